"""resample_tile against resample_poly (issue 16): the same call with the tile kernel and with it switched off,
on ``--batch`` x ``--seconds`` s at several rate pairs, with the largest difference between the two results.

    python benchmarks/tools/resample_tile_bench.py [--batch 64] [--seconds 30] [--repeat 7] [--calls 5]

Needs the CUDA backend; prints one line per rate pair and dtype (device ms of each kernel, the speed-up).
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from typing import Any

import numpy as np

RATES = [(44100, 16000), (48000, 16000), (16000, 24000), (22050, 16000), (16000, 44100), (8000, 11025)]


def _device_ms(fn: Callable[[], Any], repeat: int, calls: int) -> float:
    """Median device milliseconds per call over ``repeat`` samples of ``calls`` back-to-back calls."""
    from pygpukit.core.stream import Event, synchronize

    fn()
    synchronize()
    samples = []
    for _ in range(repeat):
        start, end = Event(), Event()
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        synchronize()
        samples.append(start.elapsed_time(end) / calls)
    return float(statistics.median(samples))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--calls", type=int, default=5)
    args = parser.parse_args(argv)
    import pygpukit.audio as audio
    from pygpukit.audio import resampling as rs
    from pygpukit.core.array import from_numpy

    geometry = rs.tile_geometry
    rng = np.random.default_rng(0)
    for dtype in (np.float32, np.float64):
        for orig, target in RATES:
            y = from_numpy(rng.standard_normal((args.batch, int(args.seconds * orig))).astype(dtype))

            def call(y: Any = y, orig: int = orig, target: int = target) -> Any:
                return audio.resample(y, orig_sr=orig, target_sr=target)

            tile = _device_ms(call, args.repeat, args.calls)
            fast = call().to_numpy()
            rs.tile_geometry = lambda *_: None
            try:
                poly = _device_ms(call, args.repeat, args.calls)
                slow = call().to_numpy()
            finally:
                rs.tile_geometry = geometry
            diff = float(np.abs(fast.astype(np.float64) - slow).max() / max(np.abs(slow).max(), 1e-300))
            print(f"{np.dtype(dtype).name:8s} {orig:6d} -> {target:6d}  tile {tile:9.3f} ms  "
                  f"poly {poly:9.3f} ms  x{poly / tile:6.2f}  "
                  f"max rel diff {diff:.2e}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
