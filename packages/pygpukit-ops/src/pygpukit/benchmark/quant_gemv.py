"""GPU benchmark of the quantized GEMVs (pygpukit.ops.quant): how fast they read packed GGUF blocks and
FP8/INT8 (per-channel) and INT4 (AWQ / GPTQ packing, group size 128) weights, as a fraction of the
device's measured copy bandwidth (issue 18's target: >= 75% for Q4_K, Q8_0, FP8 and INT4 at 7B/8B shapes).

    python -m pygpukit.benchmark.quant_gemv [--formats Q4_K,Q8_0,fp8] [--rows 1,8] [--dtype bfloat16]
                                            [--iterations 200] [--json results.json] [--compare old.json]
                                            [--shapes 14336x4096,...] [--mma-warps 2|4|8] [--simt]

``--simt`` sends the GGUF, FP8 and INT8 GEMVs through their SIMT kernels (gguf_gemv.cu, wo_gemv.cu)
rather than the tensor-core ones (gguf_gemv_mma.cu, wo_gemv_mma.cu): run it with ``--json simt.json``,
then without it and ``--compare simt.json``.

Copy bandwidth: ``dst.copy_(src)`` of a 1 GiB buffer (bytes read + bytes written per second). GEMV
bandwidth: the weight's packed bytes (plus x and y) per second at each shape. Two timings, each with
events over ``--iterations`` calls after a warm-up: ``us``, the calls issued from Python one by one
(what an eager decode loop sees: below about 15 us a call is bound by its host-side launch cost, not
by the kernel), and ``device_us``, the same calls captured once in a CUDA graph and replayed (the
kernels back to back: what a graph-captured decode step sees, and what the bandwidth fraction is
computed from). Each (format, shape) is checked once against the weight dequantized on the device
(float32) and a float64 host product before it is timed.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

import pygpukit as gp
from pygpukit.ops.quant import QUANT_FORMATS, Int4Tensor, QuantizedTensor, quantize_per_channel, quantized_gemv

# Linear layers of Llama-2-7B (4096 / 11008) and Llama-3-8B (4096 / 14336, GQA kv 1024): (N, K).
SHAPES_7B = [(4096, 4096), (11008, 4096), (4096, 11008), (1024, 4096), (14336, 4096), (4096, 14336)]
_BLOCK = {"Q4_0": (32, 18), "Q4_1": (32, 20), "Q5_0": (32, 22), "Q5_1": (32, 24), "Q8_0": (32, 34), "Q2_K": (256, 84),
          "Q3_K": (256, 110), "Q4_K": (256, 144), "Q5_K": (256, 176), "Q6_K": (256, 210)}  # fmt: skip
_SCALES = {"Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,), "Q2_K": (80, 82),
           "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}  # fmt: skip


def _timed(fn: Callable[[], Any], warmup: int, iterations: int) -> float:
    """Microseconds per call of ``fn`` on a fresh stream (events around ``iterations`` calls)."""
    stream = gp.Stream()
    with stream:
        for _ in range(warmup):
            fn()
        start, end = gp.Event(), gp.Event()
        start.record(stream)
        for _ in range(iterations):
            fn()
        end.record(stream)
        end.synchronize()
    return float(start.elapsed_time(end)) * 1e3 / iterations


def _timed_graph(fn: Callable[[], Any], iterations: int, replays: int = 5) -> float | None:
    """Microseconds per call of ``fn`` with ``iterations`` calls captured in one CUDA graph: the median
    over ``replays`` timed replays of the graph (after one warm-up replay); None when the calls cannot
    be captured."""
    graph = gp.CudaGraph()
    keep: list[Any] = []  # results of the captured calls stay allocated while the graph replays
    try:
        with graph.capture() as stream:
            for _ in range(iterations):
                keep.append(fn())
    except gp.PyGPUkitError as error:
        print(f"  (no CUDA graph: {error})", file=sys.stderr)
        return None
    graph.replay(stream)
    times = []
    for _ in range(replays):
        start, end = gp.Event(), gp.Event()
        start.record(stream)
        graph.replay(stream)
        end.record(stream)
        end.synchronize()
        times.append(float(start.elapsed_time(end)) * 1e3 / iterations)
    del keep
    return float(np.median(times))


def copy_bandwidth(nbytes: int = 1 << 30, iterations: int = 20) -> float:
    """Device copy bandwidth in GB/s (read + write) of a ``nbytes`` buffer copy."""
    src = gp.zeros((nbytes,), gp.uint8)
    dst = gp.empty((nbytes,), gp.uint8)
    us = _timed(lambda: dst.copy_(src), 3, iterations)
    return 2.0 * nbytes / (us * 1e-6) / 1e9


def random_weight(rng: np.random.Generator, fmt: str, n: int, k: int) -> np.ndarray[Any, Any]:
    """Random quants with float16 scales of moderate size, the raw bytes of an (n, k) weight."""
    elems, nbytes = _BLOCK[fmt]
    blocks = n * k // elems
    data = rng.integers(0, 256, size=(blocks, nbytes), dtype=np.uint8)
    for offset in _SCALES[fmt]:
        values = (rng.standard_normal(blocks) * 1e-3).astype(np.float16)
        data[:, offset : offset + 2] = values.view(np.uint8).reshape(blocks, 2)
    return data.reshape(-1)


def _random_int4(rng: np.random.Generator, packing: str, n: int, k: int) -> Int4Tensor:
    words = (k, n // 8) if packing == "awq" else (k // 8, n)
    qweight = rng.integers(0, 1 << 32, size=words, dtype=np.uint32)
    qzeros = rng.integers(0, 1 << 32, size=(k // 128, n // 8), dtype=np.uint32)
    scales = (rng.standard_normal((k // 128, n)) * 1e-3).astype(np.float16)
    return Int4Tensor(qweight, qzeros, scales, packing, 128)


def _check(q: Any, x: gp.GPUArray, y: gp.GPUArray) -> float:
    w = q.dequantize(gp.float32).to_numpy().astype(np.float64)
    xs = x.to_numpy().astype(np.float64)
    ref = xs @ w.T
    scale = np.abs(xs) @ np.abs(w).T + 1e-30
    return float(np.max(np.abs(y.to_numpy().astype(np.float64) - ref) / scale))


def run(formats: list[str], rows: list[int], dtype: str, iterations: int,
        shapes: list[tuple[int, int]]) -> dict[str, Any]:  # fmt: skip
    rng = np.random.default_rng(0)
    copy = copy_bandwidth()
    results: dict[str, Any] = {"device": gp.get_device_info().name, "copy_gbps": copy, "cases": []}
    print(f"device copy bandwidth: {copy:.0f} GB/s ({results['device']})")
    print(f"{'format':6} {'M':>2} {'N x K':>13} {'us':>9} {'device us':>9} {'GB/s':>8} {'of copy':>8} {'rel err':>9}")
    for fmt in formats:
        for n, k in shapes:
            q: Any
            if fmt in ("FP8", "INT8"):
                q = quantize_per_channel(rng.standard_normal((n, k)).astype(np.float32), fmt)
                nbytes = n * k + 4 * n
            elif fmt in ("AWQ", "GPTQ"):  # INT4, group size 128, random packed words and scales
                q = _random_int4(rng, fmt.lower(), n, k)
                nbytes = q.nbytes
            else:
                q = QuantizedTensor.from_raw(random_weight(rng, fmt, n, k), fmt, (n, k))
                nbytes = q.nbytes
            for m in rows:
                x = gp.from_numpy(rng.standard_normal((m, k)).astype(np.float32)).astype(dtype)
                y = gp.empty((m, n), dtype)  # given to the call: nothing allocated (graph-capturable)
                call = functools.partial(gp.ops.linear, x, q, out=y)
                if isinstance(q, QuantizedTensor):
                    call = functools.partial(quantized_gemv, x, q, y)
                y = call()
                err = _check(q, x, y) if m == rows[0] else float("nan")
                us = _timed(call, 10, iterations)
                device_us = _timed_graph(call, iterations)
                moved = nbytes + (m * k + m * n) * y.itemsize
                gbps = moved / ((us if device_us is None else device_us) * 1e-6) / 1e9
                results["cases"].append({"format": fmt, "m": m, "n": n, "k": k, "us": us, "device_us": device_us,
                                         "gbps": gbps, "fraction_of_copy": gbps / copy,
                                         "max_rel_err": err})  # fmt: skip
                dev = "-" if device_us is None else f"{device_us:.2f}"
                print(f"{fmt:6} {m:>2} {f'{n}x{k}':>13} {us:9.2f} {dev:>9} {gbps:8.0f} {gbps / copy:8.1%} {err:9.2e}")
    return results


def compare(results: dict[str, Any], old: dict[str, Any]) -> list[str]:
    """Lines comparing ``results`` with an earlier run's JSON (the same cases by format, M, N, K): the
    eager times and, where both runs have them, the graph-replay times, as old / new (above 1: faster)."""
    before = {(c["format"], c["m"], c["n"], c["k"]): c for c in old.get("cases", [])}
    lines = [f"{'format':6} {'M':>2} {'N x K':>13} {'us old':>9} {'us new':>9} {'speedup':>8} {'dev old':>9} "
             f"{'dev new':>9} {'speedup':>8}"]  # fmt: skip
    for case in results["cases"]:
        prior = before.get((case["format"], case["m"], case["n"], case["k"]))
        if prior is None:
            continue
        dev_old, dev_new = prior.get("device_us"), case.get("device_us")
        new_dev = "-" if dev_new is None else f"{dev_new:.2f}"
        dev = (f"{dev_old:9.2f} {dev_new:9.2f} {dev_old / dev_new:8.2f}" if dev_old and dev_new
               else f"{'-':>9} {new_dev:>9} {'-':>8}")  # fmt: skip
        shape = f"{case['n']}x{case['k']}"
        lines.append(f"{case['format']:6} {case['m']:>2} {shape:>13} {prior['us']:9.2f} {case['us']:9.2f} "
                     f"{prior['us'] / case['us']:8.2f} {dev}")  # fmt: skip
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--formats", default="Q4_K,Q8_0,Q4_0,Q6_K,Q5_K,FP8,INT8,AWQ,GPTQ",
                        help="comma-separated GGUF formats, fp8, int8, awq, gptq (INT4, group 128)")  # fmt: skip
    parser.add_argument("--rows", default="1,8", help="rows of x (M <= 8), comma-separated")
    parser.add_argument("--dtype", default="bfloat16", choices=("float32", "float16", "bfloat16"))
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--compare", help="an earlier run's --json file: print old / new times per case")
    parser.add_argument("--shapes", help="N x K shapes instead of the 7B/8B ones, e.g. 14336x4096,4096x14336")
    parser.add_argument("--mma-warps", type=int, choices=(2, 4, 8),
                        help="warps per 16-row tile of the tensor-core GGUF kernels (default: per shape)")  # fmt: skip
    parser.add_argument(
        "--mma-all-rows",
        action="store_true",
        help="the tensor-core kernels from one row of x for every format (MMA_MIN_ROWS = 1)",
    )
    parser.add_argument(
        "--mma-grid",
        choices=("tiles", "resident"),
        help="the tensor-core GGUF kernels' grid: a block per 16-row tile, or at most the blocks "
        "resident at once, each walking several tiles (default: ops.quant.gemv.PERSISTENT_MMA)",
    )
    parser.add_argument(
        "--mma-stages",
        type=int,
        choices=(2, 3),
        help="blocks a warp of the tensor-core GGUF kernels stages at once (default: MMA_STAGES)",
    )
    parser.add_argument("--simt", action="store_true",
                        help="the GGUF, FP8 and INT8 GEMVs through their SIMT kernels instead of the tensor-core "
                             "ones, to compare the two with --json / --compare")  # fmt: skip
    args = parser.parse_args(argv)
    formats = [f.strip().upper() for f in args.formats.split(",") if f.strip()]
    unknown = [f for f in formats if f not in (*QUANT_FORMATS, "FP8", "INT8", "AWQ", "GPTQ")]
    if unknown:
        parser.error(f"unknown formats {unknown}; choose from {', '.join(QUANT_FORMATS)}, fp8, int8, awq, gptq")
    rows = [int(r) for r in args.rows.split(",")]
    if any(not 1 <= r <= 8 for r in rows):
        parser.error(f"--rows must be within 1..8, got {rows}")
    from pygpukit.core.backend import backend_state

    if backend_state().name != "cuda":
        print("quant_gemv benchmark: needs the CUDA backend (no GPU found)", file=sys.stderr)
        return 2
    if args.simt:
        from pygpukit.ops.quant import gemv, weight_only

        gemv.USE_MMA_GEMV = weight_only.USE_MMA_GEMV = False
    if args.mma_all_rows:
        from pygpukit.ops.quant import gemv, weight_only

        gemv.MMA_MIN_ROWS = dict.fromkeys(gemv.MMA_MIN_ROWS, 1)
        gemv.MMA_MIN_N_AT_ONE_ROW = {}
        weight_only.MMA_MIN_ROWS = 1
    from pygpukit.ops.quant import gemv as gguf_gemv

    gguf_gemv._MMA_WARPS_FOR_TESTS = args.mma_warps or None
    if args.mma_grid:
        gguf_gemv.PERSISTENT_MMA = args.mma_grid == "resident"
    if args.mma_stages:
        gguf_gemv.MMA_STAGES = args.mma_stages
    shapes = SHAPES_7B
    if args.shapes:
        try:
            shapes = [(int(a), int(b)) for a, b in (item.lower().split("x") for item in args.shapes.split(","))]
        except ValueError:
            parser.error(f"--shapes takes N x K pairs such as 14336x4096, got {args.shapes!r}")
    results = run(formats, rows, args.dtype, args.iterations, shapes)
    results["kernel"] = "simt" if args.simt else "default"
    results["mma"] = {"grid": "resident" if gguf_gemv.PERSISTENT_MMA else "tiles", "stages": gguf_gemv.MMA_STAGES,
                      "warps": args.mma_warps}  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    if args.compare:
        with open(args.compare) as f:
            print("\n".join(compare(results, json.load(f))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
