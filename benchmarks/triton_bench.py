"""Built-in ops against their Triton versions (pygpukit.triton.kernels), per op, dtype and shape.

    python benchmarks/triton_bench.py [--ops rmsnorm,matmul] [--json out.json]

Both sides run on the same pygpukit stream with the same arrays; each time is the median of 7 rounds
of ``--reps`` back-to-back calls measured with CUDA events (microseconds per call), after a warm-up
that compiles the kernels. Prints a Markdown table (the one docs/triton.md describes). Needs a GPU
and Triton; torch is not used.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

import pygpukit as gk
from pygpukit import ops
from pygpukit.core.stream import Event, current_stream

rng = np.random.default_rng(0)


def _rand(shape: tuple[int, ...], dtype: Any) -> Any:
    return gk.from_numpy(rng.standard_normal(shape).astype(dtype.numpy))


def _time_us(fn: Callable[[], Any], reps: int) -> float:
    stream = current_stream()
    for _ in range(3):
        fn()
    stream.synchronize()
    rounds = []
    for _ in range(7):
        start, end = Event(), Event()
        start.record(stream)
        for _ in range(reps):
            fn()
        end.record(stream)
        end.synchronize()
        rounds.append(start.elapsed_time(end) * 1000.0 / reps)
    return statistics.median(rounds)


def _cases() -> dict[str, list[tuple[str, Callable[[], Any], Callable[[], Any]]]]:
    from pygpukit.triton import kernels as tk

    cases: dict[str, list[tuple[str, Callable[[], Any], Callable[[], Any]]]] = {}
    for dtype in (gk.bfloat16, gk.float32):
        for rows, n in ((1, 4096), (128, 4096), (4096, 4096), (512, 11008)):
            x, w, b = _rand((rows, n), dtype), _rand((n,), dtype), _rand((n,), dtype)
            label = f"{dtype.name} ({rows}, {n})"
            cases.setdefault("rmsnorm", []).append((label, partial(ops.rmsnorm, x, w), partial(tk.rmsnorm, x, w)))
            cases.setdefault("layernorm", []).append(
                (label, partial(ops.layernorm, x, w, b), partial(tk.layernorm, x, w, b))
            )
            cases.setdefault("softmax", []).append((label, partial(ops.softmax, x), partial(tk.softmax, x)))
            cases.setdefault("swiglu", []).append(
                (label, partial(ops.swiglu, x), partial(tk.swiglu, x))  # fused [gate | up] input
            )
    for dtype in (gk.bfloat16, gk.float16):
        for batch, seq, heads, kv, dim in ((1, 1, 32, 8, 128), (1, 2048, 32, 8, 128), (8, 512, 16, 16, 64)):
            cos, sin = ops.rope_cos_sin(dim, 4096, dtype=dtype)
            q, k = _rand((batch, seq, heads, dim), dtype), _rand((batch, seq, kv, dim), dtype)
            pos = gk.from_numpy(np.arange(seq, dtype=np.int32))
            label = f"{dtype.name} q ({batch}, {seq}, {heads}, {dim}) k {kv} heads"
            cases.setdefault("rotary", []).append(
                (label, partial(ops.apply_rope, q, k, cos, sin, pos), partial(tk.rotary, q, k, cos, sin, pos))
            )
    for dtype in (gk.bfloat16, gk.float16, gk.float32):
        for m, n, k in ((1, 4096, 4096), (16, 4096, 4096), (512, 4096, 4096), (4096, 4096, 4096), (333, 1000, 777)):
            a, b = _rand((m, k), dtype), _rand((k, n), dtype)
            cases.setdefault("matmul", []).append(
                (f"{dtype.name} {m}x{n}x{k}", partial(ops.matmul, a, b), partial(tk.matmul, a, b))
            )
    return cases


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", default="", help="comma-separated subset of the ops")
    parser.add_argument("--reps", type=int, default=50)
    parser.add_argument("--json", default="", help="also write the rows to this JSON file")
    args = parser.parse_args(argv)
    from pygpukit.core.device import get_device_info
    from pygpukit.triton import triton_available, triton_version

    if not triton_available():
        print("needs the CUDA backend and Triton", file=sys.stderr)
        return 2
    info = get_device_info(0)
    wanted = [o for o in args.ops.split(",") if o]
    print(f"# {info.name}, Triton {triton_version()}, microseconds per call (median of 7 x {args.reps})\n")
    print("| op | case | built-in (us) | Triton (us) | Triton / built-in |")
    print("|---|---|---:|---:|---:|")
    rows = []
    for op, items in _cases().items():
        if wanted and op not in wanted:
            continue
        for label, builtin, triton_fn in items:
            b = _time_us(builtin, args.reps)
            t = _time_us(triton_fn, args.reps)
            rows.append({"op": op, "case": label, "builtin_us": b, "triton_us": t})
            print(f"| {op} | {label} | {b:.1f} | {t:.1f} | {t / b:.2f} |", flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"device": info.name, "triton": triton_version(), "rows": rows}, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
