"""The short fuzzing run of CI (issue 21, item 4): every target in fuzz/ for a few seconds, coverage-guided
where atheris is installed. Any input that a parser neither parses nor refuses with its typed error fails
the test, with the input saved under the reported folder; `nox -s fuzz -- --long` is the long run. The inputs
that found bugs are kept in fuzz/regressions/<target>/ and replayed on every run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TARGETS = sorted(p.stem.removeprefix("fuzz_") for p in (ROOT / "fuzz").glob("fuzz_*.py"))
SECONDS = 6  # per target: 8 targets, about a minute with start-up (keeps CI under its time budget)
SKIPPED = 5  # fuzz/_harness.py: a target that cannot run here (an optional package it needs is missing)


def test_every_parser_has_a_target() -> None:
    assert {"kernel_cache", "safetensors", "gguf", "tokenizer", "model_config", "audio", "ct2", "onnx"} <= set(TARGETS)


@pytest.mark.parametrize("target", sorted(p.name for p in (ROOT / "fuzz" / "regressions").iterdir()))
def test_inputs_that_found_bugs_stay_fixed(target: str, tmp_path: Path) -> None:
    """The inputs fuzzing found bugs with (and crafted neighbours of them), replayed through their target."""
    inputs = sorted(str(p) for p in (ROOT / "fuzz" / "regressions" / target).iterdir())
    command = [sys.executable, str(ROOT / "fuzz" / f"fuzz_{target}.py"), "--reproduce", *inputs]
    environment = {**os.environ, "FUZZ_SCRATCH_DIR": str(tmp_path)}
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=environment, timeout=300, check=False)
    if done.returncode == SKIPPED:
        pytest.skip(done.stdout.strip())  # the target needs an optional package that is not installed
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert done.stdout.count("parsed or raised a typed error") == len(inputs)


@pytest.mark.slow
def test_short_fuzzing_run_finds_nothing(tmp_path: Path) -> None:
    command = [sys.executable, str(ROOT / "fuzz" / "run_all.py"), "--seconds", str(SECONDS),
               "--artifacts", str(tmp_path)]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=60 * len(TARGETS), check=False)
    report = json.loads((tmp_path / "report.json").read_text())
    findings = [r for r in report["results"] if r["status"] not in ("ok", "skipped")]
    assert not findings, (done.stdout, [r.get("output_tail") for r in findings], tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    for result in report["results"]:
        assert result["executions"] > 100 or result["status"] == "skipped", result
