//! The `rl-permit` module type: a key holding the live permits of one semaphore
//! (`RL.ACQUIRE` / `RL.RELEASE` / `RL.RENEW`). A different type from a bucket, so a
//! bucket command on a semaphore key (and the reverse) is a `WRONGTYPE` error.
//!
//! RDB encoding version 1, per key: `last_id count (id expires_at) * count` (unsigneds).
//! The key's expiry is its last permit's: when that goes, no permit is held, which is the
//! same as no key.
//!
//! Effects: `RL.SETPERMITS key LASTID id [PRUNE t] [DROP id] [ADD id expires_at]` (an ADD
//! of an existing id replaces its expiry: a renewal). The result is checked by
//! [`PermitTable::validate`], the same function RDB load uses.

pub mod acquire;
pub mod setpermits;

use crate::effect::{Decimal, EffectArgs};
use crate::error::{Error, Result};
use crate::ffi::{self, Access, Aof, Ctx, Digest, EffectArg, Io, OpenKey, Str, Value};
use crate::observe::stats;
use rl_core::{Nanos, Permit, PermitTable, MAX_PERMITS};

pub const ENCODING_VERSION: i32 = 1;

pub fn save(io: &Io, t: &PermitTable) {
    io.save_unsigned(t.last_id());
    io.save_unsigned(t.permits().len() as u64);
    for p in t.permits() {
        io.save_unsigned(p.id);
        io.save_unsigned(p.expires_at);
    }
}

/// Reads one value; `None` for an unknown encoding, an I/O error or a table
/// [`PermitTable::validate`] refuses.
pub fn load(io: &Io, encver: i32) -> Option<PermitTable> {
    if encver != ENCODING_VERSION {
        return None;
    }
    let last_id = io.load_unsigned();
    let count = io.load_unsigned();
    if io.failed() || count > MAX_PERMITS as u64 {
        return None;
    }
    let mut permits = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let id = io.load_unsigned();
        let expires_at = io.load_unsigned();
        if io.failed() {
            return None;
        }
        permits.push(Permit { id, expires_at });
    }
    let t = PermitTable::validate(last_id, permits).ok()?;
    stats::PERMITS_IN_USE.add_shared(t.permits().len() as u64);
    Some(t)
}

pub fn rewrite(aof: &Aof, key: Str, t: &PermitTable) {
    let cmd = c"RL.SETPERMITS";
    let last = EffectArg::Int(t.last_id() as i64);
    crate::ffi::emit_aof(
        aof,
        cmd,
        &[EffectArg::Str(key), EffectArg::Text(c"LASTID"), last],
    );
    for p in t.permits() {
        crate::ffi::emit_aof(
            aof,
            cmd,
            &[
                EffectArg::Str(key),
                EffectArg::Text(c"LASTID"),
                last,
                EffectArg::Text(c"ADD"),
                EffectArg::Int(p.id as i64),
                EffectArg::Int(p.expires_at as i64),
            ],
        );
    }
    // The key's actual expiry follows (Redis appends PEXPIREAT when it has one).
    crate::ffi::emit_aof(aof, c"PERSIST", &[EffectArg::Str(key)]);
}

pub fn mem_usage(t: &PermitTable) -> usize {
    std::mem::size_of::<PermitTable>() + std::mem::size_of_val(t.permits())
}

pub fn digest(md: &Digest, t: &PermitTable) {
    md.add(t.last_id());
    for p in t.permits() {
        md.add(p.id);
        md.add(p.expires_at);
    }
    md.end_sequence();
}

pub fn freed(t: PermitTable) {
    stats::PERMITS_IN_USE.sub_shared(t.permits().len() as u64);
}

pub fn unlinked(t: &PermitTable) {
    stats::PERMITS_EXPIRED.add_shared(t.permits().len() as u64);
}

pub fn copied(t: &PermitTable) -> PermitTable {
    stats::PERMITS_IN_USE.add_shared(t.permits().len() as u64);
    t.clone()
}

/// A semaphore key opened for one command; closed (and signalled if written) when dropped.
pub struct PermitKey {
    key: OpenKey,
    modified: std::cell::Cell<bool>,
}

impl PermitKey {
    pub fn open(ctx: Ctx, name: Str) -> PermitKey {
        PermitKey {
            key: OpenKey::open(ctx, name, Access::Write),
            modified: std::cell::Cell::new(false),
        }
    }

    /// The permits held here: `None` if the key does not exist, `WRONGTYPE` if it holds
    /// something else (a bucket included).
    // The table is owned by Redis's keyspace, not by this handle: borrowing it mutably
    // through `&self` lets a command change it and then update the key's expiry.
    #[allow(clippy::mut_from_ref)]
    pub fn table(&self) -> Result<Option<&mut PermitTable>> {
        match self.key.value() {
            Value::Empty => Ok(None),
            Value::Permits(t) => Ok(Some(t)),
            _ => Err(Error::WrongType),
        }
    }

    /// Stores `t` as the key's value (a new key), with its expiry.
    pub fn create(&self, t: PermitTable) {
        stats::PERMITS_IN_USE.add_shared(t.permits().len() as u64);
        let expiry = t.last_expiry().unwrap_or(0);
        if let Err(t) = self.key.set_permits(t) {
            stats::PERMITS_IN_USE.sub_shared(t.permits().len() as u64);
            return;
        }
        self.expire_at(expiry);
    }

    /// After the table was changed in place: the key's expiry follows its last permit, and
    /// a table left with no permit is no key at all.
    pub fn written(&self, t: &PermitTable) {
        match t.last_expiry() {
            Some(at) => self.expire_at(at),
            None => self.delete(),
        }
    }

    fn expire_at(&self, at: u64) {
        self.modified.set(true);
        let ms = rl_core::ceil_millis(at) as i64;
        if self.key.expire_ms() != ms {
            self.key.set_expire_ms(ms);
        }
    }

    pub fn delete(&self) {
        self.modified.set(true);
        self.key.delete();
    }

    /// The key's name (for effects).
    pub fn name(&self) -> Str {
        self.key.name()
    }
}

impl Drop for PermitKey {
    /// Signals the key if a write changed it (then the key closes).
    fn drop(&mut self) {
        if self.modified.get() {
            self.key.signal_modified();
        }
    }
}

/// Counts permits leaving a table (released, or dropped as expired).
pub fn left(n: usize) {
    stats::PERMITS_IN_USE.sub_shared(n as u64);
}

/// Counts a permit entering a table.
pub fn entered() {
    stats::PERMITS_IN_USE.add_shared(1);
}

/// A change to a semaphore key: its last id, expired permits dropped at `prune`, one
/// permit dropped, one added (or its expiry replaced: a renewal).
pub struct PermitChange {
    pub key: Str,
    pub last_id: u64,
    pub prune: Nanos,
    pub drop: Option<u64>,
    pub add: Option<rl_core::Permit>,
}

pub fn permits(ctx: Ctx, c: &PermitChange) {
    let (last_id, prune) = (Decimal::new(c.last_id), Decimal::new(c.prune));
    let drop = c.drop.map(Decimal::new);
    let add = c.add.map(|a| [a.id, a.expires_at].map(Decimal::new));
    let mut args = EffectArgs::new();
    args.push(EffectArg::Str(c.key))
        .keyword(c"LASTID", &last_id)
        .keyword(c"PRUNE", &prune);
    match (&drop, &add) {
        (Some(id), _) => {
            args.keyword(c"DROP", id);
        }
        (None, Some([id, expires_at])) => {
            args.keyword(c"ADD", id)
                .push(EffectArg::Bytes(expires_at.bytes()));
        }
        (None, None) => {}
    }
    ffi::replicate(ctx, c"RL.SETPERMITS", args.get());
}
