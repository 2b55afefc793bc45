"""Device time per kernel of a few pygpukit calls and their torch peers, read by torch's profiler (CUPTI
sees every kernel of the process, pygpukit's included, and the kernels of CUDA-graph replays), next to the
wall time per call. It tells a call bound by its kernels from one bound by host work: when the wall time
per call is well above the sum of its kernels, the launches wait for Python.

    python benchmarks/tools/kernel_times.py [--cases fft,rfft,stft2048,stft400] [--calls 50] [--json PATH]
        [--variants smem,reg8,reg16:t128]

Each case runs ``--calls`` times after a warm-up; the table lists, per case and implementation, the wall
time per call (the calls issued back to back, one synchronization at the end), the device time per call
summed over its kernels, and the kernels with their mean duration and launches per call. GPU machine
only (torch with CUDA).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import numpy as np


def _cases(torch: Any, names: list[str]) -> dict[str, dict[str, Callable[[], Any]]]:
    import pygpukit as gp
    from pygpukit import audio

    rng = np.random.default_rng(0)
    found: dict[str, dict[str, Callable[[], Any]]] = {}
    n = 1 << 20
    if "fft" in names:
        z = (rng.standard_normal(n) + 1j * rng.standard_normal(n)).astype(np.complex64)
        gz, tz = audio.complex_from_numpy(z), torch.from_numpy(z).cuda()
        found["fft_2^20"] = {"pygpukit": lambda: audio.fft(gz), "torch": lambda: torch.fft.fft(tz)}
    if "rfft" in names:
        r = rng.standard_normal(n).astype(np.float32)
        gr, tr = gp.from_numpy(r), torch.from_numpy(r).cuda()
        found["rfft_2^20"] = {"pygpukit": lambda: audio.rfft(gr), "torch": lambda: torch.fft.rfft(tr)}
    for n_fft, hop, name in ((2048, 512, "stft2048"), (400, 160, "stft400")):
        if name not in names:
            continue
        y = rng.standard_normal((64, 30 * 16000)).astype(np.float32)
        gy, ty = gp.from_numpy(y), torch.from_numpy(y).cuda()
        window = torch.hann_window(n_fft, device="cuda")

        def ours(n_fft: int = n_fft, hop: int = hop, gy: Any = gy) -> Any:
            return audio.stft(gy, n_fft=n_fft, hop_length=hop)

        def peer(n_fft: int = n_fft, hop: int = hop, window: Any = window, ty: Any = ty) -> Any:
            return torch.stft(ty, n_fft, hop, window=window, center=True, pad_mode="constant", return_complex=True)

        found[f"stft_n{n_fft}"] = {"pygpukit": ours, "torch": peer}
    return found


_DEFAULTS: list[tuple[bool, dict[str, int], int, int, bool, bool]] = []


def _use_variant(spec: str | None) -> None:
    """Plan pygpukit's FFTs as ``spec`` says from here on: "smem" (fft.cu's fft_smem only) or "reg<E>" with
    optional ":t<threads per block>", ":s<rows per block of strided launches>", ":legacy" (fft_reg's
    shared-memory layout of before, reg_banks off) and ":single" (one shared-memory buffer a block,
    reg_double off: no _2buf kernels) (fft_reg.cu's knobs, _fft_plan.reg_*); None: the defaults."""
    from pygpukit.audio import _fft_plan

    if not _DEFAULTS:  # the planner's own settings, read before the first variant changes them
        _DEFAULTS.append((_fft_plan.reg_enabled, dict(_fft_plan.reg_elements), _fft_plan.reg_threads,
                          _fft_plan.reg_strided_rows, _fft_plan.reg_banks, _fft_plan.reg_double))  # fmt: skip
    enabled, elements, threads, strided, banks, double = _DEFAULTS[0]
    elements = dict(elements)
    for part in (spec or "").split(":"):
        if part == "smem":
            enabled = False
        elif part.startswith("reg"):
            enabled, elements["float32"] = True, int(part[3:])
        elif part == "legacy":
            banks = False
        elif part == "single":
            double = False
        elif part.startswith("t"):
            threads = int(part[1:])
        elif part.startswith("s"):
            strided = int(part[1:])
        elif part:
            raise SystemExit(f"unknown variant part {part!r} in {spec!r}")
    _fft_plan.reg_enabled, _fft_plan.reg_elements = enabled, elements
    _fft_plan.reg_threads, _fft_plan.reg_strided_rows, _fft_plan.reg_banks = threads, strided, banks
    _fft_plan.reg_double = double
    _fft_plan._PLANS.clear()


def _profile(torch: Any, fn: Callable[[], Any], calls: int) -> dict[str, Any]:
    from torch.profiler import ProfilerActivity, profile

    from pygpukit.core.stream import synchronize

    for _ in range(3):
        fn()
    synchronize()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    synchronize()
    torch.cuda.synchronize()
    wall = (time.perf_counter() - t0) * 1e3 / calls
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        synchronize()
        torch.cuda.synchronize()
    kernels: dict[str, list[float]] = defaultdict(list)
    for event in prof.events():
        if str(getattr(event, "device_type", "")).endswith("CUDA") and event.device_time_total > 0:
            kernels[event.name].append(event.device_time_total / 1e3)  # ms
    rows: list[dict[str, Any]] = [
        {"kernel": name[:90], "mean_ms": float(np.mean(times)), "per_call": len(times) / calls}
        for name, times in sorted(kernels.items(), key=lambda kv: -sum(kv[1]))
    ]
    device = sum(r["mean_ms"] * r["per_call"] for r in rows)
    return {"wall_ms": wall, "device_ms": device, "kernels": rows}


def _gpu_state() -> str:
    """The SM clock, its maximum, the power draw and the temperature right after a case (nvidia-smi), so
    that runs on different lendings can be told apart by clock: an issue-bound kernel (ours) follows the
    SM clock, a memory-bound one (cuFFT's) barely does. "" where nvidia-smi is absent."""
    import subprocess

    try:
        fields = "clocks.sm,clocks.max.sm,power.draw,temperature.gpu"
        query = ["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader"]
        done = subprocess.run(query, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout.strip().splitlines()[0] if done.returncode == 0 and done.stdout.strip() else ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="fft,rfft,stft2048,stft400")
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--json", default=None)
    parser.add_argument(
        "--variants",
        default="",
        help="comma-separated FFT plan variants to time pygpukit's side with as well: smem, reg8, reg16, "
        "reg16:t128:s16 (threads per block, strided rows per block)",
    )
    parser.add_argument(
        "--plain",
        action="store_true",
        help="only run pygpukit's side of each case --calls times, no profiler (for ncu)",
    )
    args = parser.parse_args(argv)
    import torch

    if args.plain:
        from pygpukit.core.stream import synchronize

        for impls in _cases(torch, args.cases.split(",")).values():
            for _ in range(args.calls):
                impls["pygpukit"]()
            synchronize()
        return 0

    results: dict[str, Any] = {}
    variants = [v for v in args.variants.split(",") if v]
    for case, impls in _cases(torch, args.cases.split(",")).items():
        runs: list[tuple[str, Callable[[], Any], str | None]] = [(impl, fn, None) for impl, fn in impls.items()]
        runs += [(f"pygpukit-{variant}", impls["pygpukit"], variant) for variant in variants]
        for impl, fn, variant in runs:
            _use_variant(variant)
            found = _profile(torch, fn, args.calls)
            found["gpu_state"] = _gpu_state()
            results[f"{case} {impl}"] = found
            print(f"{case:10s} {impl:9s} wall {found['wall_ms']:.4f} ms/call, kernels {found['device_ms']:.4f} ms/call"
                  f"  [{found['gpu_state']}]")  # fmt: skip
            for row in found["kernels"][:8]:
                print(f"    {row['mean_ms'] * 1e3:9.2f} us x{row['per_call']:.2f}  {row['kernel']}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
