"""Issue 21, item 6: every public op fed each class of bad input, from one table.

Each op is listed once with valid random inputs and how to call it. The classes are derived from that
for every array argument (a freed array, a host NumPy array, an array on another device, a
non-contiguous view, a 0-d array) and for ``out=`` (freed, wrong shape, wrong dtype, a NumPy array,
another device, non-contiguous), plus per-op wrong dtypes, wrong shapes and bad scalar arguments
(NaN, infinity, out-of-range and wrong-type values). Every failing call must raise the typed error of
pygpukit.core.errors and change nothing: the inputs and a given ``out`` keep their contents and the
pool its in-use bytes. A non-contiguous operand either gives the contiguous result or a ShapeError.

Runs on both backends; the other-device class only on the CPU simulation backend, where an array can
claim another device without a GPU (on CUDA such an array would need a second device).
"""

from __future__ import annotations

import gc
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

import pygpukit as gp
from pygpukit.core.errors import (
    ArgumentError,
    DeviceError,
    DTypeError,
    InvalidPointerError,
    PyGPUkitError,
    ShapeError,
)
from pygpukit.core.memory import ExternalBuffer

_CPU = gp.current_backend() == "cpu"
_NEEDS_CPU = "an array on another device is simulated on the CPU backend only"

Arrays = dict[str, Any]
_rng = np.random.default_rng(21)


def _normal(*shape: int) -> np.ndarray[Any, Any]:
    return _rng.standard_normal(shape).astype(np.float32)


def _positive(*shape: int) -> np.ndarray[Any, Any]:
    return (_rng.random(shape) + 0.5).astype(np.float32)


def _ids(high: int, *shape: int) -> np.ndarray[Any, Any]:
    return _rng.integers(0, high, shape).astype(np.int32)


@dataclass
class Op:
    """One public op: its valid inputs (host arrays), how to call it with device arrays (``out`` and
    extra keyword arguments passed through), and its op-specific bad inputs."""

    inputs: dict[str, np.ndarray[Any, Any]]
    call: Callable[..., Any]
    out: bool = False
    host_ok: frozenset[str] = frozenset()  # arguments that also take host values
    receiver: str | None = None  # the array whose method this is (no host form of it exists)
    # Core copies and views: the CUDA backend copies between devices (peer access), so the CPU
    # backend's answer for memory of another device is its general PyGPUkitError, not DeviceError.
    copies_across_devices: bool = False
    dtypes: dict[str, Any] = field(default_factory=dict)  # argument -> a dtype it must refuse
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)  # argument -> a shape it must refuse
    params: list[tuple[dict[str, Any], type[Exception], str]] = field(default_factory=list)


def _binary(name: str) -> Op:
    function = getattr(gp, name)
    return Op(
        {"x1": _positive(3, 4), "x2": _positive(3, 4)},
        lambda a, out=None: function(a["x1"], a["x2"], out=out),
        out=True,
        shapes={"x2": (3, 5)},
    )


def _unary(name: str, refuses: Any = None) -> Op:
    function = getattr(gp, name)
    return Op(
        {"x": _positive(3, 4)},
        lambda a, out=None, **kw: function(a["x"], out=out, **kw),
        out=True,
        dtypes={} if refuses is None else {"x": refuses},
    )


def _reduction(name: str, **extra: Any) -> Op:
    function = getattr(gp.ops, name)
    return Op(
        {"x": _normal(3, 4)},
        lambda a, **kw: function(a["x"], **{"axis": 1, **extra, **kw}),
        params=[({"axis": 1.5}, ArgumentError, "axis must be"), ({"axis": 5}, ShapeError, "axis 5 is out of bounds")],
    )


_ATTENTION_DTYPES = {"q": gp.float64}
OPS: dict[str, Op] = {
    **{name: _binary(name) for name in ("add", "sub", "mul", "div", "pow", "maximum", "eq", "logical_and")},
    **{name: _unary(name) for name in ("exp", "sqrt", "silu", "logical_not")},
    "neg": _unary("neg", refuses=gp.bool_),
    "abs": _unary("abs"),
    "gelu": Op(
        {"x": _normal(3, 4)},
        lambda a, out=None, **kw: gp.gelu(a["x"], out=out, **kw),
        out=True,
        params=[
            ({"approximate": "fast"}, ArgumentError, "approximate must be"),
            ({"approximate": None}, ArgumentError, ""),
        ],
    ),
    "clamp": Op(
        {"x": _normal(3, 4), "low": _normal(3, 4) - 1, "high": _normal(3, 4) + 1},
        lambda a, out=None, **kw: gp.clamp(a["x"], kw.get("min", a["low"]), kw.get("max", a["high"]), out=out),
        out=True,
        shapes={"low": (3, 5)},
        params=[
            ({"min": None, "max": None}, ArgumentError, "clamp needs at least one of min and max"),
            ({"min": "low"}, DTypeError, "str"),
        ],
    ),
    "where": Op(
        {"condition": _rng.random((3, 4)) > 0.5, "x": _normal(3, 4), "y": _normal(3, 4)},
        lambda a, out=None: gp.where(a["condition"], a["x"], a["y"], out=out),
        out=True,
        shapes={"y": (2, 4)},
    ),
    "astype": Op(
        {"x": _normal(3, 4)},
        lambda a, **kw: gp.ops.astype(a["x"], kw.get("dtype", gp.float16)),
        params=[({"dtype": "float128"}, DTypeError, "unsupported dtype"), ({"dtype": 5}, DTypeError, "")],
    ),
    "copy_": Op(
        {"dst": _normal(3, 4), "src": _normal(3, 4)},
        lambda a: a["dst"].copy_(a["src"]),
        host_ok=frozenset({"src"}),
        receiver="dst",
        copies_across_devices=True,
        dtypes={"src": gp.float64},
        shapes={"src": (4, 3)},
    ),
    "to_numpy": Op({"x": _normal(3, 4)}, lambda a: a["x"].to_numpy(), receiver="x", copies_across_devices=True),
    "reshape": Op(
        {"x": _normal(3, 4)},
        lambda a, **kw: a["x"].reshape(kw.get("shape", (4, 3))).clone(),
        receiver="x",
        copies_across_devices=True,
        params=[({"shape": (2.5, 4)}, ShapeError, "dimension 2.5"), ({"shape": (5, 3)}, ShapeError, "cannot reshape")],
    ),
    "sum": _reduction("sum"),
    "mean": _reduction("mean"),
    "max": _reduction("max"),
    "all": _reduction("all"),
    "argmax": _reduction("argmax"),
    "cumsum": _reduction("cumsum"),
    "var": Op(
        {"x": _normal(3, 4)},
        lambda a, **kw: gp.ops.var(a["x"], **{"axis": 1, **kw}),
        params=[({"ddof": -1}, ArgumentError, "var: ddof"), ({"ddof": 1.5}, ArgumentError, "var: ddof")],
    ),
    "softmax": Op(
        {"x": _normal(3, 4)},
        lambda a, **kw: gp.softmax(a["x"], **kw),
        dtypes={"x": gp.int32},
        params=[({"axis": 1.5}, ArgumentError, "axis must be an int"), ({"axis": None}, ArgumentError, "")],
    ),
    "log_softmax": Op({"x": _normal(3, 4)}, lambda a: gp.ops.log_softmax(a["x"]), dtypes={"x": gp.int32}),
    "transpose": Op(
        {"x": _normal(3, 4)},
        lambda a, **kw: gp.ops.transpose(a["x"], **kw),
        params=[({"axes": (1.5, 0)}, ArgumentError, "axes must be integers"), ({"axes": (0, 0)}, ShapeError, "")],
    ),
    "concatenate": Op(
        {"a": _normal(3, 4), "b": _normal(2, 4)},
        lambda a, **kw: gp.ops.concatenate([a["a"], a["b"]], **kw),
        shapes={"b": (2, 5)},
        params=[({"axis": 1.5}, ArgumentError, "axis must be an int"), ({"axis": 2}, ShapeError, "")],
    ),
    "stack": Op(
        {"a": _normal(3, 4), "b": _normal(3, 4)},
        lambda a, **kw: gp.ops.stack([a["a"], a["b"]], **kw),
        shapes={"b": (4, 3)},
        params=[({"axis": "0"}, ArgumentError, "axis must be an int")],
    ),
    "split": Op(
        {"x": _normal(4, 4)},
        lambda a, **kw: gp.ops.split(a["x"], kw.get("sections", 2))[1].clone(),
        copies_across_devices=True,
        params=[({"sections": 1.5}, ArgumentError, "indices_or_sections"), ({"sections": 3}, ShapeError, "")],
    ),
    "broadcast_to": Op(
        {"x": _normal(1, 4)},
        lambda a, **kw: gp.ops.broadcast_to(a["x"], kw.get("shape", (3, 4))).clone(),
        copies_across_devices=True,
        params=[({"shape": ("a", 4)}, ArgumentError, "each dimension"), ({"shape": (3, 5)}, ShapeError, "")],
    ),
    "matmul": Op(
        {"a": _normal(3, 4), "b": _normal(4, 5)},
        lambda a, out=None: gp.matmul(a["a"], a["b"], out=out),
        out=True,
        dtypes={"a": gp.int32, "b": gp.float64},
        shapes={"b": (5, 5)},
    ),
    "linear": Op(
        {"x": _normal(3, 4), "w": _normal(5, 4), "b": _normal(5)},
        lambda a: gp.ops.linear(a["x"], a["w"], a["b"]),
        dtypes={"x": gp.float64, "b": gp.float64},
        shapes={"w": (5, 3), "b": (4,)},
    ),
    "gemv": Op(
        {"x": _normal(4), "w": _normal(4, 5), "o": np.zeros(5, np.float32)},
        lambda a: gp.ops.gemv(a["x"], a["w"], a["o"]),
        dtypes={"x": gp.float64, "o": gp.float16},
        shapes={"w": (4, 6)},
    ),
    "rmsnorm": Op(
        {"x": _normal(3, 8), "w": _normal(8)},
        lambda a, out=None, **kw: gp.rmsnorm(a["x"], a["w"], out=out, **kw),
        out=True,
        dtypes={"x": gp.int32, "w": gp.float64},
        shapes={"w": (9,)},
        params=[({"eps": v}, ArgumentError, "eps must be a finite number") for v in (math.nan, math.inf, -1.0, "a")],
    ),
    "layernorm": Op(
        {"x": _normal(3, 8), "w": _normal(8), "b": _normal(8)},
        lambda a, out=None, **kw: gp.layernorm(a["x"], a["w"], a["b"], out=out, **kw),
        out=True,
        dtypes={"x": gp.float64, "b": gp.int32},
        shapes={"b": (9,)},
        params=[({"eps": math.nan}, ArgumentError, "eps must be a finite number")],
    ),
    "l2norm": Op(
        {"x": _normal(3, 8)},
        lambda a, out=None, **kw: gp.ops.l2norm(a["x"], out=out, **kw),
        out=True,
        dtypes={"x": gp.int8},
        params=[({"eps": -math.inf}, ArgumentError, "eps must be a finite number")],
    ),
    "add_rmsnorm": Op(
        {"x": _normal(3, 8), "residual": _normal(3, 8), "w": _normal(8)},
        lambda a, out=None: gp.ops.add_rmsnorm(a["x"], a["residual"], a["w"], out=out)[0],
        out=True,
        dtypes={"residual": gp.float16},
        shapes={"residual": (3, 9)},
    ),
    "group_norm": Op(
        {"x": _normal(2, 4, 5), "w": _normal(4), "b": _normal(4)},
        lambda a, out=None, **kw: gp.ops.group_norm(a["x"], kw.pop("groups", 2), a["w"], a["b"], out=out, **kw),
        out=True,
        dtypes={"x": gp.int32},
        shapes={"w": (5,)},
        params=[
            ({"groups": 3}, ShapeError, "does not divide"),
            ({"groups": 0}, ArgumentError, ""),
            ({"eps": math.nan}, ArgumentError, "eps"),
        ],
    ),
    "swiglu": Op(
        {"gate": _normal(3, 8), "up": _normal(3, 8)},
        lambda a, out=None: gp.ops.swiglu(a["gate"], a["up"], out=out),
        out=True,
        dtypes={"up": gp.float16},
        shapes={"up": (3, 7)},
    ),
    "geglu": Op(
        {"gate": _normal(3, 8), "up": _normal(3, 8)},
        lambda a, out=None, **kw: gp.ops.geglu(a["gate"], a["up"], out=out, **kw),
        out=True,
        dtypes={"gate": gp.int32},
        params=[({"approximate": "fast"}, ArgumentError, "approximate")],
    ),
    "relu2": Op(
        {"x": _normal(3, 8)}, lambda a, out=None: gp.ops.relu2(a["x"], out=out), out=True, dtypes={"x": gp.int8}
    ),
    "embedding": Op(
        {"weight": _normal(10, 4), "ids": _ids(10, 3)},
        lambda a, out=None: gp.ops.embedding(a["weight"], a["ids"], out=out),
        out=True,
        dtypes={"ids": gp.float32},
        shapes={"weight": (10,)},
    ),
    "gather_last": Op(
        {"x": _normal(2, 3, 4), "lengths": np.array([1, 3], np.int32)},
        lambda a, out=None: gp.ops.gather_last(a["x"], a["lengths"], out=out),
        out=True,
        dtypes={"lengths": gp.float32},
        shapes={"lengths": (3,), "x": (2, 3)},
    ),
    "conv1d": Op(
        {"x": _normal(1, 2, 8), "w": _normal(3, 2, 3), "b": _normal(3)},
        lambda a, out=None, **kw: gp.ops.conv1d(a["x"], a["w"], a["b"], out=out, **kw),
        out=True,
        dtypes={"w": gp.float16, "b": gp.float64},
        shapes={"w": (3, 3, 3), "b": (4,)},
        params=[
            ({"stride": 0}, ArgumentError, "stride"),
            ({"padding": "middle"}, ArgumentError, "padding"),
            ({"dilation": 1.5}, ArgumentError, "dilation"),
            ({"activation": "tanh"}, ArgumentError, "activation"),
        ],
    ),
    "sdpa": Op(
        {"q": _normal(1, 4, 2, 64), "k": _normal(1, 4, 2, 64), "v": _normal(1, 4, 2, 64)},
        lambda a, out=None, **kw: gp.ops.sdpa(a["q"], a["k"], a["v"], out=out, **kw),
        out=True,
        dtypes={**_ATTENTION_DTYPES, "v": gp.float16},
        shapes={"k": (1, 4, 2, 32), "v": (1, 5, 2, 64)},
        params=[({"scale": v}, ArgumentError, "scale must be") for v in (math.nan, math.inf, 0.0, -1.0, "a")],
    ),
    "sdpa_causal": Op(
        {"q": _normal(1, 4, 2, 64), "k": _normal(1, 4, 2, 64), "v": _normal(1, 4, 2, 64)},
        lambda a, out=None, **kw: gp.ops.sdpa_causal(a["q"], a["k"], a["v"], out=out, **kw),
        out=True,
        dtypes=_ATTENTION_DTYPES,
        params=[({"window": 0}, ArgumentError, "window"), ({"window": 1.5}, ArgumentError, "window")],
    ),
    "decode_attention": Op(
        {
            "q": _normal(2, 2, 64),
            "k": _normal(2, 2, 8, 64),
            "v": _normal(2, 2, 8, 64),
            "lens": np.array([3, 8], np.int32),
        },
        lambda a, out=None, **kw: gp.ops.decode_attention(
            a["q"], a["k"], a["v"], kw.pop("lens", a["lens"]), out=out, **kw
        ),
        out=True,
        host_ok=frozenset({"lens"}),
        dtypes={**_ATTENTION_DTYPES, "lens": gp.int64},
        shapes={"lens": (3,), "v": (2, 2, 9, 64)},
        params=[
            ({"lens": [3, 9]}, ArgumentError, r"context_lens\[1\] = 9"),
            ({"lens": [3.0, 1.0]}, DTypeError, ""),
            ({"scale": math.nan}, ArgumentError, "scale"),
        ],
    ),
    "paged_decode_attention": Op(
        {
            "q": _normal(2, 2, 64),
            "k": _normal(4, 2, 4, 64),
            "v": _normal(4, 2, 4, 64),
            "table": np.array([[0, 2], [3, 1]], np.int32),
            "lens": np.array([5, 8], np.int32),
        },
        lambda a, out=None, **kw: gp.ops.paged_decode_attention(
            a["q"], a["k"], a["v"], kw.pop("table", a["table"]), kw.pop("lens", a["lens"]), out=out, **kw
        ),
        out=True,
        host_ok=frozenset({"table", "lens"}),
        dtypes={"k": gp.float16, "table": gp.int64, "lens": gp.float32},
        shapes={"table": (1, 2), "lens": (3,)},
        params=[  # host lengths: only then are the used block ids known on the GPU
            ({"table": [[0, 4], [3, 1]], "lens": [5, 8]}, ArgumentError, r"block_table\[0, 1\] = 4"),
            ({"lens": [5, 9]}, ArgumentError, r"context_lens\[1\] = 9"),
            ({"window": 0}, ArgumentError, "window"),
        ],
    ),
    "prefill_attention": Op(
        {
            "q": _normal(2, 2, 2, 64),
            "k": _normal(2, 2, 8, 64),
            "v": _normal(2, 2, 8, 64),
            "start": np.array([0, 3], np.int32),
        },
        lambda a, out=None, **kw: gp.ops.prefill_attention(
            a["q"], a["k"], a["v"], kw.pop("start", a["start"]), out=out, **kw
        ),
        out=True,
        host_ok=frozenset({"start"}),
        dtypes={**_ATTENTION_DTYPES, "start": gp.float32},
        shapes={"start": (1,)},
        params=[({"start": [0, 7]}, ArgumentError, "start_pos"), ({"start": [-1, 0]}, ArgumentError, "start_pos")],
    ),
    "greedy": Op(
        {"logits": _normal(2, 10)},
        lambda a, out=None: gp.ops.greedy(a["logits"], out=out),
        out=True,
        dtypes={"logits": gp.int32},
    ),
    "sample": Op(
        {"logits": _normal(2, 10)},
        lambda a, out=None, **kw: gp.ops.sample(a["logits"], out=out, **{"seed": 1, **kw}),
        out=True,
        dtypes={"logits": gp.float64},
        params=[
            ({"temperature": math.nan}, ArgumentError, "temperature"),
            ({"temperature": -1.0}, ArgumentError, ""),
            ({"top_p": 1.5}, ArgumentError, "top_p"),
            ({"top_p": math.nan}, ArgumentError, "top_p"),
            ({"top_k": -1}, ArgumentError, "top_k"),
            ({"min_p": math.inf}, ArgumentError, "min_p"),
            ({"repetition_penalty": 0.0}, ArgumentError, "repetition_penalty"),
            ({"seed": -1}, ArgumentError, "seed"),
            ({"temperature": "hot"}, DTypeError, "temperature"),
        ],
    ),
    "moe_topk_gating": Op(
        {"logits": _normal(3, 4)},
        lambda a, **kw: gp.ops.moe_topk_gating(a["logits"], kw.pop("k", 2), **kw)[0],
        dtypes={"logits": gp.int32},
        params=[
            ({"k": 0}, ArgumentError, "k=0"),
            ({"k": 1.5}, ArgumentError, "k must be an int"),
            ({"scoring": "max"}, ArgumentError, "scoring"),
        ],
    ),
    "moe_permute": Op(
        {"x": _normal(3, 4), "ids": _ids(4, 3, 2)},
        lambda a: gp.ops.moe_permute(a["x"], a["ids"], 4)[0],
        dtypes={"ids": gp.int64},
        shapes={"ids": (4, 2)},
    ),
    "bias_add_inplace": Op(
        {"x": _normal(3, 4), "b": _normal(4)},
        lambda a: gp.ops.bias_add_inplace(a["x"], a["b"]),
        dtypes={"b": gp.float64},
        shapes={"b": (3,)},
    ),
}


# -- running one call and checking that a failure changed nothing -----------------------------------
def _upload(op: Op) -> Arrays:
    return {name: gp.from_numpy(value) for name, value in op.inputs.items()}


def _freed(like: gp.GPUArray) -> gp.GPUArray:
    array = gp.empty(like.shape, like.dtype)
    array.buffer.free()
    return array


def _elsewhere(like: gp.GPUArray) -> gp.GPUArray:
    """An array that claims to live on cuda:7: nothing may read or write it."""
    return gp.GPUArray(ExternalBuffer(0x1000, max(like.nbytes, 1), 7, owner=None), like.shape, like.dtype)


def _strided(values: gp.GPUArray) -> gp.GPUArray:
    """A non-contiguous view holding ``values`` (every other element of the last axis)."""
    wide = gp.zeros((*values.shape[:-1], 2 * values.shape[-1]), values.dtype)
    view = wide[..., ::2]
    view.copy_(values)
    assert not view.is_contiguous
    return view


def _snapshot(arrays: Arrays) -> dict[str, np.ndarray[Any, Any]]:
    return {
        name: value.to_numpy()
        for name, value in arrays.items()
        if isinstance(value, gp.GPUArray) and not value.buffer.freed and value.buffer.device < 0
    }


def _fails_cleanly(
    call: Callable[[], Any], watched: Arrays, error: type[Exception] | tuple[type[Exception], ...], pattern: str = ""
) -> str:
    """Run ``call``, which must raise ``error`` (a PyGPUkitError) matching ``pattern``, and check that
    the watched arrays and the pool's in-use bytes are as before. Returns the message."""
    before = _snapshot(watched)
    gc.collect(1)
    in_use = gp.memory_stats()["in_use_bytes"]
    with pytest.raises(error, match=pattern or None) as caught:
        call()
    assert isinstance(caught.value, PyGPUkitError), repr(caught.value)
    message = str(caught.value)
    del caught  # its traceback holds the call's temporaries
    gc.collect(1)
    assert gp.memory_stats()["in_use_bytes"] == in_use, message
    for name, contents in before.items():
        np.testing.assert_array_equal(watched[name].to_numpy(), contents, err_msg=f"{name} changed: {message}")
    return message


def _result(value: Any) -> np.ndarray[Any, Any]:
    return value.to_numpy() if isinstance(value, gp.GPUArray) else np.asarray(value)


def _reference(op: Op) -> Any:
    return op.call(_upload(op))


def _same_as_reference(op: Op, got: Any) -> None:
    expected = _result(_reference(op))
    np.testing.assert_allclose(_result(got).astype(np.float64), expected.astype(np.float64), rtol=1e-6, atol=1e-6)


# -- the cases -------------------------------------------------------------------------------------
def _argument_cases() -> list[Any]:
    return [
        pytest.param(name, argument, kind, id=f"{name}-{argument}-{kind}")
        for name, op in OPS.items()
        for argument in op.inputs
        for kind in ("freed", "host", "other device", "non-contiguous", "0-d")
    ]


@pytest.mark.parametrize(("name", "argument", "kind"), _argument_cases())
def test_each_array_argument_refuses_bad_arrays(name: str, argument: str, kind: str) -> None:
    op = OPS[name]
    arrays = _upload(op)
    good = arrays[argument]
    if kind == "freed":
        arrays[argument] = _freed(good)
        message = _fails_cleanly(lambda: op.call(arrays), arrays, InvalidPointerError, "freed")
        if _CPU:  # native launches name the kernel's parameter instead
            assert f"shape {good.shape}" in message or argument in message or "buffer at" in message, message
    elif kind == "host":
        if argument == op.receiver:
            pytest.skip(f"{argument} is the array whose method {name} is")
        arrays[argument] = op.inputs[argument].copy()
        if argument in op.host_ok:
            _same_as_reference(op, op.call(arrays))
        else:
            _fails_cleanly(lambda: op.call(arrays), arrays, (DTypeError, DeviceError), "GPUArray|NumPy|host|needs")
    elif kind == "other device":
        if not _CPU:
            pytest.skip(_NEEDS_CPU)
        arrays[argument] = _elsewhere(good)
        if op.copies_across_devices or argument in op.host_ok:
            # Copies (and the host values of lengths, read first on the CPU backend) meet the memory
            # itself, which the CPU backend cannot reach: its general error. CUDA checks the devices.
            _fails_cleanly(lambda: op.call(arrays), arrays, PyGPUkitError)
        else:
            message = _fails_cleanly(lambda: op.call(arrays), arrays, DeviceError)
            assert "cuda:7" in message or "device 7" in message, message
    elif kind == "non-contiguous":
        if good.ndim == 0:
            pytest.skip("a 0-d array is always contiguous")
        arrays[argument] = _strided(good)
        try:
            got = op.call(arrays)
        except ShapeError:
            _fails_cleanly(lambda: op.call(arrays), arrays, ShapeError, "contiguous|stride")
        else:
            _same_as_reference(op, got)
    else:  # 0-d: only elementwise ops broadcast a scalar array; everything else must refuse it
        arrays[argument] = gp.from_numpy(np.asarray(op.inputs[argument].reshape(-1)[0]))
        try:
            got = op.call(arrays)
        except (ShapeError, ArgumentError):
            _fails_cleanly(lambda: op.call(arrays), arrays, (ShapeError, ArgumentError))
        else:
            assert name in _ZERO_D_OK, f"{name} accepted a 0-d {argument}: {got!r}"
            if name in _ELEMENTWISE:
                shapes = [v.shape for v in arrays.values() if isinstance(v, gp.GPUArray)]
                assert _result(got).shape == np.broadcast_shapes(*shapes)


_ELEMENTWISE = {"add", "sub", "mul", "div", "pow", "maximum", "eq", "logical_and", "clamp", "where"} | {
    "exp", "sqrt", "silu", "logical_not", "neg", "abs", "gelu", "astype",
}  # fmt: skip
# Also take a 0-d array: copies and views of one, a broadcast one, and ids of any shape.
_ZERO_D_OK = _ELEMENTWISE | {"copy_", "to_numpy", "transpose", "broadcast_to", "embedding"}


def _declared_cases() -> list[Any]:
    cases = []
    for name, op in OPS.items():
        cases += [pytest.param(name, "dtype", a, id=f"{name}-{a}-dtype {d}") for a, d in op.dtypes.items()]
        cases += [pytest.param(name, "shape", a, id=f"{name}-{a}-shape {s}") for a, s in op.shapes.items()]
    return cases


@pytest.mark.parametrize(("name", "kind", "argument"), _declared_cases())
def test_wrong_dtypes_and_shapes_are_refused(name: str, kind: str, argument: str) -> None:
    op = OPS[name]
    arrays = _upload(op)
    if kind == "dtype":
        dtype = gp.as_dtype(op.dtypes[argument])
        arrays[argument] = gp.from_numpy(op.inputs[argument]).astype(dtype)
        message = _fails_cleanly(lambda: op.call(arrays), arrays, DTypeError)
        assert dtype.name in message, message
    else:
        shape = op.shapes[argument]
        arrays[argument] = gp.zeros(shape, arrays[argument].dtype)
        message = _fails_cleanly(lambda: op.call(arrays), arrays, ShapeError)
        assert str(shape) in message or str(shape[-1]) in message, message


def _out_cases() -> list[Any]:
    kinds = ("freed", "shape", "dtype", "numpy", "other device", "non-contiguous")
    return [pytest.param(name, kind, id=f"{name}-out {kind}") for name, op in OPS.items() if op.out for kind in kinds]


@pytest.mark.parametrize(("name", "kind"), _out_cases())
def test_bad_out_is_refused_and_left_alone(name: str, kind: str) -> None:
    op = OPS[name]
    reference = _reference(op)
    arrays = _upload(op)
    shape, dtype = reference.shape, reference.dtype
    sentinel = gp.full(shape, 3, dtype)
    if kind == "freed":
        out: Any = _freed(reference)
        error: Any = InvalidPointerError
    elif kind == "shape":
        out, error = gp.full((*shape, 2), 3, dtype), ShapeError
    elif kind == "dtype":
        if not dtype.is_floating:
            pytest.skip(f"every dtype can hold a {dtype.name} result")
        out, error = gp.full(shape, 3, gp.int8), DTypeError
    elif kind == "numpy":
        out, error = np.full(shape, 3, dtype.numpy), DTypeError
    elif kind == "other device":
        if not _CPU:
            pytest.skip(_NEEDS_CPU)
        out, error = _elsewhere(reference), DeviceError
    else:
        out = _strided(sentinel)
        try:
            got = op.call(arrays, out=out)
        except ShapeError:
            _fails_cleanly(lambda: op.call(arrays, out=out), {**arrays, "out": out}, ShapeError, "contiguous|stride")
        else:
            assert got is out
            _same_as_reference(op, out)
        return
    before = out.copy() if isinstance(out, np.ndarray) else None
    _fails_cleanly(lambda: op.call(arrays, out=out), {**arrays, "out": out}, error)
    if before is not None:
        np.testing.assert_array_equal(out, before)


def _param_cases() -> list[Any]:
    return [
        pytest.param(name, i, id=f"{name}-{','.join(f'{k}={v!r}' for k, v in op.params[i][0].items()) or 'none'}")
        for name, op in OPS.items()
        for i in range(len(op.params))
    ]


@pytest.mark.parametrize(("name", "index"), _param_cases())
def test_bad_scalar_arguments_are_refused(name: str, index: int) -> None:
    op = OPS[name]
    kwargs, error, pattern = op.params[index]
    arrays = _upload(op)
    _fails_cleanly(lambda: op.call(arrays, **dict(kwargs)), arrays, error, pattern)


def test_every_op_of_the_table_runs_on_its_valid_inputs() -> None:
    """The table's valid calls work (so each bad case above fails for its one bad argument)."""
    for name, op in OPS.items():
        got = _result(op.call(_upload(op)))
        assert got.size > 0, name
        assert np.isfinite(got.astype(np.float64)).all(), name
