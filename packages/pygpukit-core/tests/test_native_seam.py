"""The typed seam to the native module (pygpukit/core/_native.py) against the bindings themselves.

The names are parsed from native/bindings/*.cpp, so the first and last checks need neither a GPU nor
a built module; the built module's own attributes are compared too when one is installed.
"""

from __future__ import annotations

import inspect
import re
import typing
from pathlib import Path

import pytest

from pygpukit.core._native import UNCALLED_BINDINGS, NativeModule

ROOT = Path(__file__).resolve().parents[3]
BINDINGS = ROOT / "native" / "bindings"
SOURCES = sorted((ROOT / "packages").glob("*/src/**/*.py"))


def _binding_names() -> set[str]:
    """Every name the bindings put on the module: m.def functions, the METH_FASTCALL table, pybind11
    classes, attributes (a macro name resolved through the runtime headers) and launcher.cpp's type."""
    names: set[str] = set()
    macros: dict[str, str] = {}
    for header in (ROOT / "native" / "runtime").glob("*.h*"):
        macros.update(re.findall(r'#define (\w+) "(\w+)"', header.read_text()))
    for path in sorted(BINDINGS.glob("*.cpp")):
        text = path.read_text()
        names |= set(re.findall(r'\bm\.def\(\s*"(\w+)"', text))
        names |= set(re.findall(r'py::class_<[\w:]+>\(\s*m,\s*"(\w+)"', text))
        names |= set(re.findall(r'\bm\.attr\("(\w+)"\)\s*=', text))
        names |= {macros[macro] for macro in re.findall(r"\bm\.attr\((\w+)\)\s*=", text)}
        names |= set(re.findall(r'PyModule_AddObject\(\s*module,\s*"(\w+)"', text))
        for table_name in re.findall(r"PyModule_AddFunctions\([^,]+,\s*(\w+)\)", text):
            table = re.search(rf"PyMethodDef {table_name}\[\] = \{{(.*?)\}};", text, re.S)
            assert table is not None, f"{path.name}: method table {table_name} not found"
            names |= set(re.findall(r'\{"(\w+)",', table.group(1)))
    return names


def _protocol_functions() -> set[str]:
    return {
        name
        for name, value in vars(NativeModule).items()
        if inspect.isfunction(value) and not (name.startswith("__") and name.endswith("__"))
    }


def _protocol_names() -> set[str]:
    return _protocol_functions() | set(NativeModule.__annotations__)


def _difference(bindings: set[str], protocol: set[str]) -> str:
    return (
        f"bound but missing from NativeModule: {sorted(bindings - protocol)}; "
        f"in NativeModule but not bound: {sorted(protocol - bindings)}"
    )


def test_parsing_finds_every_kind_of_binding() -> None:
    names = _binding_names()
    # One of each form, so a parser that silently finds nothing of a kind fails here.
    assert {"set_device", "mem_alloc", "launch", "Launcher", "GemmArgs", "__version__", "_C_API"} <= names
    assert "kinds" not in names  # the Launcher's own members are not module attributes


def test_protocol_lists_exactly_the_bound_names() -> None:
    bindings, protocol = _binding_names(), _protocol_names()
    assert bindings == protocol, _difference(bindings, protocol)


def test_built_module_has_exactly_the_protocol_names() -> None:
    from pygpukit.core import _variant

    native = _variant.any_native()
    if native is None:
        pytest.skip("no native module installed")
    attributes = {name for name in dir(native) if not (name.startswith("__") and name.endswith("__"))}
    attributes |= {name for name in ("__version__",) if hasattr(native, name)}
    assert attributes == _protocol_names(), _difference(attributes, _protocol_names())


def _called_from_python() -> set[str]:
    """Names called on the native module in packages/*/src: ``.name(`` on an expression ending in
    ``native``, ``native_module()`` or ``_native()`` (every way the sources reach the module)."""
    pattern = re.compile(r"native(?:_module\(\)|\(\))?\.(\w+)\(")
    return {name for path in SOURCES for name in pattern.findall(path.read_text())}


def test_every_binding_is_called_from_python_or_justified() -> None:
    called = _called_from_python()
    uncalled = _protocol_functions() - called
    unexplained = uncalled - set(UNCALLED_BINDINGS)
    assert not unexplained, (
        f"bindings no Python source calls: {sorted(unexplained)}; remove them from native/bindings and "
        "NativeModule, or say why they stay in UNCALLED_BINDINGS (core/_native.py)"
    )
    stale = set(UNCALLED_BINDINGS) - uncalled
    assert not stale, f"UNCALLED_BINDINGS names bindings that are called (or no longer exist): {sorted(stale)}"
    assert all(reason.strip() for reason in UNCALLED_BINDINGS.values())


def test_backend_state_native_is_typed_as_the_protocol() -> None:
    from pygpukit.core import backend

    namespace = {**vars(backend), "NativeModule": NativeModule}  # imported there for type checking only
    assert typing.get_type_hints(backend.BackendState, globalns=namespace)["native"] == NativeModule | None
    assert typing.get_type_hints(backend.native_module, globalns=namespace)["return"] is NativeModule
