"""Attention next to torch in the same run (issue 6's bars).

- Prefill: sdpa_causal, bf16, head_dim 128, batch 4, 32 heads, L = 1024, 4096, 8192, against
  torch.nn.functional.scaled_dot_product_attention under sdpa_kernel(SDPBackend.FLASH_ATTENTION) on the
  same data (torch gets (batch, heads, L, dim) contiguous copies, made before timing). Bar: >= 0.8x
  torch's TFLOP/s. ``flops`` = 4 * batch * heads * L^2 * dim / 2 (causal) per round. ``pygpukit-alt``
  runs the other compiled tiling of head_dim 128 (attention._PREFILL_ALTERNATIVES), to pick the default.
  On SM 90 (H100, H200) ``pygpukit`` runs the wgmma kernel (attention_prefill_sm90.cu) and
  ``pygpukit-sm80`` the mma.sync kernel (gp.set_prefill_kernel("sm80")); ``pygpukit-sm90-alt`` the
  SM 90 kernel's other tilings (_attention_sm90.CONFIGS after the first, and ALTERNATIVES);
  ``torch-default`` torch's SDPA with the backend torch picks (a Hopper kernel on an H100 where it
  has one): issue 15's bar is >= 0.9x of it.
- Decode: decode_attention, bf16, Llama-3-8B heads (32 query, 8 kv, dim 128), contexts 4096 and 32768,
  batch 1, 4 and 8, every sequence at full length. ``bytes`` is the KV cache read once (K and V of
  every live position). Bar: >= 0.85x the bandwidth of reading the cache once; ``read-once`` is torch
  summing K and V (each byte read once: the bandwidth reference), ``torch-sdpa`` torch's SDPA with the
  single query per sequence over the same cache (enable_gqa). ``test_decode_pygpukit_alt`` runs other
  decode tunings (fewest keys per split 128 or 512, two shared-memory stages) to pick the defaults.

Each round runs ITERATIONS ops and synchronizes once; decode rounds replay CUDA graphs of ITERATIONS
steps (pygpukit and torch alike), so the time is the GPU's rather than Python's launch overhead.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import pygpukit as gp
from pygpukit.core.plans import clear_plan_caches
from pygpukit.ops import _attention_sm90, attention

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _fresh_plans() -> Iterator[None]:
    """The ``_alt`` tests monkeypatch the tunings that launch plans are made from: plan afresh around each."""
    clear_plan_caches()
    yield
    clear_plan_caches()


BATCH, HEADS, HEAD_DIM = 4, 32, 128
LENGTHS = [1024, 4096, 8192]
DECODE_HEADS, DECODE_KV_HEADS = 32, 8
CONTEXTS = [4096, 32768]
DECODE_BATCHES = [1, 4, 8]
DECODE_ITERATIONS = 20


def _torch() -> Any:
    return pytest.importorskip("torch")


def _iterations(length: int) -> int:
    return max(2, 16 * 1024 * 1024 // (length * length))


def _prefill_group(length: int) -> str:
    return f"sdpa_causal bf16 batch {BATCH} heads {HEADS} dim {HEAD_DIM} L {length} (per {_iterations(length)} ops)"


def _prefill_flops(length: int) -> int:
    return 4 * BATCH * HEADS * length * length * HEAD_DIM // 2 * _iterations(length)


def _qkv(length: int) -> list[np.ndarray[Any, Any]]:
    rng = np.random.default_rng(length)
    return [rng.uniform(-2, 2, (BATCH, length, HEADS, HEAD_DIM)).astype(np.float32) for _ in range(3)]


def _time_pygpukit_prefill(benchmark: Any, length: int) -> None:
    q, k, v = (gp.from_numpy(x).astype(gp.bfloat16) for x in _qkv(length))
    out = gp.empty(q.shape, gp.bfloat16)
    stream = gp.Stream()
    iterations = _iterations(length)

    def run() -> None:
        with stream:
            for _ in range(iterations):
                gp.sdpa_causal(q, k, v, out=out)
        stream.synchronize()

    benchmark.pedantic(run, rounds=5, warmup_rounds=1)
    benchmark.extra_info["flops"] = _prefill_flops(length)


@pytest.mark.parametrize("length", LENGTHS)
def test_sdpa_causal_pygpukit(benchmark: Any, length: int) -> None:
    benchmark.group = _prefill_group(length)
    _time_pygpukit_prefill(benchmark, length)


@pytest.fixture
def _sm80() -> Iterator[None]:
    """The SM 80 (mma.sync) prefill kernel on every device, the default choice restored afterwards."""
    before = _attention_sm90.CHOICE.kind
    gp.set_prefill_kernel("sm80")
    yield
    gp.set_prefill_kernel(before)


@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.usefixtures("_sm80")
def test_sdpa_causal_pygpukit_alt(benchmark: Any, length: int, monkeypatch: pytest.MonkeyPatch) -> None:
    benchmark.group = _prefill_group(length)
    monkeypatch.setitem(attention._PREFILL_CONFIGS, HEAD_DIM, attention._PREFILL_ALTERNATIVES[HEAD_DIM])
    _time_pygpukit_prefill(benchmark, length)


@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.usefixtures("_sm80")
def test_sdpa_causal_pygpukit_sm80(benchmark: Any, length: int) -> None:
    benchmark.group = _prefill_group(length)
    _time_pygpukit_prefill(benchmark, length)


@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize("tiling", _attention_sm90.CONFIGS[HEAD_DIM][1:] + _attention_sm90.ALTERNATIVES[HEAD_DIM],
                         ids=lambda t: f"bn{t[0]}-stages{t[1]}{'-skew' if t[2] else ''}")  # fmt: skip
def test_sdpa_causal_pygpukit_sm90_alt(benchmark: Any, length: int, tiling: _attention_sm90.Tiling,
                                       monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    from pygpukit.ops.gemm._base import device_props

    if not device_props(gp.get_device()).wgmma:
        pytest.skip("the SM 90 prefill kernel runs on devices of compute capability 9.0 only")
    benchmark.group = _prefill_group(length)
    monkeypatch.setitem(_attention_sm90.CONFIGS, HEAD_DIM, [tiling])
    _time_pygpukit_prefill(benchmark, length)


@pytest.mark.parametrize("length", LENGTHS)
def test_sdpa_causal_torch_default(benchmark: Any, length: int) -> None:
    torch = _torch()
    benchmark.group = _prefill_group(length)
    q, k, v = (torch.from_numpy(x).to("cuda", torch.bfloat16).transpose(1, 2).contiguous() for x in _qkv(length))
    stream = torch.cuda.Stream()
    iterations = _iterations(length)

    def run() -> None:
        with torch.cuda.stream(stream):
            for _ in range(iterations):
                torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        stream.synchronize()

    benchmark.pedantic(run, rounds=5, warmup_rounds=1)
    benchmark.extra_info["flops"] = _prefill_flops(length)


@pytest.mark.parametrize("length", LENGTHS)
def test_sdpa_causal_torch_flash(benchmark: Any, length: int) -> None:
    torch = _torch()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    benchmark.group = _prefill_group(length)
    q, k, v = (torch.from_numpy(x).to("cuda", torch.bfloat16).transpose(1, 2).contiguous() for x in _qkv(length))
    stream = torch.cuda.Stream()
    iterations = _iterations(length)

    def run() -> None:
        with torch.cuda.stream(stream), sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            for _ in range(iterations):
                torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        stream.synchronize()

    benchmark.pedantic(run, rounds=5, warmup_rounds=1)
    benchmark.extra_info["flops"] = _prefill_flops(length)


# -- decode ------------------------------------------------------------------------------------------
DECODE_CASES = [(context, batch) for context in CONTEXTS for batch in DECODE_BATCHES]


def _decode_group(context: int, batch: int) -> str:
    return (f"decode_attention bf16 context {context} batch {batch} heads {DECODE_HEADS}/{DECODE_KV_HEADS} "
            f"dim {HEAD_DIM} (per {DECODE_ITERATIONS} steps)")  # fmt: skip


def _decode_bytes(context: int, batch: int) -> int:
    return 2 * batch * DECODE_KV_HEADS * context * HEAD_DIM * 2 * DECODE_ITERATIONS


def _decode_inputs(context: int, batch: int) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    rng = np.random.default_rng(context + batch)
    q = rng.uniform(-2, 2, (batch, DECODE_HEADS, HEAD_DIM)).astype(np.float32)
    kv = rng.random((2, batch, DECODE_KV_HEADS, context, HEAD_DIM), dtype=np.float32) * 2 - 1
    return q, kv


@pytest.mark.parametrize(("context", "batch"), DECODE_CASES)
def test_decode_pygpukit(benchmark: Any, context: int, batch: int) -> None:
    _decode_pygpukit(benchmark, context, batch)


# Decode tunings to compare with the default (attention._DECODE_MIN_CHUNK, attention._DECODE_CONFIGS):
# smaller or larger chunks of keys per block, two shared-memory stages instead of three.
DECODE_VARIANTS = {
    "chunk128": {"min_chunk": 128},
    "chunk512": {"min_chunk": 512},
    "stages2": {"configs": [(4, 2)]},
}


@pytest.mark.parametrize("variant", list(DECODE_VARIANTS))
@pytest.mark.parametrize(("context", "batch"), DECODE_CASES)
def test_decode_pygpukit_alt(
    benchmark: Any, context: int, batch: int, variant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = DECODE_VARIANTS[variant]
    if "min_chunk" in settings:
        monkeypatch.setattr(attention, "_DECODE_MIN_CHUNK", settings["min_chunk"])
    if "configs" in settings:
        monkeypatch.setitem(attention._DECODE_CONFIGS, HEAD_DIM, settings["configs"])
    _decode_pygpukit(benchmark, context, batch)
    benchmark.extra_info["variant"] = variant


def _decode_pygpukit(benchmark: Any, context: int, batch: int) -> None:
    benchmark.group = _decode_group(context, batch)
    q_host, kv_host = _decode_inputs(context, batch)
    q = gp.from_numpy(q_host).astype(gp.bfloat16)
    kv = gp.from_numpy(kv_host).astype(gp.bfloat16)
    k_cache, v_cache = kv[0], kv[1]
    lens = gp.from_numpy(np.full(batch, context, np.int32))
    out = gp.empty(q.shape, gp.bfloat16)
    ws = gp.decode_workspace(batch, DECODE_HEADS, DECODE_KV_HEADS, HEAD_DIM, context)

    def step() -> None:
        gp.decode_attention(q, k_cache, v_cache, lens, out=out, workspace=ws)

    step()
    graph = gp.CudaGraph()
    with graph.capture():
        for _ in range(DECODE_ITERATIONS):
            step()

    def run() -> None:
        graph.replay()
        graph.synchronize()

    benchmark.pedantic(run, rounds=10, warmup_rounds=2)
    benchmark.extra_info["bytes"] = _decode_bytes(context, batch)
    benchmark.extra_info["splits"] = ws.splits


def _torch_graph(torch: Any, step: Any) -> Any:
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()  # warm up outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(DECODE_ITERATIONS):
            step()
    return graph


@pytest.mark.parametrize(("context", "batch"), DECODE_CASES)
def test_decode_torch_sdpa(benchmark: Any, context: int, batch: int) -> None:
    torch = _torch()
    benchmark.group = _decode_group(context, batch)
    q_host, kv_host = _decode_inputs(context, batch)
    q = torch.from_numpy(q_host).to("cuda", torch.bfloat16)[:, :, None]  # (batch, heads, 1, dim)
    kv = torch.from_numpy(kv_host).to("cuda", torch.bfloat16)
    k_cache, v_cache = kv[0], kv[1]
    out = torch.empty_like(q)

    def step() -> None:
        out.copy_(torch.nn.functional.scaled_dot_product_attention(q, k_cache, v_cache, enable_gqa=True))

    graph = _torch_graph(torch, step)

    def run() -> None:
        graph.replay()
        torch.cuda.synchronize()

    benchmark.pedantic(run, rounds=10, warmup_rounds=2)
    benchmark.extra_info["bytes"] = _decode_bytes(context, batch)


@pytest.mark.parametrize(("context", "batch"), DECODE_CASES)
def test_decode_read_once_torch(benchmark: Any, context: int, batch: int) -> None:
    torch = _torch()
    benchmark.group = _decode_group(context, batch)
    _, kv_host = _decode_inputs(context, batch)
    kv = torch.from_numpy(kv_host).to("cuda", torch.bfloat16)
    total = torch.empty((), dtype=torch.float32, device="cuda")

    def step() -> None:
        total.copy_(torch.sum(kv, dtype=torch.float32))

    graph = _torch_graph(torch, step)

    def run() -> None:
        graph.replay()
        torch.cuda.synchronize()

    benchmark.pedantic(run, rounds=10, warmup_rounds=2)
    benchmark.extra_info["bytes"] = _decode_bytes(context, batch)
