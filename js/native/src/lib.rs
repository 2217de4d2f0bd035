//! The compiled core of the `redis-rl` npm package. Each module binds one concern of the
//! client decisions (rl-client-core: the same code the Rust and Python clients run, so the
//! clients cannot disagree); TypeScript keeps only what is JavaScript (the user's ioredis or
//! node-redis calls, promises and timers, middleware, public types).
//!
//! Every entry goes through [`guard::guarded`]: a panic becomes a JS `Error`, never an
//! abort. Nothing here waits, blocks or does I/O: each call is a few hundred nanoseconds of
//! arithmetic on the caller's thread.

// napi-derive registers the exports with Node only outside `cfg(test)` (clippy --all-targets
// checks that build too): there they look unused.
#![cfg_attr(test, allow(dead_code))]

mod budget;
mod guard;
mod limits;
mod openai;
mod patch;
mod prefetch;
mod reply;
mod rules;
mod share;
mod take;
mod typed;

use rl_client_core::budget::Backend;

/// `"module"` or `"functions"`.
pub(crate) fn backend(name: &str) -> napi::Result<Backend> {
    match name {
        "module" => Ok(Backend::Module),
        "functions" => Ok(Backend::Functions),
        other => Err(guard::invalid(format!(
            "backend {other:?}: 'module' or 'functions'"
        ))),
    }
}

/// A command's arguments as JS strings: every argument is made from JS strings (keys, limit
/// names) and numbers, so each is UTF-8 already; a string costs Node far less to make than a
/// Buffer (which needs a finalizer per argument).
pub(crate) fn strings(args: Vec<Vec<u8>>) -> Vec<String> {
    args.into_iter()
        .map(|a| {
            String::from_utf8(a)
                .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
        })
        .collect()
}
