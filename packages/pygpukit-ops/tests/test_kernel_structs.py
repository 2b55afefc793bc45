"""Kernel argument structs declared in Python (pygpukit.core.abi.KernelStruct) against their C++
definitions: every registered struct names kernel files that exist and that define (themselves or
through an included header) the C++ struct, and, with NVRTC, the struct's static_asserts (size and
every field offset) hold when compiled for one architecture. The full kernel compile check
(ci/compile_kernels.py) appends the same asserts to every kernel file; this is its fast form."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pygpukit.core import builtins
from pygpukit.core.abi import KernelStruct, registered_structs, static_asserts_for
from pygpukit.ops._kernels import all_groups, kernel_root

_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def _structs() -> list[KernelStruct]:
    all_groups()  # imports every op module: their structs register
    assert builtins.STRIDED_LAYOUT in registered_structs()
    return registered_structs()


def _root_of(relative: str) -> Path:
    """The kernel root holding ``relative``: the op kernels' (a wheel's or the checkout's) or core's."""
    for root in (kernel_root(), builtins.kernel_root()):
        if (root / relative).is_file():
            return root
    raise AssertionError(f"kernel file {relative!r} exists under no kernel root")


def _closure(path: Path) -> list[Path]:
    """``path`` and every file it includes with quotes, recursively (relative to the including file)."""
    seen: dict[Path, None] = {}
    stack = [path.resolve()]
    while stack:
        current = stack.pop()
        if current in seen:
            continue
        seen[current] = None
        for name in _INCLUDE.findall(current.read_text()):
            found = (current.parent / name).resolve()
            if found.is_file():
                stack.append(found)
    return list(seen)


def _defines(paths: list[Path], ctype: str) -> bool:
    *namespaces, name = ctype.split("::")
    definition = re.compile(rf"\bstruct\s+(alignas\s*\([^)]*\)\s*)?{re.escape(name)}\s*\{{")
    for path in paths:
        text = path.read_text()
        if definition.search(text) and all(re.search(rf"\bnamespace\s+{n}\b", text) for n in namespaces if n):
            return True
    return False


def test_every_struct_names_existing_files_that_define_it() -> None:
    structs = _structs()
    assert len(structs) >= 8  # core's StridedLayout and the op families' argument structs
    names = [s.ctype for s in structs]
    assert len(names) == len(set(names)), f"a C++ struct declared twice: {sorted(names)}"
    for struct in structs:
        assert struct.file, struct
        for relative in struct.file:
            assert relative.endswith(".cu"), f"{struct.ctype}: file {relative!r} is not a kernel file"
            path = _root_of(relative) / relative
            assert _defines(_closure(path), struct.ctype), f"{struct.ctype} is not defined in {relative} or its headers"


def test_definition_check_rejects_a_missing_struct() -> None:
    path = _root_of("reduction/reduce.cu") / "reduction/reduce.cu"
    assert _defines(_closure(path), "pygpukit::ops::ReduceLayout")
    assert not _defines(_closure(path), "pygpukit::ops::NoSuchLayout")
    assert not _defines(_closure(path), "pygpukit::elsewhere::ReduceLayout")


@pytest.mark.nvrtc
def test_static_asserts_compile_for_every_kernel_file() -> None:
    from pygpukit.core.compiler import compile_source

    files = sorted({relative for struct in _structs() for relative in struct.file})
    for relative in files:
        path = _root_of(relative) / relative
        checks = static_asserts_for(relative)
        assert "static_assert(sizeof(" in checks
        # The kernel file itself, without name expressions: its templates are not instantiated, so this
        # compiles the struct definitions and the asserts quickly.
        source = f'#include "{path.name}"\n{checks}'
        compile_source(source, arch=80, name=f"structs_{path.stem}.cu", include_dirs=[path.parent])


@pytest.mark.nvrtc
def test_a_wrong_declaration_fails_to_compile() -> None:
    """A field missing (the size differs: always checked) and two fields swapped (offsets: checked
    where NVRTC has __builtin_offsetof, as the CUDA 13 NVRTC of CI does) both fail to compile."""
    from pygpukit.core import abi
    from pygpukit.core.abi import offsets_checked
    from pygpukit.core.compiler import compile_source
    from pygpukit.core.errors import NvrtcError

    path = _root_of("core/strided_copy.cu") / "core/strided_copy.cu"
    # StridedLayout declared wrongly; unregistered again at the end (the other tests list the structs).
    short = KernelStruct("pygpukit::StridedLayout", "core/strided_copy.cu", [
        ("ndim", "int"), ("shape", "long long[8]"), ("src_strides", "long long[8]"), ("dst_strides", "long long[7]"),
    ])  # fmt: skip
    swapped = KernelStruct("pygpukit::StridedLayout", "core/strided_copy.cu", [
        ("ndim", "int"), ("shape", "long long[8]"), ("dst_strides", "long long[8]"), ("src_strides", "long long[8]"),
    ])  # fmt: skip
    offsets = [f"-DPYGPUKIT_ABI_OFFSETOF={int(offsets_checked())}"]  # what static_asserts_for's probe defines
    try:
        for wrong, message in ((short, "size differs"), (swapped, "dst_strides: offset differs")):
            if wrong is swapped and not offsets_checked():
                continue
            with pytest.raises(NvrtcError, match=message):
                compile_source(f'#include "{path.name}"\n{wrong.static_asserts()}', arch=80, name="wrong.cu",
                               include_dirs=[path.parent], options=offsets)  # fmt: skip
    finally:
        with abi._lock:
            abi._registry.remove(short)
            abi._registry.remove(swapped)
