//! The pure parts of a [`ShareLimiter`](crate::ShareLimiter): its local bucket, when a share
//! may be used, what the failure policy lets out, and how much the holder asks for. Time
//! enters as monotonic nanoseconds (never the wall clock), so every rule here is tested by
//! stepping a number.

use std::collections::VecDeque;

use crate::FailurePolicy;

pub(crate) const MS: u64 = 1_000_000;
const NANOS_PER_SEC: f64 = 1e9;

/// The protocol's `HOLD_MS`: a holder that sent a call at `s` stops using the share it had
/// before at `min(answer arrives, s + HOLD)`; the server counts the old share that long.
pub(crate) const HOLD: u64 = 250 * MS;

/// How much earlier than `sent + lease` a share stops being used: 1 % of the lease plus
/// 10 ms, for the drift between this machine's monotonic clock and the server's clock over
/// one lease (and the server's time `T >= sent`, which only helps).
pub(crate) fn drift_margin(lease: u64) -> u64 {
    lease / 100 + 10 * MS
}

/// A token bucket that starts empty, fills at `rate` up to `burst`, and whose limit can only
/// be clamped: a new or changed share never adds tokens.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct LocalBucket {
    tokens: f64,
    at: u64,
    rate: f64,
    burst: f64,
}

impl LocalBucket {
    /// An empty bucket with no share (it fills at nothing).
    pub(crate) fn empty(now: u64) -> LocalBucket {
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
    pub(crate) fn set(&mut self, rate: f64, burst: f64, now: u64) {
        self.advance(now);
        self.rate = rate.max(0.0);
        self.burst = burst.max(0.0);
        self.tokens = self.tokens.min(self.burst);
    }

    /// Takes `n` tokens at `now` if they are there.
    pub(crate) fn try_take(&mut self, n: f64, now: u64) -> bool {
        self.advance(now);
        if self.tokens >= n {
            self.tokens -= n;
            true
        } else {
            false
        }
    }

    pub(crate) fn tokens(&self) -> f64 {
        self.tokens
    }

    pub(crate) fn rate(&self) -> f64 {
        self.rate
    }

    pub(crate) fn burst(&self) -> f64 {
        self.burst
    }

    /// How long until `n` tokens are there at this rate (`None`: never, `n` above the burst
    /// or no rate).
    pub(crate) fn wait_for(&self, n: f64) -> Option<u64> {
        if n > self.burst || self.rate <= 0.0 {
            return None;
        }
        let missing = (n - self.tokens).max(0.0);
        Some((missing / self.rate * NANOS_PER_SEC).ceil() as u64)
    }

    /// How long until the bucket is full at this rate (0 with no rate).
    pub(crate) fn reset_after(&self) -> u64 {
        if self.rate <= 0.0 {
            return 0;
        }
        ((self.burst - self.tokens).max(0.0) / self.rate * NANOS_PER_SEC).ceil() as u64
    }
}

/// A share as the server granted it (times in ns).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Grant {
    pub(crate) rate: f64,
    pub(crate) burst: f64,
    pub(crate) lease: u64,
    pub(crate) refresh: u64,
    pub(crate) holders: u64,
    /// The kind of the operator's pin that decided: `Block` answers no share (every take
    /// denied), `Exempt` a share whose takes are all granted and counted nowhere.
    pub(crate) pinned: Option<crate::PinKind>,
}

/// What the failure policy lets out while the share cannot be used and Redis is down.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Fallback {
    /// Until when (`None`: until Redis answers again).
    until: Option<u64>,
}

/// Who decided a take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum By {
    /// The share the server granted.
    Share,
    /// The failure policy (Redis down and no usable share).
    Fallback,
}

/// A decision of the local state.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Local {
    pub(crate) allowed: bool,
    pub(crate) by: By,
    pub(crate) remaining: f64,
    /// Until `n` tokens are there (`None`: not at the present share).
    pub(crate) wait: Option<u64>,
    pub(crate) reset_after: u64,
    /// The kind of the pin behind the last answer, if one decided it.
    pub(crate) pinned: Option<crate::PinKind>,
}

/// The policy settings the state needs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Policy {
    pub(crate) policy: FailurePolicy,
    /// The key's whole limit.
    pub(crate) rate: f64,
    pub(crate) cap: f64,
    /// Holders assumed when none was ever seen (`LimiterConfig::instances`).
    pub(crate) instances: u64,
    /// How long `Allow` lets out `rate / holders` in one outage.
    pub(crate) allow_for: u64,
}

/// One holder's share of a key, on this side: the local bucket and the windows in which the
/// share may be used.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ShareState {
    bucket: LocalBucket,
    /// The share in use, if it may still be used.
    share: Option<Grant>,
    /// `sent + lease - margin` of the call that granted it.
    lease_end: u64,
    /// `s + HOLD` of a call sent at `s` whose answer has not come (or never will): the share
    /// had before it is used no longer than that.
    hold_end: Option<u64>,
    /// The last share granted, kept past its end (LastKnown uses it, Allow its holders).
    last: Option<Grant>,
    fallback: Option<Fallback>,
    /// Allow's bounded time was used up in this outage: nothing more until Redis answers.
    allow_spent: bool,
}

impl ShareState {
    /// A new holder: an empty bucket, no share.
    pub(crate) fn new(now: u64) -> ShareState {
        ShareState {
            bucket: LocalBucket::empty(now),
            share: None,
            lease_end: 0,
            hold_end: None,
            last: None,
            fallback: None,
            allow_spent: false,
        }
    }

    /// Until when the share in use may be used (0: none).
    pub(crate) fn usable_until(&self) -> u64 {
        match self.share {
            Some(_) => self.lease_end.min(self.hold_end.unwrap_or(u64::MAX)),
            None => 0,
        }
    }

    /// The share in use, if any.
    #[cfg(test)]
    pub(crate) fn share(&self) -> Option<Grant> {
        self.share
    }

    pub(crate) fn last(&self) -> Option<Grant> {
        self.last
    }

    #[cfg(test)]
    pub(crate) fn bucket(&self) -> &LocalBucket {
        &self.bucket
    }

    /// `(rate, burst, tokens)` at `now`, after settling what ended by then.
    pub(crate) fn peek(&mut self, now: u64) -> (f64, f64, f64) {
        self.settle(now);
        let (rate, burst) = (self.bucket.rate(), self.bucket.burst());
        self.bucket.set(rate, burst, now);
        (rate, burst, self.bucket.tokens())
    }

    /// Whether the failure policy is deciding.
    pub(crate) fn in_fallback(&self) -> bool {
        self.fallback.is_some()
    }

    /// Ends what has ended by `now`: the share at the end of its window, a bounded
    /// fallback at its end. The bucket fills until that instant, then holds nothing.
    fn settle(&mut self, now: u64) {
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
    pub(crate) fn sending(&mut self, sent: u64) {
        self.settle(sent);
        let hold = sent.saturating_add(HOLD);
        self.hold_end = Some(self.hold_end.map_or(hold, |h| h.min(hold)));
    }

    /// The answer to the call sent at `sent` arrived at `now`: the new share is used until
    /// `sent + lease - margin`, and the bucket is only clamped to its burst.
    pub(crate) fn answered(&mut self, sent: u64, grant: Grant, now: u64) {
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
        self.fallback = None;
        self.allow_spent = false;
        self.last = Some(grant);
        if now < lease_end {
            // An exempt answer counts nothing: the bucket is not filled from it.
            let exempt = grant.pinned == Some(crate::PinKind::Exempt);
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

    /// The call sent at `sent` never reached Redis (the connection was refused): the
    /// server still counts the share had before, until its lease ends.
    pub(crate) fn not_sent(&mut self, now: u64) {
        self.settle(now);
        self.hold_end = None;
    }

    /// Decides on `n` tokens at `now`. `down`: Redis is believed down (the last call was an
    /// outage), so once no share may be used, the failure policy decides.
    pub(crate) fn decide(&mut self, n: f64, now: u64, down: bool, policy: &Policy) -> Local {
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
        if pinned == Some(crate::PinKind::Exempt) && self.share.is_some() {
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
                p.rate / holders,
                p.cap / holders,
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

/// The measured demand: attempted tokens per second (granted and denied) over the span since
/// the last call, so that a step either way is in the next call's want in full; `want`
/// adds `headroom`. Between calls the refresh task notes the attempts at each tick, so that
/// a demand that strays from the one last reported is seen over the latest [`RECENT`]
/// ([`Demand::drifted`]) and reported early, as its level since it moved.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Demand {
    last: Option<f64>,
    attempted: f64,
    since: u64,
    /// `(instant, attempts since the last call)` at the refresh task's ticks, over the
    /// latest [`HISTORY`].
    ticks: VecDeque<(u64, f64)>,
    /// No early call within this long of the last one: [`SHORTEST`] after a call that
    /// shrank the share (the server would answer a call within its hold from the entry,
    /// without taking the want), else 0.
    gate: u64,
}

/// Shortest span a sample is taken over: calls closer together (a holder sent back soon
/// to pick up what another frees) keep the last want and go on counting, so that a holder
/// asking a few times a second is not measured at 0 over a few milliseconds.
const MIN_SAMPLE: u64 = HOLD;
/// No early call within this long of a call that shrank the share (its hold).
pub(crate) const SHORTEST: u64 = rl_core::share::SHORTEST_PERIOD_MS * MS;
/// The span a stray is looked for over: short, so that a demand that stepped is seen soon.
const RECENT: u64 = 150 * MS;
/// A demand that strayed this far (a fraction of the one last reported) is reported early.
const DRIFT: f64 = 0.25;
/// An early report is the demand since the instant it moved (the split of the ticks that
/// fits two rates best), measured over at least this long: a mix of the old and new
/// levels would keep a holder whose demand fell holding most of what it no longer uses.
const SETTLED: u64 = 100 * MS;
/// The ticks kept to find that instant.
const HISTORY: u64 = 1000 * MS;
/// How much better (log-likelihood) two rates split at an instant must fit the ticks than
/// one rate for the demand to have moved at that instant rather than before the last call.
const SPLIT: f64 = 5.0;

/// Log-likelihood (up to terms that do not depend on the split) of `count` Poisson
/// arrivals over `span` seconds at their own rate.
fn fit(count: f64, span: f64) -> f64 {
    if count <= 0.0 || span <= 0.0 {
        0.0
    } else {
        count * (count / span).ln() - count
    }
}

impl Demand {
    pub(crate) fn new(now: u64) -> Demand {
        Demand {
            last: None,
            attempted: 0.0,
            since: now,
            ticks: VecDeque::new(),
            gate: SHORTEST,
        }
    }

    pub(crate) fn attempt(&mut self, n: f64) {
        self.attempted += n;
    }

    /// The answer to the last call shrank the holder's share (`shrank`) or not: how soon
    /// it may call early again.
    pub(crate) fn answered(&mut self, shrank: bool) {
        self.gate = if shrank { SHORTEST } else { 0 };
    }

    /// Notes this tick; answers the demand over the latest [`RECENT`] (at least), `None`
    /// within the gate or [`SETTLED`] of the last call.
    fn recent(&mut self, now: u64, pending: f64) -> Option<f64> {
        let total = self.attempted + pending;
        self.ticks.push_back((now, total));
        while self.ticks.len() > 1 && now.saturating_sub(self.ticks[1].0) >= HISTORY {
            self.ticks.pop_front();
        }
        if now.saturating_sub(self.since) < self.gate.max(SETTLED) {
            return None;
        }
        let (t, n) = (self.ticks.iter().rev())
            .find(|&&(t, _)| now.saturating_sub(t) >= RECENT)
            .copied()
            .unwrap_or((self.since, 0.0));
        Some((total - n) * NANOS_PER_SEC / now.saturating_sub(t).max(1) as f64)
    }

    /// The demand since it moved: the ticks since the last call split where two rates fit
    /// them best, the rate after the split (`None` while that is under [`SETTLED`]); the
    /// rate since the call if no split fits much better than none.
    fn since_move(&self, now: u64) -> Option<f64> {
        let &(_, total) = self.ticks.back()?;
        let (t0, n0) = if now.saturating_sub(self.since) <= HISTORY {
            (self.since, 0.0)
        } else {
            self.ticks[0]
        };
        let secs = |a: u64, b: u64| b.saturating_sub(a) as f64 / NANOS_PER_SEC;
        let mut best: Option<(f64, u64, f64)> = None;
        for &(t, n) in &self.ticks {
            if t <= t0 || t >= now {
                continue;
            }
            let score = fit(n - n0, secs(t0, t)) + fit(total - n, secs(t, now));
            if best.is_none_or(|(s, _, _)| score > s) {
                best = Some((score, t, n));
            }
        }
        match best {
            // No instant fits much better than none: the demand moved before the last call
            // (within its gate), and all of the span since is at its new level.
            Some((s, _, _)) if s - fit(total - n0, secs(t0, now)) < SPLIT => {
                Some((total - n0) / secs(t0, now).max(1e-9))
            }
            None => Some((total - n0) / secs(t0, now).max(1e-9)),
            Some((_, t, n)) => {
                (now.saturating_sub(t) >= SETTLED).then(|| (total - n) / secs(t, now))
            }
        }
    }

    /// The demand since it moved ([`Demand::since_move`]) if the recent demand strayed from
    /// the one the last call reported by more than [`DRIFT`] of it and more than chance
    /// would (three standard deviations of a Poisson count over the span): the holder
    /// calls early, so that a holder whose demand fell gives back what it no longer uses
    /// and one whose demand rose asks for it, instead of waiting a whole period.
    /// `pending`: attempts not yet added. Not while both demands are well above the
    /// holder's `share` (if it has one): its want is then above the division's level
    /// either way, and reporting it changes nothing (a tight loop's demand swings with the
    /// CPU it gets).
    pub(crate) fn drifted(&mut self, now: u64, pending: f64, share: f64) -> Option<f64> {
        let last = self.last?;
        let rate = self.recent(now, pending)?;
        if 0.0 < share * (1.0 + DRIFT) && share * (1.0 + DRIFT) < rate.min(last) {
            return None;
        }
        let span = RECENT as f64 / NANOS_PER_SEC;
        let expected = last * span;
        let gap = (rate - last).abs() * span;
        if gap > DRIFT * expected && gap > 3.0 * expected.sqrt() + 2.0 {
            self.since_move(now)
        } else {
            None
        }
    }

    /// Closes the sample since the last call and answers `sample * (1 + headroom)` (the
    /// `recent` demand instead, when the call is early for it), or `initial` before
    /// anything was measured.
    pub(crate) fn want(
        &mut self,
        now: u64,
        headroom: f64,
        initial: f64,
        recent: Option<f64>,
    ) -> f64 {
        let dt = now.saturating_sub(self.since);
        if dt >= MIN_SAMPLE || recent.is_some() {
            self.last = Some(recent.unwrap_or(self.attempted * NANOS_PER_SEC / dt as f64));
            self.attempted = 0.0;
            self.since = now;
            self.ticks.clear();
        }
        match self.last {
            None => initial,
            Some(d) => (d * (1.0 + headroom)).clamp(0.0, 1e15),
        }
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
        use crate::PinKind;
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

    #[test]
    fn want_is_the_demand_since_the_last_call_and_a_stray_is_reported_early() {
        let mut d = Demand::new(T0);
        assert_eq!(d.want(T0, 0.5, 123.0, None), 123.0, "nothing measured yet");
        // 100 attempts a second for a second: 100, with headroom 150.
        d.attempt(100.0);
        let mut now = T0 + S;
        assert!((d.want(now, 0.5, 123.0, None) - 150.0).abs() < 1e-6);
        // A step to 1000/s is in the next want in full.
        d.attempt(1000.0);
        now += S;
        assert!((d.want(now, 0.0, 0.0, None) - 1000.0).abs() < 1e-6);
        // Calls closer than the shortest sample keep the last want.
        d.attempt(1e9);
        assert!((d.want(now + MS, 0.0, 0.0, None) - 1000.0).abs() < 1e-6);
        let mut d = Demand::new(T0);
        d.attempt(1000.0);
        now = T0 + S;
        d.want(now, 0.0, 0.0, None);
        // At 1000/s, ticks every 25 ms: no stray; never within SHORTEST of the first call.
        let tick = 25 * MS;
        let mut pending = 0.0;
        for k in 1..=40u64 {
            pending += 25.0;
            assert_eq!(
                d.drifted(now + k * tick, pending, f64::INFINITY),
                None,
                "tick {k}"
            );
        }
        // The demand falls to 200/s: seen within 200 ms, reported as its level since the
        // fall (not a mix of the two, which would keep most of what the holder no longer
        // uses).
        let mut seen = None;
        for k in 41..=80u64 {
            pending += 5.0;
            if let Some(r) = d.drifted(now + k * tick, pending, f64::INFINITY) {
                seen = Some((k, r));
                break;
            }
        }
        let (k, r) = seen.expect("a fall to a fifth is reported");
        assert!(k <= 48 && (r - 200.0).abs() < 1e-6, "tick {k}: {r}");
        let mut at = now + k * tick;
        assert!((d.want(at, 0.0, 0.0, Some(r)) - r).abs() < 1e-9);
        // The answer did not shrink the share: a rise is reported early without waiting
        // out the call's hold, as soon as it is settled.
        d.answered(false);
        pending = 0.0;
        let mut seen = None;
        for k in 1..=12u64 {
            pending += 25.0;
            if let Some(r) = d.drifted(at + k * tick, pending, f64::INFINITY) {
                seen = Some((k, r));
                break;
            }
        }
        let (k, r) = seen.expect("a rise to five times is reported");
        assert!(k <= 5 && (r - 1000.0).abs() < 1e-6, "tick {k}: {r}");
        at += k * tick;
        d.want(at, 0.0, 0.0, Some(r));
        // After an answer that shrank the share, no early call within SHORTEST of the
        // call: the server would answer it from the entry (the call's hold) and not take
        // the want.
        d.answered(true);
        pending = 0.0;
        for k in 1..=11u64 {
            pending += 1.0;
            assert_eq!(
                d.drifted(at + k * tick, pending, f64::INFINITY),
                None,
                "tick {k}"
            );
        }
        assert!(d
            .drifted(at + 325 * MS, pending + 1.0, f64::INFINITY)
            .is_some());
    }
}
