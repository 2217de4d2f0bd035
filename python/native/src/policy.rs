//! The failure policy (`redis_rl.policy.Fallback`, `redis_rl.policy.Health`): the client
//! core's [`Fallback`](CoreFallback) and [`Health`](CoreHealth) under Python. The Python
//! classes subclass these, so a limiter's hot path (`observe` on every grant, `down_until`
//! on every take) is one call into Rust, not a Python frame around one.
//!
//! Time: every method takes `now_ns`, nanoseconds on the caller's monotonic clock, or
//! `None` for the extension's own (one object, one clock: the package's limiters always
//! pass `None`, the golden cases always a time). No lock: a `Fallback` method runs whole
//! under the GIL (nothing in it calls back into Python), and `Health` is one atomic.

use std::sync::OnceLock;
use std::time::Instant;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use rl_client_core::fallback::{Fallback as CoreFallback, LocalDecision};
use rl_client_core::health::Health as CoreHealth;
use rl_client_core::token_budget::FailurePolicy;
use rl_core::{ceil_millis, Limit, Nanos};

use crate::guard::guarded;

/// Monotonic nanoseconds since the extension's first reading, never 0 (0 means "up" to
/// the health).
fn mono_ns() -> Nanos {
    static BASE: OnceLock<Instant> = OnceLock::new();
    let base = BASE.get_or_init(Instant::now);
    (base.elapsed().as_nanos().min(u64::MAX as u128) as u64).saturating_add(1)
}

fn at(now_ns: Option<u64>) -> Nanos {
    now_ns.unwrap_or_else(mono_ns)
}

fn limit(rate: f64, cap: f64) -> PyResult<Limit> {
    Limit::new(rate, cap).map_err(|e| {
        PyValueError::new_err(format!("limit ({rate}/s, burst {cap}): {}", e.message()))
    })
}

/// A local decision as `(granted, remaining, retry_after_ms, reset_after_ms, tokens)`.
type DecisionTuple = (bool, f64, u64, u64, u64);

fn tuple(d: &LocalDecision) -> DecisionTuple {
    (
        d.granted,
        d.remaining,
        ceil_millis(d.retry_after),
        ceil_millis(d.reset_after),
        d.tokens,
    )
}

/// Per-key local state of one limiter's failure policy.
#[pyclass(module = "redis_rl._core", subclass)]
pub struct Fallback {
    inner: CoreFallback,
}

#[pymethods]
impl Fallback {
    /// `policy`: `"allow"`, `"last_known"` or `"deny"`; `share`: this instance's part of
    /// the limit (`1 / instances`).
    #[new]
    #[pyo3(signature = (policy, rate, cap, share, deny_retry_after_ms, max_keys))]
    fn new(
        policy: &str,
        rate: f64,
        cap: f64,
        share: f64,
        deny_retry_after_ms: u64,
        max_keys: usize,
    ) -> PyResult<Fallback> {
        guarded(|| {
            let policy = match policy {
                "allow" => FailurePolicy::Allow,
                "last_known" => FailurePolicy::LastKnown,
                "deny" => FailurePolicy::Deny,
                other => {
                    return Err(PyValueError::new_err(format!(
                        "failure policy {other:?}: 'allow', 'last_known' or 'deny'"
                    )))
                }
            };
            let deny = deny_retry_after_ms.saturating_mul(1_000_000);
            CoreFallback::new(policy, limit(rate, cap)?, share, deny, max_keys)
                .map(|inner| Fallback { inner })
                .map_err(PyValueError::new_err)
        })
    }

    /// Redis answered a call on `key`: `granted` tokens (0: denied) and the bucket's
    /// `level` (`None`: a lease, which reports none).
    /// `granted` is taken as any number (a malformed reply's is the caller's to refuse;
    /// here a negative or not-a-number grant is none).
    #[pyo3(signature = (key, granted, level, now_ns = None))]
    fn observe(
        &mut self,
        key: &str,
        granted: f64,
        level: Option<f64>,
        now_ns: Option<u64>,
    ) -> PyResult<()> {
        guarded(|| {
            let granted = granted.max(0.0) as u64; // NaN: 0
            self.inner
                .observe(key.as_bytes(), granted, level, at(now_ns));
            Ok(())
        })
    }

    /// The policy's decision for `n` tokens of `key`.
    #[pyo3(signature = (key, n, now_ns = None))]
    fn decide_at(&mut self, key: &str, n: u64, now_ns: Option<u64>) -> PyResult<DecisionTuple> {
        guarded(|| Ok(tuple(&self.inner.decide(key.as_bytes(), n, at(now_ns)))))
    }

    /// The decision for `n` tokens of `key` under a per-call limit of `rate`, `cap`.
    #[pyo3(signature = (key, n, rate, cap, now_ns = None))]
    fn decide_with(
        &mut self,
        key: &str,
        n: u64,
        rate: f64,
        cap: f64,
        now_ns: Option<u64>,
    ) -> PyResult<DecisionTuple> {
        guarded(|| {
            let l = limit(rate, cap)?;
            Ok(tuple(&self.inner.decide_with(
                key.as_bytes(),
                n,
                l,
                at(now_ns),
            )))
        })
    }

    /// A reservation of `n` tokens of `key` waiting at most `max_wait_ms`; the retry slot
    /// is the wait before use when granted.
    #[pyo3(signature = (key, n, max_wait_ms, now_ns = None))]
    fn reserve(
        &mut self,
        key: &str,
        n: u64,
        max_wait_ms: u64,
        now_ns: Option<u64>,
    ) -> PyResult<DecisionTuple> {
        guarded(|| {
            let wait = max_wait_ms.saturating_mul(1_000_000);
            Ok(tuple(&self.inner.reserve(
                key.as_bytes(),
                n,
                wait,
                at(now_ns),
            )))
        })
    }

    /// The rate Redis was measured granting `key` (`None`: no history, or not measured).
    fn observed_rate(&self, key: &str) -> PyResult<Option<f64>> {
        guarded(|| Ok(self.inner.observed_rate(key.as_bytes())))
    }

    /// How many keys hold local state.
    fn keys(&self) -> PyResult<usize> {
        guarded(|| Ok(self.inner.keys()))
    }
}

/// Whether Redis is believed up, and who may probe it while it is down.
#[pyclass(module = "redis_rl._core", subclass, frozen)]
pub struct Health {
    inner: CoreHealth,
}

#[pymethods]
impl Health {
    #[new]
    fn new(probe_interval_ns: u64) -> PyResult<Health> {
        guarded(|| {
            Ok(Health {
                inner: CoreHealth::new(probe_interval_ns),
            })
        })
    }

    /// The instant of the next probe on the health's clock; 0 while Redis is up.
    #[getter]
    fn down_until(&self) -> PyResult<u64> {
        guarded(|| Ok(self.inner.down_until()))
    }

    /// Whether this caller may ask Redis: always while up; while down, the one caller
    /// per probe interval that probes.
    #[pyo3(signature = (now_ns = None))]
    fn may_call(&self, now_ns: Option<u64>) -> PyResult<bool> {
        guarded(|| Ok(self.inner.may_call(at(now_ns))))
    }

    /// A call failed (an outage): decide locally until the next probe.
    #[pyo3(signature = (now_ns = None))]
    fn failed(&self, now_ns: Option<u64>) -> PyResult<()> {
        guarded(|| {
            self.inner.failed(at(now_ns));
            Ok(())
        })
    }

    /// A call succeeded; returns whether an outage just ended.
    fn succeeded(&self) -> PyResult<bool> {
        guarded(|| Ok(self.inner.succeeded()))
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Fallback>()?;
    m.add_class::<Health>()?;
    m.add(
        "DEFAULT_INSTANCES",
        rl_client_core::token_budget::DEFAULT_INSTANCES,
    )?;
    Ok(())
}
