//! The boundary every command call crosses, and what Redis is told about each command.
//!
//! Redis calls a command's entry point in [`crate::ffi`], which hands the call here as
//! safe handles. The boundary turns an error into its reply and a panic into an error
//! reply: nothing unwinds into redis-server. Commands are registered with
//! `RedisModule_CreateCommand` directly rather than through the `redis-module` crate's
//! macro, which copies every argument into a `Vec<RedisString>` per call.

use crate::arg_doc::ArgDoc;
use crate::args::Args;
use crate::error::Result;
use crate::ffi::{self, Ctx};
use crate::grammar::Opt;
use crate::observe::stats;
use crate::reply::Reply;
use redis_module::raw;
use std::ffi::CStr;
use std::os::raw::c_int;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// A command body: parses, acts, and returns its reply (or an error); the boundary writes
/// either.
pub type Handler = fn(Ctx, Args) -> Result<Reply>;

/// Runs one call of `spec`'s command.
pub fn run(ctx: Ctx, args: Args, spec: &Spec) {
    if crate::observe::resetstat::PENDING.load(std::sync::atomic::Ordering::Relaxed) != 0 {
        crate::observe::resetstat::check();
    }
    if spec.internal && !ffi::may_set_state(ctx) {
        stats::ERRORS.add(1);
        reply_internal_refused(ctx, spec);
        return;
    }
    // The operator's commands (RL.PIN, RL.UNPIN: `@admin`) where the server could not put
    // them in a category (Redis 7.0): `-@admin` does not reach them there, so a user with
    // `+@all -@admin -@dangerous` could pin. Held to the setters' rule instead: the
    // replication link, loading, or a user allowed `CONFIG SET`. Where the categories are
    // set, ACL already decides (and `+rl.pin` alone makes a pinner).
    if spec.operator() && !ffi::acl_categories_set() && !ffi::may_set_state(ctx) {
        stats::ERRORS.add(1);
        reply_operator_refused(ctx, spec);
        return;
    }
    // Redis checks only that the key is there (see `Spec::registered_arity`); the rest of
    // the arity is checked here, so the error can show the usage. Such a call is not
    // counted, as when Redis refused it. (A key-position request is the handler's.)
    if !spec.arity_fits(args.len() + 1) && !ffi::is_keys_position_request(ctx) {
        reply_usage(ctx, spec);
        return;
    }
    if spec.counted == CallsCounted::AtBoundary {
        stats::CALLS.add(1);
    }
    // The hot paths' reply, an integer, is written where the handler returns it: not moved
    // out of the guard, nor walked as a general reply.
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        let result = (spec.func)(ctx, args);
        if let Ok(Reply::Int(v)) = result {
            ffi::reply_int(ctx, v);
            // An integer holds nothing to free: its drop glue is skipped.
            std::mem::forget(result);
            return None;
        }
        Some(result)
    }));
    match outcome {
        Ok(None) => {}
        Ok(Some(Ok(reply))) => ffi::reply(ctx, &reply),
        Ok(Some(Err(crate::error::Error::Arity))) => {
            stats::ERRORS.add(1);
            reply_usage(ctx, spec);
        }
        Ok(Some(Err(e))) => {
            stats::ERRORS.add(1);
            e.reply(ctx);
        }
        Err(_) => {
            stats::ERRORS.add(1);
            ffi::reply_error(
                ctx,
                c"ERR internal error in redis-rl; the call changed nothing",
            );
        }
    }
}

/// The refusal of an internal setter to a caller that may not use it (see
/// [`ffi::may_set_state`]).
fn reply_internal_refused(ctx: Ctx, spec: &Spec) {
    let name = spec.name.to_string_lossy();
    let text = format!(
        "NOPERM {name} is internal: it is what a master sends its replicas and the AOF \
         holds; clients may call it only as a user allowed to run CONFIG SET"
    );
    let text = std::ffi::CString::new(text).unwrap_or_else(|_| c"NOPERM internal command".into());
    ffi::reply_error(ctx, &text);
}

/// The refusal of an operator's command on a server without module ACL categories (see
/// [`run`]).
fn reply_operator_refused(ctx: Ctx, spec: &Spec) {
    let name = spec.name.to_string_lossy();
    let text = format!(
        "NOPERM {name} is an operator's command: on this server (no ACL categories for module \
         commands) only a user allowed to run CONFIG SET may call it"
    );
    let text = std::ffi::CString::new(text).unwrap_or_else(|_| c"NOPERM operator command".into());
    ffi::reply_error(ctx, &text);
}

/// Redis's wrong-arity error, followed by the command's usage.
fn reply_usage(ctx: Ctx, spec: &Spec) {
    let name = spec.name.to_string_lossy();
    let text = format!(
        "ERR wrong number of arguments for '{name}' command; usage: {}",
        spec.usage()
    );
    let text =
        std::ffi::CString::new(text).unwrap_or_else(|_| c"ERR wrong number of arguments".into());
    ffi::reply_error(ctx, &text);
}

/// Who counts a call in `rl_calls`.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum CallsCounted {
    /// The boundary, before the handler runs.
    AtBoundary,
    /// The handler itself (`RL.MTAKE`: key-position requests are not calls).
    ByHandler,
    /// Not counted: effects and observers.
    Never,
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
    /// asks the command (getkeys-api) for the exact list (`RL.MTAKE`).
    EveryThirdFrom2,
    /// Keys at 2, 6, 10... with options after them, reported by the command as
    /// [`Keys::EveryThirdFrom2`] (`RL.BUDGET`).
    EveryFourthFrom2,
    /// Keys at 2, 4, 6... to the last argument: the spec is exact (`RL.SETTLE`).
    EverySecondFrom2,
    /// No keys.
    None,
}

/// What Redis needs to know about a command: flags, where its keys are, its arity
/// (negative: at least that many, the name included), ACL categories, docs.
pub struct Spec {
    pub name: &'static CStr,
    pub func: Handler,
    pub counted: CallsCounted,
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
    /// The arguments before the options.
    pub args: &'static [ArgDoc],
    /// The options the command's parser takes (see `grammar.rs`), shown after the
    /// arguments: defined once, parsed and documented from the same list.
    pub options: &'static [Opt],
}

impl Spec {
    /// An operator's command (`@admin`, not an internal setter: the pins): never in
    /// `@ratelimit`, and on a server without module ACL categories only for users allowed
    /// `CONFIG SET` (see [`run`]).
    pub fn operator(&self) -> bool {
        !self.internal && self.acl.to_bytes().windows(5).any(|w| w == b"admin")
    }

    /// Whether `argc` arguments (the name included) fit the command's arity.
    pub fn arity_fits(&self, argc: usize) -> bool {
        let argc = argc as c_int;
        // `argc == arity` or, for a negative arity, `argc >= -arity`: one comparison of the
        // excess over the least count, which is 0 exactly for a fixed arity.
        let excess = argc - self.arity.abs();
        excess == 0 || (self.arity < 0 && excess > 0)
    }

    /// The arity Redis checks itself (and `COMMAND INFO` shows): for a command with keys,
    /// only that the first key is there (what Cluster routing needs); the exact arity is
    /// checked at the boundary, whose error shows the usage.
    pub fn registered_arity(&self) -> c_int {
        match self.keys {
            Keys::None => self.arity,
            _ => -2,
        }
    }

    /// Every argument as `COMMAND DOCS` shows it: the arguments, then the options.
    pub fn arg_docs(&self) -> Vec<ArgDoc> {
        let options = self.options.iter().map(|o| o.doc());
        self.args.iter().copied().chain(options).collect()
    }

    /// `RL.TAKE key rate cap [n] [WITHSTATE] ...`, from the argument table.
    pub fn usage(&self) -> String {
        let mut out = self.name.to_string_lossy().into_owned();
        for a in &self.arg_docs() {
            out.push(' ');
            a.usage(&mut out);
        }
        out
    }
}

impl ArgDoc {
    /// This argument as a usage line shows it.
    fn usage(&self, out: &mut String) {
        let name = self.name.to_string_lossy();
        let body = {
            let mut b = String::new();
            if self.kind == raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_PURE_TOKEN {
                b.push_str(&name);
            } else {
                if let Some(t) = self.token {
                    b.push_str(&t.to_string_lossy());
                    b.push(' ');
                }
                if self.sub.is_empty() {
                    b.push_str(&name);
                } else {
                    let parts: Vec<String> = self
                        .sub
                        .iter()
                        .map(|s| {
                            let mut p = String::new();
                            s.usage(&mut p);
                            p
                        })
                        .collect();
                    b.push_str(&parts.join(" "));
                }
            }
            if self.multiple {
                b = format!("{b} [{b} ...]");
            }
            b
        };
        if self.optional {
            out.push('[');
            out.push_str(&body);
            out.push(']');
        } else {
            out.push_str(&body);
        }
    }
}
