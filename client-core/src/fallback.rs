//! A limiter's failure policy: what it decides, per key, while Redis cannot answer, from
//! local buckets run by the server's own arithmetic (rl-core's [`Level`]). Every shell's
//! limiters (Rust's `Limiter`, `PrefetchLimiter`; Python's; JavaScript's `TakeLimiter`)
//! keep one [`Fallback`] and tell it what Redis answered ([`Fallback::observe`]) and what a
//! caller asks while Redis is away ([`Fallback::decide`], [`Fallback::reserve`]).
//!
//! Decided once (docs/client-contract.md, "Local budgets"):
//! - `Allow`: a local bucket per key at a fixed share of the limit, `share * rate`,
//!   `share * cap` (the shell's `1 / instances`, default `1 / 4`): a fleet of at most
//!   `instances` stays within the limit whatever the skew between them and whatever it
//!   saw before the outage. The share is configured, never measured: the lenient tier is
//!   the one whose bound must not depend on traffic.
//! - `LastKnown`: the share this instance was measured getting from Redis for the key
//!   ([`Meter`]: granted tokens a second over the last window / the limit's rate), for the
//!   rate, the cap and the level it starts at (that share of the level Redis last
//!   reported); a key with no history gets the `Allow` share.
//! - `Deny`: every request refused, with the configured retry hint.
//!
//! Never minted: a local bucket carries across flaps (an outage that ends and starts
//! again continues it, refilled only by time), what Redis grants this instance is debited
//! from it where Redis reports no level, and a new outage starts from the lower of the
//! carried bucket and what the policy would start afresh.

use std::collections::HashMap;

use rl_core::{Bucket, Level, Limit, Nanos};

use crate::meter::Meter;
use crate::token_budget::FailurePolicy;

/// Entries not touched for this long are the first to go when the map is full.
pub const STALE: Nanos = 60 * 1_000_000_000;

/// The smallest share a measured rate gives (a key Redis was denying gets a trickle,
/// never a zero rate, which no bucket can hold).
pub const MIN_MEASURED_SHARE: f64 = 1e-3;

/// The latest instant the local buckets take (the server's bound on instants, `i64::MAX`
/// nanoseconds: 292 years on any monotonic clock); later ones are read as it.
pub const LATEST: Nanos = i64::MAX as Nanos;

/// The longest wait a local reservation accepts (the server's bound): a day.
pub const MAX_WAIT: Nanos = 86_400 * 1_000_000_000;

/// One local decision. Times in nanoseconds; the shell converts them to its units.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LocalDecision {
    pub granted: bool,
    /// Tokens granted: the `n` asked for, or 0.
    pub tokens: u64,
    /// The local bucket's tokens after the decision (negative in debt, after a reserve).
    pub remaining: f64,
    /// Denied: how long until the same request could be granted locally (the policy's
    /// retry hint for `Deny`, or when the local bucket can never hold `n`). Granted by
    /// [`Fallback::reserve`]: the wait before the tokens may be used.
    pub retry_after: Nanos,
    /// How long until the local bucket is full again (0 for `Deny`).
    pub reset_after: Nanos,
}

#[derive(Debug, Clone, Default)]
struct KeyState {
    /// Answers from Redis (kept only under `LastKnown`).
    meter: Meter,
    /// The bucket level Redis last reported (kept only under `LastKnown`).
    last_tokens: Option<f64>,
    /// The local bucket, kept across outages (its limit is the one it was sized under).
    local: Option<Bucket>,
    /// Redis answered since the local bucket was sized: the next local decision sizes it
    /// anew (`LastKnown`: from the share and level measured since).
    fresh: bool,
    touched: Nanos,
}

/// Per-key local state of one limiter's failure policy. Plain data, `&mut self`: the
/// shell holds it under its own lock.
#[derive(Debug, Clone)]
pub struct Fallback {
    policy: FailurePolicy,
    limit: Limit,
    /// The configured share of the limit: `Allow`'s, and a `LastKnown` key's with no history.
    share: f64,
    /// `limit` at `share`.
    local: Limit,
    deny_retry_after: Nanos,
    max_keys: usize,
    keys: HashMap<Vec<u8>, KeyState>,
}

impl Fallback {
    /// The failure policy of a limiter of `limit`. `share`: this instance's part of the
    /// limit (`1 / instances`), in `(0, 1000]`; `max_keys`: the most keys kept (at least 1).
    pub fn new(
        policy: FailurePolicy,
        limit: Limit,
        share: f64,
        deny_retry_after: Nanos,
        max_keys: usize,
    ) -> Result<Fallback, String> {
        if !(share > 0.0 && share <= 1000.0) {
            return Err(format!(
                "share must be in (0, 1000] (1 / instances), not {share}"
            ));
        }
        if max_keys == 0 {
            return Err("max_keys must be positive".into());
        }
        Ok(Fallback {
            policy,
            limit,
            share,
            local: share_of(limit, share),
            deny_retry_after,
            max_keys,
            keys: HashMap::new(),
        })
    }

    pub fn policy(&self) -> FailurePolicy {
        self.policy
    }

    pub fn limit(&self) -> Limit {
        self.limit
    }

    /// The configured share's local limit (`Allow`'s buckets).
    pub fn local_limit(&self) -> Limit {
        self.local
    }

    /// How many keys hold local state.
    pub fn keys(&self) -> usize {
        self.keys.len()
    }

    /// The rate Redis was measured granting `key` (`LastKnown` only; `None`: no history).
    pub fn observed_rate(&self, key: &[u8]) -> Option<f64> {
        self.keys.get(key).and_then(|s| s.meter.rate())
    }

    /// Redis answered a call on `key` at `now`, granting `granted` tokens (0: denied) and
    /// reporting the bucket's `level` (`None`: a lease, which reports none).
    /// `Allow` debits its local bucket by the grant (the share is spent once, from Redis or
    /// locally); `LastKnown` measures the rate and keeps the level (a grant Redis reports a
    /// level with is counted in that level; a lease's is debited as under `Allow`); `Deny`
    /// keeps nothing.
    pub fn observe(&mut self, key: &[u8], granted: u64, level: Option<f64>, now: Nanos) {
        let now = now.min(LATEST);
        match self.policy {
            FailurePolicy::Deny => {}
            FailurePolicy::Allow => {
                if granted == 0 {
                    return; // nothing to debit: a denial keeps no state
                }
                let default_local = self.local;
                let entry = self.entry(key, now);
                let limit = entry.local.map_or(default_local, |b| b.limit());
                let mut level = Level::new(entry.local.as_ref(), limit, now);
                debit(&mut level, granted, now);
                entry.local = Some(level.bucket());
            }
            FailurePolicy::LastKnown => {
                let default_local = self.local;
                let entry = self.entry(key, now);
                entry.meter.add(granted, now);
                entry.fresh = true;
                match level {
                    // A level that is no number of tokens is no news of the level.
                    Some(l) if l.is_finite() => entry.last_tokens = Some(l.max(0.0)),
                    Some(_) => {}
                    None if granted > 0 => {
                        let limit = entry.local.map_or(default_local, |b| b.limit());
                        let mut level = Level::new(entry.local.as_ref(), limit, now);
                        debit(&mut level, granted, now);
                        entry.local = Some(level.bucket());
                    }
                    None => {}
                }
            }
        }
    }

    /// The policy's decision for `n` tokens of `key` at `now`.
    pub fn decide(&mut self, key: &[u8], n: u64, now: Nanos) -> LocalDecision {
        self.decide_with(key, n, self.limit, now)
    }

    /// The policy's decision for `n` tokens of `key` under `limit` (a per-call limit: the
    /// configured share of it, carrying the key's local bucket over).
    pub fn decide_with(&mut self, key: &[u8], n: u64, limit: Limit, now: Nanos) -> LocalDecision {
        let now = now.min(LATEST);
        if self.policy == FailurePolicy::Deny {
            return self.refused();
        }
        let mut level = self.level_under(key, limit, now);
        let granted = level.try_take(n as f64);
        let retry_after = if granted {
            0
        } else {
            // More than the local bucket can ever hold: the policy's hint (a probe may
            // find Redis back), never a wait that cannot end.
            level.wait_for(n as f64).unwrap_or(self.deny_retry_after)
        };
        self.store(key, &level);
        LocalDecision {
            granted,
            tokens: if granted { n } else { 0 },
            remaining: level.tokens(),
            retry_after,
            reset_after: level.reset_after(),
        }
    }

    /// A reservation of `n` tokens of `key` waiting at most `max_wait`: granted with the
    /// wait before use (the local bucket goes into debt as the server's does), or denied
    /// with the wait that would have been needed.
    pub fn reserve(&mut self, key: &[u8], n: u64, max_wait: Nanos, now: Nanos) -> LocalDecision {
        let now = now.min(LATEST);
        if self.policy == FailurePolicy::Deny {
            return self.refused();
        }
        let mut level = self.level_under(key, self.limit, now);
        let (granted, wait) = level
            .reserve(n as f64, max_wait.min(MAX_WAIT))
            .unwrap_or((false, self.deny_retry_after));
        self.store(key, &level);
        LocalDecision {
            granted,
            tokens: if granted { n } else { 0 },
            remaining: level.signed_tokens(),
            retry_after: wait,
            reset_after: level.reset_after(),
        }
    }

    fn refused(&self) -> LocalDecision {
        LocalDecision {
            granted: false,
            tokens: 0,
            remaining: 0.0,
            retry_after: self.deny_retry_after,
            reset_after: 0,
        }
    }

    /// The key's local bucket at `now` for a call under `limit`.
    fn level_under(&mut self, key: &[u8], limit: Limit, now: Nanos) -> Level {
        let configured = limit == self.limit;
        let (policy, share, default_local) = (self.policy, self.share, self.local);
        let entry = self.entry(key, now);
        if !configured {
            // A per-call limit: the configured share of it, from the key's bucket (the
            // next call under the configured limit sizes it back, carrying its tokens).
            entry.fresh = true;
            return Level::new(entry.local.as_ref(), share_of(limit, share), now);
        }
        match entry.local {
            Some(b) if !entry.fresh => Level::new(Some(&b), b.limit(), now),
            carried => {
                entry.fresh = false;
                let start = start_level(policy, limit, share, default_local, entry, now);
                match carried {
                    None => start,
                    Some(b) => {
                        // Never more than the carried bucket (refilled only by time).
                        let kept = Level::new(Some(&b), *start.limit(), now);
                        if kept.signed_tokens() <= start.signed_tokens() {
                            kept
                        } else {
                            start
                        }
                    }
                }
            }
        }
    }

    /// Frees at least a quarter of a full map. First what carries nothing (a full local
    /// bucket is what a key never seen starts with; a meter untouched for [`STALE`] vouches
    /// for no share), then the least recently used keys, down to half the map: a hot key
    /// keeps its drained bucket however many cold keys come (clearing the map refilled it,
    /// a share per `max_keys` new keys). A forgotten key restarts at its share, so only
    /// more than `max_keys / 2` keys newer than it can refill it. Amortized: one pass per
    /// `max_keys / 4` new keys.
    fn make_room(&mut self, now: Nanos) {
        let policy = self.policy;
        self.keys.retain(|_, s| {
            let full = s.local.is_none_or(|b| b.full_at() <= now);
            let stale = now.saturating_sub(s.touched) >= STALE;
            !(full && (policy == FailurePolicy::Allow || stale))
        });
        if self.keys.len() < self.max_keys - self.max_keys / 4 {
            return;
        }
        let keep = self.max_keys / 2;
        if keep == 0 {
            self.keys.clear(); // a map of one key: room for the new one only
            return;
        }
        let mut touched: Vec<Nanos> = self.keys.values().map(|s| s.touched).collect();
        // The `keep`-th most recent instant: newer ones stay, and ties up to `keep`.
        let cut = touched.len() - keep;
        let (_, &mut threshold, _) = touched.select_nth_unstable(cut);
        let mut ties = keep
            - touched[cut + 1..]
                .iter()
                .filter(|&&t| t > threshold)
                .count();
        self.keys.retain(|_, s| {
            s.touched > threshold
                || (s.touched == threshold && ties > 0 && {
                    ties -= 1;
                    true
                })
        });
    }

    fn store(&mut self, key: &[u8], level: &Level) {
        if let Some(entry) = self.keys.get_mut(key) {
            entry.local = Some(level.bucket());
        }
    }

    fn entry(&mut self, key: &[u8], now: Nanos) -> &mut KeyState {
        // Looked up by reference first: a key seen before costs no allocation (every
        // answer from Redis comes through here).
        if !self.keys.contains_key(key) {
            if self.keys.len() >= self.max_keys {
                self.make_room(now);
            }
            self.keys.insert(key.to_vec(), KeyState::default());
        }
        let entry = self.keys.get_mut(key).expect("the key was inserted above");
        entry.touched = now;
        entry
    }
}

/// The local bucket an outage starts a key with, by policy.
fn start_level(
    policy: FailurePolicy,
    limit: Limit,
    configured: f64,
    default_local: Limit,
    entry: &KeyState,
    now: Nanos,
) -> Level {
    match (policy, entry.meter.rate()) {
        (FailurePolicy::LastKnown, Some(seen)) => {
            let mut share = (seen / limit.rate()).clamp(MIN_MEASURED_SHARE, 1.0);
            if !entry.meter.vouches_at(now) {
                // A young or stale meter: at most the configured share (see the meter).
                share = share.min(configured);
            }
            let local = share_of(limit, share);
            let tokens = match entry.last_tokens {
                // The level is the fleet's: this instance spends its share of it.
                Some(tokens) => tokens * share,
                // No level seen (leases): the configured share of the cap at most, not a
                // full bucket of a share that a young meter can overstate.
                None => local.cap().min(default_local.cap()),
            };
            Level::starting_with(local, tokens, now)
        }
        // `Allow`, or no history: the configured share, full.
        _ => Level::new(None, default_local, now),
    }
}

/// Takes up to `n` tokens from `level`, emptying it if fewer are there.
fn debit(level: &mut Level, n: u64, now: Nanos) {
    let d = (n as f64).min(level.tokens());
    if d > 0.0 && !level.try_take(d) {
        *level = Level::starting_with(*level.limit(), 0.0, now);
    }
}

/// `limit` at `share`: `rate * share`, `cap * share` (at least one token, or the whole cap
/// if it is below one).
pub fn share_of(limit: Limit, share: f64) -> Limit {
    let (rate, cap) = (limit.rate(), limit.cap());
    let local_cap = (cap * share).max(cap.min(1.0));
    let local_rate = (rate * share).max(rl_core::MIN_VALUE);
    // A share too slow to fill within the bounds of a limit keeps the rate, not the cap.
    Limit::new(local_rate, local_cap)
        .or_else(|_| Limit::new(local_rate, cap * share))
        .or_else(|_| Limit::new(rate, local_cap))
        .unwrap_or(limit)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const S: Nanos = 1_000_000_000;
    const MS: Nanos = 1_000_000;
    const T0: Nanos = 1_700_000_000 * S;

    fn fallback(policy: FailurePolicy, share: f64) -> Fallback {
        Fallback::new(policy, Limit::new(10.0, 20.0).unwrap(), share, S, 100_000).unwrap()
    }

    fn burst(f: &mut Fallback, key: &[u8], at: Nanos) -> u64 {
        (0..100).filter(|_| f.decide(key, 1, at).granted).count() as u64
    }

    #[test]
    fn deny_denies_with_the_hint() {
        let mut f = fallback(FailurePolicy::Deny, 1.0);
        f.observe(b"k", 5, Some(3.0), T0);
        let d = f.decide(b"k", 1, T0);
        assert!(!d.granted && d.retry_after == S && d.reset_after == 0);
        assert_eq!(f.keys(), 0, "deny keeps nothing");
        assert!(!f.reserve(b"k", 1, S, T0).granted);
    }

    #[test]
    fn allow_spends_a_fixed_share_carried_across_outages() {
        let mut f = fallback(FailurePolicy::Allow, 0.5);
        assert_eq!(burst(&mut f, b"a", T0), 10);
        let d = f.decide(b"a", 1, T0);
        assert_eq!(d.retry_after, 200 * MS, "5 tokens a second locally");
        // Redis answers, then is away again: the same bucket, refilled by time only.
        f.observe(b"a", 0, Some(20.0), T0 + MS);
        assert_eq!(burst(&mut f, b"a", T0 + MS), 0, "a flap does not refill");
        // What Redis granted this instance comes off its share.
        f.observe(b"b", 7, Some(13.0), T0);
        assert_eq!(burst(&mut f, b"b", T0), 3);
        // Whatever Redis was denying it: the share is configured, not measured.
        for i in 0..40 {
            f.observe(b"c", 0, Some(0.0), T0 + i * S / 20);
        }
        assert_eq!(burst(&mut f, b"c", T0 + 2 * S), 10);
    }

    #[test]
    fn last_known_spends_its_measured_share_of_rate_and_level() {
        let mut f = fallback(FailurePolicy::LastKnown, 0.25);
        // Redis granted this instance 2 tokens a second (a fifth of the rate) for 3 s,
        // and last reported 15 left.
        for i in 0..=6 {
            f.observe(b"k", 1, Some(15.0), T0 + i * S / 2);
        }
        let rate = f.observed_rate(b"k").unwrap();
        assert!((rate - 2.0).abs() < 0.3, "{rate}");
        let share = rate / 10.0;
        let start = T0 + 3 * S;
        let got = burst(&mut f, b"k", start);
        assert_eq!(got, (15.0 * share).floor() as u64);
        // A key never seen: the configured share (a quarter of 20).
        assert_eq!(burst(&mut f, b"new", start), 5);
    }

    #[test]
    fn last_known_never_starts_above_the_carried_bucket() {
        let mut f = fallback(FailurePolicy::LastKnown, 1.0);
        for i in 0..=20 {
            f.observe(b"k", 1, Some(20.0), T0 + i * S / 10);
        }
        let at = T0 + 2 * S;
        let first = burst(&mut f, b"k", at);
        assert!(first > 0);
        // Redis answers with a full bucket (it never saw the local grants), then the next
        // outage: the carried, drained bucket wins.
        f.observe(b"k", 1, Some(20.0), at + MS);
        assert_eq!(burst(&mut f, b"k", at + MS), 0);
    }

    #[test]
    fn reserve_queues_in_the_local_bucket() {
        let mut f = fallback(FailurePolicy::Allow, 1.0);
        for _ in 0..20 {
            let d = f.reserve(b"k", 1, S, T0);
            assert!(d.granted && d.retry_after == 0);
        }
        let d = f.reserve(b"k", 2, S, T0);
        assert!(d.granted && d.retry_after == 200 * MS);
        assert!((d.remaining + 2.0).abs() < 1e-9, "in debt: {d:?}");
        for _ in 0..8 {
            assert!(f.reserve(b"k", 1, S, T0).granted);
        }
        let d = f.reserve(b"k", 1, S, T0);
        assert!(!d.granted && d.retry_after == 1100 * MS);
        assert!(
            !f.decide(b"k", 1, T0 + S).granted,
            "take waits behind the debt"
        );
        // More than the bucket holds: the hint.
        assert_eq!(f.reserve(b"k", 21, u64::MAX, T0).retry_after, S);
    }

    #[test]
    fn per_call_limits_take_the_share_of_theirs() {
        let mut f = fallback(FailurePolicy::Allow, 0.5);
        let other = Limit::new(100.0, 100.0).unwrap();
        let granted = (0..100)
            .filter(|_| f.decide_with(b"k", 1, other, T0).granted)
            .count();
        assert_eq!(granted, 50);
        // Back under the configured limit: the bucket carries over, clamped to its cap.
        assert!(!f.decide(b"k", 1, T0).granted);
    }

    #[test]
    fn shares_of_extreme_limits_stay_shares() {
        let slow = Limit::new(1e-6, 1000.0).unwrap();
        assert_eq!(share_of(slow, 0.25).cap(), 250.0);
        let tiny = Limit::new(10.0, 0.5).unwrap();
        assert_eq!(
            share_of(tiny, 0.25).cap(),
            0.5,
            "below one token: the whole cap"
        );
        let huge = Limit::new(1e15, 1e15).unwrap();
        assert!(share_of(huge, 1000.0).cap() <= 1e15);
    }

    #[test]
    fn the_map_stays_bounded() {
        let mut f = Fallback::new(
            FailurePolicy::Allow,
            Limit::new(1.0, 1.0).unwrap(),
            1.0,
            S,
            10,
        )
        .unwrap();
        for i in 0..100u32 {
            f.decide(&i.to_be_bytes(), 1, T0);
            assert!(f.keys() <= 10);
        }
        assert!(Fallback::new(
            FailurePolicy::Allow,
            Limit::new(1.0, 1.0).unwrap(),
            0.0,
            S,
            1
        )
        .is_err());
        assert!(Fallback::new(
            FailurePolicy::Allow,
            Limit::new(1.0, 1.0).unwrap(),
            1.0,
            S,
            0
        )
        .is_err());
    }

    /// Clearing a full map refilled every key: a hot key drained during an outage got its
    /// share again each `max_keys` new keys (50 tokens of a cap of 10 at one instant). Now
    /// only more than `max_keys / 2` keys newer than it can: 4 between its calls cannot.
    #[test]
    fn a_hot_key_keeps_its_drained_bucket_among_many_keys() {
        for policy in [FailurePolicy::Allow, FailurePolicy::LastKnown] {
            let limit = Limit::new(1.0, 10.0).unwrap();
            let mut f = Fallback::new(policy, limit, 1.0, S, 10).unwrap();
            let mut hot = 0;
            let mut now = T0;
            for round in 0..50u32 {
                hot += (0..20).filter(|_| f.decide(b"hot", 1, now).granted).count();
                for i in 0..4u32 {
                    now += 1; // cold keys, one after another, each touched once
                    f.decide(&(round * 100 + i).to_be_bytes(), 1, now);
                    assert!(f.keys() <= 10);
                }
            }
            assert_eq!(hot, 10, "{policy:?}: the cap once, nothing refilled");
        }
    }

    #[test]
    fn full_buckets_go_first_and_a_map_of_one_key_works() {
        let limit = Limit::new(1.0, 10.0).unwrap();
        let mut f = Fallback::new(FailurePolicy::Allow, limit, 1.0, S, 4).unwrap();
        assert!(f.decide(b"drained", 10, T0).granted);
        // Keys Redis granted nothing to under Allow keep full buckets: they go first.
        for i in 0..100u32 {
            f.decide_with(&i.to_be_bytes(), 0, limit, T0 + S + u64::from(i));
        }
        assert!(!f.decide(b"drained", 1, T0).granted, "kept, still empty");
        let mut one = Fallback::new(FailurePolicy::Allow, limit, 1.0, S, 1).unwrap();
        for i in 0..10u32 {
            assert!(one.decide(&i.to_be_bytes(), 1, T0).granted);
            assert_eq!(one.keys(), 1);
        }
    }

    /// Four instances, each given the cap in one burst at a different hour, then one
    /// outage: each read 80 tokens a second (20 over the young meter's 0.25 s), the whole
    /// limit, and the fleet let out 396 in 10 s of a limit that lets out 120. A meter that
    /// vouches for no recent whole window gives at most the configured share.
    #[test]
    fn a_burst_long_ago_vouches_for_no_more_than_the_configured_share() {
        let limit = Limit::new(10.0, 20.0).unwrap();
        let outage = T0 + 10_000 * S;
        let mut fleet = 0;
        for i in 0..4u64 {
            let mut f = Fallback::new(FailurePolicy::LastKnown, limit, 0.25, S, 10).unwrap();
            f.observe(b"k", 20, Some(0.0), T0 + i * 3600 * S);
            fleet += (0..1000)
                .filter(|j| f.decide(b"k", 1, outage + j * S / 100).granted)
                .count();
        }
        // Each: a quarter of the rate from an empty start (the level it last saw) over 10 s.
        assert!(fleet <= 4 * 25, "{fleet}");
        // A burst just before the outage is as young: the configured share too.
        let mut f = Fallback::new(FailurePolicy::LastKnown, limit, 0.25, S, 10).unwrap();
        f.observe(b"k", 20, Some(20.0), outage - S / 2);
        assert_eq!(
            (0..100)
                .filter(|_| f.decide(b"k", 1, outage).granted)
                .count(),
            5
        );
    }

    #[derive(Debug, Clone)]
    enum Event {
        Observe(u8, u64, Option<f64>),
        Decide(u8, u64),
        Reserve(u8, u64, u64),
        Other(u8, u64),
    }

    fn event() -> impl Strategy<Value = Event> {
        prop_oneof![
            (
                0u8..3,
                0u64..30,
                proptest::option::of(prop_oneof![
                    -1e3f64..1e3,
                    Just(f64::NAN),
                    Just(f64::INFINITY),
                    Just(f64::NEG_INFINITY)
                ])
            )
                .prop_map(|(k, g, l)| Event::Observe(k, g, l)),
            (0u8..3, 0u64..40).prop_map(|(k, n)| Event::Decide(k, n)),
            (0u8..3, 0u64..40, 0u64..5 * S).prop_map(|(k, n, w)| Event::Reserve(k, n, w)),
            (0u8..3, 0u64..40).prop_map(|(k, n)| Event::Other(k, n)),
        ]
    }

    proptest! {
        /// Whatever Redis answers in between (any grants, levels, malformed numbers) and in
        /// whatever order: what `Allow` lets out locally for a key never exceeds its share
        /// of `cap + rate * elapsed`, less nothing it owes (Redis's grants only lower it).
        #[test]
        fn allow_never_lets_out_more_than_its_share(
            steps in proptest::collection::vec((0u64..S, event()), 1..150),
            share in prop_oneof![Just(1.0), Just(0.5), Just(0.25), 0.01f64..1.0],
        ) {
            let mut f = fallback(FailurePolicy::Allow, share);
            let local = f.local_limit();
            let mut now = T0;
            let mut out = [0u64; 3];
            for (dt, e) in steps {
                now += dt;
                match e {
                    Event::Observe(k, g, l) => f.observe(&[k], g, l, now),
                    Event::Decide(k, n) => if f.decide(&[k], n, now).granted { out[k as usize] += n },
                    Event::Reserve(k, n, w) => if f.reserve(&[k], n, w, now).granted { out[k as usize] += n },
                    Event::Other(k, n) => {
                        let other = Limit::new(10.0, 40.0).unwrap();
                        if f.decide_with(&[k], n, other, now).granted { out[k as usize] += n }
                    }
                }
                for o in out {
                    // A reserve may borrow up to its wait ahead of time (as the server's).
                    // A per-call limit of twice the cap starts a key at twice the share.
                    let bound = 2.0 * local.cap() + local.rate() * ((now - T0) as f64 / 1e9 + 5.0);
                    prop_assert!(o as f64 <= bound + 1e-6, "{o} > {bound}");
                }
            }
        }

        /// `LastKnown`'s local grants stay within the measured share at its widest (the
        /// whole limit) plus nothing from flaps: never more than `cap + rate * elapsed`
        /// per key, and any event order or number is decided, never a panic.
        #[test]
        fn last_known_never_mints(
            steps in proptest::collection::vec((0u64..S, event()), 1..150),
        ) {
            let mut f = fallback(FailurePolicy::LastKnown, 0.25);
            let mut now = T0;
            let mut out = [0u64; 3];
            for (dt, e) in steps {
                now += dt;
                match e {
                    Event::Observe(k, g, l) => f.observe(&[k], g, l, now),
                    Event::Decide(k, n) | Event::Other(k, n) => if f.decide(&[k], n, now).granted { out[k as usize] += n },
                    Event::Reserve(k, n, w) => if f.reserve(&[k], n, w, now).granted { out[k as usize] += n },
                }
                for o in out {
                    let bound = 20.0 + 10.0 * ((now - T0) as f64 / 1e9 + 5.0);
                    prop_assert!(o as f64 <= bound + 1e-6, "{o} > {bound}");
                }
            }
        }

        /// A fleet under skewed traffic, one Redis bucket: once their meters are older than
        /// the window, the rates the instances measured add up to at most what Redis let out
        /// over it (`rate + cap / 1.9 s`: the window holds 1.9 to 2 s of whole slots),
        /// whatever the skew and the fleet's size, with no `instances` to get wrong. (A
        /// younger meter divides by its age, at least 0.25 s: `rate + cap / age`.)
        #[test]
        fn a_fleets_measured_rates_add_up_to_at_most_the_limit(
            weights in proptest::collection::vec(0u64..20, 2..8),
            steps in 200u64..400,
        ) {
            let limit = Limit::new(100.0, 50.0).unwrap();
            let mut server: Option<rl_core::Bucket> = None;
            let mut fleet: Vec<Fallback> = weights
                .iter()
                .map(|_| Fallback::new(FailurePolicy::LastKnown, limit, 0.25, S, 10).unwrap())
                .collect();
            let mut now = T0;
            for _ in 0..steps {
                now += 10 * MS;
                for (f, &w) in fleet.iter_mut().zip(&weights) {
                    for _ in 0..w {
                        let mut level = Level::new(server.as_ref(), limit, now);
                        let granted = level.try_take(1.0);
                        server = Some(level.bucket());
                        f.observe(b"k", u64::from(granted), Some(level.tokens()), now);
                    }
                }
            }
            let total: f64 = fleet.iter().filter_map(|f| f.observed_rate(b"k")).sum();
            prop_assert!(total <= 100.0 + 50.0 / 1.9 + 1e-6, "{total}");
        }

        /// A fleet whose instances stop sending at different times (skewed in time as well
        /// as in traffic), then one outage: the local rates of the instances whose meters
        /// vouch add up to at most what Redis let out over the 4 s before it
        /// (`(cap + 4 * rate) / 1.9 s`), the others' to at most the configured shares (one
        /// limit over the fleet), and their starts to that share of the cap: over `t`
        /// seconds, at most `(cap + rate * t)` times `(cap + 4 * rate) / (1.9 s * rate) + 1`.
        #[test]
        fn a_fleet_skewed_in_time_stays_within_the_documented_bound(
            fleet in proptest::collection::vec((0u64..20, 0u64..600, any::<bool>()), 2..8),
        ) {
            let limit = Limit::new(100.0, 50.0).unwrap();
            let n = fleet.len() as f64;
            let mut server: Option<rl_core::Bucket> = None;
            let mut fs: Vec<Fallback> = fleet
                .iter()
                .map(|_| Fallback::new(FailurePolicy::LastKnown, limit, 1.0 / n, S, 10).unwrap())
                .collect();
            let mut now = T0;
            for step in 0..600u64 {
                now += 10 * MS;
                for (f, &(w, stop, burst)) in fs.iter_mut().zip(&fleet) {
                    // Until its own stop: steady, or one burst of the cap at its stop.
                    let asks = match (step.cmp(&stop), burst) {
                        (std::cmp::Ordering::Less, false) => w,
                        (std::cmp::Ordering::Equal, true) => 50,
                        _ => 0,
                    };
                    for _ in 0..asks {
                        let mut level = Level::new(server.as_ref(), limit, now);
                        let granted = level.try_take(1.0);
                        server = Some(level.bucket());
                        f.observe(b"k", u64::from(granted), Some(level.tokens()), now);
                    }
                }
            }
            let t = 20u64;
            let mut out = 0u64;
            for j in 0..(t * 100) {
                for f in fs.iter_mut() {
                    out += u64::from(f.decide(b"k", 1, now + j * 10 * MS).granted);
                }
            }
            let factor = (50.0 + 4.0 * 100.0) / (1.9 * 100.0) + 1.0;
            let bound = (50.0 + 100.0 * t as f64) * factor;
            prop_assert!((out as f64) <= bound, "{out} > {bound}");
        }

        /// Any instants (a clock stepping back, 0, the end of time) and any `n`: a decision,
        /// never a panic, and its numbers are numbers.
        #[test]
        fn extremes_are_decided(
            nows in proptest::collection::vec(any::<u64>(), 1..40),
            ns in proptest::collection::vec(any::<u64>(), 40),
            policy in prop_oneof![Just(FailurePolicy::Allow), Just(FailurePolicy::LastKnown)],
        ) {
            let mut f = Fallback::new(policy, Limit::new(1e-3, 1e6).unwrap(), 1e-3, u64::MAX, 3).unwrap();
            for (i, now) in nows.into_iter().enumerate() {
                f.observe(&[i as u8 % 5], ns[i], Some(ns[i] as f64), now);
                let d = f.decide(&[i as u8 % 7], ns[i], now);
                prop_assert!(d.remaining.is_finite());
                let r = f.reserve(&[i as u8 % 7], ns[i], ns[i], now);
                prop_assert!(r.remaining.is_finite());
                prop_assert!(f.keys() <= 3);
            }
        }
    }
}
