"""User CUDA kernels: ``jit(source, func)`` compiles with NVRTC and returns a kernel that launches.

    kernel = jit(source, "saxpy")
    kernel(np.float32(2.0), x, y, np.int64(n), grid=(n + 255) // 256, block=256)
    kernel(2.0, x, y=y, n=n)  # by parameter name; grid and block derived from n (launch_config)

The kernel's parameters are read from the source when ``func`` is an ``extern "C"`` (or otherwise
plainly declared) ``__global__`` function, so Python ints and floats are converted to exactly the
parameter's C type, and arguments may be given by parameter name (:meth:`JITKernel.bind_arguments`).
Without ``grid``, the launch is 1-D over the element count (:meth:`JITKernel.launch_config`).
GPUArrays, DeviceBuffers, objects with ``__cuda_array_interface__`` and raw int addresses pass as
pointers. Compiled code is CUBIN for the device's exact architecture (PTX only
when NVRTC does not know the architecture), cached in memory and on disk (kernel_cache).

(Over 600 lines, on purpose: signature parsing, argument packing, binding by name, the launch
configuration and the two launch paths of one kernel class depend on each other's details, and the
hot path reads them inline.)
"""

from __future__ import annotations

import os
import re
import struct
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import backend as _backend
from .backend import backend_state, native_module
from .compiler import CompiledProgram, _strings, compile_source, nvrtc_status, parse_arch
from .errors import ArgumentError, DeviceError, DTypeError, InvalidPointerError, PyGPUkitError, ShapeError
from .kernel_cache import cache_key, kernel_cache
from .memory import reset_error
from .stream import Stream, thread_device
from .stream import _local as _thread_state
from .stream import current_streams as _current_streams

__all__ = [
    "COUNT_PARAMETER_NAMES",
    "DEFAULT_BLOCK",
    "JITKernel",
    "KernelArgumentError",
    "Param",
    "jit",
    "launch_dims",
    "parse_signature",
]

DEFAULT_BLOCK = 256  # threads per block of a launch that gives no block
# Integer parameters whose value is the element count of a launch that gives no grid (launch_config).
COUNT_PARAMETER_NAMES = ("n", "N", "size", "numel", "count", "length", "num_elements", "n_elements", "nelem", "total")
_MAX_GRID_X = 2**31 - 1
_MISSING: Any = object()  # a parameter no argument was bound to
# pygpukit.profiling's per-kernel hook, called as hook(kernel, args, grid, block, shared_mem, stream)
# instead of the launch while a Profiler records kernels (it launches through _launch_unhooked). None
# when profiling is off: the launch paths read this one global.
_launch_hook: Any = None


def set_launch_hook(hook: Any) -> Any:
    """Install (or, with None, remove) the per-launch hook of pygpukit.profiling; returns the previous one."""
    global _launch_hook
    previous, _launch_hook = _launch_hook, hook
    return previous


class KernelArgumentError(ArgumentError, TypeError):
    """The arguments of a JIT kernel call do not bind to its parameters: an unknown, missing or
    duplicate parameter name, too many or too few arguments, or no way to derive a launch
    configuration. Both an :class:`ArgumentError` and, as Python reports bad call arguments, a
    ``TypeError``."""


# (binary hash, binary size, device) -> module handle. Modules live as long as the process (or until
# a reset of their device: forget_device).
_modules: dict[tuple[int, int, int], int] = {}
_modules_lock = threading.Lock()
_kernels: weakref.WeakSet[JITKernel] = weakref.WeakSet()  # every kernel, for forget_device

# C type -> struct format of one kernel parameter.
_SCALARS = {
    "bool": "?",
    "char": "b",
    "signed char": "b",
    "unsigned char": "B",
    "int8_t": "b",
    "uint8_t": "B",
    "short": "h",
    "unsigned short": "H",
    "int16_t": "h",
    "uint16_t": "H",
    "int": "i",
    "unsigned": "I",
    "unsigned int": "I",
    "int32_t": "i",
    "uint32_t": "I",
    "long": "q",
    "unsigned long": "Q",
    "long long": "q",
    "unsigned long long": "Q",
    "int64_t": "q",
    "uint64_t": "Q",
    "size_t": "Q",
    "ptrdiff_t": "q",
    "float": "f",
    "double": "d",
    "__half": "e",
    "half": "e",
    "__nv_bfloat16": "bf16",
}
# Pointee spellings -> the DType.ctype they must match.
_ELEMENT_ALIASES = {
    "double": "double", "float": "float", "__half": "__half", "half": "__half", "__nv_bfloat16": "__nv_bfloat16",
    "__nv_fp8_e4m3": "__nv_fp8_e4m3", "__nv_fp8_e5m2": "__nv_fp8_e5m2", "signed char": "signed char",
    "int8_t": "signed char", "short": "short", "int16_t": "short", "int": "int", "int32_t": "int",
    "long long": "long long", "int64_t": "long long", "unsigned char": "unsigned char", "uint8_t": "unsigned char",
    "unsigned short": "unsigned short", "uint16_t": "unsigned short", "unsigned int": "unsigned int",
    "unsigned": "unsigned int", "uint32_t": "unsigned int", "unsigned long long": "unsigned long long",
    "uint64_t": "unsigned long long", "bool": "bool",
}  # fmt: skip
_QUALIFIERS = re.compile(r"\b(const|volatile|__restrict__|__restrict|restrict|struct|__grid_constant__)\b")


@dataclass(frozen=True)
class Param:
    """One kernel parameter as declared: its name, C type and how it is packed."""

    name: str
    ctype: str
    kind: str  # "pointer", "scalar" or "opaque" (a struct by value: pass bytes)
    format: str  # struct format for pointer/scalar ("Q" for pointers, "bf16" for bfloat16)
    element: str = ""  # pointers: the pointee's C type ("float"), checked against GPUArray dtypes


def _split_params(text: str) -> list[str]:
    parts: list[str] = []
    current: list[str] = []
    depth = 0
    for ch in text:
        if ch in "<([":
            depth += 1
        elif ch in ">)]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    if "".join(current).strip():
        parts.append("".join(current))
    return [p.strip() for p in parts if p.strip() and p.strip() != "void"]


def parse_signature(source: str, func: str) -> list[Param] | None:
    """Parameters of ``__global__ ... func(...)`` in ``source``; None if not found or templated."""
    text = re.sub(r"//[^\n]*|/\*.*?\*/", " ", source, flags=re.S)
    bounds = r"(?:__launch_bounds__\s*\([^)]*\)\s*)?"
    match = re.search(r"__global__\s+" + bounds + r"void\s+" + bounds + re.escape(func) + r"\s*\(", text)
    if match is None:
        return None
    start, depth, i = match.end(), 1, match.end()
    while i < len(text) and depth:
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        i += 1
    params = []
    for index, raw in enumerate(_split_params(text[start : i - 1])):
        declaration = _QUALIFIERS.sub(" ", raw.split("=")[0])
        declaration = " ".join(declaration.split())
        name_match = re.search(r"([A-Za-z_]\w*)\s*(\[\s*\d*\s*\])?$", declaration)
        name = name_match.group(1) if name_match else f"arg{index}"
        ctype = declaration[: name_match.start()].strip() if name_match else declaration
        if "*" in ctype or "&" in ctype or (name_match and name_match.group(2)):
            element = _ELEMENT_ALIASES.get(ctype.replace("*", "").replace("&", "").strip(), "")
            params.append(Param(name, ctype, "pointer", "Q", element))
        elif ctype in _SCALARS:
            params.append(Param(name, ctype, "scalar", _SCALARS[ctype]))
        else:
            params.append(Param(name, ctype, "opaque", ""))
    return params


def launch_dims(value: int | Sequence[int], what: str) -> tuple[int, int, int]:
    """Normalise a grid or block given as an int or 1 to 3 ints to three dimensions, all >= 1."""
    items = (value,) if isinstance(value, (int, np.integer)) else tuple(value)
    if not 1 <= len(items) <= 3:
        raise ShapeError(f"{what} must have 1 to 3 dimensions, got {value!r}")
    dims = tuple(int(v) for v in items) + (1,) * (3 - len(items))
    if any(d < 1 for d in dims):
        raise ShapeError(f"{what} dimensions must be >= 1, got {value!r}")
    return dims  # type: ignore[return-value]


def _pointer(value: Any, param: str, element: str = "") -> int:
    """The address to pass for a pointer parameter, validating GPUArrays against the declaration."""
    if value is None:
        return 0
    ptr = getattr(value, "device_ptr", None)
    if ptr is not None:
        dtype = getattr(value, "dtype", None)
        if element and dtype is not None and dtype.ctype != element:
            raise DTypeError(f"parameter {param!r} is {element}*, but the array passed has dtype {dtype.name}")
        if getattr(value, "is_contiguous", True) is False:
            raise ShapeError(
                f"parameter {param!r} receives a raw pointer, but the array passed is not contiguous "
                f"(shape {value.shape}, strides {value.strides}); pass .contiguous()"
            )
        device = getattr(getattr(value, "buffer", None), "device", None)
        if device is not None and device >= 0 and device != _current_device():
            raise DeviceError(f"parameter {param!r}: the array lives on cuda:{device}, the kernel runs on "
                              f"cuda:{_current_device()}")  # fmt: skip
        return int(ptr)
    cai = getattr(value, "__cuda_array_interface__", None)
    if cai is not None:
        return int(cai["data"][0])
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return int(value)
    raise DTypeError(f"parameter {param!r} is a pointer; got {type(value).__name__}")


def _current_device() -> int:
    return thread_device()


_array_type: type | None = None  # GPUArray, registered by array.py (which imports this module)


_archs: dict[int, str] = {}


def _device_arch(native: Any, device: int) -> str:
    """``"90"`` for an sm_90 device; cached, since reading every device property costs a fraction of a
    millisecond and kernel loads from the disk cache should not."""
    arch = _archs.get(device)
    if arch is None:
        major, minor = native.device_properties(device)["compute_capability"]
        arch = _archs[device] = f"{major}{minor}"
    return arch


def register_array_type(cls: type) -> None:
    global _array_type
    _array_type = cls


def _array_pointer(value: Any, param: Param, device: int) -> int:
    """Fast path for GPUArrays (the common argument), with the same checks as _pointer."""
    if type(value) is _array_type:
        array: Any = value
        buffer = array._buffer
        if buffer.freed:
            what = f"parameter {param.name!r}: the array"
            raise reset_error(buffer, what) or InvalidPointerError(f"{what}'s memory was freed")
        if param.element and array._dtype.ctype != param.element:
            raise DTypeError(
                f"parameter {param.name!r} is {param.element}*, but the array passed has dtype {array._dtype.name}"
            )
        if not array._contiguous:
            raise ShapeError(
                f"parameter {param.name!r} receives a raw pointer, but the array passed is not contiguous "
                f"(shape {array.shape}, strides {array.strides}); pass .contiguous()"
            )
        if buffer.device != device and buffer.device >= 0:
            raise DeviceError(f"parameter {param.name!r}: the array lives on cuda:{buffer.device}, the kernel runs on "
                              f"cuda:{device}")  # fmt: skip
        return int(buffer.ptr + array._offset * array._dtype.itemsize)
    return _pointer(value, param.name, param.element)


def _launcher_kind(param: Param) -> str:
    """The Launcher's code for a parameter (see native/bindings/launcher.cpp)."""
    if param.kind == "pointer":
        return "p"
    if param.kind == "opaque":
        return "o"
    return param.format if param.format in "bBhHiIqQfd?e" and len(param.format) == 1 else "x"


def _scalar_bytes(value: Any, fmt: str, param: str) -> bytes:
    try:
        if fmt == "bf16":
            import ml_dtypes

            return np.asarray(value, dtype=ml_dtypes.bfloat16).view(np.uint16).tobytes()
        if fmt == "e":
            return np.asarray(value, dtype=np.float16).tobytes()
        if fmt in "fd":
            if not isinstance(value, (int, float, np.integer, np.floating)) or isinstance(value, bool):
                raise TypeError
            return struct.pack("@" + fmt, float(value))
        if fmt == "?":
            return struct.pack("@?", bool(value))
        if isinstance(value, (float, np.floating)) or not isinstance(value, (int, np.integer, bool)):
            raise TypeError
        return struct.pack("@" + fmt, int(value))
    except struct.error as exc:
        raise DTypeError(f"parameter {param!r} ({fmt}): {value!r} is out of range ({exc})") from None
    except (TypeError, ValueError):
        raise DTypeError(f"parameter {param!r} needs a number of format {fmt!r}, got {type(value).__name__}") from None


_NUMPY_FORMATS = {np.dtype(k): v for k, v in {
    np.bool_: "?", np.int8: "b", np.uint8: "B", np.int16: "h", np.uint16: "H", np.int32: "i", np.uint32: "I",
    np.int64: "q", np.uint64: "Q", np.float16: "e", np.float32: "f", np.float64: "d"}.items()}  # fmt: skip


def _infer(value: Any, index: int) -> tuple[str, bytes]:
    """Format and bytes of an argument of a kernel whose signature is unknown."""
    if isinstance(value, np.generic):
        fmt = _NUMPY_FORMATS.get(value.dtype)
        if fmt is not None:
            return fmt, value.tobytes()
        if value.dtype.name == "bfloat16":
            return "H", value.tobytes()
    if isinstance(value, (bytes, bytearray)):
        return "opaque", bytes(value)
    if isinstance(value, (bool, int, float)):
        raise DTypeError(
            f"argument {index} is a Python {type(value).__name__} but the kernel's signature is unknown, so its C "
            f"type cannot be inferred; pass a NumPy scalar such as np.int32(...) or np.float32(...)"
        )
    return "Q", struct.pack("@Q", _pointer(value, f"arg{index}"))


def _pack(items: list[tuple[str, bytes]]) -> tuple[bytes, bytes]:
    """Lay out parameter bytes with C alignment; returns the buffer and each parameter's offset."""
    buffer = bytearray()
    offsets = []
    for fmt, data in items:
        align = 8 if fmt in ("opaque", "Q", "q", "d") else max(1, len(data))
        align = min(align, 8)
        buffer.extend(b"\0" * (-len(buffer) % align))
        offsets.append(len(buffer))
        buffer.extend(data)
    buffer.extend(b"\0" * (-len(buffer) % 8))
    return bytes(buffer), struct.pack(f"{len(offsets)}I", *offsets)


class JITKernel:
    """A CUDA kernel compiled from source; call it to launch."""

    def __init__(
        self,
        source: str,
        name: str,
        options: Sequence[str] = (),
        name_expressions: Sequence[str] = (),
        *,
        include_dirs: Sequence[str] = (),
        cache_salt: str = "",
        params: Sequence[Param] | None = None,
        programmatic: bool = False,
    ) -> None:
        self.source = source
        # Launched with programmatic stream serialization on SM90+ (set_programmatic_launch): the kernel
        # executes griddepcontrol.wait (common/overlap.cuh) before it touches memory that the kernel
        # before it may write, so it may start while that kernel finishes.
        self.programmatic = bool(programmatic)
        self.name = name
        self.options = tuple(_strings(options, "options"))  # a single str is one option
        self.name_expressions = tuple(name_expressions)
        self.include_dirs = tuple(str(d) for d in include_dirs)
        self._salt = cache_salt
        self.params: list[Param] | None = list(params) if params is not None else (
            None if name_expressions else parse_signature(source, name)
        )  # fmt: skip
        self._loaded: dict[int, tuple[int, int, dict[str, int]]] = {}  # device -> (module, function, attrs)
        self._lock = threading.Lock()
        self._struct: struct.Struct | None = None
        if self.params is not None and all(p.kind != "opaque" and p.format != "bf16" for p in self.params):
            self._struct = struct.Struct("@" + "".join(p.format for p in self.params))
            offsets = [struct.calcsize("@" + "".join(p.format for p in self.params[: i + 1]))
                       - struct.calcsize("@" + p.format) for i, p in enumerate(self.params)]  # fmt: skip
            self._offsets = struct.pack(f"{len(offsets)}I", *offsets)
        self._pointer_slots = [(i, p.element) for i, p in enumerate(self.params or ()) if p.kind == "pointer"]
        self._launch_info: tuple[int, int, int, int] | None = None  # (device, function, max threads, max dyn smem)
        self._fast: Any = None  # the bound Launcher.launch of the current device, once prepared
        self._fast_state: Any = None  # the backend state it was made under
        _kernels.add(self)

    @property
    def is_compiled(self) -> bool:
        return bool(self._loaded)

    def compile(self, arch: str | int | tuple[int, int], target: str = "cubin") -> CompiledProgram:
        """Compile (or fetch from the cache) for ``arch``; needs NVRTC but no GPU."""
        from .. import __version__

        arch_id = parse_arch(arch)
        status = nvrtc_status()
        key = cache_key(
            source=self.source, options=self.options + self.include_dirs, arch=arch_id, target=target,
            name_expressions=self.name_expressions, nvrtc_version=status["version"], pygpukit_version=__version__,
            salt=self._salt,
        )  # fmt: skip
        program = kernel_cache.get(key)
        if program is None:
            program = compile_source(
                self.source, arch=arch_id, target=target, name=f"{self.name}.cu", options=self.options,  # type: ignore[arg-type]
                include_dirs=self.include_dirs, name_expressions=self.name_expressions,
            )  # fmt: skip
            kernel_cache.put(key, program)
        return program

    def _entry_name(self, program: CompiledProgram) -> str:
        if self.name_expressions:
            return program.lowered_names.get(self.name) or program.lowered_names[self.name_expressions[0]]
        return self.name

    def load(self) -> tuple[int, int, dict[str, int]]:
        """Compile for the current device and load it; returns (module, function, attributes)."""
        native = native_module()
        device = thread_device()
        loaded = self._loaded.get(device)
        if loaded is not None:
            return loaded
        with self._lock:
            loaded = self._loaded.get(device)
            if loaded is not None:
                return loaded
            arch = _device_arch(native, device)
            supported = nvrtc_status()["supported_archs"]
            if not supported or int(arch) in supported:
                program = self.compile(arch, "cubin")
            else:  # NVRTC older than the GPU: PTX for the newest arch it knows; the driver finishes it
                program = self.compile(max(a for a in supported if a <= int(arch)), "ptx")
            # Kernels compiled from the same program (the built-ins' entry points) share one module.
            module_key = (hash(program.binary), len(program.binary), device)
            with _modules_lock:
                module = _modules.get(module_key)
                if module is None:
                    module = _modules[module_key] = int(native.module_load(program.binary))
            function = int(native.module_function(module, self._entry_name(program)))
            attributes = dict(native.function_attributes(function))
            # cuLaunchKernelEx (programmatic_launch_available) is in drivers of CUDA 12.0 and newer
            on = self.programmatic and _programmatic_launch and int(arch) >= 90
            if on and native.programmatic_launch_available():
                native.function_set_programmatic(function, True)
            loaded = (module, function, attributes)
            self._loaded[device] = loaded
            return loaded

    @property
    def attributes(self) -> dict[str, int]:
        """Registers, static shared memory, max threads per block, ... on the current device."""
        return dict(self.load()[2])

    def set_max_dynamic_shared_memory(self, nbytes: int) -> None:
        """Allow launches with up to ``nbytes`` of dynamic shared memory (above 48 KiB needs this)."""
        _, function, attributes = self.load()
        native_module().function_set_max_dynamic_shared(function, int(nbytes))
        attributes["max_dynamic_shared_size_bytes"] = int(nbytes)
        self._launch_info = None  # re-read the limit on the next launch
        self._fast = None

    def pack_arguments(self, args: Sequence[Any], device: int | None = None) -> tuple[bytes, bytes]:
        """The parameter buffer and the packed uint32 offsets for ``args`` (the general path: launches
        with only live, contiguous GPUArrays of the declared types take an inline fast path instead)."""
        params = self.params
        if params is None:
            return _pack([_infer(a, i) for i, a in enumerate(args)])
        if len(args) != len(params):
            raise KernelArgumentError(f"kernel {self.name} takes {len(params)} arguments "
                                      f"({', '.join(p.name for p in params)}), got {len(args)}")  # fmt: skip
        if device is None:
            device = thread_device()
        if self._struct is not None:
            values = list(args)
            for i, _element in self._pointer_slots:
                values[i] = _array_pointer(values[i], params[i], device)
            try:
                return self._struct.pack(*values), self._offsets
            except struct.error:
                pass  # find the offending argument and name it below
        items: list[tuple[str, bytes]] = []
        for p, a in zip(params, args, strict=True):
            if p.kind == "pointer":
                items.append(("Q", struct.pack("@Q", _array_pointer(a, p, device))))
            elif p.kind == "scalar":
                fmt = "H" if p.format == "bf16" else p.format
                items.append((fmt, _scalar_bytes(a, p.format, p.name)))
            else:
                if not isinstance(a, (bytes, bytearray, np.ndarray, np.void)):
                    raise DTypeError(f"parameter {p.name!r} has type {p.ctype!r}, passed by value: give its bytes")
                items.append(("opaque", bytes(a.tobytes() if hasattr(a, "tobytes") else a)))
        return _pack(items)

    def _prepare(self, device: int) -> tuple[int, int, int, int]:
        _, function, attributes = self.load()
        info = (device, function, attributes["max_threads_per_block"],
                max(attributes["max_dynamic_shared_size_bytes"], 48 * 1024))  # fmt: skip
        self._launch_info = info
        state = _backend._state
        if self.params is not None and state is not None and state.native is not None:
            # The C fast path (native/bindings/launcher.cpp): it launches when every argument is the
            # common case and returns NotImplemented otherwise, so _launch below explains what is wrong.
            kinds = "".join(_launcher_kind(p) for p in self.params)
            elements = tuple(p.element or None for p in self.params)
            launcher = state.native.Launcher(function, device, info[2], info[3], kinds, elements, _array_type,
                                             _thread_state, _current_streams)  # fmt: skip
            self._fast = launcher.launch
        # Remembered even without a fast path, so the general path does not prepare on every launch.
        self._fast_state = state
        return info

    def __new__(cls, *args: Any, **kwargs: Any) -> JITKernel:
        # A kernel given its parameters (params=, as every kernel of the library is) takes positional
        # arguments only: its __call__ has no **named, so the launch fast path stays as short as it was.
        if cls is JITKernel and kwargs.get("params") is not None:
            cls = _DeclaredKernel
        return super().__new__(cls)

    def __call__(
        self,
        *args: Any,
        grid: int | Sequence[int] | None = None,
        block: int | Sequence[int] | None = None,
        shared_mem: int = 0,
        stream: Stream | None = None,
        **named: Any,
    ) -> None:
        """Launch: ``args`` in declaration order, then ``named`` by parameter name (a kernel whose
        parameters were read from its source); ``grid``/``block`` default to :meth:`launch_config`."""
        fast = self._fast
        if (
            fast is not None
            and _launch_hook is None
            and _backend._state is self._fast_state
            and not named
            and fast(args, grid, block, shared_mem, stream) is None
        ):
            return
        if named:
            args = self.bind_arguments(args, named)
        if _launch_hook is not None:
            _launch_hook(self, args, grid, block, shared_mem, stream)
            return
        if grid is None or block is None:
            grid, block = self.launch_config(args, grid, block)
        elif not named:
            self._launch(args, grid, block, shared_mem, stream)
            return
        fast = self._fast
        if (
            fast is not None
            and _backend._state is self._fast_state
            and fast(args, grid, block, shared_mem, stream) is None
        ):
            return
        self._launch(args, grid, block, shared_mem, stream)

    def _launch_unhooked(self, args: tuple[Any, ...], grid: Any, block: Any, shared_mem: int,
                         stream: Stream | None) -> None:  # fmt: skip
        """The launch of bound ``args`` without the profiling hook (what the hook calls)."""
        if grid is None or block is None:
            grid, block = self.launch_config(args, grid, block)
        fast = self._fast
        if (
            fast is not None
            and _backend._state is self._fast_state
            and fast(args, grid, block, shared_mem, stream) is None
        ):
            return
        self._launch(args, grid, block, shared_mem, stream)

    def bind_arguments(self, args: Sequence[Any], named: dict[str, Any]) -> tuple[Any, ...]:
        """The arguments in declaration order: ``args`` first, then each of ``named`` at the position of
        the parameter of that name. Raises :class:`KernelArgumentError` for an unknown name, a
        parameter given twice (positionally and by name), too many arguments or a parameter left
        without one, and when the parameter names are unknown (a template instantiated through
        ``name_expressions``, or a declaration the parser cannot read): pass positionally then. A
        parameter named like a launch keyword (grid, block, shared_mem, stream) can only be passed
        positionally."""
        params = self.params
        if params is None:
            raise KernelArgumentError(
                f"kernel {self.name}: arguments by name ({', '.join(named)}) need the parameter names, which are "
                f"unknown for this kernel (a template instantiated through name_expressions, or a declaration "
                f"that could not be parsed); pass the arguments positionally"
            )
        names = ", ".join(p.name for p in params)
        if len(args) > len(params):
            raise KernelArgumentError(f"kernel {self.name} takes {len(params)} arguments ({names}), got "
                                      f"{len(args)} positional ones")  # fmt: skip
        index = {p.name: i for i, p in enumerate(params)}
        values = [*args, *([_MISSING] * (len(params) - len(args)))]
        for key, value in named.items():
            i = index.get(key)
            if i is None:
                raise KernelArgumentError(f"kernel {self.name} has no parameter {key!r}; its parameters: {names}")
            if i < len(args):
                raise KernelArgumentError(f"kernel {self.name}: parameter {key!r} was given twice (as positional "
                                          f"argument {i} and by name)")  # fmt: skip
            values[i] = value
        missing = [repr(p.name) for p, v in zip(params, values, strict=True) if v is _MISSING]
        if missing:
            raise KernelArgumentError(f"kernel {self.name}: no argument for parameter(s) {', '.join(missing)} "
                                      f"(parameters: {names})")  # fmt: skip
        return tuple(values)

    def element_count(self, args: Sequence[Any]) -> int:
        """The element count a launch without ``grid`` covers: the value of the first integer parameter
        named one of :data:`COUNT_PARAMETER_NAMES` (``n``, ``N``, ``size``, ``numel``, ``count``, ...),
        else the largest size of the GPUArray (or CUDA-Array-Interface) arguments. Raises
        :class:`KernelArgumentError` when there is neither."""
        for param, value in zip(self.params or (), args, strict=False):
            if (
                param.kind == "scalar"
                and param.format in "bBhHiIqQ"
                and param.name in COUNT_PARAMETER_NAMES
                and isinstance(value, (int, np.integer))
                and not isinstance(value, bool)
            ):
                return max(int(value), 0)
        sizes = [size for size in map(_array_size, args) if size is not None]
        if sizes:
            return max(sizes)
        raise KernelArgumentError(
            f"kernel {self.name}: no grid given and none can be derived (no integer parameter named "
            f"{', '.join(COUNT_PARAMETER_NAMES[:5])}, ... and no GPUArray argument); pass grid= (and block=)"
        )

    def launch_config(
        self, args: Sequence[Any], grid: int | Sequence[int] | None = None, block: int | Sequence[int] | None = None
    ) -> tuple[int | Sequence[int], int | Sequence[int]]:
        """The (grid, block) of a launch that leaves either out: block defaults to
        :data:`DEFAULT_BLOCK` (256) threads, grid to one dimension of ``ceil(count / threads per
        block)`` blocks (at least 1) over :meth:`element_count` (one thread per element, as in
        ``if (i < n)`` kernels)."""
        if block is None:
            block = DEFAULT_BLOCK
        if grid is None:
            b = launch_dims(block, "block")
            threads = b[0] * b[1] * b[2]
            blocks = max(1, -(-self.element_count(args) // threads))
            if blocks > _MAX_GRID_X:
                raise ShapeError(f"kernel {self.name}: {blocks} blocks of {threads} threads exceed the grid limit "
                                 f"({_MAX_GRID_X}); pass grid= and block=")  # fmt: skip
            grid = blocks
        return grid, block

    def _launch(self, args: tuple[Any, ...], grid: Any, block: Any, shared_mem: int, stream: Stream | None) -> None:
        """The general launch path: validates every argument and raises the typed error."""
        state = _backend._state
        if state is None or state.name != "cuda":
            state = backend_state()
            if state.name != "cuda":
                from .graph import is_capturing_on_cpu

                during = " (inside a CudaGraph capture, which records only pygpukit's ops there)"
                raise DeviceError(
                    f"launching a CUDA kernel needs the CUDA backend; the CPU simulation backend is in use "
                    f"({state.reason}) and cannot run custom kernels{during if is_capturing_on_cpu() else ''}"
                )
        device = _thread_state.device
        info = self._launch_info
        if info is None or info[0] != device or self._fast_state is not state:
            info = self._prepare(device)
        g = launch_dims(grid, "grid")
        b = launch_dims(block, "block")
        threads = b[0] * b[1] * b[2]
        if threads > info[2]:
            raise ShapeError(f"block {b} has {threads} threads; kernel {self.name} allows at most {info[2]} per "
                             "block on this device")  # fmt: skip
        if not isinstance(shared_mem, (int, np.integer)) or isinstance(shared_mem, bool):
            raise DTypeError(f"shared_mem must be an int, got {type(shared_mem).__name__}")
        shared_mem = int(shared_mem)
        if shared_mem < 0:
            raise ArgumentError(f"shared_mem must be >= 0, got {shared_mem}")
        if shared_mem > info[3]:
            raise ShapeError(
                f"shared_mem={shared_mem} exceeds the kernel's dynamic shared memory limit ({info[3]} bytes); "
                "call set_max_dynamic_shared_memory first"
            )
        buffer, offsets = self.pack_arguments(args, device)
        if stream is None:
            streams = _current_streams.get()
            handle = streams[-1]._handle if streams else 0
        else:
            handle = stream._handle
        state.native.launch(info[1], g[0], g[1], g[2], b[0], b[1], b[2], shared_mem, handle, buffer, offsets)  # type: ignore[union-attr]

    def __repr__(self) -> str:
        params = ", ".join(f"{p.ctype} {p.name}" for p in self.params) if self.params is not None else "..."
        return f"JITKernel({self.name}({params}), compiled={self.is_compiled})"


class _DeclaredKernel(JITKernel):
    """A kernel constructed with ``params=`` (the library's kernels): positional arguments only, so
    the launch fast path carries no keyword handling. ``grid``/``block`` still default to
    :meth:`JITKernel.launch_config`."""

    def __call__(  # type: ignore[override]
        self,
        *args: Any,
        grid: int | Sequence[int] | None = None,
        block: int | Sequence[int] | None = None,
        shared_mem: int = 0,
        stream: Stream | None = None,
    ) -> None:
        fast = self._fast
        if (
            fast is not None
            and _launch_hook is None
            and _backend._state is self._fast_state
            and fast(args, grid, block, shared_mem, stream) is None
        ):
            return
        if _launch_hook is not None:
            _launch_hook(self, args, grid, block, shared_mem, stream)
            return
        if grid is None or block is None:
            grid, block = self.launch_config(args, grid, block)
            fast = self._fast
            if (
                fast is not None
                and _backend._state is self._fast_state
                and fast(args, grid, block, shared_mem, stream) is None
            ):
                return
        self._launch(args, grid, block, shared_mem, stream)


def _array_size(value: Any) -> int | None:
    """The element count of a GPUArray or CUDA-Array-Interface argument, else None."""
    if _array_type is not None and isinstance(value, _array_type):
        size: int = getattr(value, "size")  # noqa: B009 - _array_type is GPUArray, registered at run time
        return size
    if getattr(type(value), "__cuda_array_interface__", None) is not None:
        shape = value.__cuda_array_interface__.get("shape", ())
        count = 1
        for dim in shape:
            count *= int(dim)
        return count
    return None


# Off by default until it has been measured on a GPU (written 2026-12-08 without one).
_programmatic_launch = os.environ.get("PYGPUKIT_PROGRAMMATIC_LAUNCH", "0") == "1"


def programmatic_launch() -> bool:
    """Whether kernels declared ``programmatic=True`` are launched with programmatic stream
    serialization on SM90 and newer devices (off unless ``PYGPUKIT_PROGRAMMATIC_LAUNCH=1`` at import or
    :func:`set_programmatic_launch`)."""
    return _programmatic_launch


def set_programmatic_launch(enabled: bool) -> bool:
    """Turn programmatic dependent launch of the kernels that allow it on or off for the launches and
    graph captures that follow (a captured graph keeps what it was captured with); returns the previous
    setting. With it, such a kernel may start (and prefetch its weights) while the kernel before it in
    the stream finishes, and waits for it with ``griddepcontrol.wait`` before reading its results."""
    global _programmatic_launch
    previous, _programmatic_launch = _programmatic_launch, bool(enabled)
    state = _backend._state
    if state is None or state.name != "cuda" or state.native is None:
        return previous
    available = state.native.programmatic_launch_available()  # cuLaunchKernelEx (CUDA 12.0 drivers on)
    for kernel in list(_kernels):
        if not kernel.programmatic:
            continue
        for device, (_, function, _) in list(kernel._loaded.items()):
            on = _programmatic_launch and available and int(_device_arch(state.native, device)) >= 90
            state.native.function_set_programmatic(function, on)
    return previous


def forget_device(device: int) -> int:
    """Device reset (core/recovery.py, before the context is reset): forget the modules loaded on
    ``device``, which died with its context, and every kernel's launch state; each kernel loads again,
    from the kernel cache (memory or disk, no recompilation), on its next launch. Returns the number
    of modules forgotten."""
    with _modules_lock:
        stale = [key for key in _modules if key[2] == device]
        for key in stale:
            del _modules[key]
    state = _backend._state
    native = state.native if state is not None and state.name == "cuda" else None
    for kernel in list(_kernels):
        with kernel._lock:
            loaded = kernel._loaded.pop(device, None)
            if loaded is not None and kernel.programmatic and native is not None:
                # the handle dies with the context; a function loaded later may get the same value
                native.function_set_programmatic(loaded[1], False)
            kernel._launch_info = None
            kernel._fast = None
            kernel._fast_state = None
    return len(stale)


def jit(
    source: str,
    func: str,
    options: Sequence[str] | None = None,
    name_expressions: Sequence[str] | None = None,
    *,
    programmatic: bool = False,
) -> JITKernel:
    """Compile ``func`` from CUDA C++ ``source`` with NVRTC; returns a launchable :class:`JITKernel`.

    On the CUDA backend it compiles and loads now, so source errors raise :class:`NvrtcError` here.
    ``name_expressions`` instantiates templates (``["scale<float>"]``; ``func`` may name one of them).
    ``programmatic=True`` promises that every thread of the kernel executes ``griddepcontrol.wait``
    before it reads what an earlier kernel writes and before it writes anything: on SM90 and newer it
    is then launched with programmatic stream serialization (:func:`set_programmatic_launch`).
    """
    if not isinstance(source, str) or not source.strip():
        raise PyGPUkitError("jit needs CUDA C++ source text")
    kernel = JITKernel(source, func, options or (), name_expressions or (), programmatic=programmatic)
    if backend_state().name == "cuda":
        kernel.load()
    return kernel
