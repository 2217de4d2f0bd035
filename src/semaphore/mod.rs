//! The `rl-permit` module type: a key holding the live permits of one semaphore
//! (`RL.ACQUIRE` / `RL.RELEASE` / `RL.RENEW`). A different type from a bucket, so a
//! bucket command on a semaphore key (and the reverse) is a `WRONGTYPE` error.
//!
//! RDB encoding version 2, per key: `last_id count (id expires_at) * count pin`
//! (unsigneds), `pin` 0 for none, else its kind's code followed by `until limit`. Version
//! 1 (without `pin`) is still read. The key's expiry is its last permit's (not before a
//! pin ends; none while a pin without an end holds): when that goes, nothing is held,
//! which is the same as no key.
//!
//! Effects: `RL.SETPERMITS key LASTID id [PRUNE t] [DROP id] [ADD id expires_at] [PIN kind
//! until limit]` (an ADD of an existing id replaces its expiry: a renewal; without `PIN`
//! the key is left unpinned). The result is checked by [`PermitTable::validate_pinned`],
//! the same function RDB load uses.

pub mod acquire;
pub mod pin;
pub mod setpermits;

use crate::effect::{Decimal, EffectArgs};
use crate::error::{Error, Result};
use crate::ffi::{self, Access, Aof, Ctx, Digest, EffectArg, Io, OpenKey, Str, Value};
use crate::observe::stats;
use rl_core::{Nanos, Permit, PermitTable, MAX_PERMITS};

pub const ENCODING_VERSION: i32 = 2;

pub fn save(io: &Io, t: &PermitTable) {
    io.save_unsigned(t.last_id());
    io.save_unsigned(t.permits().len() as u64);
    for p in t.permits() {
        io.save_unsigned(p.id);
        io.save_unsigned(p.expires_at);
    }
    match t.pin() {
        None => io.save_unsigned(0),
        Some(p) => {
            io.save_unsigned(p.kind.code());
            io.save_unsigned(p.until);
            io.save_unsigned(p.limit);
        }
    }
}

/// Reads one value; `None` for an unknown encoding, an I/O error or a table
/// [`PermitTable::validate`] refuses.
pub fn load(io: &Io, encver: i32) -> Option<PermitTable> {
    if !(1..=ENCODING_VERSION).contains(&encver) {
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
    let pin = match if encver >= 2 { io.load_unsigned() } else { 0 } {
        0 => None,
        code => Some(rl_core::PermitPin {
            kind: rl_core::pin::PinKind::from_code(code)?,
            until: io.load_unsigned(),
            limit: io.load_unsigned(),
        }),
    };
    if io.failed() {
        return None;
    }
    let t = PermitTable::validate_pinned(last_id, permits, pin).ok()?;
    stats::PERMITS_IN_USE.add_shared(t.permits().len() as u64);
    if t.pin().is_some() {
        stats::PINNED_KEYS.add_shared(1);
    }
    Some(t)
}

pub fn rewrite(aof: &Aof, key: Str, t: &PermitTable) {
    let cmd = c"RL.SETPERMITS";
    let last = EffectArg::Int(t.last_id() as i64);
    // Every line carries the pin: an effect without one leaves the key unpinned.
    let pin = t.pin().map(PinWords::new);
    let emit = |more: &[EffectArg]| {
        let mut args = EffectArgs::new();
        args.push(EffectArg::Str(key))
            .push(EffectArg::Text(c"LASTID"))
            .push(last);
        for a in more {
            args.push(*a);
        }
        if let Some(p) = &pin {
            p.push_onto(&mut args);
        }
        crate::ffi::emit_aof(aof, cmd, args.get());
    };
    if t.permits().is_empty() || pin.is_none() {
        // A pinned key without permits is the pin alone; otherwise the first ADD makes it.
        emit(&[]);
    }
    for p in t.permits() {
        emit(&[
            EffectArg::Text(c"ADD"),
            EffectArg::Int(p.id as i64),
            EffectArg::Int(p.expires_at as i64),
        ]);
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
    if let Some(p) = t.pin() {
        // A marker no permit id can be (ids are at most i64::MAX).
        md.add(u64::MAX);
        md.add(p.kind.code());
        md.add(p.until);
        md.add(p.limit);
    }
    md.end_sequence();
}

pub fn freed(t: PermitTable) {
    stats::PERMITS_IN_USE.sub_shared(t.permits().len() as u64);
    if t.pin().is_some() {
        stats::PINNED_KEYS.sub_shared(1);
    }
}

pub fn unlinked(t: &PermitTable) {
    stats::PERMITS_EXPIRED.add_shared(t.permits().len() as u64);
}

pub fn copied(t: &PermitTable) -> PermitTable {
    stats::PERMITS_IN_USE.add_shared(t.permits().len() as u64);
    if t.pin().is_some() {
        stats::PINNED_KEYS.add_shared(1);
    }
    t.clone()
}

/// A permit pin as the words of its effect: `PIN kind until limit`.
pub struct PinWords([Decimal; 3]);

impl PinWords {
    pub fn new(p: rl_core::PermitPin) -> PinWords {
        PinWords([p.kind.code(), p.until, p.limit].map(Decimal::new))
    }

    pub fn push_onto<'a>(&'a self, args: &mut EffectArgs<'a>) {
        args.push(EffectArg::Text(c"PIN"));
        for d in &self.0 {
            args.push(EffectArg::Bytes(d.bytes()));
        }
    }
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
        let pinned = t.pin().is_some();
        let expiry = t.expires_at().unwrap_or(0);
        if let Err(t) = self.key.set_permits(t) {
            stats::PERMITS_IN_USE.sub_shared(t.permits().len() as u64);
            return;
        }
        if pinned {
            stats::PINNED_KEYS.add_shared(1);
        }
        self.expire_at(expiry);
    }

    /// After the table was changed in place (`was_pinned`: it held a pin before): the
    /// key's expiry follows its last permit and its pin, and a table left with nothing is
    /// no key at all.
    pub fn written(&self, t: &PermitTable, was_pinned: bool) {
        match (was_pinned, t.pin().is_some()) {
            (false, true) => stats::PINNED_KEYS.add_shared(1),
            (true, false) => stats::PINNED_KEYS.sub_shared(1),
            _ => {}
        }
        match t.expires_at() {
            Some(at) => self.expire_at(at),
            None => self.delete(),
        }
    }

    fn expire_at(&self, at: u64) {
        self.modified.set(true);
        let ms = rl_core::expiry_ms(at);
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
    /// The key's pin after the change (none: unpinned).
    pub pin: Option<rl_core::PermitPin>,
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
    let pin = c.pin.map(PinWords::new);
    if let Some(p) = &pin {
        p.push_onto(&mut args);
    }
    ffi::replicate(ctx, c"RL.SETPERMITS", args.get());
}
