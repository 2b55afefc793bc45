"""An LLM's answer spoken as it is written: SmolLM2 (pygpukit.llm) streams tokens in one scheduler context,
each finished sentence goes to Kokoro (pygpukit.tts) in a second context, which writes the speech to a WAV
file sentence by sentence.

    python examples/llm_to_speech.py                                  # -> build/llm_to_speech.wav
    python examples/llm_to_speech.py --prompt "Say hello." --tokens 24 --voice jm_kumo -o hello.wav
    python examples/llm_to_speech.py --llm-budget 1GiB --tts-budget 1GiB --tts-share 0.5

Each model is loaded inside its context's session, so its weights and workspaces are charged to that
context's budget (QuotaExceededError there only), and its kernels go to the context's stream: the LLM
guaranteed (high priority), the TTS best-effort (docs/scheduler.md). The two run in two threads joined by
a queue, so the LLM keeps writing while earlier sentences are synthesized.

Kokoro's shipped voices are Japanese and take phonemes. With misaki's Japanese G2P installed
(``pip install 'pygpukit-audio[ja]'``) the text goes through it; otherwise each sentence is spoken as
its lowercase letters read as Kokoro phonemes (a rough reading of English: the point here is the
pipeline, not the pronunciation). Works on the CPU backend (slowly: minutes per sentence) and on the GPU.
Models: the cache's SmolLM2-135M-Instruct (``python -m pygpukit models pull``) and Kokoro
(``python -m pygpukit.tts.fetch``).
"""

from __future__ import annotations

import argparse
import importlib.util
import queue
import re
import sys
import threading
import time
from pathlib import Path
from typing import Any

from pygpukit import scheduler
from pygpukit.core.errors import ArgumentError

PROMPT = "Describe the sea in two short sentences."
_END = re.compile(r"[.!?](\s|$)")
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}


def parse_bytes(text: str) -> int:
    """``512MiB``, ``2GB``, ``1048576``: a positive number of bytes (ArgumentError naming the text otherwise)."""
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*", text)
    unit = match.group(2).upper() if match else ""
    if match is None or unit not in _UNITS or float(match.group(1)) <= 0:
        raise ArgumentError(f"not a size in bytes: {text!r} (examples: 512MiB, 2GB, 1048576)")
    return int(float(match.group(1)) * _UNITS[unit])


def sentences(pieces: Any) -> Any:
    """Join streamed text pieces and yield each sentence once it ends (the rest at the end)."""
    buffer = ""
    for piece in pieces:
        buffer += piece
        while (match := _END.search(buffer)) is not None:
            yield buffer[: match.end()].strip()
            buffer = buffer[match.end() :]
    if buffer.strip():
        yield buffer.strip()


def run(args: argparse.Namespace, out: Any = sys.stdout) -> dict[str, Any]:
    """Everything the command does; returns the figures."""
    import pygpukit.llm as llm
    from pygpukit.llm import hub
    from pygpukit.tts import KokoroModel
    from pygpukit.tts.cli import write_wav

    scheduler.shutdown()
    scheduler.initialize(0, capacity=args.device_budget)
    llm_ctx = scheduler.create_context("llm", max_vram=args.llm_budget, qos="guaranteed")
    tts_ctx = scheduler.create_context("tts", max_vram=args.tts_budget, qos="best_effort",
                                       compute_share=args.tts_share)  # fmt: skip
    start = time.perf_counter()
    with scheduler.context_session(llm_ctx):
        source = hub.MODELS[hub.DEFAULT_MODEL]
        path = hub.cache_dir() / "models" / source.name / source.filename
        lm = llm.load(path if path.is_file() else hub.pull(progress=False), progress=False)
    with scheduler.context_session(tts_ctx):
        tts = KokoroModel.from_pretrained(voice=args.voice)
    print(f"loaded in {time.perf_counter() - start:.1f} s (llm {llm_ctx.used_bytes / 2**20:.0f} MiB, "
          f"tts {tts_ctx.used_bytes / 2**20:.0f} MiB)", file=out)  # fmt: skip
    g2p = importlib.util.find_spec("misaki") is not None
    if not g2p:
        print("misaki's G2P is not installed: reading the letters as phonemes", file=out)

    todo: queue.Queue[str | None] = queue.Queue()
    errors: list[BaseException] = []
    figures: dict[str, Any] = {"sentences": [], "first_audio_s": None}
    begin = time.perf_counter()

    def speak() -> Any:
        while (sentence := todo.get()) is not None:
            text = sentence if g2p else "".join(c for c in sentence.lower() if c in tts.vocab)
            with scheduler.context_session(tts_ctx):
                for audio in tts.generate_stream(text, phonemes=not g2p):
                    if figures["first_audio_s"] is None:
                        figures["first_audio_s"] = time.perf_counter() - begin
                    print(f"  tts: {audio.size / 24000:.2f} s of speech for {sentence!r}", file=out)
                    yield audio

    def tts_thread() -> None:
        try:
            figures["seconds"] = write_wav(args.output, speak(), 24000)
        except BaseException as error:  # reported in the main thread
            errors.append(error)
            while todo.get() is not None:  # let the LLM thread finish
                pass

    worker = threading.Thread(target=tts_thread, name="tts")
    worker.start()
    try:
        with scheduler.context_session(llm_ctx):
            stream = lm.chat_stream([{"role": "user", "content": args.prompt}], args.tokens, temperature=0)
            for sentence in sentences(stream):
                print(f"llm: {sentence!r} ({time.perf_counter() - begin:.1f} s)", file=out)
                figures["sentences"].append(sentence)
                todo.put(sentence)
    finally:
        todo.put(None)
        worker.join()
    if errors:
        raise errors[0]
    for name, ctx in (("llm", llm_ctx), ("tts", tts_ctx)):
        usage = ctx.budget.usage()
        print(f"{name}: used {usage['used_bytes'] / 2**20:.1f} MiB, peak {usage['peak_bytes'] / 2**20:.1f} MiB "
              f"of {usage['max_vram'] / 2**20:.0f} MiB", file=out)  # fmt: skip
    first = figures["first_audio_s"]
    print(f"wrote {args.output}: {figures.get('seconds', 0.0):.2f} s of speech; first audio after "
          f"{first if first is None else round(first, 2)} s", file=out)  # fmt: skip
    return figures


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--prompt", default=PROMPT, help=f"what to ask (default {PROMPT!r})")
    p.add_argument("--tokens", type=int, default=40, help="LLM tokens at most (default 40)")
    p.add_argument("--voice", default="jf_alpha", help="Kokoro voice or mix (default jf_alpha)")
    p.add_argument("-o", "--output", default=str(Path("build") / "llm_to_speech.wav"), help="WAV file to write")
    p.add_argument("--device-budget", type=parse_bytes, default=None, help="capacity contexts are admitted against")
    p.add_argument("--llm-budget", type=parse_bytes, default=parse_bytes("1GiB"), help="default 1GiB")
    p.add_argument("--tts-budget", type=parse_bytes, default=parse_bytes("2GiB"), help="default 2GiB")
    p.add_argument("--tts-share", type=float, default=None, help="pace the TTS context's launches (0, 1]")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.tokens < 1:
        raise ArgumentError(f"--tokens must be >= 1, got {args.tokens}")
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    try:
        run(args)
    except scheduler.QuotaExceededError as error:
        print(f"refused in context {error.context!r}: {error}", file=sys.stderr)
        return 1
    finally:
        scheduler.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
