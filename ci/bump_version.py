"""Bump one distribution's version, everything that must move with it, and check that all agree.

    bump_version.py <distribution> <version>    e.g. bump_version.py pygpukit-ops 0.2.0
    bump_version.py --check                     report every disagreement; exit 1 if there is one

A bump rewrites, in one go:

- ``version`` in ``packages/<distribution>/pyproject.toml``, and of its lockstep partners, whose
  versions are compared at import: pygpukit-core, pygpukit-core-cu12 and pygpukit-core-cu13 move
  together; pygpukit-sched moves with ``[workspace.package] version`` of Cargo.toml (and the workspace
  crates' entries in Cargo.lock), because ``_pygpukit_rust.__version__`` is the crate version;
- every exact pin of it (``"pygpukit-ops==0.1.0"``) in the other pyproject files, extras included;
- the top heading of its CHANGELOG.md: ``## <old> (unreleased)`` becomes ``## <new> (unreleased)``
  (the old version was never released); otherwise ``## <new> (unreleased)`` is added above it;
- uv.lock, by running ``uv lock`` (``--no-lock`` skips it).

It prints the distributions whose pins changed: their next release needs a version bump of their own.
``--check`` (and tests/test_packaging.py) fails when a version, a pin, a lockstep partner, a CHANGELOG
heading, Cargo.lock or uv.lock disagree.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
LOCKSTEP = [("pygpukit-core", "pygpukit-core-cu12", "pygpukit-core-cu13")]
CARGO_DISTRIBUTION = "pygpukit-sched"  # its version is the Cargo workspace version
_VERSION_LINE = re.compile(r'^version = "([^"]+)"$', re.MULTILINE)
_HEADING = re.compile(r"^## (\S+)(.*)$", re.MULTILINE)


def load_toml(path: Path) -> dict[str, Any]:
    """tomllib of Python 3.11+, or on 3.10 the copy of tomli that pip vendors."""
    try:
        import tomllib  # type: ignore[import-not-found, unused-ignore]
    except ModuleNotFoundError:  # Python 3.10
        from pip._vendor import tomli as tomllib  # type: ignore[import-not-found, unused-ignore, no-redef]
    return dict(tomllib.loads(path.read_text()))


def distributions(root: Path) -> dict[str, Path]:
    """name -> package directory, for every packages/*/pyproject.toml."""
    found = {}
    for pyproject in sorted((root / "packages").glob("*/pyproject.toml")):
        found[str(load_toml(pyproject)["project"]["name"])] = pyproject.parent
    return found


def versions(root: Path) -> dict[str, str]:
    return {name: str(load_toml(d / "pyproject.toml")["project"]["version"]) for name, d in distributions(root).items()}


def cargo_version(root: Path) -> str:
    return str(load_toml(root / "Cargo.toml")["workspace"]["package"]["version"])


def workspace_crates(root: Path) -> list[str]:
    return sorted(str(load_toml(p)["package"]["name"]) for p in (root / "crates").glob("*/Cargo.toml"))


def _pin(name: str) -> re.Pattern[str]:
    """`"<name>==<version>` inside a quoted requirement; group 2 is the version."""
    return re.compile(r"""(["'])""" + re.escape(name) + r"""==([^"';\s]+)""")


# -- checking -------------------------------------------------------------------------------------------


def changelog_heading(package: Path) -> str | None:
    match = _HEADING.search((package / "CHANGELOG.md").read_text())
    return match.group(1) if match else None


def check(root: Path) -> list[str]:
    """Every disagreement between versions, pins, lockstep partners, CHANGELOG headings and lock files."""
    problems = []
    current = versions(root)
    dirs = distributions(root)
    for name, package in dirs.items():
        heading = changelog_heading(package)
        if heading != current[name]:
            problems.append(f"{name} is {current[name]} but the top heading of its CHANGELOG.md is {heading}")
        text = (package / "pyproject.toml").read_text()
        for target, version in current.items():
            for match in _pin(target).finditer(text):
                if match.group(2) != version:
                    problems.append(f"{name} pins {target}=={match.group(2)} but {target} is {version}")
    for group in LOCKSTEP:
        if len({current[n] for n in group}) != 1:
            problems.append("lockstep versions differ: " + ", ".join(f"{n} {current[n]}" for n in group))
    cargo = cargo_version(root)
    if current[CARGO_DISTRIBUTION] != cargo:
        problems.append(f"{CARGO_DISTRIBUTION} is {current[CARGO_DISTRIBUTION]} but Cargo.toml's workspace is {cargo}")
    locked = {p["name"]: p["version"] for p in load_toml(root / "Cargo.lock").get("package", [])}
    for crate in workspace_crates(root):
        if locked.get(crate) != cargo:
            problems.append(f"Cargo.lock has {crate} {locked.get(crate)}, Cargo.toml's workspace is {cargo}")
    if (root / "uv.lock").is_file():
        uv_locked = {p["name"]: p.get("version") for p in load_toml(root / "uv.lock").get("package", [])}
        for name, version in current.items():
            if uv_locked.get(name) != version:
                problems.append(
                    f"uv.lock has {name} {uv_locked.get(name)}, its pyproject.toml {version}: run `uv lock`"
                )
    return problems


# -- bumping --------------------------------------------------------------------------------------------


def _set_version(pyproject: Path, old: str, new: str) -> None:
    text = pyproject.read_text()
    match = _VERSION_LINE.search(text)
    if match is None or match.group(1) != old:
        raise SystemExit(f'{pyproject}: no line `version = "{old}"` to change')
    pyproject.write_text(text[: match.start(1)] + new + text[match.end(1) :])


def _set_heading(changelog: Path, old: str, new: str) -> None:
    text = changelog.read_text()
    match = _HEADING.search(text)
    if match is None:
        raise SystemExit(f"{changelog}: no `## <version>` heading")
    if match.group(1) == old and "unreleased" in match.group(2):
        text = text[: match.start(1)] + new + text[match.end(1) :]
    else:
        text = text[: match.start()] + f"## {new} (unreleased)\n\n" + text[match.start() :]
    changelog.write_text(text)


def _set_cargo(root: Path, old: str, new: str) -> None:
    cargo = root / "Cargo.toml"
    text = cargo.read_text()
    section = text.index("[workspace.package]")
    match = _VERSION_LINE.search(text, section)
    if match is None or match.group(1) != old:
        raise SystemExit(f'{cargo}: no `version = "{old}"` in [workspace.package]')
    cargo.write_text(text[: match.start(1)] + new + text[match.end(1) :])
    lock = root / "Cargo.lock"
    text = lock.read_text()
    for crate in workspace_crates(root):
        text, count = re.subn(rf'(name = "{re.escape(crate)}"\nversion = "){re.escape(old)}"', rf'\g<1>{new}"', text)
        if count != 1:
            raise SystemExit(f"{lock}: no entry `{crate}` at version {old}")
    lock.write_text(text)


def bump(root: Path, distribution: str, new: str) -> list[str]:
    """Bump `distribution` (and its lockstep partners) to `new`; returns the dependents whose pins changed."""
    from packaging.version import InvalidVersion, Version

    current = versions(root)
    dirs = distributions(root)
    if distribution not in current:
        raise SystemExit(f"unknown distribution {distribution!r}; known: {', '.join(sorted(current))}")
    try:
        if Version(new) <= Version(current[distribution]):
            raise SystemExit(f"{distribution} is {current[distribution]}; the new version must be newer, got {new}")
    except InvalidVersion:
        raise SystemExit(f"{new!r} is not a PEP 440 version (like 0.2.0)") from None
    group = next((g for g in LOCKSTEP if distribution in g), (distribution,))
    old = current[distribution]
    for name in group:
        _set_version(dirs[name] / "pyproject.toml", current[name], new)
        _set_heading(dirs[name] / "CHANGELOG.md", current[name], new)
        print(f"{name}: {current[name]} -> {new} (pyproject.toml, CHANGELOG.md)")
    if distribution == CARGO_DISTRIBUTION:
        _set_cargo(root, old, new)
        print(f"Cargo workspace: {old} -> {new} (Cargo.toml, Cargo.lock)")
    dependents = []
    for name, package in dirs.items():
        pyproject = package / "pyproject.toml"
        text = pyproject.read_text()
        changed = text
        for target in group:
            changed = _pin(target).sub(rf"\g<1>{target}=={new}", changed)
        if changed != text:
            pyproject.write_text(changed)
            dependents.append(name)
            print(f"{name}: pins of {', '.join(group)} -> =={new}")
    return [d for d in dependents if d not in group]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("distribution", nargs="?")
    parser.add_argument("version", nargs="?")
    parser.add_argument("--check", action="store_true", help="only report disagreements")
    parser.add_argument("--no-lock", action="store_true", help="do not run `uv lock` after bumping")
    parser.add_argument("--root", type=Path, default=ROOT, help=argparse.SUPPRESS)  # tests bump a copy
    args = parser.parse_args()
    if not args.check:
        if not (args.distribution and args.version):
            parser.error("give a distribution and a version, e.g. `pygpukit-ops 0.2.0`, or --check")
        dependents = bump(args.root, args.distribution, args.version)
        if not args.no_lock:
            from uv import find_uv_bin

            subprocess.run([str(find_uv_bin()), "lock"], cwd=args.root, check=True)
        if dependents:
            print(f"pins changed in {', '.join(dependents)}: bump them too before their next release")
    problems = check(args.root)
    for problem in problems:
        print(f"disagreement: {problem}", file=sys.stderr)
    if not problems:
        print("versions, pins, lockstep partners, CHANGELOG headings and lock files agree")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
