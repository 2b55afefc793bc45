//! The one error type of the scheduler crate. Every refusal names the value that caused it, and a
//! refused call leaves the state it would have changed as it was.

use std::fmt;

use crate::admission::RejectReason;
use crate::device::DeviceError;

/// Why a scheduler, admission, QoS, partition, pacing, transfer, dispatch or memory-pool call was
/// refused.
#[derive(Clone, Debug, PartialEq)]
pub enum SchedError {
    /// A numeric argument is out of its valid range (negative, NaN, zero where a positive value is
    /// needed, or larger than the resource it is measured against).
    InvalidArgument {
        /// Which argument, e.g. `"total_memory"`.
        name: &'static str,
        /// The offending value as the caller gave it.
        value: String,
        /// What the value must satisfy.
        expected: String,
    },
    /// An id given to an operation that is not known (never created, or already removed).
    UnknownId {
        /// What kind of object: `"task"`, `"partition"`, `"stream"`, `"block"`, ...
        kind: &'static str,
        /// The id that was looked up.
        id: String,
    },
    /// An id given to a create operation that is already in use.
    DuplicateId {
        /// What kind of object.
        kind: &'static str,
        /// The id that already exists.
        id: String,
    },
    /// Adding the dependency would close a cycle; `cycle` lists the task ids along it, starting and
    /// ending with the same id.
    DependencyCycle {
        /// The ids along the cycle.
        cycle: Vec<String>,
    },
    /// A lifecycle operation that the object's current state does not allow (completing a task
    /// twice, cancelling a finished one, restoring a block that is resident, ...).
    InvalidTransition {
        /// What kind of object.
        kind: &'static str,
        /// Its id.
        id: String,
        /// Its state when the call was made.
        from: String,
        /// The operation or target state that was refused.
        to: String,
    },
    /// Admission control refused the request.
    Rejected(RejectReason),
    /// A memory quota would be exceeded (and eviction could not make room).
    QuotaExceeded {
        /// Bytes requested.
        requested: u64,
        /// Bytes in use (resident) under the quota.
        in_use: u64,
        /// The quota.
        quota: u64,
    },
    /// A device call failed.
    Device(DeviceError),
}

impl SchedError {
    /// Shorthand for [`SchedError::InvalidArgument`].
    pub fn invalid(
        name: &'static str,
        value: impl fmt::Display,
        expected: impl Into<String>,
    ) -> Self {
        SchedError::InvalidArgument {
            name,
            value: value.to_string(),
            expected: expected.into(),
        }
    }

    /// Shorthand for [`SchedError::UnknownId`].
    pub fn unknown(kind: &'static str, id: impl fmt::Display) -> Self {
        SchedError::UnknownId {
            kind,
            id: id.to_string(),
        }
    }

    /// Shorthand for [`SchedError::DuplicateId`].
    pub fn duplicate(kind: &'static str, id: impl fmt::Display) -> Self {
        SchedError::DuplicateId {
            kind,
            id: id.to_string(),
        }
    }

    /// Shorthand for [`SchedError::InvalidTransition`].
    pub fn transition(
        kind: &'static str,
        id: impl fmt::Display,
        from: impl fmt::Display,
        to: impl fmt::Display,
    ) -> Self {
        SchedError::InvalidTransition {
            kind,
            id: id.to_string(),
            from: from.to_string(),
            to: to.to_string(),
        }
    }
}

impl fmt::Display for SchedError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SchedError::InvalidArgument {
                name,
                value,
                expected,
            } => write!(f, "invalid {name}: {value} ({expected})"),
            SchedError::UnknownId { kind, id } => write!(f, "unknown {kind} id {id:?}"),
            SchedError::DuplicateId { kind, id } => write!(f, "{kind} id {id:?} already exists"),
            SchedError::DependencyCycle { cycle } => {
                write!(f, "dependency cycle: {}", cycle.join(" -> "))
            }
            SchedError::InvalidTransition { kind, id, from, to } => {
                write!(f, "{kind} {id:?} is {from}; cannot {to}")
            }
            SchedError::Rejected(reason) => write!(f, "rejected: {reason}"),
            SchedError::QuotaExceeded {
                requested,
                in_use,
                quota,
            } => write!(
                f,
                "quota exceeded: requested {requested} bytes with {in_use} bytes in use under a quota of {quota} bytes"
            ),
            SchedError::Device(e) => write!(f, "device error: {e}"),
        }
    }
}

impl std::error::Error for SchedError {}

impl From<DeviceError> for SchedError {
    fn from(e: DeviceError) -> Self {
        SchedError::Device(e)
    }
}

impl From<RejectReason> for SchedError {
    fn from(r: RejectReason) -> Self {
        SchedError::Rejected(r)
    }
}

/// Result alias of this crate.
pub type Result<T, E = SchedError> = std::result::Result<T, E>;

/// Checks that a floating-point value is finite and within `[lo, hi]`.
pub(crate) fn check_fraction(name: &'static str, value: f64, lo: f64, hi: f64) -> Result<f64> {
    if value.is_finite() && value >= lo && value <= hi {
        Ok(value)
    } else {
        Err(SchedError::invalid(
            name,
            value,
            format!("must be a finite number in [{lo}, {hi}]"),
        ))
    }
}
