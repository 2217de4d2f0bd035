//! The commands, one file each, and what they share.

pub mod lease;
pub mod return_lease;
pub mod setstate;
pub mod take;

use crate::api::Ctx;
use crate::args::Args;
use crate::command::{self, Spec};
use crate::entry;
use crate::error::{Error, Result};
use rl_core::Limit;

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

pub fn register(ctx: *mut Ctx) -> std::result::Result<(), &'static std::ffi::CStr> {
    let write = c"write deny-oom fast";
    let specs = [
        Spec {
            name: c"RL.TAKE",
            func: entry!(take::take, true),
            flags: write,
            first_key: 1,
            last_key: 1,
            key_step: 1,
        },
        Spec {
            name: c"RL.LEASE",
            func: entry!(lease::lease, true),
            flags: write,
            first_key: 1,
            last_key: 1,
            key_step: 1,
        },
        Spec {
            name: c"RL.RETURN",
            func: entry!(return_lease::return_lease, true),
            flags: write,
            first_key: 1,
            last_key: 1,
            key_step: 1,
        },
        // Not for clients: the effect replicas and the AOF apply. Not counted in `calls`.
        Spec {
            name: c"RL.SETSTATE",
            func: entry!(setstate::setstate, false),
            flags: c"write deny-oom",
            first_key: 1,
            last_key: 1,
            key_step: 1,
        },
    ];
    specs
        .iter()
        .try_for_each(|spec| command::register(ctx, spec))
}
