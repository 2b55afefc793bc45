"""pygpukit.asr: speech recognition (Whisper) on pygpukit (from the pygpukit-audio distribution).

``WhisperModel.from_pretrained()`` loads Whisper tiny.en (fetched into the cache on first use), a CTranslate2
directory or a transformers safetensors checkpoint; ``transcribe(model, audio_or_path)`` returns a
:class:`TranscriptionResult` with timestamped segments (docs/asr.md). ``python -m pygpukit transcribe FILE``
is the command line.
"""

from __future__ import annotations

try:
    from pygpukit._distributions import check_siblings, distribution_version
except ImportError as exc:  # pygpukit-core (which owns pygpukit/__init__.py) is missing
    raise ImportError(
        "pygpukit-audio needs the pygpukit-core distribution, which is not installed: pip install pygpukit-core"
    ) from exc

check_siblings("pygpukit-audio", required=("pygpukit-core", "pygpukit-ops"))

from .batch import transcribe_batch  # noqa: E402
from .ct2 import ModelFormatError, read_model_bin  # noqa: E402
from .features import log_mel_batch, log_mel_spectrogram, whisper_features  # noqa: E402
from .hub import DEFAULT_MODEL, ModelDownloadError, ModelNotFoundError  # noqa: E402
from .longform import Segment, TranscriptionResult, detect_language, load_audio, transcribe  # noqa: E402
from .model import WhisperModel  # noqa: E402
from .streaming import StreamingTranscriber, StreamSegment, transcribe_streaming  # noqa: E402
from .tokenizer import TokenizerError, WhisperTokenizer  # noqa: E402
from .weights import WhisperConfig  # noqa: E402
from .words import Word  # noqa: E402

__version__ = distribution_version("pygpukit-audio") or "0+unknown"

__all__ = [
    "DEFAULT_MODEL",
    "ModelDownloadError",
    "ModelFormatError",
    "ModelNotFoundError",
    "Segment",
    "StreamSegment",
    "StreamingTranscriber",
    "TokenizerError",
    "TranscriptionResult",
    "WhisperConfig",
    "WhisperModel",
    "WhisperTokenizer",
    "Word",
    "__version__",
    "detect_language",
    "load_audio",
    "log_mel_batch",
    "log_mel_spectrogram",
    "read_model_bin",
    "transcribe",
    "transcribe_batch",
    "transcribe_streaming",
    "whisper_features",
]
