//! The single-key commands a limiter sends besides its takes' hot path and the leases:
//! `RL.TAKE` with its options (`WITHSTATE`, `INIT`, `VERSION`), `RL.RESERVE`, and the
//! replies of `RL.RESERVE`, `RL.ACQUIRE` and `RL.PEEK`, for the module and the Functions library
//! alike. The Python package builds and reads them here (the golden cases of
//! `protocol/cases/` pin both ends through it).

use crate::budget::Backend;
use crate::reply::{ProtocolError, Reply};

/// A number as the module reads it back exactly (the shortest digits that round-trip).
fn number(x: f64) -> Vec<u8> {
    format!("{x}").into_bytes()
}

fn int(x: u64) -> Vec<u8> {
    x.to_string().into_bytes()
}

/// The command's name and its one key: `RL.NAME key` or `FCALL rl_name 1 key`.
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

/// The options a bucket's first write and its stored limit's version take.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Options {
    /// `INIT tokens`: what a missing bucket starts with (else full).
    pub init: Option<f64>,
    /// `VERSION v`: the limit's version (a lower one than stored is refused).
    pub version: Option<u64>,
}

fn options(out: &mut Vec<Vec<u8>>, o: Options) {
    if let Some(t) = o.init {
        out.extend([b"INIT".to_vec(), number(t)]);
    }
    if let Some(v) = o.version {
        out.extend([b"VERSION".to_vec(), int(v)]);
    }
}

/// `RL.TAKE key rate cap n [WITHSTATE] [INIT t] [VERSION v]`.
pub fn take_command(
    backend: Backend,
    key: &[u8],
    (rate, cap): (f64, f64),
    n: u64,
    withstate: bool,
    o: Options,
) -> Vec<Vec<u8>> {
    let mut out = head(backend, "TAKE", key);
    out.extend([number(rate), number(cap), int(n)]);
    if withstate {
        out.push(b"WITHSTATE".to_vec());
    }
    options(&mut out, o);
    out
}

/// `RL.RESERVE key rate cap n max_wait_ms [INIT t] [VERSION v]`.
pub fn reserve_command(
    backend: Backend,
    key: &[u8],
    (rate, cap): (f64, f64),
    n: u64,
    max_wait_ms: u64,
    o: Options,
) -> Vec<Vec<u8>> {
    let mut out = head(backend, "RESERVE", key);
    out.extend([number(rate), number(cap), int(n), int(max_wait_ms)]);
    options(&mut out, o);
    out
}

/// What `RL.RESERVE` answered.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ReserveReply {
    /// The tokens reserved: `n`, or 0 (the wait would pass `max_wait_ms`).
    pub granted: u64,
    /// How long to wait before using them.
    pub wait_ms: u64,
    /// Tokens left after the call (negative while the bucket is in debt).
    pub remaining: f64,
    pub reset_after_ms: u64,
}

fn four<'a>(reply: &'a Reply, what: &str) -> Result<&'a [Reply], ProtocolError> {
    let items = reply.items(what)?;
    if items.len() != 4 {
        return Err(ProtocolError(format!(
            "{what}: 4 elements expected, got {}",
            items.len()
        )));
    }
    Ok(items)
}

/// Reads `RL.RESERVE`'s reply: `[granted, wait_ms, remaining, reset_after_ms]`.
pub fn parse_reserve(reply: &Reply) -> Result<ReserveReply, ProtocolError> {
    let items = four(reply, "RL.RESERVE")?;
    let remaining = items[2].number("RL.RESERVE remaining")?;
    if !remaining.is_finite() {
        return Err(ProtocolError(format!(
            "RL.RESERVE remaining: {remaining} is not a finite number"
        )));
    }
    Ok(ReserveReply {
        granted: items[0].count("RL.RESERVE granted")?,
        wait_ms: items[1].count("RL.RESERVE wait_ms")?,
        remaining,
        reset_after_ms: items[3].count("RL.RESERVE reset_after_ms")?,
    })
}

/// What `RL.ACQUIRE` answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AcquireReply {
    pub granted: bool,
    /// The permit's id (0 when refused).
    pub permit_id: u64,
    /// Permits held after the call.
    pub in_use: u64,
    pub retry_after_ms: u64,
}

/// Reads `RL.ACQUIRE`'s reply: `[granted 0|1, permit_id, in_use, retry_after_ms]`.
pub fn parse_acquire(reply: &Reply) -> Result<AcquireReply, ProtocolError> {
    let items = four(reply, "RL.ACQUIRE")?;
    let granted = match items[0].count("RL.ACQUIRE granted")? {
        0 => false,
        1 => true,
        other => {
            return Err(ProtocolError(format!(
                "RL.ACQUIRE granted: {other} is neither 0 nor 1"
            )))
        }
    };
    Ok(AcquireReply {
        granted,
        permit_id: items[1].count("RL.ACQUIRE permit_id")?,
        in_use: items[2].count("RL.ACQUIRE in_use")?,
        retry_after_ms: items[3].count("RL.ACQUIRE retry_after_ms")?,
    })
}

/// What `RL.PEEK` answered for a key that exists.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Peek {
    pub tokens: f64,
    pub rate: f64,
    pub cap: f64,
    pub reset_after_ms: u64,
    /// Leases out (0 from a server that does not say).
    pub leases: u64,
    pub leased_tokens: u64,
    /// The stored limit's version; `None` from a server without it.
    pub version: Option<u64>,
}

/// Reads `RL.PEEK`'s reply: a map under RESP3, a flat list of pairs under RESP2 (fields
/// it does not know are skipped); `None` for a missing key (a full bucket).
pub fn parse_peek(reply: &Reply) -> Result<Option<Peek>, ProtocolError> {
    let pairs: Vec<(&Reply, &Reply)> = match reply {
        Reply::Nil => return Ok(None),
        Reply::Map(m) => m.iter().map(|(k, v)| (k, v)).collect(),
        Reply::Array(a) if a.len() % 2 == 0 => a.chunks(2).map(|p| (&p[0], &p[1])).collect(),
        other => {
            return Err(ProtocolError(format!(
                "RL.PEEK: a map or pairs expected, got {other:?}"
            )))
        }
    };
    let field = |name: &str| -> Result<Option<&Reply>, ProtocolError> {
        for (k, v) in &pairs {
            if k.bytes_or_nil("RL.PEEK field")? == Some(name.as_bytes()) {
                return Ok(Some(*v));
            }
        }
        Ok(None)
    };
    let need = |name: &str| {
        field(name)?.ok_or_else(|| ProtocolError(format!("RL.PEEK reply lacks {name:?}")))
    };
    let finite = |name: &str| -> Result<f64, ProtocolError> {
        let x = need(name)?.number(&format!("RL.PEEK {name}"))?;
        if x.is_finite() {
            Ok(x)
        } else {
            Err(ProtocolError(format!("RL.PEEK {name}: {x} is not finite")))
        }
    };
    let count_or_zero = |name: &str| -> Result<u64, ProtocolError> {
        field(name)?.map_or(Ok(0), |v| v.count(&format!("RL.PEEK {name}")))
    };
    let version = match field("version")? {
        None | Some(Reply::Nil) => None,
        Some(v) => Some(v.count("RL.PEEK version")?),
    };
    Ok(Some(Peek {
        tokens: finite("tokens")?,
        rate: finite("rate")?,
        cap: finite("cap")?,
        reset_after_ms: need("reset_after_ms")?.count("RL.PEEK reset_after_ms")?,
        leases: count_or_zero("leases")?,
        leased_tokens: count_or_zero("leased_tokens")?,
        version,
    }))
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
        let o = Options {
            init: Some(0.0),
            version: Some(3),
        };
        let take = take_command(Backend::Module, b"k", (0.5, 10.0), 2, true, o);
        assert_eq!(
            words(&take),
            [
                "RL.TAKE",
                "k",
                "0.5",
                "10",
                "2",
                "WITHSTATE",
                "INIT",
                "0",
                "VERSION",
                "3"
            ]
        );
        let take = take_command(
            Backend::Functions,
            b"k",
            (5.0, 10.0),
            1,
            false,
            Options::default(),
        );
        assert_eq!(words(&take), ["FCALL", "rl_take", "1", "k", "5", "10", "1"]);
        let reserve = reserve_command(
            Backend::Module,
            b"k",
            (1.0, 2.0),
            1,
            500,
            Options::default(),
        );
        assert_eq!(words(&reserve), ["RL.RESERVE", "k", "1", "2", "1", "500"]);
    }

    #[test]
    fn malformed_replies_are_protocol_errors() {
        use Reply::*;
        for bad in [
            Nil,
            Int(1),
            Array(vec![Int(1), Int(0), Int(1)]),
            Array(vec![Int(1), Int(0), Bulk(b"x".to_vec()), Int(1)]),
            Array(vec![Int(-1), Int(0), Int(1), Int(1)]),
            Array(vec![Int(1), Int(0), Double(f64::NAN), Int(1)]),
            Array(vec![Int(1), Int(0), Int(1), Int(1), Int(1)]),
        ] {
            assert!(parse_reserve(&bad).is_err(), "{bad:?}");
            assert!(parse_acquire(&bad).is_err(), "{bad:?}");
        }
        assert!(parse_acquire(&Array(vec![Int(2), Int(1), Int(1), Int(0)])).is_err());
        assert!(parse_peek(&Array(vec![Bulk(b"tokens".to_vec())])).is_err());
        assert!(parse_peek(&Array(vec![Int(1), Int(2)])).is_err());
        assert!(parse_peek(&Map(vec![(Bulk(b"tokens".to_vec()), Int(1))])).is_err());
        assert_eq!(parse_peek(&Nil), Ok(None));
        let ok = parse_acquire(&Array(vec![Int(1), Int(7), Int(1), Int(0)])).unwrap();
        assert!(ok.granted && ok.permit_id == 7);
    }
}
