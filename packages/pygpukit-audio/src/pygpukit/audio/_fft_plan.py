"""FFT plans on the CUDA backend: how a transform of one length, batch and dtype runs (native/kernels/audio/fft.cu).

A plan is made once per (kind, length, valid input length, batch, dtype, normalization, device) and kept
in a :class:`~pygpukit.core.plans.PlanCache`; running it is the launches it lists. Every transform is a
forward complex DFT of a core length L (inverse ones conjugate on the way in and out); real transforms of
an even length n use L = n / 2 (see fft.cu). The core length is run by, in order of preference:

1. one ``fft_smem`` launch, when L has no prime factor above 13 and two rows of L fit in shared memory:
   the input's read and the output's write (real packing, Hermitian symmetry, scaling) happen in it;
2. a complex transform (fft, ifft) of such an L too long for that, read without zero padding, whose
   L = L1 L2 splits into two halves that fit: a four-step transform of two ``fft_smem`` launches, the first
   reading the input's columns into one scratch buffer (times the twiddles W_L^(m2 k1) on the way out), the
   second writing the output (conjugation and scale included): two passes over memory (2^20 complex64:
   8 MB read and 8 MB written each);
3. otherwise a ``fft_pack`` launch into contiguous rows, the core, and a ``fft_unpack`` launch, where the
   core is a Stockham transform of smooth length Lc: in shared memory (one launch), as a four-step
   transform Lc = L1 L2 (two ``fft_smem`` launches over strided rows) when both halves fit, else one
   global-memory ``fft_pass`` launch per radix;
4. a length with a prime factor above 13 goes through Bluestein's algorithm: the chirp-multiplied input
   zero-padded to a power of two m >= 2 L - 1, a transform of m, the product with the transformed chirp
   (``fft_chirp_mul``), a second transform of m, and the chirp again in the unpack.

Twiddle and chirp tables are computed in float64 on the host when a plan is made, rounded once to the
dtype and uploaded (kept per length, dtype and device).

A long rfft of an even length without zero padding, on an input whose row length and address hold whole
real pairs, skips 3.'s ``fft_pack``: the four-step core reads the pairs in place as complex values and
``fft_unpack`` forms the spectrum (three passes over memory instead of four).

Every ``fft_smem`` launch above whose length is a power of two from 64 to 4096 is an ``fft_reg`` launch
instead (fft_reg.cu, :data:`REG_LENGTHS`): the same reads and writes, with each row held in registers
between the passes and one shared-memory copy of it (docs/performance.md times the two).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from pygpukit.core.array import GPUArray, empty, from_numpy
from pygpukit.core.dtypes import DType
from pygpukit.core.errors import ShapeError
from pygpukit.core.jit import JITKernel, Param
from pygpukit.core.plans import PlanCache
from pygpukit.core.stream import thread_device

from . import _kernels as kern

__all__ = ["MAX_LENGTH", "FftPlan", "get_plan", "radices"]

MAX_LENGTH = 1 << 28  # positions inside a row are int in the kernels; Bluestein pads to twice the length
_RADICES = (8, 4, 2, 3, 5, 7, 11, 13)
_MAX_PASSES = 16  # 4 bits per radix in one 64-bit word

_LOAD = kern.enum_values("FftLoad")
_STORE = kern.enum_values("FftStore")

_P = kern.pointer


def _I(name: str) -> Param:  # noqa: N802 - short names for the parameter lists below
    return kern.c_param(name, "int")


def _Q(name: str) -> Param:  # noqa: N802
    return kern.c_param(name, "long long")


def _D(name: str) -> Param:  # noqa: N802
    return kern.c_param(name, "double")


SMEM_PARAMS = (
    _P("in"), _P("out"), _P("tw"), _P("tw_edge"), _Q("rows"), _Q("inner"), _Q("in_outer"), _Q("in_inner"),
    _Q("in_elem"), _Q("out_outer"), _Q("out_inner"), _Q("out_elem"), _I("n"), _I("in_len"), _I("out_count"),
    _I("npass"), kern.c_param("radices", "unsigned long long"), _I("tw_pass"), _I("tw_post"), _I("load_mode"),
    _I("store_mode"), _I("conj_in"), _I("conj_out"), _I("rows_fast"), _D("scale"), _P("window"), _Q("x_len"),
    _Q("pad_left"), _I("pad_mode"), _D("power"),
)  # fmt: skip
PASS_PARAMS = (_P("src"), _P("dst"), _P("tw"), _Q("rows"), _I("n"), _I("radix"), _I("ns"), _I("tw_pass"))
PACK_PARAMS = (
    _P("in"), _P("dst"), _P("tw_edge"), _P("chirp"), _Q("rows"), _Q("in_row"), _Q("in_elem"), _I("n"), _I("m"),
    _I("in_len"), _I("load_mode"), _I("conj_in"),
)  # fmt: skip
UNPACK_PARAMS = (
    _P("src"), _P("out"), _P("tw_edge"), _P("chirp"), _Q("rows"), _Q("out_row"), _Q("out_elem"), _I("n"), _I("m"),
    _I("out_count"), _I("store_mode"), _I("conj_out"), _D("scale"),
)  # fmt: skip
MUL_PARAMS = (_P("y"), _P("bhat"), _Q("rows"), _I("m"), _D("inv_m"))
REG_PARAMS = (
    _P("in"), _P("out"), _P("tw"), _P("tw_edge"), _P("post_lo"), _P("post_hi"), _Q("rows"), _Q("inner"),
    _Q("in_outer"), _Q("in_inner"), _Q("in_elem"), _Q("out_outer"), _Q("out_inner"), _Q("out_elem"), _I("in_len"),
    _I("out_count"), _I("post_shift"), _I("tw_post"), _I("load_mode"), _I("store_mode"), _I("conj_in"),
    _I("conj_out"), _I("rows_fast"), _I("thread_rows"), _D("scale"), _P("window"), _Q("x_len"), _Q("pad_left"),
    _I("pad_mode"), _D("power"), _I("pad_shift"), _I("row_words"),
)  # fmt: skip

# fft_reg.cu's register-resident kernels: power-of-two lengths in this range, E elements per thread by
# dtype; benchmarks/tools/kernel_times.py --variants times the knobs. On an H100 (2026-12-06) 8 elements
# (about 63 registers) beat 16 (about 92: fewer threads resident) by 10 to 30%, and 128 threads per block
# of contiguous rows beat 256 and 512 on the STFT. reg_enabled = False plans fft_smem everywhere (the
# generic kernel; the tests compare the two).
REG_LENGTHS = (64, 4096)
reg_enabled = True
reg_elements = {"float32": 8, "float64": 8}
reg_threads = 128  # threads per block of launches over contiguous rows
reg_strided_rows = 8  # rows per block of launches over strided rows (a four-step's columns)
reg_banks = True  # False: fft_reg's shared-memory layout of before (a word every 16, rows 2 (L + L/16 + 1) apart)
reg_double = True  # False: one shared-memory buffer a block (two barriers an exchange) even where two would fit


def _reg_buffers(shared: int, threads: int, registers: int, per_sm_shared: int, per_sm_threads: int) -> int:
    """2 when a second shared-memory buffer of ``shared`` bytes (fft_reg.cu's ``_2buf`` kernels: one barrier
    an exchange instead of two) costs no resident blocks: the blocks an SM holds by threads and registers
    (``registers`` a thread, allocated in warps of 256-register units) still fit its shared memory
    (``per_sm_shared``, 1 KiB of it reserved a block) with twice the bytes; else 1."""
    if not reg_double or registers <= 0:
        return 1
    warp_regs = -(-registers * 32 // 256) * 256
    resident = min(per_sm_threads // threads, 65536 // (warp_regs * -(-threads // 32)), 32)
    if resident < 1:
        return 1
    return 2 if resident * (2 * shared + 1024) <= per_sm_shared else 1


def _reg_wavefronts(length: int, elements: int, wide: bool, thread_rows: int, ry: int, shift: int,
                    row_words: int) -> float:  # fmt: skip
    """Mean shared-memory wavefronts per exchange instruction of an fft_reg launch (fft_reg.cu's RegPass:
    each pass's radix-E writes and the next pass's reads, every warp of a block) under the layout (shift,
    row_words): per request of 32 lanes (float32, 32 banks of words) or 16 (float64: half a warp, 16
    double-word banks), the most distinct addresses in one bank."""
    per_row = length // elements
    threads = np.arange(ry * per_row)
    rr, jt = (threads % ry, threads // ry) if thread_rows else (threads // per_row, threads % per_row)
    lanes = 16 if wide else 32
    positions = []
    ns = 1
    while ns * min(elements, length // ns) < length:
        radix = min(elements, length // ns)
        for i in range(elements // radix):
            j = jt + i * per_row
            k = j & (ns - 1)
            positions += [(j - k) * radix + k + r * ns for r in range(radix)]
        positions += [jt + e * per_row for e in range(elements)]
        ns *= radix
    if not positions:
        return 1.0
    p = np.stack(positions)  # (instructions, threads)
    words = rr[None, :] * row_words + p + (p >> shift)
    pad = -words.shape[1] % lanes  # a short last request: repeat its first address (no extra wavefront)
    if pad:
        words = np.concatenate([words, np.repeat(words[:, -lanes + pad :][:, :1], pad, axis=1)], axis=1)
    requests = np.sort(words.reshape(-1, lanes), axis=1)
    distinct = np.ones(requests.shape, bool)
    distinct[:, 1:] = requests[:, 1:] != requests[:, :-1]
    counts = np.zeros((requests.shape[0], lanes), np.int64)
    rows_index = np.broadcast_to(np.arange(requests.shape[0])[:, None], requests.shape)
    np.add.at(counts, (rows_index[distinct], requests[distinct] % lanes), 1)
    return float(counts.max(axis=1).mean())


def _reg_layout(length: int, elements: int, dtype: DType, thread_rows: int, ry: int) -> tuple[int, int]:
    """(pad_shift, row_words) of an fft_reg launch's shared-memory rows (fft_reg.cu): a word of padding
    every 2^pad_shift positions, rows row_words elements apart. The candidate with the fewest modelled
    bank conflicts (:func:`_reg_wavefronts`; ties: less memory) among a word every 8, 16 or 32 positions,
    each with rows 2 (L + (L >> shift) + 1) apart or that rounded up to the next distance that puts the rows
    a warp touches in different banks (an odd multiple of banks / p for p rows of a warp side by side,
    p = the largest power of two <= ry, or of the threads of a row when a warp spans several); the layout
    of before (a word every 16, rows 2 (L + L/16 + 1) apart) is a candidate too. Float32, 1024 points, 8
    elements a thread: 8 strided rows a block 2.0 -> 1.0 wavefronts an exchange, contiguous rows 2.0 -> 1.5."""
    if not reg_banks:
        return 4, 2 * (length + length // 16 + 1)
    return _best_reg_layout(length, elements, dtype.itemsize == 8, thread_rows, ry)


@functools.lru_cache(maxsize=512)
def _best_reg_layout(length: int, elements: int, wide: bool, thread_rows: int, ry: int) -> tuple[int, int]:
    legacy = (4, 2 * (length + length // 16 + 1))
    banks = 16 if wide else 32
    per_row = length // elements
    # The residue (mod banks) of a row distance that spreads the rows one warp touches: p rows side by side
    # (consecutive threads on consecutive rows) want banks / p; rows of fewer than `banks` threads each
    # (a warp spans several) want the row's thread count. None: a warp stays within one row.
    if ry <= 1:
        want = None
    elif thread_rows:
        want = (banks >> (ry.bit_length() - 1)) % banks
    else:
        want = per_row % banks if per_row < banks else None
    candidates = [legacy]
    for shift in (3, 4, 5):
        span2 = 2 * (length + (length >> shift) + 1)
        candidates.append((shift, span2))
        if want is not None:
            candidates.append((shift, span2 + (want - span2) % banks))
    scored = [(_reg_wavefronts(length, elements, wide, thread_rows, ry, s, w), w, s) for s, w in candidates]
    _, words, shift = min(scored)
    return shift, words


def radices(length: int) -> list[int] | None:
    """The Stockham radices of ``length`` (8s, then a 4 or 4 4 or 2 for the rest of the powers of two, then the
    odd primes up to 13), or None when it has a larger prime factor."""
    if length < 1:
        return None
    rest, twos = length, 0
    while rest % 2 == 0:
        rest //= 2
        twos += 1
    eights, remainder = divmod(twos, 3)
    found = [8] * eights
    if remainder == 1:
        if eights:
            found[-1] = 4
            found.append(4)
        else:
            found.append(2)
    elif remainder == 2:
        found.append(4)
    for prime in (3, 5, 7, 11, 13):
        while rest % prime == 0:
            rest //= prime
            found.append(prime)
    return found if rest == 1 else None


def _packed(rads: Sequence[int]) -> int:
    if len(rads) > _MAX_PASSES:
        raise ShapeError(f"an FFT of {math.prod(rads)} points needs {len(rads)} passes, more than {_MAX_PASSES}")
    word = 0
    for i, radix in enumerate(rads):
        word |= radix << (4 * i)
    return word


# -- tables -----------------------------------------------------------------------------------------------------
_TABLES: PlanCache[tuple[GPUArray, ...]] = PlanCache("audio.fft_tables", maxsize=256)


def _upload(values: np.ndarray[Any, Any], dtype: DType) -> GPUArray:
    pairs = np.stack([values.real, values.imag], axis=-1).astype(dtype.numpy)
    return from_numpy(np.ascontiguousarray(pairs))


def _roots(count: int, dtype: DType) -> GPUArray:
    """W_count^m = exp(-2 pi i m / count) for m < count, from float64 (m / count reduced exactly first)."""
    key = ("roots", count, dtype, thread_device())
    found = _TABLES.get(key)
    if found is None:
        m = np.arange(count, dtype=np.float64)
        found = _TABLES.put(key, (_upload(np.exp(-2j * np.pi * (m / count)), dtype),))
    return found[0]


def _post_tables(count: int, dtype: DType) -> tuple[GPUArray, GPUArray, int]:
    """A four-step's twiddles W_count^q as lo[q & (2^shift - 1)] hi[q >> shift] (fft_reg.cu): lo[m] = W^m for
    m < 2^shift, hi[m] = W^(m 2^shift) for m <= count >> shift, 2^shift about sqrt(count); and shift."""
    shift = (max(count - 1, 1).bit_length() + 1) // 2
    key = ("post", count, dtype, thread_device())
    found = _TABLES.get(key)
    if found is None:
        lo = np.arange(1 << shift, dtype=np.int64)
        hi = np.arange((count >> shift) + 1, dtype=np.int64) << shift
        found = _TABLES.put(key, tuple(_upload(np.exp(-2j * np.pi * ((m % count) / count)), dtype) for m in (lo, hi)))
    return found[0], found[1], shift


def _chirp(length: int, m: int, dtype: DType) -> tuple[GPUArray, GPUArray]:
    """Bluestein's chirp w_k = exp(-i pi k^2 / L) (k^2 reduced mod 2L in integers) and the m-point DFT of its
    conjugate wrapped around zero."""
    key = ("chirp", length, m, dtype, thread_device())
    found = _TABLES.get(key)
    if found is None:
        k = np.arange(length, dtype=np.int64)
        w = np.exp(-1j * np.pi * (((k * k) % (2 * length)).astype(np.float64) / length))
        b = np.zeros(m, np.complex128)
        b[:length] = np.conj(w)
        if length > 1:
            b[m - length + 1 :] = np.conj(w[1:])[::-1]
        found = _TABLES.put(key, (_upload(w, dtype), _upload(np.fft.fft(b), dtype)))
    return found[0], found[1]


# -- launches ---------------------------------------------------------------------------------------------------
@dataclass
class _Launch:
    kernel: JITKernel
    grid: int | tuple[int, int, int]
    block: int | tuple[int, int, int]
    shared: int
    args: tuple[Any, ...]  # buffer names ("in", "out", "s0", "s1") are replaced by addresses at run time


@dataclass(frozen=True)
class _Modes:
    """How a launch reads and writes: valid inputs per row, outputs per row, the FftLoad and FftStore codes,
    whether it conjugates on the way in and out (inverse transforms) and the scale of the outputs."""

    in_len: int
    out_count: int
    load: int
    store: int
    conj: int
    scale: float
    conj_out: int | None = None  # None: as conj (a four-step conjugates in its first read and last write only)


def _plain(length: int) -> _Modes:
    """A forward, unscaled transform of ``length`` points reading and writing complex values."""
    return _Modes(length, length, _LOAD["kLoadComplex"], _STORE["kStoreComplex"], 0, 1.0)


_opted_in: set[tuple[int, int]] = set()


def _kernel(name: str, dtype: DType, params: tuple[Param, ...]) -> JITKernel:
    return kern.kernel(name, dtype, params)


_BANK_PAD = 32  # most complex values of padding per row of a strided launch (fft.cu: 32 / rows per block)
# Rows per block of strided launches (a four-step's columns: their loads coalesce across rows), before the
# shared-memory and thread limits; benchmarks/tools/audio_bench.py --fft-variants times other values.
strided_rows = 16


def _smem_shape(length: int, dtype: DType, rows: int, strided: bool, limit: int = 1024) -> tuple[int, int, int]:
    """(threads per row, rows per block, bytes of shared memory) of an fft_smem launch over rows of ``length``:
    one thread per butterfly of the largest radix, about 256 threads a block, at least ``strided_rows`` when
    the rows are strided columns (their loads coalesce across rows), within the shared memory. Strided rows
    are padded by 32 / ry complex values each (as fft.cu does) against shared-memory bank conflicts."""
    complex_bytes = 2 * dtype.itemsize
    per_row_bytes = (2 * length + (_BANK_PAD if strided else 0)) * complex_bytes  # two buffers (+ the pad)
    rads = radices(length) or [1]
    per_row = max(1, -(-length // max(rads)))
    tx = min(limit, per_row if per_row < 32 else -(-per_row // 32) * 32)
    ry = max(1, 256 // tx)
    if strided:
        ry = max(ry, strided_rows)
    ry = max(1, min(ry, _smem_limit() // per_row_bytes, limit // tx, rows))
    if not strided:
        return tx, ry, ry * per_row_bytes
    pad = 1 if ry >= 32 else 32 // ry
    return tx, ry, ry * (2 * length + pad) * complex_bytes


# Tests set this to a small number of bytes to send short lengths down the four-step, global-pass and
# pack/unpack paths too (None: the device's limit).
smem_limit_override: int | None = None


def _smem_limit() -> int:
    return kern.max_shared_memory() if smem_limit_override is None else smem_limit_override


def _fits_smem(length: int, dtype: DType, strided: bool = False) -> bool:
    return (2 * length + (_BANK_PAD if strided else 0)) * 2 * dtype.itemsize <= _smem_limit()


class FftPlan:
    """The launches of one transform; ``run(src, dst)`` runs them on the current stream."""

    __slots__ = ("launches", "scratch", "tables")

    def __init__(self, launches: list[_Launch], scratch: tuple[int, ...], tables: tuple[GPUArray, ...]) -> None:
        self.launches = launches
        self.scratch = scratch  # complex elements of each scratch buffer (s0, s1)
        self.tables = tables  # kept alive with the plan

    def run(self, src: GPUArray, dst: GPUArray, dtype: DType) -> None:
        buffers = [empty((size, 2), dtype) for size in self.scratch]
        addresses = {"in": src.device_ptr, "out": dst.device_ptr}
        for i, buffer in enumerate(buffers):
            addresses[f"s{i}"] = buffer.device_ptr
        for launch in self.launches:
            args = [addresses[a] if isinstance(a, str) else a for a in launch.args]
            launch.kernel(*args, grid=launch.grid, block=launch.block, shared_mem=launch.shared)


class _Builder:
    """Builds a plan's launches for ``rows`` rows of one dtype."""

    def __init__(self, dtype: DType, rows: int) -> None:
        self.dtype = dtype
        self.rows = rows
        self.launches: list[_Launch] = []
        self.tables: list[GPUArray] = []
        self.scratch: list[int] = []

    def simple(self, name: str, params: tuple[Param, ...], work: int, args: tuple[Any, ...]) -> None:
        """A grid-stride launch of ``name`` over ``work`` items."""
        self.launches.append(_Launch(_kernel(name, self.dtype, params), kern.grid_for(work), kern.BLOCK, 0, args))

    def table(self, table: GPUArray) -> int:
        self.tables.append(table)
        return table.device_ptr

    def smem(self, src: str, dst: str, length: int, modes: _Modes, *, in_strides: tuple[int, int, int],
             out_strides: tuple[int, int, int], inner: int = 1, tw_post: int = 0, rows_fast: int = 0,
             rows: int | None = None, edge: GPUArray | None = None, tw_table: GPUArray | None = None,
             frames: tuple[int, int, int, int] = (0, 0, 0, 0), power: float = 2.0) -> None:  # fmt: skip
        """One fft_smem launch: ``rows`` rows (outer, inner) of a transform of ``length`` from ``src`` to ``dst``;
        ``frames``: (window address, samples per signal row, left padding, pad mode) of kLoadFramePairs;
        ``power``: the exponent of kStoreR2cPower."""
        rows = self.rows if rows is None else rows
        if _reg_applies(length, self.dtype):
            self.reg(src, dst, length, modes, in_strides=in_strides, out_strides=out_strides, inner=inner,
                     tw_post=tw_post, rows_fast=rows_fast, rows=rows, edge=edge, tw_table=tw_table, frames=frames,
                     power=power)  # fmt: skip
            return
        rads = radices(length)
        assert rads is not None
        table = tw_table if tw_table is not None else _roots(length, self.dtype)
        tw_pass = table.shape[0] // length
        kernel = _kernel("fft_smem", self.dtype, SMEM_PARAMS)
        # The most threads a block of this kernel may have (its registers decide: fewer than 1024 when it
        # needs more than 64 per thread); the passes loop over the butterflies, so any count works.
        limit = int(kernel.attributes["max_threads_per_block"]) // 32 * 32 or 32
        tx, ry, shared = _smem_shape(length, self.dtype, rows, rows_fast != 0, limit)
        if shared > 48 * 1024:
            key = (id(kernel), thread_device())
            if key not in _opted_in:
                kernel.set_max_dynamic_shared_memory(kern.max_shared_memory())
                _opted_in.add(key)
        args = (src, dst, self.table(table), self.table(edge) if edge is not None else 0, rows, inner, *in_strides,
                *out_strides, length, modes.in_len, modes.out_count, len(rads), _packed(rads), tw_pass, tw_post,
                modes.load, modes.store, modes.conj, modes.conj if modes.conj_out is None else modes.conj_out,
                rows_fast, modes.scale, *frames, power)  # fmt: skip
        self.launches.append(_Launch(kernel, -(-rows // ry), (tx, ry, 1), shared, args))

    def reg(self, src: str, dst: str, length: int, modes: _Modes, *, in_strides: tuple[int, int, int],
            out_strides: tuple[int, int, int], inner: int, tw_post: int, rows_fast: int, rows: int,
            edge: GPUArray | None, tw_table: GPUArray | None, frames: tuple[int, int, int, int],
            power: float) -> None:  # fmt: skip
        """What :meth:`smem` plans, as one fft_reg launch (fft_reg.cu): a power-of-two ``length`` whose rows
        live in registers. A four-step's twiddles (``tw_post``, over ``tw_table``'s length) come from two
        small tables instead of ``tw_table``."""
        elements = reg_elements[self.dtype.name]
        kernel = _kernel(f"fft_reg{elements}_{length}", self.dtype, REG_PARAMS)
        per_row = length // elements  # threads per row
        direct_store = modes.store in (_STORE["kStoreComplex"], _STORE["kStoreReal"])
        thread_rows = int(bool(rows_fast & (2 if direct_store else 1)))
        limit = int(kernel.attributes["max_threads_per_block"])
        ry = reg_strided_rows if thread_rows else max(1, reg_threads // per_row)
        ry = max(1, min(ry, limit // per_row, rows))
        while True:
            pad_shift, row_words = _reg_layout(length, elements, self.dtype, thread_rows, ry)
            shared = ry * row_words * self.dtype.itemsize
            if ry == 1 or shared <= _smem_limit():
                break
            ry -= 1
        registers = int(kernel.attributes.get("num_regs", 0))
        fits = reg_double and registers > 0 and 2 * shared <= _smem_limit()
        if fits and _reg_buffers(shared, per_row * ry, registers, *kern.sm_limits()) == 2:
            two = _kernel(f"fft_reg{elements}_{length}_2buf", self.dtype, REG_PARAMS)
            if int(two.attributes["max_threads_per_block"]) >= per_row * ry:
                kernel, shared = two, 2 * shared
        if shared > 48 * 1024:
            key = (id(kernel), thread_device())
            if key not in _opted_in:
                kernel.set_max_dynamic_shared_memory(kern.max_shared_memory())
                _opted_in.add(key)
        post_lo = post_hi = 0
        shift = 0
        if tw_post:
            assert tw_table is not None
            assert direct_store
            lo, hi, shift = _post_tables(tw_table.shape[0], self.dtype)
            post_lo, post_hi = self.table(lo), self.table(hi)
        args = (src, dst, self.table(_roots(length, self.dtype)), self.table(edge) if edge is not None else 0,
                post_lo, post_hi, rows, inner, *in_strides, *out_strides, modes.in_len, modes.out_count, shift,
                tw_post, modes.load, modes.store, modes.conj,
                modes.conj if modes.conj_out is None else modes.conj_out, rows_fast, thread_rows, modes.scale,
                *frames, power, pad_shift, row_words)  # fmt: skip
        self.launches.append(_Launch(kernel, -(-rows // ry), per_row * ry, shared, args))

    def core(self, buffer: str, length: int) -> str:
        """A plain forward transform of contiguous rows of ``length`` (smooth) in scratch ``buffer``; returns
        the scratch buffer holding the result."""
        rows = self.rows
        if length == 1:
            return buffer
        if _fits_smem(length, self.dtype):
            self.smem(buffer, buffer, length, _plain(length), in_strides=(length, 0, 1), out_strides=(length, 0, 1))
            return buffer
        other = "s1" if buffer == "s0" else "s0"
        split = _split(length, self.dtype)
        if split is not None:
            l1, l2 = split
            table = _roots(length, self.dtype)
            # Step 1: for each column m2 < L2, an L1-point transform over x[m1 L2 + m2], times W_L^(m2 k1),
            # stored at k1 L2 + m2. Step 2: for each k1, an L2-point transform over that row, stored at k1 + L1 k2.
            self.smem(buffer, other, l1, _plain(l1), inner=l2, in_strides=(length, 1, l2), out_strides=(length, 1, l2),
                      tw_post=1, rows_fast=3, rows=rows * l2, tw_table=table)  # fmt: skip
            self.smem(other, buffer, l2, _plain(l2), inner=l1, in_strides=(length, l2, 1), out_strides=(length, 1, l1),
                      rows_fast=2, rows=rows * l1, tw_table=table)  # fmt: skip
            return buffer
        rads = radices(length)
        assert rads is not None
        table = _roots(length, self.dtype)
        src, dst, ns = buffer, other, 1
        for radix in rads:
            self.simple("fft_pass", PASS_PARAMS, rows * (length // radix),
                        (src, dst, self.table(table), rows, length, radix, ns, 1))  # fmt: skip
            src, dst, ns = dst, src, ns * radix
        return src


def _reg_applies(length: int, dtype: DType) -> bool:
    low, high = REG_LENGTHS
    return reg_enabled and low <= length <= high and length & (length - 1) == 0 and dtype.name in reg_elements


def _split(length: int, dtype: DType) -> tuple[int, int] | None:
    """L = L1 L2 with both halves fitting in shared memory, L1 the largest such divisor <= sqrt(L)."""
    best = None
    for l1 in range(math.isqrt(length), 1, -1):
        if length % l1 == 0 and _fits_smem(l1, dtype, True) and _fits_smem(length // l1, dtype, True):
            best = (l1, length // l1)
            break
    return best


def _four_step(b: _Builder, split: tuple[int, int], in_row: int, conj: int, scale: float) -> None:
    """A complex transform of L = L1 L2 (no zero padding) as two fft_smem launches and one scratch buffer:
    the first reads the input's columns (conjugated for an inverse transform) into the scratch, the second
    writes the output rows (conjugated and scaled): two passes over memory, no pack or unpack."""
    l1, l2 = split
    length = l1 * l2
    table = _roots(length, b.dtype)
    b.scratch = [b.rows * length]
    load, store = _LOAD["kLoadComplex"], _STORE["kStoreComplex"]
    first = _Modes(l1, l1, load, store, conj, 1.0, conj_out=0)
    b.smem("in", "s0", l1, first, inner=l2, in_strides=(in_row, 1, l2), out_strides=(length, 1, l2), tw_post=1,
           rows_fast=3, rows=b.rows * l2, tw_table=table)  # fmt: skip
    second = _Modes(l2, l2, load, store, 0, scale, conj_out=conj)
    b.smem("s0", "out", l2, second, inner=l1, in_strides=(length, l2, 1), out_strides=(length, 1, l1),
           rows_fast=2, rows=b.rows * l1, tw_table=table)  # fmt: skip


# -- plans ------------------------------------------------------------------------------------------------------
# Bounded like the tables: a plan holds its tables (device memory), so the two bounds together bound it.
_PLANS: PlanCache[FftPlan] = PlanCache("audio.fft", maxsize=256)


def _scale(norm: str, n: int, inverse: bool) -> float:
    if norm == "ortho":
        return 1.0 / math.sqrt(n)
    if (norm == "backward") == inverse:
        return 1.0 / n
    return 1.0


def get_plan(kind: str, n: int, in_row: int, rows: int, dtype: DType, norm: str, pair_aligned: bool = False) -> FftPlan:
    """The plan of a transform: ``kind`` "fft", "ifft", "rfft" or "irfft" of logical length ``n`` over ``rows``
    contiguous input rows of ``in_row`` elements (complex, or real for rfft), cropped or zero-padded to what
    the transform reads (numpy.fft's ``n=``). The output rows are contiguous: n complex values (fft, ifft),
    n // 2 + 1 (rfft) or n reals (irfft). ``pair_aligned``: the input's address is a multiple of two
    elements (a long rfft may then read its real pairs as complex values, without a packing pass)."""
    key = (kind, n, in_row, rows, dtype, norm, pair_aligned, thread_device())
    plan = _PLANS.get(key)
    if plan is None:
        plan = _PLANS.put(key, _make(kind, n, in_row, rows, dtype, norm, pair_aligned))
    return plan


def stft_plan(n_fft: int, rows: int, n_frames: int, length: int, hop: int, pad_left: int, pad_mode: int,
              window: GPUArray, dtype: DType, power: float | None = None) -> FftPlan | None:  # fmt: skip
    """The STFT's rfft with the framing fused into the FFT's read: one fft_smem launch from the contiguous signal
    rows (rows, length) to the frame-major spectra (rows * n_frames, n_fft // 2 + 1, 2), each frame read from
    the padded signal and windowed on the way into shared memory (kLoadFramePairs); with ``power``, |X| ** power
    instead (rows * n_frames, n_fft // 2 + 1) reals (kStoreR2cPower). None when n_fft is odd, or n_fft / 2
    has a prime factor above 13 or does not fit in shared memory (stft then frames first)."""
    if n_fft % 2 or radices(n_fft // 2) is None or not _fits_smem(n_fft // 2, dtype):
        return None
    key = ("stft", n_fft, rows, n_frames, length, hop, pad_left, pad_mode, window.device_ptr, dtype, power,
           thread_device())  # fmt: skip
    plan = _PLANS.get(key)
    if plan is None:
        half, n_freq = n_fft // 2, n_fft // 2 + 1
        b = _Builder(dtype, rows * n_frames)
        b.table(window)  # kept alive with the plan
        store = _STORE["kStoreR2cEven"] if power is None else _STORE["kStoreR2cPower"]
        modes = _Modes(n_fft, n_freq, _LOAD["kLoadFramePairs"], store, 0, 1.0)
        b.smem("in", "out", half, modes, inner=n_frames, in_strides=(length, hop, 1),
               out_strides=(n_frames * n_freq, n_freq, 1), edge=_roots(n_fft, dtype),
               frames=(window.device_ptr, length, pad_left, pad_mode),
               power=2.0 if power is None else power)  # fmt: skip
        plan = _PLANS.put(key, FftPlan(b.launches, (), tuple(b.tables)))
    return plan


def _make(kind: str, n: int, in_row: int, rows: int, dtype: DType, norm: str, pair_aligned: bool = False) -> FftPlan:
    if n > MAX_LENGTH:
        raise ShapeError(f"FFT length {n} exceeds the largest supported, {MAX_LENGTH}")
    inverse = kind in ("ifft", "irfft")
    scale = _scale(norm, n, inverse)
    even = n % 2 == 0
    if kind in ("fft", "ifft"):
        length, load, store, out_count = n, _LOAD["kLoadComplex"], _STORE["kStoreComplex"], n
        in_len, out_row = min(in_row, n), n
    elif kind == "rfft":
        length = n // 2 if even else n
        load = _LOAD["kLoadRealPairs"] if even else _LOAD["kLoadReal"]
        store = _STORE["kStoreR2cEven"] if even else _STORE["kStoreComplex"]
        out_count = n // 2 + 1
        in_len, out_row = min(in_row, n), n // 2 + 1
    else:  # irfft
        length = n // 2 if even else n
        load = _LOAD["kLoadC2rEven"] if even else _LOAD["kLoadHermitian"]
        store = _STORE["kStoreComplex"] if even else _STORE["kStoreReal"]
        out_count = length
        in_len, out_row = min(in_row, n // 2 + 1), (n // 2 if even else n)  # even: complex pairs of the real output
    conj = int(inverse)
    edge = _roots(2 * length, dtype) if kind in ("rfft", "irfft") and even else None
    b = _Builder(dtype, rows)
    modes = _Modes(in_len, out_count, load, store, conj, scale)
    rads = radices(length)
    if rads is not None and _fits_smem(length, dtype):
        b.smem("in", "out", length, modes, in_strides=(in_row, 0, 1), out_strides=(out_row, 0, 1), edge=edge)
        return FftPlan(b.launches, (), tuple(b.tables))
    split = _split(length, dtype) if rads is not None and kind in ("fft", "ifft") and in_len == length else None
    if split is not None:
        _four_step(b, split, in_row, conj, scale)
        return FftPlan(b.launches, tuple(b.scratch), tuple(b.tables))
    edge_ptr = b.table(edge) if edge is not None else 0
    chirp_ptr, m = 0, length
    pairs = kind == "rfft" and even and in_len == n and in_row % 2 == 0 and pair_aligned and rads is not None
    split = _split(length, dtype) if pairs else None
    if split is not None:
        # A long rfft without zero padding: its rows of real pairs are rows of complex values already, so the
        # four-step core reads them in place (no fft_pack pass) and fft_unpack forms the spectrum.
        l1, l2 = split
        table = _roots(length, dtype)
        b.scratch = [rows * length, rows * length]
        b.smem("in", "s0", l1, _plain(l1), inner=l2, in_strides=(in_row // 2, 1, l2), out_strides=(length, 1, l2),
               tw_post=1, rows_fast=3, rows=rows * l2, tw_table=table)  # fmt: skip
        b.smem("s0", "s1", l2, _plain(l2), inner=l1, in_strides=(length, l2, 1), out_strides=(length, 1, l1),
               rows_fast=2, rows=rows * l1, tw_table=table)  # fmt: skip
        unpack = ("s1", "out", edge_ptr, 0, rows, out_row, 1, length, length, out_count, store, conj, scale)
        b.simple("fft_unpack", UNPACK_PARAMS, rows * out_count, unpack)
        return FftPlan(b.launches, tuple(b.scratch), tuple(b.tables))
    if rads is not None:
        b.scratch = [rows * length, rows * length]
        b.simple("fft_pack", PACK_PARAMS, rows * length,
                 ("in", "s0", edge_ptr, 0, rows, in_row, 1, length, length, in_len, load, conj))  # fmt: skip
        result = b.core("s0", length)
    else:
        m = 1 << (2 * length - 1).bit_length()  # 2 L - 1 is odd and > 1: the next power of two above it
        chirp, bhat = _chirp(length, m, dtype)
        chirp_ptr = b.table(chirp)
        b.scratch = [rows * m, rows * m]
        b.simple("fft_pack", PACK_PARAMS, rows * m,
                 ("in", "s0", edge_ptr, chirp_ptr, rows, in_row, 1, length, m, in_len, load, conj))  # fmt: skip
        result = b.core("s0", m)
        b.simple("fft_chirp_mul", MUL_PARAMS, rows * m, (result, b.table(bhat), rows, m, 1.0 / m))
        result = b.core(result, m)
    b.simple(
        "fft_unpack",
        UNPACK_PARAMS,
        rows * out_count,
        (result, "out", edge_ptr, chirp_ptr, rows, out_row, 1, length, m, out_count, store, conj, scale),
    )
    return FftPlan(b.launches, tuple(b.scratch), tuple(b.tables))
