"""Hatch build hook: put the kernel sources pygpukit.core compiles at run time into the wheel and the sdist.

In the repository they live in native/kernels, outside this package: the wheel gets them as
``pygpukit/core/_kernels/<folder>`` and the sdist as ``src/pygpukit/core/_kernels/<folder>``, where a
wheel built from the sdist finds them as ordinary package files (pygpukit.core.kernel_sources).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

PACKAGE = "pygpukit/core"
FOLDERS = ("common", "core")


class KernelSourcesHook(BuildHookInterface):
    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        root = Path(self.root)
        checkout = root.parent.parent / "native" / "kernels"
        if root.parent.name == "packages" and (checkout / "common").is_dir():
            prefix = f"src/{PACKAGE}/_kernels" if self.target_name == "sdist" else f"{PACKAGE}/_kernels"
            for folder in FOLDERS:
                build_data["force_include"][str(checkout / folder)] = f"{prefix}/{folder}"
            return
        bundled = root / "src" / PACKAGE / "_kernels"
        missing = [folder for folder in FOLDERS if not (bundled / folder).is_dir()]
        if missing:
            raise FileNotFoundError(
                f"kernel sources not found: neither {checkout} (a checkout) nor {bundled} "
                f"(an sdist) holds {', '.join(missing)}"
            )
