"""``python -m pygpukit generate --profile trace.json``: the generation runs under a pygpukit.profiling
Profiler and its chrome trace is written (with a stand-in model whose stream opens named ranges)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pygpukit import profiling
from pygpukit.llm import cli


class _Model:
    config = SimpleNamespace(name="fake-model")
    backend = "cpu"
    last_stats: Any = None

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail

    def generate_stream(self, prompt: str, **kwargs: Any) -> Iterator[str]:
        with profiling.range("llm.prefill"):
            yield "Hello"
        for piece in (" wor", "ld"):
            with profiling.range("llm.decode_step"):
                if self.fail:
                    raise RuntimeError("decode failed")
                yield piece


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> _Model:
    model = _Model()
    monkeypatch.setattr(cli, "_load_model", lambda name, dtype, *, progress: model)
    return model


def test_generate_profile_writes_a_chrome_trace(fake: _Model, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    path = tmp_path / "trace.json"
    assert cli.main(["generate", "Once upon", "--no-stats", "--profile", str(path)]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("Hello world")
    assert f"-> {path}" in err
    assert "3 ranges" in err
    events = json.loads(path.read_text())["traceEvents"]
    ranges = [e["name"] for e in events if e["ph"] == "X" and e["pid"] == 0]
    assert ranges == ["llm.prefill", "llm.decode_step", "llm.decode_step"]
    assert any(e["ph"] == "C" and e["name"] == "pool" for e in events)
    assert profiling.active_profiler() is None


def test_no_profile_no_profiler(fake: _Model, tmp_path: Path) -> None:
    assert cli.main(["generate", "p", "--no-stats"]) == 0
    assert profiling.active_profiler() is None
    assert not list(tmp_path.iterdir())


def test_a_failed_generation_stops_the_profiler(fake: _Model, tmp_path: Path) -> None:
    fake.fail = True
    with pytest.raises(RuntimeError, match="decode failed"):
        cli.main(["generate", "p", "--no-stats", "--profile", str(tmp_path / "t.json")])
    assert profiling.active_profiler() is None
