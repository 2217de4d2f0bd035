//! The boundary every command call crosses, and registering commands.
//!
//! Commands are registered with `RedisModule_CreateCommand` directly rather than through the
//! crate's macro, which copies every argument into a `Vec<RedisString>` per call. The
//! boundary turns an error into its reply and a panic into an error reply: nothing unwinds
//! into redis-server.

use crate::api::rm;
use crate::api::{self, Ctx, RStr};
use crate::args::Args;
use crate::error::Result;
use crate::stats;
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
    counting: Counting,
) -> c_int {
    if crate::resetstat::PENDING.load(std::sync::atomic::Ordering::Relaxed) != 0 {
        crate::resetstat::check();
    }
    if counting == Counting::Here {
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

/// Who counts a call in `rl_calls`.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Counting {
    /// The boundary, before the handler runs.
    Here,
    /// The handler itself (`RL.MTAKE`: key-position requests are not calls), or nobody
    /// (effects, observers).
    Elsewhere,
}

/// The C entry point of a handler: `entry!(take::take, Counting::Here)`.
#[macro_export]
macro_rules! entry {
    ($handler:path, $counting:expr) => {{
        unsafe extern "C" fn entry(
            ctx: *mut $crate::api::Ctx,
            argv: *mut *mut $crate::api::RStr,
            argc: std::os::raw::c_int,
        ) -> std::os::raw::c_int {
            $crate::boundary::run(ctx, argv, argc, $handler, $counting)
        }
        let func: redis_module::raw::RedisModuleCmdFunc = Some(entry);
        func
    }};
}

/// Which keys a command touches and how (its key spec, for ACL key permissions and
/// Cluster routing).
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Keys {
    /// Argument 1 is the key, read and written (`RW ACCESS UPDATE`).
    OneWritten,
    /// Argument 1 is the key, only read (`RO ACCESS`): a read-only ACL key pattern (`%R~`)
    /// is enough.
    OneRead,
    /// Keys at 2, 5, 8... with options after them: the spec is marked incomplete, so Redis
    /// asks the command (getkeys-api) for the exact list.
    EveryThirdFrom2,
    /// No keys.
    None,
}

/// One argument as `COMMAND DOCS` shows it (and `redis-cli` hints from).
pub struct ArgDoc {
    pub name: &'static CStr,
    pub kind: raw::RedisModuleCommandArgType,
    /// The keyword before it (`INIT` in `INIT tokens`), or the keyword itself for a pure
    /// token.
    pub token: Option<&'static CStr>,
    pub optional: bool,
    pub multiple: bool,
    pub sub: &'static [ArgDoc],
}

impl ArgDoc {
    const fn new(name: &'static CStr, kind: raw::RedisModuleCommandArgType) -> ArgDoc {
        ArgDoc {
            name,
            kind,
            token: None,
            optional: false,
            multiple: false,
            sub: &[],
        }
    }
    pub const fn key(name: &'static CStr) -> ArgDoc {
        ArgDoc::new(
            name,
            raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_KEY,
        )
    }
    pub const fn double(name: &'static CStr) -> ArgDoc {
        ArgDoc::new(
            name,
            raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_DOUBLE,
        )
    }
    pub const fn integer(name: &'static CStr) -> ArgDoc {
        ArgDoc::new(
            name,
            raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_INTEGER,
        )
    }
    /// A keyword alone (`WITHSTATE`), optional.
    pub const fn flag(name: &'static CStr) -> ArgDoc {
        let mut a = ArgDoc::new(
            name,
            raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_PURE_TOKEN,
        );
        a.token = Some(name);
        a.optional = true;
        a
    }
    /// Several arguments as one (`RETURN lease_id unused`), after `token` if given.
    pub const fn block(name: &'static CStr, sub: &'static [ArgDoc]) -> ArgDoc {
        let mut a = ArgDoc::new(
            name,
            raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_BLOCK,
        );
        a.sub = sub;
        a
    }
    /// This argument preceded by a keyword, optional (`[INIT tokens]`).
    pub const fn after(mut self, token: &'static CStr) -> ArgDoc {
        self.token = Some(token);
        self.optional = true;
        self
    }
    pub const fn optional(mut self) -> ArgDoc {
        self.optional = true;
        self
    }
    pub const fn multiple(mut self) -> ArgDoc {
        self.multiple = true;
        self
    }
}

/// What Redis needs to know about a command: flags, where its keys are, its arity
/// (negative: at least that many, the name included), ACL categories, docs.
pub struct Spec {
    pub name: &'static CStr,
    pub func: redis_module::raw::RedisModuleCmdFunc,
    pub flags: &'static CStr,
    pub keys: Keys,
    pub arity: c_int,
    pub summary: &'static CStr,
    pub complexity: &'static CStr,
    /// Space-separated ACL categories (`write fast`), set where the server can
    /// (`SetCommandACLCategories`, Redis 7.2+); `ratelimit` is added to every command but
    /// the internal one where the module's own category could be created.
    pub acl: &'static CStr,
    /// Registered with the `internal` flag where the server has it (Redis 8.0+): only the
    /// replication link, the AOF and modules may call it, and `COMMAND` does not list it.
    pub internal: bool,
    pub args: &'static [ArgDoc],
}

/// Whether the module's own ACL category `ratelimit` exists (created at load).
static RATELIMIT_CATEGORY: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// Creates the `ratelimit` ACL category where the server can (`AddACLCategory`, Redis
/// 7.4+). Must run during load, before the commands are registered.
pub fn add_acl_category(ctx: *mut Ctx) {
    // SAFETY: reading a function pointer the API table filled at load.
    if let Some(add) = unsafe { raw::RedisModule_AddACLCategory } {
        // SAFETY: a live context and a NUL-terminated name.
        let ok = unsafe { add(ctx, c"ratelimit".as_ptr()) } == raw::REDISMODULE_OK as c_int;
        RATELIMIT_CATEGORY.store(ok, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Registers one command; `Err` names it if Redis refused.
pub fn register(ctx: *mut Ctx, spec: &Spec) -> std::result::Result<(), &'static CStr> {
    let (first, last, step) = match spec.keys {
        Keys::OneWritten | Keys::OneRead => (1, 1, 1),
        Keys::EveryThirdFrom2 => (2, -1, 3),
        Keys::None => (0, 0, 0),
    };
    let ok = redis_module::raw::REDISMODULE_OK as c_int;
    let name = spec.name.as_ptr();
    let create = |flags: &CStr| {
        rm!(RedisModule_CreateCommand(
            ctx,
            name,
            spec.func,
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
    let command = rm!(RedisModule_GetCommand(ctx, name));
    if command.is_null() {
        return Err(spec.name);
    }
    set_info(command, spec).ok_or(spec.name)?;
    // The effect command is not one a rate-limited caller needs: `+@ratelimit` must not
    // let anyone overwrite buckets.
    set_acl_categories(command, spec.acl, !spec.internal).ok_or(spec.name)
}

fn set_acl_categories(
    command: *mut raw::RedisModuleCommand,
    acl: &CStr,
    ratelimit: bool,
) -> Option<()> {
    // SAFETY: reading a function pointer the API table filled at load.
    let Some(set) = (unsafe { raw::RedisModule_SetCommandACLCategories }) else {
        return Some(()); // Redis 7.0: the README gives the ACL rules to write instead.
    };
    let mut categories = acl.to_bytes().to_vec();
    if ratelimit && RATELIMIT_CATEGORY.load(std::sync::atomic::Ordering::Relaxed) {
        categories.extend_from_slice(b" ratelimit");
    }
    let categories = std::ffi::CString::new(categories).ok()?;
    // SAFETY: a command this module just created and a NUL-terminated string.
    let status = unsafe { set(command, categories.as_ptr()) };
    (status == raw::REDISMODULE_OK as c_int).then_some(())
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
/// DOCS` (Redis then checks the arity itself).
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
        arity: spec.arity,
        key_specs: if specs.is_empty() {
            std::ptr::null_mut()
        } else {
            specs.as_mut_ptr()
        },
        args: c_args(spec.args, &mut keep),
    };
    let ok = redis_module::raw::REDISMODULE_OK as c_int;
    (rm!(RedisModule_SetCommandInfo(command, &mut info)) == ok).then_some(())
}
