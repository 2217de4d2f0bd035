//! What can go wrong in a call, and what a caller did wrong.

use std::fmt;
use std::time::Duration;

/// An error from this crate.
///
/// The limiters never return Redis failures from `take`: those go to the configured
/// [`FailurePolicy`](crate::FailurePolicy). `take` only errs on requests that can never be
/// granted ([`Error::Request`]); the `*_from_server` methods and `close` return every error.
#[derive(Debug)]
pub enum Error {
    /// The request can never be granted (`n` is 0 or above the cap).
    Request(&'static str),
    /// The configuration is invalid (a limit, batch, TTL or share out of range).
    Config(&'static str),
    /// Redis did not answer within the configured timeout.
    Timeout(Duration),
    /// Redis or the connection failed (I/O error, `-ERR` reply, cluster redirect loop...).
    Redis(redis::RedisError),
    /// Redis answered with a reply of an unexpected shape (the module is too old or absent).
    Reply(String),
}

impl Error {
    /// Whether the error says Redis is unavailable or misbehaving (so a fallback applies),
    /// rather than that the caller asked for something impossible.
    pub fn is_unavailable(&self) -> bool {
        matches!(self, Error::Timeout(_) | Error::Redis(_) | Error::Reply(_))
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Request(why) => write!(f, "invalid request: {why}"),
            Error::Config(why) => write!(f, "invalid configuration: {why}"),
            Error::Timeout(after) => write!(f, "redis did not answer within {after:?}"),
            Error::Redis(e) => write!(f, "redis error: {e}"),
            Error::Reply(what) => write!(f, "unexpected reply: {what}"),
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
        Error::Redis(e)
    }
}

impl From<rl_core::LimitError> for Error {
    fn from(e: rl_core::LimitError) -> Error {
        Error::Config(e.message())
    }
}
