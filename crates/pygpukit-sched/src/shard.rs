//! A hash map split into independently locked shards, so that threads working on different ids do
//! not contend on one lock.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::{Mutex, MutexGuard};

const SHARDS: usize = 32;

type Shard<V> = Mutex<HashMap<Arc<str>, V>>;

/// A map from string ids to values, in [`SHARDS`] shards chosen by a hash of the id.
pub(crate) struct ShardedMap<V> {
    shards: Box<[Shard<V>]>,
}

/// FNV-1a: cheap and good enough to spread ids over shards.
fn shard_of(id: &str) -> usize {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in id.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    (h ^ (h >> 29)) as usize % SHARDS
}

impl<V> Default for ShardedMap<V> {
    fn default() -> Self {
        ShardedMap {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
        }
    }
}

impl<V> ShardedMap<V> {
    /// The locked shard that holds (or would hold) `id`.
    pub(crate) fn shard(&self, id: &str) -> MutexGuard<'_, HashMap<Arc<str>, V>> {
        self.shards[shard_of(id)].lock()
    }

    /// Every shard in turn, locked one at a time.
    pub(crate) fn for_each_shard(&self, mut f: impl FnMut(&mut HashMap<Arc<str>, V>)) {
        for shard in self.shards.iter() {
            f(&mut shard.lock());
        }
    }

    /// Number of entries (a snapshot; shards are counted one at a time).
    pub(crate) fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().len()).sum()
    }
}
