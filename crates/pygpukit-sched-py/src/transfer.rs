//! AsyncTransferEngine: prioritized H2D / D2H / D2D copies on dedicated streams.

use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use pygpukit_sched::device::CopyKind;
use pygpukit_sched::transfer::{AsyncTransferEngine, HostBuffer, TransferInfo};

use crate::capi;
use crate::errors::{invalid, IntoPy};
use crate::qos::bytes_arg;

fn kind_arg(kind: &str) -> PyResult<CopyKind> {
    match kind {
        "h2d" => Ok(CopyKind::HostToDevice),
        "d2h" => Ok(CopyKind::DeviceToHost),
        "d2d" => Ok(CopyKind::DeviceToDevice),
        other => Err(invalid(format!(
            "kind must be 'h2d', 'd2h' or 'd2d', got {other:?}"
        ))),
    }
}

fn info_dict<'py>(py: Python<'py>, t: &TransferInfo) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("id", t.id)?;
    d.set_item("kind", t.kind.name())?;
    d.set_item("nbytes", t.nbytes)?;
    d.set_item("priority", t.priority)?;
    d.set_item("state", t.state.name())?;
    d.set_item("start_ms", t.timeline.map(|x| x.0))?;
    d.set_item("end_ms", t.timeline.map(|x| x.1))?;
    d.set_item("error", t.error.as_deref())?;
    Ok(d)
}

/// Queues copies by priority (higher first) and runs them on one stream per direction, at most
/// `max_concurrent` in flight per direction, so they overlap compute on other streams. Copies in
/// one direction run in order; different directions are not ordered with each other (wait for a
/// transfer before queueing one that reads what it writes). Device addresses are plain integers
/// (e.g. GPUArray.device_ptr); `backend` as for MemoryPool.
#[pyclass(name = "AsyncTransferEngine", module = "_pygpukit_rust", frozen)]
pub struct PyAsyncTransferEngine {
    inner: Arc<AsyncTransferEngine>,
}

#[pymethods]
impl PyAsyncTransferEngine {
    #[new]
    #[pyo3(signature = (max_concurrent = 4, *, backend = "auto"))]
    fn new(py: Python<'_>, max_concurrent: i64, backend: &str) -> PyResult<Self> {
        let device = capi::resolve(py, backend)?;
        let n = usize::try_from(max_concurrent).map_err(|_| {
            invalid(format!(
                "invalid max_concurrent: {max_concurrent} (must be in [1, 1024])"
            ))
        })?;
        Ok(Self {
            inner: Arc::new(AsyncTransferEngine::new(device, n).py_err()?),
        })
    }

    /// Copies `data` to device address `dst` (the bytes are copied first, so `data` may be
    /// reused at once); returns the transfer id.
    #[pyo3(signature = (dst, data, priority = 0))]
    fn enqueue_h2d(&self, dst: u64, data: &Bound<'_, PyBytes>, priority: i32) -> PyResult<u64> {
        let buf: Box<dyn HostBuffer> = Box::new(data.as_bytes().to_vec());
        self.inner.enqueue_h2d(dst, buf, priority).py_err()
    }

    /// Copies `nbytes` from device address `src` into an engine-owned host buffer; fetch the
    /// bytes with `result(id)` once done.
    #[pyo3(signature = (src, nbytes, priority = 0))]
    fn enqueue_d2h(&self, src: u64, nbytes: i128, priority: i32) -> PyResult<u64> {
        let n = usize::try_from(bytes_arg("nbytes", nbytes)?)
            .map_err(|_| invalid("nbytes does not fit host memory"))?;
        self.inner
            .enqueue_d2h(Box::new(vec![0u8; n]), src, priority)
            .py_err()
    }

    /// Copies `nbytes` from device address `src` to device address `dst`.
    #[pyo3(signature = (dst, src, nbytes, priority = 0))]
    fn enqueue_d2d(&self, dst: u64, src: u64, nbytes: i128, priority: i32) -> PyResult<u64> {
        self.inner
            .enqueue_d2d(dst, src, bytes_arg("nbytes", nbytes)?, priority)
            .py_err()
    }

    /// Copies between raw addresses: `kind` is "h2d", "d2h" or "d2d". For host addresses (e.g.
    /// pinned memory, whose copies are truly asynchronous) the caller must keep the memory alive
    /// and untouched until the transfer is done.
    #[pyo3(signature = (kind, dst, src, nbytes, priority = 0))]
    fn enqueue_ptr(
        &self,
        kind: &str,
        dst: u64,
        src: u64,
        nbytes: i128,
        priority: i32,
    ) -> PyResult<u64> {
        let kind = kind_arg(kind)?;
        let n = bytes_arg("nbytes", nbytes)?;
        if kind != CopyKind::DeviceToDevice && (dst == 0 || src == 0) {
            return Err(invalid("host and device addresses must not be 0"));
        }
        // SAFETY: the documented contract: the caller keeps the host memory valid until done.
        unsafe { self.inner.enqueue(kind, dst, src, n, priority, None) }.py_err()
    }

    /// Retires finished copies and starts queued ones.
    fn poll(&self) {
        self.inner.poll();
    }

    /// Id, kind, nbytes, priority, state ("queued", "in_flight", "completed", "failed",
    /// "cancelled"), start_ms / end_ms on the device timeline, and error of `transfer_id`.
    fn status<'py>(&self, py: Python<'py>, transfer_id: u64) -> PyResult<Bound<'py, PyDict>> {
        info_dict(py, &self.inner.status(transfer_id).py_err()?)
    }

    /// Waits (without holding the GIL) until `transfer_id` is finished; returns its state.
    fn wait(&self, py: Python<'_>, transfer_id: u64) -> PyResult<&'static str> {
        let engine = self.inner.clone();
        Ok(py.detach(move || engine.wait(transfer_id)).py_err()?.name())
    }

    /// Waits until every queued and in-flight copy is finished.
    fn synchronize(&self, py: Python<'_>) -> PyResult<()> {
        let engine = self.inner.clone();
        py.detach(move || engine.synchronize()).py_err()
    }

    /// Cancels a queued transfer.
    fn cancel(&self, transfer_id: u64) -> PyResult<()> {
        self.inner.cancel(transfer_id).py_err()
    }

    /// The bytes of a completed `enqueue_d2h` transfer (handed out once).
    fn result<'py>(&self, py: Python<'py>, transfer_id: u64) -> PyResult<Bound<'py, PyBytes>> {
        let buf = self.inner.take_buffer(transfer_id).py_err()?;
        // SAFETY: the buffer is a Vec<u8> owned by `buf` (HostBuffer contract), alive here.
        let bytes = unsafe { std::slice::from_raw_parts(buf.addr() as *const u8, buf.len()) };
        Ok(PyBytes::new(py, bytes))
    }

    /// The stream handle of direction `kind` ("h2d", "d2h", "d2d").
    fn stream(&self, kind: &str) -> PyResult<u64> {
        Ok(self.inner.stream(kind_arg(kind)?))
    }

    /// Milliseconds from the engine's reference event to `event` (a completed timing event of
    /// the same device), to put other work on the transfers' timeline.
    fn event_time_ms(&self, event: u64) -> PyResult<f64> {
        self.inner.event_time_ms(event).py_err()
    }

    /// Per direction: queued, in_flight, completed, failed, bytes, busy_ms, bandwidth (bytes/s).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for kind in CopyKind::ALL {
            let s = self.inner.lane_stats(kind);
            let l = PyDict::new(py);
            l.set_item("queued", s.queued)?;
            l.set_item("in_flight", s.in_flight)?;
            l.set_item("completed", s.completed)?;
            l.set_item("failed", s.failed)?;
            l.set_item("bytes", s.bytes)?;
            l.set_item("busy_ms", s.busy_ms)?;
            l.set_item("bandwidth", s.bandwidth())?;
            d.set_item(kind.name(), l)?;
        }
        Ok(d)
    }

    /// Forgets finished transfers; returns how many.
    fn prune_finished(&self) -> usize {
        self.inner.prune_finished()
    }

    /// The most copies in flight per direction.
    #[getter]
    fn max_concurrent(&self) -> usize {
        self.inner.max_concurrent()
    }
}
