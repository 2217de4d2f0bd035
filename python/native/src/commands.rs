//! The take, reserve, acquire and peek commands and replies as the client core builds and reads
//! them (`redis_rl._protocol`'s `Protocol.take` / `reserve`, `parse_take` / `parse_reserve`
//! / `parse_acquire` / `parse_peek`): one encoding for both clients, pinned by `protocol/cases/`.

use pyo3::prelude::*;
use pyo3::types::PyBytes;

use rl_client_core::commands::{self, Options};
use rl_client_core::take;

use crate::budget::protocol_error;
use crate::guard::guarded;
use crate::prefetch::backend;
use crate::reply::to_reply;

fn words<'py>(py: Python<'py>, args: &[Vec<u8>]) -> Vec<Bound<'py, PyBytes>> {
    args.iter().map(|a| PyBytes::new(py, a)).collect()
}

/// `RL.TAKE key rate cap n [WITHSTATE] [INIT t] [VERSION v]` (or its `FCALL`).
#[pyfunction]
#[pyo3(signature = (backend_name, key, rate, cap, n, withstate, init=None, version=None))]
#[allow(clippy::too_many_arguments)] // the command's own arguments, named
fn take_command<'py>(
    py: Python<'py>,
    backend_name: &str,
    key: &str,
    rate: f64,
    cap: f64,
    n: u64,
    withstate: bool,
    init: Option<f64>,
    version: Option<u64>,
) -> PyResult<Vec<Bound<'py, PyBytes>>> {
    guarded(|| {
        let o = Options { init, version };
        let args = commands::take_command(
            backend(backend_name)?,
            key.as_bytes(),
            (rate, cap),
            n,
            withstate,
            o,
        );
        Ok(words(py, &args))
    })
}

/// `RL.RESERVE key rate cap n max_wait_ms [INIT t] [VERSION v]` (or its `FCALL`).
#[pyfunction]
#[pyo3(signature = (backend_name, key, rate, cap, n, max_wait_ms, init=None, version=None))]
#[allow(clippy::too_many_arguments)] // the command's own arguments, named
fn reserve_command<'py>(
    py: Python<'py>,
    backend_name: &str,
    key: &str,
    rate: f64,
    cap: f64,
    n: u64,
    max_wait_ms: u64,
    init: Option<f64>,
    version: Option<u64>,
) -> PyResult<Vec<Bound<'py, PyBytes>>> {
    guarded(|| {
        let o = Options { init, version };
        let args = commands::reserve_command(
            backend(backend_name)?,
            key.as_bytes(),
            (rate, cap),
            n,
            max_wait_ms,
            o,
        );
        Ok(words(py, &args))
    })
}

/// `RL.TAKE ... WITHSTATE`'s reply: `(granted, remaining, retry_after_ms, reset_after_ms,
/// pinned)`, `pinned` the pin kind's name or `None`; else `ProtocolError`.
#[pyfunction]
fn parse_take(
    py: Python<'_>,
    reply: &Bound<'_, PyAny>,
) -> PyResult<(u64, f64, u64, u64, Option<&'static str>)> {
    guarded(|| {
        let r = to_reply(reply)
            .and_then(|r| take::parse_take(&r))
            .map_err(|e| protocol_error(py, e))?;
        let pinned = r.pinned.map(|p| p.name());
        Ok((
            r.granted,
            r.remaining,
            r.retry_after_ms,
            r.reset_after_ms,
            pinned,
        ))
    })
}

/// `RL.RESERVE`'s reply: `(granted, wait_ms, remaining, reset_after_ms)`; else
/// `ProtocolError`.
#[pyfunction]
fn parse_reserve(py: Python<'_>, reply: &Bound<'_, PyAny>) -> PyResult<(u64, u64, f64, u64)> {
    guarded(|| {
        let r = to_reply(reply)
            .and_then(|r| commands::parse_reserve(&r))
            .map_err(|e| protocol_error(py, e))?;
        Ok((r.granted, r.wait_ms, r.remaining, r.reset_after_ms))
    })
}

/// `RL.ACQUIRE`'s reply: `(granted, permit_id, in_use, retry_after_ms)`; else
/// `ProtocolError`.
#[pyfunction]
fn parse_acquire(py: Python<'_>, reply: &Bound<'_, PyAny>) -> PyResult<(bool, u64, u64, u64)> {
    guarded(|| {
        let r = to_reply(reply)
            .and_then(|r| commands::parse_acquire(&r))
            .map_err(|e| protocol_error(py, e))?;
        Ok((r.granted, r.permit_id, r.in_use, r.retry_after_ms))
    })
}

/// The seven numbers of `RL.PEEK`'s reply, as `redis_rl.PeekReply` takes them.
type PeekFields = (f64, f64, f64, u64, u64, u64, Option<u64>);

/// `RL.PEEK`'s reply (a map or a flat list of pairs): `(tokens, rate, cap, reset_after_ms,
/// leases, leased_tokens, version)`, or `None` for a missing key; else `ProtocolError`.
#[pyfunction]
fn parse_peek(py: Python<'_>, reply: &Bound<'_, PyAny>) -> PyResult<Option<PeekFields>> {
    guarded(|| {
        let r = to_reply(reply)
            .and_then(|r| commands::parse_peek(&r))
            .map_err(|e| protocol_error(py, e))?;
        Ok(r.map(|p| {
            let (tokens, rate, cap, reset) = (p.tokens, p.rate, p.cap, p.reset_after_ms);
            (
                tokens,
                rate,
                cap,
                reset,
                p.leases,
                p.leased_tokens,
                p.version,
            )
        }))
    })
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(take_command, m)?)?;
    m.add_function(wrap_pyfunction!(reserve_command, m)?)?;
    m.add_function(wrap_pyfunction!(parse_take, m)?)?;
    m.add_function(wrap_pyfunction!(parse_reserve, m)?)?;
    m.add_function(wrap_pyfunction!(parse_acquire, m)?)?;
    m.add_function(wrap_pyfunction!(parse_peek, m)?)?;
    Ok(())
}
