//! Commands: the C entry point of each one, registering them (flags, key specs, docs, ACL
//! categories), the keys of `RL.MTAKE` for Cluster routing, effects passed on verbatim, the
//! `CONFIG RESETSTAT` command filter, and reading Redis's own statistics.

use super::{bytes, Ctx, Str};
use crate::arg_doc::ArgDoc;
use crate::args::Args;
use crate::boundary::{Keys, Spec};
use crate::commands::COMMANDS;
use redis_module::raw;
use std::ffi::CStr;
use std::os::raw::c_int;

/// The C entry point of `COMMANDS[I]`: the arguments as safe handles, then the boundary.
extern "C" fn entry<const I: usize>(
    ctx: *mut raw::RedisModuleCtx,
    argv: *mut *mut raw::RedisModuleString,
    argc: c_int,
) -> c_int {
    // SAFETY: Redis passes `argc` live strings, the command name first; `Str` is a
    // transparent wrapper of the pointer.
    let argv: &[Str] =
        unsafe { std::slice::from_raw_parts(argv.cast::<Str>(), argc.max(0) as usize) };
    crate::boundary::run(Ctx(ctx), Args::new(argv), &COMMANDS[I]);
    raw::REDISMODULE_OK as c_int
}

/// One entry point per slot of [`COMMANDS`] (a test checks there are enough).
const ENTRIES: [raw::RedisModuleCmdFunc; 24] = [
    Some(entry::<0>),
    Some(entry::<1>),
    Some(entry::<2>),
    Some(entry::<3>),
    Some(entry::<4>),
    Some(entry::<5>),
    Some(entry::<6>),
    Some(entry::<7>),
    Some(entry::<8>),
    Some(entry::<9>),
    Some(entry::<10>),
    Some(entry::<11>),
    Some(entry::<12>),
    Some(entry::<13>),
    Some(entry::<14>),
    Some(entry::<15>),
    Some(entry::<16>),
    Some(entry::<17>),
    Some(entry::<18>),
    Some(entry::<19>),
    Some(entry::<20>),
    Some(entry::<21>),
    Some(entry::<22>),
    Some(entry::<23>),
];

/// Registers every command of [`COMMANDS`] (and the `ratelimit` ACL category first, where
/// the server can create it); `Err` names the first one Redis refused.
pub fn register_commands(ctx: Ctx) -> std::result::Result<(), &'static CStr> {
    add_acl_category(ctx);
    if COMMANDS.len() > ENTRIES.len() {
        return Err(c"(more commands than entry points)");
    }
    COMMANDS
        .iter()
        .zip(ENTRIES)
        .try_for_each(|(spec, func)| register(ctx, spec, func))
}

/// Whether Redis asks where the keys of this call are (`COMMAND GETKEYS`, Cluster).
pub fn is_keys_position_request(ctx: Ctx) -> bool {
    rm!(RedisModule_IsKeysPositionRequest(ctx.0)) != 0
}

/// Answers a keys-position request: argument `pos` (the command name is 0) is a key.
pub fn key_at_pos(ctx: Ctx, pos: usize) {
    rm!(RedisModule_KeyAtPos(ctx.0, pos as c_int));
}

/// Passes the running command on to replicas and the AOF as it is.
pub fn replicate_verbatim(ctx: Ctx) {
    rm!(RedisModule_ReplicateVerbatim(ctx.0));
}

/// Sets the module's options (`REDISMODULE_OPTION*`).
pub fn set_module_options(ctx: Ctx, options: u32) {
    rm!(RedisModule_SetModuleOptions(ctx.0, options as c_int));
}

/// The arguments of a command passing through the filter.
pub struct Filter(*mut raw::RedisModuleCommandFilterCtx);

impl Filter {
    pub fn len(&self) -> usize {
        rm!(RedisModule_CommandFilterArgsCount(self.0)).max(0) as usize
    }

    /// Argument `i` (the command name is 0).
    pub fn arg(&self, i: usize) -> Option<&[u8]> {
        let s = rm!(RedisModule_CommandFilterArgGet(self.0, i as c_int));
        (!s.is_null()).then(|| bytes(s))
    }
}

unsafe extern "C" fn filter(fctx: *mut raw::RedisModuleCommandFilterCtx) {
    let _ = std::panic::catch_unwind(|| {
        crate::observe::eviction::command_started();
        crate::observe::resetstat::filter(&Filter(fctx))
    });
}

/// Registers the command filter at load (`CONFIG RESETSTAT`, and each command's start for
/// the eviction count).
pub fn register_filter(ctx: Ctx) -> bool {
    !rm!(RedisModule_RegisterCommandFilter(ctx.0, Some(filter), 0)).is_null()
}

/// Reads `field` of Redis's `INFO section` as text, with `read`.
pub fn server_info_text<R>(
    section: &CStr,
    field: &CStr,
    read: impl FnOnce(Option<&str>) -> R,
) -> Option<R> {
    let info = rm!(RedisModule_GetServerInfo(
        std::ptr::null_mut(),
        section.as_ptr()
    ));
    if info.is_null() {
        return None;
    }
    let text = rm!(RedisModule_ServerInfoGetFieldC(info, field.as_ptr()));
    // SAFETY: a NUL-terminated string owned by `info`, read before it is freed.
    let text = (!text.is_null()).then(|| unsafe { CStr::from_ptr(text) }.to_string_lossy());
    let out = read(text.as_deref());
    rm!(RedisModule_FreeServerInfo(std::ptr::null_mut(), info));
    Some(out)
}

/// Reads `field` of Redis's `INFO section` as an unsigned number.
pub fn server_info_u64(section: &CStr, field: &CStr) -> Option<u64> {
    let info = rm!(RedisModule_GetServerInfo(
        std::ptr::null_mut(),
        section.as_ptr()
    ));
    if info.is_null() {
        return None;
    }
    let mut err = 0;
    let v = rm!(RedisModule_ServerInfoGetFieldUnsigned(
        info,
        field.as_ptr(),
        &mut err
    ));
    rm!(RedisModule_FreeServerInfo(std::ptr::null_mut(), info));
    (err == 0).then_some(v)
}

/// Whether the server put the module's commands in their ACL categories at load
/// (`SetCommandACLCategories`, Redis 7.2+ and Valkey); on Redis 7.0 it cannot, and the
/// boundary holds the operator's commands to the setters' rule instead (see
/// [`crate::boundary::run`]).
static CATEGORIES_SET: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether the module's commands are in ACL categories on this server.
pub fn acl_categories_set() -> bool {
    CATEGORIES_SET.load(std::sync::atomic::Ordering::Relaxed)
}

/// Whether the module's own ACL category `ratelimit` exists (created at load).
static RATELIMIT_CATEGORY: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// Creates the `ratelimit` ACL category where the server can (`AddACLCategory`, Redis
/// 7.4+). Must run during load, before the commands are registered.
fn add_acl_category(ctx: Ctx) {
    // SAFETY: reading a function pointer the API table filled at load.
    if let Some(add) = unsafe { raw::RedisModule_AddACLCategory } {
        // SAFETY: a live context and a NUL-terminated name.
        let ok = unsafe { add(ctx.0, c"ratelimit".as_ptr()) } == raw::REDISMODULE_OK as c_int;
        RATELIMIT_CATEGORY.store(ok, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Registers one command, called through `func`; `Err` names it if Redis refused.
fn register(
    ctx: Ctx,
    spec: &Spec,
    func: raw::RedisModuleCmdFunc,
) -> std::result::Result<(), &'static CStr> {
    let (first, last, step) = match spec.keys {
        Keys::OneWritten | Keys::OneRead => (1, 1, 1),
        Keys::EveryThirdFrom2 => (2, -1, 3),
        Keys::EveryFourthFrom2 => (2, -1, 4),
        Keys::EverySecondFrom2 => (2, -1, 2),
        Keys::None => (0, 0, 0),
    };
    let ok = raw::REDISMODULE_OK as c_int;
    let name = spec.name.as_ptr();
    let create = |flags: &CStr| {
        rm!(RedisModule_CreateCommand(
            ctx.0,
            name,
            func,
            flags.as_ptr(),
            first,
            last,
            step
        )) == ok
    };
    let mut created = false;
    if spec.internal {
        // Servers without the flag refuse it: then register it as an ordinary command.
        let mut with = spec.flags.to_bytes().to_vec();
        with.extend_from_slice(b" internal");
        let with = std::ffi::CString::new(with).map_err(|_| spec.name)?;
        created = create(&with);
    }
    if !created && !create(spec.flags) {
        return Err(spec.name);
    }
    let command = rm!(RedisModule_GetCommand(ctx.0, name));
    if command.is_null() {
        return Err(spec.name);
    }
    set_info(command, spec).ok_or(spec.name)?;
    // The effect commands and the operator's (`@admin`: pins) are not ones a rate-limited
    // caller needs: `+@ratelimit` must not let anyone overwrite or pin buckets.
    set_acl_categories(command, spec.acl, !spec.internal && !spec.operator()).ok_or(spec.name)
}

fn set_acl_categories(
    command: *mut raw::RedisModuleCommand,
    acl: &CStr,
    ratelimit: bool,
) -> Option<()> {
    // SAFETY: reading a function pointer the API table filled at load.
    let Some(set) = (unsafe { raw::RedisModule_SetCommandACLCategories }) else {
        return Some(()); // Redis 7.0: docs/deploy.md gives the ACL rules to write instead.
    };
    let mut categories = acl.to_bytes().to_vec();
    if ratelimit && RATELIMIT_CATEGORY.load(std::sync::atomic::Ordering::Relaxed) {
        categories.extend_from_slice(b" ratelimit");
    }
    let categories = std::ffi::CString::new(categories).ok()?;
    // SAFETY: a command this module just created and a NUL-terminated string.
    let status = unsafe { set(command, categories.as_ptr()) };
    let ok = status == raw::REDISMODULE_OK as c_int;
    CATEGORIES_SET.store(ok, std::sync::atomic::Ordering::Relaxed);
    ok.then_some(())
}

/// Builds the C form of `docs` (Redis copies it; these vectors only need to live through
/// the call). Ends with the zeroed entry Redis expects.
fn c_args(
    docs: &[ArgDoc],
    keep: &mut Vec<Vec<raw::RedisModuleCommandArg>>,
) -> *mut raw::RedisModuleCommandArg {
    if docs.is_empty() {
        return std::ptr::null_mut();
    }
    let mut out: Vec<raw::RedisModuleCommandArg> = docs
        .iter()
        .map(|d| {
            let is_key = d.kind == raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_KEY;
            let mut flags = 0;
            if d.optional {
                flags |= raw::REDISMODULE_CMD_ARG_OPTIONAL as c_int;
            }
            if d.multiple {
                flags |= raw::REDISMODULE_CMD_ARG_MULTIPLE as c_int;
            }
            raw::RedisModuleCommandArg {
                name: d.name.as_ptr(),
                type_: d.kind,
                key_spec_index: if is_key { 0 } else { -1 },
                token: d.token.map_or(std::ptr::null(), CStr::as_ptr),
                summary: std::ptr::null(),
                since: std::ptr::null(),
                flags,
                deprecated_since: std::ptr::null(),
                subargs: c_args(d.sub, keep),
                display_text: std::ptr::null(),
            }
        })
        .collect();
    // SAFETY: an all-zero `RedisModuleCommandArg` is the terminator Redis looks for.
    out.push(unsafe { std::mem::zeroed() });
    let ptr = out.as_mut_ptr();
    keep.push(out);
    ptr
}

/// The key spec of `keys`, terminated by a zeroed entry; empty for commands without keys.
fn key_specs(keys: Keys) -> Vec<raw::RedisModuleCommandKeySpec> {
    const RO: u64 = raw::REDISMODULE_CMD_KEY_RO as u64 | raw::REDISMODULE_CMD_KEY_ACCESS as u64;
    const RW: u64 = raw::REDISMODULE_CMD_KEY_RW as u64
        | raw::REDISMODULE_CMD_KEY_ACCESS as u64
        | raw::REDISMODULE_CMD_KEY_UPDATE as u64;
    let (flags, pos, lastkey, keystep) = match keys {
        Keys::OneWritten => (RW, 1, 0, 1),
        Keys::OneRead => (RO, 1, 0, 1),
        Keys::EveryThirdFrom2 => (RW | raw::REDISMODULE_CMD_KEY_INCOMPLETE as u64, 2, -1, 3),
        Keys::EveryFourthFrom2 => (RW | raw::REDISMODULE_CMD_KEY_INCOMPLETE as u64, 2, -1, 4),
        Keys::EverySecondFrom2 => (RW, 2, -1, 2),
        Keys::None => return Vec::new(),
    };
    // SAFETY: all-zero is a valid value of these plain C structs (and the terminator).
    let mut spec: raw::RedisModuleCommandKeySpec = unsafe { std::mem::zeroed() };
    spec.flags = flags;
    spec.begin_search_type = raw::RedisModuleKeySpecBeginSearchType_REDISMODULE_KSPEC_BS_INDEX;
    spec.bs.index.pos = pos;
    spec.find_keys_type = raw::RedisModuleKeySpecFindKeysType_REDISMODULE_KSPEC_FK_RANGE;
    spec.fk.range.lastkey = lastkey;
    spec.fk.range.keystep = keystep;
    spec.fk.range.limit = 0;
    vec![spec, unsafe { std::mem::zeroed() }]
}

/// Arity, summary, complexity, key specs and arguments, for `COMMAND INFO` / `COMMAND
/// DOCS`.
fn set_info(command: *mut raw::RedisModuleCommand, spec: &Spec) -> Option<()> {
    let version = raw::RedisModuleCommandInfoVersion {
        version: 1,
        sizeof_historyentry: std::mem::size_of::<raw::RedisModuleCommandHistoryEntry>(),
        sizeof_keyspec: std::mem::size_of::<raw::RedisModuleCommandKeySpec>(),
        sizeof_arg: std::mem::size_of::<raw::RedisModuleCommandArg>(),
    };
    let mut specs = key_specs(spec.keys);
    let mut keep = Vec::new();
    let mut info = raw::RedisModuleCommandInfo {
        version: &version,
        summary: spec.summary.as_ptr(),
        complexity: spec.complexity.as_ptr(),
        since: c"0.1.0".as_ptr(),
        history: std::ptr::null_mut(),
        tips: std::ptr::null(),
        arity: spec.registered_arity(),
        key_specs: if specs.is_empty() {
            std::ptr::null_mut()
        } else {
            specs.as_mut_ptr()
        },
        args: c_args(&spec.arg_docs(), &mut keep),
    };
    let ok = raw::REDISMODULE_OK as c_int;
    (rm!(RedisModule_SetCommandInfo(command, &mut info)) == ok).then_some(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_command_has_an_entry_point() {
        assert!(super::COMMANDS.len() <= super::ENTRIES.len());
    }
}
