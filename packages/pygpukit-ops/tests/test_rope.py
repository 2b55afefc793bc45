"""RoPE: tables against independently written float64 formulas (and transformers' ROPE_INIT_FUNCTIONS
where importable), apply_rope against a float64 NumPy rotation for both styles, every scaling type,
partial rotary dims and the shapes of Qwen2.5-7B, Llama-3-8B and SmolLM2-135M; typed errors that leave
q and k unchanged; on the GPU, graph replays at new device positions bitwise equal to eager runs."""

from __future__ import annotations

import math
import zlib
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from ops_testing import Array, sample

import pygpukit as gp
from pygpukit.core.backend import current_backend
from pygpukit.core.dtypes import DType
from pygpukit.core.errors import ArgumentError, DTypeError, ShapeError

ROPE_DTYPES = [gp.float32, gp.float16, gp.bfloat16]
F64 = np.float64

LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8192}  # fmt: skip
SCALINGS: dict[str, dict[str, Any] | None] = {
    "default": None,
    "linear": {"rope_type": "linear", "factor": 4.0},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0, "max_position_embeddings": 256},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 2048},
    "yarn-mscale": {"type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096, "mscale": 1.0,
                    "mscale_all_dim": 0.707, "beta_fast": 32, "beta_slow": 1},
    "yarn-attention-factor": {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 4096,
                              "attention_factor": 1.25, "beta_fast": 16, "beta_slow": 2},
    "llama3": LLAMA3,
}  # fmt: skip

# (name, batch, seq, q heads, kv heads, head_dim, theta, scaling)
MODELS = [
    ("qwen2.5-7b", 2, 37, 28, 4, 128, 1e6, None),
    ("llama-3-8b", 1, 45, 32, 8, 128, 5e5, LLAMA3),
    ("smollm2-135m", 3, 19, 9, 3, 64, 1e5, None),
]


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(request.node.name.encode()))


# -- the reference formulas, written independently of the library (scalar loops in math) ----------
def reference_inv_freq(head_dim: int, theta: float, rotary_dim: int | None, scaling: dict[str, Any] | None,
                       seq_len: int) -> tuple[list[float], float]:  # fmt: skip
    dim = rotary_dim or head_dim
    kind = "default" if scaling is None else scaling.get("rope_type", scaling.get("type"))
    plain = [theta ** (-(2.0 * i) / dim) for i in range(dim // 2)]
    if kind == "default":
        return plain, 1.0
    assert scaling is not None
    factor = scaling["factor"]
    if kind == "linear":
        return [f / factor for f in plain], 1.0
    if kind == "dynamic":
        trained = scaling["max_position_embeddings"]
        length = max(seq_len, trained)
        new_base = theta * ((factor * length / trained) - (factor - 1)) ** (dim / (dim - 2))
        return [new_base ** (-(2.0 * i) / dim) for i in range(dim // 2)], 1.0
    if kind == "yarn":
        original = scaling["original_max_position_embeddings"]

        def mscale(scale: float, m: float = 1.0) -> float:
            return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

        if scaling.get("attention_factor") is not None:
            attention = scaling["attention_factor"]
        elif scaling.get("mscale") and scaling.get("mscale_all_dim"):
            attention = mscale(factor, scaling["mscale"]) / mscale(factor, scaling["mscale_all_dim"])
        else:
            attention = mscale(factor)
        fast, slow = scaling.get("beta_fast", 32), scaling.get("beta_slow", 1)

        def dim_for(rotations: float) -> float:
            return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(theta))

        low = max(math.floor(dim_for(fast)), 0)
        high = min(math.ceil(dim_for(slow)), dim - 1)
        if low == high:
            high += 0.001
        out = []
        for i, f in enumerate(plain):
            ramp = min(max((i - low) / (high - low), 0.0), 1.0)  # 0: extrapolate, 1: interpolate
            out.append(f * (1 - ramp) + (f / factor) * ramp)
        return out, attention
    assert kind == "llama3"
    low_factor, high_factor = scaling["low_freq_factor"], scaling["high_freq_factor"]
    old = scaling["original_max_position_embeddings"]
    out = []
    for f in plain:
        wavelength = 2 * math.pi / f
        if wavelength < old / high_factor:
            out.append(f)
        elif wavelength > old / low_factor:
            out.append(f / factor)
        else:
            smooth = (old / wavelength - low_factor) / (high_factor - low_factor)
            out.append((1 - smooth) * f / factor + smooth * f)
    return out, 1.0


def reference_tables(head_dim: int, positions: int, theta: float, rotary_dim: int | None,
                     scaling: dict[str, Any] | None) -> tuple[Array, Array]:  # fmt: skip
    inv, attention = reference_inv_freq(head_dim, theta, rotary_dim, scaling, positions)
    angles = np.outer(np.arange(positions, dtype=F64), np.array(inv, dtype=F64))
    return np.cos(angles) * attention, np.sin(angles) * attention


def reference_rope(x: Array, cos: Array, sin: Array, positions: Array, style: str) -> Array:
    """float64 rotation of x (batch, seq, heads, head_dim) by the table rows of positions."""
    out = x.astype(F64)
    half = cos.shape[1]
    pos = np.broadcast_to(positions, x.shape[:2])
    c = cos.astype(F64)[pos][:, :, None, :]
    s = sin.astype(F64)[pos][:, :, None, :]
    if style == "neox":
        x1, x2 = out[..., :half].copy(), out[..., half : 2 * half].copy()
        out[..., :half] = x1 * c - x2 * s
        out[..., half : 2 * half] = x2 * c + x1 * s
    else:
        x1, x2 = out[..., 0 : 2 * half : 2].copy(), out[..., 1 : 2 * half : 2].copy()
        out[..., 0 : 2 * half : 2] = x1 * c - x2 * s
        out[..., 1 : 2 * half : 2] = x2 * c + x1 * s
    return out


_ULP = {"float32": 1.2e-7, "float16": 9.8e-4, "bfloat16": 7.9e-3}


def assert_rotated(actual: Array, expected: Array, dtype: DType, what: str = "") -> None:
    """One rounding to dtype of a float32 computation of terms of magnitude <= ~3."""
    assert actual.dtype == dtype.numpy, (what, actual.dtype)
    np.testing.assert_allclose(actual.astype(F64), expected, rtol=_ULP[dtype.name], atol=4e-6, err_msg=what)


def activations(rng: np.random.Generator, shape: tuple[int, ...], dtype: DType) -> Array:
    return sample(rng, shape, dtype, -2.0, 2.0)


# -- tables ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(SCALINGS))
@pytest.mark.parametrize(("head_dim", "rotary_dim"), [(128, None), (64, None), (128, 64), (80, 32)])
def test_inv_freq_matches_the_formulas(name: str, head_dim: int, rotary_dim: int | None) -> None:
    scaling = SCALINGS[name]
    for theta in (1e4, 5e5, 1e6):
        inv, attention = gp.rope_inv_freq(head_dim, theta, rotary_dim, scaling, seq_len=1000)
        want, want_attention = reference_inv_freq(head_dim, theta, rotary_dim, scaling, 1000)
        assert inv.dtype == np.float64
        assert inv.shape == ((rotary_dim or head_dim) // 2,)
        np.testing.assert_allclose(inv, want, rtol=1e-13, atol=0)
        assert attention == pytest.approx(want_attention, rel=1e-14)


def test_scaling_changes_the_frequencies() -> None:
    """Guards against a reference that agrees by doing nothing: every scaling type moves some frequency."""
    plain, _ = gp.rope_inv_freq(128, 5e5)
    for name, scaling in SCALINGS.items():
        if scaling is None:
            continue
        scaled, attention = gp.rope_inv_freq(128, 5e5, scaling=scaling, seq_len=4096)
        assert not np.allclose(scaled, plain) or attention != 1.0, name
    llama, _ = gp.rope_inv_freq(128, 5e5, scaling=LLAMA3)
    assert llama[0] == plain[0]
    assert llama[-1] == pytest.approx(plain[-1] / 8)
    _, yarn_attention = gp.rope_inv_freq(128, 1e4, scaling=SCALINGS["yarn"])
    assert yarn_attention == pytest.approx(0.1 * math.log(4.0) + 1.0)


@pytest.mark.parametrize("name", list(SCALINGS))
@pytest.mark.parametrize("dtype", ROPE_DTYPES, ids=str)
def test_tables_match_the_formulas(name: str, dtype: DType) -> None:
    scaling = SCALINGS[name]
    positions = 300
    cos, sin = gp.rope_cos_sin(128, positions, 1e4, rotary_dim=96, scaling=scaling, dtype=dtype)
    assert cos.shape == sin.shape == (positions, 48)
    assert cos.dtype == sin.dtype == dtype
    want_cos, want_sin = reference_tables(128, positions, 1e4, 96, scaling)
    # float64 tables rounded once: within half an ulp of the dtype (plus a float64 angle error).
    for got, want in ((cos.to_numpy(), want_cos), (sin.to_numpy(), want_sin)):
        atol = 2.0**-25 if dtype == gp.float16 else 1e-12  # half the spacing of float16's subnormals
        np.testing.assert_allclose(got.astype(F64), want, rtol=_ULP[dtype.name] / 2 + 1e-12, atol=atol)


def test_dynamic_tables_follow_the_sequence_length() -> None:
    scaling = SCALINGS["dynamic"]
    short, _ = gp.rope_cos_sin(64, 100, 1e4, scaling=scaling)  # below max_position_embeddings: unscaled
    plain, _ = gp.rope_cos_sin(64, 100, 1e4)
    np.testing.assert_array_equal(short.to_numpy(), plain.to_numpy())
    long, _ = gp.rope_cos_sin(64, 1000, 1e4, scaling=scaling)
    want, _ = reference_tables(64, 1000, 1e4, None, scaling)
    np.testing.assert_allclose(long.to_numpy().astype(F64), want, rtol=1e-7, atol=1e-7)


@pytest.mark.parametrize("name", [n for n in SCALINGS if n != "default"])
def test_inv_freq_matches_transformers(name: str) -> None:
    pytest.importorskip("torch", reason="transformers' RoPE functions need torch")
    transformers = pytest.importorskip("transformers", reason="transformers is not installed here")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    scaling = dict(SCALINGS[name] or {})
    rope_type = scaling.get("rope_type", scaling.get("type"))
    if rope_type not in ROPE_INIT_FUNCTIONS:
        pytest.skip(f"this transformers version has no {rope_type!r} in ROPE_INIT_FUNCTIONS")
    head_dim, theta, heads = 128, 5e5, 4
    hf_scaling = {key: value for key, value in scaling.items() if key != "max_position_embeddings"}
    hf_scaling["rope_type"] = rope_type
    hf_scaling.pop("type", None)
    # Both readings of YaRN's factor (given, or max/original in newer versions) agree for this length.
    max_positions = int(scaling.get("max_position_embeddings") or scaling["factor"] *
                        scaling.get("original_max_position_embeddings", 4096))  # fmt: skip
    config = transformers.LlamaConfig(hidden_size=head_dim * heads, num_attention_heads=heads, head_dim=head_dim,
                                      num_key_value_heads=heads, rope_theta=theta, rope_scaling=hf_scaling,
                                      max_position_embeddings=max_positions)  # fmt: skip
    function = ROPE_INIT_FUNCTIONS[rope_type]
    seq_len = 3 * max_positions
    hf_inv, hf_attention = (
        function(config, "cpu", seq_len=seq_len) if rope_type == "dynamic" else function(config, "cpu")
    )
    ours_scaling = dict(scaling)
    ours_scaling.setdefault("max_position_embeddings", max_positions)
    inv, attention = gp.rope_inv_freq(head_dim, theta, scaling=ours_scaling, seq_len=seq_len)
    np.testing.assert_allclose(inv, hf_inv.double().numpy(), rtol=2e-6, atol=0)  # HF computes in float32
    assert attention == pytest.approx(float(hf_attention), rel=1e-6)


def test_table_arguments_are_checked() -> None:
    with pytest.raises(ArgumentError, match="rotary_dim"):
        gp.rope_cos_sin(64, 10, rotary_dim=65)
    with pytest.raises(ArgumentError, match="rotary_dim"):
        gp.rope_cos_sin(64, 10, rotary_dim=66)
    with pytest.raises(ArgumentError, match="max_positions"):
        gp.rope_cos_sin(64, 0)
    with pytest.raises(ArgumentError, match="theta"):
        gp.rope_cos_sin(64, 10, theta=1.0)
    with pytest.raises(ArgumentError, match="unsupported rope_type 'longrope'"):
        gp.rope_cos_sin(64, 10, scaling={"rope_type": "longrope", "factor": 2.0})
    with pytest.raises(ArgumentError, match="'factor'"):
        gp.rope_cos_sin(64, 10, scaling={"rope_type": "linear"})
    with pytest.raises(ArgumentError, match="original_max_position_embeddings"):
        gp.rope_cos_sin(64, 10, scaling={"rope_type": "yarn", "factor": 2.0})
    with pytest.raises(ArgumentError, match="high_freq_factor"):
        gp.rope_cos_sin(64, 10, scaling={**LLAMA3, "high_freq_factor": 0.5})
    with pytest.raises(DTypeError, match="float64"):
        gp.rope_cos_sin(64, 10, dtype=gp.float64)


# -- apply_rope ------------------------------------------------------------------------------------
def _run(rng: np.random.Generator, batch: int, seq: int, q_heads: int, kv_heads: int, head_dim: int, theta: float,
         scaling: dict[str, Any] | None, dtype: DType, style: str, rotary_dim: int | None = None,
         table_dtype: DType = gp.float32, per_batch: bool = True, max_positions: int = 4096) -> None:  # fmt: skip
    hq = activations(rng, (batch, seq, q_heads, head_dim), dtype)
    hk = activations(rng, (batch, seq, kv_heads, head_dim), dtype)
    if per_batch:
        hp = rng.integers(0, max_positions, size=(batch, seq)).astype(np.int32)
    else:
        hp = (np.arange(seq) + rng.integers(0, max_positions - seq)).astype(np.int32)
    cos, sin = gp.rope_cos_sin(head_dim, max_positions, theta, rotary_dim, scaling, table_dtype)
    q, k, positions = gp.from_numpy(hq), gp.from_numpy(hk), gp.from_numpy(hp)
    gp.apply_rope(q, k, cos, sin, positions, style=style, rotary_dim=rotary_dim)
    hc, hs = cos.to_numpy(), sin.to_numpy()
    got_q, got_k = q.to_numpy(), k.to_numpy()
    assert_rotated(got_q, reference_rope(hq, hc, hs, hp, style), dtype, "q")
    assert_rotated(got_k, reference_rope(hk, hc, hs, hp, style), dtype, "k")
    rd = rotary_dim or head_dim
    if rd < head_dim:  # the dimensions past rotary_dim are untouched, bit for bit
        assert got_q[..., rd:].tobytes() == hq[..., rd:].tobytes()
        assert got_k[..., rd:].tobytes() == hk[..., rd:].tobytes()


@pytest.mark.parametrize("style", ["neox", "gptj"])
@pytest.mark.parametrize("dtype", ROPE_DTYPES, ids=str)
@pytest.mark.parametrize("model", MODELS, ids=[m[0] for m in MODELS])
def test_model_shapes(rng: np.random.Generator, model: tuple[Any, ...], dtype: DType, style: str) -> None:
    _, batch, seq, q_heads, kv_heads, head_dim, theta, scaling = model
    _run(rng, batch, seq, q_heads, kv_heads, head_dim, theta, scaling, dtype, style)


@pytest.mark.parametrize("style", ["neox", "gptj"])
@pytest.mark.parametrize("name", list(SCALINGS))
def test_every_scaling_type(rng: np.random.Generator, name: str, style: str) -> None:
    _run(rng, 2, 11, 4, 2, 64, 1e4, SCALINGS[name], gp.bfloat16, style, per_batch=False, max_positions=777)


@pytest.mark.parametrize("style", ["neox", "gptj"])
@pytest.mark.parametrize("dtype", ROPE_DTYPES, ids=str)
@pytest.mark.parametrize(("head_dim", "rotary_dim"), [(128, 64), (64, 32), (80, 40), (96, 6), (12, 12)])
def test_partial_rotary(rng: np.random.Generator, dtype: DType, style: str, head_dim: int, rotary_dim: int) -> None:
    _run(rng, 2, 5, 3, 1, head_dim, 1e4, None, dtype, style, rotary_dim=rotary_dim, max_positions=64)


@pytest.mark.parametrize("dtype", [gp.float16, gp.bfloat16], ids=str)
def test_tables_in_the_activation_dtype(rng: np.random.Generator, dtype: DType) -> None:
    _run(rng, 1, 9, 4, 2, 128, 1e6, None, dtype, "neox", table_dtype=dtype)


def test_positions_per_sequence_and_shared(rng: np.random.Generator) -> None:
    _run(rng, 3, 4, 2, 2, 64, 1e4, None, gp.float32, "neox", per_batch=False)
    _run(rng, 3, 4, 2, 2, 64, 1e4, None, gp.float32, "neox", per_batch=True)


def test_strided_views_of_a_fused_qkv_buffer(rng: np.random.Generator) -> None:
    """q and k as views into one (batch, seq, q + 2 kv heads, head_dim) buffer; v stays untouched."""
    batch, seq, hq, hk, d = 2, 6, 4, 2, 64
    host = activations(rng, (batch, seq, hq + 2 * hk, d), gp.bfloat16)
    qkv = gp.from_numpy(host)
    q, k = qkv[:, :, :hq, :], qkv[:, :, hq : hq + hk, :]
    assert not q.is_contiguous
    hp = rng.integers(0, 100, size=(batch, seq)).astype(np.int32)
    cos, sin = gp.rope_cos_sin(d, 100, 1e4)
    gp.apply_rope(q, k, cos, sin, gp.from_numpy(hp))
    got = qkv.to_numpy()
    hc, hs = cos.to_numpy(), sin.to_numpy()
    assert_rotated(got[:, :, :hq], reference_rope(host[:, :, :hq], hc, hs, hp, "neox"), gp.bfloat16)
    assert_rotated(got[:, :, hq : hq + hk], reference_rope(host[:, :, hq : hq + hk], hc, hs, hp, "neox"), gp.bfloat16)
    assert got[:, :, hq + hk :].tobytes() == host[:, :, hq + hk :].tobytes()


def test_k_may_be_none_and_zero_positions_is_identity(rng: np.random.Generator) -> None:
    hq = activations(rng, (1, 3, 2, 32), gp.float32)
    q = gp.from_numpy(hq)
    cos, sin = gp.rope_cos_sin(32, 8)
    gp.apply_rope(q, None, cos, sin, gp.from_numpy(np.zeros(3, np.int32)))
    assert q.to_numpy().tobytes() == hq.tobytes()  # angle 0: cos 1, sin 0 exactly
    gp.apply_rope(q, None, cos, sin, gp.from_numpy(np.array([1, 2, 7], np.int32)))
    assert_rotated(q.to_numpy(), reference_rope(hq, cos.to_numpy(), sin.to_numpy(), np.array([1, 2, 7]), "neox"),
                   gp.float32)  # fmt: skip


def test_rotary_embedding_object(rng: np.random.Generator) -> None:
    rope = gp.RotaryEmbedding(128, 512, 5e5, scaling=LLAMA3, style="gptj", dtype=gp.bfloat16)
    assert rope.cos.shape == (512, 64)
    assert rope.cos.dtype == gp.bfloat16
    assert rope.rotary_dim == 128
    want, attention = reference_inv_freq(128, 5e5, None, LLAMA3, 512)
    np.testing.assert_allclose(rope.inv_freq, want, rtol=1e-13)
    assert attention == rope.attention_factor == 1.0
    hq = activations(rng, (2, 3, 4, 128), gp.bfloat16)
    hp = rng.integers(0, 512, size=(2, 3)).astype(np.int32)
    q = gp.from_numpy(hq)
    rope(q, None, gp.from_numpy(hp))
    assert_rotated(q.to_numpy(), reference_rope(hq, rope.cos.to_numpy(), rope.sin.to_numpy(), hp, "gptj"),
                   gp.bfloat16)  # fmt: skip
    assert "RotaryEmbedding(head_dim=128" in repr(rope)


def test_neox_is_transformers_rotate_half(rng: np.random.Generator) -> None:
    """The NeoX style is q * cat(cos, cos) + rotate_half(q) * cat(sin, sin), written out in NumPy."""
    hq = activations(rng, (1, 4, 2, 16), gp.float32).astype(F64)
    cos, sin = gp.rope_cos_sin(16, 10, dtype=gp.float32)
    hp = np.array([0, 3, 5, 9], np.int32)
    q = gp.from_numpy(hq.astype(np.float32))
    gp.apply_rope(q, None, cos, sin, gp.from_numpy(hp))
    c = np.concatenate([cos.to_numpy()] * 2, axis=-1).astype(F64)[hp][None, :, None, :]
    s = np.concatenate([sin.to_numpy()] * 2, axis=-1).astype(F64)[hp][None, :, None, :]
    rotated = np.concatenate([-hq[..., 8:], hq[..., :8]], axis=-1)
    assert_rotated(q.to_numpy(), hq * c + rotated * s, gp.float32)


def test_position_offset_and_per_sequence_decode_positions(rng: np.random.Generator) -> None:
    """A decode step (seq 1) takes positions of shape (batch,) (a paged cache's context_lens) and an
    offset; the result equals explicit (batch, 1) positions."""
    batch, heads, d = 5, 4, 64
    cos, sin = gp.rope_cos_sin(d, 64, 1e4)
    hq = activations(rng, (batch, 1, heads, d), gp.float16)
    lens = np.array([1, 7, 30, 63, 64], np.int32)  # counts the new token: its position is lens - 1
    q1, q2 = gp.from_numpy(hq), gp.from_numpy(hq)
    gp.apply_rope(q1, None, cos, sin, gp.from_numpy(lens), position_offset=-1)
    gp.apply_rope(q2, None, cos, sin, gp.from_numpy((lens - 1).reshape(batch, 1)))
    assert q1.to_numpy().tobytes() == q2.to_numpy().tobytes()
    assert_rotated(q1.to_numpy(), reference_rope(hq, cos.to_numpy(), sin.to_numpy(), (lens - 1)[:, None], "neox"),
                   gp.float16)  # fmt: skip
    rope = gp.RotaryEmbedding(d, 64, 1e4)
    q3 = gp.from_numpy(hq)
    rope(q3, None, gp.from_numpy(lens + 2), position_offset=-3)
    assert q3.to_numpy().tobytes() == q1.to_numpy().tobytes()


def test_position_offset_errors(rng: np.random.Generator) -> None:
    q, k, hq, hk, cos, sin, positions = _error_case(rng)
    with pytest.raises(ArgumentError, match="position_offset must be an int32"):
        gp.apply_rope(q, k, cos, sin, positions, position_offset=2**31)
    with pytest.raises(ArgumentError, match="position_offset must be an int32"):
        gp.apply_rope(q, k, cos, sin, positions, position_offset=1.5)  # type: ignore[arg-type]
    if current_backend() != "cuda":
        with pytest.raises(ArgumentError, match="position -1 is outside"):
            gp.apply_rope(q, k, cos, sin, positions, position_offset=-1)
    assert q.to_numpy().tobytes() == hq.tobytes()
    assert k.to_numpy().tobytes() == hk.tobytes()


# -- errors: typed, and q/k unchanged --------------------------------------------------------------
def _error_case(rng: np.random.Generator) -> tuple[gp.GPUArray, gp.GPUArray, Array, Array, Any, Any, gp.GPUArray]:
    hq = activations(rng, (2, 3, 4, 64), gp.float16)
    hk = activations(rng, (2, 3, 2, 64), gp.float16)
    cos, sin = gp.rope_cos_sin(64, 16)
    return gp.from_numpy(hq), gp.from_numpy(hk), hq, hk, cos, sin, gp.from_numpy(np.zeros((2, 3), np.int32))


def test_positions_past_the_table_raise_on_cpu(rng: np.random.Generator) -> None:
    if current_backend() == "cuda":
        pytest.skip("the GPU clamps device positions instead (test_gpu_positions_are_clamped)")
    q, k, hq, hk, cos, sin, _ = _error_case(rng)
    for bad in (16, -1, 1000):
        positions = gp.from_numpy(np.array([[0, 1, 2], [3, bad, 5]], np.int32))
        with pytest.raises(ArgumentError, match=rf"position {bad} is outside the RoPE tables' \[0, 16\)"):
            gp.apply_rope(q, k, cos, sin, positions)
        assert q.to_numpy().tobytes() == hq.tobytes()
        assert k.to_numpy().tobytes() == hk.tobytes()


def test_bad_arguments_raise_typed_errors(rng: np.random.Generator) -> None:
    q, k, hq, hk, cos, sin, positions = _error_case(rng)
    cos16, sin16 = gp.rope_cos_sin(64, 16, dtype=gp.float16)
    cos_bf, sin_bf = gp.rope_cos_sin(64, 16, dtype=gp.bfloat16)
    narrow_cos, narrow_sin = gp.rope_cos_sin(64, 16, rotary_dim=32)
    wide_cos, wide_sin = gp.rope_cos_sin(128, 16)
    cases: list[tuple[type[Exception], str, dict[str, Any]]] = [
        (DTypeError, "positions must be int32", {"positions": gp.from_numpy(np.zeros((2, 3), np.int64))}),
        (ShapeError, r"positions must have shape \(2, 3\) or \(3,\) \(or \(2,\) when seq is 1\)",
         {"positions": gp.from_numpy(np.zeros(6, np.int32))}),
        (ArgumentError, "style must be 'neox' or 'gptj'", {"style": "llama"}),
        (ShapeError, "rotary_dim 64 does not match", {"cos": narrow_cos, "sin": narrow_sin, "rotary_dim": 64}),
        (ShapeError, "exceeds head_dim 64", {"cos": wide_cos, "sin": wide_sin}),
        (DTypeError, "cos must be float32 or q's dtype", {"cos": cos_bf, "sin": sin_bf}),
        (ShapeError, "cos .* and sin .* differ", {"sin": sin16, "cos": cos}),
        (DTypeError, "q and k must have one dtype", {"k": gp.from_numpy(hk.astype(np.float32))}),
        (ShapeError, "must match q", {"k": gp.from_numpy(hk[:, :2])}),
        (ShapeError, r"must be \(batch, seq, heads, head_dim\)", {"q": gp.from_numpy(hq[0])}),
        (DTypeError, "float32, float16 or bfloat16", {"q": gp.from_numpy(hq.astype(np.float64))}),
        (ShapeError, "last dimension of q must be contiguous", {"q": q.transpose(0, 1, 3, 2)}),
        (ShapeError, "contiguous \\(max_positions", {"cos": cos.T, "sin": sin.T}),
        (DTypeError, "positions must be an int32 GPUArray", {"positions": np.zeros((2, 3), np.int32)}),
    ]  # fmt: skip
    del cos16  # only sin16 is used (a dtype mismatch between the tables)
    for error, message, change in cases:
        args: dict[str, Any] = {"q": q, "k": k, "cos": cos, "sin": sin, "positions": positions} | change
        with pytest.raises(error, match=message):
            gp.apply_rope(**args)
        assert q.to_numpy().tobytes() == hq.tobytes(), message
        assert k.to_numpy().tobytes() == hk.tobytes(), message


def test_empty_inputs_are_a_no_op() -> None:
    cos, sin = gp.rope_cos_sin(64, 16)
    q = gp.empty((0, 3, 4, 64), gp.float16)
    gp.apply_rope(q, None, cos, sin, gp.empty((0, 3), gp.int32))


# -- GPU: large inputs, clamping, graph capture ----------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("style", ["neox", "gptj"])
@pytest.mark.parametrize("dtype", ROPE_DTYPES, ids=str)
def test_gpu_prefill_llama3(rng: np.random.Generator, dtype: DType, style: str) -> None:
    _run(rng, 1, 4096, 32, 8, 128, 5e5, LLAMA3, dtype, style, per_batch=False, max_positions=8192)


@pytest.mark.gpu
def test_gpu_unaligned_views_take_the_scalar_path(rng: np.random.Generator) -> None:
    """Row starts not 16-byte aligned (an odd head offset into a 66-wide buffer): the W = 1 kernel."""
    host = activations(rng, (2, 5, 3, 66), gp.bfloat16)
    buffer = gp.from_numpy(host)
    q = buffer[:, :, :, 1:65]
    hp = rng.integers(0, 50, size=(2, 5)).astype(np.int32)
    cos, sin = gp.rope_cos_sin(64, 50, rotary_dim=48)
    gp.apply_rope(q, None, cos, sin, gp.from_numpy(hp), rotary_dim=48)
    got = buffer.to_numpy()
    assert_rotated(got[..., 1:65], reference_rope(host[..., 1:65], cos.to_numpy(), sin.to_numpy(), hp, "neox"),
                   gp.bfloat16)  # fmt: skip
    assert got[..., 0].tobytes() == host[..., 0].tobytes()
    assert got[..., 65].tobytes() == host[..., 65].tobytes()


@pytest.mark.gpu
def test_gpu_positions_are_clamped(rng: np.random.Generator) -> None:
    hq = activations(rng, (2, 3, 4, 64), gp.bfloat16)
    cos, sin = gp.rope_cos_sin(64, 16)
    raw = np.array([[0, 15, 16], [-5, 1000, 7]], np.int32)
    q1, q2 = gp.from_numpy(hq), gp.from_numpy(hq)
    gp.apply_rope(q1, None, cos, sin, gp.from_numpy(raw))
    gp.apply_rope(q2, None, cos, sin, gp.from_numpy(np.clip(raw, 0, 15)))
    assert q1.to_numpy().tobytes() == q2.to_numpy().tobytes()


@pytest.mark.gpu
@pytest.mark.parametrize("style", ["neox", "gptj"])
@pytest.mark.parametrize("dtype", ROPE_DTYPES, ids=str)
def test_gpu_graph_replay_at_new_positions_is_bitwise_eager(rng: np.random.Generator, dtype: DType,
                                                            style: str) -> None:  # fmt: skip
    batch, hq_heads, hk_heads, d = 4, 28, 4, 128  # a Qwen2.5-7B decode step
    cos, sin = gp.rope_cos_sin(d, 4096, 1e6)
    stream = gp.Stream()
    with stream:
        q, k = gp.empty((batch, 1, hq_heads, d), dtype), gp.empty((batch, 1, hk_heads, d), dtype)
        positions = gp.from_numpy(np.zeros(batch * 1, np.int32).reshape(batch, 1))
        gp.apply_rope(q, k, cos, sin, positions, style=style)  # compiled before capture
        graph = gp.CudaGraph()
        with graph.capture(stream):
            gp.apply_rope(q, k, cos, sin, positions, style=style)
        for step in range(3):
            hq = activations(rng, q.shape, dtype)
            hk = activations(rng, k.shape, dtype)
            hp = rng.integers(0, 4096, size=(batch, 1)).astype(np.int32)
            q.copy_(hq)
            k.copy_(hk)
            positions.copy_(hp)
            graph.replay(stream)
            eager_q, eager_k = gp.from_numpy(hq), gp.from_numpy(hk)
            gp.apply_rope(eager_q, eager_k, cos, sin, gp.from_numpy(hp), style=style)
            stream.synchronize()
            assert q.to_numpy().tobytes() == eager_q.to_numpy().tobytes(), step
            assert k.to_numpy().tobytes() == eager_k.to_numpy().tobytes(), step
            assert_rotated(q.to_numpy(), reference_rope(hq, cos.to_numpy(), sin.to_numpy(), hp, style), dtype)


@pytest.mark.nvrtc
def test_every_rope_kernel_compiles() -> None:
    from pygpukit.ops._kernels import all_groups, group

    groups = all_groups()["nn/rope.cu"]
    assert len({e for g in groups for e in g}) == 20
    for expressions in groups:
        group("nn/rope.cu", expressions).compile("80")


def test_bf16_tables_round_like_ml_dtypes() -> None:
    cos, _ = gp.rope_cos_sin(64, 32, dtype=gp.bfloat16)
    want, _ = reference_tables(64, 32, 1e4, None, None)
    assert cos.to_numpy().tobytes() == want.astype(ml_dtypes.bfloat16).tobytes()


# -- rope_inplace: the short form ---------------------------------------------------------------------
@pytest.mark.parametrize("style", ["neox", "gptj"])
@pytest.mark.parametrize("dtype", ROPE_DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(7, 4, 64), (2, 5, 3, 128), (1, 1, 80)], ids=str)
def test_rope_inplace_against_float64(
    rng: np.random.Generator, shape: tuple[int, ...], dtype: DType, style: str
) -> None:
    """Default positions 0..seq-1 (plus an offset), tables from a RotaryEmbedding, 3-D or 4-D x."""
    head_dim = shape[-1]
    rope = gp.RotaryEmbedding(head_dim, 64, 1e4, style=style)
    host = activations(rng, shape, dtype)
    x = gp.from_numpy(host)
    assert gp.rope_inplace(x, rope) is None
    x4 = host if len(shape) == 4 else host[None]
    seq = x4.shape[1]
    hc, hs = rope.cos.to_numpy(), rope.sin.to_numpy()
    want = reference_rope(x4, hc, hs, np.arange(seq), style)
    assert_rotated(x.to_numpy().reshape(x4.shape), want, dtype)
    y = gp.from_numpy(host)
    gp.rope_inplace(y, (rope.cos, rope.sin), style=style, position_offset=9)  # a table pair, shifted positions
    assert_rotated(y.to_numpy().reshape(x4.shape), reference_rope(x4, hc, hs, np.arange(seq) + 9, style), dtype)


def test_rope_inplace_q_and_k_views_and_explicit_positions(rng: np.random.Generator) -> None:
    """q and k as non-contiguous views of a fused (seq, q + 2 kv heads, head_dim) buffer; v untouched."""
    seq, hq, hk, d = 6, 4, 2, 64
    host = activations(rng, (seq, hq + 2 * hk, d), gp.bfloat16)
    qkv = gp.from_numpy(host)
    q, k = qkv[:, :hq], qkv[:, hq : hq + hk]
    assert not q.is_contiguous
    cos, sin = gp.rope_cos_sin(d, 100, 1e4)
    hp = rng.integers(0, 100, size=seq).astype(np.int32)
    gp.rope_inplace(q, (cos, sin), gp.from_numpy(hp), k=k)
    got = qkv.to_numpy()
    hc, hs = cos.to_numpy(), sin.to_numpy()
    assert_rotated(got[None, :, :hq], reference_rope(host[None, :, :hq], hc, hs, hp, "neox"), gp.bfloat16)
    assert_rotated(got[None, :, hq : hq + hk], reference_rope(host[None, :, hq : hq + hk], hc, hs, hp, "neox"),
                   gp.bfloat16)  # fmt: skip
    assert got[:, hq + hk :].tobytes() == host[:, hq + hk :].tobytes()


def test_rope_inplace_equals_apply_rope_bitwise(rng: np.random.Generator) -> None:
    rope = gp.RotaryEmbedding(128, 4096, 5e5, scaling=LLAMA3, dtype=gp.bfloat16)
    host = activations(rng, (2, 37, 8, 128), gp.bfloat16)
    a, b = gp.from_numpy(host), gp.from_numpy(host)
    gp.rope_inplace(a, rope, position_offset=100)
    rope(b, None, gp.from_numpy(np.arange(37, dtype=np.int32)), position_offset=100)
    assert a.to_numpy().tobytes() == b.to_numpy().tobytes()
    c = gp.from_numpy(host)
    gp.rope_inplace(c, rope, positions=gp.from_numpy(np.arange(37, dtype=np.int32) + 100))
    assert c.to_numpy().tobytes() == b.to_numpy().tobytes()


def test_rope_inplace_bad_input_raises_typed_errors_and_writes_nothing(rng: np.random.Generator) -> None:
    rope = gp.RotaryEmbedding(64, 16, 1e4)
    host = activations(rng, (3, 4, 64), gp.float16)
    x = gp.from_numpy(host)
    cases: list[tuple[type[Exception], str, Any]] = [
        (DTypeError, "freqs must be a RotaryEmbedding or a \\(cos, sin\\) pair", lambda: gp.rope_inplace(x, 10000.0)),
        (DTypeError, "freqs must be", lambda: gp.rope_inplace(x, (rope.cos,))),
        (DTypeError, "x must be a GPUArray", lambda: gp.rope_inplace(host, rope)),
        (ShapeError, r"must be \(seq, heads, head_dim\) or \(batch, seq, heads, head_dim\)",
         lambda: gp.rope_inplace(x[0], rope)),
        (ShapeError, "x .* and k .* must have the same rank", lambda: gp.rope_inplace(x, rope, k=x[None])),
        (DTypeError, "float32, float16 or bfloat16", lambda: gp.rope_inplace(x.astype(gp.float64), rope)),
        (ArgumentError, "style must be 'neox' or 'gptj'", lambda: gp.rope_inplace(x, rope, style="llama")),
        (DTypeError, "positions must be int32", lambda: gp.rope_inplace(x, rope, gp.zeros(3, gp.int64))),
        (ShapeError, "last dimension of q must be contiguous", lambda: gp.rope_inplace(x.transpose(0, 2, 1), rope)),
    ]  # fmt: skip
    if current_backend() != "cuda":  # the GPU clamps device positions instead
        cases.append((ArgumentError, "position 16 is outside", lambda: gp.rope_inplace(x, rope, position_offset=14)))
    for error, message, call in cases:
        with pytest.raises(error, match=message):
            call()
        assert x.to_numpy().tobytes() == host.tobytes(), message


def test_rope_inplace_keeps_one_positions_table_per_power_of_two(rng: np.random.Generator) -> None:
    from pygpukit.ops import rope as rope_module

    rope = gp.RotaryEmbedding(32, 256, 1e4)
    rope_module._positions.clear()
    for seq in (5, 7, 8, 3, 100):
        gp.rope_inplace(gp.from_numpy(activations(rng, (seq, 2, 32), gp.float32)), rope)
    device = gp.ones(1).buffer.device
    assert sorted(key[1] for key in rope_module._positions._plans) == [4, 8, 128]
    assert rope_module._default_positions(6, device).to_numpy().tolist() == list(range(6))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ROPE_DTYPES, ids=str)
def test_gpu_rope_inplace_prefill(rng: np.random.Generator, dtype: DType) -> None:
    rope = gp.RotaryEmbedding(128, 8192, 1e6, dtype=dtype)
    host = activations(rng, (3, 1021, 28, 128), dtype)
    x = gp.from_numpy(host)
    gp.rope_inplace(x, rope)
    want = reference_rope(host, rope.cos.to_numpy(), rope.sin.to_numpy(), np.arange(1021), "neox")
    assert_rotated(x.to_numpy(), want, dtype)
