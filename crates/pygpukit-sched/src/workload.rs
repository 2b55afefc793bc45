//! A reproducible mixed workload through the real [`Scheduler`]: tasks of the three QoS classes
//! arrive over time, run on a fixed number of execution slots for random durations, and some are
//! cancelled or fail at random. It reports the queue wait of each class (p50/p99/max, in steps of
//! the simulation), which is how starvation would show, and how every task ended.
//!
//! Time is simulated in steps so the result does not depend on the machine; the scheduler itself,
//! admission and preemption included, is the production code.

use std::collections::HashMap;

use crate::error::Result;
use crate::qos::QosClass;
use crate::scheduler::{Scheduler, SchedulerConfig, TaskMeta, TaskPolicy, TaskState};

/// Parameters of [`run_mixed_workload`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WorkloadConfig {
    /// Tasks in total.
    pub tasks: usize,
    /// Tasks running at once at most (execution slots).
    pub slots: usize,
    /// Mean new tasks per step (the fraction is drawn at random each step).
    pub arrivals_per_step: f64,
    /// Device memory the scheduler manages, bytes.
    pub total_memory: u64,
    /// Largest memory estimate of a task, bytes.
    pub max_task_memory: u64,
    /// Longest run of a task, steps.
    pub max_duration: u32,
    /// Chance that a task is picked, at submission, to be cancelled at a random later step (it is
    /// cancelled then unless it has finished).
    pub cancel_probability: f64,
    /// Probability that a task fails instead of completing.
    pub failure_probability: f64,
    /// Order within a class.
    pub policy: TaskPolicy,
    /// Seed of the generator.
    pub seed: u64,
}

impl WorkloadConfig {
    /// 10,000 tasks on 16 slots arriving at 1.5 per step (about 98% of what the slots can run),
    /// 8 GiB, tasks up to 512 MiB and 20 steps, 2% cancels and 2% failures, priority policy.
    pub fn ten_thousand() -> Self {
        WorkloadConfig {
            tasks: 10_000,
            slots: 16,
            arrivals_per_step: 1.5,
            total_memory: 8 << 30,
            max_task_memory: 512 << 20,
            max_duration: 20,
            cancel_probability: 0.02,
            failure_probability: 0.02,
            policy: TaskPolicy::Priority,
            seed: 42,
        }
    }
}

/// Outcome of one class in [`WorkloadReport`].
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct ClassReport {
    /// Tasks of the class submitted.
    pub submitted: usize,
    /// Tasks that started.
    pub started: usize,
    /// Completed.
    pub completed: usize,
    /// Failed.
    pub failed: usize,
    /// Cancelled (randomly, by preemption while running, or because a dependency failed).
    pub cancelled: usize,
    /// Median wait from submission to start, steps.
    pub p50_wait: u64,
    /// 99th percentile wait, steps.
    pub p99_wait: u64,
    /// Longest wait, steps.
    pub max_wait: u64,
}

/// What [`run_mixed_workload`] observed.
#[derive(Clone, Debug, PartialEq)]
pub struct WorkloadReport {
    /// Per class: Guaranteed, Burstable, BestEffort.
    pub classes: [ClassReport; 3],
    /// Steps until every task finished.
    pub steps: u64,
    /// Best-effort preemptions.
    pub preempted: u64,
    /// Tasks that were not finished at the end (0 unless something was lost).
    pub unfinished: usize,
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn chance(&mut self, p: f64) -> bool {
        ((self.next() >> 11) as f64 / ((1u64 << 53) as f64)) < p
    }
}

fn percentile(sorted: &[u64], q: f64) -> u64 {
    if sorted.is_empty() {
        0
    } else {
        sorted[((sorted.len() as f64 - 1.0) * q).round() as usize]
    }
}

/// Runs the workload and reports per-class waits and outcomes.
pub fn run_mixed_workload(config: &WorkloadConfig) -> Result<WorkloadReport> {
    let mut sched_config = SchedulerConfig::new(config.total_memory);
    sched_config.policy = config.policy;
    sched_config.admission.max_pending_tasks = config.tasks.max(1);
    let s = Scheduler::new(sched_config)?;
    let mut rng = Rng(config.seed.max(1));
    let mut classes = [ClassReport::default(); 3];
    let mut waits: [Vec<u64>; 3] = Default::default();
    let mut submitted_at: HashMap<String, (u64, QosClass)> = HashMap::new();
    let mut cancels: Vec<(u64, String)> = Vec::new();
    let mut running: Vec<(String, u32)> = Vec::new();
    let mut next = 0usize;
    let mut step = 0u64;
    let limit = (config.tasks as u64 + 1) * u64::from(config.max_duration.max(1)) * 4 + 1000;
    while step < limit {
        // Arrivals: one class in three each; sizes spread up to the maximum.
        let whole = config.arrivals_per_step.max(0.0).floor();
        let arrivals = whole as usize + usize::from(rng.chance(config.arrivals_per_step - whole));
        for _ in 0..arrivals {
            if next == config.tasks {
                break;
            }
            let class = QosClass::ALL[rng.below(3) as usize];
            let id = format!("w{next}");
            let memory = 1 + rng.below(config.max_task_memory);
            let meta = TaskMeta::new(id.clone(), "")
                .qos(class)
                .memory(memory)
                .priority(rng.below(5) as i32 - 2)
                .cost(1 + rng.below(u64::from(config.max_duration)));
            s.submit(meta)?;
            classes[class.index()].submitted += 1;
            if rng.chance(config.cancel_probability) {
                let at = step + 1 + rng.below(3 * u64::from(config.max_duration.max(1)));
                cancels.push((at, id.clone()));
            }
            submitted_at.insert(id, (step, class));
            next += 1;
        }
        // Cancels due now, of tasks not finished yet (waiting or running).
        let (due, later): (Vec<_>, Vec<_>) = cancels.drain(..).partition(|(at, _)| *at <= step);
        cancels = later;
        for (_, id) in due {
            if !s.state(&id)?.is_terminal() {
                s.cancel(&id)?;
            }
        }
        s.admit(config.slots.saturating_sub(running.len()).max(1) * 2);
        while running.len() < config.slots {
            let Some(id) = s.next_runnable() else { break };
            let (at, class) = submitted_at[&id];
            waits[class.index()].push(step - at);
            classes[class.index()].started += 1;
            running.push((id, 1 + rng.below(u64::from(config.max_duration)) as u32));
        }
        // Advance running tasks; finish those whose time is up.
        let mut still = Vec::with_capacity(running.len());
        for (id, left) in running.drain(..) {
            if s.state(&id)? != TaskState::Running {
                continue; // cancelled or preempted while running
            }
            if left > 1 {
                still.push((id, left - 1));
            } else if rng.chance(config.failure_probability) {
                s.fail(&id, "injected failure")?;
            } else {
                s.complete(&id)?;
            }
        }
        running = still;
        step += 1;
        if next == config.tasks
            && running.is_empty()
            && s.stats().by_state[..3].iter().sum::<i64>() == 0
        {
            break;
        }
    }
    for (id, (_, class)) in &submitted_at {
        match s.state(id)? {
            TaskState::Completed => classes[class.index()].completed += 1,
            TaskState::Failed => classes[class.index()].failed += 1,
            TaskState::Cancelled => classes[class.index()].cancelled += 1,
            _ => {}
        }
    }
    for (c, w) in classes.iter_mut().zip(waits.iter_mut()) {
        w.sort_unstable();
        c.p50_wait = percentile(w, 0.5);
        c.p99_wait = percentile(w, 0.99);
        c.max_wait = w.last().copied().unwrap_or(0);
    }
    let stats = s.stats();
    Ok(WorkloadReport {
        classes,
        steps: step,
        preempted: stats.preempted,
        unfinished: stats.by_state[..3].iter().sum::<i64>() as usize,
    })
}
