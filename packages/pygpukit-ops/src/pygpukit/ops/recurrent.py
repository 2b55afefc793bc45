"""LSTM (uni- or bidirectional, with per-sequence lengths) like torch.nn.LSTM with batch_first=True and
packed sequences. The input projection of every direction is one GEMM (``linear`` with the directions'
W_ih stacked); the recurrence is one launch per time step of native/kernels/nn/lstm.cu (``lstm_step``,
one warp per hidden unit, state in float32). The CPU backend computes the same in float64 with NumPy.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import Any

import numpy as np

from pygpukit.core.abi import KernelStruct
from pygpukit.core.array import GPUArray, from_numpy, zeros
from pygpukit.core.dtypes import float32
from pygpukit.core.errors import ArgumentError, ShapeError

from . import _cpu
from ._kernels import NAMESPACE, Groups, group, register_enumerator
from ._layout import check_devices, is_cuda
from ._nn_common import FLOATS, INT32_MAX, array, float_input, host64, same_dtype

__all__ = ["lstm"]

_FILE = "nn/lstm.cu"
LSTM_ARGS = KernelStruct("pygpukit::ops::lstm::LstmArgs", _FILE, [
    ("xw", "const void*"), ("w_hh", "const void*"), ("lengths", "const int*"), ("h_in", "const float*"),
    ("h_out", "float*"), ("c", "float*"), ("out", "void*"), ("directions", "int"), ("batch", "int"),
    ("steps", "int"), ("hidden", "int"), ("t", "int"), ("pad_", "int"),
])  # fmt: skip
_PARAMS = [LSTM_ARGS.param("args")]
_BLOCK = 128  # 4 warps, one hidden unit each


def _expression(dtype: Any) -> str:
    return f"{NAMESPACE}lstm::lstm_step<{dtype.ctype}>"


def _lengths(name: str, lengths: Any, batch: int, steps: int) -> list[int]:
    if lengths is None:
        return [steps] * batch
    if isinstance(lengths, GPUArray):
        lengths = lengths.to_numpy().tolist()
    if isinstance(lengths, np.ndarray):
        lengths = lengths.tolist()
    if not isinstance(lengths, Sequence) or len(lengths) != batch:
        raise ShapeError(f"{name}: lengths must be a sequence of {batch} ints (one per sample), got {lengths!r}")
    result = []
    for value in lengths:
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not 0 <= int(value) <= steps:
            raise ArgumentError(f"{name}: every length must be an integer in [0, {steps}], got {value!r}")
        result.append(int(value))
    return result


def _state(name: str, what: str, value: Any, shape: tuple[int, ...], x: GPUArray) -> GPUArray | None:
    if value is None:
        return None
    a = array(name, what, value)
    same_dtype(name, what, a, x.dtype)
    if a.shape != shape:
        raise ShapeError(f"{name}: {what} must have shape {shape}, got {a.shape}")
    return a


def lstm(
    x: GPUArray,
    w_ih: GPUArray,
    w_hh: GPUArray,
    bias: GPUArray | None = None,
    *,
    lengths: Sequence[int] | GPUArray | None = None,
    h0: GPUArray | None = None,
    c0: GPUArray | None = None,
) -> tuple[GPUArray, GPUArray, GPUArray]:
    """LSTM over ``x`` (N, T, I) with torch's gate order (input, forget, cell, output): ``w_ih``
    (D, 4H, I), ``w_hh`` (D, 4H, H), ``bias`` (D, 4H) = b_ih + b_hh or None; D = 1 (forward) or 2
    (bidirectional, the second direction runs backwards). ``lengths`` (N ints, default all T): sample n
    uses its first lengths[n] frames only, as torch's pack_padded_sequence (the backward direction
    starts at frame lengths[n] - 1; outputs past the length are zero). ``h0``, ``c0`` (D, N, H) or None
    (zeros). Returns (out (N, T, D * H), h_n (D, N, H), c_n (D, N, H)); h_n of the backward direction
    is its state after frame 0."""
    name = "lstm"
    x = float_input(name, "x", x)
    w_ih = array(name, "w_ih", w_ih)
    w_hh = array(name, "w_hh", w_hh)
    same_dtype(name, "w_ih", w_ih, x.dtype)
    same_dtype(name, "w_hh", w_hh, x.dtype)
    if x.ndim != 3:
        raise ShapeError(f"{name}: x must be (N, T, I), got shape {x.shape}")
    batch, steps, features = x.shape
    if w_ih.ndim != 3 or w_ih.shape[0] not in (1, 2) or w_ih.shape[1] % 4 or w_ih.shape[2] != features:
        raise ShapeError(f"{name}: w_ih must be (D, 4H, {features}) with D 1 or 2, got shape {w_ih.shape}")
    directions, hidden = w_ih.shape[0], w_ih.shape[1] // 4
    if hidden == 0:
        raise ShapeError(f"{name}: w_ih {w_ih.shape} gives hidden size 0")
    if w_hh.shape != (directions, 4 * hidden, hidden):
        raise ShapeError(f"{name}: w_hh must have shape {(directions, 4 * hidden, hidden)}, got {w_hh.shape}")
    if bias is not None:
        bias = array(name, "bias", bias)
        same_dtype(name, "bias", bias, x.dtype)
        if bias.shape != (directions, 4 * hidden):
            raise ShapeError(f"{name}: bias must have shape {(directions, 4 * hidden)}, got {bias.shape}")
    state_shape = (directions, batch, hidden)
    h0 = _state(name, "h0", h0, state_shape, x)
    c0 = _state(name, "c0", c0, state_shape, x)
    lens = _lengths(name, lengths, batch, steps)
    check_devices(name, [a for a in (x, w_ih, w_hh, bias, h0, c0) if a is not None])
    if batch * steps * directions * hidden > INT32_MAX or 4 * hidden * max(features, hidden) > INT32_MAX:
        raise ShapeError(f"{name}: x {x.shape} with hidden size {hidden} is too large for the kernel's indices")
    if not is_cuda():
        return _cpu_lstm(x, w_ih, w_hh, bias, lens, h0, c0)
    out = zeros((batch, steps, directions * hidden), x.dtype)
    h = [zeros(state_shape, float32) if h0 is None else h0.astype(float32), zeros(state_shape, float32)]
    c = zeros(state_shape, float32) if c0 is None else c0.astype(float32)
    longest = max(lens, default=0)
    if batch and longest:
        x2 = (x if x.is_contiguous else x.contiguous()).reshape(batch * steps, features)
        w_stack = (w_ih if w_ih.is_contiguous else w_ih.contiguous()).reshape(directions * 4 * hidden, features)
        b_stack = None if bias is None else (bias if bias.is_contiguous else bias.contiguous()).reshape(-1)
        from .gemm.api import linear  # the GEMM family imports late: it is the heaviest module

        xw = linear(x2, w_stack, b_stack)
        recurrent = w_hh if w_hh.is_contiguous else w_hh.contiguous()
        dev_lens = from_numpy(np.asarray(lens, np.int32))
        expression = _expression(x.dtype)
        kernel = group(_FILE, [expression]).kernel(expression, _PARAMS)
        grid = -(-(directions * batch * hidden * 32) // _BLOCK)
        for t in range(longest):
            args = LSTM_ARGS.pack_flat(xw.device_ptr, recurrent.device_ptr, dev_lens.device_ptr, h[0].device_ptr,
                                       h[1].device_ptr, c.device_ptr, out.device_ptr, directions, batch, steps,
                                       hidden, t, 0)  # fmt: skip
            kernel(args, grid=grid, block=_BLOCK)
            h.reverse()
    return out, h[0].astype(x.dtype), c.astype(x.dtype)


def _sigmoid(v: Any) -> Any:
    return 1.0 / (1.0 + np.exp(-v))


def lstm_reference(x: Any, w_ih: Any, w_hh: Any, bias: Any, lengths: Sequence[int], h0: Any = None,
                   c0: Any = None) -> tuple[Any, Any, Any]:  # fmt: skip
    """The LSTM in float64 NumPy on host arrays (x (N, T, I), weights as :func:`lstm`)."""
    batch, steps, _ = x.shape
    directions, four_h, _ = w_ih.shape
    hidden = four_h // 4
    out = np.zeros((batch, steps, directions * hidden))
    h_n = np.zeros((directions, batch, hidden)) if h0 is None else np.array(h0, np.float64)
    c_n = np.zeros((directions, batch, hidden)) if c0 is None else np.array(c0, np.float64)
    for d in range(directions):
        for n in range(batch):
            h, c = h_n[d, n].copy(), c_n[d, n].copy()
            frames = range(lengths[n]) if d == 0 else range(lengths[n] - 1, -1, -1)
            for t in frames:
                gates = w_ih[d] @ x[n, t] + w_hh[d] @ h + (0.0 if bias is None else bias[d])
                i, f = _sigmoid(gates[:hidden]), _sigmoid(gates[hidden : 2 * hidden])
                g, o = np.tanh(gates[2 * hidden : 3 * hidden]), _sigmoid(gates[3 * hidden :])
                c = f * c + i * g
                h = o * np.tanh(c)
                out[n, t, d * hidden : (d + 1) * hidden] = h
            h_n[d, n], c_n[d, n] = h, c
    return out, h_n, c_n


def _cpu_lstm(x: GPUArray, w_ih: GPUArray, w_hh: GPUArray, bias: GPUArray | None, lens: list[int],
              h0: GPUArray | None, c0: GPUArray | None) -> tuple[GPUArray, GPUArray, GPUArray]:  # fmt: skip
    def opt(a: GPUArray | None) -> Any:
        return None if a is None else host64(a)

    out_v, h_v, c_v = lstm_reference(host64(x), host64(w_ih), host64(w_hh), opt(bias), lens, opt(h0), opt(c0))
    results = []
    for values in (out_v, h_v, c_v):
        target = zeros(values.shape, x.dtype)
        _cpu.store(target, values)
        results.append(target)
    return results[0], results[1], results[2]


def _enumerate() -> Groups:
    return {_FILE: [(_expression(d),) for d in FLOATS]}


register_enumerator(_enumerate)
