"""DecodeSpeculative and DecodeJacobi (pygpukit.llm.decode_spec): several tokens per forward, greedy
output equal to greedy DecodeM1 token for token (self-speculation from early layers, a separate draft
model, the model as its own draft, Jacobi windows), the KV cache rolled back to the accepted tokens,
the cache's end, generate(strategy="speculative"|"jacobi") and the typed errors. The real SmolLM2
reports its acceptance rate; the GPU-marked tests run the same comparisons there.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from llm_testing import sibling

import pygpukit as gp
import pygpukit.llm as llm
from pygpukit.core.errors import ArgumentError, ShapeError
from pygpukit.core.memory import memory_stats
from pygpukit.llm import DecodeJacobi, DecodeM1, DecodeSpeculative, UnsupportedStrategyError
from pygpukit.llm.decode_spec import early_exit_model

_tm = sibling("test_model")
_ds = sibling("test_decode_strategies")
PROMPT = [5, 17, 3, 40, 22, 9]


def _greedy(model: Any, prompt: list[int], count: int) -> tuple[list[int], list[np.ndarray[Any, Any] | None]]:
    """``count`` greedy tokens of DecodeM1 and the logits each was picked from (None for the first)."""
    decoder = DecodeM1(model, 1, len(prompt) + count)
    tokens = [int(decoder.start(np.asarray([prompt], np.int32))[0])]
    logits: list[np.ndarray[Any, Any] | None] = [None]
    for _ in range(count - 1):
        tokens.append(int(decoder.step()[0]))
        logits.append(decoder.logits.to_numpy()[0].astype(np.float64))
    return tokens, logits


def _decode(decoder: Any, prompt: list[int], count: int) -> list[int]:
    tokens = decoder.start(prompt).tolist()
    while len(tokens) < count:
        new = decoder.step().tolist()
        assert 1 <= len(new) <= decoder.window + (1 if isinstance(decoder, DecodeSpeculative) else 0)
        tokens += new
        assert decoder.state.host_lengths == [len(prompt) + len(tokens) - 1]  # rolled back to the accepted
        assert decoder.state.lengths.to_numpy().tolist() == [len(prompt) + len(tokens) - 1]
    return [int(t) for t in tokens[:count]]


SELF_CASES = [("llama", 1, False), ("llama", 3, True), ("qwen2", 6, False), ("qwen3", 3, True), ("mixtral", 2, False),
              ("gpt2", 4, True)]  # fmt: skip


@pytest.mark.parametrize(("model_type", "n", "graph"), SELF_CASES)
def test_self_speculation_equals_greedy(model_type: str, n: int, graph: bool, tmp_path: Path) -> None:
    """graph=True captures the draft step and the verifying forward (the CPU backend records and
    replays their op calls)."""
    model = _ds._gpt2(tmp_path) if model_type == "gpt2" else _ds._model(tmp_path, model_type)
    count = 40
    expected, _ = _greedy(model, PROMPT, count)
    decoder = DecodeSpeculative(model, len(PROMPT) + count, draft_layers=1, num_draft_tokens=n, graph=graph)
    assert decoder.draft.num_layers == 1
    assert (decoder.full.graph is not None) is graph
    assert isinstance(decoder.drafter, llm.DecodeM1Graph) is graph
    assert _decode(decoder, PROMPT, count) == expected
    assert decoder.drafted > 0
    assert 0.0 <= decoder.acceptance_rate <= 1.0
    assert decoder.drafted == n * decoder.forwards  # the cache always had room for the whole window
    assert decoder.tokens == decoder.forwards + decoder.accepted  # each round: its accepted drafts and one more


def test_a_separate_draft_model_and_the_model_as_its_own_draft(tmp_path: Path) -> None:
    model = _ds._model(tmp_path, "llama")
    config = _tm._config("qwen2")  # another architecture and other weights, the same vocabulary
    draft = llm.load(_tm._save(tmp_path / "draft", config, _tm._weights(config, 99)), progress=False)
    count = 48
    expected, _ = _greedy(model, PROMPT, count)
    other = DecodeSpeculative(model, len(PROMPT) + count, draft=draft, num_draft_tokens=4)
    assert _decode(other, PROMPT, count) == expected
    assert other.acceptance_rate < 0.9  # an unrelated random draft is mostly rejected
    itself = DecodeSpeculative(model, len(PROMPT) + count, draft=model, num_draft_tokens=4)
    assert _decode(itself, PROMPT, count) == expected
    assert itself.acceptance_rate == 1.0  # every draft accepted: the draft's cache catches up each round
    assert itself.forwards == -(-(count - 1) // 5)
    again = _decode(itself, PROMPT[:4], 20)  # start() resets: a second prompt
    assert again == _greedy(model, PROMPT[:4], 20)[0]


@pytest.mark.parametrize(("window", "graph"), [(1, False), (2, True), (5, False), (8, True)])
def test_jacobi_equals_greedy(window: int, graph: bool, tmp_path: Path) -> None:
    model = _ds._model(tmp_path, "qwen3")
    count = 60
    expected, _ = _greedy(model, PROMPT, count)
    decoder = DecodeJacobi(model, len(PROMPT) + count, window=window, graph=graph)
    if graph:
        assert decoder.full.graph is not None
        assert decoder.full.graph.num_nodes > 0
    assert _decode(decoder, PROMPT, count) == expected
    assert decoder.iterations_per_token <= 1.0
    if window == 1:
        assert decoder.iterations_per_token == 1.0
    assert decoder.stats()["tokens_per_forward"] == pytest.approx(1 / decoder.iterations_per_token)


def test_jacobi_converges_on_a_repeating_sequence(tmp_path: Path) -> None:
    """Where greedy decoding falls into a loop, the window's guesses become right: fewer iterations
    than tokens."""
    model = _ds._model(tmp_path, "llama")
    count = 120
    expected, _ = _greedy(model, PROMPT, count)
    decoder = DecodeJacobi(model, len(PROMPT) + count, window=6)
    assert _decode(decoder, PROMPT, count) == expected
    assert len(set(expected[-40:])) < 20  # this random model repeats itself
    assert decoder.iterations_per_token < 0.9


@pytest.mark.parametrize("graph", [False, True])
def test_steady_state_steps_allocate_nothing(graph: bool, tmp_path: Path) -> None:
    model = _ds._model(tmp_path, "qwen2")
    for decoder in (DecodeSpeculative(model, 64, draft_layers=1, num_draft_tokens=3, graph=graph),
                    DecodeJacobi(model, 64, window=4, graph=graph)):  # fmt: skip
        decoder.start(PROMPT)
        decoder.step()
        before = memory_stats()
        for _ in range(5):
            decoder.step()
        after = memory_stats()
        assert after["requests"] == before["requests"], type(decoder).__name__
        assert after["in_use_bytes"] == before["in_use_bytes"], type(decoder).__name__


def test_the_end_of_the_cache(tmp_path: Path) -> None:
    model = _ds._model(tmp_path, "llama")
    expected, _ = _greedy(model, PROMPT, 30)
    decoders: list[Any] = [
        DecodeSpeculative(model, 10, draft_layers=1, num_draft_tokens=3),
        DecodeJacobi(model, 10, window=3),
    ]
    for decoder in decoders:
        tokens = decoder.start(PROMPT).tolist()
        while decoder.length < decoder.capacity:
            tokens += decoder.step().tolist()
        with pytest.raises(ArgumentError, match="KV cache holds 14 positions and is full"):
            decoder.step()
        assert tokens == expected[: len(tokens)]
        assert len(tokens) == 14 - len(PROMPT) + 1  # the windows shrink to fit the cache's last positions


def test_generate_speculative_and_jacobi(tmp_path: Path) -> None:
    model = _ds._model(tmp_path, "qwen2")
    options = {"max_new_tokens": 25, "temperature": 0, "ignore_eos": True}
    expected = model.generate(PROMPT, strategy="m1", **options)
    spec = model.generate(PROMPT, strategy="speculative", strategy_options={"num_draft_tokens": 3}, **options)
    assert spec == expected
    assert model.last_stats is not None
    assert model.last_stats.strategy == "speculative"
    assert model.last_stats.new_tokens == 25
    assert 0.0 <= model.last_stats.decode_info["acceptance_rate"] <= 1.0
    assert model.generate(PROMPT, strategy="jacobi", strategy_options={"window": 4}, **options) == expected
    assert model.last_stats.decode_info["iterations_per_token"] <= 1.0
    stop = expected[len(PROMPT) + 5]
    stopped = model.generate(PROMPT, strategy="jacobi", stop_token_ids=[stop], max_new_tokens=25, temperature=0)
    assert stopped == model.generate(PROMPT, strategy="m1", stop_token_ids=[stop], max_new_tokens=25, temperature=0)
    with pytest.raises(UnsupportedStrategyError, match="batch 2"):
        model.generate([PROMPT, PROMPT], strategy="speculative", **options)
    with pytest.raises(UnsupportedStrategyError, match=r"sampling \(temperature 0.8\)"):
        model.generate(PROMPT, strategy="jacobi", max_new_tokens=4, temperature=0.8)
    with pytest.raises(UnsupportedStrategyError, match="repetition_penalty"):
        model.generate(PROMPT, strategy="speculative", max_new_tokens=4, temperature=0, repetition_penalty=1.2)
    with pytest.raises(ArgumentError, match=r"\['draft_layers'\] do not apply to strategy='jacobi'"):
        model.generate(PROMPT, strategy="jacobi", strategy_options={"draft_layers": 1}, **options)


def test_errors_name_the_bad_value(tmp_path: Path) -> None:
    model = _ds._model(tmp_path, "llama")
    with pytest.raises(ArgumentError, match=r"num_draft_tokens must be an int in \[1, 64\], got 0"):
        DecodeSpeculative(model, 16, num_draft_tokens=0)
    with pytest.raises(ArgumentError, match=r"draft_layers must be an int in \[1, 1\], got 2"):
        DecodeSpeculative(model, 16, draft_layers=2)
    with pytest.raises(ArgumentError, match="a draft model or draft_layers, not both"):
        DecodeSpeculative(model, 16, draft=model, draft_layers=1)
    config = _tm._config("llama")
    config["vocab_size"] = 64
    small = _tm._weights(_tm._config("llama"), 3)
    small["model.embed_tokens.weight"] = small["model.embed_tokens.weight"][:64]
    small["lm_head.weight"] = small["lm_head.weight"][:64]
    other_vocab = llm.load(_tm._save(tmp_path / "v", config, small), progress=False)
    with pytest.raises(ShapeError, match="the draft's vocabulary has 64 tokens, the model's 96"):
        DecodeSpeculative(model, 16, draft=other_vocab)
    with pytest.raises(ArgumentError, match=r"window must be an int in \[1, 64\], got 65"):
        DecodeJacobi(model, 16, window=65)
    with pytest.raises(ShapeError, match=r"ids must be \(1, seq\) or \(seq,\)"):
        DecodeJacobi(model, 16).start([[1, 2], [3, 4]])
    with pytest.raises(ArgumentError, match="a 20-token prompt exceeds max_seq_len 16"):
        DecodeJacobi(model, 16).start(list(range(20)))
    with pytest.raises(ArgumentError, match=r"num_layers must be an int in \[1, 2\], got 3"):
        early_exit_model(model, 3)
    one = early_exit_model(model, 1)  # a 1-layer model
    assert one.num_layers == 1
    with pytest.raises(UnsupportedStrategyError, match="2 layers or more, this one has 1"):
        DecodeSpeculative(one, 16)


@pytest.mark.slow
def test_smollm2_speculative_and_jacobi_equal_greedy(smollm2_gguf: Path) -> None:
    """The real model: self-speculation from its first 8 of 30 layers and Jacobi, against DecodeM1
    (GPU: 128 tokens in bfloat16; CPU backend: 12 tokens in float32). Prints the acceptance rate (low:
    SmolLM2's early layers were not trained to exit early; 0.5 % over 48 tokens on the CPU backend)."""
    cuda = gp.backend_state().name == "cuda"
    model = llm.load(smollm2_gguf, dtype="bfloat16" if cuda else "float32", progress=False, keep_quantized=False)
    assert model.tokenizer is not None
    prompt = model.tokenizer.encode(model.chat_prompt([{"role": "user", "content": "What is the capital of France?"}]),
                                    add_special_tokens=False)  # fmt: skip
    count = 128 if cuda else 12
    expected, logits = _greedy(model, prompt, count)
    spec = DecodeSpeculative(model, len(prompt) + count, draft_layers=8, num_draft_tokens=4)
    jacobi = DecodeJacobi(model, len(prompt) + count, window=4)
    got = {"speculative": _decode(spec, prompt, count), "jacobi": _decode(jacobi, prompt, count)}
    print(f"\nSmolLM2 ({model.backend}, {count} tokens): speculative {spec.stats()}, jacobi {jacobi.stats()}")
    for name, tokens in got.items():
        _assert_greedy(name, tokens, expected, logits, near_ties=cuda)
    assert spec.drafted == 4 * spec.forwards


def _assert_greedy(name: str, got: list[int], expected: list[int], logits: list[np.ndarray[Any, Any] | None],
                   near_ties: bool) -> None:  # fmt: skip
    """``got`` equals the greedy tokens, except that with ``near_ties`` (bfloat16 on the GPU, where the
    multi-row GEMMs round differently from the 1-row decode step) a first difference is allowed at a
    near tie: the token taken is within 4 bfloat16 ulps of the greedy token's logit there."""
    if got == expected:
        return
    first = next(i for i, (a, b) in enumerate(zip(got, expected, strict=True)) if a != b)
    row = logits[first]
    assert near_ties, f"{name}: token {first} is {got[first]}, greedy gives {expected[first]}"
    assert row is not None, f"{name}: the first token differs ({got[0]}, greedy {expected[0]})"
    tolerance = 4 * 2.0 ** (np.floor(np.log2(np.abs(row).max())) - 7)
    gap = float(row[expected[first]] - row[got[first]])
    assert gap <= tolerance, f"{name}: token {first} differs from greedy by a logit gap of {gap} (> {tolerance})"


def test_the_near_tie_check() -> None:
    """_assert_greedy (the GPU tests' criterion) passes a first difference only at a near tie."""
    row = np.array([0.5, 8.0, 7.97, 3.0])  # bfloat16 ulp at 8 is 0.0625: 4 ulps = 0.25
    _assert_greedy("t", [1, 2], [1, 2], [None, row], near_ties=False)
    _assert_greedy("t", [1, 2, 0], [1, 1, 3], [None, row, row], near_ties=True)  # 8.0 - 7.97: a near tie
    with pytest.raises(AssertionError, match=r"logit gap of 5\.0"):
        _assert_greedy("t", [1, 3], [1, 1], [None, row], near_ties=True)
    with pytest.raises(AssertionError, match="token 1 is 2, greedy gives 1"):
        _assert_greedy("t", [1, 2], [1, 1], [None, row], near_ties=False)
    with pytest.raises(AssertionError, match="the first token differs"):
        _assert_greedy("t", [2], [1], [None], near_ties=True)


# -- on the GPU ---------------------------------------------------------------------------------------
@pytest.mark.gpu
def test_gpu_speculative_and_jacobi_equal_greedy_float32(tmp_path: Path) -> None:
    """float32 (exact fp32 GEMMs): the window forward equals the decode step's greedy tokens."""
    model = _ds._model(tmp_path, "qwen2", dtype="float32")
    count = 96
    expected, _ = _greedy(model, PROMPT, count)
    spec = DecodeSpeculative(model, len(PROMPT) + count, draft_layers=1, num_draft_tokens=4)
    assert isinstance(spec.drafter, llm.DecodeM1Graph)  # the draft replays a CUDA graph per token
    assert _decode(spec, PROMPT, count) == expected
    assert _decode(DecodeJacobi(model, len(PROMPT) + count, window=5), PROMPT, count) == expected
    itself = DecodeSpeculative(model, len(PROMPT) + count, draft=model, num_draft_tokens=4)
    assert _decode(itself, PROMPT, count) == expected
    assert itself.acceptance_rate == 1.0


@pytest.mark.gpu
def test_gpu_speculative_and_jacobi_bf16(tmp_path: Path) -> None:
    """bfloat16: equal to greedy, or first different at a near tie of the greedy logits."""
    model = _ds._model(tmp_path, "llama", dtype="bfloat16")
    count = 96
    expected, logits = _greedy(model, PROMPT, count)
    spec = DecodeSpeculative(model, len(PROMPT) + count, draft_layers=1, num_draft_tokens=4)
    _assert_greedy("speculative", _decode(spec, PROMPT, count), expected, logits, near_ties=True)
    jacobi = DecodeJacobi(model, len(PROMPT) + count, window=5)
    _assert_greedy("jacobi", _decode(jacobi, PROMPT, count), expected, logits, near_ties=True)


@pytest.mark.gpu
def test_gpu_steady_state_steps_allocate_nothing(tmp_path: Path) -> None:
    """With CUDA graphs (the default on the GPU): the draft tokens and the window forward are graph
    replays into preallocated buffers; a step makes no pool request and no device allocation."""
    model = _ds._model(tmp_path, "llama", dtype="bfloat16")
    for decoder in (DecodeSpeculative(model, 128, draft_layers=1, num_draft_tokens=4), DecodeJacobi(model, 128)):
        assert decoder.full.graph is not None
        decoder.start(PROMPT)
        decoder.step()
        gp.synchronize()
        before = memory_stats()
        for _ in range(8):
            decoder.step()
        gp.synchronize()
        after = memory_stats()
        assert after["requests"] == before["requests"], type(decoder).__name__
        assert after["device_allocations"] == before["device_allocations"], type(decoder).__name__
