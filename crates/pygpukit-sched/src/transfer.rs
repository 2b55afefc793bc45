//! [`AsyncTransferEngine`]: host-to-device, device-to-host and device-to-device copies queued by
//! priority and executed on one dedicated stream per direction, so copies overlap with compute on
//! other streams and with copies in the other directions.
//!
//! Each direction ("lane") keeps at most `max_concurrent` copies enqueued on its stream; the rest
//! wait in a priority queue (higher priority first, then submission order), so an urgent copy
//! overtakes queued bulk copies. Every issued copy is bracketed by two timing events: completion
//! is detected by querying the second, and the pair gives the copy's place on a device timeline
//! (milliseconds since the engine's reference event) and the lane's achieved bandwidth.
//!
//! Lanes are locked independently; nothing is shared between directions. For the same reason copies
//! in different directions are not ordered with each other (as on any two CUDA streams): wait for a
//! transfer before queueing one in another direction that reads what it writes.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::clock::now_ns;
use crate::device::{CopyKind, DeviceOps, EventHandle, StreamHandle};
use crate::error::{Result, SchedError};

/// Host memory a transfer keeps alive until it has completed.
///
/// # Safety
/// `addr()` must address `len()` bytes that stay valid (and, for a device-to-host destination,
/// writable and not otherwise accessed) for as long as the object lives, and must not change.
pub unsafe trait HostBuffer: Send {
    /// Address of the first byte.
    fn addr(&self) -> u64;
    /// Length in bytes.
    fn len(&self) -> usize;
    /// True when empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

// SAFETY: a Vec's heap buffer does not move while the Vec is not resized, and the engine owns it.
unsafe impl HostBuffer for Vec<u8> {
    fn addr(&self) -> u64 {
        self.as_ptr() as u64
    }
    fn len(&self) -> usize {
        Vec::len(self)
    }
}

/// Where a transfer is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TransferState {
    /// Waiting for a slot on its lane.
    Queued,
    /// Enqueued on the lane's stream.
    InFlight,
    /// Done.
    Completed,
    /// The copy could not be enqueued.
    Failed,
    /// Cancelled while queued.
    Cancelled,
}

impl TransferState {
    /// Lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            TransferState::Queued => "queued",
            TransferState::InFlight => "in_flight",
            TransferState::Completed => "completed",
            TransferState::Failed => "failed",
            TransferState::Cancelled => "cancelled",
        }
    }

    /// True for Completed, Failed and Cancelled.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            TransferState::Completed | TransferState::Failed | TransferState::Cancelled
        )
    }
}

/// A transfer's state, from [`AsyncTransferEngine::status`].
#[derive(Clone, Debug, PartialEq)]
pub struct TransferInfo {
    /// Transfer id.
    pub id: u64,
    /// Direction.
    pub kind: CopyKind,
    /// Bytes.
    pub nbytes: u64,
    /// Priority.
    pub priority: i32,
    /// State.
    pub state: TransferState,
    /// Start and end on the device timeline (ms since the engine's reference event), once done.
    pub timeline: Option<(f64, f64)>,
    /// Why it failed.
    pub error: Option<String>,
}

/// One lane's counters, from [`AsyncTransferEngine::stats`].
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct LaneStats {
    /// Copies waiting for a slot.
    pub queued: usize,
    /// Copies on the stream.
    pub in_flight: usize,
    /// Copies done.
    pub completed: u64,
    /// Copies that failed.
    pub failed: u64,
    /// Bytes copied.
    pub bytes: u64,
    /// Device time spent copying, ms (sum over copies).
    pub busy_ms: f64,
}

impl LaneStats {
    /// Achieved bandwidth while busy, bytes per second (0 before the first copy).
    pub fn bandwidth(&self) -> f64 {
        if self.busy_ms > 0.0 {
            self.bytes as f64 / (self.busy_ms / 1e3)
        } else {
            0.0
        }
    }
}

struct Record {
    kind: CopyKind,
    dst: u64,
    src: u64,
    nbytes: u64,
    priority: i32,
    state: TransferState,
    keep: Option<Box<dyn HostBuffer>>,
    events: Option<(EventHandle, EventHandle)>,
    timeline: Option<(f64, f64)>,
    error: Option<String>,
    enqueued_ns: u64,
}

#[derive(Default)]
struct LaneState {
    queue: BinaryHeap<(i32, Reverse<u64>)>,
    in_flight: VecDeque<u64>,
    records: HashMap<u64, Record>,
    free_events: Vec<EventHandle>,
    stats: LaneStats,
}

struct Lane {
    kind: CopyKind,
    stream: StreamHandle,
    state: Mutex<LaneState>,
}

/// Queues and executes copies on dedicated streams; thread-safe.
pub struct AsyncTransferEngine {
    device: Arc<dyn DeviceOps>,
    max_concurrent: usize,
    lanes: Vec<Lane>,
    reference: EventHandle,
    next: AtomicU64,
}

fn lane_index(kind: CopyKind) -> usize {
    kind as usize
}

impl AsyncTransferEngine {
    /// An engine with at most `max_concurrent` copies on each direction's stream.
    pub fn new(device: Arc<dyn DeviceOps>, max_concurrent: usize) -> Result<Self> {
        if max_concurrent == 0 || max_concurrent > 1024 {
            return Err(SchedError::invalid(
                "max_concurrent",
                max_concurrent,
                "must be in [1, 1024]",
            ));
        }
        let mut lanes = Vec::with_capacity(3);
        for kind in CopyKind::ALL {
            match device.stream_create(0) {
                Ok(stream) => lanes.push(Lane {
                    kind,
                    stream,
                    state: Mutex::new(LaneState::default()),
                }),
                Err(e) => {
                    for l in &lanes {
                        let _ = device.stream_destroy(l.stream);
                    }
                    return Err(e.into());
                }
            }
        }
        let reference = device.event_create(true)?;
        device.event_record(reference, lanes[0].stream)?;
        device.event_synchronize(reference)?;
        Ok(AsyncTransferEngine {
            device,
            max_concurrent,
            lanes,
            reference,
            next: AtomicU64::new(0),
        })
    }

    /// The stream of `kind`'s lane.
    pub fn stream(&self, kind: CopyKind) -> StreamHandle {
        self.lanes[lane_index(kind)].stream
    }

    /// The most copies in flight per direction.
    pub fn max_concurrent(&self) -> usize {
        self.max_concurrent
    }

    /// Queues a copy. `keep` is host memory to hold until the copy is done (it should cover the
    /// host side of the copy).
    ///
    /// # Safety
    /// The host side of a host-to-device or device-to-host copy must be valid for `nbytes` bytes
    /// until the transfer completes (guaranteed when `keep` covers it).
    pub unsafe fn enqueue(
        &self,
        kind: CopyKind,
        dst: u64,
        src: u64,
        nbytes: u64,
        priority: i32,
        keep: Option<Box<dyn HostBuffer>>,
    ) -> Result<u64> {
        let seq = self.next.fetch_add(1, Ordering::Relaxed);
        let id = seq * 4 + kind as u64;
        let lane = &self.lanes[lane_index(kind)];
        let mut st = lane.state.lock();
        st.records.insert(
            id,
            Record {
                kind,
                dst,
                src,
                nbytes,
                priority,
                state: TransferState::Queued,
                keep,
                events: None,
                timeline: None,
                error: None,
                enqueued_ns: now_ns(),
            },
        );
        st.queue.push((priority, Reverse(id)));
        self.poll_lane(lane, &mut st);
        Ok(id)
    }

    /// Queues a host-to-device copy of all of `src` to `dst`.
    pub fn enqueue_h2d(&self, dst: u64, src: Box<dyn HostBuffer>, priority: i32) -> Result<u64> {
        let (addr, len) = (src.addr(), src.len() as u64);
        // SAFETY: the engine keeps `src` alive until the copy is done (HostBuffer's contract).
        unsafe { self.enqueue(CopyKind::HostToDevice, dst, addr, len, priority, Some(src)) }
    }

    /// Queues a device-to-host copy from `src` filling all of `dst`; take the buffer back with
    /// [`AsyncTransferEngine::take_buffer`] once completed.
    pub fn enqueue_d2h(&self, dst: Box<dyn HostBuffer>, src: u64, priority: i32) -> Result<u64> {
        let (addr, len) = (dst.addr(), dst.len() as u64);
        // SAFETY: as for enqueue_h2d; the buffer is writable and owned by the engine meanwhile.
        unsafe { self.enqueue(CopyKind::DeviceToHost, addr, src, len, priority, Some(dst)) }
    }

    /// Queues a device-to-device copy.
    pub fn enqueue_d2d(&self, dst: u64, src: u64, nbytes: u64, priority: i32) -> Result<u64> {
        // SAFETY: no host memory is involved.
        unsafe { self.enqueue(CopyKind::DeviceToDevice, dst, src, nbytes, priority, None) }
    }

    fn event(&self, st: &mut LaneState) -> Result<EventHandle> {
        match st.free_events.pop() {
            Some(e) => Ok(e),
            None => Ok(self.device.event_create(true)?),
        }
    }

    /// Starts queued copies while the lane has room.
    fn issue(&self, lane: &Lane, st: &mut LaneState) {
        while st.in_flight.len() < self.max_concurrent {
            let Some((_, Reverse(id))) = st.queue.pop() else {
                break;
            };
            let Some(rec) = st.records.get(&id) else {
                continue;
            };
            if rec.state != TransferState::Queued {
                continue; // cancelled
            }
            let (kind, dst, src, n) = (rec.kind, rec.dst, rec.src, rec.nbytes);
            let started = self.event(st).and_then(|start| {
                let end = match self.event(st) {
                    Ok(e) => e,
                    Err(err) => {
                        st.free_events.push(start);
                        return Err(err);
                    }
                };
                let issued = self
                    .device
                    .event_record(start, lane.stream)
                    // SAFETY: the host side is valid until completion, by enqueue's contract.
                    .and_then(|()| unsafe {
                        self.device.memcpy_async(kind, dst, src, n, lane.stream)
                    })
                    .and_then(|()| self.device.event_record(end, lane.stream));
                match issued {
                    Ok(()) => Ok((start, end)),
                    Err(err) => {
                        // The events may be recorded; let the stream drain before reusing them.
                        let _ = self.device.stream_synchronize(lane.stream);
                        st.free_events.push(start);
                        st.free_events.push(end);
                        Err(err.into())
                    }
                }
            });
            let rec = st.records.get_mut(&id).expect("looked up above");
            match started {
                Ok(events) => {
                    rec.state = TransferState::InFlight;
                    rec.events = Some(events);
                    st.in_flight.push_back(id);
                }
                Err(err) => {
                    rec.state = TransferState::Failed;
                    rec.error = Some(err.to_string());
                    rec.keep = None;
                    st.stats.failed += 1;
                }
            }
        }
    }

    /// Retires finished copies (in stream order) and issues queued ones.
    fn poll_lane(&self, lane: &Lane, st: &mut LaneState) {
        while let Some(&id) = st.in_flight.front() {
            let Some((start, end)) = st.records.get(&id).and_then(|r| r.events) else {
                st.in_flight.pop_front();
                continue;
            };
            if !self.device.event_query(end).unwrap_or(true) {
                break;
            }
            st.in_flight.pop_front();
            let t0 = self.device.event_elapsed_ms(self.reference, start);
            let t1 = self.device.event_elapsed_ms(self.reference, end);
            st.free_events.push(start);
            st.free_events.push(end);
            let rec = st.records.get_mut(&id).expect("in flight implies a record");
            rec.state = TransferState::Completed;
            rec.events = None;
            if rec.kind != CopyKind::DeviceToHost {
                rec.keep = None;
            }
            let nbytes = rec.nbytes;
            if let (Ok(a), Ok(b)) = (t0, t1) {
                rec.timeline = Some((f64::from(a), f64::from(b)));
                st.stats.busy_ms += f64::from((b - a).max(0.0));
            }
            st.stats.completed += 1;
            st.stats.bytes += nbytes;
        }
        self.issue(lane, st);
    }

    /// Retires finished copies and starts queued ones on every lane.
    pub fn poll(&self) {
        for lane in &self.lanes {
            let mut st = lane.state.lock();
            self.poll_lane(lane, &mut st);
        }
    }

    fn lane_of(&self, id: u64) -> Result<&Lane> {
        self.lanes
            .get((id % 4) as usize)
            .ok_or_else(|| SchedError::unknown("transfer", id))
    }

    /// Transfer `id`'s state (after retiring finished copies on its lane).
    pub fn status(&self, id: u64) -> Result<TransferInfo> {
        let lane = self.lane_of(id)?;
        let mut st = lane.state.lock();
        self.poll_lane(lane, &mut st);
        let r = st
            .records
            .get(&id)
            .ok_or_else(|| SchedError::unknown("transfer", id))?;
        Ok(TransferInfo {
            id,
            kind: r.kind,
            nbytes: r.nbytes,
            priority: r.priority,
            state: r.state,
            timeline: r.timeline,
            error: r.error.clone(),
        })
    }

    /// Blocks until transfer `id` is finished; returns its final state.
    pub fn wait(&self, id: u64) -> Result<TransferState> {
        let lane = self.lane_of(id)?;
        loop {
            let event = {
                let mut st = lane.state.lock();
                self.poll_lane(lane, &mut st);
                let r = st
                    .records
                    .get(&id)
                    .ok_or_else(|| SchedError::unknown("transfer", id))?;
                if r.state.is_terminal() {
                    return Ok(r.state);
                }
                // In flight: wait for it; queued: wait for the oldest copy ahead of it.
                let target = match r.events {
                    Some((_, end)) => Some(end),
                    None => st
                        .in_flight
                        .front()
                        .and_then(|f| st.records.get(f))
                        .and_then(|f| f.events)
                        .map(|(_, end)| end),
                };
                target
            };
            match event {
                Some(e) => self.device.event_synchronize(e)?,
                None => self.device.stream_synchronize(lane.stream)?,
            }
        }
    }

    /// Blocks until every queued and in-flight copy is finished.
    pub fn synchronize(&self) -> Result<()> {
        for lane in &self.lanes {
            loop {
                {
                    let mut st = lane.state.lock();
                    self.poll_lane(lane, &mut st);
                    if st.in_flight.is_empty() && st.queue.is_empty() {
                        break;
                    }
                }
                self.device.stream_synchronize(lane.stream)?;
            }
        }
        Ok(())
    }

    /// Cancels a queued transfer.
    pub fn cancel(&self, id: u64) -> Result<()> {
        let lane = self.lane_of(id)?;
        let mut st = lane.state.lock();
        let r = st
            .records
            .get_mut(&id)
            .ok_or_else(|| SchedError::unknown("transfer", id))?;
        if r.state != TransferState::Queued {
            return Err(SchedError::transition(
                "transfer",
                id,
                r.state.name(),
                "cancel",
            ));
        }
        r.state = TransferState::Cancelled;
        r.keep = None;
        Ok(())
    }

    /// The host buffer of a completed device-to-host transfer (once; the record is kept).
    pub fn take_buffer(&self, id: u64) -> Result<Box<dyn HostBuffer>> {
        let lane = self.lane_of(id)?;
        let mut st = lane.state.lock();
        self.poll_lane(lane, &mut st);
        let r = st
            .records
            .get_mut(&id)
            .ok_or_else(|| SchedError::unknown("transfer", id))?;
        if r.state != TransferState::Completed {
            return Err(SchedError::transition(
                "transfer",
                id,
                r.state.name(),
                "take its buffer",
            ));
        }
        r.keep.take().ok_or_else(|| {
            SchedError::transition("transfer", id, "without a host buffer", "take its buffer")
        })
    }

    /// Milliseconds from the engine's reference event to `event` (a completed timing event of the
    /// same device, e.g. recorded by other code around a kernel), for one shared timeline.
    pub fn event_time_ms(&self, event: EventHandle) -> Result<f64> {
        Ok(f64::from(
            self.device.event_elapsed_ms(self.reference, event)?,
        ))
    }

    /// Counters of `kind`'s lane.
    pub fn lane_stats(&self, kind: CopyKind) -> LaneStats {
        let lane = &self.lanes[lane_index(kind)];
        let mut st = lane.state.lock();
        self.poll_lane(lane, &mut st);
        let queued = st
            .records
            .values()
            .filter(|r| r.state == TransferState::Queued)
            .count();
        LaneStats {
            queued,
            in_flight: st.in_flight.len(),
            ..st.stats
        }
    }

    /// Forgets finished transfers; returns how many.
    pub fn prune_finished(&self) -> usize {
        let mut n = 0;
        for lane in &self.lanes {
            let mut st = lane.state.lock();
            self.poll_lane(lane, &mut st);
            let before = st.records.len();
            st.records.retain(|_, r| !r.state.is_terminal());
            n += before - st.records.len();
        }
        n
    }

    /// How long transfer `id` has been known to the engine, ns (for diagnostics).
    pub fn age_ns(&self, id: u64) -> Result<u64> {
        let lane = self.lane_of(id)?;
        let st = lane.state.lock();
        let r = st
            .records
            .get(&id)
            .ok_or_else(|| SchedError::unknown("transfer", id))?;
        Ok(now_ns().saturating_sub(r.enqueued_ns))
    }

    /// The kind of each lane, in order.
    pub fn lane_kinds(&self) -> Vec<CopyKind> {
        self.lanes.iter().map(|l| l.kind).collect()
    }
}

impl Drop for AsyncTransferEngine {
    fn drop(&mut self) {
        let _ = self.synchronize();
        for lane in &mut self.lanes {
            let st = lane.state.get_mut();
            for e in st.free_events.drain(..) {
                let _ = self.device.event_destroy(e);
            }
            let _ = self.device.stream_destroy(lane.stream);
        }
        let _ = self.device.event_destroy(self.reference);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::HostDevice;

    #[test]
    fn copies_in_all_directions_complete_with_a_timeline() {
        let dev = Arc::new(HostDevice::new());
        let e = AsyncTransferEngine::new(dev.clone(), 2).unwrap();
        let a = dev.allocate(1024, 0).unwrap();
        let b = dev.allocate(1024, 0).unwrap();
        let src: Vec<u8> = (0..1024u32).map(|i| (i % 253) as u8).collect();
        let up = e.enqueue_h2d(a, Box::new(src.clone()), 0).unwrap();
        assert_eq!(e.wait(up).unwrap(), TransferState::Completed);
        let across = e.enqueue_d2d(b, a, 1024, 0).unwrap();
        e.wait(across).unwrap();
        let down = e.enqueue_d2h(Box::new(vec![0u8; 1024]), b, 0).unwrap();
        e.synchronize().unwrap();
        let buf = e.take_buffer(down).unwrap();
        // SAFETY: the buffer is a Vec<u8> of `len` bytes owned by `buf`.
        let bytes = unsafe { std::slice::from_raw_parts(buf.addr() as *const u8, buf.len()) };
        assert_eq!(bytes, &src[..]);
        let info = e.status(down).unwrap();
        let (t0, t1) = info.timeline.unwrap();
        assert!(t0 >= 0.0 && t1 >= t0);
        assert_eq!(e.lane_stats(CopyKind::HostToDevice).bytes, 1024);
        assert!(
            e.take_buffer(down).is_err(),
            "the buffer is handed out once"
        );
        assert!(matches!(
            e.cancel(down),
            Err(SchedError::InvalidTransition { .. })
        ));
        assert!(matches!(
            e.status(12_345 * 4 + 1),
            Err(SchedError::UnknownId { .. })
        ));
        assert_eq!(e.prune_finished(), 3);
    }

    #[test]
    fn bad_device_range_fails_the_transfer_not_the_engine() {
        let dev = Arc::new(HostDevice::new());
        let e = AsyncTransferEngine::new(dev.clone(), 1).unwrap();
        let id = e
            .enqueue_h2d(0xdead_0000, Box::new(vec![1u8; 8]), 0)
            .unwrap();
        assert_eq!(e.wait(id).unwrap(), TransferState::Failed);
        assert!(e.status(id).unwrap().error.unwrap().contains("not inside"));
        assert!(AsyncTransferEngine::new(dev, 0).is_err());
    }
}
