//! `RL.STATS [namespace]`: the per-namespace counters (also in `INFO rl`, one line per
//! namespace, as `rl_ns_<name>:calls=..,granted=..,denied=..,shadow_denied=..,tokens_granted=..,evicted=..,pinned=..`).
//!
//! Reply: without a namespace, a map of every namespace (`other` first) to its counters;
//! with one, its counters, or nil if it has no entry (never seen, or counted under `other`).
//! A map of maps under RESP3, flat arrays under RESP2.

use crate::args::Args;
use crate::error::{Error, Result};
use crate::ffi::{Ctx, Info};
use crate::observe::namespaces;
use crate::reply::Reply;
use rl_core::namespace::Counts;
use std::ffi::CStr;

const FIELDS: [&std::ffi::CStr; 7] = [
    c"calls",
    c"granted",
    c"denied",
    c"shadow_denied",
    c"tokens_granted",
    c"evicted",
    c"pinned",
];

fn values(c: &Counts) -> [u64; 7] {
    [
        c.calls,
        c.granted,
        c.denied,
        c.shadow_denied,
        c.tokens_granted,
        c.evicted,
        c.pinned,
    ]
}

fn counts(c: &Counts) -> Reply {
    // An integer reply is signed: a counter past i64::MAX shows as i64::MAX.
    Reply::Map(
        FIELDS
            .iter()
            .zip(values(c))
            .map(|(name, v)| (Reply::Text(name), Reply::count(v)))
            .collect(),
    )
}

pub fn stats(_ctx: Ctx, args: Args) -> Result<Reply> {
    match args.len() {
        0 => {
            let mut all = Vec::new();
            namespaces::each_namespace(|name, c| {
                all.push((Reply::Bytes(name.to_vec()), counts(c)))
            });
            Ok(Reply::Map(all))
        }
        1 => Ok(namespaces::namespace_counts(args.bytes(0)?).map_or(Reply::Null, |c| counts(&c))),
        _ => Err(Error::Arity),
    }
}

/// The namespace lines of `INFO rl`.
pub fn info(info: &Info) {
    namespaces::each_namespace(|name, c| {
        let mut field = [0u8; 64];
        namespaces::info_name(name, &mut field);
        info.begin_dict(CStr::from_bytes_until_nul(&field).unwrap_or(c"ns_"));
        for (f, v) in FIELDS.iter().zip(values(c)) {
            info.add_u64(f, v);
        }
        info.end_dict();
    });
}
