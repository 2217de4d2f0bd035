//! `RL.RESERVE key rate cap n max_wait_ms [INIT tokens] [SHADOW] [VERSION v]`: take `n` tokens now if they are
//! there or will be within `max_wait_ms`, and say how long to wait before using them.
//!
//! A granted reservation is debited at once; if the tokens are not there yet the bucket
//! goes into debt (its level below zero, at most `rate * max_wait_ms` below), and later
//! callers, whatever the command, queue behind it: a fair, bounded queue in one number.
//! Reply: `[granted (n or 0), wait_ms, remaining, reset_after_ms]`; a denial writes
//! nothing and says the wait that would have been needed.

use crate::args::Args;
use crate::error::{Error, Result};
use crate::ffi::Ctx;
use crate::grammar::{self, Opt};
use crate::key::BucketKey;
use crate::reply::{Reply, Scalar};
use crate::{clock, ops, stats};
use rl_core::ceil_millis;

/// The options `RL.RESERVE` takes (its `COMMAND DOCS` table lists the same).
pub const OPTIONS: &[Opt] = &[Opt::Init, Opt::Shadow, Opt::Version];

/// Longest wait a reservation may ask for: a day, as for a lease.
const MAX_WAIT_MS: u64 = 86_400_000;

pub fn reserve(ctx: Ctx, args: Args) -> Result<Reply> {
    if args.len() < 5 {
        return Err(Error::Arity);
    }
    let limit = super::limit(&args, 1)?;
    let n = args.positive(3, "n must be a positive integer")?;
    let max_wait_ms = args.integer(4, "max_wait_ms must be a non-negative integer")?;
    if max_wait_ms > MAX_WAIT_MS {
        return Err(Error::Invalid(
            "max_wait_ms must be at most 86400000 (a day)",
        ));
    }
    let opts = grammar::options(&args, 5, OPTIONS, &limit)?;
    let (init, shadow, version) = (opts.init, opts.shadow, opts.version);
    super::fits(n, &limit, "n must not exceed cap")?;

    let name = args.bytes(0)?;
    let ns = ops::enter(name);
    let now = clock::now();
    let key = BucketKey::open(ctx, args.raw(0)?);
    let mut opened = super::open_bucket(&key, limit, version.unwrap_or(0), now, init)?;
    opened.fits(n, "n must not exceed cap")?;
    let (granted, wait) = opened
        .level
        .reserve(n as f64, max_wait_ms * 1_000_000)
        .ok_or(Error::Invalid("n must not exceed cap"))?;
    opened.count();
    opened.write_if(ctx, &key, &args, 0, granted)?;
    let level = opened.level;
    // In shadow mode (server-wide or this call's SHADOW) a denial answers as a grant with
    // no wait (nothing was debited).
    let answered = ops::answered(granted, shadow);
    match (granted, answered) {
        (true, _) => {
            stats::RESERVED.add(1);
            stats::TOKENS_RESERVED.add(n);
        }
        (false, true) => stats::SHADOW_DENIED.add(1),
        (false, false) => stats::RESERVE_DENIED.add(1),
    }
    ops::decided(
        ns,
        name,
        ops::outcome_of(if granted { n } else { 0 }, answered),
        now,
    );
    let (reply, wait_ms) = match (granted, answered) {
        (true, _) => (n, ceil_millis(wait)),
        (false, true) => (n, 0),
        (false, false) => (0, ceil_millis(wait)),
    };
    Ok(Reply::row([
        Scalar::Int(reply as i64),
        Scalar::Int(wait_ms as i64),
        Scalar::Double(level.signed_tokens()),
        Scalar::Int(ceil_millis(level.reset_after()) as i64),
    ]))
}
