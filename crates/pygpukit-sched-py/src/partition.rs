//! GPU partitions: configuration, limits and the manager.

use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::PyDict;

use pygpukit_sched::contexts::{partition_error, PartitionLink};
use pygpukit_sched::partition::{PartitionConfig, PartitionLimits, PartitionManager};

use crate::errors::{charge_error, invalid, IntoPy};
use crate::qos::bytes_arg;

/// Device totals and the overcommit rule of a PartitionManager.
#[pyclass(name = "PartitionConfig", module = "_pygpukit_rust", frozen)]
pub struct PyPartitionConfig {
    inner: PartitionConfig,
}

#[pymethods]
impl PyPartitionConfig {
    #[new]
    #[pyo3(signature = (total_memory, allow_overcommit = false, overcommit_ratio = 1.0))]
    fn new(total_memory: i128, allow_overcommit: bool, overcommit_ratio: f64) -> PyResult<Self> {
        Ok(Self {
            inner: PartitionConfig {
                total_memory: bytes_arg("total_memory", total_memory)?,
                allow_overcommit,
                overcommit_ratio,
            },
        })
    }

    /// Device memory, bytes.
    #[getter]
    fn total_memory(&self) -> u64 {
        self.inner.total_memory
    }

    /// Whether limits may add up to more than the device.
    #[getter]
    fn allow_overcommit(&self) -> bool {
        self.inner.allow_overcommit
    }

    /// How far limits may add up beyond the device with overcommit.
    #[getter]
    fn overcommit_ratio(&self) -> f64 {
        self.inner.overcommit_ratio
    }
}

/// A partition's limits, built by chaining: `PartitionLimits().memory(4 * GB).compute(0.5)`.
/// Each call returns a new object.
#[pyclass(name = "PartitionLimits", module = "_pygpukit_rust", frozen)]
pub struct PyPartitionLimits {
    inner: PartitionLimits,
}

#[pymethods]
impl PyPartitionLimits {
    #[new]
    fn new() -> Self {
        Self {
            inner: PartitionLimits::new(),
        }
    }

    /// With a memory limit in bytes.
    fn memory(&self, bytes: i128) -> PyResult<Self> {
        Ok(Self {
            inner: self.inner.memory(bytes_arg("memory", bytes)?),
        })
    }

    /// With a compute share in [0, 1].
    fn compute(&self, share: f64) -> Self {
        Self {
            inner: self.inner.compute(share),
        }
    }

    /// With a bandwidth share in [0, 1].
    fn bandwidth(&self, share: f64) -> Self {
        Self {
            inner: self.inner.bandwidth(share),
        }
    }

    /// With a limit on streams used at once.
    fn streams(&self, max_streams: i64) -> PyResult<Self> {
        let n = u32::try_from(max_streams).map_err(|_| {
            invalid(format!(
                "invalid max_streams: {max_streams} (must be in [1, 2**32 - 1])"
            ))
        })?;
        Ok(Self {
            inner: self.inner.streams(n),
        })
    }

    /// Memory limit, bytes.
    #[getter]
    fn memory_bytes(&self) -> u64 {
        self.inner.memory
    }

    /// Compute share.
    #[getter]
    fn compute_share(&self) -> f64 {
        self.inner.compute_share
    }

    /// Bandwidth share.
    #[getter]
    fn bandwidth_share(&self) -> f64 {
        self.inner.bandwidth_share
    }

    /// Stream limit.
    #[getter]
    fn max_streams(&self) -> u32 {
        self.inner.max_streams
    }

    fn __repr__(&self) -> String {
        format!(
            "PartitionLimits(memory={}, compute={}, bandwidth={}, max_streams={})",
            self.inner.memory,
            self.inner.compute_share,
            self.inner.bandwidth_share,
            self.inner.max_streams
        )
    }
}

/// Creates partitions, assigns tasks and enforces their limits; thread-safe.
#[pyclass(name = "PartitionManager", module = "_pygpukit_rust", frozen)]
pub struct PyPartitionManager {
    pub(crate) inner: Arc<PartitionManager>,
}

#[pymethods]
impl PyPartitionManager {
    #[new]
    fn new(config: PyRef<'_, PyPartitionConfig>) -> PyResult<Self> {
        Ok(Self {
            inner: Arc::new(PartitionManager::new(config.inner).py_err()?),
        })
    }

    /// Creates partition `partition_id` (limits must fit beside the others).
    fn create_partition(
        &self,
        partition_id: &str,
        name: &str,
        limits: PyRef<'_, PyPartitionLimits>,
    ) -> PyResult<()> {
        self.inner
            .create_partition(partition_id, name, limits.inner)
            .py_err()
    }

    /// Replaces partition `partition_id`'s limits (current use must fit them).
    fn update_limits(
        &self,
        partition_id: &str,
        limits: PyRef<'_, PyPartitionLimits>,
    ) -> PyResult<()> {
        self.inner
            .update_limits(partition_id, limits.inner)
            .py_err()
    }

    /// Deletes an unused partition.
    fn delete_partition(&self, partition_id: &str) -> PyResult<()> {
        self.inner.delete_partition(partition_id).py_err()
    }

    /// Makes `partition_id` the partition of unassigned tasks.
    fn set_default(&self, partition_id: &str) -> PyResult<()> {
        self.inner.set_default(partition_id).py_err()
    }

    /// The default partition, if any.
    #[getter]
    fn default_partition(&self) -> Option<String> {
        self.inner.default_partition()
    }

    /// Assigns `task_id` to `partition_id`.
    fn assign_task(&self, task_id: &str, partition_id: &str) -> PyResult<()> {
        self.inner.assign_task(task_id, partition_id).py_err()
    }

    /// Removes `task_id`'s assignment.
    fn unassign_task(&self, task_id: &str) -> PyResult<()> {
        self.inner.unassign_task(task_id).py_err()
    }

    /// The partition of `task_id` (its assignment, else the default).
    fn partition_of(&self, task_id: &str) -> Option<String> {
        self.inner.partition_of(task_id)
    }

    /// Reserves `nbytes` in `partition_id` (within its limit and the device).
    fn reserve_memory(&self, partition_id: &str, nbytes: i128) -> PyResult<()> {
        self.inner
            .reserve_memory(partition_id, bytes_arg("nbytes", nbytes)?)
            .py_err()
    }

    /// Releases `nbytes` reserved in `partition_id`.
    fn release_memory(&self, partition_id: &str, nbytes: i128) -> PyResult<()> {
        self.inner
            .release_memory(partition_id, bytes_arg("nbytes", nbytes)?)
            .py_err()
    }

    /// An allocation scope charging to `partition_id`: `charge(nbytes)` reserves within its limit
    /// (and the device), raising `BudgetExceededError` when refused; `refund(nbytes)` releases.
    /// pygpukit.scheduler's `partition_session` makes it the allocation scope of real allocations.
    fn scope(&self, partition_id: &str) -> PyResult<PyPartitionScope> {
        self.inner.partition(partition_id).py_err()?;
        Ok(PyPartitionScope {
            link: PartitionLink {
                manager: self.inner.clone(),
                partition: partition_id.to_string(),
            },
        })
    }

    /// Takes one of `partition_id`'s streams.
    fn acquire_stream(&self, partition_id: &str) -> PyResult<()> {
        self.inner.acquire_stream(partition_id).py_err()
    }

    /// Gives one of `partition_id`'s streams back.
    fn release_stream(&self, partition_id: &str) -> PyResult<()> {
        self.inner.release_stream(partition_id).py_err()
    }

    /// Limits and usage of `partition_id`.
    fn get_partition<'py>(
        &self,
        py: Python<'py>,
        partition_id: &str,
    ) -> PyResult<Bound<'py, PyDict>> {
        let p = self.inner.partition(partition_id).py_err()?;
        let d = PyDict::new(py);
        d.set_item("id", p.id)?;
        d.set_item("name", p.name)?;
        d.set_item("memory_limit", p.limits.memory)?;
        d.set_item("compute_share", p.limits.compute_share)?;
        d.set_item("bandwidth_share", p.limits.bandwidth_share)?;
        d.set_item("max_streams", p.limits.max_streams)?;
        d.set_item("memory_used", p.memory_used)?;
        d.set_item("streams_used", p.streams_used)?;
        d.set_item("tasks", p.tasks)?;
        Ok(d)
    }

    /// Ids of all partitions, sorted.
    fn partition_ids(&self) -> Vec<String> {
        self.inner.partition_ids()
    }

    /// Totals across partitions.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.inner.stats();
        let d = PyDict::new(py);
        d.set_item("partitions", s.partitions)?;
        d.set_item("memory_limits", s.memory_limits)?;
        d.set_item("compute_shares", s.compute_shares)?;
        d.set_item("bandwidth_shares", s.bandwidth_shares)?;
        d.set_item("memory_used", s.memory_used)?;
        d.set_item("total_memory", s.total_memory)?;
        d.set_item("assigned_tasks", s.assigned_tasks)?;
        Ok(d)
    }
}

/// Charges real allocations to one partition of a PartitionManager (pygpukit-core's
/// AllocationScope protocol); from `PartitionManager.scope(partition_id)`.
#[pyclass(name = "PartitionScope", module = "_pygpukit_rust", frozen)]
pub struct PyPartitionScope {
    link: PartitionLink,
}

#[pymethods]
impl PyPartitionScope {
    /// Reserves `nbytes` in the partition; `BudgetExceededError` (nothing reserved) when its limit
    /// or the device would be exceeded.
    fn charge(&self, nbytes: u64) -> PyResult<()> {
        match self
            .link
            .manager
            .reserve_memory(&self.link.partition, nbytes)
        {
            Ok(()) => Ok(()),
            Err(err) => Err(charge_error(None, partition_error(&self.link, nbytes, err))),
        }
    }

    /// Releases `nbytes` (a deleted partition has nothing left to release).
    fn refund(&self, nbytes: u64) {
        let _ = self
            .link
            .manager
            .release_memory(&self.link.partition, nbytes);
    }

    /// The partition's id.
    #[getter]
    fn partition_id(&self) -> String {
        self.link.partition.clone()
    }

    fn __repr__(&self) -> String {
        format!("PartitionScope({:?})", self.link.partition)
    }
}
