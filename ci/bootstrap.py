"""Set up a fresh clone: install uv and nox from PyPI for this interpreter, then run `nox -s dev`.

`nox -s dev` creates the uv workspace environment (.venv) with every distribution installed editable,
builds the native modules, and prints `pygpukit info`. With --tools-only only uv and nox are
installed (what .ci/run needs before the test command). Needs Python 3.10+ with pip; nothing else.

The first `uv sync` compiles the C++ and Rust modules and prints nothing for minutes, so while the
command is silent a line every PERIOD seconds says how long it has run and what it is doing. Disk:
about 3 GB with uv's cache (docs/getting-started.md).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time

TOOLS = ["uv>=0.9", "nox>=2024.10"]
PERIOD = 20.0  # seconds of silence before a progress line
# What a silent step is doing, by a word of the last line printed before it.
SILENT_STEPS = {
    "uv sync": "uv sync: resolving, downloading and building; the first run compiles the native modules "
    "(C++ for CUDA 12 and 13, Rust), several minutes on two cores",
    "models pull": "fetching the default model (98 MB) into the model cache",
    "chat": "answering on this machine's backend (the CPU simulation is slow: a minute or more)",
}


def _what(line: str) -> str:
    return next((what for key, what in SILENT_STEPS.items() if key in line), line.strip()[:100] or "starting")


def run_with_progress(command: list[str], cwd: str, period: float = PERIOD) -> int:
    """Run `command`, passing its output through line by line; whenever it has printed nothing for
    `period` seconds, print the time since the start and what the last line said it was doing (in full
    the first time, then briefly)."""
    start = time.monotonic()
    process = subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    last_output = [start]
    last_line = ["starting"]
    finished = threading.Event()

    def heartbeat() -> None:
        described = ""
        while not finished.wait(period / 4):
            now = time.monotonic()
            if now - last_output[0] < period:
                continue
            elapsed = int(now - start)
            what = _what(last_line[0])
            shown = what if what != described else what.split(":")[0].split(" (")[0]
            print(f"  ... {elapsed // 60}m{elapsed % 60:02d}s, still working: {shown}", flush=True)
            described = what
            last_output[0] = now

    thread = threading.Thread(target=heartbeat, daemon=True)
    thread.start()
    assert process.stdout is not None
    for line in process.stdout:
        print(line, end="", flush=True)
        last_output[0] = time.monotonic()
        last_line[0] = line
    code = process.wait()
    finished.set()
    thread.join()
    return code


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
    print("setting up the workspace (`nox -s dev`); progress lines appear while a step is silent", flush=True)
    return run_with_progress([sys.executable, "-m", "nox", "-s", "dev"], cwd=root)


if __name__ == "__main__":
    sys.exit(main())
