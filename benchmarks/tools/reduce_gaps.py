"""Issue 14's two device-side gaps, measured next to torch in one process on the GPU machine:

- float32 ``sum`` of 2**28 elements (0.80-1.01x torch over several lendings). The split row reduction
  now lets a row's blocks sweep it together, pack by pack (block b, lane l folds packs
  (k * blocks + b) * lanes + l, as a grid-stride loop; reduce.cu, chunk 0). Variants: "sweep" (the
  code on disk), "chunks" (the code before: each block folds one contiguous 1 MiB chunk; reduce.cu
  patched in memory), "sweep, 640 blocks" (one wave of resident blocks at the 48 registers NVRTC 13.5
  gives reduce_rows for sm_90: 5 blocks of 256 an SM, 660 on an H100; reduction._SPLIT_BLOCKS).
- softmax over wide rows (bf16 over 32768: 0.86x, read twice by softmax_rows). Rows of up to 128 KiB
  are now kept in shared memory by softmax_rows_shared and read once. Variants: "shared" (on disk) and
  "two-pass" (reduction._SHARED_ROW_BYTES = 0: the code before), for bf16 2048 x 32768, float32
  2048 x 32768 (128 KiB rows: one block an SM), bf16 1024 x 65536 and bf16 2048 x 32000 (rows not a
  power of two).

Each variant checks that two calls give the same bits and reports the error against a float64
reference (relative for the sum, the largest absolute error over 8 rows for softmax), then the median
time over repetitions (device events, torch measured right before) and the ratio to torch.
Nothing on disk changes. ``--json PATH`` writes the rows.

    python benchmarks/tools/reduce_gaps.py [--json out.json] [--only sum|softmax]
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
from pygpukit.ops import _kernels, reduction

REDUCE = "reduction/reduce.cu"
SOURCES = _kernels.SOURCES
ORIGINAL = SOURCES.source
SPLIT_BLOCKS = reduction._SPLIT_BLOCKS
SHARED_ROW_BYTES = reduction._SHARED_ROW_BYTES


class _Patched:
    """_kernels.SOURCES with reduce.cu replaced by a text in memory."""

    def __init__(self, text: str) -> None:
        self.text = text

    def source(self, relative_path: str) -> str:
        return self.text if relative_path == REDUCE else ORIGINAL(relative_path)

    def __getattr__(self, name: str) -> Any:
        return getattr(SOURCES, name)


# The code before the sweep: the host passes chunk 0 for split rows, so the kernel rebuilds the chunk
# the host used to pass (ceil(count / blocks) rounded up to whole steps; 262144 for 2**28 / 1024).
CHUNKS = (
    (
        "  const bool sweep = chunk == 0 && gridDim.y > 1;\n",
        "  const bool sweep = false;\n"
        "  const index_t whole = static_cast<index_t>(lanes) * 16;\n"
        "  if (chunk == 0) chunk = ((count + gridDim.y - 1) / gridDim.y + whole - 1) / whole * whole;\n",
    ),
)


def patched(text: str, edits: tuple[tuple[str, str], ...]) -> str:
    for old, new in edits:
        if old not in text:
            raise SystemExit(f"reduce.cu changed: {old.strip()!r} not found; update this experiment")
        text = text.replace(old, new, 1)
    return text


def use(text: str | None = None, split_blocks: int = SPLIT_BLOCKS, shared_row_bytes: int = SHARED_ROW_BYTES) -> None:
    """Make the kernels compile from ``text`` for reduce.cu (None: the file on disk), with these plan
    settings, and drop every plan made before."""
    _kernels.SOURCES = SOURCES if text is None else _Patched(text)  # type: ignore[assignment]
    _kernels._groups.clear()
    reduction._SPLIT_BLOCKS = split_blocks
    reduction._SHARED_ROW_BYTES = shared_row_bytes
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


def sum_rows(torch: Any, rng: np.random.Generator) -> list[dict[str, Any]]:
    rows = []
    host = rng.uniform(-1, 1, 2**28).astype(np.float32)
    exact = float(host.astype(np.float64).sum())
    scale = float(np.abs(host.astype(np.float64)).sum())
    x = gp.from_numpy(host)
    t = torch.from_numpy(host).cuda()
    base = ORIGINAL(REDUCE)
    variants: list[tuple[str, dict[str, Any]]] = [
        ("sweep", {}),
        ("chunks", {"text": patched(base, CHUNKS)}),
        ("sweep, 640 blocks", {"split_blocks": 640}),
        ("sweep, again", {}),
    ]
    for name, settings in variants:
        use(**settings)
        first = gp.sum(x).to_numpy()
        again = gp.sum(x).to_numpy()
        torch_us = timed(lambda: torch.sum(t))
        ours = timed(lambda: gp.sum(x))
        row = {"case": "sum float32 2**28", "variant": name, "us": ours, "torch_us": torch_us,
               "ratio_torch_over_ours": torch_us / ours, "GB/s": x.nbytes / ours / 1e3,
               "deterministic": bool(np.array_equal(first, again)),
               "error_over_sum_abs": abs(float(first) - exact) / scale}  # fmt: skip
        rows.append(row)
        print(f"sum f32 2^28      {name:<18} {ours:8.1f} us {row['GB/s']:6.0f} GB/s  torch {torch_us:8.1f} us"
              f"  {row['ratio_torch_over_ours']:.3f}x  det={row['deterministic']} "
              f"err={row['error_over_sum_abs']:.1e}", flush=True)  # fmt: skip
    use()
    return rows


def softmax_rows(torch: Any, rng: np.random.Generator) -> list[dict[str, Any]]:
    rows = []
    for dtype, shape in (("bfloat16", (2048, 32768)), ("float32", (2048, 32768)), ("bfloat16", (1024, 65536)),
                         ("bfloat16", (2048, 32000))):  # fmt: skip
        host = rng.standard_normal(shape, dtype=np.float32)
        x = gp.from_numpy(host).astype(getattr(gp, dtype))
        t = torch.from_numpy(host).cuda().to(getattr(torch, dtype))
        head = x[:8].astype(gp.float32).to_numpy().astype(np.float64)  # the rounded inputs
        shifted = head - head.max(axis=-1, keepdims=True)
        reference = np.exp(shifted) / np.exp(shifted).sum(axis=-1, keepdims=True)
        label = f"softmax {dtype} {shape[0]}x{shape[1]}"
        for name, limit in (("shared", SHARED_ROW_BYTES), ("two-pass", 0)):
            use(shared_row_bytes=limit)
            first = gp.softmax(x, axis=-1)
            again = gp.softmax(x, axis=-1)
            deterministic = bool(np.array_equal(first.to_numpy(), again.to_numpy()))
            error = float(np.abs(first[:8].astype(gp.float32).to_numpy() - reference).max())
            del first, again
            torch_us = timed(lambda t=t: torch.softmax(t, dim=-1))
            ours = timed(lambda x=x: gp.softmax(x, axis=-1))
            row = {"case": label, "variant": name, "us": ours, "torch_us": torch_us,
                   "ratio_torch_over_ours": torch_us / ours, "GB/s": 2 * x.nbytes / ours / 1e3,
                   "deterministic": deterministic, "max_abs_error": error}  # fmt: skip
            rows.append(row)
            print(f"{label:<32} {name:<9} {ours:8.1f} us {row['GB/s']:6.0f} GB/s  torch {torch_us:8.1f} us"
                  f"  {row['ratio_torch_over_ours']:.3f}x  det={deterministic} err={error:.1e}",
                  flush=True)  # fmt: skip
    use()
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", help="write the rows to this file")
    parser.add_argument("--only", choices=("sum", "softmax"), help="run one of the two cases")
    args = parser.parse_args()
    import torch

    rng = np.random.default_rng(0)
    rows: list[dict[str, Any]] = []
    if args.only != "softmax":
        rows += sum_rows(torch, rng)
    if args.only != "sum":
        rows += softmax_rows(torch, rng)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": gp.get_device_info(0).name, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
