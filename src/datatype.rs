//! The `rl-bucket` module type: persistence (RDB, AOF rewrite), digest, copy, memory usage.
//!
//! RDB encoding version 3, per key:
//! `full_at rate cap hold span version table [last_id (id tokens expires_at) * (table - 1)]`
//! (unsigned, double, double, unsigned, unsigned, unsigned, unsigned, then unsigneds), where
//! `hold` and `span` keep a key alive after a limit change (0: none; see
//! [`rl_core::Bucket::span`]), `version` is the version of the limit (`VERSION v`; 0: none)
//! and `table` is 0 for a bucket that never had a lease and `1 + live leases` for one that
//! did. Version 2 (the same without `version`) and version 1 (without `hold`, `span` and
//! `version`) are still read, as version 0.
//!
//! `free`, `copy` and `rdb_load` keep `rl_leases_active` equal to the leases held in memory.

use crate::api::rm;
use crate::stored::{StateMut, Stored};
use crate::{propagate, stats};
use redis_module::native_types::RedisType;
use redis_module::raw::{self, RedisModuleDigest, RedisModuleIO, RedisModuleString};
use rl_core::{Lease, MAX_LEASES};
use std::os::raw::{c_int, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};

pub const ENCODING_VERSION: i32 = 3;

pub static BUCKET_TYPE: RedisType = RedisType::new(
    "rl-bucket",
    ENCODING_VERSION,
    raw::RedisModuleTypeMethods {
        version: raw::REDISMODULE_TYPE_METHOD_VERSION as u64,
        rdb_load: Some(rdb_load),
        rdb_save: Some(rdb_save),
        aof_rewrite: Some(aof_rewrite),
        mem_usage: Some(mem_usage),
        digest: Some(digest),
        free: Some(free),
        aux_load: None,
        aux_save: None,
        aux_save2: None,
        aux_save_triggers: 0,
        free_effort: None,
        unlink: Some(unlink),
        copy: Some(copy),
        defrag: None,
        copy2: None,
        free_effort2: None,
        mem_usage2: None,
        unlink2: None,
    },
);

/// The registered type, to recognise our keys.
pub fn raw_type() -> *mut raw::RedisModuleType {
    *BUCKET_TYPE.raw_type.borrow()
}

/// Runs a callback, turning a panic into `fallback` instead of unwinding into C.
fn guard<T>(fallback: T, f: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(fallback)
}

unsafe extern "C" fn rdb_save(io: *mut RedisModuleIO, value: *mut c_void) {
    guard((), || {
        let state = StateMut::from_raw(value);
        let b = state.bucket();
        rm!(RedisModule_SaveUnsigned(io, b.full_at()));
        rm!(RedisModule_SaveDouble(io, b.limit().rate()));
        rm!(RedisModule_SaveDouble(io, b.limit().cap()));
        rm!(RedisModule_SaveUnsigned(io, b.hold()));
        rm!(RedisModule_SaveUnsigned(io, b.span()));
        rm!(RedisModule_SaveUnsigned(io, b.version()));
        let Some(table) = state.table() else {
            rm!(RedisModule_SaveUnsigned(io, 0));
            return;
        };
        rm!(RedisModule_SaveUnsigned(
            io,
            1 + table.leases().len() as u64
        ));
        rm!(RedisModule_SaveUnsigned(io, table.last_id()));
        for l in table.leases() {
            rm!(RedisModule_SaveUnsigned(io, l.id));
            rm!(RedisModule_SaveUnsigned(io, l.tokens));
            rm!(RedisModule_SaveUnsigned(io, l.expires_at));
        }
    })
}

unsafe extern "C" fn rdb_load(io: *mut RedisModuleIO, encver: c_int) -> *mut c_void {
    guard(std::ptr::null_mut(), || {
        if !(1..=ENCODING_VERSION).contains(&encver) {
            return std::ptr::null_mut();
        }
        load(io, encver).map_or(std::ptr::null_mut(), Stored::into_raw)
    })
}

/// Reads one value; `None` on an I/O error or a state [`rl_core::validate`] refuses (the
/// same check `RL.SETSTATE` applies, so what one accepts the other loads).
///
/// The module sets `REDISMODULE_OPTIONS_HANDLE_IO_ERRORS`, so a short or corrupt payload
/// (`RESTORE`, a damaged RDB) makes the reads return 0 and raise the error flag instead of
/// aborting the server; the flag is checked before anything read is trusted.
unsafe fn load(io: *mut RedisModuleIO, encver: c_int) -> Option<Stored> {
    let io_error = || rm!(RedisModule_IsIOError(io)) != 0;
    let full_at = rm!(RedisModule_LoadUnsigned(io));
    let rate = rm!(RedisModule_LoadDouble(io));
    let cap = rm!(RedisModule_LoadDouble(io));
    let (hold, span) = if encver >= 2 {
        (
            rm!(RedisModule_LoadUnsigned(io)),
            rm!(RedisModule_LoadUnsigned(io)),
        )
    } else {
        (0, 0)
    };
    let version = if encver >= 3 {
        rm!(RedisModule_LoadUnsigned(io))
    } else {
        0
    };
    let table = rm!(RedisModule_LoadUnsigned(io));
    // 0: never leased; else 1 + the number of leases, which may not exceed the bound (a
    // corrupt count must not make us read, or allocate, without end).
    if io_error() || table > 1 + MAX_LEASES as u64 {
        return None;
    }
    let mut leases = Vec::new();
    let mut last_id = 0;
    if table > 0 {
        last_id = rm!(RedisModule_LoadUnsigned(io));
        for _ in 1..table {
            let id = rm!(RedisModule_LoadUnsigned(io));
            let tokens = rm!(RedisModule_LoadUnsigned(io));
            let expires_at = rm!(RedisModule_LoadUnsigned(io));
            if io_error() {
                return None;
            }
            leases.push(Lease {
                id,
                tokens,
                expires_at,
            });
        }
    }
    if io_error() {
        return None;
    }
    let (bucket, table) =
        rl_core::validate(full_at, rate, cap, hold, span, version, last_id, leases).ok()?;
    stats::LEASES_ACTIVE.add_shared(table.leases().len() as u64);
    Some(Stored::new(bucket, table))
}

unsafe extern "C" fn aof_rewrite(
    aof: *mut RedisModuleIO,
    key: *mut RedisModuleString,
    value: *mut c_void,
) {
    guard((), || {
        propagate::rewrite(aof, key, &StateMut::from_raw(value))
    })
}

unsafe extern "C" fn mem_usage(value: *const c_void) -> usize {
    guard(0, || StateMut::from_raw(value.cast_mut()).mem_usage())
}

unsafe extern "C" fn digest(md: *mut RedisModuleDigest, value: *mut c_void) {
    guard((), || {
        let state = StateMut::from_raw(value);
        let b = state.bucket();
        let add = |x: u64| rm!(RedisModule_DigestAddLongLong(md, x as i64));
        add(b.full_at());
        add(b.limit().rate().to_bits());
        add(b.limit().cap().to_bits());
        if b.hold() != 0 || b.span() != 0 {
            add(b.hold());
            add(b.span());
        }
        if b.version() != 0 {
            // After the hold and span (both 0 if absent), so no two states add the same.
            add(u64::MAX);
            add(b.version());
        }
        if let Some(t) = state.table() {
            add(t.last_id());
            for l in t.leases() {
                add(l.id);
                add(l.tokens);
                add(l.expires_at);
            }
        }
        rm!(RedisModule_DigestEndSequence(md));
    })
}

unsafe extern "C" fn free(value: *mut c_void) {
    guard((), || {
        if let Stored::Full(f) = Stored::from_raw(value) {
            stats::LEASES_ACTIVE.sub_shared(f.table.leases().len() as u64);
        }
    })
}

/// A key leaves the keyspace (it expired, or DEL): the leases it still holds are gone
/// without a return. (Not called when a reload or a flush frees every value.)
unsafe extern "C" fn unlink(_key: *mut RedisModuleString, value: *const c_void) {
    guard((), || {
        if let Some(table) = StateMut::from_raw(value.cast_mut()).table() {
            stats::LEASES_EXPIRED.add_shared(table.leases().len() as u64);
        }
    })
}

unsafe extern "C" fn copy(
    _from: *mut RedisModuleString,
    _to: *mut RedisModuleString,
    value: *const c_void,
) -> *mut c_void {
    guard(std::ptr::null_mut(), || {
        let copy = match StateMut::from_raw(value.cast_mut()) {
            StateMut::Compact(c) => Stored::Compact(Box::new(*c)),
            StateMut::Full(f) => {
                stats::LEASES_ACTIVE.add_shared(f.table.leases().len() as u64);
                Stored::new(f.bucket, f.table.clone())
            }
        };
        copy.into_raw()
    })
}
