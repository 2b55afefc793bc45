//! Rust errors to Python exceptions. The exception classes are defined in Python
//! (`_pygpukit_rust/errors.py`) so they can derive from pygpukit's own hierarchy; each carries the
//! structured details of the Rust error as attributes.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyList;

use pygpukit_sched::SchedError;

use crate::admission::PyRejectReason;

/// A Python exception for a refused argument, before any Rust call (raised as
/// `_pygpukit_rust.errors.InvalidArgumentError` when that module is importable).
pub fn invalid(message: impl Into<String>) -> PyErr {
    let message = message.into();
    Python::attach(|py| {
        make(py, "InvalidArgumentError", &message, |_| Ok(()))
            .unwrap_or_else(|_| PyValueError::new_err(message.clone()))
    })
}

fn make(
    py: Python<'_>,
    class: &str,
    message: &str,
    fill: impl FnOnce(&Bound<'_, PyAny>) -> PyResult<()>,
) -> PyResult<PyErr> {
    let module = py.import("_pygpukit_rust.errors")?;
    let value = module.getattr(class)?.call1((message,))?;
    fill(&value)?;
    Ok(PyErr::from_value(value))
}

/// Converts a scheduler error into the matching Python exception.
pub fn to_pyerr(err: SchedError) -> PyErr {
    let message = err.to_string();
    Python::attach(|py| {
        let result = match &err {
            SchedError::InvalidArgument { name, value, .. } => {
                make(py, "InvalidArgumentError", &message, |v| {
                    v.setattr("name", *name)?;
                    v.setattr("value", value.as_str())
                })
            }
            SchedError::UnknownId { kind, id } => make(py, "UnknownIdError", &message, |v| {
                v.setattr("kind", *kind)?;
                v.setattr("id", id.as_str())
            }),
            SchedError::DuplicateId { kind, id } => make(py, "DuplicateIdError", &message, |v| {
                v.setattr("kind", *kind)?;
                v.setattr("id", id.as_str())
            }),
            SchedError::DependencyCycle { cycle } => {
                make(py, "DependencyCycleError", &message, |v| {
                    v.setattr("cycle", PyList::new(py, cycle)?)
                })
            }
            SchedError::InvalidTransition { kind, id, from, to } => {
                make(py, "InvalidTransitionError", &message, |v| {
                    v.setattr("kind", *kind)?;
                    v.setattr("id", id.as_str())?;
                    v.setattr("state", from.as_str())?;
                    v.setattr("operation", to.as_str())
                })
            }
            SchedError::Rejected(reason) => make(py, "AdmissionRejectedError", &message, |v| {
                v.setattr("reason", Py::new(py, PyRejectReason::from(reason.clone()))?)
            }),
            SchedError::QuotaExceeded {
                requested,
                in_use,
                quota,
            } => make(py, "QuotaExceededError", &message, |v| {
                v.setattr("requested", *requested)?;
                v.setattr("in_use", *in_use)?;
                v.setattr("quota", *quota)
            }),
            SchedError::Device(e) => make(py, "DeviceOperationError", &message, |v| {
                v.setattr("code", e.code)?;
                v.setattr("call", e.call)
            }),
        };
        result.unwrap_or_else(|import_error| import_error)
    })
}

/// `Result<T, SchedError>` to `PyResult<T>`.
pub trait IntoPy<T> {
    /// Converts the error side.
    fn py_err(self) -> PyResult<T>;
}

impl<T> IntoPy<T> for Result<T, SchedError> {
    fn py_err(self) -> PyResult<T> {
        self.map_err(to_pyerr)
    }
}
