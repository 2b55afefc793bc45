//! The device the bindings act on: pygpukit core's native C API on the CUDA backend (a PyCapsule of
//! function pointers, native/runtime/c_api.h), or the crate's [`HostDevice`] on the CPU backend.

use std::ffi::{c_char, c_void, CStr};
use std::sync::{Arc, OnceLock};

use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyCapsuleMethods};

use pygpukit_sched::device::{
    CopyKind, DeviceError, DeviceOps, DevicePtr, DeviceResult, EventHandle, HostDevice, LaunchDims,
    StreamHandle,
};

use crate::errors::invalid;

/// The table version these bindings were written against.
const C_API_VERSION: u32 = 1;

type Status = i32;

/// Mirror of `PygpukitCApi` (version 1) in native/runtime/c_api.h; field order and types must match.
#[repr(C)]
struct PygpukitCApi {
    version: u32,
    size: u32,
    last_error: Option<unsafe extern "C" fn() -> *const c_char>,
    set_device: Option<unsafe extern "C" fn(i32) -> Status>,
    get_device: Option<unsafe extern "C" fn(*mut i32) -> Status>,
    allocate: Option<unsafe extern "C" fn(u64, u64, *mut u64) -> Status>,
    free: Option<unsafe extern "C" fn(u64) -> Status>,
    memory_in_use: Option<unsafe extern "C" fn(*mut u64, *mut u64) -> Status>,
    memcpy_async: Option<unsafe extern "C" fn(i32, u64, u64, u64, u64) -> Status>,
    stream_create: Option<unsafe extern "C" fn(i32, *mut u64) -> Status>,
    stream_destroy: Option<unsafe extern "C" fn(u64) -> Status>,
    stream_synchronize: Option<unsafe extern "C" fn(u64) -> Status>,
    stream_query: Option<unsafe extern "C" fn(u64, *mut i32) -> Status>,
    stream_wait_event: Option<unsafe extern "C" fn(u64, u64) -> Status>,
    event_create: Option<unsafe extern "C" fn(i32, *mut u64) -> Status>,
    event_destroy: Option<unsafe extern "C" fn(u64) -> Status>,
    event_record: Option<unsafe extern "C" fn(u64, u64) -> Status>,
    event_synchronize: Option<unsafe extern "C" fn(u64) -> Status>,
    event_query: Option<unsafe extern "C" fn(u64, *mut i32) -> Status>,
    event_elapsed_ms: Option<unsafe extern "C" fn(u64, u64, *mut f32) -> Status>,
    launch: Option<
        unsafe extern "C" fn(u64, *const u32, *const u32, u32, u64, *mut *mut c_void) -> Status,
    >,
    graph_launch: Option<unsafe extern "C" fn(u64, u64) -> Status>,
}

/// [`DeviceOps`] over core's C API table.
pub struct CApiDevice {
    table: &'static PygpukitCApi,
    name: String,
    /// Keeps the capsule (and so the module owning the table) alive.
    _capsule: Py<PyAny>,
}

impl CApiDevice {
    /// Reads and checks the capsule (its name ends in `._C_API`, version 1 or newer, large
    /// enough, every function present).
    pub fn from_capsule(capsule: &Bound<'_, PyAny>) -> PyResult<Self> {
        let capsule = capsule
            .cast::<PyCapsule>()
            .map_err(|_| invalid("c_api_capsule() did not return a PyCapsule"))?;
        let name = capsule
            .name()?
            .ok_or_else(|| invalid("the C API capsule has no name"))?;
        // SAFETY: the name is the static string core's module created the capsule with; it is
        // copied out immediately.
        let name: String = unsafe { name.as_cstr() }.to_string_lossy().into_owned();
        if !name.ends_with("._C_API") {
            return Err(invalid(format!(
                "capsule {name:?} is not a pygpukit C API capsule"
            )));
        }
        let cname = std::ffi::CString::new(name.clone()).map_err(|e| invalid(e.to_string()))?;
        let ptr = capsule.pointer_checked(Some(&cname))?;
        // SAFETY: a capsule with this name holds a pointer to core's static PygpukitCApi table,
        // which lives as long as the module (never unloaded); version and size are checked before
        // any other field is read.
        let table: &'static PygpukitCApi = unsafe { &*(ptr.as_ptr() as *const PygpukitCApi) };
        if table.version < C_API_VERSION {
            return Err(invalid(format!(
                "{name}: C API version {} is older than the {C_API_VERSION} these bindings need",
                table.version
            )));
        }
        let needed = std::mem::size_of::<PygpukitCApi>();
        if (table.size as usize) < needed {
            return Err(invalid(format!(
                "{name}: C API table of {} bytes is smaller than the {needed} of version {C_API_VERSION}",
                table.size
            )));
        }
        let complete = table.last_error.is_some()
            && table.allocate.is_some()
            && table.free.is_some()
            && table.memcpy_async.is_some()
            && table.stream_create.is_some()
            && table.stream_destroy.is_some()
            && table.stream_synchronize.is_some()
            && table.stream_query.is_some()
            && table.stream_wait_event.is_some()
            && table.event_create.is_some()
            && table.event_destroy.is_some()
            && table.event_record.is_some()
            && table.event_synchronize.is_some()
            && table.event_query.is_some()
            && table.event_elapsed_ms.is_some()
            && table.launch.is_some();
        if !complete {
            return Err(invalid(format!("{name}: the C API table has null entries")));
        }
        Ok(CApiDevice {
            table,
            name,
            _capsule: capsule.clone().into_any().unbind(),
        })
    }

    fn check(&self, call: &'static str, status: Status) -> DeviceResult<()> {
        if status == 0 {
            return Ok(());
        }
        let message = match self.table.last_error {
            // SAFETY: last_error returns the calling thread's message, a NUL-terminated string
            // valid until the thread's next C API call; it is copied here.
            Some(f) => unsafe {
                let p = f();
                if p.is_null() {
                    String::new()
                } else {
                    CStr::from_ptr(p).to_string_lossy().into_owned()
                }
            },
            None => String::new(),
        };
        Err(DeviceError::new(status, call, message))
    }
}

macro_rules! entry {
    ($self:ident, $field:ident) => {
        $self
            .table
            .$field
            .expect("checked non-null at construction")
    };
}

impl DeviceOps for CApiDevice {
    fn describe(&self) -> String {
        format!("cuda ({}, C API v{})", self.name, self.table.version)
    }

    fn is_host(&self) -> bool {
        false
    }

    fn allocate(&self, nbytes: u64, stream: StreamHandle) -> DeviceResult<DevicePtr> {
        let mut ptr = 0u64;
        // SAFETY: a valid table entry; `ptr` is a valid out pointer.
        let s = unsafe { entry!(self, allocate)(nbytes, stream, &mut ptr) };
        self.check("allocate", s).map(|()| ptr)
    }

    fn free(&self, ptr: DevicePtr) -> DeviceResult<()> {
        // SAFETY: a valid table entry; the runtime validates the pointer.
        self.check("free", unsafe { entry!(self, free)(ptr) })
    }

    unsafe fn memcpy_async(
        &self,
        kind: CopyKind,
        dst: u64,
        src: u64,
        nbytes: u64,
        stream: StreamHandle,
    ) -> DeviceResult<()> {
        // SAFETY: host-side validity is the caller's contract (see DeviceOps::memcpy_async).
        let s = unsafe { entry!(self, memcpy_async)(kind as i32, dst, src, nbytes, stream) };
        self.check("memcpy_async", s)
    }

    fn stream_create(&self, priority: i32) -> DeviceResult<StreamHandle> {
        let mut stream = 0u64;
        // SAFETY: a valid table entry and out pointer.
        let s = unsafe { entry!(self, stream_create)(priority, &mut stream) };
        self.check("stream_create", s).map(|()| stream)
    }

    fn stream_destroy(&self, stream: StreamHandle) -> DeviceResult<()> {
        // SAFETY: a valid table entry.
        self.check("stream_destroy", unsafe {
            entry!(self, stream_destroy)(stream)
        })
    }

    fn stream_synchronize(&self, stream: StreamHandle) -> DeviceResult<()> {
        // SAFETY: a valid table entry.
        self.check("stream_synchronize", unsafe {
            entry!(self, stream_synchronize)(stream)
        })
    }

    fn stream_query(&self, stream: StreamHandle) -> DeviceResult<bool> {
        let mut done = 0i32;
        // SAFETY: a valid table entry and out pointer.
        let s = unsafe { entry!(self, stream_query)(stream, &mut done) };
        self.check("stream_query", s).map(|()| done != 0)
    }

    fn stream_wait_event(&self, stream: StreamHandle, event: EventHandle) -> DeviceResult<()> {
        // SAFETY: a valid table entry.
        let s = unsafe { entry!(self, stream_wait_event)(stream, event) };
        self.check("stream_wait_event", s)
    }

    fn event_create(&self, timing: bool) -> DeviceResult<EventHandle> {
        let mut event = 0u64;
        // SAFETY: a valid table entry and out pointer.
        let s = unsafe { entry!(self, event_create)(i32::from(timing), &mut event) };
        self.check("event_create", s).map(|()| event)
    }

    fn event_destroy(&self, event: EventHandle) -> DeviceResult<()> {
        // SAFETY: a valid table entry.
        self.check("event_destroy", unsafe {
            entry!(self, event_destroy)(event)
        })
    }

    fn event_record(&self, event: EventHandle, stream: StreamHandle) -> DeviceResult<()> {
        // SAFETY: a valid table entry.
        self.check("event_record", unsafe {
            entry!(self, event_record)(event, stream)
        })
    }

    fn event_synchronize(&self, event: EventHandle) -> DeviceResult<()> {
        // SAFETY: a valid table entry.
        self.check("event_synchronize", unsafe {
            entry!(self, event_synchronize)(event)
        })
    }

    fn event_query(&self, event: EventHandle) -> DeviceResult<bool> {
        let mut done = 0i32;
        // SAFETY: a valid table entry and out pointer.
        let s = unsafe { entry!(self, event_query)(event, &mut done) };
        self.check("event_query", s).map(|()| done != 0)
    }

    fn event_elapsed_ms(&self, start: EventHandle, end: EventHandle) -> DeviceResult<f32> {
        let mut ms = 0f32;
        // SAFETY: a valid table entry and out pointer.
        let s = unsafe { entry!(self, event_elapsed_ms)(start, end, &mut ms) };
        self.check("event_elapsed_ms", s).map(|()| ms)
    }

    unsafe fn launch(
        &self,
        function: u64,
        dims: LaunchDims,
        stream: StreamHandle,
        params: &[*mut c_void],
    ) -> DeviceResult<()> {
        let mut params: Vec<*mut c_void> = params.to_vec();
        // SAFETY: grid/block point at 3 u32 each; params per the caller's contract.
        let s = unsafe {
            entry!(self, launch)(
                function,
                dims.grid.as_ptr(),
                dims.block.as_ptr(),
                dims.shared_bytes,
                stream,
                params.as_mut_ptr(),
            )
        };
        self.check("launch", s)
    }
}

fn host_device() -> Arc<dyn DeviceOps> {
    static HOST: OnceLock<Arc<HostDevice>> = OnceLock::new();
    HOST.get_or_init(|| Arc::new(HostDevice::new())).clone()
}

fn cuda_device(py: Python<'_>) -> PyResult<Arc<dyn DeviceOps>> {
    static CUDA: OnceLock<Arc<CApiDevice>> = OnceLock::new();
    if let Some(d) = CUDA.get() {
        return Ok(d.clone());
    }
    let backend = py.import("pygpukit.core.backend")?;
    let capsule = backend.call_method0("c_api_capsule")?;
    let device = Arc::new(CApiDevice::from_capsule(&capsule)?);
    Ok(CUDA.get_or_init(|| device).clone())
}

/// The device for `backend`: `"host"` (host memory), `"cuda"` (core's C API; fails without the
/// CUDA backend) or `"auto"` (cuda when pygpukit's backend is CUDA, else host). All objects of one
/// kind share one device, so their pointers and streams mix.
pub fn resolve(py: Python<'_>, backend: &str) -> PyResult<Arc<dyn DeviceOps>> {
    match backend {
        "host" => Ok(host_device()),
        "cuda" => {
            let current: String = py
                .import("pygpukit.core.backend")?
                .call_method0("current_backend")?
                .extract()?;
            if current != "cuda" {
                return Err(invalid(format!(
                    "backend='cuda' but pygpukit is using the {current} backend"
                )));
            }
            cuda_device(py)
        }
        "auto" => {
            let current: String = match py.import("pygpukit.core.backend") {
                Ok(m) => m.call_method0("current_backend")?.extract()?,
                Err(_) => "cpu".to_string(), // pygpukit core not importable: host simulation
            };
            if current == "cuda" {
                cuda_device(py)
            } else {
                Ok(host_device())
            }
        }
        other => Err(invalid(format!(
            "backend must be 'auto', 'cuda' or 'host', got {other:?}"
        ))),
    }
}
