//! Share limiters (`redis_rl.ShareLimiter`, `AsyncShareLimiter`): the client core's share
//! holder under Python, in its two halves. [`ShareHolder`] is the takers' side: one call per
//! take, which answers the finished `Decision` (no Python arithmetic around it), and counts
//! the grants it serves from the share for the package's `Metrics` to drain when read.
//! [`ShareRefresh`] is the refresh side: the next `RL.SHARE`, its reply, when to call again.
//! What the refresh saw goes to the takers as [`ShareEvent`]s, through the shell's mailbox.
//!
//! The objects hold no lock: the Python shell calls each under its own (its fork handler
//! replaces them in a child), or alone under the GIL. No borrow is held across a call into
//! Python or while a Python object is made (an allocation may run the garbage collector, a
//! finalizer, another thread), so another thread always finds every object free.

use pyo3::exceptions::PyValueError;
use pyo3::gc::{PyTraverseError, PyVisit};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyInt, PyTuple};

use rl_client_core::budget::Backend;
use rl_client_core::share::{self as core, FailurePolicy, PinKind, Policy, ShareKey, MS};
use rl_client_core::share_holder::{Event, Holder, Refresh};

use crate::budget::protocol_error;
use crate::guard::guarded;
use crate::reply::to_reply;

fn backend(name: &str) -> PyResult<Backend> {
    match name {
        "module" => Ok(Backend::Module),
        "functions" => Ok(Backend::Functions),
        other => Err(PyValueError::new_err(format!(
            "backend {other:?}: 'module' or 'functions'"
        ))),
    }
}

fn pin_name(kind: Option<PinKind>) -> Option<&'static str> {
    kind.map(|k| k.name())
}

/// `(rate, burst, tokens, holders, fallback, pinned)`.
type InfoTuple = (f64, f64, f64, u64, bool, Option<&'static str>);
/// `(rate, burst, lease_ms, refresh_ms, holders, pinned)`.
type ShareTuple = (f64, f64, u64, u64, u64, Option<&'static str>);

fn args<'py>(py: Python<'py>, args: Vec<Vec<u8>>) -> Vec<Bound<'py, PyBytes>> {
    args.iter().map(|a| PyBytes::new(py, a)).collect()
}

/// What the refresh side saw, for the takers' side (opaque to Python but for its kind).
#[pyclass(module = "redis_rl._core", frozen)]
pub struct ShareEvent {
    inner: Event,
}

#[pymethods]
impl ShareEvent {
    /// `"sending"`, `"answered"`, `"outage"` or `"failed"`.
    #[getter]
    fn kind(&self) -> &'static str {
        match self.inner {
            Event::Sending { .. } => "sending",
            Event::Answered { .. } => "answered",
            Event::Outage { .. } => "outage",
            Event::Failed => "failed",
        }
    }

    fn __repr__(&self) -> String {
        format!("ShareEvent({:?})", self.inner)
    }
}

/// The Python objects a decision is made of, given once.
struct Objects {
    /// `tuple.__new__`, to make a `Decision` without its Python-level `__new__`.
    tuple_new: Py<PyAny>,
    decision: Py<PyAny>,
    share: Py<PyAny>,
    fallback: Py<PyAny>,
    metrics: Py<PyAny>,
    block: Py<PyAny>,
    exempt: Py<PyAny>,
    rate: Py<PyAny>,
}

/// The takers' side of one holder.
#[pyclass(module = "redis_rl._core")]
pub struct ShareHolder {
    inner: Holder,
    cap: f64,
    objects: Option<Objects>,
    /// Takes granted from the share since the last drain: `(calls, granted, tokens)`.
    pending: (u64, u64, u64),
}

#[pymethods]
impl ShareHolder {
    /// `policy`: `"allow"`, `"last_known"` or `"deny"`; durations in nanoseconds; `now` on
    /// `time.monotonic_ns()`. `decision`, `share`, `fallback`: the `Decision` class and the
    /// two `Source`s; `metrics`: where every decision not served from the share is counted
    /// as it happens (`Metrics.decided`).
    #[new]
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (policy, allow_share, rate, cap, instances, allow_for_ns, period_ns, deny_retry_after_ns, now, decision, share, fallback, metrics))]
    fn new(
        py: Python<'_>,
        policy: &str,
        allow_share: f64,
        rate: f64,
        cap: f64,
        instances: u64,
        allow_for_ns: u64,
        period_ns: u64,
        deny_retry_after_ns: u64,
        now: u64,
        decision: Py<PyAny>,
        share: Py<PyAny>,
        fallback: Py<PyAny>,
        metrics: Py<PyAny>,
    ) -> PyResult<ShareHolder> {
        guarded(|| {
            let policy = match policy {
                "allow" => FailurePolicy::Allow,
                "last_known" => FailurePolicy::LastKnown,
                "deny" => FailurePolicy::Deny,
                other => {
                    return Err(PyValueError::new_err(format!(
                        "failure policy {other:?}: allow, last_known or deny"
                    )))
                }
            };
            let finite = |x: f64| x.is_finite() && x >= 0.0;
            if !(finite(rate) && finite(cap) && finite(allow_share)) {
                return Err(PyValueError::new_err(
                    "rate, cap and the policy's share must be finite numbers, at least 0",
                ));
            }
            let policy = Policy {
                policy,
                allow_share,
                rate,
                cap,
                instances,
                allow_for: allow_for_ns,
            };
            let name = |s: &str| pyo3::types::PyString::new(py, s).into_any().unbind();
            let objects = Objects {
                tuple_new: py.get_type::<PyTuple>().getattr("__new__")?.unbind(),
                decision,
                share,
                fallback,
                metrics,
                block: name("block"),
                exempt: name("exempt"),
                rate: name("rate"),
            };
            Ok(ShareHolder {
                inner: Holder::new(policy, period_ns, deny_retry_after_ns, now),
                cap,
                objects: Some(objects),
                pending: (0, 0, 0),
            })
        })
    }

    /// Decides on `n` tokens at `now`: the `Decision`, or `None` when the last call was
    /// answered with an error reply and no share may be used (the shell raises it, and
    /// counts it). `n` not a positive int, or above the cap: `ValueError`, nothing counted.
    /// One call per take, atomic under the GIL: the borrow ends before anything is
    /// allocated (an allocation may run the garbage collector, and a finalizer another
    /// thread, which must find the holder free).
    fn take(slf: &Bound<'_, Self>, n: &Bound<'_, PyAny>, now: u64) -> PyResult<Option<Py<PyAny>>> {
        let py = slf.py();
        guarded(|| {
            let n = count(n)?;
            let (take, cap, new, decision, source, pinned, metrics) = {
                let mut me = slf.borrow_mut();
                if n as f64 > me.cap {
                    return Err(PyValueError::new_err(
                        "n must not exceed cap (it could never be granted)",
                    ));
                }
                let Some(take) = me.inner.take(n, now) else {
                    return Ok(None);
                };
                let served = take.allowed && !take.fallback;
                if served {
                    let p = &mut me.pending;
                    p.0 += 1;
                    p.1 += 1;
                    p.2 += n;
                }
                let Some(o) = &me.objects else {
                    return Err(PyValueError::new_err("a cleared share holder"));
                };
                let source = if take.fallback { &o.fallback } else { &o.share };
                let pinned = match take.pinned {
                    None => None,
                    Some(PinKind::Block) => Some(o.block.clone_ref(py)),
                    Some(PinKind::Exempt) => Some(o.exempt.clone_ref(py)),
                    Some(PinKind::Rate) => Some(o.rate.clone_ref(py)),
                };
                (
                    take,
                    me.cap,
                    o.tuple_new.clone_ref(py),
                    o.decision.clone_ref(py),
                    source.clone_ref(py),
                    pinned,
                    (!served).then(|| o.metrics.clone_ref(py)),
                )
            };
            let fields = (
                take.allowed,
                take.remaining,
                take.retry_after_ms(),
                take.reset_after_ms(),
                take.tokens,
                cap,
                source,
                pinned,
            );
            let d = new.call1(py, (decision, fields))?;
            if let Some(metrics) = metrics {
                metrics.call_method1(
                    py,
                    "decided",
                    (take.allowed, take.tokens, take.fallback, 1),
                )?;
            }
            Ok(Some(d))
        })
    }

    /// Applies what the refresh side saw.
    fn apply(&mut self, event: &ShareEvent) -> PyResult<()> {
        guarded(|| {
            self.inner.apply(&event.inner);
            Ok(())
        })
    }

    /// `(rate, burst, tokens, holders, fallback, pinned)` at `now`.
    fn info(slf: &Bound<'_, Self>, now: u64) -> PyResult<InfoTuple> {
        guarded(|| {
            let i = slf.borrow_mut().inner.info(now);
            Ok((
                i.rate,
                i.burst,
                i.tokens,
                i.holders,
                i.fallback,
                pin_name(i.pinned),
            ))
        })
    }

    /// Tokens asked for so far (granted or denied).
    fn attempted(slf: &Bound<'_, Self>) -> u64 {
        slf.borrow().inner.attempted()
    }

    /// A new holder at `now` (a forked child, a closed limiter); the counts pending stay.
    fn reset(&mut self, now: u64) -> PyResult<()> {
        guarded(|| {
            self.inner.reset(now);
            Ok(())
        })
    }

    /// `(calls, granted, tokens_granted)` served from the share since the last drain.
    fn drain(slf: &Bound<'_, Self>) -> (u64, u64, u64) {
        std::mem::take(&mut slf.borrow_mut().pending)
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        if let Some(o) = &self.objects {
            for obj in [&o.decision, &o.share, &o.fallback, &o.metrics, &o.tuple_new] {
                visit.call(obj)?;
            }
        }
        Ok(())
    }

    fn __clear__(&mut self) {
        self.objects = None;
    }
}

/// A take's `n`: a positive `int` (not a `bool`).
fn count(n: &Bound<'_, PyAny>) -> PyResult<u64> {
    let bad = || PyValueError::new_err("n must be a positive integer");
    if n.is_instance_of::<PyBool>() || !n.is_instance_of::<PyInt>() {
        return Err(bad());
    }
    match n.extract::<i64>() {
        Ok(i) if i >= 1 => Ok(i as u64),
        Ok(_) => Err(bad()),
        // Beyond 64 bits: above any cap.
        Err(_) if n.gt(0)? => Err(PyValueError::new_err(
            "n must not exceed cap (it could never be granted)",
        )),
        Err(_) => Err(bad()),
    }
}

/// The refresh side of one holder.
#[pyclass(module = "redis_rl._core")]
pub struct ShareRefresh {
    inner: Refresh,
}

#[pymethods]
impl ShareRefresh {
    #[new]
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (key, rate, cap, period_ms, version, headroom, now))]
    fn new(
        key: &str,
        rate: f64,
        cap: f64,
        period_ms: u64,
        version: Option<u64>,
        headroom: f64,
        now: u64,
    ) -> PyResult<ShareRefresh> {
        guarded(|| {
            if !(headroom.is_finite() && headroom >= 0.0) {
                return Err(PyValueError::new_err(
                    "headroom must be a finite number, at least 0",
                ));
            }
            if !(rate.is_finite() && rate > 0.0 && cap.is_finite() && cap > 0.0) {
                return Err(PyValueError::new_err(
                    "rate and cap must be finite numbers above 0",
                ));
            }
            let key = ShareKey {
                key: key.as_bytes().to_vec(),
                rate,
                cap,
                period_ms,
                version,
            };
            Ok(ShareRefresh {
                inner: Refresh::new(key, headroom, now),
            })
        })
    }

    /// The call to send at `now` for `holder` (the takers asked for `attempted` so far),
    /// and the event the takers apply first.
    fn send<'py>(
        slf: &Bound<'py, Self>,
        backend_name: &str,
        holder: &str,
        attempted: u64,
        now: u64,
    ) -> PyResult<(Vec<Bound<'py, PyBytes>>, ShareEvent)> {
        let py = slf.py();
        guarded(|| {
            let backend = backend(backend_name)?;
            let (cmd, event) =
                slf.borrow_mut()
                    .inner
                    .send(backend, holder.as_bytes(), attempted, now);
            Ok((args(py, cmd), ShareEvent { inner: event }))
        })
    }

    /// `RL.SHARE ... RELEASE` for `holder`.
    fn release_command<'py>(
        slf: &Bound<'py, Self>,
        backend_name: &str,
        holder: &str,
    ) -> PyResult<Vec<Bound<'py, PyBytes>>> {
        let py = slf.py();
        guarded(|| {
            let backend = backend(backend_name)?;
            let cmd = slf
                .borrow()
                .inner
                .release_command(backend, holder.as_bytes());
            Ok(args(py, cmd))
        })
    }

    /// The reply to the call sent at `sent` came at `at`: `(event, next_ns)`; a reply that
    /// is not `RL.SHARE`'s raises `ProtocolError` and changes nothing.
    fn answered(
        slf: &Bound<'_, Self>,
        reply: &Bound<'_, PyAny>,
        sent: u64,
        at: u64,
        jitter: f64,
    ) -> PyResult<(ShareEvent, u64)> {
        let py = slf.py();
        guarded(|| {
            // Read before borrowing: reading may run Python code (an error's `__str__`).
            let reply = to_reply(reply).map_err(|e| protocol_error(py, e))?;
            let answered = slf.borrow_mut().inner.answered(&reply, sent, at, jitter);
            let (event, next) = answered.map_err(|e| protocol_error(py, e))?;
            Ok((ShareEvent { inner: event }, next))
        })
    }

    /// The call was an outage at `at` (`refused`: it never left): `(event, next_ns)`.
    fn outage(
        slf: &Bound<'_, Self>,
        refused: bool,
        at: u64,
        probe_ns: u64,
    ) -> PyResult<(ShareEvent, u64)> {
        guarded(|| {
            let (event, next) = slf.borrow_mut().inner.outage(refused, at, probe_ns);
            Ok((ShareEvent { inner: event }, next))
        })
    }

    /// The call was answered with an error reply: `(event, next_ns)`.
    fn failed(slf: &Bound<'_, Self>) -> PyResult<(ShareEvent, u64)> {
        guarded(|| {
            let (event, next) = slf.borrow_mut().inner.failed();
            Ok((ShareEvent { inner: event }, next))
        })
    }

    /// Whether to call early, at `now`, with `attempted` asked for so far.
    fn drifted(&mut self, now: u64, attempted: u64) -> PyResult<bool> {
        guarded(|| Ok(self.inner.drifted(now, attempted)))
    }

    /// A new holder at `now` whose takers asked for `attempted` so far.
    fn reset(&mut self, now: u64, attempted: u64) -> PyResult<()> {
        guarded(|| {
            self.inner.reset(now, attempted);
            Ok(())
        })
    }
}

/// `RL.SHARE`'s reply read: `(rate, burst, lease_ms, refresh_ms, holders, pinned)`, or
/// `ProtocolError`.
#[pyfunction]
fn parse_share(py: Python<'_>, reply: &Bound<'_, PyAny>) -> PyResult<ShareTuple> {
    guarded(|| {
        let reply = to_reply(reply).map_err(|e| protocol_error(py, e))?;
        let g = core::parse_share(&reply).map_err(|e| protocol_error(py, e))?;
        Ok((
            g.rate,
            g.burst,
            g.lease / MS,
            g.refresh / MS,
            g.holders,
            pin_name(g.pinned),
        ))
    })
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<ShareEvent>()?;
    m.add_class::<ShareHolder>()?;
    m.add_class::<ShareRefresh>()?;
    m.add_function(wrap_pyfunction!(parse_share, m)?)?;
    m.add(
        "SHARE_DRIFT_TICK_NS",
        rl_client_core::share_holder::DRIFT_TICK,
    )?;
    Ok(())
}
