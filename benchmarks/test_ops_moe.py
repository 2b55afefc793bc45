"""The MoE MLP block (pygpukit.moe_mlp) next to a torch eager per-expert loop in the same run.

Layers (bf16): Mixtral-8x7B (hidden 4096, 8 experts, top-2, expert intermediate 14336) and
Qwen3-30B-A3B (hidden 2048, 128 experts, top-8, intermediate 768), for 1 token (decode) and 2048
tokens (prefill). The torch peer is the HF MixtralSparseMoeBlock / Qwen3MoeSparseMoeBlock forward: fp32
softmax, top-k, renormalisation, then a loop over the experts that gathers each one's tokens, runs
gate/up/down with F.linear and index_adds the weighted result (it synchronizes with the host to find
the experts hit, so it cannot be graph-captured; its gpu_us is its wall time per call).

Each round runs ITERATIONS layers on one stream and synchronizes once. ``extra_info``: ``flops`` (6 x
routed rows x hidden x intermediate per layer), ``weight_bytes`` (the weights of the experts that
received a token, each read once), ``gpu_us`` (pygpukit: events around a CUDA-graph replay of the same
calls, launch cost excluded), ``tflops`` and ``gbps`` from it. The grouped GEMM alone at Mixtral's
prefill gate/up shape is compared with one dense torch.matmul of the same FLOPs (its ceiling).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

import pygpukit as gp

pytestmark = pytest.mark.gpu

ITERATIONS = {1: 20, 2048: 3}
MODELS = {
    # name: (hidden, experts, k, intermediate)
    "mixtral-8x7b": (4096, 8, 2, 14336),
    "qwen3-30b-a3b": (2048, 128, 8, 768),
}
CASES = [(model, tokens) for model in MODELS for tokens in (1, 2048)]
IDS = [f"{model}-{'decode' if tokens == 1 else 'prefill'}{tokens}" for model, tokens in CASES]


def _torch() -> Any:
    return pytest.importorskip("torch")


def _group(model: str, tokens: int) -> str:
    hidden, experts, k, inter = MODELS[model]
    return (f"moe_mlp {model} bf16 tokens={tokens} (hidden {hidden}, {experts} experts top-{k}, inter {inter}; "
            f"per {ITERATIONS[tokens]} layers)")  # fmt: skip


def _layer(model: str, tokens: int) -> dict[str, Any]:
    """Weights and inputs on the GPU, made by torch (fast random fill), viewed by pygpukit via DLPack."""
    torch = _torch()
    hidden, experts, _, inter = MODELS[model]
    gen = torch.Generator(device="cuda").manual_seed(tokens + hidden)

    def randn(*shape: int, scale: float) -> Any:
        return (torch.randn(*shape, device="cuda", generator=gen, dtype=torch.float32) * scale).to(torch.bfloat16)

    return {
        "x": randn(tokens, hidden, scale=1.0),
        "logits": randn(tokens, experts, scale=1.0),
        "gate_up": randn(experts, 2 * inter, hidden, scale=hidden**-0.5),
        "down": randn(experts, hidden, inter, scale=inter**-0.5),
    }


def _routing_stats(model: str, tokens: int, logits: Any) -> dict[str, float]:
    torch = _torch()
    hidden, _experts, k, inter = MODELS[model]
    ids = torch.topk(torch.softmax(logits.float(), dim=-1), k, dim=-1).indices
    hit = int(torch.unique(ids).numel())
    flops = 6.0 * tokens * k * hidden * inter
    return {"flops": flops, "weight_bytes": float(hit * 3 * hidden * inter * 2), "experts_hit": float(hit)}


def _gp_graph_time(calls: Callable[[], None], stream: gp.Stream, replays: int = 3) -> float:
    graph = gp.CudaGraph()
    with graph.capture(stream=stream):
        calls()
    graph.replay()
    stream.synchronize()
    start, end = gp.Event(), gp.Event()
    start.record(stream)
    for _ in range(replays):
        graph.replay()
    end.record(stream)
    end.synchronize()
    return start.elapsed_time(end) * 1000.0 / replays


def _report(benchmark: Any, stats: dict[str, float], per_call_us: float, iterations: int) -> None:
    benchmark.extra_info.update(
        flops=stats["flops"] * iterations,
        weight_bytes=stats["weight_bytes"] * iterations,
        experts_hit=stats["experts_hit"],
        gpu_us=per_call_us,
        tflops=stats["flops"] / per_call_us / 1e6,
        gbps=stats["weight_bytes"] / per_call_us / 1e3,
    )


@pytest.mark.parametrize(("model", "tokens"), CASES, ids=IDS)
def test_moe_mlp_pygpukit(benchmark: Any, model: str, tokens: int) -> None:
    hidden, experts, k, inter = MODELS[model]
    benchmark.group = _group(model, tokens)
    layer = _layer(model, tokens)
    stats = _routing_stats(model, tokens, layer["logits"])
    x, logits, gate_up, down = (gp.from_dlpack(layer[name]) for name in ("x", "logits", "gate_up", "down"))
    out = gp.empty((tokens, hidden), gp.bfloat16)
    workspace = gp.empty((gp.moe_workspace_size(tokens, hidden, inter, experts, k, gp.bfloat16),), gp.uint8)
    stream = gp.Stream()
    iterations = ITERATIONS[tokens]
    _torch().cuda.synchronize()

    def calls() -> None:
        for _ in range(iterations):
            gp.moe_mlp(x, logits, gate_up, down, k, True, out=out, workspace=workspace)

    def run() -> None:
        with stream:
            calls()
        stream.synchronize()

    benchmark.pedantic(run, rounds=5, warmup_rounds=1)
    with stream:
        per_call = _gp_graph_time(calls, stream) / iterations
    _report(benchmark, stats, per_call, iterations)


@pytest.mark.parametrize(("model", "tokens"), CASES, ids=IDS)
def test_moe_mlp_torch_eager_loop(benchmark: Any, model: str, tokens: int) -> None:
    torch = _torch()
    functional = torch.nn.functional
    hidden, experts, k, _inter = MODELS[model]
    benchmark.group = _group(model, tokens)
    layer = _layer(model, tokens)
    stats = _routing_stats(model, tokens, layer["logits"])
    x, logits = layer["x"], layer["logits"]
    gate_up, down = layer["gate_up"], layer["down"]
    iterations = ITERATIONS[tokens]

    def block() -> Any:
        routing = functional.softmax(logits, dim=1, dtype=torch.float)
        weights, selected = torch.topk(routing, k, dim=-1)
        weights /= weights.sum(dim=-1, keepdim=True)
        weights = weights.to(x.dtype)
        out = torch.zeros((tokens, hidden), dtype=x.dtype, device=x.device)
        mask = functional.one_hot(selected, num_classes=experts).permute(2, 1, 0)
        hit = torch.greater(mask.sum(dim=(-1, -2)), 0).nonzero()
        for expert in hit:
            e = int(expert[0])
            slot, token = torch.where(mask[e])
            state = x[token]
            gate, up = functional.linear(state, gate_up[e]).chunk(2, dim=-1)
            y = functional.linear(functional.silu(gate) * up, down[e]) * weights[token, slot, None]
            out.index_add_(0, token, y)
        return out

    def run() -> None:
        for _ in range(iterations):
            block()
        torch.cuda.synchronize()

    benchmark.pedantic(run, rounds=5, warmup_rounds=1)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iterations):
        block()
    end.record()
    end.synchronize()
    _report(benchmark, stats, float(start.elapsed_time(end)) * 1000.0 / iterations, iterations)


# -- the grouped GEMM alone against a dense GEMM of the same FLOPs ---------------------------------------
GEMM_ROWS = 4096  # Mixtral prefill: 2048 tokens x top-2
GEMM_K = 4096
GEMM_N = 2 * 14336
GEMM_ITERATIONS = 3


def _gemm_group() -> str:
    return f"grouped gemm bf16 rows={GEMM_ROWS} K={GEMM_K} N={GEMM_N} over 8 experts (per {GEMM_ITERATIONS})"


def test_grouped_gemm_pygpukit(benchmark: Any) -> None:
    torch = _torch()
    benchmark.group = _gemm_group()
    gen = torch.Generator(device="cuda").manual_seed(3)
    x_t = torch.randn(GEMM_ROWS, GEMM_K, device="cuda", generator=gen).to(torch.bfloat16)
    w_t = (torch.randn(8, GEMM_N, GEMM_K, device="cuda", generator=gen) * 0.02).to(torch.bfloat16)
    counts = torch.full((8,), GEMM_ROWS // 8, dtype=torch.int32)
    counts[0] += 37
    counts[7] -= 37
    offsets_t = torch.cat([torch.zeros(1, dtype=torch.int32), torch.cumsum(counts, 0).to(torch.int32)]).cuda()
    x, w, offsets = gp.from_dlpack(x_t), gp.from_dlpack(w_t), gp.from_dlpack(offsets_t)
    out = gp.empty((GEMM_ROWS, GEMM_N), gp.bfloat16)
    stream = gp.Stream()
    torch.cuda.synchronize()

    def calls() -> None:
        for _ in range(GEMM_ITERATIONS):
            gp.grouped_gemm(x, w, offsets, out=out)

    def run() -> None:
        with stream:
            calls()
        stream.synchronize()

    benchmark.pedantic(run, rounds=5, warmup_rounds=1)
    with stream:
        per_call = _gp_graph_time(calls, stream) / GEMM_ITERATIONS
    flops = 2.0 * GEMM_ROWS * GEMM_K * GEMM_N
    benchmark.extra_info.update(flops=flops * GEMM_ITERATIONS, gpu_us=per_call, tflops=flops / per_call / 1e6)


def test_dense_gemm_torch(benchmark: Any) -> None:
    torch = _torch()
    benchmark.group = _gemm_group()
    gen = torch.Generator(device="cuda").manual_seed(3)
    x = torch.randn(GEMM_ROWS, GEMM_K, device="cuda", generator=gen).to(torch.bfloat16)
    w = (torch.randn(GEMM_N, GEMM_K, device="cuda", generator=gen) * 0.02).to(torch.bfloat16)

    def calls() -> None:
        for _ in range(GEMM_ITERATIONS):
            torch.nn.functional.linear(x, w)

    def run() -> None:
        calls()
        torch.cuda.synchronize()

    benchmark.pedantic(run, rounds=5, warmup_rounds=1)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    calls()
    end.record()
    end.synchronize()
    per_call = float(start.elapsed_time(end)) * 1000.0 / GEMM_ITERATIONS
    flops = 2.0 * GEMM_ROWS * GEMM_K * GEMM_N
    benchmark.extra_info.update(flops=flops * GEMM_ITERATIONS, gpu_us=per_call, tflops=flops / per_call / 1e6)
