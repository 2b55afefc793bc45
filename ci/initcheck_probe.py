"""Is initcheck's report of pygpukit's cuBLASLt outputs and graph-replay outputs ours or the tool's? (issue 21)

compute-sanitizer's initcheck reported, over the GPU test subset, host copies ("cudaMemcpy source") of
device memory it counts as never written: the outputs of cuBLASLt GEMMs and the output of a CUDA-graph
replay. This runs small programs, each in its own process under ``compute-sanitizer --tool initcheck``,
that do the same things with torch alone (no pygpukit in the process) and with pygpukit alone, and a
control of each that initcheck must pass, then prints how many errors each reported:

- ``*_eager``: a kernel writes a fresh buffer, the host reads it (control: 0 expected);
- ``*_cublaslt``: a GEMM with a bias (cuBLASLt's epilogue in both libraries) into a fresh buffer, read back;
- ``*_graph_kernel``: a captured kernel writes a fresh buffer, the graph is replayed, the host reads it;
- ``*_graph_copy``: the buffer is first written from the host, then a replay writes it through a
  device-to-device copy node from a temporary the graph's kernel wrote, then the host reads it (the shape
  of test_graph.py::test_replay_is_bitwise_identical_to_eager).

If torch's own programs get the same reports as pygpukit's, the reports come from what initcheck does
not track, not from pygpukit leaving memory unwritten.

    python ci/initcheck_probe.py [--json PATH]           # every case under the tool
    python ci/initcheck_probe.py --case torch_graph_copy  # one case, plainly (what the tool runs)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

N = 7 * 4099


def torch_eager() -> None:
    import torch  # type: ignore[import-not-found,unused-ignore]

    x = torch.randn(N, device="cuda")
    y = x * 2.0
    assert torch.equal(y.cpu(), x.cpu() * 2.0)


def torch_cublaslt() -> None:
    import torch  # type: ignore[import-not-found,unused-ignore]

    g = torch.Generator().manual_seed(0)
    for m, k, n in ((18, 64, 48), (256, 256, 256)):
        a = torch.randn(m, k, generator=g).half().cuda()
        w = torch.randn(n, k, generator=g).half().cuda()
        b = torch.randn(n, generator=g).half().cuda()
        out = torch.nn.functional.linear(a, w, b)  # addmm with a bias: cublasLt's bias epilogue
        ref = a.float().cpu() @ w.float().cpu().T + b.float().cpu()
        assert (out.cpu().float() - ref).abs().max() < 0.5


def torch_graph_kernel() -> None:
    import torch  # type: ignore[import-not-found,unused-ignore]

    x = torch.randn(N, device="cuda")
    out = torch.empty(N, device="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        torch.mul(x, 2.0, out=out)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out.cpu(), x.cpu() * 2.0)


def torch_graph_copy() -> None:
    import torch  # type: ignore[import-not-found,unused-ignore]

    x = torch.randn(N, device="cuda")
    out = torch.from_numpy(np.full(N, np.nan, np.float64)).cuda()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        tmp = (x * 2.0).double()
        out.copy_(tmp)  # a device-to-device copy node
    out.copy_(torch.from_numpy(np.full(N, np.nan, np.float64)))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out.cpu(), (x.cpu() * 2.0).double())


AXPBY = r"""
extern "C" __global__ void scale(float a, const float* x, float* y, long long n) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i];
}
"""


def _gp_inputs() -> tuple[object, np.ndarray]:
    import pygpukit as gp

    host = np.random.default_rng(0).standard_normal(N).astype(np.float32)
    return gp.from_numpy(host), host


def gp_eager() -> None:
    import pygpukit as gp

    x, host = _gp_inputs()
    kernel = gp.jit(AXPBY, "scale")
    y = gp.empty(N, gp.float32)
    kernel(2.0, x, y, N, grid=(N + 255) // 256, block=256)
    assert np.array_equal(y.to_numpy(), host * 2.0)


def gp_cublaslt() -> None:
    import pygpukit as gp
    from pygpukit.ops.gemm import api as mm

    rng = np.random.default_rng(0)
    for m, k, n in ((18, 64, 48), (256, 256, 256)):
        a = rng.standard_normal((m, k)).astype(np.float16)
        w = rng.standard_normal((n, k)).astype(np.float16)
        b = rng.standard_normal(n).astype(np.float16)
        out = mm.linear(gp.from_numpy(a), gp.from_numpy(w), gp.from_numpy(b)).to_numpy()
        ref = a.astype(np.float64) @ w.astype(np.float64).T + b
        assert np.abs(out - ref).max() < 0.5


def gp_graph_kernel() -> None:
    import pygpukit as gp

    x, host = _gp_inputs()
    kernel = gp.jit(AXPBY, "scale")
    out = gp.empty(N, gp.float32)
    kernel(2.0, x, gp.empty(N, gp.float32), N, grid=(N + 255) // 256, block=256)  # compiled and loaded
    graph = gp.CudaGraph()
    with graph.capture():
        kernel(2.0, x, out, N, grid=(N + 255) // 256, block=256)
    graph.replay()
    graph.synchronize()
    assert np.array_equal(out.to_numpy(), host * 2.0)


def gp_graph_copy() -> None:
    import pygpukit as gp

    x, host = _gp_inputs()
    kernel = gp.jit(AXPBY, "scale")
    out = gp.full(N, np.nan, gp.float64)

    def body() -> None:
        tmp = gp.empty(N, gp.float32)
        kernel(2.0, x, tmp, N, grid=(N + 255) // 256, block=256)
        out.copy_(tmp.astype(gp.float64))

    body()  # warm: compiled, pool blocks cached
    graph = gp.CudaGraph()
    with graph.capture(mode="relaxed"):
        body()
    out.copy_(np.full(N, np.nan))
    graph.replay()
    graph.synchronize()
    assert np.array_equal(out.to_numpy(), (host * 2.0).astype(np.float64))


CASES: dict[str, Callable[[], None]] = {
    f.__name__: f
    for f in (torch_cublaslt, gp_cublaslt, torch_graph_copy, gp_graph_copy, torch_graph_kernel, gp_graph_kernel,
              torch_eager, gp_eager)
}  # fmt: skip


def _sanitizer() -> str:
    for candidate in (os.environ.get("COMPUTE_SANITIZER", ""), "/usr/local/cuda/bin/compute-sanitizer"):
        if candidate and os.path.exists(candidate):
            return candidate
    return "compute-sanitizer"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", choices=sorted(CASES))
    parser.add_argument("--json", default=None)
    parser.add_argument("--timeout", type=float, default=90.0, help="seconds per case under the tool")
    args = parser.parse_args(argv)
    if args.case:
        CASES[args.case]()
        print(f"{args.case}: ran")
        return 0
    rows: list[dict[str, Any]] = []
    for name in CASES:
        cmd = [_sanitizer(), "--tool", "initcheck", "--print-limit", "4", "--show-backtrace", "device",
               sys.executable, __file__, "--case", name]  # fmt: skip
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
        except subprocess.TimeoutExpired:
            rows.append({"case": name, "exit": None, "errors": None, "ran": False, "first": "timed out"})
            print(f"{name:20s} timed out after {args.timeout} s", flush=True)
            continue
        text = done.stdout + done.stderr
        found = re.search(r"ERROR SUMMARY: (\d+) error", text)
        first = next((line.strip() for line in text.splitlines() if "Uninitialized" in line), "")
        rows.append({"case": name, "exit": done.returncode, "errors": int(found.group(1)) if found else None,
                     "ran": f"{name}: ran" in text, "first": first, "tail": text[-1500:]})  # fmt: skip
        print(
            f"{name:20s} exit {done.returncode:3d}  ran {rows[-1]['ran']!s:5s}  initcheck errors {rows[-1]['errors']}"
            f"  {first[:100]}",
            flush=True,
        )
        if args.json:  # after every case: a run cut off by its limit keeps what it found
            with open(args.json, "w") as fh:
                json.dump(rows, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
