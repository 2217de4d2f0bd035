//! The prefetch ledger: the lease state machine of every shell's `PrefetchLimiter`. It holds
//! the leases a limiter spends from (at most two: the one being spent and the next), decides
//! a take from them, says when to lease the next batch (a jittered threshold, the random
//! draw passed in) and what the call sends (settling the older lease in it:
//! `RL.LEASE ... RETURN id unused`), decides what a landed lease brings (installed, or
//! returned when it landed after `sent + ttl` or after `close`), what a failed call leaves,
//! and serves the takes waiting for a call in arrival order. Time is passed in (nanoseconds
//! on the shell's monotonic clock); the shell moves the bytes, waits and locks.
//!
//! The rules it keeps:
//! - a lease is spent only until `sent + ttl` (`sent`: when the call that opened it was
//!   sent), earlier than the server's expiry whatever the clocks say;
//! - at most two leases are held, and one call is in the air at a time (one older than the
//!   late-reply bound, [`late_reply_bound`], is given up on; what it brings then is past its
//!   TTL and goes back);
//! - nothing is granted that was not leased: a lease taken out to be settled is no longer
//!   spent from, and a malformed reply puts nothing back;
//! - every lease that can be neither installed nor returned is counted in `leases_lost`.

use std::collections::VecDeque;

use rl_core::Nanos;

use crate::budget::Backend;
use crate::lease::{lease_command, parse_lease, return_command, LeaseTarget};
use crate::reply::{ProtocolError, Reply};

const MS: Nanos = 1_000_000;
const SEC: Nanos = 1_000_000_000;

/// The least a call's late reply is awaited (after its caller gave up on it): a reply
/// within the bound is read (a lease installed or returned, a take refunded), one beyond it
/// is counted lost. The Rust client's takes and permits use it as their own bound.
pub const LATE_REPLY_FLOOR: Nanos = 10 * SEC;

/// How long past a lease call's own bound a take waiting behind it waits at most.
pub const LATE_SLACK: Nanos = SEC;

/// How long a lease call's reply is awaited at most, whoever waits for it:
/// `max(10 s, ttl + timeout + 1 s)`. Past `ttl` (from when it was sent) a lease is no longer
/// spent, so a reply landing after the bound is returned, never installed: giving up on a
/// call at the bound and sending the next can never leave three leases held; and the
/// floor gives a slow network time to hand a late lease back rather than lose it.
pub fn late_reply_bound(timeout: Nanos, ttl_ms: u64) -> Nanos {
    ttl_ms
        .saturating_mul(MS)
        .saturating_add(timeout)
        .saturating_add(SEC)
        .max(LATE_REPLY_FLOOR)
}

/// What a prefetching limiter is configured with.
#[derive(Debug, Clone, PartialEq)]
pub struct LedgerConfig {
    /// Tokens asked for per lease (a take of more asks for its own size).
    pub batch: u64,
    pub ttl_ms: u64,
    /// Renew when the tokens held fall to this fraction of the batch, in `[0, 1)`.
    pub renew_at: f64,
    /// The threshold's spread, a fraction of the batch in `[0, 1]`, drawn for every lease.
    pub jitter: f64,
    /// The caller's timeout (0: none), for [`late_reply_bound`].
    pub timeout: Nanos,
}

/// A lease as the client holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    pub id: u64,
    pub left: u64,
    /// When the client stops spending it: the send time of the call plus the TTL.
    pub expires: Nanos,
}

/// A take's decision from what the ledger holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Local {
    /// Granted from the held leases, `left` tokens held after it; `renew`: the shell should
    /// lease the next batch now ([`Ledger::begin`] with `need` 0).
    Granted { left: u64, renew: bool },
    /// Redis said lately that this many tokens are not there until then.
    Denied { retry_after_ms: u64 },
    /// Redis must be asked.
    Ask,
}

/// What [`Ledger::begin`] says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Begin {
    /// Send `command`; report its end as flight `flight`.
    Send { flight: u64, command: Vec<Vec<u8>> },
    /// Flight `flight` is in the air: wait for it (in line), then look again.
    Busy { flight: u64 },
    /// Closed: nothing is leased.
    Closed,
}

/// How a failed lease call failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// An error reply: the server refused the call and changed nothing.
    Refused,
    /// Never reached the server's state (a refused connection, `LOADING`, `READONLY`...).
    NotSent,
    /// The outcome is unknown: it may have run, its reply was lost (a timeout, a reset or
    /// close after the write).
    Unknown,
}

/// What a landed lease call decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Landed {
    /// Installed. `served`: the tokens its waiter asked for were spent for it (`left`
    /// tokens held after that).
    Granted { served: bool, left: u64 },
    /// Redis had fewer than `MIN` tokens until `retry_after_ms` from now.
    Denied { retry_after_ms: u64 },
    /// Arrived at or after `sent + ttl`: nothing spent, returned.
    Stale,
    /// Arrived after `close`: nothing spent, returned.
    Closed,
}

/// A landed call's decision and the leases to return (`RL.RETURN`: [`Ledger::return_of`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Landing {
    pub landed: Landed,
    pub give_back: Vec<Lease>,
}

/// Whether a take waiting behind someone else's call may stop waiting for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Judged {
    /// The call is young enough: wait on.
    Wait,
    /// It ended (look at the ledger again).
    Ended,
    /// Its own caller found it an outage, or it is older than the limit; `first`: judged
    /// so now (count the timeout once).
    Outage { first: bool },
}

/// The ledger's counters, drained by the shell into its metrics ([`Ledger::drain`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LedgerCounters {
    pub leases: u64,
    pub lease_tokens: u64,
    pub leases_denied: u64,
    /// Leases that reached their end with tokens left (or landed after it).
    pub leases_expired: u64,
    /// Leases neither installed nor returned, and calls whose outcome is unknown.
    pub leases_lost: u64,
    /// Settles and returns made, and the tokens they gave back.
    pub returns: u64,
    pub tokens_returned: u64,
    /// Lease calls judged slow (an outage) while still in the air.
    pub slow_calls: u64,
    /// Takes granted by [`Ledger::grant`] (a shell's hot path, counted here rather than
    /// under a lock of the shell's), and their tokens.
    pub memory_grants: u64,
    pub memory_tokens: u64,
}

#[derive(Debug, Clone)]
struct Flight {
    id: u64,
    need: u64,
    /// The older lease, taken out of the state to be settled by this call.
    settle: Option<Lease>,
    sent: Nanos,
    /// A caller waits for `need` tokens from it.
    waiting: bool,
    /// Its own caller gave up on it, or a waiter judged it past its limit.
    judged: bool,
    /// Ended, and (if it served its waiter) the tokens spent for it, still unclaimed.
    ended: Option<Option<u64>>,
}

/// The lease state machine of one limiter. Plain data: no I/O, no clock reads, no locks (the
/// shell holds it under its own, which a fork handler can replace).
#[derive(Debug, Clone)]
pub struct Ledger {
    target: LeaseTarget,
    config: LedgerConfig,
    /// The previous lease, spent first (it expires first); settled by the next call.
    older: Option<Lease>,
    newer: Option<Lease>,
    /// Renew when at most this many tokens are left.
    threshold: u64,
    /// Calls in the air, the current one last; older ones were given up on.
    flights: Vec<Flight>,
    next_flight: u64,
    /// Calls ended so far.
    ended: u64,
    /// Redis said `n` tokens are not there until then: takes of `n` or more are denied
    /// without asking; smaller ones still ask.
    denied: Option<(u64, Nanos)>,
    closed: bool,
    /// Takes waiting for a call, `(waiter, n)` in arrival order.
    line: VecDeque<(u64, u64)>,
    next_waiter: u64,
    counters: LedgerCounters,
    /// A counter moved since the last drain.
    counted: bool,
}

/// The most calls kept that were given up on and may still land.
const MAX_FLIGHTS: usize = 64;

impl Ledger {
    /// A ledger leasing from `target`. Errs on a configuration no lease could serve.
    pub fn new(target: LeaseTarget, config: LedgerConfig) -> Result<Ledger, String> {
        if config.batch == 0 {
            return Err("batch must be positive".into());
        }
        if config.batch as f64 > target.cap {
            return Err("batch must not exceed cap".into());
        }
        if config.ttl_ms == 0 {
            return Err("ttl must be at least 1 ms".into());
        }
        if !(0.0..1.0).contains(&config.renew_at) {
            return Err("renew_at must be in [0, 1)".into());
        }
        if !(0.0..=1.0).contains(&config.jitter) {
            return Err("jitter must be in [0, 1]".into());
        }
        Ok(Ledger {
            target,
            config,
            older: None,
            newer: None,
            threshold: 0,
            flights: Vec::new(),
            next_flight: 1,
            ended: 0,
            denied: None,
            closed: false,
            line: VecDeque::new(),
            next_waiter: 1,
            counters: LedgerCounters::default(),
            counted: false,
        })
    }

    pub fn target(&self) -> &LeaseTarget {
        &self.target
    }

    pub fn config(&self) -> &LedgerConfig {
        &self.config
    }

    /// How long a lease call's reply is awaited ([`late_reply_bound`]).
    pub fn late_bound(&self) -> Nanos {
        late_reply_bound(self.config.timeout, self.config.ttl_ms)
    }

    /// Refuses what the server refuses for every state of the bucket.
    pub fn check(&self, n: u64) -> Result<(), &'static str> {
        if n == 0 {
            return Err("n must be positive");
        }
        if n as f64 > self.target.cap {
            return Err("n must not exceed cap");
        }
        Ok(())
    }

    pub fn closed(&self) -> bool {
        self.closed
    }

    /// A call is in the air.
    pub fn in_flight(&self) -> bool {
        self.flights.iter().any(|f| f.ended.is_none())
    }

    /// Calls ended so far (a waiter compares it with what it saw).
    pub fn calls_ended(&self) -> u64 {
        self.ended
    }

    /// The renewal threshold drawn for the lease held.
    pub fn threshold(&self) -> u64 {
        self.threshold
    }

    /// The counters since the last drain, zeroed.
    pub fn drain(&mut self) -> LedgerCounters {
        self.counted = false;
        std::mem::take(&mut self.counters)
    }

    /// Whether a counter moved since the last drain (a shell's hot path drains only then).
    pub fn counted(&self) -> bool {
        self.counted
    }

    fn count(&mut self) -> &mut LedgerCounters {
        self.counted = true;
        &mut self.counters
    }

    /// The counters since the last drain.
    pub fn counters(&self) -> LedgerCounters {
        self.counters
    }

    fn drop_expired(&mut self, now: Nanos) {
        let mut expired = 0;
        for slot in [&mut self.older, &mut self.newer] {
            if let Some(l) = slot {
                if l.expires <= now {
                    expired += u64::from(l.left > 0);
                    *slot = None;
                }
            }
        }
        if expired > 0 {
            self.count().leases_expired += expired;
        }
    }

    fn left(&self) -> u64 {
        self.older.map_or(0, |l| l.left) + self.newer.map_or(0, |l| l.left)
    }

    /// Tokens held at `now` (unexpired leftovers).
    pub fn held(&mut self, now: Nanos) -> u64 {
        self.drop_expired(now);
        self.left()
    }

    /// The leases held, older first (for a shell's fast path and for tests).
    pub fn leases(&self) -> (Option<Lease>, Option<Lease>) {
        (self.older, self.newer)
    }

    /// Spends `n` from the leases, older first; the caller checked they hold it.
    fn spend_held(&mut self, n: u64) {
        let mut due = n;
        for lease in [&mut self.older, &mut self.newer].into_iter().flatten() {
            let part = due.min(lease.left);
            lease.left -= part;
            due -= part;
        }
    }

    fn denied_for(&self, n: u64, now: Nanos) -> Option<u64> {
        let (size, until) = self.denied?;
        if n < size || until <= now {
            return None;
        }
        Some((until - now).div_ceil(MS).max(1))
    }

    /// A take of `n` at `now` from what is held: granted, denied by a recent denial of this
    /// size or less, or to ask Redis. A grant says whether to renew (`down`: the failure
    /// policy believes Redis down, so no renewal is started).
    pub fn take(&mut self, n: u64, now: Nanos, down: bool) -> Local {
        self.drop_expired(now);
        let held = self.left();
        if n > 0 && held >= n {
            self.spend_held(n);
            let left = held - n;
            return Local::Granted {
                left,
                renew: left <= self.threshold && self.renewal_due(now, down),
            };
        }
        match self.denied_for(n, now) {
            Some(retry_after_ms) => Local::Denied { retry_after_ms },
            None => Local::Ask,
        }
    }

    /// A take served from memory with nothing else to do (the hot path of a shell): granted
    /// when the held leases have `n` and the batch stays above the renewal threshold after
    /// it; `None` changes nothing (the shell's full path, [`Ledger::take`], decides).
    pub fn grant(&mut self, n: u64, now: Nanos) -> Option<u64> {
        let fresh = [self.older, self.newer]
            .into_iter()
            .flatten()
            .all(|l| l.expires > now);
        let left = self.left().checked_sub(n)?;
        if n == 0 || !fresh || left <= self.threshold {
            return None;
        }
        self.spend_held(n);
        self.count().memory_grants += 1;
        self.count().memory_tokens += n;
        Some(left)
    }

    /// Whether to lease the next batch now: the tokens held are at the threshold, no call is
    /// in the air, Redis did not deny lately, the failure policy does not believe it down
    /// (`down`), and the ledger is open.
    pub fn renewal_due(&self, now: Nanos, down: bool) -> bool {
        self.left() <= self.threshold
            && !self.in_flight()
            && self.denied_for(1, now).is_none()
            && !down
            && !self.closed
    }

    /// Puts back `tokens` granted to a take that never got them (its caller gone).
    ///
    /// They go to the newest lease held, which may not be the one they came from (a call
    /// landed meanwhile): nothing is minted by it (they were debited once, and the server
    /// credits a settle at most what the lease it names was granted), but they may then be
    /// spent after their own lease's `sent + ttl`, up to the newer one's: a shift in time of
    /// tokens already counted, within the fleet bound. With no live lease they are dropped.
    pub fn unspend(&mut self, tokens: u64, now: Nanos) {
        self.drop_expired(now);
        if let Some(lease) = self.newer.as_mut().or(self.older.as_mut()) {
            lease.left += tokens;
        }
    }

    /// A lease call for `need` tokens (0: a renewal nobody waits for) at `now`, unless one
    /// is in the air younger than the late-reply bound: the older lease is taken out of the
    /// state and settled by it (a lease of id 0 debited nothing and is dropped).
    pub fn begin(&mut self, backend: Backend, need: u64, now: Nanos) -> Begin {
        if self.closed {
            return Begin::Closed;
        }
        let bound = self.late_bound();
        if let Some(busy) = self
            .flights
            .iter()
            .rev()
            .find(|f| f.ended.is_none() && now.saturating_sub(f.sent) < bound)
        {
            return Begin::Busy { flight: busy.id };
        }
        if self.flights.len() >= MAX_FLIGHTS {
            // Calls given up on long ago that never ended (their shells lost them): their
            // leases are past their TTL on the server by now.
            self.flights.remove(0);
        }
        self.drop_expired(now);
        let settle = self.older.take();
        let returned = settle.filter(|l| l.id != 0);
        let ask = self.config.batch.max(need);
        let command = lease_command(
            backend,
            &self.target,
            ask,
            self.config.ttl_ms,
            need.max(1),
            returned.map(|l| (l.id, l.left)),
        );
        let id = self.next_flight;
        self.next_flight += 1;
        self.flights.push(Flight {
            id,
            need,
            settle: returned,
            sent: now,
            waiting: need > 0,
            judged: false,
            ended: None,
        });
        Begin::Send {
            flight: id,
            command,
        }
    }

    fn flight(&mut self, id: u64) -> Option<&mut Flight> {
        self.flights.iter_mut().find(|f| f.id == id)
    }

    /// Ends flight `id` (kept while its waiter may still claim or give back what it got).
    fn end(&mut self, id: u64, served: Option<u64>) -> Option<Flight> {
        self.ended += 1;
        let at = self.flights.iter().position(|f| f.id == id)?;
        let f = self.flights[at].clone();
        if served.is_some() {
            self.flights[at].ended = Some(served);
        } else {
            self.flights.remove(at);
        }
        Some(f)
    }

    /// Flight `id` was answered with `reply` at `now`; `draw`: a uniform number in `[0, 1)`
    /// for the next renewal threshold. A malformed reply is a [`ProtocolError`]: the call
    /// ran, so the lease it settled is gone and what it leased cannot be named (counted
    /// lost); nothing is installed.
    pub fn landed(
        &mut self,
        id: u64,
        reply: &Reply,
        now: Nanos,
        draw: f64,
    ) -> Result<Landing, ProtocolError> {
        let parsed = parse_lease(reply).and_then(|r| {
            let ask = self
                .flights
                .iter()
                .find(|f| f.id == id)
                .map_or(u64::MAX, |f| self.config.batch.max(f.need));
            if r.tokens > ask {
                Err(ProtocolError(format!(
                    "RL.LEASE granted {} tokens, more than the {ask} asked for",
                    r.tokens
                )))
            } else {
                Ok(r)
            }
        });
        let r = match parsed {
            Ok(r) => r,
            Err(e) => {
                if let Some(f) = self.end(id, None) {
                    if f.settle.is_some_and(|l| l.left > 0) {
                        self.count().leases_lost += 1;
                    }
                }
                self.count().leases_lost += 1;
                return Err(e);
            }
        };
        let Some(f) = self.flights.iter().find(|f| f.id == id).cloned() else {
            // Not a call of this ledger (a fork's parent sent it, or it ended already):
            // nothing is spent from it; it goes back.
            self.ended += 1;
            let give_back = (r.tokens > 0 && r.id != 0)
                .then_some(Lease {
                    id: r.id,
                    left: r.tokens,
                    expires: now,
                })
                .into_iter()
                .collect();
            return Ok(Landing {
                landed: Landed::Stale,
                give_back,
            });
        };
        if let Some(s) = f.settle {
            self.count().returns += 1;
            self.count().tokens_returned += s.left;
        }
        if r.tokens == 0 {
            self.end(id, None);
            self.count().leases_denied += 1;
            let size = f.need.max(1);
            let until = now.saturating_add(r.retry_after_ms.saturating_mul(MS));
            // Keep the smallest size known to be denied.
            if self.denied.is_none_or(|(s, u)| size <= s || u <= now) {
                self.denied = Some((size, until));
            }
            return Ok(Landing {
                landed: Landed::Denied {
                    retry_after_ms: r.retry_after_ms,
                },
                give_back: Vec::new(),
            });
        }
        self.count().leases += 1;
        self.count().lease_tokens += r.tokens;
        let ttl_ms = self.config.ttl_ms.min(r.ttl_ms);
        let mut lease = Lease {
            id: r.id,
            left: r.tokens,
            expires: f.sent.saturating_add(ttl_ms.saturating_mul(MS)),
        };
        let current = self.flights.last().is_some_and(|c| c.id == id);
        if now >= lease.expires || self.closed || !current {
            self.end(id, None);
            if now >= lease.expires || !current {
                self.count().leases_expired += 1;
            }
            let give_back = (lease.id != 0).then_some(lease).into_iter().collect();
            let landed = if self.closed {
                Landed::Closed
            } else {
                Landed::Stale
            };
            return Ok(Landing { landed, give_back });
        }
        let served = f.waiting && f.need <= lease.left;
        if served {
            lease.left -= f.need;
        }
        let mut give_back = Vec::new();
        // The older lease went out with this call; only calls (one at a time) put leases
        // in: never more than two held.
        if let Some(previous) = self.older.take() {
            if previous.id != 0 {
                give_back.push(previous);
            }
        }
        self.older = self.newer.replace(lease);
        self.threshold = self.draw_threshold(draw);
        self.denied = None;
        self.end(id, served.then_some(f.need));
        Ok(Landing {
            landed: Landed::Granted {
                served,
                left: self.left(),
            },
            give_back,
        })
    }

    fn draw_threshold(&self, draw: f64) -> u64 {
        let batch = self.config.batch as f64;
        let draw = if draw.is_finite() {
            draw.clamp(0.0, 1.0)
        } else {
            0.5
        };
        let at = self.config.renew_at * batch + self.config.jitter * batch * (2.0 * draw - 1.0);
        at.clamp(0.0, batch - 1.0).round() as u64
    }

    /// Flight `id` failed as `failure` at `now`. An error reply or a call never sent
    /// changed nothing: the lease it would have settled comes back (or is returned when the
    /// limiter closed meanwhile). An unknown outcome loses it, and maybe the lease the call
    /// asked for (counted). Returns the leases to give back.
    pub fn failed(&mut self, id: u64, failure: Failure, now: Nanos) -> Vec<Lease> {
        let Some(f) = self.end(id, None) else {
            return Vec::new();
        };
        let mut give_back = Vec::new();
        match failure {
            Failure::Unknown => {
                self.count().leases_lost += 1;
                if f.settle.is_some_and(|l| l.left > 0) {
                    self.count().leases_lost += 1;
                }
            }
            Failure::Refused | Failure::NotSent => {
                if let Some(s) = f.settle.filter(|s| s.expires > now) {
                    if !self.closed && self.older.is_none() {
                        self.older = Some(s);
                    } else {
                        give_back.push(s);
                    }
                }
            }
        }
        give_back
    }

    /// The waiter of flight `id` stopped waiting at its timeout: the call is judged slow (an
    /// outage for the waiters behind it). Answers the tokens spent for it if the call landed
    /// and served it meanwhile (the waiter takes them: a grant), else `None` (the call goes
    /// on and installs whole what it brings).
    pub fn give_up(&mut self, id: u64) -> Option<u64> {
        let f = self.flight(id)?;
        if let Some(served) = f.ended {
            let served = served?;
            self.flights.retain(|f| f.id != id);
            return Some(served);
        }
        f.waiting = false;
        if !f.judged {
            f.judged = true;
            self.count().slow_calls += 1;
        }
        None
    }

    /// The tokens flight `id` spent for its waiter when it landed, taken by the waiter (a
    /// grant); `None` if it has not landed or did not serve it (the waiter looks at the
    /// ledger again).
    pub fn claim(&mut self, id: u64) -> Option<u64> {
        let at = self.flights.iter().position(|f| f.id == id)?;
        let served = self.flights[at].ended?;
        self.flights.remove(at);
        served
    }

    /// Whether flight `id` has ended (landed or failed).
    pub fn has_ended(&self, id: u64) -> bool {
        self.flights
            .iter()
            .find(|f| f.id == id)
            .is_none_or(|f| f.ended.is_some())
    }

    /// The waiter of flight `id` will not take what it brings (cancelled, or it read its
    /// grant from the landing): `claimed` says it took what was spent for it; otherwise
    /// that goes back into the lease.
    pub fn release(&mut self, id: u64, claimed: bool, now: Nanos) {
        let Some(f) = self.flight(id) else {
            return;
        };
        match f.ended {
            None => f.waiting = false,
            Some(served) => {
                self.flights.retain(|f| f.id != id);
                if let (Some(tokens), false) = (served, claimed) {
                    self.unspend(tokens, now);
                }
            }
        }
    }

    /// Whether a take waiting behind flight `id` since before `now` may stop waiting: the
    /// call ended, its caller judged it, or it has been in the air `limit` (an outage,
    /// counted once).
    pub fn judge(&mut self, id: u64, now: Nanos, limit: Nanos) -> Judged {
        let Some(f) = self.flights.iter_mut().find(|f| f.id == id) else {
            return Judged::Ended;
        };
        if f.ended.is_some() {
            return Judged::Ended;
        }
        if f.judged {
            return Judged::Outage { first: false };
        }
        if now.saturating_sub(f.sent) < limit {
            return Judged::Wait;
        }
        f.judged = true;
        self.count().slow_calls += 1;
        Judged::Outage { first: true }
    }

    /// Closes the ledger at `now`: nothing more is leased; answers the live leases to
    /// return (a call in the air returns its own when it lands).
    pub fn close(&mut self, now: Nanos) -> Vec<Lease> {
        self.closed = true;
        self.drop_expired(now);
        [self.older.take(), self.newer.take()]
            .into_iter()
            .flatten()
            .filter(|l| l.id != 0)
            .collect()
    }

    /// Forgets every lease and call (a forked child: what its parent holds is the parent's
    /// to spend and return).
    pub fn forget(&mut self) {
        self.older = None;
        self.newer = None;
        self.flights.clear();
        self.line.clear();
        self.denied = None;
    }

    /// The command that returns `lease`'s leftovers.
    pub fn return_of(&self, backend: Backend, lease: &Lease) -> Vec<Vec<u8>> {
        return_command(backend, &self.target.key, lease.id, lease.left)
    }

    /// A return of `lease` ended: `ok` when Redis answered it (counted in `returns`), else
    /// the lease is lost.
    pub fn returned(&mut self, lease: &Lease, ok: bool) {
        if ok {
            self.count().returns += 1;
            self.count().tokens_returned += lease.left;
        } else {
            self.count().leases_lost += 1;
        }
    }

    /// A take of `n` stands in line for a call (at the front: a take woken to ask Redis);
    /// answers its number. `again`: its number from before, to stand at its old place.
    pub fn enter_line(&mut self, n: u64, front: bool, again: Option<u64>) -> u64 {
        let id = again.unwrap_or_else(|| {
            let id = self.next_waiter;
            self.next_waiter += 1;
            id
        });
        // A new number is above every number in line: it goes to the back at no cost (the
        // scans below are for a take coming back, so 10,000 waiting takes stay cheap).
        if again.is_some() && self.line.iter().any(|&(w, _)| w == id) {
            return id;
        }
        if front {
            self.line.push_front((id, n));
        } else if again.is_none() {
            self.line.push_back((id, n));
        } else {
            let at = self
                .line
                .iter()
                .position(|&(w, _)| w > id)
                .unwrap_or(self.line.len());
            self.line.insert(at, (id, n));
        }
        id
    }

    /// Waiter `id` left the line (served, timed out, cancelled). Answers the waiter to wake
    /// in its place when no call is in the air (it would otherwise wait for a call nobody
    /// makes).
    pub fn leave_line(&mut self, id: u64) -> Option<u64> {
        // Served in arrival order, the one leaving is mostly the first: no scan for it.
        if self.line.front().is_some_and(|&(w, _)| w == id) {
            self.line.pop_front();
        } else {
            self.line.retain(|&(w, _)| w != id);
        }
        if self.in_flight() {
            None
        } else {
            self.line.pop_front().map(|(w, _)| w)
        }
    }

    /// After a call ended, the waiters to wake, taken out of the line: when it installed
    /// tokens, those the held tokens serve in arrival order and the first they do not
    /// (which asks Redis next); else everyone (each reads the outcome).
    pub fn wake(&mut self, granted: bool) -> Vec<u64> {
        if !granted {
            return self.line.drain(..).map(|(w, _)| w).collect();
        }
        let mut budget = self.left();
        let mut woken = Vec::new();
        while let Some((w, n)) = self.line.pop_front() {
            woken.push(w);
            if n > budget {
                break;
            }
            budget -= n;
        }
        woken
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ledger(batch: u64, ttl_ms: u64) -> Ledger {
        Ledger::new(
            LeaseTarget {
                key: b"k".to_vec(),
                rate: 10.0,
                cap: 100.0,
                init: None,
                version: None,
            },
            LedgerConfig {
                batch,
                ttl_ms,
                renew_at: 0.2,
                jitter: 0.1,
                timeout: 200 * MS,
            },
        )
        .unwrap()
    }

    fn lease_reply(tokens: i64, id: i64, ttl_ms: i64, retry: i64) -> Reply {
        Reply::Array(vec![
            Reply::Int(tokens),
            Reply::Int(id),
            Reply::Int(ttl_ms),
            Reply::Int(retry),
        ])
    }

    #[test]
    fn the_late_reply_bound_covers_the_lease() {
        assert_eq!(late_reply_bound(200 * MS, 2000), 10 * SEC);
        assert_eq!(late_reply_bound(2 * SEC, 60_000), 63 * SEC);
        assert_eq!(late_reply_bound(u64::MAX, u64::MAX), u64::MAX);
    }

    #[test]
    fn thresholds_spread_around_renew_at_within_the_batch() {
        let mut l = ledger(100, 1000);
        let mut seen = std::collections::BTreeSet::new();
        for i in 0..=100 {
            let t = l.draw_threshold(f64::from(i) / 100.0);
            assert!((10..=30).contains(&t), "{t}");
            seen.insert(t);
        }
        assert_eq!((seen.first(), seen.last()), (Some(&10), Some(&30)));
        assert_eq!(l.draw_threshold(f64::NAN), 20);
        l.config.jitter = 1.0;
        assert_eq!((l.draw_threshold(0.0), l.draw_threshold(1.0)), (0, 99));
    }

    #[test]
    fn bad_configurations_are_refused() {
        let t = ledger(10, 1000).target().clone();
        let c = ledger(10, 1000).config().clone();
        for bad in [
            LedgerConfig {
                batch: 0,
                ..c.clone()
            },
            LedgerConfig {
                batch: 101,
                ..c.clone()
            },
            LedgerConfig {
                ttl_ms: 0,
                ..c.clone()
            },
            LedgerConfig {
                renew_at: 1.0,
                ..c.clone()
            },
            LedgerConfig {
                jitter: f64::NAN,
                ..c.clone()
            },
        ] {
            assert!(Ledger::new(t.clone(), bad).is_err());
        }
    }

    #[derive(Debug, Clone)]
    enum Event {
        Take(u64),
        Begin(u64),
        Land(usize, Reply),
        Fail(usize, u8),
        GiveUp(usize),
        Release(usize, bool),
        Close,
        Tick(u64),
    }

    fn any_reply() -> impl Strategy<Value = Reply> {
        prop_oneof![
            (0i64..40, 0i64..5, 0i64..3000, 0i64..500)
                .prop_map(|(t, i, ttl, r)| lease_reply(t, i, ttl, r)),
            any::<i64>().prop_map(Reply::Int),
            Just(Reply::Nil),
            Just(Reply::Error("ERR too many live leases".into())),
            proptest::collection::vec(any::<i64>().prop_map(Reply::Int), 0..6)
                .prop_map(Reply::Array),
        ]
    }

    fn any_event() -> impl Strategy<Value = Event> {
        prop_oneof![
            (1u64..30).prop_map(Event::Take),
            (0u64..30).prop_map(Event::Begin),
            (0usize..4, any_reply()).prop_map(|(f, r)| Event::Land(f, r)),
            (0usize..4, 0u8..3).prop_map(|(f, k)| Event::Fail(f, k)),
            (0usize..4).prop_map(Event::GiveUp),
            (0usize..4, any::<bool>()).prop_map(|(f, c)| Event::Release(f, c)),
            Just(Event::Close),
            (0u64..1500).prop_map(Event::Tick),
        ]
    }

    /// The waiting line as it was written first (a scan per step), the model of the fast one.
    #[derive(Default)]
    struct LineModel {
        line: VecDeque<(u64, u64)>,
    }

    impl LineModel {
        fn enter(&mut self, id: u64, n: u64, front: bool) {
            if self.line.iter().any(|&(w, _)| w == id) {
                return;
            }
            if front {
                self.line.push_front((id, n));
            } else {
                let at = self.line.iter().position(|&(w, _)| w > id);
                self.line.insert(at.unwrap_or(self.line.len()), (id, n));
            }
        }
    }

    proptest! {
        /// The line's shortcuts (a new take to the back, the first leaving without a scan)
        /// keep exactly the order the scans gave, whatever takes enter, come back and leave.
        #[test]
        fn the_line_keeps_arrival_order(ops in proptest::collection::vec((0u8..4, 0usize..8, 1u64..5, any::<bool>()), 0..200)) {
            let mut l = ledger(10, 1000);
            let mut model = LineModel::default();
            let mut ids: Vec<u64> = Vec::new();
            for (op, pick, n, front) in ops {
                match op {
                    0 | 1 => {
                        let id = l.enter_line(n, front, None);
                        model.enter(id, n, front);
                        ids.push(id);
                    }
                    2 if !ids.is_empty() => {
                        let id = ids[pick % ids.len()];
                        prop_assert_eq!(l.enter_line(n, front, Some(id)), id);
                        model.enter(id, n, front);
                    }
                    _ if !ids.is_empty() => {
                        let id = ids[pick % ids.len()];
                        let woken = l.leave_line(id);
                        model.line.retain(|&(w, _)| w != id);
                        let expected = model.line.pop_front().map(|(w, _)| w);
                        prop_assert_eq!(woken, expected);
                    }
                    _ => {}
                }
                prop_assert_eq!(&l.line, &model.line);
            }
        }
    }

    proptest! {
        /// Any order of events, any reply: no panic; never more than two leases held; never
        /// a grant past `sent + ttl`; never more granted than leased.
        #[test]
        fn any_event_order_keeps_the_bounds(
            events in proptest::collection::vec(any_event(), 1..80),
            draw in 0.0f64..1.0,
        ) {
            let mut l = ledger(20, 1000);
            let mut now: Nanos = 0;
            let mut flights: Vec<(u64, Nanos)> = Vec::new();
            let mut leased: u64 = 0;
            let mut granted: u64 = 0;
            for e in events {
                match e {
                    Event::Tick(ms) => now += ms * MS,
                    Event::Take(n) => {
                        let before = l.leases();
                        if let Local::Granted { .. } = l.take(n, now, false) {
                            granted += n;
                            // Spent only from leases live at `now`.
                            let live: u64 = [before.0, before.1]
                                .into_iter()
                                .flatten()
                                .filter(|x| x.expires > now)
                                .map(|x| x.left)
                                .sum();
                            prop_assert!(n <= live, "granted {n} of {live} live");
                        }
                    }
                    Event::Begin(need) => {
                        if let Begin::Send { flight, .. } = l.begin(Backend::Module, need, now) {
                            flights.push((flight, now));
                        }
                    }
                    Event::Land(i, reply) => {
                        if let Some(&(f, _)) = flights.get(i) {
                            if let Ok(r) = parse_lease(&reply) {
                                leased += r.tokens;
                            }
                            if let Ok(landing) = l.landed(f, &reply, now, draw) {
                                if let Landed::Granted { served: true, .. } = landing.landed {
                                    // Claimed at once: a grant.
                                    if let Some(fl) = l.flights.iter().find(|x| x.id == f) {
                                        granted += fl.ended.flatten().unwrap_or(0);
                                    }
                                    l.release(f, true, now);
                                }
                            }
                        }
                    }
                    Event::Fail(i, k) => {
                        if let Some(&(f, _)) = flights.get(i) {
                            let kind = [Failure::Refused, Failure::NotSent, Failure::Unknown][k as usize];
                            l.failed(f, kind, now);
                        }
                    }
                    Event::GiveUp(i) => {
                        if let Some(&(f, _)) = flights.get(i) {
                            if let Some(t) = l.give_up(f) {
                                granted += t;
                            }
                        }
                    }
                    Event::Release(i, claimed) => {
                        if let Some(&(f, _)) = flights.get(i) {
                            l.release(f, claimed, now);
                        }
                    }
                    Event::Close => {
                        l.close(now);
                    }
                }
                let (a, b) = l.leases();
                for lease in [a, b].into_iter().flatten() {
                    prop_assert!(lease.expires <= now + 1000 * MS);
                }
                let held = a.map_or(0, |x| x.left) + b.map_or(0, |x| x.left);
                // Leases only come from replies: what is held, granted and returned never
                // exceeds what was leased (a settle's tokens are counted at their return).
                // Leases only come from replies: what was granted and what is held never
                // exceed what was leased.
                prop_assert!(granted + held <= leased, "granted {granted} held {held} leased {leased}");
                prop_assert!(l.flights.len() <= MAX_FLIGHTS);
            }
        }
    }
}
