"""Host cost of every public op at small sizes, side by side with torch eager (and CuPy where it has
the op): the time the Python thread spends per call when the GPU is not the bottleneck.

Each case runs ``--calls`` back-to-back calls without synchronizing (small inputs: the GPU finishes
each kernel faster than the host issues the next), divided by the count; the figure is the median of
``--repeats`` such rounds (not the best), pygpukit's and torch's rounds interleaved so that both see
the same phases of the machine. Run on the GPU machine:
``python benchmarks/tools/host_cost.py --markdown --json $OUT/host_cost.json``. Exits 0; a case that
fails prints its error in the table instead of a figure.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import pygpukit as gp
import pygpukit.ops as ops


@dataclass
class Case:
    name: str
    ours: Callable[[], Any]
    torch: Callable[[], Any] | None = None
    note: str = ""
    results: dict[str, float | str] = field(default_factory=dict)


def _rng() -> np.random.Generator:
    return np.random.default_rng(0)


def build_cases(th: Any) -> list[Case]:
    """Every public op of pygpukit.ops at a small size, with torch's equivalent when there is one."""
    rng = _rng()
    f32 = rng.standard_normal(1024).astype(np.float32)
    pos = (np.abs(f32) + 0.5).astype(np.float32)
    x = gp.from_numpy(f32)
    y = gp.from_numpy(rng.standard_normal(1024).astype(np.float32))
    p = gp.from_numpy(pos)
    out = gp.empty((1024,), gp.float32)
    b = gp.from_numpy(f32 > 0)
    rows = gp.from_numpy(rng.standard_normal((32, 256)).astype(np.float32))
    w256 = gp.from_numpy(rng.standard_normal(256).astype(np.float32))
    m64 = gp.from_numpy(rng.standard_normal((64, 64)).astype(np.float32))
    h_x = gp.from_numpy(rng.standard_normal((1, 1024)).astype(np.float16))
    h_w = gp.from_numpy(rng.standard_normal((1024, 1024)).astype(np.float16))
    big_a = gp.from_numpy(rng.standard_normal((1024, 1024)).astype(np.float16))
    ids = gp.from_numpy(rng.integers(0, 1000, 16).astype(np.int32))
    table = gp.from_numpy(rng.standard_normal((1000, 64)).astype(np.float32))
    logits = gp.from_numpy(rng.standard_normal((1, 32000)).astype(np.float32))
    q = gp.from_numpy(rng.standard_normal((1, 8, 16, 64)).astype(np.float16))
    conv_x = gp.from_numpy(rng.standard_normal((1, 16, 128)).astype(np.float32))
    conv_w = gp.from_numpy(rng.standard_normal((16, 16, 3)).astype(np.float32))
    gate = gp.from_numpy(rng.standard_normal((32, 512)).astype(np.float32))
    router = gp.from_numpy(rng.standard_normal((8, 16)).astype(np.float32))

    cases = [
        Case("add", lambda: ops.add(x, y)),
        Case("add(out=)", lambda: ops.add(x, y, out=out)),
        Case("x + y", lambda: x + y),
        Case("x == y", lambda: x == y),
        Case("x * 2.0", lambda: x * 2.0),
        Case("-x", lambda: -x),
        Case("add scalar", lambda: ops.add(x, 2.0)),
        *(
            Case(n, (lambda f: lambda: f(x, y))(getattr(ops, n)))
            for n in ("sub", "mul", "div", "maximum", "minimum", "eq", "lt", "ge")
        ),
        Case("pow", lambda: ops.pow(p, y)),
        Case("floor_divide", lambda: ops.floor_divide(x, p)),
        Case("mod", lambda: ops.mod(x, p)),
        *(
            Case(n, (lambda f: lambda: f(x))(getattr(ops, n)))
            for n in ("abs", "neg", "exp", "exp2", "sin", "cos", "tanh", "sigmoid", "relu", "silu", "gelu", "sign")
        ),
        *(Case(n, (lambda f: lambda: f(p))(getattr(ops, n))) for n in ("log", "log1p", "log2", "sqrt", "rsqrt")),
        Case("exp(out=)", lambda: ops.exp(x, out=out)),
        Case("logical_and", lambda: ops.logical_and(b, b)),
        Case("logical_not", lambda: ops.logical_not(b)),
        Case("where", lambda: ops.where(b, x, y)),
        Case("clamp", lambda: ops.clamp(x, -0.5, 0.5)),
        Case("astype f16", lambda: ops.astype(x, gp.float16)),
        Case("sum", lambda: ops.sum(x)),
        Case("sum axis=-1", lambda: ops.sum(rows, axis=-1)),
        Case("mean", lambda: ops.mean(x)),
        Case("max", lambda: ops.max(x)),
        Case("min", lambda: ops.min(x)),
        Case("prod", lambda: ops.prod(p)),
        Case("argmax", lambda: ops.argmax(x)),
        Case("std", lambda: ops.std(x)),
        Case("var", lambda: ops.var(x)),
        Case("all", lambda: ops.all(b)),
        Case("cumsum", lambda: ops.cumsum(x)),
        Case("softmax", lambda: ops.softmax(rows)),
        Case("log_softmax", lambda: ops.log_softmax(rows)),
        Case("concatenate", lambda: ops.concatenate([x, y])),
        Case("stack", lambda: ops.stack([x, y])),
        Case("transpose+contiguous", lambda: ops.transpose(rows).contiguous()),
        Case("rmsnorm", lambda: ops.rmsnorm(rows, w256)),
        Case("layernorm", lambda: ops.layernorm(rows, w256, w256)),
        Case("l2norm", lambda: ops.l2norm(rows)),
        Case("swiglu", lambda: ops.swiglu(gate)),
        Case("geglu", lambda: ops.geglu(gate)),
        Case("relu2", lambda: ops.relu2(x)),
        Case("embedding", lambda: ops.embedding(table, ids)),
        Case("conv1d", lambda: ops.conv1d(conv_x, conv_w, padding=1)),
        Case("matmul 64^3 f32", lambda: ops.matmul(m64, m64)),
        Case("linear 1x1024x1024 f16", lambda: ops.linear(h_x, h_w)),
        Case("matmul 1024^3 f16", lambda: ops.matmul(big_a, h_w)),
        Case("greedy 32000", lambda: ops.greedy(logits)),
        Case("sdpa causal 16x64", lambda: ops.sdpa(q, q, q, causal=True)),
        Case("moe_topk_gating", lambda: ops.moe_topk_gating(router, 2)),
    ]
    if th is None:
        return cases
    dev = "cuda"
    tx, ty = th.from_numpy(f32).to(dev), th.from_numpy(y.to_numpy()).to(dev)
    tp, tout = th.from_numpy(pos).to(dev), th.empty(1024, device=dev)
    tb = th.from_numpy(f32 > 0).to(dev)
    trows, tw = th.from_numpy(rows.to_numpy()).to(dev), th.from_numpy(w256.to_numpy()).to(dev)
    tm = th.from_numpy(m64.to_numpy()).to(dev)
    thx, thw = th.from_numpy(h_x.to_numpy()).to(dev), th.from_numpy(h_w.to_numpy()).to(dev)
    tbig = th.from_numpy(big_a.to_numpy()).to(dev)
    tids, ttable = th.from_numpy(ids.to_numpy()).to(dev), th.from_numpy(table.to_numpy()).to(dev)
    tlog = th.from_numpy(logits.to_numpy()).to(dev)
    tq = th.from_numpy(q.to_numpy()).to(dev)
    tcx, tcw = th.from_numpy(conv_x.to_numpy()).to(dev), th.from_numpy(conv_w.to_numpy()).to(dev)
    tgate = th.from_numpy(gate.to_numpy()).to(dev)
    trouter = th.from_numpy(router.to_numpy()).to(dev)
    nnf = th.nn.functional
    peers: dict[str, Callable[[], Any]] = {
        "add": lambda: th.add(tx, ty), "add(out=)": lambda: th.add(tx, ty, out=tout), "x + y": lambda: tx + ty,
        "add scalar": lambda: th.add(tx, 2.0), "sub": lambda: th.sub(tx, ty), "mul": lambda: th.mul(tx, ty),
        "div": lambda: th.div(tx, ty), "maximum": lambda: th.maximum(tx, ty), "minimum": lambda: th.minimum(tx, ty),
        "eq": lambda: th.eq(tx, ty), "lt": lambda: th.lt(tx, ty), "ge": lambda: th.ge(tx, ty),
        "pow": lambda: th.pow(tp, ty), "floor_divide": lambda: th.floor_divide(tx, tp),
        "mod": lambda: th.remainder(tx, tp), "abs": lambda: th.abs(tx), "neg": lambda: th.neg(tx),
        "exp": lambda: th.exp(tx), "exp2": lambda: th.exp2(tx), "sin": lambda: th.sin(tx), "cos": lambda: th.cos(tx),
        "tanh": lambda: th.tanh(tx), "sigmoid": lambda: th.sigmoid(tx), "relu": lambda: th.relu(tx),
        "silu": lambda: nnf.silu(tx), "gelu": lambda: nnf.gelu(tx), "sign": lambda: th.sign(tx),
        "log": lambda: th.log(tp), "log1p": lambda: th.log1p(tp), "log2": lambda: th.log2(tp),
        "sqrt": lambda: th.sqrt(tp), "rsqrt": lambda: th.rsqrt(tp), "exp(out=)": lambda: th.exp(tx, out=tout),
        "logical_and": lambda: th.logical_and(tb, tb), "logical_not": lambda: th.logical_not(tb),
        "where": lambda: th.where(tb, tx, ty), "clamp": lambda: th.clamp(tx, -0.5, 0.5),
        "astype f16": lambda: tx.to(th.float16), "sum": lambda: th.sum(tx), "sum axis=-1": lambda: th.sum(trows, -1),
        "mean": lambda: th.mean(tx), "max": lambda: th.max(tx), "min": lambda: th.min(tx), "prod": lambda: th.prod(tp),
        "argmax": lambda: th.argmax(tx), "std": lambda: th.std(tx, correction=0),
        "var": lambda: th.var(tx, correction=0), "all": lambda: th.all(tb), "cumsum": lambda: th.cumsum(tx, 0),
        "softmax": lambda: th.softmax(trows, -1), "log_softmax": lambda: th.log_softmax(trows, -1),
        "concatenate": lambda: th.cat([tx, ty]), "stack": lambda: th.stack([tx, ty]),
        "transpose+contiguous": lambda: trows.t().contiguous(),
        "rmsnorm": lambda: nnf.rms_norm(trows, (256,), tw, 1e-6),
        "layernorm": lambda: nnf.layer_norm(trows, (256,), tw, tw, 1e-5),
        "l2norm": lambda: nnf.normalize(trows, dim=-1), "relu2": lambda: th.square(th.relu(tx)),
        "embedding": lambda: nnf.embedding(tids, ttable), "conv1d": lambda: nnf.conv1d(tcx, tcw, padding=1),
        "matmul 64^3 f32": lambda: th.matmul(tm, tm), "linear 1x1024x1024 f16": lambda: nnf.linear(thx, thw),
        "matmul 1024^3 f16": lambda: th.matmul(tbig, thw), "greedy 32000": lambda: th.argmax(tlog, -1),
        "sdpa causal 16x64": lambda: nnf.scaled_dot_product_attention(tq, tq, tq, is_causal=True),
    }  # fmt: skip
    peers["x == y"] = lambda: tx == ty
    peers["x * 2.0"] = lambda: tx * 2.0
    peers["-x"] = lambda: -tx
    swiglu_peer = lambda: nnf.silu(tgate[:, :256]) * tgate[:, 256:]  # noqa: E731 (the unfused peer)
    peers["swiglu"] = swiglu_peer
    peers["geglu"] = lambda: nnf.gelu(tgate[:, :256]) * tgate[:, 256:]
    peers["moe_topk_gating"] = lambda: th.topk(th.softmax(trouter, -1), 2, -1)
    for case in cases:
        case.torch = peers.get(case.name)
    return cases


def host_time(fn: Callable[[], Any], calls: int, repeats: int, sync: Callable[[], None]) -> float:
    """Median over ``repeats`` rounds of the per-call time of ``calls`` unsynchronised calls (us)."""
    for _ in range(20):
        fn()
    sync()
    rounds = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        rounds.append((time.perf_counter() - start) / calls)
        sync()
    return statistics.median(rounds) * 1e6


def host_times(impls: dict[str, tuple[Callable[[], Any], Callable[[], None]]], calls: int,
               repeats: int) -> dict[str, float | str]:  # fmt: skip
    """:func:`host_time` of several implementations of one case, their rounds interleaved (round r of
    each runs before round r + 1 of any), so that a slow phase of the machine (clock, other processes)
    falls on all of them alike. An implementation that raises gets its error instead of a figure."""
    results: dict[str, float | str] = {}
    live: dict[str, tuple[Callable[[], Any], Callable[[], None]]] = {}
    for label, (fn, sync) in impls.items():
        try:
            for _ in range(20):
                fn()
            sync()
            live[label] = (fn, sync)
        except Exception as exc:  # a failing case is reported, the others still run
            results[label] = f"{type(exc).__name__}: {str(exc)[:80]}"
    rounds: dict[str, list[float]] = {label: [] for label in live}
    for _ in range(repeats):
        for label, (fn, sync) in live.items():
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            rounds[label].append((time.perf_counter() - start) / calls)
            sync()
    results.update({label: statistics.median(times) * 1e6 for label, times in rounds.items()})
    return {label: results[label] for label in impls}


def print_profile(case: Case, calls: int, top: int) -> None:
    """The ``top`` functions by own time over ``calls`` calls of ``case`` (cProfile's figures are
    inflated by the profiler itself; read them as shares, not as times)."""
    import cProfile
    import pstats

    profile = cProfile.Profile()
    profile.enable()
    for _ in range(calls):
        case.ours()
    profile.disable()
    gp.synchronize()
    print(f"--- profile of {case.name} ({calls} calls)")
    pstats.Stats(profile).sort_stats("tottime").print_stats(top)


def parts(calls: int, repeats: int, th: Any) -> None:
    """Per-call cost of the pieces every op is built from (us), to tell where an op's time goes."""
    from pygpukit.core.memory import DeviceBuffer

    x = gp.from_numpy(np.ones(1024, np.float32))
    res = gp.empty((1024,), gp.float32)
    exp = ops.exp
    exp(x)
    from pygpukit.ops.elementwise import UNARY_OPS

    op = next(o for o in UNARY_OPS if o.name == "exp")
    plan = op.plans.get(gp.float32.name)  # plans are keyed by the dtype's name
    kernel = plan._contig if plan is not None else None
    code = op.code
    items: list[tuple[str, Callable[[], Any]]] = [
        ("python call (noop)", lambda: None),
        ("DeviceBuffer(4096)", lambda: DeviceBuffer(4096)),
        ("gp.empty((1024,), float32)", lambda: gp.empty((1024,), gp.float32)),
        ("kernel launch, preallocated", lambda: kernel(x, res, 1024, code, grid=1, block=256)),  # type: ignore[misc]
        ("kernel launch, int pointers", lambda: kernel(x.device_ptr, res.device_ptr, 1024, code, grid=1, block=256)),  # type: ignore[misc]
        ("ops.exp(x, out=res)", lambda: exp(x, out=res)),
        ("ops.exp(x)", lambda: exp(x)),
    ]
    if th is not None:
        tx = th.ones(1024, device="cuda")
        tres = th.empty(1024, device="cuda")
        items += [
            ("torch.empty(1024)", lambda: th.empty(1024, device="cuda")),
            ("torch.exp(x, out=res)", lambda: th.exp(tx, out=tres)),
            ("torch.exp(x)", lambda: th.exp(tx)),
        ]
    for label, fn in items:
        if kernel is None and label.startswith("kernel"):
            continue  # the CPU backend launches no kernels
        print(f"{label:<34} {host_time(fn, calls, repeats, gp.synchronize):7.2f} us", flush=True)


def dispatch(calls: int, repeats: int, top: int) -> None:
    """The Python work of the elementwise repeated-call fast paths alone, on any backend (the CPU one
    included): a CUDA backend state is simulated, every float32 plan gets a stand-in kernel, and the
    launch and the result allocation are stubbed, so what is timed is the dispatch the CUDA path runs
    (operator, op function, checks, plan lookup, launch arguments), not a kernel or the pool."""
    from types import SimpleNamespace

    from pygpukit.ops import _elementwise_engine as engine
    from pygpukit.ops.elementwise import BINARY_OPS, UNARY_OPS

    x = gp.from_numpy(np.ones(1024, np.float32))
    y = gp.from_numpy(np.ones(1024, np.float32))
    truth = gp.from_numpy(np.ones(1024, np.bool_))
    saved = {name: getattr(engine, name, None) for name in ("_backend", "launch", "allocate", "is_cuda")}
    plans = [op.plan(gp.float32) for op in (*BINARY_OPS, *UNARY_OPS) if "f" in op.kinds or op.result == "truth"]
    kernels = [plan._contig for plan in plans]
    try:
        for plan in plans:
            plan._contig = lambda *args, **kwargs: None  # type: ignore[assignment]
        engine._backend = SimpleNamespace(_state=SimpleNamespace(name="cuda"))  # type: ignore[assignment]
        engine.launch = lambda kernel, args, grid, block=None, shared_mem=0: None  # type: ignore[assignment]
        engine.allocate = lambda shape, dtype, stream=None: truth if dtype is gp.bool_ else x  # type: ignore[assignment]
        engine.is_cuda = lambda: True  # type: ignore[assignment]
        cases = [("ops.add(x, y)", lambda: ops.add(x, y)), ("x + y", lambda: x + y),
                 ("ops.eq(x, y)", lambda: ops.eq(x, y)), ("x == y", lambda: x == y), ("x < y", lambda: x < y),
                 ("ops.exp(x)", lambda: ops.exp(x)), ("-x", lambda: -x), ("ops.add(x, 2.0)", lambda: ops.add(x, 2.0)),
                 ("x * 2.0", lambda: x * 2.0)]  # fmt: skip
        for label, fn in cases:
            fn()  # the general path once: plans and scalar caches
            print(f"dispatch {label:<18} {host_time(fn, calls, repeats, lambda: None):6.2f} us", flush=True)
            if top:
                print_profile(Case(label, fn), calls, top)
    finally:
        for plan, kernel in zip(plans, kernels, strict=True):
            plan._contig = kernel
        for name, value in saved.items():
            if value is None:  # (an engine without it: an older checkout, for comparisons)
                delattr(engine, name)
            else:
                setattr(engine, name, value)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--only", default="", help="comma-separated substrings of case names")
    parser.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="N",
        help="also print the N functions with the most own time (cProfile) of each case",
    )
    parser.add_argument(
        "--parts", action="store_true", help="first time the parts every op shares: allocation, a launch, a plan lookup"
    )
    parser.add_argument(
        "--dispatch",
        action="store_true",
        help="only time the Python dispatch of the elementwise fast paths, launch and allocation stubbed (any backend)",
    )
    args = parser.parse_args(argv)
    if args.dispatch:
        dispatch(args.calls, args.repeats, args.profile)
        return 0
    try:
        import torch as th

        if not th.cuda.is_available():
            th = None
    except ImportError:
        th = None
    if args.parts:
        parts(args.calls, args.repeats, th)
    cases = build_cases(th)
    if args.only:
        wanted = [w for w in args.only.split(",") if w]
        cases = [c for c in cases if any(w in c.name for w in wanted)]
    for case in cases:
        impls: dict[str, tuple[Callable[[], Any], Callable[[], None]]] = {"pygpukit": (case.ours, gp.synchronize)}
        if case.torch is not None and th is not None:
            impls["torch"] = (case.torch, th.cuda.synchronize)
        case.results.update(host_times(impls, args.calls, args.repeats))
        if args.profile and isinstance(case.results.get("pygpukit"), float):
            print_profile(case, args.calls, args.profile)
        print(f"{case.name:<26} " + "  ".join(f"{k} {v:.2f} us" if isinstance(v, float) else f"{k} {v}"
                                              for k, v in case.results.items()), flush=True)  # fmt: skip
    if args.markdown:
        print("\n| op | pygpukit host us | torch host us | torch / pygpukit |\n|---|---:|---:|---:|")
        for case in cases:
            ours, peer = case.results.get("pygpukit"), case.results.get("torch")
            ratio = f"{peer / ours:.2f}x" if isinstance(ours, float) and isinstance(peer, float) else "-"
            fmt = lambda v: f"{v:.2f}" if isinstance(v, float) else ("-" if v is None else str(v))  # noqa: E731
            print(f"| {case.name} | {fmt(ours)} | {fmt(peer)} | {ratio} |")
    if args.json:
        info = {"calls": args.calls, "repeats": args.repeats, "statistic": "median",
                "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "cases": {c.name: c.results for c in cases}}  # fmt: skip
        with open(args.json, "w") as fh:
            json.dump(info, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
