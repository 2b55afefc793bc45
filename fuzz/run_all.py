"""Run every fuzz target of this folder, one after another, and report the executions of each.

    python fuzz/run_all.py                       # 20 s per target (what CI's short run does, shorter)
    python fuzz/run_all.py --long                # 1,000,000 executions per target
    python fuzz/run_all.py --seconds 60 gguf     # some targets only

Writes ``build/fuzz/report.json`` (target, engine, executions, seconds, status) and exits non-zero when
a target found an input that is neither parsed nor refused with a typed error (saved under build/fuzz/).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
TARGETS = sorted(p.stem.removeprefix("fuzz_") for p in HERE.glob("fuzz_*.py"))
_LIBFUZZER = re.compile(r"stat::number_of_executed_units:\s*(\d+)")
_PLAIN = re.compile(r"fuzz \w+: (\d+) executions")
SKIPPED = 5  # _harness.SKIPPED: the target cannot run here (an optional package is missing)


def run_target(name: str, seconds: float, runs: int, artifacts: Path) -> dict[str, object]:
    command = [sys.executable, str(HERE / f"fuzz_{name}.py"), "--artifacts", str(artifacts / name)]
    command += ["--runs", str(runs)] if runs else ["--seconds", str(seconds)]
    start = time.monotonic()
    shm = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    with tempfile.TemporaryDirectory(prefix=f"pygpukit-fuzz-{name}-", dir=shm) as scratch:
        environment = {**os.environ, "FUZZ_SCRATCH_DIR": scratch}  # inputs and corpus, removed afterwards
        done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=environment, check=False)
    elapsed = time.monotonic() - start
    output = done.stdout + done.stderr
    counts = _LIBFUZZER.findall(output) or _PLAIN.findall(output)
    engine = "atheris" if _LIBFUZZER.search(output) else "mutation loop"
    skipped = done.returncode == SKIPPED
    result: dict[str, object] = {
        "target": name,
        "engine": engine,
        "executions": int(counts[-1]) if counts else 0,
        "seconds": round(elapsed, 1),
        "status": "ok" if done.returncode == 0 else "skipped" if skipped else "FINDING",
    }
    if done.returncode != 0:
        result["output_tail"] = output[-4000:]
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("targets", nargs="*", choices=[[], *TARGETS], default=[], help="default: all")
    parser.add_argument("--seconds", type=float, default=20.0, help="time per target")
    parser.add_argument("--runs", type=int, default=0, help="executions per target (instead of a time)")
    parser.add_argument("--long", action="store_true", help="1,000,000 executions per target")
    parser.add_argument("--artifacts", type=Path, default=ROOT / "build" / "fuzz")
    args = parser.parse_args(argv)
    runs = 1_000_000 if args.long else args.runs
    results = []
    for name in args.targets or TARGETS:
        result = run_target(name, args.seconds, runs, args.artifacts)
        results.append(result)
        print(f"fuzz {name}: {result['executions']} executions in {result['seconds']} s ({result['engine']}): "
              f"{result['status']}", flush=True)  # fmt: skip
        if result["status"] != "ok":
            print(result["output_tail"], file=sys.stderr)  # a finding, or why the target was skipped
    args.artifacts.mkdir(parents=True, exist_ok=True)
    report = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "machine": platform.node(),
              "python": platform.python_version(), "results": results}  # fmt: skip
    (args.artifacts / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    return 0 if all(r["status"] in ("ok", "skipped") for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
