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

use crate::api::rm;
use crate::api::{Ctx, Key, RStr};
use crate::error::{Error, Result};
use crate::stats;
use redis_module::native_types::RedisType;
use redis_module::raw::{self, RedisModuleDigest, RedisModuleIO, RedisModuleString};
use rl_core::{Permit, PermitTable, MAX_PERMITS};
use std::os::raw::{c_int, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};

pub const ENCODING_VERSION: i32 = 1;

pub static PERMIT_TYPE: RedisType = RedisType::new(
    "rl-permit",
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

fn raw_type() -> *mut raw::RedisModuleType {
    *PERMIT_TYPE.raw_type.borrow()
}

fn guard<T>(fallback: T, f: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(fallback)
}

/// # Safety
/// `p` must be a value of this type (made by `Box::into_raw` of a `PermitTable`).
unsafe fn table<'a>(p: *mut c_void) -> &'a mut PermitTable {
    &mut *p.cast::<PermitTable>()
}

unsafe extern "C" fn rdb_save(io: *mut RedisModuleIO, value: *mut c_void) {
    guard((), || {
        let t = table(value);
        rm!(RedisModule_SaveUnsigned(io, t.last_id()));
        rm!(RedisModule_SaveUnsigned(io, t.permits().len() as u64));
        for p in t.permits() {
            rm!(RedisModule_SaveUnsigned(io, p.id));
            rm!(RedisModule_SaveUnsigned(io, p.expires_at));
        }
    })
}

unsafe extern "C" fn rdb_load(io: *mut RedisModuleIO, encver: c_int) -> *mut c_void {
    guard(std::ptr::null_mut(), || {
        if encver != ENCODING_VERSION {
            return std::ptr::null_mut();
        }
        let io_error = || rm!(RedisModule_IsIOError(io)) != 0;
        let last_id = rm!(RedisModule_LoadUnsigned(io));
        let count = rm!(RedisModule_LoadUnsigned(io));
        if io_error() || count > MAX_PERMITS as u64 {
            return std::ptr::null_mut();
        }
        let mut permits = Vec::with_capacity(count as usize);
        for _ in 0..count {
            let id = rm!(RedisModule_LoadUnsigned(io));
            let expires_at = rm!(RedisModule_LoadUnsigned(io));
            if io_error() {
                return std::ptr::null_mut();
            }
            permits.push(Permit { id, expires_at });
        }
        match PermitTable::validate(last_id, permits) {
            Ok(t) => {
                stats::PERMITS_IN_USE.add_shared(t.permits().len() as u64);
                Box::into_raw(Box::new(t)).cast()
            }
            Err(_) => std::ptr::null_mut(),
        }
    })
}

unsafe extern "C" fn aof_rewrite(
    aof: *mut RedisModuleIO,
    key: *mut RedisModuleString,
    value: *mut c_void,
) {
    guard((), || {
        let t = table(value);
        let cmd = c"RL.SETPERMITS".as_ptr();
        rm!(RedisModule_EmitAOF(
            aof,
            cmd,
            c"scl".as_ptr(),
            key,
            c"LASTID".as_ptr(),
            t.last_id() as i64
        ));
        for p in t.permits() {
            rm!(RedisModule_EmitAOF(
                aof,
                cmd,
                c"sclcll".as_ptr(),
                key,
                c"LASTID".as_ptr(),
                t.last_id() as i64,
                c"ADD".as_ptr(),
                p.id as i64,
                p.expires_at as i64
            ));
        }
        // The key's actual expiry follows (Redis appends PEXPIREAT when it has one).
        rm!(RedisModule_EmitAOF(
            aof,
            c"PERSIST".as_ptr(),
            c"s".as_ptr(),
            key
        ));
    })
}

unsafe extern "C" fn mem_usage(value: *const c_void) -> usize {
    guard(0, || {
        std::mem::size_of::<PermitTable>()
            + std::mem::size_of_val(table(value.cast_mut()).permits())
    })
}

unsafe extern "C" fn digest(md: *mut RedisModuleDigest, value: *mut c_void) {
    guard((), || {
        let t = table(value);
        let add = |x: u64| rm!(RedisModule_DigestAddLongLong(md, x as i64));
        add(t.last_id());
        for p in t.permits() {
            add(p.id);
            add(p.expires_at);
        }
        rm!(RedisModule_DigestEndSequence(md));
    })
}

unsafe extern "C" fn free(value: *mut c_void) {
    guard((), || {
        let t = Box::from_raw(value.cast::<PermitTable>());
        stats::PERMITS_IN_USE.sub_shared(t.permits().len() as u64);
    })
}

unsafe extern "C" fn unlink(_key: *mut RedisModuleString, value: *const c_void) {
    guard((), || {
        stats::PERMITS_EXPIRED.add_shared(table(value.cast_mut()).permits().len() as u64);
    })
}

unsafe extern "C" fn copy(
    _from: *mut RedisModuleString,
    _to: *mut RedisModuleString,
    value: *const c_void,
) -> *mut c_void {
    guard(std::ptr::null_mut(), || {
        let t = table(value.cast_mut()).clone();
        stats::PERMITS_IN_USE.add_shared(t.permits().len() as u64);
        Box::into_raw(Box::new(t)).cast()
    })
}

/// A semaphore key opened for one command; closed (and signalled if written) when dropped.
pub struct PermitKey {
    key: *mut Key,
    ctx: *mut Ctx,
    name: *mut RStr,
    modified: std::cell::Cell<bool>,
}

impl PermitKey {
    pub fn open(ctx: *mut Ctx, name: *mut RStr) -> PermitKey {
        let mode = raw::REDISMODULE_READ | raw::REDISMODULE_WRITE;
        PermitKey {
            key: rm!(RedisModule_OpenKey(ctx, name, mode as i32)).cast(),
            ctx,
            name,
            modified: std::cell::Cell::new(false),
        }
    }

    /// The permits held here: `None` if the key does not exist, `WRONGTYPE` if it holds
    /// something else (a bucket included).
    // The table is owned by Redis's keyspace, not by this handle: borrowing it mutably
    // through `&self` lets a command change it and then update the key's expiry.
    #[allow(clippy::mut_from_ref)]
    pub fn table(&self) -> Result<Option<&mut PermitTable>> {
        let kind = rm!(RedisModule_KeyType(self.key)) as isize;
        if kind == raw::REDISMODULE_KEYTYPE_EMPTY {
            return Ok(None);
        }
        if kind != raw::REDISMODULE_KEYTYPE_MODULE
            || rm!(RedisModule_ModuleTypeGetType(self.key)) != raw_type()
        {
            return Err(Error::WrongType);
        }
        let value = rm!(RedisModule_ModuleTypeGetValue(self.key));
        // SAFETY: a value of this type is a boxed `PermitTable`; the key keeps it alive and
        // this command is its only user while it runs.
        Ok(Some(unsafe { table(value) }))
    }

    /// Stores `t` as the key's value (a new key), with its expiry.
    pub fn create(&self, t: PermitTable) {
        stats::PERMITS_IN_USE.add_shared(t.permits().len() as u64);
        let expiry = t.last_expiry().unwrap_or(0);
        let p: *mut c_void = Box::into_raw(Box::new(t)).cast();
        if rm!(RedisModule_ModuleTypeSetValue(self.key, raw_type(), p))
            != raw::REDISMODULE_OK as i32
        {
            // SAFETY: Redis did not take the value; it is still ours.
            let t = unsafe { Box::from_raw(p.cast::<PermitTable>()) };
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
        if rm!(RedisModule_GetAbsExpire(self.key)) != ms {
            rm!(RedisModule_SetAbsExpire(self.key, ms));
        }
    }

    pub fn delete(&self) {
        self.modified.set(true);
        rm!(RedisModule_DeleteKey(self.key));
    }

    /// The key's name (for effects).
    pub fn name(&self) -> *mut RStr {
        self.name
    }
}

impl Drop for PermitKey {
    fn drop(&mut self) {
        if self.modified.get() {
            rm!(RedisModule_SignalModifiedKey(self.ctx, self.name));
        }
        rm!(RedisModule_CloseKey(self.key));
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
