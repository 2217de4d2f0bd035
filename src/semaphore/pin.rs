//! Pins on semaphore keys (`RL.PIN key PERMITS n|BLOCK|EXEMPT [PX ms]`, and `RL.UNPIN`,
//! `RL.PINNED` on such a key): the operator's concurrency limit, or a block, or a pass,
//! whatever limit `RL.ACQUIRE` callers send (see [`rl_core::PermitPin`]). Called by the pin
//! commands in [`crate::bucket::pin`] once they found a semaphore key, or were told
//! `PERMITS`.

use crate::error::{Error, Result};
use crate::ffi::Ctx;
use crate::observe::stats;
use crate::reply::Reply;
use crate::semaphore::{PermitChange, PermitKey};
use rl_core::pin::PinKind;
use rl_core::{Nanos, PermitPin, PermitTable, MAX_PERMITS};

/// `RL.PIN key PERMITS n` (kind `Rate`, `limit` n) or a `BLOCK`/`EXEMPT` pin on the
/// semaphore key `key`, until `until` (0: none). A key that holds nothing gets the pin alone.
pub fn pin(ctx: Ctx, key: &PermitKey, pin: PermitPin, now: Nanos) -> Result<Reply> {
    if pin.kind == PinKind::Rate && !(1..=MAX_PERMITS as u64).contains(&pin.limit) {
        return Err(Error::Invalid(
            "PERMITS takes a limit of 1 to 10000 (BLOCK refuses every permit)",
        ));
    }
    match key.table()? {
        None => {
            let t = PermitTable::validate_pinned(0, Vec::new(), Some(pin))
                .map_err(|e| Error::Invalid(e.message()))?;
            key.create(t);
        }
        Some(t) => {
            let was_pinned = t.pin().is_some();
            pruned(t.prune(now));
            t.set_pin(Some(pin));
            key.written(t, was_pinned);
        }
    }
    effect(ctx, key, now)?;
    stats::PINS_SET.add(1);
    Ok(Reply::Ok)
}

/// `RL.UNPIN` on a semaphore key: 1 if a live pin went (and with it a key that held
/// nothing else), else 0.
pub fn unpin(ctx: Ctx, key: &PermitKey, t: &mut PermitTable, now: Nanos) -> Result<Reply> {
    if t.live_pin(now).is_none() {
        return Ok(Reply::Int(0));
    }
    pruned(t.prune(now));
    stats::PINS_REMOVED.add(1);
    if t.permits().is_empty() {
        // Freed with its pin: the gauge follows there.
        key.delete();
        crate::effect::deleted(ctx, key.name());
        return Ok(Reply::Int(1));
    }
    t.set_pin(None);
    key.written(t, true);
    effect(ctx, key, now)?;
    Ok(Reply::Int(1))
}

/// Counts permits dropped as expired (the effect prunes them too).
fn pruned(n: usize) {
    crate::semaphore::left(n);
    stats::PERMITS_EXPIRED.add_shared(n as u64);
}

/// The key's state as its effect (expired permits dropped at `now`).
fn effect(ctx: Ctx, key: &PermitKey, now: Nanos) -> Result<()> {
    let Some(t) = key.table()? else {
        return Ok(());
    };
    crate::semaphore::permits(
        ctx,
        &PermitChange {
            key: key.name(),
            last_id: t.last_id(),
            prune: now,
            drop: None,
            add: None,
            pin: t.pin(),
        },
    );
    Ok(())
}

/// `RL.PINNED` on a semaphore key: `kind` (`permits`, `block`, `exempt`), `limit` (a
/// `PERMITS` pin's; nil otherwise), `ms_left` (-1: until `RL.UNPIN`); nil without a live pin.
pub fn describe(t: &PermitTable, now: Nanos) -> Reply {
    let Some(p) = t.live_pin(now) else {
        return Reply::Null;
    };
    let (kind, limit) = match p.kind {
        PinKind::Rate => (c"permits", Reply::count(p.limit)),
        PinKind::Block => (c"block", Reply::Null),
        PinKind::Exempt => (c"exempt", Reply::Null),
    };
    let left = match p.until {
        0 => -1,
        until => rl_core::ceil_millis(until.saturating_sub(now)).min(i64::MAX as u64) as i64,
    };
    Reply::fields([
        (c"kind", Reply::Text(kind)),
        (c"limit", limit),
        (c"ms_left", Reply::Int(left)),
    ])
}
