//! The one way into Rust from Python: run the body, turn a panic into an exception.
//!
//! PyO3 already stops a panic at the boundary, but it raises `PanicException`, which derives
//! from `BaseException`: a web handler's `except Exception` would not catch it and the
//! worker would die. A panic here is a bug in redis-rl, so it is raised as `RuntimeError`
//! with the panic's message and a request to report it.

use std::panic::{catch_unwind, AssertUnwindSafe};

use pyo3::exceptions::PyRuntimeError;
use pyo3::PyResult;

/// Runs `body`; a panic inside it is raised as `RuntimeError`.
pub fn guarded<T>(body: impl FnOnce() -> PyResult<T>) -> PyResult<T> {
    // AssertUnwindSafe: the bodies hold no state a panic could leave half-written that
    // Python could observe afterwards (they take their inputs by value or shared reference
    // and build a fresh result).
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(result) => result,
        Err(payload) => {
            let why = rl_client_core::panic_message(payload.as_ref());
            Err(PyRuntimeError::new_err(format!(
                "redis_rl internal error (please report it): {why}"
            )))
        }
    }
}
