//! A reply as a Redis client hands it over, whatever the client (redis-rs, redis-py,
//! ioredis): each shell converts its own value into this one, and the parsers here read
//! nothing else. A reply that is not what the command answers is a [`ProtocolError`], never
//! a panic.

use std::fmt;

/// One RESP2 or RESP3 value.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    Nil,
    Int(i64),
    /// RESP3's double (RESP2 sends a bulk string: [`Reply::Bulk`]).
    Double(f64),
    Bulk(Vec<u8>),
    /// A status reply (`+OK`).
    Simple(String),
    Array(Vec<Reply>),
    /// RESP3's map, pairs in the server's order.
    Map(Vec<(Reply, Reply)>),
    /// An error reply's text (`ERR ...`).
    Error(String),
}

/// A reply that is not what the command answers (a server of another version, a proxy
/// in between, a truncated reply): what was expected and what came.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProtocolError(pub String);

impl fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unexpected reply from redis-rl: {}", self.0)
    }
}

impl std::error::Error for ProtocolError {}

impl Reply {
    /// The elements of an array reply.
    pub fn items(&self, what: &str) -> Result<&[Reply], ProtocolError> {
        match self {
            Reply::Array(items) => Ok(items),
            other => Err(ProtocolError(format!(
                "{what}: an array expected, got {other:?}"
            ))),
        }
    }

    /// An integer reply.
    pub fn int(&self, what: &str) -> Result<i64, ProtocolError> {
        match self {
            Reply::Int(i) => Ok(*i),
            other => Err(ProtocolError(format!(
                "{what}: an integer expected, got {other:?}"
            ))),
        }
    }

    /// A non-negative integer reply.
    pub fn count(&self, what: &str) -> Result<u64, ProtocolError> {
        let i = self.int(what)?;
        u64::try_from(i).map_err(|_| ProtocolError(format!("{what}: {i} is negative")))
    }

    /// A number as either protocol sends a double: RESP3's double, RESP2's bulk string
    /// (or an integer).
    pub fn number(&self, what: &str) -> Result<f64, ProtocolError> {
        match self {
            Reply::Double(x) => Ok(*x),
            Reply::Int(i) => Ok(*i as f64),
            Reply::Bulk(b) => std::str::from_utf8(b)
                .ok()
                .and_then(|s| s.parse::<f64>().ok())
                .ok_or_else(|| ProtocolError(format!("{what}: {b:?} is not a number"))),
            other => Err(ProtocolError(format!(
                "{what}: a number expected, got {other:?}"
            ))),
        }
    }

    /// A bulk string or nil (a key the server names, or none).
    pub fn bytes_or_nil(&self, what: &str) -> Result<Option<&[u8]>, ProtocolError> {
        match self {
            Reply::Nil => Ok(None),
            Reply::Bulk(b) => Ok(Some(b)),
            Reply::Simple(s) => Ok(Some(s.as_bytes())),
            other => Err(ProtocolError(format!(
                "{what}: a string expected, got {other:?}"
            ))),
        }
    }
}
