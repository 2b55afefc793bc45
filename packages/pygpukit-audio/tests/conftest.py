"""Shared fixtures of the pygpukit-audio tests: the real recordings (pygpukit.audio.testdata, fetched into the
cache on first use; tests that use them carry the ``audio_data`` marker) and random signals."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# CI sets this (nox's tests session): missing test data fails instead of skipping, as for the real models.
REQUIRE_ENV = "PYGPUKIT_REQUIRE_MODELS"


def _files(name: str) -> list[Path]:
    from pygpukit.audio import testdata

    try:
        return testdata.wav_files(name)
    except testdata.TestDataError as exc:
        reason = f"audio test data {name} unavailable: {exc}"
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(reason)
        pytest.skip(reason)


@pytest.fixture(scope="session")
def speech_16k() -> list[Path]:
    """pocketsphinx-testdata's 16 kHz read speech."""
    return _files("pocketsphinx-testdata")


@pytest.fixture(scope="session")
def speech_8k() -> list[Path]:
    """asterisk-core-sounds-en-wav's 8 kHz prompts."""
    return _files("asterisk-core-sounds-en-wav")


@pytest.fixture(scope="session")
def music_8k() -> list[Path]:
    """asterisk-moh-opsound-wav's 8 kHz music."""
    return _files("asterisk-moh-opsound-wav")


@pytest.fixture(scope="session")
def whisper_tiny() -> Path:
    """The Whisper tiny.en CTranslate2 directory of pygpukit.asr.hub (fetched into the cache on first use)."""
    from pygpukit.asr import hub

    try:
        return hub.pull(progress=False)
    except hub.ModelDownloadError as exc:
        reason = f"Whisper tiny.en unavailable: {exc}"
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(reason)
        pytest.skip(reason)
