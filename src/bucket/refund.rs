//! `RL.REFUND key n`: give back up to `n` tokens to a bucket (a call that never reached
//! the partner). Credited under the bucket's stored limit, never above cap, nothing for a
//! missing key (it is already full). Reply: the tokens credited, a double (a bucket that
//! refilled meanwhile takes only what it lacks; one in debt pays the debt first).

use crate::args::Args;
use crate::bucket::effect;
use crate::bucket::key::BucketKey;
use crate::clock;
use crate::error::{Error, Result};
use crate::ffi::Ctx;
use crate::observe::stats;
use crate::reply::Reply;

pub fn refund(ctx: Ctx, args: Args) -> Result<Reply> {
    if args.len() != 2 {
        return Err(Error::Arity);
    }
    let n = args.positive(1, "n must be a positive integer")?;
    let now = clock::now();
    let key_name = args.raw(0)?;
    let key = BucketKey::open(ctx, key_name);
    let state = key.state()?;
    let Some(bucket) = state.as_ref().map(|s| s.bucket()) else {
        return Ok(Reply::Double(0.0));
    };
    // Under its pin, if one lives; a key that holds only a pin is full.
    let Some((mut level, pin)) = rl_core::pin::level_of_stored(&bucket, now) else {
        return Ok(Reply::Double(0.0));
    };
    let credited = level.refund(n);
    if credited <= 0.0 {
        // Full already: nothing to take back, nothing written.
        return Ok(Reply::Double(0.0));
    }
    stats::REFUNDS.add(1);
    let after = level.bucket().with_pin(pin);
    let no_leases = state
        .as_ref()
        .and_then(|s| s.table())
        .is_none_or(|t| t.is_empty());
    if no_leases && level.reset_after() == 0 && after.expires_at() <= now {
        // Full again, nothing held: the same as no key.
        key.delete();
        crate::effect::deleted(ctx, key_name);
    } else {
        key.store(state, &after);
        effect::with_stored_limit(key_name, &after, |head| effect::bucket(ctx, head));
    }
    Ok(Reply::Double(credited))
}
