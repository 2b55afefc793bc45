"""Wheel smoke test, run with the interpreter of a fresh venv (see `nox -s wheel_smoke`).

    smoke_wheels.py download --dist DIR --wheelhouse DIR   fetch the third-party wheels the dist needs
    smoke_wheels.py check                                  import everything, then uninstall piece by piece

Uses only the standard library and pip, since it runs before and around the installation it checks.
"""

from __future__ import annotations

import argparse
import email.parser
import subprocess
import sys
import zipfile
from pathlib import Path

SUBPACKAGES = {
    "pygpukit.core": "pygpukit-core",
    "pygpukit.ops": "pygpukit-ops",
    "pygpukit.llm": "pygpukit-llm",
    "pygpukit.audio": "pygpukit-audio",
    "pygpukit.asr": "pygpukit-audio",
    "pygpukit.tts": "pygpukit-audio",
    "pygpukit.scheduler": "pygpukit-sched",
    "pygpukit.triton": "pygpukit-triton",
}
EXTRAS = ("all", "cu13")


def third_party_requirements(dist: Path) -> list[str]:
    """Requirements of the wheels in `dist` that are not pygpukit distributions, for extras all+cu13."""
    from pip._vendor.packaging.requirements import Requirement  # type: ignore[import-not-found]

    wanted: set[str] = set()
    for wheel in sorted(dist.glob("*.whl")):
        if "cu12" in wheel.name:
            continue
        with zipfile.ZipFile(wheel) as archive:
            name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
            meta = email.parser.Parser().parsestr(archive.read(name).decode())
        for text in meta.get_all("Requires-Dist") or []:
            req = Requirement(text)
            if req.name.startswith("pygpukit"):
                continue
            if req.marker is None or any(req.marker.evaluate({"extra": e}) for e in ("", *EXTRAS)):
                req.marker = None
                wanted.add(str(req))
    return sorted(wanted)


def download(dist: Path, wheelhouse: Path) -> None:
    requirements = third_party_requirements(dist)
    print("third-party requirements:", ", ".join(requirements), flush=True)
    wheelhouse.mkdir(parents=True, exist_ok=True)
    pip = [sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:", "-d", str(wheelhouse)]
    subprocess.run([*pip, *requirements], check=True)


def python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)


def expect_ok(code: str, what: str) -> str:
    result = python(code)
    if result.returncode != 0:
        raise SystemExit(f"FAIL {what}:\n{result.stdout}{result.stderr}")
    print(f"ok   {what}", flush=True)
    return result.stdout


def expect_error(code: str, what: str, *needles: str) -> None:
    result = python(code)
    missing = [n for n in needles if n not in result.stderr]
    if result.returncode == 0 or missing:
        raise SystemExit(f"FAIL {what}: expected an error mentioning {missing or needles}, got:\n{result.stderr}")
    print(f"ok   {what}: {result.stderr.strip().splitlines()[-1]}", flush=True)


def uninstall(distribution: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", "uninstall", "--yes", "--quiet", distribution], check=True)
    print(f"--   uninstalled {distribution}", flush=True)


def check() -> None:
    imports = "; ".join(f"import {m}" for m in SUBPACKAGES)
    versions = (
        "import importlib, importlib.metadata as md, pygpukit, _pygpukit_rust\n"
        f"for mod, dist in {SUBPACKAGES!r}.items():\n"
        "    m = importlib.import_module(mod)\n"
        "    v = getattr(m, '__version__', pygpukit.__version__)\n"
        "    assert v == md.version(dist), (mod, v, md.version(dist))\n"
        "assert _pygpukit_rust.__version__ == md.version('pygpukit-sched')\n"
        "assert md.version('pygpukit') == pygpukit.__version__\n"
    )
    expect_ok(f"{imports}; import _pygpukit_rust", "every subpackage imports from the installed wheels")
    expect_ok(versions, "each distribution reports its own version through importlib.metadata")
    info = expect_ok("from pygpukit.__main__ import main; main(['info'])", "pygpukit info")
    if "NVRTC:     13." not in info:
        raise SystemExit(f"FAIL NVRTC from the nvidia-cuda-nvrtc wheel was not found:\n{info}")
    print("ok   NVRTC found in the pip wheel layout", flush=True)
    expect_ok(
        "import pygpukit as gp\n"
        "p = gp.compile_source('#include <cuda_bf16.h>\\n"
        'extern "C" __global__ void k(__nv_bfloat16* x) { x[threadIdx.x] = __float2bfloat16(1.0f); }\', arch=90)\n'
        "assert p.binary[:4] == b'\\x7fELF', p.binary[:4]\n",
        "NVRTC compiles a bf16 kernel to CUBIN with the runtime-header wheel",
    )

    expect_ok(
        "import numpy as np, pygpukit as gp\n"
        "from pygpukit.core.builtins import builtin_kernel, kernel_root\n"
        "assert kernel_root().name == '_kernels', kernel_root()\n"
        "assert builtin_kernel('fill', gp.bfloat16).compile('sm_90').binary[:4] == b'\\x7fELF'\n"
        "x = gp.from_numpy(np.arange(6, dtype=np.float32)).reshape(2, 3).T\n"
        "assert (x.astype(gp.int16).to_numpy() == np.arange(6).reshape(2, 3).T).all()\n",
        "the wheel ships the built-in kernels and the runtime works (CPU backend here)",
    )

    uninstall("pygpukit-llm")
    expect_ok(
        "import pygpukit, pygpukit.ops, pygpukit.audio, pygpukit.scheduler, pygpukit.triton",
        "the others import without pygpukit-llm",
    )
    expect_error(
        "import pygpukit.llm", "pygpukit.llm names its distribution", "MissingDistributionError", "pygpukit-llm"
    )

    uninstall("pygpukit-ops")
    expect_ok("import pygpukit, pygpukit.scheduler", "the others import without pygpukit-ops")
    expect_error("import pygpukit.triton", "pygpukit.triton without pygpukit-ops", "pygpukit-triton", "pygpukit-ops")
    expect_error("import pygpukit.ops", "pygpukit.ops names its distribution", "pygpukit-ops")
    expect_error("import pygpukit as gp; gp.add", "pygpukit.add names pygpukit-ops", "AttributeError", "pygpukit-ops")
    expect_error("import pygpukit.audio", "pygpukit.audio without pygpukit-ops", "pygpukit-audio", "pygpukit-ops")

    uninstall("pygpukit-core")
    expect_ok(
        "import _pygpukit_rust; print(_pygpukit_rust.build_info())", "_pygpukit_rust imports without pygpukit-core"
    )
    expect_error("import pygpukit.scheduler", "pygpukit.scheduler names pygpukit-core", "pygpukit-core")
    print("wheel smoke test passed", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    dl = sub.add_parser("download")
    dl.add_argument("--dist", type=Path, required=True)
    dl.add_argument("--wheelhouse", type=Path, required=True)
    sub.add_parser("check")
    args = parser.parse_args()
    if args.command == "download":
        download(args.dist, args.wheelhouse)
    else:
        check()


if __name__ == "__main__":
    main()
