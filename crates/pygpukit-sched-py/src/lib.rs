//! `_pygpukit_rust`: the Python module of the pygpukit-sched distribution.
//!
//! Thin PyO3 bindings only; the scheduling logic lives in the `pygpukit-sched` crate so it can be
//! tested with `cargo test` without a Python interpreter. Device actions go through pygpukit
//! core's native C API on the CUDA backend and through host memory otherwise ([`capi`]).

mod admission;
mod capi;
mod contexts;
mod dispatch;
mod errors;
mod memory;
mod pacing;
mod partition;
mod qos;
mod sched;
mod transfer;

use pyo3::prelude::*;
use pyo3::types::PyDict;

/// Version of this crate, which is also the pygpukit-sched distribution's version.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Facts about how this module was built, as (key, value) pairs.
pub fn build_facts() -> Vec<(&'static str, String)> {
    vec![
        ("version", VERSION.to_string()),
        (
            "profile",
            if cfg!(debug_assertions) {
                "debug"
            } else {
                "release"
            }
            .to_string(),
        ),
        ("target_arch", std::env::consts::ARCH.to_string()),
        ("target_os", std::env::consts::OS.to_string()),
        ("abi3_min_python", "3.10".to_string()),
    ]
}

/// build_info() -> dict: version, build profile and target of this native module.
#[pyfunction]
fn build_info(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let info = PyDict::new(py);
    for (key, value) in build_facts() {
        info.set_item(key, value)?;
    }
    Ok(info)
}

#[pymodule]
#[pyo3(name = "_native")]
fn native_module(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", VERSION)?;
    m.add_function(wrap_pyfunction!(build_info, m)?)?;
    m.add_function(wrap_pyfunction!(sched::simulate_workload, m)?)?;
    m.add_class::<memory::PyMemoryPool>()?;
    m.add_class::<qos::PyQosClass>()?;
    m.add_class::<qos::PyQosTaskMeta>()?;
    m.add_class::<qos::PyQosPolicyEvaluator>()?;
    m.add_class::<admission::PyRejectReason>()?;
    m.add_class::<admission::PyAdmissionDecision>()?;
    m.add_class::<admission::PyAdmissionConfig>()?;
    m.add_class::<admission::PyAdmissionController>()?;
    m.add_class::<partition::PyPartitionConfig>()?;
    m.add_class::<partition::PyPartitionLimits>()?;
    m.add_class::<partition::PyPartitionManager>()?;
    m.add_class::<partition::PyPartitionScope>()?;
    m.add_class::<contexts::PyContextRegistry>()?;
    m.add_class::<contexts::PyContextBudget>()?;
    m.add_class::<sched::PyTaskState>()?;
    m.add_class::<sched::PyTaskPolicy>()?;
    m.add_class::<sched::PyTaskMeta>()?;
    m.add_class::<sched::PyScheduler>()?;
    m.add_class::<pacing::PyPacingConfig>()?;
    m.add_class::<pacing::PyPacingDecision>()?;
    m.add_class::<pacing::PyKernelPacingEngine>()?;
    m.add_class::<transfer::PyAsyncTransferEngine>()?;
    m.add_class::<dispatch::PyKernelState>()?;
    m.add_class::<dispatch::PyKernelFuture>()?;
    m.add_class::<dispatch::PyKernelDispatcher>()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn build_facts_name_the_crate_version_and_target() {
        let facts = build_facts();
        let get = |k: &str| {
            facts
                .iter()
                .find(|(key, _)| *key == k)
                .map(|(_, v)| v.clone())
        };
        assert_eq!(get("version").as_deref(), Some(VERSION));
        assert_eq!(get("target_os").as_deref(), Some(std::env::consts::OS));
        assert!(matches!(
            get("profile").as_deref(),
            Some("debug") | Some("release")
        ));
    }
}
