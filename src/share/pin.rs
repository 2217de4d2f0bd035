//! Pins on share keys (`RL.PIN key [SHARES] rate cap|BLOCK|EXEMPT [PX ms]`, and `RL.UNPIN`,
//! `RL.PINNED` on such a key): `RL.SHARE` divides the pinned rate and cap, or answers every
//! holder a zero share (`BLOCK`), or the callers' whole limit to use without counting
//! (`EXEMPT`), whatever limit its callers send (see [`rl_core::share`]). Called by the pin
//! commands in [`crate::bucket::pin`] once they found a share key, or were told `SHARES`.
//!
//! Setting or removing a pin changes nothing else: what holders were given stays counted
//! until it ends, so the holders reach the limit that governs next within one lease and
//! never sum above it. The effect is `RL.SETSHARES key rate cap version now pin`.

use crate::error::{Error, Result};
use crate::ffi::Ctx;
use crate::observe::stats;
use crate::reply::Reply;
use crate::share::{self, ShareKey};
use rl_core::pin::PinKind;
use rl_core::share::SharePin;
use rl_core::{Limit, Nanos, ShareTable};

/// Pins the share key `key` (one that holds nothing gets the pin alone).
pub fn pin(ctx: Ctx, key: &ShareKey, pin: SharePin, now: Nanos) -> Result<Reply> {
    match key.table()? {
        None => {
            // The limit is a placeholder: the first holder's call sets the callers' own.
            let limit = pin
                .limit
                .unwrap_or_else(|| Limit::new(1.0, 1.0).unwrap_or_else(|_| unreachable!()));
            let t =
                ShareTable::validate_pinned(limit.rate(), limit.cap(), 0, Vec::new(), Some(pin))
                    .map_err(|e| Error::Invalid(e.message()))?;
            share::propagate_pin(ctx, key.name(), &t, now);
            let at = t.expires_at();
            key.create(t, at);
        }
        Some(t) => {
            let was_pinned = t.pin().is_some();
            let pruned = t.set_pin(Some(pin), now);
            share::moved(pruned, 0);
            share::pinned_keys(was_pinned, true);
            key.expire_at(t.expires_at());
            share::propagate_pin(ctx, key.name(), t, now);
        }
    }
    stats::PINS_SET.add(1);
    Ok(Reply::Ok)
}

/// `RL.UNPIN` on a share key: 1 if a live pin went (and with it a key that held nothing
/// else), else 0.
pub fn unpin(ctx: Ctx, key: &ShareKey, now: Nanos) -> Result<Reply> {
    let Some(t) = key.table()? else {
        return Ok(Reply::Int(0));
    };
    if t.live_pin(now).is_none() {
        return Ok(Reply::Int(0));
    }
    let pruned = t.set_pin(None, now);
    share::moved(pruned, 0);
    share::pinned_keys(true, false);
    stats::PINS_REMOVED.add(1);
    if t.holders().is_empty() {
        key.delete();
        crate::effect::deleted(ctx, key.name());
    } else {
        key.expire_at(t.expires_at());
        share::propagate_pin(ctx, key.name(), t, now);
    }
    Ok(Reply::Int(1))
}

/// `RL.PINNED` on a share key: `kind` (`rate`, `block`, `exempt`), `rate` and `cap` (a
/// rate pin's; nil otherwise), `ms_left` (-1: until `RL.UNPIN`); nil without a live pin.
pub fn describe(t: &ShareTable, now: Nanos) -> Reply {
    let Some(p) = t.live_pin(now) else {
        return Reply::Null;
    };
    let (rate, cap) = match p.limit {
        Some(l) => (Reply::Double(l.rate()), Reply::Double(l.cap())),
        None => (Reply::Null, Reply::Null),
    };
    let left = p.left(now).map_or(-1, |ns| {
        rl_core::ceil_millis(ns).min(i64::MAX as u64) as i64
    });
    Reply::fields([
        (c"kind", Reply::Text(p.kind.c_name())),
        (c"rate", rate),
        (c"cap", cap),
        (c"ms_left", Reply::Int(left)),
    ])
}

/// A pin of `kind` (a rate pin: `limit`) until `until`, for a share key.
pub fn of(kind: PinKind, limit: Option<Limit>, until: Nanos) -> Result<SharePin> {
    SharePin::new(kind, limit, until).map_err(|e| Error::Invalid(e.message()))
}
