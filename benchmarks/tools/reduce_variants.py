"""Experiment: variants of the split row reduction (reduction/reduce.cu) on a 2**26-element bf16 and float32
sum, timed with device events next to torch in one process. Run on the GPU machine."""

from __future__ import annotations

import statistics
import sys

import numpy as np

import pygpukit as gp
from pygpukit.ops import _kernels, reduction

BASE = (_kernels.kernel_root() / "reduction" / "reduce.cu").read_text()
ORIGINAL = _kernels._source
FINISH_OLD = "  for (unsigned k = threadIdx.x; k < gridDim.y; k += kFinishLanes) acc = r.combine(acc, parts[k]);"
FINISH_NEW = """  for (unsigned k = threadIdx.x; k < gridDim.y; k += 4 * kFinishLanes) {
    Acc v[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      if (k + u * kFinishLanes < gridDim.y) v[u] = parts[k + u * kFinishLanes];
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      if (k + u * kFinishLanes < gridDim.y) acc = r.combine(acc, v[u]);
    }
  }"""
BATCH_OLD = "constexpr int kBatch = R::kBatch;"


def use(text: str) -> None:
    _kernels._source = lambda rel: text if rel == "reduction/reduce.cu" else ORIGINAL(rel)  # type: ignore[assignment]
    _kernels._groups.clear()


def timed(fn, reps: int = 15, calls: int = 20) -> float:
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


def main() -> None:
    import torch

    assert FINISH_OLD in BASE
    assert BATCH_OLD in BASE
    rng = np.random.default_rng(0)
    host = rng.uniform(-1, 1, 2**26).astype(np.float32)
    results = {}
    for dtype, tdtype in ((gp.bfloat16, torch.bfloat16), (gp.float32, torch.float32)):
        x = gp.from_numpy(host).astype(dtype)
        t = torch.from_numpy(host).cuda().to(tdtype)
        nbytes = x.nbytes
        ref = gp.sum(x).to_numpy()
        variants = {
            "current": (BASE, 1024, True),
            "two-pass": (BASE, 1024, False),
            "finish batched": (BASE.replace(FINISH_OLD, FINISH_NEW), 1024, True),
            "kBatch 8": (BASE.replace(BATCH_OLD, "constexpr int kBatch = 8;"), 1024, True),
            "both": (BASE.replace(FINISH_OLD, FINISH_NEW).replace(BATCH_OLD, "constexpr int kBatch = 8;"), 1024, True),
            "both, 2048": (
                BASE.replace(FINISH_OLD, FINISH_NEW).replace(BATCH_OLD, "constexpr int kBatch = 8;"),
                2048,
                True,
            ),
            "both, 512": (
                BASE.replace(FINISH_OLD, FINISH_NEW).replace(BATCH_OLD, "constexpr int kBatch = 8;"),
                512,
                True,
            ),
            "finish batched, 2048": (BASE.replace(FINISH_OLD, FINISH_NEW), 2048, True),
        }
        torch_us = timed(lambda t=t: torch.sum(t))
        print(f"{dtype}: torch {torch_us:.2f} us ({nbytes / torch_us / 1e3:.0f} GB/s)", flush=True)
        for name, (text, blocks, counters) in variants.items():
            use(text)
            reduction._SPLIT_BLOCKS = blocks
            if not counters:
                reduction.completion_counters = lambda *a, **k: None  # type: ignore[assignment]
            us = timed(lambda x=x: gp.sum(x))
            reduction.completion_counters = _kernels.completion_counters
            ratio = torch_us / us
            same = "same bits" if blocks == 1024 and np.array_equal(gp.sum(x).to_numpy(), ref) else ""
            results[(str(dtype), name)] = us
            print(f"  {name:<22} {us:7.2f} us {nbytes / us / 1e3:6.0f} GB/s  {ratio:.3f}x torch  {same}", flush=True)
        torch_us2 = timed(lambda t=t: torch.sum(t))
        print(f"  torch again {torch_us2:.2f} us", flush=True)
    use(BASE)
    reduction._SPLIT_BLOCKS = 1024


if __name__ == "__main__":
    sys.exit(main())
