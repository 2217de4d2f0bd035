//! Which server side answers: the redis-rl module (`RL.TAKE`...) or the Redis Functions
//! library `rl` (`FCALL rl_take 1 key ...`, see docs/functions.md) for servers that do not
//! allow modules. Same arguments, same replies: only the head of each command differs, and
//! this is the one place that builds it.

use redis::Value;
use tokio::sync::OnceCell;

use crate::conn::RedisConnection;
use crate::Error;

/// The server side a limiter talks to ([`LimiterConfig::backend`](crate::LimiterConfig)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Backend {
    /// The module's commands (`RL.TAKE`, `RL.LEASE`, `RL.RETURN`). The default.
    #[default]
    Module,
    /// The Functions library `rl` loaded with `scripts/load-functions`.
    Functions,
    /// Asks the server once, at the first call: the module if `RL.TAKE` exists, else the
    /// library if it is loaded, else an error naming both.
    Auto,
}

/// A backend resolved for one limiter (`Auto` asks once and keeps the answer).
#[derive(Debug, Default)]
pub(crate) struct Selector {
    wanted: Backend,
    resolved: OnceCell<Backend>,
}

impl Selector {
    pub(crate) fn new(wanted: Backend) -> Selector {
        Selector {
            wanted,
            resolved: OnceCell::new(),
        }
    }

    /// `Module` or `Functions`; probes the server when `Auto` and not yet known, for at
    /// most `timeout`.
    pub(crate) async fn get<C: RedisConnection>(
        &self,
        conn: &C,
        timeout: std::time::Duration,
    ) -> Result<Backend, Error> {
        if self.wanted != Backend::Auto {
            return Ok(self.wanted);
        }
        let probing = self.resolved.get_or_try_init(|| probe(conn.clone()));
        match tokio::time::timeout(timeout, probing).await {
            Ok(outcome) => outcome.copied(),
            Err(_) => Err(Error::Timeout(timeout)),
        }
    }

    /// The backend if already known (for best-effort calls that cannot wait).
    pub(crate) fn known(&self) -> Option<Backend> {
        match self.wanted {
            Backend::Auto => self.resolved.get().copied(),
            b => Some(b),
        }
    }
}

/// Whether the server has what `selector` will call: the backend, or the missing-module
/// error naming the fix (or an outage, as [`Error::is_outage`] tells). For a startup check.
pub(crate) async fn check<C: RedisConnection>(
    selector: &Selector,
    conn: &C,
    timeout: std::time::Duration,
) -> Result<Backend, Error> {
    let checking = async {
        let backend = selector.get(conn, timeout).await?;
        let there = match backend {
            Backend::Functions => has_library(conn.clone()).await?,
            _ => has_module(conn.clone()).await?,
        };
        if there {
            Ok(backend)
        } else {
            Err(Error::Config(crate::error::NOT_LOADED))
        }
    };
    match tokio::time::timeout(timeout, checking).await {
        Ok(outcome) => outcome,
        Err(_) => Err(Error::Timeout(timeout)),
    }
}

async fn has_module<C: RedisConnection>(mut conn: C) -> Result<bool, Error> {
    let info: Value = redis::cmd("COMMAND")
        .arg("INFO")
        .arg("RL.LEASE")
        .query_async(&mut conn)
        .await?;
    Ok(matches!(&info, Value::Array(items) if items.first().is_some_and(|v| *v != Value::Nil)))
}

async fn has_library<C: RedisConnection>(mut conn: C) -> Result<bool, Error> {
    let libs: Value = redis::cmd("FUNCTION")
        .arg("LIST")
        .arg("LIBRARYNAME")
        .arg("rl")
        .query_async(&mut conn)
        .await?;
    Ok(matches!(&libs, Value::Array(items) if !items.is_empty()))
}

async fn probe<C: RedisConnection>(conn: C) -> Result<Backend, Error> {
    if has_module(conn.clone()).await? {
        return Ok(Backend::Module);
    }
    if has_library(conn).await? {
        return Ok(Backend::Functions);
    }
    Err(Error::Config(crate::error::NOT_LOADED))
}
