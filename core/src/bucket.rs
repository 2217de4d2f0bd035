//! A bucket's stored state ([`Bucket`]) and the same bucket refilled to an instant ([`Level`]).

use crate::pin::{Gate, GateCode, Pin};
use crate::{round, Limit, Nanos};

/// What `RL.MTAKE` decided over several buckets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AllOrNothing {
    /// Every bucket was debited.
    pub granted: bool,
    /// The bucket with the longest wait (the last of equals), the one that denies.
    pub worst: usize,
    /// That wait (`u64::MAX` if it can never grant).
    pub longest: Nanos,
}

/// Takes `n` from every level, or from none: all are looked at before any is debited.
pub fn take_all(levels: &mut [Level], n: f64) -> AllOrNothing {
    let (worst, longest) = levels
        .iter()
        .map(|l| l.wait_for(n).unwrap_or(u64::MAX))
        .enumerate()
        .max_by_key(|&(_, w)| w)
        .unwrap_or((0, 0));
    let granted = longest == 0;
    if granted {
        for l in levels.iter_mut() {
            // Each has `n` (its wait is 0), so each take succeeds.
            l.try_take(n);
        }
    }
    AllOrNothing {
        granted,
        worst,
        longest,
    }
}

/// The deficit of a bucket `deficit` ns from full under `old`, carried over to `new`: the
/// same tokens (clamped to the new cap), rounded so none appear. Every step rounds toward
/// fewer tokens, so a limit that alternates back and forth can only lose fractions.
/// The time a write keeps the key alive, as of instant `at`: the bucket's own while its
/// `keep_until` has not passed (a key past it is one Redis is about to drop), else none.
fn live_keep_after_write(b: &Bucket, at: Nanos) -> Nanos {
    if b.keep_until > at {
        b.keep_after_write
    } else {
        0
    }
}

fn carry_over(deficit: Nanos, old: &Limit, new: &Limit) -> Nanos {
    if old.rate() == new.rate() {
        // Only the cap moved: the missing tokens change by the difference of the caps,
        // which is a time at this rate. Kept in integer nanoseconds, so a cap flapping
        // between two values loses nothing either way (through tokens, at a cap of 1e15 a
        // float step is 0.125 tokens).
        return if new.cap() >= old.cap() {
            let grown = new.nanos_for(round::sub_up(new.cap(), old.cap()));
            deficit.saturating_add(grown).min(new.fill_nanos())
        } else {
            let shrunk = new.nanos_for_floor(round::sub_down(old.cap(), new.cap()));
            deficit.saturating_sub(shrunk).min(new.fill_nanos())
        };
    }
    let missing = old.tokens_for_up(deficit);
    let tokens = round::sub_down(old.cap(), missing).clamp(0.0, new.cap());
    let missing = round::sub_up(new.cap(), tokens).min(new.cap());
    new.nanos_for(missing).min(new.fill_nanos())
}

/// Latest `full_at` a stored bucket may carry: keeps `full_at / 1e6` a valid `i64`
/// millisecond expiry and leaves values above it free as markers for the storage layer.
pub const MAX_INSTANT: Nanos = i64::MAX as Nanos;

/// The expiry of a key that must not expire (a pin without an end): above every instant a
/// bucket can hold.
pub const NEVER: Nanos = u64::MAX;

/// A key's expiry (ms) for a state that may go at `at`: rounded up to milliseconds so the
/// key never goes before its state is done, and none (`-1`, what Redis reports for a key
/// without one) for [`NEVER`].
pub fn expiry_ms(at: Nanos) -> i64 {
    if at == NEVER {
        -1
    } else {
        crate::ceil_millis(at) as i64
    }
}

/// The state of one bucket: the instant it is full again and the exact limit it was last
/// written under.
///
/// `full_at <= now` means full, and an absent key means the same thing. The limit is
/// needed when a caller changes it (to carry the tokens over exactly) and when a command
/// gives none (`RL.RETURN`, `RL.PEEK`). It is kept exact: an approximate limit would read a
/// stored instant under a slightly different rate and mint or lose tokens. (The module
/// stores it in fewer bytes when it can do so exactly.)
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bucket {
    full_at: Nanos,
    limit: Limit,
    /// The key must live at least until this instant (0: no such need). See `keep_after_write`.
    keep_until: Nanos,
    /// After a write changed the bucket's limit: the longest time to fill of the limits it
    /// was written under since, and every write keeps the key until `keep_after_write` after
    /// it (`keep_until`). Were the key to go as soon as it is full under a smaller cap, a caller
    /// still on an old, larger limit would find no key, that is a full bucket, and tokens
    /// would appear; a bucket idle that long is full under every one of its limits, so
    /// dropping it then creates none. 0 for a bucket only ever used with one limit.
    keep_after_write: Nanos,
    /// The version of the limit it holds (`VERSION v`; 0: never given one). See
    /// [`crate::version`].
    version: u64,
    /// An operator's pin (`RL.PIN`; see [`crate::pin`]).
    pin: Option<Pin>,
}

impl Bucket {
    pub fn new(full_at: Nanos, limit: Limit) -> Bucket {
        Bucket::with_keep(full_at, limit, 0, 0)
    }

    /// A bucket whose key must live until `keep_until`, and `keep_after_write` after every
    /// write (see [`Bucket::keep_after_write`]).
    pub fn with_keep(
        full_at: Nanos,
        limit: Limit,
        keep_until: Nanos,
        keep_after_write: Nanos,
    ) -> Bucket {
        Bucket {
            full_at: full_at.min(MAX_INSTANT),
            limit,
            keep_until: keep_until.min(MAX_INSTANT),
            keep_after_write,
            version: 0,
            pin: None,
        }
    }

    /// The same bucket with `pin` (none: unpinned).
    pub fn with_pin(self, pin: Option<Pin>) -> Bucket {
        Bucket { pin, ..self }
    }

    /// The same bucket, full at `full_at` and kept until `keep_until` instead (what a take
    /// changes).
    pub fn moved(self, full_at: Nanos, keep_until: Nanos) -> Bucket {
        Bucket {
            full_at: full_at.min(MAX_INSTANT),
            keep_until: keep_until.min(MAX_INSTANT),
            ..self
        }
    }

    /// The same bucket without its pin.
    pub fn without_pin(self) -> Bucket {
        Bucket { pin: None, ..self }
    }

    /// Its pin, live or ended (see [`Pin::live_at`]).
    pub fn pin(&self) -> Option<Pin> {
        self.pin
    }

    /// Whether it holds a pin, live or ended (without copying it out: the hot path asks).
    #[inline]
    pub fn has_pin(&self) -> bool {
        self.pin.is_some()
    }

    /// The same bucket holding a limit of version `version`.
    pub fn with_version(self, version: u64) -> Bucket {
        Bucket { version, ..self }
    }

    /// The version of the limit this bucket holds (0: never given one).
    pub fn version(&self) -> u64 {
        self.version
    }

    /// Rebuilds a bucket from stored parts (RDB, a replicated effect), or `None` if they
    /// could not have been written by this crate.
    pub fn from_parts(full_at: Nanos, rate: f64, cap: f64) -> Option<Bucket> {
        let limit = Limit::new(rate, cap).ok()?;
        (full_at <= MAX_INSTANT).then_some(Bucket::new(full_at, limit))
    }

    /// The instant before which the key must not go even if the bucket is full (0: none).
    pub fn keep_until(&self) -> Nanos {
        self.keep_until
    }

    /// How long after each write the key must stay, since its limit changed (0: never).
    pub fn keep_after_write(&self) -> Nanos {
        self.keep_after_write
    }

    /// When the key may go: full, past `keep_until`, and its pin ended ([`NEVER`] for a
    /// pin without an end). A pin with an end keeps the key until it ends and then as long
    /// as the bucket it leaves behind needs to fill: a rate pin's tokens carried over into
    /// the limit it returns to may be far below that limit's cap, and a key that went at
    /// the pin's end would come back full.
    pub fn expires_at(&self) -> Nanos {
        let at = self.full_at.max(self.keep_until);
        match self.pin {
            None => at,
            Some(p) if p.until == 0 => NEVER,
            Some(p) => {
                let after = crate::pin::ended(self, &p).map_or(0, |b| b.expires_at());
                p.until.max(after)
            }
        }
    }

    pub fn full_at(&self) -> Nanos {
        self.full_at
    }

    /// The limit this bucket was last written under.
    pub fn limit(&self) -> Limit {
        self.limit
    }
}

/// A bucket refilled to an instant under a limit: what a command reads, changes and writes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Level {
    limit: Limit,
    /// The instant the level is taken at: the caller's `now`, except after the clock stepped
    /// back, where it stays where the stored state puts it so no tokens appear.
    at: Nanos,
    /// How far the caller's clock is behind `at` (0 unless it stepped back).
    behind: Nanos,
    /// Nanoseconds until full; `0..=limit.fill_nanos()`.
    deficit: Nanos,
    /// See [`Bucket::keep_after_write`]: the stored one while `keep_until` has not passed.
    keep_after_write: Nanos,
    /// The version of the limit, stored with the bucket (see [`Bucket::version`]).
    version: u64,
    /// What the bucket's pin lets through now (the pin itself travels beside the level:
    /// see [`crate::pin::Opened`]).
    gate: GateCode,
}

impl Level {
    /// `bucket` refilled to `now` under `limit`; an absent bucket is full. If the bucket was
    /// written under another limit, its tokens carry over, clamped to the new cap. The
    /// bucket's version is kept (see [`Level::with_version`]).
    #[inline]
    pub fn new(bucket: Option<&Bucket>, limit: Limit, now: Nanos) -> Level {
        let Some(b) = bucket else {
            return Level {
                limit,
                at: now,
                behind: 0,
                deficit: 0,
                keep_after_write: 0,
                version: 0,
                gate: GateCode::OPEN,
            };
        };
        if b.limit == limit {
            let mut level = Level::refill(b.full_at, limit, now);
            level.keep_after_write = live_keep_after_write(b, level.at);
            level.version = b.version;
            return level;
        }
        let old = Level::refill(b.full_at, b.limit, now);
        // The key now stays until it has been idle as long as the old limit takes to fill,
        // so a caller still passing that limit finds these tokens, not a fresh full bucket.
        Level {
            deficit: carry_over(old.deficit, &b.limit, &limit),
            limit,
            keep_after_write: live_keep_after_write(b, old.at).max(b.limit.fill_nanos()),
            version: b.version,
            ..old
        }
    }

    /// The same level behind a pin that lets through what `gate` says.
    pub fn with_gate(self, gate: Gate) -> Level {
        Level {
            gate: GateCode::of(gate),
            ..self
        }
    }

    /// What the pin lets through ([`Gate::Open`]: the level decides).
    pub fn gate(&self) -> Gate {
        self.gate.gate()
    }

    /// The same level, its limit of version `version` (what the bucket stores).
    #[inline]
    pub fn with_version(mut self, version: u64) -> Level {
        self.version = version;
        self
    }

    /// The version of the limit (see [`Bucket::version`]).
    pub fn version(&self) -> u64 {
        self.version
    }

    /// A bucket that does not exist yet, starting with `tokens` instead of full (warm start).
    pub fn starting_with(limit: Limit, tokens: f64, now: Nanos) -> Level {
        let tokens = tokens.clamp(0.0, limit.cap());
        // Rounded up, as every debit: at a cap of 1e15 a float step is 0.125 tokens.
        let deficit = limit.nanos_for(round::sub_up(limit.cap(), tokens));
        Level {
            limit,
            at: now,
            behind: 0,
            deficit,
            keep_after_write: 0,
            version: 0,
            gate: GateCode::OPEN,
        }
    }

    fn refill(full_at: Nanos, limit: Limit, now: Nanos) -> Level {
        // A clock that stepped back must not show more tokens than an empty bucket has, nor
        // let a write move `full_at` back: never take the level before the bucket was empty.
        let ahead = full_at.saturating_sub(now);
        let at = if limit.clearly_below(ahead, limit.cap()) {
            // The common case, decided without the exactly rounded fill time.
            now
        } else {
            now.max(full_at.saturating_sub(limit.fill_nanos()))
        };
        Level {
            limit,
            at,
            behind: at - now,
            deficit: full_at.saturating_sub(at),
            keep_after_write: 0,
            version: 0,
            gate: GateCode::OPEN,
        }
    }

    pub fn limit(&self) -> &Limit {
        &self.limit
    }

    /// Tokens in the bucket, fractional, in `[0, cap]`.
    pub fn tokens(&self) -> f64 {
        (self.limit.cap() - self.limit.tokens_for(self.deficit)).max(0.0)
    }

    /// Tokens in the bucket now, negative while it is in debt (after `RL.RESERVE`, or a
    /// clock that stepped back): what a caller would have to wait out, in tokens.
    /// Never negative out of debt: the time owed is whole nanoseconds, rounded up, so a
    /// bucket emptied exactly converts back to a hair below 0.
    pub fn signed_tokens(&self) -> f64 {
        let owed = self.behind + self.deficit;
        let tokens = self.limit.cap() - self.limit.tokens_for(owed);
        if tokens < 0.0 && owed <= self.limit.fill_nanos() {
            0.0
        } else {
            tokens
        }
    }

    /// The largest deficit at which `n` tokens are there, or `None` if `n > cap`.
    fn deficit_allowing(&self, n: f64) -> Option<Nanos> {
        let spare = round::sub_down(self.limit.cap(), n);
        (spare >= 0.0).then(|| self.limit.nanos_for_floor(spare))
    }

    /// How long until `n` tokens are there (0 if they are now), or `None` if never (`n > cap`).
    /// Exact: a caller that waits this long finds them, unless someone else took them.
    #[inline]
    pub fn wait_for(&self, n: f64) -> Option<Nanos> {
        match self.gate() {
            Gate::Open => {}
            Gate::Blocked(wait) => return Some(wait.max(1)),
            // Granted at once whatever the bucket underneath holds or was written under:
            // the caller's `n` was checked against the caller's own limit.
            Gate::Exempt => return Some(0),
        }
        let wait = |ok| self.deficit.saturating_sub(ok);
        self.deficit_allowing(n).map(|ok| {
            if wait(ok) == 0 {
                0
            } else {
                self.behind + wait(ok)
            }
        })
    }

    /// Whether `n` tokens are there now (the same answer as `wait_for(n) == Some(0)`, most
    /// often without its exactly rounded arithmetic).
    #[inline]
    fn has(&self, n: f64) -> bool {
        let spare = self.limit.cap() - n;
        if spare < 0.0 {
            return false;
        }
        if self.limit.clearly_below(self.deficit, spare) {
            return true;
        }
        if self.limit.clearly_above(self.deficit, spare) {
            return false;
        }
        self.wait_for(n) == Some(0)
    }

    /// Takes `n` tokens if they are all there; otherwise changes nothing.
    #[inline]
    pub fn try_take(&mut self, n: f64) -> bool {
        if self.gate != GateCode::OPEN {
            return self.gate == GateCode::EXEMPT;
        }
        if !self.has(n) {
            return false;
        }
        self.deficit += self.limit.nanos_for(n);
        true
    }

    /// Takes as many whole tokens as are there, up to `n`, if that is at least `min`;
    /// returns how many were taken (0 if fewer than `min` were there).
    pub fn take_up_to(&mut self, n: u64, min: u64) -> u64 {
        match self.gate() {
            Gate::Open => {}
            Gate::Blocked(_) => return 0,
            // All of it, nothing debited (see `wait_for`).
            Gate::Exempt => return if n >= min.max(1) { n } else { 0 },
        }
        let mut got = n.min(self.tokens().floor() as u64);
        // `tokens()` and the time check round differently; trust the time check.
        while got >= min.max(1) {
            if self.try_take(got as f64) {
                return got;
            }
            got -= 1;
        }
        0
    }

    /// Gives `tokens` back, clamped to `cap`. A bucket behind now (in debt after
    /// `RL.RESERVE`, or after the clock stepped back) takes nothing back: its coming tokens
    /// are promised to callers already waiting for a set instant, and moving its full
    /// instant back would let a later caller be promised the same instant.
    pub fn credit(&mut self, tokens: f64) {
        // An exempt grant debited nothing: nothing to give back.
        if self.behind > 0 || self.gate == GateCode::EXEMPT {
            return;
        }
        self.deficit = self
            .deficit
            .saturating_sub(self.limit.nanos_for_floor(tokens));
    }

    /// `RL.REFUND`: gives back up to `n` tokens, as many as the bucket lacks (nothing while
    /// it is in debt: see [`Level::credit`]); returns how many it took back.
    pub fn refund(&mut self, n: u64) -> f64 {
        if self.behind > 0 || self.gate == GateCode::EXEMPT {
            return 0.0;
        }
        let missing = self.limit.tokens_for(self.deficit);
        let credited = (n as f64).min(missing);
        self.credit(credited);
        credited
    }

    /// `RL.RESERVE`: takes `n` tokens now if they are there, or will be within `max_wait`;
    /// the bucket then goes into debt, and later callers wait behind this one. Returns the
    /// wait before the tokens may be used, and whether they were granted (denied: nothing
    /// changes, and the wait is the one that would have been needed). `None` if `n > cap`.
    pub fn reserve(&mut self, n: f64, max_wait: Nanos) -> Option<(bool, Nanos)> {
        let wait = self.wait_for(n)?;
        match self.gate() {
            Gate::Open => {}
            // Denied whatever the wait allowed (the pin may be lifted at any time).
            Gate::Blocked(w) => return Some((false, w)),
            Gate::Exempt => return Some((true, 0)),
        }
        if wait > max_wait {
            return Some((false, wait));
        }
        self.deficit += self.limit.nanos_for(n);
        Some((true, wait))
    }

    /// Gives back up to `n` tokens, as many as fit below `cap` (a bucket that refilled
    /// meanwhile takes only what it lacks). Returns the tokens taken back, a partly taken
    /// last one counted: `min(n, ceil(missing))`, 0 for a full bucket.
    pub fn credit_up_to(&mut self, n: u64) -> u64 {
        if self.behind > 0 || self.gate == GateCode::EXEMPT {
            return 0;
        }
        let missing = self.limit.tokens_for(self.deficit).ceil();
        self.credit(n as f64);
        n.min(missing as u64)
    }

    /// Gives back `n` tokens a settle found unused (`RL.SETTLE`), in debt too: the time owed,
    /// debt included, shrinks by what `n` tokens refill, never below full. Returns the whole
    /// tokens credited: at most `n` and at most the tokens missing, debt included, rounded
    /// up; 0 under `EXEMPT`. Unlike [`Level::credit_up_to`] a bucket in debt takes them
    /// back: they are tokens a reservation took and nobody used (while one call's overage
    /// keeps a key in debt, the others' unused estimates still come back). As for any
    /// refund, a bucket that was full meanwhile cannot tell that they would have been
    /// refilled over its cap: the refund allowance, at most `min(n, rate * time out)`
    /// (docs/budgets.md, the bound).
    pub(crate) fn credit_owed(&mut self, n: u64) -> u64 {
        if self.gate == GateCode::EXEMPT {
            return 0;
        }
        let owed = self.owed();
        let missing = self.limit.tokens_for(owed).ceil();
        let back = self.limit.nanos_for_floor(n as f64).min(owed);
        let now = self.at - self.behind;
        let full_at = (self.at + self.deficit).saturating_sub(back);
        let moved = Level::refill(full_at, self.limit, now);
        self.at = moved.at;
        self.behind = moved.behind;
        self.deficit = moved.deficit;
        n.min(missing as u64)
    }

    /// Time owed until full, debt included (what [`Level::reset_after`] reports).
    pub(crate) fn owed(&self) -> Nanos {
        self.behind.saturating_add(self.deficit)
    }

    /// Adds `ns` to the time until full: a debit that may take the bucket into debt (the
    /// caller bounds it; see `crate::budget::charge`).
    pub(crate) fn owe(&mut self, ns: Nanos) {
        self.deficit = self.deficit.saturating_add(ns);
    }

    /// Time until the bucket is full again.
    pub fn reset_after(&self) -> Nanos {
        self.behind + self.deficit
    }

    /// The state to store, with `pin` (see [`crate::pin::Opened`]).
    #[inline]
    pub fn bucket_with_pin(&self, pin: Option<Pin>) -> Bucket {
        let mut b = self.bucket();
        b.pin = pin;
        b
    }

    /// The state to store.
    pub fn bucket(&self) -> Bucket {
        let keep_until = if self.keep_after_write > 0 {
            self.at.saturating_add(self.keep_after_write)
        } else {
            0
        };
        Bucket::with_keep(
            self.at + self.deficit,
            self.limit,
            keep_until,
            self.keep_after_write,
        )
        .with_version(self.version)
    }
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
    fn absent_bucket_is_full() {
        let l = Level::new(None, limit(10.0, 5.0), T0);
        assert_eq!(l.tokens(), 5.0);
        assert_eq!(l.reset_after(), 0);
        assert_eq!(l.bucket().full_at(), T0);
    }

    #[test]
    fn take_debits_and_refills_with_time() {
        let lim = limit(2.0, 4.0);
        let mut l = Level::new(None, lim, T0);
        assert!(l.try_take(3.0));
        assert_eq!(l.tokens(), 1.0);
        assert!(!l.try_take(2.0));
        assert_eq!(l.wait_for(2.0), Some(S / 2));
        let b = l.bucket();
        let later = Level::new(Some(&b), lim, T0 + S / 2);
        assert_eq!(later.tokens(), 2.0);
        assert_eq!(later.wait_for(2.0), Some(0));
        assert_eq!(later.reset_after(), S);
    }

    #[test]
    fn fractional_rate() {
        let lim = limit(0.5, 1.0);
        let mut l = Level::new(None, lim, T0);
        assert!(l.try_take(1.0));
        assert_eq!(l.wait_for(1.0), Some(2 * S));
        let b = l.bucket();
        let l = Level::new(Some(&b), lim, T0 + S);
        assert!((l.tokens() - 0.5).abs() < 1e-9);
    }

    #[test]
    fn never_more_than_cap() {
        let lim = limit(100.0, 3.0);
        let mut l = Level::new(None, lim, T0);
        assert!(l.try_take(1.0));
        let b = l.bucket();
        let l = Level::new(Some(&b), lim, T0 + 3600 * S);
        assert_eq!(l.tokens(), 3.0);
        assert_eq!(l.reset_after(), 0);
    }

    #[test]
    fn n_above_cap_never_fits() {
        let l = Level::new(None, limit(1.0, 2.5), T0);
        assert_eq!(l.wait_for(3.0), None);
        assert_eq!(l.wait_for(2.0), Some(0));
    }

    #[test]
    fn cap_change_carries_tokens_clamped() {
        let mut l = Level::new(None, limit(1.0, 10.0), T0);
        assert!(l.try_take(2.0));
        let b = l.bucket();
        // Shrinking the cap clamps the 8 tokens to 5.
        let small = Level::new(Some(&b), limit(1.0, 5.0), T0);
        assert!((small.tokens() - 5.0).abs() < 1e-6);
        // Growing it keeps the 8 tokens; the bucket is now 12 short of full.
        let big = Level::new(Some(&b), limit(2.0, 20.0), T0);
        assert!((big.tokens() - 8.0).abs() < 1e-6);
        assert_eq!(big.reset_after(), 6 * S);
    }

    #[test]
    fn clock_step_back_mints_nothing() {
        let lim = limit(1.0, 10.0);
        let mut l = Level::new(None, lim, T0);
        assert!(l.try_take(10.0));
        let b = l.bucket();
        // The clock steps back an hour: still empty, and the level stays at the empty point.
        let mut back = Level::new(Some(&b), lim, T0 - 3600 * S);
        assert_eq!(back.tokens(), 0.0);
        // Behind the stored state, a credit takes nothing back (it cannot tell a clock
        // step from a debt whose coming tokens are promised).
        back.credit(1.0);
        let b2 = back.bucket();
        assert_eq!(b2.full_at(), b.full_at());
        // Nothing refills until the original clock catches up.
        let l = Level::new(Some(&b2), lim, T0);
        assert_eq!(l.tokens(), 0.0);
    }

    #[test]
    fn take_up_to_respects_min() {
        let lim = limit(1.0, 10.0);
        let mut l = Level::new(None, lim, T0);
        assert!(l.try_take(7.5));
        assert_eq!(l.take_up_to(5, 2), 2);
        assert_eq!(l.take_up_to(5, 1), 0);
        let mut l = Level::new(None, lim, T0);
        assert!(l.try_take(7.5));
        assert_eq!(l.take_up_to(5, 3), 0);
        assert!((l.tokens() - 2.5).abs() < 1e-9);
    }

    #[test]
    fn credit_says_what_the_bucket_took_back() {
        let lim = limit(1.0, 10.0);
        let mut l = Level::new(None, lim, T0);
        assert!(l.try_take(3.0));
        // 3 missing: a return of 5 takes back 3 and fills the bucket.
        assert_eq!(l.clone().credit_up_to(5), 3);
        // Refilled by half a token meanwhile: 2.5 missing, counted as 3, and 2.5 credited.
        let mut later = Level::new(Some(&l.bucket()), lim, T0 + S / 2);
        assert_eq!(later.credit_up_to(5), 3);
        assert_eq!(later.tokens(), 10.0);
        // Full: nothing.
        let mut full = Level::new(None, lim, T0);
        assert_eq!(full.credit_up_to(5), 0);
        assert_eq!(l.credit_up_to(2), 2);
        assert!((l.tokens() - 9.0).abs() < 1e-9);
    }

    #[test]
    fn a_limit_change_keeps_the_key_until_idle_as_long_as_the_old_limit_fills() {
        let big = limit(1.0, 1000.0);
        let small = limit(1000.0, 10.0);
        let mut l = Level::new(None, big, T0);
        assert!(l.try_take(999.0));
        let under_big = l.bucket();
        assert_eq!(
            (under_big.keep_until(), under_big.keep_after_write()),
            (0, 0)
        );
        // One call under the small limit: full under it within 10 ms...
        let mut s = Level::new(Some(&under_big), small, T0);
        assert!(s.try_take(1.0));
        let b = s.bucket();
        assert!(b.full_at() <= T0 + 10 * S / 1000);
        // ...but the key stays until idle as long as the big limit takes to fill.
        assert_eq!(b.keep_after_write(), big.fill_nanos());
        assert_eq!(b.expires_at(), T0 + big.fill_nanos());
        // A caller back on the big limit finds the small bucket's tokens, not 1000.
        let mut back = Level::new(Some(&b), big, T0 + 30 * S / 1000);
        assert!(back.tokens() <= 10.0 + 1e-9);
        assert!(!back.try_take(11.0));
        assert!(back.try_take(1.0));
        // Every write moves `keep_until` on.
        let again = back.bucket();
        assert_eq!(again.keep_until(), T0 + 30 * S / 1000 + big.fill_nanos());
        // Once `keep_until` has passed, `keep_after_write` goes with it.
        let later = Level::new(Some(&again), big, again.keep_until() + 1);
        assert_eq!(later.bucket().keep_after_write(), 0);
    }

    #[test]
    fn init_rounds_the_safe_way_at_large_caps() {
        // At a cap of 1e15 a float step is 0.125 tokens: 0.95 must not round to 1.
        for cap in [999_999_999_999_999.0, 562_949_953_421_313.0] {
            let mut l = Level::starting_with(limit(1e9, cap), 0.95, T0);
            assert!(!l.try_take(1.0), "cap {cap}");
        }
    }

    #[test]
    fn reserve_queues_callers_in_debt_and_refund_pays_it_back() {
        let lim = limit(10.0, 10.0);
        let mut l = Level::new(None, lim, T0);
        // 10 there: the first 10 wait nothing.
        assert_eq!(l.reserve(10.0, 0), Some((true, 0)));
        // The next 5 arrive in 0.5 s: granted now, wait 0.5 s, bucket 5 in debt.
        assert_eq!(l.reserve(5.0, S), Some((true, S / 2)));
        let b = l.bucket();
        let mut now = Level::new(Some(&b), lim, T0);
        assert!(
            (now.signed_tokens() + 5.0).abs() < 1e-9,
            "{}",
            now.signed_tokens()
        );
        // The next caller queues behind: 1 token in 0.6 s; a take gets nothing meanwhile.
        assert!(!now.clone().try_take(1.0));
        assert_eq!(now.wait_for(1.0), Some(S / 2 + S / 10));
        // Too long a wait: denied, nothing changes.
        let before = now.bucket();
        assert_eq!(now.reserve(5.0, S / 2), Some((false, S)));
        assert_eq!(now.bucket(), before);
        // In debt, a refund takes nothing back: the coming tokens are promised.
        assert_eq!(now.refund(3), 0.0);
        assert_eq!(now.bucket(), before);
        // Once the debt is paid by time, refunds credit again, never above cap.
        let mut paid = Level::new(Some(&before), lim, T0 + S / 2 + 2 * S / 10);
        let lacking = 10.0 - paid.signed_tokens();
        assert!(lacking <= 10.0);
        assert!((paid.refund(100) - lacking).abs() < 1e-9);
        assert_eq!(paid.reset_after(), 0);
        // More than cap is never reserved.
        assert_eq!(now.reserve(11.0, S), None);
    }

    #[test]
    fn warm_start() {
        let l = Level::starting_with(limit(10.0, 100.0), 20.0, T0);
        assert!((l.tokens() - 20.0).abs() < 1e-9);
        assert_eq!(l.reset_after(), 8 * S);
    }

    #[test]
    fn from_parts_validates() {
        assert!(Bucket::from_parts(T0, 1.0, 1.0).is_some());
        assert!(Bucket::from_parts(T0, f64::NAN, 1.0).is_none());
        assert!(Bucket::from_parts(T0, 1.0, -1.0).is_none());
        assert!(Bucket::from_parts(u64::MAX, 1.0, 1.0).is_none());
    }

    #[test]
    fn tiny_limit_changes_are_exact() {
        // Limits that would round to one 32-bit float are still different limits.
        let cap = 1e9;
        let mut l = Level::new(None, limit(0.5, cap), T0);
        assert!(l.try_take(cap));
        let b = l.bucket();
        let mut slower = Level::new(Some(&b), limit(0.49999999, cap), T0);
        assert!(slower.tokens() < 1e-6, "{}", slower.tokens());
        assert!(!slower.try_take(1.0));
        let big = 1073741889.0;
        let mut l = Level::new(None, limit(0.5, big), T0);
        assert!(l.try_take(big));
        let b = l.bucket();
        let mut faster = Level::new(Some(&b), limit(1.0, big), T0);
        assert!(!faster.try_take(1.0), "{}", faster.tokens());
    }
}
