"""Soak test (issue 21, item 5): mixed ops and model-sized allocations for N minutes, memory sampled, and a
JSON summary with a flat-memory verdict.

    python benchmarks/tools/soak.py --minutes 10                 # on the GPU (the issue's 10-minute soak)
    python benchmarks/tools/soak.py --minutes 1 --model-mb 64    # a short run (the CPU backend, say)
    OUT=$OUT bash ci/soak.sh                                     # where one command may run 10 minutes

``--minutes`` bounds the whole run from the start of the process (imports and warm-up included): the
last step starts only when the longest step so far still ends before the bound, so a command limit a
little above it is never hit. The summary goes to ``--out`` (default ``$OUT/soak.json`` when ``OUT``
is set, else build/soak/soak.json); it is also written, marked ``"complete": false``, at every sample,
so a run that is killed still leaves its figures so far.

Every step picks one piece of work at random: an elementwise chain, reductions and softmax, a matmul
(float32, float16, bfloat16), a model-sized allocation filled and checked, a KV-cache-like growth of
blocks that are then all dropped, dtype conversions with concatenation, work on a second thread's
stream, or an LLM decode step (embedding, RMSNorm, RoPE, a KV cache, decode attention, logits and
greedy sampling). Each result is checked against NumPy on a small slice. Between steps nothing of the workload is
alive, so the pool's in-use bytes must come back to a steady level; every
``--sample-seconds`` the pool statistics, the device's free memory and the process's resident memory are
recorded. The verdict is "flat" when the in-use bytes between steps hold one value over the second half
of the run (a workspace kept for a shape first met after the warm-up may raise the level once before),
the device memory in use at the end (after ``empty_cache``) is within ``--tolerance-mb`` of the level
after the warm-up (on the GPU; on the CPU backend that figure is the whole host's and only reported),
and the floor of the process's resident memory rose by less than ``--rss-tolerance-mb`` from the third
quarter of the run to the last. Exit status 1 when the verdict is not flat or a check failed.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import random
import sys
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

import pygpukit as gp

MB = 1 << 20
# The memory figures of the summary: after the warm-up (start) and after the last step (end).
START_KEYS = ("in_use_bytes", "cached_bytes", "device_used_after_empty_cache", "rss_bytes")
END_KEYS = ("in_use_bytes", "cached_bytes", "device_used_bytes", "rss_bytes")


def seconds_since_process_start() -> float:
    """How long this process has run (Linux /proc: the imports and CUDA start-up count; 0 elsewhere)."""
    try:
        with open("/proc/self/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
        with open("/proc/uptime") as handle:
            uptime = float(handle.read().split()[0])
        return max(0.0, uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK"))  # field 22: start time in ticks
    except (OSError, ValueError, IndexError):
        return 0.0


def rss_bytes() -> int:
    """Resident memory of this process (Linux /proc; 0 elsewhere)."""
    try:
        with open("/proc/self/statm") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def device_used() -> int:
    free, total = gp.get_memory_info()
    return int(total - free)


class Soak:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rng = random.Random(args.seed)
        self.np_rng = np.random.default_rng(args.seed)
        self.counts: Counter[str] = Counter()
        self.failures: list[str] = []
        self.side = gp.Stream()
        self.work: dict[str, Callable[[], None]] = {
            "elementwise": self.elementwise,
            "reductions": self.reductions,
            "matmul": self.matmul,
            "model_allocation": self.model_allocation,
            "kv_growth": self.kv_growth,
            "conversions": self.conversions,
            "side_stream": self.side_stream,
            "decode_step": self.decode_step,
        }

    def check(self, name: str, got: np.ndarray[Any, Any], want: np.ndarray[Any, Any], rtol: float) -> None:
        """``got`` within ``rtol`` of ``want``, element by element and relative to the largest value of
        ``want`` (a dot product of K terms near zero carries the rounding of its large terms: an
        fp32 matmul of 2048 N(0, 1) terms is off by 2.5e-4 where its result is near 0)."""
        scale = max(1.0, float(np.nanmax(np.abs(want.astype(np.float64)), initial=0.0)))
        if not np.allclose(
            got.astype(np.float64), want.astype(np.float64), rtol=rtol, atol=rtol * scale, equal_nan=True
        ):
            self.failures.append(f"{name}: max error {np.nanmax(np.abs(got.astype(np.float64) - want)):.3g}")

    def elementwise(self) -> None:
        n = self.rng.choice((1 << 16, 1 << 20, 4 << 20))
        values = self.np_rng.standard_normal(n).astype(np.float32)
        x = gp.from_numpy(values)
        y = gp.tanh(gp.exp(x * 0.25) - 1.0) * 2.0 + gp.sigmoid(x)
        head = values[:256].astype(np.float64)
        want = np.tanh(np.exp(head * 0.25) - 1.0) * 2.0 + 1 / (1 + np.exp(-head))
        self.check("elementwise", y[:256].to_numpy(), want, 1e-5)

    def reductions(self) -> None:
        rows, cols = self.rng.choice(((4096, 512), (512, 4096), (64, 65536)))
        values = self.np_rng.standard_normal((rows, cols)).astype(np.float32)
        x = gp.from_numpy(values)
        s = gp.sum(x, axis=1)
        p = gp.softmax(x, axis=-1)
        m = gp.argmax(x, axis=0)
        self.check("sum", s[:8].to_numpy(), values[:8].astype(np.float64).sum(1), 1e-4)
        row = values[0].astype(np.float64)
        self.check("softmax", p[0].to_numpy(), np.exp(row - row.max()) / np.exp(row - row.max()).sum(), 1e-5)
        self.check("argmax", m[:8].to_numpy(), values[:, :8].argmax(0), 0)

    def matmul(self) -> None:
        n = self.rng.choice((256, 1024, 2048))
        dtype = self.rng.choice((gp.float32, gp.float16, gp.bfloat16))
        a = self.np_rng.standard_normal((n, n)).astype(np.float32)
        b = self.np_rng.standard_normal((n, n)).astype(np.float32)
        x, y = gp.from_numpy(a).astype(dtype), gp.from_numpy(b).astype(dtype)
        c = gp.matmul(x, y, use_tf32=False)
        rounded_a = x[:4].astype(gp.float32).to_numpy().astype(np.float64)
        rounded_b = y.astype(gp.float32).to_numpy().astype(np.float64)
        tol = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 1e-2}[dtype.name]  # relative to the largest value
        self.check(f"matmul {dtype.name}", c[:4].astype(gp.float32).to_numpy(), rounded_a @ rounded_b, tol)

    def model_allocation(self) -> None:
        mb = self.rng.randint(self.args.model_mb // 4, self.args.model_mb)
        weights = gp.full(mb * MB // 2, 0.5, gp.bfloat16)  # a model-sized block, as a load makes
        total = float(gp.sum(weights[: 1 << 20].astype(gp.float32)).to_numpy())
        if total != 0.5 * (1 << 20):
            self.failures.append(f"model_allocation: sum {total}")

    def kv_growth(self) -> None:
        blocks = []
        size = self.args.model_mb * MB // 64
        for step in range(self.rng.randint(4, 32)):  # a KV cache growing block by block
            blocks.append(gp.full(size // 2, float(step), gp.float16))
        last = len(blocks) - 1
        if float(blocks[last][:4].to_numpy()[0]) != float(last):
            self.failures.append("kv_growth: a block holds another block's data")
        joined = gp.concatenate([b[:16] for b in blocks])
        want = np.repeat(np.arange(len(blocks), dtype=np.float64), 16)
        self.check("kv_growth concatenate", joined.to_numpy(), want, 0)

    def conversions(self) -> None:
        values = self.np_rng.integers(-100, 100, 1 << 18).astype(np.int32)
        x = gp.from_numpy(values)
        y = gp.concatenate([x.astype(gp.float16), x.astype(gp.bfloat16)])
        z = gp.clamp(y, -50, 50).astype(gp.int64)
        want = np.clip(np.concatenate([values, values]), -50, 50)
        self.check("conversions", z[::4096].to_numpy(), want[::4096], 0)

    def side_stream(self) -> None:
        out: list[float] = []

        def run() -> None:
            with self.side:
                x = gp.full(1 << 20, 3.0, gp.float32)
                out.append(float(gp.sum(x * x).to_numpy()))
            self.side.synchronize()

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        thread.join(60)
        if thread.is_alive() or out != [9.0 * (1 << 20)]:
            self.failures.append(f"side_stream: {'stuck' if thread.is_alive() else out}")

    def decode_step(self) -> None:
        """One LLM decode step: embedding, RMSNorm, RoPE, a KV cache prefilled then appended at device
        positions, decode attention over it, the logits and greedy sampling; each checked."""
        batch, vocab, hidden, heads, kv_heads, d = 4, 8192, 512, 8, 2, 64
        max_seq = self.rng.choice((256, 1024, 4096))
        lens = self.np_rng.integers(1, max_seq, size=batch)
        table_host = (self.np_rng.standard_normal((vocab, hidden)) * 0.05).astype(np.float32)
        table = gp.from_numpy(table_host)
        ids = self.np_rng.integers(0, vocab, size=batch).astype(np.int32)
        x = gp.embedding(table, gp.from_numpy(ids))
        self.check("embedding", x.to_numpy(), table_host[ids], 0)
        h = gp.rmsnorm(x, gp.ones(hidden, gp.float32))
        cache = gp.KVCache(1, batch, kv_heads, max_seq, d, gp.float16)
        prefill = int(lens.max())
        k_host = self.np_rng.standard_normal((batch, prefill, kv_heads, d)).astype(np.float16)
        v_host = self.np_rng.standard_normal((batch, prefill, kv_heads, d)).astype(np.float16)
        cache.write_prefill(0, gp.from_numpy(k_host), gp.from_numpy(v_host))
        positions = gp.from_numpy((lens - 1).astype(np.int32))  # overwrite each row's last key
        k_new = gp.from_numpy(self.np_rng.standard_normal((batch, 1, kv_heads, d)).astype(np.float16))
        cos, sin = gp.rope_cos_sin(d, max_seq)
        gp.apply_rope(k_new, None, cos, sin, positions)
        cache.append(0, k_new, k_new, positions)
        q = h[:, : heads * d].reshape(batch, 1, heads, d).astype(gp.float16)
        gp.apply_rope(q, None, cos, sin, positions)
        q = q.reshape(batch, heads, d)
        out = gp.decode_attention(q, cache.k(0), cache.v(0), gp.from_numpy(lens.astype(np.int32)))
        b = int(self.np_rng.integers(0, batch))
        n = int(lens[b])
        keys = cache.k(0)[b, 0, :n].to_numpy().astype(np.float64)  # head 0 of kv head 0
        values = cache.v(0)[b, 0, :n].to_numpy().astype(np.float64)
        scores = keys @ q[b, 0].to_numpy().astype(np.float64) / np.sqrt(d)
        weights = np.exp(scores - scores.max())
        self.check("decode attention", out[b, 0].to_numpy(), weights @ values / weights.sum(), 2e-2)
        logits = gp.matmul(h, table.T, use_tf32=False)
        tokens = gp.sample(logits, temperature=0.0).to_numpy().reshape(-1)
        self.check("greedy sampling", tokens, logits.to_numpy().argmax(axis=1), 0)

    def step(self) -> str:
        name = self.rng.choice(list(self.work))
        try:
            self.work[name]()
        except Exception:
            self.failures.append(f"{name}: {traceback.format_exc(limit=3)}")
        self.counts[name] += 1
        return name


def sample(start: float, steps: int) -> dict[str, Any]:
    stats = gp.memory_stats()
    free, total = gp.get_memory_info()
    return {
        "t": round(time.monotonic() - start, 2),
        "steps": steps,
        "in_use_bytes": int(stats["in_use_bytes"]),
        "cached_bytes": int(stats["cached_bytes"]),
        "peak_in_use_bytes": int(stats["peak_in_use_bytes"]),
        "device_allocations": int(stats["device_allocations"]),
        "device_used_bytes": int(total - free),
        "rss_bytes": rss_bytes(),
    }


def verdict(samples: list[dict[str, Any]], warm: dict[str, Any], final: dict[str, Any],
            args: argparse.Namespace) -> dict[str, Any]:  # fmt: skip
    reasons = []
    # Workspaces an op keeps for a shape first met after the warm-up may raise the level once; what must
    # not happen is a level that keeps moving: over the second half the in-use bytes between steps are
    # one value, the final one included.
    half = [s for s in samples if s["t"] >= samples[-1]["t"] / 2] or samples[-1:]
    levels = sorted({s["in_use_bytes"] for s in half})
    drift = sorted({s["in_use_bytes"] - warm["in_use_bytes"] for s in samples} - {0})
    if len(levels) > 1:
        reasons.append(f"pool in-use bytes between steps kept moving over the second half: {levels[:5]}")
    device_growth = final["device_used_bytes"] - warm["device_used_after_empty_cache"]
    # On the CPU backend "device" memory is the host's, shared with every other process: reported only.
    if gp.current_backend() == "cuda" and device_growth > args.tolerance_mb * MB:
        reasons.append(f"device memory in use grew by {device_growth / MB:.1f} MB (tolerance {args.tolerance_mb})")
    # Resident memory swings with what a step holds; a leak raises its floor: the lowest value over the last
    # quarter against the lowest over the quarter before.
    end = samples[-1]["t"]
    quarter = [s["rss_bytes"] for s in samples if end / 2 <= s["t"] < 3 * end / 4] or [half[0]["rss_bytes"]]
    last = [s["rss_bytes"] for s in samples if s["t"] >= 3 * end / 4] or [samples[-1]["rss_bytes"]]
    rss_growth = min(last) - min(quarter)
    if rss_growth > args.rss_tolerance_mb * MB:
        reasons.append(f"process memory floor rose by {rss_growth / MB:.1f} MB (third quarter to last)")
    return {
        "flat": not reasons,
        "reasons": reasons,
        "pool_in_use_levels_second_half": levels,
        "pool_in_use_drift_from_warm_up_bytes": drift[:20],
        "device_used_growth_bytes": device_growth,
        "rss_floor_growth_bytes": rss_growth,
    }


def summary_of(args: argparse.Namespace, soak: Soak, steps: int, start: float, samples: list[dict[str, Any]],
               warm: dict[str, Any], last: dict[str, Any], result: dict[str, Any] | None
               ) -> dict[str, Any]:  # fmt: skip
    """The JSON summary; ``result`` None: the run is not over (written at every sample)."""
    info = gp.get_device_info() if gp.current_backend() == "cuda" else None
    return {
        "complete": result is not None,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "backend": gp.current_backend(),
        "device": getattr(info, "name", platform.processor() or platform.machine()),
        "host": platform.node(),
        "minutes": round((time.monotonic() - start) / 60, 2),
        "minutes_with_start_up": round(seconds_since_process_start() / 60, 2),
        "steps": steps,
        "steps_by_kind": dict(soak.counts),
        "model_mb": args.model_mb,
        "failures": soak.failures[:50],
        "failure_count": len(soak.failures),
        "verdict": result,
        "peak_in_use_bytes": max(s["peak_in_use_bytes"] for s in samples),
        "memory_start": {k: warm[k] for k in START_KEYS},
        "memory_end": {k: last.get(k) for k in END_KEYS},
        "samples": samples,
    }


def write_summary(args: argparse.Namespace, summary: dict[str, Any]) -> None:
    args.out.parent.mkdir(parents=True, exist_ok=True)
    partial = args.out.with_name(args.out.name + ".partial")
    partial.write_text(json.dumps(summary, indent=1) + "\n")
    partial.replace(args.out)  # whole or not at all, should the run be killed while writing


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--model-mb", type=int, default=None, help="largest model-sized block (GPU 1024, CPU 64)")
    parser.add_argument("--sample-seconds", type=float, default=5.0)
    parser.add_argument("--tolerance-mb", type=float, default=64.0, help="device memory growth allowed at the end")
    parser.add_argument("--rss-tolerance-mb", type=float, default=128.0, help="host memory growth allowed")
    parser.add_argument("--seed", type=int, default=21)
    default_out = Path(os.environ["OUT"]) / "soak.json" if os.environ.get("OUT") else Path("build/soak/soak.json")
    parser.add_argument("--out", type=Path, default=default_out)
    args = parser.parse_args(argv)
    backend = gp.current_backend()
    if args.model_mb is None:
        args.model_mb = 1024 if backend == "cuda" else 64
    started = time.monotonic() - seconds_since_process_start()
    soak = Soak(args)
    start = time.monotonic()
    deadline = started + args.minutes * 60
    for _ in range(3):  # warm-up: compile every kernel, meet most shapes, fill the pool's caches
        for name in soak.work:
            soak.work[name]()
    gc.collect()
    gp.synchronize()
    warm = sample(start, 0)
    gp.empty_cache()
    warm["device_used_after_empty_cache"] = device_used()
    samples = [warm]
    steps, next_sample = 0, time.monotonic() + args.sample_seconds
    longest = 0.0  # the longest step so far: the last one must end before the deadline too
    while time.monotonic() + longest < deadline:
        began = time.monotonic()
        soak.step()
        longest = max(longest, time.monotonic() - began)
        steps += 1
        if time.monotonic() >= next_sample:
            gc.collect()
            gp.synchronize()
            samples.append(sample(start, steps))
            write_summary(args, summary_of(args, soak, steps, start, samples, warm, samples[-1], None))
            next_sample = time.monotonic() + args.sample_seconds
    gc.collect()
    gp.synchronize()
    gp.empty_cache()
    final = sample(start, steps)
    samples.append(final)
    result = verdict(samples, warm, final, args)
    summary = summary_of(args, soak, steps, start, samples, warm, final, result)
    write_summary(args, summary)
    print(f"soak: {steps} steps in {summary['minutes']} min on {backend} ({summary['device']}), "
          f"{len(soak.failures)} failed checks, memory {'flat' if result['flat'] else 'NOT flat'}; "
          f"summary in {args.out}")  # fmt: skip
    start_mb, end_mb = warm["device_used_after_empty_cache"] / MB, final["device_used_bytes"] / MB
    print(f"  memory: pool in use {warm['in_use_bytes'] / MB:.1f} MB after the warm-up, "
          f"{final['in_use_bytes'] / MB:.1f} MB at the end; device in use {start_mb:.0f} MB -> {end_mb:.0f} MB; "
          f"process resident {warm['rss_bytes'] / MB:.0f} MB -> {final['rss_bytes'] / MB:.0f} MB")  # fmt: skip
    for reason in result["reasons"]:
        print(f"  {reason}")
    for failure in soak.failures[:5]:
        print(f"  {failure}")
    return 0 if result["flat"] and not soak.failures else 1


if __name__ == "__main__":
    sys.exit(main())
