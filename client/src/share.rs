//! [`ShareLimiter`]: a rate share of one key (`RL.SHARE`), spent from a local bucket; the
//! share is refreshed in the background, so a take never waits for Redis. What a take gets,
//! what the next call asks for and when it goes are the client core's
//! ([`rl_client_core::share_holder`]); this shell moves the bytes, waits, and locks.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use rl_core::Limit;

use rl_client_core::budget::Backend as CoreBackend;
use rl_client_core::share::{self as core, Policy, ShareKey};
use rl_client_core::share_holder::{Event, Holder, Refresh, Take, DRIFT_TICK};

use crate::backend::Selector;
use crate::budget::to_reply;
use crate::clock::mono_ns;
use crate::config::check_request;
use crate::conn::{call, RedisConnection};
use crate::fallback::lock;
use crate::lazy::LazyConnection;
use crate::{Backend, Decision, Error, LimiterConfig, Metrics, Source};

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
///   errors, never a policy decision: once the share granted before one ends, takes return
///   it until a refresh succeeds.
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
    limit: Limit,
    config: ShareConfig,
    metrics: Arc<Metrics>,
    backend: Selector,
    /// The takers' half of the holder. The refresh task never waits for this lock (a
    /// thread taking in a tight loop would starve it): it posts what happened to `mail`,
    /// which the next take (or `share()`) applies, in order, before deciding.
    state: Mutex<Taker>,
    mail: Mutex<Vec<Mail>>,
    has_mail: AtomicBool,
    /// The holder id and the process generation it was made in (a copy of the taker's,
    /// for the refresh task).
    id: Mutex<(Vec<u8>, u64)>,
    /// Tokens asked for so far (granted or denied): the demand the refresh measures.
    attempted: AtomicU64,
    /// The refresh task's half of the holder.
    refresh: Mutex<Refresh>,
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

/// What the refresh task saw, for the takers to apply: the core's event, the process
/// generation it belongs to, and the error reply a failed call got.
#[derive(Debug, Clone)]
struct Mail {
    event: Event,
    generation: u64,
    failure: Option<Failure>,
}

#[derive(Debug)]
struct Taker {
    id: Vec<u8>,
    /// The process generation the id was made in (see [`forks`]).
    generation: u64,
    holder: Holder,
    /// The error reply the last call got (the core says when takes answer it).
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
            policy: match config.limiter.policy {
                crate::FailurePolicy::Allow => core::FailurePolicy::Allow,
                crate::FailurePolicy::LastKnown => core::FailurePolicy::LastKnown,
                crate::FailurePolicy::Deny => core::FailurePolicy::Deny,
            },
            allow_share: 1.0,
            rate: limit.rate(),
            cap: limit.cap(),
            instances: u64::from(config.limiter.instances),
            allow_for: nanos(config.allow_for),
        };
        let key = ShareKey {
            key: key.into().into_bytes(),
            rate: limit.rate(),
            cap: limit.cap(),
            period_ms: config.period_ms(),
            version: config.limiter.version,
        };
        let holder = Holder::new(
            policy,
            nanos(config.period),
            nanos(config.limiter.deny_retry_after),
            now,
        );
        let refresh = Refresh::new(key, config.headroom, now);
        let inner = Arc::new(Inner {
            conn,
            backend: Selector::new(config.limiter.backend),
            limit,
            config,
            metrics,
            state: Mutex::new(Taker {
                id: id.clone(),
                generation: forks(),
                holder,
                failure: None,
            }),
            mail: Mutex::new(Vec::new()),
            has_mail: AtomicBool::new(false),
            id: Mutex::new((id, forks())),
            attempted: AtomicU64::new(0),
            refresh: Mutex::new(refresh),
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
        let mut taker = lock(&self.inner.state);
        self.inner.read_mail(&mut taker);
        // Settles what ended by now, without counting a take.
        let i = taker.holder.info(mono_ns());
        ShareInfo {
            rate: i.rate,
            burst: i.burst,
            tokens: i.tokens,
            holders: i.holders,
            fallback: i.fallback,
            pinned: i.pinned,
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
        let take = {
            let mut taker = lock(&inner.state);
            if taker.generation != forks() {
                drop(taker);
                inner.adopt_fork();
                taker = lock(&inner.state);
            }
            inner.read_mail(&mut taker);
            match taker.holder.take(n, mono_ns()) {
                Some(take) => take,
                None => {
                    let e = taker.failure.as_ref().map_or(Error::Closed, Failure::error);
                    drop(taker);
                    answer.errored(&e);
                    return Err(e);
                }
            }
        };
        answer.decided(take.allowed, take.tokens, take.fallback);
        Ok(decision(&take, n, inner.limit.cap()))
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
        holder.holder.reset(now);
        holder.failure = None;
        lock(&self.mail).clear();
        *lock(&self.id) = (holder.id.clone(), generation);
        lock(&self.refresh).reset(now, self.attempted.load(Ordering::Relaxed));
        drop(holder);
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            if !self.closed.load(Ordering::Acquire) && !self.abandoned.load(Ordering::Acquire) {
                Inner::start(self, &runtime);
            }
        }
    }

    /// Applies what the refresh task posted, in order (events of an older process
    /// generation are dropped: the child is a new holder).
    fn read_mail(&self, taker: &mut Taker) {
        if !self.has_mail.load(Ordering::Acquire) {
            return;
        }
        let events = {
            let mut mail = lock(&self.mail);
            self.has_mail.store(false, Ordering::Release);
            std::mem::take(&mut *mail)
        };
        for m in events
            .into_iter()
            .filter(|m| m.generation == taker.generation)
        {
            match m.event {
                Event::Answered { .. } => taker.failure = None,
                Event::Failed => taker.failure = m.failure,
                _ => {}
            }
            taker.holder.apply(&m.event);
        }
    }

    fn post(&self, event: Event, generation: u64, failure: Option<Failure>) {
        let mut mail = lock(&self.mail);
        mail.push(Mail {
            event,
            generation,
            failure,
        });
        self.has_mail.store(true, Ordering::Release);
    }

    /// Whether to call before the next call is due (the core's [`Refresh::drifted`]).
    fn drifted(&self) -> bool {
        let total = self.attempted.load(Ordering::Relaxed);
        lock(&self.refresh).drifted(mono_ns(), total)
    }

    /// One `RL.SHARE` call with the measured demand; answers when to call next.
    async fn refresh(&self) -> Duration {
        let timeout = self.config.limiter.timeout;
        // Not from `state`, which a taking thread may hold all the time.
        let (id, generation) = lock(&self.id).clone();
        let probe = nanos(self.config.limiter.probe_interval);
        let backend = match self.backend.get(&self.conn, timeout).await {
            Ok(b) => core_backend(b),
            Err(e) => return self.failure(e, generation, probe),
        };
        let sent = mono_ns();
        let attempted = self.attempted.load(Ordering::Relaxed);
        let (args, sending) = lock(&self.refresh).send(backend, &id, attempted, sent);
        self.post(sending, generation, None);
        let outcome = call(&self.conn, &command(&args), timeout, &self.metrics).await;
        let at = mono_ns();
        if self.closed.load(Ordering::Acquire) {
            return self.config.period;
        }
        match outcome {
            Ok(v) => {
                let reply = to_reply(v);
                let jitter = crate::jitter::unit();
                let answered = lock(&self.refresh).answered(&reply, sent, at, jitter);
                match answered {
                    Ok((event, next)) => {
                        self.post(event, generation, None);
                        Duration::from_nanos(next)
                    }
                    Err(e) => self.failure(Error::Reply(e.0), generation, probe),
                }
            }
            Err(e) => self.failure(e, generation, probe),
        }
    }

    /// Posts a failed call (an outage, or an error reply); answers when to call next.
    fn failure(&self, e: Error, generation: u64, probe: u64) -> Duration {
        let mut refresh = lock(&self.refresh);
        let (event, next, failure) = if e.is_outage() {
            let (event, next) = refresh.outage(refused(&e), mono_ns(), probe);
            (event, next, None)
        } else {
            let (event, next) = refresh.failed();
            (event, next, Some(Failure::of(&e)))
        };
        drop(refresh);
        self.post(event, generation, failure);
        Duration::from_nanos(next)
    }

    /// `RL.SHARE ... RELEASE` for this holder.
    async fn release(self: Arc<Self>) -> Result<(), Error> {
        let id = {
            let mut taker = lock(&self.state);
            taker.holder.reset(mono_ns());
            taker.id.clone()
        };
        let timeout = self.config.limiter.timeout;
        let backend = core_backend(self.backend.get(&self.conn, timeout).await?);
        let args = lock(&self.refresh).release_command(backend, &id);
        let v = call(&self.conn, &command(&args), timeout, &self.metrics).await?;
        core::parse_share(&to_reply(v))
            .map(|_| ())
            .map_err(|e| Error::Reply(e.0))
    }
}

/// What a take of `n` got, as the shell's [`Decision`].
fn decision(take: &Take, n: u64, cap: f64) -> Decision {
    let source = if take.fallback {
        Source::Fallback
    } else {
        Source::Share
    };
    let reset_after = Duration::from_nanos(take.reset_after);
    let d = if take.allowed {
        Decision::granted(n, take.remaining, reset_after, cap, source)
    } else {
        let retry_after = Duration::from_nanos(take.retry_after);
        Decision::denied(take.remaining, retry_after, reset_after, cap, source)
    };
    Decision {
        pinned: take.pinned,
        ..d
    }
}

/// The arguments the core built, as a command.
fn command(args: &[Vec<u8>]) -> redis::Cmd {
    let mut c = redis::cmd(std::str::from_utf8(&args[0]).unwrap_or("RL.SHARE"));
    for a in &args[1..] {
        c.arg(a.as_slice());
    }
    c
}

fn core_backend(b: Backend) -> CoreBackend {
    match b {
        Backend::Functions => CoreBackend::Functions,
        // `Selector::get` resolves `Auto` to one of the two.
        _ => CoreBackend::Module,
    }
}

fn nanos(d: Duration) -> u64 {
    d.as_nanos().min(u128::from(u64::MAX)) as u64
}

/// Whether the call never left this process: the connection was refused.
fn refused(e: &Error) -> bool {
    matches!(e, Error::Redis(r) if r.is_connection_refusal())
}

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
            tokio::time::sleep(left.min(Duration::from_nanos(DRIFT_TICK))).await;
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
        let args = lock(&self.refresh).release_command(core_backend(backend), &id);
        let cmd = command(&args);
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

    /// A case's reply as redis-rs hands it over (RESP2 strings, RESP3 doubles).
    fn value(j: &serde_json::Value) -> redis::Value {
        use serde_json::Value as J;
        match j {
            J::Null => redis::Value::Nil,
            J::Number(n) => redis::Value::Int(n.as_i64().unwrap()),
            J::String(s) => redis::Value::BulkString(s.clone().into_bytes()),
            J::Array(items) => redis::Value::Array(items.iter().map(value).collect()),
            J::Object(o) => redis::Value::Double(o["double"].as_f64().unwrap()),
            J::Bool(_) => panic!("no booleans in replies"),
        }
    }

    fn ms(d: Duration) -> u64 {
        rl_client_core::share_holder::ms_up(nanos(d))
    }

    /// The golden cases (protocol/client-cases/share.json) through this shell: replies as
    /// redis-rs values, commands as the packed commands sent, decisions as [`Decision`]s.
    #[test]
    fn the_share_holder_follows_its_golden_cases_through_the_rust_shell() {
        use serde_json::Value as J;
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../protocol/client-cases/share.json"
        );
        let doc: J = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let mut steps = 0;
        for case in doc["cases"].as_array().unwrap() {
            let name = case["name"].as_str().unwrap();
            let mut h = doc["holder"].clone();
            for (k, v) in case["holder"].as_object().unwrap() {
                h[k] = v.clone();
            }
            let policy = match h["policy"].as_str().unwrap() {
                "allow" => crate::FailurePolicy::Allow,
                "last_known" => crate::FailurePolicy::LastKnown,
                _ => crate::FailurePolicy::Deny,
            };
            if h["allow_share"].as_f64() != Some(1.0) {
                continue; // Python's FailurePolicy.allow(share): no such setting here
            }
            let msd = |f: &str| Duration::from_millis(h[f].as_u64().unwrap());
            let limit =
                Limit::new(h["rate"].as_f64().unwrap(), h["cap"].as_f64().unwrap()).unwrap();
            let config = ShareConfig {
                period: msd("period_ms"),
                headroom: h["headroom"].as_f64().unwrap(),
                allow_for: msd("allow_for_ms"),
                limiter: LimiterConfig {
                    policy,
                    instances: h["instances"].as_u64().unwrap() as u32,
                    deny_retry_after: msd("deny_retry_after_ms"),
                    probe_interval: msd("probe_ms"),
                    version: h["version"].as_u64(),
                    ..LimiterConfig::default()
                },
            };
            // The shell's own construction of both halves (as `with_metrics` makes them).
            let policy = Policy {
                policy: match policy {
                    crate::FailurePolicy::Allow => core::FailurePolicy::Allow,
                    crate::FailurePolicy::LastKnown => core::FailurePolicy::LastKnown,
                    crate::FailurePolicy::Deny => core::FailurePolicy::Deny,
                },
                allow_share: 1.0,
                rate: limit.rate(),
                cap: limit.cap(),
                instances: u64::from(config.limiter.instances),
                allow_for: nanos(config.allow_for),
            };
            let key = ShareKey {
                key: h["key"].as_str().unwrap().as_bytes().to_vec(),
                rate: limit.rate(),
                cap: limit.cap(),
                period_ms: config.period_ms(),
                version: config.limiter.version,
            };
            let mut holder = Holder::new(
                policy,
                nanos(config.period),
                nanos(config.limiter.deny_retry_after),
                0,
            );
            let mut refresh = Refresh::new(key, config.headroom, 0);
            let id = h["id"].as_str().unwrap().as_bytes().to_vec();
            let probe = nanos(config.limiter.probe_interval);
            let backend = |j: &J| match j.as_str() {
                Some("functions") => Backend::Functions,
                _ => Backend::Module,
            };
            let (mut sent, mut attempted, mut failure) = (0, 0u64, None::<Failure>);
            for step in case["steps"].as_array().unwrap() {
                let now = step["at_ms"].as_u64().unwrap_or(0) * 1_000_000;
                let mut apply =
                    |event: Event, f: Option<Failure>, failure: &mut Option<Failure>| {
                        match event {
                            Event::Answered { .. } => *failure = None,
                            Event::Failed => *failure = f,
                            _ => {}
                        }
                        holder.apply(&event);
                    };
                let next =
                    |d: u64| assert_eq!(J::from(d / 1_000_000), step["next_ms"], "{name}: {step}");
                let packed = |args: &[Vec<u8>]| {
                    let want: Vec<String> = step["command"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|a| a.as_str().unwrap().to_owned())
                        .collect();
                    let mut cmd = redis::cmd(&want[0]);
                    for a in &want[1..] {
                        cmd.arg(a.as_str());
                    }
                    assert_eq!(
                        command(args).get_packed_command(),
                        cmd.get_packed_command(),
                        "{name}: {step}"
                    );
                };
                if let Some(b) = step.get("send") {
                    let (args, event) = refresh.send(core_backend(backend(b)), &id, attempted, now);
                    if step.get("command").is_some() {
                        packed(&args);
                    }
                    apply(event, None, &mut failure);
                    sent = now;
                } else if let Some(b) = step.get("release") {
                    packed(&refresh.release_command(core_backend(backend(b)), &id));
                } else if let Some(r) = step.get("reply") {
                    match refresh.answered(&to_reply(value(r)), sent, now, 0.0) {
                        Ok((event, d)) => {
                            assert!(step.get("protocol_error").is_none(), "{name}: {step}");
                            apply(event, None, &mut failure);
                            next(d);
                        }
                        Err(e) => {
                            assert_eq!(step["protocol_error"], J::Bool(true), "{name}: {e}");
                            let (event, d) = refresh.failed();
                            apply(event, Some(Failure::of(&Error::Reply(e.0))), &mut failure);
                            next(d);
                        }
                    }
                } else if let Some(text) = step.get("error") {
                    let (event, d) = refresh.failed();
                    let f = Failure::Server(text.as_str().unwrap().to_owned());
                    apply(event, Some(f), &mut failure);
                    next(d);
                } else if step.get("timeout").is_some() || step.get("refused").is_some() {
                    let (event, d) = refresh.outage(step.get("refused").is_some(), now, probe);
                    apply(event, None, &mut failure);
                    next(d);
                } else if let Some(n) = step.get("take") {
                    let n = n.as_u64().unwrap();
                    attempted += n;
                    match holder.take(n, now) {
                        None => {
                            assert_eq!(step["failed"], J::Bool(true), "{name}: {step}");
                            assert!(failure.is_some(), "{name}: the error to answer");
                        }
                        Some(t) => {
                            let d = decision(&t, n, limit.cap());
                            let w = &step["decision"];
                            assert_eq!(
                                d.allowed,
                                w["allowed"].as_bool().unwrap(),
                                "{name}: {step}"
                            );
                            let fallback = d.source == Source::Fallback;
                            assert_eq!(
                                fallback,
                                w["fallback"].as_bool().unwrap(),
                                "{name}: {step}"
                            );
                            assert!(
                                (d.remaining - w["remaining"].as_f64().unwrap()).abs() < 1e-6,
                                "{name}: {step}"
                            );
                            let retry = if d.allowed {
                                0
                            } else {
                                ms(d.retry_after).max(1)
                            };
                            assert_eq!(J::from(retry), w["retry_after_ms"], "{name}: {step}");
                            assert_eq!(
                                J::from(ms(d.reset_after)),
                                w["reset_after_ms"],
                                "{name}: {step}"
                            );
                            assert_eq!(
                                J::from(d.pinned.map(|p| p.name())),
                                w["pinned"],
                                "{name}: {step}"
                            );
                            assert_eq!(d.granted, if d.allowed { n } else { 0 });
                        }
                    }
                } else if let Some(w) = step.get("share") {
                    let i = holder.info(now);
                    assert!(
                        (i.tokens - w["tokens"].as_f64().unwrap()).abs() < 1e-6,
                        "{name}"
                    );
                    assert!(
                        (i.rate - w["rate"].as_f64().unwrap()).abs() < 1e-6,
                        "{name}"
                    );
                    assert_eq!(J::from(i.holders), w["holders"], "{name}");
                    assert_eq!(J::from(i.fallback), w["fallback"], "{name}");
                } else if step.get("tick").is_some() {
                    assert_eq!(
                        J::from(refresh.drifted(now, attempted)),
                        step["drifted"],
                        "{name}"
                    );
                } else {
                    panic!("{name}: unknown step {step}");
                }
                steps += 1;
            }
        }
        assert!(steps > 40, "{steps} steps");
    }

    #[test]
    fn needs_a_runtime() {
        let client = redis::Client::open("redis://127.0.0.1:1/").unwrap();
        let limit = Limit::new(10.0, 10.0).unwrap();
        let e = ShareLimiter::from_client(client, "k", limit, ShareConfig::default()).unwrap_err();
        assert!(matches!(e, Error::Config(_)), "{e:?}");
    }
}
