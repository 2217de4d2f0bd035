//! `RL.SETSTATE key full_at rate cap [LASTID id] [PRUNE t] [DROP id] [ADD id tokens expires_at]`
//!
//! The effect replicas and the AOF apply (see [`crate::propagate`]); not meant for clients.
//! It only sets what it is told: no clock is read, so every copy ends with the same bytes.

use crate::api::{self, Ctx};
use crate::args::Args;
use crate::error::{Error, Result};
use crate::key::{take_table, BucketKey};
use crate::rm;
use rl_core::{Bucket, Lease};

pub fn setstate(ctx: *mut Ctx, args: Args) -> Result<()> {
    if args.len() < 4 {
        return Err(Error::Arity);
    }
    let full_at = args.integer(1, "full_at must be a non-negative integer")?;
    let rate = args.number(2, "rate is not a number")?;
    let cap = args.number(3, "cap is not a number")?;
    let bucket =
        Bucket::from_parts(full_at, rate, cap).ok_or(Error::Invalid("invalid bucket state"))?;

    let (mut last_id, mut prune, mut drop, mut add) = (None, None, None, None);
    let mut i = 4;
    while i < args.len() {
        let int = |j: usize| args.integer(j, "lease fields must be non-negative integers");
        if args.is(i, "LASTID") {
            last_id = Some(int(i + 1)?);
            i += 2;
        } else if args.is(i, "PRUNE") {
            prune = Some(int(i + 1)?);
            i += 2;
        } else if args.is(i, "DROP") {
            drop = Some(int(i + 1)?);
            i += 2;
        } else if args.is(i, "ADD") {
            add = Some(Lease {
                id: int(i + 1)?,
                tokens: int(i + 2)?,
                expires_at: int(i + 3)?,
            });
            i += 4;
        } else {
            return Err(args.unknown(i));
        }
    }

    let key = BucketKey::open(ctx, args.raw(0)?);
    let mut state = key.state()?;
    let touches_leases = last_id.is_some() || prune.is_some() || drop.is_some() || add.is_some();
    if !touches_leases {
        key.store(state, bucket);
    } else {
        let mut table = take_table(&mut state);
        if let Some(id) = last_id {
            table.raise_last_id(id);
        }
        if let Some(t) = prune {
            table.prune(t);
        }
        if let Some(id) = drop {
            table.remove(id);
        }
        // Cannot fail on a stream this module wrote (the master checked the bound); on a
        // hand-made one the lease is refused and the rest applies.
        let inserted = add.map_or(Ok(()), |l| table.insert(l));
        key.store_with_leases(state, bucket, table);
        inserted?;
    }
    rm!(RedisModule_ReplicateVerbatim(ctx));
    api::reply_ok(ctx);
    Ok(())
}
