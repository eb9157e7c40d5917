//! The edge's caches (key records, leases held, recent 429s, local fallback
//! buckets, the unknown-key budgets) as one map type with a bound: at most `max`
//! entries, and when a new key finds it full, the entries no longer live are
//! dropped first; if that frees nothing, the cache either forgets everything
//! ([`WhenFull::Clear`]: what it holds can be read again) or turns the newcomer
//! away ([`WhenFull::Refuse`]: what it holds must not be lost).

use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::{BuildHasher, Hash};
use std::ops::Deref;

/// What a full map does when dropping the entries no longer live made no room.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WhenFull {
    /// Forget every entry.
    Clear,
    /// Keep them all; the new key is not held.
    Refuse,
}

/// A map of at most `max` entries (read through [`Deref`] as a `HashMap`).
#[derive(Debug)]
pub struct BoundedMap<K, V, S = std::collections::hash_map::RandomState> {
    map: HashMap<K, V, S>,
    max: usize,
    full: WhenFull,
}

impl<K: Hash + Eq, V, S: BuildHasher + Default> BoundedMap<K, V, S> {
    /// An empty map of at most `max` entries (at least one), doing `full` when a
    /// sweep frees nothing.
    pub fn new(max: usize, full: WhenFull) -> Self {
        Self {
            map: HashMap::default(),
            max: max.max(1),
            full,
        }
    }
}

impl<K: Hash + Eq, V, S: BuildHasher> BoundedMap<K, V, S> {
    /// Whether `key` may be held: it is, or there is room — once, when full, the
    /// entries `live` rejects are dropped, then [`WhenFull`] applies.
    pub fn room_for<Q>(&mut self, key: &Q, live: impl FnMut(&V) -> bool) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        if self.map.len() < self.max || self.map.contains_key(key) {
            return true;
        }
        let mut live = live;
        self.map.retain(|_, v| live(v));
        if self.map.len() < self.max {
            return true;
        }
        match self.full {
            WhenFull::Clear => {
                self.map.clear();
                true
            }
            WhenFull::Refuse => false,
        }
    }

    /// Inserts `value` under `key` when [`Self::room_for`] it: whether it was.
    pub fn insert(&mut self, key: K, value: V, live: impl FnMut(&V) -> bool) -> bool {
        if !self.room_for(&key, live) {
            return false;
        }
        self.map.insert(key, value);
        true
    }

    /// The entry of `key`, made (`V::default()`) when [`Self::room_for`] it.
    pub fn get_or_default(&mut self, key: K, live: impl FnMut(&V) -> bool) -> Option<&mut V>
    where
        V: Default,
    {
        if !self.room_for(&key, live) {
            return None;
        }
        Some(self.map.entry(key).or_default())
    }

    pub fn get_mut<Q>(&mut self, key: &Q) -> Option<&mut V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.map.get_mut(key)
    }

    pub fn remove<Q>(&mut self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.map.remove(key)
    }

    pub fn iter_mut(&mut self) -> impl Iterator<Item = (&K, &mut V)> {
        self.map.iter_mut()
    }

    pub fn retain(&mut self, keep: impl FnMut(&K, &mut V) -> bool) {
        self.map.retain(keep);
    }

    pub fn clear(&mut self) {
        self.map.clear();
    }

    /// Whether a key not held yet would find room without a sweep.
    pub fn has_room(&self) -> bool {
        self.map.len() < self.max
    }
}

impl<K, V, S> Deref for BoundedMap<K, V, S> {
    type Target = HashMap<K, V, S>;

    fn deref(&self) -> &Self::Target {
        &self.map
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Map = BoundedMap<u32, u64>;

    #[test]
    fn a_full_map_drops_what_is_dead_then_clears_or_refuses() {
        for full in [WhenFull::Clear, WhenFull::Refuse] {
            let mut m = Map::new(2, full);
            assert!(m.insert(1, 10, |_| true));
            assert!(m.insert(2, 20, |_| true));
            assert!(m.insert(2, 21, |_| false), "a key held is never swept for");
            assert_eq!(m.len(), 2);
            assert!(
                m.insert(3, 30, |v| *v > 10),
                "the dead entry (10) made room"
            );
            assert_eq!((m.get(&1), m.get(&3)), (None, Some(&30)));
            let admitted = m.insert(4, 40, |_| true);
            match full {
                WhenFull::Clear => {
                    assert!(admitted);
                    assert_eq!(m.len(), 1, "everything forgotten, then the newcomer");
                }
                WhenFull::Refuse => {
                    assert!(!admitted);
                    assert_eq!((m.len(), m.get(&4)), (2, None), "nothing lost");
                }
            }
            assert!(m.len() <= 2);
        }
    }

    #[test]
    fn an_entry_is_made_only_where_there_is_room() {
        let mut m = Map::new(1, WhenFull::Refuse);
        *m.get_or_default(1, |_| true).unwrap() += 5;
        *m.get_or_default(1, |_| true).unwrap() += 5;
        assert_eq!(m.get(&1), Some(&10));
        assert!(m.get_or_default(2, |_| true).is_none());
        assert!(!m.has_room());
        assert_eq!(m.remove(&1), Some(10));
        assert!(m.has_room());
    }
}
