//! The share holder's state machine against its golden cases
//! (`protocol/client-cases/share.json`): each step's command, decision, next call and
//! share, as every shell must see them (the Rust client's and the Python extension's
//! runners read the same file); and property tests: whatever the events and replies, a
//! holder lets out at most what its shares earned, and never panics.

use proptest::prelude::*;
use rl_client_core::budget::Backend;
use rl_client_core::share::{FailurePolicy, Policy, ShareKey, HOLD, MS};
use rl_client_core::share_holder::{Event, Holder, Refresh, Take};
use rl_client_core::Reply;
mod common;

use common::reply;
use serde_json::Value as J;

fn backend(j: &J) -> Backend {
    match j.as_str() {
        Some("functions") => Backend::Functions,
        Some("module") => Backend::Module,
        other => panic!("backend {other:?}"),
    }
}

fn text(args: &[Vec<u8>]) -> Vec<String> {
    args.iter()
        .map(|a| String::from_utf8(a.clone()).unwrap())
        .collect()
}

fn pin(kind: Option<rl_core::pin::PinKind>) -> J {
    kind.map_or(J::Null, |k| J::from(k.name()))
}

fn close(name: &str, what: &str, got: f64, want: &J) {
    let w = want
        .as_f64()
        .unwrap_or_else(|| panic!("{name}: {what} {want:?}"));
    assert!((got - w).abs() < 1e-6, "{name}: {what} {got} != {w}");
}

fn check_take(name: &str, t: &Take, want: &J) {
    assert_eq!(
        t.allowed,
        want["allowed"].as_bool().unwrap(),
        "{name}: {t:?}"
    );
    assert_eq!(
        t.fallback,
        want["fallback"].as_bool().unwrap(),
        "{name}: {t:?}"
    );
    close(name, "remaining", t.remaining, &want["remaining"]);
    assert_eq!(
        t.retry_after_ms(),
        want["retry_after_ms"].as_u64().unwrap(),
        "{name}: {t:?}"
    );
    assert_eq!(
        t.reset_after_ms(),
        want["reset_after_ms"].as_u64().unwrap(),
        "{name}: {t:?}"
    );
    assert_eq!(pin(t.pinned), want["pinned"], "{name}: {t:?}");
}

/// The holder a case describes, both halves, at `now`.
fn holder(h: &J, now: u64) -> (Holder, Refresh, Vec<u8>, u64) {
    let policy = match h["policy"].as_str().unwrap() {
        "allow" => FailurePolicy::Allow,
        "last_known" => FailurePolicy::LastKnown,
        "deny" => FailurePolicy::Deny,
        other => panic!("policy {other}"),
    };
    let ms = |f: &str| h[f].as_u64().unwrap() * MS;
    let policy = Policy {
        policy,
        allow_share: h["allow_share"].as_f64().unwrap(),
        rate: h["rate"].as_f64().unwrap(),
        cap: h["cap"].as_f64().unwrap(),
        instances: h["instances"].as_u64().unwrap(),
        allow_for: ms("allow_for_ms"),
    };
    let key = ShareKey {
        key: h["key"].as_str().unwrap().as_bytes().to_vec(),
        rate: policy.rate,
        cap: policy.cap,
        period_ms: h["period_ms"].as_u64().unwrap(),
        version: h["version"].as_u64(),
    };
    let period = ms("period_ms");
    let taker = Holder::new(policy, period, ms("deny_retry_after_ms"), now);
    let refresh = Refresh::new(key, h["headroom"].as_f64().unwrap(), now);
    let id = h["id"].as_str().unwrap().as_bytes().to_vec();
    (taker, refresh, id, ms("probe_ms"))
}

#[test]
fn the_share_holder_follows_its_golden_cases() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../protocol/client-cases/share.json"
    );
    let doc: J = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut steps_run = 0;
    for case in doc["cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let mut h = doc["holder"].clone();
        for (k, v) in case["holder"].as_object().unwrap() {
            h[k] = v.clone();
        }
        let (mut taker, mut refresh, id, probe) = holder(&h, 0);
        let mut sent = 0;
        for step in case["steps"].as_array().unwrap() {
            let now = step["at_ms"].as_u64().unwrap_or(0) * MS;
            let next = |ns: u64| assert_eq!(J::from(ns / MS), step["next_ms"], "{name}: {step}");
            if let Some(b) = step.get("send") {
                let (cmd, event) = refresh.send(backend(b), &id, taker.attempted(), now);
                if let Some(want) = step.get("command") {
                    assert_eq!(&J::from(text(&cmd)), want, "{name}: {step}");
                }
                taker.apply(&event);
                sent = now;
            } else if let Some(b) = step.get("release") {
                let cmd = refresh.release_command(backend(b), &id);
                assert_eq!(J::from(text(&cmd)), step["command"], "{name}: {step}");
            } else if let Some(r) = step.get("reply") {
                match refresh.answered(&reply(r), sent, now, 0.0) {
                    Ok((event, ns)) => {
                        assert!(step.get("protocol_error").is_none(), "{name}: {step}");
                        taker.apply(&event);
                        next(ns);
                    }
                    Err(e) => {
                        assert_eq!(step["protocol_error"], J::Bool(true), "{name}: {e}");
                        let (event, ns) = refresh.failed();
                        taker.apply(&event);
                        next(ns);
                    }
                }
            } else if step.get("error").is_some() {
                let (event, ns) = refresh.failed();
                taker.apply(&event);
                next(ns);
            } else if step.get("timeout").is_some() || step.get("refused").is_some() {
                let refused = step.get("refused").is_some();
                let (event, ns) = refresh.outage(refused, now, probe);
                taker.apply(&event);
                next(ns);
            } else if let Some(n) = step.get("take") {
                let got = taker.take(n.as_u64().unwrap(), now);
                match got {
                    None => assert_eq!(step["failed"], J::Bool(true), "{name}: {step}"),
                    Some(t) => check_take(name, &t, &step["decision"]),
                }
            } else if let Some(want) = step.get("share") {
                let i = taker.info(now);
                close(name, "rate", i.rate, &want["rate"]);
                close(name, "burst", i.burst, &want["burst"]);
                close(name, "tokens", i.tokens, &want["tokens"]);
                assert_eq!(J::from(i.holders), want["holders"], "{name}");
                assert_eq!(J::from(i.fallback), want["fallback"], "{name}");
                assert_eq!(pin(i.pinned), want["pinned"], "{name}");
            } else if step.get("tick").is_some() {
                let d = refresh.drifted(now, taker.attempted());
                assert_eq!(J::from(d), step["drifted"], "{name}: {step}");
            } else {
                panic!("{name}: unknown step {step}");
            }
            steps_run += 1;
        }
    }
    assert!(steps_run > 40, "{steps_run} steps");
}

/// One event the property tests throw at a holder.
#[derive(Debug, Clone)]
enum Ev {
    Send,
    Reply {
        rate: u32,
        burst: u16,
        lease_ms: u16,
        delay_ms: u16,
    },
    Garbage(Vec<Option<i64>>),
    Timeout,
    Refused,
    Error,
    Take(u8),
    Wait(u16),
    Tick,
}

fn ev() -> impl Strategy<Value = Ev> {
    prop_oneof![
        Just(Ev::Send),
        (0u32..2000, 0u16..60, 0u16..4000, 0u16..400).prop_map(
            |(rate, burst, lease_ms, delay_ms)| {
                Ev::Reply {
                    rate,
                    burst,
                    lease_ms,
                    delay_ms,
                }
            }
        ),
        prop::collection::vec(prop::option::of(any::<i64>()), 0..8).prop_map(Ev::Garbage),
        Just(Ev::Timeout),
        Just(Ev::Refused),
        Just(Ev::Error),
        (1u8..6).prop_map(Ev::Take),
        (0u16..600).prop_map(Ev::Wait),
        Just(Ev::Tick),
    ]
}

fn garbage(items: &[Option<i64>]) -> Reply {
    Reply::Array(
        items
            .iter()
            .map(|x| match x {
                None => Reply::Nil,
                Some(i) if i % 3 == 0 => Reply::Bulk(i.to_string().into_bytes()),
                Some(i) if i % 3 == 1 => Reply::Double(*i as f64 / 7.0),
                Some(i) => Reply::Int(*i),
            })
            .collect(),
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    /// Whatever the order of calls, answers, outages, error and malformed replies, what a
    /// holder lets out from its shares (Redis up, so the policy never decides) is at most
    /// what the shares granted earned while usable: `sum(rate * time in the window the
    /// server counts)`; and nothing panics.
    #[test]
    fn a_holder_never_lets_out_more_than_its_shares_earned(events in prop::collection::vec(ev(), 1..200)) {
        let policy = Policy {
            policy: FailurePolicy::Allow,
            allow_share: 1.0,
            rate: 1000.0,
            cap: 60.0,
            instances: 4,
            allow_for: 10_000 * MS,
        };
        let key = ShareKey { key: b"k".to_vec(), rate: 1000.0, cap: 60.0, period_ms: 1000, version: None };
        let mut now = 1_000_000 * MS;
        let mut taker = Holder::new(policy, 1000 * MS, 1000 * MS, now);
        let mut refresh = Refresh::new(key, 0.0, now);
        let (mut sent, mut let_out, mut earned) = (now, 0.0f64, 0.0f64);
        // The server's view: each grant counted from its call's arrival until the next
        // call's hold or its lease, whichever first (the client may use it no longer).
        let mut counted: Option<(f64, u64, u64)> = None; // (rate, from, until)
        let mut in_air = false;
        // `until` before the call in the air was sent: a refused call restores it.
        let mut until_before: Option<u64> = None;
        for e in events {
            match e {
                Ev::Send => {
                    let (_, event) = refresh.send(Backend::Module, b"h", taker.attempted(), now);
                    taker.apply(&event);
                    until_before = counted.map(|c| c.2);
                    if let Some((_, _, until)) = counted.as_mut() {
                        *until = (*until).min(now + HOLD);
                    }
                    sent = now;
                    in_air = true;
                }
                Ev::Reply { rate, burst, lease_ms, delay_ms } if in_air => {
                    now += u64::from(delay_ms) * MS;
                    let r = Reply::Array(vec![
                        Reply::Bulk(rate.to_string().into_bytes()),
                        Reply::Double(f64::from(burst)),
                        Reply::Int(i64::from(lease_ms)),
                        Reply::Int(300),
                        Reply::Int(2),
                    ]);
                    let (event, _) = refresh.answered(&r, sent, now, 0.5).unwrap();
                    taker.apply(&event);
                    if let Some((r0, from, until)) = counted.take() {
                        earned += r0 * (until.min(now).saturating_sub(from)) as f64 / 1e9;
                    }
                    counted = Some((f64::from(rate), now, sent + u64::from(lease_ms) * MS));
                    in_air = false;
                }
                Ev::Reply { .. } => {}
                Ev::Garbage(items) => {
                    let _ = refresh.answered(&garbage(&items), sent, now, 0.0);
                    let (event, _) = refresh.failed();
                    taker.apply(&event);
                }
                Ev::Timeout => {
                    let (event, _) = refresh.outage(false, now, 200 * MS);
                    taker.apply(&event);
                }
                // Only a call in the air can be refused (the server never saw it).
                Ev::Refused if in_air => {
                    let (event, _) = refresh.outage(true, now, 200 * MS);
                    taker.apply(&event);
                    if let (Some(c), Some(u)) = (counted.as_mut(), until_before) {
                        c.2 = u;
                    }
                    in_air = false;
                }
                Ev::Refused => {}
                Ev::Error => {
                    let (event, _) = refresh.failed();
                    taker.apply(&event);
                }
                Ev::Take(n) => {
                    if let Some(t) = taker.take(u64::from(n), now) {
                        if t.allowed && !t.fallback {
                            let_out += f64::from(n);
                        }
                    }
                }
                Ev::Wait(ms) => now += u64::from(ms) * MS,
                Ev::Tick => {
                    refresh.drifted(now, taker.attempted());
                }
            }
            let bound = earned
                + counted.map_or(0.0, |(r, from, until)| r * until.min(now).saturating_sub(from) as f64 / 1e9);
            prop_assert!(let_out <= bound + 1e-6, "let out {let_out} > earned {bound}");
        }
    }

    /// Any reply at all: a share or a `ProtocolError`, never a panic; a refused reply leaves
    /// the refresh side as it was.
    #[test]
    fn any_reply_is_a_share_or_a_protocol_error(items in prop::collection::vec(prop::option::of(any::<i64>()), 0..10)) {
        let key = ShareKey { key: b"k".to_vec(), rate: 10.0, cap: 10.0, period_ms: 1000, version: None };
        let mut refresh = Refresh::new(key, 0.0, 0);
        let before = refresh.clone();
        let jitter = [0.0, 0.999, f64::NAN, f64::INFINITY, -1.0][items.len() % 5];
        match refresh.answered(&garbage(&items), 0, MS, jitter) {
            Ok((Event::Answered { grant, .. }, next)) => {
                prop_assert!(grant.rate >= 0.0 && grant.rate.is_finite());
                prop_assert!(next >= 9 * MS);
            }
            Ok(other) => prop_assert!(false, "{other:?}"),
            Err(_) => prop_assert_eq!(refresh, before),
        }
    }
}

/// A share as the server counts it: from its instant `T` until `T + lease`, or until the
/// hold of the holder's next call.
#[derive(Debug, Clone, Copy)]
struct Span {
    from: u64,
    until: u64,
    rate: f64,
    burst: f64,
}

fn counted_earned(spans: &[Span], a: u64, b: u64) -> f64 {
    spans
        .iter()
        .map(|s| s.rate * b.min(s.until).saturating_sub(a.max(s.from)) as f64 / 1e9)
        .sum()
}

fn counted_bursts(spans: &[Span], x: u64) -> f64 {
    spans
        .iter()
        .filter(|s| s.from <= x && x < s.until)
        .map(|s| s.burst)
        .sum()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(150))]

    /// The refresh side may lose the CPU between reading the clock and posting, and the
    /// takers apply what was posted at their next take, however late. Against the server's
    /// count (share k from its instant `T_k`, `sent <= T_k <= answer`, until `T_k + lease`
    /// or the next call's `T_k+1 + HOLD`), at every take: the local bucket holds at most the
    /// counted bursts, and took in since the last take at most what the counted rates
    /// earned.
    #[test]
    fn late_posts_and_answers_never_let_out_more_than_the_server_counts(seed in any::<u64>()) {
        let mut rng = seed | 1;
        let mut next = move |m: u64| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng % m.max(1)
        };
        let t0 = 1_000_000 * MS;
        let policy = Policy {
            policy: FailurePolicy::Deny,
            allow_share: 1.0,
            rate: 1000.0,
            cap: 100.0,
            instances: 4,
            allow_for: 0,
        };
        // (time posted, order, event) of every call.
        let mut posts: Vec<(u64, u8, Event)> = Vec::new();
        let mut spans: Vec<Span> = Vec::new();
        let late = |most: u64, next: &mut dyn FnMut(u64) -> u64| {
            if next(10) < 3 { next(most) } else { 0 }
        };
        let mut t = t0;
        while t < t0 + 15_000 * MS {
            let sent = t;
            let posted = sent + late(400 * MS, &mut next);
            let at_server = posted + late(500 * MS, &mut next) + next(10 * MS);
            let at = at_server + late(500 * MS, &mut next) + next(10 * MS);
            let applied = at + late(500 * MS, &mut next);
            let lease = if next(2) == 0 { 900 * MS } else { 3000 * MS };
            let (rate, burst) = (next(500) as f64, next(50) as f64);
            if let Some(last) = spans.last_mut() {
                last.until = last.until.min(at_server + HOLD);
            }
            spans.push(Span { from: at_server, until: at_server + lease, rate, burst });
            let grant = rl_client_core::share::Grant {
                rate,
                burst,
                lease,
                refresh: lease / 3,
                holders: 2,
                pinned: None,
            };
            posts.push((posted, 0, Event::Sending { sent }));
            posts.push((applied, 1, Event::Answered { sent, grant, at }));
            t = applied + 270 * MS + next(1000 * MS);
        }
        posts.sort_by_key(|p| (p.0, p.1));
        let mut holder = Holder::new(policy, 1000 * MS, 1000 * MS, t0);
        let (mut now, mut last, mut kept, mut i) = (t0, t0, 0.0f64, 0);
        while now < t0 + 17_000 * MS {
            let scale = [MS / 2, 10 * MS, 100 * MS, 600 * MS][next(4) as usize];
            now += 1 + next(scale);
            while i < posts.len() && posts[i].0 <= now {
                holder.apply(&posts[i].2);
                i += 1;
            }
            let tokens = holder.info(now).tokens;
            prop_assert!(tokens <= counted_bursts(&spans, now) + 1e-6, "{now}: {tokens}");
            let mut out = 0.0;
            while out < 10_000.0 && holder.take(1, now).is_some_and(|t| t.allowed) {
                out += 1.0;
            }
            let left = holder.info(now).tokens;
            let took_in = left + out - kept;
            prop_assert!(
                took_in <= counted_earned(&spans, last, now) + 1e-6,
                "{last}..{now}: took in {took_in}"
            );
            last = now;
            kept = left;
        }
    }
}
