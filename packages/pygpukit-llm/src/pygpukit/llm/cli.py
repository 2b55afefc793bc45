"""The LLM command line: ``python -m pygpukit chat | generate | models``.

``pygpukit.__main__`` (in pygpukit-core) hands these commands to :func:`main` when pygpukit-llm is
installed. Everything the commands do with a model goes through a few names (``generate_stream``,
``chat_stream``, ``last_stats``, ``config.name``, ``backend``), each used in one small function, so
the command line follows the model API with small edits.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import sys
import warnings
from collections.abc import Iterator, Sequence
from typing import Any, Protocol, TextIO

from pygpukit.core.backend import BackendFallbackWarning
from pygpukit.core.errors import PyGPUkitError

from . import hub

__all__ = ["main"]

_DIM = "\x1b[2m"
_RESET = "\x1b[0m"
_REPL_HELP = "/reset clears the conversation, /exit or Ctrl-D quits, Ctrl-C stops an answer"


class _Model(Protocol):
    """The part of CausalTransformerModel the command line uses."""

    last_stats: Any
    config: Any

    @property
    def backend(self) -> str: ...

    def generate_stream(self, prompt: str, **kwargs: Any) -> Iterator[str]: ...

    def chat_stream(
        self, messages: list[dict[str, str]], *, enable_thinking: bool | None = None, **kwargs: Any
    ) -> Iterator[str]: ...


# -- the model ---------------------------------------------------------------------------------------


def _load_model(model: str | None, dtype: str | None, *, progress: bool) -> _Model:
    """Resolve ``model`` (None, a registry name or a path) and load it."""
    path = hub.resolve_model(model)
    # Imported here: the loader pulls in the whole model stack, which `models` does not need.
    llm = importlib.import_module("pygpukit.llm")
    with warnings.catch_warnings(record=True) as caught:
        loaded: _Model = llm.load(path, dtype=dtype, progress=progress)
    for warning in caught:
        if issubclass(warning.category, BackendFallbackWarning):
            # A note, not a warning with a source line: running on the CPU is a supported mode.
            print(f"pygpukit: {warning.message}", file=sys.stderr, flush=True)
        else:
            warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
    return loaded


def _sampling_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """The keyword arguments of generate_stream/chat_stream from the sampling flags."""
    return {
        "max_new_tokens": args.max_new_tokens,
        "temperature": args.temperature,
        "top_k": args.top_k if args.top_k > 0 else None,  # 0 switches top-k off
        "top_p": args.top_p,
        "min_p": args.min_p,
        "repetition_penalty": args.repetition_penalty,
        "seed": args.seed,
        "stop": list(args.stop) if args.stop else None,
    }


def _stats_line(model: _Model) -> str | None:
    """``ttft 0.123 s, 42 tokens, 35.1 tokens/s (backend cuda, model NAME)``, or None without stats."""
    stats = model.last_stats
    if stats is None:
        return None
    return (
        f"ttft {stats.time_to_first_token_s:.3f} s, {stats.new_tokens} tokens, "
        f"{stats.decode_tokens_per_s:.1f} tokens/s (backend {model.backend}, model {model.config.name})"
    )


def _make_thinking_filter() -> Any | None:
    """A ThinkingFilter that splits <think>...</think> from the answer, or None where unavailable."""
    try:
        chat = importlib.import_module("pygpukit.llm.chat")
    except ModuleNotFoundError as exc:
        if exc.name != "pygpukit.llm.chat":
            raise
        return None
    factory = getattr(chat, "ThinkingFilter", None)
    return None if factory is None else factory()


# -- output ------------------------------------------------------------------------------------------


class _Printer:
    """Writes streamed pieces: the answer to ``out``; thinking dimmed on a terminal, else to ``err``
    behind a ``[thinking]`` prefix, so that redirected output holds the answer alone."""

    def __init__(self, out: TextIO, err: TextIO, *, tty: bool) -> None:
        self.out = out
        self.err = err
        self.tty = tty
        self._in_thinking = False
        self._last = "\n"

    def thinking(self, text: str) -> None:
        if not text:
            return
        if self.tty:
            if not self._in_thinking:
                self.out.write(_DIM)
            self.out.write(text)
            self.out.flush()
            self._last = text[-1]
        else:
            if not self._in_thinking:
                self.err.write("[thinking] ")
            self.err.write(text)
            self.err.flush()
        self._in_thinking = True

    def answer(self, text: str) -> None:
        if not text:
            return
        self._end_thinking()
        self.out.write(text)
        self.out.flush()
        self._last = text[-1]

    def _end_thinking(self) -> None:
        if not self._in_thinking:
            return
        self._in_thinking = False
        if self.tty:
            self.out.write(_RESET)
        else:
            self.err.write("\n")
            self.err.flush()

    def finish(self) -> None:
        """End the reply with exactly one newline."""
        self._end_thinking()
        if self._last != "\n":
            self.out.write("\n")
            self._last = "\n"
        self.out.flush()


def _write_stream(pieces: Iterator[str], printer: _Printer, *, split_thinking: bool) -> str:
    """Print a stream; returns the answer text (thinking excluded). KeyboardInterrupt propagates
    after the stream is closed and the output ended."""
    splitter = _make_thinking_filter() if split_thinking else None
    answer: list[str] = []
    try:
        for piece in pieces:
            if splitter is None:
                thought, said = "", piece
            else:
                thought, said = splitter.push(piece)
            printer.thinking(thought)
            printer.answer(said)
            answer.append(said)
        flush = getattr(splitter, "flush", None)
        if callable(flush):
            thought, said = flush()
            printer.thinking(thought)
            printer.answer(said)
            answer.append(said)
    finally:
        close = getattr(pieces, "close", None)
        if callable(close):
            close()  # stops the generation (and frees its cache) when interrupted
        printer.finish()
    return "".join(answer)


def _report_stats(model: _Model, args: argparse.Namespace) -> None:
    if args.no_stats:
        return
    line = _stats_line(model)
    if line is not None:
        tty = sys.stderr.isatty()
        print(f"{_DIM}{line}{_RESET}" if tty else line, file=sys.stderr, flush=True)


def _printer() -> _Printer:
    return _Printer(sys.stdout, sys.stderr, tty=sys.stdout.isatty())


# -- generate ----------------------------------------------------------------------------------------


def _generate(model: _Model, args: argparse.Namespace) -> str:
    kwargs = _sampling_kwargs(args)
    if args.chat or args.system is not None:
        messages = _initial_messages(args.system)
        messages.append({"role": "user", "content": args.prompt})
        stream = model.chat_stream(messages, **kwargs)
    else:
        stream = model.generate_stream(args.prompt, **kwargs)
    return _write_stream(stream, _printer(), split_thinking=False)


def _cmd_generate(args: argparse.Namespace) -> int:
    model = _load_model(args.model, args.dtype, progress=not args.no_progress)
    profiler = None
    if getattr(args, "profile", None) is not None:  # pygpukit.profiling around the generation
        from pygpukit.profiling import Profiler

        profiler = Profiler().start()
    try:
        _generate(model, args)
    except KeyboardInterrupt:
        _report_stats(model, args)
        _write_profile(profiler, args)
        return 130
    except BaseException:
        if profiler is not None and profiler.recording:
            profiler.stop()  # no trace for a failed run, but the launch hook is removed
        raise
    _report_stats(model, args)
    _write_profile(profiler, args)
    return 0


def _write_profile(profiler: Any, args: argparse.Namespace) -> None:
    """Stop ``profiler`` (when profiling) and write its chrome trace to ``--profile``."""
    if profiler is None:
        return
    profiler.stop()
    path = profiler.export_chrome_trace(args.profile)
    print(f"profile: {len(profiler.ranges)} ranges, {len(profiler.kernels)} kernel launches, "
          f"{len(profiler.memory)} memory snapshots -> {path} (chrome://tracing or ui.perfetto.dev)",
          file=sys.stderr, flush=True)  # fmt: skip


# -- chat --------------------------------------------------------------------------------------------


def _initial_messages(system: str | None) -> list[dict[str, str]]:
    return [] if system is None else [{"role": "system", "content": system}]


def _chat_turn(model: _Model, messages: list[dict[str, str]], args: argparse.Namespace) -> str:
    """Stream the reply to ``messages``; returns the answer (without thinking)."""
    stream = model.chat_stream(messages, enable_thinking=False if args.no_think else None, **_sampling_kwargs(args))
    return _write_stream(stream, _printer(), split_thinking=True)


def _ask(model: _Model, messages: list[dict[str, str]], text: str, args: argparse.Namespace) -> bool:
    """One user turn: appends it and the answer to ``messages``; False when interrupted (the turn
    is then dropped, so a half answer does not steer the rest of the conversation)."""
    messages.append({"role": "user", "content": text})
    try:
        answer = _chat_turn(model, messages, args)
    except KeyboardInterrupt:
        messages.pop()
        print("[interrupted; this turn is not kept]", file=sys.stderr, flush=True)
        return False
    messages.append({"role": "assistant", "content": answer})
    _report_stats(model, args)
    return True


def _repl(model: _Model, args: argparse.Namespace) -> int:
    if sys.stdin.isatty():
        with contextlib.suppress(ImportError):  # not every Python is built with readline
            import readline  # noqa: F401  # line editing and history for input()
    messages = _initial_messages(args.system)
    name = model.config.name
    print(f"pygpukit chat: {name} on {model.backend}. {_REPL_HELP}.", file=sys.stderr, flush=True)
    while True:
        try:
            line = input("> ")
        except EOFError:
            print(file=sys.stdout, flush=True)
            return 0
        except KeyboardInterrupt:
            print(file=sys.stdout, flush=True)  # like a shell: Ctrl-C at the prompt clears the line
            continue
        text = line.strip()
        if not text:
            continue
        if text.startswith("/"):
            command = text.split()[0].lower()
            if command in ("/exit", "/quit"):
                return 0
            if command == "/reset":
                messages = _initial_messages(args.system)
                print("[conversation cleared]", file=sys.stderr, flush=True)
            elif command == "/help":
                print(_REPL_HELP, file=sys.stderr, flush=True)
            else:
                print(f"unknown command {command}; {_REPL_HELP}", file=sys.stderr, flush=True)
            continue
        _ask(model, messages, text, args)


def _cmd_chat(args: argparse.Namespace) -> int:
    model = _load_model(args.model, args.dtype, progress=not args.no_progress)
    if args.once is not None:
        messages = _initial_messages(args.system)
        return 0 if _ask(model, messages, args.once, args) else 130
    return _repl(model, args)


# -- models ------------------------------------------------------------------------------------------


def _cmd_models(args: argparse.Namespace) -> int:
    action = args.action
    if action == "list":
        rows = [("", "NAME", "SIZE", "LICENSE", "CACHED", "DESCRIPTION")]
        for source, path in hub.list_models():
            size = f"{source.size / 1e6:.0f} MB" if source.size else "?"
            mark = "*" if source.name == hub.DEFAULT_MODEL else ""
            rows.append((mark, source.name, size, source.license, str(path) if path else "-", source.description))
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
        for row in rows:
            print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=False)) + "  " + row[-1])
        print(f"(* the default model; cache: {hub.cache_dir() / 'models'})")
        return 0
    if action == "pull":
        print(hub.pull(args.name, force=args.force, progress=not args.quiet))
        return 0
    if action == "path":
        path = hub.model_path(args.name)
        if path is None:
            print(
                f"pygpukit: model {args.name!r} is not in the cache; fetch it with: "
                f"python -m pygpukit models pull {args.name}",
                file=sys.stderr,
            )
            return 1
        print(path)
        return 0
    # verify
    ok = hub.verify(args.name)
    print(f"{'ok' if ok else 'SHA-256 MISMATCH'}: {hub.model_path(args.name) or hub.model_dir(args.name)}")
    return 0 if ok else 1


# -- argument parsing ------------------------------------------------------------------------------


def _add_model_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("model")
    group.add_argument(
        "--model",
        "-m",
        default=None,
        help=f"a model name from 'models list', or a GGUF file or model directory (default: {hub.DEFAULT_MODEL})",
    )
    group.add_argument("--dtype", choices=("float32", "float16", "bfloat16"), default=None, help="compute dtype")
    group.add_argument("--no-progress", action="store_true", help="no progress bar while loading")
    group.add_argument("--no-stats", action="store_true", help="no timing line on stderr after an answer")


def _add_sampling_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("sampling")
    group.add_argument("--max-new-tokens", type=int, default=128, metavar="N", help="default: %(default)s")
    group.add_argument(
        "--temperature", "-t", type=float, default=0.7, metavar="T", help="0 is greedy (default: %(default)s)"
    )
    group.add_argument("--top-k", type=int, default=50, metavar="K", help="0 switches it off (default: %(default)s)")
    group.add_argument("--top-p", type=float, default=0.9, metavar="P", help="default: %(default)s")
    group.add_argument("--min-p", type=float, default=None, metavar="P", help="default: off")
    group.add_argument("--repetition-penalty", type=float, default=None, metavar="R", help="default: off")
    group.add_argument("--seed", type=int, default=None, metavar="S", help="seed of the sampler")
    group.add_argument(
        # Repeated rather than nargs="+", which would swallow a following positional prompt.
        "--stop",
        action="append",
        default=None,
        metavar="STR",
        help="stop at this string (repeat for several)",
    )
    group.add_argument("--system", default=None, metavar="TEXT", help="a system message")


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``chat``, ``generate`` and ``models`` (prog ``pygpukit``)."""
    parser = argparse.ArgumentParser(prog="pygpukit", description="pygpukit LLM command line")
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="continue a prompt, streaming the text to stdout")
    gen.add_argument("prompt", help="the prompt text")
    gen.add_argument("--chat", action="store_true", help="wrap the prompt as a user turn with the chat template")
    gen.add_argument("--profile", default=None, metavar="TRACE.json",
                     help="profile the generation (pygpukit.profiling) and write a chrome trace there")  # fmt: skip
    _add_model_flags(gen)
    _add_sampling_flags(gen)
    gen.set_defaults(handler=_cmd_generate)

    chat = sub.add_parser("chat", help="chat with a model (interactive, or one message with --once)")
    chat.add_argument("--once", default=None, metavar="PROMPT", help="answer this one message and exit")
    chat.add_argument(
        "--no-think", action="store_true", help="ask thinking models (Qwen3) to answer without a thinking part"
    )
    _add_model_flags(chat)
    _add_sampling_flags(chat)
    chat.set_defaults(handler=_cmd_chat)

    models = sub.add_parser("models", help="list, pull, locate and verify cached models")
    actions = models.add_subparsers(dest="action", required=True)
    actions.add_parser("list", help="the known models and whether they are cached")
    pull = actions.add_parser("pull", help="fetch a model into the cache and print its path")
    pull.add_argument("--force", action="store_true", help="fetch again even when cached")
    pull.add_argument("--quiet", "-q", action="store_true", help="no download progress")
    path = actions.add_parser("path", help="print the path of a cached model (exit status 1 when not cached)")
    verify = actions.add_parser("verify", help="re-check the SHA-256 of a cached model")
    for action_parser in (pull, path, verify):
        action_parser.add_argument("name", nargs="?", default=hub.DEFAULT_MODEL, help="default: %(default)s")
    models.set_defaults(handler=_cmd_models)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns the exit status (1 for a pygpukit error, 130 when interrupted)."""
    args = build_parser().parse_args(argv)
    try:
        status: int = args.handler(args)
    except PyGPUkitError as exc:
        print(f"pygpukit: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130
    return status


if __name__ == "__main__":
    sys.exit(main())
