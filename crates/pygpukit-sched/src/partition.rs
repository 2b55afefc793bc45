//! GPU partitions: named slices of the device with memory, compute-share, bandwidth-share and
//! stream limits, tasks assigned to them, and usage checked against both the partition's limit and
//! the device.
//!
//! Limits may add up to more than the device only with `allow_overcommit`, and then at most
//! `overcommit_ratio` times the device; actual use never exceeds the device either way.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};

use crate::admission::RejectReason;
use crate::error::{check_fraction, Result, SchedError};
use crate::shard::ShardedMap;

/// Configuration of a [`PartitionManager`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PartitionConfig {
    /// Device memory, bytes.
    pub total_memory: u64,
    /// Whether limits may add up to more than the device.
    pub allow_overcommit: bool,
    /// With overcommit, how far limits may add up beyond the device (>= 1).
    pub overcommit_ratio: f64,
}

impl PartitionConfig {
    /// `total_memory` bytes, no overcommit.
    pub fn new(total_memory: u64) -> Self {
        PartitionConfig {
            total_memory,
            allow_overcommit: false,
            overcommit_ratio: 1.0,
        }
    }

    fn validate(&self) -> Result<()> {
        if self.total_memory == 0 || self.total_memory > i64::MAX as u64 {
            return Err(SchedError::invalid(
                "total_memory",
                self.total_memory,
                "must be in [1, 2**63 - 1] bytes",
            ));
        }
        if !(self.overcommit_ratio.is_finite() && (1.0..=100.0).contains(&self.overcommit_ratio)) {
            return Err(SchedError::invalid(
                "overcommit_ratio",
                self.overcommit_ratio,
                "must be in [1, 100]",
            ));
        }
        Ok(())
    }

    fn ratio(&self) -> f64 {
        if self.allow_overcommit {
            self.overcommit_ratio
        } else {
            1.0
        }
    }
}

/// A partition's limits; built with chained setters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PartitionLimits {
    /// Memory limit, bytes (0: none given yet; a partition needs a positive one).
    pub memory: u64,
    /// Share of compute, in [0, 1].
    pub compute_share: f64,
    /// Share of bandwidth, in [0, 1].
    pub bandwidth_share: f64,
    /// Most streams at once (>= 1).
    pub max_streams: u32,
}

impl Default for PartitionLimits {
    fn default() -> Self {
        PartitionLimits {
            memory: 0,
            compute_share: 0.0,
            bandwidth_share: 0.0,
            max_streams: 4,
        }
    }
}

impl PartitionLimits {
    /// No memory, no shares, 4 streams.
    pub fn new() -> Self {
        Self::default()
    }

    /// With a memory limit.
    pub fn memory(mut self, bytes: u64) -> Self {
        self.memory = bytes;
        self
    }

    /// With a compute share.
    pub fn compute(mut self, share: f64) -> Self {
        self.compute_share = share;
        self
    }

    /// With a bandwidth share.
    pub fn bandwidth(mut self, share: f64) -> Self {
        self.bandwidth_share = share;
        self
    }

    /// With a stream limit.
    pub fn streams(mut self, max_streams: u32) -> Self {
        self.max_streams = max_streams;
        self
    }

    fn validate(&self, total_memory: u64) -> Result<()> {
        if self.memory == 0 || self.memory > total_memory {
            return Err(SchedError::invalid(
                "memory",
                self.memory,
                format!("must be in [1, {total_memory}] bytes (the device's memory)"),
            ));
        }
        check_fraction("compute_share", self.compute_share, 0.0, 1.0)?;
        check_fraction("bandwidth_share", self.bandwidth_share, 0.0, 1.0)?;
        if self.max_streams == 0 {
            return Err(SchedError::invalid("max_streams", 0, "must be at least 1"));
        }
        Ok(())
    }
}

/// A partition's limits and usage, from [`PartitionManager::partition`].
#[derive(Clone, Debug, PartialEq)]
pub struct PartitionInfo {
    /// Id.
    pub id: String,
    /// Name.
    pub name: String,
    /// Limits.
    pub limits: PartitionLimits,
    /// Memory in use, bytes.
    pub memory_used: u64,
    /// Streams in use.
    pub streams_used: u32,
    /// Tasks assigned.
    pub tasks: usize,
}

struct Partition {
    name: String,
    limits: Mutex<PartitionLimits>,
    memory_used: AtomicU64,
    streams_used: AtomicU32,
    tasks: AtomicU64,
}

/// Totals across partitions, from [`PartitionManager::stats`].
#[derive(Clone, Debug, PartialEq)]
pub struct PartitionStats {
    /// Partitions.
    pub partitions: usize,
    /// Sum of memory limits.
    pub memory_limits: u64,
    /// Sum of compute shares.
    pub compute_shares: f64,
    /// Sum of bandwidth shares.
    pub bandwidth_shares: f64,
    /// Memory in use over all partitions.
    pub memory_used: u64,
    /// Device memory.
    pub total_memory: u64,
    /// Tasks assigned.
    pub assigned_tasks: usize,
}

/// Creates partitions, assigns tasks and enforces limits; thread-safe.
pub struct PartitionManager {
    config: PartitionConfig,
    partitions: RwLock<HashMap<String, Arc<Partition>>>,
    default: RwLock<Option<String>>,
    /// Task id -> (partition id, partition).
    assignments: ShardedMap<(String, Arc<Partition>)>,
    memory_used: AtomicU64,
}

impl PartitionManager {
    /// A manager for `config` (validated).
    pub fn new(config: PartitionConfig) -> Result<Self> {
        config.validate()?;
        Ok(PartitionManager {
            config,
            partitions: RwLock::new(HashMap::new()),
            default: RwLock::new(None),
            assignments: ShardedMap::default(),
            memory_used: AtomicU64::new(0),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &PartitionConfig {
        &self.config
    }

    fn check_sums(
        &self,
        map: &HashMap<String, Arc<Partition>>,
        except: Option<&str>,
        limits: &PartitionLimits,
    ) -> Result<()> {
        let ratio = self.config.ratio();
        let others = map.iter().filter(|(k, _)| Some(k.as_str()) != except);
        let (mut mem, mut compute, mut bw) = (
            u128::from(limits.memory),
            limits.compute_share,
            limits.bandwidth_share,
        );
        for (_, p) in others {
            let l = p.limits.lock();
            mem += u128::from(l.memory);
            compute += l.compute_share;
            bw += l.bandwidth_share;
        }
        let mem_cap = (self.config.total_memory as f64 * ratio) as u128;
        if mem > mem_cap {
            return Err(SchedError::invalid(
                "memory",
                limits.memory,
                format!("partition memory limits would add up to {mem} bytes, more than {mem_cap}"),
            ));
        }
        for (name, value, sum) in [
            ("compute_share", limits.compute_share, compute),
            ("bandwidth_share", limits.bandwidth_share, bw),
        ] {
            if sum > ratio + 1e-9 {
                return Err(SchedError::invalid(
                    name,
                    value,
                    format!("partition shares would add up to {sum:.6}, more than {ratio}"),
                ));
            }
        }
        Ok(())
    }

    /// Creates partition `id`.
    pub fn create_partition(&self, id: &str, name: &str, limits: PartitionLimits) -> Result<()> {
        if id.is_empty() {
            return Err(SchedError::invalid("id", "\"\"", "must not be empty"));
        }
        limits.validate(self.config.total_memory)?;
        let mut map = self.partitions.write();
        if map.contains_key(id) {
            return Err(SchedError::duplicate("partition", id));
        }
        self.check_sums(&map, None, &limits)?;
        map.insert(
            id.to_string(),
            Arc::new(Partition {
                name: name.to_string(),
                limits: Mutex::new(limits),
                memory_used: AtomicU64::new(0),
                streams_used: AtomicU32::new(0),
                tasks: AtomicU64::new(0),
            }),
        );
        Ok(())
    }

    /// Changes partition `id`'s limits; its current use must fit the new ones.
    pub fn update_limits(&self, id: &str, limits: PartitionLimits) -> Result<()> {
        limits.validate(self.config.total_memory)?;
        let map = self.partitions.write();
        let p = map
            .get(id)
            .ok_or_else(|| SchedError::unknown("partition", id))?;
        self.check_sums(&map, Some(id), &limits)?;
        let used = p.memory_used.load(Ordering::Acquire);
        if used > limits.memory {
            return Err(SchedError::invalid(
                "memory",
                limits.memory,
                format!("partition {id:?} already uses {used} bytes"),
            ));
        }
        let streams = p.streams_used.load(Ordering::Acquire);
        if streams > limits.max_streams {
            return Err(SchedError::invalid(
                "max_streams",
                limits.max_streams,
                format!("partition {id:?} already uses {streams} streams"),
            ));
        }
        *p.limits.lock() = limits;
        Ok(())
    }

    /// Deletes partition `id`; refused while it has tasks, memory or streams in use.
    pub fn delete_partition(&self, id: &str) -> Result<()> {
        let mut map = self.partitions.write();
        let p = map
            .get(id)
            .ok_or_else(|| SchedError::unknown("partition", id))?;
        let (tasks, mem, streams) = (
            p.tasks.load(Ordering::Acquire),
            p.memory_used.load(Ordering::Acquire),
            p.streams_used.load(Ordering::Acquire),
        );
        if tasks > 0 || mem > 0 || streams > 0 {
            return Err(SchedError::transition(
                "partition",
                id,
                format!("in use ({tasks} tasks, {mem} bytes, {streams} streams)"),
                "delete",
            ));
        }
        map.remove(id);
        let mut default = self.default.write();
        if default.as_deref() == Some(id) {
            *default = None;
        }
        Ok(())
    }

    /// Makes `id` the partition of tasks that were not assigned one.
    pub fn set_default(&self, id: &str) -> Result<()> {
        if !self.partitions.read().contains_key(id) {
            return Err(SchedError::unknown("partition", id));
        }
        *self.default.write() = Some(id.to_string());
        Ok(())
    }

    /// The default partition, if set.
    pub fn default_partition(&self) -> Option<String> {
        self.default.read().clone()
    }

    fn get(&self, id: &str) -> Result<Arc<Partition>> {
        self.partitions
            .read()
            .get(id)
            .cloned()
            .ok_or_else(|| SchedError::unknown("partition", id))
    }

    /// Assigns `task_id` to partition `partition_id`.
    pub fn assign_task(&self, task_id: &str, partition_id: &str) -> Result<()> {
        let p = self.get(partition_id)?;
        let mut shard = self.assignments.shard(task_id);
        if let Some((existing, _)) = shard.get(task_id) {
            return Err(SchedError::transition(
                "task",
                task_id,
                format!("assigned to partition {existing:?}"),
                "assign it again",
            ));
        }
        p.tasks.fetch_add(1, Ordering::AcqRel);
        shard.insert(Arc::from(task_id), (partition_id.to_string(), p));
        Ok(())
    }

    /// Removes `task_id`'s assignment.
    pub fn unassign_task(&self, task_id: &str) -> Result<()> {
        let (_, p) = self
            .assignments
            .shard(task_id)
            .remove(task_id)
            .ok_or_else(|| SchedError::unknown("task assignment", task_id))?;
        p.tasks.fetch_sub(1, Ordering::AcqRel);
        Ok(())
    }

    /// The partition of `task_id`: its assignment, else the default.
    pub fn partition_of(&self, task_id: &str) -> Option<String> {
        self.assignments
            .shard(task_id)
            .get(task_id)
            .map(|(id, _)| id.clone())
            .or_else(|| self.default_partition())
    }

    /// Reserves `bytes` in partition `id`, within its limit and the device's memory.
    pub fn reserve_memory(&self, id: &str, bytes: u64) -> Result<()> {
        let p = self.get(id)?;
        let limit = p.limits.lock().memory;
        if !add_capped(&p.memory_used, bytes, limit) {
            let used = p.memory_used.load(Ordering::Acquire);
            return Err(SchedError::Rejected(RejectReason::PartitionLimit {
                partition: id.to_string(),
                what: format!(
                    "{bytes} more bytes would exceed its memory limit ({used} of {limit} in use)"
                ),
            }));
        }
        if !add_capped(&self.memory_used, bytes, self.config.total_memory) {
            p.memory_used.fetch_sub(bytes, Ordering::AcqRel);
            let used = self.memory_used.load(Ordering::Acquire);
            return Err(SchedError::Rejected(RejectReason::PartitionLimit {
                partition: id.to_string(),
                what: format!(
                    "{bytes} more bytes would exceed the device ({used} of {} in use across partitions)",
                    self.config.total_memory
                ),
            }));
        }
        Ok(())
    }

    /// Releases `bytes` reserved in partition `id`.
    pub fn release_memory(&self, id: &str, bytes: u64) -> Result<()> {
        let p = self.get(id)?;
        let ok = p
            .memory_used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                u.checked_sub(bytes)
            })
            .is_ok();
        if !ok {
            return Err(SchedError::invalid(
                "bytes",
                bytes,
                format!(
                    "partition {id:?} holds only {} bytes",
                    p.memory_used.load(Ordering::Acquire)
                ),
            ));
        }
        self.memory_used.fetch_sub(bytes, Ordering::AcqRel);
        Ok(())
    }

    /// Takes one of partition `id`'s streams.
    pub fn acquire_stream(&self, id: &str) -> Result<()> {
        let p = self.get(id)?;
        let limit = p.limits.lock().max_streams;
        let ok = p
            .streams_used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                (u < limit).then_some(u + 1)
            })
            .is_ok();
        if ok {
            Ok(())
        } else {
            Err(SchedError::Rejected(RejectReason::PartitionLimit {
                partition: id.to_string(),
                what: format!("all {limit} streams are in use"),
            }))
        }
    }

    /// Gives back one of partition `id`'s streams.
    pub fn release_stream(&self, id: &str) -> Result<()> {
        let p = self.get(id)?;
        p.streams_used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| u.checked_sub(1))
            .map(|_| ())
            .map_err(|_| {
                SchedError::transition("partition", id, "using no streams", "release a stream")
            })
    }

    /// Limits and usage of partition `id`.
    pub fn partition(&self, id: &str) -> Result<PartitionInfo> {
        let p = self.get(id)?;
        let limits = *p.limits.lock();
        Ok(PartitionInfo {
            id: id.to_string(),
            name: p.name.clone(),
            limits,
            memory_used: p.memory_used.load(Ordering::Acquire),
            streams_used: p.streams_used.load(Ordering::Acquire),
            tasks: p.tasks.load(Ordering::Acquire) as usize,
        })
    }

    /// Ids of all partitions, sorted.
    pub fn partition_ids(&self) -> Vec<String> {
        let mut ids: Vec<String> = self.partitions.read().keys().cloned().collect();
        ids.sort();
        ids
    }

    /// Totals.
    pub fn stats(&self) -> PartitionStats {
        let map = self.partitions.read();
        let mut s = PartitionStats {
            partitions: map.len(),
            memory_limits: 0,
            compute_shares: 0.0,
            bandwidth_shares: 0.0,
            memory_used: self.memory_used.load(Ordering::Acquire),
            total_memory: self.config.total_memory,
            assigned_tasks: self.assignments.len(),
        };
        for p in map.values() {
            let l = p.limits.lock();
            s.memory_limits += l.memory;
            s.compute_shares += l.compute_share;
            s.bandwidth_shares += l.bandwidth_share;
        }
        s
    }
}

fn add_capped(counter: &AtomicU64, amount: u64, cap: u64) -> bool {
    counter
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
            u.checked_add(amount).filter(|n| *n <= cap)
        })
        .is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const GB: u64 = 1 << 30;

    #[test]
    fn limits_add_up_to_the_device_unless_overcommitted() {
        let m = PartitionManager::new(PartitionConfig::new(8 * GB)).unwrap();
        m.create_partition(
            "inference",
            "Inference",
            PartitionLimits::new().memory(4 * GB).compute(0.5),
        )
        .unwrap();
        m.create_partition(
            "training",
            "Training",
            PartitionLimits::new().memory(4 * GB).compute(0.5),
        )
        .unwrap();
        let err = m
            .create_partition("extra", "Extra", PartitionLimits::new().memory(GB))
            .unwrap_err();
        assert!(matches!(
            err,
            SchedError::InvalidArgument { name: "memory", .. }
        ));
        assert_eq!(m.partition_ids(), vec!["inference", "training"]);

        let mut cfg = PartitionConfig::new(8 * GB);
        cfg.allow_overcommit = true;
        cfg.overcommit_ratio = 1.5;
        let o = PartitionManager::new(cfg).unwrap();
        for i in 0..3 {
            o.create_partition(&format!("p{i}"), "", PartitionLimits::new().memory(4 * GB))
                .unwrap();
        }
        // Overcommitted limits, but real use stays within the device.
        o.reserve_memory("p0", 4 * GB).unwrap();
        o.reserve_memory("p1", 4 * GB).unwrap();
        assert!(matches!(
            o.reserve_memory("p2", 1),
            Err(SchedError::Rejected(RejectReason::PartitionLimit { .. }))
        ));
        o.release_memory("p0", GB).unwrap();
        o.reserve_memory("p2", GB).unwrap();
        assert!(o.release_memory("p2", 2 * GB).is_err());
        assert_eq!(o.stats().memory_used, 8 * GB);
    }

    #[test]
    fn tasks_streams_and_deletion() {
        let m = PartitionManager::new(PartitionConfig::new(GB)).unwrap();
        m.create_partition("a", "A", PartitionLimits::new().memory(GB / 2).streams(1))
            .unwrap();
        m.set_default("a").unwrap();
        assert_eq!(m.partition_of("t0").as_deref(), Some("a"));
        m.assign_task("t1", "a").unwrap();
        assert!(m.assign_task("t1", "a").is_err());
        assert!(matches!(
            m.assign_task("t2", "zzz"),
            Err(SchedError::UnknownId { .. })
        ));
        m.acquire_stream("a").unwrap();
        assert!(m.acquire_stream("a").is_err());
        assert!(matches!(
            m.delete_partition("a"),
            Err(SchedError::InvalidTransition { .. })
        ));
        m.release_stream("a").unwrap();
        assert!(m.release_stream("a").is_err());
        m.unassign_task("t1").unwrap();
        assert!(m.unassign_task("t1").is_err());
        m.delete_partition("a").unwrap();
        assert_eq!(m.default_partition(), None);
        assert!(m
            .create_partition("b", "", PartitionLimits::new().memory(2 * GB))
            .is_err());
        assert!(m
            .create_partition("b", "", PartitionLimits::new().memory(1).compute(1.5))
            .is_err());
    }
}
