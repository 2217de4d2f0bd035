//! What can go wrong in a call, and what a caller did wrong.

use std::fmt;
use std::time::Duration;

use redis::ErrorKind;

/// What a server answers when the module (or the Functions library) is not there.
pub(crate) const NOT_LOADED: &str =
    "the redis-rl commands (RL.TAKE, RL.LEASE...) are unknown to this server: load \
     the module (redis-server --loadmodule /path/to/libredis_rl.so, or `loadmodule` in \
     redis.conf), or load the Functions library with scripts/load-functions and use \
     Backend::Functions";

/// An error from this crate.
///
/// The limiters' `take` never returns an outage (a connection failure or a timeout: those
/// go to the configured [`FailurePolicy`](crate::FailurePolicy)). It returns
/// [`Error::Request`] for requests that can never be granted, and [`Error::Server`] (or
/// [`Error::Config`] for a missing module) when Redis answered with an error reply: an
/// error reply is never turned into a grant or a policy decision. The `*_from_server`
/// methods and `close` return every error.
#[derive(Debug)]
pub enum Error {
    /// The request can never be granted (`n` is 0 or above the cap).
    Request(&'static str),
    /// The configuration is invalid (a limit, batch, TTL or instance count out of range),
    /// or the server lacks the module / library (the message names the fix).
    Config(&'static str),
    /// Redis did not answer within the configured timeout (an outage).
    Timeout(Duration),
    /// The connection failed: refused, reset, closed, not established in time (an outage;
    /// [`Error::is_outage`] tells), or another client-side failure of the redis crate.
    Redis(redis::RedisError),
    /// Redis answered with an error reply (`WRONGTYPE ...`, `ERR too many live leases...`,
    /// any `-ERR`): not an outage, returned to the caller as is.
    Server(String),
    /// Redis answered with a reply of an unexpected shape (the module is too old).
    Reply(String),
    /// The limiter was closed ([`PrefetchLimiter::close`](crate::PrefetchLimiter::close)):
    /// it leases nothing more.
    Closed,
    /// A token budget's limits or costs are not valid (the message says how to fix them).
    Budget(String),
}

/// Whether a redis-crate error means Redis cannot be reached or cannot serve right now.
fn redis_outage(e: &redis::RedisError) -> bool {
    e.is_io_error()
        || e.is_timeout()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || matches!(
            e.kind(),
            ErrorKind::BusyLoadingError
                | ErrorKind::TryAgain
                | ErrorKind::ClusterDown
                | ErrorKind::MasterDown
                | ErrorKind::ReadOnly
                | ErrorKind::ClusterConnectionNotFound
        )
}

/// Whether a redis-crate error is an error reply the server sent.
fn server_reply(e: &redis::RedisError) -> bool {
    !redis_outage(e)
        && matches!(
            e.kind(),
            ErrorKind::ResponseError
                | ErrorKind::ExtensionError
                | ErrorKind::ExecAbortError
                | ErrorKind::NoScriptError
                | ErrorKind::CrossSlot
                | ErrorKind::NotBusy
                | ErrorKind::AuthenticationFailed
        )
}

impl Error {
    /// Whether the error is an outage (the connection failed, the call timed out, or the
    /// server said it cannot serve now: `LOADING`, `MASTERDOWN`, `CLUSTERDOWN`, `TRYAGAIN`,
    /// `READONLY`), so the failure policy applies.
    pub fn is_outage(&self) -> bool {
        match self {
            Error::Timeout(_) => true,
            Error::Redis(e) => redis_outage(e),
            _ => false,
        }
    }

    /// Whether the call's outcome is unknown: it may have run on the server but its reply
    /// was lost (a timeout, a connection reset or closed after the write). A refused or
    /// never established connection sent nothing.
    pub(crate) fn may_have_run(&self) -> bool {
        match self {
            Error::Timeout(_) => true,
            Error::Redis(e) => {
                e.is_timeout()
                    || ((e.is_io_error() || e.is_connection_dropped())
                        && !e.is_connection_refusal()
                        && !crate::lazy::is_connect_error(e))
            }
            _ => false,
        }
    }

    /// The old name of [`is_outage`](Self::is_outage).
    pub fn is_unavailable(&self) -> bool {
        self.is_outage()
    }

    /// Whether Redis answered with an error reply (or lacks the module), counted in
    /// `server_errors`.
    pub fn is_server_error(&self) -> bool {
        matches!(self, Error::Server(_) | Error::Reply(_))
            || matches!(self, Error::Config(why) if *why == NOT_LOADED)
    }

    /// The crate's error for a redis-crate error: error replies become [`Error::Server`]
    /// (an unknown `RL.*` command or `rl_*` function becomes the missing-module error).
    pub(crate) fn from_redis(e: redis::RedisError) -> Error {
        if !server_reply(&e) {
            return Error::Redis(e);
        }
        let text = match (e.code(), e.detail()) {
            (Some(code), Some(detail)) => format!("{code} {detail}"),
            (Some(code), None) => code.to_owned(),
            _ => e.to_string(),
        };
        let lower = text.to_ascii_lowercase();
        if (lower.contains("unknown command") && lower.contains("rl."))
            || (lower.contains("function not found"))
        {
            return Error::Config(NOT_LOADED);
        }
        Error::Server(text)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Request(why) => write!(f, "invalid request: {why}"),
            Error::Config(why) => write!(f, "invalid configuration: {why}"),
            Error::Timeout(after) => write!(f, "redis did not answer within {after:?}"),
            Error::Redis(e) => write!(f, "redis error: {e}"),
            Error::Server(reply) => write!(f, "redis answered an error: {reply}"),
            Error::Reply(what) => write!(f, "unexpected reply: {what}"),
            Error::Closed => write!(f, "the limiter is closed"),
            Error::Budget(why) => write!(f, "invalid budget: {why}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Redis(e) => Some(e),
            _ => None,
        }
    }
}

impl From<redis::RedisError> for Error {
    fn from(e: redis::RedisError) -> Error {
        Error::from_redis(e)
    }
}

impl From<rl_core::LimitError> for Error {
    fn from(e: rl_core::LimitError) -> Error {
        Error::Config(e.message())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(code: &str, detail: &str) -> Error {
        let e = redis::RedisError::from((
            redis::ErrorKind::ExtensionError,
            "extension error",
            format!("{code} {detail}"),
        ));
        let _ = e.code();
        Error::from_redis(e)
    }

    #[test]
    fn error_replies_are_not_outages() {
        let e = reply(
            "WRONGTYPE",
            "Operation against a key holding the wrong kind of value",
        );
        assert!(
            matches!(&e, Error::Server(t) if t.contains("WRONGTYPE")),
            "{e:?}"
        );
        assert!(!e.is_outage() && e.is_server_error());
        let io =
            Error::from_redis(std::io::Error::from(std::io::ErrorKind::ConnectionRefused).into());
        assert!(io.is_outage() && !io.is_server_error());
        assert!(Error::Timeout(Duration::from_millis(1)).is_outage());
    }
}
