//! The one way into Rust from Node: run the body, turn a panic into a JS `Error`.
//!
//! A panic that unwound into N-API would abort the process (every request of the server
//! with it). A panic here is a bug in redis-rl, so it is thrown as an `Error` with the
//! panic's message and a request to report it; the caller's `catch` sees it like any other.

use std::panic::{catch_unwind, AssertUnwindSafe};

use napi::{Error, Result, Status};

/// The prefix of the message of an `Error` a panic became (the TS shell tells it apart).
pub const INTERNAL: &str = "redis-rl internal error (please report it): ";

/// Runs `body`; a panic inside it is thrown as an `Error`.
pub fn guarded<T>(body: impl FnOnce() -> Result<T>) -> Result<T> {
    // AssertUnwindSafe: a body that panics halfway leaves at worst a limiter's counters or
    // local bucket half-updated, which no invariant of memory safety depends on.
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(result) => result,
        Err(payload) => {
            let why = rl_client_core::panic_message(payload.as_ref());
            Err(Error::new(
                Status::GenericFailure,
                format!("{INTERNAL}{why}"),
            ))
        }
    }
}

/// A bad argument (thrown as an `Error` whose `code` is `InvalidArg`).
pub fn invalid(message: impl Into<String>) -> Error {
    Error::new(Status::InvalidArg, message.into())
}

/// A reply that is not what the command answers (the message starts
/// `unexpected reply from redis-rl:`; `code` is `GenericFailure`).
pub fn protocol(e: rl_client_core::ProtocolError) -> Error {
    Error::new(Status::GenericFailure, e.to_string())
}

/// A count from JS: a non-negative whole number below 2^53.
pub fn count(what: &str, x: f64) -> Result<u64> {
    if x.fract() == 0.0 && (0.0..=9_007_199_254_740_991.0).contains(&x) {
        Ok(x as u64)
    } else {
        Err(invalid(format!(
            "{what}: a non-negative integer expected, got {x}"
        )))
    }
}

/// A monotonic instant in milliseconds (`performance.now()`) as nanoseconds.
pub fn nanos(now_ms: f64) -> Result<u64> {
    if now_ms.is_finite() && now_ms >= 0.0 {
        Ok((now_ms * 1e6) as u64)
    } else {
        Err(invalid(format!("now: milliseconds expected, got {now_ms}")))
    }
}

/// A panic on purpose, for the tests that check none reaches Node.
#[napi_derive::napi(js_name = "__panicForTests")]
pub fn panic_for_tests() -> Result<()> {
    guarded(|| panic!("a panic the tests asked for"))
}
