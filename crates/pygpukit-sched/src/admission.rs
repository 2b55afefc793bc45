//! Admission control: memory and bandwidth reservations by QoS class, a queue limit, typed reasons
//! for every refusal.
//!
//! Reservations are kept in atomic counters (see [`Ledger`]): admitting and releasing Guaranteed
//! and Burstable work takes no lock. Only best-effort admissions and preemption share one small lock,
//! which keeps a best-effort task from being admitted into the room a preemption is freeing.
//!
//! Invariants, for memory and bandwidth alike:
//! - reserved total <= capacity, at every instant;
//! - Burstable reservations (requests plus bursts) <= capacity - Guaranteed reservation;
//! - a Guaranteed request that fits in what is left of the Guaranteed reservation is admitted,
//!   preempting best-effort reservations if needed.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::error::{Result, SchedError};
use crate::qos::{QosClass, QosPolicy};
use crate::shard::ShardedMap;

/// Bandwidth is kept in fixed point: this many units per 1.0 of the caller's bandwidth unit.
const BW_SCALE: f64 = 1_000_000.0;

fn bw_units(name: &'static str, value: f64) -> Result<u64> {
    if !value.is_finite() || value < 0.0 || value * BW_SCALE > u64::MAX as f64 / 2.0 {
        return Err(SchedError::invalid(
            name,
            value,
            "must be a finite, non-negative number",
        ));
    }
    Ok((value * BW_SCALE).round() as u64)
}

fn bw_value(units: u64) -> f64 {
    units as f64 / BW_SCALE
}

/// Which resource a reason is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Resource {
    /// Device memory, in bytes.
    Memory,
    /// Bandwidth, in the configured unit.
    Bandwidth,
}

impl fmt::Display for Resource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Resource::Memory => "memory",
            Resource::Bandwidth => "bandwidth",
        })
    }
}

/// Why a request was not admitted.
#[derive(Clone, Debug, PartialEq)]
pub enum RejectReason {
    /// Not enough memory is free now; it may be later.
    InsufficientMemory {
        /// Bytes requested.
        requested: u64,
        /// Bytes available to this class now.
        available: u64,
    },
    /// Not enough bandwidth is free now; it may be later.
    InsufficientBandwidth {
        /// Bandwidth requested.
        requested: f64,
        /// Bandwidth available to this class now.
        available: f64,
    },
    /// The request can never be admitted: it is larger than what its class can ever hold.
    ExceedsCapacity {
        /// The resource.
        resource: Resource,
        /// Amount requested (bytes, or bandwidth units).
        requested: f64,
        /// The most the class can ever hold.
        limit: f64,
    },
    /// The pending queue is at its limit.
    QueueFull {
        /// The limit.
        limit: usize,
    },
    /// Best-effort admission is disabled by configuration.
    BestEffortDisabled,
    /// A dependency failed or was cancelled, so the task can never run.
    UnsatisfiableDependencies {
        /// The dependency that will never complete.
        dependency: String,
    },
    /// A partition's limit refused the request.
    PartitionLimit {
        /// Partition id.
        partition: String,
        /// What was exceeded.
        what: String,
    },
}

impl RejectReason {
    /// True when retrying later cannot succeed.
    pub fn is_permanent(&self) -> bool {
        matches!(
            self,
            RejectReason::ExceedsCapacity { .. }
                | RejectReason::BestEffortDisabled
                | RejectReason::UnsatisfiableDependencies { .. }
        )
    }

    /// A short machine-readable kind: `"insufficient_memory"`, `"queue_full"`, ...
    pub fn kind(&self) -> &'static str {
        match self {
            RejectReason::InsufficientMemory { .. } => "insufficient_memory",
            RejectReason::InsufficientBandwidth { .. } => "insufficient_bandwidth",
            RejectReason::ExceedsCapacity { .. } => "exceeds_capacity",
            RejectReason::QueueFull { .. } => "queue_full",
            RejectReason::BestEffortDisabled => "best_effort_disabled",
            RejectReason::UnsatisfiableDependencies { .. } => "unsatisfiable_dependencies",
            RejectReason::PartitionLimit { .. } => "partition_limit",
        }
    }
}

impl fmt::Display for RejectReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RejectReason::InsufficientMemory {
                requested,
                available,
            } => write!(
                f,
                "insufficient memory: requested {requested} bytes, {available} bytes available"
            ),
            RejectReason::InsufficientBandwidth {
                requested,
                available,
            } => write!(
                f,
                "insufficient bandwidth: requested {requested}, {available} available"
            ),
            RejectReason::ExceedsCapacity {
                resource,
                requested,
                limit,
            } => write!(
                f,
                "{resource} request {requested} exceeds the most this class can ever hold ({limit})"
            ),
            RejectReason::QueueFull { limit } => {
                write!(f, "queue full: {limit} tasks already pending")
            }
            RejectReason::BestEffortDisabled => f.write_str("best-effort admission is disabled"),
            RejectReason::UnsatisfiableDependencies { dependency } => write!(
                f,
                "dependency {dependency:?} failed or was cancelled and will never complete"
            ),
            RejectReason::PartitionLimit { partition, what } => {
                write!(f, "partition {partition:?}: {what}")
            }
        }
    }
}

/// What a task asks admission for.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ResourceRequest {
    /// QoS class.
    pub class: QosClass,
    /// Memory needed, bytes.
    pub memory: u64,
    /// Memory wanted at most (Burstable: burst up to it); ignored when below `memory`.
    pub memory_limit: u64,
    /// Bandwidth needed.
    pub bandwidth: f64,
    /// Bandwidth wanted at most (Burstable).
    pub bandwidth_limit: f64,
}

impl ResourceRequest {
    /// A request of `memory` bytes and `bandwidth`, without burst.
    pub fn new(class: QosClass, memory: u64, bandwidth: f64) -> Self {
        ResourceRequest {
            class,
            memory,
            memory_limit: memory,
            bandwidth,
            bandwidth_limit: bandwidth,
        }
    }
}

/// What an admitted request holds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Grant {
    /// QoS class.
    pub class: QosClass,
    /// Memory reserved in total (request plus burst), bytes.
    pub memory: u64,
    /// The burst part of `memory`.
    pub burst_memory: u64,
    /// Bandwidth reserved in total.
    pub bandwidth: f64,
    /// The burst part of `bandwidth`.
    pub burst_bandwidth: f64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct GrantUnits {
    class: QosClass,
    mem: u64,
    mem_burst: u64,
    bw: u64,
    bw_burst: u64,
    seq: u64,
}

impl GrantUnits {
    fn public(&self) -> Grant {
        Grant {
            class: self.class,
            memory: self.mem,
            burst_memory: self.mem_burst,
            bandwidth: bw_value(self.bw),
            burst_bandwidth: bw_value(self.bw_burst),
        }
    }
}

/// The outcome of an admission attempt.
#[derive(Clone, Debug, PartialEq)]
pub enum AdmissionDecision {
    /// Admitted; `preempted` lists best-effort task ids whose reservations were taken back.
    Admitted {
        /// What was reserved.
        grant: Grant,
        /// Best-effort tasks preempted to make room.
        preempted: Vec<String>,
    },
    /// Not admitted, and why.
    Rejected(RejectReason),
}

impl AdmissionDecision {
    /// True when admitted.
    pub fn is_admitted(&self) -> bool {
        matches!(self, AdmissionDecision::Admitted { .. })
    }
}

/// Configuration of an [`AdmissionController`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdmissionConfig {
    /// Memory capacity, bytes.
    pub max_memory: u64,
    /// Bandwidth capacity (any unit; requests use the same unit). 1.0 means "the whole device".
    pub max_bandwidth: f64,
    /// Most tasks waiting for admission at once.
    pub max_pending_tasks: usize,
    /// Whether best-effort requests are admitted at all.
    pub enable_best_effort: bool,
    /// How capacity is split between QoS classes.
    pub qos: QosPolicy,
}

impl AdmissionConfig {
    /// Capacity `max_memory` and bandwidth 1.0, 10,000 pending tasks, best effort on, default QoS.
    pub fn new(max_memory: u64) -> Self {
        AdmissionConfig {
            max_memory,
            max_bandwidth: 1.0,
            max_pending_tasks: 10_000,
            enable_best_effort: true,
            qos: QosPolicy::default(),
        }
    }

    /// Checks every field.
    pub fn validate(&self) -> Result<()> {
        if self.max_memory == 0 {
            return Err(SchedError::invalid("max_memory", 0, "must be positive"));
        }
        if self.max_memory > i64::MAX as u64 {
            return Err(SchedError::invalid(
                "max_memory",
                self.max_memory,
                "must be at most 2**63 - 1 bytes",
            ));
        }
        if !(self.max_bandwidth.is_finite() && self.max_bandwidth > 0.0) {
            return Err(SchedError::invalid(
                "max_bandwidth",
                self.max_bandwidth,
                "must be a finite, positive number",
            ));
        }
        bw_units("max_bandwidth", self.max_bandwidth)?;
        if self.max_pending_tasks == 0 {
            return Err(SchedError::invalid(
                "max_pending_tasks",
                0,
                "must be positive",
            ));
        }
        self.qos.validate()
    }
}

/// One resource's reservations in atomic counters.
struct Ledger {
    capacity: u64,
    guaranteed_reserve: u64,
    burst_cap: u64,
    used: AtomicU64,
    /// Guaranteed + Burstable (everything that is not preemptible).
    nonbe: AtomicU64,
    /// Burstable requests plus bursts.
    burstable: AtomicU64,
    /// Burstable bursts only.
    burst: AtomicU64,
    by_class: [AtomicU64; 3],
}

/// Outcome of reserving on one [`Ledger`].
enum Reserve {
    Ok,
    /// Fits once enough best-effort reservations are released.
    NeedsPreemption,
    /// Does not fit now; this much is available to the class.
    Busy(u64),
    /// Can never fit; the class can hold at most this much.
    Never(u64),
}

fn try_add(counter: &AtomicU64, amount: u64, cap: u64) -> bool {
    let mut current = counter.load(Ordering::Relaxed);
    loop {
        let Some(next) = current.checked_add(amount).filter(|n| *n <= cap) else {
            return false;
        };
        match counter.compare_exchange_weak(current, next, Ordering::AcqRel, Ordering::Relaxed) {
            Ok(_) => return true,
            Err(seen) => current = seen,
        }
    }
}

fn sub(counter: &AtomicU64, amount: u64) {
    counter.fetch_sub(amount, Ordering::AcqRel);
}

impl Ledger {
    fn new(capacity: u64, policy: &QosPolicy) -> Self {
        Ledger {
            capacity,
            guaranteed_reserve: (capacity as f64 * policy.guaranteed_share).floor() as u64,
            burst_cap: (capacity as f64 * policy.burst_share).floor() as u64,
            used: AtomicU64::new(0),
            nonbe: AtomicU64::new(0),
            burstable: AtomicU64::new(0),
            burst: AtomicU64::new(0),
            by_class: Default::default(),
        }
    }

    fn burstable_cap(&self) -> u64 {
        self.capacity - self.guaranteed_reserve
    }

    fn class_limit(&self, class: QosClass) -> u64 {
        match class {
            QosClass::Burstable => self.burstable_cap(),
            _ => self.capacity,
        }
    }

    fn load(c: &AtomicU64) -> u64 {
        c.load(Ordering::Acquire)
    }

    fn reserve(&self, class: QosClass, amount: u64) -> Reserve {
        if amount == 0 {
            return Reserve::Ok;
        }
        let limit = self.class_limit(class);
        if amount > limit {
            return Reserve::Never(limit);
        }
        match class {
            QosClass::BestEffort => {
                if !try_add(&self.used, amount, self.capacity) {
                    return Reserve::Busy(self.capacity.saturating_sub(Self::load(&self.used)));
                }
            }
            QosClass::Guaranteed | QosClass::Burstable => {
                if class == QosClass::Burstable && !try_add(&self.burstable, amount, limit) {
                    return Reserve::Busy(limit.saturating_sub(Self::load(&self.burstable)));
                }
                if !try_add(&self.nonbe, amount, self.capacity) {
                    if class == QosClass::Burstable {
                        sub(&self.burstable, amount);
                    }
                    return Reserve::Busy(self.capacity.saturating_sub(Self::load(&self.nonbe)));
                }
                if !try_add(&self.used, amount, self.capacity) {
                    sub(&self.nonbe, amount);
                    if class == QosClass::Burstable {
                        sub(&self.burstable, amount);
                    }
                    return Reserve::NeedsPreemption;
                }
            }
        }
        self.by_class[class.index()].fetch_add(amount, Ordering::AcqRel);
        Reserve::Ok
    }

    /// Burstable only: up to `extra` more from free capacity outside the reservation, never
    /// preempting. Returns what was granted.
    fn burst(&self, extra: u64) -> u64 {
        if extra == 0 {
            return 0;
        }
        let want = extra.min(self.burst_headroom());
        if want == 0 {
            return 0;
        }
        let steps: [(&AtomicU64, u64); 4] = [
            (&self.burst, self.burst_cap),
            (&self.burstable, self.burstable_cap()),
            (&self.nonbe, self.capacity),
            (&self.used, self.capacity),
        ];
        for (i, (counter, cap)) in steps.iter().enumerate() {
            if !try_add(counter, want, *cap) {
                for (c, _) in &steps[..i] {
                    sub(c, want);
                }
                return 0;
            }
        }
        self.by_class[QosClass::Burstable.index()].fetch_add(want, Ordering::AcqRel);
        want
    }

    /// How much more burst could be granted now without preempting (a snapshot).
    fn burst_headroom(&self) -> u64 {
        [
            self.burst_cap.saturating_sub(Self::load(&self.burst)),
            self.burstable_cap()
                .saturating_sub(Self::load(&self.burstable)),
            self.capacity.saturating_sub(Self::load(&self.nonbe)),
            self.capacity.saturating_sub(Self::load(&self.used)),
        ]
        .into_iter()
        .min()
        .unwrap_or(0)
    }

    fn release(&self, class: QosClass, amount: u64, burst: u64) {
        let total = amount + burst;
        if total == 0 {
            return;
        }
        if class != QosClass::BestEffort {
            sub(&self.nonbe, total);
        }
        if class == QosClass::Burstable {
            sub(&self.burstable, total);
            sub(&self.burst, burst);
        }
        sub(&self.used, total);
        sub(&self.by_class[class.index()], total);
    }

    /// What `class` could get now without preempting (a snapshot).
    fn available(&self, class: QosClass) -> u64 {
        let free = self.capacity.saturating_sub(Self::load(&self.used));
        match class {
            QosClass::BestEffort | QosClass::Guaranteed => free,
            QosClass::Burstable => free.min(
                self.burstable_cap()
                    .saturating_sub(Self::load(&self.burstable)),
            ),
        }
    }
}

/// Counters and usage, from [`AdmissionController::stats`].
#[derive(Clone, Debug, PartialEq)]
pub struct AdmissionStats {
    /// Requests admitted.
    pub admitted: u64,
    /// Requests rejected.
    pub rejected: u64,
    /// Best-effort reservations preempted.
    pub preempted: u64,
    /// Reservations released.
    pub released: u64,
    /// Reservations currently held.
    pub active: usize,
    /// Tasks waiting for admission (see [`AdmissionController::enqueue`]).
    pub pending: usize,
    /// Memory reserved, bytes.
    pub memory_used: u64,
    /// Memory capacity, bytes.
    pub memory_capacity: u64,
    /// Memory reserved for Guaranteed work.
    pub guaranteed_memory: u64,
    /// Memory reserved per class.
    pub memory_by_class: [u64; 3],
    /// Bandwidth reserved.
    pub bandwidth_used: f64,
    /// Bandwidth capacity.
    pub bandwidth_capacity: f64,
    /// Bandwidth reserved per class.
    pub bandwidth_by_class: [f64; 3],
}

/// Admits requests against memory and bandwidth capacity; thread-safe, lock-free except for
/// best-effort admission and preemption.
pub struct AdmissionController {
    config: AdmissionConfig,
    memory: Ledger,
    bandwidth: Ledger,
    grants: ShardedMap<GrantUnits>,
    /// Best-effort holders by admission order, for newest-first preemption. Also serializes
    /// best-effort admission against preemption.
    best_effort: Mutex<BTreeMap<u64, Arc<str>>>,
    seq: AtomicU64,
    pending: AtomicUsize,
    admitted: AtomicU64,
    rejected: AtomicU64,
    preempted: AtomicU64,
    released: AtomicU64,
}

impl AdmissionController {
    /// A controller with `config` (validated).
    pub fn new(config: AdmissionConfig) -> Result<Self> {
        config.validate()?;
        let bw_capacity = bw_units("max_bandwidth", config.max_bandwidth)?;
        Ok(AdmissionController {
            memory: Ledger::new(config.max_memory, &config.qos),
            bandwidth: Ledger::new(bw_capacity, &config.qos),
            config,
            grants: ShardedMap::default(),
            best_effort: Mutex::new(BTreeMap::new()),
            seq: AtomicU64::new(0),
            pending: AtomicUsize::new(0),
            admitted: AtomicU64::new(0),
            rejected: AtomicU64::new(0),
            preempted: AtomicU64::new(0),
            released: AtomicU64::new(0),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &AdmissionConfig {
        &self.config
    }

    /// Counts one more task waiting for admission, or refuses with `QueueFull`.
    pub fn enqueue(&self) -> std::result::Result<(), RejectReason> {
        let limit = self.config.max_pending_tasks;
        let mut current = self.pending.load(Ordering::Relaxed);
        loop {
            if current >= limit {
                self.rejected.fetch_add(1, Ordering::Relaxed);
                return Err(RejectReason::QueueFull { limit });
            }
            match self.pending.compare_exchange_weak(
                current,
                current + 1,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Ok(()),
                Err(seen) => current = seen,
            }
        }
    }

    /// Counts one more task waiting for admission even above the limit (a preempted task going
    /// back to the queue must not be lost).
    pub fn enqueue_force(&self) {
        self.pending.fetch_add(1, Ordering::AcqRel);
    }

    /// Counts one task less waiting for admission.
    pub fn dequeue(&self) {
        let _ = self
            .pending
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |p| p.checked_sub(1));
    }

    /// Checks a request's amounts; permanent refusals (larger than the class can ever hold, best
    /// effort disabled) come back as `Ok(Err(reason))`.
    fn validate_request(
        &self,
        req: &ResourceRequest,
    ) -> Result<std::result::Result<(u64, u64, u64, u64), RejectReason>> {
        let bw = bw_units("bandwidth", req.bandwidth)?;
        let bw_limit = if req.class == QosClass::Burstable {
            bw_units("bandwidth_limit", req.bandwidth_limit)?.max(bw)
        } else {
            bw
        };
        let mem_limit = if req.class == QosClass::Burstable {
            req.memory_limit.max(req.memory)
        } else {
            req.memory
        };
        if req.class == QosClass::BestEffort && !self.config.enable_best_effort {
            return Ok(Err(RejectReason::BestEffortDisabled));
        }
        for (resource, amount, ledger) in [
            (Resource::Memory, req.memory, &self.memory),
            (Resource::Bandwidth, bw, &self.bandwidth),
        ] {
            let limit = ledger.class_limit(req.class);
            if amount > limit {
                let scale = |v: u64| match resource {
                    Resource::Memory => v as f64,
                    Resource::Bandwidth => bw_value(v),
                };
                return Ok(Err(RejectReason::ExceedsCapacity {
                    resource,
                    requested: scale(amount),
                    limit: scale(limit),
                }));
            }
        }
        Ok(Ok((req.memory, mem_limit, bw, bw_limit)))
    }

    /// Checks that `req` could ever be admitted (its amounts are valid and within what its class
    /// can hold). Returns the permanent reason when it never can.
    pub fn check_request(&self, req: &ResourceRequest) -> Result<Option<RejectReason>> {
        Ok(self.validate_request(req)?.err())
    }

    /// What admitting `req` now would do, without reserving anything (a snapshot: concurrent
    /// admissions may change the answer).
    pub fn evaluate(&self, req: &ResourceRequest) -> Result<AdmissionDecision> {
        let (mem, mem_limit, bw, bw_limit) = match self.validate_request(req)? {
            Ok(v) => v,
            Err(reason) => return Ok(AdmissionDecision::Rejected(reason)),
        };
        let class = req.class;
        let mut preempted = Vec::new();
        for (ledger, amount, resource) in [
            (&self.memory, mem, Resource::Memory),
            (&self.bandwidth, bw, Resource::Bandwidth),
        ] {
            let avail = ledger.available(class);
            if amount <= avail {
                continue;
            }
            if class != QosClass::BestEffort && amount <= avail_nonbe(ledger, class) {
                preempted = self.pick_victims(resource, amount - avail, &preempted);
                continue;
            }
            return Ok(AdmissionDecision::Rejected(insufficient(
                resource, amount, avail,
            )));
        }
        let (mem_burst, bw_burst) = if class == QosClass::Burstable {
            (
                (mem_limit - mem).min(self.memory.burst_headroom().saturating_sub(mem)),
                (bw_limit - bw).min(self.bandwidth.burst_headroom().saturating_sub(bw)),
            )
        } else {
            (0, 0)
        };
        let grant = GrantUnits {
            class,
            mem: mem + mem_burst,
            mem_burst,
            bw: bw + bw_burst,
            bw_burst,
            seq: 0,
        }
        .public();
        Ok(AdmissionDecision::Admitted { grant, preempted })
    }

    /// Best-effort ids (newest first) whose `resource` adds up to at least `short`, extending
    /// `already`.
    fn pick_victims(&self, resource: Resource, short: u64, already: &[String]) -> Vec<String> {
        let mut out: Vec<String> = already.to_vec();
        let mut freed: u64 = 0;
        for id in self.best_effort.lock().values().rev() {
            if freed >= short {
                break;
            }
            if let Some(g) = self.grants.shard(id).get(id.as_ref()) {
                let amount = match resource {
                    Resource::Memory => g.mem,
                    Resource::Bandwidth => g.bw,
                };
                if amount > 0 {
                    if !out.iter().any(|o| o.as_str() == id.as_ref()) {
                        out.push(id.to_string());
                    }
                    freed += amount;
                }
            }
        }
        out
    }

    /// Reserves for `id` (which must not hold a reservation), preempting best-effort reservations
    /// when the request is Guaranteed or Burstable and only those stand in the way.
    pub fn try_admit(&self, id: &str, req: &ResourceRequest) -> Result<AdmissionDecision> {
        self.try_admit_shared(&Arc::from(id), req)
    }

    /// [`AdmissionController::try_admit`] with an id the caller already holds shared.
    pub fn try_admit_shared(
        &self,
        id: &Arc<str>,
        req: &ResourceRequest,
    ) -> Result<AdmissionDecision> {
        let (mem, mem_limit, bw, bw_limit) = match self.validate_request(req)? {
            Ok(v) => v,
            Err(reason) => {
                self.rejected.fetch_add(1, Ordering::Relaxed);
                return Ok(AdmissionDecision::Rejected(reason));
            }
        };
        let class = req.class;
        let mut preempted = Vec::new();
        // Records the grant under its shard lock; a concurrent admission of the same id loses.
        let insert = |units: GrantUnits| -> bool {
            let mut shard = self.grants.shard(id);
            if shard.contains_key(id.as_ref()) {
                return false;
            }
            shard.insert(Arc::clone(id), units);
            true
        };
        let outcome = if class == QosClass::BestEffort {
            // Reserve, record and register as a preemption candidate under the best-effort lock,
            // so a preemption never sees a holder without its grant.
            let mut holders = self.best_effort.lock();
            match self.reserve_both(class, mem, bw) {
                Ok(()) => {
                    let seq = self.seq.fetch_add(1, Ordering::Relaxed);
                    let units = GrantUnits {
                        class,
                        mem,
                        mem_burst: 0,
                        bw,
                        bw_burst: 0,
                        seq,
                    };
                    if insert(units) {
                        holders.insert(seq, Arc::clone(id));
                        Ok(units)
                    } else {
                        drop(holders);
                        self.undo_units(&units);
                        return Err(SchedError::duplicate("reservation", id));
                    }
                }
                Err(e) => Err(e),
            }
        } else {
            match match self.reserve_both(class, mem, bw) {
                Err(Shortfall::Preempt) => {
                    self.admit_with_preemption(class, mem, bw, &mut preempted)
                }
                other => other,
            } {
                Ok(()) => {
                    let (mem_burst, bw_burst) = if class == QosClass::Burstable {
                        (
                            self.memory.burst(mem_limit - mem),
                            self.bandwidth.burst(bw_limit - bw),
                        )
                    } else {
                        (0, 0)
                    };
                    let units = GrantUnits {
                        class,
                        mem: mem + mem_burst,
                        mem_burst,
                        bw: bw + bw_burst,
                        bw_burst,
                        seq: 0,
                    };
                    if !insert(units) {
                        self.undo_units(&units);
                        return Err(SchedError::duplicate("reservation", id));
                    }
                    Ok(units)
                }
                Err(e) => Err(e),
            }
        };
        match outcome {
            Ok(units) => {
                self.admitted.fetch_add(1, Ordering::Relaxed);
                Ok(AdmissionDecision::Admitted {
                    grant: units.public(),
                    preempted,
                })
            }
            Err(Shortfall::Reject(reason)) | Err(Shortfall::Never(reason)) => {
                self.rejected.fetch_add(1, Ordering::Relaxed);
                Ok(AdmissionDecision::Rejected(reason))
            }
            Err(Shortfall::Preempt) => {
                self.rejected.fetch_add(1, Ordering::Relaxed);
                Ok(AdmissionDecision::Rejected(
                    self.insufficient_for(class, mem, bw),
                ))
            }
        }
    }

    /// Reserves memory then bandwidth, undoing the first when the second fails.
    fn reserve_both(
        &self,
        class: QosClass,
        mem: u64,
        bw: u64,
    ) -> std::result::Result<(), Shortfall> {
        match self.memory.reserve(class, mem) {
            Reserve::Ok => {}
            other => return Err(shortfall(other, Resource::Memory, mem)),
        }
        match self.bandwidth.reserve(class, bw) {
            Reserve::Ok => Ok(()),
            other => {
                self.memory.release(class, mem, 0);
                Err(shortfall(other, Resource::Bandwidth, bw))
            }
        }
    }

    /// Slow path: release best-effort reservations (newest first) until the request fits.
    fn admit_with_preemption(
        &self,
        class: QosClass,
        mem: u64,
        bw: u64,
        preempted: &mut Vec<String>,
    ) -> std::result::Result<(), Shortfall> {
        let mut holders = self.best_effort.lock();
        loop {
            match self.reserve_both(class, mem, bw) {
                Err(Shortfall::Preempt) => {}
                other => return other,
            }
            // Take back the newest best-effort reservation; the retry recomputes what is short.
            let Some((_, victim)) = holders.pop_last() else {
                return Err(Shortfall::Reject(self.insufficient_for(class, mem, bw)));
            };
            if let Some(g) = self.grants.shard(&victim).remove(victim.as_ref()) {
                self.release_units(&g);
                self.preempted.fetch_add(1, Ordering::Relaxed);
                preempted.push(victim.to_string());
            }
        }
    }

    /// The reason naming whichever resource is short for `class`.
    fn insufficient_for(&self, class: QosClass, mem: u64, bw: u64) -> RejectReason {
        let avail = self.memory.available(class);
        if mem > avail {
            insufficient(Resource::Memory, mem, avail)
        } else {
            insufficient(Resource::Bandwidth, bw, self.bandwidth.available(class))
        }
    }

    fn release_units(&self, g: &GrantUnits) {
        self.undo_units(g);
        self.released.fetch_add(1, Ordering::Relaxed);
    }

    /// Gives a reservation's amounts back to the ledgers without counting it as released.
    fn undo_units(&self, g: &GrantUnits) {
        self.memory
            .release(g.class, g.mem - g.mem_burst, g.mem_burst);
        self.bandwidth
            .release(g.class, g.bw - g.bw_burst, g.bw_burst);
    }

    /// Releases `id`'s reservation and returns what it held.
    pub fn release(&self, id: &str) -> Result<Grant> {
        let g = self
            .grants
            .shard(id)
            .remove(id)
            .ok_or_else(|| SchedError::unknown("reservation", id))?;
        if g.class == QosClass::BestEffort {
            self.best_effort.lock().remove(&g.seq);
        }
        self.release_units(&g);
        Ok(g.public())
    }

    /// What `id` holds, if anything.
    pub fn grant(&self, id: &str) -> Option<Grant> {
        self.grants.shard(id).get(id).map(GrantUnits::public)
    }

    /// Counters and usage.
    pub fn stats(&self) -> AdmissionStats {
        let by = |l: &Ledger| {
            [
                Ledger::load(&l.by_class[0]),
                Ledger::load(&l.by_class[1]),
                Ledger::load(&l.by_class[2]),
            ]
        };
        let bw = by(&self.bandwidth);
        AdmissionStats {
            admitted: self.admitted.load(Ordering::Relaxed),
            rejected: self.rejected.load(Ordering::Relaxed),
            preempted: self.preempted.load(Ordering::Relaxed),
            released: self.released.load(Ordering::Relaxed),
            active: self.grants.len(),
            pending: self.pending.load(Ordering::Relaxed),
            memory_used: Ledger::load(&self.memory.used),
            memory_capacity: self.memory.capacity,
            guaranteed_memory: self.memory.guaranteed_reserve,
            memory_by_class: by(&self.memory),
            bandwidth_used: bw_value(Ledger::load(&self.bandwidth.used)),
            bandwidth_capacity: bw_value(self.bandwidth.capacity),
            bandwidth_by_class: [bw_value(bw[0]), bw_value(bw[1]), bw_value(bw[2])],
        }
    }
}

/// Room for a non-best-effort class if every best-effort reservation were released.
fn avail_nonbe(ledger: &Ledger, class: QosClass) -> u64 {
    let room = ledger.capacity.saturating_sub(Ledger::load(&ledger.nonbe));
    match class {
        QosClass::Burstable => room.min(
            ledger
                .burstable_cap()
                .saturating_sub(Ledger::load(&ledger.burstable)),
        ),
        _ => room,
    }
}

enum Shortfall {
    Preempt,
    Reject(RejectReason),
    Never(RejectReason),
}

fn insufficient(resource: Resource, amount: u64, available: u64) -> RejectReason {
    match resource {
        Resource::Memory => RejectReason::InsufficientMemory {
            requested: amount,
            available,
        },
        Resource::Bandwidth => RejectReason::InsufficientBandwidth {
            requested: bw_value(amount),
            available: bw_value(available),
        },
    }
}

fn shortfall(r: Reserve, resource: Resource, amount: u64) -> Shortfall {
    match r {
        Reserve::Ok => unreachable!("shortfall of a successful reservation"),
        Reserve::NeedsPreemption => Shortfall::Preempt,
        Reserve::Busy(avail) => Shortfall::Reject(insufficient(resource, amount, avail)),
        Reserve::Never(limit) => {
            let scale = |v: u64| match resource {
                Resource::Memory => v as f64,
                Resource::Bandwidth => bw_value(v),
            };
            Shortfall::Never(RejectReason::ExceedsCapacity {
                resource,
                requested: scale(amount),
                limit: scale(limit),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn controller(mem: u64) -> AdmissionController {
        AdmissionController::new(AdmissionConfig::new(mem)).unwrap()
    }

    #[test]
    fn guaranteed_preempts_newest_best_effort_to_use_its_reservation() {
        let c = controller(100);
        for i in 0..4 {
            let d = c
                .try_admit(
                    &format!("be{i}"),
                    &ResourceRequest::new(QosClass::BestEffort, 25, 0.0),
                )
                .unwrap();
            assert!(d.is_admitted());
        }
        let d = c
            .try_admit("g", &ResourceRequest::new(QosClass::Guaranteed, 40, 0.0))
            .unwrap();
        match d {
            AdmissionDecision::Admitted { preempted, .. } => {
                assert_eq!(preempted, vec!["be3".to_string(), "be2".to_string()]);
            }
            other => panic!("{other:?}"),
        }
        let s = c.stats();
        assert_eq!(s.memory_used, 90);
        assert_eq!(s.memory_by_class, [40, 0, 50]);
        assert!(c.release("be3").is_err(), "a preempted reservation is gone");
    }

    #[test]
    fn burstable_never_uses_the_guaranteed_reservation_and_bursts_within_its_share() {
        let c = controller(100);
        let mut req = ResourceRequest::new(QosClass::Burstable, 30, 0.0);
        req.memory_limit = 80;
        let AdmissionDecision::Admitted { grant, .. } = c.try_admit("b", &req).unwrap() else {
            panic!("burstable within its share is admitted");
        };
        // The burst stops at the Burstable region (100 - 50 reserved), under the 25 burst cap.
        assert_eq!((grant.memory, grant.burst_memory), (50, 20));
        let d = c
            .try_admit("b2", &ResourceRequest::new(QosClass::Burstable, 10, 0.0))
            .unwrap();
        assert_eq!(
            d,
            AdmissionDecision::Rejected(RejectReason::InsufficientMemory {
                requested: 10,
                available: 0
            })
        );
        let d = c
            .try_admit("b3", &ResourceRequest::new(QosClass::Burstable, 60, 0.0))
            .unwrap();
        assert!(matches!(
            d,
            AdmissionDecision::Rejected(RejectReason::ExceedsCapacity { .. })
        ));
        assert_eq!(c.release("b").unwrap().memory, 50);
        assert_eq!(c.stats().memory_used, 0);
    }

    #[test]
    fn queue_limit_is_typed_and_bad_amounts_are_errors() {
        let mut cfg = AdmissionConfig::new(10);
        cfg.max_pending_tasks = 2;
        let c = AdmissionController::new(cfg).unwrap();
        c.enqueue().unwrap();
        c.enqueue().unwrap();
        assert_eq!(c.enqueue(), Err(RejectReason::QueueFull { limit: 2 }));
        c.dequeue();
        c.enqueue().unwrap();
        let err = c
            .try_admit("x", &ResourceRequest::new(QosClass::Guaranteed, 1, -0.5))
            .unwrap_err();
        assert!(matches!(
            err,
            SchedError::InvalidArgument {
                name: "bandwidth",
                ..
            }
        ));
        assert!(AdmissionController::new(AdmissionConfig::new(0)).is_err());
        let mut bad = AdmissionConfig::new(10);
        bad.max_bandwidth = f64::NAN;
        assert!(AdmissionController::new(bad).is_err());
        assert_eq!(c.stats().active, 0);
    }
}
