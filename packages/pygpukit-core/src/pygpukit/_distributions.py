"""The pygpukit distributions, their exact sibling pins, and clear errors for missing parts.

Each distribution pins its siblings to exact versions. At import, every subpackage calls
:func:`check_siblings` so that a mixed installation fails with one readable message instead of an
obscure AttributeError later. Importing a subpackage whose distribution is not installed raises
:class:`MissingDistributionError` naming the distribution to install.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.metadata as metadata
import sys
from collections.abc import Sequence
from types import ModuleType

from packaging.requirements import InvalidRequirement, Requirement

from .core import _install
from .core.errors import MissingDistributionError, VersionMismatchError

__all__ = [
    "DISTRIBUTIONS",
    "SUBPACKAGES",
    "check_siblings",
    "distribution_version",
    "install_missing_subpackage_hook",
    "installed_versions",
]

# distribution -> what it provides
DISTRIBUTIONS: dict[str, str] = {
    "pygpukit": "meta package: extras cu12, cu13, ops, llm, audio, sched, triton, all",
    "pygpukit-core": "pygpukit, pygpukit.core",
    "pygpukit-core-cu12": "pygpukit.core._native_cu12 (native runtime for CUDA 12 drivers)",
    "pygpukit-core-cu13": "pygpukit.core._native_cu13 (native runtime for CUDA 13 drivers)",
    "pygpukit-ops": "pygpukit.ops",
    "pygpukit-llm": "pygpukit.llm",
    "pygpukit-audio": "pygpukit.audio, pygpukit.asr, pygpukit.tts",
    "pygpukit-sched": "pygpukit.scheduler, _pygpukit_rust",
    "pygpukit-triton": "pygpukit.triton",
}

# subpackage of pygpukit -> (distribution, extra of the meta package)
SUBPACKAGES: dict[str, tuple[str, str]] = {
    "ops": ("pygpukit-ops", "ops"),
    "llm": ("pygpukit-llm", "llm"),
    "audio": ("pygpukit-audio", "audio"),
    "asr": ("pygpukit-audio", "audio"),
    "tts": ("pygpukit-audio", "audio"),
    "scheduler": ("pygpukit-sched", "sched"),
    "triton": ("pygpukit-triton", "triton"),
}


def distribution_version(name: str) -> str | None:
    """Installed version of a distribution, or None."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def installed_versions() -> dict[str, str | None]:
    """Version of every pygpukit distribution (None where not installed)."""
    return {name: distribution_version(name) for name in DISTRIBUTIONS}


def _sibling_requirements(distribution: str) -> list[Requirement]:
    requirements: list[Requirement] = []
    for text in metadata.requires(distribution) or []:
        try:
            req = Requirement(text)
        except InvalidRequirement:
            continue
        if not req.name.startswith("pygpukit"):
            continue
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue  # optional (an extra) or not for this platform
        requirements.append(req)
    return requirements


def check_siblings(distribution: str, *, required: Sequence[str] = ()) -> None:
    """Verify that the pygpukit siblings ``distribution`` pins are installed at the pinned versions.

    ``required`` names siblings that must be present for the import to work at all; others that are
    missing are left for the code that needs them to report.
    """
    own = distribution_version(distribution)
    if own is None:
        return  # running from a source tree without metadata: nothing to compare
    problems: list[str] = []
    missing: list[str] = []
    for req in _sibling_requirements(distribution):
        have = distribution_version(req.name)
        if have is None:
            if req.name in required:
                missing.append(str(req))
            continue
        if not req.specifier.contains(have, prereleases=True):
            problems.append(f"{distribution} {own} needs {req}, but {req.name} {have} is installed")
    if missing:
        raise MissingDistributionError(
            f"{distribution} {own} needs {', '.join(missing)}, which is not installed: pip install "
            + " ".join(f"'{m}'" for m in missing)
        )
    if problems:
        fix = " ".join(f"'{req}'" for req in _sibling_requirements(distribution) if distribution_version(req.name))
        raise VersionMismatchError(
            "pygpukit distributions with mismatched versions are installed: "
            + "; ".join(problems)
            + f". Install matching versions, e.g. pip install '{distribution}=={own}' {fix}"
        )


class _MissingSubpackageFinder(importlib.abc.MetaPathFinder):
    """Last on sys.meta_path: reached only when no other finder found a known subpackage."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        parts = fullname.split(".")
        if len(parts) != 2 or parts[0] != "pygpukit" or parts[1] not in SUBPACKAGES:
            return None
        distribution, _extra = SUBPACKAGES[parts[1]]
        raise MissingDistributionError(
            f"{fullname} is provided by the {distribution} distribution, which is not installed: "
            f"{_install.install_hint(distribution)}",
            name=fullname,
        )


def install_missing_subpackage_hook() -> None:
    """Append the finder once (idempotent)."""
    if not any(isinstance(f, _MissingSubpackageFinder) for f in sys.meta_path):
        sys.meta_path.append(_MissingSubpackageFinder())
