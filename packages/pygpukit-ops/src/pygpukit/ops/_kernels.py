"""The op kernels (native/kernels/ops): finding their sources, compiling them in groups, launch sizes.

Every op kernel is a template instantiated through an NVRTC name expression. Instantiations are
compiled in small groups (for example an op's contiguous, scalar and strided kernels for one dtype)
by one NVRTC call, so the first use of an op costs one compilation rather than three. The sources ship
in the pygpukit-ops wheel as ``pygpukit/ops/_kernels``; in a checkout they are read from native/kernels.

:func:`name_expressions` lists every instantiation the op library can launch, per kernel file, for the
compile check of CI (``ci/compile_kernels.py``).
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable, Sequence
from pathlib import Path

from pygpukit.core.device import get_device_info
from pygpukit.core.dtypes import DType
from pygpukit.core.errors import PyGPUkitError
from pygpukit.core.jit import JITKernel, Param
from pygpukit.core.stream import thread_device

__all__ = [
    "BLOCK",
    "KernelGroup",
    "c_param",
    "code_param",
    "grid_for",
    "kernel_root",
    "layout_param",
    "name_expressions",
    "pointer",
    "register_enumerator",
    "size_param",
]

BLOCK = 256
NAMESPACE = "pygpukit::ops::"

# C type -> struct format of a scalar kernel parameter (jit.Param.format).
_FORMATS = {
    "double": "d", "float": "f", "signed char": "b", "short": "h", "int": "i", "long long": "q",
    "unsigned char": "B", "unsigned short": "H", "unsigned int": "I", "unsigned long long": "Q", "bool": "?",
}  # fmt: skip


@functools.cache
def kernel_root() -> Path:
    """Directory holding the common/ and ops/ kernel sources."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "_kernels", here.parents[4] / "native" / "kernels"):
        if (candidate / "ops" / "types.cuh").is_file() and (candidate / "common" / "element_types.cuh").is_file():
            return candidate
    raise PyGPUkitError(f"op kernel sources not found (looked in {here / '_kernels'})")


@functools.cache
def _headers_digest() -> str:
    """Hash of every shared header, part of each kernel's cache key: editing a header recompiles."""
    root = kernel_root()
    h = hashlib.sha256()
    for path in sorted([*(root / "common").rglob("*.cuh"), *(root / "ops").rglob("*.cuh")]):
        h.update(path.relative_to(root).as_posix().encode())
        h.update(path.read_bytes())
    return h.hexdigest()


@functools.cache
def _source(relative_path: str) -> str:
    return (kernel_root() / relative_path).read_text()


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

    def kernel(self, expression: str, params: Sequence[Param]) -> JITKernel:
        kernel = self._kernels.get(expression)
        if kernel is None:
            path = kernel_root() / self.file
            # Same source, options and expression list: one cache entry and one module for the group.
            kernel = JITKernel(
                _source(self.file),
                expression,
                name_expressions=self.expressions,
                include_dirs=[str(path.parent)],
                cache_salt=_headers_digest(),
                params=params,
            )
            self._kernels[expression] = kernel
        return kernel


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


def _sm_count() -> int:
    device = thread_device()
    count = _sm_counts.get(device)
    if count is None:
        count = _sm_counts[device] = int(get_device_info(device).multiprocessor_count)
    return count


def grid_for(work: int, per_block: int = BLOCK) -> int:
    """Blocks of a grid-stride launch over ``work`` items, ``per_block`` per block and step: enough to
    fill the device several times over, never more than the work needs."""
    blocks = -(-work // per_block)
    return max(1, min(blocks, _sm_count() * 16))


# -- the compile check's enumeration ------------------------------------------------------------------
_enumerators: list[Callable[[], dict[str, list[str]]]] = []


def register_enumerator(enumerate_: Callable[[], dict[str, list[str]]]) -> None:
    """Register a function returning {kernel file: [every name expression an op module launches]}."""
    _enumerators.append(enumerate_)


def name_expressions(relative_path: str) -> list[str]:
    """Every template instantiation the op library uses from ``relative_path`` (e.g. ``ops/binary.cu``),
    for compile checks. Empty for files that are not op kernels."""
    from . import elementwise, reduction, shape  # noqa: F401 - they register their enumerators

    found: dict[str, None] = {}
    for enumerate_ in _enumerators:
        for expression in enumerate_().get(relative_path, []):
            found[expression] = None
    return list(found)


def ctype_name(dtype: DType) -> str:
    return dtype.ctype
