"""The typed seam to the native module (``pygpukit.core._native_cu12`` / ``_native_cu13``).

:class:`NativeModule` lists every function, type and constant that native/bindings/module.cpp and
launcher.cpp define, with the argument names and types the bindings take, and
``backend_state().native`` is typed as it, so mypy checks every call into C++. The module itself is
loaded by :mod:`pygpukit.core._variant` and cast to this Protocol there.

tests/test_native_seam.py keeps the two sides in step: the names parsed from the bindings' sources
(and, when a native module is installed, the module's attributes) must be exactly the members here,
and every binding must be called from Python (packages/*/src) unless :data:`UNCALLED_BINDINGS` says
why it exists.

Integer arguments named ``stream``, ``event``, ``module``, ``function``, ``graph``, ``exec`` and
``ptr`` / ``dst`` / ``src`` are the driver's handle and pointer values as Python ints.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

__all__ = ["UNCALLED_BINDINGS", "NativeGemmArgs", "NativeLauncher", "NativeModule"]

# Bindings no Python source under packages/*/src calls, and why each stays.
UNCALLED_BINDINGS: dict[str, str] = {
    "driver_status": "diagnostics: the driver load's outcome without loading it (tests check it is idempotent)",
    "staging_config": "diagnostics: the effective staging thresholds read from the environment (transfer tests)",
    "gemm_plan_count": "diagnostics: cuBLASLt plans in the native cache (matmul tests check plans are reused)",
}


class NativeLauncher(Protocol):
    """The per-kernel launch object (native/bindings/launcher.cpp)."""

    @property
    def kinds(self) -> str:
        """One code per kernel parameter."""

    def launch(self, args: tuple[Any, ...], grid: Any, block: Any, shared_mem: int, stream: Any, /) -> Any:
        """None after a launch; NotImplemented when some argument needs the general path."""


class NativeGemmArgs(Protocol):
    """One cuBLASLt GEMM call shape (native/runtime/gemm.hpp), column-major terms."""

    a_dtype: int
    b_dtype: int
    d_dtype: int
    bias_dtype: int
    tf32: bool
    trans_a: bool
    trans_b: bool
    m: int
    n: int
    k: int
    lda: int
    ldb: int
    ldd: int
    batch: int
    stride_a: int
    stride_b: int
    stride_d: int
    activation: int
    bias: bool
    scales: bool
    scale_mode_a: int
    scale_mode_b: int
    d_scale: bool
    alpha: float
    beta: float

    @property
    def prepared(self) -> bool: ...


class NativeModule(Protocol):
    """The native module as Python sees it. Errors are raised as pygpukit.core.errors classes."""

    # -- constants ------------------------------------------------------------------------------------
    __version__: str
    CUDA_MAJOR: int
    CUDA_HEADER_VERSION: int
    C_API_VERSION: int
    _C_API: object  # the PyCapsule of native/runtime/c_api.h

    # -- libraries and devices ------------------------------------------------------------------------
    def load_driver(self, candidates: Sequence[str]) -> dict[str, Any]: ...
    def driver_status(self) -> dict[str, Any]: ...
    def device_count(self) -> int: ...
    def device_properties(self, ordinal: int) -> dict[str, Any]: ...
    def load_nvrtc(self, candidates: Sequence[str]) -> dict[str, Any]: ...
    def nvrtc_compile(
        self,
        source: str,
        name: str,
        options: Sequence[str],
        target: str,
        name_expressions: Sequence[str] = (),
    ) -> tuple[bytes, str, dict[str, str]]: ...
    def load_cublaslt(self, candidates: Sequence[str]) -> dict[str, Any]: ...

    # -- cuBLASLt -------------------------------------------------------------------------------------
    def GemmArgs(self) -> NativeGemmArgs: ...  # noqa: N802 - the native class, constructed without arguments
    def gemm_prepare(
        self, args: NativeGemmArgs, a: int, b: int, d: int, a_scale: int = 0, b_scale: int = 0
    ) -> bool: ...
    def gemm(
        self,
        args: NativeGemmArgs,
        a: int,
        b: int,
        d: int,
        bias: int,
        a_scale: int,
        b_scale: int,
        stream: int,
        d_scale: int = 0,
    ) -> None: ...
    def gemm_plan_count(self) -> int: ...

    # -- contexts -------------------------------------------------------------------------------------
    def set_device(self, ordinal: int) -> None: ...
    def get_device(self) -> int: ...
    def device_synchronize(self) -> None: ...
    def reset_device(self, ordinal: int) -> dict[str, Any]: ...

    # -- memory ---------------------------------------------------------------------------------------
    def mem_alloc(self, nbytes: int, stream: int = 0, /) -> int: ...
    def mem_free(self, ptr: int, device: int = -1, /) -> None: ...
    def mem_empty_cache(self, all_devices: bool = False) -> int: ...
    def mem_set_limit(self, bytes: int) -> None: ...
    def mem_stats(self) -> dict[str, Any]: ...
    def mem_set_global_limit(self, bytes: int) -> None: ...
    def mem_get_info(self) -> tuple[int, int]: ...
    def pinned_alloc(self, nbytes: int) -> int: ...
    def pinned_free(self, ptr: int) -> None: ...
    def memcpy_htod(self, dst: int, src: int, nbytes: int, stream: int = 0, async_: bool = False) -> None: ...
    def memcpy_dtoh(self, dst: int, src: int, nbytes: int, stream: int = 0, async_: bool = False) -> None: ...
    def memcpy_dtod(self, dst: int, src: int, nbytes: int, stream: int = 0, async_: bool = False) -> None: ...
    def memcpy_pageable_htod(self, dst: int, src: int, nbytes: int, stream: int = 0) -> None: ...
    def memcpy_pageable_dtoh(self, dst: int, src: int, nbytes: int, stream: int = 0) -> None: ...
    def staging_config(self) -> dict[str, int]: ...
    def memset_d8(self, dst: int, value: int, nbytes: int, stream: int = 0) -> None: ...

    # -- streams and events ---------------------------------------------------------------------------
    def stream_create(self, priority: int = 0, non_blocking: bool = True) -> int: ...
    def stream_destroy(self, stream: int) -> None: ...
    def stream_synchronize(self, stream: int) -> None: ...
    def stream_query(self, stream: int) -> bool: ...
    def stream_priority(self, stream: int) -> int: ...
    def stream_priority_range(self) -> tuple[int, int]: ...
    def stream_wait_event(self, stream: int, event: int) -> None: ...
    def event_create(self, timing: bool = True, blocking_sync: bool = False) -> int: ...
    def event_destroy(self, event: int) -> None: ...
    def event_record(self, event: int, stream: int = 0) -> None: ...
    def event_synchronize(self, event: int) -> None: ...
    def event_query(self, event: int) -> bool: ...
    def event_elapsed_ms(self, start: int, end: int) -> float: ...

    # -- modules, kernels and graphs ------------------------------------------------------------------
    def module_load(self, image: bytes) -> int: ...
    def module_function(self, module: int, name: str) -> int: ...
    def function_attributes(self, function: int) -> dict[str, int]: ...
    def function_set_max_dynamic_shared(self, function: int, bytes: int) -> None: ...
    def launch(
        self,
        function: int,
        gx: int,
        gy: int,
        gz: int,
        bx: int,
        by: int,
        bz: int,
        shared: int,
        stream: int,
        args: bytes,
        offsets: bytes,
        /,
    ) -> None: ...
    def Launcher(  # noqa: N802 - the native type, constructed with these arguments
        self,
        function: int,
        device: int,
        max_threads: int,
        max_shared: int,
        kinds: str,
        elements: tuple[str | None, ...],
        array_type: type | None,
        thread_state: Any,
        streams_var: Any,
    ) -> NativeLauncher: ...
    def capture_begin(self, stream: int, mode: int = 0) -> int: ...
    def release_hold(self, hold: int, device: int = -1) -> None: ...
    def capture_end(self, stream: int) -> int: ...
    def graph_instantiate(self, graph: int) -> int: ...
    def graph_launch(self, exec: int, stream: int = 0) -> None: ...
    def graph_exec_update(self, exec: int, graph: int) -> bool: ...
    def graph_node_count(self, graph: int) -> int: ...
    def graph_destroy(self, graph: int) -> None: ...
    def graph_exec_destroy(self, exec: int) -> None: ...
