"""Test configuration of pygpukit-ops: makes the shared helpers (ops_testing.py) importable."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
