"""NVRTC compile-only: CUBIN and PTX without a GPU, errors with log, options and numbered source."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import pygpukit as gp
from pygpukit.core.compiler import parse_arch
from pygpukit.core.errors import ArgumentError, LibraryNotFoundError, NvrtcError

SAXPY = """
extern "C" __global__ void saxpy(float a, const float* x, float* y, long long n) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
"""


@pytest.mark.parametrize(
    ("arch", "expected"), [("sm_90", "90"), ("90", "90"), (86, "86"), ((12, 0), "120"), ("sm_90a", "90a")]
)
def test_parse_arch(arch: object, expected: str) -> None:
    assert parse_arch(arch) == expected  # type: ignore[arg-type]


def test_parse_arch_rejects_nonsense() -> None:
    with pytest.raises(ArgumentError, match="architecture must look like"):
        parse_arch("hopper")


@pytest.mark.parametrize(
    ("arch", "message"),
    [
        ((9,), r"architecture tuple must be \(major, minor\).*got \(9,\)"),
        ((9, 0, 1), r"architecture tuple must be \(major, minor\)"),
        ((9, 10), r"architecture tuple must be \(major, minor\)"),
        ((-1, 0), r"architecture tuple must be \(major, minor\)"),
        ((9.0, 0), r"architecture tuple must be \(major, minor\)"),
        ((True, 0), r"architecture tuple must be \(major, minor\)"),
        ("sm_9x", r"architecture must look like 'sm_90', '90' or \(9, 0\), got 'sm_9x'"),
        (-1, r"architecture must look like .*got -1"),
        (9, r"architecture must look like .*got 9"),
        (True, r"architecture must be a str, an int or a \(major, minor\) tuple.*got bool True"),
        (9.0, r"architecture must be a str, an int .*got float 9.0"),
        ([9, 0], r"architecture must be a str, an int .*got list \[9, 0\]"),
    ],
    ids=repr,
)
def test_malformed_arch_is_an_argument_error(arch: object, message: str) -> None:
    with pytest.raises(ArgumentError, match=message):
        parse_arch(arch)  # type: ignore[arg-type]
    with pytest.raises(ArgumentError, match=message):  # before NVRTC is needed: no nvrtc mark
        gp.compile_source(SAXPY, arch=arch)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("keyword", "value", "message"),
    [
        ("options", [1], r"options must be a list of str, got the item 1 of type int"),
        ("options", ["-G", None], r"options must be a list of str, got the item None"),
        ("options", b"-G", r"options must be a list of str, got bytes"),
        ("options", 3, r"options must be a list of str, got int 3"),
        ("name_expressions", [b"k"], r"name_expressions must be a list of str"),
        ("include_dirs", 7, r"include_dirs must be a list of str, got int 7"),
        ("name", "", r"name must be a non-empty str"),
        ("target", "sass", r"target must be 'cubin' or 'ptx'"),
    ],
)
def test_malformed_compile_arguments_are_argument_errors(keyword: str, value: object, message: str) -> None:
    with pytest.raises(ArgumentError, match=message):
        gp.compile_source(SAXPY, arch=90, **{keyword: value})  # type: ignore[arg-type]


def test_source_must_be_a_str() -> None:
    with pytest.raises(ArgumentError, match="source must be a str of CUDA C\\+\\+, got bytes"):
        gp.compile_source(SAXPY.encode(), arch=90)  # type: ignore[arg-type]


@pytest.mark.nvrtc
def test_a_single_str_is_one_option(tmp_path: Path) -> None:
    """``options="-lineinfo"`` is one option (not nine one-character ones); so is a single include
    directory or name expression; lists of them and path objects work as before."""
    program = gp.compile_source(SAXPY, arch=90, options="-lineinfo")
    assert program.options[-1] == "-lineinfo"
    assert program.options == gp.compile_source(SAXPY, arch=90, options=["-lineinfo"]).options
    (tmp_path / "answer.h").write_text("#define ANSWER 42\n")
    source = '#include "answer.h"\ntemplate <int N> __global__ void k(int* x) { x[0] = N + ANSWER; }\n'
    program = gp.compile_source(source, arch=(9, 0), include_dirs=tmp_path, name_expressions="k<1>")
    assert f"--include-path={tmp_path}" in program.options
    assert set(program.lowered_names) == {"k<1>"}
    program = gp.compile_source(source, arch=90, include_dirs=[str(tmp_path)], name_expressions=("k<2>",))
    assert set(program.lowered_names) == {"k<2>"}


@pytest.mark.nvrtc
@pytest.mark.parametrize("arch", ["sm_80", "sm_86", "sm_89", "sm_90", "sm_100", "sm_120"])
def test_cubin_for_every_supported_arch(arch: str) -> None:
    program = gp.compile_source(SAXPY, arch=arch)
    assert program.binary[:4] == b"\x7fELF"
    assert program.target == "cubin"
    assert f"--gpu-architecture={arch}" in program.options


@pytest.mark.nvrtc
def test_ptx_fallback_names_the_virtual_arch() -> None:
    program = gp.compile_source(SAXPY, arch=90, target="ptx")
    text = program.binary.decode()
    assert ".target sm_90" in text
    assert ".entry saxpy" in text


@pytest.mark.nvrtc
def test_half_precision_headers_come_from_the_runtime_wheel() -> None:
    source = (
        "#include <cuda_fp16.h>\n#include <cuda_bf16.h>\n#include <cuda_fp8.h>\n"
        'extern "C" __global__ void k(__half* a, __nv_bfloat16* b, __nv_fp8_e4m3* c) {\n'
        "  a[0] = __float2half(1.f); b[0] = __float2bfloat16(2.f); c[0] = __nv_fp8_e4m3(3.f);\n}\n"
    )
    assert gp.compile_source(source, arch=89).binary[:4] == b"\x7fELF"


@pytest.mark.nvrtc
def test_name_expressions_give_mangled_names() -> None:
    source = "template <typename T> __global__ void scale(T* x, T s) { x[threadIdx.x] *= s; }\n"
    program = gp.compile_source(source, arch=80, name_expressions=["scale<float>", "scale<double>"])
    assert set(program.lowered_names) == {"scale<float>", "scale<double>"}
    assert all(name.startswith("_Z") for name in program.lowered_names.values())


@pytest.mark.nvrtc
def test_compile_error_carries_log_options_and_numbered_source() -> None:
    broken = 'extern "C" __global__ void k(float* x) {\n  x[0] = undefined_symbol;\n}\n'
    with pytest.raises(NvrtcError) as caught:
        gp.compile_source(broken, arch=90, name="broken.cu", options=["-DANSWER=42"])
    error = caught.value
    assert "undefined_symbol" in error.log
    assert "-DANSWER=42" in error.options
    text = str(error)
    assert "compilation of broken.cu failed" in text
    assert "2 |   x[0] = undefined_symbol;" in text
    assert "options:" in text
    # the runtime stays usable after a failure
    assert gp.compile_source(SAXPY, arch=90).binary[:4] == b"\x7fELF"


@pytest.mark.nvrtc
def test_bad_option_is_an_nvrtc_error() -> None:
    with pytest.raises(NvrtcError, match=r"compilation of kernel\.cu failed"):
        gp.compile_source(SAXPY, arch=90, options=["--no-such-option"])


def test_target_is_validated() -> None:
    with pytest.raises(ArgumentError, match="target must be 'cubin' or 'ptx'"):
        gp.compile_source(SAXPY, arch=90, target="sass")  # type: ignore[arg-type]


def test_missing_nvrtc_is_a_typed_error_naming_the_path(tmp_path: object) -> None:
    missing = f"{tmp_path}/libnvrtc.so.13"
    code = (
        "import pygpukit as gp\n"
        "from pygpukit.core.errors import LibraryNotFoundError\n"
        "print(gp.is_nvrtc_available(), gp.get_nvrtc_path())\n"
        "try:\n"
        "    gp.compile_source('', arch=90)\n"
        "except LibraryNotFoundError as exc:\n"
        "    print('error', exc.library, exc.attempts)\n"
    )
    env = {**os.environ, "PYGPUKIT_NVRTC_PATH": missing}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "False None"
    assert lines[1].startswith("error NVRTC")
    assert missing in lines[1]
    assert LibraryNotFoundError.__name__ == "LibraryNotFoundError"


@pytest.mark.nvrtc
def test_nvrtc_version_and_path() -> None:
    major, minor = gp.get_nvrtc_version()  # type: ignore[misc]
    assert major >= 12
    assert minor >= 0
    path = gp.get_nvrtc_path()
    assert path is not None
    assert "libnvrtc" in path


# -- kernel sources ---------------------------------------------------------------------------------
def _kernel_tree(root: Path, marker: str = "common/types.cuh") -> None:
    (root / "common").mkdir(parents=True)
    (root / "fam").mkdir()
    (root / marker).write_text("// marker\n")
    (root / "common" / "a.cuh").write_text("#pragma once\n")
    (root / "fam" / "k.cu").write_text('#include "../common/a.cuh"\n')


def test_kernel_sources_prefer_the_wheel_then_the_checkout(tmp_path: Path) -> None:
    from pygpukit.core.kernel_sources import KernelSources

    package = tmp_path / "packages" / "pkg" / "src" / "pygpukit" / "pkg"
    package.mkdir(parents=True)
    checkout = tmp_path / "native" / "kernels"
    _kernel_tree(checkout)
    sources = KernelSources(package, ("common/types.cuh", "fam/k.cu"), "test")
    assert sources.candidates() == [package / "_kernels", checkout]
    assert sources.root == checkout
    assert sources.include_dirs("fam/k.cu") == [str(checkout / "fam")]
    assert sources.source("fam/k.cu").startswith("#include")
    _kernel_tree(package / "_kernels")
    assert sources.root == checkout  # found once
    sources.clear()
    assert sources.root == package / "_kernels"  # a wheel's copy wins


def test_kernel_sources_name_every_place_they_looked(tmp_path: Path) -> None:
    from pygpukit.core.errors import PyGPUkitError
    from pygpukit.core.kernel_sources import KernelSources

    package = tmp_path / "packages" / "pkg" / "src" / "pygpukit" / "pkg"
    package.mkdir(parents=True)
    _kernel_tree(tmp_path / "native" / "kernels", marker="common/other.cuh")  # the marker is missing
    sources = KernelSources(package, ("common/types.cuh",), "test")
    with pytest.raises(PyGPUkitError, match=r"test kernel sources not found .*_kernels.*native/kernels"):
        _ = sources.root
    _kernel_tree(tmp_path / "wheel" / "_kernels")
    with pytest.raises(PyGPUkitError, match=r"test kernel source 'fam/none\.cu' cannot be read"):
        KernelSources(tmp_path / "wheel", ("common/types.cuh",), "test").source("fam/none.cu")


def test_header_digest_covers_every_header_under_the_root(tmp_path: Path) -> None:
    from pygpukit.core.kernel_sources import KernelSources

    package = tmp_path / "packages" / "pkg" / "src" / "pygpukit" / "pkg"
    package.mkdir(parents=True)
    checkout = tmp_path / "native" / "kernels"
    _kernel_tree(checkout)
    sources = KernelSources(package, ("common/types.cuh",), "test")
    first = sources.headers_digest()
    assert sources.headers_digest() == first  # computed once
    (checkout / "fam" / "family.cuh").write_text("#pragma once\n")  # a family header counts too
    sources.clear()
    second = sources.headers_digest()
    assert second != first
    (checkout / "fam" / "k.cu").write_text("// kernels themselves are part of their own cache key\n")
    sources.clear()
    assert sources.headers_digest() == second
    (checkout / "fam" / "family.cuh").write_text("#pragma once // edited\n")
    sources.clear()
    assert sources.headers_digest() not in (first, second)


def test_core_and_ops_read_the_same_checkout_tree() -> None:
    from pygpukit.core import builtins
    from pygpukit.ops import _kernels

    assert (builtins.kernel_root() / "common" / "convert.cuh").is_file()
    assert (builtins.kernel_root() / "common" / "strided.cuh").is_file()
    if builtins.kernel_root() == _kernels.kernel_root():  # a checkout (wheels each ship their own copy)
        assert builtins.SOURCES.headers_digest() == _kernels.SOURCES.headers_digest()
    assert _kernels.SOURCES.source("reduction/reduce.cu") is _kernels.SOURCES.source("reduction/reduce.cu")


def test_toolkit_headers_of_another_cuda_major_are_not_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """NVRTC 12 with a CUDA 13 toolkit's headers fails to compile cuda_fp16.h: such a toolkit include
    directory is left out; one of the same major, or whose cuda.h gives no version, is kept."""
    from pygpukit.core import compiler

    roots = {}
    for name, text in (("cuda12", "#define CUDA_VERSION 12090\n"), ("cuda13", "#define CUDA_VERSION 13000\n"),
                       ("unknown", "/* no version */\n")):  # fmt: skip
        root = tmp_path / name
        root.mkdir()
        (root / "cuda.h").write_text(text)
        (root / "cuda_fp16.h").write_text("")
        roots[name] = str(root)
    monkeypatch.setattr(compiler, "_TOOLKIT_INCLUDES", tuple(roots.values()))
    monkeypatch.setattr(compiler.sys, "path", [])
    assert compiler.cuda_include_dirs(12) == [roots["cuda12"], roots["unknown"]]
    assert compiler.cuda_include_dirs(13) == [roots["cuda13"], roots["unknown"]]
    assert compiler._toolkit_major(tmp_path / "missing") is None
