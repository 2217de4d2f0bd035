//! `RL.PIN key rate cap [PX ms]`, `RL.PIN key BLOCK [PX ms]`, `RL.PIN key EXEMPT [PX ms]`,
//! `RL.UNPIN key`, `RL.PINNED key`: an operator's limit on a key, stored in its bucket and
//! applied by every command on it (see [`rl_core::pin`]).
//!
//! Pinning writes the bucket as it stands under the pin (a rate pin's tokens carried over
//! into the pinned limit) and replicates it as `RL.SETSTATE ... PIN ...`; unpinning writes it
//! back under the limit callers' calls resolve to. A key that held nothing may be pinned:
//! it then holds only the pin. Pins apply to buckets; a share or permit key is refused.

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
use rl_core::pin::{self, PinKind};
use rl_core::{Bucket, Limit, Nanos};

const NOT_A_BUCKET: &str =
    "RL.PIN pins bucket keys: this key holds shares or permits, which pins do not cover yet";

/// The bucket of `key`, or the error for a key of another type.
fn bucket_of<'k>(key: &'k BucketKey) -> Result<Option<StateMut<'k>>> {
    match key.open_key().value() {
        Value::Permits(_) | Value::Shares(_) => Err(Error::Invalid(NOT_A_BUCKET)),
        _ => key.state(),
    }
}

/// What `RL.PIN` was asked: the kind, a rate pin's limit, and its length in ms (0: none).
fn parse(args: &Args) -> Result<(PinKind, Option<Limit>, u64)> {
    let (kind, limit, from) = if args.is(1, "BLOCK") {
        (PinKind::Block, None, 2)
    } else if args.is(1, "EXEMPT") {
        (PinKind::Exempt, None, 2)
    } else {
        if args.len() < 3 {
            return Err(Error::Arity);
        }
        (PinKind::Rate, Some(grammar::limit(args, 1)?), 3)
    };
    let ms = match args.len() - from {
        0 => 0,
        2 if args.is(from, "PX") => {
            args.positive(from + 1, "PX must be a positive integer (ms)")?
        }
        2 => return Err(args.unknown(from)),
        1 => return Err(args.unknown(from)),
        _ => return Err(Error::Arity),
    };
    Ok((kind, limit, ms))
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
    if !(2..=5).contains(&args.len()) {
        return Err(Error::Arity);
    }
    let (kind, limit, ms) = parse(&args)?;
    let now = clock::now();
    let until = end_of(ms, now)?;
    let name = args.raw(0)?;
    let key = BucketKey::open(ctx, name);
    let state = bucket_of(&key)?;
    let stored: Option<Bucket> = state.as_ref().map(|s| s.bucket());
    let bucket = pin::pinned(stored.as_ref(), kind, limit, until, now);
    key.store(state, bucket);
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
            key.store(state, bucket);
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
    let key = BucketKey::open_read(ctx, args.raw(0)?);
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
        (c"kind", Reply::Text(kind_name(p.kind))),
        (c"rate", rate),
        (c"cap", cap),
        (c"ms_left", Reply::Int(left)),
    ]))
}

/// A pin's kind as replies name it.
pub fn kind_name(kind: PinKind) -> &'static std::ffi::CStr {
    match kind {
        PinKind::Rate => c"rate",
        PinKind::Block => c"block",
        PinKind::Exempt => c"exempt",
    }
}
