//! redis-rl: a distributed token bucket as native Redis commands.
//!
//! This file only registers things (Redis enters at `ffi::load::RedisModule_OnLoad`, which
//! calls [`load`]). The arithmetic lives in the `rl-core` crate.

mod arg_doc;
mod args;
mod boundary;
mod bucket;
mod clock;
mod commands;
mod config;
mod effect;
mod error;
mod ffi;
mod grammar;
mod number;
mod observe;
mod pipeline;
#[cfg(test)]
mod protocol;
mod reply;
mod semaphore;
mod share;

use ffi::{Ctx, BUCKET_TYPE, PERMIT_TYPE, SHARE_TYPE};

/// Inside Redis every allocation goes through Redis's allocator, so `used_memory` and
/// `MEMORY USAGE` see it. Unit tests run without Redis, on the system allocator.
#[cfg(not(test))]
#[global_allocator]
static ALLOCATOR: redis_module::alloc::RedisAlloc = redis_module::alloc::RedisAlloc;

/// Everything the module sets up at load, after `RedisModule_Init`. `Err` is the one log
/// line that says why it did not load.
fn load(ctx: Ctx, args: &[&[u8]]) -> Result<(), String> {
    if let Err(missing) = ffi::check() {
        return Err(format!("this server lacks {missing}"));
    }
    if !ffi::create_types(ctx, &[&BUCKET_TYPE, &PERMIT_TYPE, &SHARE_TYPE]) {
        return Err("could not create the data types".into());
    }
    let mode = config::module_args_mode(args)?;
    ffi::register_configs(ctx, config::CONFIGS, mode.map(|m| m as i32)).map_err(|name| {
        format!(
            "could not register the config rl.{}",
            name.to_string_lossy()
        )
    })?;
    // Keys signal "modified" (WATCH, client tracking) only when a command wrote them.
    // And a short or corrupt payload (RESTORE, a damaged RDB) is a refused value, not an
    // abort: the loader checks `Io::failed` (see `bucket/datatype.rs`).
    ffi::set_module_options(
        ctx,
        redis_module::raw::REDISMODULE_OPTION_NO_IMPLICIT_SIGNAL_MODIFIED
            | redis_module::raw::REDISMODULE_OPTIONS_HANDLE_IO_ERRORS,
    );
    ffi::register_commands(ctx).map_err(|name| format!("could not register {name:?}"))?;
    if !ffi::register_info(ctx) {
        return Err("could not register the INFO section".into());
    }
    observe::init();
    if !ffi::register_filter(ctx) {
        return Err("could not register the CONFIG RESETSTAT filter".into());
    }
    if !ffi::subscribe_events(ctx) {
        return Err("could not subscribe to config changes".into());
    }
    // Where the server lets a write open an expired key without deleting it, a bucket
    // whose time passed is reused in place (see `ffi::OpenKey::open_bucket`).
    let reuse = if ffi::detect_open_modes() {
        "reused in place"
    } else {
        "deleted by the server, then written anew"
    };
    ffi::log_notice(
        ctx,
        &format!(
            "redis-rl: loaded, mode {}; expired buckets written to are {reuse}",
            config::mode_name()
        ),
    );
    observe::eviction::check_policy(ctx);
    Ok(())
}
