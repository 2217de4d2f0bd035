//! Pins: an operator's limit on a key (`RL.PIN`), stored in the bucket and applied by every
//! command on it, whatever limit or `VERSION` the caller sends.
//!
//! Three kinds:
//! - a rate pin (`RL.PIN key rate cap`): the bucket is kept under the pinned limit. Its
//!   tokens carry over into it when the pin starts and out of it when the pin ends, by the
//!   never-mint rule of [`Level::new`] (clamped to the cap that governs next). Meanwhile the
//!   limit callers' versions resolve to is kept aside ([`Pin::base`]), so once the pin ends
//!   the bucket is back under that limit, as if the callers had been deciding all along.
//! - `BLOCK`: every take, lease and reservation is denied; nothing is written, the bucket
//!   refills as before.
//! - `EXEMPT`: every take, lease and reservation is granted and nothing is debited.
//!
//! A pin may end by itself (`PX`): from that instant the key decides as if it had been
//! unpinned then; the stored pin goes at the next write. A key pinned before any bucket was
//! there holds only the pin: once a `BLOCK` or `EXEMPT` pin ends, the key is as absent (a
//! full bucket under the caller's limit: nothing was taken meanwhile). A rate pin on such a
//! key holds only the pin too until the first call, which starts the bucket full under the
//! caller's limit carried over into the pinned one (`min` of the two caps): a pin never
//! starts a key above what it would hold unpinned.

use crate::version::{self, Applied};
use crate::{Bucket, Level, Limit, Nanos};

/// What a pin does, as replies name it (`rate`, `block`, `exempt`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PinKind {
    /// Decide under the pinned limit (the bucket's own limit while the pin lives).
    Rate,
    /// Denied: every take, lease and reservation of the key.
    Block,
    /// Granted, nothing debited (an allow list). Never refund or return such a grant.
    Exempt,
}

impl PinKind {
    /// The name replies use.
    pub fn name(self) -> &'static str {
        match self {
            PinKind::Rate => "rate",
            PinKind::Block => "block",
            PinKind::Exempt => "exempt",
        }
    }

    /// [`PinKind::name`] as the C string the module's replies carry.
    pub fn c_name(self) -> &'static std::ffi::CStr {
        match self {
            PinKind::Rate => c"rate",
            PinKind::Block => c"block",
            PinKind::Exempt => c"exempt",
        }
    }

    /// The kind a reply names (`None`: not a kind known here).
    pub fn parse(name: &str) -> Option<PinKind> {
        [PinKind::Rate, PinKind::Block, PinKind::Exempt]
            .into_iter()
            .find(|k| k.name() == name)
    }

    /// The code in effects and RDB.
    pub fn code(self) -> u64 {
        match self {
            PinKind::Rate => 1,
            PinKind::Block => 2,
            PinKind::Exempt => 3,
        }
    }

    pub fn from_code(c: u64) -> Option<PinKind> {
        match c {
            1 => Some(PinKind::Rate),
            2 => Some(PinKind::Block),
            3 => Some(PinKind::Exempt),
            _ => None,
        }
    }
}

impl std::fmt::Display for PinKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A pin, as stored with its bucket.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pin {
    pub kind: PinKind,
    /// When it ends (0: at `RL.UNPIN`).
    pub until: Nanos,
    /// The limit the bucket returns to when the pin ends: its own before the pin, or the
    /// one a caller with a newer `VERSION` gave meanwhile. For a `BLOCK` or `EXEMPT` pin it
    /// is the bucket's own limit (those never change it).
    pub base: Limit,
    /// The key held no bucket when it was pinned, and still holds none: `BLOCK` and
    /// `EXEMPT` until they end, a rate pin until the first call (which starts the bucket).
    pub absent: bool,
}

/// How long a caller refused by a `BLOCK` pin without an end is told to wait: the operator
/// may lift it any time, and a caller retrying once a minute costs nothing.
pub const BLOCKED_RETRY: Nanos = 60_000_000_000;

impl Pin {
    /// Whether the pin still governs at `now`.
    pub fn live_at(&self, now: Nanos) -> bool {
        self.until == 0 || now < self.until
    }

    /// Time left at `now` (`None`: no end).
    pub fn left(&self, now: Nanos) -> Option<Nanos> {
        (self.until != 0).then(|| self.until.saturating_sub(now))
    }
}

/// What a pin lets through at an instant (see [`Level::gate`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    /// The level decides (no pin, or a rate pin).
    Open,
    /// Denied; the wait a caller is told.
    Blocked(Nanos),
    /// Granted, nothing debited, nothing written.
    Exempt,
}

/// A [`Gate`] in one word, as a [`Level`] carries it (the hot path copies levels around):
/// 0 open, `u64::MAX` exempt, any other value a block's wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GateCode(u64);

impl GateCode {
    pub const OPEN: GateCode = GateCode(0);
    pub const EXEMPT: GateCode = GateCode(u64::MAX);

    pub fn of(g: Gate) -> GateCode {
        match g {
            Gate::Open => GateCode::OPEN,
            Gate::Exempt => GateCode::EXEMPT,
            Gate::Blocked(wait) => GateCode(wait.clamp(1, u64::MAX - 1)),
        }
    }

    pub fn gate(self) -> Gate {
        match self.0 {
            0 => Gate::Open,
            u64::MAX => Gate::Exempt,
            wait => Gate::Blocked(wait),
        }
    }
}

/// The outcome of opening a stored bucket for a call.
pub struct Opened {
    pub level: Level,
    pub applied: Applied,
    /// The kind of the live pin that decides the call, if any.
    pub pinned: Option<PinKind>,
}

/// `stored` refilled to `now` for a call with `limit` at `version`, under its pin if one
/// lives: the level the call is decided on, and which limit that is. The pin to store if
/// the call writes is [`kept`]'s (asked only when a pin decided: the hot path carries none).
#[inline]
pub fn open(stored: Option<&Bucket>, limit: Limit, version: u64, now: Nanos) -> Opened {
    match stored {
        Some(b) if b.has_pin() => open_holding_pin(b, limit, version, now),
        // The hot path: built in place, no pin to look at.
        _ => open_unpinned(stored, limit, version, now),
    }
}

/// [`open`] on a bucket without a live pin.
#[inline]
fn open_unpinned(stored: Option<&Bucket>, limit: Limit, version: u64, now: Nanos) -> Opened {
    let (level, applied) = version::open(stored, limit, version, now);
    Opened {
        level,
        applied,
        pinned: None,
    }
}

/// [`open`] on a bucket holding a pin, live or ended.
#[inline(never)]
fn open_holding_pin(b: &Bucket, limit: Limit, version: u64, now: Nanos) -> Opened {
    open_pinned(b, limit, version, now)
        .unwrap_or_else(|| open_unpinned(ended_pin(b).as_ref(), limit, version, now))
}

/// `b` without its ended pin (see [`ended`]).
fn ended_pin(b: &Bucket) -> Option<Bucket> {
    b.pin().and_then(|p| ended(b, &p))
}

/// [`open`] on a bucket holding a pin: `None` if the pin has ended.
fn open_pinned(b: &Bucket, limit: Limit, version: u64, now: Nanos) -> Option<Opened> {
    let pin = b.pin().filter(|p| p.live_at(now))?;
    Some(match pin.kind {
        PinKind::Rate if pin.absent => {
            // The key held nothing when it was pinned: the bucket it stands for is a full
            // one under the caller's limit (as an absent key is), carried over into the
            // pinned limit now, so it starts with `min(caller's cap, pin's cap)` tokens,
            // never more than the key would hold unpinned. The caller's limit and version
            // become the ones the bucket returns to (see `kept`).
            // A VERSION is new to the key (it stored none): written even if the call is
            // denied, as a newer one on a stored rate pin is.
            let (l, v, _) = version::resolve(None, limit, version);
            let full = Bucket::new(now, l);
            Opened {
                level: Level::new(Some(&full), b.limit(), now).with_version(v),
                applied: if v > 0 {
                    Applied::Replaced
                } else {
                    Applied::Pinned
                },
                pinned: Some(PinKind::Rate),
            }
        }
        PinKind::Rate => {
            // A newer VERSION replaces the limit the bucket returns to (stored even if the
            // call is denied: see `kept`); any other call changes nothing of it.
            let (_, v, applied) = version::resolve(Some((pin.base, b.version())), limit, version);
            let applied = if applied == Applied::Replaced {
                Applied::Replaced
            } else {
                Applied::Pinned
            };
            Opened {
                level: Level::new(Some(b), b.limit(), now).with_version(v),
                applied,
                pinned: Some(PinKind::Rate),
            }
        }
        PinKind::Block | PinKind::Exempt => {
            let gate = match pin.kind {
                PinKind::Block => Gate::Blocked(pin.left(now).unwrap_or(BLOCKED_RETRY)),
                _ => Gate::Exempt,
            };
            // Shown (and refilled) as the bucket underneath; a key that holds only the pin
            // shows a full bucket under the caller's limit.
            let level = if pin.absent {
                Level::new(None, limit, now)
            } else {
                Level::new(Some(b), b.limit(), now).with_version(b.version())
            };
            Opened {
                level: level.with_gate(gate),
                applied: Applied::Pinned,
                pinned: Some(pin.kind),
            }
        }
    })
}

/// The gate for a call that needs `needs` tokens at once on `stored`, when its live rate pin
/// decides the call: a pinned cap below them grants nothing while the pin lives, so the
/// call is denied as a `BLOCK` would deny it (told the pin's time left), not refused with an
/// error: the caller's own limit allowed it, and a client must not take the operator's pin
/// for an outage.
pub fn over_cap_gate(stored: Option<&Bucket>, needs: f64, now: Nanos) -> Gate {
    let live = stored.and_then(|b| {
        b.pin()
            .filter(|p| p.kind == PinKind::Rate && p.live_at(now))
            .map(|p| (b, p))
    });
    match live {
        Some((b, p)) if needs > b.limit().cap() => {
            Gate::Blocked(p.left(now).unwrap_or(BLOCKED_RETRY))
        }
        _ => Gate::Open,
    }
}

/// The pin a call with `limit` at `version` on `stored` leaves to store with its bucket
/// (for a call [`open`] said a live pin decided): a rate pin's base follows a newer
/// `VERSION`; `None` when no pin lives.
pub fn kept(stored: Option<&Bucket>, limit: Limit, version: u64, now: Nanos) -> Option<Pin> {
    let b = stored?;
    let pin = b.pin().filter(|p| p.live_at(now))?;
    if pin.kind != PinKind::Rate {
        return Some(pin);
    }
    if pin.absent {
        // The first call on a rate-pinned key that held nothing: its bucket now exists
        // (see `open_pinned`), returning to the caller's limit.
        let (base, _, _) = version::resolve(None, limit, version);
        return Some(Pin {
            base,
            absent: false,
            ..pin
        });
    }
    let (base, _, _) = version::resolve(Some((pin.base, b.version())), limit, version);
    Some(Pin { base, ..pin })
}

/// The bucket `b` (whose pin `pin` has ended) as it stands without it: a rate pin's tokens
/// carried over into the limit it returns to at the instant the pin ended; `None` for a key
/// that held only the pin.
pub fn ended(b: &Bucket, pin: &Pin) -> Option<Bucket> {
    if pin.absent {
        return None;
    }
    let bare = b.without_pin();
    match pin.kind {
        PinKind::Rate if pin.base != b.limit() => {
            // The level at the pin's end (or at the last write, if later: a clock that
            // stepped), moved to the base limit there.
            let at = pin.until.max(1);
            let back = Level::new(Some(&bare), pin.base, at)
                .with_version(b.version())
                .bucket();
            // Only the bucket's own hold keeps the key: no caller passes the pinned limit,
            // so its fill time (31 years at 1e-9/s) is no reason to keep an idle key.
            let (keep_until, span) = if bare.keep_until() > at {
                (bare.keep_until(), bare.keep_after_write())
            } else {
                (0, 0)
            };
            Some(
                Bucket::with_keep(back.full_at(), back.limit(), keep_until, span)
                    .with_version(b.version()),
            )
        }
        _ => Some(bare),
    }
}

/// The bucket `stored` (none: the key holds nothing) pinned with `kind` until `until` at
/// `now` (rate pins: to `limit`), replacing any pin it had.
pub fn pinned(
    stored: Option<&Bucket>,
    kind: PinKind,
    limit: Option<Limit>,
    until: Nanos,
    now: Nanos,
) -> Bucket {
    // The bucket as it stands now without its old pin.
    let current: Option<Bucket> = stored.and_then(|b| match b.pin() {
        Some(p) if !p.live_at(now) => ended(b, &p),
        Some(p) if p.absent => None,
        Some(p) if p.kind == PinKind::Rate => {
            // Back under its base, at now: the new pin starts from there.
            let bare = b.without_pin();
            Some(
                Level::new(Some(&bare), p.base, now)
                    .with_version(b.version())
                    .bucket(),
            )
        }
        Some(_) => Some(b.without_pin()),
        None => Some(*b),
    });
    match (kind, limit, current) {
        (PinKind::Rate, Some(pl), Some(b)) => {
            let level = Level::new(Some(&b), pl, now).with_version(b.version());
            level.bucket().with_pin(Some(Pin {
                kind,
                until,
                base: b.limit(),
                absent: false,
            }))
        }
        (PinKind::Rate, Some(pl), None) => {
            // Nothing underneath, and no caller's limit to say how full the bucket the key
            // stands for is (an absent key is full under whichever limit its caller
            // passes): the key holds only the pin (its limit as the bucket's and the
            // base, full_at 0) until the first call, which starts the bucket full under
            // its own limit carried over into the pin's (see `open_pinned`). Starting it
            // full under the pinned limit would hand a key the pin's whole cap when the
            // callers' limit holds less.
            Bucket::new(0, pl).with_pin(Some(Pin {
                kind,
                until,
                base: pl,
                absent: true,
            }))
        }
        (_, _, Some(b)) => b.with_pin(Some(Pin {
            kind,
            until,
            base: b.limit(),
            absent: false,
        })),
        (_, _, None) => {
            // Nothing underneath: a placeholder bucket, full, that no call reads (see
            // `Pin::absent`).
            let placeholder = Limit::new(1.0, 1.0).unwrap_or_else(|_| unreachable!());
            Bucket::new(0, placeholder).with_pin(Some(Pin {
                kind,
                until,
                base: placeholder,
                absent: true,
            }))
        }
    }
}

/// The bucket `stored` unpinned at `now`, or `None` if the key then holds nothing.
pub fn unpinned(stored: &Bucket, now: Nanos) -> Option<Bucket> {
    let pin = stored.pin()?;
    let end = Pin {
        until: if pin.live_at(now) { now } else { pin.until },
        ..pin
    };
    ended(stored, &end)
}

/// A stored bucket refilled to `now` under what governs it then (its pin's gate carried),
/// for the commands that give no limit (`RL.PEEK`, `RL.REFUND`, `RL.RETURN`), with the pin
/// to store with it if the call writes; `None` if the key is as absent (it held only a
/// pin, now ended or never over a bucket).
pub fn level_of_stored(b: &Bucket, now: Nanos) -> Option<(Level, Option<Pin>)> {
    let Some(pin) = b.pin() else {
        return Some((
            Level::new(Some(b), b.limit(), now).with_version(b.version()),
            None,
        ));
    };
    if !pin.live_at(now) {
        let bare = ended(b, &pin)?;
        return Some((
            Level::new(Some(&bare), bare.limit(), now).with_version(bare.version()),
            None,
        ));
    }
    if pin.absent {
        return None;
    }
    let gate = match pin.kind {
        PinKind::Rate => Gate::Open,
        PinKind::Block => Gate::Blocked(pin.left(now).unwrap_or(BLOCKED_RETRY)),
        PinKind::Exempt => Gate::Exempt,
    };
    Some((
        Level::new(Some(b), b.limit(), now)
            .with_version(b.version())
            .with_gate(gate),
        Some(pin),
    ))
}

#[cfg(test)]
mod tests {
    use super::PinKind;

    #[test]
    fn names_agree() {
        for kind in [PinKind::Rate, PinKind::Block, PinKind::Exempt] {
            assert_eq!(kind.c_name().to_str(), Ok(kind.name()));
            assert_eq!(PinKind::parse(kind.name()), Some(kind));
        }
    }
}
