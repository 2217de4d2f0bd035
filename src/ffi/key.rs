//! A key opened for one command: its kind, its value, its expiry.

use super::{bytes, types, value, Ctx, Str};
use crate::bucket::stored::{StateMut, Stored};
use redis_module::raw;
use rl_core::{PermitTable, ShareTable};
use std::ffi::CStr;

/// What a key holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyKind {
    Empty,
    Bucket,
    Permits,
    Shares,
    Hash,
    Other,
}

/// A key's value, borrowed for the running command.
pub enum Value<'k> {
    Empty,
    Bucket(StateMut<'k>),
    Permits(&'k mut PermitTable),
    Shares(&'k mut ShareTable),
    /// Another kind (a hash, a string, ...).
    Other,
}

/// How a key is opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    Read,
    /// Read and write.
    Write,
}

/// A key opened for the running command; closed when dropped.
pub struct OpenKey {
    key: *mut raw::RedisModuleKey,
    ctx: Ctx,
    name: Str,
}

impl OpenKey {
    pub fn open(ctx: Ctx, name: Str, access: Access) -> OpenKey {
        let mode = match access {
            Access::Read => raw::REDISMODULE_READ,
            Access::Write => raw::REDISMODULE_READ | raw::REDISMODULE_WRITE,
        };
        OpenKey {
            key: rm!(RedisModule_OpenKey(ctx.0, name.0, mode as i32)).cast(),
            ctx,
            name,
        }
    }

    pub fn name(&self) -> Str {
        self.name
    }

    pub fn kind(&self) -> KeyKind {
        // The module type first: it is null for any other kind of key, and a key of ours
        // (the common case) then costs one call, not two.
        let t = rm!(RedisModule_ModuleTypeGetType(self.key));
        if !t.is_null() {
            return if t == types::bucket_type() {
                KeyKind::Bucket
            } else if t == types::permit_type() {
                KeyKind::Permits
            } else if t == types::share_type() {
                KeyKind::Shares
            } else {
                KeyKind::Other
            };
        }
        match rm!(RedisModule_KeyType(self.key)) as isize {
            raw::REDISMODULE_KEYTYPE_EMPTY => KeyKind::Empty,
            raw::REDISMODULE_KEYTYPE_HASH => KeyKind::Hash,
            _ => KeyKind::Other,
        }
    }

    /// The value held here. Called once per command: a bucket or permit table borrows the
    /// value Redis holds for as long as the key is open (the value is owned by Redis's
    /// keyspace, not by this handle: borrowing it through `&self` lets a command change it
    /// and then update the key's expiry).
    pub fn value(&self) -> Value<'_> {
        match self.kind() {
            KeyKind::Empty => Value::Empty,
            KeyKind::Bucket => {
                let p = rm!(RedisModule_ModuleTypeGetValue(self.key));
                // SAFETY: a value of the bucket type was made by `bucket_into_raw`; the
                // open key keeps it alive and this command is its only user while it runs.
                Value::Bucket(unsafe { value::bucket_mut(p) })
            }
            KeyKind::Permits => {
                let p = rm!(RedisModule_ModuleTypeGetValue(self.key));
                // SAFETY: as above; a value of the permit type is a boxed `PermitTable`.
                Value::Permits(unsafe { value::permits_mut(p) })
            }
            KeyKind::Shares => {
                let p = rm!(RedisModule_ModuleTypeGetValue(self.key));
                // SAFETY: as above; a value of the share type is a boxed `ShareTable`.
                Value::Shares(unsafe { value::shares_mut(p) })
            }
            KeyKind::Hash | KeyKind::Other => Value::Other,
        }
    }

    /// Stores a bucket as the key's value (replacing any); `false` if Redis refused it (the
    /// value is then dropped here).
    pub fn set_bucket(&self, v: Stored) -> bool {
        let p = value::bucket_into_raw(v);
        let ok = rm!(RedisModule_ModuleTypeSetValue(
            self.key,
            types::bucket_type(),
            p
        )) == raw::REDISMODULE_OK as i32;
        if !ok {
            // SAFETY: Redis did not take the value; it is still ours.
            drop(unsafe { value::bucket_from_raw(p) });
        }
        ok
    }

    /// Stores a permit table as the key's value; gives it back if Redis refused it.
    pub fn set_permits(&self, t: PermitTable) -> Result<(), PermitTable> {
        let p = value::permits_into_raw(t);
        if rm!(RedisModule_ModuleTypeSetValue(
            self.key,
            types::permit_type(),
            p
        )) == raw::REDISMODULE_OK as i32
        {
            return Ok(());
        }
        // SAFETY: Redis did not take the value; it is still ours.
        Err(unsafe { value::permits_from_raw(p) })
    }

    /// Stores a share table as the key's value; gives it back if Redis refused it.
    pub fn set_shares(&self, t: ShareTable) -> Result<(), ShareTable> {
        let p = value::shares_into_raw(t);
        if rm!(RedisModule_ModuleTypeSetValue(
            self.key,
            types::share_type(),
            p
        )) == raw::REDISMODULE_OK as i32
        {
            return Ok(());
        }
        // SAFETY: Redis did not take the value; it is still ours.
        Err(unsafe { value::shares_from_raw(p) })
    }

    /// The key's expiry as a Unix time in ms (`-1`: none).
    pub fn expire_ms(&self) -> i64 {
        rm!(RedisModule_GetAbsExpire(self.key))
    }

    pub fn set_expire_ms(&self, ms: i64) {
        rm!(RedisModule_SetAbsExpire(self.key, ms));
    }

    pub fn delete(&self) {
        rm!(RedisModule_DeleteKey(self.key));
    }

    /// Tells Redis the key changed (`WATCH`, client tracking).
    pub fn signal_modified(&self) {
        rm!(RedisModule_SignalModifiedKey(self.ctx.0, self.name.0));
    }

    /// The number of fields of a hash (elements of other kinds).
    pub fn value_length(&self) -> usize {
        rm!(RedisModule_ValueLength(self.key))
    }

    /// Reads a field of the hash held here with `read`; `None` if there is no such field.
    pub fn hash_field<R>(&self, field: &CStr, read: impl FnOnce(&[u8]) -> R) -> Option<R> {
        let mut s: *mut raw::RedisModuleString = std::ptr::null_mut();
        rm!(RedisModule_HashGet(
            self.key,
            raw::REDISMODULE_HASH_CFIELDS as i32,
            field.as_ptr(),
            &mut s as *mut *mut raw::RedisModuleString,
            std::ptr::null::<std::os::raw::c_char>()
        ));
        if s.is_null() {
            return None;
        }
        let out = read(bytes(s));
        rm!(RedisModule_FreeString(self.ctx.0, s));
        Some(out)
    }
}

impl Drop for OpenKey {
    fn drop(&mut self) {
        rm!(RedisModule_CloseKey(self.key));
    }
}
