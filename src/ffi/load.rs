//! `RedisModule_OnLoad`, the module's entry point, written here rather than by the
//! `redis-module` crate's macro: so that a refused load says why in the server log (the
//! macro returns before any of our code runs when the name is taken, and Redis logs only
//! "initialization failed"), and so that loading runs inside the panic guard like every
//! other callback.

use super::Ctx;
use redis_module::raw;
use std::os::raw::{c_char, c_int};

/// The module's name (`MODULE LIST`, the `rl.` config prefix, the ACL category).
pub const NAME: &std::ffi::CStr = c"rl";

/// Logs `msg` at warning level, prefixed like the module's other lines.
pub fn log_warning(ctx: Ctx, msg: &str) {
    log(ctx, c"warning", msg);
}

/// Logs `msg` at notice level.
pub fn log_notice(ctx: Ctx, msg: &str) {
    log(ctx, c"notice", msg);
}

fn log(ctx: Ctx, level: &std::ffi::CStr, msg: &str) {
    let mut line = Vec::with_capacity(msg.len() + 1);
    line.extend(msg.bytes().filter(|&b| b != 0));
    line.push(0);
    rm!(RedisModule_Log(
        ctx.0,
        level.as_ptr(),
        c"%s".as_ptr(),
        line.as_ptr().cast::<c_char>()
    ));
}

/// Why `RedisModule_Init` refused the module, in words for the log.
fn init_refusal() -> &'static str {
    // SAFETY: reading a function pointer `RedisModule_Init` filled before it refused.
    let busy = unsafe { raw::RedisModule_IsModuleNameBusy };
    match busy {
        // SAFETY: a C string constant.
        Some(f) if unsafe { f(NAME.as_ptr()) } != 0 => {
            "redis-rl: not loading: a module named 'rl' is already loaded (see MODULE LIST); \
             MODULE UNLOAD cannot remove it while it has data types, so restart the server \
             to load another build"
        }
        _ => "redis-rl: not loading: RedisModule_Init failed (a server older than Redis 7.0?)",
    }
}

/// Called by Redis when the module is loaded.
///
/// # Safety
/// Redis calls it once, with its load context and the `loadmodule` arguments.
#[no_mangle]
pub unsafe extern "C" fn RedisModule_OnLoad(
    ctx: *mut raw::RedisModuleCtx,
    argv: *mut *mut raw::RedisModuleString,
    argc: c_int,
) -> c_int {
    // Nothing may allocate before this: the allocator is Redis's, reached through the API
    // table that `RedisModule_Init` fills.
    let init =
        raw::Export_RedisModule_Init(ctx, NAME.as_ptr(), 1, raw::REDISMODULE_APIVER_1 as c_int);
    if init == raw::Status::Err as c_int {
        if { raw::RedisModule_Log }.is_some() {
            log_warning(Ctx(ctx), init_refusal());
        }
        return raw::Status::Err as c_int;
    }
    let loaded = std::panic::catch_unwind(|| {
        let args: Vec<&[u8]> = (0..argc.max(0) as usize)
            // SAFETY: Redis passes `argc` valid strings.
            .map(|i| super::bytes(*argv.add(i)))
            .collect();
        crate::load(Ctx(ctx), &args)
    });
    match loaded {
        Ok(Ok(())) => raw::Status::Ok as c_int,
        Ok(Err(why)) => {
            log_warning(Ctx(ctx), &format!("redis-rl: not loading: {why}"));
            raw::Status::Err as c_int
        }
        Err(_) => {
            log_warning(
                Ctx(ctx),
                "redis-rl: not loading: internal error while loading",
            );
            raw::Status::Err as c_int
        }
    }
}

/// Creates the module's data types (Redis logs which one it refused).
pub fn create_types(ctx: Ctx, types: &[&redis_module::native_types::RedisType]) -> bool {
    let created = types.iter().all(|t| t.create_data_type(ctx.0).is_ok());
    super::types::remember_bucket_type();
    created
}
