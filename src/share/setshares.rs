//! `RL.SETSHARES key rate cap version prune_at holder
//! want,rate,burst,lease_end,held_rate,held_burst,held_until`: the effect of `RL.SHARE`, applied by replicas and the
//! AOF. Not for clients. Reads no clock; [`rl_core::ShareTable::apply`] checks the limit,
//! the entry and the table's size (the checks RDB load makes) before anything changes.

use crate::args::Args;
use crate::error::{Error, Result};
use crate::ffi::{self, Ctx};
use crate::reply::Reply;
use crate::share::{self, ShareKey};
use rl_core::ShareTable;

const FIELDS: &str =
    "a share entry is want,rate,burst,lease_end,held_rate,held_burst,held_until (times as integers)";

pub fn setshares(ctx: Ctx, args: Args) -> Result<Reply> {
    if args.len() != 7 {
        return Err(Error::Arity);
    }
    let limit = crate::grammar::limit(&args, 1)?;
    let version = crate::grammar::version(&args, 3)?;
    let prune = args.integer(4, "prune_at must be a non-negative integer")?;
    let entry = share::parse_entry(args.bytes(5)?, args.bytes(6)?).ok_or(Error::Invalid(FIELDS))?;
    let key = ShareKey::open(ctx, args.raw(0)?);
    let existing = key.table()?;
    let err = |e: rl_core::ShareError| Error::Invalid(e.message());
    match existing {
        Some(t) => {
            let (pruned, joined) = t.apply(limit, version, Some(prune), entry).map_err(err)?;
            share::moved(pruned, usize::from(joined));
            key.expire_at(t.last_end().unwrap_or(0));
        }
        None => {
            let mut t = ShareTable::new(limit, version);
            t.apply(limit, version, Some(prune), entry).map_err(err)?;
            let at = t.last_end().unwrap_or(0);
            key.create(t, at);
        }
    }
    ffi::replicate_verbatim(ctx);
    Ok(Reply::Ok)
}
