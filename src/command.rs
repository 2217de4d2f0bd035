//! Registering commands and the boundary every call crosses.
//!
//! Commands are registered with `RedisModule_CreateCommand` directly rather than through the
//! crate's macro, which copies every argument into a `Vec<RedisString>` per call. The
//! boundary turns an error into its reply and a panic into an error reply: nothing unwinds
//! into redis-server.

use crate::api::{self, Ctx, RStr};
use crate::args::Args;
use crate::error::Result;
use crate::{rm, stats};
use redis_module::raw;
use std::ffi::CStr;
use std::os::raw::c_int;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// A command body: parses, acts and replies on success; the boundary replies on error.
pub type Handler = fn(*mut Ctx, Args) -> Result<()>;

/// Runs `handler` for one call (used by [`entry!`]).
///
/// # Safety
/// `argv`/`argc` must be the arguments Redis passed to the command callback.
pub unsafe fn run(
    ctx: *mut Ctx,
    argv: *mut *mut RStr,
    argc: c_int,
    handler: Handler,
    counted: bool,
) -> c_int {
    if counted {
        stats::CALLS.add(1);
    }
    let argv = std::slice::from_raw_parts(argv, argc.max(0) as usize);
    let outcome = catch_unwind(AssertUnwindSafe(|| handler(ctx, Args::new(argv))));
    match outcome {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            stats::ERRORS.add(1);
            e.reply(ctx);
        }
        Err(_) => {
            stats::ERRORS.add(1);
            api::reply_error(
                ctx,
                c"ERR internal error in redis-rl; the call changed nothing",
            );
        }
    }
    redis_module::raw::REDISMODULE_OK as c_int
}

/// The C entry point of a handler: `entry!(take::take, counted)`.
#[macro_export]
macro_rules! entry {
    ($handler:path, $counted:expr) => {{
        unsafe extern "C" fn entry(
            ctx: *mut $crate::api::Ctx,
            argv: *mut *mut $crate::api::RStr,
            argc: std::os::raw::c_int,
        ) -> std::os::raw::c_int {
            $crate::command::run(ctx, argv, argc, $handler, $counted)
        }
        let func: redis_module::raw::RedisModuleCmdFunc = Some(entry);
        func
    }};
}

/// What Redis needs to know about a command: flags, where its keys are, its arity
/// (negative: at least that many, the name included) and a one-line summary.
pub struct Spec {
    pub name: &'static CStr,
    pub func: redis_module::raw::RedisModuleCmdFunc,
    pub flags: &'static CStr,
    pub keys: (c_int, c_int, c_int),
    pub arity: c_int,
    pub summary: &'static CStr,
}

/// Registers one command; `Err` names it if Redis refused.
pub fn register(ctx: *mut Ctx, spec: &Spec) -> std::result::Result<(), &'static CStr> {
    let (first, last, step) = spec.keys;
    let flags = spec.flags.as_ptr();
    let ok = redis_module::raw::REDISMODULE_OK as c_int;
    let name = spec.name.as_ptr();
    if rm!(RedisModule_CreateCommand(
        ctx, name, spec.func, flags, first, last, step
    )) != ok
    {
        return Err(spec.name);
    }
    // Arity and docs for COMMAND INFO / COMMAND DOCS (Redis then checks the arity itself).
    let version = raw::RedisModuleCommandInfoVersion {
        version: 1,
        sizeof_historyentry: std::mem::size_of::<raw::RedisModuleCommandHistoryEntry>(),
        sizeof_keyspec: std::mem::size_of::<raw::RedisModuleCommandKeySpec>(),
        sizeof_arg: std::mem::size_of::<raw::RedisModuleCommandArg>(),
    };
    let mut info = raw::RedisModuleCommandInfo {
        version: &version,
        summary: spec.summary.as_ptr(),
        complexity: c"O(1) per bucket".as_ptr(),
        since: c"0.1.0".as_ptr(),
        history: std::ptr::null_mut(),
        tips: std::ptr::null(),
        arity: spec.arity,
        key_specs: std::ptr::null_mut(),
        args: std::ptr::null_mut(),
    };
    let command = rm!(RedisModule_GetCommand(ctx, name));
    if command.is_null() || rm!(RedisModule_SetCommandInfo(command, &mut info)) != ok {
        return Err(spec.name);
    }
    Ok(())
}
