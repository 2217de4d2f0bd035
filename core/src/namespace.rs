//! Per-namespace counters: which caller is being limited.
//!
//! A key's namespace is its first segment: the bytes before the first separator (`orders`
//! in `orders:user:42`), or the whole key when it has no separator. The table is fixed-size
//! (no allocation, ever): at most `limit` namespaces get their own entry, in the order they
//! are first seen; every other one, and names longer than [`MAX_NAME`], count under
//! [`OTHER`] (entry 0), as does a namespace literally named `other`.

/// The namespace of `key`: the bytes before the first occurrence of `sep`, or the whole
/// key when `sep` does not occur (or is empty).
pub fn namespace_of<'a>(key: &'a [u8], sep: &[u8]) -> &'a [u8] {
    match sep {
        [] => key,
        [b] => match key.iter().position(|c| c == b) {
            Some(i) => &key[..i],
            None => key,
        },
        _ => match key.windows(sep.len()).position(|w| w == sep) {
            Some(i) => &key[..i],
            None => key,
        },
    }
}

/// Most namespaces a table can hold (besides [`OTHER`]).
pub const MAX_NAMESPACES: usize = 1024;
/// Longest namespace name with its own entry, in bytes.
pub const MAX_NAME: usize = 48;
/// The name of entry 0, where namespaces beyond the limit count.
pub const OTHER: &[u8] = b"other";
/// Hash slots: a power of two, at least twice the entries (probes stay short).
const SLOTS: usize = 2048;

/// The counters of one namespace.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Calls that reached their key (argument errors excluded).
    pub calls: u64,
    pub granted: u64,
    pub denied: u64,
    /// Denied by the bucket but answered as granted (shadow mode or the `SHADOW` option).
    pub shadow_denied: u64,
    pub tokens_granted: u64,
    /// Keys the server evicted under `maxmemory` (each came back full on its next use).
    pub evicted: u64,
    /// Decisions a live pin made (`RL.PIN`) instead of the caller's limit.
    pub pinned: u64,
}

/// One call's outcome, as counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Granted(u64),
    Denied,
    ShadowDenied,
}

impl Counts {
    /// Counts one decision. Counters saturate rather than overflow: this runs after a command
    /// has written, where nothing may fail (1e15 tokens a call fill a `u64` in 18,447
    /// calls).
    pub fn record(&mut self, outcome: Outcome) {
        match outcome {
            Outcome::Granted(tokens) => {
                self.granted = self.granted.saturating_add(1);
                self.tokens_granted = self.tokens_granted.saturating_add(tokens);
            }
            Outcome::Denied => self.denied = self.denied.saturating_add(1),
            Outcome::ShadowDenied => self.shadow_denied = self.shadow_denied.saturating_add(1),
        }
    }
}

#[derive(Clone, Copy)]
struct Entry {
    name: [u8; MAX_NAME],
    len: u8,
    counts: Counts,
}

const EMPTY: Entry = Entry {
    name: [0; MAX_NAME],
    len: 0,
    counts: Counts {
        calls: 0,
        granted: 0,
        denied: 0,
        shadow_denied: 0,
        tokens_granted: 0,
        evicted: 0,
        pinned: 0,
    },
};

/// An entry's index in a [`Table`] (0 is [`OTHER`]).
pub type Id = usize;

/// The fixed table of namespaces and their counters.
pub struct Table {
    entries: [Entry; MAX_NAMESPACES + 1],
    /// Entries in use, [`OTHER`] included.
    used: usize,
    /// Open addressing, linear probing: `entry index + 1`, or 0 for a free slot.
    slots: [u16; SLOTS],
}

impl Default for Table {
    fn default() -> Self {
        Table::new()
    }
}

fn hash(b: &[u8]) -> usize {
    // FNV-1a: a handful of instructions per byte, and namespaces are short.
    let mut h: u32 = 0x811c_9dc5;
    for &c in b {
        h = (h ^ u32::from(c)).wrapping_mul(0x0100_0193);
    }
    h as usize
}

impl Table {
    pub const fn new() -> Table {
        let mut entries = [EMPTY; MAX_NAMESPACES + 1];
        let mut i = 0;
        while i < OTHER.len() {
            entries[0].name[i] = OTHER[i];
            i += 1;
        }
        entries[0].len = OTHER.len() as u8;
        Table {
            entries,
            used: 1,
            slots: [0; SLOTS],
        }
    }

    /// The entry of namespace `ns`, created if fewer than `limit` namespaces (besides
    /// [`OTHER`]) have one; else [`OTHER`]'s.
    pub fn id(&mut self, ns: &[u8], limit: usize) -> Id {
        if ns.len() > MAX_NAME || ns == OTHER {
            return 0;
        }
        let mut s = hash(ns) & (SLOTS - 1);
        loop {
            match self.slots[s] {
                0 => {
                    if self.used > limit.min(MAX_NAMESPACES) {
                        return 0;
                    }
                    let id = self.used;
                    let e = &mut self.entries[id];
                    e.name[..ns.len()].copy_from_slice(ns);
                    e.len = ns.len() as u8;
                    self.used += 1;
                    self.slots[s] = id as u16 + 1;
                    return id;
                }
                v => {
                    let e = &self.entries[usize::from(v) - 1];
                    if &e.name[..usize::from(e.len)] == ns {
                        return usize::from(v) - 1;
                    }
                }
            }
            s = (s + 1) & (SLOTS - 1);
        }
    }

    pub fn counts_mut(&mut self, id: Id) -> &mut Counts {
        &mut self.entries[id.min(MAX_NAMESPACES)].counts
    }

    /// The counters of namespace `ns`, if it has an entry (without creating one).
    pub fn get(&self, ns: &[u8]) -> Option<&Counts> {
        self.iter().find(|(n, _)| *n == ns).map(|(_, c)| c)
    }

    /// Every namespace with an entry and its counters, [`OTHER`] first.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], &Counts)> {
        self.entries[..self.used]
            .iter()
            .map(|e| (&e.name[..usize::from(e.len)], &e.counts))
    }

    /// Forgets every namespace and zeroes the counters (`CONFIG RESETSTAT`).
    pub fn reset(&mut self) {
        for e in &mut self.entries[..self.used] {
            e.counts = Counts::default();
        }
        for e in &mut self.entries[1..self.used] {
            e.len = 0;
        }
        self.used = 1;
        self.slots = [0; SLOTS];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split() {
        assert_eq!(namespace_of(b"orders:user:42", b":"), b"orders");
        assert_eq!(namespace_of(b"orders", b":"), b"orders");
        assert_eq!(namespace_of(b":x", b":"), b"");
        assert_eq!(namespace_of(b"a::b", b"::"), b"a");
        assert_eq!(namespace_of(b"a:b", b"::"), b"a:b");
        assert_eq!(namespace_of(b"{t}.x.y", b"."), b"{t}");
        assert_eq!(namespace_of(b"k", b""), b"k");
    }

    #[test]
    fn bounded() {
        let mut t = Box::new(Table::new());
        let a = t.id(b"orders", 2);
        assert_eq!(t.id(b"orders", 2), a);
        let b = t.id(b"users", 2);
        assert_ne!(a, b);
        assert_eq!(t.id(b"third", 2), 0, "over the limit: other");
        assert_eq!(t.id(b"other", 2), 0);
        assert_eq!(t.id(&[b'x'; MAX_NAME + 1], 64), 0);
        t.counts_mut(a).calls = t.counts_mut(a).calls.saturating_add(1);
        t.counts_mut(a).record(Outcome::Granted(3));
        assert_eq!(t.get(b"orders").unwrap().tokens_granted, 3);
        assert_eq!(t.iter().count(), 3);
        t.reset();
        assert_eq!(t.iter().count(), 1);
        assert!(t.get(b"orders").is_none());
        assert_eq!(t.get(b"other"), Some(&Counts::default()));
    }

    #[test]
    fn full_table() {
        let mut t = Box::new(Table::new());
        for i in 0..MAX_NAMESPACES + 10 {
            let name = format!("ns{i}");
            let id = t.id(name.as_bytes(), usize::MAX);
            assert_eq!(id == 0, i >= MAX_NAMESPACES, "{name}");
            assert_eq!(t.id(name.as_bytes(), usize::MAX), id);
        }
        assert_eq!(t.iter().count(), MAX_NAMESPACES + 1);
    }
}
