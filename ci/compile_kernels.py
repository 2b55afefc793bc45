"""Compile every kernel in native/kernels with NVRTC for every supported architecture. No GPU needed.

Used by ``nox -s kernels``. ``--site DIR`` puts a directory holding NVRTC/runtime-header wheels (for
example one made with ``pip install --target``) in front of the search, so CUDA 12 and CUDA 13 NVRTC
can both be checked from one environment. Writes a JSON report; exits 1 if any compilation fails.

Every op module is imported first, so every kernel argument struct declared in Python
(pygpukit.core.abi.KernelStruct) is registered; each kernel file is compiled with the
``static_assert`` lines of the structs declared for it appended (``static_asserts_for``), so a field
added, removed or reordered on one side only fails here. ``--files`` takes substrings of the kernel
paths, relative to native/kernels (``reduction/``, ``attention/kv_cache``) or to the repository.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

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
    jobs = [(src, arch) for src in sources for arch in archs]
    print(f"compiling {len(sources)} kernel file(s) x {len(archs)} arch(s) = {len(jobs)} compilations", flush=True)

    def compile_one(job: tuple[Path, str]) -> dict[str, Any]:
        src, arch = job
        rel = src.relative_to(ROOT).as_posix()
        target = arch
        start = time.perf_counter()
        try:
            relative = src.relative_to(KERNELS).as_posix()
            expressions = core_expressions(relative) or ops_expressions(relative)
            # wgmma kernels compile to empty bodies for plain sm_90: check what runs there, sm_90a.
            target = f"{arch}a" if relative in SM90A_FILES and arch == "90" else arch
            source = src.read_text() + static_asserts_for(relative)
            program = compile_source(
                source, arch=target, name=rel, include_dirs=[src.parent], name_expressions=expressions
            )
        except NvrtcError as exc:
            return {"file": rel, "arch": f"sm_{target}", "ok": False, "error": str(exc)}
        seconds = time.perf_counter() - start
        return {"file": rel, "arch": f"sm_{target}", "ok": True, "bytes": len(program.binary), "seconds": seconds}

    results = []
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for done, result in enumerate(pool.map(compile_one, jobs), start=1):
            results.append(result)
            mark = "ok  " if result["ok"] else "FAIL"
            detail = f"{result['bytes']:>8} B {result['seconds']:.2f} s" if result["ok"] else ""
            print(f"[{done:>3}/{len(jobs)}] {mark} {result['arch']:<7} {result['file']} {detail}", flush=True)
    failures = [r for r in results if not r["ok"]]
    for failure in failures:
        print(f"\n--- {failure['file']} for {failure['arch']}:\n{failure['error']}", file=sys.stderr)
    if args.report is not None:
        args.report.parent.mkdir(parents=True, exist_ok=True)
        report = {"nvrtc": version, "nvrtc_path": status["path"], "archs": archs, "results": results}
        args.report.write_text(json.dumps(report, indent=2))
    print(f"\n{len(results) - len(failures)} passed, {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
