//! Property tests of the scheduler's invariants under random operation sequences:
//! - admission never reserves beyond capacity, and Burstable never reaches into the Guaranteed share;
//! - a Guaranteed request within what is left of its reservation is always admitted;
//! - no task is lost or run twice: each is handed out at most once, and once the workload drains
//!   every task is finished;
//! - pacing never grants a stream more than its share over any window (plus one bucket of burst).

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
