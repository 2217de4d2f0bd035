//! `RL.MTAKE n key rate cap [key rate cap ...] [WITHSTATE] [INIT tokens] [SHADOW] [VERSION v]`:
//! take `n` tokens from every bucket, or from none. For limits checked together (per user,
//! per API, global) in one round trip. One `VERSION` applies to every bucket, each compared
//! with its own stored version.
//!
//! Reply: `[granted, denied_by, retry_after_ms]` (+ `[remaining...]` with `WITHSTATE`):
//! `granted` is `n` or 0; `denied_by` the key whose wait is longest (nil when granted);
//! `retry_after_ms` that wait, rounded up. In Cluster the keys must share a slot (hash tags).

use crate::args::Args;
use crate::bucket::groups::{self, Shape, MAX_BUCKETS};
use crate::bucket::key::BucketKey;
use crate::error::Result;
use crate::ffi::{self, Ctx};
use crate::grammar::{self, Opt};
use crate::observe::{namespaces, stats, top};
use crate::pipeline::{self, CommandCounters, OpenBucket, Request};
use crate::reply::Reply;
use rl_core::{ceil_millis, take_all, AllOrNothing, Limit};

/// The options `RL.MTAKE` takes (read from the end, see [`shape`]).
pub const OPTIONS: &[Opt] = &[Opt::WithState, Opt::Init, Opt::Shadow, Opt::Version];

const COUNTERS: CommandCounters = CommandCounters {
    granted: &stats::MTAKE_GRANTED,
    tokens: None,
    denied: &stats::MTAKE_DENIED,
};

const N_OVER_CAP: &str = "n must not exceed cap";

const GROUP: usize = 3;

fn shape(args: &Args) -> Result<Shape> {
    groups::shape(args, 1, GROUP, OPTIONS)
}

pub fn mtake(ctx: Ctx, args: Args) -> Result<Reply> {
    // Cluster routing and COMMAND GETKEYS ask where the keys are (options follow them).
    if ffi::is_keys_position_request(ctx) {
        if let Ok(s) = shape(&args) {
            // Argument `i` is at argv position `i + 1` (the command name is argv 0).
            for i in (1..s.end).step_by(3) {
                ffi::key_at_pos(ctx, i + 1);
            }
        }
        return Ok(Reply::Nothing);
    }
    stats::CALLS.add(1);
    let s = shape(&args)?;
    let n = args.positive(0, "n must be a positive integer")?;
    let version = match s.version_at {
        Some(at) => grammar::version(&args, at)?,
        None => 0,
    };
    let mut limits: Vec<Limit> = Vec::with_capacity(s.end / 3);
    let mut init = None;
    for i in (1..s.end).step_by(3) {
        let limit = grammar::limit(&args, i + 1)?;
        grammar::fits(n, &limit, N_OVER_CAP)?;
        if let Some(at) = s.init_at {
            init = Some(grammar::init_tokens(&args, at, &limit)?);
        }
        groups::not_named_before(&args, 1, i, GROUP)?;
        limits.push(limit);
    }

    // Each namespace counts the call once, however many of its keys it names.
    let mut spaces = [0usize; MAX_BUCKETS];
    for (j, i) in (1..s.end).step_by(3).enumerate() {
        spaces[j] = namespaces::namespace_id(args.bytes(i)?);
        if !spaces[..j].contains(&spaces[j]) {
            namespaces::call(spaces[j]);
        }
    }
    let now = crate::clock::now();
    let keys: Vec<BucketKey> = (1..s.end)
        .step_by(3)
        .map(|i| args.raw(i).map(|k| BucketKey::open(ctx, k)))
        .collect::<Result<_>>()?;
    let mut buckets: Vec<OpenBucket> = Vec::with_capacity(keys.len());
    for (key, limit) in keys.iter().zip(&limits) {
        let req = Request {
            limit: *limit,
            version,
            init,
            shadow: s.shadow,
            needs: n,
            needs_too_much: N_OVER_CAP,
        };
        buckets.push(pipeline::open(key, &req, now)?);
    }
    for (j, b) in buckets.iter().enumerate() {
        pipeline::count_limit_source(b.decided_by);
        if b.pinned.is_some() {
            namespaces::pinned(spaces[j]);
        }
    }

    // All or nothing: every bucket is looked at before any is debited.
    let mut levels: Vec<_> = buckets.iter().map(|b| b.level).collect();
    let AllOrNothing {
        granted,
        worst,
        longest,
    } = take_all(&mut levels, n as f64);
    for (j, (key, mut bucket)) in keys.iter().zip(buckets).enumerate() {
        if !bucket.writes(if granted { n } else { 0 }) {
            continue;
        }
        bucket.level = levels[j];
        bucket.store(ctx, key, &args, 1 + 3 * j)?;
    }

    let tokens = if granted { n } else { 0 };
    let answered = pipeline::count_outcome(&COUNTERS, tokens, s.shadow);
    let outcome = pipeline::outcome_of(tokens, answered);
    for (j, id) in spaces[..keys.len()].iter().enumerate() {
        if !spaces[..j].contains(id) {
            namespaces::record(*id, outcome);
        }
    }
    if !granted {
        // The key that refused (the longest wait) is the one denied.
        top::denied(args.bytes(1 + 3 * worst)?, now);
    }
    let head = if answered {
        [Reply::Int(n as i64), Reply::Null, Reply::Int(0)]
    } else {
        [
            Reply::Int(0),
            Reply::Key(args.raw(1 + 3 * worst)?),
            Reply::Int(ceil_millis(longest) as i64),
        ]
    };
    let mut reply = Vec::from(head);
    if s.with_state {
        reply.push(Reply::Array(
            levels
                .iter()
                .map(|l| Reply::Double(l.signed_tokens()))
                .collect(),
        ));
    }
    Ok(Reply::Array(reply))
}
