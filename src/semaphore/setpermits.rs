//! `RL.SETPERMITS key LASTID id [PRUNE t] [DROP id] [ADD id expires_at]`: the effect of
//! the semaphore commands, applied by replicas and the AOF. Not for clients. Reads no
//! clock; the complete result is checked by [`PermitTable::validate`] (the check RDB
//! load makes) before anything changes.

use crate::args::Args;
use crate::error::{Error, Result};
use crate::ffi::{self, Ctx};
use crate::reply::Reply;
use crate::semaphore;
use crate::semaphore::PermitKey;
use rl_core::{Permit, PermitTable};

pub fn setpermits(ctx: Ctx, args: Args) -> Result<Reply> {
    if args.len() < 3 {
        return Err(Error::Arity);
    }
    let (mut last_id, mut prune, mut drop, mut add, mut pin) = (None, None, None, None, None);
    let mut i = 1;
    while i < args.len() {
        let int = |j: usize| args.integer(j, "permit fields must be non-negative integers");
        let seen = |given: bool| {
            if given {
                Err(args.duplicate(i))
            } else {
                Ok(())
            }
        };
        if args.is(i, "LASTID") {
            seen(last_id.is_some())?;
            last_id = Some(int(i + 1)?);
            i += 2;
        } else if args.is(i, "PRUNE") {
            seen(prune.is_some())?;
            prune = Some(int(i + 1)?);
            i += 2;
        } else if args.is(i, "DROP") {
            seen(drop.is_some())?;
            drop = Some(int(i + 1)?);
            i += 2;
        } else if args.is(i, "PIN") {
            seen(pin.is_some())?;
            let code = int(i + 1)?;
            pin = Some(rl_core::PermitPin {
                kind: rl_core::pin::PinKind::from_code(code)
                    .ok_or(Error::Invalid(rl_core::StateError::PinKind.message()))?,
                until: int(i + 2)?,
                limit: int(i + 3)?,
            });
            i += 4;
        } else if args.is(i, "ADD") {
            seen(add.is_some())?;
            add = Some(Permit {
                id: int(i + 1)?,
                expires_at: int(i + 2)?,
            });
            i += 3;
        } else {
            return Err(args.unknown(i));
        }
    }
    let last_id = last_id.ok_or(Error::Invalid("LASTID is required"))?;
    let name = args.raw(0)?;
    let key = PermitKey::open(ctx, name);
    let existing = key.table()?;
    let mut next = existing.as_deref().cloned().unwrap_or_default();
    next.raise_last_id(last_id);
    if let Some(t) = prune {
        next.prune(t);
    }
    if let Some(id) = drop {
        next.remove(id);
    }
    if let Some(p) = add {
        next.put(p);
    }
    let (last, list) = next.into_parts();
    if list.is_empty() && pin.is_none() {
        // No permit left: no key (what the commands leave too).
        if last > i64::MAX as u64 {
            return Err(Error::Invalid(rl_core::PermitError::LastId.message()));
        }
        if let Some(t) = existing {
            semaphore::left(t.permits().len());
            key.delete();
        }
        ffi::replicate_verbatim(ctx);
        return Ok(Reply::Ok);
    }
    let next =
        PermitTable::validate_pinned(last, list, pin).map_err(|e| Error::Invalid(e.message()))?;
    match existing {
        Some(t) => {
            semaphore::left(t.permits().len());
            for _ in next.permits() {
                semaphore::entered();
            }
            let was_pinned = t.pin().is_some();
            *t = next;
            key.written(t, was_pinned);
        }
        None => key.create(next),
    }
    ffi::replicate_verbatim(ctx);
    Ok(Reply::Ok)
}
