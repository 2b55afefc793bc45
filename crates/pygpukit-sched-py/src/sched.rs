//! The task scheduler: task states, policies, task descriptions and the Scheduler.

use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use pygpukit_sched::admission::AdmissionConfig;
use pygpukit_sched::qos::{QosClass, QosPolicy};
use pygpukit_sched::scheduler::{
    Scheduler, SchedulerConfig, TaskInfo, TaskMeta, TaskPolicy, TaskState,
};
use pygpukit_sched::workload::{run_mixed_workload, WorkloadConfig};

use crate::admission::{stats_dict, PyAdmissionDecision};
use crate::errors::{invalid, IntoPy};
use crate::qos::{bytes_arg, extract_class, PyQosClass};

/// Where a task is in its life.
#[pyclass(
    name = "TaskState",
    module = "_pygpukit_rust",
    eq,
    eq_int,
    frozen,
    from_py_object
)]
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum PyTaskState {
    /// Submitted; waiting for dependencies and admission.
    Pending,
    /// Resources reserved; waiting to start.
    Admitted,
    /// Started.
    Running,
    /// Finished successfully.
    Completed,
    /// Finished with an error.
    Failed,
    /// Cancelled (by the caller, preemption, or a failed dependency).
    Cancelled,
}

impl From<TaskState> for PyTaskState {
    fn from(s: TaskState) -> Self {
        match s {
            TaskState::Pending => Self::Pending,
            TaskState::Admitted => Self::Admitted,
            TaskState::Running => Self::Running,
            TaskState::Completed => Self::Completed,
            TaskState::Failed => Self::Failed,
            TaskState::Cancelled => Self::Cancelled,
        }
    }
}

impl From<PyTaskState> for TaskState {
    fn from(s: PyTaskState) -> Self {
        match s {
            PyTaskState::Pending => Self::Pending,
            PyTaskState::Admitted => Self::Admitted,
            PyTaskState::Running => Self::Running,
            PyTaskState::Completed => Self::Completed,
            PyTaskState::Failed => Self::Failed,
            PyTaskState::Cancelled => Self::Cancelled,
        }
    }
}

#[pymethods]
impl PyTaskState {
    /// True for Completed, Failed and Cancelled.
    #[getter]
    fn is_terminal(&self) -> bool {
        TaskState::from(*self).is_terminal()
    }
}

/// Order of tasks within a QoS class.
#[pyclass(
    name = "TaskPolicy",
    module = "_pygpukit_rust",
    eq,
    eq_int,
    frozen,
    from_py_object
)]
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum PyTaskPolicy {
    /// Submission order.
    Fifo,
    /// Higher priority first, with bounded overtaking.
    Priority,
    /// Cheaper tasks first, with bounded overtaking.
    Sjf,
}

impl From<PyTaskPolicy> for TaskPolicy {
    fn from(p: PyTaskPolicy) -> Self {
        match p {
            PyTaskPolicy::Fifo => TaskPolicy::Fifo,
            PyTaskPolicy::Priority => TaskPolicy::Priority,
            PyTaskPolicy::Sjf => TaskPolicy::ShortestJob,
        }
    }
}

/// What a task is and needs.
#[pyclass(name = "TaskMeta", module = "_pygpukit_rust", frozen)]
pub struct PyTaskMeta {
    inner: TaskMeta,
}

#[pymethods]
impl PyTaskMeta {
    #[new]
    #[pyo3(signature = (id, name, memory_estimate = 0, priority = 0, dependencies = None, *, qos = None, bandwidth = 0.0, memory_limit = 0, estimated_cost = 0))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        id: String,
        name: String,
        memory_estimate: i128,
        priority: i64,
        dependencies: Option<Vec<String>>,
        qos: Option<&Bound<'_, PyAny>>,
        bandwidth: f64,
        memory_limit: i128,
        estimated_cost: i128,
    ) -> PyResult<Self> {
        let priority = i32::try_from(priority).map_err(|_| {
            invalid(format!(
                "invalid priority: {priority} (must be in [-1000, 1000])"
            ))
        })?;
        let mut inner = TaskMeta::new(id, name)
            .memory(bytes_arg("memory_estimate", memory_estimate)?)
            .priority(priority)
            .bandwidth(bandwidth)
            .cost(bytes_arg("estimated_cost", estimated_cost)?)
            .depends_on(dependencies.unwrap_or_default());
        inner.memory_limit = bytes_arg("memory_limit", memory_limit)?;
        if let Some(q) = qos {
            inner.qos = extract_class(q)?;
        }
        Ok(Self { inner })
    }

    /// Task id.
    #[getter]
    fn id(&self) -> &str {
        &self.inner.id
    }

    /// Task name.
    #[getter]
    fn name(&self) -> &str {
        &self.inner.name
    }

    /// Memory estimate, bytes.
    #[getter]
    fn memory_estimate(&self) -> u64 {
        self.inner.memory_estimate
    }

    /// Priority.
    #[getter]
    fn priority(&self) -> i32 {
        self.inner.priority
    }

    /// QoS class.
    #[getter]
    fn qos(&self) -> PyQosClass {
        self.inner.qos.into()
    }

    /// Ids of tasks that must complete first.
    #[getter]
    fn dependencies(&self) -> Vec<String> {
        self.inner.dependencies.clone()
    }

    fn __repr__(&self) -> String {
        format!(
            "TaskMeta({:?}, {:?}, memory_estimate={}, priority={}, qos={}, dependencies={:?})",
            self.inner.id,
            self.inner.name,
            self.inner.memory_estimate,
            self.inner.priority,
            self.inner.qos,
            self.inner.dependencies
        )
    }
}

fn info_dict<'py>(py: Python<'py>, t: &TaskInfo) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("id", t.id.as_str())?;
    d.set_item("name", t.name.as_str())?;
    d.set_item("state", PyTaskState::from(t.state))?;
    d.set_item("qos", PyQosClass::from(t.qos))?;
    d.set_item("priority", t.priority)?;
    d.set_item("reserved_memory", t.reserved_memory)?;
    d.set_item("submitted_ns", t.submitted_ns)?;
    d.set_item("admitted_ns", t.admitted_ns)?;
    d.set_item("started_ns", t.started_ns)?;
    d.set_item("finished_ns", t.finished_ns)?;
    d.set_item("error", t.error.as_deref())?;
    d.set_item("preemptions", t.preemptions)?;
    Ok(d)
}

/// Submits, admits and tracks tasks under memory/bandwidth capacity, QoS classes, dependencies and
/// an ordering policy; thread-safe (calls release the GIL only where they may wait).
#[pyclass(name = "Scheduler", module = "_pygpukit_rust", frozen)]
pub struct PyScheduler {
    inner: Arc<Scheduler>,
}

#[pymethods]
impl PyScheduler {
    #[new]
    #[pyo3(signature = (total_memory, *, policy = PyTaskPolicy::Fifo, total_bandwidth = 1.0, max_pending_tasks = 10_000, enable_best_effort = true, guaranteed_share = 0.5, burst_share = 0.25, aging_step = 16, class_weights = (8, 4, 1)))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        total_memory: i128,
        policy: PyTaskPolicy,
        total_bandwidth: f64,
        max_pending_tasks: i64,
        enable_best_effort: bool,
        guaranteed_share: f64,
        burst_share: f64,
        aging_step: i64,
        class_weights: (u32, u32, u32),
    ) -> PyResult<Self> {
        let config = SchedulerConfig {
            admission: AdmissionConfig {
                max_memory: bytes_arg("total_memory", total_memory)?,
                max_bandwidth: total_bandwidth,
                max_pending_tasks: usize::try_from(max_pending_tasks).map_err(|_| {
                    invalid(format!(
                        "invalid max_pending_tasks: {max_pending_tasks} (must be positive)"
                    ))
                })?,
                enable_best_effort,
                qos: QosPolicy {
                    guaranteed_share,
                    burst_share,
                },
            },
            policy: policy.into(),
            aging_step: u64::try_from(aging_step).map_err(|_| {
                invalid(format!(
                    "invalid aging_step: {aging_step} (must be non-negative)"
                ))
            })?,
            class_weights: [class_weights.0, class_weights.1, class_weights.2],
        };
        Ok(Self {
            inner: Arc::new(Scheduler::new(config).py_err()?),
        })
    }

    /// Submits `task`; returns its id. Raises DuplicateIdError, UnknownIdError (dependency),
    /// DependencyCycleError, InvalidArgumentError or AdmissionRejectedError; nothing changes then.
    fn submit(&self, task: PyRef<'_, PyTaskMeta>) -> PyResult<String> {
        let id = task.inner.id.clone();
        self.inner.submit(task.inner.clone()).py_err()?;
        Ok(id)
    }

    /// Makes Pending task `task_id` also wait for `dependency` (DependencyCycleError if it would
    /// close a cycle).
    fn add_dependency(&self, task_id: &str, dependency: &str) -> PyResult<()> {
        self.inner.add_dependency(task_id, dependency).py_err()
    }

    /// Admits up to `max_tasks` ready tasks (all that fit when None). Returns a dict with the
    /// "admitted" ids, the "preempted" best-effort ids and the "failed" ids (never admissible).
    #[pyo3(signature = (max_tasks = None))]
    fn admit<'py>(
        &self,
        py: Python<'py>,
        max_tasks: Option<usize>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let r = self.inner.admit(max_tasks.unwrap_or(usize::MAX));
        let d = PyDict::new(py);
        d.set_item("admitted", PyList::new(py, &r.admitted)?)?;
        d.set_item("preempted", PyList::new(py, &r.preempted)?)?;
        d.set_item("failed", PyList::new(py, &r.failed)?)?;
        Ok(d)
    }

    /// What admitting `task` now would decide (nothing is reserved or submitted).
    fn evaluate_admission(&self, task: PyRef<'_, PyTaskMeta>) -> PyResult<PyAdmissionDecision> {
        let t = &task.inner;
        let req = pygpukit_sched::ResourceRequest {
            class: t.qos,
            memory: t.memory_estimate,
            memory_limit: if t.memory_limit == 0 {
                t.memory_estimate
            } else {
                t.memory_limit
            },
            bandwidth: t.bandwidth,
            bandwidth_limit: t.bandwidth,
        };
        Ok(self.inner.admission().evaluate(&req).py_err()?.into())
    }

    /// Takes the next admitted task (admission order), marks it Running and returns its id.
    fn next_runnable(&self) -> Option<String> {
        self.inner.next_runnable()
    }

    /// Admits what fits, then starts up to `max_tasks` admitted tasks; returns their ids.
    #[pyo3(signature = (max_tasks = None))]
    fn get_runnable_tasks(&self, max_tasks: Option<usize>) -> Vec<String> {
        let max = max_tasks.unwrap_or(usize::MAX);
        self.inner.admit(max);
        let mut out = Vec::new();
        while out.len() < max {
            match self.inner.next_runnable() {
                Some(id) => out.push(id),
                None => break,
            }
        }
        out
    }

    /// Marks Admitted task `task_id` Running.
    fn start(&self, task_id: &str) -> PyResult<()> {
        self.inner.start(task_id).py_err()
    }

    /// Running -> Completed.
    fn complete(&self, task_id: &str) -> PyResult<()> {
        self.inner.complete(task_id).py_err()
    }

    /// Admitted or Running -> Failed with `error`; dependents are cancelled.
    #[pyo3(signature = (task_id, error = "failed"))]
    fn fail(&self, task_id: &str, error: &str) -> PyResult<()> {
        self.inner.fail(task_id, error).py_err()
    }

    /// Cancels a task that is not finished; dependents are cancelled.
    fn cancel(&self, task_id: &str) -> PyResult<()> {
        self.inner.cancel(task_id).py_err()
    }

    /// Same as `cancel` (the name earlier pygpukit versions used).
    fn cancel_task(&self, task_id: &str) -> PyResult<()> {
        self.inner.cancel(task_id).py_err()
    }

    /// State of `task_id`.
    fn state(&self, task_id: &str) -> PyResult<PyTaskState> {
        Ok(self.inner.state(task_id).py_err()?.into())
    }

    /// Everything known about `task_id`, as a dict.
    fn task_info<'py>(&self, py: Python<'py>, task_id: &str) -> PyResult<Bound<'py, PyDict>> {
        info_dict(py, &self.inner.task(task_id).py_err()?)
    }

    /// Ids of tasks in `state`.
    fn tasks_in(&self, state: PyTaskState) -> Vec<String> {
        self.inner.tasks_in(state.into())
    }

    /// Forgets finished tasks; returns how many.
    fn prune_finished(&self) -> usize {
        self.inner.prune_finished()
    }

    /// Counts per state, admission usage and counters, ready tasks per class.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.inner.stats();
        let d = PyDict::new(py);
        for state in TaskState::ALL {
            d.set_item(state.name(), s.by_state[state as usize])?;
        }
        d.set_item("submitted", s.submitted)?;
        d.set_item("rejected", s.rejected)?;
        d.set_item("preempted", s.preempted)?;
        let q = self.inner.queued();
        let queued = PyDict::new(py);
        for class in QosClass::ALL {
            queued.set_item(class.name(), q[class.index()])?;
        }
        d.set_item("queued", queued)?;
        d.set_item("admission", stats_dict(py, &s.admission)?)?;
        Ok(d)
    }

    /// Wait from submission to start per class: {class: {"count", "p50_us", "p99_us", "max_us"}}.
    fn wait_stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let w = self.inner.wait_stats();
        let d = PyDict::new(py);
        for class in QosClass::ALL {
            let s = w[class.index()];
            let c = PyDict::new(py);
            c.set_item("count", s.count)?;
            c.set_item("p50_us", s.p50_ns as f64 / 1e3)?;
            c.set_item("p99_us", s.p99_ns as f64 / 1e3)?;
            c.set_item("max_us", s.max_ns as f64 / 1e3)?;
            d.set_item(class.name(), c)?;
        }
        Ok(d)
    }

    fn __len__(&self) -> usize {
        self.inner.len()
    }
}

/// Runs the reproducible mixed-QoS workload (10,000 tasks by default) through the real scheduler
/// and reports, per class, how tasks ended and their wait (p50/p99/max, in simulation steps).
#[pyfunction]
#[pyo3(signature = (tasks = 10_000, *, slots = 16, arrivals_per_step = 1.5, cancel_probability = 0.02, failure_probability = 0.02, policy = PyTaskPolicy::Priority, seed = 42))]
#[allow(clippy::too_many_arguments)]
pub fn simulate_workload<'py>(
    py: Python<'py>,
    tasks: usize,
    slots: usize,
    arrivals_per_step: f64,
    cancel_probability: f64,
    failure_probability: f64,
    policy: PyTaskPolicy,
    seed: u64,
) -> PyResult<Bound<'py, PyDict>> {
    if slots == 0 {
        return Err(invalid("invalid slots: 0 (must be positive)"));
    }
    for (name, p) in [
        ("cancel_probability", cancel_probability),
        ("failure_probability", failure_probability),
    ] {
        if !(0.0..=1.0).contains(&p) {
            return Err(invalid(format!("invalid {name}: {p} (must be in [0, 1])")));
        }
    }
    if !(arrivals_per_step.is_finite() && arrivals_per_step > 0.0) {
        return Err(invalid(format!(
            "invalid arrivals_per_step: {arrivals_per_step} (must be positive)"
        )));
    }
    let config = WorkloadConfig {
        tasks,
        slots,
        arrivals_per_step,
        cancel_probability,
        failure_probability,
        policy: policy.into(),
        seed,
        ..WorkloadConfig::ten_thousand()
    };
    let report = py.detach(|| run_mixed_workload(&config)).py_err()?;
    let d = PyDict::new(py);
    d.set_item("steps", report.steps)?;
    d.set_item("preempted", report.preempted)?;
    d.set_item("unfinished", report.unfinished)?;
    for class in QosClass::ALL {
        let c = report.classes[class.index()];
        let e = PyDict::new(py);
        e.set_item("submitted", c.submitted)?;
        e.set_item("started", c.started)?;
        e.set_item("completed", c.completed)?;
        e.set_item("failed", c.failed)?;
        e.set_item("cancelled", c.cancelled)?;
        e.set_item("p50_wait", c.p50_wait)?;
        e.set_item("p99_wait", c.p99_wait)?;
        e.set_item("max_wait", c.max_wait)?;
        d.set_item(class.name(), e)?;
    }
    Ok(d)
}
