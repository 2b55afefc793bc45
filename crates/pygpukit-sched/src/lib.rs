//! pygpukit's scheduler: the policy side of sharing one GPU between several workloads.
//!
//! - [`scheduler`]: the task state machine (Pending, Admitted, Running, Completed, Failed, Cancelled)
//!   with dependencies and FIFO / priority / shortest-job ordering, over [`admission`].
//! - [`admission`] and [`qos`]: memory and bandwidth reservations by QoS class (Guaranteed,
//!   Burstable, BestEffort), queue limits, best-effort preemption, typed reject reasons.
//! - [`contexts`]: execution-context budgets: admission and per-allocation accounting.
//! - [`partition`]: memory, compute share, bandwidth and stream limits per partition.
//! - [`pacing`]: per-stream token buckets holding each stream to its bandwidth share.
//! - [`transfer`]: H2D / D2H / D2D copy queues with priorities on dedicated streams.
//! - [`dispatch`]: kernel launches with per-stream in-flight limits and futures resolved by events.
//! - [`memory`]: a quota-bounded pool of device blocks with LRU eviction to host and restore.
//! - [`workload`]: a reproducible mixed-QoS workload reporting per-class wait percentiles.
//!
//! Every device action goes through [`device::DeviceOps`]; [`device::HostDevice`] implements it
//! over host memory for tests and the CPU backend, and the Python bindings implement it over
//! pygpukit core's native C API.

pub mod admission;
pub mod clock;
pub mod contexts;
pub mod device;
pub mod dispatch;
pub mod error;
pub mod memory;
pub mod pacing;
pub mod partition;
pub mod qos;
pub mod scheduler;
mod shard;
pub mod transfer;
pub mod workload;

pub use admission::{
    AdmissionConfig, AdmissionController, AdmissionDecision, AdmissionStats, Grant, RejectReason,
    Resource, ResourceRequest,
};
pub use device::{CopyKind, DeviceError, DeviceOps, HostDevice, LaunchDims};
pub use error::{Result, SchedError};
pub use qos::{QosClass, QosEvaluation, QosPolicy, QosPolicyEvaluator, QosStats, QosTaskMeta};
