//! What the scheduler needs from a device: memory, copies, streams, events and launches.
//!
//! Every device action of the crate goes through [`DeviceOps`], so the policies can be tested with
//! [`HostDevice`] (host memory, one worker thread per stream) and run on a GPU through the
//! implementation over pygpukit core's native C API that the Python bindings provide. Handles are
//! the driver's values as `u64` (CUstream, CUevent, CUfunction, device pointers), as in that C API.

mod host;

use std::fmt;

pub use host::{HostDevice, HostKernel};

/// A stream handle; 0 is the device's default stream.
pub type StreamHandle = u64;
/// An event handle.
pub type EventHandle = u64;
/// A device address.
pub type DevicePtr = u64;

/// Direction of a copy, numbered as `PYGPUKIT_COPY_*` in native/runtime/c_api.h.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CopyKind {
    /// Host memory to device memory.
    HostToDevice = 0,
    /// Device memory to host memory.
    DeviceToHost = 1,
    /// Device memory to device memory.
    DeviceToDevice = 2,
}

impl CopyKind {
    /// All kinds, in C API order.
    pub const ALL: [CopyKind; 3] = [
        CopyKind::HostToDevice,
        CopyKind::DeviceToHost,
        CopyKind::DeviceToDevice,
    ];

    /// Short name: `"h2d"`, `"d2h"` or `"d2d"`.
    pub fn name(self) -> &'static str {
        match self {
            CopyKind::HostToDevice => "h2d",
            CopyKind::DeviceToHost => "d2h",
            CopyKind::DeviceToDevice => "d2d",
        }
    }
}

/// Grid, block and shared-memory size of a kernel launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchDims {
    /// Blocks in x, y, z.
    pub grid: [u32; 3],
    /// Threads per block in x, y, z.
    pub block: [u32; 3],
    /// Dynamic shared memory in bytes.
    pub shared_bytes: u32,
}

/// A failed device call: the C API's error code and its message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceError {
    /// The `PYGPUKIT_E_*` code (1 CUDA, 2 out of memory, 3 invalid, 4 not initialized, 5 internal).
    pub code: i32,
    /// The call that failed, e.g. `"memcpy_async"`.
    pub call: &'static str,
    /// The device's description of the failure.
    pub message: String,
}

impl DeviceError {
    /// The C API's code for a failed driver call.
    pub const CUDA: i32 = 1;
    /// The C API's code for exhausted device memory or pool limit.
    pub const OUT_OF_MEMORY: i32 = 2;
    /// The C API's code for a bad argument or pointer.
    pub const INVALID: i32 = 3;
    /// The C API's code for an uninitialized runtime.
    pub const NOT_INITIALIZED: i32 = 4;
    /// The C API's code for anything else.
    pub const INTERNAL: i32 = 5;

    /// A new error of `code` from `call`.
    pub fn new(code: i32, call: &'static str, message: impl Into<String>) -> Self {
        DeviceError {
            code,
            call,
            message: message.into(),
        }
    }
}

impl fmt::Display for DeviceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} failed (code {}): {}",
            self.call, self.code, self.message
        )
    }
}

impl std::error::Error for DeviceError {}

/// Result of a device call.
pub type DeviceResult<T> = Result<T, DeviceError>;

/// The device actions the scheduler performs. Implementations are shared between threads.
///
/// Semantics follow CUDA streams: work enqueued on one stream runs in order; an event recorded on a
/// stream completes when the work enqueued before it has; an event never recorded counts as
/// complete.
pub trait DeviceOps: Send + Sync {
    /// A short description of the device, e.g. `"host"` or `"cuda:0 (C API v1)"`.
    fn describe(&self) -> String;
    /// True when memory is host memory (the CPU backend).
    fn is_host(&self) -> bool;

    /// Allocates `nbytes` of device memory for use on `stream`.
    fn allocate(&self, nbytes: u64, stream: StreamHandle) -> DeviceResult<DevicePtr>;
    /// Frees memory from [`DeviceOps::allocate`].
    fn free(&self, ptr: DevicePtr) -> DeviceResult<()>;

    /// Enqueues a copy of `nbytes` from `src` to `dst` on `stream`.
    ///
    /// # Safety
    /// Host addresses (`src` of a host-to-device copy, `dst` of a device-to-host copy) must be valid
    /// for reads (writes) of `nbytes` bytes until the stream has executed the copy, and a
    /// device-to-host destination must not be accessed otherwise meanwhile.
    unsafe fn memcpy_async(
        &self,
        kind: CopyKind,
        dst: u64,
        src: u64,
        nbytes: u64,
        stream: StreamHandle,
    ) -> DeviceResult<()>;

    /// Creates a stream; lower `priority` numbers run first where the device supports priorities.
    fn stream_create(&self, priority: i32) -> DeviceResult<StreamHandle>;
    /// Destroys a stream after its work is done.
    fn stream_destroy(&self, stream: StreamHandle) -> DeviceResult<()>;
    /// Blocks until all work enqueued on `stream` is done.
    fn stream_synchronize(&self, stream: StreamHandle) -> DeviceResult<()>;
    /// True when all work enqueued on `stream` is done.
    fn stream_query(&self, stream: StreamHandle) -> DeviceResult<bool>;
    /// Makes future work on `stream` wait for `event`.
    fn stream_wait_event(&self, stream: StreamHandle, event: EventHandle) -> DeviceResult<()>;

    /// Creates an event; `timing` enables [`DeviceOps::event_elapsed_ms`].
    fn event_create(&self, timing: bool) -> DeviceResult<EventHandle>;
    /// Destroys an event.
    fn event_destroy(&self, event: EventHandle) -> DeviceResult<()>;
    /// Records `event` on `stream`.
    fn event_record(&self, event: EventHandle, stream: StreamHandle) -> DeviceResult<()>;
    /// Blocks until `event` has completed.
    fn event_synchronize(&self, event: EventHandle) -> DeviceResult<()>;
    /// True when `event` has completed.
    fn event_query(&self, event: EventHandle) -> DeviceResult<bool>;
    /// Milliseconds between two completed timing events.
    fn event_elapsed_ms(&self, start: EventHandle, end: EventHandle) -> DeviceResult<f32>;

    /// Launches `function` on `stream`; `params[i]` points at the i-th argument's bytes.
    ///
    /// # Safety
    /// `params` must hold one valid pointer per kernel parameter, each to a value of the parameter's
    /// size, and the kernel must only touch memory that stays valid until it completes.
    unsafe fn launch(
        &self,
        function: u64,
        dims: LaunchDims,
        stream: StreamHandle,
        params: &[*mut std::ffi::c_void],
    ) -> DeviceResult<()>;
}
