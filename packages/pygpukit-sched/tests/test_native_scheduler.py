"""The Scheduler bindings: lifecycle, policies, dependencies, QoS preemption, bad input, the
10,000-task mixed workload, threads, and the per-task cost from Python."""

from __future__ import annotations

import threading
import time

import pytest

import _pygpukit_rust as rust

MB = 1 << 20


def run_all(s: rust.Scheduler) -> list[str]:
    order = []
    while True:
        s.admit()
        task_id = s.next_runnable()
        if task_id is None:
            return order
        s.complete(task_id)
        order.append(task_id)


def test_lifecycle_reserves_then_releases_memory() -> None:
    s = rust.Scheduler(100 * MB)
    assert s.submit(rust.TaskMeta("a", "A", 10 * MB)) == "a"
    assert s.state("a") == rust.TaskState.Pending
    assert s.admit()["admitted"] == ["a"]
    assert s.task_info("a")["reserved_memory"] == 10 * MB
    assert s.stats()["admission"]["memory_used"] == 10 * MB
    assert s.get_runnable_tasks() == ["a"]
    assert s.state("a") == rust.TaskState.Running
    s.complete("a")
    info = s.task_info("a")
    assert info["state"] == rust.TaskState.Completed
    assert info["finished_ns"] >= info["started_ns"] >= info["admitted_ns"] >= info["submitted_ns"] > 0
    stats = s.stats()
    assert stats["completed"] == 1
    assert stats["admission"]["memory_used"] == 0


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        (rust.TaskPolicy.Fifo, ["t0", "t1", "t2"]),
        (rust.TaskPolicy.Priority, ["t1", "t2", "t0"]),
        (rust.TaskPolicy.Sjf, ["t1", "t2", "t0"]),
    ],
)
def test_policies_order_tasks(policy: rust.TaskPolicy, expected: list[str]) -> None:
    s = rust.Scheduler(100 * MB, policy=policy)
    for i, (priority, cost) in enumerate([(0, 1000), (5, 10), (1, 100)]):
        s.submit(rust.TaskMeta(f"t{i}", "", priority=priority, estimated_cost=cost))
    assert run_all(s) == expected


def test_dependencies_order_work_and_failures_cancel_dependents() -> None:
    s = rust.Scheduler(100 * MB)
    s.submit(rust.TaskMeta("load", "load weights"))
    s.submit(rust.TaskMeta("infer", "run", dependencies=["load"]))
    s.submit(rust.TaskMeta("post", "post-process", dependencies=["infer"]))
    assert s.admit()["admitted"] == ["load"]
    s.start("load")
    s.complete("load")
    assert s.admit()["admitted"] == ["infer"]
    s.start("infer")
    s.fail("infer", "kernel crashed")
    assert s.state("post") == rust.TaskState.Cancelled
    assert "infer" in s.task_info("post")["error"]
    with pytest.raises(rust.AdmissionRejectedError) as exc:
        s.submit(rust.TaskMeta("late", "", dependencies=["infer"]))
    assert exc.value.reason.kind == "unsatisfiable_dependencies"
    assert exc.value.reason.details() == {"dependency": "infer"}


def test_dependency_cycle_is_refused_with_the_cycle_and_state_kept() -> None:
    s = rust.Scheduler(100 * MB)
    s.submit(rust.TaskMeta("gate", ""))
    s.submit(rust.TaskMeta("a", "", dependencies=["gate"]))
    s.submit(rust.TaskMeta("b", "", dependencies=["a"]))
    with pytest.raises(rust.DependencyCycleError) as exc:
        s.add_dependency("a", "b")
    assert exc.value.cycle == ["a", "b", "a"]
    assert isinstance(exc.value, ValueError)
    with pytest.raises(rust.DependencyCycleError):
        s.submit(rust.TaskMeta("self", "", dependencies=["self"]))
    assert run_all(s) == ["gate", "a", "b"]


@pytest.mark.parametrize(
    ("make", "error", "needle"),
    [
        (lambda: rust.TaskMeta("x", "", -1), rust.InvalidArgumentError, "memory_estimate: -1"),
        (lambda: rust.TaskMeta("x", "", 2**64), rust.InvalidArgumentError, "memory_estimate"),
        (lambda: rust.Scheduler(-5), rust.InvalidArgumentError, "total_memory: -5"),
        (lambda: rust.Scheduler(0), rust.InvalidArgumentError, "max_memory: 0"),
        (lambda: rust.Scheduler(MB, guaranteed_share=1.5), rust.InvalidArgumentError, "guaranteed_share"),
        (lambda: rust.Scheduler(MB, class_weights=(1, 0, 1)), rust.InvalidArgumentError, "class_weights"),
        (lambda: rust.TaskMeta("x", "", qos="platinum"), rust.InvalidArgumentError, "platinum"),
    ],
)
def test_bad_construction_raises_value_errors_naming_the_value(make, error, needle) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(error, match=needle) as exc:
        make()
    assert isinstance(exc.value, ValueError)
    assert isinstance(exc.value, rust.SchedulerError)


def test_bad_submissions_are_typed_and_change_nothing() -> None:
    s = rust.Scheduler(100 * MB)
    s.submit(rust.TaskMeta("a", "", MB))
    before = s.stats()
    with pytest.raises(rust.DuplicateIdError) as dup:
        s.submit(rust.TaskMeta("a", ""))
    assert (dup.value.kind, dup.value.id) == ("task", "a")
    with pytest.raises(rust.UnknownIdError) as unknown:
        s.submit(rust.TaskMeta("b", "", dependencies=["nope"]))
    assert isinstance(unknown.value, KeyError)
    assert str(unknown.value) == 'unknown task id "nope"'
    with pytest.raises(rust.InvalidArgumentError, match="priority"):
        s.submit(rust.TaskMeta("c", "", priority=5000))
    with pytest.raises(rust.InvalidArgumentError, match="bandwidth"):
        s.submit(rust.TaskMeta("d", "", bandwidth=float("nan")))
    with pytest.raises(rust.AdmissionRejectedError) as too_big:
        s.submit(rust.TaskMeta("e", "", 200 * MB, qos=rust.QosClass.Guaranteed))
    reason = too_big.value.reason
    assert reason.kind == "exceeds_capacity"
    assert reason.is_permanent
    assert reason.details()["requested"] == 200 * MB
    after = s.stats()
    for key in ("pending", "admitted", "running", "completed", "failed", "cancelled", "submitted"):
        assert after[key] == before[key], key
    assert run_all(s) == ["a"]


def test_double_complete_and_double_cancel_are_refused() -> None:
    s = rust.Scheduler(100 * MB)
    s.submit(rust.TaskMeta("a", "", MB))
    s.cancel("a")
    with pytest.raises(rust.InvalidTransitionError) as exc:
        s.cancel_task("a")
    assert (exc.value.state, exc.value.operation) == ("cancelled", "cancel")
    s.submit(rust.TaskMeta("b", "", MB))
    assert s.get_runnable_tasks() == ["b"]
    s.complete("b")
    with pytest.raises(rust.InvalidTransitionError, match='task "b" is completed; cannot complete'):
        s.complete("b")
    with pytest.raises(rust.UnknownIdError):
        s.complete("zzz")
    stats = s.stats()
    assert (stats["cancelled"], stats["completed"]) == (1, 1)
    assert stats["admission"]["memory_used"] == 0
    assert stats["admission"]["pending"] == 0


def test_queue_limit_rejects_with_queue_full() -> None:
    s = rust.Scheduler(100 * MB, max_pending_tasks=2)
    s.submit(rust.TaskMeta("a", ""))
    s.submit(rust.TaskMeta("b", ""))
    with pytest.raises(rust.AdmissionRejectedError) as exc:
        s.submit(rust.TaskMeta("c", ""))
    assert exc.value.reason.kind == "queue_full"
    assert exc.value.reason.details() == {"limit": 2}
    s.admit(1)
    s.submit(rust.TaskMeta("c", ""))


def test_guaranteed_preempts_best_effort_which_is_requeued_and_runs_once() -> None:
    s = rust.Scheduler(100 * MB)
    for i in range(4):
        s.submit(rust.TaskMeta(f"be{i}", "", 25 * MB, qos=rust.QosClass.BestEffort))
    assert len(s.admit()["admitted"]) == 4
    s.submit(rust.TaskMeta("g", "", 50 * MB, qos="guaranteed"))
    decision = s.evaluate_admission(rust.TaskMeta("probe", "", 50 * MB, qos="guaranteed"))
    assert decision.admitted
    assert decision.preempted == ["be3", "be2"]
    report = s.admit()
    assert report["admitted"] == ["g"]
    assert report["preempted"] == ["be3", "be2"]
    assert s.state("be3") == rust.TaskState.Pending
    assert s.task_info("be3")["preemptions"] == 1
    assert sorted(run_all(s)) == ["be0", "be1", "be2", "be3", "g"]
    assert s.stats()["preempted"] == 2


def test_mixed_workload_of_ten_thousand_tasks_has_no_starvation() -> None:
    report = rust.simulate_workload(10_000)
    assert report["unfinished"] == 0
    for name in ("guaranteed", "burstable", "best_effort"):
        c = report[name]
        assert c["completed"] + c["failed"] + c["cancelled"] == c["submitted"]
        assert c["failed"] > 0
        assert c["cancelled"] > 0
        assert c["max_wait"] <= 200, (name, c)
        assert c["p50_wait"] <= c["p99_wait"] <= c["max_wait"]
    assert report["guaranteed"]["p50_wait"] <= report["best_effort"]["p50_wait"]


def test_wait_stats_report_percentiles_per_class() -> None:
    s = rust.Scheduler(100 * MB)
    for i in range(30):
        s.submit(rust.TaskMeta(f"t{i}", "", MB, qos=["guaranteed", "burstable", "best_effort"][i % 3]))
    run_all(s)
    waits = s.wait_stats()
    assert set(waits) == {"guaranteed", "burstable", "best_effort"}
    for w in waits.values():
        assert w["count"] == 10
        assert 0 <= w["p50_us"] <= w["p99_us"] <= w["max_us"]


def test_threads_share_one_scheduler() -> None:
    s = rust.Scheduler(1 << 30, max_pending_tasks=100_000)
    started: list[str] = []
    lock = threading.Lock()

    def submitter(k: int) -> None:
        for i in range(500):
            s.submit(rust.TaskMeta(f"{k}-{i}", "", 1024, qos=["guaranteed", "burstable", "best_effort"][i % 3]))

    def worker() -> None:
        idle = 0
        while idle < 200:
            s.admit(32)
            task_id = s.next_runnable()
            if task_id is None:
                idle += 1
                time.sleep(0.0005)
                continue
            idle = 0
            with lock:
                started.append(task_id)
            s.complete(task_id)

    threads = [threading.Thread(target=submitter, args=(k,)) for k in range(4)]
    threads += [threading.Thread(target=worker) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(started) == len(set(started)) == 2000
    assert s.stats()["completed"] == 2000
    assert s.stats()["admission"]["memory_used"] == 0


def test_submit_admit_complete_costs_at_most_15_us_from_python() -> None:
    s = rust.Scheduler(1 << 40, max_pending_tasks=1 << 20)
    best = float("inf")
    for rep in range(3):
        start = time.perf_counter()
        for i in range(rep * 5000, rep * 5000 + 5000):
            s.submit(rust.TaskMeta(f"t{i}", "bench", 1024))
            s.admit(1)
            task_id = s.next_runnable()
            assert task_id is not None
            s.complete(task_id)
        best = min(best, (time.perf_counter() - start) / 5000 * 1e6)
    print(f"submit -> admit -> complete from Python: {best:.2f} us/task")
    assert best <= 15.0
