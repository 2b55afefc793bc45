"""Engine (pygpukit.llm.engine): continuous batching over a paged KV cache. Every greedy request equals
its prompt decoded alone with DecodeM1 (requests joining at different steps, finishing early, chunked
prefill, preemption and recompute), blocks all return to the allocator and the pool holds no more
than before; sampled requests depend only on their seed; the async and sync iterators; the memory
budget of a pygpukit.scheduler context; errors. The GPU-marked twin runs it in bfloat16.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from llm_testing import sibling

import pygpukit as gp
from pygpukit.core.errors import ArgumentError, OutOfMemoryError
from pygpukit.core.memory import memory_stats
from pygpukit.llm import Engine, EngineMemoryError, RequestSampling, UnsupportedStrategyError

_tm = sibling("test_model")
_ds = sibling("test_decode_strategies")
_spec = sibling("test_decode_spec")
PROMPTS = [np.random.default_rng(n).integers(0, _tm.VOCAB, n).tolist() for n in (3, 9, 1, 14, 6, 11)]
SAMPLED: dict[str, Any] = {"temperature": 0.9, "top_k": 40, "top_p": 0.95}


def _model(tmp_path: Path, model_type: str, dtype: Any = None) -> Any:
    return _ds._gpt2(tmp_path) if model_type == "gpt2" else _ds._model(tmp_path, model_type, dtype=dtype)


def _alone(model: Any, prompt: list[int], steps: int) -> list[int]:
    """``steps`` greedy tokens of ``prompt`` decoded alone with DecodeM1 (float64-checked elsewhere)."""
    return [int(t) for t in _spec._greedy(model, prompt, steps)[0]]


def _staggered(engine: Engine, limits: list[int], stops: list[tuple[int, ...]] | None = None) -> list[Any]:
    """Submit PROMPTS two at a time, stepping twice between the groups (requests join mid-run)."""
    requests = []
    for index, (prompt, limit) in enumerate(zip(PROMPTS, limits, strict=True)):
        stop = stops[index] if stops else ()
        requests.append(engine.submit(prompt, RequestSampling(max_tokens=limit, stop_token_ids=stop)))
        if index % 2 == 1:
            engine.step()
            engine.step()
    engine.run_until_done()
    return requests


@pytest.mark.parametrize(("model_type", "graph"), [("llama", False), ("qwen2", False), ("gpt2", False),
                                                  ("llama", True), ("qwen3", True), ("gpt2", True)])  # fmt: skip
def test_every_request_equals_decoding_it_alone(model_type: str, graph: bool, tmp_path: Path) -> None:
    """graph=True: the decode step captured once and replayed at every step (the CPU backend records
    and replays the op calls), whatever requests come and go."""
    model = _model(tmp_path, model_type)
    limits = [12, 3, 16, 9, 1, 14]  # some finish early
    expected = [_alone(model, p, n) for p, n in zip(PROMPTS, limits, strict=True)]
    engine = Engine(model, max_batch=4, max_seq_len=40, block_size=4, prefill_chunk=5, graph=graph)  # 3 chunks
    assert engine.graph is graph
    assert (engine.decoder.graph is not None and engine.decoder.graph.num_nodes > 0) is graph
    before = memory_stats()["in_use_bytes"]
    requests = _staggered(engine, limits)
    assert [r.output for r in requests] == expected
    assert all(r.finished and r.finish_reason == "length" for r in requests)
    stats = engine.stats
    assert stats.prefill_chunks > len(PROMPTS)  # the long prompts were prefilled in chunks
    assert stats.generated_tokens == sum(limits)
    assert (stats.running, stats.waiting, stats.blocks_used) == (0, 0, 0)
    assert engine.cache.allocator.available == engine.num_blocks  # every block returned
    assert engine.cache.sequences == {}
    assert engine.cache.context_lens.to_numpy().tolist() == [0] * 4
    assert memory_stats()["in_use_bytes"] == before  # nothing left behind in the pool
    assert stats.tokens_per_s > 0
    assert "blocks 0/" in stats.summary()


@pytest.mark.parametrize("graph", [False, True])
def test_steady_state_decode_allocates_nothing(graph: bool, tmp_path: Path) -> None:
    """A decode step uploads nothing: the picks are the next input, the mask changes only when requests
    join or leave, and the block table only when a sequence takes a block (not here: blocks of 32)."""
    model = _model(tmp_path, "llama")
    engine = Engine(model, max_batch=4, max_seq_len=40, block_size=32, graph=graph)
    requests = [engine.submit(p, max_tokens=30, seed=3, **(SAMPLED if n == 1 else {})) for n, p in
                enumerate(PROMPTS[:3])]  # fmt: skip
    for _ in range(3):  # every request decoding
        engine.step()
    assert all(r.state == "decode" for r in requests)
    blocks = engine.stats.blocks_used
    before = memory_stats()
    for _ in range(4):
        assert len(engine.step()) == 3
    after = memory_stats()
    assert engine.stats.blocks_used == blocks
    assert after["requests"] == before["requests"]
    assert after["in_use_bytes"] == before["in_use_bytes"]


def test_one_prefill_forward_serves_several_requests(tmp_path: Path) -> None:
    model = _model(tmp_path, "qwen2")
    engine = Engine(model, max_batch=4, max_seq_len=40, block_size=4, prefill_chunk=30)
    requests = [engine.submit(p, max_tokens=6) for p in PROMPTS]
    first = engine.step()  # 3 + 9 + 1 + 14 = 27 tokens of four requests: one forward
    assert engine.stats.prefill_chunks == 4
    assert sorted(r.id for r, _ in first) == [0, 1, 2, 3]
    engine.run_until_done()
    assert [r.output for r in requests] == [_alone(model, p, 6) for p in PROMPTS]


def test_stop_ids_and_interleaving(tmp_path: Path) -> None:
    model = _model(tmp_path, "llama")
    alone = [_alone(model, p, 12) for p in PROMPTS]
    stops = [(alone[0][3],), (), (alone[2][0],), (), (alone[4][5],), ()]
    engine = Engine(model, max_batch=3, max_seq_len=32, block_size=2, prefill_chunk=3)
    requests = _staggered(engine, [12] * 6, stops)
    for request, tokens, stop in zip(requests, alone, stops, strict=True):
        end = tokens.index(stop[0]) + 1 if stop and stop[0] in tokens else 12
        assert request.output == tokens[:end]
        assert request.finish_reason == ("stop" if end < 12 or (stop and tokens[11] == stop[0]) else "length")
    assert len(requests[2].output) == 1  # stopped at its first token
    assert engine.cache.allocator.used == 0


def test_preemption_recomputes_the_newest(tmp_path: Path) -> None:
    model = _model(tmp_path, "qwen2")
    limits = [20, 20, 20, 20, 20, 20]
    expected = [_alone(model, p, n) for p, n in zip(PROMPTS, limits, strict=True)]
    # 12 blocks of 4: three sequences of up to 34 tokens cannot all grow, so the newest is preempted.
    engine = Engine(model, max_batch=4, max_seq_len=36, block_size=4, num_blocks=12, prefill_chunk=8)
    requests = _staggered(engine, limits)
    assert engine.stats.preemptions > 0
    assert any(r.preemptions for r in requests)
    assert [r.output for r in requests] == expected
    assert engine.cache.allocator.used == 0
    roomy = Engine(model, max_batch=4, max_seq_len=64, block_size=4, num_blocks=12)
    with pytest.raises(ArgumentError, match="need 13 blocks of 4, the cache has 12"):
        roomy.submit(PROMPTS[3], max_tokens=36)  # a request that could never fit is refused at once


def test_preempted_sampled_requests_keep_their_tokens(tmp_path: Path) -> None:
    model = _model(tmp_path, "llama")
    roomy = Engine(model, max_batch=4, max_seq_len=36, block_size=4)
    alone = [roomy.submit(p, max_tokens=20, seed=n, **SAMPLED) for n, p in enumerate(PROMPTS[:4])]
    roomy.run_until_done()
    tight = Engine(model, max_batch=4, max_seq_len=36, block_size=4, num_blocks=11, prefill_chunk=8)
    crowded = [tight.submit(p, max_tokens=20, seed=n, **SAMPLED) for n, p in enumerate(PROMPTS[:4])]
    tight.run_until_done()
    assert tight.stats.preemptions > 0
    assert [r.output for r in crowded] == [r.output for r in alone]  # recompute draws the same tokens
    assert tight.cache.allocator.used == 0


def test_sampled_requests_depend_only_on_their_seed(tmp_path: Path) -> None:
    model = _model(tmp_path, "llama")
    alone_engine = Engine(model, max_batch=2, max_seq_len=40, block_size=4)
    alone = alone_engine.submit(PROMPTS[1], max_tokens=16, seed=5, **SAMPLED)
    assert list(alone) == alone.output  # the sync iterator drives the engine
    assert len(alone.output) == 16
    crowd = Engine(model, max_batch=4, max_seq_len=40, block_size=4, prefill_chunk=4)
    others = [crowd.submit(p, max_tokens=10, seed=9, **SAMPLED) for p in PROMPTS[2:5]]
    crowd.step()
    again = crowd.submit(PROMPTS[1], max_tokens=16, seed=5, **SAMPLED)
    greedy = crowd.submit(PROMPTS[0], max_tokens=8)
    crowd.run_until_done()
    assert again.output == alone.output  # the same seed, other neighbours: the same tokens
    assert alone.output != _alone(model, PROMPTS[1], 16)  # it samples
    assert greedy.output == _alone(model, PROMPTS[0], 8)
    assert others[0].output != again.output[:10]
    other_seed = Engine(model, max_batch=1, max_seq_len=40, block_size=4).submit(PROMPTS[1], max_tokens=16, seed=6,
                                                                                 **SAMPLED)  # fmt: skip
    assert list(other_seed) != alone.output


def test_async_iteration_and_generate(tmp_path: Path) -> None:
    model = _model(tmp_path, "llama")
    engine = Engine(model, max_batch=2, max_seq_len=40, block_size=4, prefill_chunk=6)
    expected = [_alone(model, p, 7) for p in PROMPTS[:4]]

    async def stream(prompt: list[int]) -> list[int]:
        request = engine.submit(prompt, max_tokens=7)
        return [token async for token in request]

    async def main() -> list[Any]:
        streamed = asyncio.gather(*(stream(p) for p in PROMPTS[:2]))
        generated = asyncio.gather(*(engine.generate(p, {"max_tokens": 7}) for p in PROMPTS[2:4]))
        return list(await streamed) + list(await generated)

    assert asyncio.run(main()) == expected  # four requests through two slots
    assert engine.stats.finished == 4
    assert engine.cache.allocator.used == 0


def test_context_budget(tmp_path: Path) -> None:
    scheduler = pytest.importorskip("pygpukit.scheduler")
    model = _model(tmp_path, "llama")
    probe = Engine(model, max_batch=1, max_seq_len=8, block_size=4, num_blocks=1)
    per_block = probe.block_bytes
    scheduler.shutdown()
    scheduler.initialize(device_id=0)
    try:
        small = scheduler.create_context("engine-small", max_vram=10 * per_block, qos="burstable")
        with pytest.raises(EngineMemoryError, match=r"a KV cache of 64 blocks needs .* 'engine-small' has") as info:
            Engine(model, max_batch=2, max_seq_len=40, block_size=4, num_blocks=64, context=small)
        assert isinstance(info.value, OutOfMemoryError)
        assert info.value.needed_bytes == 64 * per_block
        assert small.used_bytes == 0  # refused before allocating
        ctx = scheduler.create_context("engine", max_vram=4 * 1024 * 1024, qos="burstable")
        engine = Engine(model, max_batch=2, max_seq_len=40, block_size=4, memory_budget=40 * per_block + 7,
                        context=ctx)  # fmt: skip
        assert engine.num_blocks == 40
        assert ctx.used_bytes >= engine.cache_bytes  # the cache is charged to the context
        request = engine.submit(PROMPTS[3], max_tokens=6)
        engine.run_until_done()
        assert request.output == _alone(model, PROMPTS[3], 6)
        assert ctx.used_bytes <= ctx.max_vram
        default = Engine(model, max_batch=2, max_seq_len=40, block_size=4, context=ctx)  # 80 % of what is free
        assert 0 < default.cache_bytes <= ctx.max_vram
    finally:
        scheduler.shutdown()


def test_errors_name_the_bad_value(tmp_path: Path) -> None:
    model = _model(tmp_path, "llama")
    with pytest.raises(ArgumentError, match="max_batch must be an int >= 1, got 0"):
        Engine(model, max_batch=0)
    with pytest.raises(ArgumentError, match="max_seq_len 9999 exceeds the model's 512 positions"):
        Engine(model, max_seq_len=9999)
    with pytest.raises(ArgumentError, match="num_blocks or memory_budget, not both"):
        Engine(model, max_seq_len=16, num_blocks=4, memory_budget=1 << 20)
    with pytest.raises(EngineMemoryError, match="memory_budget 10 bytes holds no KV block"):
        Engine(model, max_seq_len=16, memory_budget=10)
    with pytest.raises(ArgumentError, match=r"context must be a pygpukit\.scheduler ExecutionContext, got str"):
        Engine(model, max_seq_len=16, context="llm")
    engine = Engine(model, max_batch=2, max_seq_len=16, block_size=4)
    with pytest.raises(ArgumentError, match=r"prompt \(14 tokens\) and max_tokens \(4\) need 18 positions"):
        engine.submit(PROMPTS[3], max_tokens=4)
    with pytest.raises(ArgumentError, match=f"token id {_tm.VOCAB} is outside"):
        engine.submit([1, _tm.VOCAB])
    with pytest.raises(ArgumentError, match="the prompt is empty"):
        engine.submit([])
    with pytest.raises(ArgumentError, match="a text prompt needs a model with a tokenizer"):
        engine.submit("hello")
    with pytest.raises(ArgumentError, match=r"unknown fields \['temp'\]"):
        engine.submit([1], temp=0.5)
    with pytest.raises(ArgumentError, match="max_tokens must be an int >= 1, got 0"):
        RequestSampling(max_tokens=0)
    with pytest.raises(ArgumentError, match="top_p must be None or in"):
        engine.submit([1], top_p=1.5)
    assert engine.step() == []  # nothing to do
    with pytest.raises(ArgumentError, match="graph must be None, True or False, got 'yes'"):
        Engine(model, max_seq_len=16, graph="yes")  # type: ignore[arg-type]
    moe = _model(tmp_path / "moe", "mixtral")
    for graph in (False, True):  # dense experts: the paged step runs moe_mlp into its buffers, captured too
        moe_engine = Engine(moe, max_batch=2, max_seq_len=16, block_size=4, graph=graph)
        assert moe_engine.graph is graph
        moe_requests = [moe_engine.submit(p, max_tokens=5) for p in PROMPTS[:3]]
        moe_engine.run_until_done()
        assert [r.output for r in moe_requests] == [_alone(moe, p, 5) for p in PROMPTS[:3]]
    from pygpukit.llm.loader import quantize_weights

    quantize_weights(moe.weights, "q8_0")
    with pytest.raises(UnsupportedStrategyError, match=r"Engine\(graph=True\) does not support quantized MoE"):
        Engine(moe, max_seq_len=16, graph=True)
    half = _model(tmp_path / "moe16", "mixtral", dtype="bfloat16")
    quantize_weights(half.weights, "q8_0")  # bf16 with quantized experts: captured (grouped GEMV / GEMM)
    half_engine = Engine(half, max_batch=2, max_seq_len=16, block_size=4, graph=True)
    half_requests = [half_engine.submit(p, max_tokens=5) for p in PROMPTS[:3]]
    half_engine.run_until_done()
    assert [r.output for r in half_requests] == [_alone(half, p, 5) for p in PROMPTS[:3]]
    assert "waiting=0" in repr(engine)


# -- on the GPU ---------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize(
    ("dtype", "graph", "model_type"),
    [
        ("float32", True, "qwen2"),
        ("bfloat16", True, "qwen2"),
        ("bfloat16", False, "qwen2"),
        ("float32", True, "mixtral"),
    ],
)
def test_gpu_requests_equal_decoding_alone(dtype: str, graph: bool, model_type: str, tmp_path: Path) -> None:
    """On the GPU the engine's GEMMs have many rows where a request alone has one, and its prefill runs
    paged decode attention per query where DecodeM1 runs flash prefill: float32 must give the same
    tokens, bfloat16 the same up to a first difference at a near tie (test_decode_batch's criterion)."""
    model = _ds._model(tmp_path, model_type, dtype=dtype)
    steps = 48
    prompts = PROMPTS * 3  # 18 requests through 8 slots
    engine = Engine(model, max_batch=8, max_seq_len=14 + steps, block_size=16, prefill_chunk=8, graph=graph)
    assert engine.graph is graph
    requests = []
    for index, prompt in enumerate(prompts):
        requests.append(engine.submit(prompt, max_tokens=steps - index % 5))
        if index % 4 == 3:
            engine.step()
    engine.run_until_done()
    for index, (request, prompt) in enumerate(zip(requests, prompts, strict=True)):
        expected, logits = _spec._greedy(model, prompt, steps - index % 5)
        _spec._assert_greedy(f"request {index}", request.output, expected, logits, near_ties=dtype == "bfloat16")
    assert engine.cache.allocator.used == 0
    gp.synchronize()
