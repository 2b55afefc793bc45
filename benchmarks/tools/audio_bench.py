"""pygpukit.audio against its peers in one run (issue 16): stft, melspectrogram, fft, rfft and resample.

    python benchmarks/tools/audio_bench.py [--batch 64] [--seconds 30] [--repeat 9] [--calls 10] [--out FILE]

Cases (float32 input; the signals are uploaded once, outside the timings):

- ``stft_n400``, ``stft_n2048``: ``audio.stft`` of ``--batch`` x ``--seconds`` s at 16 kHz (n_fft 400 / hop 160
  and n_fft 2048 / hop 512, Hann window, centred) against ``torch.stft`` (return_complex, the same window)
  and ``librosa.stft`` on the CPU. ``stft_n400_sync_check``: the same with ``set_finite_check("sync")``
  (the finiteness check's host round trip per call, as before the deferred check).
- ``melspectrogram``: 80 mels of n_fft 400 / hop 160 against torchaudio's ``MelSpectrogram`` (or, without
  torchaudio, ``torch.stft``, ``abs() ** 2`` and a matmul with the same mel matrix, labelled
  "torch.stft+matmul") and ``librosa.feature.melspectrogram``.
- ``fft_2^k``, ``rfft_2^k``: one transform of 2^``--fft-log2`` points (complex64 / float32) against
  ``torch.fft.fft`` / ``torch.fft.rfft`` (cuFFT) and ``numpy.fft`` on the CPU.
- ``--fft-variants``: the fft and rfft again with 2, 4, 8, 16 and 32 rows per block in the four-step's
  strided launches (``_fft_plan.reg_strided_rows`` and ``strided_rows``), under ``variants`` of the fft case.
- ``resample``: 44.1 -> 16 kHz of ``--batch`` x ``--seconds`` s against torchaudio's ``Resample`` (or the same
  algorithm, torchaudio.functional.resample's windowed-sinc conv1d, written in torch and labelled so) and
  ``librosa.resample`` (soxr_hq).

Timing: one warm-up call, then ``--repeat`` samples of ``--calls`` back-to-back calls each; a sample is the
synchronised wall time over the calls divided by their number (``wall_ms``) and, on the GPU, the device
events around them likewise (``device_ms``); the JSON holds the median of the samples. The peers run in the
same process. CPU peers (librosa, numpy) take ``--cpu-repeat`` single calls. A peer that is not installed
is recorded as ``{"absent": reason}``, a case that fails as ``{"error": ...}``; the run goes on. ``ratios``:
peer time / pygpukit time (above 1: pygpukit is faster), from wall times.

On the CPU simulation backend (no GPU, or PYGPUKIT_BACKEND=cpu) the same run is a smoke test of this script
(use small sizes: ``--batch 2 --seconds 0.5 --fft-log2 10 --repeat 1 --calls 1``); the GPU peers are skipped.
Writes ``$OUT/audio_bench.json`` (or ``--out``) and a summary on stdout.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import platform
import statistics
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

SR = 16000


def _optional(name: str) -> tuple[Any, str | None]:
    try:
        return importlib.import_module(name), None
    except Exception as error:
        return None, f"{type(error).__name__}: {error}"


def _median(samples: list[float]) -> float:
    return float(statistics.median(samples))


def _time_pygpukit(fn: Callable[[], Any], repeat: int, calls: int) -> dict[str, Any]:
    from pygpukit.core.stream import Event, synchronize

    fn()
    synchronize()
    walls, devices = [], []
    for _ in range(repeat):
        start, end = Event(), Event()
        synchronize()
        t0 = time.perf_counter()
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        synchronize()
        walls.append((time.perf_counter() - t0) * 1e3 / calls)
        devices.append(start.elapsed_time(end) / calls)
    return {"wall_ms": _median(walls), "device_ms": _median(devices), "repeat": repeat, "calls": calls}


def _time_torch(torch: Any, fn: Callable[[], Any], repeat: int, calls: int) -> dict[str, Any]:
    fn()
    torch.cuda.synchronize()
    walls, devices = [], []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        torch.cuda.synchronize()
        walls.append((time.perf_counter() - t0) * 1e3 / calls)
        devices.append(start.elapsed_time(end) / calls)
    return {"wall_ms": _median(walls), "device_ms": _median(devices), "repeat": repeat, "calls": calls}


def _time_cpu(fn: Callable[[], Any], repeat: int) -> dict[str, Any]:
    fn()
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e3)
    return {"wall_ms": _median(samples), "repeat": repeat, "calls": 1}


def _torch_resample_kernel(torch: Any, orig: int, new: int, device: Any, width_zeros: int = 6,
                           rolloff: float = 0.99) -> tuple[Any, int, int, int]:  # fmt: skip
    """torchaudio.functional.resample's windowed-sinc (sinc_interp_hann) kernel: (kernels, width, orig, new)."""
    g = math.gcd(orig, new)
    orig, new = orig // g, new // g
    base = min(orig, new) * rolloff
    width = math.ceil(width_zeros * orig / base)
    idx = torch.arange(-width, width + orig, dtype=torch.float64, device=device)[None, None] / orig
    t = torch.arange(0, -new, -1, dtype=torch.float64, device=device)[:, None, None] / new + idx
    t = (t * base).clamp(-width_zeros, width_zeros)
    window = torch.cos(t * math.pi / width_zeros / 2) ** 2
    t = t * math.pi
    kernels = torch.where(t == 0, torch.tensor(1.0, dtype=torch.float64, device=device), t.sin() / t)
    return (kernels * window * (base / orig)).to(torch.float32), width, orig, new


def _torch_resample(torch: Any, x: Any, kernel: tuple[Any, int, int, int]) -> Any:
    """torchaudio.functional.resample's _apply_sinc_resample_kernel."""
    kernels, width, orig, new = kernel
    rows, length = x.shape
    padded = torch.nn.functional.pad(x, (width, width + orig))
    out = torch.nn.functional.conv1d(padded[:, None], kernels, stride=orig)
    return out.transpose(1, 2).reshape(rows, -1)[..., : math.ceil(new * length / orig)]


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        import pygpukit.audio as audio
        from pygpukit.core.backend import backend_state

        self.args = args
        self.audio = audio
        self.cuda = backend_state().name == "cuda"
        self.results: dict[str, Any] = {}
        torch, reason = _optional("torch")
        if torch is not None and not (self.cuda and torch.cuda.is_available()):
            torch, reason = None, "skipped: no CUDA for torch" if self.cuda else "skipped: CPU backend (smoke run)"
        self.torch, self.torch_reason = torch, reason
        found: tuple[Any, str | None] = _optional("torchaudio") if torch is not None else (None, reason)
        self.torchaudio, self.torchaudio_reason = found
        self.librosa, self.librosa_reason = _optional("librosa")

    def case(self, name: str, target: str, ours: Callable[[], Any],
             peers: dict[str, Callable[[], dict[str, Any]] | str]) -> None:  # fmt: skip
        """Time ``ours`` and each peer (a timing function, or a string: why it is absent)."""
        entry: dict[str, Any] = {"target": target}
        try:
            entry["pygpukit"] = _time_pygpukit(ours, self.args.repeat, self.args.calls)
        except Exception as error:
            entry["pygpukit"] = {"error": f"{type(error).__name__}: {error}", "trace": traceback.format_exc()[-2000:]}
        ratios: dict[str, float] = {}
        for peer, timing in peers.items():
            if isinstance(timing, str):
                entry[peer] = {"absent": timing}
                continue
            try:
                entry[peer] = timing()
            except Exception as error:
                entry[peer] = {"error": f"{type(error).__name__}: {error}", "trace": traceback.format_exc()[-2000:]}
                continue
            ours_ms = entry["pygpukit"].get("wall_ms")
            if ours_ms:
                ratios[peer] = entry[peer]["wall_ms"] / ours_ms
        entry["ratios"] = ratios
        self.results[name] = entry
        shown = ", ".join(f"{peer} {value:.2f}x" for peer, value in ratios.items()) or "no peers"
        ours_ms = entry["pygpukit"].get("wall_ms")
        print(f"{name:24s} pygpukit {ours_ms if ours_ms is None else round(ours_ms, 4)} ms; {shown}", flush=True)

    def gpu(self, fn: Callable[[], Any]) -> Callable[[], dict[str, Any]] | str:
        if self.torch is None:
            return self.torch_reason or "absent"
        torch = self.torch
        return lambda: _time_torch(torch, fn, self.args.repeat, self.args.calls)

    def cpu(self, module: Any, reason: str | None, fn: Callable[[], Any]) -> Callable[[], dict[str, Any]] | str:
        if module is None:
            return reason or "absent"
        return lambda: _time_cpu(fn, self.args.cpu_repeat)

    def run(self) -> None:
        from pygpukit.core.array import from_numpy

        args, audio, torch, librosa = self.args, self.audio, self.torch, self.librosa
        rng = np.random.default_rng(0)
        length = int(args.seconds * SR)
        host = (0.1 * rng.standard_normal((args.batch, length))).astype(np.float32)
        y = from_numpy(host)
        ty = torch.from_numpy(host).cuda() if torch is not None else None
        for n_fft, hop in ((400, 160), (2048, 512)):
            window = torch.hann_window(n_fft, device="cuda") if torch is not None else None

            def torch_stft(n_fft: int = n_fft, hop: int = hop, window: Any = window) -> Any:
                return torch.stft(ty, n_fft, hop, window=window, center=True, pad_mode="constant",
                                  return_complex=True)  # fmt: skip

            def ours(n_fft: int = n_fft, hop: int = hop) -> Any:
                return audio.stft(y, n_fft=n_fft, hop_length=hop)

            def lib(n_fft: int = n_fft, hop: int = hop) -> Any:
                return librosa.stft(host, n_fft=n_fft, hop_length=hop)

            peers = {"torch.stft": self.gpu(torch_stft), "librosa": self.cpu(librosa, self.librosa_reason, lib)}
            self.case(f"stft_n{n_fft}", ">= 0.8x torch.stft, >= 100x librosa", ours, peers)
        audio.set_finite_check("sync")
        try:
            self.case("stft_n400_sync_check", "the cost of a synchronous finiteness check",
                      lambda: audio.stft(y, n_fft=400, hop_length=160), {})  # fmt: skip
        finally:
            audio.set_finite_check("deferred")
        self.mel(y, ty, host)
        self.ffts()
        self.resample(rng)
        audio.check_pending()

    def mel(self, y: Any, ty: Any, host: Any) -> None:
        audio, torch, librosa = self.audio, self.torch, self.librosa
        peers: dict[str, Callable[[], dict[str, Any]] | str] = {}
        if torch is not None:
            if self.torchaudio is not None:
                transform = self.torchaudio.transforms.MelSpectrogram(
                    sample_rate=SR, n_fft=400, hop_length=160, n_mels=80, power=2.0
                ).cuda()
                peers["torchaudio.MelSpectrogram"] = self.gpu(lambda: transform(ty))
            else:
                fb = torch.from_numpy(audio.filters.mel(sr=SR, n_fft=400, n_mels=80).T.astype(np.float32)).cuda()
                window = torch.hann_window(400, device="cuda")

                def mel_equivalent() -> Any:
                    spec = torch.stft(ty, 400, 160, window=window, center=True, return_complex=True).abs() ** 2
                    return torch.matmul(spec.transpose(-1, -2), fb).transpose(-1, -2)  # as torchaudio does

                peers["torch.stft+matmul (torchaudio absent)"] = self.gpu(mel_equivalent)
        else:
            peers["torchaudio.MelSpectrogram"] = self.torch_reason or "absent"

        def lib() -> Any:
            return librosa.feature.melspectrogram(y=host, sr=SR, n_fft=400, hop_length=160, n_mels=80)

        peers["librosa"] = self.cpu(librosa, self.librosa_reason, lib)
        self.case("melspectrogram", ">= 0.8x torchaudio, >= 100x librosa",
                  lambda: audio.melspectrogram(y=y, sr=SR, n_fft=400, hop_length=160, n_mels=80), peers)  # fmt: skip

    def ffts(self) -> None:
        from pygpukit.core.array import from_numpy

        audio, torch = self.audio, self.torch
        n = 1 << self.args.fft_log2
        rng = np.random.default_rng(1)
        z = (rng.standard_normal(n) + 1j * rng.standard_normal(n)).astype(np.complex64)
        r = rng.standard_normal(n).astype(np.float32)
        gz, gr = audio.complex_from_numpy(z), from_numpy(r)
        tz = torch.from_numpy(z).cuda() if torch is not None else None
        tr = torch.from_numpy(r).cuda() if torch is not None else None
        self.case(f"fft_2^{self.args.fft_log2}", ">= 0.7x torch.fft (cuFFT)", lambda: audio.fft(gz),
                  {"torch.fft.fft": self.gpu(lambda: torch.fft.fft(tz)),
                   "numpy.fft": lambda: _time_cpu(lambda: np.fft.fft(z), self.args.cpu_repeat)})  # fmt: skip
        self.case(f"rfft_2^{self.args.fft_log2}", "(no target; reported)", lambda: audio.rfft(gr),
                  {"torch.fft.rfft": self.gpu(lambda: torch.fft.rfft(tr)),
                   "numpy.fft": lambda: _time_cpu(lambda: np.fft.rfft(r), self.args.cpu_repeat)})  # fmt: skip
        if self.args.fft_variants:
            self.fft_variants(gz, gr)

    def fft_variants(self, gz: Any, gr: Any) -> None:
        """The fft and rfft above with other rows per block of the four-step's strided launches (fft_reg's
        ``reg_strided_rows``; fft_smem's ``strided_rows`` where fft_reg is off)."""
        from pygpukit.audio import _fft_plan

        default = (_fft_plan.reg_strided_rows, _fft_plan.strided_rows)
        variants: dict[str, Any] = {}
        try:
            for rows in (2, 4, 8, 16, 32):
                _fft_plan.reg_strided_rows = _fft_plan.strided_rows = rows
                _fft_plan._PLANS.clear()
                for kind, fn in (("fft", lambda: self.audio.fft(gz)), ("rfft", lambda: self.audio.rfft(gr))):
                    try:
                        variants[f"{kind} strided_rows={rows}"] = _time_pygpukit(fn, self.args.repeat, self.args.calls)
                    except Exception as error:
                        variants[f"{kind} strided_rows={rows}"] = {"error": f"{type(error).__name__}: {error}"}
        finally:
            _fft_plan.reg_strided_rows, _fft_plan.strided_rows = default
            _fft_plan._PLANS.clear()
        self.results[f"fft_2^{self.args.fft_log2}"]["variants"] = variants
        for name, timing in variants.items():
            print(f"  {name:28s} {timing.get('wall_ms', timing.get('error'))}", flush=True)

    def resample(self, rng: np.random.Generator) -> None:
        from pygpukit.core.array import from_numpy

        audio, torch, librosa = self.audio, self.torch, self.librosa
        host = (0.1 * rng.standard_normal((self.args.batch, int(self.args.seconds * 44100)))).astype(np.float32)
        y = from_numpy(host)
        peers: dict[str, Callable[[], dict[str, Any]] | str] = {}
        if torch is not None:
            ty = torch.from_numpy(host).cuda()
            if self.torchaudio is not None:
                transform = self.torchaudio.transforms.Resample(44100, 16000).cuda()
                peers["torchaudio.Resample"] = self.gpu(lambda: transform(ty))
            else:
                kernel = _torch_resample_kernel(torch, 44100, 16000, "cuda")
                peers["torch conv1d (torchaudio's resample algorithm; torchaudio absent)"] = self.gpu(
                    lambda: _torch_resample(torch, ty, kernel)
                )
        else:
            peers["torchaudio.Resample"] = self.torch_reason or "absent"

        def lib() -> Any:
            return librosa.resample(host, orig_sr=44100, target_sr=16000, res_type="soxr_hq")

        peers["librosa (soxr_hq)"] = self.cpu(librosa, self.librosa_reason, lib)
        self.case("resample_44k1_16k", ">= torchaudio", lambda: audio.resample(y, orig_sr=44100, target_sr=16000),
                  peers)  # fmt: skip


def _environment(bench: Bench) -> dict[str, Any]:
    env: dict[str, Any] = {"python": platform.python_version(), "backend": "cuda" if bench.cuda else "cpu",
                           "numpy": np.__version__, "finite_check": bench.audio.finite_check_mode()}  # fmt: skip
    for name, module in (("torch", bench.torch), ("torchaudio", bench.torchaudio), ("librosa", bench.librosa)):
        env[name] = getattr(module, "__version__", None) if module is not None else None
    if bench.cuda:
        from pygpukit.core.device import get_device_info
        from pygpukit.core.stream import thread_device

        env["device"] = get_device_info(thread_device()).name
    return env


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--fft-log2", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=9, help="timed samples per case (median; >= 7 for reports)")
    parser.add_argument("--calls", type=int, default=10, help="back-to-back calls per sample")
    parser.add_argument("--cpu-repeat", type=int, default=7, help="single calls of the CPU peers (median)")
    parser.add_argument(
        "--fft-variants",
        action="store_true",
        help="also time the FFTs with 2 to 32 rows per block in the four-step's strided launches",
    )
    parser.add_argument("--out", default=None, help="JSON file (default $OUT/audio_bench.json, else audio_bench.json)")
    args = parser.parse_args(argv)
    bench = Bench(args)
    started = time.time()
    bench.run()
    report = {"environment": _environment(bench), "config": vars(args), "results": bench.results,
              "seconds": round(time.time() - started, 1)}  # fmt: skip
    out = Path(args.out) if args.out else Path(os.environ.get("OUT", ".")) / "audio_bench.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
