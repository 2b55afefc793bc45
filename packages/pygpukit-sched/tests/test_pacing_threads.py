"""Issue 23, item 2: a paced best-effort context measured at its share (within 10% over 2 s windows)
while a guaranteed context runs in another thread of the same process.

The H100 run of 2026-11-24 gave the paced context 600 and 358 launches per 2 s window for a share of
2000, with its bucket full and 32 of 1078 launches throttled: the paced thread was not waiting for
tokens but for the GIL. A thread that gives the GIL up once per launch gets it back from a thread
that never blocks only at the interpreter's forced switches (every 5 ms): about 200 launches/s.
``test_the_gil_convoy_without_the_switch_interval_fix`` reproduces that on the CPU (a launch with
a 20 us GIL-free sleep); PacedStream now lowers the switch interval while it lives, and the CPU twin
and the GPU test check the shares with it. Both print a breakdown of where the paced thread's time
went (launch calls, token waits, synchronisations, the rest: waiting for the GIL), so a failure on
the device says which one it was."""

from __future__ import annotations

import gc
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

import pygpukit as gp
from pygpukit import scheduler as sched
from pygpukit.scheduler import GB, MB, PacedStream
from pygpukit.scheduler import _pacing as pacing
from pygpukit.testing import run_threads

RATE = 4000.0  # launch_rate of these tests: a 0.25 share is 1000 launches/s, 2000 per 2 s window
SHARE = 0.25
WINDOW = 2.0


@pytest.fixture(autouse=True)
def fresh_scheduler() -> Iterator[None]:
    sched.shutdown()
    sched.initialize(0, capacity=1 * GB, launch_rate=RATE)
    base = sys.getswitchinterval()
    yield
    sched.shutdown()
    gc.collect()  # paced streams of the test gone: the switch interval is restored
    sys.setswitchinterval(base)


def _gil_free_launch() -> None:
    """What a launch costs the CPU here: the stream's handle (where a paced stream takes its token),
    then a 20 us sleep with the GIL released (a driver call that blocks, or a synchronisation, in a
    real run). A sleep rather than GIL-free work: on an idle machine the other thread takes the GIL
    within microseconds, on a loaded one only if the GIL-free part outlasts its wake-up."""
    gp.current_stream()._handle  # noqa: B018
    time.sleep(20e-6)


def _gil_held_launch() -> None:
    gp.current_stream()._handle  # noqa: B018
    end = time.perf_counter() + 3e-6
    while time.perf_counter() < end:
        pass


def _runqueue_wait_s() -> float:
    """Seconds the calling thread has waited for a CPU (Linux schedstat; 0.0 where unavailable)."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


def measure_shares(
    guaranteed: sched.ExecutionContext,
    best: sched.ExecutionContext,
    launch: Callable[[], None],
    *,
    windows: int = 2,
    sync_every: int = 256,
    check: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """Both contexts launch as fast as they may, each in its own thread and session, synchronizing
    every ``sync_every`` launches, for ``windows`` windows of 2 s (after 0.2 s in which the paced
    bucket's initial burst is spent). Returns the launches per window of each and, for the paced
    thread, seconds spent in launch calls (token waits included; less them: the launch proper and
    getting the GIL back after each wait or GIL-free part), in synchronisations, and the rest (Python),
    its CPU time and its time waiting for a CPU, with its pacing statistics and the switch interval."""
    counts = {guaranteed.name: [0] * windows, best.name: [0] * windows}
    spent = {"launch": 0.0, "sync": 0.0, "longest_launch": 0.0, "total": 0.0}
    begin = time.perf_counter()
    start = begin + 0.2
    stop = start + windows * WINDOW

    def run(ctx: sched.ExecutionContext) -> None:
        paced = ctx is best
        with sched.context_session(ctx):
            out = gp.zeros(1024)
            n = 0
            t0 = time.perf_counter()
            queued = _runqueue_wait_s()
            cpu0 = time.thread_time()
            while (now := time.perf_counter()) < stop:
                launch()
                after = time.perf_counter()
                n += 1
                if now >= start:
                    counts[ctx.name][min(int((now - start) / WINDOW), windows - 1)] += 1
                if n % sync_every == 0:
                    ctx.synchronize()
                if paced:
                    spent["launch"] += after - now
                    spent["longest_launch"] = max(spent["longest_launch"], after - now)
                    spent["sync"] += time.perf_counter() - after if n % sync_every == 0 else 0.0
            ctx.synchronize()
            if paced:
                spent["total"] = time.perf_counter() - t0
                spent["waiting_for_a_cpu"] = _runqueue_wait_s() - queued
                spent["cpu_s"] = time.thread_time() - cpu0  # on a CPU (a driver's spin-wait counts)
            if check is not None:
                check(n)
            del out

    run_threads([lambda: run(guaranteed), lambda: run(best)])
    stream = best.stream
    assert isinstance(stream, PacedStream)
    spent["other"] = spent["total"] - spent["launch"] - spent["sync"]
    # launch calls less token waits: the launches themselves plus getting the GIL back after any wait
    spent["launch_less_token_waits"] = spent["launch"] - stream.pacing_stats()["waited_ms"] / 1e3
    report = {
        "counts": counts,
        "expected": SHARE * RATE * WINDOW,
        "paced_thread_seconds": {k: round(v, 4) for k, v in spent.items()},
        "pacing": stream.pacing_stats(),
        "switch_interval_us": round(sys.getswitchinterval() * 1e6, 1),
    }
    print(f"figures: {report}")
    return report


def _check_share(report: dict[str, Any], best: str, guaranteed: str) -> None:
    expected = report["expected"]
    seconds = report["paced_thread_seconds"]
    if any(abs(n - expected) > 0.1 * expected for n in report["counts"][best]):
        if seconds["waiting_for_a_cpu"] > 0.1 * seconds["total"]:  # not the GIL's doing nor the bucket's
            pytest.skip(f"the machine is overloaded: the paced thread waited {seconds['waiting_for_a_cpu']:.2f} s "
                        f"of {seconds['total']:.2f} s for a CPU ({report})")  # fmt: skip
        raise AssertionError(f"best-effort launches per window off its share by more than 10%: {report}")
    assert min(report["counts"][guaranteed]) > expected, report  # the guaranteed context was not held back


def _contexts() -> tuple[sched.ExecutionContext, sched.ExecutionContext]:
    guaranteed = sched.create_context("llm", max_vram=64 * MB, qos="guaranteed")  # not paced
    best = sched.create_context("bg", max_vram=64 * MB, qos="best_effort", compute_share=SHARE)
    return guaranteed, best


# -- CPU twins --------------------------------------------------------------------------------------
def test_switch_interval_is_lowered_while_paced_streams_live_and_restored_after() -> None:
    base = sys.getswitchinterval()
    assert pacing.switch_interval_for(1000.0, 0.005) == pytest.approx(250e-6)
    assert pacing.switch_interval_for(1e6, 0.005) == pacing.SWITCH_FLOOR_S
    assert pacing.switch_interval_for(10.0, 0.005) == 0.005  # never raised
    slow = PacedStream(0.1, 1000.0)  # 100 launches/s
    assert sys.getswitchinterval() == pytest.approx(min(base, 2.5e-3))
    fast = PacedStream(0.5, 1000.0)  # 500 launches/s: the fastest decides
    assert sys.getswitchinterval() == pytest.approx(min(base, 0.5e-3))
    untouched = PacedStream(0.4, 100000.0, switch_interval=False)
    assert sys.getswitchinterval() == pytest.approx(min(base, 0.5e-3))
    del fast
    gc.collect()
    assert sys.getswitchinterval() == pytest.approx(min(base, 2.5e-3))
    del slow, untouched
    gc.collect()
    assert sys.getswitchinterval() == base
    # A value set by someone else while a paced stream lives is theirs: not overwritten on restore.
    paced = PacedStream(0.5, 1000.0)
    sys.setswitchinterval(0.002)
    del paced
    gc.collect()
    assert sys.getswitchinterval() == 0.002


def test_the_gil_convoy_without_the_switch_interval_fix() -> None:
    """The H100 failure's signature on the CPU: with the default 5 ms switch interval and no tuning,
    a paced thread whose launches release the GIL gets far below its share while its bucket stays
    full and it is rarely throttled."""
    sys.setswitchinterval(0.005)
    guaranteed = sched.create_context("llm", max_vram=64 * MB, qos="guaranteed")
    best = sched.create_context("bg", max_vram=64 * MB, qos="best_effort")
    best._stream = PacedStream(SHARE, RATE, priority=5, switch_interval=False)
    assert sys.getswitchinterval() == 0.005

    def launch() -> None:
        if gp.current_stream() is best._stream:
            _gil_free_launch()
        else:
            _gil_held_launch()

    report = measure_shares(guaranteed, best, launch, windows=1)
    seconds = report["paced_thread_seconds"]
    if report["counts"]["bg"][0] >= 0.75 * report["expected"] and seconds["waiting_for_a_cpu"] > 0.1 * seconds["total"]:
        pytest.skip(f"the machine is overloaded: the OS, not the GIL, schedules the threads ({report})")
    # Measured 191 to 379 of 2000 on an idle machine, 1066 on the 2-core CI machine under load.
    assert report["counts"]["bg"][0] < 0.75 * report["expected"], report
    assert report["pacing"]["throttled"] < 0.1 * report["pacing"]["launches"], report


def test_cpu_twin_best_effort_gets_its_share_beside_a_spinning_guaranteed_context() -> None:
    """The GPU test's arithmetic on the CPU backend: the guaranteed thread never releases the GIL
    between launches; the paced thread's launches release it for a 20 us sleep each. On the CUDA
    backend the gpu-marked test measures real launches instead (on an H100 this twin's paced thread
    did not start its loop before the measurement ended: its first allocation and the session's setup
    there wait behind the spinning thread)."""
    if gp.current_backend() == "cuda":
        pytest.skip("a CPU-backend twin; test_gpu_best_effort_launches_at_its_share_* measures this on the GPU")
    guaranteed, best = _contexts()

    def launch() -> None:
        if gp.current_stream() is best._stream:
            _gil_free_launch()
        else:
            _gil_held_launch()

    report = measure_shares(guaranteed, best, launch)
    _check_share(report, "bg", "llm")
    assert report["pacing"]["throttled"] > 0  # the bucket, not the GIL, held it back


def test_one_token_per_launch_not_per_handle_read() -> None:
    """Reads of a stream's handle that are not launches (cache keys of per-stream workspaces and
    counters, the capture check, the graph replay's stream comparison) take no token."""
    from pygpukit.core.graph import is_capturing
    from pygpukit.ops._kernels import completion_counters
    from pygpukit.ops.gemm.gemv_kernels import _workspace

    stream = PacedStream(0.5, 1000.0)
    completion_counters(-1, stream)  # made once (a memset: a launch on the GPU)
    _workspace(-1, stream)
    before = stream.pacing_stats()["launches"]
    for _ in range(10):
        assert not is_capturing(stream)
        completion_counters(-1, stream)
        _workspace(-1, stream)
    assert stream.pacing_stats()["launches"] == before
    stream._handle  # noqa: B018 - a launch
    assert stream.pacing_stats()["launches"] == before + 1


# -- GPU --------------------------------------------------------------------------------------------
TOUCH = r"""
extern "C" __global__ void touch(float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] += 1.0f;
}
"""


@pytest.mark.gpu
@pytest.mark.parametrize("priorities", ["by_qos", "equal"])
def test_gpu_best_effort_launches_at_its_share_while_a_guaranteed_context_runs(priorities: str) -> None:
    """Each launch a small JIT kernel (the fast path); the guaranteed context unpaced, the best-effort
    one paced at 0.25 of 4000 launches/s, 2 windows of 2 s. ``by_qos``: the contexts' own stream
    priorities (guaranteed high, best-effort low); ``equal``: both streams at priority 0, which tells
    a GPU that starves the low-priority stream (its launches then block in the driver: ``cpu_s``
    near the thread's total) from the GIL hand-off (``cpu_s`` small, the rest spent waiting)."""
    kernel = gp.jit(TOUCH, "touch")
    warm = gp.zeros(1024)
    kernel(warm, 1024, grid=4, block=256)  # compiled and loaded before the threads race for it
    gp.synchronize()
    guaranteed, best = _contexts()
    if priorities == "equal":
        guaranteed._stream = gp.Stream(priority=0)
        best._stream = PacedStream(SHARE, RATE, priority=0)
    outs: dict[int, gp.GPUArray] = {}

    def launch() -> None:
        stream = gp.current_stream()
        out = outs.get(id(stream))
        if out is None:
            out = outs[id(stream)] = gp.zeros(1024)
        kernel(out, 1024, grid=4, block=256)

    def check(n: int) -> None:  # every launch ran once: n additions in each element
        out = outs[id(gp.current_stream())]
        np.testing.assert_array_equal(out.to_numpy(), np.full(1024, float(n), np.float32))

    report = measure_shares(guaranteed, best, launch, check=check)
    _check_share(report, "bg", "llm")


@pytest.mark.gpu
def test_gpu_one_token_per_kernel_launch_and_per_graph_replay() -> None:
    kernel = gp.jit(TOUCH, "touch")
    stream = PacedStream(0.5, 100000.0)  # fast enough not to wait
    with stream:
        out = gp.zeros(1024)
        kernel(out, 1024, grid=4, block=256)
        stream.synchronize()
        before = stream.pacing_stats()["launches"]
        for _ in range(50):
            kernel(out, 1024, grid=4, block=256)
        assert stream.pacing_stats()["launches"] == before + 50
        graph = gp.CudaGraph()
        with graph.capture(stream):  # replayed on the stream it was captured on: one graph launch
            kernel(out, 1024, grid=4, block=256)
        stream.synchronize()
        before = stream.pacing_stats()["launches"]
        for _ in range(20):
            graph.replay()
        assert stream.pacing_stats()["launches"] == before + 20
        stream.synchronize()
        expected = np.full(1024, 1.0 + 50 + 20, np.float32)  # the capture itself runs nothing
        np.testing.assert_array_equal(out.to_numpy(), expected)


class _Foreign:
    """A device array of another library: only ``__cuda_array_interface__`` (the JIT fast path takes
    GPUArrays, so a launch with it goes to the general path after the fast path looked at it)."""

    def __init__(self, array: gp.GPUArray) -> None:
        self.array = array

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        return self.array.__cuda_array_interface__


@pytest.mark.gpu
def test_gpu_a_launch_the_fast_path_hands_to_the_general_path_takes_one_token() -> None:
    kernel = gp.jit(TOUCH, "touch")
    stream = PacedStream(0.5, 100000.0)
    with stream:
        out = gp.zeros(1024)
        kernel(out, 1024, grid=4, block=256)  # compiled, fast path ready
        foreign = _Foreign(out)
        before = stream.pacing_stats()["launches"]
        for _ in range(10):
            kernel(foreign, 1024, grid=4, block=256)
        assert stream.pacing_stats()["launches"] == before + 10
        np.testing.assert_array_equal(out.to_numpy(), np.full(1024, 11.0, np.float32))
