//! Limit strings (`"5/minute"`, `"10/second;500/minute, burst 20"`): the client core's parser
//! (`rl_client_core::limits`, the Rust client's too), so both clients read a limit string the same way, message for
//! message. Python wraps the result in its public `redis_rl.Limit` type (which also writes
//! a limit back as text).

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::guard::guarded;

/// Every limit of `text` as `(amount, period_seconds, cap)`, or `ValueError` saying what is
/// wrong and how to write it.
#[pyfunction]
fn parse_limits(text: &str) -> PyResult<Vec<(f64, f64, f64)>> {
    guarded(|| {
        rl_client_core::limits::parse_limits(text)
            .map(|limits| {
                limits
                    .iter()
                    .map(|l| (l.amount, l.period_secs, l.cap))
                    .collect()
            })
            .map_err(|e| PyValueError::new_err(e.to_string()))
    })
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(parse_limits, m)?)?;
    Ok(())
}
