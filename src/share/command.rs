//! `RL.SHARE key rate cap holder want period_ms [RELEASE] [VERSION v]`: lease a share of
//! a key's rate (and of its cap, as a burst) for a holder that limits locally and calls
//! again every `period_ms` (see [`rl_core::share`]).
//!
//! Reply: `[rate, burst, lease_ms, refresh_ms, holders]` (rate and burst doubles, the rest
//! integers), and a sixth element, the kind of the pin (`rate`, `block`, `exempt`), only
//! when a live pin decided. A `RELEASE` of a holder without a live lease writes nothing;
//! neither does a call under `BLOCK` or `EXEMPT`.

use crate::args::Args;
use crate::clock;
use crate::error::{Error, Result};
use crate::ffi::Ctx;
use crate::grammar::{self, Opt};
use crate::observe::{namespaces, stats, top};
use crate::reply::{Reply, Scalar};
use crate::share::{self, LimitText, ShareKey};
use rl_core::namespace::Outcome;
use rl_core::{Applied, ShareError, ShareRequest, ShareTable};

/// The options `RL.SHARE` takes (its entry in the command table documents this same list).
pub const OPTIONS: &[Opt] = &[Opt::Release, Opt::Version];

fn invalid(e: ShareError) -> Error {
    Error::Invalid(e.message())
}

pub fn share(ctx: Ctx, args: Args) -> Result<Reply> {
    if args.len() < 6 {
        return Err(Error::Arity);
    }
    let limit = grammar::limit(&args, 1)?;
    let holder = args.bytes(3)?;
    rl_core::share::check_holder_id(holder).map_err(invalid)?;
    let want = args.number(4, ShareError::Want.message())?;
    let period_ms = args.integer(5, ShareError::Period.message())?;
    let opts = grammar::options(&args, 6, OPTIONS, &limit)?;
    let (release, version) = (opts.release, opts.version);
    let req = ShareRequest::new(
        holder,
        want,
        period_ms,
        release,
        limit,
        version.unwrap_or(0),
    )
    .map_err(invalid)?;

    let (name, holder_arg) = (args.raw(0)?, args.raw(3)?);
    let (rate_arg, cap_arg) = (args.raw(1)?, args.raw(2)?);
    let ns = namespaces::enter(name.bytes());
    let now = clock::now();
    let key = ShareKey::open(ctx, name);
    let existing = key.table()?;
    let is_new = existing.is_none();
    let mut fresh;
    let table = match existing {
        Some(t) => t,
        None => {
            fresh = ShareTable::new(req.limit, req.version);
            &mut fresh
        }
    };
    let had_pin = table.pin().is_some();
    let d = table.decide(&req, now).map_err(invalid)?;
    let r = d.reply;
    if d.pinned.is_some() {
        stats::PINNED_DECISIONS.add(1);
        namespaces::pinned(ns);
    }
    if d.written {
        // Under a pin (counted above) only a replaced limit is counted besides.
        if d.pinned.is_none() || d.applied == Applied::Replaced {
            crate::pipeline::count_limit_source(d.applied);
        }
        // Queued now, sent after the command: the table is still at hand here.
        let limit = match d.applied {
            // Decided under the stored limit (a pinned call may have been stale): the
            // effect carries it, not the caller's.
            Applied::Stale | Applied::Pinned => LimitText::Stored,
            _ => LimitText::Args {
                rate: rate_arg,
                cap: cap_arg,
            },
        };
        share::propagate(ctx, name, limit, holder_arg, table, d.index, now);
        if is_new {
            key.create(
                std::mem::replace(table, ShareTable::new(req.limit, 0)),
                d.expires_at,
            );
        } else {
            share::moved(d.pruned, usize::from(d.joined));
            if had_pin {
                // An ended pin goes at a write.
                share::pinned_keys(true, table.pin().is_some());
            }
            key.expire_at(d.expires_at);
        }
    }
    if release {
        if d.written {
            stats::SHARES_RELEASED.add(1);
        }
    } else {
        if r.rate > 0.0 {
            stats::SHARES_GRANTED.add(1);
        }
        if d.short {
            stats::SHARES_SHORT.add(1);
        }
        // A holder that wants nothing and gets nothing is granted, but not under BLOCK:
        // that refuses every call, whatever its want.
        let blocked = d.pinned == Some(rl_core::pin::PinKind::Block);
        let outcome = if r.rate > 0.0 || (req.want == 0.0 && !blocked) {
            Outcome::Granted(0)
        } else {
            Outcome::Denied
        };
        namespaces::record(ns, outcome);
        if outcome == Outcome::Denied {
            top::denied(name.bytes(), now);
        }
    }
    if let Some(kind) = d.pinned {
        // Six elements, the pin's kind last: an array (the inline row holds five, and the
        // unpinned replies stay as they were).
        return Ok(Reply::Array(vec![
            Reply::Double(r.rate),
            Reply::Double(r.burst),
            Reply::Int(r.lease_ms as i64),
            Reply::Int(r.refresh_ms as i64),
            Reply::Int(r.holders as i64),
            Reply::Text(kind.c_name()),
        ]));
    }
    Ok(Reply::row([
        Scalar::Double(r.rate),
        Scalar::Double(r.burst),
        Scalar::Int(r.lease_ms as i64),
        Scalar::Int(r.refresh_ms as i64),
        Scalar::Int(r.holders as i64),
    ]))
}
