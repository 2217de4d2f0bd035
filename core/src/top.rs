//! The keys denied most in a recent window: a space-saving heavy-hitter sketch with
//! exponential decay, in memory fixed at construction.
//!
//! Space-saving keeps `capacity` counters. A denial of a tracked key adds to its counter; a
//! denial of an untracked key takes over the smallest counter and adds to it (so a count
//! never underestimates, and any key with more than `total / capacity` of the (decayed)
//! denials is tracked). Decay is "forward": a denial at `t` adds `2^((t - landmark) /
//! half_life)`, and every count is read divided by the same factor for now, so old denials
//! fade with the half-life without touching every counter on each update. Counts only
//! grow, so the smallest is the root of a min-heap: an update costs a hash probe and a
//! sift of `log2(capacity)` levels, and allocates nothing.

use crate::Nanos;

/// Bytes of a key kept for display; longer keys are still told apart (by their length and
/// a 64-bit hash of the whole key) but shown cut.
pub const KEY_SHOWN: usize = 128;
/// Most counters a sketch may have.
pub const MAX_CAPACITY: usize = 65_536;

#[derive(Clone)]
struct Slot {
    hash: u64,
    len: usize,
    name: [u8; KEY_SHOWN],
    /// Decayed denials, scaled by the weight at the landmark.
    weight: f64,
    /// The weight it inherited when it took the slot over (its possible overestimate).
    error: f64,
    last: Nanos,
}

/// One row of [`Top::top`].
#[derive(Debug, Clone, PartialEq)]
pub struct Row<'a> {
    /// The key (its first [`KEY_SHOWN`] bytes).
    pub key: &'a [u8],
    /// The key's full length (more than `key.len()` if cut).
    pub len: usize,
    /// Denials in the recent window, decayed to now (an estimate that never
    /// underestimates; at most `error` too high).
    pub denied: f64,
    pub error: f64,
    /// When it was last denied.
    pub last: Nanos,
}

pub struct Top {
    slots: Vec<Slot>,
    /// Min-heap of slot indices by weight.
    heap: Vec<u32>,
    /// Each slot's position in `heap`.
    pos: Vec<u32>,
    /// Open addressing over slot hashes: slot index + 1, or 0 for free.
    index: Vec<u32>,
    landmark: Nanos,
    half_life: Nanos,
    /// The weight of a denial at `cached_at` (ms), computed once per millisecond.
    cached_at: Nanos,
    cached: f64,
    /// The slot of the key recorded last, + 1 (0: none): denials come in runs on one key,
    /// which then skips the hash and the probe.
    last: u32,
    /// The last slot's weight grew since the heap was last put in order: its sift is left
    /// for the next time the heap is used (a run of denials on one key sifts once; the
    /// heap ends the same, since a sift's path does not depend on the weight it moves).
    unsettled: bool,
}

pub fn hash(key: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &c in key {
        h = (h ^ u64::from(c)).wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

impl Top {
    /// A sketch of `capacity` counters (0: records nothing) whose counts halve every
    /// `half_life` ns. All its memory is allocated here.
    pub fn new(capacity: usize, half_life: Nanos) -> Top {
        let capacity = capacity.min(MAX_CAPACITY);
        let index_len = (capacity * 2).next_power_of_two().max(2);
        Top {
            slots: Vec::with_capacity(capacity),
            heap: Vec::with_capacity(capacity),
            pos: Vec::with_capacity(capacity),
            index: vec![0; index_len],
            landmark: 0,
            half_life: half_life.max(1),
            cached_at: u64::MAX,
            last: 0,
            cached: 1.0,
            unsettled: false,
        }
    }

    pub fn capacity(&self) -> usize {
        self.slots.capacity()
    }

    /// Bytes this sketch holds (fixed at construction).
    pub fn memory(&self) -> usize {
        self.slots.capacity() * (std::mem::size_of::<Slot>() + 8) + self.index.len() * 4
    }

    /// Forgets everything (`CONFIG RESETSTAT`); keeps the memory.
    pub fn clear(&mut self) {
        self.slots.clear();
        self.heap.clear();
        self.pos.clear();
        self.index.iter_mut().for_each(|s| *s = 0);
        self.landmark = 0;
        self.cached_at = u64::MAX;
        self.last = 0;
        self.unsettled = false;
    }

    fn weight_at(&mut self, now: Nanos) -> f64 {
        if self.landmark == 0 {
            self.landmark = now;
        }
        let ms = now / 1_000_000;
        if ms == self.cached_at {
            return self.cached;
        }
        let mut exp = now.saturating_sub(self.landmark) as f64 / self.half_life as f64;
        if exp > 512.0 {
            self.settle();
            // Renormalise before the weights overflow: same ratios, a later landmark.
            let scale = (-exp).exp2();
            for s in &mut self.slots {
                s.weight *= scale;
                s.error *= scale;
            }
            self.landmark = now;
            exp = 0.0;
        }
        self.cached_at = ms;
        self.cached = exp.exp2();
        self.cached
    }

    /// Records one denial of `key` at `now`.
    pub fn record(&mut self, key: &[u8], now: Nanos) {
        if self.slots.capacity() == 0 {
            return;
        }
        let w = self.weight_at(now);
        if let Some(id) = self.last_slot_of(key) {
            let s = &mut self.slots[id];
            s.weight += w;
            s.last = s.last.max(now);
            self.unsettled = true;
            return;
        }
        self.record_other(key, w, now);
    }

    /// [`Top::record`] for a key other than the last one recorded: out of line, so that a
    /// run of denials on one key costs only the few instructions above.
    #[inline(never)]
    fn record_other(&mut self, key: &[u8], w: f64, now: Nanos) {
        self.settle();
        let h = hash(key);
        let mask = self.index.len() - 1;
        let mut i = h as usize & mask;
        loop {
            match self.index[i] {
                0 => break,
                v => {
                    let s = &mut self.slots[v as usize - 1];
                    if s.hash == h
                        && s.len == key.len()
                        && s.name[..shown(key.len())] == key[..shown(key.len())]
                    {
                        self.add(v as usize - 1, w, now);
                        return;
                    }
                }
            }
            i = (i + 1) & mask;
        }
        let mut slot = Slot {
            hash: h,
            len: key.len(),
            name: [0; KEY_SHOWN],
            weight: w,
            error: 0.0,
            last: now,
        };
        slot.name[..shown(key.len())].copy_from_slice(&key[..shown(key.len())]);
        if self.slots.len() < self.slots.capacity() {
            let id = self.slots.len();
            self.slots.push(slot);
            self.pos.push(self.heap.len() as u32);
            self.heap.push(id as u32);
            self.index[i] = id as u32 + 1;
            self.sift_up(self.heap.len() - 1);
            self.last = id as u32 + 1;
            return;
        }
        // Take over the smallest counter.
        let id = self.heap[0] as usize;
        self.unindex(id);
        let old = self.slots[id].weight;
        slot.weight += old;
        slot.error = old;
        self.slots[id] = slot;
        self.index_insert(id);
        self.sift_down(0);
        self.last = id as u32 + 1;
    }

    /// The slot of `key` if it is the key recorded last and its whole name is stored.
    fn last_slot_of(&self, key: &[u8]) -> Option<usize> {
        let id = (self.last as usize).checked_sub(1)?;
        let s = self.slots.get(id)?;
        (key.len() <= KEY_SHOWN
            && s.len == key.len()
            && crate::bytes::equal(&s.name[..key.len()], key))
        .then_some(id)
    }

    /// Puts the heap in order after the last slot's weight grew (see `unsettled`).
    fn settle(&mut self) {
        if std::mem::take(&mut self.unsettled) {
            if let Some(id) = (self.last as usize).checked_sub(1) {
                let p = self.pos[id] as usize;
                self.sift_down(p);
            }
        }
    }

    /// Adds a denial of weight `w` at `now` to slot `id`.
    fn add(&mut self, id: usize, w: f64, now: Nanos) {
        let s = &mut self.slots[id];
        s.weight += w;
        s.last = s.last.max(now);
        let p = self.pos[id] as usize;
        self.sift_down(p);
        self.last = id as u32 + 1;
    }

    fn index_insert(&mut self, id: usize) {
        let mask = self.index.len() - 1;
        let mut i = self.slots[id].hash as usize & mask;
        while self.index[i] != 0 {
            i = (i + 1) & mask;
        }
        self.index[i] = id as u32 + 1;
    }

    /// Removes slot `id` from the index (backward-shift deletion keeps probes unbroken).
    fn unindex(&mut self, id: usize) {
        let mask = self.index.len() - 1;
        let mut i = self.slots[id].hash as usize & mask;
        while self.index[i] as usize != id + 1 {
            i = (i + 1) & mask;
        }
        let mut hole = i;
        let mut j = i;
        loop {
            j = (j + 1) & mask;
            let v = self.index[j];
            if v == 0 {
                break;
            }
            let home = self.slots[v as usize - 1].hash as usize & mask;
            // Move `j` into the hole if its home is not cyclically in (hole, j].
            let between = if hole <= j {
                hole < home && home <= j
            } else {
                hole < home || home <= j
            };
            if !between {
                self.index[hole] = v;
                hole = j;
            }
        }
        self.index[hole] = 0;
    }

    fn less(&self, a: usize, b: usize) -> bool {
        self.slots[self.heap[a] as usize].weight < self.slots[self.heap[b] as usize].weight
    }

    fn swap(&mut self, a: usize, b: usize) {
        self.heap.swap(a, b);
        self.pos[self.heap[a] as usize] = a as u32;
        self.pos[self.heap[b] as usize] = b as u32;
    }

    fn sift_up(&mut self, mut p: usize) {
        while p > 0 {
            let parent = (p - 1) / 2;
            if !self.less(p, parent) {
                break;
            }
            self.swap(p, parent);
            p = parent;
        }
    }

    fn sift_down(&mut self, mut p: usize) {
        let n = self.heap.len();
        loop {
            let (l, r) = (2 * p + 1, 2 * p + 2);
            let mut m = p;
            if l < n && self.less(l, m) {
                m = l;
            }
            if r < n && self.less(r, m) {
                m = r;
            }
            if m == p {
                return;
            }
            self.swap(p, m);
            p = m;
        }
    }

    /// The `count` keys with the most decayed denials at `now`, most first.
    pub fn top(&self, count: usize, now: Nanos) -> Vec<Row<'_>> {
        let exp = now.saturating_sub(self.landmark) as f64 / self.half_life as f64;
        let now_w = exp.exp2();
        let mut rows: Vec<Row> = self
            .slots
            .iter()
            .map(|s| Row {
                key: &s.name[..shown(s.len)],
                len: s.len,
                denied: s.weight / now_w,
                error: s.error / now_w,
                last: s.last,
            })
            .collect();
        rows.sort_by(|a, b| b.denied.total_cmp(&a.denied).then(b.last.cmp(&a.last)));
        rows.truncate(count);
        rows
    }
}

#[cfg(test)]
impl Top {
    /// A copy to inspect the heap of without settling this one.
    fn clone_heap_state(&self) -> Top {
        Top {
            slots: self.slots.clone(),
            heap: self.heap.clone(),
            pos: self.pos.clone(),
            index: self.index.clone(),
            ..*self
        }
    }
}

fn shown(len: usize) -> usize {
    len.min(KEY_SHOWN)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    const SEC: Nanos = 1_000_000_000;

    #[test]
    fn exact_below_capacity() {
        let mut t = Top::new(4, 60 * SEC);
        let t0 = 1_700_000_000 * SEC;
        for _ in 0..5 {
            t.record(b"a", t0);
        }
        t.record(b"b", t0);
        t.record(b"b", t0);
        let rows = t.top(10, t0);
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].key, b"a");
        assert!((rows[0].denied - 5.0).abs() < 1e-9);
        assert!((rows[1].denied - 2.0).abs() < 1e-9);
        // A half-life later, half.
        let rows = t.top(1, t0 + 60 * SEC);
        assert!((rows[0].denied - 2.5).abs() < 1e-9);
        t.clear();
        assert!(t.top(10, t0).is_empty());
    }

    #[test]
    fn long_keys_apart() {
        let mut t = Top::new(4, SEC);
        let a = [b'x'; 300];
        let mut b = a;
        b[299] = b'y';
        t.record(&a, 1);
        t.record(&b, 1);
        t.record(&b, 1);
        let rows = t.top(10, 1);
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].len, 300);
        assert_eq!(rows[0].key.len(), KEY_SHOWN);
    }

    #[test]
    fn renormalises() {
        let mut t = Top::new(2, SEC);
        for s in 0..2000u64 {
            t.record(b"k", s * SEC);
        }
        let rows = t.top(1, 1999 * SEC);
        assert!(rows[0].denied.is_finite());
        assert!((rows[0].denied - 2.0).abs() < 1e-6, "{}", rows[0].denied);
    }

    #[test]
    fn zero_capacity() {
        let mut t = Top::new(0, SEC);
        t.record(b"a", 1);
        assert!(t.top(10, 1).is_empty());
    }

    proptest! {
        /// Space-saving's guarantees, with decay: no tracked count underestimates, and a
        /// key with more than total/capacity of the decayed denials is tracked.
        #[test]
        fn heavy_hitters(capacity in 1usize..16, events in prop::collection::vec((0u8..40, 0u64..5_000), 1..400)) {
            let half = 2_000 * 1_000_000u64;
            let mut t = Top::new(capacity, half);
            let mut now = 1_000 * SEC;
            let mut exact: HashMap<Vec<u8>, f64> = HashMap::new();
            let mut times = Vec::new();
            for (k, dt) in events {
                now += dt * 1_000_000;
                let key = vec![b'k', k];
                t.record(&key, now);
                times.push((key, now));
            }
            for (key, at) in &times {
                let decay = (-((now - at) as f64) / half as f64).exp2();
                *exact.entry(key.clone()).or_default() += decay;
            }
            let total: f64 = exact.values().sum();
            let rows = t.top(usize::MAX, now);
            prop_assert!(rows.len() <= capacity);
            // Sorted, and every weight computed per-millisecond may be off by one ms of decay.
            let slack = 1.0 + 2e-3;
            for r in &rows {
                let truth = exact.get(r.key).copied().unwrap_or(0.0);
                prop_assert!(r.denied * slack >= truth, "underestimate {} < {}", r.denied, truth);
                prop_assert!(r.denied - r.error <= truth * slack + 1e-9);
            }
            for (key, truth) in &exact {
                if *truth > total / capacity as f64 * slack {
                    prop_assert!(rows.iter().any(|r| r.key == &key[..]), "heavy hitter missing");
                }
            }
        }

        /// A run of denials on one key leaves its sift for later: whenever the heap is next
        /// used it is in order, and the counts are those of sifting at every denial.
        #[test]
        fn runs_sift_once(capacity in 1usize..8, events in prop::collection::vec((0u8..12, 1usize..6), 1..120)) {
            let mut lazy = Top::new(capacity, 60 * SEC);
            let mut eager = Top::new(capacity, 60 * SEC);
            let mut now = 1_000 * SEC;
            for (k, run) in events {
                let key = [b'k', k];
                for _ in 0..run {
                    now += 1_000_000;
                    lazy.record(&key, now);
                    eager.record(&key, now);
                    eager.settle();
                }
                let mut settled = lazy.clone_heap_state();
                settled.settle();
                for (p, &id) in settled.heap.iter().enumerate() {
                    prop_assert_eq!(settled.pos[id as usize] as usize, p);
                    if p > 0 {
                        prop_assert!(!settled.less(p, (p - 1) / 2), "heap out of order");
                    }
                }
            }
            prop_assert_eq!(lazy.top(usize::MAX, now), eager.top(usize::MAX, now));
        }
    }
}
