//! `RL.SETTLE reservation_id key actual [key actual ...]`: closes an `RL.BUDGET`
//! reservation on each key with what the call actually used. What was not used comes back
//! (as `RL.RETURN` credits it); an overage is charged as debt, floored at `-cap` so no
//! actual, however wrong, keeps a key from granting longer than `cap / rate` beyond an
//! empty bucket. A key whose reservation is unknown, expired or already settled changes
//! nothing (what was reserved stays charged: never minted). The decision is
//! `rl_core::budget::settle`'s.
//!
//! Reply: one element per key, in order: the tokens credited back (positive), charged
//! (negative), or nil where the key held no live reservation of that id.

use crate::args::Args;
use crate::bucket::effect;
use crate::bucket::groups::{self, MAX_BUCKETS};
use crate::bucket::key::BucketKey;
use crate::error::{Error, Result};
use crate::ffi::Ctx;
use crate::observe::stats;
use crate::reply::Reply;

/// `key actual`.
const GROUP: usize = 2;

pub fn settle(ctx: Ctx, args: Args) -> Result<Reply> {
    let pairs = args.len().saturating_sub(1);
    if pairs == 0 || !pairs.is_multiple_of(GROUP) {
        return Err(Error::Arity);
    }
    if pairs / GROUP > MAX_BUCKETS {
        return Err(Error::Invalid("at most 64 buckets per call"));
    }
    let id = args.integer(0, "reservation_id must be a non-negative integer")?;
    let mut actuals = Vec::with_capacity(pairs / GROUP);
    for i in (1..args.len()).step_by(GROUP) {
        actuals.push(args.integer(i + 1, "actual must be a non-negative integer")?);
        groups::not_named_before(&args, 1, i, GROUP)?;
    }

    let now = crate::clock::now();
    let keys: Vec<BucketKey> = (1..args.len())
        .step_by(GROUP)
        .map(|i| args.raw(i).map(|k| BucketKey::open(ctx, k)))
        .collect::<Result<_>>()?;
    // Every key's type checked before any changes: a key of another type fails the call
    // with nothing settled.
    let mut live = Vec::with_capacity(keys.len());
    for key in &keys {
        let state = key.state()?;
        live.push(
            state
                .as_ref()
                .and_then(|s| s.table())
                .is_some_and(|t| t.live(id, now).is_some()),
        );
    }

    let mut reply = Vec::with_capacity(keys.len());
    for (j, key) in keys.iter().enumerate() {
        if !live[j] {
            stats::SETTLES_UNMATCHED.add(1);
            reply.push(Reply::Null);
            continue;
        }
        let mut state = key.state()?;
        let Some(bucket) = state.as_ref().map(|s| s.bucket()) else {
            unreachable!("a key with a live lease holds a bucket");
        };
        // Under its pin, if one lives (an exempt bucket is neither credited nor charged).
        let Some((mut level, pin)) = rl_core::pin::level_of_stored(&bucket, now) else {
            unreachable!("a key that holds only a pin holds no lease");
        };
        let mut table = key.detach_leases(&mut state);
        // The key's own limit: under a rate pin the bucket is stored under the pin's, and
        // its own is the pin's base (what it returns to).
        let own = pin.map_or(bucket.limit(), |p| p.base);
        let Some((signed, pruned)) =
            rl_core::budget::settle(&mut table, &mut level, id, actuals[j], now, &own)
        else {
            unreachable!("the lease was live a moment ago");
        };
        stats::LEASES_EXPIRED.add_shared(pruned as u64);
        stats::SETTLES.add(1);
        if signed >= 0 {
            stats::TOKENS_SETTLED_BACK.add(signed as u64);
        } else {
            stats::TOKENS_OVERAGE.add(signed.unsigned_abs());
        }
        let name = args.raw(1 + GROUP * j)?;
        let bucket = level.bucket().with_pin(pin);
        if table.is_empty() && level.reset_after() == 0 && bucket.expires_at() <= now {
            // Full and no lease left: the same as no key at all.
            key.delete();
            crate::effect::deleted(ctx, name);
        } else {
            key.store_with_leases(state, bucket, table);
            effect::with_stored_limit(name, &bucket, |head| {
                effect::leases(ctx, head, now, Some(id), None)
            });
        }
        reply.push(Reply::Int(signed));
    }
    Ok(Reply::Array(reply))
}
