//! Counters shown by `INFO rl` (fields `rl_<name>`).
//!
//! Commands run on Redis's main thread only, so a counter is a plain load and store: no
//! locked instruction on the hot path.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

pub struct Counter(AtomicU64);

impl Counter {
    const fn new() -> Counter {
        Counter(AtomicU64::new(0))
    }

    pub fn add(&self, n: u64) {
        self.0
            .store(self.0.load(Relaxed).saturating_add(n), Relaxed);
    }

    /// For counters that values' lifecycle callbacks also move: `free` may run on a
    /// background thread (`FLUSHALL ASYNC`), so these use atomic read-modify-writes.
    pub fn add_shared(&self, n: u64) {
        self.0.fetch_add(n, Relaxed);
    }

    pub fn sub_shared(&self, n: u64) {
        // Never below zero, even if some count was missed.
        let _ = self
            .0
            .fetch_update(Relaxed, Relaxed, |v| Some(v.saturating_sub(n)));
    }

    pub fn get(&self) -> u64 {
        self.0.load(Relaxed)
    }
}

macro_rules! counters {
    ($($name:ident: $doc:literal),* $(,)?) => {
        $(#[doc = $doc] pub static $name: Counter = Counter::new();)*
        const FIELDS: &[(&std::ffi::CStr, &Counter)] = &[$((
            // Field names are the counters' names, lowercased.
            match std::ffi::CStr::from_bytes_with_nul(concat!(stringify!($name), "\0").as_bytes()) {
                Ok(s) => s,
                Err(_) => panic!(),
            },
            &$name,
        )),*];
    };
}

counters! {
    CALLS: "Calls of every RL command clients make.",
    ERRORS: "Calls answered with an error.",
    GRANTED: "RL.TAKE calls granted.",
    DENIED: "RL.TAKE calls denied.",
    SHADOW_DENIED: "Calls that would have been denied but were granted: rl.mode is shadow.",
    MTAKE_GRANTED: "RL.MTAKE calls granted (every bucket debited).",
    MTAKE_DENIED: "RL.MTAKE calls denied (no bucket debited).",
    TOKENS_GRANTED: "Tokens granted by RL.TAKE.",
    LEASES_GRANTED: "RL.LEASE calls that granted a lease.",
    LEASES_DENIED: "RL.LEASE calls that granted nothing.",
    LEASE_TOKENS_GRANTED: "Tokens granted in leases.",
    RETURNS: "Leases closed by a return (RL.RETURN or RL.LEASE ... RETURN).",
    TOKENS_RETURNED: "Tokens credited back by returns.",
    LEASES_EXPIRED: "Leases gone without a return: expired (counted when dropped) or with their key (expiry, DEL).",
    LEASES_ACTIVE: "Leases recorded in buckets now (expired ones leave at the key's next write).",
    RESERVED: "RL.RESERVE calls granted (at once or after a wait).",
    RESERVE_DENIED: "RL.RESERVE calls denied (the wait would exceed max_wait_ms).",
    TOKENS_RESERVED: "Tokens granted by RL.RESERVE.",
    REFUNDS: "RL.REFUND calls that credited tokens back.",
    BUDGETS_GRANTED: "RL.BUDGET calls granted (every key reserved).",
    BUDGETS_DENIED: "RL.BUDGET calls denied (nothing reserved).",
    BUDGET_TOKENS_RESERVED: "Tokens RL.BUDGET reserved, summed over its keys (exempt keys reserve nothing).",
    SETTLES: "Reservations RL.SETTLE closed, one per key.",
    TOKENS_SETTLED_BACK: "Tokens RL.SETTLE credited back (reserved, not used).",
    TOKENS_OVERAGE: "Tokens RL.SETTLE charged as debt (used beyond what was reserved, down to -cap).",
    SETTLES_UNMATCHED: "Keys RL.SETTLE found no live reservation on (expired, unknown or settled already): what was reserved stays charged.",
    PERMITS_ACQUIRED: "RL.ACQUIRE calls that granted a permit.",
    PERMITS_DENIED: "RL.ACQUIRE calls denied (the limit was reached).",
    PERMITS_RELEASED: "Permits released by RL.RELEASE.",
    PERMITS_EXPIRED: "Permits gone without a release: expired (counted when dropped) or with their key.",
    PERMITS_IN_USE: "Permits recorded in keys now (expired ones leave at the key's next write).",
    LIMIT_CHANGES: "Writes that stored a bucket under a rate or cap other than its own: a limit rollout, or callers disagreeing on a key's limit (flapping).",
    LIMIT_REPLACED: "Buckets whose stored limit a call with a newer VERSION replaced (stored even if the call was denied; RL.MTAKE counts each bucket).",
    LIMIT_STALE: "Buckets a call with an older VERSION was decided on under the stored, newer limit (stale callers: when this stops growing, a rollout is complete).",
    LIMIT_CONFLICTS: "Buckets a call with the stored VERSION (0 included: no VERSION on a never-versioned bucket) but another rate or cap was decided on (the call's limit applied).",
    ADOPTED: "Seed Lua script hashes converted into buckets (rl.adopt-script-keys).",
    SHARES_GRANTED: "RL.SHARE calls answered with a share above 0.",
    SHARES_SHORT: "RL.SHARE calls that got less than their fair share (the rest was still in use by others: they come back sooner).",
    SHARES_RELEASED: "Shares given up with RL.SHARE ... RELEASE.",
    SHARE_HOLDERS_DROPPED: "Share holder entries dropped once their lease and hold ended (counted when dropped), or with their key.",
    SHARE_HOLDERS: "Share holder entries recorded in keys now (ended ones leave at the key's next write).",
    PINNED_DECISIONS: "Decisions a live pin made (RL.PIN: the pinned limit, BLOCK or EXEMPT) instead of the caller's limit.",
    PINS_SET: "RL.PIN calls (a pin set or replaced).",
    PINS_REMOVED: "RL.UNPIN calls that removed a pin.",
    PINNED_KEYS: "Bucket, share and semaphore keys holding a pin now (one that ended leaves at the key's next write).",
    KEYS_EVICTED: "rl keys (bucket, share, permit) the server evicted under maxmemory: each came back full (a bucket) or without its holders on its next use.",
}

/// The gauges: what keys hold now, which `CONFIG RESETSTAT` leaves as they are.
const GAUGES: [&Counter; 4] = [
    &LEASES_ACTIVE,
    &PERMITS_IN_USE,
    &SHARE_HOLDERS,
    &PINNED_KEYS,
];

/// Zeroes every counter but the gauges (`CONFIG RESETSTAT`).
pub fn reset() {
    for (_, counter) in FIELDS {
        if !GAUGES.iter().any(|g| std::ptr::eq(*counter, *g)) {
            counter.0.store(0, Relaxed);
        }
    }
}

/// Every counter with its `INFO rl` field name, lowercase (`rl_calls`), in table order:
/// what [`crate::ffi::info`] writes.
pub fn fields() -> impl Iterator<Item = ([u8; 64], u64)> {
    FIELDS.iter().map(|(name, counter)| {
        let mut field = [0u8; 64];
        let upper = name.to_bytes();
        field[..upper.len()].copy_from_slice(upper);
        field.make_ascii_lowercase();
        (field, counter.get())
    })
}
