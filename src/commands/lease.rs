//! `RL.LEASE key rate cap n ttl_ms [MIN m] [RETURN lease_id unused] [INIT tokens] [SHADOW]
//! [VERSION v]`: take up
//! to `n` tokens at once for a holder to spend locally until `ttl_ms` passes, optionally
//! settling the holder's previous lease in the same call.

use crate::args::Args;
use crate::error::{Error, Result};
use crate::ffi::{Ctx, EffectArg};
use crate::grammar::{self, Opt};
use crate::key::BucketKey;
use crate::propagate::{self, Head};
use crate::reply::Reply;
use crate::{adopt, clock, ops, stats};
use rl_core::{ceil_millis, LeaseRequest, LeaseTable, Limit, NO_LEASES};

/// The table of a bucket that never had a lease.
static EMPTY: LeaseTable = NO_LEASES;

/// Longest lease: a day. A lease keeps its key alive, and a holder that needs tokens for
/// longer renews.
const MAX_TTL_MS: u64 = 86_400_000;

/// The options `RL.LEASE` takes (its `COMMAND DOCS` table lists the same).
pub const OPTIONS: &[Opt] = &[Opt::Min, Opt::Return, Opt::Init, Opt::Shadow, Opt::Version];

struct Request {
    n: u64,
    ttl_ms: u64,
    min: u64,
    returning: Option<(u64, u64)>,
    init: Option<f64>,
    shadow: bool,
    version: Option<u64>,
}

fn parse(args: &Args, limit: &Limit) -> Result<Request> {
    if args.len() < 5 {
        return Err(Error::Arity);
    }
    let n = args.positive(3, "n must be a positive integer")?;
    let ttl_ms = args.positive(4, "ttl_ms must be a positive integer")?;
    if ttl_ms > MAX_TTL_MS {
        return Err(Error::Invalid("ttl_ms must be at most 86400000 (a day)"));
    }
    let opts = grammar::options(args, 5, OPTIONS, limit)?;
    let req = Request {
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

pub fn lease(ctx: Ctx, args: Args) -> Result<Reply> {
    let limit = super::limit(&args, 1)?;
    let req = parse(&args, &limit)?;
    super::fits(req.min, &limit, "MIN must not exceed cap")?;

    let name = args.bytes(0)?;
    let ns = ops::enter(name);
    let now = clock::now();
    let key = BucketKey::open(ctx, args.raw(0)?);
    let opened = super::open_bucket(&key, limit, req.version.unwrap_or(0), now, req.init)?;
    opened.fits(req.min, "MIN must not exceed cap")?;
    let super::Opened {
        mut state,
        mut level,
        adopted,
        created,
        applied,
    } = opened;

    // Decide everything before changing anything, so an error or a denial writes nothing.
    let table = state.as_ref().and_then(|s| s.table()).unwrap_or(&EMPTY);
    let request = LeaseRequest {
        n: req.n,
        min: req.min,
        ttl: req.ttl_ms * 1_000_000,
        returning: req.returning,
    };
    let plan = table.plan(&mut level, &request, now)?;
    super::count_applied(applied);

    let mut opened = None;
    if plan.writes() || created {
        if adopted {
            adopt::replace(ctx, &key, args.raw(0)?);
        }
        let mut table = key.detach_leases(&mut state);
        let outcome = table.carry_out(&plan, &request, now);
        stats::LEASES_EXPIRED.add_shared(outcome.pruned as u64);
        if plan.returned.is_some() {
            stats::RETURNS.add(1);
            stats::TOKENS_RETURNED.add(plan.credited);
        }
        opened = outcome.opened;
        let bucket = level.bucket();
        key.store_with_leases(state, bucket, table);
        let (returned, name) = (plan.returned, args.raw(0)?);
        if applied == rl_core::Applied::Stale {
            // Decided under the stored limit: the effect carries it, not the caller's.
            propagate::with_stored_limit(name, &bucket, |head| {
                propagate::leases(ctx, head, now, returned, opened.as_ref())
            });
        } else {
            let head = Head {
                key: name,
                full_at: bucket.full_at(),
                rate: EffectArg::Str(args.raw(1)?),
                cap: EffectArg::Str(args.raw(2)?),
                hold: bucket.hold(),
                span: bucket.span(),
                version: bucket.version(),
            };
            propagate::leases(ctx, &head, now, returned, opened.as_ref());
        }
    }

    let shadow = opened.is_none() && ops::answered(false, req.shadow);
    let counted = ops::outcome_of(opened.map_or(0, |l| l.tokens), shadow);
    ops::decided(ns, name, counted, now);
    match opened {
        Some(l) => {
            stats::LEASES_GRANTED.add(1);
            stats::LEASE_TOKENS_GRANTED.add(l.tokens);
        }
        None if shadow => stats::SHADOW_DENIED.add(1),
        None => stats::LEASES_DENIED.add(1),
    }
    // In shadow mode a denial answers as a grant of `n` under no lease (id 0): nothing is
    // recorded, so there is nothing to return.
    let (granted, id) = match opened {
        Some(l) => (l.tokens, l.id),
        None if shadow => (req.n, 0),
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
