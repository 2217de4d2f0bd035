//! Who is being limited: per-namespace counters (`RL.STATS`, `INFO rl`), a key's namespace
//! being its prefix up to `rl.namespace-separator`, at most `rl.max-namespaces` of them
//! (the rest counted under `other`).
//!
//! The table lives on Redis's main thread: commands, `INFO`, config callbacks and the
//! command filter all run there, so it is plain memory behind [`MainThread`], fixed in
//! size, and the hot path allocates nothing.

use crate::ffi::MainThread;
use crate::ffi::Refusal;
use rl_core::namespace::{self, Counts, Id, Outcome, Table};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};

static NAMESPACES: MainThread<Table> = MainThread::new(Table::new());

/// `rl.max-namespaces`: namespaces with their own counters (0 to 1024; default 64).
static MAX_NAMESPACES: AtomicI64 = AtomicI64::new(64);
pub fn max_namespaces() -> i64 {
    MAX_NAMESPACES.load(Relaxed)
}

pub fn set_max_namespaces(v: i64) -> std::result::Result<(), Refusal> {
    MAX_NAMESPACES.store(v, Relaxed);
    Ok(())
}

/// `rl.namespace-separator`: 1 to 7 bytes (any but NUL), packed with their length in one
/// word so the hot path reads it without a lock.
pub struct Separator(AtomicU64);
pub static SEPARATOR: Separator = Separator(AtomicU64::new(1 | (b':' as u64) << 8));

impl Separator {
    /// The separator's bytes, copied out.
    pub fn get(&self) -> ([u8; 8], usize) {
        let v = self.0.load(Relaxed);
        (v.to_le_bytes(), (v & 0xff) as usize)
    }
}

/// The separator's exact bytes, for `CONFIG GET` and `CONFIG REWRITE`.
pub fn separator_bytes(out: &mut [u8; 64]) -> usize {
    let (b, len) = SEPARATOR.get();
    out[..len].copy_from_slice(&b[1..1 + len]);
    len
}

/// Sets the separator to exactly `s`. A NUL byte is refused: redis.conf and client
/// libraries would carry it unreliably, and no key naming scheme uses it.
pub fn set_separator(s: &[u8]) -> std::result::Result<(), Refusal> {
    if s.is_empty() || s.len() > 7 {
        return Err("rl.namespace-separator must be 1 to 7 bytes");
    }
    if s.contains(&0) {
        return Err("rl.namespace-separator must not contain a NUL byte");
    }
    let mut b = [0u8; 8];
    b[0] = s.len() as u8;
    b[1..1 + s.len()].copy_from_slice(s);
    SEPARATOR.0.store(u64::from_le_bytes(b), Relaxed);
    Ok(())
}

/// The namespace entry of `key` (created if there is room), without counting anything.
pub fn namespace_id(key: &[u8]) -> Id {
    let (sep, len) = SEPARATOR.get();
    let ns = match len {
        // The common separator, one byte, found without slicing the separator.
        1 => key
            .iter()
            .position(|&c| c == sep[1])
            .map_or(key, |i| &key[..i]),
        _ => namespace::namespace_of(key, &sep[1..1 + len.min(7)]),
    };
    if let Some(id) = RECENT_NAMESPACE.with(|r| r.get(ns)) {
        return id;
    }
    let limit = MAX_NAMESPACES.load(Relaxed).max(0) as usize;
    let id = NAMESPACES.with(|t| t.id(ns, limit));
    RECENT_NAMESPACE.with(|r| r.put(ns, id));
    id
}

/// The last namespace looked up and its entry: calls come in runs on one namespace, and an
/// entry, once made, keeps its id until the table is reset.
static RECENT_NAMESPACE: MainThread<RecentNamespace> = MainThread::new(RecentNamespace {
    name: [0; namespace::MAX_NAME],
    len: usize::MAX,
    id: 0,
});

struct RecentNamespace {
    name: [u8; namespace::MAX_NAME],
    /// `usize::MAX`: nothing remembered.
    len: usize,
    id: Id,
}

impl RecentNamespace {
    fn get(&self, ns: &[u8]) -> Option<Id> {
        (ns.len() == self.len && rl_core::bytes::equal(&self.name[..self.len], ns))
            .then_some(self.id)
    }

    /// Remembers a namespace with an entry of its own (not one counted under `other`,
    /// which may get an entry when the limit is raised).
    fn put(&mut self, ns: &[u8], id: Id) {
        if id == 0 || ns.len() > self.name.len() {
            return;
        }
        self.name[..ns.len()].copy_from_slice(ns);
        (self.len, self.id) = (ns.len(), id);
    }

    fn forget(&mut self) {
        self.len = usize::MAX;
    }
}

/// Counts a call in namespace `id` (once its arguments are read).
pub fn call(id: Id) {
    NAMESPACES.with(|t| {
        let c = t.counts_mut(id);
        c.calls = c.calls.saturating_add(1);
    });
}

/// The namespace of `key`, with the call counted.
pub fn enter(key: &[u8]) -> Id {
    let id = namespace_id(key);
    call(id);
    id
}

/// Every namespace's counters, [`namespace::OTHER`] first.
pub fn each_namespace(mut f: impl FnMut(&[u8], &Counts)) {
    NAMESPACES.with(|t| t.iter().for_each(|(n, c)| f(n, c)));
}

/// One namespace's counters, if it has an entry.
pub fn namespace_counts(ns: &[u8]) -> Option<Counts> {
    NAMESPACES.with(|t| t.get(ns).copied())
}

/// Counts a call in namespace `id`, and its outcome if it was decided (an error is a call
/// with none).
#[inline]
pub fn count(id: Id, outcome: Option<Outcome>) {
    NAMESPACES.with(|t| {
        let c = t.counts_mut(id);
        c.calls = c.calls.saturating_add(1);
        if let Some(o) = outcome {
            c.record(o);
        }
    });
}

/// Counts a decision in namespace `id`.
#[inline]
pub fn record(id: Id, outcome: Outcome) {
    NAMESPACES.with(|t| t.counts_mut(id).record(outcome));
}

/// Counts a decision a live pin made in namespace `id`.
pub fn pinned(id: Id) {
    NAMESPACES.with(|t| {
        let c = t.counts_mut(id);
        c.pinned = c.pinned.saturating_add(1);
    });
}

/// Counts an `rl` key of namespace `id` the server evicted.
pub fn evicted(id: Id) {
    NAMESPACES.with(|t| {
        let c = t.counts_mut(id);
        c.evicted = c.evicted.saturating_add(1);
    });
}

/// Forgets the namespaces (`CONFIG RESETSTAT`).
pub fn reset() {
    NAMESPACES.with(Table::reset);
    RECENT_NAMESPACE.with(RecentNamespace::forget);
}

/// A namespace as an INFO field name: `ns_<name>`, bytes other than letters, digits, `_`,
/// `-` and `.` shown as `_`, NUL-terminated.
pub fn info_name(ns: &[u8], out: &mut [u8; 64]) {
    out.fill(0);
    out[..3].copy_from_slice(b"ns_");
    for (o, &c) in out[3..63].iter_mut().zip(ns) {
        *o = if c.is_ascii_alphanumeric() || matches!(c, b'_' | b'-' | b'.') {
            c
        } else {
            b'_'
        };
    }
    if ns.is_empty() {
        out[3] = b'_';
    }
}
