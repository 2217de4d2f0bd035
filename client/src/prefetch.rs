//! [`PrefetchLimiter`]: grants from a locally held lease batch, renewed ahead over
//! `RL.LEASE`, with leftovers settled on renewal and returned on close.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rl_core::Limit;

use crate::backend::Selector;
use crate::clock::now_ns;
use crate::conn::{call, RedisConnection};
use crate::fallback::{lock, Fallback};
use crate::health::Health;
use crate::lazy::LazyConnection;
use crate::limiter::check_request;
use crate::protocol::{self, lease_cmd, parse_lease, return_cmd};
use crate::{Decision, Error, Metrics, PrefetchConfig, Source};

/// A limiter for one key that leases tokens in batches and grants from the batch locally:
/// one Redis call per batch instead of per request.
///
/// - When the tokens held fall to a jittered threshold, the next batch is requested in the
///   background while the rest is spent, and the previous lease is settled in the same
///   call (`RL.LEASE ... RETURN lease_id unused`).
/// - A lease is never spent past `sent + ttl` (earlier than the server's expiry).
/// - [`close`](Self::close) returns what is left (`RL.RETURN`); dropping the last clone
///   inside a tokio runtime does so in the background, best effort.
/// - When Redis is unavailable the held tokens are still spent; after that the failure
///   policy decides, until Redis answers again.
///
/// Cheap to clone; clones share the batch. Create one per key (and per process).
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use rl_client::{limit, PrefetchConfig, PrefetchLimiter};
/// let client = redis::Client::open("redis://127.0.0.1:6379/")?;
/// let conn = redis::aio::ConnectionManager::new(client).await?;
/// // The whole fleet may call the partner API 500 times a second, bursts of 1000.
/// let quota = limit(500.0, 1000.0)?;
/// let limiter = PrefetchLimiter::new(conn, "partner-api", quota, PrefetchConfig::default())?;
/// if limiter.take(1).await?.allowed {
///     // call the partner API
/// }
/// limiter.close().await?; // give back what was not spent
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct PrefetchLimiter<C: RedisConnection> {
    inner: Arc<Inner<C>>,
}

impl<C: RedisConnection> Clone for PrefetchLimiter<C> {
    fn clone(&self) -> Self {
        PrefetchLimiter {
            inner: Arc::clone(&self.inner),
        }
    }
}

#[derive(Debug)]
struct Inner<C: RedisConnection> {
    conn: C,
    key: String,
    limit: Limit,
    config: PrefetchConfig,
    metrics: Arc<Metrics>,
    health: Health,
    fallback: Fallback,
    state: Mutex<State>,
    /// Held by whoever talks to Redis about leases: one lease call at a time.
    fetching: tokio::sync::Mutex<()>,
    backend: Selector,
}

/// A lease as the client sees it.
#[derive(Debug, Clone, Copy)]
struct Lease {
    id: u64,
    left: u64,
    /// When the client stops spending it: the send time of the call plus the TTL.
    expires: Instant,
}

#[derive(Debug, Default)]
struct State {
    /// The previous lease, spent first (it expires first); settled by the next lease call.
    older: Option<Lease>,
    /// The latest lease.
    newer: Option<Lease>,
    /// Renew when at most this many tokens are left.
    threshold: u64,
    /// A background renewal is queued or in flight.
    renewing: bool,
    /// Redis said the bucket is empty until then: deny without asking.
    empty_until: Option<Instant>,
}

impl State {
    fn drop_expired(&mut self, now: Instant, metrics: &Metrics) {
        for slot in [&mut self.older, &mut self.newer] {
            if slot.is_some_and(|l| l.expires <= now) {
                if slot.is_some_and(|l| l.left > 0) {
                    metrics.lease_expired();
                }
                *slot = None;
            }
        }
    }

    fn left(&self) -> u64 {
        self.older.map_or(0, |l| l.left) + self.newer.map_or(0, |l| l.left)
    }

    /// Spends `n` from the leases, older first, if they hold that many.
    fn spend(&mut self, n: u64) -> bool {
        if self.left() < n {
            return false;
        }
        let mut due = n;
        for lease in [&mut self.older, &mut self.newer].into_iter().flatten() {
            let part = due.min(lease.left);
            lease.left -= part;
            due -= part;
        }
        true
    }

    fn empty_for(&self, now: Instant) -> Option<Duration> {
        self.empty_until
            .and_then(|until| until.checked_duration_since(now))
            .filter(|d| !d.is_zero())
    }
}

/// What a lease call brought.
enum Fetched {
    /// The caller's tokens were granted; `left` are held after them.
    Granted { left: u64 },
    /// Redis had too few tokens.
    Denied { retry_after: Duration },
}

impl PrefetchLimiter<LazyConnection> {
    /// A prefetching limiter over `client` that needs no server to be built (see
    /// [`LazyConnection`]): it connects at the first lease call.
    pub fn from_client(
        client: redis::Client,
        key: impl Into<String>,
        limit: Limit,
        config: PrefetchConfig,
    ) -> Result<Self, Error> {
        PrefetchLimiter::new(LazyConnection::new(client), key, limit, config)
    }
}

impl<C: RedisConnection> PrefetchLimiter<C> {
    /// A prefetching limiter of `limit` on `key`, with its own counters.
    pub fn new(
        conn: C,
        key: impl Into<String>,
        limit: Limit,
        config: PrefetchConfig,
    ) -> Result<Self, Error> {
        Self::with_metrics(conn, key, limit, config, Arc::new(Metrics::new()))
    }

    /// Like [`new`](Self::new), counting into shared `metrics`.
    pub fn with_metrics(
        conn: C,
        key: impl Into<String>,
        limit: Limit,
        config: PrefetchConfig,
        metrics: Arc<Metrics>,
    ) -> Result<Self, Error> {
        config.validate()?;
        if config.batch as f64 > limit.cap() {
            return Err(Error::Config("batch must not exceed cap"));
        }
        Ok(PrefetchLimiter {
            inner: Arc::new(Inner {
                conn,
                key: key.into(),
                backend: Selector::new(config.limiter.backend),
                health: Health::new(config.limiter.probe_interval),
                fallback: Fallback::new(limit, &config.limiter),
                limit,
                config,
                metrics,
                state: Mutex::new(State::default()),
                fetching: tokio::sync::Mutex::new(()),
            }),
        })
    }

    /// The counters of this limiter.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.inner.metrics
    }

    /// Tokens held locally right now (unexpired lease leftovers).
    pub fn held(&self) -> u64 {
        let mut state = lock(&self.inner.state);
        state.drop_expired(Instant::now(), &self.inner.metrics);
        state.left()
    }

    /// Decides on `n` tokens: from the held batch when it has them (no Redis call), else
    /// by one `RL.LEASE` call made for this request, else (Redis unavailable) by the
    /// failure policy. Errs only when `n` is 0 or above the cap.
    pub async fn take(&self, n: u64) -> Result<Decision, Error> {
        let inner = &self.inner;
        check_request(n, &inner.limit)?;
        inner.metrics.call();
        if let Some(decision) = self.decide_locally(n) {
            return Ok(decision);
        }
        let probing = inner.health.is_down();
        if !inner.health.may_call() {
            return Ok(self.fallback(n));
        }
        let _fetching = inner.fetching.lock().await;
        // A renewal may have landed while this call waited.
        if let Some(decision) = self.decide_locally(n) {
            return Ok(decision);
        }
        if !probing && inner.health.is_down() {
            // The call this one waited behind just failed: do not wait a timeout again.
            return Ok(self.fallback(n));
        }
        let decision = match inner.fetch(n).await {
            Ok(Fetched::Granted { left }) => {
                let cap = inner.limit.cap();
                Decision::granted(n, left as f64, Duration::ZERO, cap, Source::Server)
            }
            Ok(Fetched::Denied { retry_after }) => self.denied(retry_after, Source::Server),
            Err(_) => return Ok(self.fallback(n)),
        };
        inner
            .metrics
            .decided(decision.allowed, decision.granted, false);
        Ok(decision)
    }

    /// Returns the held leftovers to Redis (`RL.RETURN` per live lease) after any renewal
    /// in flight; answers the tokens Redis credited back. The limiter stays usable: a
    /// later `take` leases again.
    pub async fn close(&self) -> Result<u64, Error> {
        let inner = &self.inner;
        let _fetching = inner.fetching.lock().await;
        let leases = {
            let mut state = lock(&inner.state);
            state.drop_expired(Instant::now(), &inner.metrics);
            [state.older.take(), state.newer.take()]
        };
        let mut credited = 0;
        let mut failure = None;
        for lease in leases.into_iter().flatten() {
            let backend = inner.backend.get(&inner.conn).await?;
            let cmd = return_cmd(backend, &inner.key, lease.id, lease.left);
            let outcome = call(
                &inner.conn,
                &cmd,
                inner.config.limiter.timeout,
                &inner.metrics,
            )
            .await
            .and_then(protocol::integer);
            match outcome {
                Ok(tokens) => {
                    inner.metrics.returned(lease.left);
                    credited += tokens;
                }
                Err(e) => failure = failure.or(Some(e)),
            }
        }
        failure.map_or(Ok(credited), Err)
    }

    /// A grant from the held batch, or a denial Redis gave lately; `None` if Redis must be
    /// asked. Starts a background renewal when the batch runs low.
    fn decide_locally(&self, n: u64) -> Option<Decision> {
        let inner = &self.inner;
        let now = Instant::now();
        let mut state = lock(&inner.state);
        state.drop_expired(now, &inner.metrics);
        if state.spend(n) {
            let renew = !state.renewing
                && state.left() <= state.threshold
                && state.empty_for(now).is_none()
                && !inner.health.is_down();
            state.renewing |= renew;
            let left = state.left();
            drop(state);
            if renew {
                self.renew_in_background();
            }
            inner.metrics.decided(true, n, false);
            let cap = inner.limit.cap();
            return Some(Decision::granted(
                n,
                left as f64,
                Duration::ZERO,
                cap,
                Source::Lease,
            ));
        }
        let wait = state.empty_for(now)?;
        drop(state);
        inner.metrics.decided(false, 0, false);
        Some(self.denied(wait, Source::Lease))
    }

    fn renew_in_background(&self) {
        let inner = Arc::clone(&self.inner);
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    let _fetching = inner.fetching.lock().await;
                    let still_low = {
                        let mut state = lock(&inner.state);
                        state.drop_expired(Instant::now(), &inner.metrics);
                        state.left() <= state.threshold
                    };
                    if still_low && !inner.health.is_down() {
                        // Failures mark Redis down inside fetch; takes then fall back.
                        let _ = inner.fetch(0).await;
                    }
                    lock(&inner.state).renewing = false;
                });
            }
            // No runtime (a caller polling with another executor): renew inline later.
            Err(_) => lock(&inner.state).renewing = false,
        }
    }

    fn fallback(&self, n: u64) -> Decision {
        let inner = &self.inner;
        let decision = inner.fallback.decide(&inner.key, n, now_ns());
        inner
            .metrics
            .decided(decision.allowed, decision.granted, true);
        decision
    }

    fn denied(&self, retry_after: Duration, source: Source) -> Decision {
        let cap = self.inner.limit.cap();
        Decision::denied(0.0, retry_after, Duration::ZERO, cap, source)
    }
}

impl<C: RedisConnection> Inner<C> {
    /// One `RL.LEASE` call (caller holds `fetching`): at least `need` tokens and up to a
    /// batch, settling the older lease. Of the tokens granted, `need` go to the caller.
    async fn fetch(&self, need: u64) -> Result<Fetched, Error> {
        let settle = {
            let mut state = lock(&self.state);
            state.drop_expired(Instant::now(), &self.metrics);
            // Out of the state before the call: nobody spends what is being returned.
            state.older.take()
        };
        let ask = self.config.batch.max(need);
        let settling = settle.map(|l| (l.id, l.left));
        let backend = self.backend.get(&self.conn).await?;
        let cmd = lease_cmd(
            backend,
            &self.key,
            &self.limit,
            ask,
            self.config.ttl_ms(),
            need.max(1),
            settling,
        );
        let sent = Instant::now();
        let outcome = call(&self.conn, &cmd, self.config.limiter.timeout, &self.metrics)
            .await
            .and_then(parse_lease);
        let granted = match outcome {
            Ok(granted) => granted,
            Err(e) => {
                // The settled lease is gone either way: if the call did not arrive, it
                // expires on the server.
                self.health.failed();
                return Err(e);
            }
        };
        if self.health.succeeded() {
            self.fallback.end_outage();
        }
        if let Some((_, unused)) = settling {
            self.metrics.returned(unused);
        }
        self.metrics.lease(granted.tokens);
        self.fallback
            .observe(&self.key, granted.tokens, None, now_ns());

        let mut state = lock(&self.state);
        if granted.tokens == 0 {
            let retry_after = Duration::from_millis(granted.retry_after_ms);
            state.empty_until = Some(Instant::now() + retry_after);
            return Ok(Fetched::Denied { retry_after });
        }
        let ttl = self.config.ttl.min(Duration::from_millis(granted.ttl_ms));
        let lease = Lease {
            id: granted.id,
            left: granted.tokens.saturating_sub(need),
            expires: sent + ttl,
        };
        // `older` was taken above and only lease calls (serialised) put leases in.
        state.older = state.newer.replace(lease);
        state.threshold = self.config.draw_threshold();
        state.empty_until = None;
        Ok(Fetched::Granted { left: state.left() })
    }
}

impl<C: RedisConnection> Drop for Inner<C> {
    fn drop(&mut self) {
        let state = self
            .state
            .get_mut()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let now = Instant::now();
        let leases: Vec<Lease> = [state.older.take(), state.newer.take()]
            .into_iter()
            .flatten()
            .filter(|l| l.expires > now)
            .collect();
        if leases.is_empty() {
            return;
        }
        // Best effort: without a runtime the leases simply expire on the server.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let mut conn = self.conn.clone();
            let key = self.key.clone();
            let timeout = self.config.limiter.timeout;
            // A lease exists only after a call, which resolved the backend.
            let Some(backend) = self.backend.known() else {
                return;
            };
            runtime.spawn(async move {
                for lease in leases {
                    let cmd = return_cmd(backend, &key, lease.id, lease.left);
                    let _ = tokio::time::timeout(timeout, conn.req_packed_command(&cmd)).await;
                }
            });
        }
    }
}
