"""pygpukit.tts: speech synthesis (Kokoro) on pygpukit (from the pygpukit-audio distribution).

So far (docs/tts.md): fetching the model (:func:`fetch`), reading its int8 ONNX file into float weights
(:func:`read_onnx`, needs the ``onnx`` package), and the model's duration and F0 / N predictors
(:class:`KokoroDurations`, :class:`KokoroProsody`, :func:`expand`) text encoder
(:class:`KokoroTextEncoder`), decoder front (:class:`KokoroDecoderFront`) and generator
(:class:`KokoroGenerator`), and :class:`KokoroModel` (``from_pretrained``, ``synthesize``, ``generate_stream``)."""

from __future__ import annotations

try:
    from pygpukit._distributions import check_siblings, distribution_version
except ImportError as exc:  # pygpukit-core (which owns pygpukit/__init__.py) is missing
    raise ImportError(
        "pygpukit-audio needs the pygpukit-core distribution, which is not installed: pip install pygpukit-core"
    ) from exc

check_siblings("pygpukit-audio", required=("pygpukit-core", "pygpukit-ops"))

from .errors import KokoroDownloadError, KokoroModelError  # noqa: E402
from .fetch import fetch, model_dir  # noqa: E402
from .kokoro_decoder import KokoroDecoderFront  # noqa: E402
from .kokoro_durations import DurationOutput, KokoroDurations  # noqa: E402
from .kokoro_generator import SAMPLE_RATE, KokoroGenerator  # noqa: E402
from .kokoro_model import KokoroModel, split_sentences  # noqa: E402
from .kokoro_prosody import KokoroProsody, expand  # noqa: E402
from .kokoro_text import KokoroTextEncoder  # noqa: E402
from .onnx_reader import KokoroOnnx, LstmWeights, read_onnx  # noqa: E402

__version__ = distribution_version("pygpukit-audio") or "0+unknown"

__all__ = [
    "SAMPLE_RATE",
    "DurationOutput",
    "KokoroDecoderFront",
    "KokoroDownloadError",
    "KokoroDurations",
    "KokoroGenerator",
    "KokoroModel",
    "KokoroModelError",
    "KokoroOnnx",
    "KokoroProsody",
    "KokoroTextEncoder",
    "LstmWeights",
    "__version__",
    "expand",
    "fetch",
    "model_dir",
    "read_onnx",
    "split_sentences",
]
