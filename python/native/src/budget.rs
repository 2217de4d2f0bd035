//! Token budgets (`redis_rl.TokenBudget`): the client core's [`TokenBudget`] under Python.
//! Python sends the commands it is handed, waits, and hands the replies back; what a
//! reservation gets, from Redis or from the failure policy, is decided in the core.
//!
//! The objects hold no lock: the Python shell calls them under its own (which its fork
//! handler replaces in a child).

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use rl_client_core::budget::{Backend, Settled};
use rl_client_core::token_budget::{
    FailurePolicy, Grant, SettleStep, Source, Ticket as CoreTicket, TokenBudget,
};
use rl_client_core::ProtocolError;

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

/// The package's `ProtocolError` (a `ServerError`: raised to the caller, never decided by
/// the failure policy).
pub(crate) fn protocol_error(py: Python<'_>, e: ProtocolError) -> PyErr {
    match py
        .import("redis_rl.errors")
        .and_then(|m| m.getattr("ProtocolError"))
    {
        Ok(cls) => PyErr::from_value(
            cls.call1((e.to_string(),))
                .unwrap_or_else(|err| err.into_value(py).into_bound(py).into_any()),
        ),
        Err(err) => err,
    }
}

fn args<'py>(py: Python<'py>, args: Vec<Vec<u8>>) -> Vec<Bound<'py, PyBytes>> {
    args.iter().map(|a| PyBytes::new(py, a)).collect()
}

fn signed(results: &[Settled]) -> Vec<Option<i64>> {
    results.iter().map(|r| r.signed()).collect()
}

/// What settles one grant (opaque to Python).
#[pyclass(module = "redis_rl._core")]
pub struct Ticket {
    inner: CoreTicket,
}

#[pymethods]
impl Ticket {
    /// Whether a settle still has something to close.
    fn open(&self) -> bool {
        match &self.inner {
            CoreTicket::Nothing => false,
            CoreTicket::Server(r) => r.open(),
            CoreTicket::Local { settled, .. } => !settled,
        }
    }
}

/// A grant as `(granted, retry_after_ms, denied_by, remaining, source, ticket)`.
type GrantTuple = (
    bool,
    u64,
    Option<usize>,
    Option<Vec<f64>>,
    &'static str,
    Ticket,
);

fn grant(g: Grant) -> GrantTuple {
    let source = match g.source {
        Source::Server => "server",
        Source::Fallback => "fallback",
    };
    (
        g.granted,
        g.retry_after_ms,
        g.denied_by,
        g.remaining,
        source,
        Ticket { inner: g.ticket },
    )
}

/// One budget's decisions.
#[pyclass(module = "redis_rl._core")]
pub struct Budget {
    inner: TokenBudget,
}

#[pymethods]
impl Budget {
    #[new]
    fn new(
        key: &str,
        limits: Vec<(String, f64, f64)>,
        ttl_ms: u64,
        policy: &str,
        share: Option<f64>,
    ) -> PyResult<Budget> {
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
            let limits: Vec<(&str, f64, f64)> = limits
                .iter()
                .map(|(n, r, c)| (n.as_str(), *r, *c))
                .collect();
            TokenBudget::new(key, &limits, ttl_ms, policy, share)
                .map(|inner| Budget { inner })
                .map_err(PyValueError::new_err)
        })
    }

    /// `[(name, key, rate, cap)]`.
    fn limits(&self) -> Vec<(String, String, f64, f64)> {
        self.inner
            .limits()
            .iter()
            .map(|l| {
                (
                    l.name.clone(),
                    String::from_utf8_lossy(&l.key).into_owned(),
                    l.limit.rate(),
                    l.limit.cap(),
                )
            })
            .collect()
    }

    /// Each limit's cost: `tokens` for a budget of one token limit, or `named` costs.
    #[pyo3(signature = (tokens, named))]
    fn costs(&self, tokens: Option<u64>, named: Vec<(String, u64)>) -> PyResult<Vec<u64>> {
        guarded(|| {
            let named: Vec<(&str, u64)> = named.iter().map(|(n, c)| (n.as_str(), *c)).collect();
            self.inner
                .costs(tokens, &named)
                .map_err(PyValueError::new_err)
        })
    }

    fn reserve_command<'py>(
        &self,
        py: Python<'py>,
        backend_name: &str,
        costs: Vec<u64>,
    ) -> PyResult<Vec<Bound<'py, PyBytes>>> {
        guarded(|| {
            self.check(&costs)?;
            Ok(args(
                py,
                self.inner.reserve_command(backend(backend_name)?, &costs),
            ))
        })
    }

    /// The decision Redis's reply makes; `ProtocolError` if it is malformed.
    fn reserved(
        &mut self,
        py: Python<'_>,
        costs: Vec<u64>,
        reply: &Bound<'_, PyAny>,
    ) -> PyResult<GrantTuple> {
        guarded(|| {
            self.check(&costs)?;
            let reply = to_reply(reply).map_err(|e| protocol_error(py, e))?;
            self.inner
                .reserved(&costs, &reply)
                .map(grant)
                .map_err(|e| protocol_error(py, e))
        })
    }

    /// The failure policy's decision while Redis does not answer, at `now_ns` (monotonic).
    fn outage(&mut self, costs: Vec<u64>, now_ns: u64) -> PyResult<GrantTuple> {
        guarded(|| {
            self.check(&costs)?;
            Ok(grant(self.inner.outage(&costs, now_ns)))
        })
    }

    /// `("send", args)`, `("done", results)` or `("nothing", None)`.
    fn settle<'py>(
        &mut self,
        py: Python<'py>,
        backend_name: &str,
        mut ticket: PyRefMut<'_, Ticket>,
        actual: Vec<Option<u64>>,
        now_ns: u64,
    ) -> PyResult<(&'static str, Py<PyAny>)> {
        guarded(|| {
            let b = backend(backend_name)?;
            Ok(
                match self.inner.settle(b, &mut ticket.inner, &actual, now_ns) {
                    SettleStep::Send(a) => {
                        ("send", args(py, a).into_pyobject(py)?.into_any().unbind())
                    }
                    SettleStep::Done(r) => {
                        ("done", signed(&r).into_pyobject(py)?.into_any().unbind())
                    }
                    SettleStep::Nothing => ("nothing", py.None()),
                },
            )
        })
    }

    /// Each limit's result from Redis's reply to a settle: tokens back (positive), charged
    /// (negative), or `None` (nothing there to settle).
    fn settled(&mut self, py: Python<'_>, reply: &Bound<'_, PyAny>) -> PyResult<Vec<Option<i64>>> {
        guarded(|| {
            let reply = to_reply(reply).map_err(|e| protocol_error(py, e))?;
            self.inner
                .settled(&reply)
                .map(|r| signed(&r))
                .map_err(|e| protocol_error(py, e))
        })
    }

    fn settle_lost(&mut self) {
        self.inner.settle_lost()
    }

    /// The counters, by name.
    fn counters(&self) -> Vec<(&'static str, u64)> {
        let c = self.inner.counters();
        vec![
            ("granted", c.budget.granted),
            ("denied", c.budget.denied),
            ("reserved_tokens", c.budget.reserved_tokens),
            ("settled", c.budget.settled),
            ("refunded_tokens", c.budget.tokens_back),
            ("overage_tokens", c.budget.tokens_overage),
            ("unmatched", c.budget.unmatched),
            ("fallback_granted", c.fallback_granted),
            ("fallback_denied", c.fallback_denied),
            ("outages", c.outages),
            ("settles_lost", c.settles_lost),
        ]
    }
}

impl Budget {
    /// Costs made by `costs()`: one per limit (anything else is a bug of the shell).
    fn check(&self, costs: &[u64]) -> PyResult<()> {
        if costs.len() != self.inner.limits().len() || costs.contains(&0) {
            return Err(PyRuntimeError::new_err(
                "redis_rl internal error (please report it): costs not made by Budget.costs",
            ));
        }
        Ok(())
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Budget>()?;
    m.add_class::<Ticket>()?;
    Ok(())
}
