//! A share of one key's rate (`RL.SHARE`, docs/share.md), on the holder's side: the command
//! and its reply for the module and the Functions library, the local bucket filled at the
//! share, when a share may be used (the hold of a call in the air, the lease, the drift
//! margin) and what the failure policy lets out while Redis is down. The demand a holder
//! reports is [`crate::share_demand`]'s; the holder every shell wraps (its takers' side and
//! its refresh side) is [`crate::share_holder`]'s.
//!
//! Time enters as nanoseconds on a monotonic clock the shell keeps (never the wall clock),
//! so every rule here is tested by stepping a number.

pub use rl_core::pin::PinKind;

use crate::budget::Backend;
use crate::reply::{ProtocolError, Reply};

/// One millisecond in nanoseconds.
pub const MS: u64 = 1_000_000;
const NANOS_PER_SEC: f64 = 1e9;

/// The protocol's `HOLD_MS`: a holder that sent a call at `s` stops using the share it had
/// before at `min(answer arrives, s + HOLD)`; the server counts the old share that long.
pub const HOLD: u64 = rl_core::share::HOLD;

/// How much earlier than `sent + lease` a share stops being used: 1 % of the lease plus
/// 10 ms, for the drift between this machine's monotonic clock and the server's clock over
/// one lease (and the server's time `T >= sent`, which only helps).
pub fn drift_margin(lease: u64) -> u64 {
    lease / 100 + 10 * MS
}

/// A number as the module and the library read it back exactly: the shortest digits that
/// round-trip, never an exponent.
fn number(x: f64) -> Vec<u8> {
    format!("{x}").into_bytes()
}

/// What one holder's `RL.SHARE` carries besides its holder id and want.
#[derive(Debug, Clone, PartialEq)]
pub struct ShareKey {
    pub key: Vec<u8>,
    /// The key's whole limit.
    pub rate: f64,
    pub cap: f64,
    pub period_ms: u64,
    /// The limit's `VERSION`, if the caller sets one.
    pub version: Option<u64>,
}

/// The arguments (command name first) of `RL.SHARE key rate cap holder want period_ms
/// [RELEASE] [VERSION v]`, or the library's `FCALL rl_share 1 key ...` with the same.
pub fn share_command(
    backend: Backend,
    key: &ShareKey,
    holder: &[u8],
    want: f64,
    release: bool,
) -> Vec<Vec<u8>> {
    let mut out: Vec<Vec<u8>> = Vec::with_capacity(12);
    match backend {
        Backend::Module => out.push(b"RL.SHARE".to_vec()),
        Backend::Functions => out.extend([b"FCALL".to_vec(), b"rl_share".to_vec(), b"1".to_vec()]),
    }
    out.extend([
        key.key.clone(),
        number(key.rate),
        number(key.cap),
        holder.to_vec(),
        number(want),
        key.period_ms.to_string().into_bytes(),
    ]);
    if release {
        out.push(b"RELEASE".to_vec());
    }
    if let Some(v) = key.version {
        out.extend([b"VERSION".to_vec(), v.to_string().into_bytes()]);
    }
    out
}

/// Reads `RL.SHARE`'s `[rate, burst, lease_ms, refresh_ms, holders]` (doubles as strings
/// under RESP2), with the kind of the pin that decided as a sixth element when one did.
pub fn parse_share(reply: &Reply) -> Result<Grant, ProtocolError> {
    let items = reply.items("RL.SHARE")?;
    if items.len() != 5 && items.len() != 6 {
        return Err(ProtocolError(format!(
            "RL.SHARE: 5 or 6 elements expected, got {}",
            items.len()
        )));
    }
    let rate = items[0].number("RL.SHARE rate")?;
    let burst = items[1].number("RL.SHARE burst")?;
    if !(rate >= 0.0 && burst >= 0.0 && rate.is_finite() && burst.is_finite()) {
        return Err(ProtocolError(format!(
            "RL.SHARE: a share must be finite and >= 0: {rate} {burst}"
        )));
    }
    let lease_ms = items[2].count("RL.SHARE lease_ms")?;
    let refresh_ms = items[3].count("RL.SHARE refresh_ms")?;
    let holders = items[4].count("RL.SHARE holders")?;
    let pinned = match items.get(5) {
        None => None,
        Some(kind) => {
            let name = kind.bytes_or_nil("RL.SHARE pin")?.unwrap_or_default();
            let kind = std::str::from_utf8(name).ok().and_then(PinKind::parse);
            Some(kind.ok_or_else(|| {
                ProtocolError(format!(
                    "RL.SHARE pin: {name:?} is not rate, block or exempt"
                ))
            })?)
        }
    };
    Ok(Grant {
        rate,
        burst,
        lease: lease_ms.saturating_mul(MS),
        refresh: refresh_ms.saturating_mul(MS),
        holders,
        pinned,
    })
}

/// A token bucket that starts empty, fills at `rate` up to `burst`, and whose limit can only
/// be clamped: a new or changed share never adds tokens.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LocalBucket {
    tokens: f64,
    at: u64,
    rate: f64,
    burst: f64,
}

impl LocalBucket {
    /// An empty bucket with no share (it fills at nothing).
    pub fn empty(now: u64) -> LocalBucket {
        LocalBucket {
            tokens: 0.0,
            at: now,
            rate: 0.0,
            burst: 0.0,
        }
    }

    /// Refills up to `now` (time never runs back: an earlier `now` changes nothing).
    fn advance(&mut self, now: u64) {
        if now > self.at {
            let add = self.rate * (now - self.at) as f64 / NANOS_PER_SEC;
            self.tokens = (self.tokens + add).min(self.burst);
            self.at = now;
        }
    }

    /// From `now` on, fill at `rate` up to `burst`: what was earned under the old limit is
    /// kept up to the new burst, nothing is added.
    pub fn set(&mut self, rate: f64, burst: f64, now: u64) {
        self.advance(now);
        self.rate = rate.max(0.0);
        self.burst = burst.max(0.0);
        self.tokens = self.tokens.min(self.burst);
    }

    /// Takes `n` tokens at `now` if they are there.
    pub fn try_take(&mut self, n: f64, now: u64) -> bool {
        self.advance(now);
        if self.tokens >= n {
            self.tokens -= n;
            true
        } else {
            false
        }
    }

    pub fn tokens(&self) -> f64 {
        self.tokens
    }

    pub fn rate(&self) -> f64 {
        self.rate
    }

    pub fn burst(&self) -> f64 {
        self.burst
    }

    /// How long until `n` tokens are there at this rate (`None`: never, `n` above the burst
    /// or no rate).
    pub fn wait_for(&self, n: f64) -> Option<u64> {
        if n > self.burst || self.rate <= 0.0 {
            return None;
        }
        let missing = (n - self.tokens).max(0.0);
        Some((missing / self.rate * NANOS_PER_SEC).ceil() as u64)
    }

    /// How long until the bucket is full at this rate (0 with no rate).
    pub fn reset_after(&self) -> u64 {
        if self.rate <= 0.0 {
            return 0;
        }
        ((self.burst - self.tokens).max(0.0) / self.rate * NANOS_PER_SEC).ceil() as u64
    }
}

/// A share as the server granted it (times in ns).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Grant {
    pub rate: f64,
    pub burst: f64,
    pub lease: u64,
    pub refresh: u64,
    pub holders: u64,
    /// The kind of the operator's pin that decided: `Block` answers no share (every take
    /// denied), `Exempt` a share whose takes are all granted and counted nowhere.
    pub pinned: Option<PinKind>,
}

/// What the failure policy lets out while the share cannot be used and Redis is down.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Fallback {
    /// Until when (`None`: until Redis answers again).
    until: Option<u64>,
}

/// Who decided a take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum By {
    /// The share the server granted.
    Share,
    /// The failure policy (Redis down and no usable share).
    Fallback,
}

/// A decision of the local state.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Local {
    pub allowed: bool,
    pub by: By,
    pub remaining: f64,
    /// Until `n` tokens are there (`None`: not at the present share).
    pub wait: Option<u64>,
    pub reset_after: u64,
    /// The kind of the pin behind the last answer, if one decided it.
    pub pinned: Option<PinKind>,
}

/// What a holder does once no share may be used and Redis is down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailurePolicy {
    /// `rate / holders` (times `allow_share`) for `allow_for`, then nothing until Redis
    /// answers.
    Allow,
    /// The last share granted, until Redis answers.
    LastKnown,
    /// Nothing.
    Deny,
}

/// The policy settings the state needs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Policy {
    pub policy: FailurePolicy,
    /// The part of `rate / holders` that `Allow` lets out (Python's
    /// `FailurePolicy.allow(share)`; 1 in Rust).
    pub allow_share: f64,
    /// The key's whole limit.
    pub rate: f64,
    pub cap: f64,
    /// Holders assumed when none was ever seen (`LimiterConfig::instances`).
    pub instances: u64,
    /// How long `Allow` lets out `rate / holders` in one outage.
    pub allow_for: u64,
}

/// One holder's share of a key, on this side: the local bucket and the windows in which the
/// share may be used.
#[derive(Debug, Clone, PartialEq)]
pub struct ShareState {
    bucket: LocalBucket,
    /// The share in use, if it may still be used.
    share: Option<Grant>,
    /// `sent + lease - margin` of the call that granted it.
    lease_end: u64,
    /// `s + HOLD` of a call sent at `s` whose answer has not come (or never will): the share
    /// had before it is used no longer than that.
    hold_end: Option<u64>,
    /// `hold_end` before the last call was sent: a call refused at the connection restores
    /// it (an earlier call whose reply never came may have reached the server).
    hold_before: Option<u64>,
    /// The last share granted, kept past its end (LastKnown uses it, Allow its holders).
    last: Option<Grant>,
    fallback: Option<Fallback>,
    /// Allow's bounded time was used up in this outage: nothing more until Redis answers.
    allow_spent: bool,
}

impl ShareState {
    /// A new holder: an empty bucket, no share.
    pub fn new(now: u64) -> ShareState {
        ShareState {
            bucket: LocalBucket::empty(now),
            share: None,
            lease_end: 0,
            hold_end: None,
            hold_before: None,
            last: None,
            fallback: None,
            allow_spent: false,
        }
    }

    /// Until when the share in use may be used (0: none).
    pub fn usable_until(&self) -> u64 {
        match self.share {
            Some(_) => self.lease_end.min(self.hold_end.unwrap_or(u64::MAX)),
            None => 0,
        }
    }

    /// The share in use, if any.
    pub fn share(&self) -> Option<Grant> {
        self.share
    }

    pub fn last(&self) -> Option<Grant> {
        self.last
    }

    pub fn bucket(&self) -> &LocalBucket {
        &self.bucket
    }

    /// `(rate, burst, tokens)` at `now`, after settling what ended by then.
    pub fn peek(&mut self, now: u64) -> (f64, f64, f64) {
        self.settle(now);
        let (rate, burst) = (self.bucket.rate(), self.bucket.burst());
        self.bucket.set(rate, burst, now);
        (rate, burst, self.bucket.tokens())
    }

    /// Whether the failure policy is deciding.
    pub fn in_fallback(&self) -> bool {
        self.fallback.is_some()
    }

    /// Ends what has ended by `now`: the share at the end of its window, a bounded
    /// fallback at its end. The bucket fills until that instant, then holds nothing.
    pub fn settle(&mut self, now: u64) {
        if self.share.is_some() {
            let end = self.usable_until();
            if now >= end {
                self.bucket.set(0.0, 0.0, end);
                self.share = None;
            }
        }
        if let Some(Fallback { until: Some(until) }) = self.fallback {
            if now >= until {
                self.bucket.set(0.0, 0.0, until);
                self.fallback = None;
                self.allow_spent = true;
            }
        }
    }

    /// A call is sent at `sent`: the share had before it is used until its answer, at most
    /// until `sent + HOLD`.
    pub fn sending(&mut self, sent: u64) {
        self.settle(sent);
        self.hold_before = self.hold_end;
        let hold = sent.saturating_add(HOLD);
        self.hold_end = Some(self.hold_end.map_or(hold, |h| h.min(hold)));
    }

    /// The answer to the call sent at `sent` arrived at `now`: the new share is used until
    /// `sent + lease - margin`, and the bucket is only clamped to its burst.
    pub fn answered(&mut self, sent: u64, grant: Grant, now: u64) {
        self.settle(now);
        let lease_end = sent
            .saturating_add(grant.lease)
            .saturating_sub(drift_margin(grant.lease));
        if self.fallback.is_some() {
            // What the policy let the bucket earn is not the server's: a share after an
            // outage starts empty, as a new holder's.
            self.bucket = LocalBucket::empty(now);
        }
        self.hold_end = None;
        self.hold_before = None;
        self.fallback = None;
        self.allow_spent = false;
        self.last = Some(grant);
        if now < lease_end {
            // An exempt answer counts nothing: the bucket is not filled from it.
            let exempt = grant.pinned == Some(PinKind::Exempt);
            let (rate, burst) = if exempt {
                (0.0, 0.0)
            } else {
                (grant.rate, grant.burst)
            };
            self.bucket.set(rate, burst, now);
            self.share = Some(grant);
            self.lease_end = lease_end;
        } else {
            // Arrived too late to be used at all.
            self.bucket.set(0.0, 0.0, now);
            self.share = None;
        }
    }

    /// The call last sent never reached Redis (the connection was refused): the server still
    /// counts the share had before until its lease ends, or until the hold of an earlier
    /// call whose reply never came (it may have reached the server, which then counted the
    /// old share only until that hold): the hold from before the refused call is restored.
    pub fn not_sent(&mut self, now: u64) {
        self.settle(now);
        self.hold_end = self.hold_before;
    }

    /// Decides on `n` tokens at `now`. `down`: Redis is believed down (the last call was an
    /// outage), so once no share may be used, the failure policy decides.
    pub fn decide(&mut self, n: f64, now: u64, down: bool, policy: &Policy) -> Local {
        self.settle(now);
        if self.share.is_none() && down {
            self.fall_back(now, policy);
        }
        let by = if self.share.is_none() && (down || self.fallback.is_some()) {
            By::Fallback
        } else {
            // The share, or none yet (waiting for a first share, or for the answer to a
            // slow call): denied, not a policy decision.
            By::Share
        };
        let pinned = match (self.share, by) {
            (Some(g), _) => g.pinned,
            // A block answers no share at all: the last answer says it was a pin.
            (None, By::Share) => self.last.and_then(|g| g.pinned),
            (None, By::Fallback) => None,
        };
        if pinned == Some(PinKind::Exempt) && self.share.is_some() {
            // Exempt: granted, nothing counted, until the answer's lease ends.
            return Local {
                allowed: true,
                by,
                remaining: self.bucket.tokens(),
                wait: Some(0),
                reset_after: 0,
                pinned,
            };
        }
        let allowed =
            (self.share.is_some() || self.fallback.is_some()) && self.bucket.try_take(n, now);
        Local {
            allowed,
            by,
            remaining: self.bucket.tokens(),
            wait: if allowed {
                Some(0)
            } else {
                self.bucket.wait_for(n)
            },
            reset_after: self.bucket.reset_after(),
            pinned,
        }
    }

    /// Starts the failure policy's local share, if it is not deciding already.
    fn fall_back(&mut self, now: u64, p: &Policy) {
        if self.fallback.is_some() || self.allow_spent {
            return;
        }
        let holders = self.last.map_or(p.instances, |g| g.holders).max(1) as f64;
        let (rate, burst, until) = match p.policy {
            FailurePolicy::Deny => (0.0, 0.0, None),
            FailurePolicy::Allow => (
                p.rate * p.allow_share / holders,
                p.cap * p.allow_share / holders,
                Some(now.saturating_add(p.allow_for)),
            ),
            FailurePolicy::LastKnown => match self.last {
                Some(g) => (g.rate, g.burst, None),
                None => (p.rate / holders, p.cap / holders, None),
            },
        };
        self.bucket.set(rate, burst, now);
        self.fallback = Some(Fallback { until });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;
    const T0: u64 = 1_000 * S;

    fn grant(rate: f64, burst: f64) -> Grant {
        Grant {
            rate,
            burst,
            lease: 3 * S,
            refresh: S,
            holders: 2,
            pinned: None,
        }
    }

    #[test]
    fn exempt_grants_without_counting_and_block_denies_saying_so() {
        let p = policy(FailurePolicy::Deny);
        let mut st = ShareState::new(T0);
        st.sending(T0);
        let exempt = Grant {
            pinned: Some(PinKind::Exempt),
            ..grant(100.0, 10.0)
        };
        st.answered(T0, exempt, T0 + 1);
        for i in 0..1000 {
            let d = st.decide(1.0, T0 + 2 + i, false, &p);
            assert!(d.allowed && d.pinned == Some(PinKind::Exempt));
        }
        // Its lease over: nothing.
        assert!(!st.decide(1.0, T0 + 3 * S, false, &p).allowed);
        st.sending(T0 + 3 * S);
        let block = Grant {
            lease: 0,
            pinned: Some(PinKind::Block),
            ..grant(0.0, 0.0)
        };
        st.answered(T0 + 3 * S, block, T0 + 3 * S + 1);
        let d = st.decide(1.0, T0 + 3 * S + 2, false, &p);
        assert!(!d.allowed && d.by == By::Share && d.pinned == Some(PinKind::Block));
        st.sending(T0 + 4 * S);
        st.answered(T0 + 4 * S, grant(10.0, 2.0), T0 + 4 * S + 1);
        assert_eq!(st.decide(1.0, T0 + 4 * S + 2, false, &p).pinned, None);
    }

    fn policy(policy: FailurePolicy) -> Policy {
        Policy {
            policy,
            allow_share: 1.0,
            rate: 100.0,
            cap: 40.0,
            instances: 4,
            allow_for: 10 * S,
        }
    }

    /// Tokens let out by `n` takes of 1 at `now`.
    fn drain(state: &mut ShareState, now: u64, down: bool, p: &Policy) -> u64 {
        (0..10_000)
            .take_while(|_| state.decide(1.0, now, down, p).allowed)
            .count() as u64
    }

    #[test]
    fn the_bucket_starts_empty_and_fills_at_its_rate_up_to_its_burst() {
        let mut b = LocalBucket::empty(T0);
        b.set(10.0, 5.0, T0);
        assert!(!b.try_take(1.0, T0), "a new holder starts empty");
        assert_eq!(b.wait_for(1.0), Some(S / 10));
        assert!(b.try_take(1.0, T0 + S / 10));
        b.set(10.0, 5.0, T0 + 10 * S);
        assert_eq!(b.tokens(), 5.0, "up to the burst");
        assert_eq!(b.wait_for(6.0), None);
    }

    #[test]
    fn a_new_or_changed_share_never_adds_tokens() {
        let mut b = LocalBucket::empty(T0);
        b.set(10.0, 5.0, T0);
        b.set(10.0, 5.0, T0 + S / 5); // 2 earned
        assert!((b.tokens() - 2.0).abs() < 1e-9);
        b.set(1000.0, 100.0, T0 + S / 5);
        assert!(
            (b.tokens() - 2.0).abs() < 1e-9,
            "a larger share adds nothing"
        );
        b.set(1.0, 1.0, T0 + S / 5);
        assert_eq!(b.tokens(), 1.0, "a smaller burst clamps");
        // Time running back changes nothing.
        b.set(1.0, 1.0, T0);
        assert_eq!(b.tokens(), 1.0);
    }

    #[test]
    fn a_share_is_used_until_sent_plus_lease_minus_the_drift_margin() {
        let p = policy(FailurePolicy::Deny);
        let mut s = ShareState::new(T0);
        s.sending(T0);
        s.answered(T0, grant(1000.0, 10.0), T0 + MS);
        let end = T0 + 3 * S - (30 * MS + 10 * MS);
        assert_eq!(s.usable_until(), end);
        assert_eq!(drain(&mut s, end - 1, false, &p), 10);
        assert!(!s.decide(1.0, end, false, &p).allowed);
        assert_eq!(s.bucket().tokens(), 0.0, "nothing is kept past the window");
        assert!(!s.decide(1.0, end + S, false, &p).allowed);
    }

    #[test]
    fn a_refresh_in_flight_ends_the_old_share_at_its_hold() {
        let p = policy(FailurePolicy::Deny);
        let mut s = ShareState::new(T0);
        s.sending(T0);
        s.answered(T0, grant(1000.0, 10.0), T0);
        let sent = T0 + S;
        s.sending(sent);
        // Before the hold ends the old share is still used...
        assert!(s.decide(1.0, sent + HOLD - 1, false, &p).allowed);
        // ...from its end on, nothing (no answer came).
        assert!(!s.decide(1.0, sent + HOLD, false, &p).allowed);
        assert_eq!(s.share(), None);
        // A late answer starts the new share from an empty bucket.
        s.answered(sent, grant(1000.0, 10.0), sent + HOLD + S);
        assert_eq!(s.bucket().tokens(), 0.0);
        assert!(s.decide(1.0, sent + HOLD + S + 2 * MS, false, &p).allowed);
    }

    #[test]
    fn an_answer_before_the_hold_switches_shares_without_adding_tokens() {
        let mut s = ShareState::new(T0);
        s.sending(T0);
        s.answered(T0, grant(10.0, 10.0), T0);
        let sent = T0 + S; // 10 earned by then
        s.sending(sent);
        s.answered(sent, grant(100.0, 4.0), sent + MS);
        assert!(
            (s.bucket().tokens() - 4.0).abs() < 1e-9,
            "clamped to the new burst"
        );
        assert_eq!(s.usable_until(), sent + 3 * S - 40 * MS);
    }

    #[test]
    fn a_call_that_never_left_keeps_the_old_lease() {
        let p = policy(FailurePolicy::Deny);
        let mut s = ShareState::new(T0);
        s.sending(T0);
        s.answered(T0, grant(1000.0, 10.0), T0);
        let sent = T0 + S;
        s.sending(sent);
        s.not_sent(sent + MS);
        let later = sent + HOLD + S / 2;
        assert!(
            s.decide(1.0, later, true, &p).allowed,
            "the lease still runs"
        );
        assert_eq!(s.decide(1.0, later, true, &p).by, By::Share);
        // Until its end; then the policy (Deny) decides.
        let end = T0 + 3 * S - 40 * MS;
        let d = s.decide(1.0, end, true, &p);
        assert!(!d.allowed && d.by == By::Fallback, "{d:?}");
    }

    #[test]
    fn a_refused_call_after_one_that_timed_out_keeps_the_earlier_hold() {
        // Call 1 timed out (it may have reached the server, which then counted the old
        // share until its hold); call 2 was refused at the connection: the old share ends
        // at call 1's hold, not at its lease.
        let p = policy(FailurePolicy::Deny);
        let mut s = ShareState::new(T0);
        s.sending(T0);
        s.answered(T0, grant(1000.0, 10.0), T0);
        let first = T0 + S;
        s.sending(first);
        let second = first + 100 * MS;
        s.sending(second);
        s.not_sent(second + MS);
        assert_eq!(s.usable_until(), first + HOLD);
        assert!(s.decide(1.0, first + HOLD - 1, true, &p).allowed);
        let d = s.decide(1.0, first + HOLD, true, &p);
        assert!(!d.allowed && d.by == By::Fallback, "{d:?}");
    }

    #[test]
    fn allow_lets_out_rate_over_holders_for_a_bounded_time() {
        let p = policy(FailurePolicy::Allow);
        let mut s = ShareState::new(T0);
        s.sending(T0);
        s.answered(T0, grant(50.0, 20.0), T0); // 2 holders
        let end = s.usable_until();
        // Redis down past the lease: 100 / 2 holders per second, burst 40 / 2, from empty.
        let start = end + S;
        assert_eq!(drain(&mut s, start, true, &p), 0, "starts empty");
        assert_eq!(drain(&mut s, start + S / 10, true, &p), 5);
        assert_eq!(s.decide(1.0, start, true, &p).by, By::Fallback);
        assert_eq!(drain(&mut s, start + 5 * S, true, &p), 20);
        // After allow_for: nothing, for the rest of the outage.
        assert_eq!(drain(&mut s, start + 10 * S, true, &p), 0);
        assert_eq!(drain(&mut s, start + 20 * S, true, &p), 0);
        // Redis answers: a share again, from an empty bucket.
        let back = start + 21 * S;
        s.sending(back);
        s.answered(back, grant(50.0, 20.0), back);
        assert_eq!(drain(&mut s, back, false, &p), 0);
        assert_eq!(drain(&mut s, back + S, false, &p), 20);
    }

    #[test]
    fn last_known_keeps_the_last_share_and_deny_nothing() {
        let mut s = ShareState::new(T0);
        s.sending(T0);
        s.answered(T0, grant(7.0, 3.0), T0);
        let late = s.usable_until() + 100 * S;
        let p = policy(FailurePolicy::LastKnown);
        assert_eq!(drain(&mut s.clone(), late, true, &p), 0);
        let mut lk = s.clone();
        lk.decide(1.0, late, true, &p);
        assert_eq!(drain(&mut lk, late + S, true, &p), 3, "the last burst");
        assert_eq!(drain(&mut lk, late + 2 * S, true, &p), 3, "refilled at 7/s");
        let p = policy(FailurePolicy::Deny);
        assert_eq!(drain(&mut s, late + S, true, &p), 0);
        // Redis not down: no policy, no grant without a share.
        let p = policy(FailurePolicy::Allow);
        let mut up = ShareState::new(T0);
        assert_eq!(drain(&mut up, T0 + 10 * S, false, &p), 0);
        assert!(!up.in_fallback());
    }

    /// A tiny generator for the property test.
    fn xorshift(state: &mut u64) -> u64 {
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        *state
    }

    /// Whatever the shares, answers and losses, what the bucket lets out while shares are
    /// used is at most what their rates earned inside their windows: `sum(rate * used
    /// time)` (each share's bucket starts from what was left, clamped, never more).
    #[test]
    fn let_out_never_exceeds_what_the_shares_earned() {
        let p = policy(FailurePolicy::Deny);
        for seed in 1..200u64 {
            let mut rng = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
            let mut s = ShareState::new(T0);
            let mut now = T0;
            let (mut let_out, mut earned) = (0.0, 0.0);
            let mut last = now;
            for _ in 0..400 {
                let step = xorshift(&mut rng) % (400 * MS);
                // Earned since `last`: the share in use, within its window.
                let next = now + step;
                if let Some(g) = s.share() {
                    let until = s.usable_until().min(next);
                    if until > last {
                        earned += g.rate * (until - last) as f64 / 1e9;
                    }
                }
                now = next;
                last = now;
                match xorshift(&mut rng) % 6 {
                    0 => s.sending(now),
                    1 => {
                        let rate = (xorshift(&mut rng) % 1000) as f64;
                        let burst = (xorshift(&mut rng) % 50) as f64;
                        let sent = now.saturating_sub(xorshift(&mut rng) % (300 * MS));
                        s.answered(sent, grant(rate, burst), now);
                    }
                    2 => s.not_sent(now),
                    _ => {
                        let n = 1 + xorshift(&mut rng) % 5;
                        if s.decide(n as f64, now, false, &p).allowed {
                            let_out += n as f64;
                        }
                    }
                }
            }
            assert!(
                let_out <= earned + 1e-6,
                "seed {seed}: let out {let_out} > earned {earned}"
            );
        }
    }
}
