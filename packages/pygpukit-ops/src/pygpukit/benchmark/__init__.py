"""``python -m pygpukit.benchmark``: op benchmarks timed with device events, each result checked
against a NumPy reference, with torch and CuPy measured on the same inputs in the same run when they
are importable, and ratios printed (peer time / pygpukit time: above 1 pygpukit is faster).

    python -m pygpukit.benchmark --quick
    python -m pygpukit.benchmark --gemm --dtypes bfloat16,float16 --sizes 4096,8192 --markdown
    python -m pygpukit.benchmark --all --save run.json
    python -m pygpukit.benchmark --all --compare run.json --threshold 0.05 --fail-on-regression

On the CPU simulation backend it still runs (to check the tool itself); its times are then host
times of the simulation and peers are not measured.
"""

from __future__ import annotations

from ._runner import Case, Result, compare, main, run_cases, select_cases

__all__ = ["Case", "Result", "compare", "main", "run_cases", "select_cases"]
