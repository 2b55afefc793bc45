//! Property tests of the scheduler's invariants under random operation sequences:
//! - admission never reserves beyond capacity, and Burstable never reaches into the Guaranteed share;
//! - a Guaranteed request within what is left of its reservation is always admitted;
//! - no task is lost or run twice: each is handed out at most once, and once the workload drains
//!   every task is finished;
//! - pacing never grants a stream more than its share over any window (plus one bucket of burst);
//! - context budgets bound to partitions match a reference model and never exceed a limit.

use std::collections::{HashMap, HashSet};

use proptest::prelude::*;
use pygpukit_sched::pacing::{KernelPacingEngine, PacingConfig, PacingDecision};
use pygpukit_sched::scheduler::{Scheduler, SchedulerConfig, TaskMeta, TaskPolicy, TaskState};
use pygpukit_sched::{
    AdmissionConfig, AdmissionController, AdmissionDecision, QosClass, ResourceRequest, SchedError,
};

const CAPACITY: u64 = 1000;

fn class(i: u8) -> QosClass {
    QosClass::ALL[(i % 3) as usize]
}

#[derive(Clone, Debug)]
enum Op {
    Submit {
        class: u8,
        memory: u64,
        bandwidth: u8,
        priority: i32,
        deps: Vec<usize>,
    },
    Admit(usize),
    Start,
    Complete(usize),
    Fail(usize),
    Cancel(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (0u8..3, 0u64..600, 0u8..40, -3i32..4, proptest::collection::vec(any::<usize>(), 0..3))
            .prop_map(|(class, memory, bandwidth, priority, deps)| Op::Submit { class, memory, bandwidth, priority, deps }),
        3 => (1usize..6).prop_map(Op::Admit),
        3 => Just(Op::Start),
        3 => any::<usize>().prop_map(Op::Complete),
        1 => any::<usize>().prop_map(Op::Fail),
        1 => any::<usize>().prop_map(Op::Cancel),
    ]
}

fn policy() -> impl Strategy<Value = TaskPolicy> {
    prop_oneof![
        Just(TaskPolicy::Fifo),
        Just(TaskPolicy::Priority),
        Just(TaskPolicy::ShortestJob)
    ]
}

/// Checks the reservation invariants against the tasks' own view.
fn check_reservations(s: &Scheduler, ids: &[String]) {
    let st = s.stats().admission;
    assert!(
        st.memory_used <= CAPACITY,
        "{} > {CAPACITY}",
        st.memory_used
    );
    assert!(st.bandwidth_used <= 1.0 + 1e-9);
    assert!(
        st.memory_by_class[1] <= CAPACITY - st.guaranteed_memory,
        "burstable {} reached into the guaranteed share",
        st.memory_by_class[1]
    );
    let held: u64 = ids
        .iter()
        .filter_map(|id| s.task(id).ok())
        .filter(|t| matches!(t.state, TaskState::Admitted | TaskState::Running))
        .map(|t| t.reserved_memory)
        .sum();
    assert_eq!(
        held, st.memory_used,
        "reservations must equal what running/admitted tasks hold"
    );
    let not_holding = ids
        .iter()
        .filter_map(|id| s.task(id).ok())
        .filter(|t| !matches!(t.state, TaskState::Admitted | TaskState::Running))
        .all(|t| t.reserved_memory == 0);
    assert!(
        not_holding,
        "a task that is not admitted or running holds memory"
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn no_task_is_lost_or_run_twice_and_capacity_holds(policy in policy(), ops in proptest::collection::vec(op(), 1..120)) {
        let mut cfg = SchedulerConfig::new(CAPACITY);
        cfg.policy = policy;
        let s = Scheduler::new(cfg).unwrap();
        let mut ids: Vec<String> = Vec::new();
        let mut running: Vec<String> = Vec::new();
        let mut started: HashSet<String> = HashSet::new();
        for op in ops {
            match op {
                Op::Submit { class: c, memory, bandwidth, priority, deps } => {
                    let id = format!("t{}", ids.len());
                    let deps: Vec<String> = if ids.is_empty() { vec![] } else {
                        deps.iter().map(|d| ids[d % ids.len()].clone()).collect()
                    };
                    let meta = TaskMeta::new(id.clone(), "")
                        .memory(memory)
                        .bandwidth(f64::from(bandwidth) / 100.0)
                        .priority(priority)
                        .qos(class(c))
                        .cost(memory)
                        .depends_on(deps);
                    match s.submit(meta) {
                        Ok(()) => ids.push(id),
                        Err(SchedError::Rejected(_)) => prop_assert!(s.state(&id).is_err()),
                        Err(e) => prop_assert!(false, "unexpected error {e}"),
                    }
                }
                Op::Admit(n) => {
                    let report = s.admit(n);
                    prop_assert!(report.admitted.len() <= n);
                    for p in &report.preempted {
                        running.retain(|r| r != p); // a preempted running task is cancelled
                    }
                }
                Op::Start => {
                    if let Some(id) = s.next_runnable() {
                        prop_assert!(started.insert(id.clone()), "{id} was handed out twice");
                        running.push(id);
                    }
                }
                Op::Complete(i) | Op::Fail(i) if !running.is_empty() => {
                    let id = running.remove(i % running.len());
                    let r = if matches!(op, Op::Complete(_)) { s.complete(&id) } else { s.fail(&id, "boom") };
                    prop_assert!(r.is_ok(), "{:?}", r);
                    prop_assert!(s.complete(&id).is_err(), "finished twice");
                }
                Op::Cancel(i) if !ids.is_empty() => {
                    let id = &ids[i % ids.len()];
                    let before = s.state(id).unwrap();
                    let r = s.cancel(id);
                    prop_assert_eq!(r.is_ok(), !before.is_terminal());
                    running.retain(|x| x != id);
                }
                _ => {}
            }
            check_reservations(&s, &ids);
        }
        // Drain: finish what runs, then admit and run everything left.
        for id in running.drain(..) {
            if s.state(&id).unwrap() == TaskState::Running {
                s.complete(&id).unwrap();
            }
        }
        loop {
            s.admit(usize::MAX);
            let Some(id) = s.next_runnable() else { break };
            prop_assert!(started.insert(id.clone()), "{id} was handed out twice");
            s.complete(&id).unwrap();
        }
        for id in &ids {
            let state = s.state(id).unwrap();
            prop_assert!(state.is_terminal(), "{id} was lost in state {state}");
        }
        let st = s.stats();
        prop_assert_eq!(st.admission.memory_used, 0);
        prop_assert_eq!(st.admission.pending, 0);
        prop_assert_eq!(st.by_state.iter().sum::<i64>(), ids.len() as i64);
    }

    #[test]
    fn guaranteed_within_its_reservation_is_always_admitted(
        ops in proptest::collection::vec((0u8..3, 1u64..400, any::<bool>()), 1..150),
    ) {
        let c = AdmissionController::new(AdmissionConfig::new(CAPACITY)).unwrap();
        let reserve = c.stats().guaranteed_memory;
        let mut held: HashMap<String, QosClass> = HashMap::new();
        for (i, (k, memory, release)) in ops.into_iter().enumerate() {
            if release && !held.is_empty() {
                let id = held.keys().next().unwrap().clone();
                held.remove(&id);
                c.release(&id).unwrap();
                continue;
            }
            let class = class(k);
            let id = format!("r{i}");
            let g_used = c.stats().memory_by_class[0];
            let decision = c.try_admit(&id, &ResourceRequest::new(class, memory, 0.0)).unwrap();
            if class == QosClass::Guaranteed && g_used + memory <= reserve {
                prop_assert!(decision.is_admitted(), "guaranteed {memory} with {g_used} of {reserve} used: {decision:?}");
            }
            if let AdmissionDecision::Admitted { preempted, .. } = decision {
                for p in &preempted {
                    prop_assert_eq!(held.remove(p), Some(QosClass::BestEffort), "only best effort is preempted");
                }
                held.insert(id, class);
            }
            let st = c.stats();
            prop_assert!(st.memory_used <= CAPACITY);
            prop_assert_eq!(st.memory_by_class.iter().sum::<u64>(), st.memory_used);
            prop_assert_eq!(st.active, held.len());
        }
        for id in held.keys() {
            c.release(id).unwrap();
        }
        prop_assert_eq!(c.stats().memory_used, 0);
    }

    #[test]
    fn pacing_never_exceeds_the_share_over_a_window(
        share in 0.05f64..1.0,
        window_ms in 1.0f64..200.0,
        attempts in proptest::collection::vec((0u64..5_000_000, 1.0f64..400.0), 1..400),
    ) {
        let total = 10_000.0; // units per second
        let mut cfg = PacingConfig::new(total);
        cfg.window_ms = window_ms;
        let e = KernelPacingEngine::new(cfg).unwrap();
        e.allocate_stream_at(1, share, 0).unwrap();
        let rate = share * total;
        let capacity = rate * window_ms / 1e3;
        let mut now = 0u64;
        let mut granted: Vec<(u64, f64)> = Vec::new();
        let mut max_cost: f64 = 0.0;
        for (dt, cost) in attempts {
            now += dt;
            if e.try_launch_at(1, cost, now).unwrap() == PacingDecision::Launch {
                granted.push((now, cost));
                max_cost = max_cost.max(cost);
            }
        }
        let debt = (max_cost - capacity).max(0.0);
        for i in 0..granted.len() {
            let mut sum = 0.0;
            for &(t, c) in &granted[i..] {
                sum += c;
                let span = (t - granted[i].0) as f64 / 1e9;
                let bound = capacity + rate * span + debt + 1e-6;
                prop_assert!(sum <= bound, "granted {sum} in {span} s, bound {bound}");
            }
        }
    }
}

/// SplitMix64: the 10k-task runs draw their steps from one seed that proptest picks (and shrinks), so
/// a failing case is reproducible without proptest having to shrink a 10k-element sequence.
struct Mix(u64);
impl Mix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn percent(&mut self, p: u8) -> bool {
        self.below(100) < u64::from(p)
    }
}

/// `PROPTEST_CASES` when set (an explicit `with_cases` would otherwise ignore it), else `default`.
fn cases_or(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

const LARGE_TASKS: usize = 10_000;

/// What the test itself did to a task, to check against the state the scheduler reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    Open,
    Completed,
    Failed,
    Cancelled,
}

/// 10k tasks with dependencies, random cancels (in any state) and failures (admitted or running):
/// every task ends in a terminal state that matches what was done to it, nothing is handed out twice
/// or started before its dependencies completed, reservations never exceed the capacity or reach into
/// the Guaranteed share, and every reservation is returned at the end.
fn run_ten_thousand_tasks(
    policy: TaskPolicy,
    seed: u64,
    cancel_pct: u8,
    fail_pct: u8,
    max_running: usize,
) {
    let mut cfg = SchedulerConfig::new(CAPACITY);
    cfg.policy = policy;
    cfg.admission.max_pending_tasks = 1_000_000;
    let s = Scheduler::new(cfg).unwrap();
    let mut rng = Mix(seed);
    let mut ids: Vec<String> = Vec::with_capacity(LARGE_TASKS);
    let mut deps_of: Vec<Vec<usize>> = Vec::with_capacity(LARGE_TASKS);
    let mut outcome: Vec<Outcome> = Vec::with_capacity(LARGE_TASKS);
    let mut started_at: Vec<Option<u64>> = Vec::with_capacity(LARGE_TASKS);
    let mut completed_at: Vec<Option<u64>> = Vec::with_capacity(LARGE_TASKS);
    let mut index: HashMap<String, usize> = HashMap::with_capacity(LARGE_TASKS);
    let mut running: Vec<usize> = Vec::new();
    let mut step = 0u64;
    let mut submitted = 0usize;
    let mut rejected = 0usize;

    let check = |s: &Scheduler, ids: &[String], step: u64| {
        let st = s.stats().admission;
        assert!(
            st.memory_used <= CAPACITY,
            "{} > {CAPACITY}",
            st.memory_used
        );
        assert!(st.bandwidth_used <= 1.0 + 1e-9);
        assert!(st.memory_by_class[1] <= CAPACITY - st.guaranteed_memory);
        if step % 997 == 0 {
            check_reservations(s, ids);
        }
    };

    while submitted < LARGE_TASKS || !running.is_empty() {
        step += 1;
        match rng.below(10) {
            // Submit a small batch, some depending on earlier tasks (any state, even finished).
            0..=3 if submitted < LARGE_TASKS => {
                for _ in 0..=rng.below(8) {
                    if submitted == LARGE_TASKS {
                        break;
                    }
                    submitted += 1;
                    let id = format!("t{}", ids.len());
                    let deps: Vec<usize> = if ids.is_empty() {
                        vec![]
                    } else {
                        (0..rng.below(3))
                            .map(|_| ids.len() - 1 - rng.below(ids.len().min(64) as u64) as usize)
                            .collect()
                    };
                    let memory = rng.below(500);
                    let meta = TaskMeta::new(id.clone(), "")
                        .memory(memory)
                        .bandwidth(rng.below(30) as f64 / 100.0)
                        .priority(rng.below(7) as i32 - 3)
                        .qos(class(rng.below(3) as u8))
                        .cost(memory)
                        .depends_on(deps.iter().map(|&d| ids[d].clone()));
                    match s.submit(meta) {
                        Ok(()) => {
                            index.insert(id.clone(), ids.len());
                            ids.push(id);
                            deps_of.push(deps);
                            outcome.push(Outcome::Open);
                            started_at.push(None);
                            completed_at.push(None);
                        }
                        Err(SchedError::Rejected(_)) => {
                            // A dependency that already failed or was cancelled, or too large a request.
                            assert!(s.state(&id).is_err(), "a rejected task was kept");
                            rejected += 1;
                        }
                        Err(e) => panic!("unexpected error {e}"),
                    }
                }
            }
            4 | 5 => {
                let report = s.admit(1 + rng.below(16) as usize);
                for p in &report.preempted {
                    running.retain(|&r| ids[r] != *p); // a preempted running task is cancelled
                    let i = index[p];
                    if s.state(p).unwrap() == TaskState::Cancelled {
                        outcome[i] = Outcome::Cancelled;
                    }
                }
            }
            6 | 7 if running.len() < max_running => {
                if let Some(id) = s.next_runnable() {
                    let i = index[&id];
                    assert!(started_at[i].is_none(), "{id} was handed out twice");
                    for &d in &deps_of[i] {
                        assert!(
                            completed_at[d].is_some(),
                            "{id} started before its dependency {} completed",
                            ids[d]
                        );
                    }
                    started_at[i] = Some(step);
                    running.push(i);
                }
            }
            _ if !running.is_empty() => {
                let i = running.swap_remove(rng.below(running.len() as u64) as usize);
                if rng.percent(fail_pct) {
                    s.fail(&ids[i], "boom").unwrap();
                    outcome[i] = Outcome::Failed;
                } else {
                    s.complete(&ids[i]).unwrap();
                    outcome[i] = Outcome::Completed;
                    completed_at[i] = Some(step);
                }
                assert!(s.complete(&ids[i]).is_err(), "finished twice");
            }
            _ => {}
        }
        // Random cancels of any task, whatever its state.
        if !ids.is_empty() && rng.percent(cancel_pct) {
            let i = ids.len() - 1 - rng.below(ids.len().min(256) as u64) as usize;
            let before = s.state(&ids[i]).unwrap();
            let r = s.cancel(&ids[i]);
            assert_eq!(
                r.is_ok(),
                !before.is_terminal(),
                "cancel of a {before} task"
            );
            if r.is_ok() {
                outcome[i] = Outcome::Cancelled;
                running.retain(|&x| x != i);
            }
        }
        check(&s, &ids, step);
    }
    // Drain: admit and run everything left.
    loop {
        s.admit(usize::MAX);
        let Some(id) = s.next_runnable() else { break };
        let i = index[&id];
        assert!(started_at[i].is_none(), "{id} was handed out twice");
        assert!(deps_of[i].iter().all(|&d| completed_at[d].is_some()));
        started_at[i] = Some(step);
        s.complete(&id).unwrap();
        outcome[i] = Outcome::Completed;
        completed_at[i] = Some(step);
    }
    let mut by_state = [0i64; 6];
    for (i, id) in ids.iter().enumerate() {
        let state = s.state(id).unwrap();
        by_state[state as usize] += 1;
        assert!(state.is_terminal(), "{id} was lost in state {state}");
        match outcome[i] {
            Outcome::Completed => assert_eq!(state, TaskState::Completed, "{id}"),
            Outcome::Failed => assert_eq!(state, TaskState::Failed, "{id}"),
            // Cancelled by the test, or by a dependency that failed or was cancelled.
            Outcome::Cancelled | Outcome::Open => {
                assert_eq!(state, TaskState::Cancelled, "{id} ({:?})", outcome[i]);
                if outcome[i] == Outcome::Open {
                    let blocked = deps_of[i]
                        .iter()
                        .any(|&d| s.state(&ids[d]).unwrap() != TaskState::Completed);
                    assert!(
                        blocked,
                        "{id} was cancelled although all its dependencies completed"
                    );
                }
            }
        }
    }
    check_reservations(&s, &ids);
    let st = s.stats();
    assert_eq!(
        st.admission.memory_used, 0,
        "a reservation was not returned"
    );
    assert!(st.admission.bandwidth_used.abs() < 1e-9);
    assert_eq!(st.admission.pending, 0);
    assert_eq!(st.admission.active, 0);
    assert_eq!(st.by_state, by_state);
    assert_eq!(ids.len() + rejected, LARGE_TASKS);
}

/// 10k blocks through the eviction pool on a device with less memory than the quota: the quota is never
/// exceeded, the device holds exactly the resident bytes, every block keeps its own bytes across
/// evictions and restores, refused allocations change nothing, and every allocation is returned.
fn run_ten_thousand_blocks(seed: u64, quota: u64, device_limit: u64, free_pct: u8) {
    use pygpukit_sched::device::HostDevice;
    use pygpukit_sched::memory::MemoryPool;
    use std::sync::Arc;

    let device = Arc::new(HostDevice::with_memory_limit(device_limit));
    let pool = MemoryPool::new(device.clone(), quota, true).unwrap();
    let mut rng = Mix(seed);
    let mut live: Vec<(u64, u8)> = Vec::new(); // (block id, the byte it was filled with)
    let mut allocated = 0usize;
    let mut refused = 0usize;
    while allocated < LARGE_TASKS {
        match rng.below(8) {
            0..=3 => {
                allocated += 1;
                // Mostly valid sizes; now and then 0 or more than the quota (typed refusals).
                let size = match rng.below(50) {
                    0 => 0,
                    1 => quota + 1 + rng.below(quota),
                    _ => 1 + rng.below(quota / 4),
                };
                let before = pool.stats();
                match pool.allocate(size) {
                    Ok(id) => {
                        let tag = (rng.next() & 0xFF) as u8;
                        pool.write(id, 0, &vec![tag; size as usize]).unwrap();
                        live.push((id, tag));
                    }
                    Err(_) => {
                        // The device refused even with everything evicted: nothing may have leaked.
                        refused += 1;
                        let after = pool.stats();
                        assert_eq!(after.blocks, before.blocks);
                        assert_eq!(after.allocations, before.allocations);
                    }
                }
            }
            4 if !live.is_empty() => {
                let (id, _) = live[rng.below(live.len() as u64) as usize];
                if pool.block(id).unwrap().resident {
                    pool.evict(id).unwrap();
                } else {
                    // May fail when the device is full of the block being restored's peers: typed, no leak.
                    let _ = pool.restore(id);
                }
            }
            5 if !live.is_empty() => {
                let (id, tag) = live[rng.below(live.len() as u64) as usize];
                if pool.block(id).unwrap().resident {
                    let size = pool.block(id).unwrap().size;
                    let bytes = pool.read(id, 0, size).unwrap();
                    assert!(bytes.iter().all(|&b| b == tag), "block {id} lost its bytes");
                    pool.touch(id).unwrap();
                }
            }
            _ if !live.is_empty() && rng.percent(free_pct.max(30)) => {
                let (id, _) = live.swap_remove(rng.below(live.len() as u64) as usize);
                pool.free(id).unwrap();
                assert!(pool.free(id).is_err(), "freed twice");
            }
            _ => {}
        }
        let st = pool.stats();
        assert!(
            st.used <= quota,
            "{} resident bytes over the quota {quota}",
            st.used
        );
        assert_eq!(
            device.allocated_bytes(),
            st.used,
            "device and pool disagree"
        );
        assert_eq!(st.blocks, live.len());
        assert_eq!(device.allocation_count(), st.resident_blocks);
    }
    assert!(refused < LARGE_TASKS, "every allocation was refused");
    for (id, tag) in live.drain(..) {
        if !pool.block(id).unwrap().resident {
            pool.restore(id)
                .unwrap_or_else(|e| panic!("block {id} cannot come back: {e}"));
        }
        let size = pool.block(id).unwrap().size;
        assert!(pool.read(id, 0, size).unwrap().iter().all(|&b| b == tag));
        pool.free(id).unwrap();
    }
    let st = pool.stats();
    assert_eq!((st.used, st.evicted_bytes, st.blocks), (0, 0, 0));
    assert_eq!(st.allocations, st.frees, "an allocation was not returned");
    assert_eq!(device.allocated_bytes(), 0);
    assert_eq!(device.allocation_count(), 0);
}

proptest! {
    // Each case runs 10k tasks; a few cases keep `cargo test` within CI time (PROPTEST_CASES raises it).
    #![proptest_config(ProptestConfig::with_cases(cases_or(4)))]

    #[test]
    fn ten_thousand_tasks_with_cancels_and_failures_lose_nothing(
        policy in policy(),
        seed in any::<u64>(),
        cancel_pct in 0u8..25,
        fail_pct in 0u8..40,
        max_running in 1usize..48,
    ) {
        run_ten_thousand_tasks(policy, seed, cancel_pct, fail_pct, max_running);
    }

    #[test]
    fn ten_thousand_blocks_through_the_eviction_pool_all_come_back(
        seed in any::<u64>(),
        quota in 4_096u64..65_536,
        device_share in 75u64..150,
        free_pct in 0u8..100,
    ) {
        // A device smaller than the quota makes it refuse before the quota does (eviction on OOM).
        run_ten_thousand_blocks(seed, quota, quota * device_share / 100, free_pct);
    }
}

// Context budgets bound to partitions: under any sequence of charges and refunds from several
// contexts, no context exceeds its budget, no partition its limit, the device is never exceeded,
// every counter equals a reference model's, and a refused charge changes nothing.
proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn context_budgets_and_partitions_match_a_reference(
        ops in proptest::collection::vec((0usize..4, 1u64..400, any::<bool>()), 1..200)
    ) {
        use std::sync::Arc;
        use pygpukit_sched::contexts::{ContextRegistry, PartitionLink};
        use pygpukit_sched::partition::{PartitionConfig, PartitionLimits, PartitionManager};

        let mut cfg = PartitionConfig::new(1000);
        cfg.allow_overcommit = true;
        cfg.overcommit_ratio = 1.2;
        let m = Arc::new(PartitionManager::new(cfg).unwrap());
        m.create_partition("p", "", PartitionLimits::new().memory(600)).unwrap();
        m.create_partition("q", "", PartitionLimits::new().memory(600)).unwrap();
        let r = ContextRegistry::new(1000).unwrap();
        let parts = [Some("p"), Some("p"), Some("q"), None];
        let limits = [500u64, 300, 600, 200];
        let ctxs: Vec<_> = (0..4)
            .map(|i| {
                let link = parts[i].map(|p| PartitionLink { manager: m.clone(), partition: p.into() });
                r.admit(&format!("c{i}"), QosClass::Burstable, limits[i], 0, link).unwrap()
            })
            .collect();
        let mut held: Vec<Vec<u64>> = vec![Vec::new(); 4];
        for (i, bytes, free) in ops {
            if free {
                if let Some(b) = held[i].pop() {
                    ctxs[i].refund(b);
                }
                continue;
            }
            let used = |h: &[Vec<u64>], k: usize| h[k].iter().sum::<u64>();
            let part_used = |h: &[Vec<u64>], p: &str| {
                (0..4).filter(|&k| parts[k] == Some(p)).map(|k| used(h, k)).sum::<u64>()
            };
            let device_used = part_used(&held, "p") + part_used(&held, "q");
            let fits = used(&held, i) + bytes <= limits[i]
                && parts[i].is_none_or(|p| part_used(&held, p) + bytes <= 600 && device_used + bytes <= 1000);
            prop_assert_eq!(ctxs[i].charge(bytes).is_ok(), fits);
            if fits {
                held[i].push(bytes);
            }
            for (k, ctx) in ctxs.iter().enumerate() {
                prop_assert_eq!(ctx.used(), used(&held, k));
            }
            prop_assert_eq!(m.partition("p").unwrap().memory_used, part_used(&held, "p"));
            prop_assert_eq!(m.partition("q").unwrap().memory_used, part_used(&held, "q"));
            prop_assert!(m.stats().memory_used <= 1000);
        }
    }
}
