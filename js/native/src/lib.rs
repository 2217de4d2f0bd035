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
mod reply;
mod take;

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

pub(crate) fn buffers(args: Vec<Vec<u8>>) -> Vec<napi::bindgen_prelude::Buffer> {
    args.into_iter().map(Into::into).collect()
}
