"""QoS evaluation and admission control bindings: the seeds' snippet, class rules, preemption,
bursts, reject reasons and bad input."""

from __future__ import annotations

import pytest

import _pygpukit_rust as rust

GB = 1 << 30
MB = 1 << 20


def test_seed_snippet_works_as_written() -> None:
    evaluator = rust.QosPolicyEvaluator(total_memory=8 * 1024**3, total_bandwidth=1.0)
    task = rust.QosTaskMeta.guaranteed("task-1", "Critical Task", 256 * 1024 * 1024)
    result = evaluator.evaluate(task)
    assert result.admitted
    assert result.granted_memory == 256 * MB
    assert evaluator.stats()["active_tasks"] == 0, "evaluate reserves nothing"
    assert task.qos_class == rust.QosClass.Guaranteed
    assert task.qos_class.label == "guaranteed"


def test_guaranteed_within_reservation_preempts_best_effort() -> None:
    ev = rust.QosPolicyEvaluator(8 * GB)
    for i in range(8):
        assert ev.reserve(rust.QosTaskMeta.best_effort(f"be{i}", "batch", GB))
    assert ev.stats()["memory_by_class"]["best_effort"] == 8 * GB
    decision = ev.reserve(rust.QosTaskMeta.guaranteed("g", "llm", 3 * GB))
    assert decision.admitted
    assert decision.preempted == ["be7", "be6", "be5"]
    stats = ev.stats()
    assert stats["memory_by_class"] == {"guaranteed": 3 * GB, "burstable": 0, "best_effort": 5 * GB}
    assert stats["preempted"] == 3
    with pytest.raises(rust.UnknownIdError):
        ev.release("be7")
    ev.release("g")
    with pytest.raises(rust.UnknownIdError):
        ev.release("g")


def test_burstable_bursts_within_limits_and_never_into_the_guaranteed_share() -> None:
    ev = rust.QosPolicyEvaluator(8 * GB, guaranteed_share=0.5, burst_share=0.25)
    d = ev.reserve(rust.QosTaskMeta.burstable("b", "tts", GB, memory_limit=6 * GB))
    assert d.admitted
    assert d.granted_memory == 3 * GB  # request 1 GiB + burst up to the 2 GiB cap (0.25 of 8)
    assert d.burst_memory == 2 * GB
    d = ev.reserve(rust.QosTaskMeta.burstable("b2", "asr", 2 * GB, memory_limit=2 * GB))
    assert not d.admitted
    assert d.reason is not None
    assert d.reason.kind == "insufficient_memory"
    assert d.reason.details() == {"resource": "memory", "requested": 2 * GB, "available": GB}
    never = ev.evaluate(rust.QosTaskMeta.burstable("b3", "", 5 * GB))
    assert never.reason is not None
    assert never.reason.kind == "exceeds_capacity"
    assert never.reason.is_permanent
    with pytest.raises(rust.InvalidArgumentError, match="memory_limit"):
        rust.QosTaskMeta.burstable("x", "", 2 * GB, memory_limit=GB)


def test_admission_controller_bandwidth_queue_and_best_effort_switch() -> None:
    ctrl = rust.AdmissionController(rust.AdmissionConfig(GB, 1.0, 2, enable_best_effort=False))
    assert ctrl.try_admit("a", 100 * MB, 0.4, qos="guaranteed")
    assert ctrl.try_admit("b", 100 * MB, 0.3, qos=rust.QosClass.Burstable)
    d = ctrl.try_admit("c", 100 * MB, 0.3, qos="burstable")
    assert not d
    assert d.reason is not None
    assert d.reason.kind == "insufficient_bandwidth"
    d = ctrl.try_admit("d", MB, qos="best_effort")
    assert d.reason is not None
    assert d.reason.kind == "best_effort_disabled"
    ctrl.enqueue()
    ctrl.enqueue()
    with pytest.raises(rust.AdmissionRejectedError) as exc:
        ctrl.enqueue()
    assert exc.value.reason.kind == "queue_full"
    ctrl.dequeue()
    ctrl.enqueue()
    with pytest.raises(rust.DuplicateIdError):
        ctrl.try_admit("a", MB, qos="guaranteed")
    assert ctrl.release("a") == 100 * MB
    stats = ctrl.stats()
    assert stats["active"] == 1
    assert stats["bandwidth_used"] == pytest.approx(0.3)
    assert stats["pending"] == 2


@pytest.mark.parametrize(
    ("make", "needle"),
    [
        (lambda: rust.QosPolicyEvaluator(-1), "total_memory: -1"),
        (lambda: rust.QosPolicyEvaluator(GB, -2.0), "max_bandwidth"),
        (lambda: rust.QosPolicyEvaluator(GB, guaranteed_share=-0.1), "guaranteed_share"),
        (lambda: rust.QosTaskMeta.guaranteed("x", "", -GB), "memory: -1073741824"),
        (lambda: rust.AdmissionConfig(GB, max_pending_tasks=0), "max_pending_tasks"),
        (lambda: rust.AdmissionConfig(GB, max_pending_tasks=-3), "max_pending_tasks: -3"),
        (lambda: rust.AdmissionConfig(2**70), "max_memory"),
        (
            lambda: rust.AdmissionController(rust.AdmissionConfig(GB)).try_admit("x", MB, float("inf")),
            "bandwidth",
        ),
    ],
)
def test_bad_values_raise_invalid_argument(make, needle) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(rust.InvalidArgumentError, match=needle):
        make()
