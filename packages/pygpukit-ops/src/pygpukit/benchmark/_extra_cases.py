"""The attention and fp8 GEMM cases of ``python -m pygpukit.benchmark`` (``--attention``, ``--fp8``).

Attention: causal prefill (``sdpa_causal``) of one sequence of each ``--seq-lens`` length with
Llama-3-8B's heads (32 query heads, 8 kv heads, head_dim 128), checked on two heads against a float64
NumPy softmax attention; the peer is torch's default ``scaled_dot_product_attention`` (its own backend
choice) on the same values in torch's (batch, heads, seq, head_dim) layout. fp8: ``scaled_matmul`` of
float8_e4m3fn operands (a row-major, b the transpose of a contiguous weight, scales 1) into bfloat16,
checked against the float64 product of the same fp8 values; the peer is ``torch._scaled_mm`` where it
exists.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

import pygpukit as gp

from ._runner import Bench, Case, _host, _relative_error, _storage

__all__ = [
    "ATTENTION_SHAPE",
    "QUANT_CHOICES",
    "QUANT_DEFAULT",
    "attention_case",
    "fp8_block_gemm_case",
    "fp8_gemm_case",
    "quant_case",
    "quant_cases",
    "quant_moe_case",
]

# (batch, query heads, kv heads, head_dim): Llama-3-8B
ATTENTION_SHAPE = (1, 32, 8, 128)
ATTENTION_TOLERANCE = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 1e-2}
FP8_TOLERANCE = 1e-2  # one bfloat16 rounding of an exact product of fp8 values


def _reference_attention(q: np.ndarray[Any, Any], k: np.ndarray[Any, Any], v: np.ndarray[Any, Any],
                         heads: int) -> np.ndarray[Any, Any]:  # fmt: skip
    """float64 causal attention of the first ``heads`` query heads of batch 0 (seq_q == seq_kv)."""
    seq, num_heads, head_dim = q.shape[1], q.shape[2], q.shape[3]
    group = num_heads // k.shape[2]
    mask = np.triu(np.ones((seq, seq), dtype=bool), 1)
    out = np.empty((seq, heads, head_dim))
    for h in range(heads):
        qh, kh, vh = q[0, :, h].astype(np.float64), k[0, :, h // group], v[0, :, h // group]
        scores = qh @ kh.astype(np.float64).T / math.sqrt(head_dim)
        scores[mask] = -np.inf
        weights = np.exp(scores - scores.max(axis=1, keepdims=True))
        weights /= weights.sum(axis=1, keepdims=True)
        out[:, h] = weights @ vh.astype(np.float64)
    return out


def attention_case(dtype: str, seq: int) -> Case:
    batch, heads, kv_heads, head_dim = ATTENTION_SHAPE

    def make() -> Bench:
        rng = np.random.default_rng(seq)

        def device(shape: tuple[int, ...]) -> gp.GPUArray:
            return gp.from_numpy(_host(rng, shape)).astype(dtype)

        q = device((batch, seq, heads, head_dim))
        k, v = device((batch, seq, kv_heads, head_dim)), device((batch, seq, kv_heads, head_dim))
        out = gp.empty(q.shape, q.dtype)

        def ours() -> gp.GPUArray:
            return gp.ops.sdpa_causal(q, k, v, out=out)

        def check(result: gp.GPUArray) -> str | None:
            checked = 2
            ref = _reference_attention(q.to_numpy(), k.to_numpy(), v.to_numpy(), checked)
            got = result.to_numpy()[0, :, :checked].astype(np.float64)
            error = _relative_error(got, ref)
            bound = ATTENTION_TOLERANCE[dtype]
            return None if error <= bound else f"relative error {error:.3g} > {bound:.0e}"

        def torch_run(torch: Any) -> Callable[[], Any] | None:
            sdpa = torch.nn.functional.scaled_dot_product_attention

            def layout(x: gp.GPUArray) -> Any:
                return torch.from_dlpack(x).transpose(1, 2).contiguous()  # (batch, heads, seq, head_dim)

            tq, tk, tv = layout(q), layout(k), layout(v)
            try:
                sdpa(tq[:, :, :1], tk[:, :, :1], tv[:, :, :1], is_causal=True, enable_gqa=True)
            except TypeError:  # torch before 2.5: no enable_gqa, so repeat the kv heads
                tk = tk.repeat_interleave(heads // kv_heads, dim=1)
                tv = tv.repeat_interleave(heads // kv_heads, dim=1)
                return lambda: sdpa(tq, tk, tv, is_causal=True)
            return lambda: sdpa(tq, tk, tv, is_causal=True, enable_gqa=True)

        return Bench(ours, check, torch_run)

    flops = 2.0 * batch * heads * seq * seq * head_dim  # causal: half of 4 * b * h * s^2 * d
    return Case("attention", "sdpa_causal", dtype, f"s{seq} h{heads}/{kv_heads} d{head_dim}", flops=flops, make=make)


def _torch_scaled_mm(torch: Any, a: gp.GPUArray, w: gp.GPUArray) -> Callable[[], Any] | None:
    """torch._scaled_mm of the fp8 a (M, K) and w (N, K) with per-tensor scales of 1 (its fastest form)."""
    scaled_mm = getattr(torch, "_scaled_mm", None)
    if scaled_mm is None or not hasattr(torch, "float8_e4m3fn"):
        return None
    # DLPack carries no fp8: through bfloat16, which holds every fp8 value exactly.
    ta = torch.from_dlpack(a.astype(_storage("bfloat16"))).to(torch.float8_e4m3fn)
    tw = torch.from_dlpack(w.astype(_storage("bfloat16"))).to(torch.float8_e4m3fn)
    tone = torch.ones((), dtype=torch.float32, device=ta.device)
    return lambda: scaled_mm(ta, tw.t(), scale_a=tone, scale_b=tone, out_dtype=torch.bfloat16)


def fp8_gemm_case(m: int, k: int, n: int) -> Case:
    """(M, K) @ (K, N) in fp8; M = 1 is the GEMV suite's form."""

    def make() -> Bench:
        rng = np.random.default_rng(m + k + n + 8)
        a = gp.from_numpy(_host(rng, (m, k))).astype("float8_e4m3fn")
        w = gp.from_numpy(_host(rng, (n, k)) / math.sqrt(k)).astype("float8_e4m3fn")  # (N, K), contiguous
        b = w.T  # (K, N), column-major: what scaled_matmul and cuBLASLt's fp8 kernels take
        one = gp.from_numpy(np.ones(1, np.float32))

        def ours() -> gp.GPUArray:
            return gp.ops.scaled_matmul(a, b, one, one, out_dtype="bfloat16")

        def check(result: gp.GPUArray) -> str | None:
            rows = min(m, 16)
            ref = a[:rows].to_numpy().astype(np.float64) @ w.to_numpy().astype(np.float64).T
            error = _relative_error(result[:rows].to_numpy(), ref)
            return None if error <= FP8_TOLERANCE else f"relative error {error:.3g} > {FP8_TOLERANCE:.0e}"

        return Bench(ours, check, lambda torch: _torch_scaled_mm(torch, a, w))

    if m == 1:
        return Case("gemv", "scaled_matmul M=1", "fp8", f"{k}x{n}", flops=2.0 * k * n, nbytes=float(k * n),
                    make=make, shape=(m, k, n))  # fmt: skip
    size = f"{n}^3" if m == k == n else f"{m}x{k}x{n}"
    return Case("gemm", "scaled_matmul", "fp8", size, flops=2.0 * m * k * n, make=make, shape=(m, k, n))


def fp8_block_gemm_case(m: int, k: int, n: int) -> Case:
    """(M, K) @ (K, N) in fp8 with 1x128 activation and 128x128 weight block scales (the W8A8 of HF
    "fp8" checkpoints; cuBLASLt on Hopper), against torch._scaled_mm with per-tensor scales (issue
    18's target: >= 0.9x)."""
    from pygpukit.ops.gemm.scaled import block_weight_scale

    def make() -> Bench:
        rng = np.random.default_rng(m + k + n + 9)
        a = gp.from_numpy(_host(rng, (m, k))).astype("float8_e4m3fn")
        w = gp.from_numpy(_host(rng, (n, k)) / math.sqrt(k)).astype("float8_e4m3fn")
        kb, nb = -(-k // 128), -(-n // 128)
        sa_host = rng.uniform(0.5, 2.0, (kb, m)).astype(np.float32)  # M-major
        sw_host = rng.uniform(0.5, 2.0, (nb, kb)).astype(np.float32)
        sa, sw = gp.from_numpy(sa_host).T, block_weight_scale(gp.from_numpy(sw_host))
        b = w.T

        def ours() -> gp.GPUArray:
            return gp.ops.scaled_matmul(a, b, sa, sw, out_dtype="bfloat16")

        def check(result: gp.GPUArray) -> str | None:
            rows = min(m, 16)
            xa = a[:rows].to_numpy().astype(np.float64) * np.repeat(sa_host.T[:rows], 128, axis=1)[:, :k]
            full = np.repeat(np.repeat(sw_host, 128, axis=0)[:n], 128, axis=1)[:, :k]
            ref = xa @ (w.to_numpy().astype(np.float64) * full).T
            error = _relative_error(result[:rows].to_numpy(), ref)
            return None if error <= FP8_TOLERANCE else f"relative error {error:.3g} > {FP8_TOLERANCE:.0e}"

        return Bench(ours, check, lambda torch: _torch_scaled_mm(torch, a, w))

    size = f"{n}^3" if m == k == n else f"{m}x{k}x{n}"
    return Case("gemm", "scaled_matmul block 1x128/128x128", "fp8", size, flops=2.0 * m * k * n, make=make,
                shape=(m, k, n))  # fmt: skip


# -- quantized weights (--quant) --------------------------------------------------------------------------
QUANT_DEFAULT = ("Q4_K", "Q8_0", "FP8", "AWQ")
"""The formats ``--quant`` measures by default (issue 18's bandwidth targets)."""
QUANT_CHOICES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "FP8", "INT8", "AWQ",
                 "GPTQ", "FP8_BLOCK", "NVF4")  # fmt: skip
# Llama-3-8B's projections (N, K) for decode; the prefill case runs the first at 4096 tokens.
QUANT_SHAPES = ((4096, 4096), (14336, 4096), (4096, 14336))
QUANT_PREFILL_TOKENS = 4096
QUANT_TOLERANCE = 1e-2  # one bfloat16 rounding of a float32-accumulated product of the decoded weight


def _quantized_weight(rng: np.random.Generator, fmt: str, n: int, k: int) -> Any:
    """A (N, K) weight in ``fmt``: random blocks (GGUF, INT4) or quantized random values."""
    from pygpukit.ops.quant import QuantizedTensor, quantize_block_fp8, quantize_nvf4, quantize_per_channel

    from .quant_gemv import _random_int4, random_weight

    values = rng.standard_normal((n, k)).astype(np.float32) if fmt in ("FP8", "INT8", "FP8_BLOCK", "NVF4") else None
    if fmt in ("FP8", "INT8"):
        return quantize_per_channel(values, fmt)
    if fmt in ("AWQ", "GPTQ"):
        return _random_int4(rng, fmt.lower(), n, k)
    if fmt == "FP8_BLOCK":
        return quantize_block_fp8(values)
    if fmt == "NVF4":
        return quantize_nvf4(values)
    return QuantizedTensor.from_raw(random_weight(rng, fmt, n, k), fmt, (n, k))


def quant_case(fmt: str, m: int, n: int, k: int) -> Case:
    """``linear(x, W)`` with W (N, K) kept packed in ``fmt`` and x (M, K) bfloat16: decode (M = 1, the
    packed GEMV; GB/s of the packed bytes) or prefill (M = 4096). The peer is torch's bfloat16 linear
    on the same weight decoded (what the layer costs without quantization): above 1, the packed weight
    is faster. Checked on 4 rows against the float64 product with the decoded weight."""

    def make() -> Bench:
        rng = np.random.default_rng(m + n + k + len(fmt))
        q = _quantized_weight(rng, fmt, n, k)
        x = gp.from_numpy(_host(rng, (m, k))).astype("bfloat16")

        def ours() -> gp.GPUArray:
            return gp.ops.linear(x, q)

        def check(result: gp.GPUArray) -> str | None:
            rows = min(m, 4)
            w = q.dequantize(gp.float32).to_numpy().astype(np.float64)
            ref = x[:rows].to_numpy().astype(np.float64) @ w.T
            error = _relative_error(result[:rows].to_numpy(), ref)
            return None if error <= QUANT_TOLERANCE else f"relative error {error:.3g} > {QUANT_TOLERANCE:.0e}"

        def torch_run(torch: Any) -> Callable[[], Any] | None:
            tx = torch.from_dlpack(x)
            tw = torch.from_dlpack(q.dequantize(gp.bfloat16)).clone()
            return lambda: torch.nn.functional.linear(tx, tw)

        return Bench(ours, check, torch_run)

    nbytes = _packed_bytes(fmt, n, k) + 2.0 * (m * k + m * n)
    phase = "M=1" if m == 1 else f"M={m}"
    return Case("quant", f"linear {fmt} {phase}", "bfloat16", f"{n}x{k}", flops=2.0 * m * n * k, nbytes=nbytes,
                make=make)  # fmt: skip


def _packed_bytes(fmt: str, n: int, k: int) -> float:
    """Bytes of a packed (N, K) weight in ``fmt`` (for GB/s, without building it)."""
    from pygpukit.ops.gguf import gguf_block_size

    if fmt in ("FP8", "INT8"):
        return float(n * k + 4 * n)
    if fmt in ("AWQ", "GPTQ"):  # 4-bit values, float16 scales and 4-bit zeros per group of 128
        return n * k / 2 + n * (k / 128) * 2.5
    if fmt == "FP8_BLOCK":
        return float(n * k + 4 * -(-n // 128) * -(-k // 128))
    if fmt == "NVF4":
        return n * k / 2 + n * k / 16 + 4.0
    elems, nbytes = gguf_block_size(fmt)
    return float(n * k // elems * nbytes)


# A Qwen3-30B-A3B MoE layer: 128 experts of hidden 2048 and intermediate 768, 8 chosen per token.
QUANT_MOE = (128, 2048, 768, 8)
QUANT_MOE_FORMATS = ("Q4_K", "Q8_0")


def quant_moe_case(fmt: str, tokens: int) -> Case:
    """``moe_mlp`` over :data:`QUANT_MOE` experts kept packed in ``fmt`` (GGUF), x bfloat16: the grouped
    GEMV (up to 32 routed rows) or the grouped GEMM. The peer is transformers' MoE block in torch on
    the decoded bfloat16 experts (a loop over the experts that received tokens: index, gate-up, SwiGLU,
    down, index_add). Checked on the first 4 tokens against pygpukit's dense ``moe_mlp`` on the decoded
    weights. GB/s counts the packed bytes of the experts a step is expected to read (random routing)."""
    experts, hidden, inter, k = QUANT_MOE

    def make() -> Bench:
        from pygpukit.ops.quant import QuantizedExperts, QuantizedTensor

        from .quant_gemv import random_weight

        rng = np.random.default_rng(tokens + len(fmt))
        gu = QuantizedExperts(QuantizedTensor.from_raw(random_weight(rng, fmt, experts * 2 * inter, hidden), fmt,
                                                       (experts * 2 * inter, hidden)), experts)  # fmt: skip
        dn = QuantizedExperts(QuantizedTensor.from_raw(random_weight(rng, fmt, experts * hidden, inter), fmt,
                                                       (experts * hidden, inter)), experts)  # fmt: skip
        x = gp.from_numpy(_host(rng, (tokens, hidden))).astype("bfloat16")
        logits = gp.from_numpy(_host(rng, (tokens, experts)))

        def ours() -> gp.GPUArray:
            return gp.ops.moe_mlp(x, logits, gu, dn, k, True)

        def check(result: gp.GPUArray) -> str | None:
            rows = min(tokens, 4)
            dense = gp.ops.moe_mlp(x[:rows], logits[:rows], gu.dequantize(gp.bfloat16), dn.dequantize(gp.bfloat16),
                                   k, True)  # fmt: skip
            error = _relative_error(result[:rows].to_numpy(), dense.to_numpy().astype(np.float64))
            return None if error <= QUANT_TOLERANCE else f"relative error {error:.3g} > {QUANT_TOLERANCE:.0e}"

        def torch_run(torch: Any) -> Callable[[], Any] | None:
            tx = torch.from_dlpack(x)
            tl = torch.from_dlpack(logits)
            wgu = torch.from_dlpack(gu.dequantize(gp.bfloat16)).clone()
            wdn = torch.from_dlpack(dn.dequantize(gp.bfloat16)).clone()

            def block() -> Any:  # transformers' Qwen3MoeSparseMoeBlock.forward, eager
                weights = torch.softmax(tl, dim=-1, dtype=torch.float)
                weights, chosen = torch.topk(weights, k, dim=-1)
                weights = (weights / weights.sum(dim=-1, keepdim=True)).to(tx.dtype)
                out = torch.zeros_like(tx)
                mask = torch.nn.functional.one_hot(chosen, num_classes=experts).permute(2, 1, 0)
                for e in torch.greater(mask.sum(dim=(-1, -2)), 0).nonzero():
                    slot, token = torch.where(mask[e[0]])
                    gate, up = torch.nn.functional.linear(tx[token], wgu[e[0]]).chunk(2, dim=-1)
                    y = torch.nn.functional.linear(torch.nn.functional.silu(gate) * up, wdn[e[0]])
                    out.index_add_(0, token, y * weights[token, slot, None])
                return out

            return block

        return Bench(ours, check, torch_run)

    # GB/s of the experts a step reads: with random routing, E (1 - (1 - k / E)^tokens) experts on average.
    touched = experts * (1.0 - (1.0 - k / experts) ** tokens)
    weight_bytes = touched * (_packed_bytes(fmt, 2 * inter, hidden) + _packed_bytes(fmt, hidden, inter))
    flops = 2.0 * tokens * k * 3 * inter * hidden
    return Case("quant", f"moe_mlp {fmt} {experts}x{hidden}x{inter} k{k}", "bfloat16", f"{tokens} tokens",
                flops=flops, nbytes=weight_bytes, make=make)  # fmt: skip


def quant_cases(formats: Sequence[str], quick: bool) -> list[Case]:
    """Decode cases at the Llama-3-8B shapes for every format, and the 4096-token prefill of the first
    shape for the 4-bit formats (issue 18's W4A16 prefill target, >= 0.8x the bf16 GEMM); the MoE layer
    of :func:`quant_moe_case` at 1, 64 and 512 tokens (grouped GEMV, then the grouped GEMM) for the
    GGUF formats of :data:`QUANT_MOE_FORMATS`."""
    shapes = QUANT_SHAPES[:1] if quick else QUANT_SHAPES
    cases = [quant_case(fmt, 1, n, k) for fmt in formats for n, k in shapes]
    prefill = 256 if quick else QUANT_PREFILL_TOKENS
    n, k = QUANT_SHAPES[0]
    cases += [quant_case(fmt, prefill, n, k) for fmt in formats if fmt in ("Q4_K", "Q4_0", "AWQ", "GPTQ", "NVF4")]
    moe_tokens = (1, 64) if quick else (1, 64, 512)
    cases += [quant_moe_case(fmt, t) for fmt in formats if fmt in QUANT_MOE_FORMATS for t in moe_tokens]
    return cases
