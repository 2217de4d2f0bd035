//! The connection abstraction and the one place a Redis call is made: with a timeout,
//! counted and timed.

use std::time::{Duration, Instant};

use redis::aio::ConnectionLike;
use redis::{Cmd, Value};

use crate::{Error, Metrics};

/// Any async Redis connection the limiters can clone and share between tasks: a
/// [`LazyConnection`](crate::LazyConnection) (what `from_client` uses: starts without a
/// server, reconnects, replaces a connection that stopped answering), a
/// [`redis::aio::ConnectionManager`] (reconnects by itself, but needs a server to be
/// created), a [`redis::aio::MultiplexedConnection`] (never reconnects: not for
/// production), or a [`redis::cluster_async::ClusterConnection`] (every `RL.*` command
/// names its key first, so the cluster client routes it to the key's slot).
pub trait RedisConnection: ConnectionLike + Clone + Send + Sync + 'static {}

impl<T: ConnectionLike + Clone + Send + Sync + 'static> RedisConnection for T {}

/// How long a call's reply is awaited in the background after its caller gave up (this,
/// or the caller's timeout if longer; the connection's own response timeout may end it
/// sooner: `LazyConfig::response_timeout`): a reply within it is read (a grant refunded),
/// one beyond it is counted lost. The client core's floor of the late-reply bound (a lease
/// call's own bound also covers its TTL: `rl_client_core::prefetch::late_reply_bound`).
pub(crate) const LATE_REPLY: Duration =
    Duration::from_nanos(rl_client_core::prefetch::LATE_REPLY_FLOOR);

/// Runs `cmd` on a clone of `conn`, giving up after `timeout`. An error reply comes back
/// as [`Error::Server`] (never as a value), a connection failure as an outage.
pub(crate) async fn call<C: RedisConnection>(
    conn: &C,
    cmd: &Cmd,
    timeout: Duration,
    metrics: &Metrics,
) -> Result<Value, Error> {
    let mut conn = conn.clone();
    let started = Instant::now();
    let outcome = tokio::time::timeout(timeout, conn.req_packed_command(cmd)).await;
    let took = started.elapsed();
    let outcome = match outcome {
        Err(_) => Err(Error::Timeout(timeout)),
        Ok(Err(e)) => Err(Error::from_redis(e)),
        Ok(Ok(value)) => value.extract_error().map_err(Error::from_redis),
    };
    metrics.redis_call(took, &outcome);
    outcome
}
