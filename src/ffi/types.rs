//! The module's data types, `rl-bucket`, `rl-permit` and `rl-shares`: the callbacks Redis makes for
//! their values (RDB, AOF rewrite, digest, memory, free, unlink, copy), each turning the raw
//! pointers into safe handles and calling the safe function of the same name in
//! [`crate::bucket::datatype`], [`crate::semaphore`] or [`crate::share`]. A panic in one is caught here: a refused value
//! (load), nothing written (save, digest), or 0 (memory), never an unwind into Redis.

use super::effects::Aof;
use super::{value, Str};
use redis_module::native_types::RedisType;
use redis_module::raw::{self, RedisModuleDigest, RedisModuleIO, RedisModuleString};
use std::os::raw::{c_int, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// The RDB stream of a value being saved or loaded.
pub struct Io(*mut RedisModuleIO);

impl Io {
    pub fn save_unsigned(&self, v: u64) {
        rm!(RedisModule_SaveUnsigned(self.0, v));
    }

    pub fn save_double(&self, v: f64) {
        rm!(RedisModule_SaveDouble(self.0, v));
    }

    /// The next unsigned (0 after an error: check [`Io::failed`] before trusting it).
    pub fn load_unsigned(&self) -> u64 {
        rm!(RedisModule_LoadUnsigned(self.0))
    }

    pub fn load_double(&self) -> f64 {
        rm!(RedisModule_LoadDouble(self.0))
    }

    pub fn save_bytes(&self, v: &[u8]) {
        rm!(RedisModule_SaveStringBuffer(
            self.0,
            v.as_ptr().cast(),
            v.len()
        ));
    }

    /// The next string, if it is at most `max` bytes (`None` after an error: the flag is
    /// raised; or for a longer string).
    pub fn load_bytes(&self, max: usize) -> Option<Box<[u8]>> {
        let mut len = 0usize;
        let p = rm!(RedisModule_LoadStringBuffer(self.0, &mut len));
        if p.is_null() {
            return None;
        }
        // SAFETY: Redis returned a buffer of `len` bytes it allocated for us to free.
        let out =
            (len <= max).then(|| unsafe { std::slice::from_raw_parts(p.cast::<u8>(), len) }.into());
        rm!(RedisModule_Free(p.cast()));
        out
    }

    /// Whether a read ran past the end of the payload or hit a corrupt one (the module sets
    /// `REDISMODULE_OPTIONS_HANDLE_IO_ERRORS`, so reads return 0 instead of aborting).
    pub fn failed(&self) -> bool {
        rm!(RedisModule_IsIOError(self.0)) != 0
    }
}

/// The `DEBUG DIGEST` of one value.
pub struct Digest(*mut RedisModuleDigest);

impl Digest {
    pub fn add(&self, v: u64) {
        rm!(RedisModule_DigestAddLongLong(self.0, v as i64));
    }

    pub fn end_sequence(&self) {
        rm!(RedisModule_DigestEndSequence(self.0));
    }
}

/// Runs a callback, turning a panic into `fallback` instead of unwinding into C.
fn guard<T>(fallback: T, f: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(fallback)
}

/// The callbacks of one type: `$owner` has `save`, `load`, `rewrite`, `mem_usage`,
/// `digest`, `freed`, `unlinked`, `copied`; `$borrow`, `$into_raw`, `$from_raw` convert its
/// values (see [`value`]).
macro_rules! type_methods {
    ($owner:path, $borrow:path, $into_raw:path, $from_raw:path) => {{
        use $owner as owner;

        unsafe extern "C" fn rdb_save(io: *mut RedisModuleIO, v: *mut c_void) {
            guard((), || owner::save(&Io(io), &$borrow(v)))
        }

        unsafe extern "C" fn rdb_load(io: *mut RedisModuleIO, encver: c_int) -> *mut c_void {
            guard(std::ptr::null_mut(), || {
                owner::load(&Io(io), encver).map_or(std::ptr::null_mut(), $into_raw)
            })
        }

        unsafe extern "C" fn aof_rewrite(
            aof: *mut RedisModuleIO,
            key: *mut RedisModuleString,
            v: *mut c_void,
        ) {
            guard((), || owner::rewrite(&Aof(aof), Str(key), &$borrow(v)))
        }

        unsafe extern "C" fn mem_usage(v: *const c_void) -> usize {
            guard(0, || owner::mem_usage(&$borrow(v.cast_mut())))
        }

        unsafe extern "C" fn digest(md: *mut RedisModuleDigest, v: *mut c_void) {
            guard((), || owner::digest(&Digest(md), &$borrow(v)))
        }

        unsafe extern "C" fn free(v: *mut c_void) {
            guard((), || owner::freed($from_raw(v)))
        }

        unsafe extern "C" fn unlink(key: *mut RedisModuleString, v: *const c_void) {
            guard((), || {
                if !key.is_null() {
                    crate::observe::eviction::unlinked(Str(key).bytes());
                }
                owner::unlinked(&$borrow(v.cast_mut()))
            })
        }

        unsafe extern "C" fn copy(
            _from: *mut RedisModuleString,
            _to: *mut RedisModuleString,
            v: *const c_void,
        ) -> *mut c_void {
            guard(std::ptr::null_mut(), || {
                $into_raw(owner::copied(&$borrow(v.cast_mut())))
            })
        }

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
        }
    }};
}

pub static BUCKET_TYPE: RedisType = RedisType::new(
    "rl-bucket",
    crate::bucket::datatype::ENCODING_VERSION,
    type_methods!(
        crate::bucket::datatype,
        value::bucket_mut,
        value::bucket_into_raw,
        value::bucket_from_raw
    ),
);

pub static PERMIT_TYPE: RedisType = RedisType::new(
    "rl-permit",
    crate::semaphore::ENCODING_VERSION,
    type_methods!(
        crate::semaphore,
        value::permits_mut,
        value::permits_into_raw,
        value::permits_from_raw
    ),
);

pub static SHARE_TYPE: RedisType = RedisType::new(
    "rl-shares",
    crate::share::ENCODING_VERSION,
    type_methods!(
        crate::share,
        value::shares_mut,
        value::shares_into_raw,
        value::shares_from_raw
    ),
);

/// The registered bucket type, to recognise its keys (every bucket command asks: read
/// from a plain copy, not through the type's `RefCell`).
pub(super) fn bucket_type() -> *mut raw::RedisModuleType {
    BUCKET_RAW.load(std::sync::atomic::Ordering::Relaxed)
}

/// A copy of the bucket type's handle, made once the types are created.
static BUCKET_RAW: std::sync::atomic::AtomicPtr<raw::RedisModuleType> =
    std::sync::atomic::AtomicPtr::new(std::ptr::null_mut());

/// Keeps the copy of the bucket type's handle (after the types are created).
pub(super) fn remember_bucket_type() {
    BUCKET_RAW.store(
        *BUCKET_TYPE.raw_type.borrow(),
        std::sync::atomic::Ordering::Relaxed,
    );
}

pub(super) fn permit_type() -> *mut raw::RedisModuleType {
    *PERMIT_TYPE.raw_type.borrow()
}

pub(super) fn share_type() -> *mut raw::RedisModuleType {
    *SHARE_TYPE.raw_type.borrow()
}
