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
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (1u64..3_000_000, 0u64..3).prop_map(|(size, stream)| Op::Allocate { size, stream }),
        4 => any::<usize>().prop_map(|index| Op::Free { index }),
        1 => (1u64..100_000, 0u64..3).prop_map(|(size, stream)| Op::DeviceRefuses { size, stream }),
        1 => proptest::option::of(1u64..4_000_000).prop_map(|bytes| Op::ReleaseCached { bytes }),
        1 => (0u64..3).prop_map(|stream| Op::ReleaseStream { stream }),
        1 => Just(Op::Reset),
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
            Op::ReleaseCached { bytes } => device.release(&pool.release_cached(bytes)),
            Op::ReleaseStream { stream } => device.release(&pool.release_stream(stream)),
            Op::Reset => {
                let blocks = pool.stats().in_use_blocks + pool.stats().cached_blocks;
                let held = device.reset();
                assert_eq!(
                    pool.reset(),
                    (blocks, held),
                    "the pool forgot other blocks than the device lost"
                );
                in_use.clear();
            }
        }
        let stats = pool.stats();
        assert_eq!(
            stats.in_use_bytes,
            in_use.iter().map(|&(_, s)| s).sum::<u64>()
        );
        assert_eq!(stats.in_use_blocks, in_use.len() as u64);
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
