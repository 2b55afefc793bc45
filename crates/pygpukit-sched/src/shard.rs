//! A hash map split into independently locked shards, so that threads working on different ids do
//! not contend on one lock.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;

use parking_lot::{Mutex, MutexGuard};

const SHARDS: usize = 32;

/// FNV-1a as a `Hasher`: ids are short strings chosen by the program itself, so a fast
/// non-keyed hash is fine (there is no untrusted input to defend against).
#[derive(Default)]
pub(crate) struct Fnv(u64);

impl Hasher for Fnv {
    fn write(&mut self, bytes: &[u8]) {
        let mut h = if self.0 == 0 {
            0xcbf2_9ce4_8422_2325
        } else {
            self.0
        };
        for b in bytes {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        self.0 = h;
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

/// A `HashMap` hashing with [`Fnv`].
pub(crate) type FnvMap<K, V> = HashMap<K, V, BuildHasherDefault<Fnv>>;

type Shard<V> = Mutex<FnvMap<Arc<str>, V>>;

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
            shards: (0..SHARDS).map(|_| Mutex::new(FnvMap::default())).collect(),
        }
    }
}

impl<V> ShardedMap<V> {
    /// The locked shard that holds (or would hold) `id`.
    pub(crate) fn shard(&self, id: &str) -> MutexGuard<'_, FnvMap<Arc<str>, V>> {
        self.shards[shard_of(id)].lock()
    }

    /// Every shard in turn, locked one at a time.
    pub(crate) fn for_each_shard(&self, mut f: impl FnMut(&mut FnvMap<Arc<str>, V>)) {
        for shard in self.shards.iter() {
            f(&mut shard.lock());
        }
    }

    /// Number of entries (a snapshot; shards are counted one at a time).
    pub(crate) fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().len()).sum()
    }
}
