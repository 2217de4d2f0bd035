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
use crate::observe::stats;
use crate::pipeline::{self, CommandCounters, Decision, Request};
use crate::reply::{Reply, Scalar};
use rl_core::ceil_millis;

/// The options `RL.RESERVE` takes (its entry in the command table documents this same list).
pub const OPTIONS: &[Opt] = &[Opt::Init, Opt::Shadow, Opt::Version];

/// Longest wait a reservation may ask for: a day, as for a lease.
const MAX_WAIT_MS: u64 = 86_400_000;

const COUNTERS: CommandCounters = CommandCounters {
    granted: &stats::RESERVED,
    tokens: Some(&stats::TOKENS_RESERVED),
    denied: &stats::RESERVE_DENIED,
};

const N_OVER_CAP: &str = "n must not exceed cap";

pub fn reserve(ctx: Ctx, args: Args) -> Result<Reply> {
    if args.len() < 5 {
        return Err(Error::Arity);
    }
    let limit = grammar::limit(&args, 1)?;
    let n = args.positive(3, "n must be a positive integer")?;
    let max_wait_ms = args.integer(4, "max_wait_ms must be a non-negative integer")?;
    if max_wait_ms > MAX_WAIT_MS {
        return Err(Error::Invalid(
            "max_wait_ms must be at most 86400000 (a day)",
        ));
    }
    let opts = grammar::options(&args, 5, OPTIONS, &limit)?;
    grammar::fits(n, &limit, N_OVER_CAP)?;
    let req = Request::new(limit, &opts, n, N_OVER_CAP);

    let done = pipeline::run(ctx, &args, &req, &COUNTERS, |level| {
        let (granted, wait) = level
            .reserve(n as f64, max_wait_ms * 1_000_000)
            .ok_or(Error::Invalid(N_OVER_CAP))?;
        Ok(Decision {
            tokens: if granted { n } else { 0 },
            detail: wait,
        })
    })?;

    // In shadow mode (server-wide or this call's SHADOW) a denial answers as a grant with
    // no wait (nothing was debited).
    let (level, wait) = (done.level, done.decision.detail);
    let (reply, wait_ms) = match (done.decision.tokens > 0, done.answered) {
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
