//! The golden protocol cases (`protocol/cases/*.json`) that say `"core": true`, decided by
//! rl-core's pure functions at the case's exact time: no server, no clock, so every number
//! must be the case's exactly (the servers' runners compare within a measured window).
//!
//! What it checks, for the plain forms these cases use (`RL.TAKE key rate cap [n]
//! [WITHSTATE]`, `RL.RESERVE key rate cap n max_wait_ms`, `RL.REFUND key n`, on an absent
//! key or a bucket with no version, hold or lease): the reply's numbers (granted, remaining
//! or credited tokens, waits, reset), whether the call writes (the case has an effect), and
//! the new state's `full_at` (or that the key goes). `RL.SHARE` cases (any form) are decided
//! by [`ShareTable::decide`] on the case's table: the reply, whether it writes, the whole new
//! table, the key's expiry (its last entry's end) and the effect's numbers, all exact.
//! Pins (`pins.json`): `RL.PIN key rate cap|BLOCK|EXEMPT [PX ms]`, `RL.UNPIN key`,
//! `RL.PINNED key`, and the plain `RL.TAKE` on a pinned bucket (a state's `pin`), decided by
//! [`rl_core::pin`] as the module's glue uses it: the reply (the pin's kind too), whether it
//! writes, and the whole bucket left (instants, limit, hold, pin), exact. Pins on share keys
//! (`share_pins.json`: a share state's `pin`, `RL.PIN key [SHARES] ...`, `RL.UNPIN`,
//! `RL.PINNED`): as src/share/pin.rs uses [`ShareTable`]: the reply, the whole table left
//! (pin included), and the effect's limit and pin (or `DEL`), exact; `RL.SHARE` on a pinned
//! table answers the pin's kind as a sixth element and carries the pin in its effect.

use rl_core::pin::{self, Gate, Pin, PinKind};
use rl_core::share::SharePin;
use rl_core::{
    ceil_millis, version, Bucket, Holder, Level, Limit, Nanos, ShareRequest, ShareTable,
};
use serde_json::Value as J;

/// The case's "now": any instant works; this one is 2023-11-14.
const NOW: Nanos = 1_700_000_000_000_000_000;

/// A reply value as the case's RESP3 form writes it, markers resolved.
#[derive(Debug, PartialEq)]
enum R {
    Int(i64),
    Double(f64),
    Text(String),
    Nil,
    Row(Vec<R>),
    /// A map's pairs, sorted by name (any order on the wire).
    Map(Vec<(String, R)>),
}

fn map(mut pairs: Vec<(String, R)>) -> R {
    pairs.sort_by(|a, b| a.0.cmp(&b.0));
    R::Map(pairs)
}

fn plain(j: &J) -> R {
    match j {
        J::Number(n) => R::Int(n.as_i64().unwrap()),
        J::String(t) => R::Text(t.clone()),
        J::Null => R::Nil,
        J::Array(items) => R::Row(items.iter().map(plain).collect()),
        J::Object(o) => {
            let (tag, x) = o.iter().next().unwrap();
            match tag.as_str() {
                "tokens" | "double" => R::Double(x.as_f64().unwrap()),
                "ms" => R::Int(x.as_i64().unwrap()),
                "simple" => R::Text(x.as_str().unwrap().into()),
                "map" => map((x.as_array().unwrap().iter())
                    .map(|p| (p[0].as_str().unwrap().into(), plain(&p[1])))
                    .collect()),
                _ => panic!("{tag} in a core case"),
            }
        }
        _ => panic!("{j} in a core case"),
    }
}

fn number(j: &J) -> f64 {
    j.as_str().unwrap().parse().unwrap()
}

/// An instant relative to [`NOW`] as an absolute one.
fn at(j: &J) -> Nanos {
    (NOW as i64 + j.as_i64().unwrap()) as Nanos
}

fn bucket(s: &J) -> Option<Bucket> {
    if s.is_null() {
        return None;
    }
    for f in ["version", "leases", "last_id", "type"] {
        assert!(s.get(f).is_none(), "core cases are plain buckets: {s}");
    }
    if let Some(p) = s.get("pin").filter(|p| p["absent"] == J::Bool(true)) {
        // A key that holds only its pin: the bucket the module stores, limit 1 1 (BLOCK,
        // EXEMPT) or the rate pin's own.
        let own = match (p.get("base_rate"), p.get("base_cap")) {
            (Some(r), Some(c)) => Limit::new(number(r), number(c)).unwrap(),
            _ => Limit::new(1.0, 1.0).unwrap(),
        };
        return Some(Bucket::new(0, own).with_pin(Some(pin_of(p, own))));
    }
    let limit = Limit::new(number(&s["rate"]), number(&s["cap"])).unwrap();
    let (hold, span) = match s.get("span") {
        Some(span) => (at(&s["hold"]), span.as_u64().unwrap()),
        None => (0, 0),
    };
    let b = Bucket::with_keep(at(&s["full_at"]), limit, hold, span);
    Some(b.with_pin(s.get("pin").map(|p| pin_of(p, limit))))
}

/// A state's pin (`base_rate`, `base_cap` absent: the bucket's own `limit`).
fn pin_of(p: &J, limit: Limit) -> Pin {
    let kind = match p["kind"].as_str().unwrap() {
        "rate" => PinKind::Rate,
        "block" => PinKind::Block,
        _ => PinKind::Exempt,
    };
    let base = match (p.get("base_rate"), p.get("base_cap")) {
        (Some(r), Some(c)) => Limit::new(number(r), number(c)).unwrap(),
        _ => limit,
    };
    let until = p["until"].as_i64().unwrap();
    Pin {
        kind,
        until: if until == 0 { 0 } else { at(&p["until"]) },
        base,
        absent: p["absent"] == J::Bool(true),
    }
}

/// `RL.PINNED`'s reply for `b` at [`NOW`] (as src/bucket/pin.rs `describe`).
fn pinned_reply(b: Option<&Bucket>) -> R {
    let Some((b, p)) = b.and_then(|b| b.pin().filter(|p| p.live_at(NOW)).map(|p| (b, p))) else {
        return R::Nil;
    };
    let (rate, cap) = match p.kind {
        PinKind::Rate => (R::Double(b.limit().rate()), R::Double(b.limit().cap())),
        _ => (R::Nil, R::Nil),
    };
    let left = p.left(NOW).map_or(-1, |ns| ceil_millis(ns) as i64);
    map(vec![
        ("kind".into(), R::Text(p.kind.name().into())),
        ("rate".into(), rate),
        ("cap".into(), cap),
        ("ms_left".into(), R::Int(left)),
    ])
}

/// Decides a pin command or a take on a pinned key: the reply, and the bucket to store
/// (`Some(None)`: the key goes; `None`: nothing written). `None` for another command.
fn decide_pinned(a: &[&str], state: Option<Bucket>) -> Option<(R, Option<Option<Bucket>>)> {
    let ok = R::Text("OK".into());
    Some(match a[0] {
        "RL.PIN" => {
            let (kind, limit, rest) = match a[2] {
                "BLOCK" => (PinKind::Block, None, 3),
                "EXEMPT" => (PinKind::Exempt, None, 3),
                r => (
                    PinKind::Rate,
                    Some(Limit::new(r.parse().unwrap(), a[3].parse().unwrap()).unwrap()),
                    4,
                ),
            };
            let until = match &a[rest..] {
                [] => 0,
                ["PX", ms] => NOW + ms.parse::<u64>().unwrap() * 1_000_000,
                other => panic!("RL.PIN options {other:?}"),
            };
            let b = pin::pinned(state.as_ref(), kind, limit, until, NOW);
            (ok, Some(Some(b)))
        }
        "RL.UNPIN" => match state.filter(|b| b.pin().is_some_and(|p| p.live_at(NOW))) {
            None => (R::Int(0), None),
            // No leases in core cases: a bucket full again is no key.
            Some(b) => match pin::unpinned(&b, NOW).filter(|b| b.expires_at() > NOW) {
                Some(b) => (R::Int(1), Some(Some(b))),
                None => (R::Int(1), Some(None)),
            },
        },
        "RL.PINNED" => (pinned_reply(state.as_ref()), None),
        "RL.TAKE" if state.is_some_and(|b| b.has_pin()) => {
            // src/pipeline.rs `open` and src/bucket/take.rs, on a stored pinned bucket.
            let with_state = a.last() == Some(&"WITHSTATE");
            let words = a.len() - usize::from(with_state);
            assert!((4..=5).contains(&words), "a plain RL.TAKE: {a:?}");
            let n: u64 = if words == 5 { a[4].parse().unwrap() } else { 1 };
            let limit = Limit::new(a[2].parse().unwrap(), a[3].parse().unwrap()).unwrap();
            let o = pin::open(state.as_ref(), limit, 0, NOW);
            let mut level = o.level;
            if o.pinned == Some(PinKind::Rate) {
                let gate = pin::over_cap_gate(state.as_ref(), n as f64, NOW);
                if gate != Gate::Open {
                    level = level.with_gate(gate);
                }
            }
            let granted = level.try_take(n as f64);
            let got = if granted { n as i64 } else { 0 };
            let writes = (granted && level.gate() != Gate::Exempt) || o.applied.must_write();
            let kept = o
                .pinned
                .and_then(|_| pin::kept(state.as_ref(), limit, 0, NOW));
            let reply = if with_state {
                let retry = if granted {
                    0
                } else {
                    level.wait_for(n as f64).map_or(0, ceil_millis)
                };
                let mut row = vec![
                    R::Int(got),
                    R::Double(level.signed_tokens()),
                    R::Int(retry as i64),
                    R::Int(ceil_millis(level.reset_after()) as i64),
                ];
                row.extend(o.pinned.map(|k| R::Text(k.name().into())));
                R::Row(row)
            } else {
                R::Int(got)
            };
            (reply, writes.then(|| Some(level.bucket_with_pin(kept))))
        }
        _ => return None,
    })
}

/// Decides a case: the reply, and the bucket to store (`Some(None)`: the key goes; `None`:
/// nothing written).
fn decide(args: &[String], state: Option<Bucket>) -> (R, Option<Option<Bucket>>) {
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    if let Some(decided) = decide_pinned(&a, state) {
        return decided;
    }
    let limit = |i: usize| Limit::new(a[i].parse().unwrap(), a[i + 1].parse().unwrap()).unwrap();
    match a[0] {
        "RL.TAKE" => {
            let with_state = a.last() == Some(&"WITHSTATE");
            let words = a.len() - usize::from(with_state);
            assert!((4..=5).contains(&words), "a plain RL.TAKE: {a:?}");
            let n: u64 = if words == 5 { a[4].parse().unwrap() } else { 1 };
            let (mut level, _) = version::open(state.as_ref(), limit(2), 0, NOW);
            let granted = level.try_take(n as f64);
            let got = if granted { n as i64 } else { 0 };
            let reply = if with_state {
                let retry = if granted {
                    0
                } else {
                    level.wait_for(n as f64).map_or(0, ceil_millis)
                };
                R::Row(vec![
                    R::Int(got),
                    R::Double(level.signed_tokens()),
                    R::Int(retry as i64),
                    R::Int(ceil_millis(level.reset_after()) as i64),
                ])
            } else {
                R::Int(got)
            };
            (reply, granted.then(|| Some(level.bucket())))
        }
        "RL.RESERVE" => {
            assert_eq!(a.len(), 6, "a plain RL.RESERVE: {a:?}");
            let n: u64 = a[4].parse().unwrap();
            let max_wait: u64 = a[5].parse().unwrap();
            let (mut level, _) = version::open(state.as_ref(), limit(2), 0, NOW);
            let (granted, wait) = level.reserve(n as f64, max_wait * 1_000_000).unwrap();
            let reply = R::Row(vec![
                R::Int(if granted { n as i64 } else { 0 }),
                R::Int(ceil_millis(wait) as i64),
                R::Double(level.signed_tokens()),
                R::Int(ceil_millis(level.reset_after()) as i64),
            ]);
            (reply, granted.then(|| Some(level.bucket())))
        }
        "RL.REFUND" => {
            assert_eq!(a.len(), 3, "a plain RL.REFUND: {a:?}");
            let Some(b) = state else {
                return (R::Double(0.0), None);
            };
            let mut level = Level::new(Some(&b), b.limit(), NOW);
            let credited = level.refund(a[2].parse().unwrap());
            let after = level.bucket();
            let written = if credited == 0.0 {
                None
            } else if level.reset_after() == 0 && after.expires_at() <= NOW {
                Some(None)
            } else {
                Some(Some(after))
            };
            (R::Double(credited), written)
        }
        other => panic!("no core form for {other}"),
    }
}

/// A share state's holders at [`NOW`] (`[id, want, rate, burst, lease_end, held_rate,
/// held_burst, held_until]`, instants relative).
fn holders(s: &J) -> Vec<Holder> {
    let at = |j: &J| (NOW as i64 + j.as_i64().unwrap()) as Nanos;
    let f = |j: &J| j.as_f64().unwrap();
    (s["holders"].as_array().unwrap().iter())
        .map(|h| Holder {
            id: h[0].as_str().unwrap().as_bytes().into(),
            want: f(&h[1]),
            rate: f(&h[2]),
            burst: f(&h[3]),
            lease_end: at(&h[4]),
            held_rate: f(&h[5]),
            held_burst: f(&h[6]),
            held_until: at(&h[7]),
        })
        .collect()
}

fn share_table(s: &J) -> Option<ShareTable> {
    if s.is_null() {
        return None;
    }
    let version = s.get("version").map_or(0, |v| v.as_u64().unwrap());
    let pin = s.get("pin").map(share_pin);
    Some(
        ShareTable::validate_pinned(
            number(&s["rate"]),
            number(&s["cap"]),
            version,
            holders(s),
            pin,
        )
        .unwrap(),
    )
}

/// A share state's pin (`until` relative, 0: no end; a rate pin's own `rate`, `cap`).
fn share_pin(p: &J) -> SharePin {
    let (kind, limit) = match p["kind"].as_str().unwrap() {
        "rate" => (
            PinKind::Rate,
            Some(Limit::new(number(&p["rate"]), number(&p["cap"])).unwrap()),
        ),
        "block" => (PinKind::Block, None),
        _ => (PinKind::Exempt, None),
    };
    let until = match p["until"].as_i64().unwrap() {
        0 => 0,
        _ => at(&p["until"]),
    };
    SharePin::new(kind, limit, until).unwrap()
}

/// A pin as its effect's last argument (src/share/mod.rs `PinText`): `0`, `kind,until`
/// or `1,until,rate,cap`.
fn share_pin_text(p: Option<&SharePin>) -> Vec<String> {
    let Some(p) = p else {
        return vec!["0".into()];
    };
    let mut t = vec![p.kind.code().to_string(), p.until.to_string()];
    if let Some(l) = p.limit {
        t.extend([l.rate().to_string(), l.cap().to_string()]);
    }
    t
}

/// Whether an effect's pin argument (`{"fields": [...]}`, or `"0"`) is `got`.
fn same_pin_arg(want: Option<&J>, got: &[String]) -> bool {
    match want {
        Some(J::String(t)) => got == [t.clone()],
        Some(w) => {
            let w = w["fields"].as_array().unwrap();
            w.len() == got.len() && w.iter().zip(got).all(|(w, g)| same_arg(w, g))
        }
        None => false,
    }
}

/// Whether a case is about a share key (`RL.PIN key SHARES`, or a share state).
fn is_share_case(case: &J, a: &[String]) -> bool {
    let key = &a[1];
    a.get(2).is_some_and(|x| x == "SHARES")
        || [&case["state"][key], &case["after"][key]]
            .iter()
            .any(|s| s.get("type").and_then(J::as_str) == Some("share"))
}

/// Decides `RL.PIN`, `RL.UNPIN`, `RL.PINNED` on a share key at [`NOW`] as src/share/pin.rs
/// does: the problems found (the reply, the table left, exact; the effect's pin).
fn share_pin_case(case: &J, args: &[String]) -> Vec<String> {
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    let key = a[1];
    let before = share_table(&case["state"][key]);
    let ok = R::Text("OK".into());
    // The reply, and the table written (`Some(None)`: the key deleted; `None`: nothing).
    let (reply, written): (R, Option<Option<ShareTable>>) = match a[0] {
        "RL.PIN" => {
            let at = usize::from(a[2] == "SHARES") + 2;
            let (kind, limit, rest) = match a[at] {
                "BLOCK" => (PinKind::Block, None, at + 1),
                "EXEMPT" => (PinKind::Exempt, None, at + 1),
                r => (
                    PinKind::Rate,
                    Some(Limit::new(r.parse().unwrap(), a[at + 1].parse().unwrap()).unwrap()),
                    at + 2,
                ),
            };
            let until = match &a[rest..] {
                [] => 0,
                ["PX", ms] => NOW + ms.parse::<u64>().unwrap() * 1_000_000,
                other => panic!("RL.PIN options {other:?}"),
            };
            let p = SharePin::new(kind, limit, until).unwrap();
            let t = match before.clone() {
                // The limit is a placeholder: the first holder's call sets the callers'.
                None => {
                    let l = limit.unwrap_or_else(|| Limit::new(1.0, 1.0).unwrap());
                    ShareTable::validate_pinned(l.rate(), l.cap(), 0, Vec::new(), Some(p)).unwrap()
                }
                Some(mut t) => {
                    t.set_pin(Some(p), NOW);
                    t
                }
            };
            (ok, Some(Some(t)))
        }
        "RL.UNPIN" => match before.clone().filter(|t| t.live_pin(NOW).is_some()) {
            None => (R::Int(0), None),
            Some(mut t) => {
                t.set_pin(None, NOW);
                (R::Int(1), Some((!t.holders().is_empty()).then_some(t)))
            }
        },
        "RL.PINNED" => {
            let reply = match before.as_ref().and_then(|t| t.live_pin(NOW)) {
                None => R::Nil,
                Some(p) => {
                    let (rate, cap) = match p.limit {
                        Some(l) => (R::Double(l.rate()), R::Double(l.cap())),
                        None => (R::Nil, R::Nil),
                    };
                    let left = p.left(NOW).map_or(-1, |ns| ceil_millis(ns) as i64);
                    map(vec![
                        ("kind".into(), R::Text(p.kind.name().into())),
                        ("rate".into(), rate),
                        ("cap".into(), cap),
                        ("ms_left".into(), R::Int(left)),
                    ])
                }
            };
            (reply, None)
        }
        other => panic!("no share core form for {other}"),
    };
    let mut problems = Vec::new();
    if reply != plain(&case["resp3"]) {
        problems.push(format!("reply {reply:?}, want {}", case["resp3"]));
    }
    let effect = case["effect"].as_array().unwrap();
    let writes_in_case = !effect.is_empty();
    if written.is_some() != writes_in_case {
        problems.push(format!(
            "writes: {}, the case's effect: {effect:?}",
            written.is_some()
        ));
    }
    let got = written.clone().unwrap_or(before);
    let after = share_table(&case["after"][key]);
    if got != after {
        problems.push(format!(
            "table {got:?}, want {:?} (NOW = {NOW})",
            case["after"][key]
        ));
    }
    // The effect of a pin set or removed: the limit, version, now, the pin (or DEL).
    if let Some(w) = written {
        let same = match &w {
            None => effect.len() == 1 && effect[0] == serde_json::json!(["DEL", key]),
            Some(t) => {
                let e = effect[0].as_array().unwrap();
                let head = [
                    t.limit().rate().to_string(),
                    t.limit().cap().to_string(),
                    t.version().to_string(),
                    NOW.to_string(),
                ];
                effect.len() == 1
                    && e.len() == 7
                    && e[0] == "RL.SETSHARES"
                    && e[2..6].iter().zip(&head).all(|(w, g)| same_arg(w, g))
                    && same_pin_arg(e.get(6), &share_pin_text(t.pin()))
            }
        };
        if !same {
            problems.push(format!("effect {effect:?}, the table written {w:?}"));
        }
    }
    problems
}

/// Whether one argument of an effect is `want` (a number's text equal as a number, an
/// instant `{"at": ns}` exact at [`NOW`]).
fn same_arg(want: &J, got: &str) -> bool {
    match want.get("at") {
        Some(x) => got.parse::<i64>().ok() == Some(NOW as i64 + x.as_i64().unwrap()),
        None => {
            let w = want.as_str().unwrap();
            w == got || w.parse::<f64>().is_ok_and(|w| got.parse::<f64>() == Ok(w))
        }
    }
}

/// Decides an `RL.SHARE` case at [`NOW`]: the problems found.
fn share_case(case: &J, args: &[String]) -> Vec<String> {
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    let key = a[1];
    let limit = Limit::new(a[2].parse().unwrap(), a[3].parse().unwrap()).unwrap();
    let (mut release, mut version) = (false, 0);
    let mut i = 7;
    while i < a.len() {
        match a[i] {
            "RELEASE" => release = true,
            "VERSION" => {
                i += 1;
                version = a[i].parse().unwrap();
            }
            o => panic!("option {o} in a core case"),
        }
        i += 1;
    }
    let (want, period) = (a[5].parse().unwrap(), a[6].parse().unwrap());
    let req = ShareRequest::new(a[4].as_bytes(), want, period, release, limit, version).unwrap();
    let before = share_table(&case["state"][key]);
    let mut table = before
        .clone()
        .unwrap_or_else(|| ShareTable::new(limit, version));
    let d = table.decide(&req, NOW).unwrap();
    let r = d.reply;
    let mut row = vec![
        R::Double(r.rate),
        R::Double(r.burst),
        R::Int(r.lease_ms as i64),
        R::Int(r.refresh_ms as i64),
        R::Int(r.holders as i64),
    ];
    // The kind of the live pin that decided, a sixth element only then.
    row.extend(d.pinned.map(|k| R::Text(k.name().into())));
    let reply = R::Row(row);
    let mut problems = Vec::new();
    if reply != plain(&case["resp3"]) {
        problems.push(format!("reply {reply:?}, want {}", case["resp3"]));
    }
    let effect = case["effect"].as_array().unwrap();
    let writes_in_case = !effect.is_empty();
    if d.written != writes_in_case {
        problems.push(format!(
            "writes: {}, the case's effect: {effect:?}",
            d.written
        ));
    }
    let after = share_table(&case["after"][key]);
    let got = if d.written {
        Some(table.clone())
    } else {
        before
    };
    if got != after {
        problems.push(format!(
            "table {got:?}, want {:?} (NOW = {NOW})",
            case["after"][key]
        ));
    }
    if d.written {
        if d.expires_at != table.expires_at() {
            problems.push(format!(
                "expires at {}, its last end (or its pin's) {:?}",
                d.expires_at,
                table.expires_at()
            ));
        }
        // The effect: the limit, the version, ended entries dropped at now, the entry set.
        let h = &table.holders()[d.index];
        let got = [
            table.limit().rate().to_string(),
            table.limit().cap().to_string(),
            table.version().to_string(),
            NOW.to_string(),
            String::from_utf8(h.id.to_vec()).unwrap(),
        ];
        let fields = [
            h.want.to_string(),
            h.rate.to_string(),
            h.burst.to_string(),
            h.lease_end.to_string(),
            h.held_rate.to_string(),
            h.held_burst.to_string(),
            h.held_until.to_string(),
        ];
        let e = effect[0].as_array().unwrap();
        let want_fields = e[7]["fields"].as_array().unwrap();
        // A pinned table's entry carries the pin (an unpinned one none).
        let pin_ok = match table.pin() {
            None => e.len() == 8,
            Some(p) => e.len() == 9 && same_pin_arg(e.get(8), &share_pin_text(Some(p))),
        };
        let same = effect.len() == 1
            && e[0] == "RL.SETSHARES"
            && e[2..7].iter().zip(&got).all(|(w, g)| same_arg(w, g))
            && want_fields.len() == 7
            && want_fields.iter().zip(&fields).all(|(w, g)| same_arg(w, g))
            && pin_ok;
        if !same {
            problems.push(format!(
                "effect {effect:?}, the entry written {got:?} {fields:?}"
            ));
        }
    }
    problems
}

#[test]
fn core_decides_every_core_case_exactly() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../protocol/cases");
    let mut ran = 0;
    let mut failures = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|x| x != "json") {
            continue;
        }
        let doc: J = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        for case in doc["cases"].as_array().unwrap() {
            if case.get("core") != Some(&J::Bool(true)) {
                continue;
            }
            ran += 1;
            let args: Vec<String> = case["args"]
                .as_array()
                .unwrap()
                .iter()
                .map(|a| a.as_str().expect("core cases have plain arguments").into())
                .collect();
            let share_pin = args[0] != "RL.SHARE" && is_share_case(case, &args);
            if args[0] == "RL.SHARE" || share_pin {
                let problems = if share_pin {
                    share_pin_case(case, &args)
                } else {
                    share_case(case, &args)
                };
                if !problems.is_empty() {
                    failures.push(format!(
                        "{}: {}: {problems:?}",
                        path.display(),
                        case["name"]
                    ));
                }
                continue;
            }
            let key = &args[1];
            let before = bucket(&case["state"][key]);
            let (reply, written) = decide(&args, before);
            let mut problems = Vec::new();
            if reply != plain(&case["resp3"]) {
                problems.push(format!("reply {reply:?}, want {}", case["resp3"]));
            }
            let effect = !case["effect"].as_array().unwrap().is_empty();
            if written.is_some() != effect {
                problems.push(format!(
                    "writes: {}, the case's effect: {effect}",
                    written.is_some()
                ));
            }
            let after = &case["after"][key];
            let pins = args[0].contains("PIN")
                || [&case["state"][key], after]
                    .iter()
                    .any(|s| s.get("pin").is_some());
            if pins {
                // The whole bucket left: instants, limit, hold and pin, exact.
                let got = written.unwrap_or(before);
                let want = bucket(after);
                if got != want {
                    problems.push(format!("bucket {got:?}, want {want:?} (NOW = {NOW})"));
                }
            }
            let after_full_at = after
                .get("full_at")
                .and_then(J::as_i64)
                .map(|f| NOW as i64 + f);
            let got = match &written {
                Some(b) => b.map(|b| b.full_at() as i64),
                None => before.map(|b| b.full_at() as i64),
            };
            if !pins && got != after_full_at {
                problems.push(format!(
                    "full_at {got:?}, want {after_full_at:?} (NOW = {NOW})"
                ));
            }
            if !problems.is_empty() {
                failures.push(format!(
                    "{}: {}: {problems:?}",
                    path.display(),
                    case["name"]
                ));
            }
        }
    }
    assert!(ran >= 10, "only {ran} core cases");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
