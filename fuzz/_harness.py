"""The runner every fuzz target shares (issue 21, item 4).

A target is a module with ``ERRORS`` (the typed exceptions its parser may raise), ``seeds()`` (valid
inputs the fuzzer starts from) and ``one_input(data)`` (parse ``data`` and use everything parsed). It
calls :func:`main`, which runs it under atheris (coverage-guided, libFuzzer) when atheris is installed,
or else under a plain mutation loop over the seeds (no coverage feedback; says so). Any exception that
is not one of ``ERRORS`` is a finding: libFuzzer writes the input to ``--artifacts`` and exits non-zero;
the plain loop does the same.

    python fuzz/fuzz_gguf.py --seconds 20          # a short run (CI)
    python fuzz/fuzz_gguf.py --runs 1000000        # the long run
    python fuzz/fuzz_gguf.py --reproduce crash-... # run one saved input

At the end a line ``fuzz <target>: <N> executions, <S> s, <engine>`` is printed (libFuzzer's own final
statistics too, under atheris); ``nox -s fuzz`` collects those lines.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import random
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

try:
    import atheris
except ImportError:  # Python versions without an atheris wheel: the plain loop below
    atheris = None

ENGINE = "atheris" if atheris is not None else "mutation loop (no coverage feedback: atheris is not installed)"
SKIPPED = 5  # the exit status of a target that cannot run here (an optional package it parses with is missing)


def skip_unless_importable(name: str, module: str, install: str) -> None:
    """Exit with :data:`SKIPPED`, saying why, when ``module`` cannot be imported (run_all.py and the tests
    report the target as skipped, not as a finding)."""
    import importlib.util

    if importlib.util.find_spec(module) is None:
        print(f"fuzz {name}: skipped: the {module} package is not installed ({install})")
        sys.exit(SKIPPED)


@contextlib.contextmanager
def instrumented(*modules: str) -> Iterator[None]:
    """Import the parser modules inside this block so that atheris instruments them (their code only)."""
    if atheris is None:
        yield
        return
    with atheris.instrument_imports(include=list(modules)):
        yield


def _scratch_base() -> str | None:
    """``FUZZ_SCRATCH_DIR`` (run_all.py sets it to a folder it removes afterwards: libFuzzer exits without
    running Python's exit handlers), else /dev/shm (RAM) where it exists."""
    given = os.environ.get("FUZZ_SCRATCH_DIR")
    if given:
        return given
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


def scratch_dir(name: str) -> Path:
    """A private folder for the files a target writes per input."""
    return Path(tempfile.mkdtemp(prefix=f"pygpukit-fuzz-{name}-", dir=_scratch_base()))


def checked(errors: tuple[type[BaseException], ...], call: Callable[[], Any]) -> Any:
    """``call()``, with the typed ``errors`` turned into None; anything else propagates (a finding)."""
    try:
        return call()
    except errors:
        return None


def _mutate(rng: random.Random, data: bytes, corpus: Sequence[bytes]) -> bytes:
    out = bytearray(data)
    for _ in range(rng.randint(1, 8)):
        choice = rng.randrange(7)
        at = rng.randrange(len(out) + 1)
        if choice == 0 and out:  # flip a bit
            at = min(at, len(out) - 1)
            out[at] ^= 1 << rng.randrange(8)
        elif choice == 1 and out:  # an interesting byte
            out[min(at, len(out) - 1)] = rng.choice((0, 1, 0x7F, 0x80, 0xFF, ord("{"), ord('"')))
        elif choice == 2:  # insert random bytes
            out[at:at] = rng.randbytes(rng.randint(1, 16))
        elif choice == 3 and out:  # delete a range
            del out[at : at + rng.randint(1, 64)]
        elif choice == 4 and len(out) >= 8:  # an interesting 32- or 64-bit value
            width = rng.choice((4, 8))
            at = min(at, len(out) - width)
            value = rng.choice((0, 1, 2**31 - 1, 2**32 - 1, 2**63 - 1, 2**64 - 1, rng.getrandbits(width * 8)))
            out[at : at + width] = (value % (1 << (width * 8))).to_bytes(width, "little")
        elif choice == 5 and corpus:  # splice in part of another input
            other = rng.choice(corpus)
            start = rng.randrange(len(other) + 1)
            out[at:at] = other[start : start + rng.randint(1, 256)]
        elif out:  # truncate
            del out[rng.randrange(len(out)) :]
    return bytes(out)


def _plain_loop(name: str, one_input: Callable[[bytes], None], corpus: list[bytes], runs: int, seconds: float,
                artifacts: Path, seed: int) -> int:  # fmt: skip
    rng = random.Random(seed)
    start = time.monotonic()
    done = 0
    pool = list(corpus) or [b""]
    while (runs <= 0 or done < runs) and (seconds <= 0 or time.monotonic() - start < seconds):
        data = pool[done] if done < len(pool) else _mutate(rng, rng.choice(pool), pool)
        try:
            one_input(data)
        except Exception:
            artifacts.mkdir(parents=True, exist_ok=True)
            path = artifacts / f"crash-{hashlib.sha1(data).hexdigest()}"
            path.write_bytes(data)
            print(f"fuzz {name}: finding after {done} executions, input saved to {path}", file=sys.stderr)
            raise
        done += 1
        if done % 64 == 0 and len(pool) < 4096:
            pool.append(data)  # grow the pool with mutants, so mutations compound
    return done


def main(name: str, one_input: Callable[[bytes], None], seeds: Callable[[], list[bytes]],
         argv: Sequence[str] | None = None) -> None:  # fmt: skip
    parser = argparse.ArgumentParser(prog=f"fuzz/{name}.py", description=f"fuzz the {name} parser")
    parser.add_argument("--runs", type=int, default=0, help="executions to run (0: no limit)")
    parser.add_argument("--seconds", type=float, default=0, help="time to run (0: no limit)")
    parser.add_argument("--corpus", type=Path, help="corpus folder (kept; default: a temporary one)")
    parser.add_argument("--artifacts", type=Path, default=Path("build/fuzz") / name, help="where findings go")
    parser.add_argument("--seed", type=int, default=1, help="random seed")
    parser.add_argument("--max-len", type=int, default=0, help="longest input (0: 4x the largest seed)")
    parser.add_argument("--reproduce", type=Path, nargs="*", default=[], help="run these inputs once and exit")
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")  # the CPU-backend notice and the like: not findings
    if args.reproduce:
        for path in args.reproduce:
            one_input(path.read_bytes())
            print(f"fuzz {name}: {path} parsed or raised a typed error")
        return
    corpus = seeds()
    if args.runs <= 0 and args.seconds <= 0:
        args.seconds = 20.0
    max_len = args.max_len or 4 * max((len(s) for s in corpus), default=4096)
    start = time.monotonic()
    if atheris is None:
        done = _plain_loop(name, one_input, corpus, args.runs, args.seconds, args.artifacts, args.seed)
        print(f"fuzz {name}: {done} executions, {time.monotonic() - start:.0f} s, {ENGINE}")
        return
    folder = args.corpus or Path(tempfile.mkdtemp(prefix=f"pygpukit-fuzz-corpus-{name}-", dir=_scratch_base()))
    folder.mkdir(parents=True, exist_ok=True)
    for data in corpus:
        (folder / f"seed-{hashlib.sha1(data).hexdigest()}").write_bytes(data)
    args.artifacts.mkdir(parents=True, exist_ok=True)
    flags = [f"-seed={args.seed}", f"-max_len={max_len}", "-print_final_stats=1", "-rss_limit_mb=4096",
             f"-artifact_prefix={args.artifacts}{os.sep}", "-timeout=30"]  # fmt: skip
    if args.runs > 0:
        flags.append(f"-runs={args.runs}")
    if args.seconds > 0:
        flags.append(f"-max_total_time={int(max(args.seconds, 1))}")
    atheris.Setup([sys.argv[0], *flags, str(folder)], one_input)
    atheris.Fuzz()  # does not return: libFuzzer prints stat::number_of_executed_units and exits
