"""Set up a fresh clone: install uv and nox from PyPI for this interpreter, then run `nox -s dev`.

`nox -s dev` creates the uv workspace environment (.venv) with every distribution installed editable,
builds the native modules, and prints `pygpukit info`. With --tools-only only uv and nox are
installed (what .ci/run needs before the test command). Needs Python 3.10+ with pip; nothing else.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

TOOLS = ["uv>=0.9", "nox>=2024.10"]


def have_tools() -> bool:
    probe = "import uv, nox; uv.find_uv_bin()"
    return subprocess.run([sys.executable, "-c", probe], capture_output=True, check=False).returncode == 0


def install_tools() -> None:
    if have_tools():
        return
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *TOOLS]
    print("installing", " and ".join(TOOLS), "with", sys.executable, flush=True)
    if subprocess.run(pip, check=False).returncode != 0:
        # An externally managed interpreter (PEP 668) refuses site-wide installs; the user site works.
        subprocess.run([*pip, "--user"], check=True)
    if not have_tools():
        sys.exit("uv and nox were installed but cannot be imported; check the pip output above")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tools-only", action="store_true", help="install uv and nox, then stop")
    args = parser.parse_args()
    if sys.version_info < (3, 10):  # noqa: UP036 - this script may run on any python3
        sys.exit(f"pygpukit needs Python 3.10 or newer; {sys.executable} is {sys.version.split()[0]}")
    install_tools()
    if args.tools_only:
        return 0
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return subprocess.run([sys.executable, "-m", "nox", "-s", "dev"], cwd=root, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
