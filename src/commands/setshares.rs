//! `RL.SETSHARES key rate cap version [PRUNE t] SET holder
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
    if args.len() < 4 {
        return Err(Error::Arity);
    }
    let limit = super::limit(&args, 1)?;
    let version = crate::grammar::version(&args, 3)?;
    let (mut prune, mut entry) = (None, None);
    let mut i = 4;
    while i < args.len() {
        let seen = |given: bool| {
            if given {
                Err(args.duplicate(i))
            } else {
                Ok(())
            }
        };
        if args.is(i, "PRUNE") {
            seen(prune.is_some())?;
            prune = Some(args.integer(i + 1, FIELDS)?);
            i += 2;
        } else if args.is(i, "SET") {
            seen(entry.is_some())?;
            let (id, text) = (args.bytes(i + 1)?, args.bytes(i + 2)?);
            entry = Some(share::parse_entry(id, text).ok_or(Error::Invalid(FIELDS))?);
            i += 3;
        } else {
            return Err(args.unknown(i));
        }
    }
    let entry = entry.ok_or(Error::Invalid("SET is required"))?;
    let key = ShareKey::open(ctx, args.raw(0)?);
    let existing = key.table()?;
    let err = |e: rl_core::ShareError| Error::Invalid(e.message());
    match existing {
        Some(t) => {
            let (pruned, joined) = t.apply(limit, version, prune, entry).map_err(err)?;
            share::moved(pruned, usize::from(joined));
            key.expire_at(t.last_end().unwrap_or(0));
        }
        None => {
            let mut t = ShareTable::new(limit, version);
            t.apply(limit, version, prune, entry).map_err(err)?;
            let at = t.last_end().unwrap_or(0);
            key.create(t, at);
        }
    }
    ffi::replicate_verbatim(ctx);
    Ok(Reply::Ok)
}
