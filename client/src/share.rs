//! [`ShareLimiter`]: a rate share of one key (`RL.SHARE`), spent from a local bucket; the
//! share is refreshed in the background, so a take never waits for Redis.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use rl_core::Limit;

use crate::backend::Selector;
use crate::clock::mono_ns;
use crate::config::check_request;
use crate::conn::{call, RedisConnection};
use crate::fallback::lock;
use crate::lazy::LazyConnection;
use crate::protocol::{share_cmd, share_reply};
use crate::share_state::{By, Demand, Grant, Policy, ShareState, MS};
use crate::{Decision, Error, LimiterConfig, Metrics, Source};

/// Settings of a [`ShareLimiter`].
#[derive(Debug, Clone, PartialEq)]
pub struct ShareConfig {
    /// How often the share is refreshed (`period_ms` of `RL.SHARE`; the server may ask for
    /// sooner, and raises a period under 300 ms to 300 ms). A share is leased for three
    /// (server) periods. Between 10 ms and an hour; default 1 s.
    pub period: Duration,
    /// How much more than its measured demand a holder asks for (`want = demand * (1 +
    /// headroom)`). Default 0: while the wants exceed the rate, headroom a holder does not
    /// use is quota the others are short of (the division is max-min by want); while they
    /// fit, the server gives every holder more than it wants anyway, and a demand that
    /// strays from the one reported is reported early.
    pub headroom: f64,
    /// How long the `Allow` policy lets out `rate / holders` (the last known holders) in
    /// one outage once no share may be used; after it, nothing until Redis answers.
    /// Default 30 s.
    pub allow_for: Duration,
    /// Timeout of each `RL.SHARE` call, the failure policy, `instances` (the holders assumed
    /// before any were seen), `probe_interval` (the retry interval while Redis is down),
    /// `version` and `backend`. (`init` and `max_keys` do not apply.)
    pub limiter: LimiterConfig,
}

impl Default for ShareConfig {
    fn default() -> Self {
        ShareConfig {
            period: Duration::from_secs(1),
            headroom: 0.0,
            allow_for: Duration::from_secs(30),
            limiter: LimiterConfig::default(),
        }
    }
}

impl ShareConfig {
    /// Checks every field; `ShareLimiter::new` calls this.
    pub fn validate(&self) -> Result<(), Error> {
        let ms = self.period.as_millis();
        if !(10..=3_600_000).contains(&ms) {
            return Err(Error::Config("period must be between 10 ms and an hour"));
        }
        if !(self.headroom >= 0.0 && self.headroom.is_finite()) {
            return Err(Error::Config(
                "headroom must be a finite number, at least 0",
            ));
        }
        self.limiter.validate()
    }

    fn period_ms(&self) -> u64 {
        self.period.as_millis() as u64
    }
}

/// What a [`ShareLimiter`] holds right now (see [`ShareLimiter::share`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ShareInfo {
    /// Tokens per second this instance may use (0 when it may use none).
    pub rate: f64,
    /// Its burst.
    pub burst: f64,
    /// Tokens in the local bucket.
    pub tokens: f64,
    /// Live holders of the key at the last answer.
    pub holders: u64,
    /// Whether the failure policy is deciding (Redis down and no usable share).
    pub fallback: bool,
    /// The kind of the operator's pin (`RL.PIN`) that decided the last answer: `Rate` (the
    /// pin's limit is divided), `Block` (no share: every take denied until a call finds
    /// the pin gone) or `Exempt` (every take granted, counted nowhere, until that answer's
    /// lease ends, never after the pin's end); `None` without one.
    pub pinned: Option<crate::PinKind>,
}

/// A limiter of one key shared by a fleet at a fixed rate, where each instance holds a
/// share of the rate (`RL.SHARE`): takes are decided by a local bucket running at the
/// granted rate and burst, and never wait for Redis; the share is refreshed in the
/// background (every `period`, at least 300 ms as the server raises a shorter one, or
/// sooner when the server asks), with the instance's
/// measured demand as its `want`. The server divides the rate max-min fairly by want and
/// keeps the shares any holder may still use within the rate at every instant.
///
/// - A new holder starts with an empty bucket; a new or changed share only clamps the
///   bucket to the new burst, never adds tokens.
/// - A share is used until `sent + lease - margin` (1 % of the lease + 10 ms, on the
///   monotonic clock); a refresh sent at `s` ends the old share at `s + 250 ms` if its
///   answer has not come.
/// - Redis unreachable: the share is used until its lease ends, then the failure policy
///   decides (`Deny`: nothing; `Allow`: `rate / holders` for `allow_for`; `LastKnown`: the
///   last share), counted as fallback decisions; recovery is automatic. Error replies are
///   errors: takes return the last one until a refresh succeeds.
/// - [`close`](Self::close) gives the share back (`RELEASE`); dropping the last handle does
///   the same, best effort. A forked child is a new holder with an empty bucket.
///
/// Every limiter object is its own holder (clones are handles to the same holder).
/// `rate / holders` should leave each holder a burst of at least one token: `cap` at least
/// the number of holders.
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use rl_client::{limit, ShareConfig, ShareLimiter};
/// let client = redis::Client::open("redis://127.0.0.1:6379/")?;
/// // The whole fleet may call the partner API 1000 times a second, bursts of 100.
/// let partner = ShareLimiter::from_client(client, "partner-api", limit(1000.0, 100.0)?,
///     ShareConfig::default())?;
/// if partner.take(1).await?.allowed {
///     // call the partner API
/// }
/// partner.close().await?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct ShareLimiter<C: RedisConnection> {
    inner: Arc<Inner<C>>,
}

impl<C: RedisConnection> Clone for ShareLimiter<C> {
    fn clone(&self) -> Self {
        ShareLimiter {
            inner: Arc::clone(&self.inner),
        }
    }
}

#[derive(Debug)]
struct Inner<C: RedisConnection> {
    conn: C,
    key: String,
    limit: Limit,
    config: ShareConfig,
    policy: Policy,
    metrics: Arc<Metrics>,
    backend: Selector,
    /// The takers' state. The refresh task never waits for this lock (a thread taking in a
    /// tight loop would starve it): it posts what happened to `mail`, which the next take
    /// (or `share()`) applies, in order, before deciding.
    state: Mutex<Holder>,
    mail: Mutex<Vec<Event>>,
    has_mail: AtomicBool,
    /// The holder id and the process generation it was made in (a copy of the holder's,
    /// for the refresh task).
    id: Mutex<(Vec<u8>, u64)>,
    /// Tokens asked for so far (granted or denied): the demand the refresh measures.
    attempted: AtomicU64,
    /// The refresh task's own: the measured demand, and the attempts already counted in it.
    demand: Mutex<(Demand, u64)>,
    /// The recent demand, when it strayed from the one the last call reported: the next
    /// call is early, and reports it.
    early: Mutex<Option<f64>>,
    /// The last call was answered (a stray in demand is no reason to call during an
    /// outage).
    answered_last: AtomicBool,
    /// The share the last answer granted (tokens per second, as `f64` bits).
    granted: AtomicU64,
    closed: AtomicBool,
    /// [`ShareLimiter::abandon`]: no refresh, no release.
    abandoned: AtomicBool,
    refresher: Mutex<Option<tokio::task::AbortHandle>>,
}

/// A stored error reply (errors are not `Clone`).
#[derive(Debug, Clone)]
enum Failure {
    Server(String),
    Reply(String),
    Config(&'static str),
}

impl Failure {
    fn of(e: &Error) -> Failure {
        match e {
            Error::Server(t) => Failure::Server(t.clone()),
            Error::Config(t) => Failure::Config(t),
            other => Failure::Reply(other.to_string()),
        }
    }

    fn error(&self) -> Error {
        match self {
            Failure::Server(t) => Error::Server(t.clone()),
            Failure::Reply(t) => Error::Reply(t.clone()),
            Failure::Config(t) => Error::Config(t),
        }
    }
}

/// What the refresh task saw, for the takers to apply (times: monotonic ns).
#[derive(Debug, Clone)]
enum Event {
    /// A call was sent (the old share ends at `sent + HOLD` unless answered).
    Sending { sent: u64, generation: u64 },
    /// Its answer arrived at `at`.
    Answered {
        sent: u64,
        grant: Grant,
        at: u64,
        generation: u64,
    },
    /// It was an outage; `refused`: it never left this process.
    Outage {
        refused: bool,
        at: u64,
        generation: u64,
    },
    /// It was answered with an error reply.
    Failed { failure: Failure, generation: u64 },
}

#[derive(Debug)]
struct Holder {
    id: Vec<u8>,
    /// The process generation the id was made in (see [`forks`]).
    generation: u64,
    state: ShareState,
    /// The last call was an outage.
    down: bool,
    /// The last call was answered with an error reply.
    failure: Option<Failure>,
}

/// Forks seen by this process: a child gets a new holder id and an empty bucket (its
/// parent's share is its parent's).
static FORKS: AtomicU64 = AtomicU64::new(0);

fn forks() -> u64 {
    FORKS.load(Ordering::Relaxed)
}

#[cfg(unix)]
fn watch_forks() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    extern "C" fn child() {
        FORKS.fetch_add(1, Ordering::Relaxed);
    }
    ONCE.call_once(|| {
        // SAFETY: registers a handler that only increments an atomic, which is
        // async-signal-safe, as a handler run in the child after fork must be.
        unsafe {
            libc::pthread_atfork(None, None, Some(child));
        }
    });
}

#[cfg(not(unix))]
fn watch_forks() {}

/// A holder id unique per limiter object and process: pid, a process-wide counter, the
/// wall clock and a random draw (1..64 bytes, as the protocol requires).
fn new_holder_id() -> Vec<u8> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let random = (crate::jitter::unit() * (1u64 << 52) as f64) as u64;
    format!(
        "{}-{}-{:x}-{:x}",
        std::process::id(),
        n,
        crate::clock::wall_ns(),
        random
    )
    .into_bytes()
}

impl ShareLimiter<LazyConnection> {
    /// A share limiter over `client` that needs no server to be built (see
    /// [`LazyConnection`]). Must be called within a tokio runtime.
    pub fn from_client(
        client: redis::Client,
        key: impl Into<String>,
        limit: Limit,
        config: ShareConfig,
    ) -> Result<Self, Error> {
        ShareLimiter::new(LazyConnection::new(client), key, limit, config)
    }
}

impl<C: RedisConnection> ShareLimiter<C> {
    /// A holder of a share of `limit` on `key`; its first `RL.SHARE` is sent at once, in the
    /// background. Must be called within a tokio runtime (the refresh runs on a task).
    pub fn new(
        conn: C,
        key: impl Into<String>,
        limit: Limit,
        config: ShareConfig,
    ) -> Result<Self, Error> {
        Self::with_metrics(conn, key, limit, config, Arc::new(Metrics::new()))
    }

    /// Like [`new`](Self::new), counting into shared `metrics`.
    pub fn with_metrics(
        conn: C,
        key: impl Into<String>,
        limit: Limit,
        config: ShareConfig,
        metrics: Arc<Metrics>,
    ) -> Result<Self, Error> {
        config.validate()?;
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| {
            Error::Config("a ShareLimiter refreshes on a task: create it within a tokio runtime")
        })?;
        watch_forks();
        let now = mono_ns();
        let id = new_holder_id();
        let policy = Policy {
            policy: config.limiter.policy,
            rate: limit.rate(),
            cap: limit.cap(),
            instances: u64::from(config.limiter.instances),
            allow_for: config.allow_for.as_nanos().min(u64::MAX as u128) as u64,
        };
        let inner = Arc::new(Inner {
            conn,
            key: key.into(),
            backend: Selector::new(config.limiter.backend),
            policy,
            limit,
            config,
            metrics,
            state: Mutex::new(Holder {
                id: id.clone(),
                generation: forks(),
                state: ShareState::new(now),
                down: false,
                failure: None,
            }),
            mail: Mutex::new(Vec::new()),
            has_mail: AtomicBool::new(false),
            id: Mutex::new((id, forks())),
            attempted: AtomicU64::new(0),
            demand: Mutex::new((Demand::new(now), 0)),
            early: Mutex::new(None),
            answered_last: AtomicBool::new(false),
            granted: AtomicU64::new(0),
            closed: AtomicBool::new(false),
            abandoned: AtomicBool::new(false),
            refresher: Mutex::new(None),
        });
        Inner::start(&inner, &runtime);
        Ok(ShareLimiter { inner })
    }

    /// The counters of this limiter (`redis_calls` counts its `RL.SHARE` calls).
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.inner.metrics
    }

    /// This holder's id (new in a forked child).
    pub fn holder_id(&self) -> Vec<u8> {
        self.inner.adopt_fork();
        lock(&self.inner.state).id.clone()
    }

    /// The share held now, the local bucket and the holders seen.
    pub fn share(&self) -> ShareInfo {
        self.inner.adopt_fork();
        let mut holder = lock(&self.inner.state);
        self.inner.read_mail(&mut holder);
        let now = mono_ns();
        // Settles what ended by now, without counting a take.
        let view = holder.state.peek(now);
        ShareInfo {
            rate: view.0,
            burst: view.1,
            tokens: view.2,
            holders: holder.state.last().map_or(0, |g| g.holders),
            fallback: holder.state.in_fallback(),
            pinned: holder.state.last().and_then(|g| g.pinned),
        }
    }

    /// Decides on `n` tokens from the local bucket: never waits for Redis. Errs when `n` is
    /// 0 or above the cap, after [`close`](Self::close), and while the last refresh was
    /// answered with an error reply ([`Error::Server`]; [`Error::Config`] if the module is
    /// not loaded).
    pub async fn take(&self, n: u64) -> Result<Decision, Error> {
        self.try_take(n)
    }

    /// [`take`](Self::take) without `async`: the same decision, for synchronous code.
    pub fn try_take(&self, n: u64) -> Result<Decision, Error> {
        let inner = &self.inner;
        check_request(n, &inner.limit)?;
        let answer = inner.metrics.answer();
        if inner.closed.load(Ordering::Acquire) {
            answer.errored(&Error::Closed);
            return Err(Error::Closed);
        }
        inner.attempted.fetch_add(n, Ordering::Relaxed);
        let local = {
            let mut holder = lock(&inner.state);
            if holder.generation != forks() {
                drop(holder);
                inner.adopt_fork();
                holder = lock(&inner.state);
            }
            inner.read_mail(&mut holder);
            if let Some(failure) = &holder.failure {
                let e = failure.error();
                drop(holder);
                answer.errored(&e);
                return Err(e);
            }
            let down = holder.down;
            holder
                .state
                .decide(n as f64, mono_ns(), down, &inner.policy)
        };
        let fallback = local.by == By::Fallback;
        answer.decided(local.allowed, if local.allowed { n } else { 0 }, fallback);
        let source = if fallback {
            Source::Fallback
        } else {
            Source::Share
        };
        let cap = inner.limit.cap();
        let reset_after = Duration::from_nanos(local.reset_after);
        if local.allowed {
            let d = Decision::granted(n, local.remaining, reset_after, cap, source);
            return Ok(Decision {
                pinned: local.pinned,
                ..d
            });
        }
        let retry_after = match local.wait {
            Some(ns) => Duration::from_nanos(ns),
            None if fallback && inner.policy.policy == crate::FailurePolicy::Deny => {
                inner.config.limiter.deny_retry_after
            }
            None => inner.config.period,
        };
        let d = Decision::denied(local.remaining, retry_after, reset_after, cap, source);
        Ok(Decision {
            pinned: local.pinned,
            ..d
        })
    }

    /// Stops refreshing and never releases, as a holder whose process died: the share
    /// ends with its lease on the server, and takes go on from what is left of it. For
    /// failure drills (the incident replay kills an instance with it) and tests.
    pub fn abandon(&self) {
        let inner = &self.inner;
        inner.abandoned.store(true, Ordering::Release);
        if let Some(task) = lock(&inner.refresher).take() {
            task.abort();
        }
    }

    /// Gives the share back (`RL.SHARE ... RELEASE`: the server hands it to the others once
    /// its hold ends) and stops refreshing; later takes answer [`Error::Closed`]. Waits for
    /// the answer up to the limiter's timeout. The release runs on a task of its own: a
    /// `close` whose future is dropped still releases.
    pub async fn close(&self) -> Result<(), Error> {
        let inner = &self.inner;
        if inner.closed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        if let Some(task) = lock(&inner.refresher).take() {
            task.abort();
        }
        let release = Arc::clone(inner).release();
        let wait = inner.config.limiter.timeout;
        match tokio::time::timeout(wait, tokio::spawn(release)).await {
            Ok(Ok(outcome)) => outcome,
            Ok(Err(_)) => Err(Error::Closed),
            Err(_) => Err(Error::Timeout(wait)),
        }
    }
}

impl<C: RedisConnection> Inner<C> {
    /// Starts the refresh task on `runtime`.
    fn start(inner: &Arc<Inner<C>>, runtime: &tokio::runtime::Handle) {
        let task = runtime.spawn(refresh_loop(Arc::downgrade(inner)));
        *lock(&inner.refresher) = Some(task.abort_handle());
    }

    /// In a forked child: a new holder (new id, empty bucket, no share), refreshing on the
    /// child's runtime if it runs one (the parent's task did not survive the fork).
    fn adopt_fork(self: &Arc<Self>) {
        let generation = forks();
        let mut holder = lock(&self.state);
        if holder.generation == generation {
            return;
        }
        let now = mono_ns();
        holder.id = new_holder_id();
        holder.generation = generation;
        holder.state = ShareState::new(now);
        holder.down = false;
        holder.failure = None;
        lock(&self.mail).clear();
        *lock(&self.id) = (holder.id.clone(), generation);
        *lock(&self.demand) = (Demand::new(now), self.attempted.load(Ordering::Relaxed));
        *lock(&self.early) = None;
        self.answered_last.store(false, Ordering::Release);
        drop(holder);
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            if !self.closed.load(Ordering::Acquire) && !self.abandoned.load(Ordering::Acquire) {
                Inner::start(self, &runtime);
            }
        }
    }

    /// Applies what the refresh task posted, in order (events of an older process
    /// generation are dropped: the child is a new holder).
    fn read_mail(&self, holder: &mut Holder) {
        if !self.has_mail.load(Ordering::Acquire) {
            return;
        }
        let events = {
            let mut mail = lock(&self.mail);
            self.has_mail.store(false, Ordering::Release);
            std::mem::take(&mut *mail)
        };
        for event in events {
            match event {
                Event::Sending { sent, generation } if generation == holder.generation => {
                    holder.state.sending(sent);
                }
                Event::Answered {
                    sent,
                    grant,
                    at,
                    generation,
                } if generation == holder.generation => {
                    holder.state.answered(sent, grant, at);
                    holder.down = false;
                    holder.failure = None;
                }
                Event::Outage {
                    refused,
                    at,
                    generation,
                } if generation == holder.generation => {
                    if refused {
                        holder.state.not_sent(at);
                    }
                    holder.down = true;
                }
                Event::Failed {
                    failure,
                    generation,
                } if generation == holder.generation => {
                    holder.failure = Some(failure);
                }
                _ => {}
            }
        }
    }

    fn post(&self, event: Event) {
        let mut mail = lock(&self.mail);
        mail.push(event);
        self.has_mail.store(true, Ordering::Release);
    }

    /// Whether to call before `refresh_ms` is over: the last call was answered and the
    /// demand since strayed from what it reported ([`Demand::drifted`]; the next call
    /// reports the recent demand).
    fn drifted(&self) -> bool {
        if !self.answered_last.load(Ordering::Acquire) {
            return false;
        }
        let now = mono_ns();
        let mut demand = lock(&self.demand);
        let total = self.attempted.load(Ordering::Relaxed);
        let (d, counted) = &mut *demand;
        let share = f64::from_bits(self.granted.load(Ordering::Relaxed));
        let recent = d.drifted(now, total.saturating_sub(*counted) as f64, share);
        drop(demand);
        if recent.is_some() {
            *lock(&self.early) = recent;
        }
        recent.is_some()
    }

    /// One `RL.SHARE` call with the measured demand; answers when to call next.
    async fn refresh(&self) -> Duration {
        let period = self.config.period;
        let sent = mono_ns();
        let want = {
            let mut demand = lock(&self.demand);
            let total = self.attempted.load(Ordering::Relaxed);
            let (d, counted) = &mut *demand;
            d.attempt(total.saturating_sub(*counted) as f64);
            *counted = total;
            let early = lock(&self.early).take();
            (
                d.want(sent, self.config.headroom, self.limit.rate(), early),
                early.is_some(),
            )
        };
        let (want, confirm) = want;
        self.answered_last.store(false, Ordering::Release);
        // Not from `state`, which a taking thread may hold all the time.
        let (id, generation) = lock(&self.id).clone();
        self.post(Event::Sending { sent, generation });
        let timeout = self.config.limiter.timeout;
        let outcome = async {
            let backend = self.backend.get(&self.conn, timeout).await?;
            let cmd = share_cmd(
                backend,
                &self.key,
                &self.limit,
                &id,
                want,
                self.config.period_ms(),
                false,
                self.config.limiter.version,
            );
            call(&self.conn, &cmd, timeout, &self.metrics)
                .await
                .and_then(share_reply)
        }
        .await;
        let at = mono_ns();
        if self.closed.load(Ordering::Acquire) {
            return period;
        }
        match outcome {
            Ok(r) => {
                let grant = Grant {
                    rate: r.rate,
                    burst: r.burst,
                    lease: r.lease_ms.saturating_mul(MS),
                    refresh: r.refresh_ms.saturating_mul(MS),
                    holders: r.holders,
                    pinned: r.pinned,
                };
                self.post(Event::Answered {
                    sent,
                    grant,
                    at,
                    generation,
                });
                let before = f64::from_bits(self.granted.swap(r.rate.to_bits(), Ordering::Relaxed));
                lock(&self.demand).0.answered(r.rate < before);
                self.answered_last.store(true, Ordering::Release);
                // When the server says, at most its period (a third of the lease: it raises
                // a short one, so that no call comes within the previous call's hold). A
                // server raises a period to 300 ms and no further, so a longer lease (not
                // one of ours) is no reason to call less often than asked: the holder's
                // want would go stale. A little early rather than late: the server counts
                // on a call per period.
                let raised = (r.lease_ms / 3).min(rl_core::share::SHORTEST_PERIOD_MS);
                let mut most = raised.max(self.config.period_ms());
                if confirm {
                    // An early report measured its demand over a short span (a holder whose
                    // demand fell, measured low, would be refused for a whole period): once
                    // past its hold, it is measured again over the span since.
                    most = most.min(CONFIRM_MS);
                }
                let next = Duration::from_millis(r.refresh_ms.clamp(10, most));
                next.mul_f64(1.0 - 0.1 * crate::jitter::unit())
            }
            Err(e) if e.is_outage() => {
                self.post(Event::Outage {
                    refused: refused(&e),
                    at,
                    generation,
                });
                self.config.limiter.probe_interval.min(period)
            }
            Err(e) => {
                self.post(Event::Failed {
                    failure: Failure::of(&e),
                    generation,
                });
                period
            }
        }
    }

    /// `RL.SHARE ... RELEASE` for this holder.
    async fn release(self: Arc<Self>) -> Result<(), Error> {
        let id = {
            let mut holder = lock(&self.state);
            holder.state = ShareState::new(mono_ns());
            holder.id.clone()
        };
        let timeout = self.config.limiter.timeout;
        let backend = self.backend.get(&self.conn, timeout).await?;
        let cmd = share_cmd(
            backend,
            &self.key,
            &self.limit,
            &id,
            0.0,
            self.config.period_ms(),
            true,
            self.config.limiter.version,
        );
        call(&self.conn, &cmd, timeout, &self.metrics)
            .await
            .and_then(share_reply)
            .map(|_| ())
    }
}

/// Whether the call never left this process: the connection was refused.
fn refused(e: &Error) -> bool {
    matches!(e, Error::Redis(r) if r.is_connection_refusal())
}

/// A call that reported an early demand is followed by one this soon at most, past its
/// hold, that measures the demand over the span since.
const CONFIRM_MS: u64 = 400;

/// How often the refresh task looks at the demand between calls: a demand that moved is
/// seen within a few ticks, and the instant it moved to within one.
const DRIFT_TICK: Duration = Duration::from_millis(25);

async fn refresh_loop<C: RedisConnection>(weak: Weak<Inner<C>>) {
    let mut next = Duration::ZERO;
    loop {
        // Until `next`, or sooner if the demand strays (the limiter is not held meanwhile:
        // one dropped without `close` ends this task at the next tick).
        let deadline = tokio::time::Instant::now() + next;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                break;
            }
            tokio::time::sleep(left.min(DRIFT_TICK)).await;
            let Some(inner) = weak.upgrade() else {
                return;
            };
            if inner.closed.load(Ordering::Acquire) {
                return;
            }
            if inner.drifted() {
                break;
            }
        }
        let Some(inner) = weak.upgrade() else {
            return;
        };
        if inner.closed.load(Ordering::Acquire) {
            return;
        }
        next = inner.refresh().await;
    }
}

impl<C: RedisConnection> Drop for Inner<C> {
    /// Best effort, as a prefetching limiter's leftovers: in the main future of a
    /// multi-threaded runtime the release is sent before the drop ends; in a task it is
    /// spawned; without a runtime the share ends with its lease on the server.
    fn drop(&mut self) {
        if self.closed.load(Ordering::Acquire) || self.abandoned.load(Ordering::Acquire) {
            return;
        }
        if let Some(task) = lock(&self.refresher).take() {
            task.abort();
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let Some(backend) = self.backend.known() else {
            return;
        };
        let id = lock(&self.state).id.clone();
        let cmd = share_cmd(
            backend,
            &self.key,
            &self.limit,
            &id,
            0.0,
            self.config.period_ms(),
            true,
            self.config.limiter.version,
        );
        let mut conn = self.conn.clone();
        let timeout = self.config.limiter.timeout;
        let release = async move {
            let _ = tokio::time::timeout(timeout, conn.req_packed_command(&cmd)).await;
        };
        let in_task = tokio::task::try_id().is_some();
        if !in_task && runtime.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread {
            tokio::task::block_in_place(|| runtime.block_on(release));
        } else {
            runtime.spawn(release);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_is_checked() {
        assert!(ShareConfig::default().validate().is_ok());
        let bad = [
            ShareConfig {
                period: Duration::from_millis(5),
                ..Default::default()
            },
            ShareConfig {
                headroom: -1.0,
                ..Default::default()
            },
        ];
        for c in bad {
            assert!(c.validate().is_err(), "{c:?}");
        }
    }

    #[test]
    fn holder_ids_are_unique_and_within_the_protocol() {
        let a = new_holder_id();
        let b = new_holder_id();
        assert_ne!(a, b);
        assert!((1..=64).contains(&a.len()), "{}", a.len());
    }

    #[test]
    fn needs_a_runtime() {
        let client = redis::Client::open("redis://127.0.0.1:1/").unwrap();
        let limit = Limit::new(10.0, 10.0).unwrap();
        let e = ShareLimiter::from_client(client, "k", limit, ShareConfig::default()).unwrap_err();
        assert!(matches!(e, Error::Config(_)), "{e:?}");
    }
}
