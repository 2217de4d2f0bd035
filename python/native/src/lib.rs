//! `redis_rl._core`: the Python package's compiled core. Each submodule binds one concern of
//! the Rust client's decisions (the same code the Rust client runs, so the two clients
//! cannot disagree); Python keeps only what is Python (redis-py calls, threads, asyncio,
//! fork handlers, middleware, public types).
//!
//! Every entry goes through [`guard::guarded`]: a panic becomes a Python exception, never
//! an abort or a `PanicException` (a `BaseException` an `except Exception` would miss).

mod budget;
mod commands;
mod guard;
mod limits;
mod openai;
mod permit;
mod policy;
mod prefetch;
mod reply;
mod rules;
mod share;

use pyo3::prelude::*;

/// The compiled core of redis_rl: the client decisions the Rust client makes, written once.
#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    limits::register(m)?;
    budget::register(m)?;
    openai::register(m)?;
    rules::register(m)?;
    permit::register(m)?;
    policy::register(m)?;
    prefetch::register(m)?;
    commands::register(m)?;
    share::register(m)?;
    Ok(())
}
