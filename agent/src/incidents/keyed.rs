//! Per-key state with a cap: a node that sees more keys (namespaces, servers, containers) than
//! this at once drops the least recently touched one, and counts it.

use std::{collections::HashMap, hash::Hash};

/// Keys each signature keeps at most.
pub const DEFAULT_CAP: usize = 10_000;

pub struct Keyed<K, V> {
    map: HashMap<K, (u64, V)>,
    cap: usize,
    evicted: u64,
}

impl<K: Hash + Eq + Clone, V> Keyed<K, V> {
    pub fn new(cap: usize) -> Self {
        Self { map: HashMap::new(), cap, evicted: 0 }
    }

    /// The state of `key`, created with `init` (evicting the oldest key at the cap), touched at `now`.
    pub fn touch(&mut self, key: &K, now: u64, init: impl FnOnce() -> V) -> &mut V {
        if !self.map.contains_key(key) && self.map.len() >= self.cap {
            // Linear, but only when the cap is reached — a node in that state has bigger problems.
            if let Some(oldest) = self.map.iter().min_by_key(|(_, (t, _))| *t).map(|(k, _)| k.clone()) {
                self.map.remove(&oldest);
                self.evicted += 1;
            }
        }
        let slot = self.map.entry(key.clone()).or_insert_with(|| (now, init()));
        slot.0 = slot.0.max(now);
        &mut slot.1
    }

    pub fn get(&self, key: &K) -> Option<&V> {
        self.map.get(key).map(|(_, v)| v)
    }

    pub fn get_mut(&mut self, key: &K) -> Option<&mut V> {
        self.map.get_mut(key).map(|(_, v)| v)
    }

    pub fn retain(&mut self, mut keep: impl FnMut(&K, &mut V) -> bool) {
        self.map.retain(|k, (_, v)| keep(k, v));
    }

    pub fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        self.map.iter().map(|(k, (_, v))| (k, v))
    }

    pub fn evicted(&self) -> u64 {
        self.evicted
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_least_recently_touched_key_goes_first() {
        let mut k: Keyed<u32, u32> = Keyed::new(2);
        *k.touch(&1, 10, || 0) += 1;
        *k.touch(&2, 20, || 0) += 1;
        *k.touch(&1, 30, || 0) += 1;
        k.touch(&3, 40, || 0);
        assert_eq!((k.get(&1), k.get(&2), k.get(&3)), (Some(&2), None, Some(&0)));
        assert_eq!(k.evicted(), 1);
    }
}
