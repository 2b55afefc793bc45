"""Packaging: a plain install's dependencies, the fix commands of mismatched pieces, the documented install
commands against the release session's wheelhouse, the version bump and its consistency check, and the
set-up command's progress lines. CPU only; `nox -s release install_test` builds and installs the wheels."""

from __future__ import annotations

import importlib.util
import re
import shutil
import sys
import types
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement

from pygpukit.core import _install, _libraries, _loaded_library, _variant
from pygpukit.core._loaded_library import LoadedLibrary
from pygpukit.core.errors import LibraryNotFoundError

ROOT = Path(__file__).resolve().parent.parent


def _script(name: str) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "ci" / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and NamedTuples look their module up
    spec.loader.exec_module(module)
    return module


release = _script("release")
bump_version = _script("bump_version")
bootstrap = _script("bootstrap")


def _project(distribution: str) -> dict:  # type: ignore[type-arg]
    return tomllib.loads((ROOT / "packages" / distribution / "pyproject.toml").read_text())["project"]


# -- a plain install ------------------------------------------------------------------------------------


def test_plain_install_brings_the_default_variant_with_its_nvrtc_and_cublas() -> None:
    meta = _project("pygpukit")
    base = [Requirement(r) for r in meta["dependencies"]]
    linux = {"sys_platform": "linux", "platform_machine": "x86_64"}
    nvidia = sorted(str(r.specifier) + r.name for r in base if r.name.startswith("nvidia") and r.marker.evaluate(linux))
    cu13 = sorted(str(r.specifier) + r.name for r in map(Requirement, meta["optional-dependencies"]["cu13"])
                  if r.name.startswith("nvidia"))  # fmt: skip
    assert nvidia == cu13  # the same NVRTC, cuBLAS and header wheels as the cu13 extra
    assert {r.name for r in base if r.name.startswith("nvidia")} == {
        "nvidia-cuda-nvrtc", "nvidia-cublas", "nvidia-cuda-runtime"}  # fmt: skip
    core = [Requirement(r) for r in _project("pygpukit-core")["dependencies"]]
    (native,) = [r for r in core if r.name.startswith("pygpukit-core-cu")]
    assert native.name == "pygpukit-core-cu13"
    assert native.marker is not None
    assert native.marker.evaluate(linux)
    assert not native.marker.evaluate({"sys_platform": "darwin", "platform_machine": "arm64"})


@pytest.mark.parametrize("variant", ["cu12", "cu13"])
def test_fix_commands_install_what_the_extras_install(variant: str) -> None:
    extra = [Requirement(r) for r in _project("pygpukit")["optional-dependencies"][variant]]
    wheels = sorted(f"{r.name}{r.specifier}" for r in extra if r.name.startswith("nvidia"))
    assert sorted(str(Requirement(r)) for r in _install.CUDA_REQUIREMENTS[variant]) == wheels
    assert f"pygpukit-core-{variant}" in {r.name for r in extra}


# -- fix commands where the pieces do not match the driver -----------------------------------------------


@pytest.fixture
def no_wheelhouse(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    monkeypatch.setattr(_install, "_installed_from", lambda distribution: None)


def test_the_command_reads_the_wheelhouse_pip_was_pointed_at(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(_install, "_installed_from", lambda distribution: None)
    monkeypatch.setenv("PIP_FIND_LINKS", f"{tmp_path} /elsewhere")
    command = _install.install_command("pygpukit-core-cu12==0.1.0", "nvidia-cublas-cu12>=12.8,<13")
    assert command == (f"{sys.executable} -m pip install pygpukit-core-cu12==0.1.0 'nvidia-cublas-cu12>=12.8,<13' "
                       f"--find-links {tmp_path}")  # fmt: skip
    monkeypatch.delenv("PIP_FIND_LINKS")
    monkeypatch.setattr(_install, "_installed_from", lambda d: "/w/dist/wheelhouse" if d == "pygpukit-core" else None)
    fix = _install.variant_fix("cu13")
    assert fix.startswith(f"fix: {sys.executable} -m pip install pygpukit-core-cu13==")
    assert fix.endswith(" --find-links /w/dist/wheelhouse")


def test_the_wheelhouse_comes_from_the_wheel_pip_installed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    record = f'{{"url": "file://{tmp_path}/pygpukit_core-0.1.0-py3-none-any.whl", "archive_info": {{}}}}'
    fake = types.SimpleNamespace(read_text=lambda name: record if name == "direct_url.json" else None)
    monkeypatch.setattr(_install.metadata, "distribution", lambda name: fake)
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    assert _install.wheelhouse() == str(tmp_path)


@pytest.mark.usefixtures("no_wheelhouse")
def test_an_unknown_wheelhouse_is_a_named_placeholder_and_the_pypi_name_is_explained() -> None:
    fix = _install.variant_fix("cu12")
    assert fix.startswith(f"fix: {sys.executable} -m pip install pygpukit-core-cu12==")
    assert " --find-links WHEELHOUSE (WHEELHOUSE: the directory holding the pygpukit wheels" in fix
    assert "'nvidia-cuda-nvrtc-cu12>=12.8,<13'" in fix
    assert "unrelated project" in fix
    assert "pygpukit[" not in fix  # never the meta package: PyPI's pygpukit is someone else's


@pytest.fixture
def fake_variants(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    def configure(installed: list[str], driver: int | None, forced: str = "") -> str:
        monkeypatch.setenv("PYGPUKIT_CUDA_VARIANT", forced)
        monkeypatch.setattr(_variant, "installed_variants", lambda: list(installed))
        monkeypatch.setattr(_variant, "probe_driver_version", lambda: _variant.DriverProbe(driver, "libcuda.so.1"))
        monkeypatch.setattr(_variant, "_import_variant", lambda v: types.SimpleNamespace(CUDA_MAJOR=int(v[2:])))
        return _variant.choose_variant().reason

    return configure


@pytest.mark.usefixtures("no_wheelhouse")
def test_variant_mismatches_name_the_command_that_fixes_them(fake_variants) -> None:  # type: ignore[no-untyped-def]
    version = _install._core_version()
    cu12 = f"-m pip install pygpukit-core-cu12=={version} 'nvidia-cuda-nvrtc-cu12>=12.8,<13'"
    cu13 = f"-m pip install pygpukit-core-cu13=={version} 'nvidia-cuda-nvrtc>=13.0,<14'"
    reason = fake_variants(["cu13"], 12080)  # a CUDA 12 driver, only the CUDA 13 module
    assert "driver supports CUDA 12.8" in reason
    assert cu12 in reason
    reason = fake_variants(["cu13"], 13000, forced="cu12")
    assert "PYGPUKIT_CUDA_VARIANT=cu12 but pygpukit-core-cu12 is not installed; fix: " in reason
    assert cu12 in reason
    assert cu13 in fake_variants([], 13000)
    assert cu12 in fake_variants([], 12040)
    reason = fake_variants(["cu13", "cu12"], 11080)  # no pip command helps an old driver
    assert "update the NVIDIA driver" in reason
    assert "fix:" not in reason


@pytest.mark.usefixtures("no_wheelhouse")
def test_a_missing_library_names_the_command_that_installs_it(monkeypatch: pytest.MonkeyPatch) -> None:
    # The native loader's own failure (it keeps a library it loaded once, so it is simulated here).
    attempts = ["/nonexistent/libnvrtc.so.12: cannot open shared object file"]

    def native_failure(native: object, candidates: list[str]) -> dict[str, object]:
        raise LibraryNotFoundError("NVRTC could not be loaded; tried:\n  " + attempts[0], library="NVRTC",
                                   attempts=attempts)  # fmt: skip

    monkeypatch.setitem(_loaded_library._LOADERS, "test_nvrtc", native_failure)
    monkeypatch.setattr(_variant, "any_native", lambda: types.SimpleNamespace(CUDA_MAJOR=13))
    monkeypatch.setattr(_variant, "probe_driver_version", lambda: _variant.DriverProbe(12080, "libcuda.so.1"))
    monkeypatch.setattr(_libraries, "candidates", lambda spec, major=None: ["/nonexistent/libnvrtc.so.12"])
    library = LoadedLibrary(_libraries.NVRTC, "test_nvrtc")
    with pytest.raises(LibraryNotFoundError) as caught:
        library.status()
    message = str(caught.value)
    assert message.startswith("NVRTC could not be loaded; tried:\n  /nonexistent/libnvrtc.so.12")
    fix = message.splitlines()[-1]
    assert fix.startswith(f"fix: {sys.executable} -m pip install 'nvidia-cuda-nvrtc-cu12>=12.8,<13'")  # driver's major
    assert " --find-links WHEELHOUSE (WHEELHOUSE: " in fix
    assert caught.value.library == "NVRTC"
    assert caught.value.attempts == attempts
    with pytest.raises(LibraryNotFoundError, match="fix: "):
        library.status()  # remembered, same answer
    monkeypatch.setattr(_variant, "probe_driver_version", lambda: _variant.DriverProbe(None, None))
    with pytest.raises(LibraryNotFoundError, match=r"pip install 'nvidia-cuda-nvrtc>=13.0,<14'"):
        LoadedLibrary(_libraries.NVRTC, "test_nvrtc").status()  # no driver: the module's major, 13


@pytest.mark.usefixtures("no_wheelhouse")
def test_a_library_newer_than_the_driver_is_a_mismatch_with_its_fix() -> None:
    problem = _install.driver_mismatch("NVRTC", "/x/nvidia/cu13/lib/libnvrtc.so.13", 12080)
    assert problem is not None
    assert "is from CUDA 13 but the driver supports CUDA 12.8; fix: " in problem
    assert "'nvidia-cuda-nvrtc-cu12>=12.8,<13'" in problem
    assert _install.driver_mismatch("NVRTC", "/x/libnvrtc.so.13", 13000) is None
    assert _install.driver_mismatch("NVRTC", "/x/libnvrtc.so.12", 13020) is None
    assert _install.driver_mismatch("NVRTC", "/x/libnvrtc.so.13", None) is None


# -- documented install commands ------------------------------------------------------------------------

_DOCS = ("README.md", *(p.relative_to(ROOT).as_posix() for p in sorted((ROOT / "docs").glob("*.md"))))
_INSTALL = re.compile(r"""pip install (?:--no-index )?--find-links (\S+) "(pygpukit(?:\[[a-z0-9,]+\])?)\"""")


def test_install_commands_read_the_release_wheelhouse_and_are_the_ones_the_install_test_runs() -> None:
    wheelhouse = release.WHEELHOUSE.relative_to(ROOT).as_posix()
    assert wheelhouse == "dist/wheelhouse"
    for page in ("README.md", "docs/getting-started.md"):
        text = (ROOT / page).read_text()
        commands = _INSTALL.findall(text)
        assert commands, f"{page} gives no install command from the wheelhouse"
        for where, spec in commands:
            assert where == wheelhouse, f"{page}: --find-links {where}, the release session writes {wheelhouse}"
            assert spec in release.INSTALL_SPECS, (
                f"{page}: {spec} is not one of the install test's {release.INSTALL_SPECS}"
            )
        assert "nox -s release" in text
        assert "unrelated" in text  # why not plain `pip install pygpukit`


def test_no_documented_pip_command_fetches_the_other_pygpukit_from_pypi() -> None:
    for page in (*_DOCS, *(p.relative_to(ROOT).as_posix() for p in (ROOT / "packages").glob("*/README.md"))):
        for line in (ROOT / page).read_text().splitlines():
            if "PyPI" in line:  # a line explaining which command not to run
                continue
            if re.search(r"pip install\b[^`]*?[\s\"']pygpukit(\[|\"|'|`|\s|$)", line) and "--find-links" not in line:
                pytest.fail(f"{page}: `{line.strip()}` would install the unrelated pygpukit from PyPI")


def test_the_extras_the_docs_install_exist() -> None:
    extras = set(_project("pygpukit")["optional-dependencies"])
    for spec in release.INSTALL_SPECS:
        named = re.findall(r"\[([a-z0-9,]+)\]", spec)
        assert set(named[0].split(",") if named else []) <= extras


# -- versions, pins, CHANGELOG headings ------------------------------------------------------------------


def test_versions_pins_lockstep_partners_changelogs_and_lock_files_agree() -> None:
    assert bump_version.check(ROOT) == []


def _copy_of_the_repository(tmp_path: Path) -> Path:
    for package in (ROOT / "packages").iterdir():
        if (package / "pyproject.toml").is_file():
            (tmp_path / "packages" / package.name).mkdir(parents=True)
            for name in ("pyproject.toml", "CHANGELOG.md"):
                shutil.copy2(package / name, tmp_path / "packages" / package.name / name)
    for crate in (ROOT / "crates").iterdir():
        (tmp_path / "crates" / crate.name).mkdir(parents=True)
        shutil.copy2(crate / "Cargo.toml", tmp_path / "crates" / crate.name / "Cargo.toml")
    for name in ("Cargo.toml", "Cargo.lock", "uv.lock"):
        shutil.copy2(ROOT / name, tmp_path / name)
    return tmp_path


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, (path, old)
    path.write_text(text.replace(old, new, 1))


def test_the_check_fails_on_every_kind_of_disagreement(tmp_path: Path) -> None:
    root = _copy_of_the_repository(tmp_path)
    assert bump_version.check(root) == []
    ops = _project("pygpukit-ops")["version"]
    _edit(root / "packages/pygpukit-ops/CHANGELOG.md", f"## {ops}", "## 9.9.9")
    _edit(root / "packages/pygpukit-llm/pyproject.toml", f'"pygpukit-ops=={ops}"', '"pygpukit-ops==9.9.8"')
    _edit(root / "packages/pygpukit-core-cu12/pyproject.toml", 'version = "', 'version = "9.')
    _edit(root / "Cargo.toml", 'version = "', 'version = "7.')
    problems = "\n".join(bump_version.check(root))
    assert "pygpukit-ops is" in problems
    assert "CHANGELOG.md is 9.9.9" in problems
    assert "pygpukit-llm pins pygpukit-ops==9.9.8" in problems
    assert "lockstep versions differ" in problems
    assert "Cargo.toml's workspace is 7." in problems
    assert "uv.lock has pygpukit-core-cu12" in problems


def test_bump_moves_the_version_every_pin_the_partners_and_the_changelog_heading(tmp_path: Path) -> None:
    root = _copy_of_the_repository(tmp_path)
    (root / "uv.lock").unlink()  # `uv lock` is not run here
    bumped = bump_version.bump(root, "pygpukit-ops", "0.2.0")
    assert bumped == ["pygpukit", "pygpukit-audio", "pygpukit-llm", "pygpukit-triton"]
    assert bump_version.bump(root, "pygpukit-core", "0.1.1")  # with core-cu12 and core-cu13
    assert bump_version.bump(root, "pygpukit-sched", "0.3.0") == ["pygpukit"]  # with the Cargo workspace
    assert bump_version.check(root) == []
    versions = bump_version.versions(root)
    assert versions["pygpukit-ops"] == "0.2.0"
    assert versions["pygpukit-core-cu12"] == versions["pygpukit-core-cu13"] == "0.1.1"
    assert bump_version.cargo_version(root) == "0.3.0"
    assert '"pygpukit-ops==0.2.0"' in (root / "packages/pygpukit-llm/pyproject.toml").read_text()
    changelog = (root / "packages/pygpukit-ops/CHANGELOG.md").read_text()
    assert bump_version.changelog_heading(root / "packages/pygpukit-ops") == "0.2.0"
    assert changelog.count("## ") == (ROOT / "packages/pygpukit-ops/CHANGELOG.md").read_text().count("## ")
    _edit(root / "packages/pygpukit-ops/CHANGELOG.md", "## 0.2.0 (unreleased)", "## 0.2.0 (2026-12-01)")
    bump_version.bump(root, "pygpukit-ops", "0.2.1")  # released: a new heading above it
    assert (root / "packages/pygpukit-ops/CHANGELOG.md").read_text().index("## 0.2.1 (unreleased)") < (
        root / "packages/pygpukit-ops/CHANGELOG.md").read_text().index("## 0.2.0 (2026-12-01)")  # fmt: skip
    with pytest.raises(SystemExit, match="must be newer"):
        bump_version.bump(root, "pygpukit-ops", "0.1.0")
    with pytest.raises(SystemExit, match="unknown distribution 'pygpukit-foo'"):
        bump_version.bump(root, "pygpukit-foo", "1.0")
    with pytest.raises(SystemExit, match="not a PEP 440 version"):
        bump_version.bump(root, "pygpukit-ops", "next")


# -- the set-up command shows progress ------------------------------------------------------------------


def test_bootstrap_reports_progress_while_a_step_is_silent(capsys: pytest.CaptureFixture[str]) -> None:
    code = "import time; print('nox > uv sync --locked', flush=True); time.sleep(1.2); print('done', flush=True)"
    assert bootstrap.run_with_progress([sys.executable, "-c", code], str(ROOT), period=0.3) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "nox > uv sync --locked"
    assert lines[-1] == "done"
    progress = lines[1:-1]
    assert progress, "no progress line during a silent second"
    assert "still working: uv sync: resolving, downloading and building" in progress[0]
    assert all(re.match(r"  \.\.\. \dm\d\ds, still working: uv sync", line) for line in progress)
    assert bootstrap.run_with_progress([sys.executable, "-c", "raise SystemExit(3)"], str(ROOT)) == 3
