"""The scripts in examples/ run (on whatever backend this machine has) and say what they promise."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_scheduler_two_models_example() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "scheduler_two_models.py")],
        capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONWARNINGS": "ignore"}, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "tts refused as expected: context 'tts'" in result.stdout
    assert "guaranteed reservations 32.00 MiB" in result.stdout
