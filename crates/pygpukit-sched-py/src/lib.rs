//! `_pygpukit_rust`: the Python module of the pygpukit-sched distribution.
//!
//! Thin PyO3 bindings only; the scheduling logic lives in plain Rust crates of this workspace so it
//! can be tested with `cargo test` without a Python interpreter.

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
