//! redis-rl: a distributed token bucket as native Redis commands.
//!
//! This file only registers things. The arithmetic lives in the `rl-core` crate; each
//! command has its own file under `commands/`.

mod adopt;
mod args;
mod boundary;
mod clock;
mod commands;
mod config;
mod datatype;
mod error;
mod ffi;
mod key;
mod ops;
mod permits;
mod propagate;
mod reply;
mod resetstat;
mod share;
mod stats;
mod stored;

use ffi::{BUCKET_TYPE, PERMIT_TYPE, SHARE_TYPE};
use redis_module::configuration::ConfigurationFlags;
use redis_module::{redis_module, Context, RedisString, Status};

/// Inside Redis every allocation goes through Redis's allocator, so `used_memory` and
/// `MEMORY USAGE` see it. Unit tests run without Redis, on the system allocator.
#[cfg(not(test))]
type Allocator = redis_module::alloc::RedisAlloc;
#[cfg(not(test))]
const ALLOCATOR: Allocator = redis_module::alloc::RedisAlloc;
#[cfg(test)]
type Allocator = std::alloc::System;
#[cfg(test)]
const ALLOCATOR: Allocator = std::alloc::System;

fn init(ctx: &Context, args: &[RedisString]) -> Status {
    if let Err(missing) = ffi::check() {
        ctx.log_warning(&format!(
            "redis-rl: this server lacks {missing}; not loading"
        ));
        return Status::Err;
    }
    let args: Vec<&[u8]> = args.iter().map(RedisString::as_slice).collect();
    if let Err(why) = config::apply_module_args(&args) {
        ctx.log_warning(&format!("redis-rl: not loading: {why}"));
        return Status::Err;
    }
    let raw = ffi::Ctx::of_load(ctx);
    // Keys signal "modified" (WATCH, client tracking) only when a command wrote them.
    // And a short or corrupt payload (RESTORE, a damaged RDB) is a refused value, not an
    // abort: the loader checks `Io::failed` (see `datatype.rs`).
    ffi::set_module_options(
        raw,
        redis_module::raw::REDISMODULE_OPTION_NO_IMPLICIT_SIGNAL_MODIFIED
            | redis_module::raw::REDISMODULE_OPTIONS_HANDLE_IO_ERRORS,
    );
    if let Err(name) = ffi::register_commands(raw) {
        ctx.log_warning(&format!("redis-rl: could not register {name:?}"));
        return Status::Err;
    }
    if !ffi::register_info(raw) {
        ctx.log_warning("redis-rl: could not register the INFO section");
        return Status::Err;
    }
    ops::init();
    if !ffi::register_filter(raw) {
        ctx.log_warning("redis-rl: could not register the CONFIG RESETSTAT filter");
        return Status::Err;
    }
    ctx.log_notice(&format!("redis-rl: loaded, mode {}", config::mode_name()));
    Status::Ok
}

redis_module! {
    name: "rl",
    version: 1,
    allocator: (Allocator, ALLOCATOR),
    data_types: [BUCKET_TYPE, PERMIT_TYPE, SHARE_TYPE],
    init: init,
    commands: [],
    // The macro wants every kind listed when module args are configs.
    configurations: [
        i64: [
            ["max-namespaces", &ops::MAX_NAMESPACES, 64, 0, 1024, ConfigurationFlags::DEFAULT, None],
            ["top-keys", &ops::TOP_KEYS, 128, 0, 65536, ConfigurationFlags::DEFAULT, None],
        ],
        string: [
            ["namespace-separator", &ops::SEPARATOR, ":", ConfigurationFlags::DEFAULT, None],
        ],
        bool: [
            ["adopt-script-keys", &ops::ADOPT, false, ConfigurationFlags::DEFAULT, None],
        ],
        enum: [
            ["mode", &config::MODE, config::Mode::Enforce, ConfigurationFlags::DEFAULT, None],
        ],
        module_args_as_configuration: false,
    ]
}
