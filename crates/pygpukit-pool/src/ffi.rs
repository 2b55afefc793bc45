//! C ABI of the pool for the C++ allocator (declared in native/runtime/pool_ffi.h; keep in sync).
//!
//! A handle owns one `Pool` behind a mutex. Blocks that must be freed on the device are reported
//! through a callback while the lock is held; the callback must not call back into the pool.

use std::ffi::c_void;
use std::sync::{Arc, LazyLock, Mutex};

use crate::budget::SharedBudget;
use crate::pool::{Decision, Pool, PoolError, Stats};

/// The budget every pool made by `pgk_pool_new` shares: the process-wide (all-device) limit.
static PROCESS_BUDGET: LazyLock<Arc<SharedBudget>> =
    LazyLock::new(|| Arc::new(SharedBudget::new(None)));

/// Opaque to C.
pub struct PgkPool {
    pool: Mutex<Pool>,
}

/// Result codes of the C API.
pub const PGK_OK: i32 = 0;
pub const PGK_OUT_OF_MEMORY: i32 = 1;
pub const PGK_TOO_LARGE: i32 = 2;
pub const PGK_UNKNOWN_POINTER: i32 = 3;
pub const PGK_DOUBLE_FREE: i32 = 4;
pub const PGK_ALREADY_REGISTERED: i32 = 5;
pub const PGK_INVALID_ARGUMENT: i32 = 6;
/// Like PGK_OUT_OF_MEMORY, but the process-wide limit over all devices refused.
pub const PGK_OUT_OF_MEMORY_ALL_DEVICES: i32 = 7;

/// Decision kinds.
pub const PGK_REUSE: u32 = 0;
pub const PGK_ALLOCATE: u32 = 1;

#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct PgkDecision {
    pub kind: u32,
    /// The block to hand out (REUSE).
    pub ptr: u64,
    /// Bytes of the block (REUSE) or to allocate (ALLOCATE).
    pub size: u64,
}

/// Filled on PGK_OUT_OF_MEMORY so the caller can say what was asked and what the pool held.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct PgkOutOfMemory {
    pub requested: u64,
    pub rounded: u64,
    pub in_use: u64,
    pub cached: u64,
    pub limit: u64,
}

/// The statistics as C sees them: the same `repr(C)` struct.
pub type PgkStats = Stats;

/// Called once per cached block the caller must free on the device: (context, pointer, bytes).
pub type PgkReleaseFn = Option<unsafe extern "C" fn(*mut c_void, u64, u64)>;

fn code(error: &PoolError) -> i32 {
    match error {
        PoolError::OutOfMemory {
            all_devices: true, ..
        } => PGK_OUT_OF_MEMORY_ALL_DEVICES,
        PoolError::OutOfMemory { .. } => PGK_OUT_OF_MEMORY,
        PoolError::TooLarge { .. } => PGK_TOO_LARGE,
        PoolError::UnknownPointer(_) => PGK_UNKNOWN_POINTER,
        PoolError::DoubleFree(_) => PGK_DOUBLE_FREE,
        PoolError::AlreadyRegistered(_) => PGK_ALREADY_REGISTERED,
        PoolError::UnknownHold(_) => PGK_INVALID_ARGUMENT,
    }
}

fn with_pool<R>(handle: *const PgkPool, f: impl FnOnce(&mut Pool) -> R) -> Option<R> {
    // SAFETY: handles come from pgk_pool_new and live until pgk_pool_destroy; null is rejected.
    let handle = unsafe { handle.as_ref() }?;
    let mut pool = handle
        .pool
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    Some(f(&mut pool))
}

fn report(blocks: &[(u64, u64)], release: PgkReleaseFn, context: *mut c_void) {
    if let Some(callback) = release {
        for &(ptr, size) in blocks {
            // SAFETY: the caller supplied a callback valid for this call.
            unsafe { callback(context, ptr, size) };
        }
    }
}

/// Creates a pool; `limit` 0 means unlimited. Free it with `pgk_pool_destroy`.
#[no_mangle]
pub extern "C" fn pgk_pool_new(limit: u64) -> *mut PgkPool {
    let limit = (limit != 0).then_some(limit);
    Box::into_raw(Box::new(PgkPool {
        pool: Mutex::new(Pool::with_budget(limit, Arc::clone(&PROCESS_BUDGET))),
    }))
}

/// Destroys a pool handle (its blocks must have been released on the device by the caller).
///
/// # Safety
/// `handle` must come from `pgk_pool_new` and not be used afterwards.
#[no_mangle]
pub unsafe extern "C" fn pgk_pool_destroy(handle: *mut PgkPool) {
    if !handle.is_null() {
        // SAFETY: per the contract above.
        drop(unsafe { Box::from_raw(handle) });
    }
}

/// Decides how to serve `size` bytes on `stream`. On ALLOCATE, cached blocks to free first are
/// reported through `release`. On PGK_OUT_OF_MEMORY, `oom` (if not null) says why.
///
/// # Safety
/// `decision` must be valid for writes; `oom` null or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn pgk_pool_request(
    handle: *const PgkPool,
    size: u64,
    stream: u64,
    release: PgkReleaseFn,
    context: *mut c_void,
    decision: *mut PgkDecision,
    oom: *mut PgkOutOfMemory,
) -> i32 {
    if decision.is_null() {
        return PGK_INVALID_ARGUMENT;
    }
    let outcome = with_pool(handle, |pool| {
        let result = pool.request(size, stream);
        if let Ok(Decision::Allocate {
            release: blocks, ..
        }) = &result
        {
            report(blocks, release, context);
        }
        result
    });
    let Some(result) = outcome else {
        return PGK_INVALID_ARGUMENT;
    };
    match result {
        Ok(Decision::Reuse { ptr, size }) => {
            // SAFETY: checked non-null above; the caller guarantees validity.
            unsafe {
                *decision = PgkDecision {
                    kind: PGK_REUSE,
                    ptr,
                    size,
                }
            };
            PGK_OK
        }
        Ok(Decision::Allocate { size, .. }) => {
            // SAFETY: as above.
            unsafe {
                *decision = PgkDecision {
                    kind: PGK_ALLOCATE,
                    ptr: 0,
                    size,
                }
            };
            PGK_OK
        }
        Err(error) => {
            if let (
                PoolError::OutOfMemory {
                    requested,
                    rounded,
                    in_use,
                    cached,
                    limit,
                    ..
                },
                false,
            ) = (&error, oom.is_null())
            {
                let info = PgkOutOfMemory {
                    requested: *requested,
                    rounded: *rounded,
                    in_use: *in_use,
                    cached: *cached,
                    limit: *limit,
                };
                // SAFETY: non-null, valid per the contract.
                unsafe { *oom = info };
            }
            code(&error)
        }
    }
}

/// Records the device allocation made for an ALLOCATE decision.
#[no_mangle]
pub extern "C" fn pgk_pool_register(
    handle: *const PgkPool,
    ptr: u64,
    size: u64,
    stream: u64,
) -> i32 {
    match with_pool(handle, |pool| pool.register(ptr, size, stream)) {
        Some(Ok(())) => PGK_OK,
        Some(Err(error)) => code(&error),
        None => PGK_INVALID_ARGUMENT,
    }
}

/// The device allocation for an ALLOCATE decision of `size` bytes failed.
#[no_mangle]
pub extern "C" fn pgk_pool_abandon(handle: *const PgkPool, size: u64) -> i32 {
    with_pool(handle, |pool| pool.abandon(size)).map_or(PGK_INVALID_ARGUMENT, |()| PGK_OK)
}

/// Returns an in-use block to its stream's cache.
#[no_mangle]
pub extern "C" fn pgk_pool_free(handle: *const PgkPool, ptr: u64) -> i32 {
    match with_pool(handle, |pool| pool.free(ptr)) {
        Some(Ok(())) => PGK_OK,
        Some(Err(error)) => code(&error),
        None => PGK_INVALID_ARGUMENT,
    }
}

/// Opens a hold (a CUDA graph capture's, see pool.rs); returns its id, 0 for a null pool.
#[no_mangle]
pub extern "C" fn pgk_pool_hold_begin(handle: *const PgkPool) -> u64 {
    with_pool(handle, Pool::hold_begin).unwrap_or(0)
}

/// Frees an in-use block into `hold` instead of its stream's cache.
#[no_mangle]
pub extern "C" fn pgk_pool_free_held(handle: *const PgkPool, ptr: u64, hold: u64) -> i32 {
    match with_pool(handle, |pool| pool.free_held(ptr, hold)) {
        Some(Ok(())) => PGK_OK,
        Some(Err(error)) => code(&error),
        None => PGK_INVALID_ARGUMENT,
    }
}

/// A block of `hold` cached from `stream` for a request of `size` bytes, in use again: `*ptr` receives
/// it (0 when the hold has none that fits).
///
/// # Safety
/// `ptr` must be valid for writes.
#[no_mangle]
pub unsafe extern "C" fn pgk_pool_take_held(
    handle: *const PgkPool,
    size: u64,
    stream: u64,
    hold: u64,
    ptr: *mut u64,
) -> i32 {
    if ptr.is_null() {
        return PGK_INVALID_ARGUMENT;
    }
    let Some(found) = with_pool(handle, |pool| pool.take_held(size, stream, hold)) else {
        return PGK_INVALID_ARGUMENT;
    };
    // SAFETY: non-null, valid per the contract.
    unsafe { *ptr = found.map_or(0, |(block, _)| block) };
    PGK_OK
}

/// How many blocks `hold` keeps (0 for a null pool or a hold that is not open).
#[no_mangle]
pub extern "C" fn pgk_pool_hold_size(handle: *const PgkPool, hold: u64) -> u64 {
    with_pool(handle, |pool| pool.hold_blocks(hold)).unwrap_or(0)
}

/// Closes `hold`: its blocks go to their streams' caches.
#[no_mangle]
pub extern "C" fn pgk_pool_hold_end(handle: *const PgkPool, hold: u64) -> i32 {
    match with_pool(handle, |pool| pool.hold_end(hold)) {
        Some(Ok(_)) => PGK_OK,
        Some(Err(error)) => code(&error),
        None => PGK_INVALID_ARGUMENT,
    }
}

/// Releases cached blocks (LRU first) until `bytes` are released; `bytes` 0 releases all of them.
/// Returns the number of bytes released, each block reported through `release`.
#[no_mangle]
pub extern "C" fn pgk_pool_release_cached(
    handle: *const PgkPool,
    bytes: u64,
    release: PgkReleaseFn,
    context: *mut c_void,
) -> u64 {
    with_pool(handle, |pool| {
        let blocks = pool.release_cached((bytes != 0).then_some(bytes));
        report(&blocks, release, context);
        blocks.iter().map(|&(_, size)| size).sum()
    })
    .unwrap_or(0)
}

/// Releases every cached block of `stream`.
#[no_mangle]
pub extern "C" fn pgk_pool_release_stream(
    handle: *const PgkPool,
    stream: u64,
    release: PgkReleaseFn,
    context: *mut c_void,
) -> u64 {
    with_pool(handle, |pool| {
        let blocks = pool.release_stream(stream);
        report(&blocks, release, context);
        blocks.iter().map(|&(_, size)| size).sum()
    })
    .unwrap_or(0)
}

/// Sets the limit (0: unlimited); cached blocks above it are reported through `release`.
#[no_mangle]
pub extern "C" fn pgk_pool_set_limit(
    handle: *const PgkPool,
    limit: u64,
    release: PgkReleaseFn,
    context: *mut c_void,
) -> i32 {
    with_pool(handle, |pool| {
        let blocks = pool.set_limit((limit != 0).then_some(limit));
        report(&blocks, release, context);
    })
    .map_or(PGK_INVALID_ARGUMENT, |()| PGK_OK)
}

/// Copies the pool's statistics into `out`.
///
/// # Safety
/// `out` must be valid for writes.
#[no_mangle]
pub unsafe extern "C" fn pgk_pool_stats(handle: *const PgkPool, out: *mut PgkStats) -> i32 {
    if out.is_null() {
        return PGK_INVALID_ARGUMENT;
    }
    match with_pool(handle, |pool| pool.stats()) {
        Some(stats) => {
            // SAFETY: non-null, valid per the contract.
            unsafe { *out = stats };
            PGK_OK
        }
        None => PGK_INVALID_ARGUMENT,
    }
}

/// Forgets every block and reservation of the pool after its device's context was reset (the memory
/// is gone; see `Pool::reset`); nothing is reported for release. Writes the number of blocks and of
/// bytes forgotten to `blocks` and `bytes` when they are not null.
///
/// # Safety
/// `blocks` and `bytes` must each be null or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn pgk_pool_reset(
    handle: *const PgkPool,
    blocks: *mut u64,
    bytes: *mut u64,
) -> i32 {
    match with_pool(handle, Pool::reset) {
        Some((count, held)) => {
            // SAFETY: each is null or valid per the contract.
            unsafe {
                if let Some(out) = blocks.as_mut() {
                    *out = count;
                }
                if let Some(out) = bytes.as_mut() {
                    *out = held;
                }
            }
            PGK_OK
        }
        None => PGK_INVALID_ARGUMENT,
    }
}

/// Whether `ptr` is an in-use block of this pool (1) or not (0).
#[no_mangle]
pub extern "C" fn pgk_pool_is_in_use(handle: *const PgkPool, ptr: u64) -> i32 {
    with_pool(handle, |pool| i32::from(pool.is_in_use(ptr))).unwrap_or(0)
}

/// Sets the process-wide limit over the pools of all devices (0: unlimited). Bytes already held
/// stay held; the caller releases cached blocks per pool to get under a lower limit.
#[no_mangle]
pub extern "C" fn pgk_budget_set_limit(limit: u64) {
    PROCESS_BUDGET.set_limit((limit != 0).then_some(limit));
}

/// The process-wide limit (`u64::MAX`: none) and the bytes all pools hold (in use, cached, pending).
///
/// # Safety
/// `limit` and `reserved` must be valid for writes.
#[no_mangle]
pub unsafe extern "C" fn pgk_budget_get(limit: *mut u64, reserved: *mut u64) -> i32 {
    if limit.is_null() || reserved.is_null() {
        return PGK_INVALID_ARGUMENT;
    }
    // SAFETY: non-null, valid per the contract.
    unsafe {
        *limit = PROCESS_BUDGET.limit().unwrap_or(u64::MAX);
        *reserved = PROCESS_BUDGET.reserved();
    }
    PGK_OK
}
