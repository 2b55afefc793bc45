"""NVRTC compile time of the built-in kernels (cold: nothing is cached at this layer). No GPU needed."""

from __future__ import annotations

from pathlib import Path

import pytest

import pygpukit as gp

KERNELS = Path(__file__).resolve().parent.parent / "native" / "kernels"


@pytest.mark.nvrtc
@pytest.mark.parametrize("kernel", ["core/fill.cu", "core/strided_copy.cu"])
def test_compile_builtin_kernel_sm90(benchmark, kernel: str) -> None:  # type: ignore[no-untyped-def]
    path = KERNELS / kernel
    source = path.read_text()
    program = benchmark.pedantic(
        gp.compile_source,
        args=(source,),
        kwargs={"arch": "sm_90", "name": kernel, "include_dirs": [path.parent]},
        rounds=3,
        iterations=1,
    )
    assert program.binary[:4] == b"\x7fELF"
    benchmark.extra_info["cubin_bytes"] = len(program.binary)
    benchmark.extra_info["nvrtc"] = ".".join(map(str, gp.get_nvrtc_version() or ()))
