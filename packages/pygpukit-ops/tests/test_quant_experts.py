"""MoE experts kept in GGUF block formats (pygpukit.ops.quant.experts): moe_mlp on QuantizedExperts equals
moe_mlp on the same experts dequantized (the dense grouped path) for decode and prefill token counts,
every activation and several formats; typed errors. CPU backend in CI, the GPU with -m gpu."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

import pygpukit as gp
from pygpukit.core.errors import ArgumentError, DTypeError, ShapeError
from pygpukit.core.memory import memory_stats
from pygpukit.ops.quant import QuantizedExperts, QuantizedTensor, quantize_experts

E, H, I = 4, 256, 256  # noqa: E741 - the usual MoE names


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(request.node.name.encode()))


def _experts(rng: np.random.Generator, fmt_up: str, fmt_down: str) -> tuple[QuantizedExperts, QuantizedExperts]:
    gate_up = (rng.standard_normal((E, 2 * I, H)) * 0.05).astype(np.float32)
    down = (rng.standard_normal((E, H, I)) * 0.05).astype(np.float32)
    return quantize_experts(gate_up, fmt_up), quantize_experts(down, fmt_down)


def _check(rng: np.random.Generator, tokens: int, k: int, activation: str, fmts: tuple[str, str],
           renormalize: bool = True) -> None:  # fmt: skip
    gu, dn = _experts(rng, *fmts)
    x = gp.from_numpy(rng.standard_normal((tokens, H)).astype(np.float32))
    logits = gp.from_numpy(rng.standard_normal((tokens, E)).astype(np.float32))
    got = gp.ops.moe_mlp(x, logits, gu, dn, k, renormalize, activation).to_numpy().astype(np.float64)
    want = gp.ops.moe_mlp(x, logits, gu.dequantize("float32"), dn.dequantize("float32"), k, renormalize,
                          activation).to_numpy().astype(np.float64)  # fmt: skip
    scale = np.abs(want).max()
    assert got.shape == (tokens, H)
    assert np.abs(got - want).max() <= 1e-4 * scale + 1e-6


@pytest.mark.parametrize("tokens", [1, 3, 8, 37])
@pytest.mark.parametrize("fmts", [("Q4_K", "Q6_K"), ("Q8_0", "Q4_0")])
def test_quantized_experts_equal_their_dequantized_block(rng: np.random.Generator, tokens: int,
                                                         fmts: tuple[str, str]) -> None:  # fmt: skip
    _check(rng, tokens, 2, "silu", fmts)


@pytest.mark.parametrize("activation", ["gelu", "gelu_tanh"])
def test_other_activations_and_top1(rng: np.random.Generator, activation: str) -> None:
    _check(rng, 5, 1, activation, ("Q5_1", "Q8_0"), renormalize=False)


def test_expert_views_and_stack(rng: np.random.Generator) -> None:
    gu, _ = _experts(rng, "Q8_0", "Q8_0")
    assert gu.shape == (E, 2 * I, H)
    assert gu.format == "Q8_0"
    whole = gu.dequantize("float32").to_numpy()
    for e in range(E):
        part = gu.expert(e)
        assert isinstance(part, QuantizedTensor)
        assert np.array_equal(part.dequantize(gp.float32).to_numpy(), whole[e])
    again = QuantizedExperts.stack([gu.expert(e) for e in range(E)])
    assert np.array_equal(again.dequantize("float32").to_numpy(), whole)
    assert again.nbytes == gu.nbytes < 0.55 * (E * 2 * I * H * 2)  # Q8_0: 34 bytes per 32 values


def test_bad_input_is_named(rng: np.random.Generator) -> None:
    gu, dn = _experts(rng, "Q8_0", "Q8_0")
    x = gp.from_numpy(rng.standard_normal((2, H)).astype(np.float32))
    logits = gp.from_numpy(rng.standard_normal((2, E)).astype(np.float32))
    with pytest.raises(ShapeError, match="do not split into 5 experts"):
        QuantizedExperts(gu.q, 5)
    with pytest.raises(ArgumentError, match="is not an expert"):
        gu.expert(E)
    with pytest.raises(ShapeError, match="do not fit x"):
        gp.ops.moe_mlp(x, logits, dn, dn, 2)
    with pytest.raises(DTypeError, match="both w_gate_up and w_down"):
        gp.ops.moe_mlp(x, logits, gu, dn.dequantize("float32"), 2)
    with pytest.raises(ArgumentError, match="'nk' layout"):
        gp.ops.moe_mlp(x, logits, gu, dn, 2, layout="kn")
    with pytest.raises(ShapeError, match="workspace has"):
        gp.ops.moe_mlp(x, logits, gu, dn, 2, out=gp.empty((2, H)), workspace=gp.empty((16,), gp.uint8))
    with pytest.raises(ShapeError, match="router_logits"):
        gp.ops.moe_mlp(x, logits[:, :3], gu, dn, 2)


def test_half_activations_take_the_device_groups_at_any_size(rng: np.random.Generator,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """bf16 x beyond the GEMV's rows never reads the offsets on the host (the grouped GEMM on the GPU);
    float32 x there does (the per-expert linear)."""
    from pygpukit.ops.quant import experts as module

    gu, dn = _experts(rng, "Q4_K", "Q8_0")
    tokens = module.GROUPED_MAX_ROWS  # k = 2: twice the GEMV's rows
    x = gp.from_numpy(rng.standard_normal((tokens, H)).astype(np.float32))
    logits = gp.from_numpy(rng.standard_normal((tokens, E)).astype(np.float32))
    calls: list[str] = []
    monkeypatch.setattr(module, "_project", lambda *args: calls.append("host") or module._grouped(
        args[0], args[1], gp.from_numpy(args[2].astype(np.int32)), args[3]))  # fmt: skip
    want = gp.ops.moe_mlp(x, logits, gu, dn, 2, True).to_numpy().astype(np.float64)
    assert calls == ["host", "host"]
    calls.clear()
    got = gp.ops.moe_mlp(x.astype("bfloat16"), logits, gu, dn, 2, True).to_numpy().astype(np.float64)
    assert calls == []
    assert np.abs(got - want).max() <= 2.0**-6 * np.abs(want).max()


@pytest.mark.parametrize("tokens", [3, 40])
def test_out_and_workspace_allocate_nothing(rng: np.random.Generator, tokens: int) -> None:
    """With out= and workspace= the quantized block writes the given buffers and allocates nothing
    (bf16: the grouped GEMV at 3 tokens, the grouped GEMM at 40), equal to the allocating call."""
    _out_and_workspace(rng, tokens)


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [3, 40])
def test_gpu_out_and_workspace_allocate_nothing(rng: np.random.Generator, tokens: int) -> None:
    _out_and_workspace(rng, tokens)


def _out_and_workspace(rng: np.random.Generator, tokens: int) -> None:
    gu, dn = _experts(rng, "Q4_K", "Q6_K")
    x = gp.from_numpy(rng.standard_normal((tokens, H)).astype(np.float32)).astype("bfloat16")
    logits = gp.from_numpy(rng.standard_normal((tokens, E)).astype(np.float32))
    want = gp.ops.moe_mlp(x, logits, gu, dn, 2, True).to_numpy()
    out = gp.from_numpy(np.full((tokens, H), np.nan, np.float32)).astype("bfloat16")
    workspace = gp.empty((gp.ops.moe_workspace_size(tokens, H, I, E, 2, "bfloat16"),), gp.uint8)
    gp.ops.moe_mlp(x, logits, gu, dn, 2, True, out=out, workspace=workspace)  # warm: kernels compiled
    before = memory_stats()
    got = gp.ops.moe_mlp(x, logits, gu, dn, 2, True, out=out, workspace=workspace)
    after = memory_stats()
    assert got is out
    assert after["requests"] == before["requests"]
    assert got.to_numpy().tobytes() == want.tobytes()


def test_grouped_and_per_expert_paths_agree(rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch) -> None:
    """The grouped GEMV (offsets on the device) and the per-expert linear (offsets on the host) give the
    same block, at the boundary row count too."""
    from pygpukit.ops.quant import experts as module

    gu, dn = _experts(rng, "Q4_K", "Q8_0")
    tokens = module.GROUPED_MAX_ROWS // 2  # k = 2: exactly the grouped limit
    x = gp.from_numpy(rng.standard_normal((tokens, H)).astype(np.float32))
    logits = gp.from_numpy(rng.standard_normal((tokens, E)).astype(np.float32))
    grouped = gp.ops.moe_mlp(x, logits, gu, dn, 2, True).to_numpy().astype(np.float64)
    monkeypatch.setattr(module, "GROUPED_MAX_ROWS", 0)
    per_expert = gp.ops.moe_mlp(x, logits, gu, dn, 2, True).to_numpy().astype(np.float64)
    assert np.abs(grouped - per_expert).max() <= 1e-5 * np.abs(per_expert).max()


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_gpu_grouped_gemv_every_format(rng: np.random.Generator, fmt: str, dtype: str) -> None:
    """The grouped kernel against the dequantized experts in float64, every format, bf16 and f32 x;
    rows past the routed ones stay as they were (poisoned)."""
    from pygpukit.ops.quant.experts import _grouped

    w = quantize_experts((rng.standard_normal((E, 96, H)) * 0.1).astype(np.float32), fmt)
    rows = 7
    x = gp.from_numpy(rng.standard_normal((rows + 1, H)).astype(np.float32)).astype(dtype)
    offsets = gp.from_numpy(np.array([0, 2, 2, 6, rows], np.int32))  # expert 1 empty; row 7 not routed
    out = gp.from_numpy(np.full((rows + 1, 96), np.nan, np.float32)).astype(dtype)
    _grouped(x, w, offsets, out)
    got = out.to_numpy().astype(np.float64)
    dense = w.dequantize("float32").to_numpy().astype(np.float64)
    xs = x.to_numpy().astype(np.float64)
    expert = [0, 0, 2, 2, 2, 2, 3]
    want = np.stack([xs[r] @ dense[expert[r]].T for r in range(rows)])
    eps = 2.0**-8 if dtype == "bfloat16" else 2.0**-20
    mag = np.stack([np.abs(xs[r]) @ np.abs(dense[expert[r]]).T for r in range(rows)])
    assert np.all(np.abs(got[:rows] - want) <= eps * np.abs(want) + 1e-6 * mag)
    assert np.isnan(got[rows]).all()


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("groups", [(0, 37, 37, 101, 150), (0, 9, 20, 31, 40)])
def test_gpu_grouped_gemm_every_format(rng: np.random.Generator, fmt: str, dtype: str,
                                       groups: tuple[int, ...]) -> None:  # fmt: skip
    """The grouped tensor-core GEMM (more rows than the GEMV takes) against float64 products of x and the
    weights dequantized and rounded to x's dtype, every format, both tiles (mean group above and below
    32 rows), an empty expert, N not a multiple of the tile, K with a partial 256-element span for the
    32-element formats; rows past the routed ones stay poisoned."""
    from pygpukit.ops.quant.experts import _grouped_gemm

    k = 288 if fmt[-2:] in ("_0", "_1") else 512
    n = 200
    w = quantize_experts((rng.standard_normal((E, n, k)) * 0.1).astype(np.float32), fmt)
    rows = groups[-1]
    x = gp.from_numpy(rng.standard_normal((rows + 3, k)).astype(np.float32)).astype(dtype)
    offsets = gp.from_numpy(np.array(groups, np.int32))
    out = gp.from_numpy(np.full((rows + 3, n), np.nan, np.float32)).astype(dtype)
    _grouped_gemm(x, w, offsets, out)
    got = out.to_numpy().astype(np.float64)
    dense = w.dequantize(dtype).to_numpy().astype(np.float64)  # the kernel rounds the weights to x's dtype
    xs = x.to_numpy().astype(np.float64)
    want = np.empty((rows, n))
    mag = np.empty((rows, n))
    for e in range(E):
        lo, hi = groups[e], groups[e + 1]
        want[lo:hi] = xs[lo:hi] @ dense[e].T
        mag[lo:hi] = np.abs(xs[lo:hi]) @ np.abs(dense[e]).T
    eps = 2.0**-8 if dtype == "bfloat16" else 2.0**-11
    assert np.all(np.abs(got[:rows] - want) <= eps * np.abs(want) + 2e-6 * mag)
    assert np.isnan(got[rows:]).all()


@pytest.mark.gpu
@pytest.mark.parametrize(("fmt", "shift"), [("Q4_K", 2), ("Q4_K", 1), ("Q8_0", 1)])
def test_gpu_grouped_gemm_of_an_unaligned_weight(rng: np.random.Generator, fmt: str, shift: int) -> None:
    """Experts whose bytes start off the kernel's copy word (a view into a larger buffer): the same
    products as the aligned copy of the same bytes, bit for bit."""
    from pygpukit.ops.quant.experts import _grouped_gemm

    w = quantize_experts((rng.standard_normal((E, 136, 256)) * 0.1).astype(np.float32), fmt)
    raw = w.data.to_numpy()
    padded = gp.from_numpy(np.concatenate([np.zeros(shift, np.uint8), raw]))
    moved = QuantizedExperts(QuantizedTensor(padded[shift:], fmt, w.q.shape), E)
    x = gp.from_numpy(rng.standard_normal((70, 256)).astype(np.float32)).astype("bfloat16")
    offsets = gp.from_numpy(np.array([0, 30, 30, 52, 70], np.int32))
    outs = []
    for weights in (w, moved):
        out = gp.from_numpy(np.full((70, 136), np.nan, np.float32)).astype("bfloat16")
        _grouped_gemm(x, weights, offsets, out)
        outs.append(out.to_numpy())
    assert outs[0].tobytes() == outs[1].tobytes()
    assert not np.isnan(outs[0].astype(np.float32)).any()


@pytest.mark.gpu
def test_gpu_prefill_block_replays_in_a_graph(rng: np.random.Generator) -> None:
    """A prefill-sized quantized MoE block in bf16 (the grouped GEMM: no host read, else the capture
    would fail) captures and replays bitwise, and equals the per-expert path within bf16 rounding."""
    from pygpukit.ops.quant.experts import GROUPED_MAX_ROWS

    gu, dn = _experts(rng, "Q4_K", "Q6_K")
    tokens = GROUPED_MAX_ROWS + 9
    x = gp.from_numpy(rng.standard_normal((tokens, H)).astype(np.float32)).astype("bfloat16")
    logits = gp.from_numpy(rng.standard_normal((tokens, E)).astype(np.float32))
    with gp.Stream() as stream:
        eager = gp.ops.moe_mlp(x, logits, gu, dn, 2, True).to_numpy()
        graph = gp.CudaGraph()
        with graph.capture(stream):
            out = gp.ops.moe_mlp(x, logits, gu, dn, 2, True)
        graph.replay(stream)
        stream.synchronize()
        assert out.to_numpy().tobytes() == eager.tobytes()
    dense = gp.ops.moe_mlp(x, logits, gu.dequantize("bfloat16"), dn.dequantize("bfloat16"), 2, True).to_numpy()
    want = dense.astype(np.float64)
    assert np.abs(eager.astype(np.float64) - want).max() <= 2.0**-6 * np.abs(want).max()


@pytest.mark.gpu
def test_gpu_decode_block_replays_in_a_graph(rng: np.random.Generator) -> None:
    """A decode-sized quantized MoE block (grouped path: no host read) captures and replays bitwise."""
    gu, dn = _experts(rng, "Q4_K", "Q6_K")
    x = gp.from_numpy(rng.standard_normal((1, H)).astype(np.float32))
    logits = gp.from_numpy(rng.standard_normal((1, E)).astype(np.float32))
    with gp.Stream() as stream:
        eager = gp.ops.moe_mlp(x, logits, gu, dn, 2, True).to_numpy()
        graph = gp.CudaGraph()
        with graph.capture(stream):
            out = gp.ops.moe_mlp(x, logits, gu, dn, 2, True)
        graph.replay(stream)
        stream.synchronize()
        assert out.to_numpy().tobytes() == eager.tobytes()
