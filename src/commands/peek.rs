//! `RL.PEEK key`: a bucket's state now, consuming nothing. Read-only: nothing is written or
//! propagated, and replicas answer it too.

use crate::api::{self, Ctx};
use crate::args::Args;
use crate::clock;
use crate::error::{Error, Result};
use crate::key::BucketKey;
use rl_core::{ceil_millis, Level};

pub fn peek(ctx: *mut Ctx, args: Args) -> Result<()> {
    if args.len() != 1 {
        return Err(Error::Arity);
    }
    let now = clock::now();
    let key = BucketKey::open_read(ctx, args.raw(0)?);
    let Some(state) = key.state()? else {
        // No key: the bucket is full, and its limit is unknown.
        api::reply_null(ctx);
        return Ok(());
    };
    let bucket = state.bucket();
    // The limit it was last written under.
    let level = Level::new(Some(&bucket), bucket.limit(), now);
    let live = state
        .table()
        .map(|t| t.leases().iter().filter(|l| l.expires_at > now));
    let (leases, held) = live.map_or((0, 0), |ls| {
        ls.fold((0i64, 0u64), |(n, t), l| {
            (n + 1, t.saturating_add(l.tokens))
        })
    });

    api::reply_map(ctx, 7);
    api::reply_text(ctx, c"tokens");
    api::reply_double(ctx, level.signed_tokens());
    api::reply_text(ctx, c"rate");
    api::reply_double(ctx, bucket.limit().rate());
    api::reply_text(ctx, c"cap");
    api::reply_double(ctx, bucket.limit().cap());
    api::reply_text(ctx, c"reset_after_ms");
    api::reply_integer(ctx, ceil_millis(level.reset_after()) as i64);
    api::reply_text(ctx, c"leases");
    api::reply_integer(ctx, leases);
    api::reply_text(ctx, c"leased_tokens");
    api::reply_integer(ctx, held.min(i64::MAX as u64) as i64);
    api::reply_text(ctx, c"version");
    api::reply_integer(ctx, bucket.version() as i64);
    Ok(())
}
