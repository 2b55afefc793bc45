//! QoS classes and the per-task QoS view of admission.
//!
//! The rules (enforced by [`crate::admission::AdmissionController`]):
//! - Guaranteed: a reservation of `guaranteed_share` of memory and bandwidth is kept for this class.
//!   Burstable work can never use it; best-effort work may borrow it, and is preempted when a
//!   Guaranteed request needs it back. So a Guaranteed request that fits in what is left of the
//!   reservation is always admitted.
//! - Burstable: admitted for its request from the capacity outside the reservation; at admission it
//!   also gets up to its limit ("burst") from what is free there, while the class's total burst stays
//!   under `burst_share` of the capacity. Never preempted.
//! - BestEffort: admitted from whatever is free anywhere, preemptible at admission by the other two.

use std::fmt;

use crate::admission::{AdmissionConfig, AdmissionController, AdmissionDecision, ResourceRequest};
use crate::error::{check_fraction, Result, SchedError};

/// A task's QoS class.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum QosClass {
    /// Reserved capacity; admitted first; never preempted.
    Guaranteed = 0,
    /// A guaranteed request plus an opportunistic burst up to a limit.
    Burstable = 1,
    /// Whatever is free; preemptible.
    BestEffort = 2,
}

impl QosClass {
    /// All classes, most important first.
    pub const ALL: [QosClass; 3] = [
        QosClass::Guaranteed,
        QosClass::Burstable,
        QosClass::BestEffort,
    ];

    /// Index 0, 1, 2 in [`QosClass::ALL`] order.
    pub fn index(self) -> usize {
        self as usize
    }

    /// Name as used in reports: `"guaranteed"`, `"burstable"`, `"best_effort"`.
    pub fn name(self) -> &'static str {
        match self {
            QosClass::Guaranteed => "guaranteed",
            QosClass::Burstable => "burstable",
            QosClass::BestEffort => "best_effort",
        }
    }

    /// Parses [`QosClass::name`] (also accepting `"besteffort"` and `"best-effort"`).
    pub fn parse(text: &str) -> Result<QosClass> {
        match text.to_ascii_lowercase().as_str() {
            "guaranteed" => Ok(QosClass::Guaranteed),
            "burstable" => Ok(QosClass::Burstable),
            "best_effort" | "besteffort" | "best-effort" => Ok(QosClass::BestEffort),
            _ => Err(SchedError::invalid(
                "qos",
                format!("{text:?}"),
                "one of 'guaranteed', 'burstable', 'best_effort'",
            )),
        }
    }
}

impl fmt::Display for QosClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How capacity is divided between the classes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct QosPolicy {
    /// Fraction of memory and bandwidth reserved for Guaranteed work, in [0, 1].
    pub guaranteed_share: f64,
    /// Most of the capacity that Burstable bursts (beyond their requests) may hold together, in [0, 1].
    pub burst_share: f64,
}

impl Default for QosPolicy {
    fn default() -> Self {
        QosPolicy {
            guaranteed_share: 0.5,
            burst_share: 0.25,
        }
    }
}

impl QosPolicy {
    /// Checks both shares are finite fractions.
    pub fn validate(&self) -> Result<()> {
        check_fraction("guaranteed_share", self.guaranteed_share, 0.0, 1.0)?;
        check_fraction("burst_share", self.burst_share, 0.0, 1.0)?;
        Ok(())
    }
}

/// A task as the QoS evaluator sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct QosTaskMeta {
    /// Task id.
    pub id: String,
    /// Human-readable name.
    pub name: String,
    /// QoS class.
    pub class: QosClass,
    /// Memory the task needs, in bytes.
    pub memory: u64,
    /// Memory the task may use at most (Burstable bursts up to it; equal to `memory` otherwise).
    pub memory_limit: u64,
    /// Bandwidth the task needs, in the evaluator's bandwidth units.
    pub bandwidth: f64,
    /// Bandwidth the task may use at most.
    pub bandwidth_limit: f64,
}

impl QosTaskMeta {
    /// A Guaranteed task needing `memory` bytes (request equals limit).
    pub fn guaranteed(id: impl Into<String>, name: impl Into<String>, memory: u64) -> Self {
        Self::new(id, name, QosClass::Guaranteed, memory, memory)
    }

    /// A Burstable task needing `memory` bytes and allowed to burst to `memory_limit`.
    pub fn burstable(
        id: impl Into<String>,
        name: impl Into<String>,
        memory: u64,
        memory_limit: u64,
    ) -> Self {
        Self::new(id, name, QosClass::Burstable, memory, memory_limit)
    }

    /// A BestEffort task wanting `memory` bytes.
    pub fn best_effort(id: impl Into<String>, name: impl Into<String>, memory: u64) -> Self {
        Self::new(id, name, QosClass::BestEffort, memory, memory)
    }

    fn new(
        id: impl Into<String>,
        name: impl Into<String>,
        class: QosClass,
        memory: u64,
        memory_limit: u64,
    ) -> Self {
        QosTaskMeta {
            id: id.into(),
            name: name.into(),
            class,
            memory,
            memory_limit,
            bandwidth: 0.0,
            bandwidth_limit: 0.0,
        }
    }

    /// The same task needing `bandwidth` (and allowed up to `limit`, Burstable only).
    pub fn with_bandwidth(mut self, bandwidth: f64, limit: f64) -> Self {
        self.bandwidth = bandwidth;
        self.bandwidth_limit = limit;
        self
    }

    /// The admission request this task makes.
    pub fn request(&self) -> ResourceRequest {
        ResourceRequest {
            class: self.class,
            memory: self.memory,
            memory_limit: self.memory_limit,
            bandwidth: self.bandwidth,
            bandwidth_limit: self.bandwidth_limit,
        }
    }
}

/// Result of evaluating or reserving a QoS task.
#[derive(Clone, Debug, PartialEq)]
pub struct QosEvaluation {
    /// The task id.
    pub task_id: String,
    /// The decision (with granted amounts and preempted best-effort tasks when admitted).
    pub decision: AdmissionDecision,
}

impl QosEvaluation {
    /// True when the task is (or would be) admitted.
    pub fn admitted(&self) -> bool {
        matches!(self.decision, AdmissionDecision::Admitted { .. })
    }
}

/// Usage of each class, from [`QosPolicyEvaluator::stats`].
#[derive(Clone, Debug, PartialEq)]
pub struct QosStats {
    /// Memory in use per class (Guaranteed, Burstable, BestEffort), bytes.
    pub memory_by_class: [u64; 3],
    /// Bandwidth in use per class, in bandwidth units.
    pub bandwidth_by_class: [f64; 3],
    /// Memory capacity.
    pub total_memory: u64,
    /// Bandwidth capacity.
    pub total_bandwidth: f64,
    /// Memory reserved for Guaranteed work.
    pub guaranteed_memory: u64,
    /// Tasks holding reservations.
    pub active_tasks: usize,
    /// Best-effort tasks preempted so far.
    pub preempted: u64,
}

/// Admits QoS tasks against memory and bandwidth capacity under a [`QosPolicy`]; thread-safe.
pub struct QosPolicyEvaluator {
    controller: AdmissionController,
}

impl QosPolicyEvaluator {
    /// An evaluator for `total_memory` bytes and `total_bandwidth` units with the default policy.
    pub fn new(total_memory: u64, total_bandwidth: f64) -> Result<Self> {
        Self::with_policy(total_memory, total_bandwidth, QosPolicy::default())
    }

    /// An evaluator with an explicit policy.
    pub fn with_policy(total_memory: u64, total_bandwidth: f64, policy: QosPolicy) -> Result<Self> {
        let config = AdmissionConfig {
            max_memory: total_memory,
            max_bandwidth: total_bandwidth,
            max_pending_tasks: usize::MAX,
            enable_best_effort: true,
            qos: policy,
        };
        Ok(QosPolicyEvaluator {
            controller: AdmissionController::new(config)?,
        })
    }

    /// What reserving `task` now would do, without reserving anything.
    pub fn evaluate(&self, task: &QosTaskMeta) -> Result<QosEvaluation> {
        Ok(QosEvaluation {
            task_id: task.id.clone(),
            decision: self.controller.evaluate(&task.request())?,
        })
    }

    /// Reserves resources for `task` (preempting best-effort tasks if needed and allowed).
    pub fn reserve(&self, task: &QosTaskMeta) -> Result<QosEvaluation> {
        Ok(QosEvaluation {
            task_id: task.id.clone(),
            decision: self.controller.try_admit(&task.id, &task.request())?,
        })
    }

    /// Releases `task_id`'s reservation.
    pub fn release(&self, task_id: &str) -> Result<()> {
        self.controller.release(task_id).map(|_| ())
    }

    /// Per-class usage.
    pub fn stats(&self) -> QosStats {
        let s = self.controller.stats();
        QosStats {
            memory_by_class: s.memory_by_class,
            bandwidth_by_class: s.bandwidth_by_class,
            total_memory: s.memory_capacity,
            total_bandwidth: s.bandwidth_capacity,
            guaranteed_memory: s.guaranteed_memory,
            active_tasks: s.active,
            preempted: s.preempted,
        }
    }

    /// The underlying admission controller.
    pub fn controller(&self) -> &AdmissionController {
        &self.controller
    }
}
