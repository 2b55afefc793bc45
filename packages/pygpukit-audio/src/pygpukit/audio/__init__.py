"""pygpukit.audio: GPU audio DSP (from the pygpukit-audio distribution).

Signal processing that gives librosa's results on batches of signals: FFTs of its own (``fft``, ``ifft``,
``rfft``, ``irfft``, numpy.fft's semantics), STFT and ISTFT, mel filterbanks and spectrograms, MFCC and
deltas, decibel scaling, spectral features, pre-emphasis, and audio file I/O through soundfile
(docs/audio.md). Complex arrays are float32/float64 GPUArrays with a trailing dimension of 2 (real,
imaginary). On the CPU simulation backend the same functions run with NumPy.
"""

from __future__ import annotations

try:
    from pygpukit._distributions import check_siblings, distribution_version
except ImportError as exc:  # pygpukit-core (which owns pygpukit/__init__.py) is missing
    raise ImportError(
        "pygpukit-audio needs the pygpukit-core distribution, which is not installed: pip install pygpukit-core"
    ) from exc

check_siblings("pygpukit-audio", required=("pygpukit-core", "pygpukit-ops"))

from . import (  # noqa: E402
    constantq,
    decompose,
    dynamics,
    effects,
    features,
    filters,
    io,
    music,
    onset,
    phase,
    pitch,
    resampling,
    spectral,
    streaming,
    vad,
)
from . import fft as _fft  # noqa: E402
from ._finite import check_pending, finite_check_mode, set_finite_check  # noqa: E402
from ._kernels import precompile  # noqa: E402
from .constantq import *  # noqa: E402,F403
from .decompose import *  # noqa: E402,F403
from .dynamics import *  # noqa: E402,F403
from .effects import *  # noqa: E402,F403
from .features import *  # noqa: E402,F403
from .fft import *  # noqa: E402,F403
from .io import *  # noqa: E402,F403
from .music import *  # noqa: E402,F403
from .onset import *  # noqa: E402,F403
from .phase import *  # noqa: E402,F403
from .pitch import *  # noqa: E402,F403
from .resampling import *  # noqa: E402,F403
from .spectral import *  # noqa: E402,F403
from .streaming import *  # noqa: E402,F403
from .vad import *  # noqa: E402,F403

__version__ = distribution_version("pygpukit-audio") or "0+unknown"

__all__ = [
    "__version__",
    "constantq",
    "decompose",
    "effects",
    "features",
    "filters",
    "io",
    "music",
    "phase",
    "check_pending",
    "finite_check_mode",
    "precompile",
    "set_finite_check",
    "resampling",
    "spectral",
    "streaming",
    "vad",
    *_fft.__all__,
    "dynamics",
    "onset",
    "pitch",
    *dynamics.__all__,
    *onset.__all__,
    *pitch.__all__,
    *constantq.__all__,
    *decompose.__all__,
    *effects.__all__,
    *features.__all__,
    *io.__all__,
    *music.__all__,
    *phase.__all__,
    *resampling.__all__,
    *spectral.__all__,
    *streaming.__all__,
    *vad.__all__,
]
