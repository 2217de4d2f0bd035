//! The prefetch ledger (`redis_rl._core.Ledger`): the client core's [`Ledger`] under
//! Python's `PrefetchLimiter` / `AsyncPrefetchLimiter`. Python sends the lease calls it is
//! handed, waits (threads, asyncio), and hands the replies and failures back; what is held,
//! when to renew, and what a call leaves is decided in the core. Times are nanoseconds on
//! the shell's monotonic clock (`time.monotonic_ns()`).
//!
//! No lock here: the shell calls it under its own (which its fork handler replaces in a
//! child). Each method is one whole transition and never lets go of the GIL.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use rl_client_core::budget::Backend;
use rl_client_core::lease::LeaseTarget;
use rl_client_core::prefetch::{
    Begin, Failure, Judged, Landed, Lease, Ledger as CoreLedger, LedgerConfig, LedgerCounters,
    Local,
};
use rl_client_core::Reply;

use crate::budget::protocol_error;
use crate::guard::guarded;
use crate::reply::to_reply;

pub(crate) fn backend(name: &str) -> PyResult<Backend> {
    match name {
        "module" => Ok(Backend::Module),
        "functions" => Ok(Backend::Functions),
        other => Err(PyValueError::new_err(format!(
            "backend {other:?}: 'module' or 'functions'"
        ))),
    }
}

fn pairs(leases: &[Lease]) -> Vec<(u64, u64)> {
    leases.iter().map(|l| (l.id, l.left)).collect()
}

fn counters<'py>(py: Python<'py>, c: LedgerCounters) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    for (k, v) in [
        ("leases", c.leases),
        ("lease_tokens", c.lease_tokens),
        ("leases_denied", c.leases_denied),
        ("leases_expired", c.leases_expired),
        ("leases_lost", c.leases_lost),
        ("returns", c.returns),
        ("tokens_returned", c.tokens_returned),
        ("slow_calls", c.slow_calls),
        ("memory_grants", c.memory_grants),
        ("memory_tokens", c.memory_tokens),
    ] {
        d.set_item(k, v)?;
    }
    Ok(d)
}

/// What `begin` answers: `(kind, flight, command)`.
type Began<'py> = (&'static str, u64, Option<Vec<Bound<'py, PyBytes>>>);

/// What `landed` answers: `(kind, served, value, give_back)`.
type Landing = (&'static str, bool, u64, Vec<(u64, u64)>);

/// One prefetching limiter's lease ledger.
#[pyclass(module = "redis_rl._core")]
pub struct Ledger {
    inner: CoreLedger,
}

#[pymethods]
impl Ledger {
    #[new]
    #[pyo3(signature = (key, rate, cap, batch, ttl_ms, renew_at, jitter, timeout, init=None, version=None))]
    #[allow(clippy::too_many_arguments)] // the limiter's settings, named
    fn new(
        key: &str,
        rate: f64,
        cap: f64,
        batch: u64,
        ttl_ms: u64,
        renew_at: f64,
        jitter: f64,
        timeout: Option<f64>,
        init: Option<f64>,
        version: Option<u64>,
    ) -> PyResult<Ledger> {
        guarded(|| {
            let timeout = match timeout {
                None => 0,
                Some(t) if t.is_finite() && t >= 0.0 => (t * 1e9).min(u64::MAX as f64) as u64,
                Some(_) => return Err(PyValueError::new_err("timeout must be positive seconds")),
            };
            CoreLedger::new(
                LeaseTarget {
                    key: key.as_bytes().to_vec(),
                    rate,
                    cap,
                    init,
                    version,
                },
                LedgerConfig {
                    batch,
                    ttl_ms,
                    renew_at,
                    jitter,
                    timeout,
                },
            )
            .map(|inner| Ledger { inner })
            .map_err(PyValueError::new_err)
        })
    }

    /// The take from memory: `left` after granting `n`, or `None` (nothing changed: `take`
    /// decides). The hot path: one call, no allocation.
    fn grant(&mut self, n: u64, now: u64) -> PyResult<Option<u64>> {
        guarded(|| Ok(self.inner.grant(n, now)))
    }

    /// `("granted", left, renew)`, `("denied", retry_after_ms, False)` or `("ask", 0, False)`.
    fn take(&mut self, n: u64, now: u64, down: bool) -> PyResult<(&'static str, u64, bool)> {
        guarded(|| {
            Ok(match self.inner.take(n, now, down) {
                Local::Granted { left, renew } => ("granted", left, renew),
                Local::Denied { retry_after_ms } => ("denied", retry_after_ms, false),
                Local::Ask => ("ask", 0, false),
            })
        })
    }

    fn renewal_due(&self, now: u64, down: bool) -> PyResult<bool> {
        guarded(|| Ok(self.inner.renewal_due(now, down)))
    }

    fn unspend(&mut self, tokens: u64, now: u64) -> PyResult<()> {
        guarded(|| {
            self.inner.unspend(tokens, now);
            Ok(())
        })
    }

    /// `("send", flight, command)`, `("busy", flight, None)` or `("closed", 0, None)`.
    fn begin<'py>(
        &mut self,
        py: Python<'py>,
        backend_name: &str,
        need: u64,
        now: u64,
    ) -> PyResult<Began<'py>> {
        guarded(|| {
            Ok(match self.inner.begin(backend(backend_name)?, need, now) {
                Begin::Send { flight, command } => (
                    "send",
                    flight,
                    Some(command.iter().map(|a| PyBytes::new(py, a)).collect()),
                ),
                Begin::Busy { flight } => ("busy", flight, None),
                Begin::Closed => ("closed", 0, None),
            })
        })
    }

    /// `(kind, served, value, give_back)`: kind `granted` (value: tokens held after),
    /// `denied` (value: retry_after_ms), `stale` or `closed`; `give_back`: `[(id, left)]`
    /// to return. A malformed reply raises `ProtocolError`.
    fn landed(
        slf: &Bound<'_, Self>,
        flight: u64,
        reply: &Bound<'_, PyAny>,
        now: u64,
        draw: f64,
    ) -> PyResult<Landing> {
        let py = slf.py();
        guarded(|| {
            // Read before the ledger is borrowed: reading a reply may run Python code (an
            // exception's `__str__`), which may let another thread in.
            let read = to_reply(reply);
            let mut this = slf.borrow_mut();
            let landing = match read {
                Ok(r) => this.inner.landed(flight, &r, now, draw),
                Err(e) => {
                    // Not a Redis reply at all: the call is ended as a malformed one all the
                    // same (its settled lease gone, its lease unknown).
                    let _ = this.inner.landed(flight, &Reply::Nil, now, draw);
                    Err(e)
                }
            }
            .map_err(|e| protocol_error(py, e))?;
            let back = pairs(&landing.give_back);
            Ok(match landing.landed {
                Landed::Granted { served, left } => ("granted", served, left, back),
                Landed::Denied { retry_after_ms } => ("denied", false, retry_after_ms, back),
                Landed::Stale => ("stale", false, 0, back),
                Landed::Closed => ("closed", false, 0, back),
            })
        })
    }

    /// A failed call: `kind` is `refused` (an error reply), `not_sent` or `unknown`; answers
    /// `[(id, left)]` to return.
    fn failed(&mut self, flight: u64, kind: &str, now: u64) -> PyResult<Vec<(u64, u64)>> {
        guarded(|| {
            let failure = match kind {
                "refused" => Failure::Refused,
                "not_sent" => Failure::NotSent,
                "unknown" => Failure::Unknown,
                other => {
                    return Err(PyValueError::new_err(format!(
                        "failure {other:?}: refused, not_sent or unknown"
                    )))
                }
            };
            Ok(pairs(&self.inner.failed(flight, failure, now)))
        })
    }

    fn give_up(&mut self, flight: u64) -> PyResult<Option<u64>> {
        guarded(|| Ok(self.inner.give_up(flight)))
    }

    fn claim(&mut self, flight: u64) -> PyResult<Option<u64>> {
        guarded(|| Ok(self.inner.claim(flight)))
    }

    fn release(&mut self, flight: u64, claimed: bool, now: u64) -> PyResult<()> {
        guarded(|| {
            self.inner.release(flight, claimed, now);
            Ok(())
        })
    }

    fn has_ended(&self, flight: u64) -> PyResult<bool> {
        guarded(|| Ok(self.inner.has_ended(flight)))
    }

    /// `wait`, `ended`, `outage_first` or `outage`.
    fn judge(&mut self, flight: u64, now: u64, limit: u64) -> PyResult<&'static str> {
        guarded(|| {
            Ok(match self.inner.judge(flight, now, limit) {
                Judged::Wait => "wait",
                Judged::Ended => "ended",
                Judged::Outage { first: true } => "outage_first",
                Judged::Outage { first: false } => "outage",
            })
        })
    }

    fn close(&mut self, now: u64) -> PyResult<Vec<(u64, u64)>> {
        guarded(|| Ok(pairs(&self.inner.close(now))))
    }

    fn closed(&self) -> bool {
        self.inner.closed()
    }

    fn forget(&mut self) -> PyResult<()> {
        guarded(|| {
            self.inner.forget();
            Ok(())
        })
    }

    fn held(&mut self, now: u64) -> PyResult<u64> {
        guarded(|| Ok(self.inner.held(now)))
    }

    fn in_flight(&self) -> bool {
        self.inner.in_flight()
    }

    fn calls_ended(&self) -> u64 {
        self.inner.calls_ended()
    }

    /// How long a lease call's reply is awaited, in nanoseconds.
    fn late_bound(&self) -> u64 {
        self.inner.late_bound()
    }

    fn return_command<'py>(
        &self,
        py: Python<'py>,
        backend_name: &str,
        lease_id: u64,
        left: u64,
    ) -> PyResult<Vec<Bound<'py, PyBytes>>> {
        guarded(|| {
            let lease = Lease {
                id: lease_id,
                left,
                expires: 0,
            };
            let args = self.inner.return_of(backend(backend_name)?, &lease);
            Ok(args.iter().map(|a| PyBytes::new(py, a)).collect())
        })
    }

    fn returned(&mut self, lease_id: u64, left: u64, ok: bool) -> PyResult<()> {
        guarded(|| {
            let lease = Lease {
                id: lease_id,
                left,
                expires: 0,
            };
            self.inner.returned(&lease, ok);
            Ok(())
        })
    }

    #[pyo3(signature = (n, front, again=None))]
    fn enter_line(&mut self, n: u64, front: bool, again: Option<u64>) -> PyResult<u64> {
        guarded(|| Ok(self.inner.enter_line(n, front, again)))
    }

    fn leave_line(&mut self, waiter: u64) -> PyResult<Option<u64>> {
        guarded(|| Ok(self.inner.leave_line(waiter)))
    }

    fn wake(&mut self, granted: bool) -> PyResult<Vec<u64>> {
        guarded(|| Ok(self.inner.wake(granted)))
    }

    /// Whether a counter moved since the last drain.
    fn counted(&self) -> bool {
        self.inner.counted()
    }

    /// The counters since the last drain (`dict`).
    fn counters<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        guarded(|| counters(py, self.inner.counters()))
    }

    /// The counters since the last drain, zeroed.
    fn drain<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        guarded(|| {
            let c = self.inner.drain();
            counters(py, c)
        })
    }
}

/// `RL.LEASE`'s reply as the core reads it: `(granted, lease_id, ttl_ms, retry_after_ms)`;
/// else `ProtocolError`.
#[pyfunction]
fn parse_lease(py: Python<'_>, reply: &Bound<'_, PyAny>) -> PyResult<(u64, u64, u64, u64)> {
    guarded(|| {
        let r = to_reply(reply)
            .and_then(|r| rl_client_core::lease::parse_lease(&r))
            .map_err(|e| protocol_error(py, e))?;
        Ok((r.tokens, r.id, r.ttl_ms, r.retry_after_ms))
    })
}

/// `RL.LEASE`'s arguments as the core builds them (`redis_rl.Protocol.lease`).
#[pyfunction]
#[pyo3(signature = (backend_name, key, rate, cap, n, ttl_ms, min, settle=None, init=None, version=None))]
#[allow(clippy::too_many_arguments)] // the command's own arguments, named
fn lease_command<'py>(
    py: Python<'py>,
    backend_name: &str,
    key: &str,
    rate: f64,
    cap: f64,
    n: u64,
    ttl_ms: u64,
    min: u64,
    settle: Option<(u64, u64)>,
    init: Option<f64>,
    version: Option<u64>,
) -> PyResult<Vec<Bound<'py, PyBytes>>> {
    guarded(|| {
        let target = LeaseTarget {
            key: key.as_bytes().to_vec(),
            rate,
            cap,
            init,
            version,
        };
        let args = rl_client_core::lease::lease_command(
            backend(backend_name)?,
            &target,
            n,
            ttl_ms,
            min,
            settle,
        );
        Ok(args.iter().map(|a| PyBytes::new(py, a)).collect())
    })
}

/// `RL.RETURN`'s arguments as the core builds them (`redis_rl.Protocol.return_`).
#[pyfunction]
fn return_command<'py>(
    py: Python<'py>,
    backend_name: &str,
    key: &str,
    lease_id: u64,
    unused: u64,
) -> PyResult<Vec<Bound<'py, PyBytes>>> {
    guarded(|| {
        let args = rl_client_core::lease::return_command(
            backend(backend_name)?,
            key.as_bytes(),
            lease_id,
            unused,
        );
        Ok(args.iter().map(|a| PyBytes::new(py, a)).collect())
    })
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Ledger>()?;
    m.add_function(wrap_pyfunction!(lease_command, m)?)?;
    m.add_function(wrap_pyfunction!(return_command, m)?)?;
    m.add_function(wrap_pyfunction!(parse_lease, m)?)?;
    Ok(())
}
