//! Admission control: configuration, decisions, reject reasons and the controller.

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use pygpukit_sched::admission::{
    AdmissionConfig, AdmissionController, AdmissionDecision, AdmissionStats, Grant, RejectReason,
    Resource, ResourceRequest,
};
use pygpukit_sched::qos::{QosClass, QosPolicy};

use crate::errors::IntoPy;
use crate::qos::{bytes_arg, extract_class};

/// Why a request was not admitted. `kind` is one of "insufficient_memory",
/// "insufficient_bandwidth", "exceeds_capacity", "queue_full", "best_effort_disabled",
/// "unsatisfiable_dependencies", "partition_limit".
#[pyclass(name = "RejectReason", module = "_pygpukit_rust", frozen)]
pub struct PyRejectReason {
    inner: RejectReason,
}

impl From<RejectReason> for PyRejectReason {
    fn from(inner: RejectReason) -> Self {
        Self { inner }
    }
}

#[pymethods]
impl PyRejectReason {
    /// Machine-readable kind.
    #[getter]
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }

    /// Human-readable description naming the amounts.
    #[getter]
    fn message(&self) -> String {
        self.inner.to_string()
    }

    /// True when retrying later cannot succeed.
    #[getter]
    fn is_permanent(&self) -> bool {
        self.inner.is_permanent()
    }

    /// The amounts involved (requested, available, limit, resource, dependency, partition) as a
    /// dict; only the keys that apply are present.
    fn details<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        match &self.inner {
            RejectReason::InsufficientMemory {
                requested,
                available,
            } => {
                d.set_item("resource", "memory")?;
                d.set_item("requested", *requested)?;
                d.set_item("available", *available)?;
            }
            RejectReason::InsufficientBandwidth {
                requested,
                available,
            } => {
                d.set_item("resource", "bandwidth")?;
                d.set_item("requested", *requested)?;
                d.set_item("available", *available)?;
            }
            RejectReason::ExceedsCapacity {
                resource,
                requested,
                limit,
            } => {
                d.set_item(
                    "resource",
                    match resource {
                        Resource::Memory => "memory",
                        Resource::Bandwidth => "bandwidth",
                    },
                )?;
                d.set_item("requested", *requested)?;
                d.set_item("limit", *limit)?;
            }
            RejectReason::QueueFull { limit } => d.set_item("limit", *limit)?,
            RejectReason::BestEffortDisabled => {}
            RejectReason::UnsatisfiableDependencies { dependency } => {
                d.set_item("dependency", dependency.as_str())?
            }
            RejectReason::PartitionLimit { partition, what } => {
                d.set_item("partition", partition.as_str())?;
                d.set_item("what", what.as_str())?;
            }
        }
        Ok(d)
    }

    fn __str__(&self) -> String {
        self.inner.to_string()
    }

    fn __repr__(&self) -> String {
        format!("RejectReason({:?}: {})", self.inner.kind(), self.inner)
    }
}

/// The outcome of an admission attempt; true when admitted.
#[pyclass(name = "AdmissionDecision", module = "_pygpukit_rust", frozen)]
pub struct PyAdmissionDecision {
    grant: Option<Grant>,
    preempted: Vec<String>,
    reason: Option<RejectReason>,
}

impl From<AdmissionDecision> for PyAdmissionDecision {
    fn from(d: AdmissionDecision) -> Self {
        match d {
            AdmissionDecision::Admitted { grant, preempted } => Self {
                grant: Some(grant),
                preempted,
                reason: None,
            },
            AdmissionDecision::Rejected(reason) => Self {
                grant: None,
                preempted: Vec::new(),
                reason: Some(reason),
            },
        }
    }
}

#[pymethods]
impl PyAdmissionDecision {
    /// True when admitted.
    #[getter]
    fn admitted(&self) -> bool {
        self.grant.is_some()
    }

    /// Why not, when rejected.
    #[getter]
    fn reason(&self) -> Option<PyRejectReason> {
        self.reason.clone().map(PyRejectReason::from)
    }

    /// Best-effort task ids preempted to make room.
    #[getter]
    fn preempted<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        PyList::new(py, &self.preempted)
    }

    /// Memory reserved (request plus burst), bytes; 0 when rejected.
    #[getter]
    fn granted_memory(&self) -> u64 {
        self.grant.map_or(0, |g| g.memory)
    }

    /// The burst part of `granted_memory`.
    #[getter]
    fn burst_memory(&self) -> u64 {
        self.grant.map_or(0, |g| g.burst_memory)
    }

    /// Bandwidth reserved; 0 when rejected.
    #[getter]
    fn granted_bandwidth(&self) -> f64 {
        self.grant.map_or(0.0, |g| g.bandwidth)
    }

    fn __bool__(&self) -> bool {
        self.grant.is_some()
    }

    fn __repr__(&self) -> String {
        match (&self.grant, &self.reason) {
            (Some(g), _) => format!(
                "AdmissionDecision(admitted, memory={}, bandwidth={}, preempted={:?})",
                g.memory, g.bandwidth, self.preempted
            ),
            (None, Some(r)) => format!("AdmissionDecision(rejected: {r})"),
            (None, None) => "AdmissionDecision(rejected)".to_string(),
        }
    }
}

/// Capacity, queue limit and QoS split of an AdmissionController or Scheduler.
#[pyclass(name = "AdmissionConfig", module = "_pygpukit_rust", frozen)]
pub struct PyAdmissionConfig {
    pub(crate) inner: AdmissionConfig,
}

#[pymethods]
impl PyAdmissionConfig {
    #[new]
    #[pyo3(signature = (max_memory, max_bandwidth = 1.0, max_pending_tasks = 10_000, enable_best_effort = true, *, guaranteed_share = 0.5, burst_share = 0.25))]
    fn new(
        max_memory: i128,
        max_bandwidth: f64,
        max_pending_tasks: i64,
        enable_best_effort: bool,
        guaranteed_share: f64,
        burst_share: f64,
    ) -> PyResult<Self> {
        let max_pending_tasks = usize::try_from(max_pending_tasks).map_err(|_| {
            crate::errors::invalid(format!(
                "invalid max_pending_tasks: {max_pending_tasks} (must be positive)"
            ))
        })?;
        let inner = AdmissionConfig {
            max_memory: bytes_arg("max_memory", max_memory)?,
            max_bandwidth,
            max_pending_tasks,
            enable_best_effort,
            qos: QosPolicy {
                guaranteed_share,
                burst_share,
            },
        };
        inner.validate().py_err()?;
        Ok(Self { inner })
    }

    /// Memory capacity, bytes.
    #[getter]
    fn max_memory(&self) -> u64 {
        self.inner.max_memory
    }

    /// Bandwidth capacity.
    #[getter]
    fn max_bandwidth(&self) -> f64 {
        self.inner.max_bandwidth
    }

    /// Most tasks waiting at once.
    #[getter]
    fn max_pending_tasks(&self) -> usize {
        self.inner.max_pending_tasks
    }

    /// Whether best-effort requests are admitted.
    #[getter]
    fn enable_best_effort(&self) -> bool {
        self.inner.enable_best_effort
    }
}

/// Admission statistics as a dict.
pub fn stats_dict<'py>(py: Python<'py>, s: &AdmissionStats) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("admitted", s.admitted)?;
    d.set_item("rejected", s.rejected)?;
    d.set_item("preempted", s.preempted)?;
    d.set_item("released", s.released)?;
    d.set_item("active", s.active)?;
    d.set_item("pending", s.pending)?;
    d.set_item("memory_used", s.memory_used)?;
    d.set_item("memory_capacity", s.memory_capacity)?;
    d.set_item("guaranteed_reserve", s.guaranteed_memory)?;
    d.set_item("bandwidth_used", s.bandwidth_used)?;
    d.set_item("bandwidth_capacity", s.bandwidth_capacity)?;
    let (memory, bandwidth) = (PyDict::new(py), PyDict::new(py));
    for (i, class) in QosClass::ALL.iter().enumerate() {
        memory.set_item(class.name(), s.memory_by_class[i])?;
        bandwidth.set_item(class.name(), s.bandwidth_by_class[i])?;
    }
    d.set_item("memory_by_class", memory)?;
    d.set_item("bandwidth_by_class", bandwidth)?;
    Ok(d)
}

fn request(
    qos: &Bound<'_, PyAny>,
    memory: i128,
    bandwidth: f64,
    memory_limit: Option<i128>,
) -> PyResult<ResourceRequest> {
    let class = extract_class(qos)?;
    let memory = bytes_arg("memory", memory)?;
    let mut req = ResourceRequest::new(class, memory, bandwidth);
    if let Some(limit) = memory_limit {
        req.memory_limit = bytes_arg("memory_limit", limit)?;
    }
    Ok(req)
}

/// Admits requests against memory and bandwidth capacity by QoS class; thread-safe.
#[pyclass(name = "AdmissionController", module = "_pygpukit_rust", frozen)]
pub struct PyAdmissionController {
    inner: AdmissionController,
}

#[pymethods]
impl PyAdmissionController {
    #[new]
    fn new(config: PyRef<'_, PyAdmissionConfig>) -> PyResult<Self> {
        Ok(Self {
            inner: AdmissionController::new(config.inner).py_err()?,
        })
    }

    /// Reserves `memory` bytes and `bandwidth` for `task_id` (Burstable may burst to
    /// `memory_limit`); returns the decision (rejections are decisions, not exceptions).
    #[pyo3(signature = (task_id, memory, bandwidth = 0.0, qos = None, memory_limit = None))]
    fn try_admit(
        &self,
        py: Python<'_>,
        task_id: &str,
        memory: i128,
        bandwidth: f64,
        qos: Option<&Bound<'_, PyAny>>,
        memory_limit: Option<i128>,
    ) -> PyResult<PyAdmissionDecision> {
        let default = pyo3::types::PyString::new(py, "burstable");
        let req = request(
            qos.unwrap_or(default.as_any()),
            memory,
            bandwidth,
            memory_limit,
        )?;
        Ok(self.inner.try_admit(task_id, &req).py_err()?.into())
    }

    /// What `try_admit` would decide now, without reserving.
    #[pyo3(signature = (memory, bandwidth = 0.0, qos = None, memory_limit = None))]
    fn evaluate(
        &self,
        py: Python<'_>,
        memory: i128,
        bandwidth: f64,
        qos: Option<&Bound<'_, PyAny>>,
        memory_limit: Option<i128>,
    ) -> PyResult<PyAdmissionDecision> {
        let default = pyo3::types::PyString::new(py, "burstable");
        let req = request(
            qos.unwrap_or(default.as_any()),
            memory,
            bandwidth,
            memory_limit,
        )?;
        Ok(self.inner.evaluate(&req).py_err()?.into())
    }

    /// Releases `task_id`'s reservation; returns the memory it held.
    fn release(&self, task_id: &str) -> PyResult<u64> {
        Ok(self.inner.release(task_id).py_err()?.memory)
    }

    /// Counts one more waiting task; raises AdmissionRejectedError (queue_full) at the limit.
    fn enqueue(&self) -> PyResult<()> {
        self.inner
            .enqueue()
            .map_err(pygpukit_sched::SchedError::Rejected)
            .py_err()
    }

    /// Counts one waiting task less.
    fn dequeue(&self) {
        self.inner.dequeue();
    }

    /// Counters and usage.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        stats_dict(py, &self.inner.stats())
    }
}
