"""Two real models side by side on one device: SmolLM2 (pygpukit.llm) and Whisper tiny.en (pygpukit.asr)
in two scheduler contexts, each under a memory budget that holds for its real allocations.

    python examples/multi_model.py                       # LLM guaranteed, ASR best-effort
    python examples/multi_model.py --guaranteed asr      # the other way round
    python examples/multi_model.py --device-budget 2GiB --llm-budget 1GiB --asr-budget 512MiB --asr-share 0.25

Each model is loaded inside its context's session, so its weights, caches and workspaces are charged
to that context (an allocation past the budget raises QuotaExceededError in that context only), and
its work goes to the context's own stream (high priority for the guaranteed one, low for the
best-effort one; ``--llm-share``/``--asr-share`` also pace that context's launches, docs/scheduler.md).
The guaranteed model's latency is measured alone, then again while the other model runs in another
thread; both must make progress. Works on the CPU backend (slowly: seconds per token) and on the GPU.
Models: the cache's SmolLM2-135M-Instruct and Whisper tiny.en (``python -m pygpukit models pull``).
"""

from __future__ import annotations

import argparse
import re
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pygpukit import scheduler
from pygpukit.core.backend import backend_state
from pygpukit.core.errors import ArgumentError

PROMPT = "Write one sentence about the sea."
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}


def parse_bytes(text: str) -> int:
    """``512MiB``, ``2GB``, ``1048576``: a positive number of bytes (ArgumentError naming the text otherwise)."""
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*", text)
    unit = match.group(2).upper() if match else ""
    if match is None or unit not in _UNITS or float(match.group(1)) <= 0:
        raise ArgumentError(f"not a size in bytes: {text!r} (examples: 512MiB, 2GB, 1048576)")
    return int(float(match.group(1)) * _UNITS[unit])


@dataclass
class Workload:
    """One model in its context: ``unit`` is what its latency is per (a token, or a transcription)."""

    name: str
    ctx: scheduler.ExecutionContext
    unit: str
    latencies: dict[str, list[float]] = field(default_factory=dict)  # phase -> seconds per unit
    done_beside: int = 0  # units finished while the other workload was the measured one


class LLMWork:
    def __init__(self, tokens: int) -> None:
        self.tokens = tokens
        self.model: Any = None
        self.last_units = 0  # tokens of the last run
        self.texts: list[str] = []  # of every run (greedy: the same each time)

    def load(self) -> None:
        import pygpukit.llm as llm
        from pygpukit.llm import hub

        source = hub.MODELS[hub.DEFAULT_MODEL]
        path = hub.cache_dir() / "models" / source.name / source.filename
        if not path.is_file():
            path = hub.pull(progress=False)
        self.model = llm.load(path, progress=False)

    def run_once(self) -> list[float]:
        """Greedy tokens of PROMPT; the seconds of each token after the first (the decode latency)."""
        stamps = [time.perf_counter()]
        pieces = []
        for piece in self.model.generate_stream(PROMPT, self.tokens, temperature=0, ignore_eos=True):
            stamps.append(time.perf_counter())
            pieces.append(piece)
        self.texts.append("".join(pieces))
        stats = self.model.last_stats
        self.last_units = stats.new_tokens if stats is not None else len(stamps) - 1
        if stats is not None and stats.new_tokens > 1 and stats.decode_tokens_per_s > 0:
            # pieces of text may join tokens: the statistics' decode rate is per token
            return [1.0 / stats.decode_tokens_per_s] * (stats.new_tokens - 1)
        return list(np.diff(stamps[1:]))


class ASRWork:
    def __init__(self, audio: str | None) -> None:
        self.audio_path = audio
        self.model: Any = None
        self.audio: Any = None
        self.text = ""
        self.last_units = 1

    def load(self) -> None:
        from pygpukit.asr import WhisperModel, load_audio

        self.model = WhisperModel.from_pretrained()
        path = self.audio_path or _cached_speech()
        if path is not None:
            self.audio = load_audio(path)
        else:  # no recording at hand: one second of a chirp (Whisper still decodes, whatever it hears)
            t = np.arange(16000, dtype=np.float64) / 16000
            self.audio = (0.3 * np.sin(2 * np.pi * (200 + 300 * t) * t)).astype(np.float32)

    def run_once(self) -> list[float]:
        from pygpukit.asr import transcribe

        start = time.perf_counter()
        result = transcribe(self.model, self.audio, temperature=0.0, beam_size=1, condition_on_previous_text=False)
        self.text = result.text.strip()
        return [time.perf_counter() - start]


def _cached_speech() -> str | None:
    """A short recording of the audio test data, when it is in the cache already (nothing is fetched)."""
    try:
        from pygpukit.audio import testdata
    except ImportError:
        return None
    wavs = sorted((testdata.cache_dir() / "pocketsphinx-testdata").rglob("cards/*.wav"))
    return str(wavs[0]) if wavs else None


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def run(args: argparse.Namespace, out: Any = sys.stdout) -> dict[str, Any]:
    """Everything the command does; returns the figures (the test reads them)."""
    scheduler.shutdown()
    scheduler.initialize(0, capacity=args.device_budget, launch_rate=args.launch_rate)
    guaranteed = args.guaranteed
    other = "asr" if guaranteed == "llm" else "llm"
    qos = {guaranteed: "guaranteed", other: "best_effort"}
    budgets = {"llm": args.llm_budget, "asr": args.asr_budget}
    shares = {"llm": args.llm_share, "asr": args.asr_share}
    works: dict[str, Any] = {"llm": LLMWork(args.tokens), "asr": ASRWork(args.audio)}
    loads = {}
    for name in ("llm", "asr"):
        ctx = scheduler.create_context(name, max_vram=budgets[name], qos=qos[name], compute_share=shares[name])  # type: ignore[arg-type]
        loads[name] = Workload(name, ctx, "token" if name == "llm" else "transcription")
        start = time.perf_counter()
        with scheduler.context_session(ctx):  # the weights are charged to the context
            works[name].load()
        print(f"{name}: loaded in {time.perf_counter() - start:.1f} s, {_mib(ctx.used_bytes)} of its "
              f"{_mib(budgets[name])} budget ({qos[name]})", file=out)  # fmt: skip

    main, side = loads[guaranteed], loads[other]
    # One run of each model first, not measured: kernel compilation, plan and graph set-up happen there.
    for name in ("llm", "asr"):
        with scheduler.context_session(loads[name].ctx):
            works[name].run_once()
    main.latencies["alone"] = []
    for _ in range(args.repeat):
        with scheduler.context_session(main.ctx):
            main.latencies["alone"] += works[guaranteed].run_once()

    stop = threading.Event()
    side_errors: list[BaseException] = []

    def background() -> None:  # the other model, over and over, until the measured one is done
        try:
            with scheduler.context_session(side.ctx):
                while not stop.is_set() or side.done_beside == 0:
                    side.latencies.setdefault("beside", []).extend(works[other].run_once())
                    side.done_beside += works[other].last_units
        except BaseException as error:  # reported in the main thread
            side_errors.append(error)

    thread = threading.Thread(target=background, name=f"{other}-background")
    thread.start()
    try:
        with scheduler.context_session(main.ctx):
            main.latencies["beside"] = []
            for _ in range(args.repeat):
                main.latencies["beside"] += works[guaranteed].run_once()
    finally:
        stop.set()
        thread.join()
    if side_errors:
        raise side_errors[0]

    usage = {name: loads[name].ctx.budget.usage() for name in ("llm", "asr")}
    alone = float(np.median(main.latencies["alone"])) * 1e3
    beside = float(np.median(main.latencies["beside"])) * 1e3
    alone_p90 = float(np.percentile(main.latencies["alone"], 90)) * 1e3
    beside_p90 = float(np.percentile(main.latencies["beside"], 90)) * 1e3
    device = backend_state().name
    print(f"\ndevice: {device}; {guaranteed} guaranteed, {other} best-effort"
          f"{f' (paced at {shares[other]})' if shares[other] else ''}", file=out)  # fmt: skip
    print(f"{'context':<8} {'qos':<12} {'budget':>12} {'used':>12} {'peak':>12} {'refused':>8}", file=out)
    for name in ("llm", "asr"):
        u = usage[name]
        print(f"{name:<8} {qos[name]:<12} {_mib(u['max_vram']):>12} {_mib(u['used_bytes']):>12} "
              f"{_mib(u['peak_bytes']):>12} {u['refused']:>8}", file=out)  # fmt: skip
    print(f"\n{guaranteed} latency per {main.unit} (ms, median / p90)   alone: {alone:.2f} / {alone_p90:.2f}   "
          f"beside {other}: {beside:.2f} / {beside_p90:.2f}   ratio of medians: {beside / alone:.2f}",
          file=out)  # fmt: skip
    print(f"{other} meanwhile: {side.done_beside} {side.unit}(s)"
          f"{f', last text: {works[other].text!r}' if other == 'asr' else ''}", file=out)  # fmt: skip
    return {
        "device": device,
        "guaranteed": guaranteed,
        "alone_ms": alone,
        "beside_ms": beside,
        "alone_p90_ms": alone_p90,
        "beside_p90_ms": beside_p90,
        "units": {"alone": len(main.latencies["alone"]), "beside": len(main.latencies["beside"])},
        "other_done": side.done_beside,
        "usage": usage,
        "asr_text": works["asr"].text,
        "llm_texts": works["llm"].texts,
    }


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--guaranteed", choices=("llm", "asr"), default="llm", help="the context measured (default llm)")
    p.add_argument("--device-budget", type=parse_bytes, default=None,
                   help="what contexts are admitted against (default: the whole device)")  # fmt: skip
    p.add_argument("--llm-budget", type=parse_bytes, default=parse_bytes("1GiB"), help="default 1GiB")
    p.add_argument("--asr-budget", type=parse_bytes, default=parse_bytes("1GiB"), help="default 1GiB")
    p.add_argument("--llm-share", type=float, default=None, help="pace the LLM's launches (0, 1]")
    p.add_argument("--asr-share", type=float, default=None, help="pace the ASR's launches (0, 1]")
    p.add_argument("--launch-rate", type=float, default=20000.0, help="launches/s that shares divide")
    p.add_argument("--tokens", type=int, default=32, help="tokens per LLM generation (default 32)")
    p.add_argument("--repeat", type=int, default=1, help="generations (or transcriptions) per measurement")
    p.add_argument("--audio", default=None, help="a recording for Whisper (default: the cached test data)")
    return p


def main(argv: list[str] | None = None) -> int:
    cli = parser()
    args = cli.parse_args(argv)
    if args.tokens < 2 or args.repeat < 1:
        cli.error(f"--tokens must be >= 2 and --repeat >= 1, got {args.tokens} and {args.repeat}")
    try:
        run(args)
    except scheduler.QuotaExceededError as error:
        print(f"refused in context {error.context!r}: {error}", file=sys.stderr)
        return 1
    except (scheduler.AdmissionError, scheduler.ContextError) as error:  # budgets that do not fit, bad shares
        print(f"not admitted: {error}", file=sys.stderr)
        return 2
    finally:
        scheduler.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
