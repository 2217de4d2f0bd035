//! `RL.TAKE key rate cap [n] [WITHSTATE] [INIT tokens] [SHADOW] [VERSION v]`: refill, check and
//! debit in one step.

use crate::args::Args;
use crate::error::{Error, Result};
use crate::ffi::Ctx;
use crate::grammar::{self, Opt};
use crate::observe::stats;
use crate::pipeline::{self, CommandCounters, Decision, Request};
use crate::reply::{Reply, Scalar};
use rl_core::ceil_millis;

const COUNTERS: CommandCounters = CommandCounters {
    granted: &stats::GRANTED,
    tokens: Some(&stats::TOKENS_GRANTED),
    denied: &stats::DENIED,
};

pub fn take(ctx: Ctx, args: Args) -> Result<Reply> {
    if !(3..=10).contains(&args.len()) {
        return Err(Error::Arity);
    }
    let limit = grammar::limit(&args, 1)?;
    // `n` is optional: a number where the options start.
    let (n, from) = match args.bytes(3) {
        Ok(b) if crate::args::looks_numeric(b) => {
            (crate::args::positive(b, "n must be a positive integer")?, 4)
        }
        _ => (1, 3),
    };
    let opts = grammar::options(&args, from, OPTIONS, &limit)?;
    grammar::fits(n, &limit, N_OVER_CAP).map_err(|e| redis_cell_hint(&args).unwrap_or(e))?;
    let req = Request::new(limit, &opts, n, N_OVER_CAP);

    let done = pipeline::run(ctx, &args, &req, &COUNTERS, |level| {
        let granted = level.try_take(n as f64);
        Ok(Decision {
            tokens: if granted { n } else { 0 },
            detail: (),
        })
    })?;

    let (level, answered) = (done.level, done.answered);
    let reply = if answered { n as i64 } else { 0 };
    if !opts.with_state {
        return Ok(Reply::Int(reply));
    }
    let retry = if answered {
        0
    } else {
        level.wait_for(n as f64).map_or(0, ceil_millis)
    };
    let state = [
        Scalar::Int(reply),
        Scalar::Double(level.signed_tokens()),
        Scalar::Int(retry as i64),
        Scalar::Int(ceil_millis(level.reset_after()) as i64),
    ];
    // A decision a live pin made says so in a fifth element (only then: replies on
    // unpinned keys stay as they were).
    Ok(match done.pinned {
        None => Reply::row(state),
        Some(kind) => {
            let [a, b, c, d] = state;
            Reply::row([a, b, c, d, Scalar::Text(kind.c_name())])
        }
    })
}

/// The options `RL.TAKE` takes (its entry in the command table documents this same list).
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
