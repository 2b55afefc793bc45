"""Where the CUDA kernel sources of a package live, and what their compilations share.

pygpukit-core (its runtime kernels: native/kernels/core) and pygpukit-ops (the op families) compile
kernels from source at run time. A wheel ships them inside the package (``pygpukit/core/_kernels``:
common/ and core/; ``pygpukit/ops/_kernels``: common/ and the op family folders); a source checkout
reads them from ``native/kernels``. :class:`KernelSources` finds that root once, reads sources once,
and computes the digest of every shared header under it, which salts the kernel cache key: editing
any header recompiles every kernel that may include it.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Sequence
from pathlib import Path

from .errors import PyGPUkitError

__all__ = ["KernelSources"]


class KernelSources:
    """The kernel source tree of one package.

    ``package_dir`` is the package's directory (``Path(__file__).parent`` of one of its modules);
    the root is ``package_dir / "_kernels"`` (a wheel) or, in a checkout (``package_dir`` is
    ``packages/<pkg>/src/pygpukit/<name>``), ``native/kernels`` of the repository. A candidate is the
    root when every path of ``markers`` (relative to it) is a file.
    """

    __slots__ = ("_digest", "_lock", "_root", "_sources", "markers", "package_dir", "what")

    def __init__(self, package_dir: Path, markers: Sequence[str], what: str) -> None:
        if not markers:
            raise ValueError("KernelSources needs at least one marker file")
        self.package_dir = Path(package_dir).resolve()
        self.markers = tuple(markers)
        self.what = what
        self._root: Path | None = None
        self._digest: str | None = None
        self._sources: dict[str, str] = {}
        self._lock = threading.Lock()

    def candidates(self) -> list[Path]:
        """The directories tried, in order: the wheel's ``_kernels``, then a checkout's native/kernels."""
        here = self.package_dir
        found = [here / "_kernels"]
        if len(here.parents) > 4:  # a checkout: packages/<pkg>/src/pygpukit/<name>
            found.append(here.parents[4] / "native" / "kernels")
        return found

    @property
    def root(self) -> Path:
        """The directory holding common/ and this package's kernel folders."""
        root = self._root
        if root is None:
            for candidate in self.candidates():
                if all((candidate / marker).is_file() for marker in self.markers):
                    root = self._root = candidate
                    break
            else:
                raise PyGPUkitError(f"{self.what} kernel sources not found (looked in "
                                    f"{', '.join(str(c) for c in self.candidates())})")  # fmt: skip
        return root

    def path(self, relative_path: str) -> Path:
        """The file ``relative_path`` (e.g. ``"reduction/reduce.cu"``) under the root."""
        return self.root / relative_path

    def source(self, relative_path: str) -> str:
        """The text of ``relative_path``, read once."""
        text = self._sources.get(relative_path)
        if text is None:
            path = self.path(relative_path)
            try:
                text = path.read_text()
            except OSError as exc:
                raise PyGPUkitError(f"{self.what} kernel source {relative_path!r} cannot be read: {exc}") from exc
            with self._lock:
                self._sources[relative_path] = text
        return text

    def include_dirs(self, relative_path: str) -> list[str]:
        """The include directories of ``relative_path``: its own folder (kernels include
        ``"../common/..."`` relative to it)."""
        return [str(self.path(relative_path).parent)]

    def headers_digest(self) -> str:
        """SHA-256 over every ``.cuh`` under the root (relative path and bytes, in path order): part of
        each kernel's cache key, so editing a header recompiles."""
        digest = self._digest
        if digest is None:
            root = self.root
            h = hashlib.sha256()
            for path in sorted(root.rglob("*.cuh")):
                h.update(path.relative_to(root).as_posix().encode())
                h.update(b"\0")
                h.update(path.read_bytes())
            digest = self._digest = h.hexdigest()
        return digest

    def clear(self) -> None:
        """Forget the root, the sources read and the digest (tests that edit kernel files)."""
        with self._lock:
            self._root = None
            self._digest = None
            self._sources.clear()

    def __repr__(self) -> str:
        return f"KernelSources({self.what!r}, {self._root or self.package_dir})"
