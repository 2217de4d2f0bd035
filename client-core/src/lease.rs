//! The lease commands a prefetching limiter sends (`RL.LEASE`, `RL.RETURN`, or the
//! Functions library's `rl_lease` / `rl_return` with the same arguments) and the reading of
//! their replies. The ledger that decides when to send them is [`crate::prefetch`]'s.

use crate::budget::Backend;
use crate::reply::{ProtocolError, Reply};

/// A number as the module reads it back exactly (the shortest digits that round-trip).
fn number(x: f64) -> Vec<u8> {
    format!("{x}").into_bytes()
}

fn int(x: u64) -> Vec<u8> {
    x.to_string().into_bytes()
}

/// The bucket a limiter leases from: its key, its limit, and the options every
/// limit-carrying command takes from the limiter's configuration (`INIT`, `VERSION`).
#[derive(Debug, Clone, PartialEq)]
pub struct LeaseTarget {
    pub key: Vec<u8>,
    pub rate: f64,
    pub cap: f64,
    pub init: Option<f64>,
    pub version: Option<u64>,
}

fn head(backend: Backend, name: &str, key: &[u8]) -> Vec<Vec<u8>> {
    match backend {
        Backend::Module => vec![format!("RL.{name}").into_bytes(), key.to_vec()],
        Backend::Functions => vec![
            b"FCALL".to_vec(),
            format!("rl_{}", name.to_ascii_lowercase()).into_bytes(),
            b"1".to_vec(),
            key.to_vec(),
        ],
    }
}

/// `RL.LEASE key rate cap n ttl_ms MIN min [RETURN id unused] [INIT tokens] [VERSION v]`:
/// up to `n` tokens, at least `min` or none, for `ttl_ms`, settling lease `id` (its `unused`
/// tokens go back) in the same call.
pub fn lease_command(
    backend: Backend,
    target: &LeaseTarget,
    n: u64,
    ttl_ms: u64,
    min: u64,
    settle: Option<(u64, u64)>,
) -> Vec<Vec<u8>> {
    let mut out = head(backend, "LEASE", &target.key);
    out.extend([
        number(target.rate),
        number(target.cap),
        int(n),
        int(ttl_ms),
        b"MIN".to_vec(),
        int(min),
    ]);
    if let Some((id, unused)) = settle {
        out.extend([b"RETURN".to_vec(), int(id), int(unused)]);
    }
    if let Some(t) = target.init {
        out.extend([b"INIT".to_vec(), number(t)]);
    }
    if let Some(v) = target.version {
        out.extend([b"VERSION".to_vec(), int(v)]);
    }
    out
}

/// `RL.RETURN key id unused`: a lease's leftovers back to the bucket.
pub fn return_command(backend: Backend, key: &[u8], id: u64, unused: u64) -> Vec<Vec<u8>> {
    let mut out = head(backend, "RETURN", key);
    out.extend([int(id), int(unused)]);
    out
}

/// What `RL.LEASE` answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseReply {
    /// Tokens granted (0: denied).
    pub tokens: u64,
    /// The lease's id, for `RETURN` / `RL.RETURN` (0: a lease that debited nothing, under
    /// an `EXEMPT` pin or a shadow grant: nothing to return).
    pub id: u64,
    /// The TTL the server applied.
    pub ttl_ms: u64,
    /// When denied: how long until `MIN` tokens are there.
    pub retry_after_ms: u64,
}

/// Reads `RL.LEASE`'s `[granted, lease_id, ttl_ms, retry_after_ms]`.
pub fn parse_lease(reply: &Reply) -> Result<LeaseReply, ProtocolError> {
    let items = reply.items("RL.LEASE")?;
    if items.len() != 4 {
        return Err(ProtocolError(format!(
            "RL.LEASE: 4 elements expected, got {}",
            items.len()
        )));
    }
    Ok(LeaseReply {
        tokens: items[0].count("RL.LEASE granted")?,
        id: items[1].count("RL.LEASE lease_id")?,
        ttl_ms: items[2].count("RL.LEASE ttl_ms")?,
        retry_after_ms: items[3].count("RL.LEASE retry_after_ms")?,
    })
}

/// Reads `RL.RETURN`'s reply: the tokens credited back.
pub fn parse_return(reply: &Reply) -> Result<u64, ProtocolError> {
    reply.count("RL.RETURN")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(args: &[Vec<u8>]) -> Vec<String> {
        args.iter()
            .map(|a| String::from_utf8(a.clone()).unwrap())
            .collect()
    }

    #[test]
    fn commands_for_both_backends() {
        let target = LeaseTarget {
            key: b"k".to_vec(),
            rate: 2.5,
            cap: 20.0,
            init: Some(0.5),
            version: Some(3),
        };
        assert_eq!(
            words(&lease_command(
                Backend::Module,
                &target,
                20,
                1000,
                1,
                Some((7, 3))
            )),
            [
                "RL.LEASE", "k", "2.5", "20", "20", "1000", "MIN", "1", "RETURN", "7", "3", "INIT",
                "0.5", "VERSION", "3"
            ]
        );
        let plain = LeaseTarget {
            init: None,
            version: None,
            ..target
        };
        assert_eq!(
            words(&lease_command(Backend::Functions, &plain, 5, 10, 5, None)),
            ["FCALL", "rl_lease", "1", "k", "2.5", "20", "5", "10", "MIN", "5"]
        );
        assert_eq!(
            words(&return_command(Backend::Functions, b"k", 9, 2)),
            ["FCALL", "rl_return", "1", "k", "9", "2"]
        );
        assert_eq!(
            words(&return_command(Backend::Module, b"k", 9, 2)),
            ["RL.RETURN", "k", "9", "2"]
        );
    }

    #[test]
    fn malformed_replies_are_protocol_errors() {
        for r in [
            Reply::Int(1),
            Reply::Array(vec![Reply::Int(1); 3]),
            Reply::Array(vec![Reply::Int(1); 5]),
            Reply::Array(vec![
                Reply::Int(-1),
                Reply::Int(1),
                Reply::Int(1),
                Reply::Int(0),
            ]),
            Reply::Array(vec![
                Reply::Bulk(b"x".to_vec()),
                Reply::Int(1),
                Reply::Int(1),
                Reply::Int(0),
            ]),
            Reply::Error("ERR too many live leases".into()),
        ] {
            assert!(parse_lease(&r).is_err(), "{r:?}");
        }
        assert!(parse_return(&Reply::Int(-1)).is_err());
        assert_eq!(parse_return(&Reply::Int(4)), Ok(4));
    }
}
