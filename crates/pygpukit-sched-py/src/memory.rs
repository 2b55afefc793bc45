//! MemoryPool: device blocks under a quota with LRU eviction to host memory.

use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use pygpukit_sched::memory::MemoryPool;

use crate::capi;
use crate::errors::{invalid, IntoPy};
use crate::qos::bytes_arg;

/// Device blocks under a quota; with `enable_eviction`, least recently used blocks are copied to
/// host memory and freed to make room, and `restore` brings them back (at a new address).
/// `backend`: "auto" (CUDA when pygpukit uses it, else host memory), "cuda" or "host".
#[pyclass(name = "MemoryPool", module = "_pygpukit_rust", frozen)]
pub struct PyMemoryPool {
    inner: Arc<MemoryPool>,
}

#[pymethods]
impl PyMemoryPool {
    #[new]
    #[pyo3(signature = (quota, enable_eviction = true, *, backend = "auto"))]
    fn new(py: Python<'_>, quota: i128, enable_eviction: bool, backend: &str) -> PyResult<Self> {
        let device = capi::resolve(py, backend)?;
        let quota = bytes_arg("quota", quota)?;
        Ok(Self {
            inner: Arc::new(MemoryPool::new(device, quota, enable_eviction).py_err()?),
        })
    }

    /// Allocates `size` bytes of device memory; returns the block id. Raises QuotaExceededError
    /// when it cannot fit (after eviction, when enabled).
    fn allocate(&self, py: Python<'_>, size: i128) -> PyResult<u64> {
        let size = bytes_arg("size", size)?;
        let pool = self.inner.clone();
        py.detach(move || pool.allocate(size)).py_err()
    }

    /// Frees block `block_id` (resident or evicted).
    fn free(&self, py: Python<'_>, block_id: u64) -> PyResult<()> {
        let pool = self.inner.clone();
        py.detach(move || pool.free(block_id)).py_err()
    }

    /// Marks `block_id` as just used.
    fn touch(&self, block_id: u64) -> PyResult<()> {
        self.inner.touch(block_id).py_err()
    }

    /// Copies `block_id` to host memory and frees its device memory. Work using the block must
    /// be finished first.
    fn evict(&self, py: Python<'_>, block_id: u64) -> PyResult<()> {
        let pool = self.inner.clone();
        py.detach(move || pool.evict(block_id)).py_err()
    }

    /// Brings evicted `block_id` back; returns its new device address.
    fn restore(&self, py: Python<'_>, block_id: u64) -> PyResult<u64> {
        let pool = self.inner.clone();
        py.detach(move || pool.restore(block_id)).py_err()
    }

    /// The device address of resident `block_id`.
    fn device_ptr(&self, block_id: u64) -> PyResult<u64> {
        self.inner.device_ptr(block_id).py_err()
    }

    /// `block_id`'s id, size, device_ptr (None when evicted), resident flag and last_access.
    fn get_block<'py>(&self, py: Python<'py>, block_id: u64) -> PyResult<Bound<'py, PyDict>> {
        let b = self.inner.block(block_id).py_err()?;
        let d = PyDict::new(py);
        d.set_item("id", b.id)?;
        d.set_item("size", b.size)?;
        d.set_item("device_ptr", b.device_ptr)?;
        d.set_item("resident", b.resident)?;
        d.set_item("last_access", b.last_access)?;
        Ok(d)
    }

    /// Copies `data` into resident `block_id` at `offset`.
    #[pyo3(signature = (block_id, data, offset = 0))]
    fn write(
        &self,
        py: Python<'_>,
        block_id: u64,
        data: &Bound<'_, PyBytes>,
        offset: i128,
    ) -> PyResult<()> {
        let offset = bytes_arg("offset", offset)?;
        let bytes = data.as_bytes().to_vec();
        let pool = self.inner.clone();
        py.detach(move || pool.write(block_id, offset, &bytes))
            .py_err()
    }

    /// Reads `size` bytes (to the end when None) of resident `block_id` from `offset`.
    #[pyo3(signature = (block_id, offset = 0, size = None))]
    fn read<'py>(
        &self,
        py: Python<'py>,
        block_id: u64,
        offset: i128,
        size: Option<i128>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let offset = bytes_arg("offset", offset)?;
        let total = self.inner.block(block_id).py_err()?.size;
        let size = match size {
            Some(s) => bytes_arg("size", s)?,
            None => total.checked_sub(offset).ok_or_else(|| {
                invalid(format!(
                    "invalid offset: {offset} (block {block_id} has {total} bytes)"
                ))
            })?,
        };
        let pool = self.inner.clone();
        let bytes = py
            .detach(move || pool.read(block_id, offset, size))
            .py_err()?;
        Ok(PyBytes::new(py, &bytes))
    }

    /// Live block ids: resident ones least recently used first, then evicted ones.
    fn block_ids(&self) -> Vec<u64> {
        self.inner.block_ids()
    }

    /// The quota, bytes.
    #[getter]
    fn quota(&self) -> u64 {
        self.inner.quota()
    }

    /// Whether eviction is enabled.
    #[getter]
    fn enable_eviction(&self) -> bool {
        self.inner.eviction_enabled()
    }

    /// Which device the blocks live on.
    #[getter]
    fn device(&self) -> String {
        self.inner.device().describe()
    }

    /// Usage and counters.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.inner.stats();
        let d = PyDict::new(py);
        d.set_item("quota", s.quota)?;
        d.set_item("used", s.used)?;
        d.set_item("available", s.quota.saturating_sub(s.used))?;
        d.set_item("evicted_bytes", s.evicted_bytes)?;
        d.set_item("blocks", s.blocks)?;
        d.set_item("resident_blocks", s.resident_blocks)?;
        d.set_item("evicted_blocks", s.evicted_blocks)?;
        d.set_item("allocations", s.allocations)?;
        d.set_item("frees", s.frees)?;
        d.set_item("evictions", s.evictions)?;
        d.set_item("restores", s.restores)?;
        d.set_item("device_allocations", s.device_allocations)?;
        Ok(d)
    }
}
