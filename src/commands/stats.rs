//! `RL.STATS [namespace]`: the per-namespace counters (also in `INFO rl`, one line per
//! namespace, as `rl_ns_<name>:calls=..,granted=..,denied=..,shadow_denied=..,tokens_granted=..`).
//!
//! Reply: without a namespace, a map of every namespace (`other` first) to its counters;
//! with one, its counters, or nil if it has no entry (never seen, or counted under `other`).
//! A map of maps under RESP3, flat arrays under RESP2.

use crate::args::Args;
use crate::error::{Error, Result};
use crate::ffi::{self, Ctx, Info};
use crate::ops;
use rl_core::namespace::Counts;
use std::ffi::CStr;

const FIELDS: [&std::ffi::CStr; 5] = [
    c"calls",
    c"granted",
    c"denied",
    c"shadow_denied",
    c"tokens_granted",
];

fn values(c: &Counts) -> [u64; 5] {
    [
        c.calls,
        c.granted,
        c.denied,
        c.shadow_denied,
        c.tokens_granted,
    ]
}

fn reply_counts(ctx: Ctx, c: &Counts) {
    ffi::reply_map(ctx, FIELDS.len());
    for (name, v) in FIELDS.iter().zip(values(c)) {
        ffi::reply_text(ctx, name);
        // An integer reply is signed: a counter past i64::MAX shows as i64::MAX.
        ffi::reply_integer(ctx, v.min(i64::MAX as u64) as i64);
    }
}

pub fn stats(ctx: Ctx, args: Args) -> Result<()> {
    match args.len() {
        0 => {
            let mut n = 0;
            ops::each_namespace(|_, _| n += 1);
            ffi::reply_map(ctx, n);
            ops::each_namespace(|name, c| {
                ffi::reply_bytes(ctx, name);
                reply_counts(ctx, c);
            });
        }
        1 => match ops::namespace_counts(args.bytes(0)?) {
            Some(c) => reply_counts(ctx, &c),
            None => ffi::reply_null(ctx),
        },
        _ => return Err(Error::Arity),
    }
    Ok(())
}

/// The namespace lines of `INFO rl`.
pub fn info(info: &Info) {
    ops::each_namespace(|name, c| {
        let mut field = [0u8; 64];
        ops::info_name(name, &mut field);
        info.begin_dict(CStr::from_bytes_until_nul(&field).unwrap_or(c"ns_"));
        for (f, v) in FIELDS.iter().zip(values(c)) {
            info.add_u64(f, v);
        }
        info.end_dict();
    });
}
