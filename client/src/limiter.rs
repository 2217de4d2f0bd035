//! [`Limiter`]: one `RL.TAKE ... WITHSTATE` call per request, with the failure policy.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::{Cmd, Value};

use rl_core::Limit;

use crate::backend::Selector;
use crate::clock::mono_ns;
use crate::config::check_request;
use crate::conn::LATE_REPLY;
use crate::conn::{call, RedisConnection};
use crate::fallback::Fallback;
use crate::health::Health;
use crate::lazy::LazyConnection;
use crate::protocol;
use crate::{
    Decision, Error, LimiterConfig, Metrics, PinInfo, PinKind, PinSpec, Reservation, Source,
};

/// Longest wait a reservation may accept (the server's bound): a day.
const MAX_WAIT: Duration = Duration::from_secs(86_400);

/// A limiter that asks Redis for every request: exact, one round trip per decision.
///
/// One limiter serves any number of keys under the same `(rate, cap)`. It is cheap to
/// clone (the clones share the connection, counters and fallback state).
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use rl_client::{limit, Limiter, LimiterConfig};
/// // No I/O: connects at the first call, serves its policy while Redis is down.
/// let client = redis::Client::open("redis://127.0.0.1:6379/")?;
/// // 10 requests a second per user, bursts of 20.
/// let limiter = Limiter::from_client(client, limit(10.0, 20.0)?, LimiterConfig::default())?;
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

impl Limiter<LazyConnection> {
    /// A limiter over `client` that needs no server to be built: it connects at the first
    /// call, and while Redis is unreachable the failure policy decides (then it reconnects
    /// when a probe succeeds). For services that must start whether or not Redis is up.
    ///
    /// ```no_run
    /// # fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use rl_client::{limit, redis, Limiter, LimiterConfig};
    /// let client = redis::Client::open("redis://127.0.0.1:6379/")?; // parses, no I/O
    /// let limiter = Limiter::from_client(client, limit(10.0, 20.0)?, LimiterConfig::default())?;
    /// # Ok(()) }
    /// ```
    pub fn from_client(
        client: redis::Client,
        limit: Limit,
        config: LimiterConfig,
    ) -> Result<Self, Error> {
        Limiter::new(LazyConnection::new(client), limit, config)
    }
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

    /// Checks that the server has the module (or the Functions library, per the config's
    /// backend), within the timeout: for a startup check. A missing module is
    /// [`Error::Config`] naming the fix; Redis down is an outage ([`Error::is_outage`]),
    /// which a service that must start without Redis may ignore.
    pub async fn check(&self) -> Result<crate::Backend, Error> {
        let inner = &self.inner;
        crate::backend::check(&inner.backend, &inner.conn, inner.config.timeout).await
    }

    /// The limit this limiter applies.
    pub fn limit(&self) -> Limit {
        self.inner.limit
    }

    /// Decides on `n` tokens of `key`: one `RL.TAKE ... WITHSTATE` call, or, during an
    /// outage (connection failure, timeout, or a recent one not yet re-probed), the failure
    /// policy. Returns within [`LimiterConfig::timeout`]. Errs when `n` is 0 or above the
    /// cap, and when Redis answers with an error reply ([`Error::Server`], counted in
    /// `server_errors`; [`Error::Config`] if the module is not loaded): an error reply is
    /// never a grant nor a policy decision.
    pub async fn take(&self, key: &str, n: u64) -> Result<Decision, Error> {
        self.take_with(key, n, self.inner.limit).await
    }

    /// [`take`](Self::take) under another `limit` for this call (per-call limits: one
    /// limiter for keys of different limits). The failure policy applies the instance's
    /// share of `limit` too.
    pub async fn take_with(&self, key: &str, n: u64, limit: Limit) -> Result<Decision, Error> {
        let inner = &self.inner;
        check_request(n, &limit)?;
        let answer = inner.metrics.answer();
        if inner.health.may_call() {
            match self.server_take(key, n, &limit).await {
                Ok(decision) => {
                    inner.health.succeeded();
                    inner.fallback.observe(
                        key,
                        decision.granted,
                        Some(decision.remaining),
                        mono_ns(),
                    );
                    answer.decided(decision.allowed, decision.granted, false);
                    return Ok(decision);
                }
                Err(e) if e.is_outage() => inner.health.failed(),
                Err(e) => {
                    answer.errored(&e);
                    return Err(e);
                }
            }
        }
        let decision = if limit == inner.limit {
            inner.fallback.decide(key, n, mono_ns())
        } else {
            inner.fallback.decide_with(key, n, limit, mono_ns())
        };
        answer.decided(decision.allowed, decision.granted, true);
        Ok(decision)
    }

    /// One `RL.TAKE ... WITHSTATE` call with no failure policy: every error is returned.
    /// Counts Redis latency and errors but not decisions.
    pub async fn take_from_server(&self, key: &str, n: u64) -> Result<Decision, Error> {
        check_request(n, &self.inner.limit)?;
        self.server_take(key, n, &self.inner.limit).await
    }

    async fn server_take(&self, key: &str, n: u64, limit: &Limit) -> Result<Decision, Error> {
        let inner = &self.inner;
        let deadline = Instant::now() + inner.config.timeout;
        let backend = inner.backend.get(&inner.conn, inner.config.timeout).await?;
        let cmd = protocol::take_cmd(
            backend,
            key,
            limit,
            n,
            protocol::LimitOptions::of(&inner.config),
        );
        let value = TakeFlight::send(&self.inner, cmd, key, n, protocol::take_reply)
            .reply(left(deadline))
            .await?;
        let r = protocol::take_reply(value)?;
        let cap = limit.cap();
        Ok(Decision::from_server(
            r.granted,
            r.remaining,
            r.wait,
            r.reset_after,
            cap,
            r.pinned,
        ))
    }

    /// `RL.PEEK key`: the bucket's level without changing it (`None` for a key that does
    /// not exist: a full bucket). Every error is returned.
    pub async fn peek(&self, key: &str) -> Result<Option<f64>, Error> {
        let inner = &self.inner;
        let deadline = Instant::now() + inner.config.timeout;
        let backend = inner.backend.get(&inner.conn, inner.config.timeout).await?;
        let cmd = protocol::peek_cmd(backend, key);
        let value = call(&inner.conn, &cmd, left(deadline), &inner.metrics).await?;
        protocol::peek_reply(value)
    }

    /// `RL.MTAKE n key rate cap ...`: `n` tokens from every key (each under this limiter's
    /// limit), or from none, in one atomic call. No failure policy: every error is
    /// returned (an outage too, as [`Error::is_outage`] tells). Answers whether the tokens
    /// were taken.
    pub async fn mtake(&self, keys: &[&str], n: u64) -> Result<bool, Error> {
        let inner = &self.inner;
        check_request(n, &inner.limit)?;
        if keys.is_empty() {
            return Err(Error::Request("mtake needs at least one key"));
        }
        let deadline = Instant::now() + inner.config.timeout;
        let backend = inner.backend.get(&inner.conn, inner.config.timeout).await?;
        let cmd = protocol::mtake_cmd(
            backend,
            keys,
            &inner.limit,
            n,
            protocol::LimitOptions::of(&inner.config),
        );
        let value = call(&inner.conn, &cmd, left(deadline), &inner.metrics).await?;
        Ok(protocol::mtake_reply(value)? > 0)
    }

    /// Reserves `n` tokens of `key`, waiting up to `max_wait` for them: one `RL.RESERVE`
    /// call, then a sleep of the wait it answers, so the caller uses the tokens at their
    /// turn. Reservations queue: the bucket goes into debt (at most `rate * max_wait`) and
    /// later callers, reserving or taking, wait behind it. Denied (nothing debited, no
    /// sleep) when the wait would exceed `max_wait`.
    ///
    /// While Redis is unavailable the failure policy decides, as for [`take`](Self::take):
    /// `Allow` and `LastKnown` reserve from the local bucket (and sleep its wait), `Deny`
    /// denies. Errs only for impossible requests (`n` is 0 or above the cap, `max_wait`
    /// above a day).
    ///
    /// The tokens are debited before the sleep, and a caller that drops this future while it
    /// sleeps does not get them back: until their turn the bucket is in debt, and a bucket in
    /// debt takes nothing back (its coming tokens are promised to the callers queued
    /// behind). The refund is still sent (`RL.REFUND`, on a task of its own: it credits the
    /// tokens if it lands after their turn), and a reservation it credited nothing of counts
    /// in `takes_lost`.
    pub async fn reserve(
        &self,
        key: &str,
        n: u64,
        max_wait: Duration,
    ) -> Result<Reservation, Error> {
        let reservation = self.reserve_nowait(key, n, max_wait).await?;
        let d = &reservation.decision;
        if d.allowed && !reservation.wait.is_zero() {
            let unused = (d.source == Source::Server).then(|| Unused {
                inner: Arc::clone(&self.inner),
                key: key.to_owned(),
                n,
            });
            tokio::time::sleep(reservation.wait).await;
            if let Some(unused) = unused {
                unused.used();
            }
            self.inner.metrics.reserve_waited(reservation.wait);
        }
        Ok(reservation)
    }

    /// [`reserve`](Self::reserve) without the sleep: the caller waits `wait` itself before
    /// using the tokens (or gives them back with [`refund`](Self::refund)).
    pub async fn reserve_nowait(
        &self,
        key: &str,
        n: u64,
        max_wait: Duration,
    ) -> Result<Reservation, Error> {
        let inner = &self.inner;
        check_request(n, &inner.limit)?;
        check_wait(max_wait)?;
        let answer = inner.metrics.answer();
        if inner.health.may_call() {
            match self.reserve_from_server(key, n, max_wait).await {
                Ok(reservation) => {
                    inner.health.succeeded();
                    let d = &reservation.decision;
                    inner
                        .fallback
                        .observe(key, d.granted, Some(d.remaining.max(0.0)), mono_ns());
                    answer.decided(d.allowed, d.granted, false);
                    return Ok(reservation);
                }
                Err(e) if e.is_outage() => inner.health.failed(),
                Err(e) => {
                    answer.errored(&e);
                    return Err(e);
                }
            }
        }
        let (decision, wait) = inner.fallback.reserve(key, n, max_wait, mono_ns());
        answer.decided(decision.allowed, decision.granted, true);
        Ok(Reservation { decision, wait })
    }

    /// One `RL.RESERVE` call with no failure policy and no sleep: every error is returned.
    pub async fn reserve_from_server(
        &self,
        key: &str,
        n: u64,
        max_wait: Duration,
    ) -> Result<Reservation, Error> {
        let inner = &self.inner;
        check_request(n, &inner.limit)?;
        check_wait(max_wait)?;
        let deadline = Instant::now() + inner.config.timeout;
        let backend = inner.backend.get(&inner.conn, inner.config.timeout).await?;
        let cmd = protocol::reserve_cmd(
            backend,
            key,
            &inner.limit,
            n,
            max_wait,
            protocol::LimitOptions::of(&inner.config),
        );
        let value = TakeFlight::send(&self.inner, cmd, key, n, protocol::reserve_reply)
            .reply(left(deadline))
            .await?;
        let r = protocol::reserve_reply(value)?;
        let cap = inner.limit.cap();
        Ok(Reservation {
            decision: Decision::from_server(
                r.granted,
                r.remaining,
                r.wait,
                r.reset_after,
                cap,
                r.pinned,
            ),
            wait: r.wait,
        })
    }

    /// Pins `key` (`RL.PIN`): from now on every command on it, from every client, decides
    /// under `spec` whatever limit its caller sends: a [`PinSpec::Rate`] limit, every take
    /// denied ([`PinSpec::Block`]) or every take granted with nothing debited
    /// ([`PinSpec::Exempt`]). For `duration` (rounded up to a millisecond), or until
    /// [`unpin`](Self::unpin) when `None`; pinning again replaces the pin. An operator's
    /// command: the server's ACL must allow `RL.PIN` (`@admin`, never `@ratelimit`). Every
    /// error is returned; no failure policy applies.
    pub async fn pin(
        &self,
        key: &str,
        spec: PinSpec,
        duration: Option<Duration>,
    ) -> Result<(), Error> {
        let px = duration.map(crate::pin::px_ms).transpose()?;
        let value = self
            .call_with(|backend| protocol::pin_cmd(backend, key, &spec, px))
            .await?;
        protocol::ok_reply(value)
    }

    /// Removes the pin of `key` (`RL.UNPIN`): answers whether a live pin was removed. A rate
    /// pin's tokens carry over into the callers' limit (clamped to its cap).
    pub async fn unpin(&self, key: &str) -> Result<bool, Error> {
        let value = self
            .call_with(|backend| protocol::key_cmd(backend, "RL.UNPIN", key))
            .await?;
        Ok(protocol::integer(value)? > 0)
    }

    /// The live pin of `key` (`RL.PINNED`), or `None`.
    pub async fn pinned(&self, key: &str) -> Result<Option<PinInfo>, Error> {
        let value = self
            .call_with(|backend| protocol::key_cmd(backend, "RL.PINNED", key))
            .await?;
        protocol::pinned_reply(value)
    }

    /// One call of the command `build` makes for the backend, within the timeout; every
    /// error returned.
    async fn call_with(&self, build: impl FnOnce(crate::Backend) -> Cmd) -> Result<Value, Error> {
        let inner = &self.inner;
        let deadline = Instant::now() + inner.config.timeout;
        let backend = inner.backend.get(&inner.conn, inner.config.timeout).await?;
        call(&inner.conn, &build(backend), left(deadline), &inner.metrics).await
    }

    /// Gives back up to `n` tokens of `key` that were taken or reserved but not used (a
    /// call that never reached its destination): `RL.REFUND key n`. Answers the tokens
    /// credited: fewer than `n` when the bucket refilled meanwhile (it never goes above
    /// its cap), 0 for a key that is full or absent, and 0 for a bucket in debt (its coming
    /// tokens are promised to callers already waiting).
    ///
    /// Every error is returned (a refund that did not arrive only leaves the bucket
    /// emptier than it need be); no failure policy applies.
    pub async fn refund(&self, key: &str, n: u64) -> Result<f64, Error> {
        let inner = &self.inner;
        if n == 0 {
            return Err(Error::Request("n must be positive"));
        }
        let deadline = Instant::now() + inner.config.timeout;
        let backend = inner.backend.get(&inner.conn, inner.config.timeout).await?;
        let cmd = protocol::refund_cmd(backend, key, n);
        let value = call(&inner.conn, &cmd, left(deadline), &inner.metrics).await?;
        let credited = protocol::credited(value)?;
        if credited > 0.0 {
            inner.metrics.refunded(credited);
        }
        Ok(credited)
    }
}

/// A Redis call in flight, owned: it can move to a task of its own.
type PendingCall = Pin<Box<dyn Future<Output = Result<Value, Error>> + Send>>;

/// How a reply that takes tokens (`RL.TAKE`, `RL.RESERVE`) reads.
type ParseGrant = fn(Value) -> Result<protocol::BucketReply, Error>;

/// An `RL.TAKE` or `RL.RESERVE` sent for a caller. If the caller stops waiting (its timeout
/// passes, or its future is dropped) the call completes on a task of its own, and a grant
/// that lands then is refunded (`RL.REFUND`): a take nobody waited for costs no tokens (the
/// Python client does the same). Without a runtime to finish on (or when its runtime shuts
/// down first) the call is dropped, and counted in `takes_lost`: it may have been granted.
struct TakeFlight<C: RedisConnection> {
    inner: Arc<Inner<C>>,
    /// The call, until it has answered the caller.
    call: Option<PendingCall>,
    key: String,
    n: u64,
    parse: ParseGrant,
}

impl<C: RedisConnection> TakeFlight<C> {
    fn send(inner: &Arc<Inner<C>>, cmd: Cmd, key: &str, n: u64, parse: ParseGrant) -> Self {
        let owner = Arc::clone(inner);
        // The call's own bound is the late one (never below the caller's): the caller's is
        // applied in `reply`.
        let late = owner.config.timeout.max(LATE_REPLY);
        let call = async move { call(&owner.conn, &cmd, late, &owner.metrics).await };
        TakeFlight {
            inner: Arc::clone(inner),
            call: Some(Box::pin(call)),
            key: key.to_owned(),
            n,
            parse,
        }
    }

    /// The reply within `wait`: a timeout is an outage for the caller (counted now; the
    /// call's latency is counted when it ends).
    async fn reply(mut self, wait: Duration) -> Result<Value, Error> {
        let Some(call) = self.call.as_mut() else {
            return Err(Error::Timeout(wait));
        };
        match tokio::time::timeout(wait, call).await {
            Ok(outcome) => {
                self.call = None;
                outcome
            }
            Err(_) => {
                self.inner.metrics.slow_call();
                Err(Error::Timeout(wait))
            }
        }
    }
}

impl<C: RedisConnection> Drop for TakeFlight<C> {
    fn drop(&mut self) {
        let Some(call) = self.call.take() else {
            return;
        };
        let (key, n, parse) = (std::mem::take(&mut self.key), self.n, self.parse);
        settle_later(&self.inner, move |limiter| async move {
            match call.await.and_then(parse) {
                // An exempt grant debited nothing: refunding it could credit tokens never
                // taken (should the pin end first).
                Ok(r) if r.granted > 0 && r.pinned != Some(PinKind::Exempt) => {
                    limiter.give_back(&key, r.granted.min(n)).await
                }
                Ok(_) => {}
                // The reply never came (cut by the connection's response timeout or the
                // late bound): Redis may have run the take; nothing to refund safely.
                Err(e) if e.is_outage() => limiter.inner.metrics.take_lost(),
                Err(_) => {}
            }
        });
    }
}

/// Runs `settle` (a grant nobody uses, on its way back) on a task of its own; if it never
/// finishes (no runtime, or the runtime shut down first) the grant counts in `takes_lost`.
fn settle_later<C, F>(inner: &Arc<Inner<C>>, settle: impl FnOnce(Limiter<C>) -> F)
where
    C: RedisConnection,
    F: Future<Output = ()> + Send + 'static,
{
    let unsettled = Unsettled(Some(Arc::clone(&inner.metrics)));
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let work = settle(Limiter {
        inner: Arc::clone(inner),
    });
    runtime.spawn(async move {
        let unsettled = unsettled;
        work.await;
        unsettled.settled();
    });
}

/// A grant nobody uses, on its way back: counted in `takes_lost` if dropped before it is
/// settled (refunded, or counted otherwise), as when the runtime it was spawned on shuts
/// down (the task is dropped unrun) or there is none.
struct Unsettled(Option<Arc<Metrics>>);

impl Unsettled {
    fn settled(mut self) {
        self.0 = None;
    }
}

impl Drop for Unsettled {
    fn drop(&mut self) {
        if let Some(metrics) = self.0.take() {
            metrics.take_lost();
        }
    }
}

/// Tokens reserved by a [`Limiter::reserve`] that sleeps until their turn: if the caller
/// drops it during the sleep, they are refunded on a task of their own.
struct Unused<C: RedisConnection> {
    inner: Arc<Inner<C>>,
    key: String,
    /// The tokens, 0 once the sleep has ended (the caller has them then).
    n: u64,
}

impl<C: RedisConnection> Unused<C> {
    fn used(mut self) {
        self.n = 0;
    }
}

impl<C: RedisConnection> Drop for Unused<C> {
    fn drop(&mut self) {
        if self.n == 0 {
            return;
        }
        let (key, n) = (std::mem::take(&mut self.key), self.n);
        settle_later(&self.inner, move |limiter| async move {
            limiter.give_back(&key, n).await;
        });
    }
}

impl<C: RedisConnection> Limiter<C> {
    /// Refunds `n` tokens of a grant nobody used. A refund that failed, or that a bucket in
    /// debt took nothing of, leaves the tokens spent: counted in `takes_lost`.
    async fn give_back(&self, key: &str, n: u64) {
        let lost = match self.refund(key, n).await {
            Ok(credited) if credited > 0.0 => false,
            // Nothing credited: the bucket is full (nothing is missing) or in debt now, which
            // the grant alone does not tell (a reservation may have run behind it). Its level
            // read right after tells; unknown counts as lost.
            Ok(_) => self
                .peek(key)
                .await
                .map_or(true, |level| level.is_some_and(|t| t < 0.0)),
            Err(_) => true,
        };
        if lost {
            self.inner.metrics.take_lost();
        }
    }
}

/// What is left of the time until `deadline` (at least a millisecond).
pub(crate) fn left(deadline: Instant) -> Duration {
    deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1))
}

/// Refuses a `max_wait` the server would refuse.
fn check_wait(max_wait: Duration) -> Result<(), Error> {
    if max_wait > MAX_WAIT {
        return Err(Error::Request("max_wait must be at most a day"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::test_step;
    use crate::{FailurePolicy, Source};

    const HOUR_NS: i64 = 3_600_000_000_000;

    /// A limiter whose Redis is a loopback port nobody listens on: after the first refused
    /// connection every decision is the `Allow` fallback's (no probe for an hour).
    fn unreachable(limit: Limit) -> Limiter<LazyConnection> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).unwrap();
        let config = LimiterConfig {
            timeout: Duration::from_secs(30),
            probe_interval: Duration::from_secs(3600),
            policy: FailurePolicy::Allow,
            instances: 1,
            ..LimiterConfig::default()
        };
        Limiter::from_client(client, limit, config).unwrap()
    }

    async fn allowed(limiter: &Limiter<LazyConnection>, key: &str) -> bool {
        let d = limiter.take(key, 1).await.unwrap();
        assert_eq!(d.source, Source::Fallback, "{d:?}");
        d.allowed
    }

    /// The local fallback bucket is timed by the monotonic clock: the wall clock stepping
    /// an hour forward refills nothing, an hour back locks nothing out.
    #[tokio::test]
    async fn a_wall_clock_step_neither_refills_nor_freezes_the_fallback_bucket() {
        // 5 tokens, one more every 1000 s: an hour of wall time would bring 3.6.
        let slow = unreachable(Limit::new(0.001, 5.0).unwrap());
        for _ in 0..5 {
            assert!(allowed(&slow, "k").await);
        }
        assert!(!allowed(&slow, "k").await);
        test_step::step(HOUR_NS);
        let refilled = allowed(&slow, "k").await;
        test_step::step(-HOUR_NS);
        assert!(
            !refilled,
            "a wall clock step of +1 h refilled the local bucket"
        );

        // 1000 tokens a second: emptied, it has a token again within a millisecond of real
        // time, whatever the wall clock did meanwhile.
        let fast = unreachable(Limit::new(1000.0, 5.0).unwrap());
        for _ in 0..5 {
            assert!(allowed(&fast, "k").await);
        }
        test_step::step(-HOUR_NS);
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut locked = true;
        while Instant::now() < deadline {
            if allowed(&fast, "k").await {
                locked = false;
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        test_step::step(HOUR_NS);
        assert!(
            !locked,
            "a wall clock step of -1 h locked the local bucket out"
        );
    }
}
