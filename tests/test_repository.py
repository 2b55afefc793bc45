"""Repository invariants: layout, exact sibling pins, extras, workspace settings, ASCII-only sources."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = sorted(p.parent for p in (ROOT / "packages").glob("*/pyproject.toml"))
PROJECTS = {p.name: tomllib.loads((p / "pyproject.toml").read_text())["project"] for p in PACKAGES}
SEVEN = {"pygpukit", "pygpukit-core", "pygpukit-ops", "pygpukit-llm", "pygpukit-audio", "pygpukit-sched",
         "pygpukit-triton"}  # fmt: skip


def test_the_seven_distributions_and_the_two_native_variants_exist() -> None:
    assert set(PROJECTS) == SEVEN | {"pygpukit-core-cu12", "pygpukit-core-cu13"}
    for directory, project in zip(PACKAGES, PROJECTS.values(), strict=True):
        assert project["name"] == directory.name


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: p.name)
def test_each_distribution_is_complete(package: Path) -> None:
    for name in ("README.md", "CHANGELOG.md", "LICENSE", "pyproject.toml"):
        assert (package / name).is_file(), f"{package.name} lacks {name}"
    project = PROJECTS[package.name]
    assert project["requires-python"] == ">=3.10"
    assert project["license"] == "MIT"
    if package.name != "pygpukit" and not package.name.startswith("pygpukit-core-cu"):
        assert (package / "src").is_dir()
        assert (package / "tests").is_dir()


def _sibling_requirements() -> list[tuple[str, Requirement]]:
    found = []
    for name, project in PROJECTS.items():
        texts = list(project.get("dependencies", []))
        for extra in project.get("optional-dependencies", {}).values():
            texts += extra
        found += [(name, Requirement(t)) for t in texts if t.startswith("pygpukit")]
    return found


def test_siblings_are_pinned_exactly_to_their_current_versions() -> None:
    pairs = _sibling_requirements()
    assert pairs
    for owner, req in pairs:
        (spec,) = list(req.specifier)
        assert spec.operator == "==", f"{owner}: {req} is not an exact pin"
        assert spec.version == PROJECTS[req.name]["version"], f"{owner}: {req} does not match {req.name}"


def test_lockstep_versions_that_are_checked_at_import() -> None:
    core = PROJECTS["pygpukit-core"]["version"]
    assert PROJECTS["pygpukit-core-cu12"]["version"] == core
    assert PROJECTS["pygpukit-core-cu13"]["version"] == core
    cargo = tomllib.loads((ROOT / "Cargo.toml").read_text())["workspace"]["package"]["version"]
    assert PROJECTS["pygpukit-sched"]["version"] == cargo


def test_meta_package_extras() -> None:
    meta = PROJECTS["pygpukit"]
    assert {Requirement(r).name for r in meta["dependencies"]} == {"pygpukit-core", "pygpukit-ops"}
    extras = meta["optional-dependencies"]
    assert set(extras) == {"cu12", "cu13", "ops", "llm", "audio", "sched", "triton", "all"}
    for major in ("12", "13"):
        names = {Requirement(r).name for r in extras[f"cu{major}"]}
        assert f"pygpukit-core-cu{major}" in names
        assert any("nvrtc" in n for n in names)
        assert any("cublas" in n for n in names)
        assert any("runtime" in n for n in names)
    assert {Requirement(r).name for r in extras["all"]} == SEVEN - {"pygpukit", "pygpukit-core"}


def test_workspace_declares_conflicting_cuda_extras_and_native_cache_keys() -> None:
    root = tomllib.loads((ROOT / "pyproject.toml").read_text())
    conflicts = root["tool"]["uv"]["conflicts"]
    assert [{"package": "pygpukit", "extra": "cu12"}, {"package": "pygpukit", "extra": "cu13"}] in conflicts
    assert sorted(root["tool"]["uv"]["workspace"]["members"]) == ["packages/*"]
    for native in ("pygpukit-core-cu12", "pygpukit-core-cu13", "pygpukit-sched"):
        keys = tomllib.loads((ROOT / "packages" / native / "pyproject.toml").read_text())["tool"]["uv"]["cache-keys"]
        files = " ".join(k["file"] for k in keys)
        assert "crates/" in files
        if native != "pygpukit-sched":
            assert "native/" in files


def _tracked_files() -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):  # a copy of the tree without .git (the GPU machine)
        skip = {".git", ".venv", ".nox", "build", "dist", "target", ".device"}
        return [p for p in ROOT.rglob("*") if p.is_file() and not skip & set(p.relative_to(ROOT).parts)]
    return [ROOT / name for name in out.decode().split("\0") if name]


def test_sources_are_ascii_only() -> None:
    suffixes = {".py", ".pyi", ".rs", ".cpp", ".hpp", ".cu", ".cuh", ".toml", ".md", ".txt", ".sh", ".cfg", ".yml"}
    offenders = []
    for path in _tracked_files():
        if path.suffix in suffixes or path.name in ("run", "CMakeLists.txt", ".clang-format"):
            try:
                path.read_text(encoding="ascii")
            except UnicodeDecodeError as exc:
                offenders.append(f"{path.relative_to(ROOT)}: byte {exc.start}")
            except FileNotFoundError:
                continue
    assert not offenders, offenders


def test_ci_runs_exactly_the_readme_test_command() -> None:
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    command = "python3 -m nox -s lint tests kernels build wheel_smoke"
    assert f"\n{command}\n" in readme
    assert any(line.strip() == command for line in ci.splitlines())
