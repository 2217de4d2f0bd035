//! The few Redis module API calls the hot path makes, called directly (no `Vec`, no
//! `String`), each checked for presence instead of `.unwrap()`ed: a missing API becomes a
//! panic, which the command boundary turns into an error reply. [`check`] runs at load time
//! so a server that lacks one refuses the module instead.

use redis_module::raw;
use std::os::raw::c_int;

pub use raw::{RedisModuleCtx as Ctx, RedisModuleKey as Key, RedisModuleString as RStr};

/// Calls `RedisModule_<name>(args)`. The arguments are evaluated inside `unsafe`: they are
/// pointers Redis handed to the running callback, passed straight back.
macro_rules! rm {
    ($name:ident ( $($arg:expr),* $(,)? )) => {
        match unsafe { redis_module::raw::$name } {
            Some(f) => unsafe { f($($arg),*) },
            None => panic!(concat!("Redis lacks ", stringify!($name))),
        }
    };
}
pub(crate) use rm;

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
        RedisModule_CreateString,
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
        RedisModule_InfoEndDictField
    );
    Ok(())
}

/// The bytes of a Redis string argument.
///
/// # Safety
/// `s` must be a live `RedisModuleString`; the slice borrows its buffer.
pub unsafe fn bytes<'a>(s: *mut RStr) -> &'a [u8] {
    let mut len = 0usize;
    let ptr = rm!(RedisModule_StringPtrLen(s, &mut len));
    std::slice::from_raw_parts(ptr.cast::<u8>(), len)
}

pub fn reply_integer(ctx: *mut Ctx, v: i64) {
    rm!(RedisModule_ReplyWithLongLong(ctx, v));
}

/// A double: RESP3's double type, or under RESP2 a bulk string in the shortest form that
/// reads back as the same number (`0.1`, not Redis's `%.17g` `0.10000000000000001`, which
/// also costs some 4,000 instructions to format).
pub fn reply_double(ctx: *mut Ctx, v: f64) {
    use std::io::Write;
    let resp3 = rm!(RedisModule_GetContextFlags(ctx)) as u32 & raw::REDISMODULE_CTX_FLAGS_RESP3;
    let mut buf = [0u8; 64];
    let mut out = &mut buf[..];
    if resp3 != 0 || write!(out, "{v}").is_err() {
        rm!(RedisModule_ReplyWithDouble(ctx, v));
        return;
    }
    let len = 64 - out.len();
    rm!(RedisModule_ReplyWithStringBuffer(
        ctx,
        buf.as_ptr().cast(),
        len
    ));
}

pub fn reply_array(ctx: *mut Ctx, len: usize) {
    rm!(RedisModule_ReplyWithArray(ctx, len as std::os::raw::c_long));
}

/// A map of `len` pairs (a flat array of `2 * len` under RESP2).
pub fn reply_map(ctx: *mut Ctx, len: usize) {
    rm!(RedisModule_ReplyWithMap(ctx, len as std::os::raw::c_long));
}

/// A bulk string.
pub fn reply_text(ctx: *mut Ctx, s: &std::ffi::CStr) {
    rm!(RedisModule_ReplyWithCString(ctx, s.as_ptr()));
}

/// A Redis string as it is (a key name, say).
pub fn reply_string(ctx: *mut Ctx, s: *mut RStr) {
    rm!(RedisModule_ReplyWithString(ctx, s));
}

pub fn reply_null(ctx: *mut Ctx) {
    rm!(RedisModule_ReplyWithNull(ctx));
}

pub fn reply_ok(ctx: *mut Ctx) {
    rm!(RedisModule_ReplyWithSimpleString(ctx, c"OK".as_ptr()));
}

/// `msg` must hold its own error code (`ERR ...`, `WRONGTYPE ...`) and end in NUL.
pub fn reply_error(ctx: *mut Ctx, msg: &std::ffi::CStr) {
    rm!(RedisModule_ReplyWithError(ctx, msg.as_ptr()));
}

pub fn reply_wrong_arity(ctx: *mut Ctx) -> c_int {
    rm!(RedisModule_WrongArity(ctx))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::path::Path;

    fn sources(dir: &Path, out: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                sources(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(std::fs::read_to_string(path).unwrap());
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

    /// The APIs `check` looks up at load are exactly the ones the module calls through
    /// `rm!`: a call missing from the list would panic (an error reply) on a server that
    /// lacks it instead of refusing the load; one listed but never called refuses servers
    /// for nothing.
    #[test]
    fn the_apis_checked_at_load_are_the_apis_called() {
        let mut files = Vec::new();
        sources(
            &Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
            &mut files,
        );
        let called: BTreeSet<String> = files
            .iter()
            .flat_map(|f| names_after(f, "rm!(RedisModule_"))
            .collect();
        let api = include_str!("api.rs");
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
}
