"""Registers and spill bytes of each kernel of one kernel file, read from the CUBIN NVRTC builds for an
architecture: no GPU needed. Occupancy follows from the registers (an SM has 65536: a block of 256
threads at 48 registers leaves room for 5 such blocks, at 32 for 8), and a spill (local memory) shows
as a non-zero frame.

    python benchmarks/tools/kernel_registers.py reduction/softmax.cu [--arch 90] [--match shared<]

``--match`` keeps the name expressions containing that text (fewer to compile). ``--source FILE``
compiles another text in the file's place (an edited copy), with the file's expressions.
"""

from __future__ import annotations

import argparse
import struct
import sys
from pathlib import Path

from pygpukit.core.compiler import compile_source
from pygpukit.ops._kernels import all_groups, name_expressions

KERNELS = Path(__file__).resolve().parents[2] / "native" / "kernels"
_EIATTR = {0x2F: "registers", 0x11: "frame"}  # EIATTR_REGCOUNT, EIATTR_FRAME_SIZE of .nv.info


def kernel_resources(cubin: bytes) -> dict[str, dict[str, int]]:
    """Mangled kernel name -> {"registers": n, "frame": bytes} from an sm_XX CUBIN (ELF64)."""
    (section_offset,) = struct.unpack_from("<Q", cubin, 0x28)
    entry_size, count, names_index = struct.unpack_from("<HHH", cubin, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", cubin, section_offset + i * entry_size) for i in range(count)]
    names_at = sections[names_index][4]

    def name(offset: int) -> str:
        start = names_at + offset
        return cubin[start : cubin.index(b"\0", start)].decode()

    by_symbol: dict[int, dict[str, int]] = {}
    for section in sections:
        if name(section[0]) != ".nv.info":
            continue
        at, end = section[4], section[4] + section[5]
        while at < end:
            form, attribute, size = struct.unpack_from("<BBH", cubin, at)
            if form == 0x04:  # EIFMT_SVAL: a sized value (symbol index, value) for these attributes
                if attribute in _EIATTR and size == 8:
                    symbol, value = struct.unpack_from("<II", cubin, at + 4)
                    by_symbol.setdefault(symbol, {})[_EIATTR[attribute]] = value
                at += 4 + size
            else:
                at += 4
    return {
        name(section[0])[len(".text.") :]: {"registers": 0, "frame": 0, **by_symbol.get(section[7] & 0xFFFFFF, {})}
        for section in sections
        if name(section[0]).startswith(".text.")
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("file", help="kernel file relative to native/kernels, e.g. reduction/softmax.cu")
    parser.add_argument("--arch", default="90")
    parser.add_argument("--match", default="", help="only the name expressions containing this text")
    parser.add_argument("--source", help="compile this file's text instead (an edited copy)")
    args = parser.parse_args(argv)
    all_groups()  # every op module imported: their name expressions registered
    path = KERNELS / args.file
    expressions = [e for e in name_expressions(args.file) if args.match in e]
    if not expressions:
        print(f"no name expressions of {args.file} contain {args.match!r}", file=sys.stderr)
        return 1
    text = Path(args.source).read_text() if args.source else path.read_text()
    program = compile_source(text, arch=args.arch, name=args.file, include_dirs=[path.parent],
                             name_expressions=expressions)  # fmt: skip
    names = {lowered: expression for expression, lowered in program.lowered_names.items()}
    for mangled, found in sorted(kernel_resources(program.binary).items(), key=lambda item: names.get(item[0], "")):
        print(f"{found['registers']:4d} registers {found['frame']:6d} B frame  {names.get(mangled, mangled)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
