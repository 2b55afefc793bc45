"""DecodeBatch (pygpukit.llm.decode_batch): B prompts of different lengths decoded together, each row
greedy-equal to the prompt decoded alone with DecodeM1, per-row stops, groups of batch_size, sampled
rows equal to DecodeM1's batch, no pool request in steady state, generate(strategy="batch") and its
errors. The GPU-marked twin runs the same comparison in bfloat16 with the graph step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from llm_testing import sibling

import pygpukit as gp
import pygpukit.llm as llm
from pygpukit.core.backend import backend_state
from pygpukit.core.errors import ArgumentError, ShapeError
from pygpukit.core.memory import memory_stats
from pygpukit.llm import DecodeBatch, DecodeM1, SamplingParams
from pygpukit.llm.decode_batch import FINISHED

_tm = sibling("test_model")
_ds = sibling("test_decode_strategies")
_spec = sibling("test_decode_spec")
SAMPLING = SamplingParams(temperature=0.9, top_k=40, top_p=0.95)
PROMPTS = [np.random.default_rng(n).integers(0, _tm.VOCAB, n).tolist() for n in (3, 9, 1, 14, 6)]


def _alone(model: Any, prompt: list[int], steps: int) -> list[int]:
    """``steps`` greedy tokens of ``prompt`` decoded alone with DecodeM1."""
    decoder = DecodeM1(model, 1, len(prompt) + steps)
    tokens = [int(decoder.start(np.asarray([prompt], np.int32))[0])]
    tokens += [int(decoder.step()[0]) for _ in range(steps - 1)]
    return tokens


@pytest.mark.parametrize("model_type", ["llama", "qwen2", "qwen3", "mixtral", "gpt2"])
def test_each_row_equals_decoding_it_alone(model_type: str, tmp_path: Path) -> None:
    model = _ds._gpt2(tmp_path) if model_type == "gpt2" else _ds._model(tmp_path, model_type)
    steps = 24
    batch = DecodeBatch(model, 3, 14 + steps)  # 5 prompts: a group of 3, then a group of 2 (one padding row)
    got = batch.generate(PROMPTS, steps)
    assert got == [_alone(model, p, steps) for p in PROMPTS]
    if backend_state().name != "cuda":
        assert not batch.graph  # the CPU backend launches op by op by default (CUDA: one graph per step)


def test_rows_stop_on_their_own(tmp_path: Path) -> None:
    model = _ds._model(tmp_path, "llama")
    steps = 20
    alone = [_alone(model, p, steps) for p in PROMPTS[:3]]
    stop = alone[0][4]  # row 0 stops at or before its 5th token
    limits = [steps, 7, 2]
    ends = [min(limits[r], alone[r].index(stop) + 1) if stop in alone[r] else limits[r] for r in range(3)]
    assert ends[0] <= 5
    batch = DecodeBatch(model, 4, 9 + steps)
    table = np.stack(list(batch.iterate(PROMPTS[:3], limits, stop_token_ids=[stop])))  # (steps taken + 1, 3)
    assert table.shape == (max(ends), 3)  # the loop ends with the last live row
    assert batch.steps == max(ends) - 1
    for row, expected in enumerate(alone):
        assert table[: ends[row], row].tolist() == expected[: ends[row]]
        assert (table[ends[row] :, row] == FINISHED).all()
    assert batch.generate(PROMPTS[:3], limits, [stop]) == [alone[r][: ends[r]] for r in range(3)]


def test_sampled_rows_equal_decode_m1_on_the_same_batch(tmp_path: Path) -> None:
    model = _ds._model(tmp_path, "qwen2")
    prompts = PROMPTS[:2]
    steps = 16
    got = DecodeBatch(model, 2, 9 + steps, SAMPLING, seed=11).generate(prompts, steps)
    ids = np.zeros((2, 9), np.int32)
    for row, p in enumerate(prompts):
        ids[row, : len(p)] = p
    m1 = DecodeM1(model, 2, 9 + steps, SAMPLING, seed=11)
    first = m1.start(ids, [len(p) for p in prompts])
    expected = np.stack([first] + [m1.step() for _ in range(steps - 1)], axis=1)
    assert got == expected.tolist()
    assert got != [_alone(model, p, steps) for p in prompts]  # it samples
    assert got == DecodeBatch(model, 2, 9 + steps, SAMPLING, seed=11).generate(prompts, steps)  # seeded


def test_steady_state_steps_allocate_nothing(tmp_path: Path) -> None:
    model = _ds._model(tmp_path, "llama")
    batch = DecodeBatch(model, 4, 64, SAMPLING, seed=2)
    rows = batch.iterate(PROMPTS[:3], 40)
    for _ in range(3):
        next(rows)
    before = memory_stats()
    for _ in range(8):
        next(rows)
    after = memory_stats()
    assert after["requests"] == before["requests"]
    assert after["in_use_bytes"] == before["in_use_bytes"]


def test_generate_batch_strategy(tmp_path: Path) -> None:
    model = _ds._model(tmp_path, "llama")
    options = {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True}
    expected = model.generate(PROMPTS[:3], strategy="eager", **options)
    assert model.generate(PROMPTS[:3], strategy="batch", **options) == expected
    wide = model.generate(PROMPTS[:3], strategy="batch", strategy_options={"batch_size": 5}, **options)
    assert wide == expected
    assert model.last_stats is not None
    assert model.last_stats.strategy == "batch"
    assert model.last_stats.new_tokens == 12
    stop = expected[1][len(PROMPTS[1]) + 2]  # row 1 stops at its third new token
    stopped = model.generate(PROMPTS[:3], strategy="batch", stop_token_ids=[stop], max_new_tokens=12, temperature=0)
    reference = model.generate(PROMPTS[:3], strategy="m1", stop_token_ids=[stop], max_new_tokens=12, temperature=0)
    assert stopped == reference
    assert len(stopped[1]) <= len(PROMPTS[1]) + 3
    with pytest.raises(ArgumentError, match="batch_size must be an int >= the 3 prompts"):
        model.generate(PROMPTS[:3], strategy="batch", strategy_options={"batch_size": 2}, **options)
    with pytest.raises(ArgumentError, match=r"\['window'\] do not apply to strategy='batch'"):
        model.generate(PROMPTS[:3], strategy="batch", strategy_options={"window": 2}, **options)
    with pytest.raises(ArgumentError, match="do not apply to strategy='m1'"):
        model.generate(PROMPTS[:3], strategy="m1", strategy_options={"batch_size": 2}, **options)


def test_errors_name_the_bad_value(tmp_path: Path) -> None:
    model = _ds._model(tmp_path, "llama")
    with pytest.raises(ArgumentError, match="batch_size must be an int >= 1, got 0"):
        DecodeBatch(model, 0, 16)
    with pytest.raises(ArgumentError, match="graph must be None, True or False"):
        DecodeBatch(model, 1, 16, graph="yes")  # type: ignore[arg-type]
    batch = DecodeBatch(model, 2, 16)
    with pytest.raises(ShapeError, match="3 prompts exceed batch_size 2"):
        next(batch.iterate(PROMPTS[:3], 2))
    with pytest.raises(ArgumentError, match=r"longest prompt \(14\) and max_new_tokens \(4\) need 18 positions"):
        batch.generate([PROMPTS[3]], 4)
    with pytest.raises(ArgumentError, match=f"token id {_tm.VOCAB} is outside"):
        batch.generate([[1, _tm.VOCAB]], 2)
    with pytest.raises(ArgumentError, match="2 max_new_tokens values for 1 prompts"):
        batch.generate([[1, 2]], [2, 3])
    with pytest.raises(ArgumentError, match="prompt 1 must be a non-empty list"):
        batch.generate([[1], []], 2)
    config = _tm._config("llama")
    quantized = llm.load(_tm._save(tmp_path / "q", config, _tm._weights(config, 7)), progress=False, quantize="int8")
    alone = [_alone(quantized, p, 3) for p in PROMPTS[:2]]
    assert DecodeBatch(quantized, 2, 16).generate(PROMPTS[:2], 3) == alone
    assert DecodeBatch(quantized, 2, 16, graph=True).generate(PROMPTS[:2], 3) == alone  # INT8 GEMVs write out=


# -- on the GPU ---------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize(("dtype", "graph"), [("float32", True), ("bfloat16", True), ("bfloat16", False)])
def test_gpu_rows_equal_decoding_alone(dtype: str, graph: bool, tmp_path: Path) -> None:
    """On the GPU a batch's GEMMs have B rows where a row alone has one (another kernel: the 1-row
    GEMV against the tensor-core multi-row one), so rows are only bitwise equal up to rounding: float32
    must give the same tokens; bfloat16 the same tokens up to a first difference at a near tie."""
    model = _ds._model(tmp_path, "qwen2", dtype=dtype)
    steps = 64
    batch = DecodeBatch(model, 8, 14 + steps, graph=graph)
    assert batch.graph is graph
    prompts = PROMPTS * 2  # 10 prompts: groups of 8 and 2
    got = batch.generate(prompts, steps)
    for index, prompt in enumerate(prompts):
        expected, logits = _spec._greedy(model, prompt, steps)
        _spec._assert_greedy(f"row {index}", got[index], expected, logits, near_ties=dtype == "bfloat16")
    gp.synchronize()
