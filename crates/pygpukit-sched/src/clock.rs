//! A monotonic clock in nanoseconds, shared by the scheduler's timestamps and the pacing engine.
//! Time-dependent logic takes `now` as an argument so tests can drive it with a fake clock.

use std::sync::OnceLock;
use std::time::Instant;

fn origin() -> Instant {
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    *ORIGIN.get_or_init(Instant::now)
}

/// Nanoseconds since the first call in this process (monotonic).
pub fn now_ns() -> u64 {
    u64::try_from(origin().elapsed().as_nanos()).unwrap_or(u64::MAX)
}
