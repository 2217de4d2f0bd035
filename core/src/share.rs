//! Rate shares (`RL.SHARE`): a key divides its rate (and its cap, as bursts) among the
//! holders that ask for it, so each holder limits locally at its share and calls the
//! server once per period, however busy it is.
//!
//! A key holds its limit (rate, cap, version) and up to [`MAX_HOLDERS`] entries, ids
//! ascending. An entry records the share its holder was given (`rate`, `burst`, usable
//! until `lease_end`) and the share it had before (`held_rate`, `held_burst`), counted
//! until `held_until` because the holder may still be using it while its call is under way
//! (see [`HOLD`]).
//!
//! The bound: the server never gives a holder more than `rate` minus what every other
//! entry may still be using (its *commitment*), so at every instant the shares holders may
//! still use sum to at most `rate`, and the bursts to at most `cap`. A holder that dies
//! strands its share until its lease ends (under-issue, never over-issue).
//!
//! The division: live holders get `rate` in proportion to their wants when the wants fit
//! (a lone holder gets all of it), else max-min fair by want (water-filling); bursts follow
//! the rates (`burst = rate * cap / rate_limit`). A holder gets `min(its target, what is
//! free)`; one that got less calls again sooner (`refresh_ms`).
//!
//! Pins (`RL.PIN`, see [`SharePin`]): a rate pin divides the pinned rate and cap instead of
//! the callers' limit (which the table keeps, following `VERSION`s, for when the pin
//! ends); the commitments stay counted as they are, so a pin's start, change or end never
//! gives out more than the limit that governs next minus what holders may still be using.
//! `BLOCK` answers every call a zero share and `EXEMPT` the callers' whole limit, marked
//! so that the holders' limiters grant without counting; neither writes. A pinned table
//! may hold no entry (a key pinned before any holder came), and never expires while its
//! pin lives.

use crate::pin::PinKind;
use crate::round::{add_up, sub_down};
use crate::version::{resolve, Applied, MAX_VERSION};
use crate::{Limit, Nanos, NEVER};

const MS: Nanos = 1_000_000;

/// How long the server keeps counting a holder's previous share after a call: a holder
/// that sent a call at `s` stops using its old share at `min(answer, s + HOLD)`, and the
/// server's instant `T` of the call is no earlier than `s`.
pub const HOLD: Nanos = 250 * MS;
/// A share may be used for this many periods after the call that gave it.
pub const LEASE_PERIODS: u64 = 3;
/// Most entries one key may hold (live holders and holders whose old share is held).
pub const MAX_HOLDERS: usize = 4096;
/// Longest holder id, in bytes.
pub const MAX_HOLDER_LEN: usize = 64;
/// Shortest and longest `period_ms`.
pub const MIN_PERIOD_MS: u64 = 10;
pub const MAX_PERIOD_MS: u64 = 3_600_000;
/// A shorter `period_ms` is raised to this (the lease and `refresh_ms` follow), so that a
/// holder that calls again after `refresh_ms` never calls within the hold of its previous
/// call. A call within it would keep the larger of its old shares counted for another
/// [`HOLD`] (an entry holds one old share), and a holder calling that often while its
/// share shrinks would never let go of what it gave up. The clients wait `refresh_ms`
/// from the answer (which comes after the server's instant of the call), less up to a
/// tenth so that a fleet does not call in step: 90% of 300 ms is still 20 ms past the hold.
pub const SHORTEST_PERIOD_MS: u64 = 300;
/// Largest `want` (the largest rate a limit may have).
pub const MAX_WANT: f64 = crate::MAX_VALUE;
/// A holder whose share came out below its target by more than this fraction of it was
/// short (rounding alone moves a share by a few units in the last place).
const SHORT: f64 = 1e-9;

/// A holder whose share came out below this fraction of its target is far short: it is
/// sent back within a quarter period even when nothing frees before.
const FAR: f64 = 0.9;

/// Whether a share went down from `held` to `new` by more than rounding: the free rate is
/// rounded down, so a share that did not change may come out a unit in the last place
/// below, and treating that as a shrink told a far-short holder to wait the shortest
/// period instead of a quarter of its own (a property test found it).
fn shrank(held: f64, new: f64) -> bool {
    held > new * (1.0 + SHORT)
}

/// Largest number a stored time may hold (Redis integers are signed 64-bit).
const MAX_FIELD: u64 = i64::MAX as u64;

/// An operator's pin on a share key.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SharePin {
    pub kind: PinKind,
    /// When it ends (0: at `RL.UNPIN`).
    pub until: Nanos,
    /// A rate pin's limit (the rate and cap divided among the holders); `None` for
    /// `BLOCK` and `EXEMPT`.
    pub limit: Option<Limit>,
}

impl SharePin {
    /// A pin of `kind` (a rate pin needs `limit`, the others take none) until `until`.
    pub fn new(kind: PinKind, limit: Option<Limit>, until: Nanos) -> Result<SharePin, ShareError> {
        let p = SharePin { kind, until, limit };
        p.check()?;
        Ok(p)
    }

    /// Whether the pin still governs at `now`.
    pub fn live_at(&self, now: Nanos) -> bool {
        self.until == 0 || now < self.until
    }

    /// Time left at `now` (`None`: no end).
    pub fn left(&self, now: Nanos) -> Option<Nanos> {
        (self.until != 0).then(|| self.until.saturating_sub(now))
    }

    fn check(&self) -> Result<(), ShareError> {
        if self.until > MAX_FIELD || (self.kind == PinKind::Rate) != self.limit.is_some() {
            return Err(ShareError::Pin);
        }
        Ok(())
    }
}

/// When a key whose entries end last at `last_end` may go under `pin`: never while a pin
/// without an end holds, not before a pin's end, else at its last entry's end.
pub fn keep_until(pin: Option<&SharePin>, last_end: Nanos) -> Nanos {
    match pin {
        None => last_end,
        Some(p) if p.until == 0 => NEVER,
        Some(p) => p.until.max(last_end),
    }
}

/// One holder's entry.
#[derive(Debug, Clone, PartialEq)]
pub struct Holder {
    /// 1 to [`MAX_HOLDER_LEN`] bytes, unique within the key.
    pub id: Box<[u8]>,
    /// Tokens per second the holder said it would use.
    pub want: f64,
    /// Its share (tokens per second) and burst (tokens), usable until `lease_end`.
    pub rate: f64,
    pub burst: f64,
    pub lease_end: Nanos,
    /// Its previous share, counted until `held_until`.
    pub held_rate: f64,
    pub held_burst: f64,
    pub held_until: Nanos,
}

impl Holder {
    /// The rate this holder may still be using at `t`.
    pub fn rate_at(&self, t: Nanos) -> f64 {
        commitment(
            self.rate,
            self.lease_end,
            self.held_rate,
            self.held_until,
            t,
        )
    }

    /// The burst this holder may still be using at `t`.
    pub fn burst_at(&self, t: Nanos) -> f64 {
        commitment(
            self.burst,
            self.lease_end,
            self.held_burst,
            self.held_until,
            t,
        )
    }

    /// When this entry stops counting (it is dropped at this instant or later).
    pub fn end(&self) -> Nanos {
        self.lease_end.max(self.held_until)
    }

    /// Whether the holder holds a lease at `t` (it counts among the holders dividing the
    /// rate).
    pub fn is_live(&self, t: Nanos) -> bool {
        t < self.lease_end
    }

    /// Whether the holder's last call shrank its share and `t` is within that call's
    /// hold: its old, larger share is still counted.
    pub fn shrank_within_hold(&self, t: Nanos) -> bool {
        self.is_live(t)
            && t < self.held_until
            && (shrank(self.held_rate, self.rate) || shrank(self.held_burst, self.burst))
    }

    /// Whether the entry no longer counts for anything at `t`.
    pub fn is_dead(&self, t: Nanos) -> bool {
        t >= self.end()
    }

    /// Whether the entry is one this module could have written (the per-entry part of
    /// [`ShareTable::validate`]).
    pub fn check(&self) -> Result<(), ShareError> {
        check_holder_id(&self.id)?;
        check_want(self.want)?;
        for x in [self.rate, self.burst, self.held_rate, self.held_burst] {
            if !(0.0..=crate::MAX_VALUE).contains(&x) || x.is_sign_negative() {
                return Err(ShareError::Field);
            }
        }
        // Every call sets a hold (`T + HOLD`), so no entry ends at 0.
        if self.lease_end > MAX_FIELD || !(1..=MAX_FIELD).contains(&self.held_until) {
            return Err(ShareError::Time);
        }
        Ok(())
    }
}

fn commitment(share: f64, until: Nanos, held: f64, held_until: Nanos, t: Nanos) -> f64 {
    let a = if t < until { share } else { 0.0 };
    let b = if t < held_until { held } else { 0.0 };
    a.max(b)
}

/// Why a request or a stored table was refused. The texts are the user-facing messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShareError {
    Holder,
    Want,
    Period,
    TooMany,
    Empty,
    Order,
    Field,
    Time,
    Version,
    Pin,
}

impl ShareError {
    pub fn message(self) -> &'static str {
        match self {
            ShareError::Holder => "holder must be 1 to 64 bytes",
            ShareError::Want => "want must be a finite number from 0 to 1e15",
            ShareError::Period => "period_ms must be an integer from 10 to 3600000",
            ShareError::TooMany => "too many holders on this key (at most 4096)",
            ShareError::Empty => "a share key holds at least one holder",
            ShareError::Order => "holders must be unique, in ascending order",
            ShareError::Field => "share rates and bursts must be finite numbers from 0 to 1e15",
            ShareError::Time => {
                "share times must be at most 9223372036854775807 (and a hold's end above 0)"
            }
            ShareError::Version => "VERSION must be an integer from 0 to 9007199254740991",
            ShareError::Pin => {
                "a share key's pin is a kind (1 rate with its limit, 2 BLOCK, 3 EXEMPT) and an end of at most 9223372036854775807"
            }
        }
    }
}

pub fn check_holder_id(id: &[u8]) -> Result<(), ShareError> {
    if id.is_empty() || id.len() > MAX_HOLDER_LEN {
        return Err(ShareError::Holder);
    }
    Ok(())
}

pub fn check_want(want: f64) -> Result<(), ShareError> {
    // NaN fails the range; -0.0 is in it but is not a number a command stores.
    if !(0.0..=MAX_WANT).contains(&want) || want.is_sign_negative() {
        return Err(ShareError::Want);
    }
    Ok(())
}

pub fn check_period(period_ms: u64) -> Result<(), ShareError> {
    if !(MIN_PERIOD_MS..=MAX_PERIOD_MS).contains(&period_ms) {
        return Err(ShareError::Period);
    }
    Ok(())
}

/// One `RL.SHARE` call, checked.
#[derive(Debug, Clone, Copy)]
pub struct ShareRequest<'a> {
    pub holder: &'a [u8],
    pub want: f64,
    pub period_ms: u64,
    pub release: bool,
    pub limit: Limit,
    pub version: u64,
}

impl<'a> ShareRequest<'a> {
    pub fn new(
        holder: &'a [u8],
        want: f64,
        period_ms: u64,
        release: bool,
        limit: Limit,
        version: u64,
    ) -> Result<ShareRequest<'a>, ShareError> {
        check_holder_id(holder)?;
        // `-0` is read as 0 (the stored form has no sign).
        let want = if want == 0.0 { 0.0 } else { want };
        check_want(want)?;
        check_period(period_ms)?;
        if version > MAX_VERSION {
            return Err(ShareError::Version);
        }
        Ok(ShareRequest {
            holder,
            want,
            period_ms,
            release,
            limit,
            version,
        })
    }
}

/// What `RL.SHARE` answers.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ShareReply {
    /// The holder's share (tokens per second) and burst (tokens).
    pub rate: f64,
    pub burst: f64,
    /// How long the holder may use them (from when it sent the call, less its margin).
    pub lease_ms: u64,
    /// When to call again.
    pub refresh_ms: u64,
    /// Live holders after the call.
    pub holders: u64,
}

/// What a call did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Decision {
    pub reply: ShareReply,
    /// Whether the table changed (only a `RELEASE` of a holder without a live lease
    /// changes nothing).
    pub written: bool,
    /// Entries dropped as dead.
    pub pruned: usize,
    /// Whether the holder's entry is new.
    pub joined: bool,
    /// The holder got less than its target (it waits for others to give theirs up).
    pub short: bool,
    /// Which limit decided the call.
    pub applied: Applied,
    /// The holder's entry (an index into [`ShareTable::holders`]), if written.
    pub index: usize,
    /// When the key may go, if written: its last entry's end, or later under a pin
    /// ([`keep_until`]; [`NEVER`] while a pin without an end holds).
    pub expires_at: Nanos,
    /// The kind of the live pin that decided the call, if one did.
    pub pinned: Option<PinKind>,
}

/// The holders of one key and its limit.
#[derive(Debug, Clone, PartialEq)]
pub struct ShareTable {
    limit: Limit,
    version: u64,
    holders: Vec<Holder>,
    pin: Option<SharePin>,
}

impl ShareTable {
    /// A table with no holder yet (for a key that does not exist: a call fills it, and
    /// only a filled table is stored).
    pub fn new(limit: Limit, version: u64) -> ShareTable {
        ShareTable {
            limit,
            version,
            holders: Vec::new(),
            pin: None,
        }
    }

    /// A table from stored parts (RDB), if this module could have written them: the
    /// check the effect command makes too (through [`ShareTable::apply`]).
    pub fn validate(
        rate: f64,
        cap: f64,
        version: u64,
        holders: Vec<Holder>,
    ) -> Result<ShareTable, LoadError> {
        ShareTable::validate_pinned(rate, cap, version, holders, None)
    }

    /// [`ShareTable::validate`] for a table that may hold a pin: one with a pin may hold
    /// no entry (a key pinned before any holder came).
    pub fn validate_pinned(
        rate: f64,
        cap: f64,
        version: u64,
        holders: Vec<Holder>,
        pin: Option<SharePin>,
    ) -> Result<ShareTable, LoadError> {
        let limit = Limit::new(rate, cap).map_err(LoadError::Limit)?;
        if version > MAX_VERSION {
            return Err(LoadError::Share(ShareError::Version));
        }
        if let Some(p) = &pin {
            p.check().map_err(LoadError::Share)?;
        }
        if holders.is_empty() && pin.is_none() {
            return Err(LoadError::Share(ShareError::Empty));
        }
        if holders.len() > MAX_HOLDERS {
            return Err(LoadError::Share(ShareError::TooMany));
        }
        for (i, h) in holders.iter().enumerate() {
            h.check().map_err(LoadError::Share)?;
            if i > 0 && holders[i - 1].id >= h.id {
                return Err(LoadError::Share(ShareError::Order));
            }
        }
        Ok(ShareTable {
            limit,
            version,
            holders,
            pin,
        })
    }

    /// The stored pin (it may have ended: it goes at the key's next write).
    pub fn pin(&self) -> Option<&SharePin> {
        self.pin.as_ref()
    }

    /// The pin that governs at `now`, if any.
    pub fn live_pin(&self, now: Nanos) -> Option<&SharePin> {
        self.pin.as_ref().filter(|p| p.live_at(now))
    }

    /// Pins the table (`RL.PIN`; `None`: `RL.UNPIN`) at `now`, dropping the entries dead
    /// then. Nothing else changes: what holders were given stays counted until it ends,
    /// so the bound holds under whatever limit governs next. Returns the entries dropped.
    /// An unpinned table left with no entry is no key: the caller deletes it.
    pub fn set_pin(&mut self, pin: Option<SharePin>, now: Nanos) -> usize {
        let pruned = self.prune(now);
        self.pin = pin;
        pruned
    }

    /// When the key may go ([`keep_until`]): [`NEVER`] while a pin without an end holds;
    /// 0 for a table with nothing in it.
    pub fn expires_at(&self) -> Nanos {
        keep_until(self.pin.as_ref(), self.last_end().unwrap_or(0))
    }

    pub fn limit(&self) -> Limit {
        self.limit
    }

    pub fn version(&self) -> u64 {
        self.version
    }

    /// Every entry, ids ascending (some may be dead since the last write).
    pub fn holders(&self) -> &[Holder] {
        &self.holders
    }

    pub fn is_empty(&self) -> bool {
        self.holders.is_empty()
    }

    /// When the last entry stops counting: the key's expiry (`None`: no entry).
    pub fn last_end(&self) -> Option<Nanos> {
        self.holders.iter().map(Holder::end).max()
    }

    /// Live holders at `t`.
    pub fn live(&self, t: Nanos) -> usize {
        self.holders.iter().filter(|h| h.is_live(t)).count()
    }

    /// The rates and bursts every entry may still be using at `t`, summed (rounded up).
    pub fn committed(&self, t: Nanos) -> (f64, f64) {
        self.holders.iter().fold((0.0, 0.0), |(r, b), h| {
            (add_up(r, h.rate_at(t)), add_up(b, h.burst_at(t)))
        })
    }

    fn find(&self, id: &[u8]) -> Result<usize, usize> {
        self.holders.binary_search_by(|h| (*h.id).cmp(id))
    }

    /// Drops the entries dead at `now`; returns how many.
    pub fn prune(&mut self, now: Nanos) -> usize {
        let before = self.holders.len();
        self.holders.retain(|h| !h.is_dead(now));
        // A fleet that shrank gives its memory back.
        if self.holders.capacity() > 4 * self.holders.len().max(8) {
            self.holders.shrink_to(2 * self.holders.len());
        }
        before - self.holders.len()
    }

    /// Decides one `RL.SHARE` call at server time `now` and carries it out. An error (too
    /// many holders) or a `RELEASE` of a holder without a live lease changes nothing.
    pub fn decide(&mut self, req: &ShareRequest, now: Nanos) -> Result<Decision, ShareError> {
        let (limit, version, applied) = if self.holders.is_empty() {
            (req.limit, req.version, Applied::Created)
        } else {
            resolve(Some((self.limit, self.version)), req.limit, req.version)
        };
        // A live pin decides; the callers' limit is kept (a newer VERSION replaces it) for
        // when the pin ends. An ended pin goes at this call's write. (One test of the
        // stored pin on the common, unpinned path.)
        let (pin, pinned, applied, divided) = match &self.pin {
            None => (None, None, applied, limit),
            Some(p) => {
                let pin = Some(*p).filter(|p| p.live_at(now));
                let applied = match pin {
                    Some(_) if applied != Applied::Replaced => Applied::Pinned,
                    _ => applied,
                };
                if let Some(p) = pin.filter(|p| p.kind != PinKind::Rate && !req.release) {
                    return Ok(self.gated(&p, limit, req, applied, now));
                }
                // The rate and cap divided among the holders.
                let divided = pin.and_then(|p| p.limit).unwrap_or(limit);
                (pin, pin.map(|p| p.kind), applied, divided)
            }
        };
        let found = self.find(req.holder);
        let own = found.ok().map(|i| &self.holders[i]);
        let own_alive = own.filter(|h| !h.is_dead(now));

        // One pass over the others: what they may still use, who is live, when the
        // first of their commitments ends, how many are dead.
        let s = self.scan(found.ok(), now);
        let others = self.holders.len() - s.dead - usize::from(found.is_ok());
        let period_ms = effective_period_ms(req.period_ms);

        if req.release && !own.is_some_and(|h| h.is_live(now)) {
            return Ok(Decision {
                reply: ShareReply {
                    rate: 0.0,
                    burst: 0.0,
                    lease_ms: 0,
                    refresh_ms: period_ms,
                    holders: s.live as u64,
                },
                written: false,
                pruned: 0,
                joined: false,
                short: false,
                applied,
                index: 0,
                expires_at: 0,
                pinned,
            });
        }
        // A holder whose last call shrank its share, calling again within that call's hold
        // (sooner than it was told): deciding the call would hold the larger old share
        // for another HOLD, and a holder calling that often would keep it counted for as
        // long as it kept calling, starving the others. Its entry already says what it
        // may use, so the call is answered from it and writes nothing: the share it has,
        // for what is left of its lease, and to come back when the hold ends. What it gave
        // up is free when that hold ends, however often it calls.
        if let Some(h) = own.filter(|h| !req.release && h.shrank_within_hold(now)) {
            return Ok(Decision {
                reply: ShareReply {
                    rate: h.rate,
                    burst: h.burst,
                    // Counted from the server's instant: the holder, which counts from
                    // when it sent the call (no later), stops no later than the entry.
                    lease_ms: (h.lease_end - now) / MS,
                    refresh_ms: crate::ceil_millis(h.held_until - now).max(MIN_PERIOD_MS),
                    holders: (s.live + 1) as u64,
                },
                written: false,
                pruned: 0,
                joined: false,
                short: false,
                applied,
                index: 0,
                expires_at: 0,
                pinned,
            });
        }
        if own_alive.is_none() && others >= MAX_HOLDERS {
            return Err(ShareError::TooMany);
        }

        let (rate, burst, short, far, capped) = if req.release {
            (0.0, 0.0, false, false, false)
        } else {
            let target = self.target(&divided, req, &s, found.ok(), now);
            let target_burst = target * divided.cap() / divided.rate();
            let free = sub_down(divided.rate(), s.rate);
            let free_burst = sub_down(divided.cap(), s.burst);
            let rate = non_negative(target.min(free));
            let burst = non_negative(target_burst.min(free_burst));
            let short = rate < target * (1.0 - SHORT) || burst < target_burst * (1.0 - SHORT);
            // Far short: below nine tenths of its target (a newcomer to a fleet that holds
            // everything, a holder whose demand stepped up), not by a rounding or by the
            // jitter of a measured demand.
            let far = rate < target * FAR || burst < target_burst * FAR;
            // Capped: the others' wants cut it below its own, and some of them want less
            // than it gets (the wants differ: a hot spot that may move). When every holder
            // wants more than the level (one hot key, the demand everywhere unlimited),
            // nobody's want is likely to fall below it: once a period is enough.
            let capped = target < req.want * (1.0 - SHORT) && s.least_want < target;
            (rate, burst, short, far, capped)
        };
        let lease = period_ms * LEASE_PERIODS * MS;
        // The id is allocated only for a new entry (below).
        let entry = Holder {
            id: Box::default(),
            want: req.want,
            rate,
            burst,
            lease_end: if req.release {
                now
            } else {
                now.saturating_add(lease).min(MAX_FIELD)
            },
            held_rate: own_alive.map_or(0.0, |h| h.rate_at(now)),
            held_burst: own_alive.map_or(0.0, |h| h.burst_at(now)),
            held_until: now.saturating_add(HOLD).min(MAX_FIELD),
        };
        let refresh_ms = if short {
            // Sooner, to pick up what others free; but not within this call's hold if it
            // holds more than the new share (a holder whose share shrank).
            let soonest = if shrank(entry.held_rate, rate) || shrank(entry.held_burst, burst) {
                SHORTEST_PERIOD_MS
            } else {
                MIN_PERIOD_MS
            };
            // Far short, it comes back within a quarter period even when nothing frees
            // before: the holders over their targets learn of its want at their next
            // calls, and it picks up what they give up without waiting a whole period.
            let latest = if far {
                (period_ms / 4).max(soonest)
            } else {
                period_ms
            };
            match self.next_release(found.ok(), now) {
                None => (period_ms / 4).max(soonest),
                Some(t) => crate::ceil_millis(t - now).clamp(soonest, latest),
            }
        } else if capped {
            // At its target but wanting more: its target grows as soon as another holder
            // wants less (a hot spot that moved), and it learns that only by calling. Half
            // a period, not within its hold if its share shrank.
            let soonest = if shrank(entry.held_rate, rate) || shrank(entry.held_burst, burst) {
                SHORTEST_PERIOD_MS
            } else {
                MIN_PERIOD_MS
            };
            (period_ms / 2).max(soonest)
        } else if !own.is_some_and(|h| h.is_live(now)) {
            // A newcomer (a fleet starting together, a restarted instance): its first want
            // is often a guess (the clients send the whole rate before they have measured
            // anything), and it may hold everything, the others not yet there. It comes
            // back after the shortest period with what it measured, so that the division
            // settles within a fraction of a period instead of one.
            period_ms.min(SHORTEST_PERIOD_MS)
        } else {
            period_ms
        };
        let reply = ShareReply {
            rate,
            burst,
            lease_ms: if req.release {
                0
            } else {
                period_ms * LEASE_PERIODS
            },
            refresh_ms,
            holders: (s.live + usize::from(!req.release)) as u64,
        };

        let mut expires_at = s.last_end.max(entry.end());
        if self.pin.is_some() {
            expires_at = keep_until(pin.as_ref(), expires_at);
        }
        // Nothing can fail from here on.
        self.limit = limit;
        self.version = version;
        if self.pin.is_some() {
            self.pin = pin;
        }
        let pruned = if s.dead > 0 || own.is_some_and(|h| h.is_dead(now)) {
            self.prune(now)
        } else {
            0
        };
        // Without a prune the entries have not moved: the first search still holds.
        let place = if pruned == 0 {
            found
        } else {
            self.find(req.holder)
        };
        let (index, joined) = match place {
            Ok(i) => {
                // The id is already there: keep its allocation.
                let id = std::mem::take(&mut self.holders[i].id);
                self.holders[i] = Holder { id, ..entry };
                (i, false)
            }
            Err(i) => {
                let id = Box::from(req.holder);
                self.holders.insert(i, Holder { id, ..entry });
                (i, true)
            }
        };
        Ok(Decision {
            reply,
            written: true,
            pruned,
            joined,
            short,
            applied,
            index,
            expires_at,
            pinned,
        })
    }

    /// A call (not a `RELEASE`) on a key under a `BLOCK` or `EXEMPT` pin `p`, with the
    /// callers' limit `limit`: answered, nothing written. `BLOCK`: a zero share, and to
    /// call again in a period or when the pin ends if sooner. `EXEMPT`: the callers' whole
    /// limit, for a lease that ends no later than the pin (the holders' limiters, told the
    /// pin's kind, grant without counting meanwhile). The holders' entries stay as they
    /// are: what they were given before stays counted until it ends.
    fn gated(
        &self,
        p: &SharePin,
        limit: Limit,
        req: &ShareRequest,
        applied: Applied,
        now: Nanos,
    ) -> Decision {
        let period_ms = effective_period_ms(req.period_ms);
        let left = p.left(now);
        // Called again when the pin ends, if sooner than a period.
        let refresh_ms = left.map_or(period_ms, |ns| crate::ceil_millis(ns).clamp(1, period_ms));
        let (rate, burst, lease_ms) = match p.kind {
            PinKind::Exempt => {
                let lease = period_ms * LEASE_PERIODS;
                // Never past the pin's end: counted from the server's instant, and the
                // holder counts from when it sent the call (no later).
                let lease = left.map_or(lease, |ns| (ns / MS).min(lease));
                (limit.rate(), limit.cap(), lease)
            }
            _ => (0.0, 0.0, 0),
        };
        Decision {
            reply: ShareReply {
                rate,
                burst,
                lease_ms,
                refresh_ms,
                holders: self.live(now) as u64,
            },
            written: false,
            pruned: 0,
            joined: false,
            short: false,
            applied,
            index: 0,
            expires_at: 0,
            pinned: Some(p.kind),
        }
    }

    /// The earliest instant after `now` at which another entry's commitment drops (a
    /// lease or a hold ends that frees something): when a short holder may get more.
    fn next_release(&self, own: Option<usize>, now: Nanos) -> Option<Nanos> {
        let mut next = None;
        for (i, h) in self.holders.iter().enumerate() {
            if Some(i) == own {
                continue;
            }
            for t in [h.lease_end, h.held_until] {
                let frees = t > now
                    && (h.rate_at(t - 1) > h.rate_at(t) || h.burst_at(t - 1) > h.burst_at(t));
                if frees && next.is_none_or(|n| t < n) {
                    next = Some(t);
                }
            }
        }
        next
    }

    /// One pass over the entries but `own`: what they may still use at `now` (an upper
    /// bound of the exact sums: see [`Sum`]), how many are live and the sum of their
    /// wants, when the last ends, how many are dead.
    fn scan(&self, own: Option<usize>, now: Nanos) -> Scan {
        let own = own.unwrap_or(usize::MAX);
        let mut s = Scan::default();
        let (mut rate, mut burst, mut counted) = (Sum::default(), Sum::default(), 0usize);
        for (i, h) in self.holders.iter().enumerate() {
            let end = h.end();
            if i == own || now >= end {
                s.dead += usize::from(i != own);
                continue;
            }
            s.last_end = s.last_end.max(end);
            let live = now < h.lease_end;
            let held = now < h.held_until;
            let (r, b) = if live { (h.rate, h.burst) } else { (0.0, 0.0) };
            let (hr, hb) = if held {
                (h.held_rate, h.held_burst)
            } else {
                (0.0, 0.0)
            };
            rate.add(r.max(hr));
            burst.add(b.max(hb));
            counted += 1;
            if live {
                s.live += 1;
                s.wants += h.want;
                s.least_want = s.least_want.min(h.want);
            }
        }
        s.rate = rate.up(counted);
        s.burst = burst.up(counted);
        s
    }

    /// The holder's fair share among the live holders (itself included, with its new
    /// want): in proportion to the wants when they fit the rate, else max-min fair.
    fn target(
        &self,
        limit: &Limit,
        req: &ShareRequest,
        s: &Scan,
        own: Option<usize>,
        now: Nanos,
    ) -> f64 {
        let rate = limit.rate();
        let n = s.live + 1;
        let sum = s.wants + req.want;
        if sum <= rate {
            if sum == 0.0 {
                return rate / n as f64;
            }
            // `want / sum <= 1`, so the product never exceeds the rate.
            return rate * (req.want / sum);
        }
        // The water level is at least `rate / n`: a want below that is met in full.
        if req.want <= rate / n as f64 {
            return req.want;
        }
        // The live others' wants (the entries [`ShareTable::scan`] counted as live).
        let own = own.unwrap_or(usize::MAX);
        let level = WANTS.with(|w| {
            let mut w = w.borrow_mut();
            w.clear();
            w.extend(
                (self.holders.iter().enumerate())
                    .filter(|&(i, h)| i != own && h.is_live(now))
                    .map(|(_, h)| h.want),
            );
            w.push(req.want);
            water_level(&mut w, rate)
        });
        req.want.min(level)
    }

    /// Applies one effect (`RL.SETSHARES` without a pin): the limit, the entries dead at
    /// `prune` dropped (none end at 0: `Some(0)` drops nothing), `entry` set, no pin (see
    /// [`ShareTable::apply_pinned`]). Returns (entries pruned, whether the entry is new).
    pub fn apply(
        &mut self,
        limit: Limit,
        version: u64,
        prune: Option<Nanos>,
        entry: Holder,
    ) -> Result<(usize, bool), ShareError> {
        self.apply_pinned(limit, version, prune, Some(entry), None)
    }

    /// Applies one effect: the limit, the entries dead at `prune` dropped, `entry` set (if
    /// any), the pin set to `pin`. Every check runs first (the entry's own, the pin's, the
    /// table's size, a table left with nothing), so an error changes nothing; the result
    /// is a table [`ShareTable::validate_pinned`] accepts. Returns (entries pruned,
    /// whether the entry is new).
    pub fn apply_pinned(
        &mut self,
        limit: Limit,
        version: u64,
        prune: Option<Nanos>,
        entry: Option<Holder>,
        pin: Option<SharePin>,
    ) -> Result<(usize, bool), ShareError> {
        if version > MAX_VERSION {
            return Err(ShareError::Version);
        }
        if let Some(p) = &pin {
            p.check()?;
        }
        let dead = || prune.map_or(0, |t| self.holders.iter().filter(|h| h.is_dead(t)).count());
        match &entry {
            Some(e) => {
                e.check()?;
                if self.find(&e.id).is_err() && self.holders.len() - dead() >= MAX_HOLDERS {
                    return Err(ShareError::TooMany);
                }
            }
            None if pin.is_none() && self.holders.len() == dead() => {
                return Err(ShareError::Empty);
            }
            None => {}
        }
        self.limit = limit;
        self.version = version;
        self.pin = pin;
        let pruned = prune.map_or(0, |t| self.prune(t));
        let Some(entry) = entry else {
            return Ok((pruned, false));
        };
        match self.find(&entry.id) {
            Ok(i) => {
                self.holders[i] = entry;
                Ok((pruned, false))
            }
            Err(i) => {
                self.holders.insert(i, entry);
                Ok((pruned, true))
            }
        }
    }

    /// The parts, to store.
    pub fn into_parts(self) -> (Limit, u64, Vec<Holder>, Option<SharePin>) {
        (self.limit, self.version, self.holders, self.pin)
    }
}

/// Why stored parts were refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoadError {
    Limit(crate::LimitError),
    Share(ShareError),
}

impl LoadError {
    pub fn message(self) -> &'static str {
        match self {
            LoadError::Limit(e) => e.message(),
            LoadError::Share(e) => e.message(),
        }
    }
}

/// What one pass over the other entries found.
struct Scan {
    /// What they may still use (rounded up).
    rate: f64,
    burst: f64,
    /// Live holders among them and the sum of their wants.
    live: usize,
    wants: f64,
    /// The smallest of their wants (infinite if none is live).
    least_want: f64,
    dead: usize,
    /// When the last of them ends.
    last_end: Nanos,
}

impl Default for Scan {
    fn default() -> Scan {
        Scan {
            rate: 0.0,
            burst: 0.0,
            live: 0,
            wants: 0.0,
            least_want: f64::INFINITY,
            dead: 0,
            last_end: 0,
        }
    }
}

/// The period a call is decided with: `period_ms`, raised to [`SHORTEST_PERIOD_MS`].
pub fn effective_period_ms(period_ms: u64) -> u64 {
    period_ms.max(SHORTEST_PERIOD_MS)
}

fn non_negative(x: f64) -> f64 {
    if x > 0.0 {
        x
    } else {
        0.0
    }
}

thread_local! {
    /// The live holders' wants, for the water level (Redis runs commands on one thread;
    /// the buffer is kept so that no call allocates for it).
    static WANTS: std::cell::RefCell<Vec<f64>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// A sum of non-negative terms, and whether any addition rounded.
#[derive(Default)]
struct Sum {
    sum: f64,
    /// The rounding errors' sizes, summed (0: the sum is exact).
    lost: f64,
}

impl Sum {
    fn add(&mut self, x: f64) {
        // Knuth's two-sum: the exact error of one addition, with no branch.
        let s = self.sum + x;
        let b = s - self.sum;
        let e = (self.sum - (s - b)) + (x - b);
        self.sum = s;
        self.lost += e.abs();
    }

    /// At least the exact sum of the `n` terms added: the sum itself if no addition
    /// rounded (the common case: shares like 62.5), else the sum raised by more than its
    /// worst rounding (a plain sum of `n` non-negative terms is below the exact one by
    /// less than `n * 2^-53` of it): off by far less than a part in a billion.
    fn up(&self, n: usize) -> f64 {
        if self.lost == 0.0 {
            return self.sum;
        }
        crate::round::mul_up(self.sum, 1.0 + n as f64 * f64::EPSILON)
    }
}

/// The level `λ` with `sum(min(w, λ)) = rate`, for wants summing to more than `rate`
/// (infinite if they do not). Expected linear time: a quickselect that keeps only the side
/// of each pivot the level lies on, carrying the sum of the wants known to be below it and
/// the count of those known to be above. Reorders `wants`.
pub fn water_level(wants: &mut [f64], rate: f64) -> f64 {
    let (mut lo, mut hi) = (0, wants.len());
    let mut below = 0.0f64;
    let mut above = 0usize;
    // A fixed pseudo-random sequence of pivots: deterministic, and no sorted or
    // organ-pipe input makes it quadratic.
    let mut seed = 0x9E37_79B9_7F4A_7C15u64 ^ wants.len() as u64;
    while lo < hi {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let part = &mut wants[lo..hi];
        let p = part[(seed % part.len() as u64) as usize];
        let (lt, gt) = partition3(part, p);
        let s_lt: f64 = part[..lt].iter().sum();
        let c_ge = part.len() - lt;
        if below + s_lt + p * (above + c_ge) as f64 >= rate {
            // The level is at most p: everything from p up is cut to it.
            above += c_ge;
            hi = lo + lt;
        } else {
            // The level is above p: everything up to p is met in full.
            below += s_lt + p * (gt - lt) as f64;
            lo += gt;
        }
    }
    if above == 0 {
        return f64::INFINITY;
    }
    non_negative((rate - below) / above as f64)
}

/// Reorders `v` into `[< p][== p][> p]`; returns the starts of the second and third parts.
fn partition3(v: &mut [f64], p: f64) -> (usize, usize) {
    let (mut lt, mut i, mut gt) = (0, 0, v.len());
    while i < gt {
        if v[i] < p {
            v.swap(lt, i);
            lt += 1;
            i += 1;
        } else if v[i] > p {
            gt -= 1;
            v.swap(i, gt);
        } else {
            i += 1;
        }
    }
    (lt, gt)
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: Nanos = 1_700_000_000_000 * MS;

    fn limit(rate: f64, cap: f64) -> Limit {
        Limit::new(rate, cap).unwrap()
    }

    fn req<'a>(holder: &'a str, want: f64, l: Limit) -> ShareRequest<'a> {
        ShareRequest::new(holder.as_bytes(), want, 1000, false, l, 0).unwrap()
    }

    fn release<'a>(holder: &'a str, l: Limit) -> ShareRequest<'a> {
        ShareRequest::new(holder.as_bytes(), 0.0, 1000, true, l, 0).unwrap()
    }

    #[test]
    fn a_lone_holder_gets_everything_and_a_newcomer_what_is_free() {
        let l = limit(100.0, 50.0);
        let mut t = ShareTable::new(l, 0);
        let d = t.decide(&req("a", 10.0, l), T0).unwrap();
        assert_eq!(
            d.reply,
            ShareReply {
                rate: 100.0,
                burst: 50.0,
                lease_ms: 3000,
                refresh_ms: SHORTEST_PERIOD_MS,
                holders: 1
            }
        );
        assert!(d.written && d.joined && !d.short, "a newcomer is back soon");
        // b arrives: nothing is free, so it gets 0; far short, it comes back within a
        // quarter period though a's lease ends later than that.
        let d = t.decide(&req("b", 10.0, l), T0 + MS).unwrap();
        assert_eq!((d.reply.rate, d.reply.holders), (0.0, 2));
        assert!(d.short);
        assert_eq!(d.reply.refresh_ms, 250);
        // (a's hold of nothing is no reason to come back sooner.)
        // a refreshes: its target is now half; its old share is held for HOLD.
        let d = t.decide(&req("a", 10.0, l), T0 + 2 * MS).unwrap();
        assert_eq!((d.reply.rate, d.reply.burst), (50.0, 25.0));
        assert!(!d.short);
        // b before the hold ends: still nothing free; told to come back when it ends.
        let d = t.decide(&req("b", 10.0, l), T0 + 3 * MS).unwrap();
        assert_eq!(d.reply.rate, 0.0);
        assert_eq!(d.reply.refresh_ms, 250 - 1);
        let d = t.decide(&req("b", 10.0, l), T0 + 2 * MS + HOLD).unwrap();
        assert_eq!((d.reply.rate, d.reply.burst), (50.0, 25.0));
        assert!(!d.short);
        let (r, b) = t.committed(T0 + 2 * MS + HOLD);
        assert!(r <= 100.0 && b <= 50.0);
    }

    #[test]
    fn a_call_within_the_hold_of_a_shrink_is_answered_from_the_entry() {
        let l = limit(100.0, 50.0);
        let mut t = ShareTable::new(l, 0);
        t.decide(&req("a", 100.0, l), T0).unwrap();
        t.decide(&req("b", 100.0, l), T0 + MS).unwrap();
        // a shrinks to half; its 100 is held until T0 + 2 ms + HOLD.
        let d = t.decide(&req("a", 100.0, l), T0 + 2 * MS).unwrap();
        assert_eq!(d.reply.rate, 50.0);
        let before = t.clone();
        // a again 100 ms later (told to wait 1,000): nothing written, its share for the
        // rest of its lease, back when the hold ends.
        let d = t.decide(&req("a", 7.0, l), T0 + 102 * MS).unwrap();
        assert!(!d.written);
        assert_eq!(t, before);
        assert_eq!(
            d.reply,
            ShareReply {
                rate: 50.0,
                burst: 25.0,
                lease_ms: 2900,
                refresh_ms: 150,
                holders: 2
            }
        );
        // After the hold it is decided: its want of 7 now counts, its 50 is held.
        let d = t.decide(&req("a", 7.0, l), T0 + 2 * MS + HOLD).unwrap();
        assert!(d.written);
        assert_eq!(d.reply.rate, 7.0);
        assert_eq!(t.holders()[0].held_rate, 50.0);
        // A call whose share grew holds nothing over it: decided at once.
        let d = t.decide(&req("b", 100.0, l), T0 + 3 * MS + HOLD).unwrap();
        assert!(d.written);
    }

    #[test]
    fn a_holder_cut_by_the_division_comes_back_in_half_a_period() {
        let l = limit(100.0, 100.0);
        let mut t = ShareTable::new(l, 0);
        let mut at = T0;
        let mut last = Vec::new();
        for _ in 0..3 {
            last.clear();
            for (h, w) in [("a", 80.0), ("b", 80.0), ("c", 10.0)] {
                last.push(t.decide(&req(h, w, l), at).unwrap().reply);
                at += MS;
            }
            at += HOLD;
        }
        // a and b want 80 and get 45 (the level): back in 500 ms, when another's want may
        // have fallen; c gets all it wants: a period.
        let got: Vec<(f64, u64)> = last.iter().map(|r| (r.rate, r.refresh_ms)).collect();
        assert_eq!(got, vec![(45.0, 500), (45.0, 500), (10.0, 1000)]);
    }

    #[test]
    fn over_subscribed_wants_are_divided_max_min() {
        let l = limit(100.0, 100.0);
        let mut t = ShareTable::new(l, 0);
        for (i, (h, w)) in [("a", 10.0), ("b", 60.0), ("c", 80.0)].iter().enumerate() {
            t.decide(&req(h, *w, l), T0 + i as u64).unwrap();
        }
        // Everyone again after the holds: a 10, b and c 45 each.
        let at = T0 + HOLD + 10;
        let mut got = Vec::new();
        for (i, (h, w)) in [("a", 10.0), ("b", 60.0), ("c", 80.0)].iter().enumerate() {
            got.push(t.decide(&req(h, *w, l), at + i as u64).unwrap().reply.rate);
        }
        let at = at + HOLD + 10;
        got.clear();
        for (i, (h, w)) in [("a", 10.0), ("b", 60.0), ("c", 80.0)].iter().enumerate() {
            got.push(t.decide(&req(h, *w, l), at + i as u64).unwrap().reply.rate);
        }
        assert_eq!(got, vec![10.0, 45.0, 45.0]);
    }

    #[test]
    fn water_level_matches_a_sorted_reference() {
        let mut seed = 7u64;
        for n in 1..200usize {
            let mut v: Vec<f64> = (0..n)
                .map(|_| {
                    seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
                    ((seed >> 33) % 50) as f64
                })
                .collect();
            let total: f64 = v.iter().sum();
            let rate = total * 0.6 + 0.5;
            let mut sorted = v.clone();
            sorted.sort_by(f64::total_cmp);
            // Reference: walk up the sorted wants.
            let mut rest = rate;
            let mut level = f64::INFINITY;
            for (i, w) in sorted.iter().enumerate() {
                let k = (n - i) as f64;
                if w * k >= rest {
                    level = rest / k;
                    break;
                }
                rest -= w;
            }
            let got = water_level(&mut v, rate);
            assert!(
                (got - level).abs() <= 1e-9 * rate,
                "n {n}: {got} vs {level}"
            );
        }
        assert_eq!(water_level(&mut [1.0, 2.0], 5.0), f64::INFINITY);
        assert_eq!(water_level(&mut [5.0, 5.0, 5.0], 6.0), 2.0);
    }

    #[test]
    fn release_gives_the_share_up_after_the_hold_and_unknown_release_writes_nothing() {
        let l = limit(10.0, 10.0);
        let mut t = ShareTable::new(l, 0);
        t.decide(&req("a", 5.0, l), T0).unwrap();
        let before = t.clone();
        let d = t.decide(&release("zz", l), T0 + MS).unwrap();
        assert!(!d.written);
        assert_eq!(
            d.reply,
            ShareReply {
                rate: 0.0,
                burst: 0.0,
                lease_ms: 0,
                refresh_ms: 1000,
                holders: 1
            }
        );
        assert_eq!(t, before);
        let d = t.decide(&release("a", l), T0 + MS).unwrap();
        assert!(d.written);
        assert_eq!(
            (d.reply.rate, d.reply.holders, d.reply.lease_ms),
            (0.0, 0, 0)
        );
        assert_eq!(t.holders()[0].held_rate, 10.0);
        assert_eq!(t.last_end(), Some(T0 + MS + HOLD));
        // Released twice: the second is unknown (no live lease).
        assert!(!t.decide(&release("a", l), T0 + 2 * MS).unwrap().written);
        // During the hold a newcomer gets nothing; after it, everything.
        assert_eq!(
            t.decide(&req("b", 1.0, l), T0 + 2 * MS).unwrap().reply.rate,
            0.0
        );
        let d = t.decide(&req("b", 1.0, l), T0 + MS + HOLD).unwrap();
        assert_eq!(d.reply.rate, 10.0);
        assert_eq!(d.pruned, 1, "a's entry is gone");
    }

    #[test]
    fn a_dead_holder_strands_its_share_until_its_lease_ends_then_exactly_it_is_freed() {
        let l = limit(90.0, 9.0);
        let mut t = ShareTable::new(l, 0);
        for h in ["a", "b", "c"] {
            t.decide(&req(h, 30.0, l), T0).unwrap();
        }
        // Fair: 30 each once the rounds are more than a hold apart.
        for h in ["a", "b", "c"] {
            t.decide(&req(h, 30.0, l), T0 + HOLD).unwrap();
        }
        let at = T0 + 2 * HOLD + MS;
        for h in ["a", "b", "c"] {
            assert_eq!(t.decide(&req(h, 30.0, l), at).unwrap().reply.rate, 30.0);
        }
        // c dies; a and b want more, but c's 30 stays counted (and its want, as a live
        // holder's) until its lease ends.
        for (k, h) in ["a", "b"].iter().enumerate() {
            let d = t
                .decide(&req(h, 90.0, l), at + 1000 * MS + k as u64)
                .unwrap();
            assert_eq!(d.reply.rate, 30.0);
        }
        assert_eq!(t.committed(at + 3000 * MS - 1).0, 90.0);
        // At its end exactly c's share comes free: a takes half of the rate.
        let end = at + 3000 * MS;
        let d = t.decide(&req("a", 90.0, l), end).unwrap();
        assert_eq!((d.pruned, d.reply.rate, d.reply.holders), (1, 45.0, 2));
        let d = t.decide(&req("b", 90.0, l), end + HOLD).unwrap();
        assert_eq!(d.reply.rate, 45.0);
        assert_eq!(t.committed(end + HOLD).0, 90.0);
    }

    #[test]
    fn too_many_holders_is_an_error_that_changes_nothing() {
        let l = limit(1000.0, 1000.0);
        let mut t = ShareTable::new(l, 0);
        for i in 0..MAX_HOLDERS {
            let id = format!("h{i}");
            t.decide(&req(&id, 1.0, l), T0).unwrap();
        }
        let before = t.clone();
        assert_eq!(
            t.decide(&req("new", 1.0, l), T0 + 1),
            Err(ShareError::TooMany)
        );
        assert_eq!(t, before);
        // A known holder still refreshes; once the leases end there is room again.
        assert!(t.decide(&req("h7", 1.0, l), T0 + 1).is_ok());
        let d = t.decide(&req("new", 1.0, l), T0 + 3001 * MS).unwrap();
        assert_eq!(d.pruned, MAX_HOLDERS);
    }

    #[test]
    fn huge_wants_stay_within_the_rate() {
        let l = limit(1e15, 1e15);
        let mut t = ShareTable::new(l, 0);
        let n = 300u64;
        for round in 0..3u64 {
            for i in 0..n {
                let id = format!("h{i}");
                let want = if i % 3 == 0 {
                    1e15
                } else {
                    (i * 1_000_000_000) as f64
                };
                let at = T0 + round * (HOLD + MS) + i;
                t.decide(&req(&id, want, l), at).unwrap();
            }
            let at = T0 + round * (HOLD + MS) + n;
            let (r, b) = t.committed(at);
            assert!(r <= 1e15 && b <= 1e15, "{r} {b}");
        }
    }

    #[test]
    fn an_over_committed_table_gives_nothing_more() {
        // What a limit drop (or a forged effect) leaves: more held than the rate.
        let h = |id: &[u8], rate: f64| Holder {
            id: id.into(),
            want: 10.0,
            rate,
            burst: rate,
            lease_end: T0 + 10_000 * MS,
            held_rate: 0.0,
            held_burst: 0.0,
            held_until: T0,
        };
        let mut t =
            ShareTable::validate(10.0, 10.0, 0, vec![h(b"a", 50.0), h(b"b", 50.0)]).unwrap();
        let l = limit(10.0, 10.0);
        let d = t.decide(&req("c", 10.0, l), T0 + MS).unwrap();
        assert_eq!((d.reply.rate, d.reply.burst), (0.0, 0.0));
        // a refreshes: it can only shrink (its old 50 is held a while).
        let d = t.decide(&req("a", 10.0, l), T0 + 2 * MS).unwrap();
        assert_eq!(d.reply.rate, 0.0);
        assert_eq!(t.committed(T0 + 2 * MS).0, 100.0, "nothing added");
        assert_eq!(t.committed(T0 + 2 * MS + HOLD).0, 50.0);
    }

    #[test]
    fn a_period_under_the_hold_is_raised_so_no_call_falls_within_a_hold() {
        let l = limit(100.0, 10.0);
        let mut t = ShareTable::new(l, 0);
        let short = |id: &'static str, p| ShareRequest::new(id.as_bytes(), 1.0, p, false, l, 0);
        for (p, eff) in [(10, 300), (100, 300), (299, 300), (300, 300), (301, 301)] {
            let d = t.decide(&short("a", p).unwrap(), T0).unwrap();
            assert_eq!(
                (d.reply.lease_ms, d.reply.refresh_ms),
                (3 * eff, eff),
                "{p}"
            );
            assert_eq!(t.holders()[0].lease_end, T0 + 3 * eff * MS);
        }
        let r = ShareRequest::new(b"zz", 0.0, 10, true, l, 0).unwrap();
        assert_eq!(t.decide(&r, T0).unwrap().reply.refresh_ms, 300);
        let r = ShareRequest::new(b"a", 0.0, 10, true, l, 0).unwrap();
        assert_eq!(t.decide(&r, T0 + MS).unwrap().reply.refresh_ms, 300);
    }

    #[test]
    fn a_short_holder_whose_share_shrank_is_not_sent_back_within_its_hold() {
        // x holds 90 until 5 ms from now (then 80); a holds 20 and is short.
        let h = |id: &[u8], rate: f64, held: f64, held_until: Nanos| Holder {
            id: id.into(),
            want: 50.0,
            rate,
            burst: rate,
            lease_end: T0 + 10_000 * MS,
            held_rate: held,
            held_burst: held,
            held_until,
        };
        let entries = vec![h(b"a", 20.0, 0.0, T0), h(b"x", 80.0, 90.0, T0 + 6 * MS)];
        let mut t = ShareTable::validate(100.0, 100.0, 0, entries).unwrap();
        let l = limit(100.0, 100.0);
        // a gets 10 of its 50 and holds its 20 for HOLD: it must not call within it...
        let d = t.decide(&req("a", 50.0, l), T0 + MS).unwrap();
        assert_eq!(d.reply.rate, 10.0);
        assert!(d.short);
        assert_eq!(d.reply.refresh_ms, SHORTEST_PERIOD_MS);
        // ...while one whose share grows may come back when x's hold ends.
        let mut t = ShareTable::validate(
            100.0,
            100.0,
            0,
            vec![h(b"a", 5.0, 0.0, T0), h(b"x", 80.0, 90.0, T0 + 6 * MS)],
        )
        .unwrap();
        let d = t.decide(&req("a", 50.0, l), T0 + MS).unwrap();
        assert_eq!((d.reply.rate, d.reply.refresh_ms), (10.0, 10));
    }

    #[test]
    fn versions_follow_the_bucket_rules() {
        let (a, b) = (limit(100.0, 10.0), limit(10.0, 1.0));
        let mut t = ShareTable::new(a, 2);
        t.decide(&ShareRequest::new(b"x", 1.0, 100, false, a, 2).unwrap(), T0)
            .unwrap();
        let old = ShareRequest::new(b"y", 1.0, 100, false, b, 1).unwrap();
        let d = t.decide(&old, T0 + HOLD).unwrap();
        assert_eq!(d.applied, Applied::Stale);
        assert_eq!((t.limit(), t.version()), (a, 2));
        let new = ShareRequest::new(b"y", 1.0, 100, false, b, 3).unwrap();
        let d = t.decide(&new, T0 + HOLD + 1).unwrap();
        assert_eq!(d.applied, Applied::Replaced);
        assert_eq!((t.limit(), t.version()), (b, 3));
        // The limit dropped below what x still holds: y gets nothing, nothing is minted.
        assert_eq!(d.reply.rate, 0.0);
    }

    #[test]
    fn requests_and_tables_are_checked() {
        let l = limit(1.0, 1.0);
        let long = [b'x'; 65];
        assert_eq!(
            ShareRequest::new(b"", 1.0, 100, false, l, 0).unwrap_err(),
            ShareError::Holder
        );
        assert_eq!(
            ShareRequest::new(&long, 1.0, 100, false, l, 0).unwrap_err(),
            ShareError::Holder
        );
        assert!(ShareRequest::new(&long[..64], 1.0, 100, false, l, 0).is_ok());
        for w in [-1.0, f64::NAN, f64::INFINITY, 1.1e15, -0.0 - 1e-300] {
            assert_eq!(
                ShareRequest::new(b"a", w, 100, false, l, 0).unwrap_err(),
                ShareError::Want
            );
        }
        // -0.0 is read as 0.
        assert_eq!(
            ShareRequest::new(b"a", -0.0, 100, false, l, 0)
                .unwrap()
                .want
                .to_bits(),
            0
        );
        for p in [0, 9, 3_600_001] {
            assert_eq!(
                ShareRequest::new(b"a", 1.0, p, false, l, 0).unwrap_err(),
                ShareError::Period
            );
        }
        let h = |id: &[u8]| Holder {
            id: id.into(),
            want: 1.0,
            rate: 0.5,
            burst: 0.5,
            lease_end: T0,
            held_rate: 0.0,
            held_burst: 0.0,
            held_until: T0,
        };
        assert!(ShareTable::validate(1.0, 1.0, 0, vec![h(b"a"), h(b"b")]).is_ok());
        let bad = |v| ShareTable::validate(1.0, 1.0, 0, v).unwrap_err();
        assert_eq!(bad(vec![]), LoadError::Share(ShareError::Empty));
        assert_eq!(
            bad(vec![h(b"b"), h(b"a")]),
            LoadError::Share(ShareError::Order)
        );
        assert_eq!(
            bad(vec![h(b"a"), h(b"a")]),
            LoadError::Share(ShareError::Order)
        );
        assert_eq!(bad(vec![h(b"")]), LoadError::Share(ShareError::Holder));
        let mut nan = h(b"a");
        nan.held_rate = f64::NAN;
        assert_eq!(bad(vec![nan]), LoadError::Share(ShareError::Field));
        let mut neg = h(b"a");
        neg.burst = -0.0;
        assert_eq!(bad(vec![neg]), LoadError::Share(ShareError::Field));
        let mut late = h(b"a");
        late.held_until = u64::MAX;
        assert_eq!(bad(vec![late]), LoadError::Share(ShareError::Time));
        let mut zero = h(b"a");
        zero.held_until = 0;
        assert_eq!(bad(vec![zero]), LoadError::Share(ShareError::Time));
        assert!(matches!(
            ShareTable::validate(0.0, 1.0, 0, vec![h(b"a")]),
            Err(LoadError::Limit(_))
        ));
        assert_eq!(
            ShareTable::validate(1.0, 1.0, MAX_VERSION + 1, vec![h(b"a")]).unwrap_err(),
            LoadError::Share(ShareError::Version)
        );
    }

    #[test]
    fn an_effect_rebuilds_the_decided_table() {
        let l = limit(100.0, 10.0);
        let mut t = ShareTable::new(l, 0);
        let mut replica = ShareTable::new(l, 0);
        let mut now = T0;
        for (i, w) in [3.0, 50.0, 7.0, 0.0, 1e9].iter().enumerate() {
            now += 97 * MS;
            let id = format!("h{}", i % 3);
            let d = t.decide(&req(&id, *w, l), now).unwrap();
            let e = t.holders()[d.index].clone();
            let (pruned, joined) = replica.apply(t.limit(), t.version(), Some(now), e).unwrap();
            assert_eq!((pruned, joined), (d.pruned, d.joined));
            assert_eq!(replica, t);
            assert_eq!(Some(d.expires_at), t.last_end());
        }
    }

    fn pin(kind: PinKind, l: Option<Limit>, until: Nanos) -> SharePin {
        SharePin::new(kind, l, until).unwrap()
    }

    #[test]
    fn a_rate_pin_divides_its_limit_and_keeps_the_callers_for_after() {
        let l = limit(100.0, 10.0);
        let mut t = ShareTable::new(l, 0);
        t.decide(&req("a", 100.0, l), T0).unwrap();
        t.set_pin(Some(pin(PinKind::Rate, Some(limit(10.0, 1.0)), 0)), T0 + MS);
        // a still holds 100 (counted until its lease ends): b gets nothing...
        let d = t.decide(&req("b", 100.0, l), T0 + 2 * MS).unwrap();
        assert_eq!(
            (d.reply.rate, d.pinned, d.applied),
            (0.0, Some(PinKind::Rate), Applied::Pinned)
        );
        assert_eq!(d.expires_at, NEVER);
        // ...and once a's old share has gone (a lease), the two share the pinned 10.
        let mut at = T0 + 3000 * MS + HOLD;
        let (mut da, mut db) = (None, None);
        for _ in 0..3 {
            da = Some(t.decide(&req("a", 100.0, l), at).unwrap().reply);
            db = Some(t.decide(&req("b", 100.0, l), at + 1).unwrap().reply);
            assert!(t.committed(at + 1).0 <= 10.0);
            at += HOLD + 2;
        }
        let (da, db) = (da.unwrap(), db.unwrap());
        assert_eq!((da.rate, db.rate), (5.0, 5.0));
        assert_eq!((da.burst, db.burst), (0.5, 0.5));
        // The callers' limit is the table's own all along.
        assert_eq!(t.limit(), l);
    }

    #[test]
    fn block_answers_a_zero_share_and_writes_nothing_until_it_ends() {
        let l = limit(100.0, 10.0);
        let mut t = ShareTable::new(l, 0);
        t.decide(&req("a", 50.0, l), T0).unwrap();
        t.set_pin(Some(pin(PinKind::Block, None, T0 + 500 * MS)), T0 + MS);
        let before = t.clone();
        let d = t.decide(&req("a", 50.0, l), T0 + 100 * MS).unwrap();
        assert!(!d.written);
        assert_eq!(t, before);
        assert_eq!(
            (
                d.reply.rate,
                d.reply.burst,
                d.reply.lease_ms,
                d.reply.refresh_ms
            ),
            (0.0, 0.0, 0, 400),
            "called again when the pin ends"
        );
        assert_eq!(d.pinned, Some(PinKind::Block));
        // A release still gives the share up.
        assert!(t.decide(&release("a", l), T0 + 200 * MS).unwrap().written);
        // Ended: decided as before, the pin dropped at the write.
        let d = t.decide(&req("b", 1.0, l), T0 + 500 * MS + HOLD).unwrap();
        assert_eq!((d.pinned, d.reply.rate), (None, 100.0));
        assert_eq!(t.pin(), None);
        assert_eq!(Some(d.expires_at), t.last_end());
        // Without an end: a period.
        t.set_pin(Some(pin(PinKind::Block, None, 0)), T0 + 600 * MS);
        let d = t.decide(&req("b", 1.0, l), T0 + 601 * MS).unwrap();
        assert_eq!(d.reply.refresh_ms, 1000);
    }

    #[test]
    fn exempt_answers_the_callers_limit_for_no_longer_than_the_pin() {
        let l = limit(100.0, 10.0);
        let mut t = ShareTable::new(l, 0);
        t.set_pin(Some(pin(PinKind::Exempt, None, T0 + 1234 * MS)), T0);
        let d = t.decide(&req("a", 5.0, l), T0).unwrap();
        assert!(!d.written);
        assert_eq!(
            (
                d.reply.rate,
                d.reply.burst,
                d.reply.lease_ms,
                d.reply.refresh_ms
            ),
            (100.0, 10.0, 1234, 1000)
        );
        let d = t.decide(&req("a", 5.0, l), T0 + 1000 * MS + 1).unwrap();
        assert_eq!((d.reply.lease_ms, d.reply.refresh_ms), (233, 234));
    }

    #[test]
    fn a_key_pinned_before_any_holder_takes_the_first_callers_limit() {
        let p = pin(PinKind::Rate, Some(limit(8.0, 8.0)), 0);
        let mut t = ShareTable::validate_pinned(8.0, 8.0, 0, Vec::new(), Some(p)).unwrap();
        assert_eq!(t.expires_at(), NEVER);
        let l = limit(100.0, 100.0);
        let d = t
            .decide(
                &ShareRequest::new(b"a", 100.0, 1000, false, l, 3).unwrap(),
                T0,
            )
            .unwrap();
        assert_eq!((d.reply.rate, t.limit(), t.version()), (8.0, l, 3));
        // Without the pin and without entries it is no table.
        assert_eq!(
            ShareTable::validate_pinned(8.0, 8.0, 0, Vec::new(), None).unwrap_err(),
            LoadError::Share(ShareError::Empty)
        );
    }

    #[test]
    fn pins_and_their_effects_are_checked() {
        let l = limit(1.0, 1.0);
        for bad in [
            SharePin {
                kind: PinKind::Rate,
                until: 0,
                limit: None,
            },
            SharePin {
                kind: PinKind::Block,
                until: 0,
                limit: Some(l),
            },
            SharePin {
                kind: PinKind::Exempt,
                until: u64::MAX,
                limit: None,
            },
        ] {
            assert_eq!(
                SharePin::new(bad.kind, bad.limit, bad.until),
                Err(ShareError::Pin)
            );
            assert!(ShareTable::validate_pinned(1.0, 1.0, 0, Vec::new(), Some(bad)).is_err());
            let mut t = ShareTable::new(l, 0);
            t.decide(&req("a", 1.0, l), T0).unwrap();
            let before = t.clone();
            assert_eq!(
                t.apply_pinned(l, 0, Some(T0), None, Some(bad)),
                Err(ShareError::Pin)
            );
            assert_eq!(t, before);
        }
        // An unpin that would leave nothing is refused (the master deletes the key).
        let mut t = ShareTable::new(l, 0);
        t.decide(&req("a", 1.0, l), T0).unwrap();
        let end = t.last_end().unwrap();
        let before = t.clone();
        assert_eq!(
            t.apply_pinned(l, 0, Some(end), None, None),
            Err(ShareError::Empty)
        );
        assert_eq!(t, before);
        assert_eq!(
            t.apply_pinned(l, 0, Some(end - 1), None, None),
            Ok((0, false))
        );
    }
}
