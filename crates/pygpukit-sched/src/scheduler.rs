//! The task state machine: submit, admit, run, finish, with dependencies, ordering policies and
//! QoS classes.
//!
//! ```text
//! Pending --admit--> Admitted --start--> Running --complete--> Completed
//!    |                  |   \                |----fail------> Failed
//!    |                  |    preempted (best effort) -> Pending
//!    +------------------+-------cancel-------+-------------> Cancelled
//! ```
//!
//! A task is Pending until its dependencies have completed and admission control has reserved its
//! memory and bandwidth. Ready tasks wait in one queue per QoS class; [`Scheduler::admit`] takes
//! from the classes by weighted stride scheduling (Guaranteed 8 : Burstable 4 : BestEffort 1 by
//! default) and, within a class, by the [`TaskPolicy`] key. Every key is the submission sequence
//! number shifted by a bounded amount, so a task can be passed by only a bounded number of later
//! tasks: no policy starves anyone. A class whose head does not fit holds its turn (the other
//! non-Guaranteed class is not admitted past it in that round), so large tasks are not starved by
//! small ones either.
//!
//! Concurrency: task records live in a sharded map and ready queues are sharded; reservations are
//! atomic counters; each class's ready queue has its own lock. Only [`Scheduler::admit`] rounds are
//! serialized with each other (they share the stride state); submit, start, complete, fail and
//! cancel never wait for a round.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashSet};
use std::fmt;
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use crossbeam_queue::SegQueue;
use parking_lot::Mutex;

use crate::admission::{
    AdmissionConfig, AdmissionController, AdmissionDecision, AdmissionStats, RejectReason,
    ResourceRequest,
};
use crate::clock::now_ns;
use crate::error::{Result, SchedError};
use crate::qos::QosClass;
use crate::shard::ShardedMap;

/// Where a task is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TaskState {
    /// Submitted; waiting for dependencies and admission.
    Pending = 0,
    /// Resources reserved; waiting to be started.
    Admitted = 1,
    /// Started.
    Running = 2,
    /// Finished successfully.
    Completed = 3,
    /// Finished with an error.
    Failed = 4,
    /// Cancelled (by the caller, preemption, or a failed dependency).
    Cancelled = 5,
}

impl TaskState {
    /// All states in order.
    pub const ALL: [TaskState; 6] = [
        TaskState::Pending,
        TaskState::Admitted,
        TaskState::Running,
        TaskState::Completed,
        TaskState::Failed,
        TaskState::Cancelled,
    ];

    /// True for Completed, Failed and Cancelled.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            TaskState::Completed | TaskState::Failed | TaskState::Cancelled
        )
    }

    /// Lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            TaskState::Pending => "pending",
            TaskState::Admitted => "admitted",
            TaskState::Running => "running",
            TaskState::Completed => "completed",
            TaskState::Failed => "failed",
            TaskState::Cancelled => "cancelled",
        }
    }
}

impl fmt::Display for TaskState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Order of tasks within a QoS class.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TaskPolicy {
    /// Submission order.
    Fifo,
    /// Higher `priority` first; each priority level lets a task pass `aging_step` later-submitted
    /// tasks, no more.
    Priority,
    /// Cheaper tasks first (`estimated_cost`, or the memory estimate when it is 0); each doubling
    /// of cost lets `aging_step` later-submitted tasks pass, no more.
    ShortestJob,
}

/// Most negative priority accepted.
pub const MIN_PRIORITY: i32 = -1000;
/// Highest priority accepted.
pub const MAX_PRIORITY: i32 = 1000;

/// What a task is and what it needs.
#[derive(Clone, Debug, PartialEq)]
pub struct TaskMeta {
    /// Unique id.
    pub id: String,
    /// Human-readable name.
    pub name: String,
    /// Device memory the task needs, bytes.
    pub memory_estimate: u64,
    /// Memory it may burst to (Burstable); 0 means "same as the estimate".
    pub memory_limit: u64,
    /// Bandwidth it needs, in the scheduler's bandwidth unit (1.0 = whole device by default).
    pub bandwidth: f64,
    /// Priority in [`MIN_PRIORITY`, `MAX_PRIORITY`]; higher runs first under [`TaskPolicy::Priority`].
    pub priority: i32,
    /// QoS class.
    pub qos: QosClass,
    /// Estimated run time (any unit, e.g. microseconds) for [`TaskPolicy::ShortestJob`]; 0 uses the
    /// memory estimate.
    pub estimated_cost: u64,
    /// Ids of tasks that must complete first.
    pub dependencies: Vec<String>,
}

impl TaskMeta {
    /// A Burstable task without resource needs, priority 0, no dependencies.
    pub fn new(id: impl Into<String>, name: impl Into<String>) -> Self {
        TaskMeta {
            id: id.into(),
            name: name.into(),
            memory_estimate: 0,
            memory_limit: 0,
            bandwidth: 0.0,
            priority: 0,
            qos: QosClass::Burstable,
            estimated_cost: 0,
            dependencies: Vec::new(),
        }
    }

    /// With a memory estimate.
    pub fn memory(mut self, bytes: u64) -> Self {
        self.memory_estimate = bytes;
        self
    }

    /// With a priority.
    pub fn priority(mut self, priority: i32) -> Self {
        self.priority = priority;
        self
    }

    /// With a QoS class.
    pub fn qos(mut self, qos: QosClass) -> Self {
        self.qos = qos;
        self
    }

    /// With a bandwidth need.
    pub fn bandwidth(mut self, bandwidth: f64) -> Self {
        self.bandwidth = bandwidth;
        self
    }

    /// With an estimated cost.
    pub fn cost(mut self, cost: u64) -> Self {
        self.estimated_cost = cost;
        self
    }

    /// With dependencies.
    pub fn depends_on<S: Into<String>>(mut self, deps: impl IntoIterator<Item = S>) -> Self {
        self.dependencies = deps.into_iter().map(Into::into).collect();
        self
    }

    fn request(&self) -> ResourceRequest {
        ResourceRequest {
            class: self.qos,
            memory: self.memory_estimate,
            memory_limit: if self.memory_limit == 0 {
                self.memory_estimate
            } else {
                self.memory_limit
            },
            bandwidth: self.bandwidth,
            bandwidth_limit: self.bandwidth,
        }
    }
}

/// Configuration of a [`Scheduler`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SchedulerConfig {
    /// Capacity, queue limit and QoS split.
    pub admission: AdmissionConfig,
    /// Order within a class.
    pub policy: TaskPolicy,
    /// How many later submissions one priority level (or one doubling of cost) may pass.
    pub aging_step: u64,
    /// Admission weights of Guaranteed, Burstable, BestEffort (each at least 1).
    pub class_weights: [u32; 3],
}

impl SchedulerConfig {
    /// `total_memory` bytes, bandwidth 1.0, FIFO, default QoS and weights 8:4:1.
    pub fn new(total_memory: u64) -> Self {
        SchedulerConfig {
            admission: AdmissionConfig::new(total_memory),
            policy: TaskPolicy::Fifo,
            aging_step: 16,
            class_weights: [8, 4, 1],
        }
    }

    fn validate(&self) -> Result<()> {
        self.admission.validate()?;
        if self.aging_step > 1 << 20 {
            return Err(SchedError::invalid(
                "aging_step",
                self.aging_step,
                "must be at most 1048576",
            ));
        }
        if let Some(w) = self.class_weights.iter().find(|w| **w == 0 || **w > 1000) {
            return Err(SchedError::invalid(
                "class_weights",
                w,
                "each weight must be in [1, 1000]",
            ));
        }
        Ok(())
    }
}

/// A snapshot of one task.
#[derive(Clone, Debug, PartialEq)]
pub struct TaskInfo {
    /// Id.
    pub id: String,
    /// Name.
    pub name: String,
    /// State.
    pub state: TaskState,
    /// QoS class.
    pub qos: QosClass,
    /// Priority.
    pub priority: i32,
    /// Memory reserved while admitted or running (0 otherwise).
    pub reserved_memory: u64,
    /// Nanoseconds (monotonic clock) of submission, admission, start and finish (0 if not yet).
    pub submitted_ns: u64,
    /// See `submitted_ns`.
    pub admitted_ns: u64,
    /// See `submitted_ns`.
    pub started_ns: u64,
    /// See `submitted_ns`.
    pub finished_ns: u64,
    /// Why the task failed or was cancelled.
    pub error: Option<String>,
    /// Times it was preempted back to Pending.
    pub preemptions: u32,
}

/// Counts from [`Scheduler::stats`].
#[derive(Clone, Debug, PartialEq)]
pub struct SchedulerStats {
    /// Tasks in each [`TaskState`] (indexed like [`TaskState::ALL`]), among records kept.
    pub by_state: [i64; 6],
    /// Tasks ever submitted.
    pub submitted: u64,
    /// Submissions refused.
    pub rejected: u64,
    /// Best-effort tasks preempted.
    pub preempted: u64,
    /// Admission counters and usage.
    pub admission: AdmissionStats,
}

/// Queue wait (submission to start) of one class, from [`Scheduler::wait_stats`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct WaitStats {
    /// Tasks that started.
    pub count: usize,
    /// Median wait, nanoseconds.
    pub p50_ns: u64,
    /// 99th percentile wait, nanoseconds.
    pub p99_ns: u64,
    /// Longest wait, nanoseconds.
    pub max_ns: u64,
}

/// What one [`Scheduler::admit`] round did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AdmitReport {
    /// Tasks admitted, in order.
    pub admitted: Vec<String>,
    /// Best-effort tasks preempted (sent back to Pending, or cancelled if they were running).
    pub preempted: Vec<String>,
    /// Tasks that can never be admitted and were failed.
    pub failed: Vec<String>,
}

struct TaskRecord {
    name: Arc<str>,
    qos: QosClass,
    priority: i32,
    request: ResourceRequest,
    key: i64,
    seq: u64,
    state: TaskState,
    unmet: u32,
    deps: Vec<Arc<str>>,
    dependents: Vec<Arc<str>>,
    epoch: u32,
    submitted_ns: u64,
    admitted_ns: u64,
    started_ns: u64,
    finished_ns: u64,
    error: Option<String>,
    preemptions: u32,
}

#[derive(Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Entry {
    key: i64,
    seq: u64,
    epoch: u32,
    id: Arc<str>,
}

/// The ready queue of one class: a heap behind its own lock (classes never share one).
struct ClassQueue {
    heap: Mutex<BinaryHeap<Reverse<Entry>>>,
    len: AtomicUsize,
}

impl ClassQueue {
    fn new() -> Self {
        ClassQueue {
            heap: Mutex::new(BinaryHeap::new()),
            len: AtomicUsize::new(0),
        }
    }

    fn push(&self, entry: Entry) {
        self.heap.lock().push(Reverse(entry));
        self.len.fetch_add(1, Ordering::AcqRel);
    }

    /// Removes and returns the entry with the smallest key.
    fn pop(&self) -> Option<Entry> {
        if self.len.load(Ordering::Acquire) == 0 {
            return None;
        }
        let Reverse(e) = self.heap.lock().pop()?;
        self.len.fetch_sub(1, Ordering::AcqRel);
        Some(e)
    }

    fn len(&self) -> usize {
        self.len.load(Ordering::Acquire)
    }
}

struct Stride {
    pass: [u64; 3],
    vtime: u64,
}

const STRIDE_UNIT: u64 = 1 << 20;

/// The scheduler; share it between threads by reference or `Arc`.
pub struct Scheduler {
    config: SchedulerConfig,
    admission: AdmissionController,
    tasks: ShardedMap<TaskRecord>,
    ready: [ClassQueue; 3],
    runnable: SegQueue<(Arc<str>, u32)>,
    stride: Mutex<Stride>,
    seq: AtomicU64,
    counts: [AtomicI64; 6],
    submitted: AtomicU64,
    rejected: AtomicU64,
    preempted: AtomicU64,
    /// Serializes [`Scheduler::add_dependency`] calls, so two of them cannot close a cycle together.
    graph: Mutex<()>,
}

impl Scheduler {
    /// A scheduler with `config` (validated).
    pub fn new(config: SchedulerConfig) -> Result<Self> {
        config.validate()?;
        Ok(Scheduler {
            admission: AdmissionController::new(config.admission)?,
            config,
            tasks: ShardedMap::default(),
            ready: [ClassQueue::new(), ClassQueue::new(), ClassQueue::new()],
            runnable: SegQueue::new(),
            stride: Mutex::new(Stride {
                pass: [0; 3],
                vtime: 0,
            }),
            seq: AtomicU64::new(0),
            counts: Default::default(),
            submitted: AtomicU64::new(0),
            rejected: AtomicU64::new(0),
            preempted: AtomicU64::new(0),
            graph: Mutex::new(()),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &SchedulerConfig {
        &self.config
    }

    /// The admission controller (for its statistics).
    pub fn admission(&self) -> &AdmissionController {
        &self.admission
    }

    fn count(&self, from: Option<TaskState>, to: TaskState) {
        if let Some(f) = from {
            self.counts[f as usize].fetch_sub(1, Ordering::Relaxed);
        }
        self.counts[to as usize].fetch_add(1, Ordering::Relaxed);
    }

    fn key_for(&self, meta: &TaskMeta, seq: u64) -> i64 {
        let step = self.config.aging_step as i64;
        let seq = seq as i64;
        match self.config.policy {
            TaskPolicy::Fifo => seq,
            TaskPolicy::Priority => seq - i64::from(meta.priority) * step,
            TaskPolicy::ShortestJob => {
                let cost = if meta.estimated_cost > 0 {
                    meta.estimated_cost
                } else {
                    meta.memory_estimate
                };
                seq + i64::from(64 - cost.leading_zeros()) * step
            }
        }
    }

    /// Submits a task. It becomes ready once its dependencies have completed.
    ///
    /// Errors: `DuplicateId`; `UnknownId` for a dependency that does not exist;
    /// `DependencyCycle` for a task depending on itself; `InvalidArgument` for a priority or
    /// bandwidth out of range; `Rejected` for a full queue, a request larger than its class can
    /// ever hold, or a dependency that already failed or was cancelled. Nothing changes on error.
    pub fn submit(&self, meta: TaskMeta) -> Result<()> {
        let result = self.submit_inner(meta);
        if matches!(result, Err(SchedError::Rejected(_))) {
            self.rejected.fetch_add(1, Ordering::Relaxed);
        }
        result
    }

    fn submit_inner(&self, meta: TaskMeta) -> Result<()> {
        if !(MIN_PRIORITY..=MAX_PRIORITY).contains(&meta.priority) {
            return Err(SchedError::invalid(
                "priority",
                meta.priority,
                format!("must be in [{MIN_PRIORITY}, {MAX_PRIORITY}]"),
            ));
        }
        if meta.id.is_empty() {
            return Err(SchedError::invalid("id", "\"\"", "must not be empty"));
        }
        if meta.dependencies.contains(&meta.id) {
            return Err(SchedError::DependencyCycle {
                cycle: vec![meta.id.clone(), meta.id.clone()],
            });
        }
        let request = meta.request();
        if let Some(reason) = self.admission.check_request(&request)? {
            return Err(SchedError::Rejected(reason));
        }
        let id: Arc<str> = Arc::from(meta.id.as_str());
        let mut seen = HashSet::new();
        let deps: Vec<Arc<str>> = meta
            .dependencies
            .iter()
            .filter(|d| seen.insert(d.as_str()))
            .map(|d| Arc::from(d.as_str()))
            .collect();
        self.admission.enqueue()?;
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        let record = TaskRecord {
            name: Arc::from(meta.name.as_str()),
            qos: meta.qos,
            priority: meta.priority,
            request,
            key: self.key_for(&meta, seq),
            seq,
            state: TaskState::Pending,
            // The extra count is released once registration with the dependencies is done.
            unmet: if deps.is_empty() {
                0
            } else {
                deps.len() as u32 + 1
            },
            deps: deps.clone(),
            dependents: Vec::new(),
            epoch: 0,
            submitted_ns: now_ns(),
            admitted_ns: 0,
            started_ns: 0,
            finished_ns: 0,
            error: None,
            preemptions: 0,
        };
        {
            let mut shard = self.tasks.shard(&id);
            if shard.contains_key(&id) {
                drop(shard);
                self.admission.dequeue();
                return Err(SchedError::duplicate("task", &id));
            }
            shard.insert(Arc::clone(&id), record);
        }
        self.count(None, TaskState::Pending);
        if deps.is_empty() {
            // Ready at once. Should the task change before this push, the entry is stale and
            // skipped when popped.
            self.submitted.fetch_add(1, Ordering::Relaxed);
            let key = self.key_for(&meta, seq);
            self.ready[meta.qos.index()].push(Entry {
                key,
                seq,
                epoch: 0,
                id,
            });
            return Ok(());
        }
        // Register with each dependency; satisfied ones count down right away.
        let mut satisfied = 1u32;
        let mut registered: Vec<&Arc<str>> = Vec::new();
        let mut failure: Option<SchedError> = None;
        for dep in &deps {
            let mut shard = self.tasks.shard(dep);
            match shard.get_mut(dep) {
                None => failure = Some(SchedError::unknown("task", dep)),
                Some(d) => match d.state {
                    TaskState::Completed => satisfied += 1,
                    TaskState::Failed | TaskState::Cancelled => {
                        failure = Some(SchedError::Rejected(
                            RejectReason::UnsatisfiableDependencies {
                                dependency: dep.to_string(),
                            },
                        ))
                    }
                    _ => {
                        d.dependents.push(Arc::clone(&id));
                        registered.push(dep);
                    }
                },
            }
            if failure.is_some() {
                break;
            }
        }
        if let Some(err) = failure {
            for dep in registered {
                if let Some(d) = self.tasks.shard(dep).get_mut(dep) {
                    d.dependents.retain(|x| *x != id);
                }
            }
            self.tasks.shard(&id).remove(&id);
            self.counts[TaskState::Pending as usize].fetch_sub(1, Ordering::Relaxed);
            self.admission.dequeue();
            return Err(err);
        }
        self.submitted.fetch_add(1, Ordering::Relaxed);
        self.satisfy(&id, satisfied);
        Ok(())
    }

    /// Counts `n` dependencies of `id` as met; queues it when none are left.
    fn satisfy(&self, id: &Arc<str>, n: u32) {
        let entry = {
            let mut shard = self.tasks.shard(id);
            let Some(r) = shard.get_mut(id) else { return };
            r.unmet = r.unmet.saturating_sub(n);
            if r.unmet > 0 || r.state != TaskState::Pending {
                return;
            }
            (
                r.qos,
                Entry {
                    key: r.key,
                    seq: r.seq,
                    epoch: r.epoch,
                    id: Arc::clone(id),
                },
            )
        };
        self.ready[entry.0.index()].push(entry.1);
    }

    /// Makes Pending task `task` also wait for `dependency`.
    ///
    /// Errors: `UnknownId`; `InvalidTransition` when `task` is no longer Pending;
    /// `DependencyCycle` (with the cycle) when `dependency` already depends on `task`, directly or
    /// not; `Rejected` when `dependency` failed or was cancelled.
    pub fn add_dependency(&self, task: &str, dependency: &str) -> Result<()> {
        let _graph = self.graph.lock();
        if task == dependency {
            return Err(SchedError::DependencyCycle {
                cycle: vec![task.to_string(), task.to_string()],
            });
        }
        let dep_state = self
            .tasks
            .shard(dependency)
            .get(dependency)
            .map(|d| d.state)
            .ok_or_else(|| SchedError::unknown("task", dependency))?;
        {
            let shard = self.tasks.shard(task);
            let r = shard
                .get(task)
                .ok_or_else(|| SchedError::unknown("task", task))?;
            if r.state != TaskState::Pending {
                return Err(SchedError::transition(
                    "task",
                    task,
                    r.state,
                    "add a dependency",
                ));
            }
            if r.deps.iter().any(|d| d.as_ref() == dependency) {
                return Ok(());
            }
        }
        if let Some(path) = self.path_between(dependency, task) {
            // The new edge task -> dependency closes dependency -> ... -> task.
            let mut cycle = vec![task.to_string()];
            cycle.extend(path);
            return Err(SchedError::DependencyCycle { cycle });
        }
        if matches!(dep_state, TaskState::Failed | TaskState::Cancelled) {
            return Err(SchedError::Rejected(
                RejectReason::UnsatisfiableDependencies {
                    dependency: dependency.to_string(),
                },
            ));
        }
        let id: Arc<str> = Arc::from(task);
        let dep: Arc<str> = Arc::from(dependency);
        // Count the edge first (and take the task out of its ready queue by bumping its epoch),
        // then register with the dependency, which may already have completed.
        {
            let mut shard = self.tasks.shard(task);
            let Some(r) = shard.get_mut(task) else {
                return Err(SchedError::unknown("task", task));
            };
            if r.state != TaskState::Pending {
                return Err(SchedError::transition(
                    "task",
                    task,
                    r.state,
                    "add a dependency",
                ));
            }
            r.unmet += 1;
            r.epoch = r.epoch.wrapping_add(1);
            r.deps.push(Arc::clone(&dep));
        }
        let done = {
            let mut shard = self.tasks.shard(dependency);
            match shard.get_mut(dependency) {
                Some(d) if d.state == TaskState::Completed => true,
                Some(d) => {
                    d.dependents.push(Arc::clone(&id));
                    false
                }
                None => true,
            }
        };
        // Zero newly met: re-queues the task under its new epoch if nothing else is missing.
        self.satisfy(&id, u32::from(done));
        Ok(())
    }

    /// A dependency path from `from` to `to` (following "depends on" edges), as ids.
    fn path_between(&self, from: &str, to: &str) -> Option<Vec<String>> {
        let mut stack: Vec<(Arc<str>, usize)> = vec![(Arc::from(from), 0)];
        let mut visited: HashSet<Arc<str>> = HashSet::new();
        let mut path: Vec<String> = Vec::new();
        while let Some((node, depth)) = stack.pop() {
            path.truncate(depth);
            path.push(node.to_string());
            if node.as_ref() == to {
                return Some(path);
            }
            if !visited.insert(Arc::clone(&node)) {
                continue;
            }
            let deps = self
                .tasks
                .shard(&node)
                .get(&node)
                .filter(|r| !r.state.is_terminal())
                .map(|r| r.deps.clone())
                .unwrap_or_default();
            for d in deps {
                stack.push((d, depth + 1));
            }
        }
        None
    }

    /// Admits up to `max` ready tasks in policy order, reserving their resources. Admitted tasks
    /// are handed out by [`Scheduler::next_runnable`] in admission order.
    pub fn admit(&self, max: usize) -> AdmitReport {
        let mut report = AdmitReport::default();
        let mut stride = self.stride.lock();
        let mut blocked = [false; 3];
        while report.admitted.len() < max {
            let Some(class) = self.pick_class(&mut stride, &blocked) else {
                break;
            };
            let Some(entry) = self.ready[class.index()].pop() else {
                continue;
            };
            match self.try_admit_entry(&entry) {
                None => continue, // stale: cancelled, re-queued or given a new dependency
                Some(Ok(AdmissionDecision::Admitted { preempted, .. })) => {
                    stride.pass[class.index()] +=
                        STRIDE_UNIT / u64::from(self.config.class_weights[class.index()]);
                    stride.vtime = stride.pass[class.index()];
                    report.admitted.push(entry.id.to_string());
                    for victim in preempted {
                        self.preempt(&victim, &entry.id);
                        report.preempted.push(victim);
                    }
                }
                Some(Ok(AdmissionDecision::Rejected(reason))) if reason.is_permanent() => {
                    self.finish_unadmitted(&entry.id, TaskState::Failed, reason.to_string());
                    report.failed.push(entry.id.to_string());
                }
                Some(Ok(AdmissionDecision::Rejected(_)) | Err(_)) => {
                    // Does not fit now: back at the head of its class, and the class holds its
                    // turn against the other non-Guaranteed class for this round.
                    self.ready[class.index()].push(entry);
                    blocked[class.index()] = true;
                    if class != QosClass::Guaranteed {
                        blocked[QosClass::Burstable.index()] = true;
                        blocked[QosClass::BestEffort.index()] = true;
                    }
                }
            }
        }
        report
    }

    /// The non-blocked, non-empty class with the smallest stride pass.
    fn pick_class(&self, stride: &mut Stride, blocked: &[bool; 3]) -> Option<QosClass> {
        let mut best: Option<QosClass> = None;
        for class in QosClass::ALL {
            let i = class.index();
            if self.ready[i].len() == 0 {
                // An idle class must not bank credit for when it returns.
                stride.pass[i] = stride.pass[i].max(stride.vtime);
                continue;
            }
            if blocked[i] {
                continue;
            }
            if best.map_or(true, |b| stride.pass[i] < stride.pass[b.index()]) {
                best = Some(class);
            }
        }
        best
    }

    /// Admission of a queued entry, with its task record locked throughout so that nothing can
    /// change it between the check and the transition: None when the entry is stale; on success
    /// the task is Admitted and queued to run.
    fn try_admit_entry(&self, entry: &Entry) -> Option<Result<AdmissionDecision>> {
        let decision = {
            let mut shard = self.tasks.shard(&entry.id);
            let r = shard.get_mut(&entry.id)?;
            if !(r.state == TaskState::Pending && r.unmet == 0 && r.epoch == entry.epoch) {
                return None;
            }
            let decision = self.admission.try_admit_shared(&entry.id, &r.request);
            if let Ok(AdmissionDecision::Admitted { .. }) = decision {
                r.state = TaskState::Admitted;
                r.admitted_ns = now_ns();
                self.runnable.push((Arc::clone(&entry.id), r.epoch));
            }
            decision
        };
        if let Ok(AdmissionDecision::Admitted { .. }) = decision {
            self.count(Some(TaskState::Pending), TaskState::Admitted);
            self.admission.dequeue();
        }
        Some(decision)
    }

    /// A best-effort task lost its reservation to `by`: back to Pending if it had not started,
    /// cancelled if it was running.
    fn preempt(&self, victim: &str, by: &str) {
        self.preempted.fetch_add(1, Ordering::Relaxed);
        let requeue = {
            let mut shard = self.tasks.shard(victim);
            let Some(r) = shard.get_mut(victim) else {
                return;
            };
            match r.state {
                TaskState::Admitted => {
                    r.state = TaskState::Pending;
                    r.epoch = r.epoch.wrapping_add(1);
                    r.preemptions += 1;
                    Some((
                        r.qos,
                        Entry {
                            key: r.key,
                            seq: r.seq,
                            epoch: r.epoch,
                            id: Arc::from(victim),
                        },
                    ))
                }
                TaskState::Running => None,
                _ => return,
            }
        };
        match requeue {
            Some((qos, entry)) => {
                self.count(Some(TaskState::Admitted), TaskState::Pending);
                self.admission.enqueue_force();
                self.ready[qos.index()].push(entry);
            }
            None => {
                let _ = self.finish(
                    victim,
                    &[TaskState::Running],
                    TaskState::Cancelled,
                    Some(format!("preempted by {by:?}")),
                    false,
                );
            }
        }
    }

    /// Takes the next admitted task (in admission order) and marks it Running.
    pub fn next_runnable(&self) -> Option<String> {
        while let Some((id, epoch)) = self.runnable.pop() {
            let mut shard = self.tasks.shard(&id);
            if let Some(r) = shard.get_mut(&id) {
                if r.state == TaskState::Admitted && r.epoch == epoch {
                    r.state = TaskState::Running;
                    r.started_ns = now_ns();
                    drop(shard);
                    self.count(Some(TaskState::Admitted), TaskState::Running);
                    return Some(id.to_string());
                }
            }
        }
        None
    }

    /// Marks a specific Admitted task Running.
    pub fn start(&self, id: &str) -> Result<()> {
        let mut shard = self.tasks.shard(id);
        let r = shard
            .get_mut(id)
            .ok_or_else(|| SchedError::unknown("task", id))?;
        if r.state != TaskState::Admitted {
            return Err(SchedError::transition("task", id, r.state, "start"));
        }
        r.state = TaskState::Running;
        r.started_ns = now_ns();
        drop(shard);
        self.count(Some(TaskState::Admitted), TaskState::Running);
        Ok(())
    }

    /// Running -> Completed; releases its resources and readies its dependents.
    pub fn complete(&self, id: &str) -> Result<()> {
        self.finish(id, &[TaskState::Running], TaskState::Completed, None, true)
    }

    /// Admitted or Running -> Failed with `error`; its dependents are cancelled.
    pub fn fail(&self, id: &str, error: &str) -> Result<()> {
        self.finish(
            id,
            &[TaskState::Admitted, TaskState::Running],
            TaskState::Failed,
            Some(error.to_string()),
            true,
        )
    }

    /// Pending, Admitted or Running -> Cancelled; its dependents are cancelled.
    pub fn cancel(&self, id: &str) -> Result<()> {
        self.finish(
            id,
            &[TaskState::Pending, TaskState::Admitted, TaskState::Running],
            TaskState::Cancelled,
            Some("cancelled".to_string()),
            true,
        )
    }

    fn finish_unadmitted(&self, id: &str, to: TaskState, error: String) {
        let _ = self.finish(id, &[TaskState::Pending], to, Some(error), false);
    }

    /// Moves `id` from one of `allowed` to terminal state `to`, releases what it holds, and
    /// notifies its dependents (readied on completion, cancelled otherwise, transitively).
    fn finish(
        &self,
        id: &str,
        allowed: &[TaskState],
        to: TaskState,
        error: Option<String>,
        release: bool,
    ) -> Result<()> {
        let dependents = self.finish_one(id, allowed, to, error, release)?;
        if to == TaskState::Completed {
            for d in &dependents {
                self.satisfy(d, 1);
            }
            return Ok(());
        }
        // Cancel everything that (transitively) waited on this task, without recursion.
        let mut work: Vec<(Arc<str>, String)> = dependents
            .into_iter()
            .map(|d| (d, id.to_string()))
            .collect();
        while let Some((task, cause)) = work.pop() {
            let why = format!("dependency {cause:?} did not complete");
            if let Ok(next) = self.finish_one(
                &task,
                &[TaskState::Pending],
                TaskState::Cancelled,
                Some(why),
                true,
            ) {
                work.extend(next.into_iter().map(|d| (d, task.to_string())));
            }
        }
        Ok(())
    }

    fn finish_one(
        &self,
        id: &str,
        allowed: &[TaskState],
        to: TaskState,
        error: Option<String>,
        release: bool,
    ) -> Result<Vec<Arc<str>>> {
        let (from, dependents) = {
            let mut shard = self.tasks.shard(id);
            let r = shard
                .get_mut(id)
                .ok_or_else(|| SchedError::unknown("task", id))?;
            if !allowed.contains(&r.state) {
                let op = match to {
                    TaskState::Completed => "complete",
                    TaskState::Failed => "fail",
                    _ => "cancel",
                };
                return Err(SchedError::transition("task", id, r.state, op));
            }
            let from = r.state;
            r.state = to;
            r.finished_ns = now_ns();
            r.error = error;
            r.epoch = r.epoch.wrapping_add(1);
            (from, std::mem::take(&mut r.dependents))
        };
        self.count(Some(from), to);
        match from {
            TaskState::Pending => self.admission.dequeue(),
            TaskState::Admitted | TaskState::Running if release => {
                let _ = self.admission.release(id);
            }
            _ => {}
        }
        Ok(dependents)
    }

    /// The state of `id`.
    pub fn state(&self, id: &str) -> Result<TaskState> {
        self.tasks
            .shard(id)
            .get(id)
            .map(|r| r.state)
            .ok_or_else(|| SchedError::unknown("task", id))
    }

    /// A snapshot of `id`.
    pub fn task(&self, id: &str) -> Result<TaskInfo> {
        let reserved_memory = self.admission.grant(id).map_or(0, |g| g.memory);
        let shard = self.tasks.shard(id);
        let r = shard
            .get(id)
            .ok_or_else(|| SchedError::unknown("task", id))?;
        Ok(TaskInfo {
            id: id.to_string(),
            name: r.name.to_string(),
            state: r.state,
            qos: r.qos,
            priority: r.priority,
            reserved_memory,
            submitted_ns: r.submitted_ns,
            admitted_ns: r.admitted_ns,
            started_ns: r.started_ns,
            finished_ns: r.finished_ns,
            error: r.error.clone(),
            preemptions: r.preemptions,
        })
    }

    /// Ids of tasks in `state` (a snapshot).
    pub fn tasks_in(&self, state: TaskState) -> Vec<String> {
        let mut out = Vec::new();
        self.tasks.for_each_shard(|m| {
            out.extend(
                m.iter()
                    .filter(|(_, r)| r.state == state)
                    .map(|(k, _)| k.to_string()),
            );
        });
        out
    }

    /// Tasks ready for admission (dependencies met), per class.
    pub fn queued(&self) -> [usize; 3] {
        [
            self.ready[0].len(),
            self.ready[1].len(),
            self.ready[2].len(),
        ]
    }

    /// Counters.
    pub fn stats(&self) -> SchedulerStats {
        let mut by_state = [0i64; 6];
        for (i, c) in self.counts.iter().enumerate() {
            by_state[i] = c.load(Ordering::Relaxed);
        }
        SchedulerStats {
            by_state,
            submitted: self.submitted.load(Ordering::Relaxed),
            rejected: self.rejected.load(Ordering::Relaxed),
            preempted: self.preempted.load(Ordering::Relaxed),
            admission: self.admission.stats(),
        }
    }

    /// Wait from submission to start per class (Guaranteed, Burstable, BestEffort), over tasks
    /// that started and whose records are kept.
    pub fn wait_stats(&self) -> [WaitStats; 3] {
        let mut waits: [Vec<u64>; 3] = Default::default();
        self.tasks.for_each_shard(|m| {
            for r in m.values() {
                if r.started_ns > 0 {
                    waits[r.qos.index()].push(r.started_ns.saturating_sub(r.submitted_ns));
                }
            }
        });
        waits.map(|mut w| {
            if w.is_empty() {
                return WaitStats::default();
            }
            w.sort_unstable();
            let pick = |q: f64| w[((w.len() as f64 - 1.0) * q).round() as usize];
            WaitStats {
                count: w.len(),
                p50_ns: pick(0.5),
                p99_ns: pick(0.99),
                max_ns: *w.last().unwrap_or(&0),
            }
        })
    }

    /// Forgets finished tasks (their ids become unknown); returns how many.
    pub fn prune_finished(&self) -> usize {
        let mut removed = [0i64; 6];
        self.tasks.for_each_shard(|m| {
            m.retain(|_, r| {
                if r.state.is_terminal() {
                    removed[r.state as usize] += 1;
                    false
                } else {
                    true
                }
            });
        });
        for (i, n) in removed.iter().enumerate() {
            self.counts[i].fetch_sub(*n, Ordering::Relaxed);
        }
        removed.iter().sum::<i64>() as usize
    }

    /// Number of task records kept.
    pub fn len(&self) -> usize {
        self.tasks.len()
    }

    /// True when no task records are kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
