"""The SM 90 prefill attention kernel in one run on an H100 / H200 (issue 15 item 3): accuracy, determinism
and speed next to the SM 80 kernel and torch's default SDPA.

    python benchmarks/tools/attention_sm90_check.py [--quick] [--out DIR]

- ``accuracy``: max |out - float64 reference| of the SM 90 kernel (``auto``) and of the SM 80 kernel
  (``gp.set_prefill_kernel("sm80")``) for fp16 / bf16, head_dim 64 / 128, causal and not, odd lengths,
  batch 2, 8 query heads over 2 kv heads; the tolerances of the tests (4e-3 fp16, 3e-2 bf16) for reference.
- ``deterministic``: two runs of the SM 90 kernel bitwise equal.
- ``speed``: sdpa_causal bf16, batch 4, 32 heads, head_dim 128 (and 64) at L = 1024, 4096, 8192: TFLOP/s
  of both kernels, of every compiled SM 90 tiling (``tflops BN-STAGES-SKEW``) and of
  torch.nn.functional.scaled_dot_product_attention with the backend torch picks (skipped without
  torch), median of 5 rounds, each round ITERATIONS calls then one synchronize.

Writes ``$OUT/attention_sm90_check.json`` (or ``--out``) and a table on stdout. Needs a GPU.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

import pygpukit as gp
from pygpukit.ops import _attention_sm90, attention

Array = np.ndarray[Any, Any]


def reference(q: Array, k: Array, v: Array, causal: bool) -> Array:
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    batch, seq_q, heads, dim = q.shape
    seq_kv, group = k.shape[1], heads // k.shape[2]
    visible = np.arange(seq_kv)[None, :] <= (seq_kv - seq_q + np.arange(seq_q))[:, None]
    out = np.zeros(q.shape)
    for b in range(batch):
        for h in range(heads):
            s = q[b, :, h] @ k[b, :, h // group].T / math.sqrt(dim)
            if causal:
                s = np.where(visible, s, -np.inf)
            w = np.exp(s - s.max(axis=1, keepdims=True))
            out[b, :, h] = (w / w.sum(axis=1, keepdims=True)) @ v[b, :, h // group]
    return out


def kernels_planned() -> list[str]:
    plans = attention._PLANS._plans.items()
    return sorted({_attention_sm90.describe(p) for key, p in plans if isinstance(key, tuple) and key[0] == "rows"})


def accuracy(quick: bool) -> list[dict[str, Any]]:
    rows = []
    lengths = [1, 17, 127, 1000] if quick else [1, 17, 127, 1000, 2049]
    for dtype in (gp.bfloat16, gp.float16):
        for dim in (64, 128):
            for seq in lengths:
                for causal in (True, False):
                    rng = np.random.default_rng(seq + dim)
                    q = rng.uniform(-2, 2, (2, seq, 8, dim)).astype(np.float32)
                    k = rng.uniform(-2, 2, (2, seq, 2, dim)).astype(np.float32)
                    v = rng.uniform(-1, 1, (2, seq, 2, dim)).astype(np.float32)
                    dq, dk, dv = (gp.from_numpy(x).astype(dtype) for x in (q, k, v))
                    rounded = [x.to_numpy().astype(np.float64) for x in (dq, dk, dv)]
                    expected = reference(rounded[0], rounded[1], rounded[2], causal)
                    row: dict[str, Any] = {"dtype": dtype.name, "dim": dim, "seq": seq, "causal": causal}
                    for kind in ("auto", "sm80"):
                        gp.set_prefill_kernel(kind)
                        attention._PLANS.clear()
                        got = gp.sdpa(dq, dk, dv, causal=causal).to_numpy().astype(np.float64)
                        row[f"{kind}_kernel"] = kernels_planned()
                        row[f"{kind}_max_err"] = float(np.nanmax(np.abs(got - expected))) if got.size else 0.0
                        row[f"{kind}_nan"] = bool(np.isnan(got).any())
                    gp.set_prefill_kernel("auto")
                    first = gp.sdpa(dq, dk, dv, causal=causal).to_numpy()
                    second = gp.sdpa(dq, dk, dv, causal=causal).to_numpy()
                    row["deterministic"] = bool(np.array_equal(first.view(np.uint16), second.view(np.uint16)))
                    rows.append(row)
                    print(f"{dtype.name:9} d{dim:<4} L{seq:<5} {'causal' if causal else 'full  '} "
                          f"sm90 {row['auto_max_err']:.2e} {row['auto_kernel']} sm80 {row['sm80_max_err']:.2e} "
                          f"det {row['deterministic']}", flush=True)  # fmt: skip
    return rows


def _median_seconds(run: Any, rounds: int = 5) -> float:
    run()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _speed_case(torch: Any, dim: int, length: int) -> dict[str, Any]:
    batch, heads = 4, 32
    iterations = max(2, 16 * 1024 * 1024 // (length * length))
    flops = 4 * batch * heads * length * length * dim // 2 * iterations
    rng = np.random.default_rng(length)
    host = [rng.uniform(-2, 2, (batch, length, heads, dim)).astype(np.float32) for _ in range(3)]
    q, k, v = (gp.from_numpy(x).astype(gp.bfloat16) for x in host)
    out = gp.empty(q.shape, gp.bfloat16)
    stream = gp.Stream()
    row: dict[str, Any] = {"dim": dim, "L": length}

    def ours() -> None:
        with stream:
            for _ in range(iterations):
                gp.sdpa_causal(q, k, v, out=out)
        stream.synchronize()

    for kind in ("auto", "sm80"):
        gp.set_prefill_kernel(kind)
        row[f"{kind}_tflops"] = flops / _median_seconds(ours) / 1e12
    gp.set_prefill_kernel("auto")
    if _attention_sm90.CHOICE.kind == "auto" and "sm90" in kernels_planned():
        defaults = _attention_sm90.CONFIGS[dim]
        for tiling in defaults + _attention_sm90.ALTERNATIVES.get(dim, []):
            _attention_sm90.CONFIGS[dim] = [tiling]
            attention._PLANS.clear()
            try:
                row["tflops " + "-".join(map(str, tiling))] = flops / _median_seconds(ours) / 1e12
            finally:
                _attention_sm90.CONFIGS[dim] = defaults
                attention._PLANS.clear()
    if torch is not None:
        tq, tk, tv = (torch.from_numpy(x).to("cuda", torch.bfloat16).transpose(1, 2).contiguous() for x in host)

        def theirs() -> None:
            for _ in range(iterations):
                torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=True)
            torch.cuda.synchronize()

        row["torch_tflops"] = flops / _median_seconds(theirs) / 1e12
        row["sm90_vs_torch"] = row["auto_tflops"] / row["torch_tflops"]
    return row


def speed(quick: bool) -> list[dict[str, Any]]:
    try:
        import torch  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        torch = None
    rows = []
    for dim in (128, 64):
        for length in [1024, 4096] if quick else [1024, 4096, 8192]:
            row = _speed_case(torch, dim, length)
            rows.append(row)
            print(" ".join(f"{key} {value:.3g}" if isinstance(value, float) else f"{key} {value}"
                           for key, value in row.items()), flush=True)  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer lengths")
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    args = parser.parse_args()
    info = gp.get_device_info(gp.get_device())
    print(f"{info.name} compute capability {info.compute_capability}", flush=True)
    result: dict[str, Any] = {"device": info.name}
    for part in (accuracy, speed):
        try:
            result[part.__name__] = part(args.quick)
        except Exception as exc:  # record it and go on with the next part
            result[part.__name__] = {"error": f"{type(exc).__name__}: {exc}"}
            print(f"{part.__name__} failed: {type(exc).__name__}: {exc}", flush=True)
    path = Path(args.out) / "attention_sm90_check.json"
    path.write_text(json.dumps(result, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
