//! The semaphore's failure policy (`RL.ACQUIRE` permits while Redis is unavailable): the
//! local permits a process may hand out per key, for every shell's permits (the Rust
//! client's `Semaphore`, Python's `permit()` / `apermit()`).
//!
//! `Allow` and `LastKnown` grant local permits up to `max(1, limit / instances)` per key in
//! this process (a fleet of at most `instances` then holds at most `limit`, or one each
//! when `limit < instances`); `Deny` denies, retry after `deny_retry_after_ms`. A local
//! permit needs no release call and is never renewed: the shell gives it back here when
//! its holder lets go. Plain data (the shells lock around it: no lock here that a fork
//! could leave held).

use std::collections::HashMap;

/// The server's bounds: at most 10 000 permits per key.
pub const MAX_LIMIT: u64 = 10_000;
/// TTLs from 1 ms to a day.
pub const MAX_TTL_MS: u64 = 86_400_000;

/// Who decides while Redis is unavailable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    Allow,
    /// As `Allow`: a permit has no rate a last answer could carry over.
    LastKnown,
    Deny,
}

/// A permit request that can never be served: the caller's mistake.
pub fn check(limit: u64, ttl_ms: u64) -> Result<(), &'static str> {
    if limit == 0 || limit > MAX_LIMIT {
        return Err("limit must be between 1 and 10000");
    }
    if ttl_ms == 0 || ttl_ms > MAX_TTL_MS {
        return Err("ttl must be between 1 ms and a day");
    }
    Ok(())
}

/// What the failure policy decided for one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Local {
    /// A local permit: `in_use` of this key held locally now, this one included.
    Granted { in_use: u64 },
    /// Denied: `in_use` held locally, retry after `retry_after_ms`.
    Busy { in_use: u64, retry_after_ms: u64 },
}

/// The local permits of one process, per key.
#[derive(Debug, Clone)]
pub struct LocalPermits {
    policy: Policy,
    instances: u32,
    deny_retry_after_ms: u64,
    held: HashMap<String, u64>,
}

impl LocalPermits {
    /// `instances`: how many processes share each key's limit (at least 1).
    pub fn new(policy: Policy, instances: u32, deny_retry_after_ms: u64) -> LocalPermits {
        LocalPermits {
            policy,
            instances: instances.max(1),
            deny_retry_after_ms,
            held: HashMap::new(),
        }
    }

    /// The local permits of a key of `limit` this process may hold at once.
    pub fn local_limit(&self, limit: u64) -> u64 {
        match self.policy {
            Policy::Deny => 0,
            Policy::Allow | Policy::LastKnown => (limit / u64::from(self.instances)).max(1),
        }
    }

    /// Redis is unavailable: a local permit of `key`, or busy.
    pub fn acquire(&mut self, key: &str, limit: u64) -> Local {
        let allowed = self.local_limit(limit);
        let held = self.held(key);
        if held >= allowed {
            return Local::Busy {
                in_use: held,
                retry_after_ms: self.deny_retry_after_ms,
            };
        }
        self.held.insert(key.to_owned(), held + 1);
        Local::Granted { in_use: held + 1 }
    }

    /// A local permit of `key` let go (one more than were granted changes nothing).
    pub fn release(&mut self, key: &str) {
        if let Some(n) = self.held.get_mut(key) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.held.remove(key);
            }
        }
    }

    /// Local permits of `key` held now.
    pub fn held(&self, key: &str) -> u64 {
        self.held.get(key).copied().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Whatever the order of acquires and releases, a process never holds more than
        /// its share, and a fleet of `instances` never more than `max(limit, instances)`.
        #[test]
        fn never_more_than_the_share(
            limit in 1u64..=MAX_LIMIT,
            instances in 1u32..64,
            ops in proptest::collection::vec(any::<bool>(), 0..200),
        ) {
            let mut p = LocalPermits::new(Policy::Allow, instances, 1000);
            let share = (limit / u64::from(instances)).max(1);
            for acquire in ops {
                if acquire {
                    let _ = p.acquire("k", limit);
                } else {
                    p.release("k");
                }
                prop_assert!(p.held("k") <= share);
            }
            prop_assert!(share * u64::from(instances) <= limit.max(u64::from(instances)));
        }
    }

    #[test]
    fn deny_never_grants() {
        let mut p = LocalPermits::new(Policy::Deny, 1, 250);
        assert_eq!(
            p.acquire("k", 10),
            Local::Busy {
                in_use: 0,
                retry_after_ms: 250
            }
        );
        p.release("k");
        assert_eq!(p.held("k"), 0);
    }
}
