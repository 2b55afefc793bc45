"""Launch helpers of the spectral kernels (native/kernels/audio/spectral.cu) shared by the audio modules:
parameter lists, the finiteness check, device copies of host tables, dense layouts of strided views, and
batched rows of signals."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from pygpukit.core.array import GPUArray, from_numpy
from pygpukit.core.dtypes import DType
from pygpukit.core.errors import ArgumentError, ShapeError
from pygpukit.core.jit import JITKernel, Param
from pygpukit.core.plans import PlanCache
from pygpukit.core.stream import thread_device

from . import _kernels as kern
from ._finite import check_finite

__all__ = ["PAD_MODES", "check_finite", "dense", "device_table", "launch", "pad_mode_code", "signal_rows"]

_P = kern.pointer


def _i(name: str) -> Param:
    return kern.c_param(name, "int")


def _q(name: str) -> Param:
    return kern.c_param(name, "long long")


def _d(name: str) -> Param:
    return kern.c_param(name, "double")


PARAMS: dict[str, tuple[Param, ...]] = {
    "count_nonfinite": (_P("x"), _q("n"), _P("count")),
    "frame_signal": (_P("x"), _P("out"), _P("window"), _q("rows"), _q("length"), _q("x_row"), _q("n_frames"),
                     _i("frame_length"), _i("hop"), _q("pad_left"), _i("pad_mode")),
    "overlap_add": (_P("frames"), _P("window"), _P("out"), _q("rows"), _q("n_frames"), _i("frame_length"), _i("hop"),
                    _q("start"), _q("out_len"), _d("tiny")),
    "spectrum_power": (_P("s"), _P("out"), _q("n"), _d("power")),
    "apply_scale_db": (_P("x"), _P("out"), _q("n"), _d("amin"), _d("ref_value"), _P("ref_ptr"), _d("top_db"),
                       _P("max_ptr")),
    "spectral_moments": (_P("s"), _P("freq"), _P("out"), _q("rows"), _q("inner"), _q("s_outer"), _q("s_inner"),
                         _q("s_elem"), _i("n_freq"), _i("mode"), _d("p"), _d("param"), _i("norm"), _d("tiny")),
    "frame_rms": (_P("x"), _P("out"), _q("rows"), _q("length"), _q("x_row"), _q("n_frames"), _i("frame_length"),
                  _i("hop"), _q("pad_left"), _i("pad_mode")),
    "zero_crossings": (_P("x"), _P("out"), _q("rows"), _q("length"), _q("x_row"), _q("n_frames"), _i("frame_length"),
                       _i("hop"), _q("pad_left"), _i("pad_mode"), _d("threshold"), _i("zero_pos")),
    "preemphasis": (_P("x"), _P("out"), _q("rows"), _q("length"), _d("coef"), _P("zi")),
    "deemphasis": (_P("x"), _P("out"), _P("zf"), _q("rows"), _q("length"), _d("coef"), _P("zi"), _i("default_zi")),
    "savgol_delta": (_P("x"), _P("out"), _P("coefs"), _q("rows"), _q("inner"), _q("x_outer"), _q("x_inner"),
                     _q("x_elem"), _q("length"), _i("width")),
}  # fmt: skip

_PAD = kern.enum_values("PadMode")
PAD_MODES = {"constant": _PAD["kPadConstant"], "reflect": _PAD["kPadReflect"], "edge": _PAD["kPadEdge"],
             "symmetric": _PAD["kPadSymmetric"], "wrap": _PAD["kPadWrap"]}  # fmt: skip


def kernel(name: str, dtype: DType) -> JITKernel:
    return kern.kernel(name, dtype, PARAMS[name])


def launch(name: str, dtype: DType, work: int, *args: Any, block: int = kern.BLOCK, per_block: int | None = None,
           grid: int | None = None) -> None:  # fmt: skip
    """A grid-stride launch of ``name`` over ``work`` items (``per_block`` items a block; default one a thread)."""
    blocks = grid if grid is not None else kern.grid_for(work, per_block or block)
    kernel(name, dtype)(*args, grid=blocks, block=block)


def pad_mode_code(name: str, mode: Any, allowed: tuple[str, ...] = tuple(PAD_MODES)) -> int:
    if not isinstance(mode, str) or mode not in allowed:
        raise ArgumentError(f"{name}: pad_mode must be one of {', '.join(repr(m) for m in allowed)}, got {mode!r}")
    return PAD_MODES[mode]


_TABLES: PlanCache[GPUArray] = PlanCache("audio.tables", maxsize=512)


def device_table(key: tuple[Any, ...], make: Any, dtype: DType) -> GPUArray:
    """A host table (``make()``, float64) rounded once to ``dtype`` on the device, kept per key and device."""
    full = (*key, dtype, thread_device())
    found = _TABLES.get(full)
    if found is None:
        values = np.ascontiguousarray(np.asarray(make(), dtype=np.float64).astype(dtype.numpy))
        found = _TABLES.put(full, from_numpy(values))
    return found


def dense(x: GPUArray, keep_last: int = 0) -> tuple[GPUArray, tuple[int, ...]]:
    """``x`` as a contiguous array ``d`` and a permutation ``order`` with ``x == d.transpose(back)``: the axes of
    ``x`` sorted by decreasing stride when that order is contiguous (a transposed view of dense memory, as
    stft returns; no copy), else a device copy in the given order. The last ``keep_last`` axes stay last."""
    free = x.ndim - keep_last
    order = tuple(sorted(range(free), key=lambda a: -x.strides[a] if x.shape[a] > 1 else 0)) + tuple(
        range(free, x.ndim)
    )
    candidate = x.transpose(order)
    if candidate.is_contiguous:
        return candidate, order
    identity = tuple(range(x.ndim))
    return x.contiguous(), identity


def undo(result: GPUArray, order: tuple[int, ...]) -> GPUArray:
    """The view of ``result`` (laid out in ``order``) in the original axis order."""
    if order == tuple(range(len(order))):
        return result
    back = tuple(int(i) for i in np.argsort(order))
    return result.transpose(back)


def signal_rows(name: str, y: GPUArray) -> tuple[GPUArray, tuple[int, ...], int, int]:
    """A batch of signals (..., T) as contiguous rows: (array, leading shape, rows, T)."""
    if y.ndim < 1:
        raise ShapeError(f"{name}: y must have at least one dimension (..., T), got shape {y.shape}")
    data = y if y.is_contiguous else y.contiguous()
    lead = y.shape[:-1]
    return data, lead, math.prod(lead), y.shape[-1]
