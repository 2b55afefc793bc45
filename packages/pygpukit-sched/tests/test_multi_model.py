"""examples/multi_model.py (issue 23, item 5): SmolLM2 and Whisper tiny.en in two scheduler contexts,
a short version. Like the other real-model tests these need the models in the cache (``python -m
pygpukit models pull``; Whisper tiny.en is fetched on first use) and skip without them, or fail with
PYGPUKIT_REQUIRE_MODELS=1. They run on whatever backend is in use (the CPU backend in CI: about a
minute; the GPU on the GPU machine)."""

from __future__ import annotations

import importlib.util
import io
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from pygpukit import scheduler
from pygpukit.core.errors import ArgumentError

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "multi_model.py"
MiB = 2**20


def _skip_or_fail(reason: str) -> None:
    if os.environ.get("PYGPUKIT_REQUIRE_MODELS") == "1":
        pytest.fail(reason)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("multi_model_example", EXAMPLE)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def models() -> None:
    llm_hub = pytest.importorskip("pygpukit.llm.hub")
    asr_hub = pytest.importorskip("pygpukit.asr.hub")
    source = llm_hub.MODELS[llm_hub.DEFAULT_MODEL]
    if not (llm_hub.cache_dir() / "models" / source.name / source.filename).is_file():
        _skip_or_fail("SmolLM2 GGUF not in the cache (python -m pygpukit models pull)")
    try:
        asr_hub.pull(progress=False)
    except asr_hub.ModelDownloadError as exc:
        _skip_or_fail(f"Whisper tiny.en unavailable: {exc}")


@pytest.fixture(autouse=True)
def fresh_scheduler() -> Iterator[None]:
    scheduler.shutdown()
    yield
    scheduler.shutdown()


def test_sizes_parse_and_bad_ones_are_named(example: ModuleType) -> None:
    assert example.parse_bytes("512MiB") == 512 * MiB
    assert example.parse_bytes("2GB") == 2 * 10**9
    assert example.parse_bytes("1.5KiB") == 1536
    assert example.parse_bytes("4096") == 4096
    for bad in ("", "12 parsecs", "-1MiB", "0"):
        with pytest.raises(ArgumentError, match=repr(bad).replace("\\", "\\\\")):
            example.parse_bytes(bad)


@pytest.mark.slow
def test_both_models_progress_under_their_budgets(example: ModuleType, models: None) -> None:
    args = example.parser().parse_args(["--tokens", "3", "--llm-budget", "600MiB", "--asr-budget", "400MiB"])
    out = io.StringIO()
    report = example.run(args, out=out)
    text = out.getvalue()
    assert "latency per token" in text, text
    assert "beside asr" in text, text
    assert report["units"] == {"alone": 2, "beside": 2}  # 3 tokens: 2 decode latencies each time
    assert report["alone_ms"] > 0
    assert report["beside_ms"] > 0
    assert report["other_done"] >= 1  # the best-effort model made progress meanwhile
    # Greedy: the LLM wrote the same text in its unmeasured first run, alone and beside Whisper
    # (nothing shared was clobbered).
    first, *others = report["llm_texts"]
    assert len(others) == 2, report["llm_texts"]
    assert all(text == first for text in others), report["llm_texts"]
    assert first, report["llm_texts"]  # (the first tokens of this prompt are white space)
    if example._cached_speech() is not None:
        assert report["asr_text"].lower().rstrip(".") in ("10 of clubs", "ten of clubs"), report["asr_text"]
    for name, budget, least in (("llm", 600 * MiB, 50 * MiB), ("asr", 400 * MiB, 30 * MiB)):
        usage = report["usage"][name]
        assert least < usage["used_bytes"] <= usage["peak_bytes"] <= budget, (name, usage)
        assert usage["refused"] == 0


@pytest.mark.slow
def test_a_budget_too_small_for_whisper_refuses_there_only(example: ModuleType, models: None) -> None:
    args = example.parser().parse_args(["--tokens", "3", "--asr-budget", "16MiB"])
    with pytest.raises(scheduler.QuotaExceededError) as caught:
        example.run(args, out=io.StringIO())
    assert caught.value.context == "asr"
    assert caught.value.limit == 16 * MiB
    contexts = {c["name"]: c for c in scheduler.stats().contexts}
    assert contexts["llm"]["used_bytes"] > 50 * MiB  # loaded in full before, and untouched
    assert contexts["asr"]["refused"] >= 1


def test_budgets_that_do_not_fit_the_device_budget_are_not_admitted(
    example: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    assert example.main(["--device-budget", "512MiB"]) == 2  # the guaranteed LLM's 1 GiB reservation
    assert "not admitted: context 'llm': max_vram 1.00 GiB exceeds the device's capacity 512.00 MiB" in (
        capsys.readouterr().err
    )
    with pytest.raises(SystemExit):
        example.main(["--tokens", "1"])
    assert "--tokens must be >= 2" in capsys.readouterr().err
