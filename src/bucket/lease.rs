//! `RL.LEASE key rate cap n ttl_ms [MIN m] [RETURN lease_id unused] [INIT tokens] [SHADOW]
//! [VERSION v]`: take up
//! to `n` tokens at once for a holder to spend locally until `ttl_ms` passes, optionally
//! settling the holder's previous lease in the same call.

use crate::args::Args;
use crate::bucket::key::BucketKey;
use crate::error::{Error, Result};
use crate::ffi::Ctx;
use crate::grammar::{self, Opt};
use crate::observe::{namespaces, stats};
use crate::pipeline::{self, CommandCounters, LeaseWrite, Request};
use crate::reply::Reply;
use rl_core::{ceil_millis, LeaseRequest, LeaseTable, Limit, NO_LEASES};

/// The table of a bucket that never had a lease.
static EMPTY: LeaseTable = NO_LEASES;

/// Longest lease: a day. A lease keeps its key alive, and a holder that needs tokens for
/// longer renews.
pub const MAX_TTL_MS: u64 = 86_400_000;

/// The options `RL.LEASE` takes (its entry in the command table documents this same list).
pub const OPTIONS: &[Opt] = &[Opt::Min, Opt::Return, Opt::Init, Opt::Shadow, Opt::Version];

struct LeaseArgs {
    n: u64,
    ttl_ms: u64,
    min: u64,
    returning: Option<(u64, u64)>,
    init: Option<f64>,
    shadow: bool,
    version: Option<u64>,
}

fn parse(args: &Args, limit: &Limit) -> Result<LeaseArgs> {
    if args.len() < 5 {
        return Err(Error::Arity);
    }
    let n = args.positive(3, "n must be a positive integer")?;
    let ttl_ms = args.positive(4, "ttl_ms must be a positive integer")?;
    if ttl_ms > MAX_TTL_MS {
        return Err(Error::Invalid("ttl_ms must be at most 86400000 (a day)"));
    }
    let opts = grammar::options(args, 5, OPTIONS, limit)?;
    let req = LeaseArgs {
        n,
        ttl_ms,
        min: opts.min.unwrap_or(1),
        returning: opts.returning,
        init: opts.init,
        shadow: opts.shadow,
        version: opts.version,
    };
    if req.min > req.n {
        return Err(Error::Invalid("MIN must not exceed n"));
    }
    Ok(req)
}

const COUNTERS: CommandCounters = CommandCounters {
    granted: &stats::LEASES_GRANTED,
    tokens: Some(&stats::LEASE_TOKENS_GRANTED),
    denied: &stats::LEASES_DENIED,
};

const MIN_OVER_CAP: &str = "MIN must not exceed cap";

pub fn lease(ctx: Ctx, args: Args) -> Result<Reply> {
    let limit = grammar::limit(&args, 1)?;
    let req = parse(&args, &limit)?;
    grammar::fits(req.min, &limit, MIN_OVER_CAP)?;
    let call = Request {
        limit,
        version: req.version.unwrap_or(0),
        init: req.init,
        shadow: req.shadow,
        needs: req.min,
        needs_too_much: MIN_OVER_CAP,
    };

    let name = args.bytes(0)?;
    let ns = namespaces::enter(name);
    let now = crate::clock::now();
    let key = BucketKey::open(ctx, args.raw(0)?);
    let mut bucket = pipeline::open(&key, &call, now)?;

    if bucket.level.gate() == rl_core::pin::Gate::Exempt {
        // An exempt key grants the whole lease and records nothing: there is nothing to
        // return (id 0), and a return could only credit tokens never debited.
        pipeline::count_limit_source(bucket.decided_by);
        namespaces::pinned(ns);
        let granted = req.n.min(call.limit.cap().floor() as u64).max(req.min);
        pipeline::count(&COUNTERS, ns, name, now, granted, req.shadow);
        return Ok(Reply::ints([granted as i64, 0, req.ttl_ms as i64, 0]));
    }
    // Decide everything before changing anything, so an error or a denial writes nothing.
    let table = bucket
        .stored
        .as_ref()
        .and_then(|s| s.table())
        .unwrap_or(&EMPTY);
    let request = LeaseRequest {
        n: req.n,
        min: req.min,
        ttl: req.ttl_ms * 1_000_000,
        returning: req.returning,
    };
    let plan = table.plan(&mut bucket.level, &request, now)?;
    pipeline::count_limit_source(bucket.decided_by);
    if bucket.pinned.is_some() {
        namespaces::pinned(ns);
    }

    let level = bucket.level;
    let opened = if plan.writes() || bucket.store_even_if_denied {
        let write = LeaseWrite {
            plan: &plan,
            request: &request,
        };
        pipeline::store_with_leases(ctx, &key, &args, bucket, write, now)?
    } else {
        None
    };
    let tokens = opened.map_or(0, |l| l.tokens);
    let answered = pipeline::count(&COUNTERS, ns, name, now, tokens, req.shadow);

    // In shadow mode a denial answers as a grant of `n` under no lease (id 0): nothing is
    // recorded, so there is nothing to return.
    let (granted, id) = match opened {
        Some(l) => (l.tokens, l.id),
        None if answered => (req.n, 0),
        None => (0, 0),
    };
    let (retry, ttl) = match granted {
        0 => (level.wait_for(req.min as f64).map_or(0, ceil_millis), 0),
        _ => (0, req.ttl_ms),
    };
    Ok(Reply::ints([
        granted as i64,
        id as i64,
        ttl as i64,
        retry as i64,
    ]))
}
