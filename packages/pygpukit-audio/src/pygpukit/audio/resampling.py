"""Sample-rate conversion, as librosa.resample: a polyphase Kaiser-windowed sinc filter of high quality.

``resample(y, orig_sr=..., target_sr=...)`` of a signal or a batch (..., T) gives (..., ceil(T * target_sr /
orig_sr)) samples, the length librosa's ``fix=True`` gives, time-aligned as soxr is (output sample n sits at
input time n * orig_sr / target_sr; samples outside the signal are zeros). With L / M the rates divided by
their gcd the filter has L phases: a sinc of cutoff ``rolloff * min(1, L / M)`` (of the input's Nyquist
rate) under a Kaiser window reaching ``zeros`` zero crossings on each side. ``res_type="soxr_hq"`` (the
default, librosa's) uses 64 zero crossings, rolloff 0.945 and Kaiser beta 12.0: an error about 1e-6 relative
to full scale on band-limited signals (below 0.8 of the lower Nyquist rate), at or below soxr_hq's;
``"soxr_vhq"`` 96 zero crossings, rolloff 0.96, beta 14.5. Rates need not be whole numbers (soxr's, and
pitch_shift's, are not): when they are not, or when the table would pass :data:`MAX_TABLE` coefficients, the
same filter is evaluated at every tap instead of read from a table.

On the CUDA backend the filter table (L x taps, built in float64 on the host and rounded once to the
signal's dtype) is kept per rates and dtype, and one kernel of native/kernels/audio/resample.cu computes
every output sample of the batch: resample_tile (a block copies an input window to shared memory, a thread
computes :data:`TILE_OUTPUTS` outputs of one phase, reading each coefficient of a transposed table once),
or resample_poly (one thread per output) where that window would not fit 48 KiB; resample_direct evaluates
the filter in double. The sums are the same, in the same order. On the CPU backend NumPy computes them in
float64.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from pygpukit.core.array import GPUArray, empty
from pygpukit.core.dtypes import DType, int32
from pygpukit.core.errors import ArgumentError, ShapeError
from pygpukit.core.jit import JITKernel

from . import _kernels as kern
from ._common import Array, as_signal, host, is_cuda, number
from ._launch import check_finite, device_table, signal_rows

__all__ = ["resample"]

# res_type -> (zero crossings each side, rolloff, Kaiser beta)
RES_TYPES: dict[str, tuple[int, float, float]] = {
    "soxr_hq": (64, 0.945, 12.0),
    "soxr_vhq": (96, 0.96, 14.5),
}
# The most filter coefficients (phases x taps) one conversion may use (256 MiB in float64).
MAX_TABLE = 1 << 25

# resample_tile: outputs of one phase per thread, by element size (R of resample.cu's entries), the fewest phases
# (threads) a block takes, and the most shared memory its input window may use (no opt-in above 48 KiB).
TILE_OUTPUTS = {4: 16, 8: 8}
TILE_MIN_PHASES = 64
TILE_SHARED = 48 * 1024
TILE_ORDER_SEARCH = 4096

_FILE = "audio/resample.cu"
_Q = "long long"
_PARAMS = {
    "resample_poly": (
        kern.pointer("x"), kern.pointer("table"), kern.pointer("out"), kern.c_param("rows", _Q),
        kern.c_param("length", _Q), kern.c_param("out_len", _Q), kern.c_param("up", _Q), kern.c_param("down", _Q),
        kern.c_param("taps", "int"), kern.c_param("left", _Q),
    ),
    "resample_tile": (
        kern.pointer("x"), kern.pointer("table_t"), kern.pointer("order"), kern.pointer("out"),
        kern.c_param("rows", _Q), kern.c_param("length", _Q), kern.c_param("out_len", _Q), kern.c_param("up", _Q),
        kern.c_param("down", _Q), kern.c_param("taps", "int"), kern.c_param("left", _Q),
        kern.c_param("span_up", _Q), kern.c_param("span_down", _Q), kern.c_param("tiles", _Q),
    ),
    "resample_direct": (
        kern.pointer("x"), kern.pointer("out"), kern.c_param("rows", _Q), kern.c_param("length", _Q),
        kern.c_param("out_len", _Q), kern.c_param("step", "double"), kern.c_param("cutoff", "double"),
        kern.c_param("half", "double"), kern.c_param("beta", "double"), kern.c_param("gain", "double"),
    ),
}  # fmt: skip


@functools.cache
def _kernel(name: str, dtype: DType) -> JITKernel:
    names = [f"{n}_{s}" for n in _PARAMS for s in ("f32", "f64")]
    return JITKernel(
        kern.SOURCES.source(_FILE),
        kern.entry(name, dtype),
        name_expressions=names,
        include_dirs=kern.SOURCES.include_dirs(_FILE),
        cache_salt=kern.SOURCES.headers_digest(),
        params=list(_PARAMS[name]),
    )


def tile_geometry(up: int, down: int, taps: int, itemsize: int) -> tuple[int, int, int] | None:
    """(span_up, threads, shared bytes) of resample_tile for the ratio up / down, or None when its input window
    would not fit :data:`TILE_SHARED` bytes (resample_poly serves those). span_up, a whole number of periods of
    ``up`` outputs (at least :data:`TILE_MIN_PHASES`), is the one of the next 8 whose window fits that leaves
    the fewest idle threads."""
    first = -(-TILE_MIN_PHASES // up)
    best: tuple[float, int, int, int] | None = None
    for span in range(first, first + 8):
        span_up = span * up
        shared = (TILE_OUTPUTS[itemsize] * span * down + taps) * itemsize
        if shared > TILE_SHARED:
            break
        rounds = -(-span_up // kern.BLOCK)
        threads = -(-span_up // (32 * rounds)) * 32  # the fewest whole warps that take span_up in `rounds`
        used = span_up / (threads * -(-span_up // threads))
        if best is None or used > best[0] + 1e-9:
            best = (used, span_up, threads, shared)
    return None if best is None else best[1:]


def _order_cost(order: Array, up: int, down: int, outputs: int) -> float:
    """Shared-memory wavefronts (``outputs`` window reads) plus 128-byte table lines (one coefficient read) per
    tap and warp of resample_tile when thread t takes q = order[t]: the cost its order is chosen by."""
    total = 0.0
    warps = 0
    for w in range(0, len(order), 32):
        q = order[w : w + 32].astype(np.int64)
        c = q * down // up
        phase = q * down - c * up
        banks = max(np.bincount(np.unique(c + k) % 32, minlength=32).max() for k in range(4))
        total += outputs * banks + len(np.unique(phase // 32))
        warps += 1
    return total / warps


@functools.cache
def tile_order(up: int, down: int, span_up: int, outputs: int) -> Array:
    """The q of the tile each thread of resample_tile takes (int32, a permutation of range(span_up)): of the
    natural order, the phase order and a greedy spread of window starts over the 32 banks, the cheapest (the
    natural order past :data:`TILE_ORDER_SEARCH` threads)."""
    q = np.arange(span_up, dtype=np.int64)
    if span_up > TILE_ORDER_SEARCH:
        return q.astype(np.int32)
    starts = q * down // up
    classes = [list(q[starts % 32 == b]) for b in range(32)]
    spread: list[int] = []
    while len(spread) < span_up:
        for b in sorted(range(32), key=lambda b: -len(classes[b])):
            if classes[b]:
                spread.append(int(classes[b].pop(0)))
    candidates = [q, q[np.argsort((q * down) % up, kind="stable")], np.array(spread, dtype=np.int64)]
    best: Array = min(candidates, key=lambda order: _order_cost(order, up, down, outputs)).astype(np.int32)
    return best


def _rate(name: str, what: str, value: Any) -> float:
    return number(name, what, value, minimum=0.0, exclusive=True)


def filter_geometry(up: int, down: int, res_type: str) -> tuple[int, int, float, float, float]:
    """(taps, left, cutoff, half width, beta) of the polyphase filter for the ratio up / down."""
    zeros, rolloff, beta = RES_TYPES[res_type]
    cutoff = rolloff * min(1.0, up / down)
    half = zeros / cutoff
    left = math.ceil(half)
    return 2 * left + 2, left, cutoff, half, beta


def filter_table(up: int, down: int, res_type: str) -> Array:
    """The (up, taps) float64 table: row p holds the windowed sinc at p / up + left - k, k < taps."""
    taps, left, cutoff, half, beta = filter_geometry(up, down, res_type)
    tau = np.arange(up, dtype=np.float64)[:, None] / up + left - np.arange(taps, dtype=np.float64)[None, :]
    inside = np.abs(tau) < half
    ratio = np.where(inside, tau / half, 0.0)
    window = np.where(inside, np.i0(beta * np.sqrt(np.maximum(0.0, 1.0 - ratio * ratio))) / np.i0(beta), 0.0)
    table: Array = cutoff * np.sinc(cutoff * tau) * window
    return table


def _host_resample(x: Array, up: int, down: int, out_len: int, res_type: str) -> Array:
    """float64 (rows, out_len) resampled rows of ``x`` (rows, T): the kernel's sums, in blocks of outputs."""
    taps, left, *_ = filter_geometry(up, down, res_type)
    table = filter_table(up, down, res_type)
    rows, length = x.shape
    padded = np.zeros((rows, length + 2 * taps + 2), dtype=np.float64)
    padded[:, taps : taps + length] = x
    out = np.empty((rows, out_len), dtype=np.float64)
    block = max(1, (1 << 22) // max(taps * rows, 1))
    for start in range(0, out_len, block):
        n = np.arange(start, min(start + block, out_len), dtype=np.int64)
        i0, phase = np.divmod(n * down, up)
        first = i0 - left + taps  # index in padded
        idx = first[:, None] + np.arange(taps)[None, :]
        inside = (idx >= 0) & (idx < padded.shape[1])
        gathered = padded[:, np.where(inside, idx, 0)] * inside
        out[:, start : start + len(n)] = np.einsum("rnk,nk->rn", gathered, table[phase])
    return out


def _direct_geometry(orig: float, target: float, res_type: str) -> tuple[float, float, float]:
    zeros, rolloff, beta = RES_TYPES[res_type]
    cutoff = rolloff * min(1.0, target / orig)
    return cutoff, zeros / cutoff, beta


def _host_direct(x: Array, orig: float, target: float, out_len: int, res_type: str) -> Array:
    """float64 (rows, out_len): the windowed sinc evaluated at every tap (the resample_direct kernel's sums)."""
    cutoff, half, beta = _direct_geometry(orig, target, res_type)
    rows, length = x.shape
    taps = 2 * math.ceil(half) + 2
    out = np.empty((rows, out_len), dtype=np.float64)
    block = max(1, (1 << 22) // max(taps * rows, 1))
    step = orig / target
    for start in range(0, out_len, block):
        t = np.arange(start, min(start + block, out_len), dtype=np.float64) * step
        idx = np.floor(t - half).astype(np.int64)[:, None] + np.arange(taps)[None, :]
        tau = t[:, None] - idx
        inside = (np.abs(tau) < half) & (idx >= 0) & (idx < length)
        u = np.where(inside, tau / half, 0.0)
        h = np.where(inside, cutoff * np.sinc(cutoff * tau) * np.i0(beta * np.sqrt(1.0 - u * u)) / np.i0(beta), 0.0)
        out[:, start : start + len(t)] = np.einsum("rnk,nk->rn", x[:, np.clip(idx, 0, length - 1)], h)
    return out


def _launch_tile(data: GPUArray, out: GPUArray, sizes: tuple[int, int, int], ratio: tuple[int, int, int, int],
                 tile: tuple[int, int, int], res_type: str, gain: float) -> None:  # fmt: skip
    """resample_tile over ``data`` (rows, length) into ``out`` (rows, out_len): ``ratio`` is (up, down, taps,
    left), ``tile`` :func:`tile_geometry`'s answer."""
    rows, length, out_len = sizes
    up, down, taps, left = ratio
    span_up, threads, shared = tile
    dt = data.dtype
    outputs = TILE_OUTPUTS[dt.itemsize]
    tiles = -(-out_len // (outputs * span_up))
    table = device_table(("resample_t", up, down, res_type, gain),
                         lambda: np.ascontiguousarray((filter_table(up, down, res_type) * gain).T), dt)  # fmt: skip
    order = device_table(("resample_order", up, down, span_up, outputs),
                         lambda: tile_order(up, down, span_up, outputs), int32)  # fmt: skip
    _kernel("resample_tile", dt)(data.device_ptr, table.device_ptr, order.device_ptr, out.device_ptr, rows, length,
                                 out_len, up, down, taps, left, span_up, span_up // up * down, tiles,
                                 grid=min(rows * tiles, 1 << 20), block=threads, shared_mem=shared)  # fmt: skip


def resample(y: Any, *, orig_sr: float, target_sr: float, res_type: str = "soxr_hq",
             scale: bool = False) -> GPUArray:  # fmt: skip
    """``y`` (..., T) resampled from ``orig_sr`` to ``target_sr`` along its last axis, as librosa.resample
    (``fix=True``): (..., ceil(T * target_sr / orig_sr)) samples; ``scale`` divides by sqrt(target / orig)
    as librosa does. Equal rates give ``y`` itself, as librosa."""
    name = "resample"
    signal = as_signal(name, "y", y)
    orig = _rate(name, "orig_sr", orig_sr)
    target = _rate(name, "target_sr", target_sr)
    if not isinstance(res_type, str) or res_type not in RES_TYPES:
        raise ArgumentError(f"{name}: res_type must be one of {', '.join(map(repr, RES_TYPES))}, got {res_type!r}")
    data, lead, rows, length = signal_rows(name, signal)
    if length == 0:
        raise ShapeError(f"{name}: y is empty (shape {signal.shape})")
    check_finite(name, "y", data, deferred=isinstance(y, GPUArray))  # NumPy input: the copy waited anyway
    if orig == target:
        return signal
    whole = orig == int(orig) and target == int(target)
    up = down = taps = left = 0
    if whole:
        g = math.gcd(int(orig), int(target))
        up, down = int(target) // g, int(orig) // g
        taps, left, *_ = filter_geometry(up, down, res_type)
        whole = up * taps <= MAX_TABLE
    out_len = math.ceil(length * target / orig)
    gain = 1.0 / math.sqrt(target / orig) if scale else 1.0
    dt = signal.dtype
    out = empty((*lead, out_len), dt)
    work = rows * out_len
    if is_cuda():
        tile = tile_geometry(up, down, taps, dt.itemsize) if whole else None
        if tile is not None:
            _launch_tile(data, out, (rows, length, out_len), (up, down, taps, left), tile, res_type, gain)
        elif whole:
            table = device_table(("resample", up, down, res_type, gain),
                                 lambda: filter_table(up, down, res_type) * gain, dt)  # fmt: skip
            _kernel("resample_poly", dt)(data.device_ptr, table.device_ptr, out.device_ptr, rows, length, out_len,
                                         up, down, taps, left, grid=kern.grid_for(work), block=kern.BLOCK)  # fmt: skip
        else:
            cutoff, half, beta = _direct_geometry(orig, target, res_type)
            _kernel("resample_direct", dt)(data.device_ptr, out.device_ptr, rows, length, out_len, orig / target,
                                           cutoff, half, beta, gain, grid=kern.grid_for(work),
                                           block=kern.BLOCK)  # fmt: skip
        return out
    x = host(data).astype(np.float64).reshape(rows, length)
    if whole:
        values = _host_resample(x, up, down, out_len, res_type)
    else:
        values = _host_direct(x, orig, target, out_len, res_type)
    host(out)[...] = (values * gain).reshape(out.shape).astype(dt.numpy)
    return out
