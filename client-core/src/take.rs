//! A limiter's takes (`RL.TAKE key rate cap n WITHSTATE`, or the Functions library's
//! `rl_take`): the command, its reply, the decision and its HTTP rendering (the
//! `X-RateLimit-*` headers, `Retry-After` and the 429 body), and a limiter's state: its
//! limit, its failure policy (the core's [`Fallback`]: a local bucket per key at `share` of
//! the limit, or a refusal) and its counters. No I/O, no clock reads: time is
//! passed in (nanoseconds on any monotonic clock the shell keeps).

use rl_core::{Limit, Nanos};

use crate::budget::Backend;
use crate::fallback::Fallback;
use crate::reply::{ProtocolError, Reply};
use crate::token_budget::{FailurePolicy, Source, DEFAULT_INSTANCES};

/// A number as the module reads it back exactly (the shortest digits that round-trip).
fn number(x: f64) -> Vec<u8> {
    format!("{x}").into_bytes()
}

/// The arguments (command name first) of a take of `n` tokens on `key`, with the bucket's
/// state in the reply (`WITHSTATE`).
pub fn take_command(backend: Backend, key: &[u8], rate: f64, cap: f64, n: u64) -> Vec<Vec<u8>> {
    let rest = [
        number(rate),
        number(cap),
        n.to_string().into_bytes(),
        b"WITHSTATE".to_vec(),
    ];
    let mut out: Vec<Vec<u8>> = Vec::with_capacity(8);
    match backend {
        Backend::Module => {
            out.push(b"RL.TAKE".to_vec());
            out.push(key.to_vec());
        }
        Backend::Functions => {
            out.extend([
                b"FCALL".to_vec(),
                b"rl_take".to_vec(),
                b"1".to_vec(),
                key.to_vec(),
            ]);
        }
    }
    out.extend(rest);
    out
}

/// The kind of the operator's pin (`RL.PIN`) that decided a take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pinned {
    /// The pin's limit decided, not the caller's.
    Rate,
    /// Denied by the pin.
    Block,
    /// Granted, nothing debited.
    Exempt,
}

impl Pinned {
    pub fn name(self) -> &'static str {
        match self {
            Pinned::Rate => "rate",
            Pinned::Block => "block",
            Pinned::Exempt => "exempt",
        }
    }
}

/// What `RL.TAKE ... WITHSTATE` answered.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TakeReply {
    /// The tokens granted: `n`, or 0.
    pub granted: u64,
    /// Tokens left after the call (negative while the bucket is in debt).
    pub remaining: f64,
    pub retry_after_ms: u64,
    pub reset_after_ms: u64,
    /// The pin that decided, the reply's fifth element.
    pub pinned: Option<Pinned>,
}

/// Reads `RL.TAKE ... WITHSTATE`'s reply: `[granted, remaining, retry_after_ms,
/// reset_after_ms]`, and the kind of the pin that decided as a fifth element when one did.
pub fn parse_take(reply: &Reply) -> Result<TakeReply, ProtocolError> {
    let items = reply.items("RL.TAKE WITHSTATE")?;
    if items.len() != 4 && items.len() != 5 {
        return Err(ProtocolError(format!(
            "RL.TAKE WITHSTATE: 4 or 5 elements expected, got {}",
            items.len()
        )));
    }
    let granted = items[0].count("RL.TAKE granted")?;
    let remaining = items[1].number("RL.TAKE remaining")?;
    if !remaining.is_finite() {
        return Err(ProtocolError(format!(
            "RL.TAKE remaining: {remaining} is not a finite number"
        )));
    }
    let retry_after_ms = items[2].count("RL.TAKE retry_after_ms")?;
    let reset_after_ms = items[3].count("RL.TAKE reset_after_ms")?;
    let pinned = match items.get(4) {
        None => None,
        Some(kind) => Some(
            match kind.bytes_or_nil("RL.TAKE pinned")?.unwrap_or_default() {
                b"rate" => Pinned::Rate,
                b"block" => Pinned::Block,
                b"exempt" => Pinned::Exempt,
                other => {
                    return Err(ProtocolError(format!(
                        "RL.TAKE pinned: {:?} is no pin kind (rate, block, exempt)",
                        String::from_utf8_lossy(other)
                    )))
                }
            },
        ),
    };
    Ok(TakeReply {
        granted,
        remaining,
        retry_after_ms,
        reset_after_ms,
        pinned,
    })
}

/// One take's decision.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Decision {
    pub granted: bool,
    /// Tokens granted: the `n` asked for, or 0.
    pub tokens: u64,
    /// The bucket's tokens after the call, as Redis (or the local fallback) reported.
    pub remaining: f64,
    pub retry_after_ms: u64,
    pub reset_after_ms: u64,
    /// The bucket's capacity (`X-RateLimit-Limit`).
    pub limit: f64,
    pub source: Source,
    pub pinned: Option<Pinned>,
}

/// Milliseconds as whole seconds, rounded up (a `Retry-After` never says too early).
pub fn ceil_secs(ms: u64) -> u64 {
    ms.div_ceil(1000)
}

/// A cap for the `X-RateLimit-Limit` header: an integer without `.0`, else the float.
pub fn format_limit(cap: f64) -> String {
    if cap.fract() == 0.0 && cap.abs() < 1e15 {
        format!("{}", cap as i64)
    } else {
        format!("{cap}")
    }
}

impl Decision {
    /// `Retry-After`: whole seconds, rounded up, at least 1.
    pub fn retry_after_secs(&self) -> u64 {
        ceil_secs(self.retry_after_ms).max(1)
    }

    /// `X-RateLimit-Limit/Remaining/Reset`, and `Retry-After` when denied (the Python
    /// client's headers, name for name).
    pub fn headers(&self) -> Vec<(&'static str, String)> {
        let mut h = vec![
            ("X-RateLimit-Limit", format_limit(self.limit)),
            (
                "X-RateLimit-Remaining",
                format!("{}", self.remaining.floor().max(0.0) as u64),
            ),
            (
                "X-RateLimit-Reset",
                ceil_secs(self.reset_after_ms).to_string(),
            ),
        ];
        if !self.granted {
            h.push(("Retry-After", self.retry_after_secs().to_string()));
        }
        h
    }

    /// The JSON body of a 429 answer, as the Python middleware writes it:
    /// `{"error": {"code": "rate_limit_exceeded", "retry_after": N}}`.
    pub fn too_many_body(&self) -> String {
        format!(
            "{{\"error\": {{\"code\": \"rate_limit_exceeded\", \"retry_after\": {}}}}}",
            self.retry_after_secs()
        )
    }
}

/// What a limiter decides while Redis cannot answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TakePolicy {
    /// Fail open through a local bucket per key at `share` of the limit (the failure
    /// policy's [`Fallback`]: carried across outages, debited by what Redis grants).
    Allow,
    /// Fail closed: every take refused until Redis answers.
    Deny,
}

/// How long a refusal of the `Deny` policy asks the caller to wait.
pub const DENY_RETRY_AFTER_MS: u64 = 1000;

/// A limiter's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TakeCounters {
    /// Takes Redis decided, granted and denied.
    pub granted: u64,
    pub denied: u64,
    /// Tokens Redis granted.
    pub tokens_granted: u64,
    /// Takes the failure policy decided, granted and denied.
    pub fallback_granted: u64,
    pub fallback_denied: u64,
    /// Calls that found Redis unreachable or slow.
    pub outages: u64,
    /// Calls that ended in an error (an error reply, a malformed reply): raised, not decided.
    pub errors: u64,
    /// Requests a fail-open integration let through on an error.
    pub errors_let_through: u64,
}

/// Keys the failure policy keeps a local bucket for at most; beyond, they start afresh (a
/// fail-open limiter's memory stays bounded whatever the keys a middleware is handed).
pub const MAX_LOCAL_KEYS: usize = 100_000;

/// A limiter's state: its key and limit, the failure policy (a local bucket per key a take
/// named: a middleware's limiter takes on one key per caller) and the counters.
/// No I/O, no clock reads, not thread-safe by itself (each shell holds it as its language
/// needs: Node's one thread, a lock elsewhere).
#[derive(Debug, Clone)]
pub struct TakeLimiter {
    key: Vec<u8>,
    limit: Limit,
    fallback: Fallback,
    counters: TakeCounters,
}

impl TakeLimiter {
    /// A limiter of `rate` tokens per second and bursts of `cap` on `key`. `share`: this
    /// instance's part of the limit when the failure policy decides (`1 / instances`;
    /// `None`: `1 / DEFAULT_INSTANCES`).
    pub fn new(
        key: &str,
        rate: f64,
        cap: f64,
        policy: TakePolicy,
        share: Option<f64>,
    ) -> Result<TakeLimiter, String> {
        if key.is_empty() {
            return Err("key must not be empty".into());
        }
        let share = share.unwrap_or(1.0 / f64::from(DEFAULT_INSTANCES));
        if !(share > 0.0 && share <= 1.0) {
            return Err("share must be in (0, 1]: 1 / instances".into());
        }
        let limit = Limit::new(rate, cap)
            .map_err(|e| format!("limit ({rate}/s, burst {cap}): {}", e.message()))?;
        let policy = match policy {
            TakePolicy::Allow => FailurePolicy::Allow,
            TakePolicy::Deny => FailurePolicy::Deny,
        };
        let deny = DENY_RETRY_AFTER_MS * 1_000_000;
        Ok(TakeLimiter {
            key: key.as_bytes().to_vec(),
            limit,
            fallback: Fallback::new(policy, limit, share, deny, MAX_LOCAL_KEYS)?,
            counters: TakeCounters::default(),
        })
    }

    pub fn key(&self) -> &[u8] {
        &self.key
    }

    pub fn limit(&self) -> Limit {
        self.limit
    }

    pub fn counters(&self) -> TakeCounters {
        self.counters
    }

    /// Whether `n` tokens can be asked for at all (1 to the burst).
    pub fn check(&self, n: u64) -> Result<(), String> {
        if n == 0 {
            return Err("n must be at least 1".into());
        }
        if n as f64 > self.limit.cap() {
            return Err(format!(
                "n = {n} is above the burst of {} and could never be granted",
                format_limit(self.limit.cap())
            ));
        }
        Ok(())
    }

    /// The command that takes `n` tokens on this limiter's key.
    pub fn command(&self, backend: Backend, n: u64) -> Vec<Vec<u8>> {
        take_command(backend, &self.key, self.limit.rate(), self.limit.cap(), n)
    }

    /// The command that takes `n` tokens on `key` (under this limiter's limit).
    pub fn command_on(&self, backend: Backend, key: &[u8], n: u64) -> Vec<Vec<u8>> {
        take_command(backend, key, self.limit.rate(), self.limit.cap(), n)
    }

    /// Decides a take of `n` on this limiter's key from Redis's reply, at `now`.
    pub fn taken(&mut self, n: u64, reply: &Reply, now: Nanos) -> Result<Decision, ProtocolError> {
        let key = std::mem::take(&mut self.key);
        let d = self.taken_on(&key, n, reply, now);
        self.key = key;
        d
    }

    /// Decides a take of `n` on `key` from Redis's reply to [`TakeLimiter::command_on`],
    /// at `now`. What Redis granted comes off the key's local bucket (the share is spent
    /// once, from Redis or locally; the bucket carries across outages).
    pub fn taken_on(
        &mut self,
        key: &[u8],
        n: u64,
        reply: &Reply,
        now: Nanos,
    ) -> Result<Decision, ProtocolError> {
        let r = match parse_take(reply) {
            Ok(r) if r.granted == 0 || r.granted == n => r,
            Ok(r) => {
                self.counters.errors += 1;
                return Err(ProtocolError(format!(
                    "RL.TAKE granted: {} for a take of {n}",
                    r.granted
                )));
            }
            Err(e) => {
                self.counters.errors += 1;
                return Err(e);
            }
        };
        self.fallback
            .observe(key, r.granted, Some(r.remaining), now);
        let granted = r.granted > 0;
        if granted {
            self.counters.granted += 1;
            self.counters.tokens_granted += n;
        } else {
            self.counters.denied += 1;
        }
        Ok(Decision {
            granted,
            tokens: if granted { n } else { 0 },
            remaining: r.remaining,
            retry_after_ms: r.retry_after_ms,
            reset_after_ms: r.reset_after_ms,
            limit: self.limit.cap(),
            source: Source::Server,
            pinned: r.pinned,
        })
    }

    /// A call that ended in an error the caller is told about (an error reply).
    pub fn error(&mut self) {
        self.counters.errors += 1;
    }

    /// A request a fail-open integration let through on an error.
    pub fn let_through(&mut self) {
        self.counters.errors_let_through += 1;
    }

    /// Tokens Redis granted on this limiter's key outside a take (a prefetching shell's
    /// lease): debited from the failure policy's local bucket as a take's grant is, so an
    /// outage after it lets out the share once, not again.
    pub fn observe(&mut self, granted: u64, now: Nanos) {
        self.fallback.observe(&self.key, granted, None, now);
    }

    /// Decides a take of `n` on this limiter's key Redis did not answer, at `now`.
    pub fn outage(&mut self, n: u64, now: Nanos) -> Decision {
        let key = std::mem::take(&mut self.key);
        let d = self.outage_on(&key, n, now);
        self.key = key;
        d
    }

    /// Decides a take of `n` on `key` Redis did not answer (unreachable, slower than the
    /// timeout), as the failure policy says, at `now`.
    pub fn outage_on(&mut self, key: &[u8], n: u64, now: Nanos) -> Decision {
        self.counters.outages += 1;
        let d = self.fallback.decide(key, n, now);
        if d.granted {
            self.counters.fallback_granted += 1;
        } else {
            self.counters.fallback_denied += 1;
        }
        Decision {
            granted: d.granted,
            tokens: d.tokens,
            remaining: d.remaining,
            retry_after_ms: rl_core::ceil_millis(d.retry_after),
            reset_after_ms: rl_core::ceil_millis(d.reset_after),
            limit: self.limit.cap(),
            source: Source::Fallback,
            pinned: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::Value;

    const SEC: Nanos = 1_000_000_000;

    fn strs(args: &[Vec<u8>]) -> Vec<String> {
        args.iter()
            .map(|a| String::from_utf8(a.clone()).unwrap())
            .collect()
    }

    #[test]
    fn commands_for_both_backends() {
        assert_eq!(
            strs(&take_command(Backend::Module, b"user:42", 2.0, 10.0, 3)),
            ["RL.TAKE", "user:42", "2", "10", "3", "WITHSTATE"]
        );
        assert_eq!(
            strs(&take_command(Backend::Functions, b"k", 0.5, 7.25, 1)),
            [
                "FCALL",
                "rl_take",
                "1",
                "k",
                "0.5",
                "7.25",
                "1",
                "WITHSTATE"
            ]
        );
        // 100/minute: the shortest digits that round-trip.
        let rate = 100.0 / 60.0;
        let args = take_command(Backend::Module, b"k", rate, 100.0, 1);
        assert_eq!(
            String::from_utf8(args[2].clone())
                .unwrap()
                .parse::<f64>()
                .unwrap(),
            rate
        );
    }

    /// A golden reply as a client hands it over (times at the call's instant: exact).
    fn golden(v: &Value) -> Reply {
        match v {
            Value::Null => Reply::Nil,
            Value::Number(n) => Reply::Int(n.as_i64().unwrap()),
            Value::String(s) => Reply::Bulk(s.clone().into_bytes()),
            Value::Array(a) => Reply::Array(a.iter().map(golden).collect()),
            Value::Object(o) => {
                let (k, x) = o.iter().next().unwrap();
                match k.as_str() {
                    "ms" => Reply::Int(x.as_i64().unwrap()),
                    "tokens" | "double" => Reply::Double(x.as_f64().unwrap()),
                    "tokens_text" | "double_text" => {
                        Reply::Bulk(format!("{}", x.as_f64().unwrap()).into_bytes())
                    }
                    other => panic!("no golden form {other}"),
                }
            }
            Value::Bool(_) => panic!("no booleans in take replies"),
        }
    }

    /// Every `RL.TAKE ... WITHSTATE` case of the golden files (take.json, pins.json), under
    /// both protocols, parses to the case's numbers.
    #[test]
    fn golden_take_replies() {
        let mut seen = 0;
        for file in ["take.json", "pins.json"] {
            let path = format!("{}/../protocol/cases/{file}", env!("CARGO_MANIFEST_DIR"));
            let doc: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
            for case in doc["cases"].as_array().unwrap() {
                let args: Vec<&str> = case["args"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|a| a.as_str().unwrap_or(""))
                    .collect();
                if args[0] != "RL.TAKE" || !args.contains(&"WITHSTATE") {
                    continue;
                }
                for proto in ["resp2", "resp3"] {
                    let want = &case[proto];
                    if want.get("error").is_some() {
                        continue;
                    }
                    let got = parse_take(&golden(want))
                        .unwrap_or_else(|e| panic!("{}: {e}", case["name"]));
                    let w = want.as_array().unwrap();
                    let num = |v: &Value| match v {
                        Value::Object(o) => o.values().next().unwrap().as_f64().unwrap(),
                        other => other.as_f64().unwrap(),
                    };
                    assert_eq!(got.granted as f64, num(&w[0]), "{}", case["name"]);
                    assert_eq!(got.remaining, num(&w[1]), "{}", case["name"]);
                    assert_eq!(got.retry_after_ms as f64, num(&w[2]), "{}", case["name"]);
                    assert_eq!(got.reset_after_ms as f64, num(&w[3]), "{}", case["name"]);
                    assert_eq!(
                        got.pinned.map(Pinned::name),
                        w.get(4).and_then(Value::as_str),
                        "{}",
                        case["name"]
                    );
                    seen += 1;
                }
            }
        }
        assert!(seen >= 40, "only {seen} golden replies");
    }

    #[test]
    fn malformed_replies_are_protocol_errors() {
        for r in [
            Reply::Int(1),
            Reply::Array(vec![Reply::Int(1); 3]),
            Reply::Array(vec![Reply::Int(1); 6]),
            Reply::Array(vec![
                Reply::Int(-1),
                Reply::Int(1),
                Reply::Int(0),
                Reply::Int(0),
            ]),
            Reply::Array(vec![
                Reply::Int(1),
                Reply::Bulk(b"x".to_vec()),
                Reply::Int(0),
                Reply::Int(0),
            ]),
            Reply::Array(vec![
                Reply::Int(1),
                Reply::Bulk(b"inf".to_vec()),
                Reply::Int(0),
                Reply::Int(0),
            ]),
            Reply::Array(vec![
                Reply::Int(1),
                Reply::Int(1),
                Reply::Int(0),
                Reply::Int(0),
                Reply::Bulk(b"open".to_vec()),
            ]),
            Reply::Error("ERR n must not exceed cap".into()),
        ] {
            assert!(parse_take(&r).is_err(), "{r:?}");
        }
        let mut l = TakeLimiter::new("k", 1.0, 10.0, TakePolicy::Allow, None).unwrap();
        let two = Reply::Array(vec![
            Reply::Int(2),
            Reply::Int(1),
            Reply::Int(0),
            Reply::Int(0),
        ]);
        assert!(l.taken(3, &two, 0).is_err(), "granted 2 for a take of 3");
        assert_eq!(l.counters().errors, 1);
    }

    #[test]
    fn headers_and_body_as_the_python_middleware_writes_them() {
        let mut l = TakeLimiter::new("k", 2.0, 10.0, TakePolicy::Allow, None).unwrap();
        let reply = |g: i64, rem: f64, retry: i64, reset: i64| {
            Reply::Array(vec![
                Reply::Int(g),
                Reply::Bulk(format!("{rem}").into_bytes()),
                Reply::Int(retry),
                Reply::Int(reset),
            ])
        };
        let d = l.taken(3, &reply(3, 7.5, 0, 1250), 0).unwrap();
        assert!(d.granted && d.source == Source::Server && d.tokens == 3);
        assert_eq!(
            d.headers(),
            [
                ("X-RateLimit-Limit", "10".to_string()),
                ("X-RateLimit-Remaining", "7".to_string()),
                ("X-RateLimit-Reset", "2".to_string()),
            ]
        );
        let d = l.taken(3, &reply(0, -0.5, 1, 5250), 0).unwrap();
        assert_eq!(d.headers()[1].1, "0");
        assert_eq!(d.headers()[3], ("Retry-After", "1".to_string()));
        assert_eq!(
            d.too_many_body(),
            r#"{"error": {"code": "rate_limit_exceeded", "retry_after": 1}}"#
        );
        assert_eq!(format_limit(2.5), "2.5");
        let c = l.counters();
        assert_eq!((c.granted, c.denied, c.tokens_granted), (1, 1, 3));
    }

    #[test]
    fn deny_refuses_allow_spends_a_share() {
        let mut deny = TakeLimiter::new("k", 1.0, 8.0, TakePolicy::Deny, Some(1.0)).unwrap();
        let d = deny.outage(1, 0);
        assert!(!d.granted && d.source == Source::Fallback && d.retry_after_ms == 1000);

        // A quarter of 8 tokens and 4/s: 2 tokens, refilling at 1/s.
        let mut l = TakeLimiter::new("k", 4.0, 8.0, TakePolicy::Allow, None).unwrap();
        assert!(l.outage(1, 0).granted);
        assert!(l.outage(1, 0).granted);
        let d = l.outage(1, 0);
        assert!(!d.granted);
        assert_eq!(d.retry_after_ms, 1000);
        assert!(l.outage(1, SEC).granted);
        // More than the local bucket holds: denied, never granted on credit.
        assert!(!l.outage(3, 10 * SEC).granted);
        let c = l.counters();
        assert_eq!(
            (c.fallback_granted, c.fallback_denied, c.outages),
            (3, 2, 5)
        );
        // Redis answers, granting this instance 1: it comes off the key's local bucket (2,
        // refilled by then), which carries on at the next outage (not full again).
        l.taken(
            1,
            &Reply::Array(vec![
                Reply::Int(1),
                Reply::Int(7),
                Reply::Int(0),
                Reply::Int(250),
            ]),
            10 * SEC,
        )
        .unwrap();
        assert!(!l.outage(2, 10 * SEC).granted);
        assert!(l.outage(1, 10 * SEC).granted);
        // Each key its own local bucket.
        assert!(l.outage_on(b"other", 2, 10 * SEC).granted);
        assert!(!l.outage_on(b"other", 1, 10 * SEC).granted);
        assert!(!l.outage(1, 10 * SEC).granted);
        assert_eq!(
            strs(&l.command_on(Backend::Module, b"rl:http:1.2.3.4", 1))[1],
            "rl:http:1.2.3.4"
        );
    }

    #[test]
    fn bad_limits_are_refused() {
        assert!(TakeLimiter::new("", 1.0, 1.0, TakePolicy::Allow, None).is_err());
        assert!(TakeLimiter::new("k", 0.0, 1.0, TakePolicy::Allow, None).is_err());
        assert!(TakeLimiter::new("k", 1.0, 1.0, TakePolicy::Allow, Some(0.0)).is_err());
        let l = TakeLimiter::new("k", 1.0, 5.0, TakePolicy::Allow, None).unwrap();
        assert!(l.check(0).is_err() && l.check(6).is_err() && l.check(5).is_ok());
    }

    proptest! {
        /// The local bucket never lets out more than `share * (cap + rate * elapsed)`.
        #[test]
        fn local_grants_stay_within_the_share(
            steps in proptest::collection::vec((0u64..2 * SEC, 1u64..5), 1..100),
            share in 0.05f64..=1.0,
        ) {
            let mut l = TakeLimiter::new("k", 10.0, 20.0, TakePolicy::Allow, Some(share)).unwrap();
            let (mut now, mut out) = (0u64, 0u64);
            for (dt, n) in steps {
                now += dt;
                if l.outage(n, now).granted {
                    out += n;
                }
                let local = l.fallback.local_limit();
                let bound = local.cap() + local.rate() * now as f64 / SEC as f64;
                prop_assert!(out as f64 <= bound + 1e-6);
            }
        }

        /// Any reply is read or refused: never a panic.
        #[test]
        fn any_reply_is_read_or_refused(i in any::<i64>(), d in any::<f64>(), k in "[a-z]{0,8}") {
            let mut l = TakeLimiter::new("k", 1.0, 10.0, TakePolicy::Allow, None).unwrap();
            for reply in [
                Reply::Array(vec![Reply::Int(i), Reply::Double(d), Reply::Int(i), Reply::Int(i)]),
                Reply::Array(vec![Reply::Int(1), Reply::Bulk(k.clone().into_bytes()), Reply::Int(0), Reply::Int(0), Reply::Bulk(k.clone().into_bytes())]),
                Reply::Array(vec![Reply::Int(i); 5]),
                Reply::Simple(k.clone()),
            ] {
                if let Ok(dec) = l.taken(1, &reply, 0) {
                    let _ = dec.headers();
                }
            }
        }
    }
}
