//! [`Semaphore`] and its [`Permit`] guard: how many calls may be in flight at once, over
//! `RL.ACQUIRE`, `RL.RELEASE` and `RL.RENEW` (permits that expire, so a crashed holder
//! frees its slot after the TTL).

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rl_client_core::permit::{self as core, Local, LocalPermits};
use tokio::task::JoinHandle;

use crate::backend::Selector;
use crate::conn::{call, RedisConnection};
use crate::fallback::lock;
use crate::health::Health;
use crate::lazy::LazyConnection;
use crate::protocol;
use crate::{Backend, Error, FailurePolicy, LimiterConfig, Metrics, Source};

/// A distributed semaphore: at most `limit` permits of a key held at once, fleet-wide.
/// For capping the calls in flight to a slow downstream (concurrency, not rate).
///
/// [`acquire`](Self::acquire) answers a [`Permit`] guard, which
/// - releases its slot when dropped (`RL.RELEASE`, sent in the background) or on
///   [`release`](Permit::release);
/// - renews itself in the background (`RL.RENEW` every `ttl / 2`) while it is held, so a
///   call may outlast the TTL; renewal stops when the guard goes;
/// - expires on the server `ttl` after its last renewal if the process holding it dies,
///   so a crashed holder frees its slot after at most `ttl`.
///
/// While Redis is unavailable the [`FailurePolicy`] decides, as for the rate limiters:
/// `Allow` and `LastKnown` grant local permits up to `max(1, limit / instances)` per key
/// in this process, `Deny` denies. Error replies are returned, never decided locally.
/// Local permits need no release call and are never renewed.
///
/// Cheap to clone; clones share the connection, counters and health. Module only: the
/// Functions library has no permits, and a `Functions` backend gets [`Error::Config`].
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use rl_client::{redis, LimiterConfig, Semaphore};
/// let client = redis::Client::open("redis://127.0.0.1:6379/")?;
/// let semaphore = Semaphore::from_client(client, LimiterConfig::default())?;
/// // At most 8 report jobs at once across the fleet; a dead holder's slot frees in 30 s.
/// match semaphore.acquire("reports", 8, Duration::from_secs(30)).await? {
///     Ok(permit) => {
///         // run the job; the permit is renewed while it runs
///         permit.release().await?;
///     }
///     Err(busy) => println!("8 running, next slot in {:?}", busy.retry_after),
/// }
/// # Ok(()) }
/// ```
pub struct Semaphore<C: RedisConnection> {
    inner: Arc<Inner<C>>,
}

impl<C: RedisConnection> Clone for Semaphore<C> {
    fn clone(&self) -> Self {
        Semaphore {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<C: RedisConnection + fmt::Debug> fmt::Debug for Semaphore<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Semaphore")
            .field("conn", &self.inner.conn)
            .field("config", &self.inner.config)
            .finish()
    }
}

struct Inner<C> {
    conn: C,
    config: LimiterConfig,
    metrics: Arc<Metrics>,
    health: Health,
    backend: Selector,
    /// Permits granted locally by the failure policy, per key (the client core's).
    local: Mutex<LocalPermits>,
}

/// A permit request that was denied: the key's limit is reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Busy {
    /// Permits held when it was denied.
    pub in_use: u64,
    /// Until the earliest held permit expires (a release may come sooner); for a `Deny`
    /// fallback, [`LimiterConfig::deny_retry_after`].
    pub retry_after: Duration,
    /// Who decided: [`Source::Server`] or [`Source::Fallback`].
    pub source: Source,
}

/// One slot of a [`Semaphore`] key, held until this guard is released or dropped.
///
/// Dropping it inside a tokio runtime (or while the runtime it was acquired on is still
/// running) sends `RL.RELEASE` in the background; dropping it anywhere else does not
/// panic, and the slot frees when the permit expires, `ttl` after its last renewal. A
/// guard leaked with `mem::forget` in a live runtime keeps renewing, like a leaked lock;
/// it is the process ending that lets it expire.
pub struct Permit<C: RedisConnection> {
    semaphore: Arc<Inner<C>>,
    key: String,
    id: u64,
    source: Source,
    in_use: u64,
    lost: Arc<AtomicBool>,
    renewer: Option<JoinHandle<()>>,
    runtime: Option<tokio::runtime::Handle>,
    done: bool,
}

impl<C: RedisConnection> fmt::Debug for Permit<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Permit")
            .field("key", &self.key)
            .field("id", &self.id)
            .field("source", &self.source)
            .field("in_use", &self.in_use)
            .field("lost", &self.is_lost())
            .finish()
    }
}

impl Semaphore<LazyConnection> {
    /// A semaphore over `client` that needs no server to be built (see
    /// [`LazyConnection`]): it connects at the first call.
    pub fn from_client(client: redis::Client, config: LimiterConfig) -> Result<Self, Error> {
        Semaphore::new(LazyConnection::new(client), config)
    }
}

impl<C: RedisConnection> Semaphore<C> {
    /// A semaphore over `conn` with its own counters. `config` gives the call timeout,
    /// the probe interval and the failure policy.
    pub fn new(conn: C, config: LimiterConfig) -> Result<Self, Error> {
        Self::with_metrics(conn, config, Arc::new(Metrics::new()))
    }

    /// Like [`new`](Self::new), counting into shared `metrics`.
    pub fn with_metrics(
        conn: C,
        config: LimiterConfig,
        metrics: Arc<Metrics>,
    ) -> Result<Self, Error> {
        config.validate()?;
        let local = LocalPermits::new(
            match config.policy {
                FailurePolicy::Allow => core::Policy::Allow,
                FailurePolicy::LastKnown => core::Policy::LastKnown,
                FailurePolicy::Deny => core::Policy::Deny,
            },
            config.instances,
            config.deny_retry_after.as_millis() as u64,
        );
        Ok(Semaphore {
            inner: Arc::new(Inner {
                conn,
                health: Health::new(config.probe_interval),
                backend: Selector::new(config.backend),
                config,
                metrics,
                local: Mutex::new(local),
            }),
        })
    }

    /// The counters of this semaphore.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.inner.metrics
    }

    /// Asks for one of `limit` slots of `key`, held for `ttl` at a time (renewed while the
    /// guard lives): `Ok(permit)`, or `Err(Busy)` when `limit` are held. While Redis is
    /// unavailable the failure policy decides. Errs only on impossible requests (`limit`
    /// outside 1..=10000, `ttl` outside 1 ms..=1 day) and with a `Functions` backend.
    pub async fn acquire(
        &self,
        key: &str,
        limit: u64,
        ttl: Duration,
    ) -> Result<Result<Permit<C>, Busy>, Error> {
        let inner = &self.inner;
        check(limit, ttl)?;
        if inner.health.may_call() {
            match self.acquire_from_server(key, limit, ttl).await {
                Ok(outcome) => {
                    inner.health.succeeded();
                    return Ok(outcome);
                }
                Err(e) if e.is_unavailable() => inner.health.failed(),
                Err(e) => return Err(e),
            }
        }
        Ok(self.acquire_locally(key, limit))
    }

    /// One `RL.ACQUIRE` call with no failure policy: every error is returned. A granted
    /// permit renews and releases itself like one from [`acquire`](Self::acquire).
    pub async fn acquire_from_server(
        &self,
        key: &str,
        limit: u64,
        ttl: Duration,
    ) -> Result<Result<Permit<C>, Busy>, Error> {
        let inner = &self.inner;
        check(limit, ttl)?;
        if inner.backend.get(&inner.conn, inner.config.timeout).await? == Backend::Functions {
            return Err(Error::Config(
                "permits (RL.ACQUIRE) need the module: the Functions library has none",
            ));
        }
        let protocol::AcquireReply {
            granted,
            id,
            in_use,
            retry_after,
        } = inner.acquire_call(key, limit, ttl).await?;
        inner.metrics.permit(granted);
        if !granted {
            return Ok(Err(Busy {
                in_use,
                retry_after,
                source: Source::Server,
            }));
        }
        let lost = Arc::new(AtomicBool::new(false));
        let runtime = tokio::runtime::Handle::try_current().ok();
        let renewer = runtime.as_ref().map(|rt| {
            rt.spawn(renew_loop(
                Arc::clone(inner),
                key.to_owned(),
                id,
                ttl,
                Arc::clone(&lost),
            ))
        });
        Ok(Ok(Permit {
            semaphore: Arc::clone(inner),
            key: key.to_owned(),
            id,
            source: Source::Server,
            in_use,
            lost,
            renewer,
            runtime,
            done: false,
        }))
    }

    /// The failure policy's answer.
    fn acquire_locally(&self, key: &str, limit: u64) -> Result<Permit<C>, Busy> {
        let inner = &self.inner;
        let decided = lock(&inner.local).acquire(key, limit);
        let in_use = match decided {
            Local::Busy {
                in_use,
                retry_after_ms,
            } => {
                inner.metrics.permit(false);
                return Err(Busy {
                    in_use,
                    retry_after: Duration::from_millis(retry_after_ms),
                    source: Source::Fallback,
                });
            }
            Local::Granted { in_use } => in_use,
        };
        inner.metrics.permit(true);
        Ok(Permit {
            semaphore: Arc::clone(inner),
            key: key.to_owned(),
            id: 0,
            source: Source::Fallback,
            in_use,
            lost: Arc::new(AtomicBool::new(false)),
            renewer: None,
            runtime: None,
            done: false,
        })
    }
}

fn check(limit: u64, ttl: Duration) -> Result<(), Error> {
    let ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
    core::check(limit, ms).map_err(Error::Request)
}

impl<C: RedisConnection> Inner<C> {
    /// One `RL.ACQUIRE` call, within the timeout. It runs on its own task: when its caller
    /// gives up (the timeout, a dropped future) the call still lands, and a permit it
    /// brings is released at once instead of holding a slot nobody has until its TTL.
    async fn acquire_call(
        self: &Arc<Self>,
        key: &str,
        limit: u64,
        ttl: Duration,
    ) -> Result<protocol::AcquireReply, Error> {
        let cmd = protocol::acquire_cmd(key, limit, ttl);
        let timeout = self.config.timeout;
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            let value = call(&self.conn, &cmd, timeout, &self.metrics).await?;
            return protocol::acquire_reply(value);
        };
        let (tx, rx) = tokio::sync::oneshot::channel();
        let owner = Arc::clone(self);
        let owned_key = key.to_owned();
        let late = timeout.max(crate::conn::LATE_REPLY);
        runtime.spawn(async move {
            let outcome = call(&owner.conn, &cmd, late, &owner.metrics)
                .await
                .and_then(protocol::acquire_reply);
            if let Err(Ok(reply)) = tx.send(outcome) {
                if reply.granted {
                    // Nobody holds it: free the slot (not counted as a permit).
                    let release = protocol::release_cmd(&owned_key, reply.id);
                    let _ = call(&owner.conn, &release, timeout, &owner.metrics).await;
                }
            }
        });
        match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(outcome)) => outcome,
            // The task was dropped: the runtime is shutting down.
            Ok(Err(_)) => Err(Error::Timeout(timeout)),
            Err(_) => {
                let e = Error::Timeout(timeout);
                self.metrics
                    .redis_call(timeout, &Err::<(), _>(Error::Timeout(timeout)));
                Err(e)
            }
        }
    }

    /// `RL.RELEASE key id`: whether a live permit was released.
    async fn release(&self, key: &str, id: u64) -> Result<bool, Error> {
        let cmd = protocol::release_cmd(key, id);
        let value = call(&self.conn, &cmd, self.config.timeout, &self.metrics).await?;
        let released = protocol::integer(value)? == 1;
        if released {
            self.metrics.permit_released();
        }
        Ok(released)
    }

    /// `RL.RENEW key id ttl_ms`: whether the permit was still held.
    async fn renew(&self, key: &str, id: u64, ttl: Duration) -> Result<bool, Error> {
        let cmd = protocol::renew_cmd(key, id, ttl);
        let value = call(&self.conn, &cmd, self.config.timeout, &self.metrics).await?;
        Ok(protocol::integer(value)? == 1)
    }

    fn release_locally(&self, key: &str) {
        lock(&self.local).release(key);
        self.metrics.permit_released();
    }
}

/// Renews permit `id` every `ttl / 2` until aborted (the guard went) or the server says
/// it is gone. A failed renewal is retried sooner; the permit counts as lost once a whole
/// `ttl` has passed since the last renewal that arrived.
async fn renew_loop<C: RedisConnection>(
    semaphore: Arc<Inner<C>>,
    key: String,
    id: u64,
    ttl: Duration,
    lost: Arc<AtomicBool>,
) {
    let every = (ttl / 2).max(Duration::from_millis(1));
    let retry = (ttl / 8).max(Duration::from_millis(1));
    let mut renewed = tokio::time::Instant::now();
    let mut next = every;
    loop {
        tokio::time::sleep(next).await;
        let sent = tokio::time::Instant::now();
        match semaphore.renew(&key, id, ttl).await {
            Ok(true) => {
                semaphore.metrics.permit_renewed();
                renewed = sent;
                next = every;
            }
            Ok(false) => break,
            Err(_) if sent.duration_since(renewed) >= ttl => break,
            Err(_) => next = retry,
        }
    }
    lost.store(true, Ordering::Release);
    semaphore.metrics.permit_lost();
}

impl<C: RedisConnection> Permit<C> {
    /// The key it is a permit of.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The server's permit id (0 for a local permit of the failure policy).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Who granted it: [`Source::Server`], or [`Source::Fallback`] while Redis was away.
    pub fn source(&self) -> Source {
        self.source
    }

    /// Permits of the key held when this one was granted (this one included).
    pub fn in_use(&self) -> u64 {
        self.in_use
    }

    /// Whether renewal found the permit gone (it expired: renewals could not reach Redis
    /// within the TTL). Its slot may have been given to another holder; a caller that
    /// must not exceed the limit should stop.
    pub fn is_lost(&self) -> bool {
        self.lost.load(Ordering::Acquire)
    }

    /// Gives the slot back now and answers whether the server still held it (false: it
    /// had expired). Errors are returned; the permit then expires after its TTL.
    pub async fn release(mut self) -> Result<bool, Error> {
        self.stop_renewing();
        self.done = true;
        if self.source == Source::Fallback {
            self.semaphore.release_locally(&self.key);
            return Ok(true);
        }
        self.semaphore.release(&self.key, self.id).await
    }

    fn stop_renewing(&mut self) {
        if let Some(renewer) = self.renewer.take() {
            renewer.abort();
        }
    }
}

impl<C: RedisConnection> Drop for Permit<C> {
    fn drop(&mut self) {
        self.stop_renewing();
        if self.done {
            return;
        }
        if self.source == Source::Fallback {
            self.semaphore.release_locally(&self.key);
            return;
        }
        let runtime = tokio::runtime::Handle::try_current()
            .ok()
            .or_else(|| self.runtime.take());
        let Some(runtime) = runtime else {
            return; // no runtime to call from: the permit expires after its TTL
        };
        let semaphore = Arc::clone(&self.semaphore);
        let key = std::mem::take(&mut self.key);
        let id = self.id;
        // A runtime that is shutting down drops the task instead of running it; never
        // let a release attempt panic inside a drop.
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            runtime.spawn(async move {
                let _ = semaphore.release(&key, id).await;
            })
        }));
    }
}
