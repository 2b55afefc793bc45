"""The benchmark cases, timers, checks, report and regression comparison of ``python -m pygpukit.benchmark``."""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import pygpukit as gp
from pygpukit.core.backend import backend_state

from ._options import SUITE_DTYPES, TOLERANCE, parse_dtypes, parse_seq_lens, parse_size

SUITES = ("gemm", "gemv", "elementwise", "reduction", "attention")
GEMV_SHAPES = ((4096, 4096), (3584, 18944), (18944, 3584), (8192, 29568))


@dataclass
class Bench:
    """One prepared case: ``ours()`` runs one iteration on the current stream and returns its output;
    ``check(output)`` returns None or what is wrong; the peers' factories return their run functions
    (or None when the peer cannot run this case)."""

    ours: Callable[[], Any]
    check: Callable[[Any], str | None]
    torch: Callable[[Any], Callable[[], Any] | None] | None = None
    cupy: Callable[[Any], Callable[[], Any] | None] | None = None


@dataclass
class Case:
    suite: str
    op: str
    dtype: str
    size: str
    flops: float = 0.0  # per iteration, for TFLOP/s
    nbytes: float = 0.0  # per iteration, for GB/s
    make: Callable[[], Bench] = field(repr=False, default=lambda: Bench(lambda: None, lambda _: None))
    shape: tuple[int, ...] = ()  # (M, K, N) of the GEMM cases that check it (fp8)

    @property
    def key(self) -> str:
        return f"{self.suite}/{self.op}/{self.dtype}/{self.size}"


@dataclass
class Result:
    suite: str
    op: str
    dtype: str
    size: str
    pygpukit_us: float
    torch_us: float | None
    cupy_us: float | None
    metric: str
    check: str  # "ok" or what was wrong

    @property
    def key(self) -> str:
        return f"{self.suite}/{self.op}/{self.dtype}/{self.size}"


# -- inputs and references ------------------------------------------------------------------------------
def _storage(dtype: str) -> str:
    return "float32" if dtype == "tf32" else dtype


def _host(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray[Any, Any]:
    return rng.standard_normal(shape, dtype=np.float32)


def _device(host: np.ndarray[Any, Any], dtype: str) -> gp.GPUArray:
    return gp.from_numpy(host).astype(_storage(dtype))


def _relative_error(got: np.ndarray[Any, Any], ref: np.ndarray[Any, Any]) -> float:
    got64, ref64 = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    return float(np.linalg.norm(got64 - ref64)) / (float(np.linalg.norm(ref64)) or 1.0)


def _within(got: np.ndarray[Any, Any], ref: np.ndarray[Any, Any], dtype: str) -> str | None:
    error = _relative_error(got, ref)
    bound = TOLERANCE[dtype]
    return None if error <= bound else f"relative error {error:.3g} > {bound:.0e}"


def _torch_dtype(torch: Any, dtype: str) -> Any:
    return {"float32": torch.float32, "tf32": torch.float32, "float16": torch.float16,
            "bfloat16": torch.bfloat16, "float64": torch.float64}[dtype]  # fmt: skip


def _torch_tensor(torch: Any, array: gp.GPUArray) -> Any:
    """The same values as a torch tensor (through DLPack: no host round trip)."""
    return torch.from_dlpack(array).clone()


def _cupy_array(cupy: Any, array: gp.GPUArray) -> Any | None:
    if array.dtype.name == "bfloat16":
        return None  # CuPy has no bfloat16
    return cupy.from_dlpack(array).copy()


# -- cases ------------------------------------------------------------------------------------------------
def _gemm_case(dtype: str, n: int) -> Case:
    def make() -> Bench:
        rng = np.random.default_rng(n)
        a, b = _device(_host(rng, (n, n)), dtype), _device(_host(rng, (n, n)), dtype)
        out = gp.empty((n, n), a.dtype)
        tf32 = dtype == "tf32"

        def ours() -> gp.GPUArray:
            return gp.ops.matmul(a, b, out=out, use_tf32=tf32)

        def check(result: gp.GPUArray) -> str | None:
            rows = min(n, 16)
            ref = a[:rows].to_numpy().astype(np.float64) @ b.to_numpy().astype(np.float64)
            return _within(result[:rows].to_numpy(), ref, dtype)

        def torch_run(torch: Any) -> Callable[[], Any]:
            ta, tb = _torch_tensor(torch, a), _torch_tensor(torch, b)
            tout = torch.empty_like(ta)

            def run() -> Any:
                previous = torch.backends.cuda.matmul.allow_tf32
                torch.backends.cuda.matmul.allow_tf32 = tf32
                try:
                    return torch.matmul(ta, tb, out=tout)
                finally:
                    torch.backends.cuda.matmul.allow_tf32 = previous

            return run

        def cupy_run(cupy: Any) -> Callable[[], Any] | None:
            ca, cb = _cupy_array(cupy, a), _cupy_array(cupy, b)
            if ca is None or tf32:
                return None
            cout = cupy.empty_like(ca)
            return lambda: cupy.matmul(ca, cb, out=cout)

        return Bench(ours, check, torch_run, cupy_run)

    return Case("gemm", "matmul", dtype, f"{n}^3", flops=2.0 * n**3, make=make)


def _gemv_case(dtype: str, k: int, n: int) -> Case:
    def make() -> Bench:
        rng = np.random.default_rng(k + n)
        x, w = _device(_host(rng, (1, k)), dtype), _device(_host(rng, (k, n)) / math.sqrt(k), dtype)

        def ours() -> gp.GPUArray:
            return gp.ops.matmul(x, w)

        def check(result: gp.GPUArray) -> str | None:
            ref = x.to_numpy().astype(np.float64) @ w.to_numpy().astype(np.float64)
            return _within(result.to_numpy(), ref, dtype)

        def torch_run(torch: Any) -> Callable[[], Any]:
            tx, tw = _torch_tensor(torch, x), _torch_tensor(torch, w)
            return lambda: tx @ tw

        def cupy_run(cupy: Any) -> Callable[[], Any] | None:
            cx, cw = _cupy_array(cupy, x), _cupy_array(cupy, w)
            return None if cx is None else (lambda: cx @ cw)

        return Bench(ours, check, torch_run, cupy_run)

    itemsize = 4 if _storage(dtype) == "float32" else 2
    return Case("gemv", "matmul M=1", dtype, f"{k}x{n}", flops=2.0 * k * n, nbytes=float(k * n * itemsize), make=make)


def _elementwise_case(op: str, dtype: str, n: int) -> Case:
    itemsize = 4 if _storage(dtype) == "float32" else 2
    arity = {"add": 2, "mul": 2, "exp": 1, "copy": 1, "cast": 1}[op]
    out_itemsize = 2 if op == "cast" else itemsize

    def make() -> Bench:
        rng = np.random.default_rng(n + len(op))
        host = [_host(rng, (n,)) for _ in range(arity)]
        if op == "exp":
            host = [h * 0.5 for h in host]
        xs = [_device(h, dtype) for h in host]
        target = "bfloat16" if _storage(dtype) == "float32" else "float32"

        def ours() -> gp.GPUArray:
            if op == "add":
                return gp.ops.add(xs[0], xs[1])
            if op == "mul":
                return gp.ops.mul(xs[0], xs[1])
            if op == "exp":
                return gp.ops.exp(xs[0])
            if op == "cast":
                return xs[0].astype(target)
            return xs[0].clone()

        def check(result: gp.GPUArray) -> str | None:
            values = [x.to_numpy().astype(np.float64) for x in xs]
            if op == "add":
                ref = values[0] + values[1]
            elif op == "mul":
                ref = values[0] * values[1]
            elif op == "exp":
                ref = np.exp(values[0])
            else:  # copy, cast
                ref = values[0]
            return _within(result.to_numpy(), ref, "bfloat16" if op == "cast" else dtype)

        def torch_run(torch: Any) -> Callable[[], Any]:
            ts = [_torch_tensor(torch, x) for x in xs]
            fn = {"add": lambda: ts[0] + ts[1], "mul": lambda: ts[0] * ts[1], "exp": lambda: torch.exp(ts[0]),
                  "cast": lambda: ts[0].to(_torch_dtype(torch, target)), "copy": lambda: ts[0].clone()}[op]  # fmt: skip
            return fn

        def cupy_run(cupy: Any) -> Callable[[], Any] | None:
            found = [_cupy_array(cupy, x) for x in xs]
            if any(c is None for c in found) or (op == "cast" and target == "bfloat16"):
                return None
            cs: list[Any] = [c for c in found if c is not None]
            fn = {"add": lambda: cs[0] + cs[1], "mul": lambda: cs[0] * cs[1], "exp": lambda: cupy.exp(cs[0]),
                  "cast": lambda: cs[0].astype(target), "copy": lambda: cs[0].copy()}[op]  # fmt: skip
            return fn

        return Bench(ours, check, torch_run, cupy_run)

    return Case("elementwise", op, dtype, str(n), nbytes=float(n * (arity * itemsize + out_itemsize)), make=make)


def _reduction_case(op: str, dtype: str, n: int) -> Case:
    itemsize = 4 if _storage(dtype) == "float32" else 2
    cols = 8192 if n >= 8192 else n
    rows = max(n // cols, 1)

    def make() -> Bench:
        rng = np.random.default_rng(n + 7 * len(op))
        x = _device(_host(rng, (rows, cols)), dtype)

        def ours() -> gp.GPUArray:
            if op == "sum":
                return gp.ops.sum(x)
            if op == "sum rows":
                return gp.ops.sum(x, axis=1)
            if op == "max rows":
                return gp.ops.max(x, axis=1)
            return gp.ops.softmax(x, axis=1)

        def check(result: gp.GPUArray) -> str | None:
            v = x.to_numpy().astype(np.float64)
            if op == "sum":
                ref: Any = np.asarray(v.sum())
            elif op == "sum rows":
                ref = v.sum(axis=1)
            elif op == "max rows":
                ref = v.max(axis=1)
            else:
                e = np.exp(v - v.max(axis=1, keepdims=True))
                ref = e / e.sum(axis=1, keepdims=True)
            got = result.to_numpy()
            # sums of n standard normals: compare against the spread of the terms, not the (small) total
            if op.startswith("sum"):
                scale = math.sqrt(cols if op == "sum rows" else n)
                error = float(np.max(np.abs(got.astype(np.float64) - ref))) / scale
                return None if error <= 10 * TOLERANCE[dtype] else f"error {error:.3g} of sqrt(n)"
            return _within(got, ref, dtype)

        def torch_run(torch: Any) -> Callable[[], Any]:
            t = _torch_tensor(torch, x)
            return {"sum": lambda: t.sum(), "sum rows": lambda: t.sum(dim=1), "max rows": lambda: t.amax(dim=1),
                    "softmax rows": lambda: torch.softmax(t, dim=1)}[op]  # fmt: skip

        def cupy_run(cupy: Any) -> Callable[[], Any] | None:
            c = _cupy_array(cupy, x)
            if c is None:
                return None
            if op == "softmax rows":

                def softmax() -> Any:
                    e = cupy.exp(c - c.max(axis=1, keepdims=True))
                    return e / e.sum(axis=1, keepdims=True)

                return softmax
            return {"sum": lambda: c.sum(), "sum rows": lambda: c.sum(axis=1), "max rows": lambda: c.max(axis=1)}[op]

        return Bench(ours, check, torch_run, cupy_run)

    out_bytes = rows * cols * itemsize if op == "softmax rows" else rows * itemsize
    return Case("reduction", op, dtype, f"{rows}x{cols}", nbytes=float(rows * cols * itemsize + out_bytes), make=make)


def _suite_dtypes(suite: str, given: list[str] | None, default: list[str], notes: list[str]) -> list[str]:
    if given is None:
        return default
    supported = SUITE_DTYPES[suite]
    for dtype in given:
        if dtype not in supported:
            notes.append(f"the {suite} suite has no {dtype} case (it runs {', '.join(supported)}); skipped")
    return [d for d in given if d in supported]


def select_cases(args: argparse.Namespace, notes: list[str] | None = None) -> list[Case]:
    """The cases the options ask for; ``notes`` collects what was skipped and why. ValueError for a
    malformed --sizes, --dtypes or --seq-lens."""
    from ._extra_cases import QUANT_CHOICES, attention_case, fp8_block_gemm_case, fp8_gemm_case, quant_cases

    notes = [] if notes is None else notes
    fp8 = bool(getattr(args, "fp8", False))
    quant = getattr(args, "quant", None)
    named = [s for s in SUITES if getattr(args, s, False)]
    suites = named or ([] if (fp8 or quant) and not args.all else list(SUITES))
    quick = args.quick
    sizes = [parse_size(s) for s in args.sizes.split(",")] if args.sizes else None
    given = parse_dtypes(args.dtypes) if args.dtypes else None
    seq_lens = parse_seq_lens(args.seq_lens) if getattr(args, "seq_lens", None) else None
    gemm_sizes = sizes or ([1024] if quick else [4096, 8192])
    cases: list[Case] = []
    if "gemm" in suites:
        default = ["bfloat16", "float32"] if quick else ["bfloat16", "float16", "tf32", "float32"]
        for dtype in _suite_dtypes("gemm", given, default, notes):
            for n in gemm_sizes:
                cases.append(fp8_gemm_case(n, n, n) if dtype == "fp8" else _gemm_case(dtype, n))
    if fp8 and not (given and "fp8" in given and "gemm" in suites):  # --fp8: the fp8 GEMM cases too
        cases.extend(fp8_gemm_case(n, n, n) for n in gemm_sizes)
        # and the block-scaled (W8A8) form: Hopper only (dropped with a note elsewhere)
        cases.extend(fp8_block_gemm_case(n, n, n) for n in gemm_sizes)
    if quant:
        formats = [f.strip().upper() for f in quant.split(",") if f.strip()]
        unknown = [f for f in formats if f not in QUANT_CHOICES]
        if unknown:
            raise ValueError(f"unknown --quant formats {', '.join(unknown)} (known: {', '.join(QUANT_CHOICES)})")
        cases.extend(quant_cases(formats, quick))
        # the device copy bandwidth in the same run: issue 18's GEMV targets are a share of it
        cases.append(_elementwise_case("copy", "bfloat16", 2**24 if quick else 2**28))
    if "gemv" in suites:
        for dtype in _suite_dtypes("gemv", given, ["bfloat16"], notes):
            for k, n in GEMV_SHAPES[:2] if quick else GEMV_SHAPES:
                cases.append(fp8_gemm_case(1, k, n) if dtype == "fp8" else _gemv_case(dtype, k, n))
    if "elementwise" in suites:
        for dtype in _suite_dtypes("elementwise", given, ["float32", "bfloat16"], notes):
            for n in sizes or ([2**22] if quick else [2**26]):
                for op in ("copy", "add", "mul", "exp", "cast"):
                    cases.append(_elementwise_case(op, dtype, n))
            cases.append(_elementwise_case("add", dtype, 16))
    if "reduction" in suites:
        for dtype in _suite_dtypes("reduction", given, ["float32", "bfloat16"], notes):
            for n in sizes or ([2**22] if quick else [2**26]):
                for op in ("sum", "sum rows", "max rows", "softmax rows"):
                    cases.append(_reduction_case(op, dtype, n))
    if "attention" in suites:
        for dtype in _suite_dtypes("attention", given, ["bfloat16"], notes):
            for seq in seq_lens or ([512] if quick else [512, 2048, 8192]):
                cases.append(attention_case(dtype, seq))
    elif seq_lens is not None:
        notes.append("--seq-lens applies to the attention suite only (add --attention)")
    bad_fp8 = sorted({c.size for c in cases if c.dtype == "fp8" and not _fp8_shape_ok(c)})
    if bad_fp8:
        raise ValueError(f"fp8 GEMM needs K and N that are multiples of 16; not {', '.join(bad_fp8)}")
    return cases


def _fp8_shape_ok(case: Case) -> bool:
    k, n = case.shape[1], case.shape[2]
    return k % 16 == 0 and n % 16 == 0


def fp8_problem() -> str | None:
    """Why fp8 cases cannot run on this device (compute capability below 8.9), else None. The CPU
    simulation runs them (scaled_matmul is simulated there)."""
    state = backend_state()
    if state.name != "cuda":
        return None
    caps = gp.get_device_capabilities()
    if caps.fp8:
        return None
    major, minor = caps.compute_capability
    return (f"fp8 GEMM (scaled_matmul) needs compute capability 8.9 or newer; this GPU ({caps.name}) is "
            f"{major}.{minor}: the fp8 cases are skipped")  # fmt: skip


# -- timing ----------------------------------------------------------------------------------------------
def _time_ours(fn: Callable[[], Any], warmup: int, iterations: int) -> tuple[float, Any]:
    stream = gp.Stream()
    with stream:
        output = None
        for _ in range(warmup):
            output = fn()
        start, end = gp.Event(), gp.Event()
        start.record(stream)
        for _ in range(iterations):
            output = fn()
        end.record(stream)
        end.synchronize()
    return start.elapsed_time(end) * 1e3 / iterations, output


def _time_torch(torch: Any, fn: Callable[[], Any], warmup: int, iterations: int) -> float:
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            fn()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(stream)
        for _ in range(iterations):
            fn()
        end.record(stream)
    end.synchronize()
    return float(start.elapsed_time(end)) * 1e3 / iterations


def _time_cupy(cupy: Any, fn: Callable[[], Any], warmup: int, iterations: int) -> float:
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        for _ in range(warmup):
            fn()
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        start.record(stream)
        for _ in range(iterations):
            fn()
        end.record(stream)
    end.synchronize()
    return float(cupy.cuda.get_elapsed_time(start, end)) * 1e3 / iterations


def _peer(name: str) -> Any | None:
    if backend_state().name != "cuda":
        return None
    try:
        module = __import__(name)
    except ImportError:
        return None
    if name == "torch" and not module.cuda.is_available():
        return None
    return module


def _metric(case: Case, us: float) -> str:
    if case.flops and not case.nbytes:
        return f"{case.flops / (us * 1e-6) / 1e12:.1f} TFLOP/s"
    if case.nbytes:
        return f"{case.nbytes / (us * 1e-6) / 1e9:.1f} GB/s"
    return ""


def run_cases(cases: Sequence[Case], warmup: int, iterations: int, progress: bool = True) -> list[Result]:
    torch, cupy = _peer("torch"), _peer("cupy")
    results: list[Result] = []
    iterator: Any = cases
    if progress:
        from tqdm import tqdm

        iterator = tqdm(cases, desc="benchmark", unit="case", file=sys.stderr)
    for case in iterator:
        bench = case.make()
        us, output = _time_ours(bench.ours, warmup, iterations)
        problem = bench.check(output)
        torch_us = cupy_us = None
        if torch is not None and bench.torch is not None:
            run = bench.torch(torch)
            torch_us = None if run is None else _time_torch(torch, run, warmup, iterations)
        if cupy is not None and bench.cupy is not None:
            run = bench.cupy(cupy)
            cupy_us = None if run is None else _time_cupy(cupy, run, warmup, iterations)
        results.append(Result(case.suite, case.op, case.dtype, case.size, us, torch_us, cupy_us, _metric(case, us),
                              problem or "ok"))  # fmt: skip
    return results


# -- report and comparison ----------------------------------------------------------------------------
def _ratio(peer: float | None, ours: float) -> str:
    return "" if peer is None else f"{peer / ours:.2f}"


def report(results: Sequence[Result], markdown: bool) -> str:
    header = ("suite", "op", "dtype", "size", "pygpukit", "rate", "torch", "ratio torch", "CuPy", "ratio CuPy",
              "check")  # fmt: skip
    rows = [
        (r.suite, r.op, r.dtype, r.size, f"{r.pygpukit_us:.1f} us", r.metric,
         "" if r.torch_us is None else f"{r.torch_us:.1f} us", _ratio(r.torch_us, r.pygpukit_us),
         "" if r.cupy_us is None else f"{r.cupy_us:.1f} us", _ratio(r.cupy_us, r.pygpukit_us), r.check)
        for r in results
    ]  # fmt: skip
    if markdown:
        lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
        lines += ["| " + " | ".join(row) + " |" for row in rows]
        return "\n".join(lines)
    widths = [max(len(h), *(len(row[i]) for row in rows)) if rows else len(h) for i, h in enumerate(header)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)).rstrip()]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    return "\n".join(lines)


def compare(results: Sequence[Result], baseline: dict[str, Any], threshold: float) -> list[str]:
    """Cases at least ``threshold`` (a fraction) slower than in ``baseline`` (a saved JSON)."""
    before = {f"{r['suite']}/{r['op']}/{r['dtype']}/{r['size']}": r for r in baseline.get("results", [])}
    regressions = []
    for r in results:
        old = before.get(r.key)
        if old is not None and r.pygpukit_us > old["pygpukit_us"] * (1.0 + threshold):
            regressions.append(f"{r.key}: {old['pygpukit_us']:.1f} us -> {r.pygpukit_us:.1f} us "
                               f"(+{(r.pygpukit_us / old['pygpukit_us'] - 1) * 100:.0f}%)")  # fmt: skip
    return regressions


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m pygpukit.benchmark", description=__doc__)
    for suite in SUITES:
        parser.add_argument(f"--{suite}", action="store_true", help=f"run the {suite} suite")
    parser.add_argument("--all", action="store_true", help="every suite (the default when none is named)")
    parser.add_argument("--quick", action="store_true", help="small sizes, fewer cases")
    parser.add_argument("--sizes", help="comma-separated sizes: GEMM edge lengths or element counts (2^26 works)")
    parser.add_argument("--dtypes", help="comma-separated: float32 (fp32), tf32, float16 (fp16), bfloat16 (bf16), "
                        "float64 (fp64), fp8 (GEMM and GEMV: scaled_matmul)")  # fmt: skip
    parser.add_argument("--seq-lens", help="comma-separated sequence lengths of the attention suite (512,2048)")
    parser.add_argument("--fp8", action="store_true",
                        help="add the fp8 GEMM cases (scaled_matmul; compute capability 8.9 or newer); alone, "
                        "run only them")  # fmt: skip
    parser.add_argument("--quant", nargs="?", const="Q4_K,Q8_0,FP8,AWQ", default=None,
                        help="quantized-weight linear cases (decode GEMV at Llama-3-8B shapes, 4-bit prefill) of these "
                        "formats (default Q4_K,Q8_0,FP8,AWQ; also Q4_0 .. Q6_K, INT8, GPTQ, FP8_BLOCK, NVF4) against "
                        "torch's bf16 linear; alone, run only them")  # fmt: skip
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--save", type=Path, help="write the results as JSON")
    parser.add_argument("--compare", type=Path, help="a JSON saved earlier to compare against")
    parser.add_argument("--threshold", type=float, default=0.10, help="slowdown counted as a regression (0.10)")
    parser.add_argument("--fail-on-regression", action="store_true", help="exit 1 when --compare finds one")
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table")
    parser.add_argument("--no-progress", action="store_true")
    return parser


def _llm(argv: list[str]) -> int:
    """``--llm``: the LLM suite of pygpukit-llm (``python -m pygpukit.llm.benchmark``; the remaining
    arguments are its own)."""
    try:
        from pygpukit.llm.benchmark import main as llm_main
    except ImportError as exc:
        print(f"--llm needs the pygpukit-llm distribution ({exc}): pip install pygpukit[llm]", file=sys.stderr)
        return 2
    return int(llm_main(argv))


def main(argv: Sequence[str] | None = None) -> int:
    given = list(argv if argv is not None else sys.argv[1:])
    if "--llm" in given:
        given.remove("--llm")
        return _llm(given)
    args = _parser().parse_args(argv)
    if args.warmup < 0 or args.iterations < 1:
        print("--warmup must be >= 0 and --iterations >= 1", file=sys.stderr)
        return 2
    state = backend_state()
    if state.name != "cuda":
        print(f"note: CPU simulation backend ({state.reason}); times are host times, peers not measured",
              file=sys.stderr)  # fmt: skip
    notes: list[str] = []
    try:
        cases = select_cases(args, notes)
    except ValueError as exc:
        print(f"bad --sizes, --dtypes, --seq-lens or --quant: {exc}", file=sys.stderr)
        return 2
    problem = fp8_problem() if any(c.dtype == "fp8" for c in cases) else None
    if problem is not None:
        notes.append(problem)
        cases = [c for c in cases if c.dtype != "fp8"]
    if backend_state().name == "cuda" and gp.get_device_capabilities().compute_capability[0] != 9:
        blocked = [c for c in cases if c.op.startswith("scaled_matmul block")]
        if blocked:
            notes.append("the block-scaled fp8 GEMM (1x128/128x128 scales) runs on Hopper only: skipped")
            cases = [c for c in cases if c not in blocked]
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    if not cases:
        print("no benchmark case matches the options", file=sys.stderr)
        return 2
    results = run_cases(cases, args.warmup, args.iterations, progress=not args.no_progress)
    print(report(results, args.markdown))
    device = "cpu-simulation"
    if state.name == "cuda":
        from pygpukit.core.device import get_device, get_device_info

        device = get_device_info(get_device()).name
    if args.save:
        payload = {"device": device, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                   "host": platform.node(), "argv": list(argv if argv is not None else sys.argv[1:]),
                   "results": [asdict(r) for r in results]}  # fmt: skip
        args.save.write_text(json.dumps(payload, indent=1))
        print(f"saved {len(results)} results to {args.save}", file=sys.stderr)
    failed = [r for r in results if r.check != "ok"]
    for r in failed:
        print(f"CHECK FAILED {r.key}: {r.check}", file=sys.stderr)
    status = 1 if failed else 0
    if args.compare:
        regressions = compare(results, json.loads(args.compare.read_text()), args.threshold)
        for line in regressions:
            print(f"REGRESSION {line}", file=sys.stderr)
        if not regressions:
            print(f"no regression beyond {args.threshold:.0%} against {args.compare}", file=sys.stderr)
        if regressions and args.fail_on_regression:
            status = 1
    return status
