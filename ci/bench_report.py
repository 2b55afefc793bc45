"""Turn a pytest-benchmark JSON (from ci/gpu.sh) into Markdown tables: each group's pygpukit result next
to its peers, with the peer/pygpukit time ratio (> 1 means pygpukit is faster) and, for copies, GB/s.

    python ci/bench_report.py build/gpu/bench.json
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any


def library(name: str) -> str:
    for lib in ("pygpukit", "cupy", "torch"):
        if lib in name:
            return lib
    return "pygpukit"


def main() -> int:
    data = json.loads(Path(sys.argv[1]).read_text())
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for bench in data["benchmarks"]:
        groups[bench.get("group") or bench["name"]].append(bench)
    print(f"machine: {data['machine_info'].get('node')} | date: {data['datetime']}\n")
    print("| group | library | median | min | GB/s or TFLOP/s (median) | ratio peer/pygpukit |")
    print("| --- | --- | --- | --- | --- | --- |")
    for group, benches in groups.items():
        ours = next((b for b in benches if library(b["name"]) == "pygpukit"), None)
        for b in sorted(benches, key=lambda b: library(b["name"]) != "pygpukit"):
            median, low = b["stats"]["median"], b["stats"]["min"]
            extra = b.get("extra_info", {})
            size, flops = extra.get("bytes"), extra.get("flops")
            gbps = (
                f"{size / median / 1e9:.1f} GB/s" if size else f"{flops / median / 1e12:.1f} TFLOP/s" if flops else ""
            )
            ratio = "" if ours is None or b is ours else f"{median / ours['stats']['median']:.2f}"
            unit, scale = ("ms", 1e3) if median >= 1e-3 else ("us", 1e6)
            print(f"| {group} | {library(b['name'])} | {median * scale:.2f} {unit} | {low * scale:.2f} {unit} | "
                  f"{gbps} | {ratio} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
