//! A limit over several pools together: the device memory held by every device's pool of a process.
//!
//! Each pool reports the bytes it reserves (a device allocation being made) and releases (a cached
//! block handed back to the device, an abandoned allocation). Reservations are checked against the
//! limit under one lock, so two pools cannot both pass the check with the last free bytes; releases
//! are plain atomic subtractions and never wait.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

/// Bytes held by a group of pools and their common limit (`u64::MAX`: none).
#[derive(Debug)]
pub struct SharedBudget {
    limit: AtomicU64,
    reserved: AtomicU64,
    reserve_lock: Mutex<()>,
}

impl Default for SharedBudget {
    fn default() -> Self {
        SharedBudget::new(None)
    }
}

impl SharedBudget {
    /// A budget with an optional limit in bytes.
    pub fn new(limit: Option<u64>) -> Self {
        SharedBudget {
            limit: AtomicU64::new(limit.unwrap_or(u64::MAX)),
            reserved: AtomicU64::new(0),
            reserve_lock: Mutex::new(()),
        }
    }

    /// The limit, `None` when unlimited.
    pub fn limit(&self) -> Option<u64> {
        let limit = self.limit.load(Ordering::Acquire);
        (limit != u64::MAX).then_some(limit)
    }

    /// Changes the limit. Bytes already reserved stay reserved; the caller releases cached blocks
    /// if it wants usage back under a lower limit.
    pub fn set_limit(&self, limit: Option<u64>) {
        self.limit
            .store(limit.unwrap_or(u64::MAX), Ordering::Release);
    }

    /// Bytes reserved by all pools of the group (in use, cached and being allocated).
    pub fn reserved(&self) -> u64 {
        self.reserved.load(Ordering::Acquire)
    }

    /// Holds off other reservations while a pool decides whether (and after releasing what) its
    /// request fits; `None` when there is no limit to check.
    pub(crate) fn lock_if_limited(&self) -> Option<MutexGuard<'_, ()>> {
        self.limit()?;
        Some(
            self.reserve_lock
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner()),
        )
    }

    /// Adds `bytes` (the caller checked the limit while holding `lock_if_limited`, or there is none).
    pub(crate) fn add(&self, bytes: u64) {
        self.reserved.fetch_add(bytes, Ordering::AcqRel);
    }

    /// Gives back `bytes` reserved earlier.
    pub(crate) fn release(&self, bytes: u64) {
        let previous = self.reserved.fetch_sub(bytes, Ordering::AcqRel);
        debug_assert!(previous >= bytes, "budget released more than it reserved");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limit_round_trip_and_accounting() {
        let budget = SharedBudget::new(Some(100));
        assert_eq!(budget.limit(), Some(100));
        assert!(budget.lock_if_limited().is_some());
        budget.add(60);
        budget.release(20);
        assert_eq!(budget.reserved(), 40);
        budget.set_limit(None);
        assert_eq!(budget.limit(), None);
        assert!(budget.lock_if_limited().is_none());
    }
}
