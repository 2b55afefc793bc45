//! Rust errors to Python exceptions. The exception classes are defined in Python
//! (`_pygpukit_rust/errors.py`) so they can derive from pygpukit's own hierarchy; each carries the
//! structured details of the Rust error as attributes.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyList;

use pygpukit_sched::contexts::ChargeError;
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

/// Bytes as the scheduler's messages write them ("2.00 MiB").
pub fn fmt_bytes(value: u64) -> String {
    for (unit, size) in [("GiB", 1u64 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)] {
        if value >= size {
            return format!("{:.2} {unit}", value as f64 / size as f64);
        }
    }
    format!("{value} B")
}

/// A refused charge of context `context` (None: a partition scope) as the Python exception:
/// `ContextError` for a destroyed context, else `BudgetExceededError` with `context`,
/// `partition`, `requested`, `in_use` and `limit` (bytes).
pub fn charge_error(context: Option<&str>, err: ChargeError) -> PyErr {
    Python::attach(|py| {
        let result = match err {
            ChargeError::Destroyed => {
                let name = context.unwrap_or("?");
                make(
                    py,
                    "ContextError",
                    &format!(
                        "context {name:?} was destroyed; allocations in its session are refused"
                    ),
                    |_| Ok(()),
                )
            }
            ChargeError::Budget {
                requested,
                in_use,
                limit,
            } => {
                let name = context.unwrap_or("?");
                let message = format!(
                    "context {}: allocating {} would exceed its budget ({} in use of {})",
                    py_repr(name),
                    fmt_bytes(requested),
                    fmt_bytes(in_use),
                    fmt_bytes(limit)
                );
                make(py, "BudgetExceededError", &message, |v| {
                    fill_budget(v, context, None, requested, in_use, limit)
                })
            }
            ChargeError::Partition {
                partition,
                requested,
                in_use,
                limit,
                message,
            } => {
                let who = context.map_or(String::new(), |c| format!("context {}: ", py_repr(c)));
                let text = format!(
                    "{who}partition {}: allocating {} refused ({} in use of {}): {message}",
                    py_repr(&partition),
                    fmt_bytes(requested),
                    fmt_bytes(in_use),
                    fmt_bytes(limit)
                );
                make(py, "BudgetExceededError", &text, |v| {
                    fill_budget(v, context, Some(&partition), requested, in_use, limit)
                })
            }
        };
        result.unwrap_or_else(|import_error| import_error)
    })
}

fn fill_budget(
    v: &Bound<'_, PyAny>,
    context: Option<&str>,
    partition: Option<&str>,
    requested: u64,
    in_use: u64,
    limit: u64,
) -> PyResult<()> {
    v.setattr("context", context)?;
    v.setattr("partition", partition)?;
    v.setattr("requested", requested)?;
    v.setattr("in_use", in_use)?;
    v.setattr("cached", 0)?;
    v.setattr("limit", limit)?;
    v.setattr("quota", limit)
}

/// `'name'` as Python's repr of a simple string writes it.
pub fn py_repr(text: &str) -> String {
    format!("'{}'", text.replace('\\', "\\\\").replace('\'', "\\'"))
}
