"""Which cuBLASLt fp8 scale modes this GPU and cuBLASLt run, in which operand order, and how fast.

scaled_matmul hands cuBLASLt the row-major product y = x @ w.T as the column-major D^T = w x^T: cuBLASLt's
A is the weight, its B the activations ("ours"). cuBLASLt's documentation and samples show the 1x128 x
128x128 block mode with A scaled per 1x128 (VEC128_32F) and B per 128x128 block (BLK128x128_32F), the
other way round; an H100 run of 2026-12-07 found no block algorithm and an INVALID_VALUE launch for the
per-channel (OUTER_VEC_32F) mode in our order. This probe asks both orders ("ours", and "flipped": A = x,
B = w, D = y^T column-major, i.e. y's transpose in row-major terms) for every mode, with and without a
bias, launches what was planned, checks each result against a float64 product of the same fp8 values and
scales, and times the ones that work at a large size next to torch._scaled_mm (per-tensor, per-row and,
where torch has it, 1x128 x 128x128 blockwise scales), as medians of CUDA-event timings.

    python benchmarks/tools/cublaslt_scale_probe.py [--size 8192] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import traceback
from typing import Any

import numpy as np

MODES = {"tensor": (0, 0), "channel": (3, 3), "block": (4, 5)}  # (activation's mode, weight's mode)


def _native() -> Any:
    from pygpukit.core.backend import backend_state

    native = backend_state().native
    if native is None:
        sys.exit("cublaslt_scale_probe: needs the CUDA backend")
    return native


def _operands(m: int, n: int, k: int, kind: str, rng: np.random.Generator) -> dict[str, Any]:
    """x, w quantized for ``kind``: device arrays and their float64 values (scales applied)."""
    import pygpukit as gp
    from pygpukit.ops.gemm.scaled import block_weight_scale
    from pygpukit.ops.quant import quantize_block_fp8, quantize_fp8, quantize_per_channel

    x = gp.from_numpy(rng.standard_normal((m, k)).astype(np.float32)).astype("bfloat16")
    w_host = (rng.standard_normal((n, k)) * 0.05).astype(np.float32)
    gran = {"tensor": "tensor", "channel": "row", "block": "block"}[kind]
    q, sx = quantize_fp8(x, gran)
    qx = q.to_numpy().astype(np.float64)
    sxh = sx.to_numpy().astype(np.float64)
    if kind == "block":
        bw = quantize_block_fp8(w_host)
        data, w_scale = bw.data, block_weight_scale(bw.scale)
        full = np.repeat(np.repeat(bw.scale.to_numpy().astype(np.float64), 128, 0)[:n], 128, 1)[:, :k]
        w_val = bw.data.to_numpy().astype(np.float64) * full
        x_val = qx * np.repeat(sxh, 128, axis=1)[:, :k]
        sx_dev = sx  # (M, G) view, M-major storage: the (G, M) contiguous buffer
    else:
        cw = quantize_per_channel(w_host, "fp8")
        data = cw.data
        if kind == "tensor":
            s = float(np.abs(w_host).max() / 448.0)
            w_scale = gp.from_numpy(np.array([s], np.float32))
            w_val = data.to_numpy().astype(np.float64) * s  # the data of per-channel quantization, one scale
        else:
            w_scale = cw.scale
            w_val = data.to_numpy().astype(np.float64) * cw.scale.to_numpy().astype(np.float64)[:, None]
        x_val = qx * (sxh.reshape(-1)[0] if kind == "tensor" else sxh[:, None])
        sx_dev = sx
    return {"q": q, "sx": sx_dev, "w": data, "sw": w_scale, "x_val": x_val, "w_val": w_val}


def _args(native: Any, m: int, n: int, k: int, order: str, kind: str, bias: bool, out: str) -> Any:
    from pygpukit.core.codes import DTYPE_CODES

    g = native.GemmArgs()
    g.a_dtype = g.b_dtype = DTYPE_CODES["float8_e4m3fn"]
    g.d_dtype = DTYPE_CODES[out]
    act_mode, w_mode = MODES[kind]
    if order == "ours":  # D (n x m col-major) = op(A = w: stored k x n col-major, transposed) x (B = x^T)
        g.trans_a, g.trans_b = True, False
        g.m, g.n, g.k = n, m, k
        g.lda, g.ldb, g.ldd = k, k, n
        g.scale_mode_a, g.scale_mode_b = w_mode, act_mode
    else:  # flipped: D (m x n col-major) = op(A = x) op(B = w^T)
        g.trans_a, g.trans_b = True, False
        g.m, g.n, g.k = m, n, k
        g.lda, g.ldb, g.ldd = k, k, m
        g.scale_mode_a, g.scale_mode_b = act_mode, w_mode
    g.batch, g.stride_a, g.stride_b, g.stride_d = 1, 0, 0, m * n
    g.scales = True
    if bias:
        g.bias, g.bias_dtype = True, DTYPE_CODES[out]
    return g


def _run_case(native: Any, ops: dict[str, Any], m: int, n: int, k: int, order: str, kind: str, bias: bool,
              out: str, check: bool = True) -> dict[str, Any]:  # fmt: skip
    import pygpukit as gp

    row: dict[str, Any] = {"kind": kind, "order": order, "bias": bias, "out": out, "m": m, "n": n, "k": k}
    g = _args(native, m, n, k, order, kind, bias, out)
    d = gp.empty((m, n) if order == "ours" else (n, m), out)
    d.copy_(np.full(d.shape, np.nan, np.float32).astype(d.dtype.numpy))
    b_host = np.random.default_rng(5).standard_normal(m if order == "flipped" else n).astype(np.float32)
    b = gp.from_numpy(b_host).astype(out) if bias else None
    a_ptr, b_ptr = (ops["w"].device_ptr, ops["q"].device_ptr) if order == "ours" else (
        ops["q"].device_ptr, ops["w"].device_ptr)  # fmt: skip
    a_scale, b_scale = (ops["sw"].device_ptr, ops["sx"].device_ptr) if order == "ours" else (
        ops["sx"].device_ptr, ops["sw"].device_ptr)  # fmt: skip
    try:
        found = native.gemm_prepare(g, a_ptr, b_ptr, d.device_ptr, a_scale, b_scale)
    except Exception as exc:
        row["prepare"] = f"{type(exc).__name__}: {exc}"
        return row
    row["prepare"] = "algorithm" if found else "no algorithm"
    if not found:
        return row
    try:
        native.gemm(g, a_ptr, b_ptr, d.device_ptr, b.device_ptr if b is not None else 0, a_scale, b_scale,
                    gp.current_stream().handle)  # fmt: skip
        gp.synchronize()
    except Exception as exc:
        row["launch"] = f"{type(exc).__name__}: {exc}"
        return row
    row["launch"] = "ok"
    got = d.to_numpy().astype(np.float64)
    if order == "flipped":
        got = got.T
    if not check:  # a large case: finite values only (the float64 product would take minutes)
        row["correct"] = bool(np.isfinite(got).all())
        row["args"], row["_keep"] = g, (d, b, ops)
        row["ptrs"] = (a_ptr, b_ptr, d.device_ptr, b.device_ptr if b is not None else 0, a_scale, b_scale)
        return row
    want = ops["x_val"] @ ops["w_val"].T
    if bias:
        want = want + (b_host[:, None] if order == "flipped" else b_host[None, :]).astype(np.float64)
    mag = np.abs(ops["x_val"]) @ np.abs(ops["w_val"]).T
    err = np.abs(got - want) / (mag + 1e-30)
    row["max_rel_err"] = float(np.nanmax(err)) if np.isfinite(got).all() else float("nan")
    row["correct"] = bool(np.isfinite(got).all() and row["max_rel_err"] < 1e-2)
    row["args"] = g
    row["ptrs"] = (a_ptr, b_ptr, d.device_ptr, b.device_ptr if b is not None else 0, a_scale, b_scale)
    row["_keep"] = (d, b, ops)
    return row


def _api_checks(rng: np.random.Generator) -> list[dict[str, Any]]:
    """pygpukit.ops.scaled_matmul itself (its routes and fallbacks) per kind, with and without a bias, and the
    per-channel W8A8 linear: the largest error over sum |a| |b| against the float64 product."""
    import pygpukit as gp
    from pygpukit.core.stream import thread_device
    from pygpukit.ops.gemm import scaled
    from pygpukit.ops.gemm.api import scaled_matmul

    out: list[dict[str, Any]] = []
    m, n, k = 40, 256, 384
    for kind in ("channel", "block"):
        ops = _operands(m, n, k, kind, rng)
        for bias in (False, True):
            for out_dtype in ("bfloat16", "float32"):
                b_host = rng.standard_normal(n).astype(np.float32)
                b = gp.from_numpy(b_host).astype(out_dtype) if bias else None
                row: dict[str, Any] = {"kind": kind, "bias": bias, "out": out_dtype}
                try:
                    got = scaled_matmul(ops["q"], ops["w"].T, ops["sx"], ops["sw"], out_dtype=out_dtype,
                                        bias=b).to_numpy().astype(np.float64)  # fmt: skip
                    want = ops["x_val"] @ ops["w_val"].T + (b.to_numpy().astype(np.float64) if b is not None else 0)
                    mag = np.abs(ops["x_val"]) @ np.abs(ops["w_val"]).T
                    row["max_err_over_mag"] = float(np.max(np.abs(got - want) / (mag + 1e-30)))
                    row["max_abs_err"] = float(np.max(np.abs(got - want)))
                except Exception as exc:
                    row["error"] = f"{type(exc).__name__}: {exc}"
                device = thread_device()
                row["refused"] = sorted(r for r, dev in scaled._REFUSED if dev == device)
                out.append(row)
                print("api", row, flush=True)
    return out


def _median_ms(fn: Any, repeats: int = 20) -> float:
    import pygpukit as gp

    times = []
    for _ in range(3):
        fn()
    for _ in range(repeats):
        start, end = gp.Event(), gp.Event()
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def _torch_times(size: int) -> dict[str, Any]:
    try:
        import torch
    except ImportError:
        return {"torch": "not installed"}
    result: dict[str, Any] = {"torch": torch.__version__}
    a = torch.randn(size, size, device="cuda").to(torch.float8_e4m3fn)
    b = torch.randn(size, size, device="cuda").to(torch.float8_e4m3fn).t()
    cases = {
        "tensor": (torch.ones((), device="cuda"), torch.ones((), device="cuda")),
        "rowwise": (torch.ones(size, 1, device="cuda"), torch.ones(1, size, device="cuda")),
        "blockwise": (
            torch.ones(size // 128, size, device="cuda").t(),  # (M, K/128), M-major
            torch.ones(size // 128, size // 128, device="cuda").t(),
        ),
    }
    for name, (sa, sb) in cases.items():

        def call(sa: Any = sa, sb: Any = sb) -> Any:
            return torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)

        try:
            for _ in range(3):
                call()
            torch.cuda.synchronize()
            times = []
            for _ in range(20):
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                call()
                e.record()
                e.synchronize()
                times.append(s.elapsed_time(e))
            ms = statistics.median(times)
            result[name] = {"ms": ms, "tflops": 2 * size**3 / ms / 1e9}
        except Exception as exc:
            result[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=8192, help="M = N = K of the timed cases")
    parser.add_argument("--json", help="write the rows here")
    opts = parser.parse_args()

    import pygpukit as gp

    native = _native()
    from pygpukit.core.cublaslt import is_cublaslt_available

    if not is_cublaslt_available():  # loads the library (the native gemm needs it loaded)
        sys.exit("cublaslt_scale_probe: cuBLASLt was not found")
    print(gp.get_device_capabilities(), flush=True)
    api_rows = _api_checks(np.random.default_rng(1))
    rng = np.random.default_rng(0)
    rows: list[dict[str, Any]] = []
    m, n, k = 96, 384, 512
    for kind in ("tensor", "channel", "block"):
        ops = _operands(m, n, k, kind, rng)
        for order in ("ours", "flipped"):
            for bias in (False, True):
                for out in ("bfloat16", "float32"):
                    try:
                        row = _run_case(native, ops, m, n, k, order, kind, bias, out)
                    except Exception:
                        row = {"kind": kind, "order": order, "bias": bias, "out": out,
                               "error": traceback.format_exc(limit=3)}  # fmt: skip
                    rows.append(row)
                    print({key: v for key, v in row.items() if key not in ("args", "ptrs", "_keep")}, flush=True)
    timed: list[dict[str, Any]] = []
    size = opts.size
    for kind in ("tensor", "channel", "block"):
        for order in ("ours", "flipped"):
            works = [r for r in rows if r["kind"] == kind and r["order"] == order and r.get("correct")
                     and not r["bias"] and r["out"] == "bfloat16"]  # fmt: skip
            if not works:
                continue
            ops = _operands(size, size, size, kind, rng)
            big = _run_case(native, ops, size, size, size, order, kind, False, "bfloat16", check=False)
            if not big.get("correct"):
                why = big.get("launch", big.get("prepare"))
                timed.append({"kind": kind, "order": order, "size": size, "error": why})
                continue
            g, ptrs = big["args"], big["ptrs"]
            handle = gp.current_stream().handle
            ms = _median_ms(lambda g=g, ptrs=ptrs, handle=handle: native.gemm(g, *ptrs, handle))
            timed.append({"kind": kind, "order": order, "size": size, "ms": ms, "tflops": 2 * size**3 / ms / 1e9})
            print(timed[-1], flush=True)
    peers = _torch_times(size)
    print(peers, flush=True)
    if opts.json:
        clean = [{key: v for key, v in r.items() if key not in ("args", "ptrs", "_keep")} for r in rows]
        with open(opts.json, "w") as fh:
            json.dump({"cases": clean, "timed": timed, "torch": peers, "api": api_rows}, fh, indent=1)


if __name__ == "__main__":
    main()
