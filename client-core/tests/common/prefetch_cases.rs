//! The prefetch ledger's golden cases (`protocol/client-cases/prefetch.json`), run by the
//! core's tests and by the Rust client's (each hands its own reading of a case's reply: the
//! core's from the JSON, the client's through redis-rs's values and its own conversion).

use rl_client_core::budget::Backend;
use rl_client_core::lease::LeaseTarget;
use rl_client_core::prefetch::{
    Begin, Failure, Judged, Landed, Lease, Ledger, LedgerConfig, Local,
};
use rl_client_core::Reply;
use serde_json::{json, Value as J};

const MS: u64 = 1_000_000;

fn text(args: &[Vec<u8>]) -> Vec<String> {
    args.iter()
        .map(|a| String::from_utf8(a.clone()).unwrap())
        .collect()
}

fn pairs(leases: &[Lease]) -> J {
    J::Array(leases.iter().map(|l| json!([l.id, l.left])).collect())
}

/// The case's ledger.
pub fn ledger(spec: &J) -> Ledger {
    Ledger::new(
        LeaseTarget {
            key: spec["key"].as_str().unwrap().as_bytes().to_vec(),
            rate: spec["rate"].as_f64().unwrap(),
            cap: spec["cap"].as_f64().unwrap(),
            init: spec["init"].as_f64(),
            version: spec["version"].as_u64(),
        },
        LedgerConfig {
            batch: spec["batch"].as_u64().unwrap(),
            ttl_ms: spec["ttl_ms"].as_u64().unwrap(),
            renew_at: spec["renew_at"].as_f64().unwrap(),
            jitter: spec["jitter"].as_f64().unwrap(),
            timeout: spec["timeout_ms"].as_u64().unwrap() * MS,
        },
    )
    .unwrap()
}

/// A take's decision as the cases write it.
pub fn local(l: Local) -> J {
    match l {
        Local::Granted { left, renew } => json!({"granted": left, "renew": renew}),
        Local::Denied { retry_after_ms } => json!({"denied": retry_after_ms}),
        Local::Ask => json!("ask"),
    }
}

/// A landing as the cases write it.
pub fn landed(l: Landed) -> J {
    match l {
        Landed::Granted { served, left } => {
            json!({"granted": true, "served": served, "left": left})
        }
        Landed::Denied { retry_after_ms } => json!({"denied": retry_after_ms}),
        Landed::Stale => json!("stale"),
        Landed::Closed => json!("closed"),
    }
}

/// Runs every case, each reply read by `reply`; answers the steps run.
pub fn run(reply: &dyn Fn(&J) -> Reply) -> usize {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../protocol/client-cases/prefetch.json"
    );
    let doc: J = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut steps_run = 0;
    for case in doc["cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let mut l = ledger(&case["ledger"]);
        for (i, step) in case["steps"].as_array().unwrap().iter().enumerate() {
            steps_run += 1;
            let at = format!("{name}, step {i}");
            let now = step["at_ms"].as_u64().unwrap_or(0) * MS;
            let backend = match step["backend"].as_str() {
                Some("functions") => Backend::Functions,
                _ => Backend::Module,
            };
            if let Some(n) = step.get("take") {
                let down = step["down"].as_bool().unwrap_or(false);
                let got = local(l.take(n.as_u64().unwrap(), now, down));
                assert_eq!(got, step["local"], "{at}");
            } else if let Some(need) = step.get("begin") {
                let got = match l.begin(backend, need.as_u64().unwrap(), now) {
                    Begin::Send { flight, command } => {
                        json!({"send": {"flight": flight, "command": text(&command)}})
                    }
                    Begin::Busy { flight } => json!({"busy": flight}),
                    Begin::Closed => json!({"closed": true}),
                };
                let key = got.as_object().unwrap().keys().next().unwrap().clone();
                assert_eq!(got[&key], step[&key], "{at}");
            } else if let Some(r) = step.get("reply") {
                let flight = step["flight"].as_u64().unwrap();
                let draw = step["draw"].as_f64().unwrap_or(0.5);
                let got = l.landed(flight, &reply(r), now, draw);
                if step["protocol_error"].as_bool() == Some(true) {
                    assert!(got.is_err(), "{at}: {got:?}");
                    continue;
                }
                let landing = got.unwrap_or_else(|e| panic!("{at}: {e}"));
                assert_eq!(landed(landing.landed), step["landed"], "{at}");
                assert_eq!(pairs(&landing.give_back), step["give_back"], "{at}");
            } else if let Some(kind) = step.get("error") {
                let failure = match kind.as_str().unwrap() {
                    "refused" => Failure::Refused,
                    "not_sent" => Failure::NotSent,
                    _ => Failure::Unknown,
                };
                let back = l.failed(step["flight"].as_u64().unwrap(), failure, now);
                assert_eq!(pairs(&back), step["give_back"], "{at}");
            } else if let Some(f) = step.get("timeout") {
                let got = l.give_up(f.as_u64().unwrap());
                assert_eq!(json!(got), step["claimed"], "{at}");
            } else if let Some(f) = step.get("cancel") {
                l.release(f.as_u64().unwrap(), false, now);
            } else if let Some(f) = step.get("judge") {
                let limit = step["limit_ms"].as_u64().unwrap() * MS;
                let got = match l.judge(f.as_u64().unwrap(), now, limit) {
                    Judged::Wait => "wait",
                    Judged::Ended => "ended",
                    Judged::Outage { first: true } => "outage_first",
                    Judged::Outage { first: false } => "outage",
                };
                assert_eq!(json!(got), step["judged"], "{at}");
            } else if step.get("close").is_some() {
                assert_eq!(pairs(&l.close(now)), step["give_back"], "{at}");
            } else if let Some(n) = step.get("grant") {
                let got = l.grant(n.as_u64().unwrap(), now);
                assert_eq!(json!(got), step["left"], "{at}");
            } else if step.get("forget").is_some() {
                l.forget();
            } else if let Some(h) = step.get("held") {
                assert_eq!(json!(l.held(now)), *h, "{at}");
            } else if let Some(b) = step.get("late_bound_ms") {
                assert_eq!(json!(l.late_bound() / MS), *b, "{at}");
            } else if let Some(n) = step.get("enter") {
                let again = step["again"].as_u64();
                let got =
                    l.enter_line(n.as_u64().unwrap(), step["front"].as_bool().unwrap(), again);
                assert_eq!(json!(got), step["waiter"], "{at}");
            } else if let Some(w) = step.get("leave") {
                assert_eq!(
                    json!(l.leave_line(w.as_u64().unwrap())),
                    step["next"],
                    "{at}"
                );
            } else if let Some(g) = step.get("wake") {
                assert_eq!(json!(l.wake(g.as_bool().unwrap())), step["woken"], "{at}");
            } else if let Some(want) = step.get("counters") {
                let c = l.counters();
                let got = json!({
                    "leases": c.leases, "lease_tokens": c.lease_tokens,
                    "leases_denied": c.leases_denied, "leases_expired": c.leases_expired,
                    "leases_lost": c.leases_lost, "returns": c.returns,
                    "tokens_returned": c.tokens_returned, "slow_calls": c.slow_calls,
                });
                for (k, v) in want.as_object().unwrap() {
                    assert_eq!(got[k], *v, "{at}: counter {k}");
                }
            } else {
                panic!("{at}: no event in {step}");
            }
        }
    }
    steps_run
}
