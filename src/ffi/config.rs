//! Module configs (`rl.*`): registered here with callbacks of our own, so every call Redis
//! makes for `CONFIG GET`, `CONFIG SET`, `CONFIG REWRITE` and redis.conf runs inside the
//! panic guard, and a string config round-trips its exact bytes (the `redis-module`
//! crate's string getter goes through a C string, which a NUL byte made it abort on).
//!
//! Each config is a static description ([`Config`]) whose getter and setter are plain
//! functions in `crate::config`; the description's address is the private data Redis hands
//! back to the callbacks.

use super::Ctx;
use redis_module::raw;
use std::ffi::{c_void, CStr};
use std::os::raw::{c_char, c_int, c_longlong};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// A config setter's refusal: the text `CONFIG SET` answers (after Redis's own prefix).
pub type Refusal = &'static str;

/// One `rl.<name>` config.
pub struct Config {
    /// Without the `rl.` prefix (Redis adds the module's name).
    pub name: &'static CStr,
    pub kind: Kind,
}

pub enum Kind {
    Number {
        default: i64,
        min: i64,
        max: i64,
        get: fn() -> i64,
        set: fn(i64) -> Result<(), Refusal>,
    },
    Bool {
        default: bool,
        get: fn() -> bool,
        set: fn(bool) -> Result<(), Refusal>,
    },
    /// A string config's bytes: `get` writes them into the buffer and returns the length.
    Bytes {
        default: &'static CStr,
        get: fn(&mut [u8; 64]) -> usize,
        set: fn(&[u8]) -> Result<(), Refusal>,
    },
    Enum {
        default: i32,
        /// NUL-terminated names and their values, same order.
        names: &'static [&'static CStr],
        values: &'static [i32],
        get: fn() -> i32,
        set: fn(i32) -> Result<(), Refusal>,
    },
}

const OK: c_int = raw::REDISMODULE_OK as c_int;
const ERR: c_int = raw::REDISMODULE_ERR as c_int;

/// The config behind a callback's private data.
fn config<'a>(privdata: *mut c_void) -> &'a Config {
    // SAFETY: the private data is the address of a `&'static Config` given at registration.
    unsafe { &*(privdata as *const Config) }
}

/// Runs a setter: `OK`, or `ERR` with the refusal written where Redis reads it (Redis
/// frees that string). A panic is a refusal too. The refusal ends with the value refused,
/// `shown`: Redis logs a bad redis.conf or command-line value with the config's name and
/// our text only, so without it a typo in a long config would leave the operator guessing.
fn apply(
    r: std::thread::Result<Result<(), String>>,
    err: *mut *mut raw::RedisModuleString,
    shown: &str,
) -> c_int {
    let why = match r {
        Ok(Ok(())) => return OK,
        Ok(Err(why)) => why,
        Err(_) => "internal error in redis-rl; the config is unchanged".to_string(),
    };
    let why = format!("{why} (got '{shown}')");
    if !err.is_null() {
        let s = rm!(RedisModule_CreateString(
            std::ptr::null_mut(),
            why.as_ptr().cast::<c_char>(),
            why.len()
        ));
        // SAFETY: Redis passed a valid out-pointer for the error.
        unsafe { *err = s };
    }
    ERR
}

/// Runs a getter of config `privdata` inside the guard (`fallback` if it panics or the
/// config is of another kind).
fn get<T>(privdata: *mut c_void, fallback: T, f: impl FnOnce(&Kind) -> Option<T>) -> T {
    catch_unwind(AssertUnwindSafe(|| f(&config(privdata).kind)))
        .ok()
        .flatten()
        .unwrap_or(fallback)
}

/// Runs a setter of config `privdata` inside the guard; `shown` is the value, as the
/// refusal quotes it.
fn set(
    privdata: *mut c_void,
    err: *mut *mut raw::RedisModuleString,
    shown: &str,
    f: impl FnOnce(&Config) -> Option<Result<(), String>>,
) -> c_int {
    let r = catch_unwind(AssertUnwindSafe(|| {
        f(config(privdata)).unwrap_or_else(|| Err("a config of another kind".to_string()))
    }));
    apply(r, err, shown)
}

/// A value as a refusal quotes it: at most 64 bytes, escaped unless printable UTF-8 (the
/// log line must not end at a NUL or break at a newline).
fn shown(value: &[u8]) -> String {
    let cut = &value[..value.len().min(64)];
    match std::str::from_utf8(cut) {
        Ok(s) if !s.chars().any(char::is_control) => s.to_string(),
        _ => cut.escape_ascii().to_string(),
    }
}

unsafe extern "C" fn get_number(_: *const c_char, privdata: *mut c_void) -> c_longlong {
    get(privdata, 0, |k| match k {
        Kind::Number { get, .. } => Some(get()),
        _ => None,
    })
}

unsafe extern "C" fn set_number(
    _: *const c_char,
    val: c_longlong,
    privdata: *mut c_void,
    err: *mut *mut raw::RedisModuleString,
) -> c_int {
    set(privdata, err, &val.to_string(), |c| match &c.kind {
        // Redis checks the bounds it is given itself, but its refusal names neither the
        // value nor the redis.conf line: the configs are registered with the widest bounds
        // and checked here.
        Kind::Number { min, max, set, .. } => Some(if (*min..=*max).contains(&val) {
            set(val).map_err(String::from)
        } else {
            Err(format!(
                "rl.{} must be an integer from {min} to {max}",
                c.name.to_string_lossy()
            ))
        }),
        _ => None,
    })
}

unsafe extern "C" fn get_bool(_: *const c_char, privdata: *mut c_void) -> c_int {
    get(privdata, 0, |k| match k {
        Kind::Bool { get, .. } => Some(get() as c_int),
        _ => None,
    })
}

unsafe extern "C" fn set_bool(
    _: *const c_char,
    val: c_int,
    privdata: *mut c_void,
    err: *mut *mut raw::RedisModuleString,
) -> c_int {
    let text = if val != 0 { "yes" } else { "no" };
    set(privdata, err, text, |c| match &c.kind {
        Kind::Bool { set, .. } => Some(set(val != 0).map_err(String::from)),
        _ => None,
    })
}

unsafe extern "C" fn get_enum(_: *const c_char, privdata: *mut c_void) -> c_int {
    get(privdata, 0, |k| match k {
        Kind::Enum { get, .. } => Some(get()),
        _ => None,
    })
}

unsafe extern "C" fn set_enum(
    _: *const c_char,
    val: c_int,
    privdata: *mut c_void,
    err: *mut *mut raw::RedisModuleString,
) -> c_int {
    let name = match &config(privdata).kind {
        Kind::Enum { names, values, .. } => values
            .iter()
            .position(|v| *v == val)
            .and_then(|i| names.get(i))
            .map(|n| n.to_string_lossy().into_owned()),
        _ => None,
    };
    set(
        privdata,
        err,
        &name.unwrap_or_else(|| val.to_string()),
        |c| match &c.kind {
            Kind::Enum { set, .. } => Some(set(val).map_err(String::from)),
            _ => None,
        },
    )
}

/// The string each string getter last returned: Redis copies it and leaves it to the
/// module, which frees it on the next get (one string per config, never a leak per call).
static LAST_STRING: super::MainThread<*mut raw::RedisModuleString> =
    super::MainThread::new(std::ptr::null_mut());

unsafe extern "C" fn get_bytes(
    _: *const c_char,
    privdata: *mut c_void,
) -> *mut raw::RedisModuleString {
    let mut buf = [0u8; 64];
    let len = get(privdata, 0, |k| match k {
        Kind::Bytes { get, .. } => Some(get(&mut buf).min(64)),
        _ => None,
    });
    let s = rm!(RedisModule_CreateString(
        std::ptr::null_mut(),
        buf.as_ptr().cast::<c_char>(),
        len
    ));
    LAST_STRING.with(|last| {
        if !last.is_null() {
            rm!(RedisModule_FreeString(std::ptr::null_mut(), *last));
        }
        *last = s;
    });
    s
}

unsafe extern "C" fn set_bytes(
    _: *const c_char,
    val: *mut raw::RedisModuleString,
    privdata: *mut c_void,
    err: *mut *mut raw::RedisModuleString,
) -> c_int {
    let value = super::bytes(val);
    set(privdata, err, &shown(value), |c| match &c.kind {
        Kind::Bytes { set, .. } => Some(set(value).map_err(String::from)),
        _ => None,
    })
}

/// Registers `configs` and loads their values from redis.conf (or sets the defaults);
/// `enum_default` replaces the enum config's own default (the `loadmodule` argument's
/// mode). `Err`: the name of the one Redis refused.
pub fn register_configs(
    ctx: Ctx,
    configs: &'static [Config],
    enum_default: Option<i32>,
) -> Result<(), &'static CStr> {
    for c in configs {
        let privdata = c as *const Config as *mut c_void;
        let flags = raw::REDISMODULE_CONFIG_DEFAULT;
        let status = match &c.kind {
            // The bounds are checked in `set_number`.
            Kind::Number { default, .. } => rm!(RedisModule_RegisterNumericConfig(
                ctx.0,
                c.name.as_ptr(),
                *default,
                flags,
                i64::MIN,
                i64::MAX,
                Some(get_number),
                Some(set_number),
                None,
                privdata
            )),
            Kind::Bool { default, .. } => rm!(RedisModule_RegisterBoolConfig(
                ctx.0,
                c.name.as_ptr(),
                *default as c_int,
                flags,
                Some(get_bool),
                Some(set_bool),
                None,
                privdata
            )),
            Kind::Bytes { default, .. } => rm!(RedisModule_RegisterStringConfig(
                ctx.0,
                c.name.as_ptr(),
                default.as_ptr(),
                flags,
                Some(get_bytes),
                Some(set_bytes),
                None,
                privdata
            )),
            Kind::Enum {
                default,
                names,
                values,
                ..
            } => {
                let mut ptrs = [std::ptr::null::<c_char>(); 8];
                for (p, n) in ptrs.iter_mut().zip(names.iter()) {
                    *p = n.as_ptr();
                }
                rm!(RedisModule_RegisterEnumConfig(
                    ctx.0,
                    c.name.as_ptr(),
                    enum_default.unwrap_or(*default),
                    flags,
                    ptrs.as_mut_ptr(),
                    values.as_ptr(),
                    names.len().min(values.len()).min(8) as c_int,
                    Some(get_enum),
                    Some(set_enum),
                    None,
                    privdata
                ))
            }
        };
        if status != OK {
            return Err(c.name);
        }
    }
    // Redis 7.0 names no unknown rl.* config, no server a bad mode or yes/no word: the
    // module reads the config file itself and says which line (the command line is out of
    // reach: Redis overwrote it with its process title).
    let file =
        super::command::server_info_text(c"server", c"config_file", |f| f.map(str::to_string));
    if let Some(text) = file
        .flatten()
        .filter(|f| !f.is_empty())
        .and_then(|f| std::fs::read(f).ok())
    {
        for problem in crate::config::conf_problems(&text) {
            super::load::log_warning(ctx, &format!("redis-rl: {problem}"));
        }
    }
    if rm!(RedisModule_LoadConfigs(ctx.0)) != OK {
        // Redis logged which (a value refused by its own checks or by a setter, which
        // quotes it); the load's line then reads "... the config rl.* value ...".
        return Err(c"* value refused (see the line above)");
    }
    Ok(())
}
