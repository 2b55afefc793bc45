"""Experiment for issue 14's two device-side gaps, run on the GPU machine next to torch in one process:

- float32 ``sum`` of 2**28 elements (measured at 0.80-0.88x torch): the split row reduction gives each
  block one contiguous chunk of 1 MiB; the variant "sweep" lets the blocks sweep the row together, pack
  by pack (block b, lane l read packs (k * blocks + b) * lanes + l), as a grid-stride loop does;
- bfloat16 ``softmax`` over rows of 32768 (measured at 0.83x): rows too long for the register-held kernel
  are read twice (``softmax_rows``); reported as is, for the next change.

Each variant patches reduction/reduce.cu in memory (nothing on disk changes), checks that the result is
deterministic over runs and close to the float64 reference, and prints the median time over repetitions
(device events) and the ratio to torch. ``--json PATH`` writes the rows.

    python benchmarks/tools/reduce_gaps.py [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

import pygpukit as gp
from pygpukit.core.plans import clear_plan_caches
from pygpukit.ops import _kernels

REDUCE = "reduction/reduce.cu"
SOURCES = _kernels.SOURCES
ORIGINAL = SOURCES.source


class _Patched:
    """_kernels.SOURCES with reduce.cu replaced by a text in memory."""

    def __init__(self, text: str) -> None:
        self.text = text

    def source(self, relative_path: str) -> str:
        return self.text if relative_path == REDUCE else ORIGINAL(relative_path)

    def __getattr__(self, name: str) -> Any:
        return getattr(SOURCES, name)


# reduce_rows only (the first occurrence of each line is in reduce_rows).
SWEEP = (
    (
        "  const index_t begin = static_cast<index_t>(blockIdx.y) * chunk;\n"
        "  const index_t end = begin + chunk < count ? begin + chunk : count;\n",
        "  const bool sweep = gridDim.y > 1;  // split row: the blocks sweep it together\n"
        "  const index_t blocks = sweep ? gridDim.y : 1;\n"
        "  const index_t first = sweep ? static_cast<index_t>(blockIdx.y) * lanes : 0;\n"
        "  const index_t begin = sweep ? 0 : static_cast<index_t>(blockIdx.y) * chunk;\n"
        "  const index_t end = sweep ? count : (begin + chunk < count ? begin + chunk : count);\n",
    ),
    (
        "        const index_t step = static_cast<index_t>(lanes) * V;\n"
        "        index_t start = begin + static_cast<index_t>(lane) * V;\n",
        "        const index_t step = static_cast<index_t>(lanes) * V * blocks;\n"
        "        index_t start = begin + (first + static_cast<index_t>(lane)) * V;\n",
    ),
    (
        "      for (index_t k = begin + lane; k < end; k += lanes) {\n",
        "      for (index_t k = begin + first + lane; k < end; k += static_cast<index_t>(lanes) * blocks) {\n",
    ),
)


def patched(text: str, edits: tuple[tuple[str, str], ...]) -> str:
    for old, new in edits:
        if old not in text:
            raise SystemExit(f"reduce.cu changed: {old.strip()!r} not found; update this experiment")
        text = text.replace(old, new, 1)
    return text


def use(text: str | None) -> None:
    """Make the kernels compile from ``text`` for reduce.cu (None: the file on disk)."""
    _kernels.SOURCES = SOURCES if text is None else _Patched(text)  # type: ignore[assignment]
    _kernels._groups.clear()
    clear_plan_caches()


def timed(fn: Callable[[], Any], reps: int = 15, calls: int = 10) -> float:
    for _ in range(3):
        fn()
    gp.synchronize()
    times = []
    for _ in range(reps):
        start, end = gp.Event(), gp.Event()
        start.record(gp.Stream.null())
        for _ in range(calls):
            fn()
        end.record(gp.Stream.null())
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000 / calls)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", help="write the rows to this file")
    args = parser.parse_args()
    import torch

    rows: list[dict[str, Any]] = []
    rng = np.random.default_rng(0)
    host = rng.uniform(-1, 1, 2**28).astype(np.float32)
    exact = float(host.astype(np.float64).sum())
    x = gp.from_numpy(host)
    t = torch.from_numpy(host).cuda()
    nbytes = x.nbytes
    base = ORIGINAL(REDUCE)
    for name, text in (("current", None), ("sweep", patched(base, SWEEP)), ("current again", None)):
        use(text)
        first = gp.sum(x).to_numpy()
        again = gp.sum(x).to_numpy()
        torch_us = timed(lambda: torch.sum(t))
        ours = timed(lambda: gp.sum(x))
        row = {"case": "sum float32 2**28", "variant": name, "us": ours, "torch_us": torch_us,
               "ratio_torch_over_ours": torch_us / ours, "GB/s": nbytes / ours / 1e3,
               "deterministic": bool(np.array_equal(first, again)),
               "rel_error": abs(float(first) - exact) / abs(exact)}  # fmt: skip
        rows.append(row)
        print(f"sum f32 2^28 {name:<14} {ours:8.1f} us {row['GB/s']:6.0f} GB/s  torch {torch_us:8.1f} us"
              f"  {row['ratio_torch_over_ours']:.3f}x  det={row['deterministic']} err={row['rel_error']:.1e}",
              flush=True)  # fmt: skip
    use(None)
    hs = rng.standard_normal((2048, 32768)).astype(np.float32)
    xs = gp.from_numpy(hs).astype(gp.bfloat16)
    ts = torch.from_numpy(hs).cuda().to(torch.bfloat16)
    torch_us = timed(lambda: torch.softmax(ts, dim=-1))
    ours = timed(lambda: gp.softmax(xs, axis=-1))
    row = {"case": "softmax bf16 2048 x 32768", "variant": "current", "us": ours, "torch_us": torch_us,
           "ratio_torch_over_ours": torch_us / ours, "GB/s": 2 * xs.nbytes / ours / 1e3}  # fmt: skip
    rows.append(row)
    print(f"softmax bf16 2048x32768 current {ours:8.1f} us {row['GB/s']:6.0f} GB/s  torch {torch_us:8.1f} us"
          f"  {row['ratio_torch_over_ours']:.3f}x", flush=True)  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": gp.get_device_info(0).name, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
