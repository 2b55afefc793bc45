//! QoS classes, QoS task descriptions and the QoS policy evaluator.

use pyo3::prelude::*;
use pyo3::types::PyDict;

use pygpukit_sched::qos::{QosClass, QosPolicy, QosPolicyEvaluator, QosTaskMeta};

use crate::admission::PyAdmissionDecision;
use crate::errors::{invalid, IntoPy};

/// QoS class of a task: Guaranteed (reserved capacity, never preempted), Burstable (a request plus
/// an opportunistic burst) or BestEffort (whatever is free; preemptible).
#[pyclass(
    name = "QosClass",
    module = "_pygpukit_rust",
    eq,
    eq_int,
    frozen,
    from_py_object
)]
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum PyQosClass {
    /// Reserved capacity; admitted first; never preempted.
    Guaranteed,
    /// A guaranteed request plus a burst up to a limit.
    Burstable,
    /// Whatever is free; preemptible.
    BestEffort,
}

impl From<PyQosClass> for QosClass {
    fn from(c: PyQosClass) -> Self {
        match c {
            PyQosClass::Guaranteed => QosClass::Guaranteed,
            PyQosClass::Burstable => QosClass::Burstable,
            PyQosClass::BestEffort => QosClass::BestEffort,
        }
    }
}

impl From<QosClass> for PyQosClass {
    fn from(c: QosClass) -> Self {
        match c {
            QosClass::Guaranteed => PyQosClass::Guaranteed,
            QosClass::Burstable => PyQosClass::Burstable,
            QosClass::BestEffort => PyQosClass::BestEffort,
        }
    }
}

#[pymethods]
impl PyQosClass {
    /// Name as used in reports: "guaranteed", "burstable" or "best_effort".
    #[getter]
    fn label(&self) -> &'static str {
        QosClass::from(*self).name()
    }
}

/// Accepts a QosClass or one of its names.
pub fn extract_class(value: &Bound<'_, PyAny>) -> PyResult<QosClass> {
    if let Ok(c) = value.extract::<PyQosClass>() {
        return Ok(c.into());
    }
    let text: String = value.extract().map_err(|_| {
        invalid("qos must be a QosClass or one of 'guaranteed', 'burstable', 'best_effort'")
    })?;
    QosClass::parse(&text).py_err()
}

fn check_bytes(name: &str, value: i128) -> PyResult<u64> {
    u64::try_from(value)
        .ok()
        .filter(|v| *v <= i64::MAX as u64)
        .ok_or_else(|| {
            invalid(format!(
                "invalid {name}: {value} (must be in [0, 2**63 - 1] bytes)"
            ))
        })
}

/// Converts a Python int of bytes, refusing negative and oversized values with a clear error.
pub fn bytes_arg(name: &str, value: i128) -> PyResult<u64> {
    check_bytes(name, value)
}

/// A task as the QoS evaluator sees it; build it with `guaranteed`, `burstable` or `best_effort`.
#[pyclass(name = "QosTaskMeta", module = "_pygpukit_rust", frozen)]
pub struct PyQosTaskMeta {
    pub(crate) inner: QosTaskMeta,
}

#[pymethods]
impl PyQosTaskMeta {
    /// A Guaranteed task needing `memory` bytes (and `bandwidth`).
    #[staticmethod]
    #[pyo3(signature = (id, name, memory, bandwidth = 0.0))]
    fn guaranteed(id: String, name: String, memory: i128, bandwidth: f64) -> PyResult<Self> {
        let m = bytes_arg("memory", memory)?;
        Ok(Self {
            inner: QosTaskMeta::guaranteed(id, name, m).with_bandwidth(bandwidth, bandwidth),
        })
    }

    /// A Burstable task needing `memory` bytes and allowed to burst to `memory_limit` (default:
    /// twice `memory`).
    #[staticmethod]
    #[pyo3(signature = (id, name, memory, memory_limit = None, bandwidth = 0.0, bandwidth_limit = None))]
    fn burstable(
        id: String,
        name: String,
        memory: i128,
        memory_limit: Option<i128>,
        bandwidth: f64,
        bandwidth_limit: Option<f64>,
    ) -> PyResult<Self> {
        let m = bytes_arg("memory", memory)?;
        let limit = match memory_limit {
            Some(l) => bytes_arg("memory_limit", l)?,
            None => m.saturating_mul(2),
        };
        if limit < m {
            return Err(invalid(format!(
                "invalid memory_limit: {limit} (must be at least memory, {m})"
            )));
        }
        Ok(Self {
            inner: QosTaskMeta::burstable(id, name, m, limit)
                .with_bandwidth(bandwidth, bandwidth_limit.unwrap_or(bandwidth)),
        })
    }

    /// A BestEffort task wanting `memory` bytes (and `bandwidth`).
    #[staticmethod]
    #[pyo3(signature = (id, name, memory = 0, bandwidth = 0.0))]
    fn best_effort(id: String, name: String, memory: i128, bandwidth: f64) -> PyResult<Self> {
        let m = bytes_arg("memory", memory)?;
        Ok(Self {
            inner: QosTaskMeta::best_effort(id, name, m).with_bandwidth(bandwidth, bandwidth),
        })
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

    /// QoS class.
    #[getter]
    fn qos_class(&self) -> PyQosClass {
        self.inner.class.into()
    }

    /// Memory needed, bytes.
    #[getter]
    fn memory(&self) -> u64 {
        self.inner.memory
    }

    /// Memory allowed at most, bytes.
    #[getter]
    fn memory_limit(&self) -> u64 {
        self.inner.memory_limit
    }

    /// Bandwidth needed.
    #[getter]
    fn bandwidth(&self) -> f64 {
        self.inner.bandwidth
    }

    fn __repr__(&self) -> String {
        format!(
            "QosTaskMeta({:?}, {:?}, {}, memory={}, bandwidth={})",
            self.inner.id,
            self.inner.name,
            self.inner.class,
            self.inner.memory,
            self.inner.bandwidth
        )
    }
}

/// Admits QoS tasks against memory and bandwidth under the class rules; thread-safe.
#[pyclass(name = "QosPolicyEvaluator", module = "_pygpukit_rust", frozen)]
pub struct PyQosPolicyEvaluator {
    inner: QosPolicyEvaluator,
}

#[pymethods]
impl PyQosPolicyEvaluator {
    #[new]
    #[pyo3(signature = (total_memory, total_bandwidth = 1.0, *, guaranteed_share = 0.5, burst_share = 0.25))]
    fn new(
        total_memory: i128,
        total_bandwidth: f64,
        guaranteed_share: f64,
        burst_share: f64,
    ) -> PyResult<Self> {
        let policy = QosPolicy {
            guaranteed_share,
            burst_share,
        };
        let inner = QosPolicyEvaluator::with_policy(
            bytes_arg("total_memory", total_memory)?,
            total_bandwidth,
            policy,
        )
        .py_err()?;
        Ok(Self { inner })
    }

    /// What reserving `task` now would do (nothing is reserved).
    fn evaluate(&self, task: PyRef<'_, PyQosTaskMeta>) -> PyResult<PyAdmissionDecision> {
        Ok(self.inner.evaluate(&task.inner).py_err()?.decision.into())
    }

    /// Reserves for `task`, preempting best-effort tasks when needed and allowed; the decision
    /// lists them.
    fn reserve(&self, task: PyRef<'_, PyQosTaskMeta>) -> PyResult<PyAdmissionDecision> {
        Ok(self.inner.reserve(&task.inner).py_err()?.decision.into())
    }

    /// Releases `task_id`'s reservation.
    fn release(&self, task_id: &str) -> PyResult<()> {
        self.inner.release(task_id).py_err()
    }

    /// Usage per class.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.inner.stats();
        let d = PyDict::new(py);
        d.set_item("total_memory", s.total_memory)?;
        d.set_item("total_bandwidth", s.total_bandwidth)?;
        d.set_item("guaranteed_reserve", s.guaranteed_memory)?;
        d.set_item("active_tasks", s.active_tasks)?;
        d.set_item("preempted", s.preempted)?;
        let (memory, bandwidth) = (PyDict::new(py), PyDict::new(py));
        for (i, class) in QosClass::ALL.iter().enumerate() {
            memory.set_item(class.name(), s.memory_by_class[i])?;
            bandwidth.set_item(class.name(), s.bandwidth_by_class[i])?;
        }
        d.set_item("memory_by_class", memory)?;
        d.set_item("bandwidth_by_class", bandwidth)?;
        Ok(d)
    }
}
