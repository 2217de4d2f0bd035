//! [`LazyConnection`]: a connection that needs no server to be created. It connects on
//! first use, replaces a connection that failed, and never makes a caller wait longer than
//! one connection attempt, so a service can start (and serve under its failure policy)
//! while Redis is down.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::{AsyncConnectionConfig, Cmd, ErrorKind, Pipeline, RedisError, RedisFuture, Value};

use crate::clock::mono_ns;
use crate::fallback::lock;

/// Timeouts of a [`LazyConnection`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LazyConfig {
    /// Longest time one connection attempt may take (TCP connect, handshake, `AUTH`,
    /// `SELECT`). The attempt runs in the background: a caller whose own timeout is
    /// shorter gives up without cancelling it. Default 1 s.
    pub connect_timeout: Duration,
    /// Longest wait for one reply on an established connection. A connection on which
    /// calls go unanswered this long (a peer that vanished without closing it) is
    /// replaced at the next call. Default 2 s.
    pub response_timeout: Duration,
}

impl Default for LazyConfig {
    fn default() -> Self {
        LazyConfig {
            connect_timeout: Duration::from_secs(1),
            response_timeout: Duration::from_secs(2),
        }
    }
}

/// A single-node connection that is created without a server: it connects at the first
/// call, and after a connection-level failure (refused, reset, closed, timed out) it drops
/// the connection and connects again at the next call. Cheap to clone; clones share one
/// multiplexed connection.
///
/// [`redis::aio::ConnectionManager::new`] needs the server when it is created, so a
/// service built on it cannot start while Redis is down; the limiters'
/// `from_client` constructors use this instead. Every failure is returned to the caller
/// at once (the limiters then apply their failure policy and probe again later): there is
/// no retry loop inside.
///
/// ```no_run
/// # fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use rl_client::{limit, LazyConnection, Limiter, LimiterConfig};
/// let conn = LazyConnection::new(redis::Client::open("redis://127.0.0.1:6379/")?);
/// // No server needed yet: the first take connects, or falls back.
/// let limiter = Limiter::new(conn, limit(10.0, 20.0)?, LimiterConfig::default())?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct LazyConnection {
    shared: Arc<Shared>,
}

struct Shared {
    client: redis::Client,
    config: LazyConfig,
    slot: Mutex<Slot>,
    /// Held by the one connection attempt in progress (by the attempt itself, so a
    /// caller that gives up does not start a second one).
    connecting: Arc<tokio::sync::Mutex<()>>,
}

#[derive(Default)]
struct Slot {
    live: Option<Live>,
    generation: u64,
    /// Monotonic ns of the last failed attempt, and why.
    failed: Option<(u64, String)>,
}

#[derive(Clone)]
struct Live {
    generation: u64,
    conn: MultiplexedConnection,
    /// Monotonic ns since which a call has gone unanswered (its caller gave up); 0: none.
    unanswered_since: Arc<AtomicU64>,
}

impl fmt::Debug for LazyConnection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LazyConnection")
            .field("addr", &self.shared.client.get_connection_info().addr)
            .field("connected", &self.is_connected())
            .field("config", &self.shared.config)
            .finish()
    }
}

impl LazyConnection {
    /// A connection to `client`'s server with the default timeouts; does not connect.
    pub fn new(client: redis::Client) -> LazyConnection {
        LazyConnection::with_config(client, LazyConfig::default())
    }

    /// Like [`new`](Self::new) with the given timeouts.
    pub fn with_config(client: redis::Client, config: LazyConfig) -> LazyConnection {
        LazyConnection {
            shared: Arc::new(Shared {
                client,
                config,
                slot: Mutex::new(Slot::default()),
                connecting: Arc::new(tokio::sync::Mutex::new(())),
            }),
        }
    }

    /// A connection to the server at `url` (`redis://host:port/db`); fails only on a
    /// malformed URL, never for want of a server.
    pub fn open(url: &str) -> redis::RedisResult<LazyConnection> {
        Ok(LazyConnection::new(redis::Client::open(url)?))
    }

    /// Whether a connection is established right now (it may still fail at the next call).
    pub fn is_connected(&self) -> bool {
        lock(&self.shared.slot).live.is_some()
    }
}

/// Marks the connection as unanswered if a call is dropped before its reply.
struct Pending<'a> {
    live: &'a Live,
    started: u64,
    finished: bool,
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if !self.finished {
            let _ = self.live.unanswered_since.compare_exchange(
                0,
                self.started,
                Ordering::AcqRel,
                Ordering::Acquire,
            );
        }
    }
}

impl Shared {
    /// The established connection, unless it has left calls unanswered too long.
    fn current(&self) -> Option<Live> {
        let mut slot = lock(&self.slot);
        let live = slot.live.as_ref()?;
        let since = live.unanswered_since.load(Ordering::Acquire);
        let limit = self.config.response_timeout.as_nanos() as u64;
        if since != 0 && mono_ns().saturating_sub(since) > limit {
            slot.live = None;
            return None;
        }
        slot.live.clone()
    }

    /// A failure recorded at or after `since`.
    fn failed_since(&self, since: u64) -> Option<RedisError> {
        let slot = lock(&self.slot);
        let (at, why) = slot.failed.as_ref()?;
        (*at >= since).then(|| connect_error(why.clone()))
    }

    async fn connection(self: &Arc<Self>) -> redis::RedisResult<Live> {
        if let Some(live) = self.current() {
            return Ok(live);
        }
        let asked = mono_ns();
        let guard = Arc::clone(&self.connecting).lock_owned().await;
        if let Some(live) = self.current() {
            return Ok(live);
        }
        if let Some(e) = self.failed_since(asked) {
            // The attempt this call waited behind just failed: do not try again at once.
            return Err(e);
        }
        let shared = Arc::clone(self);
        let attempt = async move {
            let _guard = guard;
            shared.connect().await
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => runtime
                .spawn(attempt)
                .await
                .unwrap_or_else(|e| Err(connect_error(e.to_string()))),
            Err(_) => attempt.await,
        }
    }

    async fn connect(&self) -> redis::RedisResult<Live> {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(self.config.connect_timeout)
            .set_response_timeout(self.config.response_timeout);
        let outcome = self
            .client
            .get_multiplexed_async_connection_with_config(&config)
            .await;
        let mut slot = lock(&self.slot);
        match outcome {
            Ok(conn) => {
                slot.generation += 1;
                let live = Live {
                    generation: slot.generation,
                    conn,
                    unanswered_since: Arc::new(AtomicU64::new(0)),
                };
                slot.live = Some(live.clone());
                slot.failed = None;
                Ok(live)
            }
            Err(e) => {
                slot.failed = Some((mono_ns(), e.to_string()));
                Err(e)
            }
        }
    }

    /// After a call on `live`: a connection-level failure drops it (if still current).
    fn settle<T>(&self, live: &Live, outcome: &redis::RedisResult<T>) {
        match outcome {
            Ok(_) => live.unanswered_since.store(0, Ordering::Release),
            Err(e) if e.is_io_error() || e.is_unrecoverable_error() => {
                let mut slot = lock(&self.slot);
                if slot
                    .live
                    .as_ref()
                    .is_some_and(|l| l.generation == live.generation)
                {
                    slot.live = None;
                }
            }
            Err(_) => {}
        }
    }
}

const CONNECT_ERROR: &str = "cannot connect to redis";

fn connect_error(why: String) -> RedisError {
    RedisError::from((ErrorKind::IoError, CONNECT_ERROR, why))
}

/// Whether `e` is a failure to connect (nothing was sent on it).
pub(crate) fn is_connect_error(e: &RedisError) -> bool {
    e.to_string().starts_with(CONNECT_ERROR)
}

impl ConnectionLike for LazyConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let live = self.shared.connection().await?;
            let mut conn = live.conn.clone();
            let mut pending = Pending {
                live: &live,
                started: mono_ns(),
                finished: false,
            };
            let outcome = conn.req_packed_command(cmd).await;
            pending.finished = true;
            self.shared.settle(&live, &outcome);
            outcome
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let live = self.shared.connection().await?;
            let mut conn = live.conn.clone();
            let mut pending = Pending {
                live: &live,
                started: mono_ns(),
                finished: false,
            };
            let outcome = conn.req_packed_commands(cmd, offset, count).await;
            pending.finished = true;
            self.shared.settle(&live, &outcome);
            outcome
        })
    }

    fn get_db(&self) -> i64 {
        self.shared.client.get_connection_info().redis.db
    }
}
