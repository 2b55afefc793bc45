//! KernelDispatcher: per-stream in-flight limits, launch lifecycle, futures resolved by events.

use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::PyDict;

use pygpukit_sched::device::LaunchDims;
use pygpukit_sched::dispatch::{KernelDispatcher, KernelState, LaunchSpec};

use crate::capi;
use crate::errors::{invalid, IntoPy};

/// Where a dispatched request is in its life.
#[pyclass(
    name = "KernelState",
    module = "_pygpukit_rust",
    eq,
    eq_int,
    frozen,
    from_py_object
)]
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum PyKernelState {
    /// Waiting for room on its stream.
    Queued,
    /// Handed to the caller to launch.
    Ready,
    /// On the stream.
    Launched,
    /// Done.
    Completed,
    /// Failed.
    Failed,
    /// Cancelled before launch.
    Cancelled,
}

impl From<KernelState> for PyKernelState {
    fn from(s: KernelState) -> Self {
        match s {
            KernelState::Queued => Self::Queued,
            KernelState::Ready => Self::Ready,
            KernelState::Launched => Self::Launched,
            KernelState::Completed => Self::Completed,
            KernelState::Failed => Self::Failed,
            KernelState::Cancelled => Self::Cancelled,
        }
    }
}

fn dims3(name: &str, v: Vec<u32>) -> PyResult<[u32; 3]> {
    let mut out = [1u32; 3];
    if v.is_empty() || v.len() > 3 {
        return Err(invalid(format!(
            "invalid {name}: {v:?} (give 1 to 3 dimensions)"
        )));
    }
    out[..v.len()].copy_from_slice(&v);
    Ok(out)
}

/// The future of one dispatched request: resolved when the event recorded after its work
/// completes.
#[pyclass(name = "KernelFuture", module = "_pygpukit_rust", frozen)]
pub struct PyKernelFuture {
    dispatcher: Arc<KernelDispatcher>,
    id: u64,
    stream: u64,
}

#[pymethods]
impl PyKernelFuture {
    /// Request id.
    #[getter]
    fn id(&self) -> u64 {
        self.id
    }

    /// Its stream.
    #[getter]
    fn stream(&self) -> u64 {
        self.stream
    }

    /// Current state (completed launches are noticed here).
    fn state(&self) -> PyResult<PyKernelState> {
        Ok(self.dispatcher.state(self.id).py_err()?.into())
    }

    /// True once finished (completed, failed or cancelled).
    fn is_ready(&self) -> PyResult<bool> {
        Ok(self.dispatcher.state(self.id).py_err()?.is_terminal())
    }

    /// Same as `is_ready` (the asyncio/concurrent.futures spelling).
    fn done(&self) -> PyResult<bool> {
        self.is_ready()
    }

    /// Waits (without holding the GIL) until finished; returns the final state. Raises
    /// InvalidTransitionError for caller-launched work not yet marked launched.
    fn wait(&self, py: Python<'_>) -> PyResult<PyKernelState> {
        let d = self.dispatcher.clone();
        let id = self.id;
        Ok(py.detach(move || d.wait(id)).py_err()?.into())
    }

    /// The state if finished, else None.
    fn try_get(&self) -> PyResult<Option<PyKernelState>> {
        let s = self.dispatcher.state(self.id).py_err()?;
        Ok(s.is_terminal().then(|| s.into()))
    }

    /// Cancels the request if it has not been launched.
    fn cancel(&self) -> PyResult<()> {
        self.dispatcher.cancel(self.id).py_err()
    }

    fn __repr__(&self) -> String {
        let state = self
            .dispatcher
            .state(self.id)
            .map(|s| s.name())
            .unwrap_or("forgotten");
        format!(
            "KernelFuture(id={}, stream={:#x}, {state})",
            self.id, self.stream
        )
    }
}

/// Dispatches kernel launches onto streams with at most `max_in_flight` unfinished per stream
/// (streams may set their own limit). `backend` as for MemoryPool.
#[pyclass(name = "KernelDispatcher", module = "_pygpukit_rust", frozen)]
pub struct PyKernelDispatcher {
    inner: Arc<KernelDispatcher>,
}

impl PyKernelDispatcher {
    fn future(&self, id: u64, stream: u64) -> PyKernelFuture {
        PyKernelFuture {
            dispatcher: self.inner.clone(),
            id,
            stream,
        }
    }
}

#[pymethods]
impl PyKernelDispatcher {
    #[new]
    #[pyo3(signature = (max_in_flight = 4, *, backend = "auto"))]
    fn new(py: Python<'_>, max_in_flight: i64, backend: &str) -> PyResult<Self> {
        let device = capi::resolve(py, backend)?;
        let n = usize::try_from(max_in_flight).map_err(|_| {
            invalid(format!(
                "invalid max_in_flight: {max_in_flight} (must be in [1, 65536])"
            ))
        })?;
        Ok(Self {
            inner: Arc::new(KernelDispatcher::new(device, n).py_err()?),
        })
    }

    /// Creates a stream owned by the dispatcher (destroyed with it); returns its handle.
    #[pyo3(signature = (priority = 0, max_in_flight = None))]
    fn create_stream(&self, priority: i32, max_in_flight: Option<usize>) -> PyResult<u64> {
        let limit = max_in_flight.unwrap_or_else(|| self.inner.default_limit());
        self.inner.create_stream(priority, limit).py_err()
    }

    /// Sets `stream`'s in-flight limit.
    fn set_limit(&self, stream: u64, max_in_flight: usize) -> PyResult<()> {
        self.inner.set_limit(stream, max_in_flight).py_err()
    }

    /// Queues a kernel launch on `stream`: `function` is a CUfunction handle, `params` the
    /// packed argument bytes and `offsets` each argument's offset in them (as JITKernel's
    /// pack_arguments gives). Returns its future.
    #[pyo3(signature = (stream, function, grid, block, params, offsets, shared_mem = 0, priority = 0))]
    #[allow(clippy::too_many_arguments)]
    fn submit(
        &self,
        stream: u64,
        function: u64,
        grid: Vec<u32>,
        block: Vec<u32>,
        params: Vec<u8>,
        offsets: Vec<u32>,
        shared_mem: u32,
        priority: i32,
    ) -> PyResult<PyKernelFuture> {
        let spec = LaunchSpec {
            function,
            dims: LaunchDims {
                grid: dims3("grid", grid)?,
                block: dims3("block", block)?,
                shared_bytes: shared_mem,
            },
            params,
            offsets,
        };
        let id = self.inner.submit(stream, Some(spec), priority).py_err()?;
        Ok(self.future(id, stream))
    }

    /// Queues work the caller launches itself: `get_ready` hands it out when the stream has
    /// room; launch it on the stream, then call `mark_launched(id)`.
    #[pyo3(signature = (stream, priority = 0))]
    fn queue(&self, stream: u64, priority: i32) -> PyResult<PyKernelFuture> {
        let id = self.inner.submit(stream, None, priority).py_err()?;
        Ok(self.future(id, stream))
    }

    /// Up to `max_count` caller-launched requests that have room now, as (id, stream) pairs.
    #[pyo3(signature = (max_count = None))]
    fn get_ready(&self, max_count: Option<usize>) -> Vec<(u64, u64)> {
        self.inner.get_ready(max_count.unwrap_or(usize::MAX))
    }

    /// Records that Ready request `request_id` was launched (an event is recorded on its stream).
    fn mark_launched(&self, request_id: u64) -> PyResult<()> {
        self.inner.mark_launched(request_id).py_err()
    }

    /// Reports that launched `request_id` completed.
    fn completed(&self, request_id: u64) -> PyResult<()> {
        self.inner.completed(request_id).py_err()
    }

    /// Reports that `request_id` failed.
    #[pyo3(signature = (request_id, error = "failed"))]
    fn failed(&self, request_id: u64, error: &str) -> PyResult<()> {
        self.inner.failed(request_id, error).py_err()
    }

    /// Cancels `request_id` before launch.
    fn cancel(&self, request_id: u64) -> PyResult<()> {
        self.inner.cancel(request_id).py_err()
    }

    /// Retires completed launches, fills free slots; returns how many requests are unfinished.
    fn poll(&self) -> usize {
        self.inner.poll()
    }

    /// State of `request_id`.
    fn state(&self, request_id: u64) -> PyResult<PyKernelState> {
        Ok(self.inner.state(request_id).py_err()?.into())
    }

    /// Waits (without the GIL) until `request_id` is finished; returns its state.
    fn wait(&self, py: Python<'_>, request_id: u64) -> PyResult<PyKernelState> {
        let d = self.inner.clone();
        Ok(py.detach(move || d.wait(request_id)).py_err()?.into())
    }

    /// Id, stream, priority, state, error and launch/completion delays (ns) of `request_id`.
    fn info<'py>(&self, py: Python<'py>, request_id: u64) -> PyResult<Bound<'py, PyDict>> {
        let i = self.inner.info(request_id).py_err()?;
        let d = PyDict::new(py);
        d.set_item("id", i.id)?;
        d.set_item("stream", i.stream)?;
        d.set_item("priority", i.priority)?;
        d.set_item("state", PyKernelState::from(i.state))?;
        d.set_item("error", i.error)?;
        d.set_item("launch_delay_ns", i.launch_delay_ns)?;
        d.set_item("completion_ns", i.completion_ns)?;
        Ok(d)
    }

    /// Limit, queued, in_flight, peak_in_flight, launched, completed, failed, cancelled of
    /// `stream`.
    fn stream_stats<'py>(&self, py: Python<'py>, stream: u64) -> PyResult<Bound<'py, PyDict>> {
        let s = self.inner.stream_stats(stream).py_err()?;
        let d = PyDict::new(py);
        d.set_item("limit", s.limit)?;
        d.set_item("queued", s.queued)?;
        d.set_item("in_flight", s.in_flight)?;
        d.set_item("peak_in_flight", s.peak_in_flight)?;
        d.set_item("launched", s.launched)?;
        d.set_item("completed", s.completed)?;
        d.set_item("failed", s.failed)?;
        d.set_item("cancelled", s.cancelled)?;
        Ok(d)
    }

    /// Streams known to the dispatcher.
    fn streams(&self) -> Vec<u64> {
        self.inner.streams()
    }

    /// Forgets finished requests; returns how many.
    fn prune_finished(&self) -> usize {
        self.inner.prune_finished()
    }
}
