"""Triton on pygpukit arrays, streams and contexts, without torch.

Triton's launcher takes a pointer argument from any object with a ``data_ptr()`` method and a
``dtype`` whose ``str()`` is a torch-style name (``float16``, ``bfloat16``, ``float8_e4m3fn``, ...):
pygpukit's :class:`~pygpukit.core.array.GPUArray` has both, so it is passed to a ``@triton.jit``
kernel as it is (zero-copy). :class:`TritonArray` is a thin adapter on top for kernels that want
torch-like helpers (``stride(i)``, ``numel()``) and checks that name the bad value.

Which device, context and stream a launch uses is the business of Triton's *driver*
(``triton.runtime.driver.driver.active``). Triton's own CUDA driver asks torch for them, so it is
not even active without torch. :func:`use_triton_backend` makes :class:`PygpukitCudaDriver` the
active driver through ``DriverConfig.set_active`` -- the one seam of Triton this package touches --
which answers with pygpukit's thread device (whose primary context it makes current) and pygpukit's
current stream (also the capture stream inside ``CudaGraph.capture()``). Used as a context manager it
restores the previous driver on exit.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from pygpukit.core.array import GPUArray
from pygpukit.core.array import from_numpy as _array_from_numpy
from pygpukit.core.backend import backend_state
from pygpukit.core.dtypes import DType, uint8
from pygpukit.core.errors import BackendUnavailableError, DTypeError, PyGPUkitError, ShapeError
from pygpukit.core.stream import current_stream, thread_device

__all__ = [
    "TritonArray",
    "TritonKernelError",
    "from_gpuarray",
    "from_numpy",
    "require_gpu_array",
    "scratch_allocator",
    "triton_available",
    "triton_version",
    "use_triton_backend",
]

_MIN_VERSION = (3, 0)


class TritonKernelError(PyGPUkitError, RuntimeError):
    """A kernel of :mod:`pygpukit.triton.kernels` failed in Triton itself: its compilation
    (``CompilationError``), its resources (``OutOfResources``: shared memory, registers) or its launch
    (Triton's launcher reports a CUDA error as ``RuntimeError("Triton Error [CUDA]: ...")``). The
    message names the kernel; Triton's exception is the ``__cause__``. Bad arguments never get here:
    they raise pygpukit's ShapeError / DTypeError / InvalidPointerError before Triton is called."""

    def __init__(self, message: str, *, kernel: str = "") -> None:
        super().__init__(message)
        self.kernel = kernel


def triton_error(error: BaseException, kernel: str = "") -> TritonKernelError | None:
    """``error`` as a :class:`TritonKernelError` naming ``kernel`` when Triton raised it, else None."""
    if not _from_triton(error):
        return None
    what = f"pygpukit.triton.kernels.{kernel}" if kernel else "a pygpukit.triton kernel"
    return TritonKernelError(f"{what} failed in Triton: {type(error).__name__}: {error}", kernel=kernel)


def _from_triton(error: BaseException) -> bool:
    """Whether ``error`` was raised by Triton (its exception classes, or its launcher's RuntimeError)."""
    if isinstance(error, PyGPUkitError):
        return False
    module = type(error).__module__ or ""
    return (
        module == "triton"
        or module.startswith("triton.")
        or (type(error) is RuntimeError and str(error).startswith("Triton Error"))
    )


_state: dict[str, Any] = {}  # "triton": the module or None; "driver": our driver once made
_lock = threading.Lock()


def _import_triton() -> Any:
    if "triton" not in _state:
        try:
            module: Any = importlib.import_module("triton")
            version = tuple(int(p) for p in module.__version__.split(".")[:2] if p.isdigit())
            _state["triton"] = module if version >= _MIN_VERSION else None
        except ImportError:
            _state["triton"] = None
    return _state["triton"]


def triton_version() -> str | None:
    """The installed Triton's version string, or None when Triton (3.0 or newer) cannot be imported."""
    module = _import_triton()
    return None if module is None else str(module.__version__)


def triton_available() -> bool:
    """True when Triton 3.0 or newer imports *and* pygpukit runs on the CUDA backend, i.e. when
    Triton kernels can run on pygpukit arrays here (compiling with ``triton.compile`` needs only the
    former: :func:`triton_version`)."""
    return _import_triton() is not None and backend_state().name == "cuda"


def _require_triton() -> Any:
    module = _import_triton()
    if module is None:
        raise BackendUnavailableError(
            "Triton 3.0 or newer is not installed, so pygpukit.triton cannot run Triton kernels; "
            'install it with the extra: pip install "pygpukit[triton]"'
        )
    return module


def _require_cuda(what: str) -> Any:
    state = backend_state()
    if state.name != "cuda":
        raise BackendUnavailableError(
            f"{what} needs the CUDA backend, but pygpukit runs on the {state.name} backend (no usable GPU, or "
            "PYGPUKIT_BACKEND=cpu); Triton kernels cannot run on the CPU simulation, use the built-in ops there"
        )
    return state.native


# -- the driver -------------------------------------------------------------------------------------


def _benchmark(kernel_call: Callable[[], Any], warmup: int = 25, rep: int = 100, **kwargs: Any) -> Any:
    """``triton.testing.do_bench`` on pygpukit events (no torch): the mean (or ``quantiles``, or the
    ``return_mode`` statistic: min, max, mean, median) of the milliseconds one call takes on the
    current stream."""
    from pygpukit.core.stream import Event

    stream = current_stream()
    kernel_call()
    stream.synchronize()
    start, end = Event(), Event()
    start.record(stream)
    for _ in range(5):
        kernel_call()
    end.record(stream)
    end.synchronize()
    estimate = max(start.elapsed_time(end) / 5, 1e-3)
    for _ in range(min(1000, max(1, int(warmup / estimate)))):
        kernel_call()
    times = []
    for _ in range(min(1000, max(1, int(rep / estimate)))):
        begin, finish = Event(), Event()
        begin.record(stream)
        kernel_call()
        finish.record(stream)
        times.append((begin, finish))
    stream.synchronize()
    ms = sorted(b.elapsed_time(f) for b, f in times)
    quantiles: Sequence[float] | None = kwargs.get("quantiles")
    if quantiles:
        picked = [ms[min(len(ms) - 1, int(q * len(ms)))] for q in quantiles]
        return picked[0] if len(picked) == 1 else picked
    mode = kwargs.get("return_mode", "mean")  # do_bench's default
    if mode == "min":
        return ms[0]
    if mode == "max":
        return ms[-1]
    if mode == "mean":
        return sum(ms) / len(ms)
    return ms[len(ms) // 2]


def _make_driver() -> Any:
    _require_triton()
    from triton.backends.nvidia import driver as nvidia

    class PygpukitCudaDriver(nvidia.CudaDriver):  # type: ignore[misc]
        """Triton's CUDA driver with pygpukit, not torch, answering device, context and stream."""

        def __init__(self) -> None:  # CudaDriver's would import torch (GPUDriver.__init__)
            self.utils = nvidia.CudaUtils()
            self.launcher_cls = nvidia.CudaLauncher

        @staticmethod
        def is_active() -> bool:
            return backend_state().name == "cuda"

        def get_current_device(self) -> int:
            native = _require_cuda("launching a Triton kernel")
            device = thread_device()
            native.set_device(device)  # makes pygpukit's primary context of it current on this thread
            return device

        def set_current_device(self, device: int) -> None:
            from pygpukit.core.device import set_device

            set_device(device)

        def get_current_stream(self, device: int | None = None) -> int:
            return current_stream().handle

        def get_device_capability(self, device: int = 0) -> tuple[int, int]:
            from pygpukit.core.device import get_device_info

            major, minor = get_device_info(device).compute_capability
            return int(major), int(minor)

        def get_active_torch_device(self) -> Any:
            raise BackendUnavailableError("pygpukit's Triton driver has no torch device; pass pygpukit arrays")

        def get_device_interface(self) -> Any:
            raise BackendUnavailableError("pygpukit's Triton driver has no torch device interface")

        def get_benchmarker(self) -> Any:
            return _benchmark

        def get_empty_cache_for_benchmark(self) -> Any:
            from pygpukit.core.array import empty

            return empty((256 * 1024 * 1024,), uint8)

        def clear_cache(self, cache: Any) -> None:
            _require_cuda("clearing the benchmark cache").memset_d8(
                cache.device_ptr, 0, cache.nbytes, current_stream().handle
            )

    return PygpukitCudaDriver()


def pygpukit_driver() -> Any:
    """The one :class:`PygpukitCudaDriver` (made on first use; it compiles Triton's small C helper)."""
    drv = _state.get("driver")
    if drv is None:
        with _lock:
            drv = _state.get("driver")
            if drv is None:
                _require_cuda("pygpukit's Triton driver")
                drv = _state["driver"] = _make_driver()
    return drv


class _Activation:
    """What :func:`use_triton_backend` returns: a context manager restoring the previous driver."""

    def __init__(self, config: Any, previous: Any) -> None:
        self._config = config
        self._previous = previous

    def __enter__(self) -> _Activation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.restore()

    def restore(self) -> None:
        """Put back the driver that was active before (None: Triton chooses again on next use)."""
        self._config._active = self._previous

    def __repr__(self) -> str:
        return "use_triton_backend()"


def use_triton_backend() -> _Activation:
    """Make Triton launch on pygpukit's current device, CUDA context and stream (no torch involved).

    Installs :class:`PygpukitCudaDriver` as ``triton.runtime.driver.driver``'s active driver (its
    ``set_active``) and returns an object that restores the previous one, on ``restore()`` or at the
    end of a ``with use_triton_backend():`` block. Raises :class:`BackendUnavailableError` without
    Triton or on the CPU backend."""
    _require_triton()
    drv = pygpukit_driver()
    from triton.runtime.driver import driver as config

    _state["config"] = config
    previous = config._active
    config.set_active(drv)
    return _Activation(config, previous)


@contextmanager
def pygpukit_launches(kernel: str = "") -> Iterator[None]:
    """pygpukit's driver active inside the block, the previous one restored at its end (what the
    kernels of :mod:`pygpukit.triton.kernels` launch under; nothing changes when it is already active).
    An error of Triton's inside the block comes out as :class:`TritonKernelError` naming ``kernel``."""
    drv = pygpukit_driver()
    config: Any = _state.get("config")
    if config is None:
        from triton.runtime.driver import driver

        config = _state["config"] = driver
    previous = config._active
    if previous is not drv:
        config.set_active(drv)
    try:
        yield
    except Exception as error:
        typed = triton_error(error, kernel)
        if typed is None:
            raise
        raise typed from error
    finally:
        if previous is not drv:
            config._active = previous


def scratch_allocator(size: int, alignment: int, stream: int | None) -> GPUArray:
    """A ``triton.set_allocator`` allocator from pygpukit's pool, for kernels that need global scratch
    memory (TMA descriptors made on the device, ...): ``triton.set_allocator(scratch_allocator)``."""
    from pygpukit.core.array import empty

    size, alignment = max(int(size), 1), max(int(alignment), 1)
    block = empty((size + alignment,), uint8)  # on the current stream: the launch's, under our driver
    skip = -block.device_ptr % alignment
    return block[skip : skip + size]


# -- arrays -----------------------------------------------------------------------------------------


def require_gpu_array(value: Any, what: str = "argument", *, contiguous: bool = False) -> GPUArray:
    """``value`` as a GPUArray Triton can read: on the CUDA backend, not freed, of an addressable dtype
    (not the packed int4) and, with ``contiguous``, C-contiguous; else the typed error naming it."""
    if isinstance(value, TritonArray):
        value = value.array
    if not isinstance(value, GPUArray):
        raise DTypeError(f"{what} must be a GPUArray or TritonArray, got {type(value).__name__}")
    if value.dtype.packed:
        raise DTypeError(f"{what} has dtype {value.dtype}, packed two per byte: Triton has no pointer type for it; "
                         "unpack with .astype(int8) first")  # fmt: skip
    value.device_ptr  # noqa: B018 - raises InvalidPointerError (or DeviceResetError) when freed
    if not value.on_gpu:
        _require_cuda(f"{what} (shape {value.shape}, dtype {value.dtype}, device {value.device})")
    if contiguous and not value.is_contiguous:
        raise ShapeError(f"{what} must be contiguous for this Triton kernel, got shape {value.shape} and strides "
                         f"{value.strides} (bytes); call .contiguous() first")  # fmt: skip
    return value


class TritonArray:
    """A zero-copy view of a GPUArray for Triton kernels: ``data_ptr()`` and ``dtype`` (Triton's
    pointer protocol) plus torch-like ``shape``, ``stride()``, ``numel()``, ``element_size()`` and
    ``is_contiguous()``. ``array`` is the GPUArray; the adapter keeps it (and its memory) alive."""

    __slots__ = ("array",)

    def __init__(self, array: GPUArray) -> None:
        self.array = require_gpu_array(array, "TritonArray's array")

    @property
    def dtype(self) -> DType:
        return self.array.dtype

    @property
    def shape(self) -> tuple[int, ...]:
        return self.array.shape

    @property
    def ndim(self) -> int:
        return self.array.ndim

    def data_ptr(self) -> int:
        """The device address of the first element; InvalidPointerError once the memory was freed."""
        return self.array.device_ptr

    def stride(self, dim: int | None = None) -> Any:
        """Strides in elements (torch's convention), all of them or that of ``dim``."""
        strides = tuple(s // self.array.itemsize for s in self.array.strides)
        if dim is None:
            return strides
        if not -len(strides) <= dim < len(strides):
            raise ShapeError(f"stride: dimension {dim} is out of range for shape {self.array.shape}")
        return strides[dim]

    def numel(self) -> int:
        return self.array.size

    def element_size(self) -> int:
        return self.array.itemsize

    def is_contiguous(self) -> bool:
        return self.array.is_contiguous

    def to_numpy(self) -> Any:
        return self.array.to_numpy()

    def __repr__(self) -> str:
        a = self.array
        return f"TritonArray(shape={a.shape}, dtype={a.dtype.name}, device={a.device})"


def from_gpuarray(array: GPUArray) -> TritonArray:
    """Wrap ``array`` for Triton without copying (typed errors for freed, int4 or CPU-backend arrays)."""
    return TritonArray(array)


def from_numpy(values: Any) -> TritonArray:
    """Copy a NumPy array to the device (on the current stream) and wrap it for Triton."""
    _require_cuda("pygpukit.triton.from_numpy")
    return TritonArray(_array_from_numpy(values))
