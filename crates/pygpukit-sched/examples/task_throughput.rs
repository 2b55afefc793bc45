//! Measures the scheduler's hot path, submit -> admit -> start -> complete, in ns per task.
//!
//!     cargo run --release -p pygpukit-sched --example task_throughput
//!
//! Three shapes: one task at a time (the latency of the whole path), batches of 256 (submit all,
//! admit all, run all), and 4 threads each running tasks one at a time on a shared scheduler.
//! Finished records are pruned every 8192 tasks, and that cost is included.

use std::sync::Arc;
use std::time::Instant;

use pygpukit_sched::scheduler::{Scheduler, SchedulerConfig, TaskMeta};
use pygpukit_sched::QosClass;

const TASKS: usize = 200_000;

fn scheduler() -> Scheduler {
    let mut cfg = SchedulerConfig::new(64 << 30);
    cfg.admission.max_pending_tasks = 1 << 20;
    Scheduler::new(cfg).expect("valid config")
}

fn meta(prefix: &str, i: usize) -> TaskMeta {
    TaskMeta::new(format!("{prefix}{i}"), "bench")
        .memory(1 << 20)
        .qos(QosClass::ALL[i % 3])
}

fn one_at_a_time(s: &Scheduler, prefix: &str, n: usize) {
    for i in 0..n {
        s.submit(meta(prefix, i)).expect("submit");
        s.admit(1);
        let id = s.next_runnable().expect("admitted");
        s.complete(&id).expect("complete");
        if i % 8192 == 8191 {
            s.prune_finished();
        }
    }
}

fn main() {
    let s = scheduler();
    one_at_a_time(&s, "warm", 20_000);
    s.prune_finished();

    let t = Instant::now();
    one_at_a_time(&s, "single", TASKS);
    let single = t.elapsed().as_nanos() as f64 / TASKS as f64;
    s.prune_finished();

    let t = Instant::now();
    for b in 0..TASKS / 256 {
        for i in 0..256 {
            s.submit(meta(&format!("b{b}-"), i)).expect("submit");
        }
        s.admit(usize::MAX);
        while let Some(id) = s.next_runnable() {
            s.complete(&id).expect("complete");
        }
        if b % 32 == 31 {
            s.prune_finished();
        }
    }
    let batched = t.elapsed().as_nanos() as f64 / (TASKS / 256 * 256) as f64;
    s.prune_finished();

    let shared = Arc::new(scheduler());
    let threads = 4;
    let t = Instant::now();
    let handles: Vec<_> = (0..threads)
        .map(|k| {
            let s = Arc::clone(&shared);
            std::thread::spawn(move || {
                for i in 0..TASKS / threads {
                    s.submit(meta(&format!("m{k}-"), i)).expect("submit");
                    s.admit(1);
                    if let Some(id) = s.next_runnable() {
                        s.complete(&id).expect("complete");
                    }
                }
            })
        })
        .collect();
    for h in handles {
        h.join().expect("thread");
    }
    // Tasks another thread admitted but did not pick up are run here, inside the timing.
    loop {
        shared.admit(usize::MAX);
        let Some(id) = shared.next_runnable() else {
            break;
        };
        shared.complete(&id).expect("complete");
    }
    let parallel = t.elapsed().as_nanos() as f64 / TASKS as f64;

    println!("submit -> admit -> start -> complete, {TASKS} tasks, release build:");
    println!("  one at a time          {single:8.0} ns/task");
    println!("  batches of 256         {batched:8.0} ns/task");
    println!("  {threads} threads, one at a time {parallel:8.0} ns/task (wall time / tasks)");
}
