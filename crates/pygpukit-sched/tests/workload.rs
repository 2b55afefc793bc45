//! 10,000 tasks over the three QoS classes with random cancels and failures: every task finishes,
//! no class starves, and the per-class waits are reported.

use pygpukit_sched::scheduler::TaskPolicy;
use pygpukit_sched::workload::{run_mixed_workload, WorkloadConfig};

#[test]
fn ten_thousand_mixed_tasks_finish_without_starvation() {
    for policy in [
        TaskPolicy::Fifo,
        TaskPolicy::Priority,
        TaskPolicy::ShortestJob,
    ] {
        let mut config = WorkloadConfig::ten_thousand();
        config.policy = policy;
        let report = run_mixed_workload(&config).unwrap();
        println!(
            "{policy:?}: {} steps, {} preemptions",
            report.steps, report.preempted
        );
        for (name, c) in ["guaranteed", "burstable", "best_effort"]
            .iter()
            .zip(&report.classes)
        {
            println!(
                "  {name:<12} submitted {:>5} started {:>5} completed {:>5} failed {:>4} cancelled {:>4}  wait p50 {:>4} p99 {:>5} max {:>5} steps",
                c.submitted, c.started, c.completed, c.failed, c.cancelled, c.p50_wait, c.p99_wait, c.max_wait
            );
        }
        assert_eq!(report.unfinished, 0, "{policy:?}: tasks were lost");
        let total: usize = report.classes.iter().map(|c| c.submitted).sum();
        assert_eq!(total, config.tasks);
        for c in &report.classes {
            assert_eq!(c.completed + c.failed + c.cancelled, c.submitted);
            assert!(
                c.failed > 0 && c.cancelled > 0,
                "failures and cancels were injected: {c:?}"
            );
            // No starvation: every class keeps starting work, and even its longest wait is a small
            // fraction of the whole run.
            assert!(c.started * 10 >= c.submitted * 9, "{c:?}");
            assert!(
                c.max_wait * 4 <= report.steps,
                "{policy:?}: max wait {} of {} steps",
                c.max_wait,
                report.steps
            );
        }
        // Guaranteed work is admitted first.
        assert!(report.classes[0].p50_wait <= report.classes[2].p50_wait);
    }
}
