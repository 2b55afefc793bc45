"""The real default model, SmolLM2-135M-Instruct (Q4_1 GGUF), against transformers.

``data/smollm2_golden.json`` holds transformers' greedy generations for five prompts (written by
``data/make_smollm2_golden.py`` on the GPU machine, transformers loading the same GGUF in float32).
These tests run on whatever backend is in use: the CPU simulation backend in CI, the GPU on the GPU
machine. They need the model file in the cache (``python -m pygpukit models pull``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

GOLDEN = Path(__file__).parent / "data" / "smollm2_golden.json"


@pytest.fixture(scope="module")
def golden() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(GOLDEN.read_text())
    return data


@pytest.fixture(scope="module")
def model(smollm2_gguf: Path) -> Any:
    import pygpukit.llm as llm

    return llm.load(smollm2_gguf, dtype="float32", progress=False)


def test_the_file_is_the_golden_files_model(smollm2_gguf: Path, golden: dict[str, Any]) -> None:
    import hashlib

    assert hashlib.sha256(smollm2_gguf.read_bytes()).hexdigest() == golden["meta"]["sha256"]


def test_prompt_ids_equal_transformers(model: Any, golden: dict[str, Any]) -> None:
    for case in golden["cases"]:
        if case["kind"] == "chat":
            text = model.chat_prompt(case["messages"])
            assert text == case["prompt_text"]
            ids = model.tokenizer.encode(text, add_special_tokens=False)
        else:
            ids = model.tokenizer.encode(case["prompt_text"])
        assert ids == case["prompt_ids"], case["prompt_text"]


def test_greedy_generations_equal_transformers(model: Any, golden: dict[str, Any]) -> None:
    """64 greedy tokens for each of the five prompts, identical ids (no stop on end-of-sequence)."""
    for case in golden["cases"]:
        ids = model.generate(case["prompt_ids"], max_new_tokens=len(case["new_ids"]), temperature=0, ignore_eos=True)
        new = ids[len(case["prompt_ids"]) :]
        assert new == case["new_ids"], (case["prompt_text"], model.tokenizer.decode(new), case["new_text"])


def test_capital_of_france_is_paris(model: Any) -> None:
    answer = model.chat([{"role": "user", "content": "What is the capital of France?"}], max_new_tokens=32,
                        temperature=0)  # fmt: skip
    assert "Paris" in answer
    stats = model.last_stats
    assert stats.new_tokens <= 32
    assert stats.prompt_tokens > 0
    assert stats.time_to_first_token_s > 0


def test_stream_equals_generate_and_stops_at_end_of_turn(model: Any) -> None:
    messages = [{"role": "user", "content": "Name three colors."}]
    streamed = "".join(model.chat_stream(messages, max_new_tokens=40, temperature=0))
    assert streamed == model.chat(messages, max_new_tokens=40, temperature=0)
    assert "<|im_end|>" not in streamed
    assert "\ufffd" not in streamed
    if model.last_stats.new_tokens < 40:
        assert model.last_stats.finish_reason == "stop"


def test_stop_strings_cut_the_text(model: Any) -> None:
    text = model.generate("The quick brown fox", max_new_tokens=24, temperature=0, ignore_eos=True)
    word = text.split()[1] if len(text.split()) > 1 else text.strip()
    cut = model.generate("The quick brown fox", max_new_tokens=24, temperature=0, ignore_eos=True, stop=[word])
    assert word not in cut
    assert text.startswith(cut)


def test_sampling_is_seeded(model: Any) -> None:
    kwargs: dict[str, Any] = {"max_new_tokens": 16, "temperature": 0.8, "top_k": 40, "top_p": 0.9, "ignore_eos": True}
    a = model.generate([1, 2, 3, 4], seed=11, **kwargs)
    assert a == model.generate([1, 2, 3, 4], seed=11, **kwargs)


def test_prefill_logits_of_a_batch_match_single_rows(model: Any) -> None:
    rows = [[1, 9690, 198], [1, 4093, 314, 2891, 30]]
    batch = model.generate(rows, max_new_tokens=4, temperature=0, ignore_eos=True)
    for row, got in zip(rows, batch, strict=True):
        assert got == model.generate(row, max_new_tokens=4, temperature=0, ignore_eos=True)
    assert np.asarray(model.forward([1, 2, 3]).to_numpy()).shape == (3, model.vocab_size)
