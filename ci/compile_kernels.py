"""Compile every kernel in native/kernels with NVRTC for every supported architecture. No GPU needed.

Used by ``nox -s kernels`` (one architecture per CUDA major) and ``nox -s kernels_full`` (every
supported architecture). ``--site DIR`` puts a directory holding NVRTC/runtime-header wheels (for
example one made with ``pip install --target``) in front of the search, so CUDA 12 and CUDA 13 NVRTC
can both be checked from one environment. Writes a JSON report; exits 1 if any compilation fails.

Every op module is imported first, so every kernel argument struct declared in Python
(pygpukit.core.abi.KernelStruct) is registered; each kernel file is compiled with the
``static_assert`` lines of the structs declared for it appended (``static_asserts_for``), so a field
added, removed or reordered on one side only fails here. ``--files`` takes substrings of the kernel
paths, relative to native/kernels (``reduction/``, ``attention/kv_cache``) or to the repository.

``--cache FILE`` remembers every compilation that passed, keyed by the SHA-256 of everything that
decides its outcome: the kernel file with its appended ``static_assert`` lines, every header under
native/kernels, the name expressions, the target architecture, the NVRTC version and the CUDA header
wheels of ``--site``. A later run skips the compilations whose key it holds, so a re-run after a
change compiles only what the change touched. Failures are never cached.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple

ARCHS = ("80", "86", "89", "90", "100", "120")
ROOT = Path(__file__).resolve().parent.parent
KERNELS = ROOT / "native" / "kernels"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--site", type=Path, help="directory with the nvidia/ wheel tree to use first")
    parser.add_argument("--archs", default=",".join(ARCHS), help="comma-separated, default: %(default)s")
    parser.add_argument("--report", type=Path, help="write a JSON report here")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--files", default="", help="comma-separated substrings: only kernel files whose path has one")
    parser.add_argument("--cache", type=Path, help="JSON file of compilations that passed (read, then updated)")
    args = parser.parse_args()

    if args.site is not None:
        site = args.site.resolve()
        sys.path.insert(0, str(site))
        libs = [site / "nvidia" / "cu13" / "lib", site / "nvidia" / "cuda_nvrtc" / "lib"]
        lib = next((d for d in libs if d.is_dir()), None)
        if lib is None:
            parser.error(f"no NVRTC library directory under {site}/nvidia")
        os.environ["PYGPUKIT_NVRTC_PATH"] = str(lib)

    import pygpukit
    from pygpukit.core.abi import registered_structs, static_asserts_for
    from pygpukit.core.builtins import name_expressions as core_expressions
    from pygpukit.core.compiler import compile_source, nvrtc_status
    from pygpukit.core.errors import NvrtcError
    from pygpukit.ops._kernels import SM90A_FILES, all_groups
    from pygpukit.ops._kernels import name_expressions as ops_expressions

    all_groups()  # imports every op module: their kernels and their KernelStructs register

    status = nvrtc_status()
    version = ".".join(map(str, status["version"]))
    print(f"NVRTC {version} from {status['path']} (pygpukit {pygpukit.__version__}; "
          f"{len(registered_structs())} kernel structs checked)", flush=True)  # fmt: skip
    sources = sorted(KERNELS.rglob("*.cu"))
    if args.files:
        wanted = [w.strip() for w in args.files.split(",") if w.strip()]
        sources = [s for s in sources
                   if any(w in s.relative_to(KERNELS).as_posix() or w in s.relative_to(ROOT).as_posix()
                          for w in wanted)]  # fmt: skip
    if not sources:
        print(f"no kernels found under {KERNELS}", file=sys.stderr)
        return 1
    archs = [a.strip() for a in args.archs.split(",") if a.strip()]
    jobs = []
    salt = _salt(version, args.site)
    for src in sources:
        relative = src.relative_to(KERNELS).as_posix()
        expressions = core_expressions(relative) or ops_expressions(relative)
        source = src.read_text() + static_asserts_for(relative)
        for arch in archs:
            # wgmma kernels compile to empty bodies for plain sm_90: check what runs there, sm_90a.
            target = f"{arch}a" if relative in SM90A_FILES and arch == "90" else arch
            key = hashlib.sha256("\0".join([salt, relative, target, *expressions, source]).encode()).hexdigest()
            jobs.append(Job(src, target, source, tuple(expressions), key))
    cache: dict[str, dict[str, Any]] = _read_cache(args.cache)
    cached = [job for job in jobs if job.key in cache]
    todo = [job for job in jobs if job.key not in cache]
    print(f"{len(sources)} kernel file(s) x {len(archs)} arch(s) = {len(jobs)} compilations, "
          f"{len(cached)} unchanged since they passed (--cache), {len(todo)} to compile", flush=True)  # fmt: skip

    def compile_one(job: Job) -> dict[str, Any]:
        rel = job.src.relative_to(ROOT).as_posix()
        start = time.perf_counter()
        try:
            program = compile_source(job.source, arch=job.target, name=rel, include_dirs=[job.src.parent],
                                     name_expressions=job.expressions)  # fmt: skip
        except NvrtcError as exc:
            return {"file": rel, "arch": f"sm_{job.target}", "ok": False, "error": str(exc)}
        seconds = time.perf_counter() - start
        return {"file": rel, "arch": f"sm_{job.target}", "ok": True, "bytes": len(program.binary),
                "seconds": seconds, "key": job.key}  # fmt: skip

    results = [{**cache[job.key], "cached": True} for job in cached]
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for done, result in enumerate(pool.map(compile_one, todo), start=1):
            results.append(result)
            mark = "ok  " if result["ok"] else "FAIL"
            detail = f"{result['bytes']:>8} B {result['seconds']:.2f} s" if result["ok"] else ""
            print(f"[{done:>3}/{len(todo)}] {mark} {result['arch']:<7} {result['file']} {detail}", flush=True)
    failures = [r for r in results if not r["ok"]]
    if args.cache is not None:
        for result in results:
            if result["ok"] and not result.get("cached"):
                cache[result["key"]] = {k: v for k, v in result.items() if k != "cached"}
        args.cache.parent.mkdir(parents=True, exist_ok=True)
        args.cache.write_text(json.dumps(cache, indent=1, sort_keys=True))
    for failure in failures:
        print(f"\n--- {failure['file']} for {failure['arch']}:\n{failure['error']}", file=sys.stderr)
    if args.report is not None:
        args.report.parent.mkdir(parents=True, exist_ok=True)
        report = {"nvrtc": version, "nvrtc_path": status["path"], "archs": archs, "results": results}
        args.report.write_text(json.dumps(report, indent=2))
    print(f"\n{len(results) - len(failures)} passed ({len(cached)} of them cached), {len(failures)} failed")
    return 1 if failures else 0


class Job(NamedTuple):
    src: Path
    target: str  # "90", "90a", ...
    source: str  # the file's text with its static_assert lines appended
    expressions: tuple[str, ...]
    key: str  # the --cache key


def _salt(nvrtc_version: str, site: Path | None) -> str:
    """What every compilation of this run shares: the NVRTC version, the CUDA header wheels of ``site``
    (their dist-info names carry the versions) and every header under native/kernels."""
    h = hashlib.sha256(f"nvrtc {nvrtc_version}\0".encode())
    if site is not None:
        h.update("\0".join(sorted(p.name for p in site.glob("*.dist-info"))).encode())
    for path in sorted([*KERNELS.rglob("*.cuh"), *KERNELS.rglob("*.h")]):
        h.update(path.relative_to(KERNELS).as_posix().encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def _read_cache(path: Path | None) -> dict[str, dict[str, Any]]:
    if path is None or not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}  # unreadable: start again
    return data if isinstance(data, dict) else {}


if __name__ == "__main__":
    sys.exit(main())
