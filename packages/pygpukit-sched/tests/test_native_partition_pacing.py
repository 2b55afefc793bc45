"""Partition and pacing bindings: the seeds' partition snippet, limits, overcommit, streams,
token-bucket pacing by share, adaptive bandwidth, and bad input."""

from __future__ import annotations

import time

import pytest

import _pygpukit_rust as rust

GB = 1 << 30


def test_seed_partition_snippet_and_limits() -> None:
    manager = rust.PartitionManager(rust.PartitionConfig(total_memory=8 * 1024**3))
    manager.create_partition("inference", "Inference", rust.PartitionLimits().memory(4 * 1024**3).compute(0.5))
    manager.create_partition("training", "Training", rust.PartitionLimits().memory(4 * GB).compute(0.5).streams(1))
    with pytest.raises(rust.InvalidArgumentError, match="memory limits would add up"):
        manager.create_partition("extra", "", rust.PartitionLimits().memory(GB))
    with pytest.raises(rust.InvalidArgumentError, match="compute_share"):
        manager.update_limits("training", rust.PartitionLimits().memory(GB).compute(0.6))
    with pytest.raises(rust.DuplicateIdError):
        manager.create_partition("inference", "", rust.PartitionLimits().memory(GB))
    manager.reserve_memory("inference", 3 * GB)
    with pytest.raises(rust.AdmissionRejectedError) as exc:
        manager.reserve_memory("inference", 2 * GB)
    assert exc.value.reason.kind == "partition_limit"
    assert manager.get_partition("inference")["memory_used"] == 3 * GB
    manager.acquire_stream("training")
    with pytest.raises(rust.AdmissionRejectedError, match="streams"):
        manager.acquire_stream("training")
    manager.assign_task("t1", "training")
    manager.set_default("inference")
    assert manager.partition_of("t1") == "training"
    assert manager.partition_of("t2") == "inference"
    with pytest.raises(rust.InvalidTransitionError):
        manager.delete_partition("training")
    manager.release_stream("training")
    manager.unassign_task("t1")
    manager.delete_partition("training")
    assert manager.partition_ids() == ["inference"]
    with pytest.raises(rust.UnknownIdError):
        manager.assign_task("t3", "training")
    stats = manager.stats()
    assert (stats["partitions"], stats["memory_used"]) == (1, 3 * GB)


def test_overcommitted_limits_never_overcommit_real_use() -> None:
    m = rust.PartitionManager(rust.PartitionConfig(8 * GB, allow_overcommit=True, overcommit_ratio=1.5))
    for i in range(3):
        m.create_partition(f"p{i}", "", rust.PartitionLimits().memory(4 * GB))
    m.reserve_memory("p0", 4 * GB)
    m.reserve_memory("p1", 4 * GB)
    with pytest.raises(rust.AdmissionRejectedError, match="exceed the device"):
        m.reserve_memory("p2", 1)
    with pytest.raises(rust.InvalidArgumentError, match="holds only"):
        m.release_memory("p2", 1)
    with pytest.raises(rust.InvalidArgumentError, match="overcommit_ratio"):
        rust.PartitionManager(rust.PartitionConfig(GB, True, 0.5))
    with pytest.raises(rust.InvalidArgumentError, match="nbytes: -1"):
        m.reserve_memory("p0", -1)


def test_pacing_holds_a_stream_to_its_share() -> None:
    # 1e6 units/s; a stream with a quarter share gets 2.5e5/s plus one 10 ms bucket.
    engine = rust.KernelPacingEngine(rust.PacingConfig(total_bandwidth=1e6, window_ms=10.0))
    engine.allocate_stream(7, 0.25)
    granted = 0.0
    start = time.perf_counter()
    while time.perf_counter() - start < 0.4:
        engine.acquire(7, 1000.0)
        granted += 1000.0
    elapsed = time.perf_counter() - start
    rate = granted / elapsed
    assert rate <= 2.5e5 * 1.1 + 2500 / elapsed, rate
    assert rate >= 2.5e5 * 0.8, rate
    stats = engine.stream_stats(7)
    assert stats["share"] == 0.25
    assert stats["granted"] == granted
    decision = engine.try_launch(7, 1e5)
    assert not decision
    assert decision.delay_ms > 0


def test_pacing_shares_adaptive_bandwidth_and_bad_input() -> None:
    engine = rust.KernelPacingEngine(rust.PacingConfig(1.0, adaptive=True))
    engine.allocate_stream(1, 0.6)
    with pytest.raises(rust.InvalidArgumentError, match="shares would add up"):
        engine.allocate_stream(2, 0.5)
    with pytest.raises(rust.DuplicateIdError):
        engine.allocate_stream(1, 0.1)
    with pytest.raises(rust.UnknownIdError):
        engine.try_launch(99, 1.0)
    with pytest.raises(rust.InvalidArgumentError, match="cost"):
        engine.try_launch(1, -1.0)
    with pytest.raises(rust.InvalidArgumentError, match="share"):
        engine.set_share(1, 0.0)
    with pytest.raises(rust.InvalidArgumentError, match="window_ms"):
        rust.KernelPacingEngine(rust.PacingConfig(1.0, window_ms=0.0))
    for _ in range(40):
        engine.record_completion(4e6, 2.0)  # 2e9 units/s observed
    assert engine.total_bandwidth == pytest.approx(2e9, rel=1e-3)
    assert engine.stream_stats(1)["rate"] == pytest.approx(1.2e9, rel=1e-3)
    engine.release_stream(1)
    assert engine.streams() == []
