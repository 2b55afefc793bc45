"""Command line: ``python -m pygpukit info [--json]``, and ``chat``, ``generate``, ``models``, ``transcribe``.

``chat``, ``generate`` and ``models`` belong to the pygpukit-llm distribution: they are handed to
``pygpukit.llm.cli`` when it is installed. pygpukit-core does not depend on it, so without it those
commands exit with status 2 and say what to install. ``transcribe`` belongs to pygpukit-audio
(``pygpukit.asr.cli``) in the same way.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import warnings
from collections.abc import Sequence

from .core import _install
from .core.errors import PyGPUkitError

__all__ = ["main"]

# command -> help; run by pygpukit.llm.cli (the pygpukit-llm distribution)
_LLM_COMMANDS: dict[str, str] = {
    "chat": "chat with a language model (pygpukit-llm)",
    "generate": "continue a prompt with a language model (pygpukit-llm)",
    "models": "list, pull and verify cached models (pygpukit-llm)",
}


def _run_llm_command(argv: list[str]) -> int:
    try:
        cli = importlib.import_module("pygpukit.llm.cli")
    except ModuleNotFoundError as exc:
        if exc.name not in ("pygpukit.llm", "pygpukit.llm.cli"):
            if isinstance(exc, PyGPUkitError):  # e.g. a sibling that pygpukit-llm needs is missing
                print(f"pygpukit: error: {exc}", file=sys.stderr)
                return 2
            raise  # a third-party dependency is missing: Python's own message names it
        print(
            f"pygpukit {argv[0]}: this command needs the pygpukit-llm distribution, which is not installed: "
            f"{_install.install_hint('pygpukit-llm')}",
            file=sys.stderr,
        )
        return 2
    except PyGPUkitError as exc:  # installed, but unusable (mismatched sibling versions)
        print(f"pygpukit: error: {exc}", file=sys.stderr)
        return 2
    status: int = cli.main(argv)
    return status


# command -> help; run by pygpukit.asr.cli or pygpukit.tts.cli (speak) of the pygpukit-audio distribution
_AUDIO_COMMANDS: dict[str, str] = {"transcribe": "speech to text with Whisper (pygpukit-audio)",
                                   "speak": "text to speech with Kokoro (pygpukit-audio)"}  # fmt: skip


def _run_audio_command(argv: list[str]) -> int:
    try:
        module = "pygpukit.tts.cli" if argv[0] == "speak" else "pygpukit.asr.cli"
        cli = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name not in (module.rsplit(".", 1)[0], module):
            raise
        print(f"pygpukit {argv[0]}: this command needs the pygpukit-audio distribution, which is not installed: "
              f"{_install.install_hint('pygpukit-audio')}", file=sys.stderr)  # fmt: skip
        return 2
    except PyGPUkitError as exc:
        print(f"pygpukit: error: {exc}", file=sys.stderr)
        return 2
    status: int = cli.main(argv)
    return status


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list and args_list[0] in _AUDIO_COMMANDS:
        return _run_audio_command(args_list)
    # The LLM commands parse their own arguments; importing pygpukit.llm only for them keeps `info`
    # fast and independent of the optional distribution.
    if args_list and args_list[0] in _LLM_COMMANDS:
        return _run_llm_command(args_list)

    parser = argparse.ArgumentParser(prog="pygpukit", description="pygpukit command line")
    sub = parser.add_subparsers(dest="command", required=True)
    info_parser = sub.add_parser("info", help="report backend, driver, devices, NVRTC, cuBLASLt and versions")
    info_parser.add_argument("--json", action="store_true", help="print the report as JSON")
    for name, text in {**_LLM_COMMANDS, **_AUDIO_COMMANDS}.items():
        sub.add_parser(name, help=text, add_help=False)  # listed in --help; handled above
    args = parser.parse_args(args_list)

    from .core.backend import BackendFallbackWarning
    from .info import collect_info, format_info

    with warnings.catch_warnings():
        # The report states the backend and the reason itself.
        warnings.simplefilter("ignore", BackendFallbackWarning)
        report = collect_info()
    print(json.dumps(report, indent=2) if args.json else format_info(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
