//! [`MemoryPool`]: device blocks under a quota, with least-recently-used eviction to host memory.
//!
//! Blocks are real device allocations made through [`DeviceOps`] (on the GPU: core's pool, so they
//! count in the same statistics as GPUArrays). Evicting a block copies its bytes to host memory
//! (synchronously, on the pool's own stream) and frees the device memory; restoring allocates again
//! and copies the bytes back, so a restored block has a new device address. When an allocation or
//! restore would exceed the quota and eviction is enabled, least recently used resident blocks are
//! evicted first.
//!
//! The pool does not know which streams use a block: before evicting (or freeing) a block, the
//! caller must make sure no work using it is still pending.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::device::{CopyKind, DeviceError, DeviceOps, DevicePtr, StreamHandle};
use crate::error::{Result, SchedError};

/// One block's state, from [`MemoryPool::block`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockInfo {
    /// Block id.
    pub id: u64,
    /// Size, bytes.
    pub size: u64,
    /// Device address while resident.
    pub device_ptr: Option<DevicePtr>,
    /// True while the block is in device memory.
    pub resident: bool,
    /// Position in use order (higher is more recent).
    pub last_access: u64,
}

/// Counters and usage, from [`MemoryPool::stats`].
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct PoolStats {
    /// The quota, bytes.
    pub quota: u64,
    /// Resident bytes.
    pub used: u64,
    /// Bytes held in host memory by evicted blocks.
    pub evicted_bytes: u64,
    /// Live blocks (resident or evicted).
    pub blocks: usize,
    /// Resident blocks.
    pub resident_blocks: usize,
    /// Evicted blocks.
    pub evicted_blocks: usize,
    /// Blocks allocated so far.
    pub allocations: u64,
    /// Blocks freed so far.
    pub frees: u64,
    /// Evictions so far (explicit and to make room).
    pub evictions: u64,
    /// Restores so far.
    pub restores: u64,
    /// Device allocations made (allocations plus restores).
    pub device_allocations: u64,
}

struct Block {
    size: u64,
    ptr: Option<DevicePtr>,
    host: Option<Vec<u8>>,
    tick: u64,
}

struct Inner {
    blocks: HashMap<u64, Block>,
    /// tick -> block id, resident blocks only.
    lru: BTreeMap<u64, u64>,
    tick: u64,
    next_id: u64,
    used: u64,
    stats: PoolStats,
}

/// A quota-bounded pool of device blocks with LRU eviction; thread-safe.
pub struct MemoryPool {
    device: Arc<dyn DeviceOps>,
    quota: u64,
    enable_eviction: bool,
    stream: StreamHandle,
    inner: Mutex<Inner>,
}

impl MemoryPool {
    /// A pool of at most `quota` resident bytes on `device`.
    pub fn new(device: Arc<dyn DeviceOps>, quota: u64, enable_eviction: bool) -> Result<Self> {
        if quota == 0 || quota > i64::MAX as u64 {
            return Err(SchedError::invalid(
                "quota",
                quota,
                "must be in [1, 2**63 - 1] bytes",
            ));
        }
        let stream = device.stream_create(0)?;
        Ok(MemoryPool {
            device,
            quota,
            enable_eviction,
            stream,
            inner: Mutex::new(Inner {
                blocks: HashMap::new(),
                lru: BTreeMap::new(),
                tick: 0,
                next_id: 1,
                used: 0,
                stats: PoolStats {
                    quota,
                    ..PoolStats::default()
                },
            }),
        })
    }

    /// The quota, bytes.
    pub fn quota(&self) -> u64 {
        self.quota
    }

    /// Whether eviction is enabled.
    pub fn eviction_enabled(&self) -> bool {
        self.enable_eviction
    }

    /// The device the blocks live on.
    pub fn device(&self) -> &Arc<dyn DeviceOps> {
        &self.device
    }

    /// The stream the pool allocates on and copies on.
    pub fn stream(&self) -> StreamHandle {
        self.stream
    }

    fn touch_locked(inner: &mut Inner, id: u64) {
        inner.tick += 1;
        let tick = inner.tick;
        if let Some(b) = inner.blocks.get_mut(&id) {
            if b.ptr.is_some() {
                inner.lru.remove(&b.tick);
                inner.lru.insert(tick, id);
            }
            b.tick = tick;
        }
    }

    /// Evicts least recently used resident blocks (never `keep`) until `size` more bytes fit.
    fn make_room(&self, inner: &mut Inner, size: u64, keep: Option<u64>) -> Result<()> {
        while inner.used + size > self.quota {
            let victim = if self.enable_eviction {
                inner.lru.values().copied().find(|id| Some(*id) != keep)
            } else {
                None
            };
            match victim {
                Some(id) => self.evict_locked(inner, id)?,
                None => {
                    return Err(SchedError::QuotaExceeded {
                        requested: size,
                        in_use: inner.used,
                        quota: self.quota,
                    })
                }
            }
        }
        Ok(())
    }

    /// Allocates on the device, evicting more LRU blocks (when enabled) while the device itself
    /// is out of memory.
    fn device_allocate(
        &self,
        inner: &mut Inner,
        size: u64,
        keep: Option<u64>,
    ) -> Result<DevicePtr> {
        loop {
            match self.device.allocate(size, self.stream) {
                Ok(ptr) => {
                    inner.stats.device_allocations += 1;
                    return Ok(ptr);
                }
                Err(e) if e.code == DeviceError::OUT_OF_MEMORY && self.enable_eviction => {
                    let victim = inner.lru.values().copied().find(|id| Some(*id) != keep);
                    match victim {
                        Some(id) => self.evict_locked(inner, id)?,
                        None => return Err(e.into()),
                    }
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Allocates a block of `size` bytes and returns its id.
    pub fn allocate(&self, size: u64) -> Result<u64> {
        if size == 0 || size > self.quota {
            return Err(SchedError::invalid(
                "size",
                size,
                format!("must be in [1, {}] bytes (the quota)", self.quota),
            ));
        }
        let mut inner = self.inner.lock();
        self.make_room(&mut inner, size, None)?;
        let ptr = self.device_allocate(&mut inner, size, None)?;
        let id = inner.next_id;
        inner.next_id += 1;
        inner.blocks.insert(
            id,
            Block {
                size,
                ptr: Some(ptr),
                host: None,
                tick: 0,
            },
        );
        inner.used += size;
        inner.stats.allocations += 1;
        Self::touch_locked(&mut inner, id);
        Ok(id)
    }

    /// Frees block `id` (resident or evicted).
    pub fn free(&self, id: u64) -> Result<()> {
        let mut inner = self.inner.lock();
        let block = inner
            .blocks
            .get(&id)
            .ok_or_else(|| SchedError::unknown("block", id))?;
        if let Some(ptr) = block.ptr {
            self.device.free(ptr)?;
        }
        let block = inner.blocks.remove(&id).expect("checked above");
        if block.ptr.is_some() {
            inner.lru.remove(&block.tick);
            inner.used -= block.size;
        } else {
            inner.stats.evicted_bytes -= block.size;
        }
        inner.stats.frees += 1;
        Ok(())
    }

    /// Marks block `id` as just used.
    pub fn touch(&self, id: u64) -> Result<()> {
        let mut inner = self.inner.lock();
        if !inner.blocks.contains_key(&id) {
            return Err(SchedError::unknown("block", id));
        }
        Self::touch_locked(&mut inner, id);
        Ok(())
    }

    fn evict_locked(&self, inner: &mut Inner, id: u64) -> Result<()> {
        let block = inner
            .blocks
            .get(&id)
            .ok_or_else(|| SchedError::unknown("block", id))?;
        let Some(ptr) = block.ptr else {
            return Err(SchedError::transition("block", id, "evicted", "evict"));
        };
        let size = block.size;
        let len = usize::try_from(size)
            .map_err(|_| SchedError::invalid("size", size, "does not fit host memory"))?;
        let mut host = vec![0u8; len];
        // SAFETY: `host` is valid for `size` bytes and is not touched until the stream is
        // synchronized below.
        unsafe {
            self.device.memcpy_async(
                CopyKind::DeviceToHost,
                host.as_mut_ptr() as u64,
                ptr,
                size,
                self.stream,
            )?;
        }
        self.device.stream_synchronize(self.stream)?;
        self.device.free(ptr)?;
        let block = inner.blocks.get_mut(&id).expect("checked above");
        block.ptr = None;
        block.host = Some(host);
        let tick = block.tick;
        inner.lru.remove(&tick);
        inner.used -= size;
        inner.stats.evicted_bytes += size;
        inner.stats.evictions += 1;
        Ok(())
    }

    /// Copies block `id` to host memory and frees its device memory.
    pub fn evict(&self, id: u64) -> Result<()> {
        let mut inner = self.inner.lock();
        self.evict_locked(&mut inner, id)
    }

    /// Brings evicted block `id` back to device memory (evicting others to make room when
    /// enabled) and returns its new device address.
    pub fn restore(&self, id: u64) -> Result<DevicePtr> {
        let mut inner = self.inner.lock();
        let block = inner
            .blocks
            .get(&id)
            .ok_or_else(|| SchedError::unknown("block", id))?;
        if block.ptr.is_some() {
            return Err(SchedError::transition("block", id, "resident", "restore"));
        }
        let size = block.size;
        self.make_room(&mut inner, size, Some(id))?;
        let ptr = self.device_allocate(&mut inner, size, Some(id))?;
        let host = inner
            .blocks
            .get_mut(&id)
            .and_then(|b| b.host.take())
            .expect("an evicted block holds its bytes");
        // SAFETY: `host` stays alive until the stream is synchronized below.
        let copied = unsafe {
            self.device.memcpy_async(
                CopyKind::HostToDevice,
                ptr,
                host.as_ptr() as u64,
                size,
                self.stream,
            )
        }
        .and_then(|()| self.device.stream_synchronize(self.stream));
        if let Err(e) = copied {
            let _ = self.device.free(ptr);
            if let Some(b) = inner.blocks.get_mut(&id) {
                b.host = Some(host);
            }
            return Err(e.into());
        }
        drop(host);
        let block = inner.blocks.get_mut(&id).expect("checked above");
        block.ptr = Some(ptr);
        inner.used += size;
        inner.stats.evicted_bytes -= size;
        inner.stats.restores += 1;
        Self::touch_locked(&mut inner, id);
        Ok(ptr)
    }

    /// Block `id`'s state.
    pub fn block(&self, id: u64) -> Result<BlockInfo> {
        let inner = self.inner.lock();
        let b = inner
            .blocks
            .get(&id)
            .ok_or_else(|| SchedError::unknown("block", id))?;
        Ok(BlockInfo {
            id,
            size: b.size,
            device_ptr: b.ptr,
            resident: b.ptr.is_some(),
            last_access: b.tick,
        })
    }

    /// The device address of resident block `id`.
    pub fn device_ptr(&self, id: u64) -> Result<DevicePtr> {
        self.block(id)?
            .device_ptr
            .ok_or_else(|| SchedError::transition("block", id, "evicted", "use its device address"))
    }

    fn check_range(&self, id: u64, size: u64, offset: u64, len: u64) -> Result<()> {
        if offset.checked_add(len).map_or(true, |end| end > size) {
            return Err(SchedError::invalid(
                "offset",
                offset,
                format!("[{offset}, +{len}) does not fit in block {id} of {size} bytes"),
            ));
        }
        Ok(())
    }

    /// Copies `data` into resident block `id` at `offset` (synchronously) and marks it used.
    pub fn write(&self, id: u64, offset: u64, data: &[u8]) -> Result<()> {
        let mut inner = self.inner.lock();
        let b = inner
            .blocks
            .get(&id)
            .ok_or_else(|| SchedError::unknown("block", id))?;
        self.check_range(id, b.size, offset, data.len() as u64)?;
        let ptr = b
            .ptr
            .ok_or_else(|| SchedError::transition("block", id, "evicted", "write"))?;
        // SAFETY: `data` outlives the synchronize below.
        unsafe {
            self.device.memcpy_async(
                CopyKind::HostToDevice,
                ptr + offset,
                data.as_ptr() as u64,
                data.len() as u64,
                self.stream,
            )?;
        }
        self.device.stream_synchronize(self.stream)?;
        Self::touch_locked(&mut inner, id);
        Ok(())
    }

    /// Reads `len` bytes of resident block `id` from `offset` (synchronously) and marks it used.
    pub fn read(&self, id: u64, offset: u64, len: u64) -> Result<Vec<u8>> {
        let mut inner = self.inner.lock();
        let b = inner
            .blocks
            .get(&id)
            .ok_or_else(|| SchedError::unknown("block", id))?;
        self.check_range(id, b.size, offset, len)?;
        let ptr = b
            .ptr
            .ok_or_else(|| SchedError::transition("block", id, "evicted", "read"))?;
        let n = usize::try_from(len).map_err(|_| SchedError::invalid("len", len, "too large"))?;
        let mut out = vec![0u8; n];
        // SAFETY: `out` is valid for `len` bytes and untouched until the synchronize below.
        unsafe {
            self.device.memcpy_async(
                CopyKind::DeviceToHost,
                out.as_mut_ptr() as u64,
                ptr + offset,
                len,
                self.stream,
            )?;
        }
        self.device.stream_synchronize(self.stream)?;
        Self::touch_locked(&mut inner, id);
        Ok(out)
    }

    /// Ids of live blocks, least recently used first among resident ones, then evicted ones.
    pub fn block_ids(&self) -> Vec<u64> {
        let inner = self.inner.lock();
        let mut ids: Vec<u64> = inner.lru.values().copied().collect();
        let mut evicted: Vec<u64> = inner
            .blocks
            .iter()
            .filter(|(_, b)| b.ptr.is_none())
            .map(|(id, _)| *id)
            .collect();
        evicted.sort_unstable();
        ids.extend(evicted);
        ids
    }

    /// Counters and usage.
    pub fn stats(&self) -> PoolStats {
        let inner = self.inner.lock();
        let resident = inner.lru.len();
        PoolStats {
            used: inner.used,
            blocks: inner.blocks.len(),
            resident_blocks: resident,
            evicted_blocks: inner.blocks.len() - resident,
            ..inner.stats.clone()
        }
    }
}

impl Drop for MemoryPool {
    fn drop(&mut self) {
        let inner = self.inner.get_mut();
        let _ = self.device.stream_synchronize(self.stream);
        for b in inner.blocks.values() {
            if let Some(ptr) = b.ptr {
                let _ = self.device.free(ptr);
            }
        }
        inner.blocks.clear();
        let _ = self.device.stream_destroy(self.stream);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::HostDevice;

    fn pool(quota: u64, evict: bool) -> (Arc<HostDevice>, MemoryPool) {
        let dev = Arc::new(HostDevice::new());
        let p = MemoryPool::new(dev.clone(), quota, evict).unwrap();
        (dev, p)
    }

    #[test]
    fn eviction_round_trips_bytes_and_frees_device_memory() {
        let (dev, p) = pool(1000, true);
        let a = p.allocate(400).unwrap();
        let data: Vec<u8> = (0..400u32).map(|i| (i * 7 % 251) as u8).collect();
        p.write(a, 0, &data).unwrap();
        p.evict(a).unwrap();
        assert_eq!(dev.allocated_bytes(), 0);
        assert!(matches!(
            p.device_ptr(a),
            Err(SchedError::InvalidTransition { .. })
        ));
        assert!(matches!(
            p.evict(a),
            Err(SchedError::InvalidTransition { .. })
        ));
        p.restore(a).unwrap();
        assert!(matches!(
            p.restore(a),
            Err(SchedError::InvalidTransition { .. })
        ));
        assert_eq!(p.read(a, 0, 400).unwrap(), data);
        let s = p.stats();
        assert_eq!(
            (s.evictions, s.restores, s.used, s.evicted_bytes),
            (1, 1, 400, 0)
        );
    }

    #[test]
    fn allocation_over_quota_evicts_least_recently_used() {
        let (dev, p) = pool(1000, true);
        let a = p.allocate(400).unwrap();
        let b = p.allocate(400).unwrap();
        p.touch(a).unwrap();
        let c = p.allocate(400).unwrap();
        assert!(!p.block(b).unwrap().resident, "b was least recently used");
        assert!(p.block(a).unwrap().resident && p.block(c).unwrap().resident);
        assert_eq!(dev.allocated_bytes(), 800);
        // Restoring b evicts the LRU of a and c (a, touched before c was allocated).
        p.restore(b).unwrap();
        assert!(!p.block(a).unwrap().resident);
        p.free(a).unwrap();
        p.free(b).unwrap();
        p.free(c).unwrap();
        assert!(matches!(p.free(c), Err(SchedError::UnknownId { .. })));
        assert_eq!(dev.allocated_bytes(), 0);
        assert_eq!(
            p.stats(),
            PoolStats {
                quota: 1000,
                allocations: 3,
                frees: 3,
                evictions: 2,
                restores: 1,
                device_allocations: 4,
                ..PoolStats::default()
            }
        );
    }

    #[test]
    fn without_eviction_the_quota_is_an_error_and_state_is_unchanged() {
        let (_, p) = pool(1000, false);
        p.allocate(600).unwrap();
        let err = p.allocate(600).unwrap_err();
        assert_eq!(
            err,
            SchedError::QuotaExceeded {
                requested: 600,
                in_use: 600,
                quota: 1000
            }
        );
        assert!(matches!(
            p.allocate(0),
            Err(SchedError::InvalidArgument { .. })
        ));
        assert!(matches!(
            p.allocate(1001),
            Err(SchedError::InvalidArgument { .. })
        ));
        assert!(MemoryPool::new(Arc::new(HostDevice::new()), 0, true).is_err());
        assert_eq!(p.stats().used, 600);
        assert_eq!(p.stats().blocks, 1);
    }

    #[test]
    fn device_out_of_memory_evicts_then_reports() {
        let dev = Arc::new(HostDevice::with_memory_limit(500));
        let p = MemoryPool::new(dev.clone(), 10_000, true).unwrap();
        let a = p.allocate(300).unwrap();
        let _b = p.allocate(300).unwrap();
        assert!(
            !p.block(a).unwrap().resident,
            "device OOM evicted the LRU block"
        );
        let strict = MemoryPool::new(dev, 10_000, false).unwrap();
        assert!(matches!(strict.allocate(300), Err(SchedError::Device(_))));
    }
}
