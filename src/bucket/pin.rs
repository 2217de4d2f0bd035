//! `RL.PIN key rate cap [PX ms]`, `RL.PIN key BLOCK [PX ms]`, `RL.PIN key EXEMPT [PX ms]`,
//! `RL.UNPIN key`, `RL.PINNED key`: an operator's limit on a key, stored in its bucket and
//! applied by every command on it (see [`rl_core::pin`]).
//!
//! Pinning writes the bucket as it stands under the pin (a rate pin's tokens carried over
//! into the pinned limit) and replicates it as `RL.SETSTATE ... PIN ...`; unpinning writes it
//! back under the limit callers' calls resolve to. A key that held nothing may be pinned:
//! it then holds only the pin. Semaphore keys take `RL.PIN key PERMITS n|BLOCK|EXEMPT`
//! (and `BLOCK`/`EXEMPT` alone on an existing one): see [`crate::semaphore::pin`]. Share
//! keys take the bucket's syntax, and `RL.PIN key SHARES rate cap|BLOCK|EXEMPT [PX ms]`
//! pins a key before any holder came: see [`crate::share::pin`].

use crate::args::Args;
use crate::bucket::effect;
use crate::bucket::key::BucketKey;
use crate::bucket::stored::StateMut;
use crate::clock;
use crate::error::{Error, Result};
use crate::ffi::{Ctx, Value};
use crate::grammar;
use crate::observe::stats;
use crate::reply::Reply;
use crate::semaphore::PermitKey;
use crate::share::ShareKey;
use rl_core::pin::{self, PinKind};
use rl_core::{Bucket, Limit, Nanos, PermitPin};

const SHARE_KEY: &str =
    "this key holds shares (RL.SHARE): pin it with RL.PIN key rate cap|BLOCK|EXEMPT [PX ms]";
const NOT_SHARES: &str =
    "this key is not a share key: RL.PIN key SHARES ... pins share keys (RL.SHARE) or a key that holds nothing";
const PERMITS_NEEDED: &str =
    "this key is a semaphore (RL.ACQUIRE): pin its concurrency with RL.PIN key PERMITS n";
const BUCKET_KEY: &str =
    "this key is a token bucket: RL.PIN key PERMITS ... pins semaphore keys (RL.ACQUIRE)";

/// What a key holds, for the pin commands to pick their type.
#[derive(PartialEq)]
enum Holds {
    Bucket,
    Permits,
    Shares,
}

/// What `name` holds (a missing key: a bucket, the default), or the error for a key no
/// pin covers.
fn holds(ctx: Ctx, name: crate::ffi::Str) -> Result<Holds> {
    let key = crate::ffi::OpenKey::open(ctx, name, crate::ffi::Access::Read);
    match key.value() {
        Value::Permits(_) => Ok(Holds::Permits),
        Value::Shares(_) => Ok(Holds::Shares),
        Value::Other => Err(Error::WrongType),
        _ => Ok(Holds::Bucket),
    }
}

/// The bucket of `key` (after [`holds`] said it is one, or none).
fn bucket_of<'k>(key: &'k BucketKey) -> Result<Option<StateMut<'k>>> {
    key.state()
}

/// What `RL.PIN` was asked, from argument `at`: the kind, a rate pin's limit, and its
/// length in ms (0: none).
fn parse(args: &Args, at: usize) -> Result<(PinKind, Option<Limit>, u64)> {
    let (kind, limit, from) = if args.is(at, "PERMITS") || args.is(at, "SHARES") {
        return Err(Error::Invalid(
            "internal: PERMITS and SHARES are parsed apart",
        ));
    } else if args.is(at, "BLOCK") {
        (PinKind::Block, None, at + 1)
    } else if args.is(at, "EXEMPT") {
        (PinKind::Exempt, None, at + 1)
    } else {
        if args.len() < at + 2 {
            return Err(Error::Arity);
        }
        (PinKind::Rate, Some(grammar::limit(args, at)?), at + 2)
    };
    Ok((kind, limit, px(args, from)?))
}

/// `[PX ms]` from argument `from` to the end (0: none).
fn px(args: &Args, from: usize) -> Result<u64> {
    let rest = args.len().saturating_sub(from);
    // `PX ms PX ...`: the option twice, as every command answers a repeated option (its
    // first value checked first, as the option parsers read left to right).
    if rest >= 3 && args.is(from, "PX") && args.is(from + 2, "PX") {
        args.positive(from + 1, "PX must be a positive integer (ms)")?;
        return Err(args.duplicate(from + 2));
    }
    match rest {
        0 => Ok(0),
        2 if args.is(from, "PX") => args.positive(from + 1, "PX must be a positive integer (ms)"),
        1 | 2 => Err(args.unknown(from)),
        _ => Err(Error::Arity),
    }
}

/// `RL.PIN key PERMITS n|BLOCK|EXEMPT [PX ms]`: the pin of a semaphore key.
fn parse_permits(args: &Args) -> Result<(PinKind, u64, u64)> {
    if args.len() < 3 {
        return Err(Error::Arity);
    }
    let (kind, limit) = if args.is(2, "BLOCK") {
        (PinKind::Block, 0)
    } else if args.is(2, "EXEMPT") {
        (PinKind::Exempt, 0)
    } else {
        (
            PinKind::Rate,
            args.positive(2, "PERMITS takes a positive integer limit, BLOCK or EXEMPT")?,
        )
    };
    Ok((kind, limit, px(args, 3)?))
}

/// Whether `name` exists (of any type).
fn key_exists(ctx: Ctx, name: crate::ffi::Str) -> bool {
    let key = crate::ffi::OpenKey::open(ctx, name, crate::ffi::Access::Read);
    !matches!(key.value(), Value::Empty)
}

/// The instant a pin of `ms` set at `now` ends (0: none).
fn end_of(ms: u64, now: Nanos) -> Result<Nanos> {
    if ms == 0 {
        return Ok(0);
    }
    ms.checked_mul(1_000_000)
        .and_then(|ns| now.checked_add(ns))
        .filter(|&t| t <= i64::MAX as u64)
        .ok_or(Error::Invalid("PX is too long"))
}

pub fn pin(ctx: Ctx, args: Args) -> Result<Reply> {
    // At most `key SHARES rate cap PX ms`, and one more `PX ms` to be refused as given twice.
    if !(2..=8).contains(&args.len()) {
        return Err(Error::Arity);
    }
    let name = args.raw(0)?;
    let holds = holds(ctx, name)?;
    let now = clock::now();
    let shares = args.is(1, "SHARES");
    if shares || holds == Holds::Shares {
        if holds != Holds::Shares && key_exists(ctx, name) {
            return Err(Error::Invalid(NOT_SHARES));
        }
        let at = 1 + usize::from(shares);
        if args.is(at, "PERMITS") || args.is(at, "SHARES") {
            return Err(Error::Invalid(SHARE_KEY));
        }
        let (kind, limit, ms) = parse(&args, at)?;
        let p = crate::share::pin::of(kind, limit, end_of(ms, now)?)?;
        let key = ShareKey::open(ctx, name);
        return crate::share::pin::pin(ctx, &key, p, now);
    }
    if args.len() > 7 {
        return Err(Error::Arity);
    }
    if args.is(1, "PERMITS") {
        let (kind, limit, ms) = parse_permits(&args)?;
        if holds == Holds::Bucket && key_exists(ctx, name) {
            return Err(Error::Invalid(BUCKET_KEY));
        }
        let until = end_of(ms, now)?;
        let key = PermitKey::open(ctx, name);
        let p = PermitPin { kind, limit, until };
        return crate::semaphore::pin::pin(ctx, &key, p, now);
    }
    let (kind, limit, ms) = parse(&args, 1)?;
    let until = end_of(ms, now)?;
    if holds == Holds::Permits {
        if kind == PinKind::Rate {
            return Err(Error::Invalid(PERMITS_NEEDED));
        }
        let key = PermitKey::open(ctx, name);
        let p = PermitPin {
            kind,
            limit: 0,
            until,
        };
        return crate::semaphore::pin::pin(ctx, &key, p, now);
    }
    let key = BucketKey::open(ctx, name);
    let state = bucket_of(&key)?;
    let stored: Option<Bucket> = state.as_ref().map(|s| s.bucket());
    let bucket = pin::pinned(stored.as_ref(), kind, limit, until, now);
    key.store(state, &bucket);
    effect::with_stored_limit(name, &bucket, |e| effect::bucket(ctx, e));
    stats::PINS_SET.add(1);
    Ok(Reply::Ok)
}

pub fn unpin(ctx: Ctx, args: Args) -> Result<Reply> {
    if args.len() != 1 {
        return Err(Error::Arity);
    }
    let now = clock::now();
    let name = args.raw(0)?;
    let holds = holds(ctx, name)?;
    if holds == Holds::Shares {
        return crate::share::pin::unpin(ctx, &ShareKey::open(ctx, name), now);
    }
    if holds == Holds::Permits {
        let key = PermitKey::open(ctx, name);
        let Some(t) = key.table()? else {
            return Ok(Reply::Int(0));
        };
        return crate::semaphore::pin::unpin(ctx, &key, t, now);
    }
    let key = BucketKey::open(ctx, name);
    let state = bucket_of(&key)?;
    let Some(stored) = state.as_ref().map(|s| s.bucket()) else {
        return Ok(Reply::Int(0));
    };
    if !stored.pin().is_some_and(|p| p.live_at(now)) {
        // No pin, or one that has ended (it goes at the key's next write).
        return Ok(Reply::Int(0));
    }
    let leased = state.as_ref().is_some_and(|s| s.table().is_some());
    match pin::unpinned(&stored, now) {
        Some(bucket) if leased || bucket.expires_at() > now => {
            key.store(state, &bucket);
            effect::with_stored_limit(name, &bucket, |e| effect::bucket(ctx, e));
        }
        _ => {
            // Nothing under the pin, or a full bucket without leases: the same as no key.
            key.delete();
            crate::effect::deleted(ctx, name);
        }
    }
    stats::PINS_REMOVED.add(1);
    Ok(Reply::Int(1))
}

/// `RL.PINNED key`: nil, or the live pin: `kind` (`rate`, `block`, `exempt`), `rate` and
/// `cap` (a rate pin's; nil otherwise), `ms_left` (-1: until `RL.UNPIN`).
pub fn pinned(ctx: Ctx, args: Args) -> Result<Reply> {
    if args.len() != 1 {
        return Err(Error::Arity);
    }
    let now = clock::now();
    let name = args.raw(0)?;
    let key = crate::ffi::OpenKey::open(ctx, name, crate::ffi::Access::Read);
    match key.value() {
        Value::Permits(t) => return Ok(crate::semaphore::pin::describe(t, now)),
        Value::Shares(t) => return Ok(crate::share::pin::describe(t, now)),
        _ => {}
    }
    drop(key);
    holds(ctx, name)?;
    let key = BucketKey::open_read(ctx, name);
    let Some(bucket) = bucket_of(&key)?.map(|s| s.bucket()) else {
        return Ok(Reply::Null);
    };
    Ok(describe(&bucket, now).unwrap_or(Reply::Null))
}

/// The live pin of `bucket` as `RL.PINNED` shows it.
fn describe(bucket: &Bucket, now: Nanos) -> Option<Reply> {
    let p = bucket.pin().filter(|p| p.live_at(now))?;
    let (rate, cap) = match p.kind {
        PinKind::Rate => (
            Reply::Double(bucket.limit().rate()),
            Reply::Double(bucket.limit().cap()),
        ),
        _ => (Reply::Null, Reply::Null),
    };
    let left = p.left(now).map_or(-1, |ns| {
        rl_core::ceil_millis(ns).min(i64::MAX as u64) as i64
    });
    Some(Reply::fields([
        (c"kind", Reply::Text(p.kind.c_name())),
        (c"rate", rate),
        (c"cap", cap),
        (c"ms_left", Reply::Int(left)),
    ]))
}
