"""Checks run inside a fresh venv that installed pygpukit from the wheelhouse (`release.py install-test`).

    wheel_check.py --versions JSON --imports pygpukit.ops,... [--variant cu12]

Imports every listed module and compares each distribution's installed version with JSON (the
versions of the checkout's pyproject files); checks that `pygpukit info` finds the CUDA 13 NVRTC and
cuBLASLt of the NVIDIA wheels (a plain `pip install pygpukit` brings them) and lists the native
variants; compiles a runtime kernel and an op kernel from the
sources inside the installed wheels (NVRTC needs no GPU); with --variant cu12 also imports the CUDA 12
native module and compiles with the CUDA 12 NVRTC and headers of the cu12 wheels. Standard library and
pygpukit only. Exits 1 with the reason on the first failure.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata as metadata
import json
import os
import subprocess
import sys
from pathlib import Path

BF16_KERNEL = (
    "#include <cuda_bf16.h>\n"
    'extern "C" __global__ void k(__nv_bfloat16* x) { x[threadIdx.x] = __float2bfloat16(1.0f); }\n'
)


def fail(message: str) -> None:
    raise SystemExit(f"FAIL {message}")


def ok(message: str) -> None:
    print(f"ok   {message}", flush=True)


def check_imports(modules: list[str], versions: dict[str, str]) -> None:
    for module in modules:
        importlib.import_module(module)
    ok(f"imported {', '.join(modules)}")
    for distribution, expected in versions.items():
        try:
            found = metadata.version(distribution)
        except metadata.PackageNotFoundError:
            continue
        if found != expected:
            fail(f"{distribution} {found} is installed, the checkout is at {expected}")
    ok("installed versions equal the checkout's")


def check_info(variants: list[str]) -> None:
    from pygpukit.info import collect_info, format_info

    info = collect_info()
    print(format_info(info), flush=True)
    if not set(variants) <= set(info["native_variants_installed"]):
        fail(f"native variants {info['native_variants_installed']}, expected {variants} among them")
    nvrtc = info["nvrtc"]
    if not nvrtc["found"] or int(nvrtc["version"][0]) != 13 or "site-packages" not in nvrtc["path"]:
        fail(f"pygpukit info does not report the CUDA 13 NVRTC of the nvidia-cuda-nvrtc wheel: {nvrtc}")
    cublaslt = info["cublaslt"]
    if not cublaslt["found"] or "site-packages" not in cublaslt["path"] or ".so.13" not in cublaslt["path"]:
        fail(f"pygpukit info does not report the CUDA 13 cuBLASLt of the nvidia-cublas wheel: {cublaslt}")
    ok(f"pygpukit info: NVRTC {nvrtc['version'][0]}.{nvrtc['version'][1]} and cuBLASLt {cublaslt['version']} "
       f"from the wheels, variants {variants}")  # fmt: skip


def check_compile() -> None:
    import pygpukit as gp
    from pygpukit.core.builtins import builtin_kernel, kernel_root
    from pygpukit.ops._kernels import SOURCES, name_expressions

    for root in (kernel_root(), SOURCES.root):
        if "site-packages" not in str(root):
            fail(f"kernel sources read from {root}, not from the installed wheel")
    cubin = builtin_kernel("fill", gp.bfloat16).compile("sm_90").binary
    if cubin[:4] != b"\x7fELF":
        fail(f"the fill kernel did not compile to CUBIN: {cubin[:4]!r}")
    relative = "nn/rope.cu"
    program = gp.compile_source(SOURCES.source(relative), arch="sm_80", name=relative,
                                include_dirs=SOURCES.include_dirs(relative),
                                name_expressions=name_expressions(relative))  # fmt: skip
    if program.binary[:4] != b"\x7fELF" or not program.lowered_names:
        fail(f"{relative} did not compile to CUBIN with its name expressions")
    ok(f"compiled core/fill.cu (bf16, sm_90) and ops {relative} ({len(program.lowered_names)} kernels, sm_80)")


def check_cu12() -> None:
    import pygpukit

    native = importlib.import_module("pygpukit.core._native_cu12")
    if native.__version__ != pygpukit.__version__:
        fail(f"_native_cu12 {native.__version__} next to pygpukit-core {pygpukit.__version__}")
    lib = next((Path(p) / "nvidia" / "cuda_nvrtc" / "lib" for p in sys.path
                if (Path(p) / "nvidia" / "cuda_nvrtc" / "lib" / "libnvrtc.so.12").is_file()), None)  # fmt: skip
    if lib is None:
        fail("the nvidia-cuda-nvrtc-cu12 wheel is not installed")
    code = (
        "import pygpukit as gp\n"
        "assert gp.get_nvrtc_version()[0] == 12, gp.get_nvrtc_version()\n"
        f"assert gp.compile_source({BF16_KERNEL!r}, arch=80).binary[:4] == b'\\x7fELF'\n"
    )
    env = {**os.environ, "PYGPUKIT_NVRTC_PATH": str(lib)}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        fail(f"CUDA 12 NVRTC from {lib} did not compile a bf16 kernel:\n{result.stderr}")
    ok(f"_native_cu12 imports; NVRTC 12 from {lib} compiles a bf16 kernel with the cu12 headers")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--versions", required=True, help="JSON: distribution -> version")
    parser.add_argument("--imports", required=True, help="comma-separated modules")
    parser.add_argument("--variant", choices=["cu12", "cu13"], default="cu13")
    args = parser.parse_args()
    check_imports([m for m in args.imports.split(",") if m], json.loads(args.versions))
    check_info(["cu13", "cu12"] if args.variant == "cu12" else ["cu13"])
    check_compile()
    if args.variant == "cu12":
        check_cu12()
    print("wheel check passed", flush=True)


if __name__ == "__main__":
    main()
