"""The compiled-kernel cache: in memory and on disk.

The key covers everything that changes the binary: the source (and for built-in kernels the headers it
includes), the options, the architecture and target, the name expressions, the NVRTC version and the
pygpukit version. Disk entries are written atomically (a temporary file renamed into place) and carry
a SHA-256 of their payload; an entry that fails the check is deleted and recompiled, never trusted.

``PYGPUKIT_CACHE_DIR`` moves pygpukit's cache root (default ``$XDG_CACHE_HOME/pygpukit`` or
``~/.cache/pygpukit``); compiled kernels live in its ``kernels`` folder (the model cache of
pygpukit-llm in its ``models`` folder);
``PYGPUKIT_KERNEL_CACHE=0`` (or ``false``, ``no``, ``off``) turns the disk cache off; any other value but
an on value warns once and keeps it on.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ._env import env_flag
from .compiler import CompiledProgram

__all__ = ["CacheStats", "KernelCache", "cache_key", "kernel_cache"]

_MAGIC = b"PGKCUBN1"


def cache_key(
    *,
    source: str,
    options: Sequence[str],
    arch: str,
    target: str,
    name_expressions: Sequence[str],
    nvrtc_version: Sequence[int],
    pygpukit_version: str,
    salt: str = "",
) -> str:
    """SHA-256 hex digest identifying one compilation."""
    h = hashlib.sha256()
    for part in (source, "\0".join(options), arch, target, "\0".join(name_expressions),
                 ".".join(map(str, nvrtc_version)), pygpukit_version, salt):  # fmt: skip
        h.update(part.encode())
        h.update(b"\x1f")
    return h.hexdigest()


@dataclass
class CacheStats:
    memory_hits: int = 0
    disk_hits: int = 0
    misses: int = 0
    corrupt_entries: int = 0
    writes: int = 0


class KernelCache:
    """Maps cache keys to :class:`CompiledProgram` objects in memory and, optionally, on disk."""

    def __init__(self, directory: Path | None) -> None:
        self.directory = directory
        self.stats = CacheStats()
        self._memory: dict[str, CompiledProgram] = {}
        self._lock = threading.Lock()

    def _path(self, key: str) -> Path | None:
        return None if self.directory is None else self.directory / f"{key}.cubin"

    def get(self, key: str) -> CompiledProgram | None:
        with self._lock:
            program = self._memory.get(key)
            if program is not None:
                self.stats.memory_hits += 1
                return program
        path = self._path(key)
        program = self._read(path) if path is not None else None
        with self._lock:
            if program is None:
                self.stats.misses += 1
                return None
            self.stats.disk_hits += 1
            self._memory[key] = program
            return program

    def put(self, key: str, program: CompiledProgram) -> None:
        with self._lock:
            self._memory[key] = program
        path = self._path(key)
        if path is None:
            return
        meta = json.dumps(
            {
                "target": program.target,
                "arch": program.arch,
                "options": list(program.options),
                "log": program.log,
                "lowered_names": program.lowered_names,
            }
        ).encode()
        payload = len(meta).to_bytes(8, "little") + meta + program.binary
        blob = _MAGIC + hashlib.sha256(payload).digest() + payload
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".cubin")
            with os.fdopen(fd, "wb") as handle:
                handle.write(blob)
            os.replace(tmp, path)
        except OSError:
            return  # a read-only or full disk only costs recompilation next time
        with self._lock:
            self.stats.writes += 1

    def _read(self, path: Path) -> CompiledProgram | None:
        try:
            blob = path.read_bytes()
        except OSError:
            return None
        try:
            if blob[:8] != _MAGIC or hashlib.sha256(blob[40:]).digest() != blob[8:40]:
                raise ValueError("checksum mismatch")
            payload = blob[40:]
            size = int.from_bytes(payload[:8], "little")
            meta = json.loads(payload[8 : 8 + size])
            binary = payload[8 + size :]
            if not _well_formed(meta):
                raise ValueError("malformed record")
            return CompiledProgram(
                binary, meta["target"], meta["arch"], tuple(meta["options"]), meta["log"], meta["lowered_names"]
            )
        except (ValueError, KeyError, TypeError, RecursionError):  # RecursionError: JSON nested too deeply
            with self._lock:
                self.stats.corrupt_entries += 1
            with contextlib.suppress(OSError):
                path.unlink()
            return None

    def clear_memory(self) -> None:
        """Forget the in-memory entries (the disk cache stays)."""
        with self._lock:
            self._memory.clear()


def _well_formed(meta: object) -> bool:
    """The record of an entry has the fields and types ``put`` writes (a checksum only proves integrity)."""
    if not isinstance(meta, dict):
        return False
    names, options = meta.get("lowered_names"), meta.get("options")
    return (
        meta.get("target") in ("cubin", "ptx")
        and isinstance(meta.get("arch"), str)
        and isinstance(meta.get("log"), str)
        and isinstance(options, list)
        and all(isinstance(o, str) for o in options)
        and isinstance(names, dict)
        and all(isinstance(k, str) and isinstance(v, str) for k, v in names.items())
    )


def _default_directory() -> Path | None:
    if not env_flag("PYGPUKIT_KERNEL_CACHE", True):
        return None
    explicit = os.environ.get("PYGPUKIT_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser() / "kernels"
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "pygpukit" / "kernels"


kernel_cache = KernelCache(_default_directory())
