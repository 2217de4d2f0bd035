//! [`PrefetchLimiter`]: grants from a locally held lease batch, renewed ahead over
//! `RL.LEASE`, with leftovers settled on renewal and returned on close.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use rl_core::Limit;

use crate::backend::Selector;
use crate::clock::mono_ns;
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
/// - Lease calls run on their own task: a take that is cancelled or times out loses
///   nothing (the lease is installed when it arrives, or returned).
/// - [`close`](Self::close) returns what is left (`RL.RETURN`) and stops leasing; dropping
///   the last clone returns it best effort (see the README).
/// - During an outage the held tokens are still spent; after that the failure policy
///   decides, until Redis answers again. Error replies are returned, never decided
///   locally.
///
/// Cheap to clone; clones share the batch. Create one per key (and per process), or use a
/// [`KeyedPrefetcher`](crate::KeyedPrefetcher) for many keys.
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use rl_client::{limit, PrefetchConfig, PrefetchLimiter};
/// // No I/O: connects at the first lease call, serves its policy while Redis is down.
/// let client = redis::Client::open("redis://127.0.0.1:6379/")?;
/// // The whole fleet may call the partner API 500 times a second, bursts of 1000.
/// let quota = limit(500.0, 1000.0)?;
/// let limiter =
///     PrefetchLimiter::from_client(client, "partner-api", quota, PrefetchConfig::default())?;
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
    /// Woken when a lease call ends (its outcome is in `State::last`).
    fetched: Arc<Notify>,
    backend: Selector,
    /// `close` was called: no more lease calls; late leases are returned.
    closed: AtomicBool,
}

/// How long a lease call's reply is awaited in the background after its caller gave up
/// (this, or the limiter's timeout if longer; the connection's own response timeout may
/// end it sooner: `LazyConfig::response_timeout`): a reply within it is installed (or
/// returned), one beyond it is counted in `leases_lost`.
pub(crate) const LATE_REPLY: Duration = Duration::from_secs(10);

/// How long past a lease call's own bound a take waiting behind it waits at most.
const LATE_SLACK: Duration = Duration::from_secs(1);

/// A take's place in [`State::line`]. Leaving (returned, timed out, cancelled) it takes
/// itself out of the line; if no call is in flight then, it wakes the first in line, which
/// would otherwise wait for a call nobody makes.
struct Place<'a, C: RedisConnection> {
    inner: &'a Inner<C>,
    /// Its number in line, 0 until it first stands in line.
    id: std::sync::atomic::AtomicU64,
    n: u64,
    wake: Arc<Notify>,
}

impl<'a, C: RedisConnection> Place<'a, C> {
    fn new(inner: &'a Inner<C>, n: u64) -> Self {
        Place {
            inner,
            id: std::sync::atomic::AtomicU64::new(0),
            n,
            wake: Arc::new(Notify::new()),
        }
    }

    /// Stands in line (at the front for its own call, else in arrival order), unless it is
    /// there already.
    fn enter(&self, state: &mut State, front: bool) {
        let mut id = self.id.load(Ordering::Relaxed);
        if id == 0 {
            state.waiters += 1;
            id = state.waiters;
            self.id.store(id, Ordering::Relaxed);
        } else if state.line.iter().any(|w| w.id == id) {
            return;
        }
        let waiter = Waiter {
            id,
            n: self.n,
            wake: Arc::clone(&self.wake),
        };
        if front {
            state.line.push_front(waiter);
        } else {
            // By arrival: one woken before (and not served) goes back to its place.
            let at = state
                .line
                .iter()
                .position(|w| w.id > id)
                .unwrap_or(state.line.len());
            state.line.insert(at, waiter);
        }
    }
}

impl<C: RedisConnection> Drop for Place<'_, C> {
    fn drop(&mut self) {
        let id = *self.id.get_mut();
        if id == 0 {
            // Never stood in line: served without waiting.
            return;
        }
        let next = {
            let mut state = lock(&self.inner.state);
            state.line.retain(|w| w.id != id);
            if state.fetching {
                None
            } else {
                state.line.pop_front()
            }
        };
        if let Some(next) = next {
            next.wake.notify_one();
        }
    }
}

/// A lease as the client sees it.
#[derive(Debug, Clone, Copy)]
struct HeldLease {
    id: u64,
    left: u64,
    /// When the client stops spending it: the send time of the call plus the TTL.
    expires: Instant,
}

/// How the last lease call ended, for the callers that waited for it.
#[derive(Debug, Clone, Default)]
enum Outcome {
    #[default]
    None,
    /// Tokens installed in the state.
    Granted,
    /// Redis had fewer than `MIN` tokens (see `State::denied`).
    Denied,
    /// Connection failure or timeout: the failure policy decides.
    Outage,
    /// The lease arrived expired (TTL shorter than the round trip) and was returned.
    Stale,
    /// An error reply (or a missing module): returned to the callers.
    Failed(Failure),
}

#[derive(Debug, Clone)]
enum Failure {
    Server(String),
    Reply(String),
    Config(&'static str),
    Closed,
}

impl Failure {
    fn of(e: &Error) -> Failure {
        match e {
            Error::Server(t) => Failure::Server(t.clone()),
            Error::Config(t) => Failure::Config(t),
            Error::Closed => Failure::Closed,
            other => Failure::Reply(other.to_string()),
        }
    }

    fn error(&self) -> Error {
        match self {
            Failure::Server(t) => Error::Server(t.clone()),
            Failure::Reply(t) => Error::Reply(t.clone()),
            Failure::Config(t) => Error::Config(t),
            Failure::Closed => Error::Closed,
        }
    }
}

#[derive(Debug, Default)]
struct State {
    /// The previous lease, spent first (it expires first); settled by the next lease call.
    older: Option<HeldLease>,
    /// The latest lease.
    newer: Option<HeldLease>,
    /// Renew when at most this many tokens are left.
    threshold: u64,
    /// A lease call is in flight (on its own task: a caller that gives up does not stop
    /// it).
    fetching: bool,
    /// Lease calls ended so far, and how the last one ended.
    generation: u64,
    last: Outcome,
    /// Redis said `n` tokens are not there until then: takes of `n` or more are denied
    /// without asking; smaller ones still ask.
    denied: Option<(u64, Instant)>,
    /// The generation of the lease call already counted as timed out (once per call).
    slow: Option<u64>,
    /// Takes waiting for a lease call, in arrival order: a landed lease wakes only those it
    /// can serve, and the first it cannot (which asks Redis next).
    line: VecDeque<Waiter>,
    /// Numbers the waiters.
    waiters: u64,
}

/// A take waiting in [`State::line`].
#[derive(Debug)]
struct Waiter {
    id: u64,
    n: u64,
    wake: Arc<Notify>,
}

impl State {
    /// Takes out of the line those to wake after a lease call ended: with tokens installed,
    /// those the held tokens serve in order and the first they do not; else everyone (each
    /// reads the outcome).
    fn wake_after(&mut self, granted: bool) -> Vec<Arc<Notify>> {
        if !granted {
            return self.line.drain(..).map(|w| w.wake).collect();
        }
        let mut budget = self.left();
        let mut woken = Vec::new();
        while let Some(waiter) = self.line.pop_front() {
            woken.push(waiter.wake);
            if waiter.n > budget {
                break;
            }
            budget -= waiter.n;
        }
        woken
    }

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

    /// How long a take of `n` is known to be denied.
    fn denied_for(&self, n: u64, now: Instant) -> Option<Duration> {
        let (size, until) = self.denied?;
        if n < size {
            return None;
        }
        until.checked_duration_since(now).filter(|d| !d.is_zero())
    }
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
                fetched: Arc::new(Notify::new()),
                closed: AtomicBool::new(false),
            }),
        })
    }

    /// The counters of this limiter.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.inner.metrics
    }

    /// Checks that the server has the module or library: see [`Limiter::check`](
    /// crate::Limiter::check).
    pub async fn check(&self) -> Result<crate::Backend, Error> {
        let inner = &self.inner;
        crate::backend::check(&inner.backend, &inner.conn, inner.config.limiter.timeout).await
    }

    /// Tokens held locally right now (unexpired lease leftovers).
    pub fn held(&self) -> u64 {
        let mut state = lock(&self.inner.state);
        state.drop_expired(Instant::now(), &self.inner.metrics);
        state.left()
    }

    /// Decides on `n` tokens: from the held batch when it has them (no Redis call), else
    /// by an `RL.LEASE` call made for this request, else (an outage) by the failure policy.
    /// Returns within [`LimiterConfig::timeout`](crate::LimiterConfig::timeout), except a
    /// take that waited for another take's (or a renewal's) lease call: that call is not
    /// this take's to judge, so it waits for it (up to the call's own bound, the
    /// connection's response timeout or at most `max(timeout, 10 s)`) and, if it must then
    /// ask Redis itself, gives its own call the whole timeout. Waiting takes are served in
    /// arrival order.
    ///
    /// The lease call runs on its own task: if this future is dropped (a request timeout,
    /// `select!`) or its timeout passes, the call still completes and its tokens are
    /// installed for the next takes (or returned with `RL.RETURN` if they arrive expired or
    /// after [`close`](Self::close)): cancelling a take never loses tokens.
    ///
    /// Errs when `n` is 0 or above the cap, after `close` ([`Error::Closed`]), and when
    /// Redis answers with an error reply ([`Error::Server`]; [`Error::Config`] if the
    /// module is not loaded): error replies are never grants nor policy decisions.
    pub async fn take(&self, n: u64) -> Result<Decision, Error> {
        let inner = &self.inner;
        check_request(n, &inner.limit)?;
        let answer = inner.metrics.answer();
        let timeout = inner.config.limiter.timeout;
        let mut deadline = tokio::time::Instant::now() + timeout;
        let mut asked = false;
        // This take made a lease call of its own (its deadline was renewed for it).
        let mut started = false;
        let place = Place::new(inner, n);
        loop {
            if inner.closed.load(Ordering::Acquire) {
                answer.errored(&Error::Closed);
                return Err(Error::Closed);
            }
            if let Some(mut decision) = self.decide_locally(n) {
                if asked && decision.source == Source::Lease {
                    decision.source = Source::Server;
                }
                answer.decided(decision.allowed, decision.granted, false);
                return Ok(decision);
            }
            enum Next {
                Fallback,
                Deny,
                Start(u64),
                Join(u64),
            }
            let next = {
                let mut state = lock(&inner.state);
                let now = tokio::time::Instant::now();
                if !state.fetching {
                    if started && now >= deadline {
                        // Others spent what this take's own call brought, and its time is up.
                        Next::Deny
                    } else if inner.health.may_call() {
                        state.fetching = true;
                        if !started {
                            // A take that waited behind other calls gives its own the whole
                            // timeout.
                            started = true;
                            deadline = now + timeout;
                        }
                        place.enter(&mut state, true);
                        Next::Start(state.generation)
                    } else {
                        Next::Fallback
                    }
                } else if inner.health.is_down() {
                    // A probe is in flight, or the call's own caller judged it an outage: do
                    // not wait for a Redis believed down.
                    Next::Fallback
                } else {
                    place.enter(&mut state, false);
                    Next::Join(state.generation)
                }
            };
            let (seen, own) = match next {
                Next::Fallback => return Ok(self.fallback(n, answer)),
                Next::Deny => {
                    let decision = self.denied(Duration::ZERO, Source::Server);
                    answer.decided(false, 0, false);
                    return Ok(decision);
                }
                Next::Join(generation) => (generation, false),
                Next::Start(generation) => {
                    if let Some(inline) = Inner::spawn_fetch(inner, n) {
                        inline.await;
                    }
                    (generation, true)
                }
            };
            asked = true;
            // Only a call's own caller judges it by its timeout. A take waiting behind
            // another's call waits for it past its own deadline (a busy process is no
            // outage), up to the call's own bound: the call ends by then.
            let until = if own {
                deadline
            } else {
                deadline.max(tokio::time::Instant::now() + inner.late_bound() + LATE_SLACK)
            };
            let woken = tokio::time::timeout_at(until, place.wake.notified())
                .await
                .is_ok();
            let last = {
                let state = lock(&inner.state);
                (state.generation != seen).then(|| state.last.clone())
            };
            match last {
                None if !woken && own => {
                    // Redis is slow: an outage for this caller and the next ones (the
                    // call goes on; its outcome ends the outage if it succeeds). Those
                    // waiting behind the call learn it now.
                    let (first, woken) = {
                        let mut state = lock(&inner.state);
                        let first =
                            state.generation == seen && state.slow.replace(seen) != Some(seen);
                        inner.health.failed();
                        (first, state.wake_after(false))
                    };
                    if first {
                        inner.metrics.slow_call();
                    }
                    woken.iter().for_each(|w| w.notify_one());
                    return Ok(self.fallback(n, answer));
                }
                // Past the call's own bound: unreachable unless the runtime stalls; the
                // call is not this take's to judge.
                None if !woken => return Ok(self.fallback(n, answer)),
                None => continue,
                Some(Outcome::Outage) => return Ok(self.fallback(n, answer)),
                Some(Outcome::Failed(failure)) => {
                    let e = failure.error();
                    answer.errored(&e);
                    return Err(e);
                }
                Some(Outcome::Stale) => {
                    let decision = self.denied(Duration::ZERO, Source::Server);
                    answer.decided(false, 0, false);
                    return Ok(decision);
                }
                // Granted or denied: the state says what is there now.
                Some(_) => continue,
            }
        }
    }

    /// Stops leasing and returns the held leftovers (`RL.RETURN` per live lease); answers
    /// the tokens Redis credited back for them. A lease call in flight returns its lease
    /// itself when it lands (not counted in the answer); `close` waits for it up to the
    /// limiter's `timeout`, no longer, so a slow or unreachable Redis does not hold up a
    /// shutdown (a call landing later still returns its lease if the runtime runs, else the
    /// lease expires after its TTL). Later `take`s answer [`Error::Closed`]; no renewal
    /// starts after `close`.
    pub async fn close(&self) -> Result<u64, Error> {
        let inner = &self.inner;
        {
            // Under the state lock: a lease call landing from now on sees `closed` before it
            // could install its lease (see `fetch`), so none slips in after the take below.
            let _state = lock(&inner.state);
            inner.closed.store(true, Ordering::Release);
        }
        let wait = inner.config.limiter.timeout;
        let _ = tokio::time::timeout(wait, async {
            loop {
                let notified = inner.fetched.notified();
                tokio::pin!(notified);
                notified.as_mut().enable();
                if !lock(&inner.state).fetching {
                    return;
                }
                notified.await;
            }
        })
        .await;
        let leases = {
            let mut state = lock(&inner.state);
            state.drop_expired(Instant::now(), &inner.metrics);
            [state.older.take(), state.newer.take()]
        };
        let mut credited = 0;
        let mut failure = None;
        for lease in leases.into_iter().flatten() {
            match inner.give_back(lease).await {
                Ok(tokens) => credited += tokens,
                Err(e) => failure = failure.or(Some(e)),
            }
        }
        failure.map_or(Ok(credited), Err)
    }

    /// Closed from the start (a keyed prefetcher after its `close`): takes answer
    /// [`Error::Closed`], nothing is leased.
    pub(crate) fn mark_closed(&self) {
        self.inner.closed.store(true, Ordering::Release);
    }

    /// A grant from the held batch, or a denial Redis gave lately for this size; `None`
    /// if Redis must be asked. Starts a background renewal when the batch runs low.
    fn decide_locally(&self, n: u64) -> Option<Decision> {
        let inner = &self.inner;
        let now = Instant::now();
        let mut state = lock(&inner.state);
        state.drop_expired(now, &inner.metrics);
        if state.spend(n) {
            let renew = !state.fetching
                && state.left() <= state.threshold
                && state.denied_for(1, now).is_none()
                && !inner.health.is_down()
                && !inner.closed.load(Ordering::Acquire);
            state.fetching |= renew;
            let left = state.left();
            drop(state);
            if renew {
                if let Some(inline) = Inner::spawn_fetch(inner, 0) {
                    // No runtime to spawn on: the next take that needs Redis renews.
                    drop(inline);
                    lock(&inner.state).fetching = false;
                }
            }
            let cap = inner.limit.cap();
            return Some(Decision::granted(
                n,
                left as f64,
                Duration::ZERO,
                cap,
                Source::Lease,
            ));
        }
        let wait = state.denied_for(n, now)?;
        drop(state);
        Some(self.denied(wait, Source::Lease))
    }

    fn fallback(&self, n: u64, answer: crate::metrics::Answer<'_>) -> Decision {
        let inner = &self.inner;
        let decision = inner.fallback.decide(&inner.key, n, mono_ns());
        answer.decided(decision.allowed, decision.granted, true);
        decision
    }

    fn denied(&self, retry_after: Duration, source: Source) -> Decision {
        let cap = self.inner.limit.cap();
        Decision::denied(0.0, retry_after, Duration::ZERO, cap, source)
    }
}

impl<C: RedisConnection> Inner<C> {
    /// How long a lease reply is awaited at most.
    fn late_bound(&self) -> Duration {
        self.config.limiter.timeout.max(LATE_REPLY)
    }

    /// Starts the lease call (the caller set `fetching`) on its own task; without a
    /// runtime, answers the future for the caller to run inline.
    fn spawn_fetch(
        inner: &Arc<Inner<C>>,
        need: u64,
    ) -> Option<std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>> {
        let task = Box::pin(Arc::clone(inner).fetch(need));
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(task);
                None
            }
            Err(_) => Some(task),
        }
    }

    /// One `RL.LEASE` call: at least `need` tokens (1 for a renewal) and up to a batch,
    /// settling the older lease. Everything granted is installed in the state (whoever
    /// waits spends from there), or returned if it cannot be. Ends the `fetching` slot and
    /// wakes the waiters with the outcome.
    async fn fetch(self: Arc<Self>, need: u64) {
        let outcome = self.lease(need).await;
        let mut state = lock(&self.state);
        state.fetching = false;
        state.generation += 1;
        let woken = state.wake_after(matches!(outcome, Outcome::Granted));
        state.last = outcome;
        drop(state);
        // Let go of the limiter before waking its callers: if they drop it, the last
        // handle (which returns the leftovers) is theirs, not this task's.
        let fetched = Arc::clone(&self.fetched);
        drop(self);
        woken.iter().for_each(|w| w.notify_one());
        fetched.notify_waiters();
    }

    async fn lease(&self, need: u64) -> Outcome {
        let settle = {
            let mut state = lock(&self.state);
            state.drop_expired(Instant::now(), &self.metrics);
            // Out of the state before the call: nobody spends what is being returned.
            state.older.take()
        };
        let late = self.late_bound();
        let backend = match self.backend.get(&self.conn, late).await {
            Ok(backend) => backend,
            Err(e) => {
                self.restore(settle).await;
                return self.failed(&e);
            }
        };
        let ask = self.config.batch.max(need);
        // A lease of id 0 (granted under an `EXEMPT` pin, or a shadow grant) debited
        // nothing: there is nothing to return, and it is simply dropped.
        let settling = settle.filter(|l| l.id != 0).map(|l| (l.id, l.left));
        let cmd = lease_cmd(
            backend,
            &self.key,
            &self.limit,
            ask,
            self.config.ttl_ms(),
            need.max(1),
            settling,
            protocol::LimitOptions::of(&self.config.limiter),
        );
        let sent = Instant::now();
        let granted = match call(&self.conn, &cmd, late, &self.metrics)
            .await
            .and_then(parse_lease)
        {
            Ok(granted) => granted,
            Err(e) => {
                if e.may_have_run() {
                    // Unknown outcome (a timeout, a reset after the write): the server may
                    // hold a lease for us we cannot return.
                    self.metrics.lease_lost();
                }
                if e.is_outage() {
                    // The settled lease is gone either way (spending it again could spend
                    // tokens the call returned): if the call did not arrive, its leftover
                    // expires on the server unspent.
                    if settle.is_some_and(|l| l.left > 0) {
                        self.metrics.lease_lost();
                    }
                } else {
                    // An error reply changes nothing on the server: keep the older lease.
                    self.restore(settle).await;
                }
                return self.failed(&e);
            }
        };
        self.health.succeeded();
        if let Some((_, unused)) = settling {
            self.metrics.returned(unused);
        }
        self.metrics.lease(granted.tokens);
        self.fallback
            .observe(&self.key, granted.tokens, None, mono_ns());

        let now = Instant::now();
        if granted.tokens == 0 {
            let retry_after = Duration::from_millis(granted.retry_after_ms);
            let mut state = lock(&self.state);
            let size = need.max(1);
            // Keep the smallest size known to be denied.
            if state
                .denied
                .is_none_or(|(s, until)| size <= s || until <= now)
            {
                state.denied = Some((size, now + retry_after));
            }
            return Outcome::Denied;
        }
        let ttl = self.config.ttl.min(Duration::from_millis(granted.ttl_ms));
        let lease = HeldLease {
            id: granted.id,
            left: granted.tokens,
            expires: sent + ttl,
        };
        if lease.expires <= now {
            // Arrived expired (a TTL shorter than the round trip): nothing to spend.
            let _ = self.give_back(lease).await;
            return Outcome::Stale;
        }
        let mut state = lock(&self.state);
        // `close` sets `closed` under this lock and then takes what `state` holds: a lease
        // that finds it set here is nobody's but this task's to return.
        if self.closed.load(Ordering::Acquire) {
            drop(state);
            let _ = self.give_back(lease).await;
            return Outcome::Failed(Failure::Closed);
        }
        // `older` was taken above and only lease calls (one at a time) put leases in.
        if let Some(previous) = state.older.take() {
            // Unreachable, but never drop a lease silently.
            state.newer = state.newer.or(Some(previous));
        }
        state.older = state.newer.replace(lease);
        state.threshold = self.config.draw_threshold();
        state.denied = None;
        Outcome::Granted
    }

    /// Puts a lease taken out for settling back (the call that would settle it failed
    /// without reaching the server's state), or returns it if the limiter was closed
    /// meanwhile: `close` has taken what the state held, so the lease is this task's.
    async fn restore(&self, lease: Option<HeldLease>) {
        let Some(lease) = lease else {
            return;
        };
        {
            // `closed` is set under this lock (see `close`).
            let mut state = lock(&self.state);
            if !self.closed.load(Ordering::Acquire) {
                if state.older.is_none() && lease.expires > Instant::now() {
                    state.older = Some(lease);
                }
                return;
            }
        }
        let _ = self.give_back(lease).await;
    }

    fn failed(&self, e: &Error) -> Outcome {
        if e.is_outage() {
            self.health.failed();
            Outcome::Outage
        } else {
            Outcome::Failed(Failure::of(e))
        }
    }

    /// `RL.RETURN` of a lease's leftover; a failed return counts the lease as lost. A lease
    /// of id 0 (exempt or shadow) debited nothing: nothing is sent, nothing credited.
    async fn give_back(&self, lease: HeldLease) -> Result<u64, Error> {
        if lease.id == 0 {
            return Ok(0);
        }
        let outcome = async {
            let backend = self
                .backend
                .get(&self.conn, self.config.limiter.timeout)
                .await?;
            let cmd = return_cmd(backend, &self.key, lease.id, lease.left);
            call(&self.conn, &cmd, self.config.limiter.timeout, &self.metrics)
                .await
                .and_then(protocol::integer)
        }
        .await;
        match &outcome {
            Ok(_) => self.metrics.returned(lease.left),
            Err(_) => self.metrics.lease_lost(),
        }
        outcome
    }
}

impl<C: RedisConnection> Drop for Inner<C> {
    /// Best effort: dropped in the main future of a multi-threaded tokio runtime (the end of
    /// a `#[tokio::main]`), the leftovers are returned before the drop ends (at most one
    /// timeout per lease); in a task or a current-thread runtime the return is spawned (it
    /// runs if the runtime keeps running); without a runtime the leases expire on the
    /// server after their TTL. `close().await` is the sure way.
    fn drop(&mut self) {
        let state = self
            .state
            .get_mut()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let now = Instant::now();
        let leases: Vec<HeldLease> = [state.older.take(), state.newer.take()]
            .into_iter()
            .flatten()
            // Spent-out leases too: returning closes them, freeing their slot on the key.
            .filter(|l| l.expires > now && l.id != 0)
            .collect();
        if leases.is_empty() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        // A lease exists only after a call, which resolved the backend.
        let Some(backend) = self.backend.known() else {
            return;
        };
        let mut conn = self.conn.clone();
        let key = self.key.clone();
        let timeout = self.config.limiter.timeout;
        let metrics = Arc::clone(&self.metrics);
        let give_back = async move {
            for lease in leases {
                let cmd = return_cmd(backend, &key, lease.id, lease.left);
                let outcome = tokio::time::timeout(timeout, conn.req_packed_command(&cmd)).await;
                match outcome {
                    Ok(Ok(_)) => metrics.returned(lease.left),
                    _ => metrics.lease_lost(),
                }
            }
        };
        // Outside any task of a multi-threaded runtime (the end of `main`, which the
        // runtime stops right after) the return is made before the drop ends; inside a
        // task the runtime is running (or shutting down, where nothing can be sent).
        let in_task = tokio::task::try_id().is_some();
        if !in_task && runtime.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread {
            tokio::task::block_in_place(|| runtime.block_on(give_back));
        } else {
            runtime.spawn(give_back);
        }
    }
}
