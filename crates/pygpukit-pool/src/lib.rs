//! pygpukit's device memory pool policy.
//!
//! The pool decides; it never calls the driver. The C++ allocator in native/runtime asks it how to
//! serve each request ([`Pool::request`]), performs the device allocation or release it is told to,
//! and reports back ([`Pool::register`], [`Pool::abandon`]). That keeps every policy (size classes,
//! per-stream caching, least-recently-freed release, limits, statistics) in testable Rust while the
//! memory itself really comes from the device. [`ffi`] is the C ABI the native module links.

pub mod budget;
pub mod ffi;
pub mod pool;
pub mod size_class;

pub use budget::SharedBudget;
pub use pool::{Decision, DevicePtr, Pool, PoolError, Stats, StreamId};
