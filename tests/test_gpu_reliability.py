"""Issue 21, item 5 on the GPU: threads launching model-sized work on their own streams, and a CUDA graph
of a decode step captured while another thread allocates model-sized blocks and computes; every result
checked against NumPy, no thread left running (no deadlock), every allocation returned. Also a short
run of the soak tool (benchmarks/tools/soak.py), on any backend, so that its checks keep working.

packages/pygpukit-core/tests/test_concurrency.py covers the same on small shapes on both backends."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import pygpukit as gp
from pygpukit import testing

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = 300.0
Array = np.ndarray[Any, Any]


def run_threads(workers: list[Callable[[], None]], timeout: float = TIMEOUT) -> None:
    testing.run_threads(workers, timeout)


def in_use() -> int:
    gc.collect()
    gp.synchronize()
    return int(gp.memory_stats()["in_use_bytes"])


def attention_reference(q: Array, k: Array, v: Array, lens: Array) -> Array:
    """float64 decode attention: q (batch, heads, d), caches (batch, kv_heads, max_len, d)."""
    batch, heads, d = q.shape
    group = heads // k.shape[1]
    out = np.zeros(q.shape)
    for b in range(batch):
        for h in range(heads):
            keys = k[b, h // group, : lens[b]].astype(np.float64)
            scores = keys @ q[b, h].astype(np.float64) / np.sqrt(d)
            w = np.exp(scores - scores.max())
            out[b, h] = w @ v[b, h // group, : lens[b]].astype(np.float64) / w.sum()
    return out


@pytest.mark.gpu
def test_gpu_threads_on_their_own_streams_model_sized() -> None:
    before = in_use()
    workers = 8

    def worker(index: int) -> Callable[[], None]:
        def run() -> None:
            rng = np.random.default_rng(100 + index)
            stream = gp.Stream()
            with stream:
                for round_ in range(4):
                    n = (2048, 4096)[(index + round_) % 2]
                    a = rng.standard_normal((64, n)).astype(np.float32)
                    w = rng.standard_normal((n, n)).astype(np.float16)  # a 4096 x 4096 layer: 32 MiB
                    y = gp.matmul(gp.from_numpy(a).astype(gp.float16), gp.from_numpy(w)).astype(gp.float32)
                    want = a[:4].astype(np.float16).astype(np.float64) @ w.astype(np.float64)
                    np.testing.assert_allclose(y[:4].to_numpy(), want, rtol=2e-2, atol=0.5, err_msg=f"worker {index}")
                    q = rng.standard_normal((4, 32, 128)).astype(np.float16)
                    k = rng.standard_normal((4, 8, 2048, 128)).astype(np.float16)
                    lens = rng.integers(1, 2049, size=4)
                    out = gp.decode_attention(gp.from_numpy(q), gp.from_numpy(k), gp.from_numpy(k), lens.tolist())
                    np.testing.assert_allclose(out.to_numpy().astype(np.float64), attention_reference(q, k, k, lens),
                                               rtol=4e-3, atol=4e-3, err_msg=f"worker {index}")  # fmt: skip
                stream.synchronize()

        return run

    run_threads([worker(i) for i in range(workers)])
    assert in_use() == before, "allocations were not returned"


@pytest.mark.gpu
def test_gpu_graph_capture_of_a_decode_step_while_another_thread_allocates() -> None:
    rng = np.random.default_rng(7)
    batch, heads, kv_heads, d, max_len, hidden = 4, 32, 8, 128, 4096, 4096
    q = gp.from_numpy(rng.standard_normal((batch, heads, d)).astype(np.float16))
    k_host = rng.standard_normal((batch, kv_heads, max_len, d)).astype(np.float16)
    kc = gp.from_numpy(k_host)
    lens = gp.from_numpy(np.array([1, 100, 2048, 4096], np.int32))
    w_host = (rng.standard_normal((hidden, heads * d)) * 0.02).astype(np.float16)
    w = gp.from_numpy(w_host)
    attn = gp.empty((batch, heads, d), gp.float16)
    proj = gp.empty((batch, hidden), gp.float16)
    workspace = gp.decode_workspace(batch, heads, kv_heads, d, max_len)
    stream = gp.Stream()

    def step() -> None:
        gp.decode_attention(q, kc, kc, lens, out=attn, workspace=workspace)
        gp.matmul(attn.reshape(batch, heads * d), w.T, out=proj)

    with stream:
        step()
        stream.synchronize()
    before = in_use()
    capturing, done = threading.Event(), threading.Event()
    graphs: list[gp.CudaGraph] = []
    allocated = [0]

    def capturer() -> None:
        capturing.set()
        for _ in range(3):
            graph = gp.CudaGraph()
            with graph.capture(stream):
                step()
            graphs.append(graph)
        done.set()

    def allocator() -> None:
        own = gp.Stream()
        local = np.random.default_rng(8)
        capturing.wait(TIMEOUT)
        with own:
            while not done.is_set() or allocated[0] < 10:
                mb = int(local.integers(64, 512))  # model-sized blocks
                block = gp.full(mb << 19, 0.25, gp.float16)
                assert float(gp.sum(block[: 1 << 16].astype(gp.float32)).to_numpy()) == 0.25 * (1 << 16)
                del block
                allocated[0] += 1
            own.synchronize()

    run_threads([capturer, allocator])
    assert allocated[0] >= 10
    nodes = {graph.num_nodes for graph in graphs}
    assert len(nodes) == 1, f"captures recorded different work (another thread's?): {nodes}"
    host_lens = np.array([1, 100, 2048, 4096])
    for graph in graphs:
        q_host = rng.standard_normal((batch, heads, d)).astype(np.float16)
        q.copy_(q_host)
        with stream:
            proj.copy_(np.full((batch, hidden), np.nan, np.float16))
            graph.replay()
            stream.synchronize()
        want_attn = attention_reference(q_host, k_host, k_host, host_lens)
        want = want_attn.astype(np.float16).astype(np.float64).reshape(batch, -1) @ w_host.T.astype(np.float64)
        np.testing.assert_allclose(proj.to_numpy().astype(np.float64), want, rtol=2e-2, atol=2e-2)
    graphs.clear()
    assert in_use() == before, "allocations were not returned"


def test_streams_made_and_dropped_leave_no_per_stream_memory() -> None:
    """100 streams, each running a split row reduction (whose last block uses the stream's completion
    counters, 256 KiB per stream) and then closed or dropped: the per-stream counters go with their
    stream, so in_use stays flat (it grew by 256 KiB per stream before). The counters are also taken
    explicitly, as the GPU's split reduction does, so that the CPU backend exercises the release too."""
    from pygpukit.ops import _kernels

    rng = np.random.default_rng(11)
    host = rng.standard_normal((4, 1 << 17)).astype(np.float32)
    x = gp.from_numpy(host)
    want = host.astype(np.float64).sum(axis=1)
    with gp.Stream() as warm:  # kernels and plans made once
        gp.sum(x, axis=1).to_numpy()
    del warm
    before = in_use()
    for i in range(100):
        stream = gp.Stream()
        with stream:
            counters = _kernels.completion_counters(x._buffer.device, None)
            assert counters is not None
            assert counters.nbytes == 4 * _kernels.COUNTERS
            got = gp.sum(x, axis=1).to_numpy().astype(np.float64)
            stream.synchronize()
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)
        del counters
        if i % 2:
            stream.close()
        del stream
    assert in_use() == before, f"{in_use() - before} bytes left by 100 dropped streams"


@pytest.mark.slow
def test_soak_tool_short_run(tmp_path: Path) -> None:
    """Half a minute of the soak (warm-up included) on the current backend: steps run, no check fails,
    the JSON summary holds the start and end memory figures, and on the CPU backend the verdict is
    flat (the GPU's verdict is the 10-minute run's)."""
    out = tmp_path / "soak.json"
    command = [sys.executable, str(ROOT / "benchmarks" / "tools" / "soak.py"), "--minutes", "0.5",
               "--sample-seconds", "1", "--model-mb", "16", "--out", str(out)]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    assert result.returncode in (0, 1), result.stdout + result.stderr  # 1: a failed check or not flat
    summary = json.loads(out.read_text())
    assert summary["failure_count"] == 0, summary["failures"]
    if summary["backend"] != "cuda":  # on the GPU, half a minute may meet a shape (and a workspace) late
        assert summary["verdict"]["flat"], summary["verdict"]
    assert summary["steps"] > 0
    assert {"in_use_bytes", "rss_bytes"} <= set(summary["memory_start"]) & set(summary["memory_end"])
