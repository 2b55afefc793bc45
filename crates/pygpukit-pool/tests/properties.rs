//! Property tests of the pool under random allocate/free/release sequences: no block is handed out
//! twice, the statistics equal what the blocks add up to, and a limit is never exceeded.

use std::collections::HashMap;

use proptest::prelude::*;
use std::sync::Arc;

use pygpukit_pool::{Decision, Pool, PoolError, SharedBudget};

#[derive(Clone, Debug)]
enum Op {
    Allocate {
        size: u64,
        stream: u64,
    },
    Free {
        index: usize,
    },
    DeviceRefuses {
        size: u64,
        stream: u64,
    },
    ReleaseCached {
        bytes: Option<u64>,
    },
    ReleaseStream {
        stream: u64,
    },
    /// The device's context was reset: all its memory is gone at once.
    Reset,
    /// A graph capture opens a hold (when none is open), frees into it, takes from it, ends it.
    HoldBegin,
    FreeHeld {
        index: usize,
    },
    TakeHeld {
        size: u64,
        stream: u64,
    },
    HoldEnd,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (1u64..3_000_000, 0u64..3).prop_map(|(size, stream)| Op::Allocate { size, stream }),
        4 => any::<usize>().prop_map(|index| Op::Free { index }),
        1 => (1u64..100_000, 0u64..3).prop_map(|(size, stream)| Op::DeviceRefuses { size, stream }),
        1 => proptest::option::of(1u64..4_000_000).prop_map(|bytes| Op::ReleaseCached { bytes }),
        1 => (0u64..3).prop_map(|stream| Op::ReleaseStream { stream }),
        1 => Just(Op::Reset),
        1 => Just(Op::HoldBegin),
        2 => any::<usize>().prop_map(|index| Op::FreeHeld { index }),
        2 => (1u64..3_000_000, 0u64..3).prop_map(|(size, stream)| Op::TakeHeld { size, stream }),
        1 => Just(Op::HoldEnd),
    ]
}

/// The device the tests pretend to have: hands out fresh, never-overlapping addresses.
struct FakeDevice {
    next: u64,
    live: HashMap<u64, u64>,
}

impl FakeDevice {
    fn allocate(&mut self, size: u64) -> u64 {
        let ptr = self.next;
        self.next += size + 4096;
        self.live.insert(ptr, size);
        ptr
    }
    /// A context reset: every allocation disappears; returns the bytes it held.
    fn reset(&mut self) -> u64 {
        let held = self.live.values().sum();
        self.live.clear();
        held
    }
    fn release(&mut self, blocks: &[(u64, u64)]) {
        for (ptr, size) in blocks {
            assert_eq!(
                self.live.remove(ptr),
                Some(*size),
                "released a block the device does not hold"
            );
        }
    }
}

fn run(limit: Option<u64>, ops: Vec<Op>) {
    let mut pool = Pool::new(limit);
    let mut device = FakeDevice {
        next: 1 << 40,
        live: HashMap::new(),
    };
    let mut in_use: Vec<(u64, u64)> = Vec::new(); // (ptr, size) handed out and not freed
    let mut streams: HashMap<u64, u64> = HashMap::new(); // ptr -> the stream it was registered for
    let mut hold: Option<u64> = None;
    let mut held: Vec<(u64, u64)> = Vec::new(); // (ptr, size) freed into the open or ended-not-yet hold
    for op in ops {
        match op {
            Op::Allocate { size, stream } | Op::DeviceRefuses { size, stream } => {
                let refuse = matches!(op, Op::DeviceRefuses { .. });
                match pool.request(size, stream) {
                    Ok(Decision::Reuse { ptr, size: got }) => {
                        assert!(got >= size);
                        assert!(
                            !in_use.iter().any(|&(p, _)| p == ptr),
                            "block {ptr:#x} handed out twice"
                        );
                        assert!(
                            !held.iter().any(|&(p, _)| p == ptr),
                            "held block {ptr:#x} handed out"
                        );
                        in_use.push((ptr, got));
                    }
                    Ok(Decision::Allocate { size: got, release }) => {
                        assert!(got >= size);
                        device.release(&release);
                        if refuse {
                            pool.abandon(got);
                        } else {
                            let ptr = device.allocate(got);
                            pool.register(ptr, got, stream).unwrap();
                            streams.insert(ptr, stream);
                            in_use.push((ptr, got));
                        }
                    }
                    Err(PoolError::OutOfMemory { limit: l, .. }) => assert_eq!(Some(l), limit),
                    Err(other) => panic!("unexpected {other:?}"),
                }
            }
            Op::Free { index } => {
                if !in_use.is_empty() {
                    let (ptr, _) = in_use.swap_remove(index % in_use.len());
                    pool.free(ptr).unwrap();
                    assert_eq!(pool.free(ptr), Err(PoolError::DoubleFree(ptr)));
                }
            }
            Op::ReleaseCached { bytes } => {
                let released = pool.release_cached(bytes);
                assert!(released
                    .iter()
                    .all(|(p, _)| !held.iter().any(|(h, _)| h == p)));
                device.release(&released);
            }
            Op::ReleaseStream { stream } => {
                let released = pool.release_stream(stream);
                assert!(released
                    .iter()
                    .all(|(p, _)| !held.iter().any(|(h, _)| h == p)));
                device.release(&released);
            }
            Op::Reset => {
                let blocks = pool.stats().in_use_blocks + pool.stats().cached_blocks;
                let lost = device.reset();
                assert_eq!(
                    pool.reset(),
                    (blocks, lost),
                    "the pool forgot other blocks than the device lost"
                );
                in_use.clear();
                held.clear();
                if let Some(h) = hold.take() {
                    assert_eq!(pool.hold_end(h), Err(PoolError::UnknownHold(h)));
                }
            }
            Op::HoldBegin => {
                if hold.is_none() {
                    hold = Some(pool.hold_begin());
                }
            }
            Op::FreeHeld { index } => {
                if let (Some(h), false) = (hold, in_use.is_empty()) {
                    let (ptr, size) = in_use.swap_remove(index % in_use.len());
                    pool.free_held(ptr, h).unwrap();
                    assert_eq!(pool.free(ptr), Err(PoolError::DoubleFree(ptr)));
                    held.push((ptr, size));
                }
            }
            Op::TakeHeld { size, stream } => {
                if let Some(h) = hold {
                    if let Some((ptr, got)) = pool.take_held(size, stream, h) {
                        let at = held
                            .iter()
                            .position(|&(p, _)| p == ptr)
                            .expect("taken from the hold");
                        assert_eq!(held.swap_remove(at), (ptr, got));
                        assert!(got >= size);
                        assert_eq!(streams.get(&ptr), Some(&stream), "taken for another stream");
                        in_use.push((ptr, got));
                    }
                }
            }
            Op::HoldEnd => {
                if let Some(h) = hold.take() {
                    assert_eq!(pool.hold_end(h), Ok(held.len() as u64));
                    held.clear();
                }
            }
        }
        let stats = pool.stats();
        let held_bytes: u64 = held.iter().map(|&(_, s)| s).sum();
        assert_eq!(
            stats.in_use_bytes,
            in_use.iter().map(|&(_, s)| s).sum::<u64>() + held_bytes
        );
        assert_eq!(stats.in_use_blocks, (in_use.len() + held.len()) as u64);
        let held: u64 = device.live.values().sum();
        assert_eq!(
            stats.in_use_bytes + stats.cached_bytes,
            held,
            "pool and device disagree"
        );
        assert_eq!(stats.pending_bytes, 0);
        assert_eq!(stats.requests, stats.reuse_hits + stats.device_allocations);
        assert!(stats.peak_in_use_bytes >= stats.in_use_bytes);
        if let Some(limit) = limit {
            assert!(held <= limit, "{held} bytes held over the limit {limit}");
        }
        for &(ptr, _) in &in_use {
            assert!(pool.is_in_use(ptr));
        }
    }
}

/// Two pools (two devices) under one shared budget: the budget always equals what both hold on their
/// devices, a request is refused only with the shared or the pool's own limit, and the shared limit
/// is never exceeded.
fn run_shared(global: u64, ops: Vec<(usize, Op)>) {
    let budget = Arc::new(SharedBudget::new(Some(global)));
    let mut pools = [
        Pool::with_budget(None, Arc::clone(&budget)),
        Pool::with_budget(Some(global / 2 + 1), Arc::clone(&budget)),
    ];
    let mut devices = [0u64, 1].map(|d| FakeDevice {
        next: (d + 1) << 44,
        live: HashMap::new(),
    });
    let mut in_use: [Vec<u64>; 2] = [Vec::new(), Vec::new()];
    for (which, op) in ops {
        let (pool, device, used) = (&mut pools[which], &mut devices[which], &mut in_use[which]);
        match op {
            Op::Allocate { size, stream } | Op::DeviceRefuses { size, stream } => {
                match pool.request(size, stream) {
                    Ok(Decision::Reuse { ptr, .. }) => used.push(ptr),
                    Ok(Decision::Allocate { size: got, release }) => {
                        device.release(&release);
                        if matches!(op, Op::DeviceRefuses { .. }) {
                            pool.abandon(got);
                        } else {
                            let ptr = device.allocate(got);
                            pool.register(ptr, got, stream).unwrap();
                            used.push(ptr);
                        }
                    }
                    Err(PoolError::OutOfMemory {
                        limit, all_devices, ..
                    }) => {
                        assert_eq!(limit, if all_devices { global } else { global / 2 + 1 });
                    }
                    Err(other) => panic!("unexpected {other:?}"),
                }
            }
            Op::Free { index } => {
                if !used.is_empty() {
                    let ptr = used.swap_remove(index % used.len());
                    pool.free(ptr).unwrap();
                }
            }
            Op::ReleaseCached { bytes } => device.release(&pool.release_cached(bytes)),
            Op::ReleaseStream { stream } => device.release(&pool.release_stream(stream)),
            Op::Reset => {
                let held = device.reset();
                assert_eq!(
                    pool.reset().1,
                    held,
                    "the pool forgot other bytes than the device lost"
                );
                used.clear();
            }
            // Holds (single-pool property above) change no budget: held blocks stay in use.
            Op::HoldBegin | Op::FreeHeld { .. } | Op::TakeHeld { .. } | Op::HoldEnd => {}
        }
        let held: u64 = devices.iter().flat_map(|d| d.live.values()).sum();
        assert_eq!(
            budget.reserved(),
            held,
            "the shared budget and the devices disagree"
        );
        assert!(
            held <= global,
            "{held} bytes held over the shared limit {global}"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn pools_sharing_a_budget_never_exceed_it(
        global in 1u64..16_000_000,
        ops in proptest::collection::vec((0usize..2, op()), 1..200),
    ) {
        run_shared(global, ops);
    }

    #[test]
    fn unlimited_pool_invariants(ops in proptest::collection::vec(op(), 1..200)) {
        run(None, ops);
    }

    #[test]
    fn limited_pool_never_exceeds_its_limit(
        limit in 1u64..16_000_000,
        ops in proptest::collection::vec(op(), 1..200),
    ) {
        run(Some(limit), ops);
    }
}

/// SplitMix64: a 10k-task run draws its steps from one seed that proptest picks, so a failing case is
/// reproducible without shrinking a 10k-element sequence.
struct Mix(u64);
impl Mix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// `PROPTEST_CASES` when set (an explicit `with_cases` would otherwise ignore it), else `default`.
fn cases_or(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// How one simulated task ended.
#[derive(Clone, Copy, Debug, Default)]
struct Tally {
    completed: u64,
    failed: u64,
    cancelled: u64,
    allocations: u64,
}

/// One device's share of the 10k tasks: each task takes 1 to 4 blocks (now and then a model-sized
/// one) on one of 4 streams, a few at a time are live, and each ends completed (frees its blocks),
/// failed (a request refused by a limit or by the device: frees what it got) or cancelled part-way
/// (frees what it got and releases its stream's cache). Checks after every step that the pool's
/// statistics equal its blocks, that its own limit and the shared one hold, and at the end that
/// every allocation was returned.
fn device_worker(
    seed: u64,
    tasks: u64,
    base: u64,
    pool: &mut Pool,
    budget: &SharedBudget,
    global: u64,
) -> Tally {
    let mut rng = Mix(seed);
    let mut device = FakeDevice {
        next: base,
        live: HashMap::new(),
    };
    let mut live: Vec<Vec<u64>> = Vec::new(); // blocks of each live task
    let mut tally = Tally::default();
    let mut begun = 0;
    let own = pool.limit();
    while begun < tasks || !live.is_empty() {
        if begun < tasks && (live.is_empty() || (live.len() < 16 && rng.below(2) == 0)) {
            begun += 1;
            let stream = rng.below(4);
            let mut blocks = Vec::new();
            let mut refused = false;
            for _ in 0..=rng.below(4) {
                let size = if rng.below(40) == 0 {
                    global / 4 + rng.below(global / 2) // model-sized
                } else {
                    1 + rng.below(2_000_000)
                };
                match pool.request(size, stream) {
                    Ok(Decision::Reuse { ptr, size: got }) => {
                        assert!(got >= size);
                        blocks.push(ptr);
                    }
                    Ok(Decision::Allocate { size: got, release }) => {
                        device.release(&release);
                        if rng.below(50) == 0 {
                            pool.abandon(got); // the device itself refused
                            refused = true;
                            break;
                        }
                        let ptr = device.allocate(got);
                        pool.register(ptr, got, stream).unwrap();
                        blocks.push(ptr);
                    }
                    Err(PoolError::OutOfMemory { .. }) => {
                        refused = true;
                        break;
                    }
                    Err(other) => panic!("unexpected {other:?}"),
                }
                tally.allocations += 1;
                let reserved = budget.reserved();
                assert!(
                    reserved <= global,
                    "{reserved} bytes reserved over the shared limit {global}"
                );
            }
            if refused {
                tally.failed += 1;
                for ptr in blocks {
                    pool.free(ptr).unwrap();
                }
            } else {
                live.push(blocks);
            }
        } else {
            let blocks = live.swap_remove(rng.below(live.len() as u64) as usize);
            let cancel = rng.below(8) == 0;
            for &ptr in &blocks {
                pool.free(ptr).unwrap();
                assert_eq!(pool.free(ptr), Err(PoolError::DoubleFree(ptr)));
            }
            if cancel {
                tally.cancelled += 1;
                device.release(&pool.release_stream(rng.below(4)));
            } else {
                tally.completed += 1;
            }
            if rng.below(64) == 0 {
                device.release(&pool.release_cached(Some(rng.below(8_000_000))));
            }
        }
        let stats = pool.stats();
        let held: u64 = device.live.values().sum();
        assert_eq!(
            stats.in_use_blocks,
            live.iter().map(Vec::len).sum::<usize>() as u64
        );
        assert_eq!(
            stats.in_use_bytes + stats.cached_bytes,
            held,
            "pool and device disagree"
        );
        assert_eq!(stats.pending_bytes, 0);
        assert_eq!(stats.requests, stats.reuse_hits + stats.device_allocations);
        if let Some(own) = own {
            assert!(held <= own, "{held} bytes held over the pool's limit {own}");
        }
        assert!(
            held <= global,
            "{held} bytes held over the shared limit {global}"
        );
    }
    let stats = pool.stats();
    assert_eq!((stats.in_use_bytes, stats.in_use_blocks), (0, 0));
    assert_eq!(
        stats.frees, stats.requests,
        "an allocation was not returned"
    );
    device.release(&pool.release_cached(None));
    assert!(
        device.live.is_empty(),
        "the device still holds {:?}",
        device.live
    );
    assert_eq!(pool.stats().cached_bytes, 0);
    tally
}

/// 10k tasks over two devices' pools under one shared budget, each device driven by its own thread
/// (the budget is the only shared state, as in the native module): no budget is exceeded, every task
/// ends one way or the other, and every byte comes back.
fn run_ten_thousand_tasks(seed: u64, global: u64, own_limit: Option<u64>) {
    const TASKS: u64 = 10_000;
    let budget = Arc::new(SharedBudget::new(Some(global)));
    let handles: Vec<_> = (0..2u64)
        .map(|d| {
            let budget = Arc::clone(&budget);
            std::thread::spawn(move || {
                let mut pool =
                    Pool::with_budget(if d == 1 { own_limit } else { None }, Arc::clone(&budget));
                device_worker(
                    seed ^ d,
                    TASKS / 2,
                    (d + 1) << 44,
                    &mut pool,
                    &budget,
                    global,
                )
            })
        })
        .collect();
    let tallies: Vec<Tally> = handles
        .into_iter()
        .map(|h| h.join().expect("worker panicked"))
        .collect();
    let ended: u64 = tallies
        .iter()
        .map(|t| t.completed + t.failed + t.cancelled)
        .sum();
    assert_eq!(ended, TASKS, "tasks were lost: {tallies:?}");
    assert!(
        tallies.iter().all(|t| t.completed > 0 && t.allocations > 0),
        "{tallies:?}"
    );
    assert_eq!(budget.reserved(), 0, "the shared budget still counts bytes");
}

proptest! {
    // Each case runs 10k tasks; a few cases keep `cargo test` within CI time (PROPTEST_CASES raises it).
    #![proptest_config(ProptestConfig::with_cases(cases_or(8)))]

    #[test]
    fn ten_thousand_tasks_with_cancels_and_failures_return_every_allocation(
        seed in any::<u64>(),
        global in 16_000_000u64..64_000_000,
        own_limit in proptest::option::of(8_000_000u64..32_000_000),
    ) {
        run_ten_thousand_tasks(seed, global, own_limit);
    }
}
