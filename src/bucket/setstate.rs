//! `RL.SETSTATE key full_at rate cap [HOLD t SPAN d] [VERSION v] [PIN kind until base_rate base_cap absent] [LASTID id] [PRUNE t] [DROP id] [ADD id tokens expires_at]`
//!
//! The effect replicas and the AOF apply (see [`crate::bucket::effect`]); not meant for clients.
//! `RL.SETSTATE key full_at KEEP [HOLD t]` moves only the instant the key's bucket is full
//! and its hold (the effect of a take on a pinned key): the key must hold a bucket.
//!
//! It only sets what it is told: no clock is read, so every copy ends with the same bytes.
//!
//! The complete resulting state (the bucket given, and the key's lease table changed as
//! told) is checked by [`rl_core::validate`], the same function RDB load uses, before
//! anything is written: a state this command accepts is one every reload, sync and
//! migration accepts, and a refused one changes nothing.

use crate::args::Args;
use crate::bucket::key::BucketKey;
use crate::error::{Error, Result};
use crate::ffi::{self, Ctx};
use crate::reply::Reply;
use rl_core::Lease;

/// The lease-table changes one effect carries, each at most once.
#[derive(Default)]
struct TableOps {
    /// `HOLD t SPAN d`: the instant before which the key must not go even if full, and how
    /// long after each write it must stay (part of the bucket, not the table; absent: 0).
    keep_until: Option<u64>,
    keep_after_write: Option<u64>,
    /// The version of the bucket's limit (absent: 0).
    version: Option<u64>,
    last_id: Option<u64>,
    prune: Option<u64>,
    drop: Option<u64>,
    add: Option<Lease>,
    /// `PIN kind until base_rate base_cap absent` (part of the bucket; absent: no pin).
    pin: Option<rl_core::PinParts>,
}

impl TableOps {
    fn any(&self) -> bool {
        self.last_id.is_some() || self.prune.is_some() || self.drop.is_some() || self.add.is_some()
    }
}

fn parse_ops(args: &Args) -> Result<TableOps> {
    let mut ops = TableOps::default();
    let mut i = 4;
    while i < args.len() {
        let int = |j: usize| args.integer(j, "lease fields must be non-negative integers");
        let seen = |given: bool| {
            if given {
                Err(args.duplicate(i))
            } else {
                Ok(())
            }
        };
        if args.is(i, "HOLD") {
            seen(ops.keep_until.is_some())?;
            ops.keep_until = Some(int(i + 1)?);
            i += 2;
        } else if args.is(i, "SPAN") {
            seen(ops.keep_after_write.is_some())?;
            ops.keep_after_write = Some(int(i + 1)?);
            i += 2;
        } else if args.is(i, "VERSION") {
            seen(ops.version.is_some())?;
            ops.version = Some(crate::grammar::version(args, i + 1)?);
            i += 2;
        } else if args.is(i, "PIN") {
            seen(ops.pin.is_some())?;
            let absent = int(i + 5)?;
            if absent > 1 {
                return Err(Error::Invalid("the pin's absent flag must be 0 or 1"));
            }
            ops.pin = Some(rl_core::PinParts {
                kind: int(i + 1)?,
                until: int(i + 2)?,
                base_rate: args.number(i + 3, "the pin's base rate is not a number")?,
                base_cap: args.number(i + 4, "the pin's base cap is not a number")?,
                absent: absent == 1,
            });
            i += 6;
        } else if args.is(i, "LASTID") {
            seen(ops.last_id.is_some())?;
            ops.last_id = Some(int(i + 1)?);
            i += 2;
        } else if args.is(i, "PRUNE") {
            seen(ops.prune.is_some())?;
            ops.prune = Some(int(i + 1)?);
            i += 2;
        } else if args.is(i, "DROP") {
            seen(ops.drop.is_some())?;
            ops.drop = Some(int(i + 1)?);
            i += 2;
        } else if args.is(i, "ADD") {
            seen(ops.add.is_some())?;
            ops.add = Some(Lease {
                id: int(i + 1)?,
                tokens: int(i + 2)?,
                expires_at: int(i + 3)?,
            });
            i += 4;
        } else {
            return Err(args.unknown(i));
        }
    }
    Ok(ops)
}

pub fn setstate(ctx: Ctx, args: Args) -> Result<Reply> {
    if args.is(2, "KEEP") {
        return moved(ctx, &args);
    }
    if args.len() < 4 {
        return Err(Error::Arity);
    }
    let full_at = args.integer(1, "full_at must be a non-negative integer")?;
    let rate = args.number(2, "rate is not a number")?;
    let cap = args.number(3, "cap is not a number")?;
    let ops = parse_ops(&args)?;

    let key = BucketKey::open(ctx, args.raw(0)?);
    let state = key.state()?;
    let (keep_until, keep_after_write, version) = (
        ops.keep_until.unwrap_or(0),
        ops.keep_after_write.unwrap_or(0),
        ops.version.unwrap_or(0),
    );
    let validate = |last_id, leases| {
        let (bucket, table) = rl_core::validate(
            full_at,
            rate,
            cap,
            keep_until,
            keep_after_write,
            version,
            last_id,
            leases,
        )?;
        let bucket = match ops.pin {
            Some(p) => rl_core::validate_pin(bucket, &table, p)?,
            None => bucket,
        };
        Ok::<_, rl_core::StateError>((bucket, table))
    };
    if !ops.any() {
        // The bucket alone; the key's leases (valid when they got in) stay as they are.
        let (bucket, _) = validate(0, Vec::new())?;
        let leased = state.as_ref().is_some_and(|s| s.table().is_some());
        if leased && bucket.pin().is_some_and(|p| p.absent) {
            // A key that holds only a pin holds no leases either.
            return Err(rl_core::StateError::PinAbsent.into());
        }
        key.store(state, &bucket);
    } else {
        // The table this effect leaves: the key's own, changed as told (a copy: nothing
        // is changed until the whole result is known to be valid).
        let mut table = state
            .as_ref()
            .and_then(|s| s.table().cloned())
            .unwrap_or_default();
        if let Some(id) = ops.last_id {
            table.raise_last_id(id);
        }
        if let Some(t) = ops.prune {
            table.prune(t);
        }
        if let Some(id) = ops.drop {
            table.remove(id);
        }
        if let Some(l) = ops.add {
            table.insert(l);
        }
        let (last_id, leases) = table.into_parts();
        let (bucket, table) = validate(last_id, leases)?;
        key.replace(state, bucket, table);
    }
    ffi::replicate_verbatim(ctx);
    Ok(Reply::Ok)
}

/// `RL.SETSTATE key full_at KEEP [HOLD t]`: the stored bucket, full at `full_at` and kept
/// until `t` (absent: 0), every other part (limit, span, version, pin, leases) kept;
/// checked as a state given in full is.
fn moved(ctx: Ctx, args: &Args) -> Result<Reply> {
    let keep_until = match args.len() {
        3 => 0,
        5 if args.is(3, "HOLD") => args.integer(4, "HOLD must be a non-negative integer")?,
        4 | 5 => return Err(args.unknown(3)),
        _ => return Err(Error::Arity),
    };
    let full_at = args.integer(1, "full_at must be a non-negative integer")?;
    let key = BucketKey::open(ctx, args.raw(0)?);
    let Some(state) = key.state()? else {
        return Err(Error::Invalid(
            "RL.SETSTATE key full_at KEEP needs a key that holds a bucket",
        ));
    };
    let empty = rl_core::LeaseTable::default();
    let table = state.table().unwrap_or(&empty);
    let bucket = rl_core::validate_moved(&state.bucket(), table, full_at, keep_until)?;
    key.store(Some(state), &bucket);
    ffi::replicate_verbatim(ctx);
    Ok(Reply::Ok)
}
