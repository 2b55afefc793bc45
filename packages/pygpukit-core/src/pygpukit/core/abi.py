"""Kernel argument structs declared once, in Python, and checked against their C++ definition.

A kernel that takes many arguments takes one struct by value. Its Python side is a
:class:`KernelStruct`: the C++ type name, the kernel file that defines it, and the fields in
declaration order with their C types (arrays as ``"long long[8]"``). From that one declaration come
the packing (``struct`` with native alignment, as the C++ compiler lays the struct out), the
:class:`~pygpukit.core.jit.Param` of the kernel signature, and :meth:`KernelStruct.static_asserts`:
C++ ``static_assert`` lines on ``sizeof`` and every ``offsetof``. The kernel compile check
(``ci/compile_kernels.py``, ``nox -s kernels``) appends those lines to each kernel file it compiles
(:func:`static_asserts_for`), so a field added, removed or reordered on one side only fails CI.
"""

from __future__ import annotations

import functools
import re
import struct
import threading
from collections.abc import Iterable, Sequence
from typing import Any

from .jit import Param

__all__ = ["KernelStruct", "offsets_checked", "registered_structs", "static_asserts_for"]

# C type -> struct format character (native size and alignment, as on the device's 64-bit ABI).
_FORMATS = {
    "double": "d", "float": "f", "signed char": "b", "char": "b", "short": "h", "int": "i", "long long": "q",
    "unsigned char": "B", "unsigned short": "H", "unsigned int": "I", "unsigned long long": "Q", "bool": "?",
    "void*": "Q", "const void*": "Q",
}  # fmt: skip
_ARRAY = re.compile(r"^(.*?)\s*\[\s*(\d+)\s*\]$")

_registry: list[KernelStruct] = []
_lock = threading.Lock()


class KernelStruct:
    """One kernel argument struct: ``KernelStruct("pygpukit::ops::NormArgs", "nn/norm.cu",
    [("x", "void*"), ("rows", "long long"), ("strides", "long long[4]"), ("eps", "float")])``.

    ``pack(*values)`` takes one value per scalar field and a sequence for an array field (shorter
    sequences are padded with zeros); ``pack_flat(*values)`` takes the flattened values (the hot path:
    no per-field work). Pointers are passed as ints.
    """

    __slots__ = ("_flat", "ctype", "fields", "file", "format", "offsets", "size", "struct")

    def __init__(self, ctype: str, file: str | Sequence[str], fields: Iterable[tuple[str, str]]) -> None:
        self.ctype = ctype
        self.file: tuple[str, ...] = (file,) if isinstance(file, str) else tuple(file)
        self.fields: tuple[tuple[str, str, int], ...] = tuple(_field(ctype, name, c) for name, c in fields)
        if not self.fields:
            raise ValueError(f"KernelStruct {ctype}: no fields")
        fmt = "@" + "".join(f"{count}{_FORMATS[base]}" for _, base, count in self.fields)
        # C pads a struct to its alignment; struct.Struct does not: add the tail padding explicitly.
        align = max(struct.calcsize("@" + _FORMATS[base]) for _, base, _ in self.fields)
        self.struct = struct.Struct(
            fmt + f"0{'q' if align == 8 else 'i' if align == 4 else 'h' if align == 2 else 'b'}"
        )
        self.format = self.struct.format
        self.size = self.struct.size
        offsets: dict[str, int] = {}
        prefix = "@"
        for name, base, count in self.fields:
            char = _FORMATS[base]
            offsets[name] = struct.calcsize(prefix + "0" + char)
            prefix += f"{count}{char}"
        self.offsets = offsets
        self._flat = tuple(count for _, _, count in self.fields)
        with _lock:
            _registry.append(self)

    def param(self, name: str = "args") -> Param:
        """The kernel parameter passing this struct by value."""
        return Param(name, self.ctype, "opaque", "")

    def pack_flat(self, *values: Any) -> bytes:
        """The struct's bytes from every scalar in order (array fields flattened, fully given)."""
        return self.struct.pack(*values)

    def pack(self, *values: Any) -> bytes:
        """The struct's bytes from one value per field (a sequence, zero-padded, for array fields)."""
        if len(values) != len(self.fields):
            raise TypeError(f"{self.ctype}: {len(self.fields)} fields, {len(values)} values given")
        flat: list[Any] = []
        for (name, _, count), value in zip(self.fields, values, strict=True):
            if count == 1 and not isinstance(value, (list, tuple)):
                flat.append(value)
                continue
            items = list(value)
            if len(items) > count:
                raise ValueError(f"{self.ctype}.{name}: at most {count} values, got {len(items)}")
            flat.extend(items + [0] * (count - len(items)))
        return self.struct.pack(*flat)

    def static_asserts(self) -> str:
        """C++ static_asserts tying the C++ definition to this declaration: its size always, and every
        field's offset where the compiler has ``__builtin_offsetof`` (NVRTC 12.x and 13.0 lack it; 13.5,
        which the CUDA 13 kernel compile check of CI installs, has it, so CI checks every offset)."""
        lines = [f"static_assert(sizeof({self.ctype}) == {self.size}, "
                 f"\"{self.ctype}: size differs from its Python KernelStruct\");",
                 "#if PYGPUKIT_ABI_OFFSETOF"]  # fmt: skip
        for name, offset in self.offsets.items():
            lines.append(f"static_assert(__builtin_offsetof({self.ctype}, {name}) == {offset}, "
                         f"\"{self.ctype}::{name}: offset differs from its Python KernelStruct\");")  # fmt: skip
        lines.append("#endif")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"KernelStruct({self.ctype!r}, {len(self.fields)} fields, {self.size} bytes)"


def _field(owner: str, name: str, ctype: str) -> tuple[str, str, int]:
    ctype = " ".join(ctype.split())
    count = 1
    match = _ARRAY.match(ctype)
    if match is not None:
        ctype, count = match.group(1), int(match.group(2))
    if ctype.endswith("*"):
        ctype = "void*"
    if ctype not in _FORMATS or count < 1:
        raise ValueError(f"KernelStruct {owner}: field {name!r} has unsupported C type {ctype!r}")
    return name, ctype, count


def registered_structs() -> list[KernelStruct]:
    """Every KernelStruct declared so far (import the op modules first to register theirs)."""
    with _lock:
        return list(_registry)


def static_asserts_for(relative_path: str) -> str:
    """The static_assert block for every struct declared for the kernel file ``relative_path``
    (relative to native/kernels), empty when there is none."""
    blocks = [s.static_asserts() for s in registered_structs() if relative_path in s.file]
    if not blocks:
        return ""
    return "\n" + _OFFSETOF_PROBE + "\n".join(blocks) + "\n"


# Defines PYGPUKIT_ABI_OFFSETOF to 1 where __builtin_offsetof exists (once per source).
_OFFSETOF_PROBE = """#ifndef PYGPUKIT_ABI_OFFSETOF
#if defined(__has_builtin)
#if __has_builtin(__builtin_offsetof)
#define PYGPUKIT_ABI_OFFSETOF 1
#endif
#endif
#endif
#ifndef PYGPUKIT_ABI_OFFSETOF
#define PYGPUKIT_ABI_OFFSETOF 0
#endif
"""


@functools.cache
def offsets_checked() -> bool:
    """Whether this machine's NVRTC checks field offsets too (has ``__builtin_offsetof``); sizes are
    always checked. Tests that break an offset on purpose skip where it does not."""
    from .compiler import compile_source
    from .errors import NvrtcError

    probe = _OFFSETOF_PROBE + "#if !PYGPUKIT_ABI_OFFSETOF\n#error no offsetof\n#endif\n"
    try:
        compile_source(probe, arch="80", name="offsetof_probe.cu")
    except NvrtcError:
        return False
    return True
