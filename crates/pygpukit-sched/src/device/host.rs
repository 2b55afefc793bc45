//! [`HostDevice`]: a [`DeviceOps`] over host memory, used by the CPU backend and by tests.
//!
//! It keeps CUDA's ordering rules rather than faking them: every stream other than 0 is a worker
//! thread that runs its work in order, so copies and launches really are asynchronous, events
//! really complete later, and `stream_wait_event` really orders two streams. Stream 0 runs work
//! inline on the calling thread. "Device memory" is host memory owned by the device; copies from or
//! to it are checked against its allocations, and a pending copy keeps its allocation alive even if
//! it is freed meanwhile.

use std::cell::UnsafeCell;
use std::collections::{BTreeMap, HashMap};
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use parking_lot::{Condvar, Mutex};

use super::{
    CopyKind, DeviceError, DeviceOps, DevicePtr, DeviceResult, EventHandle, LaunchDims,
    StreamHandle,
};

/// A host function standing in for a kernel: it receives the launch dimensions and a copy of each
/// argument's bytes (taken at launch time, as the driver does).
pub type HostKernel = Arc<dyn Fn(LaunchDims, &[Vec<u8>]) + Send + Sync>;

struct Allocation {
    bytes: Box<[UnsafeCell<u8>]>,
}

// SAFETY: the bytes are only accessed through raw pointers by copies and host kernels, whose
// ordering is the caller's responsibility exactly as for device memory; the allocation itself is
// never moved or resized while shared.
unsafe impl Sync for Allocation {}
unsafe impl Send for Allocation {}

impl Allocation {
    fn addr(&self) -> u64 {
        self.bytes.as_ptr() as u64
    }
    fn len(&self) -> u64 {
        self.bytes.len() as u64
    }
}

type Work = Box<dyn FnOnce() + Send>;

struct HostStream {
    sender: mpsc::Sender<Work>,
    pending: Arc<AtomicU64>,
    worker: Option<JoinHandle<()>>,
}

#[derive(Default)]
struct EventState {
    recorded: u64,
    completed: u64,
    at: Option<Instant>,
}

struct HostEvent {
    state: Mutex<EventState>,
    done: Condvar,
    timing: bool,
}

impl HostEvent {
    fn complete(&self, generation: u64) {
        let mut state = self.state.lock();
        if generation > state.completed {
            state.completed = generation;
            state.at = Some(Instant::now());
        }
        self.done.notify_all();
    }

    fn wait_for(&self, generation: u64) {
        let mut state = self.state.lock();
        while state.completed < generation {
            self.done.wait(&mut state);
        }
    }
}

struct KernelEntry {
    param_sizes: Vec<usize>,
    body: HostKernel,
}

/// A device whose memory is host memory and whose streams are worker threads.
pub struct HostDevice {
    memory: Mutex<BTreeMap<u64, Arc<Allocation>>>,
    allocated: AtomicU64,
    memory_limit: u64,
    streams: Mutex<HashMap<StreamHandle, HostStream>>,
    events: Mutex<HashMap<EventHandle, Arc<HostEvent>>>,
    kernels: Mutex<HashMap<u64, Arc<KernelEntry>>>,
    next_handle: AtomicU64,
}

impl Default for HostDevice {
    fn default() -> Self {
        Self::new()
    }
}

impl HostDevice {
    /// A host device without a memory limit.
    pub fn new() -> Self {
        Self::with_memory_limit(u64::MAX)
    }

    /// A host device whose allocations fail with `OUT_OF_MEMORY` beyond `limit` bytes in total
    /// (to exercise out-of-memory paths).
    pub fn with_memory_limit(limit: u64) -> Self {
        HostDevice {
            memory: Mutex::new(BTreeMap::new()),
            allocated: AtomicU64::new(0),
            memory_limit: limit,
            streams: Mutex::new(HashMap::new()),
            events: Mutex::new(HashMap::new()),
            kernels: Mutex::new(HashMap::new()),
            next_handle: AtomicU64::new(0x1000),
        }
    }

    /// Bytes currently allocated.
    pub fn allocated_bytes(&self) -> u64 {
        self.allocated.load(Ordering::Relaxed)
    }

    /// Number of live allocations.
    pub fn allocation_count(&self) -> usize {
        self.memory.lock().len()
    }

    /// Registers a host kernel taking arguments of `param_sizes` bytes; returns its function
    /// handle for [`DeviceOps::launch`].
    pub fn register_kernel(&self, param_sizes: Vec<usize>, body: HostKernel) -> u64 {
        let handle = self.handle();
        self.kernels
            .lock()
            .insert(handle, Arc::new(KernelEntry { param_sizes, body }));
        handle
    }

    fn handle(&self) -> u64 {
        self.next_handle.fetch_add(16, Ordering::Relaxed)
    }

    /// The allocation holding `[ptr, ptr + nbytes)`, or an error naming the range.
    fn device_range(
        &self,
        call: &'static str,
        ptr: u64,
        nbytes: u64,
    ) -> DeviceResult<Arc<Allocation>> {
        let memory = self.memory.lock();
        if let Some((_, alloc)) = memory.range(..=ptr).next_back() {
            let end = ptr.checked_add(nbytes);
            if end.is_some_and(|end| end <= alloc.addr() + alloc.len()) {
                return Ok(Arc::clone(alloc));
            }
        }
        Err(DeviceError::new(
            DeviceError::INVALID,
            call,
            format!("[{ptr:#x}, +{nbytes}) is not inside a live device allocation"),
        ))
    }

    fn event(&self, call: &'static str, event: EventHandle) -> DeviceResult<Arc<HostEvent>> {
        self.events.lock().get(&event).cloned().ok_or_else(|| {
            DeviceError::new(
                DeviceError::INVALID,
                call,
                format!("unknown event {event:#x}"),
            )
        })
    }

    /// Runs `work` in order on `stream` (inline for stream 0).
    fn enqueue(&self, call: &'static str, stream: StreamHandle, work: Work) -> DeviceResult<()> {
        if stream == 0 {
            work();
            return Ok(());
        }
        let streams = self.streams.lock();
        let s = streams.get(&stream).ok_or_else(|| {
            DeviceError::new(
                DeviceError::INVALID,
                call,
                format!("unknown stream {stream:#x}"),
            )
        })?;
        s.pending.fetch_add(1, Ordering::AcqRel);
        s.sender.send(work).map_err(|_| {
            s.pending.fetch_sub(1, Ordering::AcqRel);
            DeviceError::new(DeviceError::INTERNAL, call, "stream worker has exited")
        })
    }
}

impl Drop for HostDevice {
    fn drop(&mut self) {
        let streams: Vec<HostStream> = self.streams.lock().drain().map(|(_, s)| s).collect();
        for mut s in streams {
            drop(s.sender);
            if let Some(worker) = s.worker.take() {
                let _ = worker.join();
            }
        }
    }
}

impl DeviceOps for HostDevice {
    fn describe(&self) -> String {
        "host (CPU simulation: host memory, one worker thread per stream)".to_string()
    }

    fn is_host(&self) -> bool {
        true
    }

    fn allocate(&self, nbytes: u64, _stream: StreamHandle) -> DeviceResult<DevicePtr> {
        let size = nbytes.max(1);
        let total = self.allocated.fetch_add(size, Ordering::AcqRel) + size;
        if total > self.memory_limit || usize::try_from(size).is_err() {
            self.allocated.fetch_sub(size, Ordering::AcqRel);
            return Err(DeviceError::new(
                DeviceError::OUT_OF_MEMORY,
                "allocate",
                format!(
                    "cannot allocate {nbytes} bytes: {} of {} bytes in use",
                    total - size,
                    self.memory_limit
                ),
            ));
        }
        let bytes: Box<[UnsafeCell<u8>]> = (0..size).map(|_| UnsafeCell::new(0u8)).collect();
        let alloc = Arc::new(Allocation { bytes });
        let ptr = alloc.addr();
        self.memory.lock().insert(ptr, alloc);
        Ok(ptr)
    }

    fn free(&self, ptr: DevicePtr) -> DeviceResult<()> {
        match self.memory.lock().remove(&ptr) {
            Some(alloc) => {
                self.allocated.fetch_sub(alloc.len(), Ordering::AcqRel);
                Ok(())
            }
            None => Err(DeviceError::new(
                DeviceError::INVALID,
                "free",
                format!("{ptr:#x} is not a live device allocation"),
            )),
        }
    }

    unsafe fn memcpy_async(
        &self,
        kind: CopyKind,
        dst: u64,
        src: u64,
        nbytes: u64,
        stream: StreamHandle,
    ) -> DeviceResult<()> {
        if nbytes == 0 {
            return Ok(());
        }
        let len = usize::try_from(nbytes).map_err(|_| {
            DeviceError::new(
                DeviceError::INVALID,
                "memcpy_async",
                "size does not fit the host",
            )
        })?;
        // Keep the device allocations alive until the copy has run.
        let keep: Vec<Arc<Allocation>> = match kind {
            CopyKind::HostToDevice => vec![self.device_range("memcpy_async", dst, nbytes)?],
            CopyKind::DeviceToHost => vec![self.device_range("memcpy_async", src, nbytes)?],
            CopyKind::DeviceToDevice => vec![
                self.device_range("memcpy_async", dst, nbytes)?,
                self.device_range("memcpy_async", src, nbytes)?,
            ],
        };
        self.enqueue(
            "memcpy_async",
            stream,
            Box::new(move || {
                // SAFETY: device ranges were checked above and are kept alive by `keep`; host
                // ranges are valid per this function's contract. `copy` allows overlap (D2D).
                unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, len) };
                drop(keep);
            }),
        )
    }

    fn stream_create(&self, _priority: i32) -> DeviceResult<StreamHandle> {
        let handle = self.handle();
        let (sender, receiver) = mpsc::channel::<Work>();
        let pending = Arc::new(AtomicU64::new(0));
        let worker_pending = Arc::clone(&pending);
        let worker = std::thread::Builder::new()
            .name(format!("pygpukit-host-stream-{handle:x}"))
            .spawn(move || {
                while let Ok(work) = receiver.recv() {
                    work();
                    worker_pending.fetch_sub(1, Ordering::AcqRel);
                }
            })
            .map_err(|e| DeviceError::new(DeviceError::INTERNAL, "stream_create", e.to_string()))?;
        self.streams.lock().insert(
            handle,
            HostStream {
                sender,
                pending,
                worker: Some(worker),
            },
        );
        Ok(handle)
    }

    fn stream_destroy(&self, stream: StreamHandle) -> DeviceResult<()> {
        let removed = self.streams.lock().remove(&stream);
        match removed {
            Some(mut s) => {
                drop(s.sender);
                if let Some(worker) = s.worker.take() {
                    let _ = worker.join();
                }
                Ok(())
            }
            None => Err(DeviceError::new(
                DeviceError::INVALID,
                "stream_destroy",
                format!("unknown stream {stream:#x}"),
            )),
        }
    }

    fn stream_synchronize(&self, stream: StreamHandle) -> DeviceResult<()> {
        if stream == 0 {
            return Ok(());
        }
        let (tx, rx) = mpsc::channel::<()>();
        self.enqueue(
            "stream_synchronize",
            stream,
            Box::new(move || {
                let _ = tx.send(());
            }),
        )?;
        rx.recv().map_err(|_| {
            DeviceError::new(
                DeviceError::INTERNAL,
                "stream_synchronize",
                "stream worker has exited",
            )
        })
    }

    fn stream_query(&self, stream: StreamHandle) -> DeviceResult<bool> {
        if stream == 0 {
            return Ok(true);
        }
        let streams = self.streams.lock();
        let s = streams.get(&stream).ok_or_else(|| {
            DeviceError::new(
                DeviceError::INVALID,
                "stream_query",
                format!("unknown stream {stream:#x}"),
            )
        })?;
        Ok(s.pending.load(Ordering::Acquire) == 0)
    }

    fn stream_wait_event(&self, stream: StreamHandle, event: EventHandle) -> DeviceResult<()> {
        let ev = self.event("stream_wait_event", event)?;
        let generation = ev.state.lock().recorded;
        self.enqueue(
            "stream_wait_event",
            stream,
            Box::new(move || ev.wait_for(generation)),
        )
    }

    fn event_create(&self, timing: bool) -> DeviceResult<EventHandle> {
        let handle = self.handle();
        self.events.lock().insert(
            handle,
            Arc::new(HostEvent {
                state: Mutex::new(EventState::default()),
                done: Condvar::new(),
                timing,
            }),
        );
        Ok(handle)
    }

    fn event_destroy(&self, event: EventHandle) -> DeviceResult<()> {
        self.events
            .lock()
            .remove(&event)
            .map(|_| ())
            .ok_or_else(|| {
                DeviceError::new(
                    DeviceError::INVALID,
                    "event_destroy",
                    format!("unknown event {event:#x}"),
                )
            })
    }

    fn event_record(&self, event: EventHandle, stream: StreamHandle) -> DeviceResult<()> {
        let ev = self.event("event_record", event)?;
        let generation = {
            let mut state = ev.state.lock();
            state.recorded += 1;
            state.recorded
        };
        let signal = Arc::clone(&ev);
        let result = self.enqueue(
            "event_record",
            stream,
            Box::new(move || signal.complete(generation)),
        );
        if result.is_err() {
            // Nothing will complete this recording: treat it as complete so waiters do not hang.
            ev.complete(generation);
        }
        result
    }

    fn event_synchronize(&self, event: EventHandle) -> DeviceResult<()> {
        let ev = self.event("event_synchronize", event)?;
        let generation = ev.state.lock().recorded;
        ev.wait_for(generation);
        Ok(())
    }

    fn event_query(&self, event: EventHandle) -> DeviceResult<bool> {
        let ev = self.event("event_query", event)?;
        let state = ev.state.lock();
        Ok(state.completed >= state.recorded)
    }

    fn event_elapsed_ms(&self, start: EventHandle, end: EventHandle) -> DeviceResult<f32> {
        let (a, b) = (
            self.event("event_elapsed_ms", start)?,
            self.event("event_elapsed_ms", end)?,
        );
        if !a.timing || !b.timing {
            return Err(DeviceError::new(
                DeviceError::INVALID,
                "event_elapsed_ms",
                "both events must be created with timing enabled",
            ));
        }
        let time = |e: &HostEvent| {
            let s = e.state.lock();
            if s.recorded == 0 || s.completed < s.recorded {
                None
            } else {
                s.at
            }
        };
        match (time(&a), time(&b)) {
            (Some(t0), Some(t1)) => {
                let ms = if t1 >= t0 {
                    t1.duration_since(t0).as_secs_f64() * 1e3
                } else {
                    -(t0.duration_since(t1).as_secs_f64() * 1e3)
                };
                Ok(ms as f32)
            }
            _ => Err(DeviceError::new(
                DeviceError::INVALID,
                "event_elapsed_ms",
                "both events must have been recorded and completed",
            )),
        }
    }

    unsafe fn launch(
        &self,
        function: u64,
        dims: LaunchDims,
        stream: StreamHandle,
        params: &[*mut c_void],
    ) -> DeviceResult<()> {
        let entry = self.kernels.lock().get(&function).cloned().ok_or_else(|| {
            DeviceError::new(
                DeviceError::INVALID,
                "launch",
                format!("unknown host kernel {function:#x}"),
            )
        })?;
        if params.len() != entry.param_sizes.len() {
            return Err(DeviceError::new(
                DeviceError::INVALID,
                "launch",
                format!(
                    "host kernel {function:#x} takes {} arguments, got {}",
                    entry.param_sizes.len(),
                    params.len()
                ),
            ));
        }
        let args: Vec<Vec<u8>> = params
            .iter()
            .zip(&entry.param_sizes)
            .map(|(&p, &size)| {
                // SAFETY: the caller guarantees each pointer addresses a value of the parameter's
                // size; the bytes are copied now, as the driver copies kernel parameters at launch.
                unsafe { std::slice::from_raw_parts(p as *const u8, size) }.to_vec()
            })
            .collect();
        self.enqueue(
            "launch",
            stream,
            Box::new(move || (entry.body)(dims, &args)),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn copies_round_trip_through_device_memory_on_a_stream() {
        let dev = HostDevice::new();
        let stream = dev.stream_create(0).unwrap();
        let a = dev.allocate(64, stream).unwrap();
        let b = dev.allocate(64, stream).unwrap();
        let src: Vec<u8> = (0..64).collect();
        let mut out = vec![0u8; 64];
        unsafe {
            dev.memcpy_async(CopyKind::HostToDevice, a, src.as_ptr() as u64, 64, stream)
                .unwrap();
            dev.memcpy_async(CopyKind::DeviceToDevice, b, a, 64, stream)
                .unwrap();
            dev.memcpy_async(
                CopyKind::DeviceToHost,
                out.as_mut_ptr() as u64,
                b,
                64,
                stream,
            )
            .unwrap();
        }
        dev.stream_synchronize(stream).unwrap();
        assert_eq!(out, src);
        dev.free(a).unwrap();
        dev.free(b).unwrap();
        assert_eq!(dev.allocated_bytes(), 0);
        dev.stream_destroy(stream).unwrap();
    }

    #[test]
    fn out_of_range_copies_and_unknown_handles_are_refused() {
        let dev = HostDevice::new();
        let a = dev.allocate(16, 0).unwrap();
        let host = [0u8; 32];
        let err =
            unsafe { dev.memcpy_async(CopyKind::HostToDevice, a, host.as_ptr() as u64, 32, 0) }
                .unwrap_err();
        assert_eq!(err.code, DeviceError::INVALID);
        assert!(dev.free(a + 1).is_err());
        assert!(dev.stream_query(12345).is_err());
        assert!(dev.event_query(12345).is_err());
        dev.free(a).unwrap();
        assert_eq!(dev.free(a).unwrap_err().code, DeviceError::INVALID);
    }

    #[test]
    fn events_complete_after_earlier_work_and_order_streams() {
        let dev = HostDevice::new();
        let (s1, s2) = (dev.stream_create(0).unwrap(), dev.stream_create(0).unwrap());
        let gate = Arc::new((Mutex::new(false), Condvar::new()));
        let g = Arc::clone(&gate);
        let kernel = dev.register_kernel(
            vec![],
            Arc::new(move |_, _| {
                let mut open = g.0.lock();
                while !*open {
                    g.1.wait(&mut open);
                }
            }),
        );
        let dims = LaunchDims {
            grid: [1; 3],
            block: [1; 3],
            shared_bytes: 0,
        };
        let ev = dev.event_create(true).unwrap();
        assert!(
            dev.event_query(ev).unwrap(),
            "an unrecorded event counts as complete"
        );
        unsafe { dev.launch(kernel, dims, s1, &[]).unwrap() };
        dev.event_record(ev, s1).unwrap();
        dev.stream_wait_event(s2, ev).unwrap();
        let after = dev.event_create(true).unwrap();
        dev.event_record(after, s2).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        assert!(!dev.event_query(ev).unwrap());
        assert!(!dev.event_query(after).unwrap(), "s2 waits for s1's event");
        assert!(!dev.stream_query(s1).unwrap());
        *gate.0.lock() = true;
        gate.1.notify_all();
        dev.event_synchronize(after).unwrap();
        assert!(dev.event_query(ev).unwrap());
        assert!(dev.event_elapsed_ms(ev, after).unwrap() >= 0.0);
    }

    #[test]
    fn memory_limit_makes_allocation_fail_with_out_of_memory() {
        let dev = HostDevice::with_memory_limit(100);
        let a = dev.allocate(60, 0).unwrap();
        let err = dev.allocate(60, 0).unwrap_err();
        assert_eq!(err.code, DeviceError::OUT_OF_MEMORY);
        dev.free(a).unwrap();
        dev.allocate(60, 0).unwrap();
    }
}
