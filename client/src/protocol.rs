//! The wire protocol, in one place: the commands the client sends (the module's, or the
//! Functions library's `FCALL rl_...` with the same arguments) and the reading of their
//! replies, which are checked rather than trusted (RESP2 and RESP3 alike).

use std::time::Duration;

use redis::{Cmd, Value};
use rl_core::Limit;

use crate::pin::{PinInfo, PinKind, PinSpec};
use crate::{Backend, Error};

/// The head of command `name` (`RL.TAKE`...) for `backend`; the caller adds the key and
/// the arguments as for the module.
pub(crate) fn head(backend: Backend, name: &str) -> Cmd {
    match backend {
        Backend::Functions => {
            let mut c = redis::cmd("FCALL");
            c.arg(name.replace("RL.", "rl_").to_ascii_lowercase())
                .arg(1);
            c
        }
        _ => redis::cmd(name),
    }
}

/// The options every limit-carrying command takes from the limiter's configuration:
/// `INIT tokens` and `VERSION v`.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct LimitOptions {
    pub(crate) init: Option<f64>,
    pub(crate) version: Option<u64>,
}

impl LimitOptions {
    pub(crate) fn of(config: &crate::LimiterConfig) -> LimitOptions {
        LimitOptions {
            init: config.init,
            version: config.version,
        }
    }
}

/// `[INIT tokens] [INIT tokens] [VERSION v]` after a command's other arguments.
fn with_limit_options(mut cmd: Cmd, options: LimitOptions) -> Cmd {
    if let Some(t) = options.init {
        cmd.arg("INIT").arg(t);
    }
    if let Some(v) = options.version {
        cmd.arg("VERSION").arg(v);
    }
    cmd
}

/// `RL.TAKE key rate cap n WITHSTATE [INIT tokens] [VERSION v]`.
pub(crate) fn take_cmd(
    backend: Backend,
    key: &str,
    limit: &Limit,
    n: u64,
    options: LimitOptions,
) -> Cmd {
    let mut cmd = head(backend, "RL.TAKE");
    cmd.arg(key)
        .arg(limit.rate())
        .arg(limit.cap())
        .arg(n)
        .arg("WITHSTATE");
    with_limit_options(cmd, options)
}

/// `RL.RESERVE key rate cap n max_wait_ms [INIT tokens] [VERSION v]`.
pub(crate) fn reserve_cmd(
    backend: Backend,
    key: &str,
    limit: &Limit,
    n: u64,
    max_wait: Duration,
    options: LimitOptions,
) -> Cmd {
    let mut cmd = head(backend, "RL.RESERVE");
    cmd.arg(key)
        .arg(limit.rate())
        .arg(limit.cap())
        .arg(n)
        .arg(max_wait.as_millis() as u64);
    with_limit_options(cmd, options)
}

/// `RL.REFUND key n`.
pub(crate) fn refund_cmd(backend: Backend, key: &str, n: u64) -> Cmd {
    let mut cmd = head(backend, "RL.REFUND");
    cmd.arg(key).arg(n);
    cmd
}

/// `RL.PEEK key`.
pub(crate) fn peek_cmd(backend: Backend, key: &str) -> Cmd {
    let mut cmd = head(backend, "RL.PEEK");
    cmd.arg(key);
    cmd
}

/// `RL.PEEK`'s tokens: `None` for a missing key; the map (or flat array) otherwise.
pub(crate) fn peek_reply(v: Value) -> Result<Option<f64>, Error> {
    let Some(fields) = fields(v, "RL.PEEK")? else {
        return Ok(None);
    };
    match fields.iter().find(|(k, _)| k == "tokens") {
        Some((_, v)) => number(v).map(Some),
        None => Err(Error::Reply("RL.PEEK reply without tokens".into())),
    }
}

/// `RL.MTAKE n key rate cap [key rate cap ...] [INIT tokens] [VERSION v]` (or `FCALL rl_mtake N keys.. n
/// rate cap..`): the client core's command ([`rl_client_core::rules::mtake_command`]).
pub(crate) fn mtake_cmd(
    backend: Backend,
    keys: &[&str],
    limit: &Limit,
    n: u64,
    options: LimitOptions,
) -> Cmd {
    let core = match backend {
        Backend::Functions => rl_client_core::budget::Backend::Functions,
        _ => rl_client_core::budget::Backend::Module,
    };
    let buckets: Vec<(&[u8], f64, f64)> = keys
        .iter()
        .map(|k| (k.as_bytes(), limit.rate(), limit.cap()))
        .collect();
    let args = rl_client_core::rules::mtake_command(core, &buckets, n, false);
    let mut cmd = redis::cmd(std::str::from_utf8(&args[0]).unwrap_or("RL.MTAKE"));
    for a in &args[1..] {
        cmd.arg(a.as_slice());
    }
    with_limit_options(cmd, options)
}

/// `RL.MTAKE`'s `[granted, denied_by, retry_after_ms]`: the tokens granted (the client
/// core's parser, [`rl_client_core::rules::parse_mtake`]).
pub(crate) fn mtake_reply(v: Value) -> Result<u64, Error> {
    rl_client_core::rules::parse_mtake(&crate::budget::to_reply(v), None)
        .map(|r| r.granted)
        .map_err(|e| Error::Reply(e.0))
}

pub(crate) fn acquire_cmd(key: &str, limit: u64, ttl: Duration) -> Cmd {
    let mut cmd = redis::cmd("RL.ACQUIRE");
    cmd.arg(key)
        .arg(limit)
        .arg(ttl.as_millis().clamp(1, u128::from(u64::MAX)) as u64);
    cmd
}

/// `RL.RELEASE key id`.
pub(crate) fn release_cmd(key: &str, id: u64) -> Cmd {
    let mut cmd = redis::cmd("RL.RELEASE");
    cmd.arg(key).arg(id);
    cmd
}

/// `RL.RENEW key id ttl_ms`.
pub(crate) fn renew_cmd(key: &str, id: u64, ttl: Duration) -> Cmd {
    let mut cmd = redis::cmd("RL.RENEW");
    cmd.arg(key)
        .arg(id)
        .arg(ttl.as_millis().clamp(1, u128::from(u64::MAX)) as u64);
    cmd
}

/// The four numbers of an `RL.TAKE ... WITHSTATE` or `RL.RESERVE` reply: granted, then
/// `retry_after_ms` / `wait_ms`, the remaining tokens and `reset_after_ms` (in the order
/// the command sends them: see [`take_reply`] and [`reserve_reply`]).
pub(crate) struct BucketReply {
    pub(crate) granted: u64,
    pub(crate) remaining: f64,
    pub(crate) wait: Duration,
    pub(crate) reset_after: Duration,
    /// The kind of the live pin that decided (`RL.TAKE ... WITHSTATE`'s fifth element).
    pub(crate) pinned: Option<PinKind>,
}

/// `[granted, remaining, retry_after_ms, reset_after_ms]`, and a fifth element, the pin's
/// kind, when a live pin decided.
pub(crate) fn take_reply(v: Value) -> Result<BucketReply, Error> {
    let items = match v {
        Value::Array(items) if items.len() == 4 || items.len() == 5 => items,
        other => return Err(bad("expected an array of 4 or 5", &other)),
    };
    let pinned = match items.get(4) {
        None => None,
        Some(kind) => Some(pin_kind(kind)?),
    };
    Ok(BucketReply {
        granted: count(&items[0])?,
        remaining: number(&items[1])?,
        wait: Duration::from_millis(count(&items[2])?),
        reset_after: Duration::from_millis(count(&items[3])?),
        pinned,
    })
}

/// A pin's kind element (`rate`, `block`, `exempt`).
fn pin_kind(v: &Value) -> Result<PinKind, Error> {
    text(v)
        .and_then(|t| PinKind::parse(&t))
        .ok_or_else(|| bad("expected a pin kind (rate, block, exempt)", v))
}

/// A string element (bulk, simple or verbatim).
fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        Value::VerbatimString { text, .. } => Some(text.clone()),
        _ => None,
    }
}

/// `RL.PIN key rate cap | BLOCK | EXEMPT [PX ms]`.
pub(crate) fn pin_cmd(backend: Backend, key: &str, spec: &PinSpec, px_ms: Option<u64>) -> Cmd {
    let mut cmd = head(backend, "RL.PIN");
    cmd.arg(key);
    match spec {
        PinSpec::Rate(limit) => cmd.arg(limit.rate()).arg(limit.cap()),
        PinSpec::Block => cmd.arg("BLOCK"),
        PinSpec::Exempt => cmd.arg("EXEMPT"),
    };
    if let Some(ms) = px_ms {
        cmd.arg("PX").arg(ms);
    }
    cmd
}

/// `RL.UNPIN key` or `RL.PINNED key`.
pub(crate) fn key_cmd(backend: Backend, name: &str, key: &str) -> Cmd {
    let mut cmd = head(backend, name);
    cmd.arg(key);
    cmd
}

/// `RL.PIN`'s `OK`.
pub(crate) fn ok_reply(v: Value) -> Result<(), Error> {
    match v {
        Value::Okay => Ok(()),
        Value::SimpleString(s) if s == "OK" => Ok(()),
        other => Err(bad("expected OK", &other)),
    }
}

/// The fields of a map reply (RESP3) or of its flat array (RESP2); `None` for nil.
fn fields(v: Value, what: &str) -> Result<Option<Vec<(String, Value)>>, Error> {
    let pairs: Vec<(Value, Value)> = match v {
        Value::Nil => return Ok(None),
        Value::Map(pairs) => pairs,
        Value::Array(items) if items.len() % 2 == 0 => {
            let mut it = items.into_iter();
            let mut pairs = Vec::new();
            while let (Some(k), Some(v)) = (it.next(), it.next()) {
                pairs.push((k, v));
            }
            pairs
        }
        other => return Err(bad(&format!("expected {what}'s map"), &other)),
    };
    Ok(Some(
        pairs
            .into_iter()
            .filter_map(|(k, v)| text(&k).map(|k| (k, v)))
            .collect(),
    ))
}

/// `RL.PINNED`'s nil, or `kind`, `rate`, `cap` (nil but for a rate pin) and `ms_left` (-1:
/// until unpinned).
pub(crate) fn pinned_reply(v: Value) -> Result<Option<PinInfo>, Error> {
    let Some(fields) = fields(v, "RL.PINNED")? else {
        return Ok(None);
    };
    let get = |name: &str| {
        fields
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v)
            .ok_or_else(|| Error::Reply(format!("RL.PINNED reply without {name}")))
    };
    let kind = pin_kind(get("kind")?)?;
    let limit =
        match kind {
            PinKind::Rate => {
                let (rate, cap) = (number(get("rate")?)?, number(get("cap")?)?);
                Some(Limit::new(rate, cap).map_err(|e| {
                    Error::Reply(format!("RL.PINNED: not a limit: {rate} {cap}: {e}"))
                })?)
            }
            _ => None,
        };
    let left = match get("ms_left")? {
        Value::Int(-1) => None,
        other => Some(Duration::from_millis(count(other)?)),
    };
    Ok(Some(PinInfo { kind, limit, left }))
}

/// `[granted, wait_ms, remaining, reset_after_ms]`.
pub(crate) fn reserve_reply(v: Value) -> Result<BucketReply, Error> {
    let items = array(v, 4)?;
    Ok(BucketReply {
        granted: count(&items[0])?,
        wait: Duration::from_millis(count(&items[1])?),
        remaining: number(&items[2])?,
        reset_after: Duration::from_millis(count(&items[3])?),
        pinned: None,
    })
}

/// `RL.ACQUIRE`'s `[granted, permit_id, in_use, retry_after_ms]`.
pub(crate) struct AcquireReply {
    pub(crate) granted: bool,
    pub(crate) id: u64,
    pub(crate) in_use: u64,
    pub(crate) retry_after: Duration,
}

pub(crate) fn acquire_reply(v: Value) -> Result<AcquireReply, Error> {
    let items = array(v, 4)?;
    Ok(AcquireReply {
        granted: count(&items[0])? > 0,
        id: count(&items[1])?,
        in_use: count(&items[2])?,
        retry_after: Duration::from_millis(count(&items[3])?),
    })
}

/// `RL.REFUND`'s tokens credited.
pub(crate) fn credited(v: Value) -> Result<f64, Error> {
    number(&v)
}

fn bad(what: &str, v: &Value) -> Error {
    Error::Reply(format!("{what}: {v:?}"))
}

/// The elements of an array reply of exactly `len` items.
pub(crate) fn array(v: Value, len: usize) -> Result<Vec<Value>, Error> {
    match v {
        Value::Array(items) if items.len() == len => Ok(items),
        other => Err(bad(&format!("expected an array of {len}"), &other)),
    }
}

/// A non-negative integer element.
pub(crate) fn count(v: &Value) -> Result<u64, Error> {
    match v {
        Value::Int(i) if *i >= 0 => Ok(*i as u64),
        other => Err(bad("expected a non-negative integer", other)),
    }
}

/// A number element: a double (RESP3) or its text (RESP2 bulk string).
pub(crate) fn number(v: &Value) -> Result<f64, Error> {
    let parsed = match v {
        Value::Double(d) => Some(*d),
        Value::Int(i) => Some(*i as f64),
        Value::BulkString(bytes) => std::str::from_utf8(bytes).ok().and_then(|s| s.parse().ok()),
        Value::SimpleString(s) => s.parse().ok(),
        _ => None,
    };
    parsed
        .filter(|d: &f64| d.is_finite())
        .ok_or_else(|| bad("expected a number", v))
}

/// An integer reply (`RL.RETURN`).
pub(crate) fn integer(v: Value) -> Result<u64, Error> {
    count(&v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_in_both_protocols() {
        assert_eq!(number(&Value::Double(2.5)).unwrap(), 2.5);
        assert_eq!(number(&Value::BulkString(b"0.25".to_vec())).unwrap(), 0.25);
        assert!(number(&Value::BulkString(b"nan".to_vec())).is_err());
        assert!(number(&Value::Nil).is_err());
    }

    #[test]
    fn shapes_are_checked() {
        assert!(array(Value::Array(vec![Value::Int(1)]), 4).is_err());
        assert!(count(&Value::Int(-1)).is_err());
        assert_eq!(count(&Value::Int(7)).unwrap(), 7);
    }

    #[test]
    fn a_take_reply_says_the_pin_that_decided() {
        let four = || {
            vec![
                Value::Int(1),
                Value::Double(4.0),
                Value::Int(0),
                Value::Int(2),
            ]
        };
        assert_eq!(take_reply(Value::Array(four())).unwrap().pinned, None);
        let mut five = four();
        five.push(Value::BulkString(b"exempt".to_vec()));
        let r = take_reply(Value::Array(five)).unwrap();
        assert_eq!((r.granted, r.pinned), (1, Some(PinKind::Exempt)));
        let mut unknown = four();
        unknown.push(Value::BulkString(b"paused".to_vec()));
        assert!(take_reply(Value::Array(unknown)).is_err());
        let mut six = four();
        six.extend([Value::SimpleString("rate".into()), Value::Nil]);
        assert!(take_reply(Value::Array(six)).is_err());
    }

    #[test]
    fn pinned_reads_both_protocols() {
        let text = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let resp3 = Value::Map(vec![
            (text("kind"), text("rate")),
            (text("rate"), Value::Double(500.0)),
            (text("cap"), Value::Double(250.0)),
            (text("ms_left"), Value::Int(1200)),
        ]);
        let info = pinned_reply(resp3).unwrap().unwrap();
        assert_eq!(info.kind, PinKind::Rate);
        assert_eq!(info.limit, Some(Limit::new(500.0, 250.0).unwrap()));
        assert_eq!(info.left, Some(Duration::from_millis(1200)));
        let resp2 = Value::Array(vec![
            text("kind"),
            text("block"),
            text("rate"),
            Value::Nil,
            text("cap"),
            Value::Nil,
            text("ms_left"),
            Value::Int(-1),
        ]);
        let info = pinned_reply(resp2).unwrap().unwrap();
        assert_eq!(
            (info.kind, info.limit, info.left),
            (PinKind::Block, None, None)
        );
        assert_eq!(pinned_reply(Value::Nil).unwrap(), None);
        assert!(pinned_reply(Value::Array(vec![text("kind")])).is_err());
    }

    #[test]
    fn pin_commands() {
        let limit = Limit::new(500.0, 500.0).unwrap();
        let rate = pin_cmd(Backend::Module, "k", &PinSpec::Rate(limit), Some(600_000));
        assert_eq!(
            words(&rate),
            ["RL.PIN", "k", "500.0", "500.0", "PX", "600000"]
        );
        let block = pin_cmd(Backend::Module, "k", &PinSpec::Block, None);
        assert_eq!(words(&block), ["RL.PIN", "k", "BLOCK"]);
        let exempt = pin_cmd(Backend::Functions, "k", &PinSpec::Exempt, Some(5));
        assert_eq!(
            words(&exempt),
            ["FCALL", "rl_pin", "1", "k", "EXEMPT", "PX", "5"]
        );
    }

    fn words(c: &Cmd) -> Vec<String> {
        c.args_iter()
            .map(|a| match a {
                redis::Arg::Simple(b) => String::from_utf8_lossy(b).into_owned(),
                redis::Arg::Cursor => "?".into(),
            })
            .collect()
    }

    #[test]
    fn functions_heads() {
        let mut c = head(Backend::Functions, "RL.LEASE");
        c.arg("k");
        assert_eq!(words(&c), ["FCALL", "rl_lease", "1", "k"]);
        assert_eq!(words(&head(Backend::Module, "RL.TAKE")), ["RL.TAKE"]);
    }

    /// Every golden protocol case's reply (`protocol/cases/*.json`), in both RESP versions,
    /// parses to the numbers the case says, in the order the command sends them. Errors are
    /// left out (redis-rs turns them into errors before a parser sees them), and so is
    /// `RL.MTAKE ... WITHSTATE`, which this client never sends.
    mod golden {
        use super::*;
        use serde_json::Value as J;

        /// Lease and permit ids in a case count from the call's microsecond clock.
        const BASE_US: i64 = 1_700_000_000_000_000;

        fn value(j: &J) -> Value {
            match j {
                J::Null => Value::Nil,
                J::Number(n) => Value::Int(n.as_i64().unwrap()),
                J::String(s) => Value::BulkString(s.clone().into_bytes()),
                J::Array(items) => Value::Array(items.iter().map(value).collect()),
                J::Bool(_) => panic!("no booleans in replies"),
                J::Object(o) => {
                    let (tag, x) = o.iter().next().unwrap();
                    let pairs = || {
                        x.as_array()
                            .unwrap()
                            .iter()
                            .map(|p| (value(&p[0]), value(&p[1])))
                            .collect::<Vec<_>>()
                    };
                    match tag.as_str() {
                        "double" | "tokens" => Value::Double(x.as_f64().unwrap()),
                        "simple" => Value::SimpleString(x.as_str().unwrap().into()),
                        "double_text" | "tokens_text" => {
                            Value::BulkString(x.as_f64().unwrap().to_string().into_bytes())
                        }
                        "ms" => Value::Int(x.as_i64().unwrap()),
                        "id" => Value::Int(BASE_US + x.as_i64().unwrap()),
                        "map" => Value::Map(pairs()),
                        "pairs" => {
                            Value::Array(pairs().into_iter().flat_map(|(k, v)| [k, v]).collect())
                        }
                        other => panic!("unknown reply tag {other}"),
                    }
                }
            }
        }

        /// A pin's kind as a number here (the replies name it).
        fn kind_code(kind: PinKind) -> f64 {
            match kind {
                PinKind::Rate => 1.0,
                PinKind::Block => 2.0,
                PinKind::Exempt => 3.0,
            }
        }

        /// The numbers a case's RESP3 reply says, in wire order (ids on the base; a pin's
        /// kind as its code).
        fn want(j: &J) -> Vec<f64> {
            match j {
                J::Number(n) => vec![n.as_f64().unwrap()],
                J::String(s) if ["rate", "block", "exempt"].contains(&s.as_str()) => {
                    vec![kind_code(
                        pin_kind(&Value::BulkString(s.clone().into_bytes())).unwrap(),
                    )]
                }
                J::Array(items) => items.iter().flat_map(want).collect(),
                J::Object(o) => {
                    let (tag, x) = o.iter().next().unwrap();
                    match tag.as_str() {
                        "id" => vec![(BASE_US + x.as_i64().unwrap()) as f64],
                        // RL.PINNED's map: kind, a rate pin's limit, ms_left (-1: no end).
                        "map" | "pairs" if x.as_array().unwrap().iter().any(|p| p[0] == "kind") => {
                            ["kind", "rate", "cap", "ms_left"]
                                .iter()
                                .filter_map(|f| x.as_array().unwrap().iter().find(|p| p[0] == *f))
                                .flat_map(|p| want(&p[1]))
                                .collect()
                        }
                        // RL.PEEK's map: the client reads the tokens.
                        "map" | "pairs" => x
                            .as_array()
                            .unwrap()
                            .iter()
                            .filter(|p| p[0] == "tokens")
                            .flat_map(|p| want(&p[1]))
                            .collect(),
                        "simple" => vec![],
                        _ => vec![x.as_f64().unwrap()],
                    }
                }
                _ => vec![],
            }
        }

        fn secs(d: Duration) -> f64 {
            d.as_millis() as f64
        }

        /// The case's reply parsed as the client parses that command; `None`: not parsed here.
        fn parse(args: &[String], v: Value) -> Option<Result<Vec<f64>, Error>> {
            let with_state = args.iter().any(|a| a.eq_ignore_ascii_case("WITHSTATE"));
            Some(match args[0].as_str() {
                "RL.TAKE" if with_state => take_reply(v).map(|r| {
                    let mut got = vec![
                        r.granted as f64,
                        r.remaining,
                        secs(r.wait),
                        secs(r.reset_after),
                    ];
                    got.extend(r.pinned.map(kind_code));
                    got
                }),
                "RL.PIN" => ok_reply(v).map(|()| vec![]),
                "RL.PINNED" => pinned_reply(v).map(|p| {
                    p.map_or(vec![], |p| {
                        let mut got = vec![kind_code(p.kind)];
                        got.extend(p.limit.iter().flat_map(|l| [l.rate(), l.cap()]));
                        got.push(p.left.map_or(-1.0, secs));
                        got
                    })
                }),
                "RL.RESERVE" => reserve_reply(v).map(|r| {
                    vec![
                        r.granted as f64,
                        secs(r.wait),
                        r.remaining,
                        secs(r.reset_after),
                    ]
                }),
                "RL.LEASE" => rl_client_core::lease::parse_lease(&crate::budget::to_reply(v))
                    .map_err(|e| Error::Reply(e.0))
                    .map(|r| {
                        vec![
                            r.tokens as f64,
                            r.id as f64,
                            r.ttl_ms as f64,
                            r.retry_after_ms as f64,
                        ]
                    }),
                "RL.ACQUIRE" => acquire_reply(v).map(|r| {
                    vec![
                        f64::from(u8::from(r.granted)),
                        r.id as f64,
                        r.in_use as f64,
                        secs(r.retry_after),
                    ]
                }),
                // The share holder's reply is read by the client core.
                "RL.SHARE" => rl_client_core::share::parse_share(&crate::budget::to_reply(v))
                    .map_err(|e| Error::Reply(e.0))
                    .map(|g| {
                        let mut got = vec![
                            g.rate,
                            g.burst,
                            (g.lease / 1_000_000) as f64,
                            (g.refresh / 1_000_000) as f64,
                            g.holders as f64,
                        ];
                        got.extend(g.pinned.map(kind_code));
                        got
                    }),
                "RL.MTAKE" if with_state => return None,
                "RL.MTAKE" => mtake_reply(v).map(|g| vec![g as f64]),
                "RL.PEEK" => peek_reply(v).map(|t| t.into_iter().collect()),
                "RL.REFUND" => credited(v).map(|c| vec![c]),
                "RL.TAKE" | "RL.RETURN" | "RL.RELEASE" | "RL.RENEW" | "RL.UNPIN" => {
                    integer(v).map(|i| vec![i as f64])
                }
                _ => return None,
            })
        }

        #[test]
        fn every_case_reply_parses_in_both_protocols() {
            let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../protocol/cases");
            let mut parsed = 0;
            for entry in std::fs::read_dir(dir).unwrap() {
                let path = entry.unwrap().path();
                if path.extension().is_none_or(|x| x != "json") {
                    continue;
                }
                let doc: J =
                    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
                for case in doc["cases"].as_array().unwrap() {
                    let resp3 = &case["resp3"];
                    if resp3.get("error").is_some() {
                        continue;
                    }
                    let args: Vec<String> = case["args"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|a| a.as_str().unwrap_or("id").to_ascii_uppercase())
                        .collect();
                    let mut want = want(resp3);
                    if args[0] == "RL.MTAKE" {
                        want.truncate(1);
                    }
                    for protocol in ["resp2", "resp3"] {
                        let Some(got) = parse(&args, value(&case[protocol])) else {
                            continue;
                        };
                        let got = got.unwrap_or_else(|e| {
                            panic!("{}: {} ({protocol}): {e}", path.display(), case["name"])
                        });
                        assert_eq!(
                            got,
                            want,
                            "{}: {} ({protocol})",
                            path.display(),
                            case["name"]
                        );
                        parsed += 1;
                    }
                }
            }
            assert!(parsed >= 60, "only {parsed} replies parsed");
        }
    }
}
