//! `RL.TAKE key rate cap [n] [WITHSTATE] [INIT tokens] [SHADOW] [VERSION v]`: refill, check and
//! debit in one step.

use crate::args::Args;
use crate::error::{Error, Result};
use crate::ffi::Ctx;
use crate::grammar::{self, Opt};
use crate::key::BucketKey;
use crate::reply::{Reply, Scalar};
use crate::{clock, ops, stats};
use rl_core::ceil_millis;

pub fn take(ctx: Ctx, args: Args) -> Result<Reply> {
    if !(3..=10).contains(&args.len()) {
        return Err(Error::Arity);
    }
    let limit = super::limit(&args, 1)?;
    // `n` is optional: a number where the options start.
    let (n, from) = if args.len() > 3 && args.looks_numeric(3) {
        (args.positive(3, "n must be a positive integer")?, 4)
    } else {
        (1, 3)
    };
    let opts = grammar::options(&args, from, OPTIONS, &limit)?;
    let (with_state, init, shadow, version) =
        (opts.with_state, opts.init, opts.shadow, opts.version);
    super::fits(n, &limit, N_OVER_CAP).map_err(|e| redis_cell_hint(&args).unwrap_or(e))?;

    let name = args.bytes(0)?;
    let ns = ops::enter(name);
    let now = clock::now();
    let key = BucketKey::open(ctx, args.raw(0)?);
    let mut opened = super::open_bucket(&key, limit, version.unwrap_or(0), now, init)?;
    opened.fits(n, N_OVER_CAP)?;
    opened.count();
    let granted = opened.level.try_take(n as f64);
    opened.write_if(ctx, &key, &args, 0, granted)?;
    let level = opened.level;
    let answered = ops::answered(granted, shadow);
    match (granted, answered) {
        (true, _) => {
            stats::GRANTED.add(1);
            stats::TOKENS_GRANTED.add(n);
        }
        (false, true) => stats::SHADOW_DENIED.add(1),
        (false, false) => stats::DENIED.add(1),
    }
    ops::decided(
        ns,
        name,
        ops::outcome_of(if granted { n } else { 0 }, answered),
        now,
    );

    let reply = if answered { n as i64 } else { 0 };
    if !with_state {
        return Ok(Reply::Int(reply));
    }
    let retry = if answered {
        0
    } else {
        level.wait_for(n as f64).map_or(0, ceil_millis)
    };
    Ok(Reply::row([
        Scalar::Int(reply),
        Scalar::Double(level.signed_tokens()),
        Scalar::Int(retry as i64),
        Scalar::Int(ceil_millis(level.reset_after()) as i64),
    ]))
}

/// The options `RL.TAKE` takes (its `COMMAND DOCS` table lists the same).
pub const OPTIONS: &[Opt] = &[Opt::WithState, Opt::Init, Opt::Shadow, Opt::Version];

const N_OVER_CAP: &str = "n must not exceed cap";

/// `RL.TAKE key 15 30 60` is redis-cell's habit (`CL.THROTTLE key max_burst count period`):
/// three numbers where the third exceeds the second. The error then says what the same
/// limit is here: `count / period` tokens per second, and a cap of `max_burst + 1`.
fn redis_cell_hint(args: &Args) -> Option<Error> {
    if args.len() != 4 {
        return None;
    }
    let burst = args.integer(1, "").ok()?;
    let count = args.number(2, "").ok()?;
    let period = args.integer(3, "").ok()?;
    // Below 2^53, so the Functions library (Lua numbers) writes the same text.
    if period == 0 || count.is_nan() || count <= 0.0 || burst >= 1 << 53 {
        return None;
    }
    let rate = count / period as f64;
    // Only a call that works here is suggested: the rate and cap must be ones RL.TAKE takes.
    rl_core::Limit::new(rate, (burst + 1) as f64).ok()?;
    Some(Error::Hinted(
        N_OVER_CAP,
        format!(
            "if these are redis-cell's max_burst count period, the same limit here is \
             RL.TAKE key {rate} {}: rate in tokens per second, cap = max_burst + 1",
            burst.saturating_add(1)
        ),
    ))
}
