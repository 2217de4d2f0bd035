//! `RL.ACQUIRE key limit ttl_ms`, `RL.RELEASE key permit_id`, `RL.RENEW key permit_id
//! ttl_ms`: a distributed semaphore whose permits expire, so a crashed holder frees its
//! slot after `ttl_ms`. For capping how many calls are in flight to a slow downstream.
//!
//! ACQUIRE reply: `[granted (1 or 0), permit_id (0 when denied), in_use (after this
//! call), retry_after_ms (when denied: until the earliest permit expires)]`. RELEASE: 1 if
//! it released a live permit, else 0. RENEW: 1 and a new expiry, or 0. Denials and no-ops
//! write nothing; a key whose last permit goes is deleted.

use crate::args::Args;
use crate::clock;
use crate::error::{Error, Result};
use crate::ffi::Ctx;
use crate::observe::stats;
use crate::reply::Reply;
use crate::semaphore::PermitChange;
use crate::semaphore::{self, PermitKey};
use rl_core::{ceil_millis, Acquired, PermitTable, MAX_PERMITS};

/// Longest permit: a day. A holder that needs longer renews.
const MAX_TTL_MS: u64 = 86_400_000;

fn ttl_at(args: &Args, i: usize) -> Result<u64> {
    let ttl_ms = args.positive(i, "ttl_ms must be a positive integer")?;
    if ttl_ms > MAX_TTL_MS {
        return Err(Error::Invalid("ttl_ms must be at most 86400000 (a day)"));
    }
    Ok(ttl_ms * 1_000_000)
}

pub fn acquire(ctx: Ctx, args: Args) -> Result<Reply> {
    if args.len() != 3 {
        return Err(Error::Arity);
    }
    let limit = args.positive(1, "limit must be a positive integer")?;
    if limit > MAX_PERMITS as u64 {
        return Err(Error::Invalid("limit must be at most 10000"));
    }
    let ttl = ttl_at(&args, 2)?;
    let now = clock::now();
    let name = args.raw(0)?;
    let key = PermitKey::open(ctx, name);
    let mut fresh = PermitTable::default();
    let existing = key.table()?;
    let is_new = existing.is_none();
    let table = existing.unwrap_or(&mut fresh);
    let was_pinned = table.pin().is_some();
    if table.live_pin(now).is_some() {
        stats::PINNED_DECISIONS.add(1);
    }
    let (decision, pruned) = table.acquire(limit, ttl, now)?;
    let in_use = table.in_use(now);
    let permit = match decision {
        Acquired::Granted(permit) => permit,
        Acquired::Denied { retry_after } => {
            stats::PERMITS_DENIED.add(1);
            return Ok(reply(0, 0, in_use, ceil_millis(retry_after)));
        }
        Acquired::Exempt => {
            // Let through, nothing recorded: permit id 0 (releasing it does nothing).
            stats::PERMITS_ACQUIRED.add(1);
            return Ok(reply(1, 0, in_use, 0));
        }
    };
    stats::PERMITS_ACQUIRED.add(1);
    stats::PERMITS_EXPIRED.add_shared(pruned as u64);
    let last_id = table.last_id();
    let pin = table.pin();
    if is_new {
        key.create(std::mem::take(table));
    } else {
        semaphore::left(pruned);
        semaphore::entered();
        key.written(table, was_pinned);
    }
    let change = PermitChange {
        key: name,
        last_id,
        prune: now,
        drop: None,
        add: Some(permit),
        pin,
    };
    crate::semaphore::permits(ctx, &change);
    Ok(reply(1, permit.id, in_use, 0))
}

fn reply(granted: i64, id: u64, in_use: usize, retry_ms: u64) -> Reply {
    Reply::ints([granted, id as i64, in_use as i64, retry_ms as i64])
}

pub fn release(ctx: Ctx, args: Args) -> Result<Reply> {
    if args.len() != 2 {
        return Err(Error::Arity);
    }
    let id = args.integer(1, "permit_id must be a non-negative integer")?;
    let now = clock::now();
    let name = args.raw(0)?;
    let key = PermitKey::open(ctx, name);
    let Some(table) = key.table()? else {
        return Ok(Reply::Int(0));
    };
    if !table.release(id, now) {
        return Ok(Reply::Int(0));
    }
    let pruned = table.prune(now);
    stats::PERMITS_RELEASED.add(1);
    stats::PERMITS_EXPIRED.add_shared(pruned as u64);
    semaphore::left(1 + pruned);
    written(ctx, &key, table, now, Some(id), None);
    Ok(Reply::Int(1))
}

pub fn renew(ctx: Ctx, args: Args) -> Result<Reply> {
    if args.len() != 3 {
        return Err(Error::Arity);
    }
    let id = args.integer(1, "permit_id must be a non-negative integer")?;
    let ttl = ttl_at(&args, 2)?;
    let now = clock::now();
    let name = args.raw(0)?;
    let key = PermitKey::open(ctx, name);
    let Some(table) = key.table()? else {
        return Ok(Reply::Int(0));
    };
    let Some(permit) = table.renew(id, ttl, now) else {
        return Ok(Reply::Int(0));
    };
    let pruned = table.prune(now);
    stats::PERMITS_EXPIRED.add_shared(pruned as u64);
    semaphore::left(pruned);
    written(ctx, &key, table, now, None, Some(permit));
    Ok(Reply::Int(1))
}

/// After a change in place: the expiry, or the key's deletion, and the effect.
fn written(
    ctx: Ctx,
    key: &PermitKey,
    table: &mut PermitTable,
    now: u64,
    drop: Option<u64>,
    add: Option<rl_core::Permit>,
) {
    if !table.holds_anything(now) {
        key.delete();
        crate::effect::deleted(ctx, key.name());
        return;
    }
    // A pin that has ended goes with this write.
    let was_pinned = table.pin().is_some();
    table.set_pin(table.live_pin(now));
    key.written(table, was_pinned);
    let change = PermitChange {
        key: key.name(),
        last_id: table.last_id(),
        prune: now,
        drop,
        add,
        pin: table.pin(),
    };
    crate::semaphore::permits(ctx, &change);
}
