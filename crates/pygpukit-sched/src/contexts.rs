//! Execution contexts: admission against the device and the per-allocation budget accounting that
//! `pygpukit.scheduler` charges every real device allocation of a context session to.
//!
//! A [`ContextRegistry`] admits named contexts through a [`QosPolicyEvaluator`] (Guaranteed
//! contexts reserve their whole budget against the capacity; Burstable and BestEffort ones reserve
//! nothing and are held to their budget). Each admitted context is a [`ContextBudget`]: `charge`
//! and `refund` are lock-free (one compare-and-swap loop on the used counter), so the allocation
//! path of a session pays one atomic update. A context may be bound to a partition of a
//! [`PartitionManager`]: a charge then has to fit both the context's budget and the partition's
//! limit (and the device), and a refused one leaves both as they were.

use std::cmp::Reverse;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::admission::{RejectReason, Resource};
use crate::error::{Result, SchedError};
use crate::partition::PartitionManager;
use crate::qos::{QosClass, QosPolicy, QosPolicyEvaluator, QosTaskMeta};

/// A partition a context's allocations are also charged to.
#[derive(Clone)]
pub struct PartitionLink {
    /// The manager.
    pub manager: Arc<PartitionManager>,
    /// The partition's id.
    pub partition: String,
}

/// Why a charge was refused.
#[derive(Clone, Debug, PartialEq)]
pub enum ChargeError {
    /// The context was destroyed.
    Destroyed,
    /// The context's budget would be exceeded.
    Budget {
        /// Bytes requested.
        requested: u64,
        /// Bytes in use in the context.
        in_use: u64,
        /// The budget.
        limit: u64,
    },
    /// The context's partition (or the device behind it) refused.
    Partition {
        /// Partition id.
        partition: String,
        /// Bytes requested.
        requested: u64,
        /// Bytes in use in the partition.
        in_use: u64,
        /// The partition's memory limit.
        limit: u64,
        /// The manager's message.
        message: String,
    },
}

/// A context's budget and usage counters; thread-safe and lock-free.
pub struct ContextBudget {
    name: String,
    serial: u64,
    class: QosClass,
    limit: u64,
    priority: i64,
    used: AtomicU64,
    peak: AtomicU64,
    allocations: AtomicU64,
    refused: AtomicU64,
    destroyed: AtomicBool,
    partition: Option<PartitionLink>,
}

/// A snapshot of a [`ContextBudget`].
#[derive(Clone, Debug, PartialEq)]
pub struct ContextUsage {
    /// Name.
    pub name: String,
    /// QoS class.
    pub class: QosClass,
    /// Budget, bytes.
    pub limit: u64,
    /// Priority within the class.
    pub priority: i64,
    /// Bytes in use.
    pub used: u64,
    /// Most bytes in use at once.
    pub peak: u64,
    /// Allocations charged.
    pub allocations: u64,
    /// Allocations refused.
    pub refused: u64,
    /// The partition, if bound to one.
    pub partition: Option<String>,
}

impl ContextBudget {
    /// The context's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A number unique to this context object in its registry (a later context of the same name
    /// gets another).
    pub fn serial(&self) -> u64 {
        self.serial
    }

    /// The budget, bytes.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// The QoS class.
    pub fn class(&self) -> QosClass {
        self.class
    }

    /// Bytes in use.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Acquire)
    }

    /// Whether the context was destroyed.
    pub fn is_destroyed(&self) -> bool {
        self.destroyed.load(Ordering::Acquire)
    }

    /// The partition it is bound to.
    pub fn partition(&self) -> Option<&PartitionLink> {
        self.partition.as_ref()
    }

    /// Charges an allocation of `bytes`: within the budget (and the partition's limit, when bound),
    /// else refused with nothing charged.
    pub fn charge(&self, bytes: u64) -> std::result::Result<(), ChargeError> {
        if self.destroyed.load(Ordering::Acquire) {
            self.refused.fetch_add(1, Ordering::Relaxed);
            return Err(ChargeError::Destroyed);
        }
        let limit = self.limit;
        let before = self
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                u.checked_add(bytes).filter(|n| *n <= limit)
            });
        let before = match before {
            Ok(b) => b,
            Err(in_use) => {
                self.refused.fetch_add(1, Ordering::Relaxed);
                return Err(ChargeError::Budget {
                    requested: bytes,
                    in_use,
                    limit,
                });
            }
        };
        if let Some(link) = &self.partition {
            if let Err(err) = link.manager.reserve_memory(&link.partition, bytes) {
                self.used.fetch_sub(bytes, Ordering::AcqRel);
                self.refused.fetch_add(1, Ordering::Relaxed);
                return Err(partition_error(link, bytes, err));
            }
        }
        self.allocations.fetch_add(1, Ordering::Relaxed);
        self.peak.fetch_max(before + bytes, Ordering::AcqRel);
        Ok(())
    }

    /// Refunds a freed allocation of `bytes` (never below zero).
    pub fn refund(&self, bytes: u64) {
        let _ = self
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                Some(u.saturating_sub(bytes))
            });
        if let Some(link) = &self.partition {
            // The partition may have been deleted meanwhile; nothing is left to release then.
            let _ = link.manager.release_memory(&link.partition, bytes);
        }
    }

    /// A snapshot of the counters.
    pub fn usage(&self) -> ContextUsage {
        ContextUsage {
            name: self.name.clone(),
            class: self.class,
            limit: self.limit,
            priority: self.priority,
            used: self.used.load(Ordering::Acquire),
            peak: self.peak.load(Ordering::Acquire),
            allocations: self.allocations.load(Ordering::Relaxed),
            refused: self.refused.load(Ordering::Relaxed),
            partition: self.partition.as_ref().map(|l| l.partition.clone()),
        }
    }
}

/// Turns a partition manager's refusal of `bytes` into a [`ChargeError::Partition`].
pub fn partition_error(link: &PartitionLink, bytes: u64, err: SchedError) -> ChargeError {
    let (in_use, limit) = link
        .manager
        .partition(&link.partition)
        .map(|p| (p.memory_used, p.limits.memory))
        .unwrap_or((0, 0));
    ChargeError::Partition {
        partition: link.partition.clone(),
        requested: bytes,
        in_use,
        limit,
        message: err.to_string(),
    }
}

/// Admits contexts against a device's capacity and keeps their budgets; thread-safe.
pub struct ContextRegistry {
    capacity: u64,
    qos: QosPolicyEvaluator,
    contexts: Mutex<HashMap<String, Arc<ContextBudget>>>,
    serials: AtomicU64,
}

impl ContextRegistry {
    /// A registry admitting against `capacity` bytes.
    pub fn new(capacity: u64) -> Result<Self> {
        if capacity == 0 || capacity > i64::MAX as u64 {
            return Err(SchedError::invalid(
                "capacity",
                capacity,
                "must be in [1, 2**63 - 1] bytes",
            ));
        }
        let policy = QosPolicy {
            guaranteed_share: 1.0,
            burst_share: 1.0,
        };
        Ok(ContextRegistry {
            capacity,
            qos: QosPolicyEvaluator::with_policy(capacity, 1.0, policy)?,
            contexts: Mutex::new(HashMap::new()),
            serials: AtomicU64::new(1),
        })
    }

    /// The capacity contexts are admitted against.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Admits context `name` of `class` with a budget of `limit` bytes, optionally bound to a
    /// partition (which must exist). Refusals: `InvalidArgument` (zero budget, empty name),
    /// `Rejected(ExceedsCapacity)` (a budget above the capacity or the partition's limit),
    /// `DuplicateId`, `Rejected(InsufficientMemory)` (Guaranteed reservations would exceed the
    /// capacity), `UnknownId` (no such partition).
    pub fn admit(
        &self,
        name: &str,
        class: QosClass,
        limit: u64,
        priority: i64,
        partition: Option<PartitionLink>,
    ) -> Result<Arc<ContextBudget>> {
        if name.is_empty() {
            return Err(SchedError::invalid("name", "\"\"", "must not be empty"));
        }
        if limit == 0 {
            return Err(SchedError::invalid("max_vram", 0, "must be positive"));
        }
        if limit > self.capacity {
            return Err(SchedError::Rejected(RejectReason::ExceedsCapacity {
                resource: Resource::Memory,
                requested: limit as f64,
                limit: self.capacity as f64,
            }));
        }
        if let Some(link) = &partition {
            let info = link.manager.partition(&link.partition)?;
            if limit > info.limits.memory {
                return Err(SchedError::Rejected(RejectReason::PartitionLimit {
                    partition: link.partition.clone(),
                    what: format!(
                        "a budget of {limit} bytes exceeds its memory limit of {} bytes",
                        info.limits.memory
                    ),
                }));
            }
        }
        let mut map = self.contexts.lock();
        if map.contains_key(name) {
            return Err(SchedError::duplicate("context", name));
        }
        let meta = match class {
            QosClass::Guaranteed => QosTaskMeta::guaranteed(name, name, limit),
            QosClass::Burstable => QosTaskMeta::burstable(name, name, 0, limit),
            QosClass::BestEffort => QosTaskMeta::best_effort(name, name, 0),
        };
        let evaluation = self.qos.reserve(&meta)?;
        if let crate::admission::AdmissionDecision::Rejected(reason) = evaluation.decision {
            return Err(SchedError::Rejected(reason));
        }
        let budget = Arc::new(ContextBudget {
            name: name.to_string(),
            serial: self.serials.fetch_add(1, Ordering::Relaxed),
            class,
            limit,
            priority,
            used: AtomicU64::new(0),
            peak: AtomicU64::new(0),
            allocations: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            destroyed: AtomicBool::new(false),
            partition,
        });
        map.insert(name.to_string(), budget.clone());
        Ok(budget)
    }

    /// The live context `name`.
    pub fn get(&self, name: &str) -> Result<Arc<ContextBudget>> {
        self.contexts
            .lock()
            .get(name)
            .cloned()
            .ok_or_else(|| SchedError::unknown("context", name))
    }

    /// Destroys the live context `name` (when `serial` is given, only if it is that object):
    /// its reservation is released and later charges refused. `UnknownId` when there is no live
    /// context of that name, `InvalidTransition` when the live one is another object.
    pub fn destroy(&self, name: &str, serial: Option<u64>) -> Result<()> {
        let mut map = self.contexts.lock();
        let found = map
            .get(name)
            .ok_or_else(|| SchedError::unknown("context", name))?;
        if let Some(s) = serial {
            if found.serial != s {
                return Err(SchedError::transition(
                    "context",
                    name,
                    format!("live as object #{}", found.serial),
                    format!("destroy object #{s}"),
                ));
            }
        }
        let budget = map.remove(name).expect("present");
        budget.destroyed.store(true, Ordering::Release);
        self.qos.release(name)?;
        Ok(())
    }

    /// Destroys every context.
    pub fn clear(&self) {
        let mut map = self.contexts.lock();
        for (name, budget) in map.drain() {
            budget.destroyed.store(true, Ordering::Release);
            let _ = self.qos.release(&name);
        }
    }

    /// Bytes reserved by Guaranteed contexts.
    pub fn reserved(&self) -> u64 {
        self.qos.stats().memory_by_class[QosClass::Guaranteed.index()]
    }

    /// The live contexts ordered by class, then priority (highest first), then name.
    pub fn contexts(&self) -> Vec<Arc<ContextBudget>> {
        let mut v: Vec<Arc<ContextBudget>> = self.contexts.lock().values().cloned().collect();
        v.sort_by(|a, b| {
            (a.class.index(), Reverse(a.priority), &a.name).cmp(&(
                b.class.index(),
                Reverse(b.priority),
                &b.name,
            ))
        });
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::partition::{PartitionConfig, PartitionLimits};

    const MB: u64 = 1 << 20;

    #[test]
    fn budgets_hold_and_refunds_restore() {
        let r = ContextRegistry::new(1024 * MB).unwrap();
        let small = r
            .admit("small", QosClass::Burstable, 2 * MB, 0, None)
            .unwrap();
        small.charge(MB).unwrap();
        assert_eq!(
            small.charge(2 * MB),
            Err(ChargeError::Budget {
                requested: 2 * MB,
                in_use: MB,
                limit: 2 * MB
            })
        );
        small.charge(MB).unwrap();
        small.refund(2 * MB);
        let u = small.usage();
        assert_eq!(
            (u.used, u.peak, u.allocations, u.refused),
            (0, 2 * MB, 2, 1)
        );
        r.destroy("small", Some(small.serial())).unwrap();
        assert_eq!(small.charge(1), Err(ChargeError::Destroyed));
    }

    #[test]
    fn guaranteed_admission_and_identity() {
        let r = ContextRegistry::new(1000).unwrap();
        let a = r.admit("a", QosClass::Guaranteed, 600, 0, None).unwrap();
        assert!(matches!(
            r.admit("b", QosClass::Guaranteed, 600, 0, None),
            Err(SchedError::Rejected(
                RejectReason::InsufficientMemory { .. }
            ))
        ));
        assert!(matches!(
            r.admit("a", QosClass::Burstable, 1, 0, None),
            Err(SchedError::DuplicateId { .. })
        ));
        assert!(matches!(
            r.admit("z", QosClass::Burstable, 1001, 0, None),
            Err(SchedError::Rejected(RejectReason::ExceedsCapacity { .. }))
        ));
        r.admit("c", QosClass::Burstable, 600, 0, None).unwrap();
        assert_eq!(r.reserved(), 600);
        r.destroy("a", Some(a.serial())).unwrap();
        let a2 = r.admit("a", QosClass::Guaranteed, 600, 0, None).unwrap();
        assert!(matches!(
            r.destroy("a", Some(a.serial())),
            Err(SchedError::InvalidTransition { .. })
        ));
        assert!(!a2.is_destroyed());
        let names: Vec<String> = r.contexts().iter().map(|c| c.name().to_string()).collect();
        assert_eq!(names, vec!["a", "c"]);
        r.clear();
        assert!(a2.is_destroyed());
        assert_eq!(r.reserved(), 0);
    }

    #[test]
    fn a_partition_bound_context_is_held_to_both_limits() {
        let m = Arc::new(PartitionManager::new(PartitionConfig::new(100 * MB)).unwrap());
        m.create_partition("p", "P", PartitionLimits::new().memory(10 * MB))
            .unwrap();
        m.create_partition("q", "Q", PartitionLimits::new().memory(10 * MB))
            .unwrap();
        let r = ContextRegistry::new(100 * MB).unwrap();
        let link = |id: &str| PartitionLink {
            manager: m.clone(),
            partition: id.to_string(),
        };
        assert!(r
            .admit("big", QosClass::Burstable, 20 * MB, 0, Some(link("p")))
            .is_err());
        let a = r
            .admit("a", QosClass::Burstable, 8 * MB, 0, Some(link("p")))
            .unwrap();
        let b = r
            .admit("b", QosClass::Burstable, 8 * MB, 0, Some(link("p")))
            .unwrap();
        let c = r
            .admit("c", QosClass::Burstable, 8 * MB, 0, Some(link("q")))
            .unwrap();
        a.charge(6 * MB).unwrap();
        // b fits its own budget but not the partition: refused, nothing charged anywhere.
        assert!(matches!(
            b.charge(6 * MB),
            Err(ChargeError::Partition { in_use, limit, .. }) if in_use == 6 * MB && limit == 10 * MB
        ));
        assert_eq!(b.used(), 0);
        c.charge(6 * MB).unwrap(); // the other partition is intact
        assert_eq!(m.partition("p").unwrap().memory_used, 6 * MB);
        assert_eq!(m.partition("q").unwrap().memory_used, 6 * MB);
        a.refund(6 * MB);
        b.charge(6 * MB).unwrap();
        assert_eq!(m.stats().memory_used, 12 * MB);
    }
}
