"""Fetch the Debian packages of real recordings the pygpukit-audio tests compare against librosa with
(pocketsphinx-testdata, asterisk-core-sounds-en-wav, asterisk-moh-opsound-wav) into pygpukit's cache:
``python ci/fetch_audio_testdata.py [package ...]``. The tests fetch them on first use too
(pygpukit.audio.testdata); this script does it ahead, for example before an offline run."""

from __future__ import annotations

import sys

from pygpukit.audio.testdata import main

if __name__ == "__main__":
    sys.exit(main())
