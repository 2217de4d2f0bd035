//! The `INFO rl` section: Redis calls [`info`], which writes the counters
//! ([`crate::observe::stats`]), the mode ([`crate::config`]), the eviction risk
//! ([`crate::observe::eviction`]) and `RL.STATS`'s namespaces into a safe [`Info`]. The
//! section is put together here, at the edge, so that the counters' room reads nothing
//! of the rooms that count into it (the loop stats -> eviction -> stats is gone).

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
    let _ = std::panic::catch_unwind(|| section(&Info(ctx), for_crash_report != 0));
}

/// The `INFO rl` section (the crash report gets the counters only).
fn section(info: &Info, for_crash_report: bool) {
    if !for_crash_report {
        crate::observe::resetstat::check();
    }
    info.section();
    for (field, value) in crate::observe::stats::fields() {
        let name = CStr::from_bytes_until_nul(&field).unwrap_or(c"rl_unnamed");
        info.add_u64(name, value);
    }
    let mode = if crate::config::shadow() {
        c"shadow"
    } else {
        c"enforce"
    };
    info.add_text(c"mode", mode);
    info.add_u64(c"eviction_risk", crate::observe::eviction::risk());
    if !for_crash_report {
        crate::observe::rl_stats::info(info);
    }
}

/// Registers the `INFO rl` callback at load.
pub fn register_info(ctx: Ctx) -> bool {
    rm!(RedisModule_RegisterInfoFunc(ctx.0, Some(info)))
        == redis_module::raw::REDISMODULE_OK as c_int
}
