//! The token budget's state machine against its golden cases
//! (`protocol/client-cases/token_budget.json`): each step's command, decision, settle and
//! counters, as every shell must see them (the Python extension runs the same file).

use rl_client_core::budget::Backend;
use rl_client_core::token_budget::{FailurePolicy, Grant, SettleStep, Source, Ticket, TokenBudget};
mod common;

use common::reply;
use serde_json::Value as J;

const MS: u64 = 1_000_000;

fn backend(step: &J) -> Backend {
    match step["backend"].as_str() {
        Some("functions") => Backend::Functions,
        _ => Backend::Module,
    }
}

fn text(args: &[Vec<u8>]) -> Vec<String> {
    args.iter()
        .map(|a| String::from_utf8(a.clone()).unwrap())
        .collect()
}

fn check_decision(name: &str, g: &Grant, want: &J) {
    assert_eq!(g.granted, want["granted"].as_bool().unwrap(), "{name}");
    assert_eq!(
        g.retry_after_ms,
        want["retry_after_ms"].as_u64().unwrap(),
        "{name}"
    );
    assert_eq!(
        g.denied_by,
        want["denied_by"].as_u64().map(|i| i as usize),
        "{name}"
    );
    let source = match g.source {
        Source::Server => "server",
        Source::Fallback => "fallback",
    };
    assert_eq!(source, want["source"].as_str().unwrap(), "{name}");
    let open = match &g.ticket {
        Ticket::Nothing => false,
        Ticket::Server(r) => r.open(),
        Ticket::Local { settled, .. } => !settled,
    };
    assert_eq!(open, want["open"].as_bool().unwrap(), "{name}");
    match (&g.remaining, want["remaining"].as_array()) {
        (None, None) => {}
        (Some(got), Some(w)) => {
            assert_eq!(got.len(), w.len(), "{name}");
            for (a, b) in got.iter().zip(w) {
                assert!(
                    (a - b.as_f64().unwrap()).abs() < 1e-6,
                    "{name}: {got:?} vs {w:?}"
                );
            }
        }
        (got, w) => panic!("{name}: remaining {got:?}, wanted {w:?}"),
    }
}

#[test]
fn the_budget_state_machine_follows_its_golden_cases() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../protocol/client-cases/token_budget.json"
    );
    let doc: J = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut steps_run = 0;
    for case in doc["cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let b = &case["budget"];
        let limits: Vec<(String, f64, f64)> = b["limits"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| {
                (
                    l[0].as_str().unwrap().to_owned(),
                    l[1].as_f64().unwrap(),
                    l[2].as_f64().unwrap(),
                )
            })
            .collect();
        let specs: Vec<(&str, f64, f64)> = limits
            .iter()
            .map(|(n, r, c)| (n.as_str(), *r, *c))
            .collect();
        let policy = match b["policy"].as_str().unwrap() {
            "allow" => FailurePolicy::Allow,
            "last_known" => FailurePolicy::LastKnown,
            _ => FailurePolicy::Deny,
        };
        let mut budget = TokenBudget::new(
            b["key"].as_str().unwrap(),
            &specs,
            b["ttl_ms"].as_u64().unwrap(),
            policy,
            b["share"].as_f64(),
        )
        .unwrap();
        // The costs of the last reservation, and the ticket of the last grant.
        let mut costs: Vec<u64> = Vec::new();
        let mut ticket = Ticket::Nothing;
        for step in case["steps"].as_array().unwrap() {
            steps_run += 1;
            let now = step["at_ms"].as_u64().unwrap_or(0) * MS;
            if let Some(r) = step.get("reserve") {
                let named: Vec<(String, u64)> = r
                    .get("named")
                    .and_then(J::as_object)
                    .map(|o| {
                        o.iter()
                            .map(|(k, v)| (k.clone(), v.as_u64().unwrap()))
                            .collect()
                    })
                    .unwrap_or_default();
                let named: Vec<(&str, u64)> = named.iter().map(|(k, v)| (k.as_str(), *v)).collect();
                let made = budget.costs(r["tokens"].as_u64(), &named);
                if let Some(e) = step["error"].as_str() {
                    let err = made.unwrap_err();
                    assert!(err.contains(e), "{name}: {err:?} lacks {e:?}");
                    continue;
                }
                costs = made.unwrap();
                if let Some(cmd) = step.get("command") {
                    let got = text(&budget.reserve_command(backend(step), &costs));
                    let want: Vec<String> = serde_json::from_value(cmd.clone()).unwrap();
                    assert_eq!(got, want, "{name}");
                }
                if step["outage"].as_bool() == Some(true) {
                    let g = budget.outage(&costs, now);
                    check_decision(name, &g, &step["decision"]);
                    if g.granted {
                        ticket = g.ticket;
                    }
                }
            }
            if let Some(r) = step.get("reply") {
                let got = budget.reserved(&costs, &reply(r));
                if step["protocol_error"].as_bool() == Some(true) {
                    assert!(got.is_err(), "{name}: {got:?}");
                    continue;
                }
                let g = got.unwrap();
                check_decision(name, &g, &step["decision"]);
                if g.granted {
                    ticket = g.ticket;
                }
            }
            if let Some(s) = step.get("settle") {
                let actual: Vec<Option<u64>> =
                    s.as_array().unwrap().iter().map(J::as_u64).collect();
                let got = budget.settle(backend(step), &mut ticket, &actual, now);
                match got {
                    SettleStep::Send(args) => {
                        let want: Vec<String> =
                            serde_json::from_value(step["command"].clone()).unwrap();
                        assert_eq!(text(&args), want, "{name}");
                    }
                    SettleStep::Done(r) => {
                        let got: Vec<Option<i64>> = r.iter().map(|x| x.signed()).collect();
                        let want: Vec<Option<i64>> =
                            serde_json::from_value(step["done"].clone()).unwrap();
                        assert_eq!(got, want, "{name}");
                    }
                    SettleStep::Nothing => {
                        assert_eq!(step["nothing"].as_bool(), Some(true), "{name}")
                    }
                }
            }
            if let Some(r) = step.get("settle_reply") {
                let got: Vec<Option<i64>> = budget
                    .settled(&reply(r))
                    .unwrap()
                    .iter()
                    .map(|x| x.signed())
                    .collect();
                let want: Vec<Option<i64>> =
                    serde_json::from_value(step["settled"].clone()).unwrap();
                assert_eq!(got, want, "{name}");
            }
            if let Some(c) = step.get("counters") {
                let k = budget.counters();
                let got = serde_json::json!({
                    "granted": k.budget.granted, "denied": k.budget.denied,
                    "reserved_tokens": k.budget.reserved_tokens, "settled": k.budget.settled,
                    "refunded_tokens": k.budget.tokens_back, "overage_tokens": k.budget.tokens_overage,
                    "unmatched": k.budget.unmatched, "fallback_granted": k.fallback_granted,
                    "fallback_denied": k.fallback_denied, "outages": k.outages,
                    "settles_lost": k.settles_lost,
                });
                assert_eq!(&got, c, "{name}");
            }
        }
    }
    assert!(steps_run > 30, "{steps_run} steps");
}
