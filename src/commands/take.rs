//! `RL.TAKE key rate cap [n] [WITHSTATE] [INIT tokens] [SHADOW] [VERSION v]`: refill, check and
//! debit in one step.

use crate::args::Args;
use crate::error::{Error, Result};
use crate::ffi::Ctx;
use crate::key::BucketKey;
use crate::reply::{Reply, Scalar};
use crate::{clock, ops, stats};
use rl_core::ceil_millis;

pub fn take(ctx: Ctx, args: Args) -> Result<Reply> {
    if !(3..=10).contains(&args.len()) {
        return Err(Error::Arity);
    }
    let limit = super::limit(&args, 1)?;
    let (mut n, mut with_state, mut init, mut shadow) = (1, false, None, false);
    let mut version = None;
    let mut i = 3;
    while i < args.len() {
        if let Some(v) = super::version_option(&args, i, version) {
            version = Some(v?);
            i += 1;
        } else if args.is(i, "WITHSTATE") {
            if with_state {
                return Err(args.duplicate(i));
            }
            with_state = true;
        } else if ops::is_shadow(&args, i) {
            if shadow {
                return Err(args.duplicate(i));
            }
            shadow = true;
        } else if args.is(i, "INIT") {
            if init.is_some() {
                return Err(args.duplicate(i));
            }
            init = Some(super::init_tokens(&args, i + 1, &limit)?);
            i += 1;
        } else if i == 3 && args.looks_numeric(i) {
            n = args.positive(i, "n must be a positive integer")?;
        } else {
            return Err(args.unknown(i));
        }
        i += 1;
    }
    super::fits(n, &limit, "n must not exceed cap")?;

    let name = args.bytes(0)?;
    let ns = ops::enter(name);
    let now = clock::now();
    let key = BucketKey::open(ctx, args.raw(0)?);
    let mut opened = super::open_bucket(&key, limit, version.unwrap_or(0), now, init)?;
    opened.fits(n, "n must not exceed cap")?;
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
