//! What `COMMAND DOCS` shows of a command's arguments: one [`ArgDoc`] each. Its own room:
//! the command table ([`crate::boundary`]) and the options the grammar defines once
//! ([`crate::grammar`]) both describe arguments with it, and neither reaches into the
//! other for it.

use redis_module::raw;
use std::ffi::CStr;

/// One argument as `COMMAND DOCS` shows it (and `redis-cli` hints from).
#[derive(Clone, Copy)]
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
    pub const fn string(name: &'static CStr) -> ArgDoc {
        ArgDoc::new(
            name,
            raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_STRING,
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
