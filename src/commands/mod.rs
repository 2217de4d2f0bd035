//! The commands, one file each, and what they share.

#[cfg(debug_assertions)]
pub mod debug_panic;
pub mod lease;
pub mod mtake;
pub mod peek;
pub mod return_lease;
pub mod setstate;
pub mod take;

use crate::api::Ctx;
use crate::args::Args;
use crate::command::{self, Spec};
use crate::entry;
use crate::error::{Error, Result};
use crate::stored::StateMut;
use rl_core::{Level, Limit, Nanos};

/// `rate cap` at argument `i`.
fn limit(args: &Args, i: usize) -> Result<Limit> {
    let rate = args.number(i, "rate is not a number")?;
    let cap = args.number(i + 1, "cap is not a number")?;
    Ok(Limit::new(rate, cap)?)
}

/// A request for `n` tokens must be one the bucket can ever grant; `what` names it.
fn fits(n: u64, limit: &Limit, what: &'static str) -> Result<()> {
    if n as f64 > limit.cap() {
        return Err(Error::Invalid(what));
    }
    Ok(())
}

/// The `tokens` of `INIT tokens` at argument `i`: what a bucket that does not exist yet
/// starts with instead of full (warm start).
fn init_tokens(args: &Args, i: usize, limit: &Limit) -> Result<f64> {
    let tokens = args.number(i, "INIT must be a number")?;
    if !(0.0..=limit.cap()).contains(&tokens) {
        return Err(Error::Invalid("INIT must be between 0 and cap"));
    }
    Ok(tokens)
}

/// The bucket a command works on: the stored one refilled to `now`, or a new one (full, or
/// holding `init` tokens).
fn level_of(state: Option<&StateMut>, limit: Limit, now: Nanos, init: Option<f64>) -> Level {
    match (state, init) {
        (None, Some(tokens)) => Level::starting_with(limit, tokens, now),
        (state, _) => Level::new(state.map(|s| s.bucket()).as_ref(), limit, now),
    }
}

/// Whether a new bucket started below full must be stored even if the call is denied:
/// otherwise every call would start it afresh and it would never fill.
fn created_below_full(state: Option<&StateMut>, level: &Level) -> bool {
    state.is_none() && level.reset_after() > 0
}

pub fn register(ctx: *mut Ctx) -> std::result::Result<(), &'static std::ffi::CStr> {
    let write = c"write deny-oom fast";
    let one_key = (1, 1, 1);
    let specs = [
        Spec {
            name: c"RL.TAKE",
            func: entry!(take::take, true),
            flags: write,
            keys: one_key,
            arity: -4,
            summary: c"Refills a token bucket and takes n tokens if they are all there",
        },
        Spec {
            name: c"RL.LEASE",
            func: entry!(lease::lease, true),
            flags: write,
            keys: one_key,
            arity: -6,
            summary: c"Takes a batch of tokens to spend until the lease expires",
        },
        Spec {
            name: c"RL.RETURN",
            func: entry!(return_lease::return_lease, true),
            flags: write,
            keys: one_key,
            arity: 4,
            summary: c"Gives back what a lease did not spend, once",
        },
        Spec {
            name: c"RL.PEEK",
            func: entry!(peek::peek, true),
            flags: c"readonly fast",
            keys: one_key,
            arity: 2,
            summary: c"Shows a bucket's state without taking anything",
        },
        // Keys at 2, 5, 8...; options after them, so the command reports its keys itself
        // (getkeys-api) and counts its own calls (key-position requests are not calls).
        Spec {
            name: c"RL.MTAKE",
            func: entry!(mtake::mtake, false),
            flags: c"write deny-oom getkeys-api",
            keys: (2, -1, 3),
            arity: -5,
            summary: c"Takes n tokens from every bucket given, or from none",
        },
        // Not for clients: the effect replicas and the AOF apply. Not counted in `calls`.
        Spec {
            name: c"RL.SETSTATE",
            func: entry!(setstate::setstate, false),
            flags: c"write deny-oom",
            keys: one_key,
            arity: -5,
            summary: c"Internal: sets a bucket's state (what replicas and the AOF receive)",
        },
    ];
    specs
        .iter()
        .try_for_each(|spec| command::register(ctx, spec))?;
    #[cfg(debug_assertions)]
    command::register(
        ctx,
        &Spec {
            name: c"RL.DEBUG-PANIC",
            func: entry!(debug_panic::debug_panic, false),
            flags: c"readonly",
            keys: (0, 0, 0),
            arity: 1,
            summary: c"Debug builds only: panics inside a command",
        },
    )?;
    Ok(())
}
