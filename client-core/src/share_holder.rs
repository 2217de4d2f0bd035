//! The share holder every shell's `ShareLimiter` wraps, in two halves that never wait for
//! each other: the takers' side ([`Holder`]: the local state, the failure policy, what a
//! take gets) and the refresh side ([`Refresh`]: the demand, the next `RL.SHARE`, when to
//! call again). The refresh side reports what happened as [`Event`]s the takers' side
//! applies, in order, before its next decision: a shell keeps them in a mailbox, so that a
//! thread taking in a tight loop (holding the takers' lock) never starves the refresh.
//!
//! No I/O, no clock reads, no locks (each shell holds each half under its own, which its
//! fork handling replaces in a child). Time: nanoseconds on the shell's monotonic clock.

use crate::budget::Backend;
use crate::reply::{ProtocolError, Reply};
use crate::share::{
    parse_share, share_command, By, FailurePolicy, Grant, Policy, ShareKey, ShareState, MS,
};
use crate::share_demand::Demand;
use rl_core::pin::PinKind;

/// What the refresh side saw, for the takers' side to apply.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// A call was sent at `sent` (the old share ends at `sent + HOLD` unless answered).
    Sending { sent: u64 },
    /// The answer to the call sent at `sent` arrived at `at`.
    Answered { sent: u64, grant: Grant, at: u64 },
    /// The call was an outage; `refused`: it never left this process (the connection was
    /// refused), so the server never saw it.
    Outage { refused: bool, at: u64 },
    /// The call was answered with an error reply (or one that is not `RL.SHARE`'s): takes
    /// answer that error once no share may be used, until a call is answered.
    Failed,
}

/// What one take gets.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Take {
    pub allowed: bool,
    /// The failure policy decided (Redis down and no usable share).
    pub fallback: bool,
    /// Tokens granted: the `n` asked for, or 0.
    pub tokens: u64,
    /// Tokens left in the local bucket.
    pub remaining: f64,
    /// Until a retry may be granted (0 when granted): until `n` tokens are there at the
    /// present share; the policy's `deny_retry_after` when `Deny` decided; else a period
    /// (the next call may bring a share).
    pub retry_after: u64,
    /// Until the local bucket is full (0 with no rate).
    pub reset_after: u64,
    /// The kind of the pin behind the share used (or behind the last answer, for a block).
    pub pinned: Option<PinKind>,
}

/// Nanoseconds as whole milliseconds, rounded up (a retry never says too early).
pub fn ms_up(ns: u64) -> u64 {
    ns.div_ceil(MS)
}

impl Take {
    /// `retry_after` in milliseconds as a `Retry-After` needs it: rounded up, at least 1
    /// when denied.
    pub fn retry_after_ms(&self) -> u64 {
        if self.allowed {
            0
        } else {
            ms_up(self.retry_after).max(1)
        }
    }

    pub fn reset_after_ms(&self) -> u64 {
        ms_up(self.reset_after)
    }
}

/// What a holder holds now (`ShareLimiter::share()`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Info {
    pub rate: f64,
    pub burst: f64,
    pub tokens: f64,
    /// Live holders at the last answer (0 before any).
    pub holders: u64,
    pub fallback: bool,
    pub pinned: Option<PinKind>,
}

/// The takers' side of one holder.
#[derive(Debug, Clone, PartialEq)]
pub struct Holder {
    state: ShareState,
    policy: Policy,
    /// A period (ns): how long a denial without a share asks to wait.
    period: u64,
    deny_retry_after: u64,
    /// The last call was an outage: once no share may be used, the policy decides.
    down: bool,
    /// The last call was answered with an error reply.
    failed: bool,
    /// Tokens asked for so far (granted or denied): the demand the refresh side measures.
    attempted: u64,
}

impl Holder {
    /// A new holder at `now`: an empty bucket, no share. `period` and `deny_retry_after`
    /// in nanoseconds.
    pub fn new(policy: Policy, period: u64, deny_retry_after: u64, now: u64) -> Holder {
        Holder {
            state: ShareState::new(now),
            policy,
            period,
            deny_retry_after,
            down: false,
            failed: false,
            attempted: 0,
        }
    }

    /// Starts over as a new holder (a forked child, a closed limiter): nothing held.
    pub fn reset(&mut self, now: u64) {
        *self = Holder::new(self.policy, self.period, self.deny_retry_after, now);
    }

    pub fn apply(&mut self, event: &Event) {
        match *event {
            Event::Sending { sent } => self.state.sending(sent),
            Event::Answered { sent, grant, at } => {
                self.state.answered(sent, grant, at);
                self.down = false;
                self.failed = false;
            }
            Event::Outage { refused, at } => {
                if refused {
                    self.state.not_sent(at);
                }
                self.down = true;
            }
            Event::Failed => self.failed = true,
        }
    }

    /// Tokens asked for so far (the refresh side reads it to measure the demand).
    pub fn attempted(&self) -> u64 {
        self.attempted
    }

    /// Decides on `n` tokens at `now` from the local bucket. `None`: the last call was
    /// answered with an error reply and no share may be used any more: the shell answers
    /// that error (a share granted before it is still the server's to count, and used
    /// until it ends).
    pub fn take(&mut self, n: u64, now: u64) -> Option<Take> {
        self.attempted = self.attempted.saturating_add(n);
        if self.failed {
            self.state.settle(now);
            // No share left to use: the error is the answer.
            self.state.share()?;
        }
        let local = self.state.decide(n as f64, now, self.down, &self.policy);
        let fallback = local.by == By::Fallback;
        let retry_after = match (local.allowed, local.wait) {
            (true, _) => 0,
            (false, Some(ns)) => ns,
            (false, None) if fallback && self.policy.policy == FailurePolicy::Deny => {
                self.deny_retry_after
            }
            (false, None) => self.period,
        };
        Some(Take {
            allowed: local.allowed,
            fallback,
            tokens: if local.allowed { n } else { 0 },
            remaining: local.remaining,
            retry_after,
            reset_after: local.reset_after,
            pinned: local.pinned,
        })
    }

    /// The share held at `now`, after settling what ended by then (no take counted).
    pub fn info(&mut self, now: u64) -> Info {
        let (rate, burst, tokens) = self.state.peek(now);
        let last = self.state.last();
        Info {
            rate,
            burst,
            tokens,
            holders: last.map_or(0, |g| g.holders),
            fallback: self.state.in_fallback(),
            pinned: last.and_then(|g| g.pinned),
        }
    }
}

/// A call that reported an early demand is followed by one this soon at most, past its
/// hold, that measures the demand over the span since.
pub const CONFIRM: u64 = 400 * MS;
/// How often a shell's refresh looks at the demand between calls ([`Refresh::drifted`]):
/// a demand that moved is seen within a few ticks, and the instant it moved to within one.
pub const DRIFT_TICK: u64 = 25 * MS;

/// The refresh side of one holder: what the next `RL.SHARE` asks for and when it goes.
#[derive(Debug, Clone, PartialEq)]
pub struct Refresh {
    key: ShareKey,
    headroom: f64,
    demand: Demand,
    /// The attempts already counted in `demand`.
    counted: u64,
    /// The recent demand, when it strayed from the one the last call reported: the next
    /// call is early, and reports it.
    early: Option<f64>,
    /// The call under way reports an early demand (measured over a short span).
    confirm: bool,
    /// The share the last answer granted (tokens per second).
    granted: f64,
    /// The last call was answered (a stray in demand is no reason to call in an outage).
    answered_last: bool,
}

impl Refresh {
    /// The refresh side of a holder of `key`, at `now`; `headroom` as `want = demand * (1 +
    /// headroom)`.
    pub fn new(key: ShareKey, headroom: f64, now: u64) -> Refresh {
        Refresh {
            key,
            headroom,
            demand: Demand::new(now),
            counted: 0,
            early: None,
            confirm: false,
            granted: 0.0,
            answered_last: false,
        }
    }

    /// Starts over as a new holder at `now` whose takers asked for `attempted` so far.
    pub fn reset(&mut self, now: u64, attempted: u64) {
        *self = Refresh {
            counted: attempted,
            ..Refresh::new(self.key.clone(), self.headroom, now)
        };
    }

    pub fn key(&self) -> &ShareKey {
        &self.key
    }

    /// The call to send at `now` for `holder`, whose takers asked for `attempted` tokens so
    /// far, with the measured demand as its want; and the event the takers apply first.
    pub fn send(
        &mut self,
        backend: Backend,
        holder: &[u8],
        attempted: u64,
        now: u64,
    ) -> (Vec<Vec<u8>>, Event) {
        self.demand
            .attempt(attempted.saturating_sub(self.counted) as f64);
        self.counted = attempted;
        let early = self.early.take();
        self.confirm = early.is_some();
        self.answered_last = false;
        let want = self.demand.want(now, self.headroom, self.key.rate, early);
        let cmd = share_command(backend, &self.key, holder, want, false);
        (cmd, Event::Sending { sent: now })
    }

    /// `RL.SHARE ... RELEASE` for `holder`: the share given back (its reply is read with
    /// [`parse_share`]).
    pub fn release_command(&self, backend: Backend, holder: &[u8]) -> Vec<Vec<u8>> {
        share_command(backend, &self.key, holder, 0.0, true)
    }

    /// The reply to the call sent at `sent` arrived at `at`: the event for the takers and
    /// how long until the next call (`jitter` in `[0, 1)`: up to 10 % early, so that a
    /// fleet does not call in step). A reply that is not `RL.SHARE`'s is a
    /// [`ProtocolError`] and changes nothing here (the shell reports [`Event::Failed`]
    /// with [`Refresh::failed`]).
    pub fn answered(
        &mut self,
        reply: &Reply,
        sent: u64,
        at: u64,
        jitter: f64,
    ) -> Result<(Event, u64), ProtocolError> {
        if let Reply::Error(text) = reply {
            return Err(ProtocolError(format!("RL.SHARE: an error reply {text:?}")));
        }
        let grant = parse_share(reply)?;
        self.demand.answered(grant.rate < self.granted);
        self.granted = grant.rate;
        self.answered_last = true;
        Ok((
            Event::Answered { sent, grant, at },
            self.next_after(&grant, jitter),
        ))
    }

    /// When to call again after `grant`: when the server says, at most its period (a third
    /// of the lease: it raises a short one, so that no call comes within the previous
    /// call's hold; a server raises a period to 300 ms and no further, so a longer lease,
    /// not one of ours, is no reason to call less often than asked: the want would go
    /// stale). A little early rather than late: the server counts on a call per period.
    fn next_after(&self, grant: &Grant, jitter: f64) -> u64 {
        let raised = (grant.lease / 3).min(rl_core::share::SHORTEST_PERIOD_MS * MS);
        let mut most = raised.max(self.key.period_ms.saturating_mul(MS));
        if self.confirm {
            // An early report measured its demand over a short span (a holder whose demand
            // fell, measured low, would be refused for a whole period): once past its
            // hold, it is measured again over the span since.
            most = most.min(CONFIRM);
        }
        let next = grant.refresh.clamp(10 * MS, most.max(10 * MS));
        // A draw that is not a number is none: never a call at once.
        let jitter = if jitter.is_finite() {
            jitter.clamp(0.0, 1.0)
        } else {
            0.0
        };
        let early = 1.0 - 0.1 * jitter;
        (next as f64 * early) as u64
    }

    /// The call was an outage at `at` (`refused`: it never left this process): the event,
    /// and the next call after `probe` (the retry interval while Redis is down), at most a
    /// period.
    pub fn outage(&mut self, refused: bool, at: u64, probe: u64) -> (Event, u64) {
        self.answered_last = false;
        let period = self.key.period_ms.saturating_mul(MS);
        (Event::Outage { refused, at }, probe.min(period))
    }

    /// The call was answered with an error reply (or a malformed one): the event, and the
    /// next call a period later.
    pub fn failed(&mut self) -> (Event, u64) {
        self.answered_last = false;
        (Event::Failed, self.key.period_ms.saturating_mul(MS))
    }

    /// Whether to call before the next call is due, at `now`, with `attempted` asked for
    /// so far: the last call was answered and the demand since strayed from what it
    /// reported (the next call reports the recent demand). A shell asks every
    /// [`DRIFT_TICK`].
    pub fn drifted(&mut self, now: u64, attempted: u64) -> bool {
        if !self.answered_last {
            return false;
        }
        let pending = attempted.saturating_sub(self.counted) as f64;
        self.early = self.demand.drifted(now, pending, self.granted);
        self.early.is_some()
    }
}
