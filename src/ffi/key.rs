//! A key opened for one command: its kind, its value, its expiry.

use super::{bytes, types, value, Ctx, Str};
use crate::bucket::stored::{Compact, StateMut, Stored};
use redis_module::raw;
use rl_core::{PermitTable, ShareTable};
use std::cell::Cell;
use std::ffi::CStr;
use std::sync::atomic::{AtomicI32, Ordering};

/// The extra `OpenKey` mode that hands a module a key whose time has passed instead of
/// deleting it first (`REDISMODULE_OPEN_KEY_ACCESS_EXPIRED`, Redis 8.0+), or 0 where the
/// server lacks it: Redis 7.0 has no such mode, and on Redis 7.2 and Valkey 9
/// (`REDISMODULE_OPEN_KEY_NOEXPIRE` only) an expired key is not deleted but still reads as
/// empty, and the write that adds the key again deletes it then.
static REUSE_MODES: AtomicI32 = AtomicI32::new(0);

/// Looks up at load whether this server lets a write reuse an expired bucket's value (see
/// [`OpenKey::open_bucket`]); returns whether it does.
pub fn detect_open_modes() -> bool {
    let wanted = raw::REDISMODULE_OPEN_KEY_ACCESS_EXPIRED as i32;
    // SAFETY: reading a function pointer the API table filled at load (null before 7.2).
    let all = match unsafe { raw::RedisModule_GetOpenKeyModesAll } {
        // SAFETY: the server's own function, taking nothing.
        Some(f) => unsafe { f() },
        None => 0,
    };
    // The server's own instant of the command (`RM_CachedMicroseconds`, 7.2+) decides what
    // has expired, as the server's lazy expiry would.
    // SAFETY: as above.
    let cached = unsafe { raw::RedisModule_CachedMicroseconds }.is_some();
    let modes = if all & wanted == wanted && cached {
        wanted
    } else {
        0
    };
    REUSE_MODES.store(modes, Ordering::Relaxed);
    modes != 0
}

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
    /// The key holds a compact bucket whose expiry has passed, kept (not deleted) so that a
    /// write can reuse it: it reads as empty (see [`OpenKey::open_bucket`]).
    expired: Cell<bool>,
    /// The kind read at open, until a write changes the key.
    kind: Cell<Option<KeyKind>>,
}

/// The server's cached instant of the running command, in ms (only called where
/// [`detect_open_modes`] found `RM_CachedMicroseconds`).
fn server_ms() -> i64 {
    // SAFETY: a function pointer the API table filled at load, checked then.
    match unsafe { raw::RedisModule_CachedMicroseconds } {
        // SAFETY: the server's own function, taking nothing.
        Some(f) => (unsafe { f() }) / 1000,
        None => (super::realtime() / 1_000_000) as i64,
    }
}

impl OpenKey {
    #[inline]
    pub fn open(ctx: Ctx, name: Str, access: Access) -> OpenKey {
        let mode = match access {
            Access::Read => raw::REDISMODULE_READ,
            Access::Write => raw::REDISMODULE_READ | raw::REDISMODULE_WRITE,
        };
        OpenKey {
            key: rm!(RedisModule_OpenKey(ctx.0, name.0, mode as i32)).cast(),
            ctx,
            name,
            expired: Cell::new(false),
            kind: Cell::new(None),
        }
    }

    /// Opens a key for a write to a bucket. A key whose expiry has passed is, as for any
    /// write, an absent key; where the server allows it ([`detect_open_modes`]) and the
    /// key holds a compact bucket, its value is kept for the write to reuse rather than
    /// deleted by the server's lazy expiry first (which would propagate a `DEL`, then the
    /// write would add the key again): one effect, no key removed and added. Any other
    /// expired key is opened again the usual way, so the server expires it as before.
    ///
    /// The reuse saves the server's delete and add of the key (with its expiry entry) and
    /// the `DEL` in the replication stream and the AOF.
    ///
    /// A call that ends without writing (a denial, a refused call) leaves the key to the
    /// server's lazy expiry as before (see `Drop`).
    ///
    /// "Passed" is the server's own rule (`now > expiry`, in ms) at the server's instant of
    /// the command: a key the server would not have expired is read as it is.
    /// On a replica or while loading, where the server never expires keys itself, an
    /// `RL.SETSTATE` into such a key ends exactly as into the key it would find: a compact
    /// bucket holds no leases, so setting a bucket there equals setting it into no key.
    #[inline]
    pub fn open_bucket(ctx: Ctx, name: Str) -> OpenKey {
        let modes = REUSE_MODES.load(Ordering::Relaxed);
        if modes == 0 {
            return OpenKey::open(ctx, name, Access::Write);
        }
        OpenKey::open_keeping_expired(ctx, name, modes)
    }

    /// [`OpenKey::open_bucket`] where the server has `modes` to open an expired key without
    /// deleting it.
    #[inline(never)]
    fn open_keeping_expired(ctx: Ctx, name: Str, modes: i32) -> OpenKey {
        let mode = (raw::REDISMODULE_READ | raw::REDISMODULE_WRITE) as i32 | modes;
        let raw_key: *mut raw::RedisModuleKey =
            rm!(RedisModule_OpenKey(ctx.0, name.0, mode)).cast();
        if raw_key.is_null() {
            return OpenKey::open(ctx, name, Access::Write);
        }
        let key = OpenKey {
            key: raw_key,
            ctx,
            name,
            expired: Cell::new(false),
            kind: Cell::new(None),
        };
        // The expiry of a key that is not there is not asked for (Redis 8 reads it from
        // the key's object).
        let kind = key.kind();
        key.kind.set(Some(kind));
        if kind == KeyKind::Empty {
            return key;
        }
        if kind == KeyKind::Bucket {
            let at = key.expire_ms();
            if at < 0 || server_ms() <= at {
                return key;
            }
            let p = rm!(RedisModule_ModuleTypeGetValue(key.key));
            // SAFETY: a value of the bucket type (see `value`).
            if let StateMut::Compact(_) = unsafe { value::bucket_mut(p) } {
                key.expired.set(true);
                return key;
            }
        }
        // Another kind (read the usual way: a hash's fields past their time stay hidden),
        // or an expired bucket with leases, a version or a hold.
        drop(key);
        OpenKey::open(ctx, name, Access::Write)
    }

    /// The expired compact bucket this key holds for a write to reuse (see
    /// [`OpenKey::open_bucket`]): a write that stores into it in place calls
    /// [`OpenKey::reused`].
    // The value is Redis's, not this handle's (as in `value`): borrowed for the command.
    #[allow(clippy::mut_from_ref)]
    pub fn expired_compact(&self) -> Option<&mut Compact> {
        if !self.expired.get() {
            return None;
        }
        let p = rm!(RedisModule_ModuleTypeGetValue(self.key));
        // SAFETY: checked to be a compact bucket at open; the open key keeps it alive and
        // this command is its only user.
        match unsafe { value::bucket_mut(p) } {
            StateMut::Compact(c) => Some(c),
            StateMut::Full(_) => None,
        }
    }

    /// The expired value was overwritten: the key is live again. Subscribers to keyspace
    /// events still see it expire, as when the server deleted it.
    pub fn reused(&self) {
        if self.expired.replace(false) {
            rm!(RedisModule_NotifyKeyspaceEvent(
                self.ctx.0,
                raw::REDISMODULE_NOTIFY_EXPIRED,
                c"expired".as_ptr(),
                self.name.0
            ));
        }
    }

    pub fn name(&self) -> Str {
        self.name
    }

    pub fn kind(&self) -> KeyKind {
        if self.expired.get() {
            return KeyKind::Empty;
        }
        if let Some(k) = self.kind.get() {
            return k;
        }
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
        // An expired value kept for reuse is replaced (and freed) like any value.
        self.reused();
        self.kind.set(None);
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
        self.kind.set(None);
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
        self.kind.set(None);
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
        self.expired.set(false);
        self.kind.set(None);
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
        if self.expired.get() {
            // No write reused the expired bucket: opened the usual way, the server expires
            // it now as it would have at the first open (deleting it, propagating its
            // `DEL`, counting and signalling it), so a call that writes nothing changes
            // nothing else.
            let mode = (raw::REDISMODULE_READ | raw::REDISMODULE_WRITE) as i32;
            let again: *mut raw::RedisModuleKey =
                rm!(RedisModule_OpenKey(self.ctx.0, self.name.0, mode)).cast();
            rm!(RedisModule_CloseKey(again));
        }
    }
}
