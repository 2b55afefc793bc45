"""Real recordings for the tests: WAV files from three Debian packages, fetched on request into the cache.

- ``pocketsphinx-testdata``: read English speech, 16 kHz mono (``usr/share/pocketsphinx/test/data``);
- ``asterisk-core-sounds-en-wav``: telephone prompts, 8 kHz mono (``usr/share/asterisk/sounds``);
- ``asterisk-moh-opsound-wav``: music on hold, 8 kHz mono (``usr/share/asterisk/moh``).

``fetch(name)`` downloads the exact pinned version of the package with the system's package client
(``apt-get download name=version``, after one ``apt-get update`` when the package lists lack it and this is
root), checks the SHA-256 of the .deb against the pinned one, and extracts its WAV files into
``<cache>/audio-testdata/<name>/`` (``<cache>`` is ``$PYGPUKIT_CACHE_DIR``, else ``$XDG_CACHE_HOME/pygpukit``,
else ``~/.cache/pygpukit``). Nothing is fetched at import time. ``python -m pygpukit.audio.testdata`` (or
ci/fetch_audio_testdata.py) fetches all three.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from pygpukit.core.errors import PyGPUkitError

__all__ = ["PACKAGES", "TestDataError", "cache_dir", "fetch", "wav_files"]


class TestDataError(PyGPUkitError):
    """A test-data package could not be fetched, verified or extracted."""

    __test__ = False  # not a pytest test class


@dataclass(frozen=True)
class DebPackage:
    name: str
    version: str
    sha256: str
    size: int


PACKAGES = {
    p.name: p
    for p in (
        DebPackage("pocketsphinx-testdata", "0.8+5prealpha+1-15",
                   "eaeb7a01d54f20b799d1a81ef110ec544b2cb47ea006614078220737a33019f0", 1822580),
        DebPackage("asterisk-core-sounds-en-wav", "1.6.1-1",
                   "2be3ea287d83299d143815fa804f11179a75b7affd4a758b98b55f5afc18a35d", 18272864),
        DebPackage("asterisk-moh-opsound-wav", "2.03-1.1",
                   "8f9d808a729d305c2d3343993f21ca5e6829e411682618dc8ea7aa8bc24a566c", 13969212),
    )
}  # fmt: skip
_STAMP = ".complete"


def cache_dir() -> Path:
    """Where the extracted packages live (not created here)."""
    explicit = os.environ.get("PYGPUKIT_CACHE_DIR")
    if explicit:
        root = Path(explicit).expanduser()
    elif os.environ.get("XDG_CACHE_HOME"):
        root = Path(os.environ["XDG_CACHE_HOME"]).expanduser() / "pygpukit"
    else:
        root = Path.home() / ".cache" / "pygpukit"
    return root / "audio-testdata"


def _package(name: str) -> DebPackage:
    found = PACKAGES.get(name)
    if found is None:
        raise TestDataError(f"unknown test-data package {name!r}; known: {', '.join(PACKAGES)}")
    return found


def wav_files(name: str) -> list[Path]:
    """The extracted WAV files of package ``name`` (fetched first when missing), sorted."""
    folder = fetch(name)
    return sorted(folder.rglob("*.wav"))


def fetch(name: str) -> Path:
    """The folder holding package ``name``'s WAV files, downloading and extracting it when it is not there yet.
    Processes sharing the cache take turns (a lock file next to the folder): one downloads, the others then
    find its stamp, and none replaces a folder another is reading from."""
    package = _package(name)
    folder = cache_dir() / package.name
    stamp = folder / _STAMP
    if stamp.is_file() and stamp.read_text().strip() == package.sha256:
        return folder
    with _exclusive(folder.parent / f".{package.name}.lock"):
        if stamp.is_file() and stamp.read_text().strip() == package.sha256:
            return folder  # another process fetched it meanwhile
        return _fetch_into(package, folder)


@contextlib.contextmanager
def _exclusive(lock: Path) -> Iterator[None]:
    """An exclusive advisory lock on ``lock`` (created if missing) for the block (POSIX; elsewhere none)."""
    _ensure(lock.parent)
    with open(lock, "a") as handle:
        try:
            import fcntl
        except ImportError:  # not POSIX: no other process to wait for is assumed
            yield
            return
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _fetch_into(package: DebPackage, folder: Path) -> Path:
    with tempfile.TemporaryDirectory(prefix="pygpukit-testdata-") as scratch:
        deb = _download(package, Path(scratch))
        data = deb.read_bytes()
        digest = hashlib.sha256(data).hexdigest()
        if digest != package.sha256:
            raise TestDataError(f"{deb.name}: SHA-256 {digest} does not match the pinned {package.sha256}")
        staging = Path(tempfile.mkdtemp(prefix=f".{package.name}-", dir=_ensure(folder.parent)))
        try:
            count = _extract_wavs(data, staging)
            if count == 0:
                raise TestDataError(f"{deb.name} holds no WAV files")
            (staging / _STAMP).write_text(package.sha256 + "\n")
            if folder.exists():
                shutil.rmtree(folder)
            staging.rename(folder)
        finally:
            if staging.exists():
                shutil.rmtree(staging, ignore_errors=True)
    return folder


def _ensure(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def _download(package: DebPackage, scratch: Path) -> Path:
    """The pinned .deb, downloaded into ``scratch`` by ``apt-get download``."""
    if shutil.which("apt-get") is None:
        raise TestDataError(f"fetching {package.name} needs apt-get (a Debian or Ubuntu system); put the WAV "
                            f"files under {cache_dir() / package.name} by hand otherwise")  # fmt: skip
    spec = f"{package.name}={package.version}"
    command = ["apt-get", "download", spec]
    result = subprocess.run(command, cwd=scratch, capture_output=True, text=True, check=False)
    if result.returncode != 0 and hasattr(os, "geteuid") and os.geteuid() == 0:
        # Fresh machines have empty package lists: read them once and try again.
        subprocess.run(["apt-get", "update"], capture_output=True, text=True, check=False)
        result = subprocess.run(command, cwd=scratch, capture_output=True, text=True, check=False)
    debs = sorted(scratch.glob(f"{package.name}_*.deb"))
    if result.returncode != 0 or not debs:
        raise TestDataError(f"apt-get download {spec} failed (exit {result.returncode}): "
                            f"{(result.stderr or result.stdout).strip()[-500:]}")  # fmt: skip
    return debs[0]


def _ar_members(data: bytes) -> dict[str, bytes]:
    """The members of an ar archive (a .deb)."""
    if not data.startswith(b"!<arch>\n"):
        raise TestDataError("not a Debian package (no ar header)")
    members: dict[str, bytes] = {}
    at = 8
    while at + 60 <= len(data):
        header = data[at : at + 60]
        name = header[:16].decode("ascii", "replace").strip().rstrip("/")
        size = int(header[48:58].decode("ascii").strip())
        members[name] = data[at + 60 : at + 60 + size]
        at += 60 + size + (size % 2)
    return members


def _extract_wavs(data: bytes, target: Path) -> int:
    """Extract every .wav of the package's data archive under ``target`` (paths below usr/share); returns how many."""
    members = _ar_members(data)
    payload = next((v for k, v in members.items() if k.startswith("data.tar")), None)
    if payload is None:
        raise TestDataError(f"the package has no data.tar member (members: {', '.join(members)})")
    count = 0
    with tarfile.open(fileobj=io.BytesIO(payload), mode="r:*") as archive:
        for member in archive:
            if not member.isfile() or not member.name.endswith(".wav"):
                continue
            relative = Path(member.name.lstrip("./"))
            parts = relative.parts[2:] if relative.parts[:2] == ("usr", "share") else relative.parts
            if any(part in ("..", "") for part in parts):
                continue
            source = archive.extractfile(member)
            if source is None:
                continue
            destination = target.joinpath(*parts)
            destination.parent.mkdir(parents=True, exist_ok=True)
            destination.write_bytes(source.read())
            count += 1
    return count


def main(argv: list[str] | None = None) -> int:
    names = (argv if argv is not None else sys.argv[1:]) or list(PACKAGES)
    for name in names:
        folder = fetch(name)
        print(f"{name}: {len(list(folder.rglob('*.wav')))} WAV files in {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
