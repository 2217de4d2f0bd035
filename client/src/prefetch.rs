//! [`PrefetchLimiter`]: grants from a locally held lease batch, renewed ahead over
//! `RL.LEASE`, with leftovers settled on renewal and returned on close.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

use rl_client_core::budget::Backend as CoreBackend;
use rl_client_core::lease::{parse_lease, return_command, LeaseTarget};
use rl_client_core::prefetch::{
    Begin, Failure as CallFailure, Landed, Lease, Ledger, LedgerConfig, Local, LATE_SLACK,
};
use rl_core::Limit;

use crate::backend::Selector;
use crate::budget::to_reply;
use crate::clock::mono_ns;
use crate::config::check_request;
use crate::conn::{call, RedisConnection};
use crate::fallback::{lock, Fallback};
use crate::health::Health;
use crate::lazy::LazyConnection;
use crate::{Backend, Decision, Error, Metrics, PrefetchConfig, Source};

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
    /// The lease ledger (the client core's: what is held, when to renew, what a call
    /// leaves) and what the shell keeps beside it.
    state: Mutex<State>,
    /// Woken when a lease call ends.
    fetched: Arc<Notify>,
    backend: Selector,
    /// `close` was called: no more lease calls; late leases are returned.
    closed: AtomicBool,
}

#[derive(Debug)]
struct State {
    ledger: Ledger,
    /// How the last lease call ended (`(flight, outcome)`), for the callers that waited.
    last: (u64, Outcome),
    /// The waiters standing in the ledger's line, by number.
    wakers: HashMap<u64, Arc<Notify>>,
    /// Lease-call tasks running (until what they return is returned): `close` waits for
    /// them.
    tasks: usize,
}

impl State {
    /// Counts what the ledger counted since the last look.
    fn sync(&mut self, metrics: &Metrics) {
        // Most takes count nothing here (a grant from memory is counted by `Answer`): no
        // atomic add for them.
        if self.ledger.counted() {
            metrics.ledger(&self.ledger.drain());
        }
    }

    fn wake(&mut self, granted: bool) -> Vec<Arc<Notify>> {
        let woken = self.ledger.wake(granted);
        woken
            .into_iter()
            .filter_map(|w| self.wakers.remove(&w))
            .collect()
    }
}

/// How a lease call ended, for the callers that waited for it.
#[derive(Debug, Clone, Default)]
enum Outcome {
    #[default]
    None,
    /// Tokens installed in the ledger.
    Granted,
    /// Redis had fewer than `MIN` tokens (the ledger remembers it per size).
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

/// How a failed call failed, as the ledger reads it.
fn call_failure(e: &Error) -> CallFailure {
    if !e.is_outage() {
        CallFailure::Refused
    } else if e.may_have_run() {
        CallFailure::Unknown
    } else {
        CallFailure::NotSent
    }
}

fn core_backend(b: Backend) -> CoreBackend {
    match b {
        Backend::Functions => CoreBackend::Functions,
        _ => CoreBackend::Module,
    }
}

fn cmd(args: &[Vec<u8>]) -> redis::Cmd {
    let mut c = redis::cmd(std::str::from_utf8(&args[0]).unwrap_or("RL.LEASE"));
    for a in &args[1..] {
        c.arg(a.as_slice());
    }
    c
}

fn nanos(d: Duration) -> u64 {
    d.as_nanos().min(u128::from(u64::MAX)) as u64
}

/// A take's place in the ledger's line, and the lease call it made (if any). Leaving
/// (returned, timed out, cancelled) it takes itself out of the line (waking the first in
/// line if no call is in the air: it would otherwise wait for a call nobody makes), and
/// gives back what its call spent for it if it never took it.
struct Place<'a, C: RedisConnection> {
    inner: &'a Inner<C>,
    /// Its number in line, 0 until it first stands in line.
    id: AtomicU64,
    /// Its own lease call, until it took (or gave up) what the call brought it.
    own: AtomicU64,
    n: u64,
    /// Made when it first stands in line: most takes are served from memory and never do
    /// (no allocation for them).
    wake: std::sync::OnceLock<Arc<Notify>>,
}

impl<'a, C: RedisConnection> Place<'a, C> {
    fn new(inner: &'a Inner<C>, n: u64) -> Self {
        Place {
            inner,
            id: AtomicU64::new(0),
            own: AtomicU64::new(0),
            n,
            wake: std::sync::OnceLock::new(),
        }
    }

    fn wake(&self) -> &Arc<Notify> {
        self.wake.get_or_init(|| Arc::new(Notify::new()))
    }

    /// Stands in line (at the front for its own call, else in arrival order), unless it is
    /// there already.
    fn enter(&self, state: &mut State, front: bool) {
        let before = self.id.load(Ordering::Relaxed);
        let again = (before != 0).then_some(before);
        let id = state.ledger.enter_line(self.n, front, again);
        self.id.store(id, Ordering::Relaxed);
        state.wakers.insert(id, Arc::clone(self.wake()));
    }
}

impl<C: RedisConnection> Drop for Place<'_, C> {
    fn drop(&mut self) {
        let id = *self.id.get_mut();
        let own = *self.own.get_mut();
        if id == 0 && own == 0 {
            // Never stood in line: served without waiting.
            return;
        }
        let next = {
            let mut state = lock(&self.inner.state);
            if own != 0 {
                // Cancelled or timed out before taking what its call brought: the tokens
                // spent for it go back into the lease.
                state.ledger.release(own, false, mono_ns());
            }
            state.wakers.remove(&id);
            let next = if id == 0 {
                None
            } else {
                state.ledger.leave_line(id)
            };
            next.and_then(|w| state.wakers.remove(&w))
        };
        if let Some(next) = next {
            next.notify_one();
        }
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
        let key = key.into();
        let ledger = Ledger::new(
            LeaseTarget {
                key: key.clone().into_bytes(),
                rate: limit.rate(),
                cap: limit.cap(),
                init: config.limiter.init,
                version: config.limiter.version,
            },
            LedgerConfig {
                batch: config.batch,
                ttl_ms: config.ttl_ms(),
                renew_at: config.renew_at,
                jitter: config.jitter,
                timeout: nanos(config.limiter.timeout),
            },
        )
        .map_err(|_| Error::Config("invalid prefetch configuration"))?;
        Ok(PrefetchLimiter {
            inner: Arc::new(Inner {
                conn,
                key,
                backend: Selector::new(config.limiter.backend),
                health: Health::new(config.limiter.probe_interval),
                fallback: Fallback::new(limit, &config.limiter),
                limit,
                config,
                metrics,
                state: Mutex::new(State {
                    ledger,
                    last: (0, Outcome::None),
                    wakers: HashMap::new(),
                    tasks: 0,
                }),
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
        let held = state.ledger.held(mono_ns());
        state.sync(&self.inner.metrics);
        held
    }

    /// Decides on `n` tokens: from the held batch when it has them (no Redis call), else
    /// by an `RL.LEASE` call made for this request, else (an outage) by the failure policy.
    /// Returns within [`LimiterConfig::timeout`](crate::LimiterConfig::timeout), except a
    /// take that waited for another take's (or a renewal's) lease call: that call is not
    /// this take's to judge, so it waits for it (up to the call's own bound, the
    /// connection's response timeout or at most the late-reply bound,
    /// `max(10 s, ttl + timeout + 1 s)`) and, if it must then ask Redis itself, gives its
    /// own call the whole timeout. Waiting takes are served in arrival order.
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
            let backend = match inner.backend.get(&inner.conn, inner.late_bound()).await {
                Ok(b) => core_backend(b),
                Err(e) if e.is_outage() => {
                    inner.health.failed();
                    return Ok(self.fallback(n, answer));
                }
                Err(e) => {
                    answer.errored(&e);
                    return Err(e);
                }
            };
            enum Next {
                Fallback,
                Deny,
                Start(u64, Vec<Vec<u8>>),
                Join(u64),
            }
            let next = {
                let mut state = lock(&inner.state);
                let now = tokio::time::Instant::now();
                let flying = state.ledger.in_flight();
                if !flying && started && now >= deadline {
                    // Others spent what this take's own call brought, and its time is up.
                    Next::Deny
                } else if !flying && !inner.health.may_call() {
                    Next::Fallback
                } else if flying && inner.health.is_down() {
                    // A probe is in flight, or the call's own caller judged it an outage: do
                    // not wait for a Redis believed down.
                    Next::Fallback
                } else {
                    match state.ledger.begin(backend, n, mono_ns()) {
                        Begin::Closed => Next::Fallback,
                        Begin::Busy { flight } => {
                            place.enter(&mut state, false);
                            Next::Join(flight)
                        }
                        Begin::Send { flight, command } => {
                            if !started {
                                // A take that waited behind other calls gives its own the
                                // whole timeout.
                                started = true;
                                deadline = now + timeout;
                            }
                            place.own.store(flight, Ordering::Relaxed);
                            place.enter(&mut state, true);
                            Next::Start(flight, command)
                        }
                    }
                }
            };
            // The call waited for: another's (`seen`) or its own.
            let (seen, own) = match next {
                Next::Fallback if inner.closed.load(Ordering::Acquire) => {
                    answer.errored(&Error::Closed);
                    return Err(Error::Closed);
                }
                Next::Fallback => return Ok(self.fallback(n, answer)),
                Next::Deny => {
                    let decision = self.denied(Duration::ZERO, Source::Server);
                    answer.decided(false, 0, false);
                    return Ok(decision);
                }
                Next::Join(seen) => (seen, 0),
                Next::Start(flight, command) => {
                    if let Some(inline) = Inner::spawn_fetch(inner, flight, command) {
                        inline.await;
                    }
                    (0, flight)
                }
            };
            asked = true;
            // Only a call's own caller judges it by its timeout. A take waiting behind
            // another's call waits for it past its own deadline (a busy process is no
            // outage), up to the call's own bound: the call ends by then.
            let until = if own != 0 {
                deadline
            } else {
                let bound = inner.late_bound() + Duration::from_nanos(LATE_SLACK);
                deadline.max(tokio::time::Instant::now() + bound)
            };
            let woken = tokio::time::timeout_at(until, place.wake().notified())
                .await
                .is_ok();
            if own != 0 {
                let (claimed, ended, last, woken_behind, renew) = {
                    let mut state = lock(&inner.state);
                    let ended = state.ledger.has_ended(own);
                    let claimed = if ended {
                        state.ledger.claim(own)
                    } else if !woken {
                        // Redis is slow: an outage for this caller and the next ones (the
                        // call goes on; its outcome ends the outage if it succeeds).
                        state.ledger.give_up(own)
                    } else {
                        None
                    };
                    let last = (state.last.0 == own).then(|| state.last.1.clone());
                    let behind = if !ended && claimed.is_none() && !woken {
                        inner.health.failed();
                        state.wake(false)
                    } else {
                        Vec::new()
                    };
                    let now = mono_ns();
                    let left = state.ledger.held(now);
                    // Its grant may leave the batch at the threshold: renew as a take from
                    // memory would.
                    let renew = match (claimed, inner.backend.known()) {
                        (Some(_), Some(b)) if !inner.closed.load(Ordering::Acquire) => {
                            let down = inner.health.is_down();
                            match state.ledger.renewal_due(now, down) {
                                true => match state.ledger.begin(core_backend(b), 0, now) {
                                    Begin::Send { flight, command } => Some((flight, command)),
                                    _ => None,
                                },
                                false => None,
                            }
                        }
                        _ => None,
                    };
                    state.sync(&inner.metrics);
                    place.own.store(0, Ordering::Relaxed);
                    (claimed.map(|t| (t, left)), ended, last, behind, renew)
                };
                woken_behind.iter().for_each(|w| w.notify_one());
                if let Some((flight, command)) = renew {
                    inner.renew(flight, command);
                }
                if let Some((tokens, left)) = claimed {
                    answer.decided(true, tokens, false);
                    let cap = inner.limit.cap();
                    return Ok(Decision::granted(
                        tokens,
                        left as f64,
                        Duration::ZERO,
                        cap,
                        Source::Server,
                    ));
                }
                if !ended && !woken {
                    return Ok(self.fallback(n, answer));
                }
                match last {
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
                    _ => continue,
                }
            }
            let last = {
                // The outcome of the call it waited for, once its task recorded it.
                let state = lock(&inner.state);
                (state.last.0 == seen).then(|| state.last.1.clone())
            };
            match last {
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
                // Granted or denied: the ledger says what is there now.
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
        let leases = {
            // The flag and the ledger close together: a lease call landing from now on
            // returns its lease itself, never installs it.
            let mut state = lock(&inner.state);
            inner.closed.store(true, Ordering::Release);
            let leases = state.ledger.close(mono_ns());
            state.sync(&inner.metrics);
            leases
        };
        let wait = inner.config.limiter.timeout;
        let _ = tokio::time::timeout(wait, async {
            loop {
                let notified = inner.fetched.notified();
                tokio::pin!(notified);
                notified.as_mut().enable();
                let idle = {
                    let state = lock(&inner.state);
                    !state.ledger.in_flight() && state.tasks == 0
                };
                if idle {
                    return;
                }
                notified.await;
            }
        })
        .await;
        let mut credited = 0;
        let mut failure = None;
        for lease in leases {
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
        let inner = &self.inner;
        inner.closed.store(true, Ordering::Release);
        lock(&inner.state).ledger.close(mono_ns());
    }

    /// A grant from the held batch, or a denial Redis gave lately for this size; `None`
    /// if Redis must be asked. Starts a background renewal when the batch runs low.
    fn decide_locally(&self, n: u64) -> Option<Decision> {
        let inner = &self.inner;
        let now = mono_ns();
        let closed = inner.closed.load(Ordering::Acquire);
        let mut state = lock(&inner.state);
        let local = state.ledger.take(n, now, inner.health.is_down() || closed);
        let decision = match local {
            Local::Ask => None,
            Local::Denied { retry_after_ms } => {
                Some(self.denied(Duration::from_millis(retry_after_ms), Source::Lease))
            }
            Local::Granted { left, renew } => {
                // A lease exists only after a call, which resolved the backend.
                let fetch = match renew.then(|| inner.backend.known()).flatten() {
                    Some(b) => match state.ledger.begin(core_backend(b), 0, now) {
                        Begin::Send { flight, command } => Some((flight, command)),
                        _ => None,
                    },
                    None => None,
                };
                state.sync(&inner.metrics);
                drop(state);
                if let Some((flight, command)) = fetch {
                    inner.renew(flight, command);
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
        };
        state.sync(&inner.metrics);
        decision
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
    /// How long a lease reply is awaited at most: the client core's late-reply bound,
    /// `max(10 s, ttl + timeout + 1 s)`.
    fn late_bound(&self) -> Duration {
        Duration::from_nanos(rl_client_core::prefetch::late_reply_bound(
            nanos(self.config.limiter.timeout),
            self.config.ttl_ms(),
        ))
    }

    /// Starts renewal `flight` in the background.
    fn renew(self: &Arc<Self>, flight: u64, command: Vec<Vec<u8>>) {
        if let Some(inline) = Inner::spawn_fetch(self, flight, command) {
            // No runtime to spawn on: the next take that needs Redis renews.
            drop(inline);
            let mut state = lock(&self.state);
            state.ledger.failed(flight, CallFailure::NotSent, mono_ns());
            state.sync(&self.metrics);
        }
    }

    /// Starts lease call `flight` on its own task; without a runtime, answers the future
    /// for the caller to run inline.
    fn spawn_fetch(
        inner: &Arc<Inner<C>>,
        flight: u64,
        command: Vec<Vec<u8>>,
    ) -> Option<std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>> {
        let task = Box::pin(Arc::clone(inner).fetch(flight, command));
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(task);
                None
            }
            Err(_) => Some(task),
        }
    }

    /// One `RL.LEASE` call, as the ledger built it: what it brings is installed in the
    /// ledger (whoever waits spends from there) or returned if it cannot be; the waiters
    /// are woken with the outcome.
    async fn fetch(self: Arc<Self>, flight: u64, command: Vec<Vec<u8>>) {
        lock(&self.state).tasks += 1;
        let result = call(&self.conn, &cmd(&command), self.late_bound(), &self.metrics).await;
        let now = mono_ns();
        let (outcome, give_back) = {
            let mut state = lock(&self.state);
            let ended = match result {
                Ok(value) => {
                    let reply = to_reply(value);
                    let tokens = parse_lease(&reply).map(|r| r.tokens).ok();
                    match state
                        .ledger
                        .landed(flight, &reply, now, crate::jitter::unit())
                    {
                        Ok(landing) => {
                            self.health.succeeded();
                            if let Some(tokens) = tokens {
                                self.fallback.observe(&self.key, tokens, None, now);
                            }
                            let outcome = match landing.landed {
                                Landed::Granted { .. } => Outcome::Granted,
                                Landed::Denied { .. } => Outcome::Denied,
                                Landed::Stale => Outcome::Stale,
                                Landed::Closed => Outcome::Failed(Failure::Closed),
                            };
                            (outcome, landing.give_back)
                        }
                        Err(e) => (Outcome::Failed(Failure::Reply(e.0)), Vec::new()),
                    }
                }
                Err(e) => {
                    let back = state.ledger.failed(flight, call_failure(&e), now);
                    (self.failed(&e), back)
                }
            };
            state.sync(&self.metrics);
            ended
        };
        for lease in give_back {
            let _ = self.give_back(lease).await;
        }
        let woken = {
            let mut state = lock(&self.state);
            let woken = state.wake(matches!(outcome, Outcome::Granted));
            state.last = (flight, outcome);
            state.tasks -= 1;
            woken
        };
        // Let go of the limiter before waking its callers: if they drop it, the last
        // handle (which returns the leftovers) is theirs, not this task's.
        let fetched = Arc::clone(&self.fetched);
        drop(self);
        woken.iter().for_each(|w| w.notify_one());
        fetched.notify_waiters();
    }

    fn failed(&self, e: &Error) -> Outcome {
        if e.is_outage() {
            self.health.failed();
            Outcome::Outage
        } else {
            Outcome::Failed(Failure::of(e))
        }
    }

    /// `RL.RETURN` of a lease's leftover; a failed return counts the lease as lost.
    async fn give_back(&self, lease: Lease) -> Result<u64, Error> {
        let timeout = self.config.limiter.timeout;
        let outcome = async {
            let backend = core_backend(self.backend.get(&self.conn, timeout).await?);
            let args = return_command(backend, self.key.as_bytes(), lease.id, lease.left);
            let value = call(&self.conn, &cmd(&args), timeout, &self.metrics).await?;
            rl_client_core::lease::parse_return(&to_reply(value)).map_err(|e| Error::Reply(e.0))
        }
        .await;
        let mut state = lock(&self.state);
        state.ledger.returned(&lease, outcome.is_ok());
        state.sync(&self.metrics);
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
        // Spent-out leases too: returning closes them, freeing their slot on the key.
        let leases = state.ledger.close(mono_ns());
        self.metrics.ledger(&state.ledger.drain());
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
        let backend = core_backend(backend);
        let mut conn = self.conn.clone();
        let key = self.key.clone();
        let timeout = self.config.limiter.timeout;
        let metrics = Arc::clone(&self.metrics);
        let give_back = async move {
            for lease in leases {
                let args = cmd(&return_command(
                    backend,
                    key.as_bytes(),
                    lease.id,
                    lease.left,
                ));
                let outcome = tokio::time::timeout(timeout, conn.req_packed_command(&args)).await;
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
