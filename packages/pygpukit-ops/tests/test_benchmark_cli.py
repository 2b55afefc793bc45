"""python -m pygpukit.benchmark: options, checked results, JSON, comparison (runs on any backend)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pygpukit.benchmark import main

FAST = ["--elementwise", "--reduction", "--sizes", "1024", "--iterations", "1", "--warmup", "0", "--no-progress"]


def test_runs_checks_and_saves(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    saved = tmp_path / "run.json"
    assert main([*FAST, "--save", str(saved), "--markdown"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("| suite | op | dtype |")
    data = json.loads(saved.read_text())
    ops = {(r["suite"], r["op"], r["dtype"]) for r in data["results"]}
    assert ("elementwise", "add", "bfloat16") in ops
    assert ("reduction", "softmax rows", "float32") in ops
    assert all(r["check"] == "ok" and r["pygpukit_us"] > 0 for r in data["results"])


def test_compare_finds_regressions(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    saved = tmp_path / "base.json"
    assert main([*FAST, "--save", str(saved)]) == 0
    data = json.loads(saved.read_text())
    for r in data["results"]:
        r["pygpukit_us"] /= 1000.0  # pretend the baseline was 1000x faster
    saved.write_text(json.dumps(data))
    assert main([*FAST, "--compare", str(saved), "--threshold", "0.05"]) == 0  # reported, not fatal
    assert "REGRESSION elementwise/add/float32/1024" in capsys.readouterr().err
    assert main([*FAST, "--compare", str(saved), "--fail-on-regression"]) == 1


def test_bad_options_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--iterations", "0"]) == 2
    assert main(["--gemm", "--dtypes", "int4", "--no-progress"]) == 2
    assert main(["--elementwise", "--sizes", "lots", "--no-progress"]) == 2
    capsys.readouterr()
