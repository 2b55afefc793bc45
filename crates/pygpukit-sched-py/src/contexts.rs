//! Execution-context budgets: the registry that admits contexts and the per-context budget that
//! pygpukit-core's allocation path charges (the AllocationScope protocol: `charge`, `refund`).

use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::PyDict;

use pygpukit_sched::contexts::{ContextBudget, ContextRegistry, ContextUsage, PartitionLink};
use pygpukit_sched::qos::QosClass;

use crate::errors::{charge_error, IntoPy};
use crate::partition::PyPartitionManager;
use crate::qos::bytes_arg;

/// Admits execution contexts against a capacity (Guaranteed ones reserve their budget) and keeps
/// their budgets; thread-safe. pygpukit.scheduler orchestrates it.
#[pyclass(name = "ContextRegistry", module = "_pygpukit_rust", frozen)]
pub struct PyContextRegistry {
    inner: ContextRegistry,
}

/// One context's budget and counters. It is an allocation scope: `charge(nbytes)` raises
/// `BudgetExceededError` (or `ContextError` once destroyed) and charges nothing when refused.
#[pyclass(name = "ContextBudget", module = "_pygpukit_rust", frozen)]
pub struct PyContextBudget {
    inner: Arc<ContextBudget>,
}

fn usage_dict<'py>(py: Python<'py>, u: ContextUsage) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("name", u.name)?;
    d.set_item("qos", u.class.name())?;
    d.set_item("priority", u.priority)?;
    d.set_item("max_vram", u.limit)?;
    d.set_item("used_bytes", u.used)?;
    d.set_item("peak_bytes", u.peak)?;
    d.set_item("allocations", u.allocations)?;
    d.set_item("refused", u.refused)?;
    d.set_item("partition", u.partition)?;
    Ok(d)
}

#[pymethods]
impl PyContextRegistry {
    #[new]
    fn new(capacity: i128) -> PyResult<Self> {
        Ok(Self {
            inner: ContextRegistry::new(bytes_arg("capacity", capacity)?).py_err()?,
        })
    }

    /// Admits context `name` (`qos`: "guaranteed", "burstable" or "best_effort") with a budget of
    /// `max_vram` bytes, optionally bound to partition `partition_id` of `manager` (its charges
    /// must then fit the partition too). Raises DuplicateIdError, AdmissionRejectedError (reason
    /// kinds "exceeds_capacity", "insufficient_memory", "partition_limit"), UnknownIdError (no
    /// such partition) or InvalidArgumentError.
    #[pyo3(signature = (name, qos, max_vram, priority = 0, manager = None, partition_id = None))]
    fn admit(
        &self,
        name: &str,
        qos: &str,
        max_vram: i128,
        priority: i64,
        manager: Option<PyRef<'_, PyPartitionManager>>,
        partition_id: Option<&str>,
    ) -> PyResult<PyContextBudget> {
        let class = QosClass::parse(qos).py_err()?;
        let link = match (manager, partition_id) {
            (Some(m), Some(id)) => Some(PartitionLink {
                manager: m.inner.clone(),
                partition: id.to_string(),
            }),
            (None, None) => None,
            _ => {
                return Err(crate::errors::invalid(
                    "admit needs both manager and partition_id, or neither",
                ))
            }
        };
        let limit = bytes_arg("max_vram", max_vram)?;
        Ok(PyContextBudget {
            inner: self
                .inner
                .admit(name, class, limit, priority, link)
                .py_err()?,
        })
    }

    /// The live context `name` (UnknownIdError when there is none).
    fn get(&self, name: &str) -> PyResult<PyContextBudget> {
        Ok(PyContextBudget {
            inner: self.inner.get(name).py_err()?,
        })
    }

    /// Destroys the live context `name` (only if its serial is `serial`, when given).
    #[pyo3(signature = (name, serial = None))]
    fn destroy(&self, name: &str, serial: Option<u64>) -> PyResult<()> {
        self.inner.destroy(name, serial).py_err()
    }

    /// Destroys every context.
    fn clear(&self) {
        self.inner.clear()
    }

    /// The capacity, bytes.
    #[getter]
    fn capacity(&self) -> u64 {
        self.inner.capacity()
    }

    /// Bytes reserved by Guaranteed contexts.
    #[getter]
    fn reserved(&self) -> u64 {
        self.inner.reserved()
    }

    /// The live contexts, by class, priority (highest first) and name.
    fn contexts(&self) -> Vec<PyContextBudget> {
        self.inner
            .contexts()
            .into_iter()
            .map(|inner| PyContextBudget { inner })
            .collect()
    }
}

#[pymethods]
impl PyContextBudget {
    /// Charges an allocation of `nbytes` (the allocation path of a context session calls this).
    fn charge(&self, nbytes: u64) -> PyResult<()> {
        self.inner
            .charge(nbytes)
            .map_err(|e| charge_error(Some(self.inner.name()), e))
    }

    /// Refunds a freed allocation of `nbytes`.
    fn refund(&self, nbytes: u64) {
        self.inner.refund(nbytes)
    }

    /// Name.
    #[getter]
    fn name(&self) -> &str {
        self.inner.name()
    }

    /// Unique per context object of a registry.
    #[getter]
    fn serial(&self) -> u64 {
        self.inner.serial()
    }

    /// Budget, bytes.
    #[getter]
    fn max_vram(&self) -> u64 {
        self.inner.limit()
    }

    /// Bytes in use.
    #[getter]
    fn used_bytes(&self) -> u64 {
        self.inner.used()
    }

    /// Whether the context was destroyed.
    #[getter]
    fn destroyed(&self) -> bool {
        self.inner.is_destroyed()
    }

    /// Name, qos, priority, max_vram, used_bytes, peak_bytes, allocations, refused, partition.
    fn usage<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        usage_dict(py, self.inner.usage())
    }

    fn __repr__(&self) -> String {
        let u = self.inner.usage();
        format!(
            "ContextBudget({:?}, {}, {} of {} bytes)",
            u.name,
            u.class.name(),
            u.used,
            u.limit
        )
    }
}
