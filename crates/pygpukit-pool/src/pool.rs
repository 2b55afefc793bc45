//! The pool's bookkeeping and decisions. It never touches the device: the caller (native/runtime's
//! allocator) performs the driver calls the decisions ask for and reports back.
//!
//! Free blocks are cached per stream: a block freed on stream S is handed out again only for work on
//! S, where stream order makes reuse safe without events. Cached blocks are released least recently
//! freed first when the limit or the driver says memory is short.
//!
//! Holds (CUDA graph captures): a block freed while a capture is open on the freeing thread may still
//! be written by every replay of the captured graph (a temporary of the captured work), so it goes to
//! the capture's hold instead of the stream's cache. The capture's own later requests take blocks back
//! from its hold (reuse inside one graph is ordered by the capture stream); nothing else does, and the
//! LRU release never frees them. Ending the hold (the graph is destroyed) caches them as frees would.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Arc;

use crate::budget::SharedBudget;
use crate::size_class::{fits, round_size};

/// A stream handle value; 0 is the legacy default stream.
pub type StreamId = u64;
/// A device pointer value.
pub type DevicePtr = u64;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum BlockState {
    InUse,
    Cached {
        tick: u64,
    },
    /// Freed into hold `0` (a graph capture's): not handed out but to that capture, never released.
    Held(u64),
}

#[derive(Clone, Copy, Debug)]
struct Block {
    size: u64,
    stream: StreamId,
    state: BlockState,
}

/// What the caller must do to satisfy a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Hand out this cached block; it is now in use.
    Reuse { ptr: DevicePtr, size: u64 },
    /// Free the `release`d cached blocks on the device (they are already forgotten), then allocate
    /// `size` bytes and report the result with [`Pool::register`] or [`Pool::abandon`].
    Allocate {
        size: u64,
        release: Vec<(DevicePtr, u64)>,
    },
}

/// Why a request or a free was refused. Nothing in the pool changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PoolError {
    /// The request cannot fit under the limit even with every cached block released.
    OutOfMemory {
        requested: u64,
        rounded: u64,
        in_use: u64,
        cached: u64,
        limit: u64,
        /// The limit that refused is the shared budget of all pools, not this pool's own.
        all_devices: bool,
    },
    /// The request's size cannot be represented after rounding.
    TooLarge {
        requested: u64,
    },
    /// `free` or `register` of a pointer the pool does not know / already knows.
    UnknownPointer(DevicePtr),
    DoubleFree(DevicePtr),
    AlreadyRegistered(DevicePtr),
    /// A hold id that [`Pool::hold_begin`] did not return or that was already ended.
    UnknownHold(u64),
}

impl fmt::Display for PoolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PoolError::OutOfMemory {
                requested,
                rounded,
                in_use,
                cached,
                limit,
                all_devices,
            } => write!(
                f,
                "out of memory: requested {requested} bytes ({rounded} after rounding), \
                 {in_use} bytes in use, {cached} bytes cached, {scope}limit {limit} bytes",
                scope = if *all_devices { "all-device " } else { "" }
            ),
            PoolError::TooLarge { requested } => {
                write!(f, "request of {requested} bytes is too large")
            }
            PoolError::UnknownPointer(p) => {
                write!(f, "pointer {p:#x} was not allocated by this pool")
            }
            PoolError::DoubleFree(p) => write!(f, "pointer {p:#x} was already freed"),
            PoolError::AlreadyRegistered(p) => write!(f, "pointer {p:#x} is already registered"),
            PoolError::UnknownHold(h) => write!(f, "hold {h} is not open"),
        }
    }
}

impl std::error::Error for PoolError {}

/// Counters and gauges of one pool. Byte gauges are of rounded (allocated) sizes. `repr(C)`: it is
/// also the C ABI's `PgkStats` (native/runtime/pool_ffi.h).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub in_use_bytes: u64,
    pub cached_bytes: u64,
    /// Reserved for allocations the caller is performing right now.
    pub pending_bytes: u64,
    pub peak_in_use_bytes: u64,
    pub in_use_blocks: u64,
    pub cached_blocks: u64,
    /// Requests served (reuse or new allocation).
    pub requests: u64,
    /// Requests served from the cache.
    pub reuse_hits: u64,
    /// Device allocations registered.
    pub device_allocations: u64,
    pub frees: u64,
    /// Cached blocks handed back for release to the device, and their bytes.
    pub releases: u64,
    pub released_bytes: u64,
    /// The limit in bytes, `u64::MAX` when unlimited.
    pub limit: u64,
}

/// The pool of one device.
#[derive(Debug, Default)]
pub struct Pool {
    limit: Option<u64>,
    /// Shared with the pools of the other devices: their common limit.
    budget: Option<Arc<SharedBudget>>,
    blocks: HashMap<DevicePtr, Block>,
    /// stream -> size -> pointers of cached blocks of that size
    free_lists: HashMap<StreamId, BTreeMap<u64, Vec<DevicePtr>>>,
    /// tick of caching -> pointer, oldest first
    lru: BTreeMap<u64, DevicePtr>,
    tick: u64,
    stats: Stats,
    /// hold -> size -> pointers of the blocks freed into it (each in state Held(hold))
    holds: HashMap<u64, BTreeMap<u64, Vec<DevicePtr>>>,
    next_hold: u64,
}

impl Pool {
    /// A pool with an optional limit on in-use + cached + pending bytes.
    pub fn new(limit: Option<u64>) -> Self {
        Pool {
            limit,
            stats: Stats {
                limit: limit.unwrap_or(u64::MAX),
                ..Stats::default()
            },
            ..Pool::default()
        }
    }

    /// A pool that also reports to (and is limited by) a budget shared with other pools.
    pub fn with_budget(limit: Option<u64>, budget: Arc<SharedBudget>) -> Self {
        Pool {
            budget: Some(budget),
            ..Pool::new(limit)
        }
    }

    pub fn limit(&self) -> Option<u64> {
        self.limit
    }

    /// Changes the limit. Cached blocks above a lower limit are returned for release; in-use blocks
    /// are never taken away, so usage may stay above the new limit until they are freed.
    pub fn set_limit(&mut self, limit: Option<u64>) -> Vec<(DevicePtr, u64)> {
        self.limit = limit;
        self.stats.limit = limit.unwrap_or(u64::MAX);
        match limit {
            Some(limit) => {
                let excess = self.reserved().saturating_sub(limit);
                self.release_lru(excess)
            }
            None => Vec::new(),
        }
    }

    pub fn stats(&self) -> Stats {
        self.stats
    }

    fn reserved(&self) -> u64 {
        self.stats.in_use_bytes + self.stats.cached_bytes + self.stats.pending_bytes
    }

    /// Decides how to serve a request of `size` bytes for work on `stream`.
    pub fn request(&mut self, size: u64, stream: StreamId) -> Result<Decision, PoolError> {
        let rounded = round_size(size).ok_or(PoolError::TooLarge { requested: size })?;
        if let Some(ptr) = self.take_cached(stream, rounded) {
            let block = self.blocks.get_mut(&ptr).expect("cached pointer is known");
            block.state = BlockState::InUse;
            let block_size = block.size;
            self.stats.cached_bytes -= block_size;
            self.stats.cached_blocks -= 1;
            self.mark_in_use(block_size);
            self.stats.requests += 1;
            self.stats.reuse_hits += 1;
            return Ok(Decision::Reuse {
                ptr,
                size: block_size,
            });
        }
        let mut excess = 0;
        if let Some(limit) = self.limit {
            let used = self.stats.in_use_bytes + self.stats.pending_bytes;
            if rounded > limit || used + rounded > limit {
                return Err(self.out_of_memory(size, rounded, limit));
            }
            excess = (self.reserved() + rounded).saturating_sub(limit);
        }
        let budget = self.budget.clone();
        // Held until the reservation is added, so no other pool takes the bytes checked here.
        let _guard = budget.as_deref().and_then(SharedBudget::lock_if_limited);
        if let (Some(budget), Some(limit)) = (
            budget.as_deref(),
            budget.as_deref().and_then(SharedBudget::limit),
        ) {
            // Only this pool's cached blocks can be released here; the other pools' are theirs.
            let held_elsewhere = budget.reserved() - self.stats.cached_bytes;
            if rounded > limit || held_elsewhere + rounded > limit {
                return Err(PoolError::OutOfMemory {
                    requested: size,
                    rounded,
                    in_use: self.stats.in_use_bytes,
                    cached: self.stats.cached_bytes,
                    limit,
                    all_devices: true,
                });
            }
            excess = excess.max((budget.reserved() + rounded).saturating_sub(limit));
        }
        let release = self.release_lru(excess);
        self.stats.pending_bytes += rounded;
        if let Some(budget) = budget.as_deref() {
            budget.add(rounded);
        }
        Ok(Decision::Allocate {
            size: rounded,
            release,
        })
    }

    fn out_of_memory(&self, requested: u64, rounded: u64, limit: u64) -> PoolError {
        PoolError::OutOfMemory {
            requested,
            rounded,
            in_use: self.stats.in_use_bytes,
            cached: self.stats.cached_bytes,
            limit,
            all_devices: false,
        }
    }

    /// The current state as an out-of-memory error, for when the device itself refused.
    pub fn device_out_of_memory(&self, requested: u64) -> PoolError {
        let rounded = round_size(requested).unwrap_or(requested);
        self.out_of_memory(requested, rounded, self.limit.unwrap_or(u64::MAX))
    }

    /// Records the device allocation made for an `Allocate` decision of `size` bytes.
    pub fn register(
        &mut self,
        ptr: DevicePtr,
        size: u64,
        stream: StreamId,
    ) -> Result<(), PoolError> {
        if self.blocks.contains_key(&ptr) {
            return Err(PoolError::AlreadyRegistered(ptr));
        }
        self.stats.pending_bytes = self.stats.pending_bytes.saturating_sub(size);
        self.blocks.insert(
            ptr,
            Block {
                size,
                stream,
                state: BlockState::InUse,
            },
        );
        self.mark_in_use(size);
        self.stats.requests += 1;
        self.stats.device_allocations += 1;
        Ok(())
    }

    /// The device allocation for an `Allocate` decision of `size` bytes failed: drop the reservation.
    pub fn abandon(&mut self, size: u64) {
        let pending = self.stats.pending_bytes.min(size);
        self.stats.pending_bytes -= pending;
        if let Some(budget) = &self.budget {
            budget.release(pending);
        }
    }

    fn mark_in_use(&mut self, size: u64) {
        self.stats.in_use_bytes += size;
        self.stats.in_use_blocks += 1;
        self.stats.peak_in_use_bytes = self.stats.peak_in_use_bytes.max(self.stats.in_use_bytes);
    }

    /// Returns an in-use block to the cache of its stream.
    pub fn free(&mut self, ptr: DevicePtr) -> Result<(), PoolError> {
        let tick = self.tick;
        let block = in_use_block(&mut self.blocks, ptr)?;
        block.state = BlockState::Cached { tick };
        let (size, stream) = (block.size, block.stream);
        self.tick += 1;
        self.lru.insert(tick, ptr);
        self.free_lists
            .entry(stream)
            .or_default()
            .entry(size)
            .or_default()
            .push(ptr);
        self.stats.in_use_bytes -= size;
        self.stats.in_use_blocks -= 1;
        self.stats.cached_bytes += size;
        self.stats.cached_blocks += 1;
        self.stats.frees += 1;
        Ok(())
    }

    /// Releases cached blocks, least recently freed first, until at least `bytes` are released
    /// (all of them for `None`). The caller frees the returned blocks on the device.
    pub fn release_cached(&mut self, bytes: Option<u64>) -> Vec<(DevicePtr, u64)> {
        self.release_lru(bytes.unwrap_or(u64::MAX))
    }

    /// Releases every cached block of one stream (before the stream is destroyed).
    pub fn release_stream(&mut self, stream: StreamId) -> Vec<(DevicePtr, u64)> {
        let ptrs: Vec<DevicePtr> = self
            .free_lists
            .get(&stream)
            .map(|sizes| sizes.values().flatten().copied().collect())
            .unwrap_or_default();
        ptrs.into_iter()
            .map(|ptr| self.forget_cached(ptr))
            .collect()
    }

    fn release_lru(&mut self, bytes: u64) -> Vec<(DevicePtr, u64)> {
        let mut released = Vec::new();
        let mut total = 0u64;
        while total < bytes {
            let Some((_, &ptr)) = self.lru.iter().next() else {
                break;
            };
            let entry = self.forget_cached(ptr);
            total += entry.1;
            released.push(entry);
        }
        released
    }

    /// Removes a cached block from every index and the stats; returns (ptr, size).
    fn forget_cached(&mut self, ptr: DevicePtr) -> (DevicePtr, u64) {
        let block = self.blocks.remove(&ptr).expect("cached pointer is known");
        let BlockState::Cached { tick } = block.state else {
            panic!("forget_cached of an in-use block")
        };
        self.lru.remove(&tick);
        if let Some(sizes) = self.free_lists.get_mut(&block.stream) {
            if let Some(list) = sizes.get_mut(&block.size) {
                list.retain(|&p| p != ptr);
                if list.is_empty() {
                    sizes.remove(&block.size);
                }
            }
            if sizes.is_empty() {
                self.free_lists.remove(&block.stream);
            }
        }
        self.stats.cached_bytes -= block.size;
        self.stats.cached_blocks -= 1;
        if let Some(budget) = &self.budget {
            budget.release(block.size);
        }
        self.stats.releases += 1;
        self.stats.released_bytes += block.size;
        (ptr, block.size)
    }

    /// Best fit among the stream's cached blocks: the smallest that fits without too much waste.
    fn take_cached(&mut self, stream: StreamId, rounded: u64) -> Option<DevicePtr> {
        let sizes = self.free_lists.get_mut(&stream)?;
        let (&size, _) = sizes.range(rounded..).next()?;
        if !fits(size, rounded) {
            return None;
        }
        let list = sizes.get_mut(&size)?;
        let ptr = list.pop()?;
        if list.is_empty() {
            sizes.remove(&size);
        }
        if sizes.is_empty() {
            self.free_lists.remove(&stream);
        }
        if let Some(BlockState::Cached { tick }) = self.blocks.get(&ptr).map(|b| b.state) {
            self.lru.remove(&tick);
        }
        Some(ptr)
    }

    /// Forgets every block, in use and cached, and any reservation of an allocation being made,
    /// because the device memory they were in no longer exists (the device's CUDA context was reset:
    /// pygpukit.reset_device()). Nothing is returned for release: freeing those addresses in the new
    /// context would free someone else's memory, and a later `free` of one of them is refused as an
    /// unknown pointer. The limit and the cumulative counters stay; the gauges drop to zero and the
    /// shared budget gets back every byte this pool held. Returns (blocks, bytes) forgotten.
    pub fn reset(&mut self) -> (u64, u64) {
        let blocks = self.blocks.len() as u64;
        let held = self.reserved();
        self.blocks.clear();
        self.free_lists.clear();
        self.lru.clear();
        self.holds.clear();
        if let Some(budget) = &self.budget {
            budget.release(held);
        }
        let s = &mut self.stats;
        s.in_use_bytes = 0;
        s.cached_bytes = 0;
        s.pending_bytes = 0;
        s.in_use_blocks = 0;
        s.cached_blocks = 0;
        (blocks, held)
    }

    /// Opens an empty hold (a graph capture's); returns its id (never 0).
    pub fn hold_begin(&mut self) -> u64 {
        self.next_hold += 1;
        self.holds.insert(self.next_hold, BTreeMap::new());
        self.next_hold
    }

    /// Frees an in-use block into `hold` instead of its stream's cache: it stays counted in use (the
    /// captured graph may write it) until [`Pool::hold_end`].
    pub fn free_held(&mut self, ptr: DevicePtr, hold: u64) -> Result<(), PoolError> {
        let block = in_use_block(&mut self.blocks, ptr)?;
        let Some(sizes) = self.holds.get_mut(&hold) else {
            return Err(PoolError::UnknownHold(hold));
        };
        block.state = BlockState::Held(hold);
        sizes.entry(block.size).or_default().push(ptr);
        Ok(())
    }

    /// A block of `hold` cached from `stream` that serves a request of `size` bytes (the smallest that
    /// fits, as the caches), in use again; `None` when the hold has none (the caller then asks
    /// [`Pool::request`]).
    pub fn take_held(
        &mut self,
        size: u64,
        stream: StreamId,
        hold: u64,
    ) -> Option<(DevicePtr, u64)> {
        let rounded = round_size(size)?;
        let sizes = self.holds.get_mut(&hold)?;
        let blocks = &self.blocks;
        let (block_size, index) = sizes
            .range(rounded..)
            .take_while(|(&block_size, _)| fits(block_size, rounded))
            .find_map(|(&block_size, list)| {
                list.iter()
                    .rposition(|p| blocks.get(p).is_some_and(|b| b.stream == stream))
                    .map(|index| (block_size, index))
            })?;
        let list = sizes.get_mut(&block_size)?;
        let ptr = list.remove(index);
        if list.is_empty() {
            sizes.remove(&block_size);
        }
        let block = self.blocks.get_mut(&ptr).expect("held pointer is known");
        block.state = BlockState::InUse;
        self.stats.requests += 1;
        self.stats.reuse_hits += 1;
        Some((ptr, block_size))
    }

    /// How many blocks `hold` keeps now (0 for a hold that is not open).
    pub fn hold_blocks(&self, hold: u64) -> u64 {
        self.holds.get(&hold).map_or(0, |sizes| {
            sizes.values().map(|list| list.len() as u64).sum()
        })
    }

    /// Closes `hold`: its blocks go to their streams' caches, as frees. Returns how many.
    pub fn hold_end(&mut self, hold: u64) -> Result<u64, PoolError> {
        let sizes = self
            .holds
            .remove(&hold)
            .ok_or(PoolError::UnknownHold(hold))?;
        let mut count = 0;
        for ptr in sizes.into_values().flatten() {
            if let Some(block) = self.blocks.get_mut(&ptr) {
                block.state = BlockState::InUse;
                self.free(ptr)?;
                count += 1;
            }
        }
        Ok(count)
    }

    /// Whether `ptr` is a block this pool handed out and that is still in use.
    pub fn is_in_use(&self, ptr: DevicePtr) -> bool {
        matches!(
            self.blocks.get(&ptr),
            Some(Block {
                state: BlockState::InUse,
                ..
            })
        )
    }
}

/// The in-use block at `ptr`, or why a free of it is refused.
fn in_use_block(
    blocks: &mut HashMap<DevicePtr, Block>,
    ptr: DevicePtr,
) -> Result<&mut Block, PoolError> {
    let block = blocks.get_mut(&ptr).ok_or(PoolError::UnknownPointer(ptr))?;
    if block.state != BlockState::InUse {
        return Err(PoolError::DoubleFree(ptr));
    }
    Ok(block)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allocate(pool: &mut Pool, size: u64, stream: StreamId, next_ptr: &mut u64) -> DevicePtr {
        match pool.request(size, stream).unwrap() {
            Decision::Reuse { ptr, .. } => ptr,
            Decision::Allocate { size, .. } => {
                let ptr = *next_ptr;
                *next_ptr += size.max(1 << 21);
                pool.register(ptr, size, stream).unwrap();
                ptr
            }
        }
    }

    #[test]
    fn held_blocks_serve_their_capture_only_until_the_hold_ends() {
        let mut pool = Pool::new(None);
        let mut next = 1 << 32;
        let a = allocate(&mut pool, 1000, 7, &mut next);
        let hold = pool.hold_begin();
        assert_ne!(hold, 0);
        pool.free_held(a, hold).unwrap();
        // Not in the stream's cache: a request on the stream allocates anew; in use still.
        assert!(matches!(
            pool.request(1000, 7).unwrap(),
            Decision::Allocate { size: 1024, .. }
        ));
        pool.abandon(1024);
        assert_eq!(
            (pool.stats().in_use_bytes, pool.stats().cached_bytes),
            (1024, 0)
        );
        // Never released by the LRU, and a second free is a double free.
        assert!(pool.release_cached(None).is_empty());
        assert_eq!(pool.free(a), Err(PoolError::DoubleFree(a)));
        assert_eq!(pool.free_held(a, hold), Err(PoolError::DoubleFree(a)));
        // The capture takes it back (best fit: too small a request does not), and frees it again.
        assert_eq!(pool.take_held(100, 7, hold), None);
        assert_eq!(pool.take_held(900, 8, hold), None); // another stream's request
        assert_eq!(pool.take_held(900, 7, hold), Some((a, 1024)));
        assert_eq!(pool.take_held(900, 7, hold), None);
        assert_eq!(pool.hold_blocks(hold), 0);
        pool.free_held(a, hold).unwrap();
        assert_eq!(pool.hold_blocks(hold), 1);
        assert_eq!(pool.free_held(a, 99), Err(PoolError::DoubleFree(a)));
        // Ending the hold caches it on its stream, as a free.
        assert_eq!(pool.hold_end(hold), Ok(1));
        assert_eq!(pool.hold_end(hold), Err(PoolError::UnknownHold(hold)));
        assert_eq!(pool.take_held(900, 7, hold), None);
        let s = pool.stats();
        assert_eq!(
            (s.in_use_bytes, s.cached_bytes, s.cached_blocks),
            (0, 1024, 1)
        );
        assert_eq!(
            pool.request(900, 7).unwrap(),
            Decision::Reuse { ptr: a, size: 1024 }
        );
    }

    #[test]
    fn holds_are_separate_and_reset_forgets_them() {
        let mut pool = Pool::new(None);
        let mut next = 1 << 32;
        let a = allocate(&mut pool, 4096, 7, &mut next);
        let b = allocate(&mut pool, 4096, 7, &mut next);
        let (h1, h2) = (pool.hold_begin(), pool.hold_begin());
        assert_ne!(h1, h2);
        pool.free_held(a, h1).unwrap();
        pool.free_held(b, h2).unwrap();
        assert_eq!(pool.take_held(4096, 7, h2), Some((b, 4096)));
        assert_eq!(pool.take_held(4096, 7, h2), None);
        let c = allocate(&mut pool, 10, 7, &mut next);
        assert_eq!(pool.free_held(c, 12345), Err(PoolError::UnknownHold(12345)));
        assert!(pool.is_in_use(c));
        pool.reset();
        assert_eq!(pool.hold_end(h1), Err(PoolError::UnknownHold(h1)));
        assert_eq!(pool.stats().in_use_bytes, 0);
    }

    #[test]
    fn freed_block_is_reused_on_the_same_stream_only() {
        let mut pool = Pool::new(None);
        let mut next = 1 << 32;
        let a = allocate(&mut pool, 1000, 7, &mut next);
        pool.free(a).unwrap();
        assert!(matches!(
            pool.request(1000, 8).unwrap(),
            Decision::Allocate { size: 1024, .. }
        ));
        pool.abandon(1024);
        assert_eq!(
            pool.request(900, 7).unwrap(),
            Decision::Reuse { ptr: a, size: 1024 }
        );
        let s = pool.stats();
        assert_eq!(
            (
                s.reuse_hits,
                s.device_allocations,
                s.in_use_bytes,
                s.cached_bytes
            ),
            (1, 1, 1024, 0)
        );
    }

    #[test]
    fn limit_releases_lru_cache_before_refusing() {
        let mut pool = Pool::new(Some(4096));
        let mut next = 1 << 32;
        let a = allocate(&mut pool, 2048, 1, &mut next);
        let b = allocate(&mut pool, 1024, 1, &mut next);
        pool.free(a).unwrap();
        pool.free(b).unwrap();
        // 3072 bytes cached; a 3072-byte request on another stream needs 2048 released (a first).
        match pool.request(3072, 2).unwrap() {
            Decision::Allocate { size, release } => {
                assert_eq!(size, 3072);
                assert_eq!(release, vec![(a, 2048)]);
            }
            other => panic!("unexpected {other:?}"),
        }
        assert_eq!(pool.stats().pending_bytes, 3072);
        let err = pool.request(2048, 2).unwrap_err();
        assert_eq!(
            err,
            PoolError::OutOfMemory {
                requested: 2048,
                rounded: 2048,
                in_use: 0,
                cached: 1024,
                limit: 4096,
                all_devices: false,
            }
        );
        assert!(err.to_string().contains("limit 4096 bytes"));
    }

    #[test]
    fn double_free_and_unknown_pointers_are_refused() {
        let mut pool = Pool::new(None);
        let mut next = 1 << 32;
        let a = allocate(&mut pool, 10, 0, &mut next);
        pool.free(a).unwrap();
        assert_eq!(pool.free(a), Err(PoolError::DoubleFree(a)));
        assert_eq!(pool.free(12345), Err(PoolError::UnknownPointer(12345)));
        assert_eq!(
            pool.register(a, 512, 0),
            Err(PoolError::AlreadyRegistered(a))
        );
    }

    #[test]
    fn release_stream_and_set_limit() {
        let mut pool = Pool::new(None);
        let mut next = 1 << 32;
        let a = allocate(&mut pool, 512, 3, &mut next);
        let b = allocate(&mut pool, 512, 4, &mut next);
        pool.free(a).unwrap();
        pool.free(b).unwrap();
        assert_eq!(pool.release_stream(3), vec![(a, 512)]);
        assert_eq!(pool.set_limit(Some(0)), vec![(b, 512)]);
        assert_eq!(pool.stats().cached_bytes, 0);
        assert_eq!(pool.stats().releases, 2);
    }

    #[test]
    fn reset_forgets_every_block_and_gives_the_budget_back() {
        let budget = Arc::new(SharedBudget::new(None));
        let mut pool = Pool::with_budget(Some(1 << 20), Arc::clone(&budget));
        let mut next = 1 << 32;
        let a = allocate(&mut pool, 1000, 1, &mut next);
        let b = allocate(&mut pool, 3000, 2, &mut next);
        pool.free(b).unwrap();
        let Decision::Allocate { size: pending, .. } = pool.request(5000, 1).unwrap() else {
            panic!("expected a new allocation")
        };
        assert_eq!(budget.reserved(), 1024 + 3072 + pending);
        let before = pool.stats();
        assert_eq!(pool.reset(), (2, 1024 + 3072 + pending));
        let s = pool.stats();
        assert_eq!(
            (
                s.in_use_bytes,
                s.cached_bytes,
                s.pending_bytes,
                s.in_use_blocks,
                s.cached_blocks
            ),
            (0, 0, 0, 0, 0)
        );
        assert_eq!(
            (s.requests, s.frees, s.limit),
            (before.requests, before.frees, 1 << 20)
        );
        assert_eq!(budget.reserved(), 0);
        // The old addresses are unknown now: nothing of the old context can be freed into the new one.
        assert_eq!(pool.free(a), Err(PoolError::UnknownPointer(a)));
        assert!(!pool.is_in_use(a));
        // An allocation that was being made across the reset reports back harmlessly.
        pool.abandon(pending);
        assert_eq!((pool.stats().pending_bytes, budget.reserved()), (0, 0));
        // The cache is gone too: a request on b's stream allocates instead of reusing b.
        assert!(matches!(
            pool.request(3000, 2).unwrap(),
            Decision::Allocate { size: 3072, .. }
        ));
        assert_eq!(pool.reset(), (0, 3072));
        assert_eq!(budget.reserved(), 0);
    }

    #[test]
    fn shared_budget_limits_pools_together_and_releases_own_cache_first() {
        let budget = Arc::new(SharedBudget::new(Some(8192)));
        let mut a = Pool::with_budget(None, Arc::clone(&budget));
        let mut b = Pool::with_budget(None, Arc::clone(&budget));
        let Decision::Allocate { size, .. } = a.request(4096, 1).unwrap() else {
            panic!("expected a new allocation")
        };
        a.register(0x1000, size, 1).unwrap();
        let Decision::Allocate { size, .. } = b.request(4096, 1).unwrap() else {
            panic!("expected a new allocation")
        };
        b.register(0x9000, size, 1).unwrap();
        assert_eq!(budget.reserved(), 8192);
        // Pool a holds nothing it could release: refused, naming the all-device limit, unchanged.
        let before = a.stats();
        let err = a.request(512, 1).unwrap_err();
        assert!(matches!(
            err,
            PoolError::OutOfMemory {
                all_devices: true,
                limit: 8192,
                ..
            }
        ));
        assert!(err.to_string().contains("all-device limit 8192 bytes"));
        assert_eq!(a.stats(), before);
        // Once b's block is cached, b can release it to serve a request of its own.
        b.free(0x9000).unwrap();
        let Decision::Allocate { release, .. } = b.request(2048, 2).unwrap() else {
            panic!("expected a new allocation")
        };
        assert_eq!(release, vec![(0x9000, 4096)]);
        b.abandon(2048);
        assert_eq!(budget.reserved(), 4096);
        budget.set_limit(None);
        assert!(a.request(1 << 20, 1).is_ok());
    }
}
