//! Rounding of request sizes to the sizes the pool actually allocates.
//!
//! Small requests round to 512 bytes so that many nearby sizes share a class; large ones round to
//! 2 MiB (the driver's own large-page granularity), which bounds internal waste to under 2 MiB or
//! 1/8 of the request, whichever the class scheme below gives.

/// Granularity of requests up to [`SMALL_LIMIT`].
pub const SMALL_GRANULE: u64 = 512;
/// Requests up to this size use [`SMALL_GRANULE`].
pub const SMALL_LIMIT: u64 = 1 << 20;
/// Granularity of requests up to [`MEDIUM_LIMIT`].
pub const MEDIUM_GRANULE: u64 = 128 << 10;
/// Requests up to this size use [`MEDIUM_GRANULE`]; larger ones use [`LARGE_GRANULE`].
pub const MEDIUM_LIMIT: u64 = 64 << 20;
/// Granularity of large requests.
pub const LARGE_GRANULE: u64 = 2 << 20;

/// The size the pool allocates for a request of `size` bytes (at least one small granule).
/// Returns `None` when rounding would overflow.
pub fn round_size(size: u64) -> Option<u64> {
    let granule = if size <= SMALL_LIMIT {
        SMALL_GRANULE
    } else if size <= MEDIUM_LIMIT {
        MEDIUM_GRANULE
    } else {
        LARGE_GRANULE
    };
    let size = size.max(1);
    size.checked_add(granule - 1).map(|s| s / granule * granule)
}

/// A cached block of `cached` bytes may serve a request rounded to `rounded` bytes if it wastes at
/// most 1/8 of the block (and never more than one large granule).
pub fn fits(cached: u64, rounded: u64) -> bool {
    cached >= rounded && cached - rounded <= (cached / 8).min(LARGE_GRANULE)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding_examples() {
        assert_eq!(round_size(0), Some(512));
        assert_eq!(round_size(1), Some(512));
        assert_eq!(round_size(512), Some(512));
        assert_eq!(round_size(513), Some(1024));
        assert_eq!(round_size(SMALL_LIMIT), Some(SMALL_LIMIT));
        assert_eq!(
            round_size(SMALL_LIMIT + 1),
            Some(SMALL_LIMIT + MEDIUM_GRANULE)
        );
        assert_eq!(
            round_size(MEDIUM_LIMIT + 1),
            Some(MEDIUM_LIMIT + LARGE_GRANULE)
        );
        assert_eq!(round_size(u64::MAX), None);
    }

    #[test]
    fn fit_bounds_waste() {
        assert!(fits(1024, 1024));
        assert!(!fits(1024, 1536));
        assert!(fits(9 * 512, 8 * 512)); // 512 of 4608 wasted: under 1/8
        assert!(!fits(4 * 512, 3 * 512)); // 512 of 2048 wasted: over 1/8
        assert!(!fits(1 << 30, (1 << 30) - (4 << 20))); // more than one large granule wasted
    }
}
