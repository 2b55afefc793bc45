"""The finiteness checks of pygpukit.audio (pygpukit/audio/_finite.py): NumPy inputs raise in the call, device
arrays in "deferred" mode raise from a later checked call or check_pending, in "sync" mode in the call."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

import pygpukit.audio as audio
from pygpukit.audio import _finite
from pygpukit.core.array import from_numpy
from pygpukit.core.errors import ArgumentError


@pytest.fixture
def deferred_on_cpu(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The deferred bookkeeping on whatever backend runs (on the CPU the count is added on the host)."""
    monkeypatch.setattr(_finite, "device_path_on_cpu", True)
    audio.set_finite_check("deferred")
    audio.check_pending()
    yield
    _finite._pending.clear()


def _signal(bad: bool = False) -> np.ndarray[Any, Any]:
    y = np.random.default_rng().standard_normal((2, 4000))
    if bad:
        y[1, 123] = np.nan
        y[0, 7] = np.inf
    return y


def _raised_late(call: Callable[[], object], pattern: str) -> None:
    """``call`` raises the deferred error matching ``pattern`` when the earlier check is done (always on the
    CPU backend); otherwise check_pending, which waits for it, does."""
    message = ""
    try:
        call()
    except ArgumentError as error:
        message = str(error)
    if message:
        assert re.search(pattern, message), message
        assert "deferred device check" in message
        return
    with pytest.raises(ArgumentError, match=pattern):
        audio.check_pending()


def test_numpy_input_raises_in_the_call_in_every_mode(deferred_on_cpu: None) -> None:
    for mode in _finite.MODES:
        audio.set_finite_check(mode)
        with pytest.raises(ArgumentError, match=r"stft: y holds 2 non-finite"):
            audio.stft(_signal(bad=True), n_fft=256)
        with pytest.raises(ArgumentError, match=r"resample: y holds 2 non-finite"):
            audio.resample(_signal(bad=True), orig_sr=16000, target_sr=8000)
    audio.set_finite_check("deferred")
    audio.check_pending()  # nothing was deferred


def test_device_input_raises_later_in_deferred_mode(deferred_on_cpu: None) -> None:
    bad = from_numpy(_signal(bad=True))
    spec = audio.stft(bad, n_fft=256)  # no error yet: the check is in flight
    assert spec.shape[:2] == (2, 129)
    _raised_late(lambda: audio.stft(from_numpy(_signal()), n_fft=256), r"stft: y holds 2 non-finite")
    audio.check_pending()  # the later call's own check: finite
    audio.stft(bad, n_fft=256)
    with pytest.raises(ArgumentError, match=r"stft: y holds 2 non-finite"):
        audio.check_pending()
    audio.check_pending()  # consumed once


def test_many_checks_in_flight_and_counts_in_order(deferred_on_cpu: None) -> None:
    good = from_numpy(_signal())
    for _ in range(3 * 64 + 5):  # more than the slots: the oldest are consumed on the way
        audio.resample(good, orig_sr=16000, target_sr=8000)
    one_bad = _signal()
    one_bad[0, 0] = np.nan
    audio.resample(from_numpy(one_bad), orig_sr=16000, target_sr=8000)
    _raised_late(lambda: audio.resample(good, orig_sr=16000, target_sr=8000), r"resample: y holds 1 non-finite")
    audio.check_pending()


def test_sync_mode_raises_in_the_call(deferred_on_cpu: None) -> None:
    audio.set_finite_check("sync")
    try:
        assert audio.finite_check_mode() == "sync"
        with pytest.raises(ArgumentError, match=r"stft: y holds 2 non-finite value\(s\) \(NaN or infinity\); audio"):
            audio.stft(from_numpy(_signal(bad=True)), n_fft=256)
    finally:
        audio.set_finite_check("deferred")
    with pytest.raises(ArgumentError, match="mode must be 'deferred' or 'sync'"):
        audio.set_finite_check("off")


def test_host_count_is_exact_where_the_sum_overflows() -> None:
    big = np.full(10, 1e308)
    assert _finite._host_count(big) == 0
    big[3] = -np.inf
    assert _finite._host_count(big) == 1
    assert _finite._host_count(np.zeros(0)) == 0
    assert _finite._host_count(np.array([np.nan, 1.0, np.inf], np.float32)) == 2


@pytest.mark.gpu
def test_deferred_and_sync_checks_on_the_device() -> None:
    audio.check_pending()
    bad = from_numpy(_signal(bad=True).astype(np.float32))
    good = from_numpy(_signal().astype(np.float32))
    audio.stft(bad, n_fft=400, hop_length=160)
    with pytest.raises(ArgumentError, match=r"stft: y holds 2 non-finite"):
        audio.check_pending()
    for _ in range(100):
        audio.melspectrogram(y=good, sr=16000, n_fft=400, hop_length=160, n_mels=80)
    audio.check_pending()
    audio.set_finite_check("sync")
    try:
        with pytest.raises(ArgumentError, match=r"resample: y holds 2 non-finite"):
            audio.resample(bad, orig_sr=44100, target_sr=16000)
    finally:
        audio.set_finite_check("deferred")
    audio.istft(audio.stft(good, n_fft=512), n_fft=512)
    audio.check_pending()
