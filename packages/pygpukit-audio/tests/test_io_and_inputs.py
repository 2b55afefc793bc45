"""Audio I/O through soundfile (WAV, FLAC, OGG round trips, offsets, channels, AudioBuffer), the test-data fetcher's
archive handling, the host tables (windows, DCT, Savitzky-Golay, fast lengths against scipy), the kernel sources
(every listed entry point compiles with NVRTC), and typed errors for bad input."""

from __future__ import annotations

import hashlib
import io
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import pygpukit.audio as audio
from pygpukit.audio import _kernels, filters, testdata
from pygpukit.core.errors import ArgumentError, DTypeError, ShapeError

sf = pytest.importorskip("soundfile")


def _tone(channels: int, frames: int, rate: int) -> np.ndarray[Any, Any]:
    t = np.arange(frames) / rate
    return np.stack([0.5 * np.sin(2 * np.pi * (220 + 110 * c) * t) for c in range(channels)])


FORMATS = [("wav", "FLOAT", 0.0), ("wav", "PCM_16", 1 / 32768), ("flac", "PCM_24", 1 / 2**23), ("ogg", "VORBIS", 0.05)]


@pytest.mark.parametrize(("ext", "subtype", "tol"), FORMATS)
def test_save_and_load_round_trip(tmp_path: Path, ext: str, subtype: str, tol: float) -> None:
    y = _tone(2, 8000, 16000)
    path = tmp_path / f"tone.{ext}"
    audio.save(path, y, 16000, subtype=subtype)
    stereo, rate = audio.load(path, mono=False)
    assert rate == 16000
    assert stereo.shape == (2, 8000)
    assert stereo.dtype.name == "float32"
    assert np.abs(stereo.to_numpy() - y).max() <= tol + 1e-6
    mono, _ = audio.load(path, dtype="float64")
    np.testing.assert_allclose(mono.to_numpy(), stereo.to_numpy().astype(np.float64).mean(axis=0), atol=1e-6)
    part, _ = audio.load(path, offset=0.25, duration=0.125)
    assert part.shape == (2000,)


def test_audio_buffer(tmp_path: Path) -> None:
    buffer = audio.AudioBuffer(_tone(2, 4000, 8000).astype(np.float32), 8000)
    assert (buffer.channels, buffer.frames, buffer.duration) == (2, 4000, 0.5)
    mono = buffer.to_mono()
    assert mono.channels == 1
    with pytest.raises(ShapeError, match="needs mono audio"):
        buffer.require_mono("pitch tracking")
    assert mono.require_mono("pitch tracking").shape == (4000,)
    loud = mono.normalize(0.9)
    assert np.isclose(np.abs(loud.to_numpy()).max(), 0.9, atol=1e-6)
    silent = audio.AudioBuffer(np.zeros(10, np.float32), 8000).normalize()
    assert np.all(silent.to_numpy() == 0)
    path = tmp_path / "b.wav"
    buffer.save(path, subtype="FLOAT")
    again = audio.AudioBuffer.load(path)
    np.testing.assert_allclose(again.to_numpy(), buffer.to_numpy(), atol=1e-7)


def test_bad_files_raise_audio_file_error(tmp_path: Path) -> None:
    with pytest.raises(audio.AudioFileError, match="no such audio file"):
        audio.load(tmp_path / "missing.wav")
    junk = tmp_path / "junk.wav"
    junk.write_bytes(b"RIFF\x10\x00\x00\x00WAVEnot really a wave file")
    with pytest.raises(audio.AudioFileError, match="cannot decode"):
        audio.load(junk)
    good = tmp_path / "good.wav"
    audio.save(good, _tone(1, 4000, 8000)[0], 8000)
    truncated = tmp_path / "truncated.flac"
    audio.save(truncated, _tone(1, 40000, 8000)[0], 8000)
    truncated.write_bytes(truncated.read_bytes()[:2000])
    with pytest.raises(audio.AudioFileError):
        audio.load(truncated)
    with pytest.raises(ArgumentError, match="past the end"):
        audio.load(good, offset=10.0)
    with pytest.raises(audio.AudioFileError, match="cannot write"):
        audio.save(tmp_path / "x.unknown-extension", np.zeros(10, np.float32), 8000)
    with pytest.raises(ShapeError, match=r"\(T,\) or \(channels, T\)"):
        audio.save(tmp_path / "y.wav", np.zeros((1, 2, 3), np.float32), 8000)


def test_bad_signals_raise_typed_errors() -> None:
    y = np.random.default_rng().standard_normal((2, 4000))
    bad = y.copy()
    bad[0, 5] = np.inf
    with pytest.raises(ArgumentError, match="non-finite"):
        audio.stft(bad)
    with pytest.raises(ArgumentError, match="non-finite"):
        audio.melspectrogram(bad, sr=16000)
    with pytest.raises(ShapeError, match="empty"):
        audio.stft(np.zeros((2, 0)))
    with pytest.raises(ShapeError, match="too large"):
        audio.stft(y[:, :100], n_fft=512, center=False)
    with pytest.raises(ArgumentError, match="sr must be > 0"):
        audio.melspectrogram(y, sr=0)
    with pytest.raises(ArgumentError, match="sr must be a real number"):
        audio.spectral_centroid(y, sr="16k")
    with pytest.raises(ArgumentError, match="pad_mode"):
        audio.stft(y, pad_mode="wrap")
    with pytest.raises(ArgumentError, match="win_length"):
        audio.stft(y, n_fft=256, win_length=512)
    with pytest.raises(DTypeError, match="float32 or float64"):
        audio.stft(y.astype(np.int16))
    with pytest.raises(ArgumentError, match="non-negative"):
        audio.spectral_centroid(S=-np.abs(y[:, :257].reshape(2, 257, 1)))
    with pytest.raises(ArgumentError, match="odd"):
        audio.delta(y, width=4)
    with pytest.raises(ShapeError, match="cannot exceed"):
        audio.delta(y[:, :5], width=9)
    with pytest.raises(ArgumentError, match="top_db"):
        audio.power_to_db(np.abs(y), top_db=-1.0)
    with pytest.raises(ArgumentError, match="dct_type"):
        audio.mfcc(y, sr=16000, dct_type=3)
    with pytest.raises(ShapeError, match="frequencies"):
        audio.istft(audio.stft(y, n_fft=256), n_fft=512)


def test_host_tables_match_scipy() -> None:
    signal = pytest.importorskip("scipy.signal")
    scipy_fft = pytest.importorskip("scipy.fft")
    for name in ("hann", "hamming", "blackman", "bartlett", "boxcar"):
        for length in (1, 2, 7, 400, 512):
            np.testing.assert_allclose(filters.get_window(name, length), signal.get_window(name, length, fftbins=True),
                                       rtol=0, atol=1e-15)  # fmt: skip
    x = np.random.default_rng().standard_normal((40, 7))
    for norm in ("ortho", None):
        np.testing.assert_allclose(filters.dct(13, 40, norm=norm) @ x,
                                   scipy_fft.dct(x, type=2, norm=norm, axis=0)[:13], rtol=0, atol=1e-12)  # fmt: skip
    data = np.random.default_rng().standard_normal(30)
    for width, order in ((9, 1), (5, 2), (7, 3)):
        coefs = filters.savgol_coefficients(width, order)
        want = signal.savgol_filter(data, width, order, deriv=order, mode="interp")
        half = width // 2
        got = np.empty(30)
        got[half:-half] = np.lib.stride_tricks.sliding_window_view(data, width) @ coefs[0]
        got[:half] = data[:width] @ coefs[1 : 1 + half].T
        got[-half:] = data[-width:] @ coefs[1 + half :].T
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-10)
    for target in (1, 2, 7, 97, 1000, 4097, 123457):
        assert filters.next_fast_len(target) == scipy_fft.next_fast_len(target, real=True)


def _deb(members: dict[str, bytes]) -> bytes:
    payload = io.BytesIO()
    with tarfile.open(fileobj=payload, mode="w:xz") as archive:
        for name, content in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(content)
            archive.addfile(info, io.BytesIO(content))
    parts = [(b"debian-binary", b"2.0\n"), (b"data.tar.xz", payload.getvalue())]
    out = b"!<arch>\n"
    for name, content in parts:
        header = name.ljust(16) + b"0".ljust(12) + b"0".ljust(6) + b"0".ljust(6) + b"100644".ljust(8)
        out += header + str(len(content)).encode().ljust(10) + b"`\n" + content + (b"\n" if len(content) % 2 else b"")
    return out


def test_testdata_extracts_only_wavs_and_checks_the_digest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    deb = _deb({"./usr/share/sounds/a.wav": b"RIFFa", "./usr/share/doc/readme": b"x", "./usr/share/s/b/c.wav": b"c"})
    assert testdata._extract_wavs(deb, tmp_path / "out") == 2
    assert (tmp_path / "out" / "sounds" / "a.wav").read_bytes() == b"RIFFa"
    with pytest.raises(testdata.TestDataError, match="ar header"):
        testdata._ar_members(b"not a deb")

    package = testdata.DebPackage("fake-pkg", "1.0", hashlib.sha256(deb).hexdigest(), len(deb))
    monkeypatch.setitem(testdata.PACKAGES, "fake-pkg", package)
    monkeypatch.setenv("PYGPUKIT_CACHE_DIR", str(tmp_path / "cache"))

    def fake_download(p: testdata.DebPackage, scratch: Path) -> Path:
        path = scratch / f"{p.name}_{p.version}_all.deb"
        path.write_bytes(deb)
        return path

    monkeypatch.setattr(testdata, "_download", fake_download)
    assert sorted(f.name for f in testdata.wav_files("fake-pkg")) == ["a.wav", "c.wav"]
    monkeypatch.setitem(testdata.PACKAGES, "fake-pkg", testdata.DebPackage("fake-pkg", "1.0", "0" * 64, len(deb)))
    with pytest.raises(testdata.TestDataError, match="does not match the pinned"):
        testdata.fetch("fake-pkg")
    with pytest.raises(testdata.TestDataError, match="unknown test-data package"):
        testdata.fetch("no-such-package")


def test_testdata_fetches_once_when_processes_share_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Fetchers that start together (the test workers of one CI run) take turns on the lock file: one
    downloads, the others find its stamp, and nobody replaces the folder another has returned."""
    import threading
    import time

    deb = _deb({"./usr/share/sounds/a.wav": b"RIFFa"})
    package = testdata.DebPackage("fake-pkg", "1.0", hashlib.sha256(deb).hexdigest(), len(deb))
    monkeypatch.setitem(testdata.PACKAGES, "fake-pkg", package)
    monkeypatch.setenv("PYGPUKIT_CACHE_DIR", str(tmp_path / "cache"))
    downloads = []

    def slow_download(p: testdata.DebPackage, scratch: Path) -> Path:
        downloads.append(p.name)
        time.sleep(0.3)
        path = scratch / f"{p.name}_{p.version}_all.deb"
        path.write_bytes(deb)
        return path

    monkeypatch.setattr(testdata, "_download", slow_download)
    found: list[Path] = []
    threads = [threading.Thread(target=lambda: found.append(testdata.fetch("fake-pkg"))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert downloads == ["fake-pkg"]
    assert len(found) == 3
    assert all((f / "sounds" / "a.wav").read_bytes() == b"RIFFa" for f in found)


def test_codes_parse_from_the_header() -> None:
    assert _kernels.enum_values("FftLoad")["kLoadComplex"] == 0
    assert set(_kernels.enum_values("PadMode")) == {"kPadConstant", "kPadReflect", "kPadEdge", "kPadSymmetric",
                                                    "kPadWrap"}  # fmt: skip


@pytest.mark.nvrtc
@pytest.mark.parametrize("file", sorted(_kernels.FILES))
def test_every_listed_entry_point_compiles(file: str) -> None:
    from pygpukit.core.compiler import compile_source

    names = [f"{n}_{s}" for n in _kernels.FILES[file] for s in ("f32", "f64")]
    program = compile_source(_kernels.SOURCES.source(file), arch=80, name=file, name_expressions=names,
                             include_dirs=_kernels.SOURCES.include_dirs(file))  # fmt: skip
    assert set(program.lowered_names) >= set(names)
