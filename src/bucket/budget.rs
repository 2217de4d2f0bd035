//! `RL.BUDGET ttl_ms key rate cap n [key rate cap n ...] [WITHSTATE] [SHADOW] [VERSION v]`:
//! reserve a cost on every limit at once, each limit with its own `n`, or on none. For a
//! call whose cost is known only when it completes (an LLM request: its requests, input
//! and output tokens), settled later with `RL.SETTLE` (see `settle.rs`). The decision is
//! `rl_core::budget`'s; this is its glue.
//!
//! Reply: `[granted, reservation_id, denied_by, retry_after_ms]` (+ `[remaining...]` with
//! `WITHSTATE`): `granted` 1 or 0; `reservation_id` the lease id every key recorded (0:
//! nothing recorded: denied, or every key exempt); `denied_by` the key whose wait is
//! longest (nil when granted); `retry_after_ms` that wait, rounded up. In Cluster the keys
//! must share a slot (a hash tag: `{org:42}:tpm`, `{org:42}:rpm`).

use crate::args::Args;
use crate::bucket::groups::{self, MAX_BUCKETS};
use crate::bucket::key::BucketKey;
use crate::bucket::lease::MAX_TTL_MS;
use crate::error::{Error, Result};
use crate::ffi::{self, Ctx};
use crate::grammar::{self, Opt};
use crate::observe::top;
use crate::observe::{namespaces, stats};
use crate::pipeline::{self, CommandCounters, OpenBucket, Request};
use crate::reply::Reply;
use rl_core::budget::{self, BudgetPlan};
use rl_core::{ceil_millis, LeaseTable, Limit, NO_LEASES};

/// The options `RL.BUDGET` takes (read from the end, see [`groups::shape`]).
pub const OPTIONS: &[Opt] = &[Opt::WithState, Opt::Shadow, Opt::Version];

/// `key rate cap n`.
const GROUP: usize = 4;

const N_OVER_CAP: &str = "n must not exceed cap";

/// The table of a bucket that never had a lease.
static EMPTY: LeaseTable = NO_LEASES;

const COUNTERS: CommandCounters = CommandCounters {
    granted: &stats::BUDGETS_GRANTED,
    tokens: None,
    denied: &stats::BUDGETS_DENIED,
};

pub fn budget(ctx: Ctx, args: Args) -> Result<Reply> {
    // Cluster routing and COMMAND GETKEYS ask where the keys are (options follow them).
    if ffi::is_keys_position_request(ctx) {
        if let Ok(s) = groups::shape(&args, 1, GROUP, OPTIONS) {
            // Argument `i` is at argv position `i + 1` (the command name is argv 0).
            for i in (1..s.end).step_by(GROUP) {
                ffi::key_at_pos(ctx, i + 1);
            }
        }
        return Ok(Reply::Nothing);
    }
    stats::CALLS.add(1);
    let s = groups::shape(&args, 1, GROUP, OPTIONS)?;
    let ttl_ms = args.positive(0, "ttl_ms must be a positive integer")?;
    if ttl_ms > MAX_TTL_MS {
        return Err(Error::Invalid("ttl_ms must be at most 86400000 (a day)"));
    }
    let version = match s.version_at {
        Some(at) => grammar::version(&args, at)?,
        None => 0,
    };
    let mut limits: Vec<Limit> = Vec::with_capacity(s.end / GROUP);
    let mut costs: Vec<u64> = Vec::with_capacity(s.end / GROUP);
    for i in (1..s.end).step_by(GROUP) {
        let limit = grammar::limit(&args, i + 1)?;
        let n = args.positive(i + 3, "n must be a positive integer")?;
        grammar::fits(n, &limit, N_OVER_CAP)?;
        groups::not_named_before(&args, 1, i, GROUP)?;
        limits.push(limit);
        costs.push(n);
    }

    // Each namespace counts the call once, however many of its keys it names.
    let mut spaces = [0usize; MAX_BUCKETS];
    for (j, i) in (1..s.end).step_by(GROUP).enumerate() {
        spaces[j] = namespaces::namespace_id(args.bytes(i)?);
        if !spaces[..j].contains(&spaces[j]) {
            namespaces::call(spaces[j]);
        }
    }
    let now = crate::clock::now();
    let keys: Vec<BucketKey> = (1..s.end)
        .step_by(GROUP)
        .map(|i| args.raw(i).map(|k| BucketKey::open(ctx, k)))
        .collect::<Result<_>>()?;
    let mut buckets: Vec<OpenBucket> = Vec::with_capacity(keys.len());
    for (j, key) in keys.iter().enumerate() {
        let req = Request {
            limit: limits[j],
            version,
            init: None,
            shadow: s.shadow,
            needs: costs[j],
            needs_too_much: N_OVER_CAP,
        };
        buckets.push(pipeline::open(key, &req, now)?);
    }

    // Everything decided before anything changes: a full lease table is an error that
    // leaves every key as it was.
    let mut levels: Vec<_> = buckets.iter().map(|b| b.level).collect();
    let tables: Vec<&LeaseTable> = buckets
        .iter()
        .map(|b| b.stored.as_ref().and_then(|s| s.table()).unwrap_or(&EMPTY))
        .collect();
    let plan: BudgetPlan = budget::plan(&mut levels, &costs, &tables, now)?;
    drop(tables);
    for (j, b) in buckets.iter().enumerate() {
        pipeline::count_limit_source(b.decided_by);
        if b.pinned.is_some() {
            namespaces::pinned(spaces[j]);
        }
    }
    let granted = plan.outcome.granted;
    let ttl = ttl_ms * 1_000_000;
    let mut reserved = 0u64;
    for (j, (key, mut bucket)) in keys.iter().zip(buckets).enumerate() {
        let at = 1 + GROUP * j;
        if granted && plan.leases(&levels[j]) {
            bucket.level = levels[j];
            let n = costs[j];
            pipeline::store_with_table(ctx, key, &args, at, bucket, now, |table| {
                stats::LEASES_EXPIRED.add_shared(table.prune(now) as u64);
                // `plan` checked the room and the id on this very table.
                let lease = table.open_as(plan.id, n, ttl, now).ok();
                (None, lease)
            })?;
            reserved += n;
        } else if bucket.writes(0) {
            // Denied (or exempt) but stored anyway: a limit replaced by a newer VERSION.
            bucket.level = levels[j];
            bucket.store(ctx, key, &args, at)?;
        }
    }
    stats::BUDGET_TOKENS_RESERVED.add(reserved);

    let answered = pipeline::count_outcome(&COUNTERS, granted as u64, s.shadow);
    for (j, id) in spaces[..keys.len()].iter().enumerate() {
        if !spaces[..j].contains(id) {
            // A namespace's tokens: the costs of its keys in this call.
            let tokens: u64 = if granted {
                (0..keys.len())
                    .filter(|&k| spaces[k] == *id)
                    .map(|k| costs[k])
                    .sum()
            } else {
                0
            };
            namespaces::record(*id, pipeline::outcome_of(tokens, answered));
        }
    }
    let worst = plan.outcome.worst;
    if !granted {
        // The key that refused (the longest wait) is the one denied.
        top::denied(args.bytes(1 + GROUP * worst)?, now);
    }
    let head = if answered {
        // A shadow denial answers as a grant under no reservation (id 0): nothing recorded.
        [
            Reply::Int(1),
            Reply::Int(plan.id as i64),
            Reply::Null,
            Reply::Int(0),
        ]
    } else {
        [
            Reply::Int(0),
            Reply::Int(0),
            Reply::Key(args.raw(1 + GROUP * worst)?),
            Reply::Int(ceil_millis(plan.outcome.longest) as i64),
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
