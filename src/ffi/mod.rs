//! The one room with `unsafe` in it: every call into the Redis module API, every callback
//! Redis makes into this module, and every raw pointer Redis hands over, behind small safe
//! functions and handles. The rest of the crate never says `unsafe`.
//!
//! The handles ([`Ctx`], [`Str`], [`OpenKey`], [`Io`], [`Aof`], [`Digest`], [`Info`],
//! [`Filter`]) are made only here, from what Redis passed to the running callback, and are
//! valid while it runs. They hold raw pointers, so they are neither `Send` nor `Sync` and
//! cannot be kept in a static: nothing can use one after its callback returned.
//!
//! Each API is checked for presence at load ([`check`]) so a server that lacks one refuses
//! the module; a missing one at a call becomes a panic, which the boundary turns into an
//! error reply. APIs newer than Redis 7.0 (ACL categories, the `internal` flag) are read
//! where they are used and skipped when absent.

/// The function `RedisModule_<name>` (a panic if the server lacks it; [`check`] refuses
/// such a server at load).
macro_rules! api {
    ($name:ident) => {
        // SAFETY: reading a function pointer the API table filled at load.
        match unsafe { redis_module::raw::$name } {
            Some(f) => f,
            None => panic!(concat!("Redis lacks ", stringify!($name))),
        }
    };
}

/// Calls `RedisModule_<name>(args)`. Only this module uses it: the arguments are pointers
/// Redis handed to the running callback (inside the handles), passed straight back.
macro_rules! rm {
    ($name:ident ( $($arg:expr),* $(,)? )) => {
        {
            let f = api!($name);
            unsafe { f($($arg),*) }
        }
    };
}

mod acl;
mod command;
mod config;
mod effects;
mod events;
mod info;
mod key;
pub mod load;
mod reply;
mod types;
mod value;

pub use acl::may_set_state;
pub use command::{
    acl_categories_set, is_keys_position_request, key_at_pos, register_commands, register_filter,
    replicate_verbatim, server_info_text, server_info_u64, set_module_options, Filter,
};
pub use config::{register_configs, Config, Kind, Refusal};
pub use effects::{emit_aof, replicate, replicate_head, Aof, EffectArg};
pub use events::{eviction_possible, subscribe as subscribe_events, subscribe_evictions};
pub use info::{register_info, Info};
pub use key::{detect_open_modes, Access, KeyKind, OpenKey, Value};
pub use load::{create_types, log_notice, log_warning};
pub use reply::{reply, reply_error, reply_int, reply_wrong_arity};
pub use types::{Digest, Io, BUCKET_TYPE, PERMIT_TYPE, SHARE_TYPE};

use redis_module::raw;
use std::cell::UnsafeCell;

/// The context of the running callback.
#[derive(Clone, Copy)]
pub struct Ctx(*mut raw::RedisModuleCtx);

/// A Redis string Redis passed to the running callback (an argument, a key name).
#[derive(Clone, Copy, Debug)]
#[repr(transparent)]
pub struct Str(*mut raw::RedisModuleString);

impl Str {
    /// Its bytes.
    pub fn bytes(&self) -> &[u8] {
        bytes(self.0)
    }
}

/// The bytes of a live Redis string.
fn bytes<'a>(s: *mut raw::RedisModuleString) -> &'a [u8] {
    let mut len = 0usize;
    let ptr = rm!(RedisModule_StringPtrLen(s, &mut len));
    // SAFETY: Redis returned the buffer of a live string and its length; callers hold the
    // string (an argument of the running callback, or one freed after reading).
    unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), len) }
}

/// `CLOCK_REALTIME` in nanoseconds since 1970 (0 before it: a badly set clock). Read
/// directly rather than through `SystemTime`, whose checked conversions cost a few dozen
/// instructions on every command.
pub fn realtime() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer; CLOCK_REALTIME always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
    (ts.tv_sec.max(0) as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec.max(0) as u64)
}

/// State only Redis's main thread touches: commands, `INFO`, config callbacks and command
/// filters all run there, one at a time.
pub struct MainThread<T>(UnsafeCell<T>);

// SAFETY: every access is from Redis's main thread (above), one at a time: `with` is never
// nested for the same cell.
unsafe impl<T> Sync for MainThread<T> {}

impl<T> MainThread<T> {
    pub const fn new(v: T) -> Self {
        MainThread(UnsafeCell::new(v))
    }

    pub fn with<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        // SAFETY: see `Sync` above.
        f(unsafe { &mut *self.0.get() })
    }
}

/// Every API this module calls; loading fails with the first one missing.
pub fn check() -> Result<(), &'static str> {
    macro_rules! need {
        ($($name:ident),*) => { $(if unsafe { raw::$name }.is_none() { return Err(stringify!($name)); })* };
    }
    need!(
        RedisModule_CreateCommand,
        RedisModule_StringPtrLen,
        RedisModule_OpenKey,
        RedisModule_CloseKey,
        RedisModule_KeyType,
        RedisModule_ModuleTypeGetType,
        RedisModule_ModuleTypeGetValue,
        RedisModule_ModuleTypeSetValue,
        RedisModule_SetAbsExpire,
        RedisModule_GetAbsExpire,
        RedisModule_DeleteKey,
        RedisModule_Replicate,
        RedisModule_ReplyWithLongLong,
        RedisModule_ReplyWithDouble,
        RedisModule_ReplyWithArray,
        RedisModule_ReplyWithError,
        RedisModule_ReplyWithNull,
        RedisModule_ReplyWithSimpleString,
        RedisModule_EmitAOF,
        RedisModule_SaveUnsigned,
        RedisModule_LoadUnsigned,
        RedisModule_SaveDouble,
        RedisModule_LoadDouble,
        RedisModule_IsIOError,
        RedisModule_DigestAddLongLong,
        RedisModule_DigestEndSequence,
        RedisModule_RegisterInfoFunc,
        RedisModule_InfoAddSection,
        RedisModule_InfoAddFieldULongLong,
        RedisModule_WrongArity,
        RedisModule_FreeString,
        RedisModule_ReplicateVerbatim,
        RedisModule_ReplyWithMap,
        RedisModule_ReplyWithCString,
        RedisModule_ReplyWithString,
        RedisModule_IsKeysPositionRequest,
        RedisModule_KeyAtPos,
        RedisModule_InfoAddFieldCString,
        RedisModule_SetModuleOptions,
        RedisModule_SignalModifiedKey,
        RedisModule_GetContextFlags,
        RedisModule_ReplyWithStringBuffer,
        RedisModule_GetCommand,
        RedisModule_SetCommandInfo,
        RedisModule_RegisterCommandFilter,
        RedisModule_CommandFilterArgGet,
        RedisModule_CommandFilterArgsCount,
        RedisModule_GetServerInfo,
        RedisModule_ServerInfoGetFieldUnsigned,
        RedisModule_ServerInfoGetFieldC,
        RedisModule_FreeServerInfo,
        RedisModule_HashGet,
        RedisModule_ValueLength,
        RedisModule_InfoBeginDictField,
        RedisModule_InfoEndDictField,
        RedisModule_Log,
        RedisModule_CreateString,
        RedisModule_RegisterNumericConfig,
        RedisModule_RegisterBoolConfig,
        RedisModule_RegisterStringConfig,
        RedisModule_RegisterEnumConfig,
        RedisModule_LoadConfigs,
        RedisModule_SaveStringBuffer,
        RedisModule_LoadStringBuffer,
        RedisModule_Free,
        RedisModule_SubscribeToKeyspaceEvents,
        RedisModule_SubscribeToServerEvent,
        RedisModule_NotifyKeyspaceEvent
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::path::Path;

    fn sources(dir: &Path, out: &mut Vec<(String, String)>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                sources(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).unwrap();
                out.push((path.display().to_string(), text));
            }
        }
    }

    /// Names following `prefix` in `text`, up to the first non-identifier character.
    fn names_after(text: &str, prefix: &str) -> BTreeSet<String> {
        text.match_indices(prefix)
            .map(|(i, _)| {
                text[i + prefix.len()..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect::<String>()
            })
            .filter(|n| !n.is_empty())
            .collect()
    }

    fn src() -> Vec<(String, String)> {
        let mut files = Vec::new();
        sources(
            &Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
            &mut files,
        );
        files
    }

    /// The APIs `check` looks up at load are exactly the ones the module calls through
    /// `rm!` (or takes with `api!`): a call missing from the list would panic (an error reply) on a server that
    /// lacks it instead of refusing the load; one listed but never called refuses servers
    /// for nothing.
    #[test]
    fn the_apis_checked_at_load_are_the_apis_called() {
        let called: BTreeSet<String> = src()
            .iter()
            .flat_map(|(_, f)| {
                let mut names = names_after(f, "rm!(RedisModule_");
                names.extend(names_after(f, "api!(RedisModule_"));
                names
            })
            .collect();
        let api = include_str!("mod.rs");
        let start = api.find("need!(\n").expect("the need! list");
        let end = start + api[start..].find(");").unwrap();
        let checked = names_after(&api[start..end], "RedisModule_");
        assert_eq!(
            checked.difference(&called).collect::<Vec<_>>(),
            Vec::<&String>::new(),
            "checked at load but never called"
        );
        assert_eq!(
            called.difference(&checked).collect::<Vec<_>>(),
            Vec::<&String>::new(),
            "called but not checked at load"
        );
    }

    /// `unsafe` (and the raw API) stays in this module.
    #[test]
    fn nothing_outside_ffi_says_unsafe() {
        let ffi = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("src")
            .join("ffi")
            .display()
            .to_string();
        let outside: Vec<String> = src()
            .into_iter()
            .filter(|(path, text)| {
                !path.starts_with(&ffi)
                    && (text.contains(concat!("uns", "afe")) || text.contains("rm!("))
            })
            .map(|(path, _)| path)
            .collect();
        assert_eq!(outside, Vec::<String>::new());
    }
}
