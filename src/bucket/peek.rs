//! `RL.PEEK key`: a bucket's state now, consuming nothing. Read-only: nothing is written or
//! propagated, and replicas answer it too.

use crate::args::Args;
use crate::bucket::key::BucketKey;
use crate::clock;
use crate::error::{Error, Result};
use crate::ffi::Ctx;
use crate::reply::Reply;
use rl_core::ceil_millis;

pub fn peek(ctx: Ctx, args: Args) -> Result<Reply> {
    if args.len() != 1 {
        return Err(Error::Arity);
    }
    let now = clock::now();
    let key = BucketKey::open_read(ctx, args.raw(0)?);
    let Some(state) = key.state()? else {
        // No key: the bucket is full, and its limit is unknown.
        return Ok(Reply::Null);
    };
    let bucket = state.bucket();
    // The limit it was last written under, or its pin's; a key that holds only a pin is as
    // absent (`RL.PINNED` shows the pin).
    let Some((level, pin)) = rl_core::pin::level_of_stored(&bucket, now) else {
        return Ok(Reply::Null);
    };
    let bucket = level.bucket().with_pin(pin);
    let live = state
        .table()
        .map(|t| t.leases().iter().filter(|l| l.expires_at > now));
    let (leases, held) = live.map_or((0, 0), |ls| {
        ls.fold((0i64, 0u64), |(n, t), l| {
            (n + 1, t.saturating_add(l.tokens))
        })
    });

    let mut reply = Reply::fields([
        (c"tokens", Reply::Double(level.signed_tokens())),
        (c"rate", Reply::Double(bucket.limit().rate())),
        (c"cap", Reply::Double(bucket.limit().cap())),
        (
            c"reset_after_ms",
            Reply::Int(ceil_millis(level.reset_after()) as i64),
        ),
        (c"leases", Reply::Int(leases)),
        (c"leased_tokens", Reply::count(held)),
        (c"version", Reply::count(bucket.version())),
    ]);
    // A live pin shows as one more field (only then, so replies of unpinned keys stay as
    // they were).
    if let (Reply::Map(fields), Some(p)) = (&mut reply, bucket.pin().filter(|p| p.live_at(now))) {
        fields.push((Reply::Text(c"pinned"), Reply::Text(p.kind.c_name())));
    }
    Ok(reply)
}
