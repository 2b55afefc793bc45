"""The SM 90 prefill attention kernel (native/kernels/attention/attention_prefill_sm90.cu): when it runs,
its tilings, its launch and its compile-check enumeration. attention.py plans the launches.

``flash_prefill_sm90<T, HD, BN, STAGES, SKEW>`` computes what ``flash_prefill`` computes (same
AttentionArgs, same grid order) with warpgroup MMA (wgmma, sm_90a): 256 threads per block, 128 query
rows per block, BN keys per tile, STAGES shared-memory stages of K and V; with SKEW the second
warpgroup runs half a tile behind the first, so one's softmax overlaps the other's matrix products.
It runs for fp16 and bf16 with head dimensions 64 and 128 over strided keys (``sdpa_causal``,
``sdpa``, ``prefill_attention``) on devices of compute capability 9.0 exactly, with an NVRTC that
targets sm_90a. Everything else (other devices, head dimensions, float32, paged keys) keeps the SM 80
kernels of attention_prefill.cu.

:func:`set_prefill_kernel` (or the environment variable ``PYGPUKIT_PREFILL_KERNEL``, read at import:
``auto``, the default, or ``sm80``) forces the SM 80 kernel for comparison. The choice is part of the
launch-plan key, so switching takes effect at the next call.
"""

from __future__ import annotations

import os
from typing import Any

from pygpukit.core.compiler import CompiledProgram, parse_arch
from pygpukit.core.dtypes import DType, bfloat16, float16
from pygpukit.core.errors import ArgumentError
from pygpukit.core.jit import JITKernel, Param

from ._kernels import NAMESPACE, SOURCES, Groups, register_enumerator
from .gemm._base import device_props

__all__ = ["CHOICE", "FILE", "THREADS", "config", "describe", "expression", "grid", "kernel", "set_prefill_kernel",
           "shared_bytes"]  # fmt: skip

FILE = "attention/attention_prefill_sm90.cu"
KINDS = ("auto", "sm80")
ENV = "PYGPUKIT_PREFILL_KERNEL"
HEAD_DIMS = (64, 128)
BLOCK_M = 128  # query rows per block (two warpgroups of 64)
THREADS = 256
# (keys per tile, shared-memory stages, skewed warpgroups) per head dimension, best first; the first
# whose shared memory fits the device runs. A skewed kernel needs three stages or more (the lagging
# warpgroup reads the previous tile's): at head_dim 128, (128 + 6 * 128) * 128 * 2 bytes + 1 KiB =
# 225 KiB, within an H100's 227 KiB.
Tiling = tuple[int, int, bool]
CONFIGS: dict[int, list[Tiling]] = {
    64: [(128, 4, True), (128, 2, False)],
    128: [(128, 3, True), (128, 2, False)],
}
# Also compiled, for tuning (benchmarks/test_ops_attention.py times them) and tested.
ALTERNATIVES: dict[int, list[Tiling]] = {64: [(128, 3, False)], 128: [(64, 3, True), (128, 3, False)]}


class Choice:
    """The kernel kind attention.py plans with: ``auto`` (the SM 90 kernel where it applies) or ``sm80``."""

    __slots__ = ("kind",)

    def __init__(self, kind: str) -> None:
        self.kind = kind


def _parse(value: str, what: str) -> str:
    kind = value.strip().lower() or DEFAULT
    if kind not in KINDS:
        raise ArgumentError(f"{what} must be one of {', '.join(KINDS)}, got {value!r}")
    return kind


DEFAULT = "auto"  # the choice when PYGPUKIT_PREFILL_KERNEL is unset or empty
_env_value = os.environ.get(ENV, "")
_env_kind = _env_value.strip().lower() or DEFAULT
# A bad environment value fails the first prefill plan (not the import), naming the variable.
CHOICE = Choice(_env_kind if _env_kind in KINDS else "invalid")


def set_prefill_kernel(kind: str) -> None:
    """Which kernel the fp16/bf16 prefill attention (``sdpa_causal``, ``sdpa``, ``prefill_attention``)
    runs: ``"auto"`` (the default: on SM 90 devices the wgmma kernel for head dimensions 64 and 128, else
    the mma.sync kernel) or ``"sm80"`` (the mma.sync kernel everywhere, for comparison). Takes effect at
    the next call. The environment variable ``PYGPUKIT_PREFILL_KERNEL`` sets the initial choice."""
    if not isinstance(kind, str):
        raise ArgumentError(f"set_prefill_kernel: kind must be a str ({', '.join(KINDS)}), got {type(kind).__name__}")
    CHOICE.kind = _parse(kind, "set_prefill_kernel: kind")


def shared_bytes(head_dim: int, tiling: Tiling) -> int:
    """Dynamic shared memory of one block: the Q tile, STAGES stages of K and V, 1 KiB of alignment."""
    block_n, stages, _ = tiling
    return (BLOCK_M + 2 * stages * block_n) * head_dim * 2 + 1024


def expression(dtype: DType, head_dim: int, tiling: Tiling) -> str:
    block_n, stages, skew = tiling
    return (f"{NAMESPACE}attention::flash_prefill_sm90<{dtype.ctype}, {head_dim}, {block_n}, {stages}, "
            f"{str(skew).lower()}>")  # fmt: skip


def config(dtype: DType, head_dim: int, paged: bool, device: int) -> Tiling | None:
    """The tiling of the SM 90 kernel for this call on ``device``, or None where the SM 80 kernels run
    (called when a launch plan is made)."""
    if CHOICE.kind != "auto":
        if CHOICE.kind == "invalid":
            raise ArgumentError(f"{ENV} must be one of {', '.join(KINDS)}, got {_env_value!r}")
        return None
    if paged or head_dim not in HEAD_DIMS or dtype not in (float16, bfloat16):
        return None
    props = device_props(device)
    if not props.wgmma:  # compute capability 9.0 exactly and an NVRTC that targets sm_90a
        return None
    return next((c for c in CONFIGS[head_dim] if shared_bytes(head_dim, c) <= props.shared_per_block), None)


class _Sm90aKernel(JITKernel):
    """A JIT kernel whose SM 90 build targets sm_90a, the architecture-specific ISA that wgmma needs."""

    def compile(self, arch: str | int | tuple[int, int], target: str = "cubin") -> CompiledProgram:
        arch_id = parse_arch(arch)
        return super().compile("90a" if arch_id == "90" else arch_id, target)


_kernels: dict[str, JITKernel] = {}


def kernel(name: str, params: list[Param], shared: int) -> JITKernel:
    """The kernel of expression ``name``, allowed ``shared`` bytes of dynamic shared memory on the
    current device (called when a launch plan is made: once per call shape and device)."""
    found = _kernels.get(name)
    if found is None:
        found = _kernels[name] = _Sm90aKernel(
            SOURCES.source(FILE), name, name_expressions=[name], include_dirs=SOURCES.include_dirs(FILE),
            cache_salt=SOURCES.headers_digest(), params=params,
        )  # fmt: skip
    if shared > 48 * 1024:
        found.set_max_dynamic_shared_memory(shared)
    return found


def grid(batch: int, seq_q: int, heads: int) -> int:
    """Blocks of a launch: one per 128 query rows of each (batch, head)."""
    return -(-seq_q // BLOCK_M) * batch * heads


def enumerate_kernels() -> Groups:
    """Every instantiation the SM 90 path can launch, one compilation each (as they are compiled at run time)."""
    found: list[tuple[str, ...]] = []
    for head_dim in HEAD_DIMS:
        for dtype in (float16, bfloat16):
            for tiling in CONFIGS[head_dim] + ALTERNATIVES.get(head_dim, []):
                found.append((expression(dtype, head_dim, tiling),))
    return {FILE: found}


def describe(plan: Any) -> str:
    """'sm90' or 'sm80': which prefill kernel a plan launches (for tests and benchmarks)."""
    return "sm90" if isinstance(getattr(plan, "kernel", None), _Sm90aKernel) else "sm80"


register_enumerator(enumerate_kernels)
