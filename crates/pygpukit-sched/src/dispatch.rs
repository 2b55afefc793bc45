//! [`KernelDispatcher`]: kernel launches with a per-stream limit on work in flight, a lifecycle per
//! launch, and completion detected by events.
//!
//! ```text
//! Queued --(room on its stream)--> Launched --(event done)--> Completed
//!    |  \--(caller-launched work)--> Ready --mark_launched--^     \--failed--> Failed
//!    +-----------cancel (Queued or Ready)-----------------------------------> Cancelled
//! ```
//!
//! A request either carries a [`LaunchSpec`] (the dispatcher launches it through
//! [`DeviceOps::launch`]) or not (the caller launches the work itself once the dispatcher hands it
//! out by [`KernelDispatcher::get_ready`], then calls [`KernelDispatcher::mark_launched`]). Either
//! way an event is recorded on the stream right after the work, and the request counts against the
//! stream's limit until that event completes. Streams are independent: each has its own lock, and
//! requests are found through a sharded table.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};

use crate::clock::now_ns;
use crate::device::{DeviceOps, EventHandle, LaunchDims, StreamHandle};
use crate::error::{Result, SchedError};

/// A kernel launch the dispatcher performs: the function handle, its dimensions, and the
/// arguments packed as in pygpukit core (one byte buffer, each argument at its offset).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaunchSpec {
    /// The function handle (CUfunction, or a HostDevice kernel handle).
    pub function: u64,
    /// Grid, block and shared memory.
    pub dims: LaunchDims,
    /// Packed argument bytes.
    pub params: Vec<u8>,
    /// Offset of each argument in `params`.
    pub offsets: Vec<u32>,
}

impl LaunchSpec {
    fn validate(&self) -> Result<()> {
        if let Some(bad) = self
            .offsets
            .iter()
            .find(|o| **o as usize >= self.params.len())
        {
            return Err(SchedError::invalid(
                "offsets",
                bad,
                format!(
                    "every offset must be inside the {}-byte parameter buffer",
                    self.params.len()
                ),
            ));
        }
        let dims_ok = self
            .dims
            .grid
            .iter()
            .chain(&self.dims.block)
            .all(|d| *d >= 1);
        if !dims_ok {
            return Err(SchedError::invalid(
                "dims",
                format!("grid {:?} block {:?}", self.dims.grid, self.dims.block),
                "every grid and block dimension must be at least 1",
            ));
        }
        Ok(())
    }
}

/// Where a dispatched request is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KernelState {
    /// Waiting for room on its stream.
    Queued,
    /// Handed to the caller to launch (caller-launched requests only).
    Ready,
    /// On the stream.
    Launched,
    /// Done.
    Completed,
    /// The launch failed, or the caller reported failure.
    Failed,
    /// Cancelled before launch.
    Cancelled,
}

impl KernelState {
    /// Lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            KernelState::Queued => "queued",
            KernelState::Ready => "ready",
            KernelState::Launched => "launched",
            KernelState::Completed => "completed",
            KernelState::Failed => "failed",
            KernelState::Cancelled => "cancelled",
        }
    }

    /// True for Completed, Failed and Cancelled.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            KernelState::Completed | KernelState::Failed | KernelState::Cancelled
        )
    }
}

/// A request's state, from [`KernelDispatcher::info`].
#[derive(Clone, Debug, PartialEq)]
pub struct KernelInfo {
    /// Request id.
    pub id: u64,
    /// Its stream.
    pub stream: StreamHandle,
    /// Priority.
    pub priority: i32,
    /// State.
    pub state: KernelState,
    /// Why it failed.
    pub error: Option<String>,
    /// Nanoseconds from submission to launch and to completion (0 if not yet).
    pub launch_delay_ns: u64,
    /// See `launch_delay_ns`.
    pub completion_ns: u64,
}

/// Counters of one stream, from [`KernelDispatcher::stream_stats`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct DispatchStats {
    /// Most requests in flight (Ready or Launched) at once.
    pub limit: usize,
    /// Requests waiting for room.
    pub queued: usize,
    /// Requests Ready or Launched.
    pub in_flight: usize,
    /// Most requests that were in flight at once so far.
    pub peak_in_flight: usize,
    /// Requests launched.
    pub launched: u64,
    /// Requests completed.
    pub completed: u64,
    /// Requests failed.
    pub failed: u64,
    /// Requests cancelled.
    pub cancelled: u64,
}

struct Record {
    stream: StreamHandle,
    priority: i32,
    spec: Option<LaunchSpec>,
    state: KernelState,
    event: Option<EventHandle>,
    error: Option<String>,
    queued_ns: u64,
    launched_ns: u64,
    completed_ns: u64,
}

#[derive(Default)]
struct LaneState {
    limit: usize,
    queue: BinaryHeap<(i32, Reverse<u64>)>,
    /// Ready or Launched requests (they hold a slot).
    active: usize,
    /// Launched requests with their events, in stream order.
    launched: VecDeque<(u64, EventHandle)>,
    /// Caller-launched requests made Ready and not yet handed out.
    ready: VecDeque<u64>,
    free_events: Vec<EventHandle>,
    stats: DispatchStats,
}

struct Lane {
    stream: StreamHandle,
    state: Mutex<LaneState>,
}

const RECORD_SHARDS: usize = 16;

/// Dispatches kernels onto streams under per-stream in-flight limits; thread-safe.
pub struct KernelDispatcher {
    device: Arc<dyn DeviceOps>,
    default_limit: usize,
    lanes: RwLock<HashMap<StreamHandle, Arc<Lane>>>,
    records: Vec<Mutex<HashMap<u64, Record>>>,
    owned_streams: Mutex<Vec<StreamHandle>>,
    next: AtomicU64,
}

fn check_limit(limit: usize) -> Result<()> {
    if limit == 0 || limit > 65_536 {
        return Err(SchedError::invalid(
            "max_in_flight",
            limit,
            "must be in [1, 65536]",
        ));
    }
    Ok(())
}

impl KernelDispatcher {
    /// A dispatcher allowing `max_in_flight` requests per stream unless a stream sets its own.
    pub fn new(device: Arc<dyn DeviceOps>, max_in_flight: usize) -> Result<Self> {
        check_limit(max_in_flight)?;
        Ok(KernelDispatcher {
            device,
            default_limit: max_in_flight,
            lanes: RwLock::new(HashMap::new()),
            records: (0..RECORD_SHARDS)
                .map(|_| Mutex::new(HashMap::new()))
                .collect(),
            owned_streams: Mutex::new(Vec::new()),
            next: AtomicU64::new(1),
        })
    }

    /// The in-flight limit of streams that did not set their own.
    pub fn default_limit(&self) -> usize {
        self.default_limit
    }

    fn records(&self, id: u64) -> parking_lot::MutexGuard<'_, HashMap<u64, Record>> {
        self.records[(id as usize) % RECORD_SHARDS].lock()
    }

    /// Sets `stream`'s in-flight limit (registering the stream if needed).
    pub fn set_limit(&self, stream: StreamHandle, max_in_flight: usize) -> Result<()> {
        check_limit(max_in_flight)?;
        let lane = self.lane_or_register(stream);
        let mut st = lane.state.lock();
        st.limit = max_in_flight;
        st.stats.limit = max_in_flight;
        self.pump(&lane, &mut st);
        Ok(())
    }

    /// Creates a stream owned by the dispatcher (destroyed with it) with its own limit.
    pub fn create_stream(&self, priority: i32, max_in_flight: usize) -> Result<StreamHandle> {
        check_limit(max_in_flight)?;
        let stream = self.device.stream_create(priority)?;
        self.owned_streams.lock().push(stream);
        self.set_limit(stream, max_in_flight)?;
        Ok(stream)
    }

    fn lane_or_register(&self, stream: StreamHandle) -> Arc<Lane> {
        if let Some(l) = self.lanes.read().get(&stream) {
            return Arc::clone(l);
        }
        let mut lanes = self.lanes.write();
        Arc::clone(lanes.entry(stream).or_insert_with(|| {
            Arc::new(Lane {
                stream,
                state: Mutex::new(LaneState {
                    limit: self.default_limit,
                    stats: DispatchStats {
                        limit: self.default_limit,
                        ..DispatchStats::default()
                    },
                    ..LaneState::default()
                }),
            })
        }))
    }

    fn lane(&self, stream: StreamHandle) -> Result<Arc<Lane>> {
        self.lanes
            .read()
            .get(&stream)
            .cloned()
            .ok_or_else(|| SchedError::unknown("stream", stream))
    }

    /// Queues a request on `stream`: a kernel the dispatcher launches (`spec`), or, with `None`,
    /// work the caller launches once [`KernelDispatcher::get_ready`] hands it out. Higher
    /// `priority` goes first among queued requests of the stream.
    pub fn submit(
        &self,
        stream: StreamHandle,
        spec: Option<LaunchSpec>,
        priority: i32,
    ) -> Result<u64> {
        if let Some(s) = &spec {
            s.validate()?;
        }
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.records(id).insert(
            id,
            Record {
                stream,
                priority,
                spec,
                state: KernelState::Queued,
                event: None,
                error: None,
                queued_ns: now_ns(),
                launched_ns: 0,
                completed_ns: 0,
            },
        );
        let lane = self.lane_or_register(stream);
        let mut st = lane.state.lock();
        st.queue.push((priority, Reverse(id)));
        st.stats.queued += 1;
        self.pump(&lane, &mut st);
        Ok(id)
    }

    fn event(&self, st: &mut LaneState) -> Result<EventHandle> {
        match st.free_events.pop() {
            Some(e) => Ok(e),
            None => Ok(self.device.event_create(false)?),
        }
    }

    /// Retires completed launches (in stream order), then fills free slots from the queue.
    fn pump(&self, lane: &Lane, st: &mut LaneState) {
        while let Some(&(id, event)) = st.launched.front() {
            if !self.device.event_query(event).unwrap_or(true) {
                break;
            }
            st.launched.pop_front();
            st.free_events.push(event);
            st.active -= 1;
            let mut records = self.records(id);
            if let Some(r) = records.get_mut(&id) {
                if r.state == KernelState::Launched {
                    r.state = KernelState::Completed;
                    r.completed_ns = now_ns();
                    r.event = None;
                    st.stats.completed += 1;
                }
            }
        }
        while st.active < st.limit {
            let Some((_, Reverse(id))) = st.queue.pop() else {
                break;
            };
            st.stats.queued = st.stats.queued.saturating_sub(1);
            let mut records = self.records(id);
            let Some(r) = records.get_mut(&id) else {
                continue;
            };
            if r.state != KernelState::Queued {
                continue; // cancelled
            }
            match r.spec.take() {
                None => {
                    r.state = KernelState::Ready;
                    st.active += 1;
                    st.ready.push_back(id);
                }
                Some(spec) => {
                    drop(records);
                    let outcome = self.launch(lane.stream, &spec, st);
                    let mut records = self.records(id);
                    let Some(r) = records.get_mut(&id) else {
                        continue;
                    };
                    match outcome {
                        Ok(event) => {
                            r.state = KernelState::Launched;
                            r.launched_ns = now_ns();
                            r.event = Some(event);
                            st.active += 1;
                            st.launched.push_back((id, event));
                            st.stats.launched += 1;
                        }
                        Err(e) => {
                            r.state = KernelState::Failed;
                            r.error = Some(e.to_string());
                            st.stats.failed += 1;
                        }
                    }
                }
            }
            st.stats.peak_in_flight = st.stats.peak_in_flight.max(st.active);
        }
        st.stats.in_flight = st.active;
    }

    fn launch(
        &self,
        stream: StreamHandle,
        spec: &LaunchSpec,
        st: &mut LaneState,
    ) -> Result<EventHandle> {
        let base = spec.params.as_ptr();
        let params: Vec<*mut c_void> = spec
            .offsets
            .iter()
            // SAFETY: offsets were checked to lie inside `params`.
            .map(|o| unsafe { base.add(*o as usize) } as *mut c_void)
            .collect();
        // SAFETY: the pointers address the packed arguments, which live until this call returns
        // (the driver copies kernel parameters at launch).
        unsafe {
            self.device
                .launch(spec.function, spec.dims, stream, &params)?
        };
        let event = self.event(st)?;
        if let Err(e) = self.device.event_record(event, stream) {
            st.free_events.push(event);
            return Err(e.into());
        }
        Ok(event)
    }

    /// Hands out up to `max` caller-launched requests that have a slot (over all streams), as
    /// (id, stream) pairs. Launch each on its stream, then call [`KernelDispatcher::mark_launched`].
    pub fn get_ready(&self, max: usize) -> Vec<(u64, StreamHandle)> {
        let lanes: Vec<Arc<Lane>> = self.lanes.read().values().cloned().collect();
        let mut out = Vec::new();
        for lane in lanes {
            let mut st = lane.state.lock();
            self.pump(&lane, &mut st);
            while out.len() < max {
                match st.ready.pop_front() {
                    Some(id) => out.push((id, lane.stream)),
                    None => break,
                }
            }
        }
        out
    }

    /// Records that the caller launched Ready request `id` on its stream (an event is recorded
    /// there now; the request completes when the event does).
    pub fn mark_launched(&self, id: u64) -> Result<()> {
        let stream = self.stream_of(id)?;
        let lane = self.lane(stream)?;
        let mut st = lane.state.lock();
        {
            let records = self.records(id);
            let r = records
                .get(&id)
                .ok_or_else(|| SchedError::unknown("kernel", id))?;
            if r.state != KernelState::Ready {
                return Err(SchedError::transition(
                    "kernel",
                    id,
                    r.state.name(),
                    "mark it launched",
                ));
            }
        }
        let event = self.event(&mut st)?;
        if let Err(e) = self.device.event_record(event, stream) {
            st.free_events.push(event);
            return Err(e.into());
        }
        st.ready.retain(|r| *r != id);
        let mut records = self.records(id);
        let r = records
            .get_mut(&id)
            .ok_or_else(|| SchedError::unknown("kernel", id))?;
        r.state = KernelState::Launched;
        r.launched_ns = now_ns();
        r.event = Some(event);
        st.launched.push_back((id, event));
        st.stats.launched += 1;
        Ok(())
    }

    fn stream_of(&self, id: u64) -> Result<StreamHandle> {
        self.records(id)
            .get(&id)
            .map(|r| r.stream)
            .ok_or_else(|| SchedError::unknown("kernel", id))
    }

    /// Ends request `id` as `to` (Completed or Failed from Launched, Failed or Cancelled from Ready,
    /// Cancelled from Queued), freeing its slot.
    fn finish(
        &self,
        id: u64,
        allowed: &[KernelState],
        to: KernelState,
        error: Option<String>,
    ) -> Result<()> {
        let stream = self.stream_of(id)?;
        let lane = self.lane(stream)?;
        let mut st = lane.state.lock();
        let from = {
            let mut records = self.records(id);
            let r = records
                .get_mut(&id)
                .ok_or_else(|| SchedError::unknown("kernel", id))?;
            if !allowed.contains(&r.state) {
                let op = match to {
                    KernelState::Completed => "complete",
                    KernelState::Failed => "fail",
                    _ => "cancel",
                };
                return Err(SchedError::transition("kernel", id, r.state.name(), op));
            }
            let from = r.state;
            r.state = to;
            r.error = error;
            r.completed_ns = now_ns();
            r.spec = None;
            r.event = None;
            from
        };
        match from {
            KernelState::Launched => {
                if let Some(pos) = st.launched.iter().position(|(x, _)| *x == id) {
                    let (_, event) = st.launched.remove(pos).expect("position is valid");
                    // The event may still be pending; wait before reusing it.
                    let _ = self.device.event_synchronize(event);
                    st.free_events.push(event);
                }
                st.active -= 1;
            }
            KernelState::Ready => {
                st.ready.retain(|r| *r != id);
                st.active -= 1;
            }
            _ => {}
        }
        match to {
            KernelState::Completed => st.stats.completed += 1,
            KernelState::Failed => st.stats.failed += 1,
            _ => st.stats.cancelled += 1,
        }
        self.pump(&lane, &mut st);
        Ok(())
    }

    /// Reports that launched request `id` completed (without waiting for its event).
    pub fn completed(&self, id: u64) -> Result<()> {
        self.finish(id, &[KernelState::Launched], KernelState::Completed, None)
    }

    /// Reports that request `id` failed (Ready or Launched).
    pub fn failed(&self, id: u64, error: &str) -> Result<()> {
        self.finish(
            id,
            &[KernelState::Ready, KernelState::Launched],
            KernelState::Failed,
            Some(error.to_string()),
        )
    }

    /// Cancels request `id` before launch (Queued or Ready).
    pub fn cancel(&self, id: u64) -> Result<()> {
        self.finish(
            id,
            &[KernelState::Queued, KernelState::Ready],
            KernelState::Cancelled,
            Some("cancelled".to_string()),
        )
    }

    /// Retires completed launches and fills free slots on every stream; returns how many
    /// requests are still not finished.
    pub fn poll(&self) -> usize {
        let lanes: Vec<Arc<Lane>> = self.lanes.read().values().cloned().collect();
        let mut open = 0;
        for lane in lanes {
            let mut st = lane.state.lock();
            self.pump(&lane, &mut st);
            open += st.active + st.stats.queued;
        }
        open
    }

    /// Request `id`'s state (after retiring completed launches on its stream).
    pub fn info(&self, id: u64) -> Result<KernelInfo> {
        let stream = self.stream_of(id)?;
        let lane = self.lane(stream)?;
        {
            let mut st = lane.state.lock();
            self.pump(&lane, &mut st);
        }
        let records = self.records(id);
        let r = records
            .get(&id)
            .ok_or_else(|| SchedError::unknown("kernel", id))?;
        let since = |t: u64| {
            if t > 0 {
                t.saturating_sub(r.queued_ns)
            } else {
                0
            }
        };
        Ok(KernelInfo {
            id,
            stream: r.stream,
            priority: r.priority,
            state: r.state,
            error: r.error.clone(),
            launch_delay_ns: since(r.launched_ns),
            completion_ns: since(r.completed_ns),
        })
    }

    /// Request `id`'s state.
    pub fn state(&self, id: u64) -> Result<KernelState> {
        Ok(self.info(id)?.state)
    }

    /// Blocks until request `id` is finished and returns its final state. Waiting on a Ready
    /// (caller-launched, not yet launched) request is refused, since only the caller can move it.
    pub fn wait(&self, id: u64) -> Result<KernelState> {
        loop {
            let stream = self.stream_of(id)?;
            let lane = self.lane(stream)?;
            let target = {
                let mut st = lane.state.lock();
                self.pump(&lane, &mut st);
                let records = self.records(id);
                let r = records
                    .get(&id)
                    .ok_or_else(|| SchedError::unknown("kernel", id))?;
                match r.state {
                    s if s.is_terminal() => return Ok(s),
                    KernelState::Ready => {
                        return Err(SchedError::transition(
                            "kernel",
                            id,
                            "ready",
                            "wait before it is launched",
                        ))
                    }
                    KernelState::Launched => r.event,
                    _ => st.launched.front().map(|(_, e)| *e),
                }
            };
            match target {
                Some(e) => self.device.event_synchronize(e)?,
                // Queued behind Ready requests only the caller can move: nothing to wait on here.
                None => {
                    return Err(SchedError::transition(
                        "kernel",
                        id,
                        "queued behind caller-launched requests",
                        "wait",
                    ))
                }
            }
        }
    }

    /// Counters of `stream`.
    pub fn stream_stats(&self, stream: StreamHandle) -> Result<DispatchStats> {
        let lane = self.lane(stream)?;
        let mut st = lane.state.lock();
        self.pump(&lane, &mut st);
        Ok(st.stats)
    }

    /// Streams known to the dispatcher, sorted.
    pub fn streams(&self) -> Vec<StreamHandle> {
        let mut v: Vec<StreamHandle> = self.lanes.read().keys().copied().collect();
        v.sort_unstable();
        v
    }

    /// Forgets finished requests; returns how many.
    pub fn prune_finished(&self) -> usize {
        self.records
            .iter()
            .map(|shard| {
                let mut m = shard.lock();
                let before = m.len();
                m.retain(|_, r| !r.state.is_terminal());
                before - m.len()
            })
            .sum()
    }
}

impl Drop for KernelDispatcher {
    fn drop(&mut self) {
        let lanes: Vec<Arc<Lane>> = self.lanes.get_mut().drain().map(|(_, l)| l).collect();
        for lane in lanes {
            let _ = self.device.stream_synchronize(lane.stream);
            let mut st = lane.state.lock();
            let mut events: Vec<EventHandle> = st.free_events.drain(..).collect();
            events.extend(st.launched.drain(..).map(|(_, e)| e));
            for e in events {
                let _ = self.device.event_destroy(e);
            }
        }
        for s in self.owned_streams.get_mut().drain(..) {
            let _ = self.device.stream_destroy(s);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::HostDevice;
    use std::sync::atomic::AtomicUsize;

    fn dims() -> LaunchDims {
        LaunchDims {
            grid: [1; 3],
            block: [1; 3],
            shared_bytes: 0,
        }
    }

    #[test]
    fn launches_respect_the_in_flight_limit_and_complete_by_event() {
        let dev = Arc::new(HostDevice::new());
        let gate = Arc::new((parking_lot::Mutex::new(false), parking_lot::Condvar::new()));
        let ran = Arc::new(AtomicUsize::new(0));
        let (g, r) = (gate.clone(), ran.clone());
        let kernel = dev.register_kernel(
            vec![4],
            Arc::new(move |_, args| {
                let mut open = g.0.lock();
                while !*open {
                    g.1.wait(&mut open);
                }
                r.fetch_add(
                    u32::from_ne_bytes(args[0][..4].try_into().unwrap()) as usize,
                    Ordering::SeqCst,
                );
            }),
        );
        let d = KernelDispatcher::new(dev.clone(), 8).unwrap();
        let s = d.create_stream(0, 2).unwrap();
        let spec = |v: u32| LaunchSpec {
            function: kernel,
            dims: dims(),
            params: v.to_ne_bytes().to_vec(),
            offsets: vec![0],
        };
        let ids: Vec<u64> = (1..=5)
            .map(|v| d.submit(s, Some(spec(v)), 0).unwrap())
            .collect();
        let st = d.stream_stats(s).unwrap();
        assert_eq!((st.in_flight, st.queued, st.launched), (2, 3, 2));
        assert_eq!(d.state(ids[2]).unwrap(), KernelState::Queued);
        d.cancel(ids[4]).unwrap();
        *gate.0.lock() = true;
        gate.1.notify_all();
        assert_eq!(d.wait(ids[3]).unwrap(), KernelState::Completed);
        assert_eq!(d.poll(), 0);
        assert_eq!(ran.load(Ordering::SeqCst), 1 + 2 + 3 + 4);
        let st = d.stream_stats(s).unwrap();
        assert_eq!((st.completed, st.cancelled, st.peak_in_flight), (4, 1, 2));
        assert!(matches!(
            d.cancel(ids[0]),
            Err(SchedError::InvalidTransition { .. })
        ));
    }

    #[test]
    fn caller_launched_work_goes_through_ready_and_mark_launched() {
        let dev = Arc::new(HostDevice::new());
        let d = KernelDispatcher::new(dev.clone(), 1).unwrap();
        let s = dev.stream_create(0).unwrap();
        let a = d.submit(s, None, 0).unwrap();
        let b = d.submit(s, None, 5).unwrap();
        assert_eq!(d.get_ready(10), vec![(a, s)]);
        assert!(d.wait(a).is_err(), "waiting on unlaunched work would hang");
        d.mark_launched(a).unwrap();
        assert!(matches!(
            d.mark_launched(a),
            Err(SchedError::InvalidTransition { .. })
        ));
        assert_eq!(d.wait(a).unwrap(), KernelState::Completed);
        assert_eq!(d.get_ready(10), vec![(b, s)]);
        d.failed(b, "launch error").unwrap();
        assert_eq!(d.info(b).unwrap().error.as_deref(), Some("launch error"));
        assert!(matches!(d.state(999), Err(SchedError::UnknownId { .. })));
        let bad = LaunchSpec {
            function: 1,
            dims: dims(),
            params: vec![0; 4],
            offsets: vec![4],
        };
        assert!(matches!(
            d.submit(s, Some(bad), 0),
            Err(SchedError::InvalidArgument { .. })
        ));
        assert!(KernelDispatcher::new(dev, 0).is_err());
    }

    #[test]
    fn a_failing_launch_fails_its_request_only() {
        let dev = Arc::new(HostDevice::new());
        let d = KernelDispatcher::new(dev.clone(), 4).unwrap();
        let s = d.create_stream(0, 4).unwrap();
        let id = d
            .submit(
                s,
                Some(LaunchSpec {
                    function: 0xbad,
                    dims: dims(),
                    params: vec![],
                    offsets: vec![],
                }),
                0,
            )
            .unwrap();
        assert_eq!(d.wait(id).unwrap(), KernelState::Failed);
        assert!(d
            .info(id)
            .unwrap()
            .error
            .unwrap()
            .contains("unknown host kernel"));
        assert_eq!(d.stream_stats(s).unwrap().in_flight, 0);
    }
}
