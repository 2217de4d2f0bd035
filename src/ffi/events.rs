//! What the server tells the module outside its commands: a key was evicted (so the module
//! can count the `rl` keys the memory limit removed), a config changed (so it can warn when
//! the memory policy starts evicting). Each callback runs inside the panic guard and calls
//! the safe function in [`crate::observe::eviction`].
//!
//! An evicted key's value is gone when the `evicted` notification arrives, so its type is
//! unknown there; the type's `unlink` callback, which the server runs just before, notes
//! the key's name (see `types.rs`), and the notification counts it if the names match.

use super::{bytes, Ctx};
use redis_module::raw;
use std::os::raw::{c_char, c_int, c_void};

/// Whether the server may evict keys now: `maxmemory` is set with a policy other than
/// `noeviction` (and this is not a replica ignoring `maxmemory`).
pub fn eviction_possible() -> bool {
    // A null context asks for the server-wide flags only.
    let flags = rm!(RedisModule_GetContextFlags(std::ptr::null_mut()));
    flags & raw::REDISMODULE_CTX_FLAGS_EVICT as c_int != 0
}

unsafe extern "C" fn on_keyspace_event(
    ctx: *mut raw::RedisModuleCtx,
    kind: c_int,
    _event: *const c_char,
    key: *mut raw::RedisModuleString,
) -> c_int {
    let _ = std::panic::catch_unwind(|| {
        if kind & raw::REDISMODULE_NOTIFY_EVICTED != 0 && !key.is_null() {
            crate::observe::eviction::evicted(Ctx(ctx), bytes(key));
        }
    });
    raw::REDISMODULE_OK as c_int
}

unsafe extern "C" fn on_config_change(
    ctx: *mut raw::RedisModuleCtx,
    _event: raw::RedisModuleEvent,
    _subevent: u64,
    _data: *mut c_void,
) {
    let _ = std::panic::catch_unwind(|| crate::observe::eviction::config_changed(Ctx(ctx)));
}

/// Whether the module listens to evictions (see [`subscribe_evictions`]).
static EVICTIONS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Listens to evictions from now on (once). A module that listens to any keyspace event
/// makes the server walk its listeners on every notification of every write command (about
/// 50 instructions even for an `INCR`), so the module listens only once the server may
/// evict: at load, or when a config change makes it so. `false` if the server refused.
pub fn subscribe_evictions(ctx: Ctx) -> bool {
    use std::sync::atomic::Ordering::Relaxed;
    if EVICTIONS.load(Relaxed) {
        return true;
    }
    let ok = rm!(RedisModule_SubscribeToKeyspaceEvents(
        ctx.0,
        raw::REDISMODULE_NOTIFY_EVICTED,
        Some(on_keyspace_event)
    )) == raw::REDISMODULE_OK as c_int;
    EVICTIONS.store(ok, Relaxed);
    ok
}

/// Subscribes to config changes, at load (optional: older servers lack the event; the
/// eviction subscription then happens at load only).
pub fn subscribe(ctx: Ctx) -> bool {
    // The event's handle is a constant of the C header, which the bindings do not carry.
    let config = raw::RedisModuleEvent {
        id: raw::REDISMODULE_EVENT_CONFIG,
        dataver: 1,
    };
    let _ = rm!(RedisModule_SubscribeToServerEvent(
        ctx.0,
        config,
        Some(on_config_change)
    ));
    true
}
