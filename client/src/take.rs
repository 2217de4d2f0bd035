//! [`Limiter`]: one `RL.TAKE ... WITHSTATE` call per request, with the failure policy.

use std::sync::Arc;
use std::time::Duration;

use redis::Cmd;
use rl_core::Limit;

use crate::backend::{self, Selector};
use crate::clock::now_ns;
use crate::conn::{call, RedisConnection};
use crate::fallback::Fallback;
use crate::health::Health;
use crate::reply;
use crate::{Backend, Decision, Error, LimiterConfig, Metrics, Source};

/// A limiter that asks Redis for every request: exact, one round trip per decision.
///
/// One limiter serves any number of keys under the same `(rate, cap)`. It is cheap to
/// clone (the clones share the connection, counters and fallback state).
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use rl_client::{limit, Limiter, LimiterConfig};
/// let client = redis::Client::open("redis://127.0.0.1:6379/")?;
/// let conn = redis::aio::ConnectionManager::new(client).await?;
/// // 10 requests a second per user, bursts of 20.
/// let limiter = Limiter::new(conn, limit(10.0, 20.0)?, LimiterConfig::default())?;
/// let decision = limiter.take("user:42", 1).await?;
/// if !decision.allowed {
///     println!("retry in {:?}", decision.retry_after);
/// }
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Limiter<C> {
    inner: Arc<Inner<C>>,
}

impl<C> Clone for Limiter<C> {
    fn clone(&self) -> Self {
        Limiter {
            inner: Arc::clone(&self.inner),
        }
    }
}

#[derive(Debug)]
struct Inner<C> {
    conn: C,
    limit: Limit,
    config: LimiterConfig,
    metrics: Arc<Metrics>,
    health: Health,
    fallback: Fallback,
    backend: Selector,
}

/// `RL.TAKE key rate cap n WITHSTATE`.
pub(crate) fn take_cmd(backend: Backend, key: &str, limit: &Limit, n: u64) -> Cmd {
    let mut cmd = backend::cmd(backend, "RL.TAKE");
    cmd.arg(key)
        .arg(limit.rate())
        .arg(limit.cap())
        .arg(n)
        .arg("WITHSTATE");
    cmd
}

/// Refuses what the server would refuse for every state of the bucket.
pub(crate) fn check_request(n: u64, limit: &Limit) -> Result<(), Error> {
    if n == 0 {
        return Err(Error::Request("n must be positive"));
    }
    if n as f64 > limit.cap() {
        return Err(Error::Request("n must not exceed cap"));
    }
    Ok(())
}

impl<C: RedisConnection> Limiter<C> {
    /// A limiter of `limit` over `conn`, with its own counters.
    pub fn new(conn: C, limit: Limit, config: LimiterConfig) -> Result<Self, Error> {
        Self::with_metrics(conn, limit, config, Arc::new(Metrics::new()))
    }

    /// Like [`new`](Self::new), counting into shared `metrics`.
    pub fn with_metrics(
        conn: C,
        limit: Limit,
        config: LimiterConfig,
        metrics: Arc<Metrics>,
    ) -> Result<Self, Error> {
        config.validate()?;
        Ok(Limiter {
            inner: Arc::new(Inner {
                conn,
                health: Health::new(config.probe_interval),
                fallback: Fallback::new(limit, &config),
                backend: Selector::new(config.backend),
                limit,
                config,
                metrics,
            }),
        })
    }

    /// The counters of this limiter.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.inner.metrics
    }

    /// The limit this limiter applies.
    pub fn limit(&self) -> Limit {
        self.inner.limit
    }

    /// Decides on `n` tokens of `key`: one `RL.TAKE ... WITHSTATE` call, or, while Redis is
    /// unavailable (error, timeout, or a recent failure not yet re-probed), the failure
    /// policy. Errs only when `n` is 0 or above the cap.
    pub async fn take(&self, key: &str, n: u64) -> Result<Decision, Error> {
        let inner = &self.inner;
        check_request(n, &inner.limit)?;
        inner.metrics.call();
        if inner.health.may_call() {
            match self.take_from_server(key, n).await {
                Ok(decision) => {
                    if inner.health.succeeded() {
                        inner.fallback.end_outage();
                    }
                    inner.fallback.observe(
                        key,
                        decision.granted,
                        Some(decision.remaining),
                        now_ns(),
                    );
                    inner
                        .metrics
                        .decided(decision.allowed, decision.granted, false);
                    return Ok(decision);
                }
                Err(e) if e.is_unavailable() => inner.health.failed(),
                Err(e) => return Err(e),
            }
        }
        let decision = inner.fallback.decide(key, n, now_ns());
        inner
            .metrics
            .decided(decision.allowed, decision.granted, true);
        Ok(decision)
    }

    /// One `RL.TAKE ... WITHSTATE` call with no failure policy: every error is returned.
    /// Counts Redis latency and errors but not decisions.
    pub async fn take_from_server(&self, key: &str, n: u64) -> Result<Decision, Error> {
        let inner = &self.inner;
        check_request(n, &inner.limit)?;
        let backend = inner.backend.get(&inner.conn).await?;
        let cmd = take_cmd(backend, key, &inner.limit, n);
        let value = call(&inner.conn, &cmd, inner.config.timeout, &inner.metrics).await?;
        let items = reply::array(value, 4)?;
        let granted = reply::count(&items[0])?;
        let remaining = reply::number(&items[1])?;
        let retry_ms = reply::count(&items[2])?;
        let reset_ms = reply::count(&items[3])?;
        Ok(Decision {
            allowed: granted > 0,
            granted,
            remaining,
            retry_after: Duration::from_millis(retry_ms),
            reset_after: Duration::from_millis(reset_ms),
            limit: inner.limit.cap(),
            source: Source::Server,
        })
    }
}
