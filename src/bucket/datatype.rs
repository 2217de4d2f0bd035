//! The `rl-bucket` module type: persistence (RDB, AOF rewrite), digest, copy, memory usage
//! (called from the type's callbacks in [`crate::ffi`]).
//!
//! RDB encoding version 3, per key:
//! `full_at rate cap hold span version table [last_id (id tokens expires_at) * (table - 1)]`
//! (unsigned, double, double, unsigned, unsigned, unsigned, unsigned, then unsigneds), where
//! `hold` and `span` keep a key alive after a limit change (0: none; see
//! [`rl_core::Bucket::span`]), `version` is the version of the limit (`VERSION v`; 0: none)
//! and `table` is 0 for a bucket that never had a lease and `1 + live leases` for one that
//! did. Version 4 adds, after `version`, the pin: `pin` (0: none; else its kind's code,
//! followed by `until base_rate base_cap absent`: unsigned, double, double, unsigned).
//! Version 3 (the same without `pin`), version 2 (without `version` either) and version 1
//! (without `hold` and `span` too) are still read.
//!
//! `free`, `copy` and `rdb_load` keep `rl_leases_active` equal to the leases held in memory.

use crate::bucket::effect;
use crate::bucket::stored::{StateMut, Stored};
use crate::ffi::{Aof, Digest, Io, Str};
use crate::observe::stats;
use rl_core::{Lease, MAX_LEASES};

pub const ENCODING_VERSION: i32 = 4;

pub fn save(io: &Io, state: &StateMut) {
    let b = state.bucket();
    io.save_unsigned(b.full_at());
    io.save_double(b.limit().rate());
    io.save_double(b.limit().cap());
    io.save_unsigned(b.keep_until());
    io.save_unsigned(b.keep_after_write());
    io.save_unsigned(b.version());
    match b.pin() {
        None => io.save_unsigned(0),
        Some(p) => {
            io.save_unsigned(p.kind.code());
            io.save_unsigned(p.until);
            io.save_double(p.base.rate());
            io.save_double(p.base.cap());
            io.save_unsigned(p.absent as u64);
        }
    }
    let Some(table) = state.table() else {
        io.save_unsigned(0);
        return;
    };
    io.save_unsigned(1 + table.leases().len() as u64);
    io.save_unsigned(table.last_id());
    for l in table.leases() {
        io.save_unsigned(l.id);
        io.save_unsigned(l.tokens);
        io.save_unsigned(l.expires_at);
    }
}

/// Reads one value; `None` for an encoding this module does not know, on an I/O error, or
/// for a state [`rl_core::validate`] refuses (the same check `RL.SETSTATE` applies, so what
/// one accepts the other loads).
///
/// The module sets `REDISMODULE_OPTIONS_HANDLE_IO_ERRORS`, so a short or corrupt payload
/// (`RESTORE`, a damaged RDB) makes the reads return 0 and raise the error flag instead of
/// aborting the server; the flag is checked before anything read is trusted.
pub fn load(io: &Io, encver: i32) -> Option<Stored> {
    if !(1..=ENCODING_VERSION).contains(&encver) {
        return None;
    }
    let full_at = io.load_unsigned();
    let rate = io.load_double();
    let cap = io.load_double();
    let (hold, span) = if encver >= 2 {
        (io.load_unsigned(), io.load_unsigned())
    } else {
        (0, 0)
    };
    let version = if encver >= 3 { io.load_unsigned() } else { 0 };
    let pin_kind = if encver >= 4 { io.load_unsigned() } else { 0 };
    let pin = if pin_kind == 0 {
        None
    } else {
        Some(rl_core::PinParts {
            kind: pin_kind,
            until: io.load_unsigned(),
            base_rate: io.load_double(),
            base_cap: io.load_double(),
            absent: match io.load_unsigned() {
                0 => false,
                1 => true,
                _ => return None,
            },
        })
    };
    let table = io.load_unsigned();
    // 0: never leased; else 1 + the number of leases, which may not exceed the bound (a
    // corrupt count must not make us read, or allocate, without end).
    if io.failed() || table > 1 + MAX_LEASES as u64 {
        return None;
    }
    let mut leases = Vec::new();
    let mut last_id = 0;
    if table > 0 {
        last_id = io.load_unsigned();
        for _ in 1..table {
            let id = io.load_unsigned();
            let tokens = io.load_unsigned();
            let expires_at = io.load_unsigned();
            if io.failed() {
                return None;
            }
            leases.push(Lease {
                id,
                tokens,
                expires_at,
            });
        }
    }
    if io.failed() {
        return None;
    }
    let (bucket, table) =
        rl_core::validate(full_at, rate, cap, hold, span, version, last_id, leases).ok()?;
    let bucket = match pin {
        Some(p) => rl_core::validate_pin(bucket, &table, p).ok()?,
        None => bucket,
    };
    stats::LEASES_ACTIVE.add_shared(table.leases().len() as u64);
    if bucket.pin().is_some() {
        stats::PINNED_KEYS.add_shared(1);
    }
    Some(Stored::new(bucket, table))
}

pub fn rewrite(aof: &Aof, key: Str, state: &StateMut) {
    effect::rewrite(aof, key, state);
}

pub fn mem_usage(state: &StateMut) -> usize {
    state.mem_usage()
}

pub fn digest(md: &Digest, state: &StateMut) {
    let b = state.bucket();
    md.add(b.full_at());
    md.add(b.limit().rate().to_bits());
    md.add(b.limit().cap().to_bits());
    if b.keep_until() != 0 || b.keep_after_write() != 0 {
        md.add(b.keep_until());
        md.add(b.keep_after_write());
    }
    if b.version() != 0 {
        // After the hold and span (both 0 if absent), so no two states add the same.
        md.add(u64::MAX);
        md.add(b.version());
    }
    if let Some(p) = b.pin() {
        // After the version's marker (or none), behind a marker of its own.
        md.add(u64::MAX - 1);
        md.add(p.kind.code());
        md.add(p.until);
        md.add(p.base.rate().to_bits());
        md.add(p.base.cap().to_bits());
        md.add(p.absent as u64);
    }
    if let Some(t) = state.table() {
        md.add(t.last_id());
        for l in t.leases() {
            md.add(l.id);
            md.add(l.tokens);
            md.add(l.expires_at);
        }
    }
    md.end_sequence();
}

/// Redis frees a value (it was replaced, deleted, flushed or reloaded).
pub fn freed(value: Stored) {
    if let Stored::Full(f) = value {
        stats::LEASES_ACTIVE.sub_shared(f.table.leases().len() as u64);
        if f.bucket.pin().is_some() {
            stats::PINNED_KEYS.sub_shared(1);
        }
    }
}

/// A key leaves the keyspace (it expired, or DEL): the leases it still holds are gone
/// without a return. (Not called when a reload or a flush frees every value.)
pub fn unlinked(state: &StateMut) {
    if let Some(table) = state.table() {
        stats::LEASES_EXPIRED.add_shared(table.leases().len() as u64);
    }
}

/// `COPY`: the same bucket under another key.
pub fn copied(state: &StateMut) -> Stored {
    match state {
        StateMut::Compact(c) => Stored::Compact(Box::new(**c)),
        StateMut::Full(f) => {
            stats::LEASES_ACTIVE.add_shared(f.table.leases().len() as u64);
            if f.bucket.pin().is_some() {
                stats::PINNED_KEYS.add_shared(1);
            }
            Stored::new(f.bucket, f.table.clone())
        }
    }
}
