//! The scheduler's state machine, policies, dependencies, QoS and every bad-input path.

use pygpukit_sched::scheduler::{Scheduler, SchedulerConfig, TaskMeta, TaskPolicy, TaskState};
use pygpukit_sched::{QosClass, RejectReason, SchedError};

const MB: u64 = 1 << 20;

fn scheduler(total: u64, policy: TaskPolicy) -> Scheduler {
    let mut cfg = SchedulerConfig::new(total);
    cfg.policy = policy;
    Scheduler::new(cfg).unwrap()
}

fn run_all(s: &Scheduler) -> Vec<String> {
    let mut order = Vec::new();
    loop {
        s.admit(usize::MAX);
        let Some(id) = s.next_runnable() else { break };
        s.complete(&id).unwrap();
        order.push(id);
    }
    order
}

#[test]
fn lifecycle_reserves_and_releases() {
    let s = scheduler(100 * MB, TaskPolicy::Fifo);
    s.submit(TaskMeta::new("a", "A").memory(10 * MB)).unwrap();
    assert_eq!(s.state("a").unwrap(), TaskState::Pending);
    assert_eq!(s.admit(10).admitted, vec!["a"]);
    assert_eq!(s.state("a").unwrap(), TaskState::Admitted);
    assert_eq!(s.task("a").unwrap().reserved_memory, 10 * MB);
    assert_eq!(s.next_runnable().as_deref(), Some("a"));
    assert_eq!(s.state("a").unwrap(), TaskState::Running);
    s.complete("a").unwrap();
    assert_eq!(s.state("a").unwrap(), TaskState::Completed);
    let st = s.stats();
    assert_eq!(st.admission.memory_used, 0);
    assert_eq!(st.by_state[TaskState::Completed as usize], 1);
    assert_eq!(st.admission.pending, 0);
}

#[test]
fn fifo_priority_and_shortest_job_orders() {
    let fifo = scheduler(100 * MB, TaskPolicy::Fifo);
    let prio = scheduler(100 * MB, TaskPolicy::Priority);
    let sjf = scheduler(100 * MB, TaskPolicy::ShortestJob);
    for (i, (p, cost)) in [(0, 1000u64), (5, 10), (1, 100)].into_iter().enumerate() {
        for s in [&fifo, &prio, &sjf] {
            s.submit(TaskMeta::new(format!("t{i}"), "").priority(p).cost(cost))
                .unwrap();
        }
    }
    assert_eq!(run_all(&fifo), ["t0", "t1", "t2"]);
    assert_eq!(run_all(&prio), ["t1", "t2", "t0"]);
    assert_eq!(run_all(&sjf), ["t1", "t2", "t0"]);
}

#[test]
fn priority_aging_bounds_how_far_a_task_can_be_passed() {
    // aging_step 16: a priority-0 task is passed by at most 16 * 10 later priority-10 tasks.
    let s = scheduler(100 * MB, TaskPolicy::Priority);
    s.submit(TaskMeta::new("low", "")).unwrap();
    for i in 0..400 {
        s.submit(TaskMeta::new(format!("hi{i}"), "").priority(10))
            .unwrap();
    }
    let order = run_all(&s);
    let pos = order.iter().position(|x| x == "low").unwrap();
    assert!(pos <= 160, "low ran at position {pos}");
    assert!(pos >= 100, "priority still mattered: position {pos}");
}

#[test]
fn dependencies_gate_readiness_and_failures_cascade() {
    let s = scheduler(100 * MB, TaskPolicy::Fifo);
    s.submit(TaskMeta::new("load", "")).unwrap();
    s.submit(TaskMeta::new("run", "").depends_on(["load"]))
        .unwrap();
    s.submit(TaskMeta::new("post", "").depends_on(["run", "load"]))
        .unwrap();
    s.submit(TaskMeta::new("other", "")).unwrap();
    assert_eq!(s.admit(10).admitted, ["load", "other"]);
    assert_eq!(s.next_runnable().as_deref(), Some("load"));
    s.complete("load").unwrap();
    assert_eq!(s.admit(10).admitted, ["run"]);
    assert_eq!(s.next_runnable().as_deref(), Some("other"));
    assert_eq!(s.next_runnable().as_deref(), Some("run"));
    s.fail("run", "kernel crashed").unwrap();
    assert_eq!(s.state("post").unwrap(), TaskState::Cancelled);
    assert!(s.task("post").unwrap().error.unwrap().contains("run"));
    // A dependency that already failed makes a new dependent unsatisfiable.
    let err = s
        .submit(TaskMeta::new("late", "").depends_on(["run"]))
        .unwrap_err();
    assert!(matches!(
        err,
        SchedError::Rejected(RejectReason::UnsatisfiableDependencies { .. })
    ));
    assert!(
        s.state("late").is_err(),
        "a refused submission leaves no record"
    );
    // Depending on a completed task is immediately satisfied.
    s.submit(TaskMeta::new("after", "").depends_on(["load"]))
        .unwrap();
    assert_eq!(s.admit(10).admitted, ["after"]);
}

#[test]
fn dependency_cycles_are_refused_with_the_cycle() {
    let s = scheduler(100 * MB, TaskPolicy::Fifo);
    let err = s
        .submit(TaskMeta::new("self", "").depends_on(["self"]))
        .unwrap_err();
    assert_eq!(
        err,
        SchedError::DependencyCycle {
            cycle: vec!["self".into(), "self".into()]
        }
    );
    s.submit(TaskMeta::new("gate", "")).unwrap();
    s.submit(TaskMeta::new("a", "").depends_on(["gate"]))
        .unwrap();
    s.submit(TaskMeta::new("b", "").depends_on(["a"])).unwrap();
    s.submit(TaskMeta::new("c", "").depends_on(["b"])).unwrap();
    let err = s.add_dependency("a", "c").unwrap_err();
    assert_eq!(
        err,
        SchedError::DependencyCycle {
            cycle: vec!["a".into(), "c".into(), "b".into(), "a".into()]
        }
    );
    assert!(err.to_string().contains("a -> c -> b -> a"));
    // State is unchanged: the chain still runs in order once the gate completes.
    assert_eq!(run_all(&s), ["gate", "a", "b", "c"]);
}

#[test]
fn add_dependency_takes_a_ready_task_out_of_the_queue() {
    let s = scheduler(100 * MB, TaskPolicy::Fifo);
    s.submit(TaskMeta::new("x", "")).unwrap();
    s.submit(TaskMeta::new("y", "")).unwrap();
    s.add_dependency("x", "y").unwrap();
    assert_eq!(s.admit(10).admitted, ["y"]);
    assert_eq!(s.next_runnable().as_deref(), Some("y"));
    s.complete("y").unwrap();
    assert_eq!(s.admit(10).admitted, ["x"]);
    assert!(matches!(
        s.add_dependency("x", "y"),
        Err(SchedError::InvalidTransition { .. })
    ));
}

#[test]
fn bad_input_is_typed_and_leaves_state_consistent() {
    let s = scheduler(100 * MB, TaskPolicy::Fifo);
    s.submit(TaskMeta::new("a", "").memory(MB)).unwrap();
    let before = s.stats();
    type Check = fn(&SchedError) -> bool;
    let cases: Vec<(TaskMeta, Check)> = vec![
        (TaskMeta::new("a", ""), |e| {
            matches!(e, SchedError::DuplicateId { .. })
        }),
        (TaskMeta::new("", ""), |e| {
            matches!(e, SchedError::InvalidArgument { name: "id", .. })
        }),
        (TaskMeta::new("p", "").priority(5000), |e| {
            matches!(
                e,
                SchedError::InvalidArgument {
                    name: "priority",
                    ..
                }
            )
        }),
        (TaskMeta::new("bw", "").bandwidth(-1.0), |e| {
            matches!(
                e,
                SchedError::InvalidArgument {
                    name: "bandwidth",
                    ..
                }
            )
        }),
        (TaskMeta::new("nan", "").bandwidth(f64::NAN), |e| {
            matches!(
                e,
                SchedError::InvalidArgument {
                    name: "bandwidth",
                    ..
                }
            )
        }),
        (
            TaskMeta::new("huge", "")
                .memory(101 * MB)
                .qos(QosClass::Guaranteed),
            |e| {
                matches!(
                    e,
                    SchedError::Rejected(RejectReason::ExceedsCapacity { .. })
                )
            },
        ),
        // Burstable can never use the Guaranteed half.
        (TaskMeta::new("big", "").memory(60 * MB), |e| {
            matches!(
                e,
                SchedError::Rejected(RejectReason::ExceedsCapacity { .. })
            )
        }),
        (TaskMeta::new("orphan", "").depends_on(["nope"]), |e| {
            matches!(e, SchedError::UnknownId { kind: "task", .. })
        }),
    ];
    for (meta, check) in cases {
        let id = meta.id.clone();
        let err = s.submit(meta).unwrap_err();
        assert!(check(&err), "{id}: {err}");
    }
    let after = s.stats();
    assert_eq!(after.by_state, before.by_state);
    assert_eq!(after.admission.pending, 1);
    assert!(s.task("a").unwrap().state == TaskState::Pending);
    assert!(run_all(&s) == ["a"]);
    // Unknown ids and impossible transitions.
    assert!(matches!(
        s.complete("zzz"),
        Err(SchedError::UnknownId { .. })
    ));
    assert!(matches!(s.cancel("zzz"), Err(SchedError::UnknownId { .. })));
    assert!(matches!(
        s.complete("a"),
        Err(SchedError::InvalidTransition { .. })
    ));
    assert!(matches!(
        s.cancel("a"),
        Err(SchedError::InvalidTransition { .. })
    ));
    assert!(matches!(
        s.fail("a", "x"),
        Err(SchedError::InvalidTransition { .. })
    ));
    assert!(matches!(
        s.start("a"),
        Err(SchedError::InvalidTransition { .. })
    ));
    assert_eq!(s.state("a").unwrap(), TaskState::Completed);
    // Bad configurations.
    assert!(Scheduler::new(SchedulerConfig::new(0)).is_err());
    let mut cfg = SchedulerConfig::new(MB);
    cfg.class_weights = [1, 0, 1];
    assert!(Scheduler::new(cfg).is_err());
    let mut cfg = SchedulerConfig::new(MB);
    cfg.admission.qos.guaranteed_share = 1.5;
    assert!(Scheduler::new(cfg).is_err());
}

#[test]
fn double_cancel_and_double_complete_are_refused() {
    let s = scheduler(100 * MB, TaskPolicy::Fifo);
    s.submit(TaskMeta::new("c", "").memory(MB)).unwrap();
    s.cancel("c").unwrap();
    assert!(matches!(
        s.cancel("c"),
        Err(SchedError::InvalidTransition { .. })
    ));
    s.submit(TaskMeta::new("d", "").memory(MB)).unwrap();
    s.admit(1);
    s.start("d").unwrap();
    s.complete("d").unwrap();
    let err = s.complete("d").unwrap_err();
    assert_eq!(err.to_string(), "task \"d\" is completed; cannot complete");
    let st = s.stats();
    assert_eq!(st.admission.memory_used, 0);
    assert_eq!(st.admission.pending, 0);
    assert_eq!(st.by_state[TaskState::Cancelled as usize], 1);
    assert_eq!(st.by_state[TaskState::Completed as usize], 1);
}

#[test]
fn queue_limit_rejects_with_queue_full() {
    let mut cfg = SchedulerConfig::new(100 * MB);
    cfg.admission.max_pending_tasks = 3;
    let s = Scheduler::new(cfg).unwrap();
    for i in 0..3 {
        s.submit(TaskMeta::new(format!("t{i}"), "")).unwrap();
    }
    assert_eq!(
        s.submit(TaskMeta::new("t3", "")).unwrap_err(),
        SchedError::Rejected(RejectReason::QueueFull { limit: 3 })
    );
    s.admit(1);
    s.submit(TaskMeta::new("t3", "")).unwrap();
    assert_eq!(s.stats().rejected, 1);
}

#[test]
fn guaranteed_preempts_admitted_best_effort_which_runs_later() {
    let s = scheduler(100 * MB, TaskPolicy::Fifo);
    for i in 0..4 {
        s.submit(
            TaskMeta::new(format!("be{i}"), "")
                .memory(25 * MB)
                .qos(QosClass::BestEffort),
        )
        .unwrap();
    }
    assert_eq!(s.admit(10).admitted.len(), 4);
    assert_eq!(s.next_runnable().as_deref(), Some("be0"));
    s.submit(
        TaskMeta::new("g", "")
            .memory(50 * MB)
            .qos(QosClass::Guaranteed),
    )
    .unwrap();
    let report = s.admit(10);
    assert_eq!(report.admitted, ["g"]);
    assert_eq!(report.preempted, ["be3", "be2"]);
    assert_eq!(s.state("be3").unwrap(), TaskState::Pending);
    assert_eq!(s.task("be3").unwrap().preemptions, 1);
    assert_eq!(s.state("be0").unwrap(), TaskState::Running);
    // Everything still runs exactly once.
    let mut ran = vec!["be0".to_string()];
    s.complete("be0").unwrap();
    ran.extend(run_all(&s));
    ran.sort();
    assert_eq!(ran, ["be0", "be1", "be2", "be3", "g"]);
    assert_eq!(s.stats().admission.memory_used, 0);
}

#[test]
fn running_best_effort_is_cancelled_when_guaranteed_needs_its_room() {
    let s = scheduler(100 * MB, TaskPolicy::Fifo);
    s.submit(
        TaskMeta::new("be", "")
            .memory(90 * MB)
            .qos(QosClass::BestEffort),
    )
    .unwrap();
    s.admit(1);
    s.next_runnable().unwrap();
    s.submit(
        TaskMeta::new("g", "")
            .memory(50 * MB)
            .qos(QosClass::Guaranteed),
    )
    .unwrap();
    assert_eq!(s.admit(1).preempted, ["be"]);
    let info = s.task("be").unwrap();
    assert_eq!(info.state, TaskState::Cancelled);
    assert!(info.error.unwrap().contains("preempted"));
    assert!(matches!(
        s.complete("be"),
        Err(SchedError::InvalidTransition { .. })
    ));
    assert_eq!(s.stats().admission.memory_used, 50 * MB);
}

#[test]
fn a_large_head_holds_its_turn_against_small_tasks() {
    // Burstable capacity is 50 MB. A 40 MB task at the head of BestEffort must not be starved by a
    // stream of small Burstable tasks that would otherwise keep taking the freed room.
    let s = scheduler(100 * MB, TaskPolicy::Fifo);
    for i in 0..5 {
        s.submit(TaskMeta::new(format!("small{i}"), "").memory(20 * MB))
            .unwrap();
    }
    s.admit(usize::MAX);
    s.submit(
        TaskMeta::new("big", "")
            .memory(70 * MB)
            .qos(QosClass::BestEffort),
    )
    .unwrap();
    let mut started_big = false;
    for i in 5..100 {
        s.submit(TaskMeta::new(format!("small{i}"), "").memory(20 * MB))
            .unwrap();
        s.admit(usize::MAX);
        while let Some(id) = s.next_runnable() {
            if id == "big" {
                started_big = true;
            }
            s.complete(&id).unwrap();
        }
        if started_big {
            break;
        }
    }
    assert!(started_big, "the big best-effort task was starved");
}

#[test]
fn prune_forgets_finished_tasks_only() {
    let s = scheduler(100 * MB, TaskPolicy::Fifo);
    s.submit(TaskMeta::new("done", "")).unwrap();
    s.submit(TaskMeta::new("waiting", "").depends_on(["done"]))
        .unwrap();
    s.admit(1);
    let id = s.next_runnable().unwrap();
    s.complete(&id).unwrap();
    assert_eq!(s.prune_finished(), 1);
    assert!(s.state("done").is_err());
    assert_eq!(s.state("waiting").unwrap(), TaskState::Pending);
    assert_eq!(s.len(), 1);
}
