//! Kernel pacing: per-stream token buckets by bandwidth share.

use std::time::Duration;

use pyo3::prelude::*;
use pyo3::types::PyDict;

use pygpukit_sched::pacing::{KernelPacingEngine, PacingConfig, PacingDecision};

use crate::errors::IntoPy;

/// Configuration of a KernelPacingEngine: device bandwidth (cost units per second), bucket size
/// in ms, least time between launches of a stream, and whether to learn the bandwidth.
#[pyclass(name = "PacingConfig", module = "_pygpukit_rust", frozen)]
pub struct PyPacingConfig {
    inner: PacingConfig,
}

#[pymethods]
impl PyPacingConfig {
    #[new]
    #[pyo3(signature = (total_bandwidth = 1.0, window_ms = 100.0, min_interval_ms = 0.0, adaptive = false))]
    fn new(total_bandwidth: f64, window_ms: f64, min_interval_ms: f64, adaptive: bool) -> Self {
        Self {
            inner: PacingConfig {
                total_bandwidth,
                window_ms,
                min_interval_ms,
                adaptive,
            },
        }
    }

    /// Device bandwidth, units/s.
    #[getter]
    fn total_bandwidth(&self) -> f64 {
        self.inner.total_bandwidth
    }

    /// Bucket size, ms of a stream's rate.
    #[getter]
    fn window_ms(&self) -> f64 {
        self.inner.window_ms
    }

    /// Least time between launches of a stream, ms.
    #[getter]
    fn min_interval_ms(&self) -> f64 {
        self.inner.min_interval_ms
    }

    /// Whether the bandwidth is learned from completions.
    #[getter]
    fn adaptive(&self) -> bool {
        self.inner.adaptive
    }
}

/// Whether a launch may go now; true when it may, else `delay_ms` says how long to wait.
#[pyclass(name = "PacingDecision", module = "_pygpukit_rust", frozen)]
pub struct PyPacingDecision {
    delay_ms: f64,
}

impl From<PacingDecision> for PyPacingDecision {
    fn from(d: PacingDecision) -> Self {
        match d {
            PacingDecision::Launch => Self { delay_ms: 0.0 },
            PacingDecision::Wait { delay_ms } => Self { delay_ms },
        }
    }
}

#[pymethods]
impl PyPacingDecision {
    /// True when the launch may go now.
    #[getter]
    fn launch(&self) -> bool {
        self.delay_ms <= 0.0
    }

    /// Milliseconds to wait (0 when it may go).
    #[getter]
    fn delay_ms(&self) -> f64 {
        self.delay_ms
    }

    fn __bool__(&self) -> bool {
        self.delay_ms <= 0.0
    }

    fn __repr__(&self) -> String {
        if self.delay_ms <= 0.0 {
            "PacingDecision(launch)".to_string()
        } else {
            format!("PacingDecision(wait {:.3} ms)", self.delay_ms)
        }
    }
}

/// Holds each stream to its bandwidth share; thread-safe. Streams are any integers (e.g. stream
/// handles); costs are in the configured bandwidth's units (e.g. bytes).
#[pyclass(name = "KernelPacingEngine", module = "_pygpukit_rust", frozen)]
pub struct PyKernelPacingEngine {
    inner: KernelPacingEngine,
}

#[pymethods]
impl PyKernelPacingEngine {
    #[new]
    #[pyo3(signature = (config = None))]
    fn new(config: Option<PyRef<'_, PyPacingConfig>>) -> PyResult<Self> {
        let config = config.map_or(PacingConfig::new(1.0), |c| c.inner);
        Ok(Self {
            inner: KernelPacingEngine::new(config).py_err()?,
        })
    }

    /// Gives `stream` a share in (0, 1]; shares add up to at most 1.
    fn allocate_stream(&self, stream: u64, share: f64) -> PyResult<()> {
        self.inner.allocate_stream(stream, share).py_err()
    }

    /// Changes `stream`'s share.
    fn set_share(&self, stream: u64, share: f64) -> PyResult<()> {
        self.inner.set_share(stream, share).py_err()
    }

    /// Removes `stream`.
    fn release_stream(&self, stream: u64) -> PyResult<()> {
        self.inner.release_stream(stream).py_err()
    }

    /// Whether a launch of `cost` may go now (takes nothing).
    fn should_launch(&self, stream: u64, cost: f64) -> PyResult<PyPacingDecision> {
        Ok(self.inner.should_launch(stream, cost).py_err()?.into())
    }

    /// Checks and, when the launch may go, takes `cost` in one step.
    fn try_launch(&self, stream: u64, cost: f64) -> PyResult<PyPacingDecision> {
        Ok(self.inner.try_launch(stream, cost).py_err()?.into())
    }

    /// Waits (without holding the GIL) until a launch of `cost` may go, takes it, and returns the
    /// milliseconds waited.
    fn acquire(&self, py: Python<'_>, stream: u64, cost: f64) -> PyResult<f64> {
        // The common case (tokens available) keeps the GIL: releasing it costs more than the check.
        if let PacingDecision::Launch = self.inner.try_launch(stream, cost).py_err()? {
            return Ok(0.0);
        }
        py.detach(|| {
            let start = std::time::Instant::now();
            loop {
                match self.inner.try_launch(stream, cost)? {
                    PacingDecision::Launch => return Ok(start.elapsed().as_secs_f64() * 1e3),
                    PacingDecision::Wait { delay_ms } => {
                        std::thread::sleep(Duration::from_secs_f64((delay_ms / 1e3).min(1.0)));
                    }
                }
            }
        })
        .py_err()
    }

    /// Records a launch that happened (takes `cost`, possibly into debt).
    fn record_launch(&self, stream: u64, cost: f64) -> PyResult<()> {
        self.inner.record_launch(stream, cost).py_err()
    }

    /// Reports a launch of `cost` took `elapsed_ms` on the device (adaptive mode learns from it).
    fn record_completion(&self, cost: f64, elapsed_ms: f64) -> PyResult<()> {
        self.inner.record_completion(cost, elapsed_ms).py_err()
    }

    /// The bandwidth the shares divide (learned in adaptive mode).
    #[getter]
    fn total_bandwidth(&self) -> f64 {
        self.inner.total_bandwidth()
    }

    /// Streams with a share.
    fn streams(&self) -> Vec<u64> {
        self.inner.streams()
    }

    /// Share, rate, tokens, launches, throttled and granted of `stream`.
    fn stream_stats<'py>(&self, py: Python<'py>, stream: u64) -> PyResult<Bound<'py, PyDict>> {
        let s = self.inner.stream_stats(stream).py_err()?;
        let d = PyDict::new(py);
        d.set_item("share", s.share)?;
        d.set_item("rate", s.rate)?;
        d.set_item("tokens", s.tokens)?;
        d.set_item("launches", s.launches)?;
        d.set_item("throttled", s.throttled)?;
        d.set_item("granted", s.granted)?;
        Ok(d)
    }
}
