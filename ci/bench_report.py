"""Turn pytest-benchmark JSON files (from ci/gpu.sh) into one Markdown table: each group's pygpukit result
next to its peers, the peer/pygpukit time ratio (> 1 means pygpukit is faster) and, where the benchmark
records them, GB/s or TFLOP/s.

Each file is one run. Within a run a time is pytest-benchmark's median over its rounds. Figures vary
between lendings of the GPU machine, so with several files every figure is the median over the runs
that hold that group, the table gives the number of runs and the range of the ratio, and no column is
a best-of (no minimum is reported):

    python ci/bench_report.py build/gpu/bench.json
    python ci/bench_report.py benchmarks/results/2026-11-2?-h100-*.json --group gemm

A JSON file that holds no pytest-benchmark results (a test-run summary) is skipped with a note.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

LIBRARIES = ("pygpukit", "cupy", "torch")


def library(name: str) -> str:
    for lib in LIBRARIES:
        if lib in name:
            return lib
    return "pygpukit"


@dataclass
class Row:
    """One library in one group, over the runs that hold it."""

    times: list[float] = field(default_factory=list)  # per run: the median over that run's rounds
    ratios: list[float] = field(default_factory=list)  # per run holding pygpukit too: peer / pygpukit
    size: float | None = None  # bytes per round (extra_info "bytes")
    flops: float | None = None  # floating-point operations per round (extra_info "flops")


def load_runs(paths: list[Path]) -> list[tuple[Path, dict[str, Any]]]:
    runs = []
    for path in paths:
        data = json.loads(path.read_text())
        if not isinstance(data, dict) or "benchmarks" not in data:
            print(f"skipped {path}: no pytest-benchmark results in it", file=sys.stderr)
            continue
        runs.append((path, data))
    return runs


def collect(
    runs: list[tuple[Path, dict[str, Any]]], wanted: list[str]
) -> tuple[dict[str, dict[str, Row]], list[tuple[Path, dict[str, Any]]]]:
    """group -> library -> Row (groups in order of first appearance, pygpukit first within a group), and
    the runs that hold at least one of those groups."""
    table: dict[str, dict[str, Row]] = {}
    used = []
    for path, data in runs:
        groups: dict[str, dict[str, dict[str, Any]]] = defaultdict(dict)
        for bench in data["benchmarks"]:
            group = bench.get("group") or bench["name"]
            if wanted and not any(w in group for w in wanted):
                continue
            groups[group].setdefault(library(bench["name"]), bench)  # the first result of a library counts
        if groups:
            used.append((path, data))
        for group, benches in groups.items():
            rows = table.setdefault(group, {})
            ours = benches.get("pygpukit")
            for lib in sorted(benches, key=lambda name: (name != "pygpukit", name)):
                bench = benches[lib]
                row = rows.setdefault(lib, Row())
                median = float(bench["stats"]["median"])
                row.times.append(median)
                extra = bench.get("extra_info") or {}
                row.size = extra.get("bytes", row.size)
                row.flops = extra.get("flops", row.flops)
                if ours is not None and lib != "pygpukit":
                    row.ratios.append(median / float(ours["stats"]["median"]))
    return table, used


def _time(seconds: float) -> str:
    unit, scale = ("ms", 1e3) if seconds >= 1e-3 else ("us", 1e6)
    return f"{seconds * scale:.2f} {unit}"


def _rate(row: Row, seconds: float) -> str:
    if row.size:
        return f"{row.size / seconds / 1e9:.1f} GB/s"
    if row.flops:
        return f"{row.flops / seconds / 1e12:.1f} TFLOP/s"
    return ""


def _ratio(ratios: list[float]) -> str:
    if not ratios:
        return ""
    text = f"{statistics.median(ratios):.2f}"
    if len(ratios) > 1:
        text += f" ({min(ratios):.2f}-{max(ratios):.2f})"
    return text


def render(runs: list[tuple[Path, dict[str, Any]]], table: dict[str, dict[str, Row]]) -> str:
    lines = []
    for path, data in runs:
        commit = (data.get("commit_info") or {}).get("id") or "-"
        lines.append(f"- run: {path.name} | machine: {data['machine_info'].get('node')} | date: {data['datetime']}"
                     f" | commit: {commit[:10]}")  # fmt: skip
    lines += [
        "",
        "Time: median over each run's rounds, then the median over the runs. Ratio: peer / pygpukit time per",
        "run, median over the runs (range over the runs in brackets).",
        "",
        "| group | library | runs | time (median) | GB/s or TFLOP/s (at the median) | ratio peer/pygpukit |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for group, rows in table.items():
        for lib, row in rows.items():
            median = statistics.median(row.times)
            lines.append(f"| {group} | {lib} | {len(row.times)} | {_time(median)} | {_rate(row, median)} | "
                         f"{_ratio(row.ratios)} |")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path, help="pytest-benchmark JSON files, one per run")
    parser.add_argument("--group", action="append", default=[], help="only groups whose name holds this text")
    args = parser.parse_args(argv)
    runs = load_runs(args.runs)
    if not runs:
        print("no pytest-benchmark results in the files given", file=sys.stderr)
        return 1
    table, used = collect(runs, args.group)
    if not table:
        print("no benchmark group matches", file=sys.stderr)
        return 1
    print(render(used, table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
