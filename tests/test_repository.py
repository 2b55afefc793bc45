"""Repository invariants: layout, exact sibling pins, extras, workspace settings, ASCII-only sources, and
docs that name what the code has (environment variables, runtime files, crates, the CI command)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
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
    siblings = {Requirement(r).name for r in meta["dependencies"] if r.startswith("pygpukit")}
    assert siblings == {"pygpukit-core", "pygpukit-ops"}  # plus the default variant's NVIDIA wheels: test_packaging
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


def test_contributing_states_what_ci_runs() -> None:
    command = "python3 -m nox -s lint tests kernels build wheel_smoke"
    assert command in (ROOT / "docs" / "contributing.md").read_text()
    noxfile = (ROOT / "noxfile.py").read_text()
    assert 'nox.options.sessions = ["lint", "tests", "kernels", "build", "wheel_smoke"]' in noxfile


# -- docs that must name what the code has -------------------------------------------------------------

_SOURCE_SUFFIXES = {".py", ".pyi", ".rs", ".cpp", ".hpp", ".h", ".cu", ".cuh", ".cmake", ".txt", ".toml"}
_SKIPPED_PARTS = {"build", "target", "__pycache__", ".venv", ".nox"}
# A string literal that is exactly a PYGPUKIT_* name: "PYGPUKIT_BACKEND", 'PYGPUKIT_CACHE_DIR'.
_ENV_LITERAL = re.compile(r"""(["'])(PYGPUKIT_[A-Z0-9_]*[A-Z0-9])\1""")


def _source_files() -> list[Path]:
    roots = [*(ROOT / "packages").glob("*/src"), ROOT / "native", ROOT / "crates"]
    files = []
    for root in roots:
        for path in root.rglob("*"):
            parts = set(path.relative_to(ROOT).parts)
            if path.is_file() and path.suffix in _SOURCE_SUFFIXES and not parts & _SKIPPED_PARTS:
                files.append(path)
    return files


def _variables_in_source() -> dict[str, str]:
    """Every PYGPUKIT_* name that appears as a whole string literal in the sources -> the first file."""
    found: dict[str, str] = {}
    for path in _source_files():
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, FileNotFoundError):  # a file another process is rewriting
            continue
        for match in _ENV_LITERAL.finditer(text):
            found.setdefault(match.group(2), str(path.relative_to(ROOT)))
    return found


def _documented_variables() -> set[str]:
    """The PYGPUKIT_* names in the first column of docs/getting-started.md's environment table."""
    text = (ROOT / "docs" / "getting-started.md").read_text()
    section = text.split("## Environment variables", 1)[1].split("\n## ", 1)[0]
    names: set[str] = set()
    for line in section.splitlines():
        if line.startswith("|") and not line.startswith("| ---"):
            first = line.split("|")[1]
            names.update(re.findall(r"`(PYGPUKIT_[A-Z0-9_]+)`", first))
    return names


def test_the_environment_table_lists_every_variable_of_the_sources() -> None:
    in_source = _variables_in_source()
    assert {"PYGPUKIT_BACKEND", "PYGPUKIT_STAGING_MIN_BYTES", "PYGPUKIT_DEBUG_LIBRARY_LOAD"} <= set(in_source)
    documented = _documented_variables()
    missing = sorted(f"{name} (read in {where})" for name, where in in_source.items() if name not in documented)
    assert not missing, f"docs/getting-started.md's environment table lacks: {missing}"


def test_the_environment_table_lists_no_variable_nothing_reads() -> None:
    readers = [ROOT / "ci", ROOT / "benchmarks", ROOT / "tests", *(ROOT / "packages").glob("*/tests")]
    text = "\n".join(p.read_text(errors="replace") for p in _source_files())
    text += "\n".join(p.read_text(errors="replace") for r in readers for p in r.rglob("*") if p.is_file()
                       and p.suffix in {".py", ".sh"} and p.name != "test_repository.py")  # fmt: skip
    text += (ROOT / "noxfile.py").read_text()
    text += "".join(p.read_text() for p in (ROOT / "packages").glob("*/pyproject.toml"))
    stale = sorted(name for name in _documented_variables() if not re.search(rf"\b{name}\b", text))
    assert not stale, f"documented in docs/getting-started.md but read nowhere: {stale}"


def _named(name: str, text: str) -> bool:
    return re.search(rf"(?<![\w.-]){re.escape(name)}(?![\w-])", text) is not None


def test_architecture_names_every_runtime_file_and_every_crate() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text()
    runtime = sorted(p.name for p in (ROOT / "native" / "runtime").iterdir() if p.is_file())
    crates = sorted(p.parent.name for p in (ROOT / "crates").glob("*/Cargo.toml"))
    assert "c_api.h" in runtime
    assert "pygpukit-pool" in crates
    missing = [f"native/runtime/{name}" for name in runtime if not _named(name, text)]
    missing += [f"crates/{name}" for name in crates if not _named(name, text)]
    assert not missing, f"docs/architecture.md does not name: {missing}"


def test_the_name_checks_tell_apart_names_that_share_a_prefix() -> None:
    assert _named("c_api.h", "see native/runtime/c_api.h.")
    assert not _named("c_api.h", "see native/runtime/c_api.hpp")
    assert not _named("pygpukit-sched", "crates/pygpukit-sched-py")
    assert _named("pygpukit-sched", "crates/pygpukit-sched, the policy")
    assert [m.group(2) for m in _ENV_LITERAL.finditer("""getenv("PYGPUKIT_X"); 'PYGPUKIT_' "PYGPUKIT_Y must" """)] == [
        "PYGPUKIT_X"
    ]


def test_bench_report_gives_the_median_over_runs_never_the_best(tmp_path: Path) -> None:
    def stats(median: float) -> dict[str, float]:
        return {"median": median, "min": median / 10}  # a minimum that must not show

    def run(ours: float, peer: float) -> dict[str, object]:
        benches = [
            {"group": "g", "name": "test_pygpukit", "stats": stats(ours), "extra_info": {"bytes": 4e9}},
            {"group": "g", "name": "test_torch", "stats": stats(peer), "extra_info": {"bytes": 4e9}},
        ]
        return {"machine_info": {"node": "n"}, "datetime": "d", "benchmarks": benches}

    paths = []
    for i, (ours, peer) in enumerate([(1.0, 1.2), (2.0, 1.0), (1.0, 0.9)]):  # ratios 1.2, 0.5, 0.9
        paths.append(tmp_path / f"run{i}.json")
        paths[-1].write_text(json.dumps(run(ours, peer)))
    (tmp_path / "summary.json").write_text(json.dumps({"tests": 3}))  # no benchmarks: skipped
    out = subprocess.run(
        [sys.executable, str(ROOT / "ci" / "bench_report.py"), *map(str, paths), str(tmp_path / "summary.json")],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    rows = {line.split("|")[2].strip(): line for line in out.splitlines() if line.startswith("| g |")}
    assert "| 3 | 1000.00 ms | 4.0 GB/s |" in rows["pygpukit"]  # times 1, 2, 1: median 1 s
    assert "| 3 | 1000.00 ms |" in rows["torch"]  # times 1.2, 1.0, 0.9: median 1 s
    assert "| 0.90 (0.50-1.20) |" in rows["torch"]  # ratios 1.2, 0.5, 0.9
    assert "100.00 ms" not in out  # no minimum anywhere (the runs' minima are 100, 200, 100 ms)
