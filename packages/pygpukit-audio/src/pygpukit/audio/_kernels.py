"""The audio kernels (native/kernels/audio/): their sources, codes, compiled entry points and launch sizes.

Every audio kernel is an ``extern "C"`` entry point with the element type in its name (``fft_smem_f32``,
``frame_signal_f64``), so no name mangling is involved and the repository's kernel compile check
(``ci/compile_kernels.py``) compiles every one of them as they are. The entry points of one file are
compiled together by one NVRTC call (one kernel-cache entry and one module per file and architecture).
The sources ship in the pygpukit-audio wheel as ``pygpukit/audio/_kernels/audio`` (hatch_build.py); in a
checkout they are read from native/kernels (:data:`SOURCES`, a
:class:`~pygpukit.core.kernel_sources.KernelSources`).

The integer codes the kernels switch on (FFT load and store modes, padding modes) are defined once, in
``audio/audio_codes.cuh``, and read from there by :func:`enum_values`.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Sequence
from pathlib import Path

from pygpukit.core.device import get_device_info
from pygpukit.core.dtypes import DType, float32, float64
from pygpukit.core.errors import DTypeError, PyGPUkitError
from pygpukit.core.jit import JITKernel, Param
from pygpukit.core.kernel_sources import KernelSources
from pygpukit.core.stream import thread_device

__all__ = [
    "BLOCK",
    "FILES",
    "SOURCES",
    "c_param",
    "entry",
    "enum_values",
    "grid_for",
    "kernel",
    "max_shared_memory",
    "pointer",
    "precompile",
    "sm_limits",
    "suffix",
]

BLOCK = 256
SOURCES = KernelSources(Path(__file__).parent, ("audio/audio_codes.cuh", "audio/fft.cu"), "audio")

# C type -> struct format of a scalar kernel parameter.
_FORMATS = {"double": "d", "float": "f", "int": "i", "long long": "q", "unsigned long long": "Q"}

# Every entry point, per kernel file (without the _f32/_f64 suffix). ci/compile_kernels.py compiles the
# files whole; tests/test_kernels.py checks that each listed entry point exists.
FILES: dict[str, tuple[str, ...]] = {
    "audio/fft.cu": ("fft_smem", "fft_pass", "fft_pack", "fft_unpack", "fft_chirp_mul"),
    "audio/fft_reg.cu": tuple(
        f"fft_reg{e}_{1 << bits}{two}" for e in (8, 16) for bits in range(6, 13) for two in ("", "_2buf")
    ),
    "audio/spectral.cu": (
        "count_nonfinite", "frame_signal", "overlap_add", "spectrum_power", "apply_scale_db", "spectral_moments",
        "frame_rms", "zero_crossings", "preemphasis", "deemphasis", "savgol_delta",
    ),
    "audio/resample.cu": ("resample_poly", "resample_direct"),
    "audio/phase.cu": ("phase_vocoder",),
    "audio/analysis.cu": ("yin_frames", "sos_filter", "onset_flux", "frame_gate", "viterbi"),
    "audio/music.cu": ("median_filter", "hpss_mask", "band_contrast", "normalize_rows", "stack_block",
                       "spectrum_crop"),
}  # fmt: skip
_FILE_OF = {name: file for file, names in FILES.items() for name in names}
_SUFFIXES = {"float32": "f32", "float64": "f64"}
_REG_PAIR = re.compile(r"fft_reg(\d+)_(\d+)(?:_2buf)?")


def suffix(dtype: DType) -> str:
    """The entry-point suffix of ``dtype`` (float32 or float64; else :class:`DTypeError`)."""
    found = _SUFFIXES.get(dtype.name)
    if found is None:
        raise DTypeError(f"audio kernels compute in float32 or float64, not {dtype.name}")
    return found


def entry(name: str, dtype: DType) -> str:
    return f"{name}_{suffix(dtype)}"


def pointer(name: str) -> Param:
    return Param(name, "void*", "pointer", "Q")


def c_param(name: str, ctype: str) -> Param:
    """A scalar parameter of C type ``ctype`` (``int``, ``long long``, ``double``, ...)."""
    return Param(name, ctype, "scalar", _FORMATS[ctype])


def _expressions(file: str) -> list[str]:
    return [f"{name}_{s}" for name in FILES[file] for s in ("f32", "f64")]


@functools.cache
def kernel(name: str, dtype: DType, params: tuple[Param, ...]) -> JITKernel:
    """The entry point ``<name>_<suffix>`` compiled with every entry point of its file (one program)."""
    file = _FILE_OF[name]
    source, expressions = SOURCES.source(file), _expressions(file)
    found = _REG_PAIR.fullmatch(name)
    if found is not None:  # fft_reg.cu: one (elements, length) pair per program (fft_reg.cu says why)
        elements, length = found.groups()
        source = f"#define PYGPUKIT_FFT_REG_LENGTH {length}\n#define PYGPUKIT_FFT_REG_ELEMENTS {elements}\n{source}"
        pair = f"fft_reg{elements}_{length}"
        expressions = [f"{pair}{two}_{s}" for two in ("", "_2buf") for s in _SUFFIXES.values()]
    return JITKernel(
        source,
        entry(name, dtype),
        name_expressions=expressions,
        include_dirs=SOURCES.include_dirs(file),
        cache_salt=SOURCES.headers_digest(),
        params=list(params),
    )


def precompile(arch: str | int | tuple[int, int] | None = None, *, jobs: int | None = None) -> int:
    """Compile every audio kernel file for ``arch`` (default: the current device's) into the kernel cache,
    so that no audio function compiles on first use; returns the number of compilations. Needs NVRTC, not
    a GPU."""
    from concurrent.futures import ThreadPoolExecutor

    target: str | int | tuple[int, int] = (
        arch if arch is not None else get_device_info(thread_device()).compute_capability
    )

    def compile_one(file: str) -> None:
        names = _expressions(file)
        JITKernel(SOURCES.source(file), names[0], name_expressions=names, include_dirs=SOURCES.include_dirs(file),
                  cache_salt=SOURCES.headers_digest(), params=[]).compile(target)  # fmt: skip

    files = list(FILES)
    with ThreadPoolExecutor(max_workers=jobs or os.cpu_count() or 1) as pool:
        list(pool.map(compile_one, files))
    return len(files)


# -- codes ------------------------------------------------------------------------------------------------------
_ENUM = re.compile(r"enum\s+(\w+)\s*:\s*int\s*\{([^}]*)\}", re.S)
_ENTRY = re.compile(r"^\s*(k\w+)\s*=\s*(\d+)\s*$")


@functools.cache
def enum_values(enum: str) -> dict[str, int]:
    """``{enumerator: value}`` of ``enum Name : int {...}`` in audio/audio_codes.cuh, in declaration order."""
    path = SOURCES.path("audio/audio_codes.cuh")
    text = path.read_text()
    for match in _ENUM.finditer(text):
        if match.group(1) != enum:
            continue
        values: dict[str, int] = {}
        for item in match.group(2).split(","):
            item = item.strip()
            if not item:
                continue
            found = _ENTRY.match(item)
            if found is None:
                raise PyGPUkitError(f"{path}: enum {enum}: cannot parse {item!r} (expected kName = number)")
            values[found.group(1)] = int(found.group(2))
        return values
    raise PyGPUkitError(f"{path}: no enum {enum!r}")


# -- launch sizes -----------------------------------------------------------------------------------------------
_sm_counts: dict[int, int] = {}
_shared: dict[int, int] = {}
_per_sm: dict[int, tuple[int, int]] = {}


def grid_for(work: int, per_block: int = BLOCK, per_sm: int = 16) -> int:
    """Blocks of a grid-stride launch over ``work`` items: enough to fill the device several times over, never
    more than the work needs."""
    blocks = -(-work // per_block)
    if blocks <= 128:
        return max(blocks, 1)
    device = thread_device()
    count = _sm_counts.get(device)
    if count is None:
        count = _sm_counts[device] = int(get_device_info(device).multiprocessor_count)
    return min(blocks, count * per_sm)


def max_shared_memory() -> int:
    """Dynamic shared memory one block of the current device may use once opted in (bytes)."""
    device = thread_device()
    found = _shared.get(device)
    if found is None:
        info = get_device_info(device)
        found = _shared[device] = int(max(info.max_shared_memory_per_block_optin, info.max_shared_memory_per_block))
    return found


def sm_limits() -> tuple[int, int]:
    """(shared memory bytes, threads) one SM of the current device holds at once."""
    device = thread_device()
    found = _per_sm.get(device)
    if found is None:
        info = get_device_info(device)
        found = _per_sm[device] = (int(info.max_shared_memory_per_multiprocessor),
                                   int(info.max_threads_per_multiprocessor))  # fmt: skip
    return found


def float_dtypes() -> Sequence[DType]:
    return (float32, float64)
