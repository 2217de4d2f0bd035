//! `RL.SETSHARES key rate cap version prune_at holder
//! want,rate,burst,lease_end,held_rate,held_burst,held_until [pin]` and `RL.SETSHARES key
//! rate cap version prune_at pin`: the effects of `RL.SHARE`, `RL.PIN` and `RL.UNPIN` on
//! a share key, applied by replicas and the AOF (see [`crate::share`]). Not for clients.
//! Reads no clock; [`rl_core::ShareTable::apply_pinned`] checks the limit, the entry, the
//! pin and the table's size (the checks RDB load makes) before anything changes.

use crate::args::Args;
use crate::error::{Error, Result};
use crate::ffi::{self, Ctx};
use crate::reply::Reply;
use crate::share::{self, ShareKey};
use rl_core::ShareTable;

const FIELDS: &str =
    "a share entry is want,rate,burst,lease_end,held_rate,held_burst,held_until (times as integers)";
const PIN: &str =
    "a share key's pin is 0 (none), kind,until (2 BLOCK, 3 EXEMPT) or 1,until,rate,cap";

pub fn setshares(ctx: Ctx, args: Args) -> Result<Reply> {
    if !(6..=8).contains(&args.len()) {
        return Err(Error::Arity);
    }
    let limit = crate::grammar::limit(&args, 1)?;
    let version = crate::grammar::version(&args, 3)?;
    let prune = args.integer(4, "prune_at must be a non-negative integer")?;
    // 6 arguments: the pin alone; 7: an entry, no pin (as before pins); 8: both.
    let entry = match args.len() {
        6 => None,
        _ => {
            Some(share::parse_entry(args.bytes(5)?, args.bytes(6)?).ok_or(Error::Invalid(FIELDS))?)
        }
    };
    let pin = match args.len() {
        6 => share::parse_pin(args.bytes(5)?).ok_or(Error::Invalid(PIN))?,
        8 => match share::parse_pin(args.bytes(7)?) {
            // An entry's effect carries a pin, or nothing: never `0`.
            Some(Some(p)) => Some(p),
            _ => return Err(Error::Invalid(PIN)),
        },
        _ => None,
    };
    let key = ShareKey::open(ctx, args.raw(0)?);
    let existing = key.table()?;
    let err = |e: rl_core::ShareError| Error::Invalid(e.message());
    match existing {
        Some(t) => {
            let was_pinned = t.pin().is_some();
            let (pruned, joined) = t
                .apply_pinned(limit, version, Some(prune), entry, pin)
                .map_err(err)?;
            share::moved(pruned, usize::from(joined));
            share::pinned_keys(was_pinned, t.pin().is_some());
            key.expire_at(t.expires_at());
        }
        None => {
            let mut t = ShareTable::new(limit, version);
            t.apply_pinned(limit, version, Some(prune), entry, pin)
                .map_err(err)?;
            let at = t.expires_at();
            key.create(t, at);
        }
    }
    ffi::replicate_verbatim(ctx);
    Ok(Reply::Ok)
}
