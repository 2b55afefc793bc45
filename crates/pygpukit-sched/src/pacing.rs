//! Kernel pacing: each stream holds a share of the device's bandwidth and may only launch as fast
//! as a token bucket filled at that share allows.
//!
//! A stream with share `s` of total bandwidth `B` (units per second, e.g. bytes/s) gets a bucket
//! refilled at `r = s * B` and holding at most `C = r * window`. A launch of cost `c` (in the same
//! units, e.g. bytes it moves) may go when the bucket holds `min(c, C)` and `min_interval` has
//! passed since the stream's previous launch; it then takes `c` (a launch larger than the bucket
//! leaves a debt). So over any interval of length `T` a stream is granted at most
//! `C + r * T + max(0, c_max - C)`: its share, plus one window of burst.
//!
//! Adaptive mode learns `B` from completed launches ([`KernelPacingEngine::record_completion`]):
//! the configured total is only a starting guess, and the shares then divide what the device
//! really delivers.
//!
//! Each stream has its own lock; the stream table is behind a read-mostly lock taken for writing
//! only when streams are added or removed.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};

use crate::clock::now_ns;
use crate::error::{check_fraction, Result, SchedError};

/// Shares may add up to 1 plus this much (rounding slack).
const SHARE_SLACK: f64 = 1e-9;

/// Configuration of a [`KernelPacingEngine`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PacingConfig {
    /// Device bandwidth in cost units per second (e.g. bytes/s); positive.
    pub total_bandwidth: f64,
    /// Bucket size in milliseconds of a stream's rate; positive.
    pub window_ms: f64,
    /// Least time between two launches on one stream, milliseconds; >= 0.
    pub min_interval_ms: f64,
    /// Learn the device bandwidth from completed launches.
    pub adaptive: bool,
}

impl PacingConfig {
    /// `total_bandwidth` units/s, a 100 ms window, no minimum interval, not adaptive.
    pub fn new(total_bandwidth: f64) -> Self {
        PacingConfig {
            total_bandwidth,
            window_ms: 100.0,
            min_interval_ms: 0.0,
            adaptive: false,
        }
    }

    fn validate(&self) -> Result<()> {
        for (name, v) in [
            ("total_bandwidth", self.total_bandwidth),
            ("window_ms", self.window_ms),
        ] {
            if !(v.is_finite() && v > 0.0) {
                return Err(SchedError::invalid(
                    name,
                    v,
                    "must be a finite, positive number",
                ));
            }
        }
        if !(self.min_interval_ms.is_finite() && self.min_interval_ms >= 0.0) {
            return Err(SchedError::invalid(
                "min_interval_ms",
                self.min_interval_ms,
                "must be a finite, non-negative number",
            ));
        }
        Ok(())
    }
}

/// Whether a launch may go now.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum PacingDecision {
    /// Launch now.
    Launch,
    /// Wait this many milliseconds, then ask again.
    Wait {
        /// Milliseconds until the launch would be allowed (at the current rate).
        delay_ms: f64,
    },
}

/// A stream's pacing state, from [`KernelPacingEngine::stream_stats`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StreamPacingStats {
    /// Share of the total bandwidth.
    pub share: f64,
    /// Current rate, units/s.
    pub rate: f64,
    /// Tokens in the bucket (negative: debt).
    pub tokens: f64,
    /// Launches granted.
    pub launches: u64,
    /// Launch requests told to wait.
    pub throttled: u64,
    /// Cost granted in total.
    pub granted: f64,
}

struct Bucket {
    share: f64,
    tokens: f64,
    last_ns: u64,
    last_launch_ns: Option<u64>,
    launches: u64,
    throttled: u64,
    granted: f64,
}

/// Paces launches per stream by bandwidth share; thread-safe.
pub struct KernelPacingEngine {
    config: PacingConfig,
    streams: RwLock<HashMap<u64, Arc<Mutex<Bucket>>>>,
    /// The learned device bandwidth (f64 bits); 0 until the first completion in adaptive mode.
    learned: AtomicU64,
}

impl KernelPacingEngine {
    /// An engine with `config` (validated).
    pub fn new(config: PacingConfig) -> Result<Self> {
        config.validate()?;
        Ok(KernelPacingEngine {
            config,
            streams: RwLock::new(HashMap::new()),
            learned: AtomicU64::new(0),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &PacingConfig {
        &self.config
    }

    /// The bandwidth the shares divide: learned (adaptive, once known) or configured.
    pub fn total_bandwidth(&self) -> f64 {
        let learned = f64::from_bits(self.learned.load(Ordering::Relaxed));
        if self.config.adaptive && learned > 0.0 {
            learned
        } else {
            self.config.total_bandwidth
        }
    }

    fn rate_and_capacity(&self, share: f64) -> (f64, f64) {
        let rate = share * self.total_bandwidth();
        (rate, rate * self.config.window_ms / 1e3)
    }

    fn bucket(&self, stream: u64) -> Result<Arc<Mutex<Bucket>>> {
        self.streams
            .read()
            .get(&stream)
            .cloned()
            .ok_or_else(|| SchedError::unknown("stream", stream))
    }

    fn allocated_share(map: &HashMap<u64, Arc<Mutex<Bucket>>>, except: Option<u64>) -> f64 {
        map.iter()
            .filter(|(k, _)| Some(**k) != except)
            .map(|(_, b)| b.lock().share)
            .sum()
    }

    /// Gives `stream` a `share` in (0, 1] of the bandwidth; all shares together stay <= 1.
    pub fn allocate_stream(&self, stream: u64, share: f64) -> Result<()> {
        self.allocate_stream_at(stream, share, now_ns())
    }

    /// [`KernelPacingEngine::allocate_stream`] at time `now_ns`.
    pub fn allocate_stream_at(&self, stream: u64, share: f64, now_ns: u64) -> Result<()> {
        check_share(share)?;
        let mut map = self.streams.write();
        if map.contains_key(&stream) {
            return Err(SchedError::duplicate("stream", stream));
        }
        let total = Self::allocated_share(&map, None) + share;
        if total > 1.0 + SHARE_SLACK {
            return Err(SchedError::invalid(
                "share",
                share,
                format!("shares would add up to {total:.6}, more than 1"),
            ));
        }
        let (_, capacity) = self.rate_and_capacity(share);
        map.insert(
            stream,
            Arc::new(Mutex::new(Bucket {
                share,
                tokens: capacity,
                last_ns: now_ns,
                last_launch_ns: None,
                launches: 0,
                throttled: 0,
                granted: 0.0,
            })),
        );
        Ok(())
    }

    /// Changes `stream`'s share (same limits as allocation).
    pub fn set_share(&self, stream: u64, share: f64) -> Result<()> {
        check_share(share)?;
        let map = self.streams.write();
        let bucket = map
            .get(&stream)
            .ok_or_else(|| SchedError::unknown("stream", stream))?;
        let total = Self::allocated_share(&map, Some(stream)) + share;
        if total > 1.0 + SHARE_SLACK {
            return Err(SchedError::invalid(
                "share",
                share,
                format!("shares would add up to {total:.6}, more than 1"),
            ));
        }
        bucket.lock().share = share;
        Ok(())
    }

    /// Removes `stream`.
    pub fn release_stream(&self, stream: u64) -> Result<()> {
        self.streams
            .write()
            .remove(&stream)
            .map(|_| ())
            .ok_or_else(|| SchedError::unknown("stream", stream))
    }

    /// Streams with a share.
    pub fn streams(&self) -> Vec<u64> {
        let mut v: Vec<u64> = self.streams.read().keys().copied().collect();
        v.sort_unstable();
        v
    }

    fn refill(&self, b: &mut Bucket, now_ns: u64) -> (f64, f64) {
        let (rate, capacity) = self.rate_and_capacity(b.share);
        if now_ns > b.last_ns {
            let dt = (now_ns - b.last_ns) as f64 / 1e9;
            b.tokens = (b.tokens + rate * dt).min(capacity);
            b.last_ns = now_ns;
        } else if b.tokens > capacity {
            b.tokens = capacity; // the rate went down since the last refill
        }
        (rate, capacity)
    }

    fn decide(&self, b: &mut Bucket, cost: f64, now_ns: u64) -> PacingDecision {
        let (rate, capacity) = self.refill(b, now_ns);
        let need = cost.min(capacity);
        let token_wait_ms = if b.tokens >= need {
            0.0
        } else if rate > 0.0 {
            (need - b.tokens) / rate * 1e3
        } else {
            f64::INFINITY
        };
        let interval_wait_ms = match b.last_launch_ns {
            Some(last) => {
                let since_ms = now_ns.saturating_sub(last) as f64 / 1e6;
                (self.config.min_interval_ms - since_ms).max(0.0)
            }
            None => 0.0,
        };
        let delay_ms = token_wait_ms.max(interval_wait_ms);
        if delay_ms > 0.0 {
            PacingDecision::Wait { delay_ms }
        } else {
            PacingDecision::Launch
        }
    }

    fn take(b: &mut Bucket, cost: f64, now_ns: u64) {
        b.tokens -= cost;
        b.launches += 1;
        b.granted += cost;
        b.last_launch_ns = Some(now_ns);
    }

    /// Whether a launch of `cost` on `stream` may go now, without taking anything.
    pub fn should_launch(&self, stream: u64, cost: f64) -> Result<PacingDecision> {
        self.should_launch_at(stream, cost, now_ns())
    }

    /// [`KernelPacingEngine::should_launch`] at time `now_ns`.
    pub fn should_launch_at(&self, stream: u64, cost: f64, now_ns: u64) -> Result<PacingDecision> {
        check_cost(cost)?;
        let bucket = self.bucket(stream)?;
        let mut b = bucket.lock();
        Ok(self.decide(&mut b, cost, now_ns))
    }

    /// Takes `cost` from `stream`'s bucket if the launch may go now (check and take in one step).
    pub fn try_launch(&self, stream: u64, cost: f64) -> Result<PacingDecision> {
        self.try_launch_at(stream, cost, now_ns())
    }

    /// [`KernelPacingEngine::try_launch`] at time `now_ns`.
    pub fn try_launch_at(&self, stream: u64, cost: f64, now_ns: u64) -> Result<PacingDecision> {
        check_cost(cost)?;
        let bucket = self.bucket(stream)?;
        let mut b = bucket.lock();
        let decision = self.decide(&mut b, cost, now_ns);
        match decision {
            PacingDecision::Launch => Self::take(&mut b, cost, now_ns),
            PacingDecision::Wait { .. } => b.throttled += 1,
        }
        Ok(decision)
    }

    /// Records a launch of `cost` that happened (takes the tokens even if that makes a debt).
    pub fn record_launch(&self, stream: u64, cost: f64) -> Result<()> {
        self.record_launch_at(stream, cost, now_ns())
    }

    /// [`KernelPacingEngine::record_launch`] at time `now_ns`.
    pub fn record_launch_at(&self, stream: u64, cost: f64, now_ns: u64) -> Result<()> {
        check_cost(cost)?;
        let bucket = self.bucket(stream)?;
        let mut b = bucket.lock();
        self.refill(&mut b, now_ns);
        Self::take(&mut b, cost, now_ns);
        Ok(())
    }

    /// Reports that a launch of `cost` took `elapsed_ms` on the device; in adaptive mode this
    /// updates the learned device bandwidth (moving average).
    pub fn record_completion(&self, cost: f64, elapsed_ms: f64) -> Result<()> {
        check_cost(cost)?;
        if !(elapsed_ms.is_finite() && elapsed_ms > 0.0) {
            return Err(SchedError::invalid(
                "elapsed_ms",
                elapsed_ms,
                "must be a finite, positive number",
            ));
        }
        if !self.config.adaptive || cost == 0.0 {
            return Ok(());
        }
        let observed = cost / (elapsed_ms / 1e3);
        let _ = self
            .learned
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |bits| {
                let old = f64::from_bits(bits);
                let new = if old > 0.0 {
                    0.8 * old + 0.2 * observed
                } else {
                    observed
                };
                Some(new.to_bits())
            });
        Ok(())
    }

    /// Pacing state of `stream`.
    pub fn stream_stats(&self, stream: u64) -> Result<StreamPacingStats> {
        let bucket = self.bucket(stream)?;
        let b = bucket.lock();
        let (rate, _) = self.rate_and_capacity(b.share);
        Ok(StreamPacingStats {
            share: b.share,
            rate,
            tokens: b.tokens,
            launches: b.launches,
            throttled: b.throttled,
            granted: b.granted,
        })
    }
}

fn check_share(share: f64) -> Result<f64> {
    if share <= 0.0 {
        return Err(SchedError::invalid("share", share, "must be in (0, 1]"));
    }
    check_fraction("share", share, 0.0, 1.0)
}

fn check_cost(cost: f64) -> Result<()> {
    if cost.is_finite() && cost >= 0.0 {
        Ok(())
    } else {
        Err(SchedError::invalid(
            "cost",
            cost,
            "must be a finite, non-negative number",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn a_stream_is_held_to_its_rate_after_the_initial_burst() {
        // 1000 units/s, share 0.5 -> 500/s, bucket 50 (100 ms).
        let e = KernelPacingEngine::new(PacingConfig::new(1000.0)).unwrap();
        e.allocate_stream_at(1, 0.5, 0).unwrap();
        let mut granted = 0.0f64;
        let mut t = 0;
        while t <= 1000 * MS {
            if e.try_launch_at(1, 10.0, t).unwrap() == PacingDecision::Launch {
                granted += 10.0;
            }
            t += MS;
        }
        assert!((granted - 550.0).abs() <= 10.0, "granted {granted}");
    }

    #[test]
    fn wait_time_is_the_time_to_refill() {
        let e = KernelPacingEngine::new(PacingConfig::new(100.0)).unwrap();
        e.allocate_stream_at(7, 1.0, 0).unwrap();
        assert_eq!(e.try_launch_at(7, 10.0, 0).unwrap(), PacingDecision::Launch);
        match e.try_launch_at(7, 10.0, 0).unwrap() {
            PacingDecision::Wait { delay_ms } => assert!((delay_ms - 100.0).abs() < 1e-6),
            d => panic!("{d:?}"),
        }
    }

    #[test]
    fn shares_cannot_exceed_one_and_bad_values_are_errors() {
        let e = KernelPacingEngine::new(PacingConfig::new(1.0)).unwrap();
        e.allocate_stream(1, 0.7).unwrap();
        assert!(matches!(
            e.allocate_stream(2, 0.5),
            Err(SchedError::InvalidArgument { name: "share", .. })
        ));
        assert!(e.allocate_stream(2, -0.1).is_err());
        assert!(e.allocate_stream(2, f64::NAN).is_err());
        assert!(matches!(
            e.allocate_stream(1, 0.1),
            Err(SchedError::DuplicateId { .. })
        ));
        assert!(matches!(
            e.try_launch(99, 1.0),
            Err(SchedError::UnknownId { .. })
        ));
        assert!(e.try_launch(1, -1.0).is_err());
        e.allocate_stream(2, 0.3).unwrap();
        assert!(KernelPacingEngine::new(PacingConfig::new(0.0)).is_err());
    }

    #[test]
    fn adaptive_mode_learns_the_device_bandwidth() {
        let mut cfg = PacingConfig::new(1.0);
        cfg.adaptive = true;
        let e = KernelPacingEngine::new(cfg).unwrap();
        e.allocate_stream(1, 0.5).unwrap();
        for _ in 0..50 {
            e.record_completion(2000.0, 1.0).unwrap(); // 2e6 units/s
        }
        assert!((e.total_bandwidth() - 2e6).abs() < 1.0);
        assert!((e.stream_stats(1).unwrap().rate - 1e6).abs() < 1.0);
    }

    #[test]
    fn min_interval_spaces_launches() {
        let mut cfg = PacingConfig::new(1e9);
        cfg.min_interval_ms = 5.0;
        let e = KernelPacingEngine::new(cfg).unwrap();
        e.allocate_stream_at(1, 1.0, 0).unwrap();
        assert_eq!(e.try_launch_at(1, 1.0, 0).unwrap(), PacingDecision::Launch);
        assert!(matches!(
            e.try_launch_at(1, 1.0, 2 * MS).unwrap(),
            PacingDecision::Wait { .. }
        ));
        assert_eq!(
            e.try_launch_at(1, 1.0, 5 * MS).unwrap(),
            PacingDecision::Launch
        );
    }
    #[test]
    fn saturating_streams_get_their_shares_within_ten_percent_per_two_second_window() {
        // Two streams launching as fast as allowed (one launch = cost 1) for 10 s of fake time; the
        // device budget is 2000 launches/s, shares 0.7 and 0.2.
        let e = KernelPacingEngine::new(PacingConfig::new(2000.0)).unwrap();
        e.allocate_stream_at(1, 0.7, 0).unwrap();
        e.allocate_stream_at(2, 0.2, 0).unwrap();
        let mut counts = [[0u64; 5]; 2];
        let mut t = 0;
        while t < 10_000 * MS {
            for (i, stream) in [1u64, 2].into_iter().enumerate() {
                while e.try_launch_at(stream, 1.0, t).unwrap() == PacingDecision::Launch {
                    counts[i][(t / (2000 * MS)) as usize] += 1;
                }
            }
            t += MS / 4;
        }
        for (i, share) in [0.7, 0.2].into_iter().enumerate() {
            let expected = share * 2000.0 * 2.0;
            for (w, &n) in counts[i].iter().enumerate() {
                // The first window also holds the initial bucket (100 ms of the stream's rate).
                let burst = if w == 0 { share * 2000.0 * 0.1 } else { 0.0 };
                let err = (n as f64 - expected - burst).abs() / expected;
                assert!(
                    err < 0.10,
                    "stream {i} window {w}: {n} launches, expected {expected}"
                );
            }
        }
    }
}
