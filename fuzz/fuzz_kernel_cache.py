"""Fuzz target: disk entries of the compiled-kernel cache (pygpukit.core.kernel_cache).

An entry is ``PGKCUBN1``, a SHA-256 of the payload, then the payload (a length-prefixed JSON record and
the binary). Contract: reading any file gives either a well-formed CompiledProgram or None (a miss), and a
file that is not a valid entry is deleted; nothing raises. The first input byte chooses whether the rest
is the whole file or only the payload (then given a correct magic and checksum, so that the fuzzer gets
past the checksum into the record's parsing).
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import instrumented, main, scratch_dir

with instrumented("pygpukit.core.kernel_cache"):
    from pygpukit.core.compiler import CompiledProgram
    from pygpukit.core.kernel_cache import _MAGIC, KernelCache

ERRORS: tuple[type[BaseException], ...] = ()  # the cache never raises on a bad entry
_DIR = scratch_dir("kernel-cache")
_KEY = "0" * 64


def seeds() -> list[bytes]:
    cache = KernelCache(_DIR)
    found = []
    programs = [
        CompiledProgram(b"\x7fELF" + bytes(range(64)), "cubin", "sm_90", ("-O3",), "", {"k<1>": "_Z1kILi1EEvv"}),
        CompiledProgram(b"//\n.version 8.0\n.target sm_80\n", "ptx", "compute_80", (), "warning: x", {}),
    ]
    for program in programs:
        cache.put(_KEY, program)
        blob = (_DIR / f"{_KEY}.cubin").read_bytes()
        found += [b"\x00" + blob, b"\x01" + blob[40:]]  # raw file; payload only
    deep = b"[" * 5000  # JSON nested past Python's recursion limit
    found.append(b"\x01" + len(deep).to_bytes(8, "little") + deep)
    return found


def one_input(data: bytes) -> None:
    if not data:
        return
    blob = data[1:]
    if data[0] & 1:
        blob = _MAGIC + hashlib.sha256(blob).digest() + blob
    path = _DIR / f"{_KEY}.cubin"
    path.write_bytes(blob)
    cache = KernelCache(_DIR)
    program = cache.get(_KEY)
    if program is None:
        assert not path.exists(), "a corrupt entry was left on disk"
        assert cache.stats.corrupt_entries == 1
        return
    assert isinstance(program, CompiledProgram)
    assert isinstance(program.binary, bytes)
    assert program.target in ("cubin", "ptx"), program.target
    assert isinstance(program.arch, str)
    assert isinstance(program.options, tuple)
    assert all(isinstance(o, str) for o in program.options)
    assert isinstance(program.log, str)
    assert isinstance(program.lowered_names, dict)
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in program.lowered_names.items())
    assert cache.get(_KEY) is program  # now a memory hit


if __name__ == "__main__":
    main("kernel_cache", one_input, seeds)
