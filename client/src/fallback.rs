//! Local decisions while Redis is unavailable, by the limiter's [`FailurePolicy`].

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use rl_core::{Bucket, Level, Limit, Nanos};

use crate::meter::Meter;
use crate::{Decision, FailurePolicy, LimiterConfig, Source};

/// Entries not touched for this long are the first to go when the map is full.
const STALE: Nanos = 60 * 1_000_000_000;

#[derive(Debug, Default)]
struct KeyState {
    /// Grants seen from Redis (kept only under `LastKnown`).
    meter: Meter,
    /// The bucket level Redis last reported (kept only under `LastKnown`).
    last_tokens: Option<f64>,
    /// The local bucket of the current outage and the limit it was started under.
    local: Option<(Limit, Bucket)>,
    touched: Nanos,
}

/// Per-key local state of one limiter's failure policy.
#[derive(Debug)]
pub(crate) struct Fallback {
    policy: FailurePolicy,
    limit: Limit,
    /// This instance's share of `limit`: `rate / instances`, `cap / instances`.
    share: Limit,
    instances: f64,
    deny_retry_after: Duration,
    max_keys: usize,
    keys: Mutex<HashMap<String, KeyState>>,
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic elsewhere while holding the lock leaves plain data behind; keep serving.
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Fallback {
    pub(crate) fn new(limit: Limit, config: &LimiterConfig) -> Fallback {
        let instances = f64::from(config.instances.max(1));
        Fallback {
            policy: config.policy,
            limit,
            share: share_of(limit, instances),
            instances,
            deny_retry_after: config.deny_retry_after,
            max_keys: config.max_keys,
            keys: Mutex::new(HashMap::new()),
        }
    }

    /// Records what Redis granted for `key` (and the level it reported, if any).
    /// `LastKnown` measures the rate; `Allow` debits its local bucket, so the budget it
    /// falls back to is what this instance has not spent of its share (it carries across
    /// outages instead of starting full at each one). `Deny` keeps nothing.
    pub(crate) fn observe(&self, key: &str, granted: u64, level: Option<f64>, now: Nanos) {
        match self.policy {
            FailurePolicy::Deny => {}
            FailurePolicy::LastKnown => {
                let mut keys = lock(&self.keys);
                let entry = self.entry(&mut keys, key, now);
                entry.meter.add(granted, now);
                if level.is_some() {
                    entry.last_tokens = level;
                    // Fresh news from Redis: the next outage starts from it.
                    entry.local = None;
                } else if granted > 0 {
                    // A lease reports no level: the local budget carries across outages,
                    // debited by what Redis granted (as under `Allow`), never refilled.
                    let mut local = self.local_level(entry, now);
                    let debit = (granted as f64).min(local.tokens());
                    if debit > 0.0 {
                        local.try_take(debit);
                    }
                    entry.local = Some((*local.limit(), local.bucket()));
                }
            }
            FailurePolicy::Allow => {
                if granted == 0 {
                    return;
                }
                let mut keys = lock(&self.keys);
                let entry = self.entry(&mut keys, key, now);
                let mut level = self.local_level(entry, now);
                let debit = (granted as f64).min(level.tokens());
                if debit > 0.0 {
                    level.try_take(debit);
                }
                entry.local = Some((*level.limit(), level.bucket()));
            }
        }
    }

    /// The policy's decision for `n` tokens of `key` at `now`.
    pub(crate) fn decide(&self, key: &str, n: u64, now: Nanos) -> Decision {
        self.decide_with(key, n, self.limit, now)
    }

    /// The policy's decision for `n` tokens of `key` under `limit` (a per-call limit).
    pub(crate) fn decide_with(&self, key: &str, n: u64, limit: Limit, now: Nanos) -> Decision {
        if self.policy == FailurePolicy::Deny {
            return self.denied(0.0, self.deny_retry_after, Duration::ZERO);
        }
        let mut keys = lock(&self.keys);
        let entry = self.entry(&mut keys, key, now);
        let mut level = self.local_level(entry, now);
        if limit != self.limit {
            let share = share_of(limit, self.instances);
            if *level.limit() != share {
                level = match entry.local {
                    Some((_, bucket)) => Level::new(Some(&bucket), share, now),
                    None => Level::new(None, share, now),
                };
            }
        }
        let allowed = level.try_take(n as f64);
        entry.local = Some((*level.limit(), level.bucket()));
        let remaining = level.tokens();
        let reset_after = Duration::from_nanos(level.reset_after());
        if allowed {
            return Decision::granted(
                n,
                remaining,
                reset_after,
                self.limit.cap(),
                Source::Fallback,
            );
        }
        let retry_after = level
            .wait_for(n as f64)
            .map_or(self.deny_retry_after, Duration::from_nanos);
        self.denied(remaining, retry_after, reset_after)
    }

    /// The policy's answer to a reservation of `n` tokens of `key` waiting at most
    /// `max_wait`: the decision and the wait before use (granted), or the wait that would
    /// have been needed (denied). The local bucket goes into debt as the server's does.
    pub(crate) fn reserve(
        &self,
        key: &str,
        n: u64,
        max_wait: Duration,
        now: Nanos,
    ) -> (Decision, Duration) {
        if self.policy == FailurePolicy::Deny {
            let wait = self.deny_retry_after;
            return (self.denied(0.0, wait, Duration::ZERO), wait);
        }
        let mut keys = lock(&self.keys);
        let entry = self.entry(&mut keys, key, now);
        let mut level = self.local_level(entry, now);
        let max_wait = max_wait.as_nanos().min(u64::MAX as u128) as Nanos;
        let (granted, wait) = level
            .reserve(n as f64, max_wait)
            .unwrap_or((false, self.deny_retry_after.as_nanos() as Nanos));
        entry.local = Some((*level.limit(), level.bucket()));
        let wait = Duration::from_nanos(wait);
        let remaining = level.signed_tokens();
        let reset_after = Duration::from_nanos(level.reset_after());
        if !granted {
            return (self.denied(remaining, wait, reset_after), wait);
        }
        let decision = Decision::granted(
            n,
            remaining,
            reset_after,
            self.limit.cap(),
            Source::Fallback,
        );
        (decision, wait)
    }

    /// The local bucket of `entry` at `now`: the outage's, or a new one by policy.
    fn local_level(&self, entry: &KeyState, now: Nanos) -> Level {
        match entry.local {
            Some((limit, bucket)) => Level::new(Some(&bucket), limit, now),
            None => self.start_level(entry, now),
        }
    }

    fn denied(&self, remaining: f64, retry_after: Duration, reset_after: Duration) -> Decision {
        let cap = self.limit.cap();
        Decision::denied(remaining, retry_after, reset_after, cap, Source::Fallback)
    }

    /// The local bucket an outage starts with, by policy.
    fn start_level(&self, entry: &KeyState, now: Nanos) -> Level {
        match self.policy {
            FailurePolicy::Allow => Level::new(None, self.share, now),
            FailurePolicy::LastKnown => match entry.meter.rate(now) {
                // No history: this instance's share of the limit.
                None => Level::new(None, self.share, now),
                Some(seen) => {
                    let rate = self.limit.rate();
                    let local = share_of(self.limit, rate / seen.clamp(rate * 1e-3, rate));
                    match entry.last_tokens {
                        // The level is the fleet's: this instance spends its share of it.
                        Some(tokens) => Level::starting_with(local, tokens / self.instances, now),
                        // No level seen (leases): this instance's share of the cap, not
                        // a full bucket of a share that can be the whole limit.
                        None => Level::starting_with(local, local.cap().min(self.share.cap()), now),
                    }
                }
            },
            FailurePolicy::Deny => Level::starting_with(self.limit, 0.0, now),
        }
    }

    fn entry<'a>(
        &self,
        keys: &'a mut HashMap<String, KeyState>,
        key: &str,
        now: Nanos,
    ) -> &'a mut KeyState {
        if !keys.contains_key(key) && keys.len() >= self.max_keys {
            keys.retain(|_, s| now.saturating_sub(s.touched) < STALE);
            if keys.len() >= self.max_keys {
                keys.clear();
            }
        }
        let entry = keys.entry(key.to_owned()).or_default();
        entry.touched = now;
        entry
    }
}

/// `limit` divided by `parts`: `rate / parts`, `cap / parts` (at least one token, or the
/// whole cap if it is below one).
fn share_of(limit: Limit, parts: f64) -> Limit {
    let (rate, cap) = (limit.rate(), limit.cap());
    let parts = parts.max(1.0);
    let local_cap = (cap / parts).max(cap.min(1.0));
    let local_rate = (rate / parts).max(rl_core::MIN_VALUE);
    // A share too slow to fill within the bounds of a limit keeps the rate, not the cap.
    Limit::new(local_rate, local_cap)
        .or_else(|_| Limit::new(local_rate, cap / parts))
        .or_else(|_| Limit::new(rate, local_cap))
        .unwrap_or(limit)
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Nanos = 1_000_000_000;
    const T0: Nanos = 1_700_000_000 * S;

    fn fallback(policy: FailurePolicy) -> Fallback {
        fleet(policy, 1)
    }

    fn fleet(policy: FailurePolicy, instances: u32) -> Fallback {
        let config = LimiterConfig {
            policy,
            instances,
            ..Default::default()
        };
        Fallback::new(Limit::new(10.0, 20.0).unwrap(), &config)
    }

    fn allowed_in_burst(f: &Fallback, key: &str) -> u64 {
        (0..100).filter(|_| f.decide(key, 1, T0).allowed).count() as u64
    }

    #[test]
    fn deny_denies_with_the_hint() {
        let f = fallback(FailurePolicy::Deny);
        let d = f.decide("k", 1, T0);
        assert!(!d.allowed);
        assert_eq!(d.retry_after, Duration::from_secs(1));
        assert_eq!(d.source, Source::Fallback);
    }

    #[test]
    fn allow_uses_a_share_of_the_limit() {
        let f = fleet(FailurePolicy::Allow, 2);
        assert_eq!(allowed_in_burst(&f, "a"), 10);
        let d = f.decide("a", 1, T0);
        assert!(!d.allowed);
        assert_eq!(d.retry_after, Duration::from_millis(200)); // 5 tokens/s locally
                                                               // Keys are independent, and time refills.
        assert_eq!(allowed_in_burst(&f, "b"), 10);
        assert!(f.decide("a", 1, T0 + S).allowed);
    }

    #[test]
    fn last_known_keeps_the_observed_rate_and_level() {
        let f = fallback(FailurePolicy::LastKnown);
        // Redis granted this instance 2 tokens a second for 3 s and last reported 3 left.
        for i in 0..=6 {
            f.observe("k", 1, Some(3.0), T0 + i * S / 2);
        }
        let start = T0 + 3 * S;
        assert_eq!(
            (0..10).filter(|_| f.decide("k", 1, start).allowed).count(),
            3
        );
        let d = f.decide("k", 1, start);
        assert_eq!(d.retry_after, Duration::from_millis(500));
        // A key never seen gets the configured limit.
        assert_eq!(allowed_in_burst(&f, "new"), 20);
    }

    #[test]
    fn reserve_queues_in_the_local_bucket() {
        let f = fallback(FailurePolicy::Allow);
        // Cap 20 at 10/s: 20 now, then each token 100 ms later than the one before.
        let max = Duration::from_secs(1);
        for _ in 0..20 {
            let (d, wait) = f.reserve("k", 1, max, T0);
            assert!(d.allowed && wait.is_zero());
        }
        let (d, wait) = f.reserve("k", 2, max, T0);
        assert!(d.allowed);
        assert_eq!(wait, Duration::from_millis(200));
        assert!((d.remaining + 2.0).abs() < 1e-9, "in debt: {d:?}");
        // 8 more fit within a second of waiting; the next would wait 1.1 s.
        for _ in 0..8 {
            assert!(f.reserve("k", 1, max, T0).0.allowed);
        }
        let (d, wait) = f.reserve("k", 1, max, T0);
        assert!(!d.allowed);
        assert_eq!(wait, Duration::from_millis(1100));
        assert!(
            !f.decide("k", 1, T0 + S).allowed,
            "take waits behind the debt"
        );
        let deny = fallback(FailurePolicy::Deny);
        assert!(!deny.reserve("k", 1, max, T0).0.allowed);
    }

    #[test]
    fn allow_budget_carries_across_outages_and_counts_server_grants() {
        let f = fleet(FailurePolicy::Allow, 4);
        // cap 20 / 4 instances.
        assert_eq!(allowed_in_burst(&f, "a"), 5);
        // Redis answers for a while, then is away again: the same budget, not a new one.
        assert_eq!(allowed_in_burst(&f, "a"), 0, "a flap does not refill");
        // Redis granted this instance 3 of "b": its local budget is 2 more.
        f.observe("b", 3, Some(10.0), T0);
        assert_eq!(allowed_in_burst(&f, "b"), 2);
        // Time refills at 10 / 4 per second.
        assert!(f.decide("a", 2, T0 + S).allowed);
        // No history under LastKnown: the share too.
        assert_eq!(
            allowed_in_burst(&fleet(FailurePolicy::LastKnown, 4), "c"),
            5
        );
    }

    #[test]
    fn shares_of_extreme_limits_stay_shares() {
        let slow = Limit::new(1e-6, 1000.0).unwrap();
        let share = share_of(slow, 4.0);
        assert_eq!(share.cap(), 250.0);
        let tiny = Limit::new(10.0, 0.5).unwrap();
        assert_eq!(
            share_of(tiny, 4.0).cap(),
            0.5,
            "below one token: the whole cap"
        );
    }

    #[test]
    fn map_stays_bounded() {
        let config = LimiterConfig {
            max_keys: 10,
            ..Default::default()
        };
        let f = Fallback::new(Limit::new(1.0, 1.0).unwrap(), &config);
        for i in 0..100 {
            f.decide(&format!("k{i}"), 1, T0);
        }
        assert!(lock(&f.keys).len() <= 10);
    }
}
