//! The `INFO rl` section: Redis calls [`info`], which hands [`crate::observe::stats::info`] a safe
//! [`Info`] to write fields into.

use super::Ctx;
use redis_module::raw::RedisModuleInfoCtx;
use std::ffi::CStr;
use std::os::raw::c_int;

/// The `INFO` reply being built.
pub struct Info(*mut RedisModuleInfoCtx);

impl Info {
    /// Starts the module's section (`# rl`).
    pub fn section(&self) {
        rm!(RedisModule_InfoAddSection(self.0, c"".as_ptr()));
    }

    pub fn add_u64(&self, name: &CStr, v: u64) {
        rm!(RedisModule_InfoAddFieldULongLong(self.0, name.as_ptr(), v));
    }

    pub fn add_text(&self, name: &CStr, v: &CStr) {
        rm!(RedisModule_InfoAddFieldCString(
            self.0,
            name.as_ptr(),
            v.as_ptr()
        ));
    }

    /// Starts a field of `key=value` pairs (`rl_ns_orders:calls=..,granted=..`).
    pub fn begin_dict(&self, name: &CStr) {
        rm!(RedisModule_InfoBeginDictField(self.0, name.as_ptr()));
    }

    pub fn end_dict(&self) {
        rm!(RedisModule_InfoEndDictField(self.0));
    }
}

unsafe extern "C" fn info(ctx: *mut RedisModuleInfoCtx, for_crash_report: c_int) {
    let _ =
        std::panic::catch_unwind(|| crate::observe::stats::info(&Info(ctx), for_crash_report != 0));
}

/// Registers the `INFO rl` callback at load.
pub fn register_info(ctx: Ctx) -> bool {
    rm!(RedisModule_RegisterInfoFunc(ctx.0, Some(info)))
        == redis_module::raw::REDISMODULE_OK as c_int
}
