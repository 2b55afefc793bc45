"""The op kernels (native/kernels/<family>/): finding their sources, compiling them in groups, launch sizes.

Every op kernel is a template instantiated through an NVRTC name expression. Instantiations are
compiled in small groups (for example an op's contiguous, scalar and strided kernels for one dtype)
by one NVRTC call, so the first use of an op costs one compilation rather than three. The sources ship
in the pygpukit-ops wheel as ``pygpukit/ops/_kernels``; in a checkout they are read from native/kernels
(:data:`SOURCES`, a :class:`~pygpukit.core.kernel_sources.KernelSources`).

:func:`name_expressions` lists every instantiation the op library can launch, per kernel file, for the
compile check of CI (``ci/compile_kernels.py``).
"""

from __future__ import annotations

import importlib
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pygpukit.core import backend as _backend
from pygpukit.core.array import GPUArray, zeros
from pygpukit.core.compiler import parse_arch
from pygpukit.core.device import get_device_info
from pygpukit.core.dtypes import uint32
from pygpukit.core.graph import is_capturing
from pygpukit.core.jit import JITKernel, Param
from pygpukit.core.kernel_sources import KernelSources
from pygpukit.core.plans import PlanCache
from pygpukit.core.stream import Stream, current_stream, on_stream_destroyed, thread_device

__all__ = [
    "BLOCK",
    "SM90A_FILES",
    "SOURCES",
    "TILE",
    "TILE_BLOCKS_PER_SM",
    "UNROLL",
    "KernelGroup",
    "c_param",
    "code_param",
    "completion_counters",
    "grid_for",
    "kernel_root",
    "launch",
    "layout_param",
    "name_expressions",
    "pointer",
    "precompile",
    "register_enumerator",
    "size_param",
    "sm_count",
]

_jit = importlib.import_module("pygpukit.core.jit")  # the module (pygpukit.core.jit is also a function's name)
BLOCK = 256
# Kernels with real bodies only when built for sm_90a.
SM90A_FILES = frozenset({"gemm/gemm_wgmma.cu", "attention/attention_prefill_sm90.cu"})
UNROLL = 4  # kUnroll of types.cuh: packs per thread and tile of the contiguous elementwise kernels
TILE = BLOCK * UNROLL  # packs per block and tile of those kernels (their grid_for per_block)
TILE_BLOCKS_PER_SM = 256  # their grid_for per_sm
NAMESPACE = "pygpukit::ops::"

# C type -> struct format of a scalar kernel parameter (jit.Param.format).
_FORMATS = {
    "double": "d", "float": "f", "signed char": "b", "short": "h", "int": "i", "long long": "q",
    "unsigned char": "B", "unsigned short": "H", "unsigned int": "I", "unsigned long long": "Q", "bool": "?",
}  # fmt: skip


SOURCES = KernelSources(Path(__file__).parent, ("common/types.cuh", "elementwise/unary.cu"), "op")


def kernel_root() -> Path:
    """Directory holding common/ and the op kernel family folders (elementwise/, gemm/, ...)."""
    return SOURCES.root


def _source(relative_path: str) -> str:
    return SOURCES.source(relative_path)


def pointer(name: str) -> Param:
    return Param(name, "void*", "pointer", "Q")


def c_param(name: str, ctype: str) -> Param:
    """A scalar parameter of C type ``ctype`` (a compute type such as ``float`` or ``long long``)."""
    return Param(name, ctype, "scalar", _FORMATS[ctype])


def size_param(name: str) -> Param:
    return Param(name, "long long", "scalar", "q")


def code_param(name: str) -> Param:
    return Param(name, "int", "scalar", "i")


def layout_param(name: str = "layout", ctype: str = "Layout") -> Param:
    """A struct passed by value (packed by the caller)."""
    return Param(name, ctype, "opaque", "")


class KernelGroup:
    """Instantiations of one kernel file compiled together; ``kernel(expression, params)`` launches one."""

    __slots__ = ("_kernels", "expressions", "file")

    def __init__(self, file: str, expressions: Sequence[str]) -> None:
        self.file = file
        self.expressions = tuple(expressions)
        self._kernels: dict[str, JITKernel] = {}

    def _make(self, expression: str, params: Sequence[Param], programmatic: bool = False) -> JITKernel:
        # Same source, options and expression list: one cache entry and one module for the group.
        return JITKernel(
            SOURCES.source(self.file),
            expression,
            name_expressions=self.expressions,
            include_dirs=SOURCES.include_dirs(self.file),
            cache_salt=SOURCES.headers_digest(),
            params=params,
            programmatic=programmatic,
        )

    def kernel(self, expression: str, params: Sequence[Param], programmatic: bool = False) -> JITKernel:
        """The launchable kernel of ``expression``; ``programmatic``: it waits for the kernel before it
        with ``overlap_wait()`` (common/overlap.cuh), so it may be launched before that one finishes."""
        kernel = self._kernels.get(expression)
        if kernel is None:
            kernel = self._kernels[expression] = self._make(expression, params, programmatic)
        return kernel

    def compile(self, arch: str | int | tuple[int, int]) -> None:
        """Compile the group for ``arch`` into the kernel cache (memory and disk); needs no GPU. Files
        that need SM 90's architecture-specific ISA (wgmma) are built for sm_90a there, as they run."""
        if self.file in SM90A_FILES and parse_arch(arch) == "90":
            arch = "90a"
        self._make(self.expressions[0], []).compile(arch)


_groups: dict[tuple[str, tuple[str, ...]], KernelGroup] = {}


def group(file: str, expressions: Sequence[str]) -> KernelGroup:
    """The (cached) group compiling ``expressions`` of ``file`` together."""
    key = (file, tuple(expressions))
    found = _groups.get(key)
    if found is None:
        found = _groups[key] = KernelGroup(file, key[1])
    return found


# -- launch sizes -----------------------------------------------------------------------------------
_sm_counts: dict[int, int] = {}


def sm_count() -> int:
    """Multiprocessors of the calling thread's current device (cached per device)."""
    device = thread_device()
    count = _sm_counts.get(device)
    if count is None:
        count = _sm_counts[device] = int(get_device_info(device).multiprocessor_count)
    return count


def grid_for(work: int, per_block: int = BLOCK, per_sm: int = 16) -> int:
    """Blocks of a grid-stride launch over ``work`` items, ``per_block`` per block and step: enough to
    fill the device several times over (at most ``per_sm`` blocks per SM), never more than the work
    needs. The contiguous elementwise kernels pass per_sm=TILE_BLOCKS_PER_SM: one tile per block up to
    large sizes, so the hardware balances blocks across SMs and no SM is left with an extra step."""
    blocks = -(-work // per_block)
    if blocks <= 128:  # within the cap of any supported GPU (8 SMs or more): skip the device lookup
        return blocks if blocks > 0 else 1
    return min(blocks, sm_count() * per_sm)


def launch(kernel: JITKernel, args: tuple[Any, ...], grid: int | tuple[int, ...], block: Any = None,
           shared_mem: int = 0) -> None:  # fmt: skip
    """``kernel(*args, grid=grid, block=block, shared_mem=shared_mem)`` (block: :data:`BLOCK` when
    None) through the kernel's native launcher directly when it has one for the current backend state:
    the repeated-call fast paths' launch. Anything the launcher does not take goes through the full
    call, which checks it."""
    block = BLOCK if block is None else block
    fast = kernel._fast
    if (fast is None or _jit._launch_hook is not None or kernel._fast_state is not _backend._state
            or fast(args, grid, block, shared_mem, None) is not None):  # fmt: skip
        kernel(*args, grid=grid, block=block, shared_mem=shared_mem)  # (pygpukit.profiling's hook records it there)


# -- completion counters ----------------------------------------------------------------------------
COUNTERS = 1 << 16  # per stream: the most blocks along grid.x of a launch that uses them
# A PlanCache so that clear_plan_caches(), which pygpukit.reset_device() runs, drops the arrays: they
# die with a device reset (core/recovery.py).
_counters: PlanCache[GPUArray] = PlanCache("ops.completion_counters")
_counters_lock = threading.Lock()


def _drop_counters(device: int, handle: int) -> None:
    """A stream was destroyed: its counters go back to the pool (to the stream's cache, which the
    destroy then releases). A plain dict pop, no lock: this may run inside a garbage collection."""
    _counters._plans.pop((device, handle), None)


on_stream_destroyed(_drop_counters)


def completion_counters(device: int, stream: Stream | None, *, in_capture: bool = True) -> GPUArray | None:
    """COUNTERS zeroed uint32 counters of ``stream`` (the current one if None), for kernels whose last
    block to finish does the final step (gemv's split K, split reductions). Every such launch leaves
    its counters zero again, so launches on one stream share them; launches on different streams
    have their own. Made on first use by a memset on the stream; when that stream is being captured
    the memset would only run at replay, so with ``in_capture=False`` the result is None instead
    (the caller then takes a path without counters)."""
    target = stream if stream is not None else current_stream()
    key = (device, target._id)  # not .handle: a paced stream takes a token per .handle read
    found = _counters.get(key)
    if found is None:
        if not in_capture and is_capturing(target):
            return None
        with _counters_lock:
            found = _counters.get(key)
            if found is None:
                found = _counters.put(key, zeros(COUNTERS, uint32, stream=target))
    return found


# -- every group the op library launches ------------------------------------------------------------
Groups = dict[str, list[tuple[str, ...]]]
_enumerators: list[Callable[[], Mapping[str, Sequence[Any]]]] = []


def register_enumerator(enumerate_: Callable[[], Mapping[str, Sequence[Any]]]) -> None:
    """Register a function returning {kernel file: [each group of name expressions an op module
    compiles together]}: every instantiation it can launch. A plain list of expressions for a file
    is one group."""
    _enumerators.append(enumerate_)


def all_groups() -> Groups:
    """Every kernel group of the op library, per kernel file."""
    import importlib
    import pkgutil

    # Every module of the package registers its kernels when imported.
    for module in pkgutil.iter_modules([str(Path(__file__).parent)]):
        importlib.import_module(f"{__package__}.{module.name}")

    found: dict[str, dict[tuple[str, ...], None]] = {}
    for enumerate_ in _enumerators:
        for file, groups in enumerate_().items():
            if groups and isinstance(groups[0], str):
                groups = [tuple(groups)]
            for expressions in groups:
                found.setdefault(file, {})[tuple(expressions)] = None
    return {file: list(groups) for file, groups in found.items()}


def name_expressions(relative_path: str) -> list[str]:
    """Every template instantiation the op library uses from ``relative_path`` (e.g. ``elementwise/binary.cu``),
    for compile checks. Empty for files that are not op kernels."""
    found: dict[str, None] = {}
    for expressions in all_groups().get(relative_path, []):
        for expression in expressions:
            found[expression] = None
    return list(found)


def precompile(arch: str | int | tuple[int, int] | None = None, *, jobs: int | None = None) -> int:
    """Compile every op kernel for ``arch`` (default: the current device's) into the kernel cache, in
    parallel, so that no op compiles on first use; returns the number of compilations. Needs NVRTC,
    not a GPU. Later runs find the binaries in the disk cache (see docs/core.md)."""
    from concurrent.futures import ThreadPoolExecutor

    target: str | int | tuple[int, int] = (
        arch if arch is not None else get_device_info(thread_device()).compute_capability
    )
    work = [(file, expressions) for file, groups in all_groups().items() for expressions in groups]

    def compile_one(item: tuple[str, tuple[str, ...]]) -> None:
        group(*item).compile(target)

    with ThreadPoolExecutor(max_workers=jobs or os.cpu_count() or 1) as pool:
        list(pool.map(compile_one, work))
    return len(work)
