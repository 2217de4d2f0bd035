//! Who may call the internal setters (`RL.SETSTATE`, `RL.SETSHARES`, `RL.SETPERMITS`):
//! they write any state a key can hold, so one forged call can starve a fleet or double its
//! rate. Redis 8.2 hides them from clients with the `internal` flag and gives them the
//! `admin` and `dangerous` categories; Redis 7.0 has neither for module commands, so a user
//! with `+@all -@admin -@dangerous` could reach them. The module checks every call itself,
//! on every server: the replication link and loading (AOF, RDB) may call them, and so may
//! a connection whose user may run `CONFIG SET` (an operator who can already rewrite the
//! server). A script or another module's call has no connection of its own: refused.

use super::Ctx;
use redis_module::raw;
use std::os::raw::c_int;

/// Whether the running call may use an internal setter.
pub fn may_set_state(ctx: Ctx) -> bool {
    let flags = rm!(RedisModule_GetContextFlags(ctx.0));
    let trusted = (raw::REDISMODULE_CTX_FLAGS_REPLICATED
        | raw::REDISMODULE_CTX_FLAGS_LOADING
        | raw::REDISMODULE_CTX_FLAGS_ASYNC_LOADING) as c_int;
    if flags & trusted != 0 {
        return true;
    }
    // SAFETY (for each read below): reading function pointers the API table filled at load;
    // servers without them (none we support) refuse every client call.
    let (Some(client_id), Some(user_name), Some(user_of), Some(check), Some(free_user)) = (unsafe {
        (
            raw::RedisModule_GetClientId,
            raw::RedisModule_GetClientUserNameById,
            raw::RedisModule_GetModuleUserFromUserName,
            raw::RedisModule_ACLCheckCommandPermissions,
            raw::RedisModule_FreeModuleUser,
        )
    }) else {
        return false;
    };
    // SAFETY: the running call's context.
    let id = unsafe { client_id(ctx.0) };
    if id == 0 {
        return false;
    }
    // SAFETY: a live context; the name is freed below (or by automatic memory: never on).
    let name = unsafe { user_name(ctx.0, id) };
    if name.is_null() {
        // No such connection (a script's or a module's client: refused), or a connection
        // without a user, which only the server's own clients are (the master link,
        // flagged above).
        return false;
    }
    // SAFETY: a live string; the user handle is freed below.
    let user = unsafe { user_of(name) };
    let allowed = !user.is_null() && {
        let mut argv = [
            new_string(ctx, b"CONFIG"),
            new_string(ctx, b"SET"),
            new_string(ctx, b"maxmemory"),
            new_string(ctx, b"0"),
        ];
        // SAFETY: a live user and four live strings.
        let ok = unsafe { check(user, argv.as_mut_ptr(), argv.len() as c_int) }
            == raw::REDISMODULE_OK as c_int;
        for s in argv {
            free_string(ctx, s);
        }
        ok
    };
    if !user.is_null() {
        // SAFETY: the handle made above, freed once.
        unsafe { free_user(user) };
    }
    free_string(ctx, name);
    allowed
}

fn new_string(ctx: Ctx, s: &[u8]) -> *mut raw::RedisModuleString {
    rm!(RedisModule_CreateString(ctx.0, s.as_ptr().cast(), s.len()))
}

fn free_string(ctx: Ctx, s: *mut raw::RedisModuleString) {
    rm!(RedisModule_FreeString(ctx.0, s));
}
