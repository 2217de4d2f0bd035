//! Versioned limits (`VERSION v`): a bucket keeps the newest limit it has seen, so callers
//! on two releases passing two limits cannot flap it.
//!
//! A bucket stores the version of the limit it holds (0 when none was ever given). A call
//! with limit `L` at version `v` on a bucket holding limit `S` at version `sv`:
//! - no bucket: it is created with `L` at `v`;
//! - `v > sv`: `L` replaces `S` (the tokens carry over by the never-mint rule of
//!   [`Level::new`]) and the bucket goes to `v`. This must be stored even if the call is
//!   denied, so that every later decision follows `L`;
//! - `v < sv`: the call is decided under `S`, as if it had passed `S` (a stale caller);
//! - `v == sv`: `L` applies, as without versions; a different `L` is a conflict.
//!
//! So versions never decrease, and an older version never changes the stored limit.

use crate::{Bucket, Level, Limit, Nanos};

/// Largest version: `2^53 - 1`, so a Lua number (a double) holds every version exactly.
pub const MAX_VERSION: u64 = (1 << 53) - 1;

/// Which limit decided a call, relative to the one its bucket held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    /// No bucket: a new one with the call's limit and version.
    Created,
    /// Same version and same limit as stored.
    Same,
    /// Same version, another limit: the call's limit applies (as without versions).
    Conflict,
    /// A newer version: the call's limit replaced the stored one.
    Replaced,
    /// An older version: the stored, newer limit applied; the call's own was ignored.
    Stale,
    /// A live pin decided (see [`crate::pin`]); the call's limit was ignored.
    Pinned,
}

impl Applied {
    /// Whether the call's bucket must be written even if the call is denied: a
    /// replacement is, so every later call sees the new limit.
    pub fn must_write(self) -> bool {
        self == Applied::Replaced
    }
}

/// The limit and version a call with `limit` at `version` is decided under, on a bucket
/// holding `stored` (its limit and version; `None`: no bucket).
#[inline]
pub fn resolve(stored: Option<(Limit, u64)>, limit: Limit, version: u64) -> (Limit, u64, Applied) {
    let Some((held, sv)) = stored else {
        return (limit, version, Applied::Created);
    };
    match version.cmp(&sv) {
        std::cmp::Ordering::Greater => (limit, version, Applied::Replaced),
        std::cmp::Ordering::Less => (held, sv, Applied::Stale),
        std::cmp::Ordering::Equal if held == limit => (limit, sv, Applied::Same),
        std::cmp::Ordering::Equal => (limit, sv, Applied::Conflict),
    }
}

/// `bucket` refilled to `now` for a call with `limit` at `version`: under the limit
/// [`resolve`] picks (tokens carried over if it differs from the stored one), at the
/// resulting version.
#[inline]
pub fn open(bucket: Option<&Bucket>, limit: Limit, version: u64, now: Nanos) -> (Level, Applied) {
    let (limit, version, applied) =
        resolve(bucket.map(|b| (b.limit(), b.version())), limit, version);
    (
        Level::new(bucket, limit, now).with_version(version),
        applied,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Nanos = 1_000_000_000;
    const T0: Nanos = 1_700_000_000 * S;

    fn limit(rate: f64, cap: f64) -> Limit {
        Limit::new(rate, cap).unwrap()
    }

    #[test]
    fn newest_limit_wins() {
        let a = limit(10.0, 100.0);
        let b = limit(1.0, 5.0);
        assert_eq!(resolve(None, a, 3), (a, 3, Applied::Created));
        assert_eq!(resolve(Some((a, 1)), b, 2), (b, 2, Applied::Replaced));
        assert_eq!(resolve(Some((a, 1)), a, 2), (a, 2, Applied::Replaced));
        assert_eq!(resolve(Some((b, 2)), a, 1), (b, 2, Applied::Stale));
        assert_eq!(resolve(Some((b, 2)), a, 0), (b, 2, Applied::Stale));
        assert_eq!(resolve(Some((b, 2)), b, 2), (b, 2, Applied::Same));
        assert_eq!(resolve(Some((b, 2)), a, 2), (a, 2, Applied::Conflict));
        // Without versions: exactly as before (the call's limit).
        assert_eq!(resolve(Some((b, 0)), a, 0), (a, 0, Applied::Conflict));
        assert_eq!(resolve(Some((a, 0)), a, 0), (a, 0, Applied::Same));
        assert!(Applied::Replaced.must_write());
        assert!(!Applied::Stale.must_write());
    }

    #[test]
    fn open_keeps_the_newer_limit() {
        let big = limit(10.0, 100.0);
        let small = limit(1.0, 5.0);
        let mut l = Level::new(None, big, T0).with_version(1);
        assert!(l.try_take(98.0));
        let stored = l.bucket();
        assert_eq!(stored.version(), 1);
        // Version 2 replaces: 2 tokens carried over, clamped to the new cap.
        let (l2, applied) = open(Some(&stored), small, 2, T0);
        assert_eq!(applied, Applied::Replaced);
        assert_eq!(l2.limit(), &small);
        assert!(l2.tokens() <= 2.0);
        let stored = l2.bucket();
        assert_eq!(stored.version(), 2);
        // An old caller later is decided under version 2's limit.
        let (l1, applied) = open(Some(&stored), big, 1, T0 + S);
        assert_eq!(applied, Applied::Stale);
        assert_eq!(l1.limit(), &small);
        assert_eq!(l1.bucket().version(), 2);
        assert_eq!(l1.bucket().limit(), small);
    }
}
