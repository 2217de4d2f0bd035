//! `RL.RETURN key lease_id unused`: give back what a lease did not spend, once.

use crate::args::Args;
use crate::bucket::effect;
use crate::bucket::key::BucketKey;
use crate::clock;
use crate::error::{Error, Result};
use crate::ffi::Ctx;
use crate::observe::stats;
use crate::reply::Reply;
use rl_core::Settled;

pub fn return_lease(ctx: Ctx, args: Args) -> Result<Reply> {
    if args.len() != 3 {
        return Err(Error::Arity);
    }
    let id = args.integer(1, "lease_id must be a non-negative integer")?;
    let unused = args.integer(2, "unused must be a non-negative integer")?;

    let now = clock::now();
    let key_name = args.raw(0)?;
    let key = BucketKey::open(ctx, key_name);
    let mut state = key.state()?;
    let live = state
        .as_ref()
        .and_then(|s| s.table())
        .and_then(|t| t.live(id, now));
    let Some(bucket) = live.and(state.as_ref()).map(|s| s.bucket()) else {
        // Unknown, expired or already returned: credits nothing and writes nothing.
        return Ok(Reply::Int(0));
    };

    let mut table = key.detach_leases(&mut state);
    stats::LEASES_EXPIRED.add_shared(table.prune(now) as u64);
    let Settled::Returned { credited } = table.settle(id, unused, now) else {
        unreachable!("the lease was live a moment ago");
    };
    // The limit is the one the bucket was last written under. A bucket near full takes
    // back only what fits below cap: the reply says what it took.
    // Under its pin, if one lives (an exempt bucket takes nothing back: its grants debited
    // nothing).
    let Some((mut level, pin)) = rl_core::pin::level_of_stored(&bucket, now) else {
        unreachable!("a key that holds only a pin holds no lease");
    };
    let credited = level.credit_up_to(credited);
    stats::RETURNS.add(1);
    stats::TOKENS_RETURNED.add(credited);
    let bucket = level.bucket().with_pin(pin);
    if table.is_empty() && level.reset_after() == 0 && bucket.expires_at() <= now {
        // Full and no lease left: the same as no key at all.
        key.delete();
        crate::effect::deleted(ctx, key_name);
    } else {
        key.store_with_leases(state, bucket, table);
        effect::with_stored_limit(key_name, &bucket, |head| {
            effect::leases(ctx, head, now, Some(id), None)
        });
    }
    Ok(Reply::count(credited))
}
