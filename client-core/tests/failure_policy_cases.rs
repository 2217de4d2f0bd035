//! The failure policy's state machines against their golden cases
//! (`protocol/client-cases/failure_policy.json`): the health's probes, what Redis's answers
//! leave in the local buckets, the local decisions, as every shell must see them (the Rust
//! client's wrappers and the Python extension run the same file).

use rl_client_core::fallback::{Fallback, LocalDecision};
use rl_client_core::health::Health;
use rl_client_core::token_budget::{FailurePolicy, DEFAULT_INSTANCES};
use rl_core::Limit;
use serde_json::Value as J;

const MS: u64 = 1_000_000;

/// A reply's level: a number, `null` (a lease), or a string naming a float JSON has no
/// number for (`"NaN"`, `"inf"`, `"-inf"`: a malformed reply's).
fn level(r: &J) -> Option<f64> {
    r["level"]
        .as_f64()
        .or_else(|| r["level"].as_str().map(|s| s.parse().unwrap()))
}

fn ceil_ms(ns: u64) -> u64 {
    ns.div_ceil(MS)
}

fn check(name: &str, d: &LocalDecision, want: &J) {
    assert_eq!(
        d.granted,
        want["granted"].as_bool().unwrap(),
        "{name}: {d:?}"
    );
    let remaining = want["remaining"].as_f64().unwrap();
    assert!((d.remaining - remaining).abs() < 1e-6, "{name}: {d:?}");
    assert_eq!(
        ceil_ms(d.retry_after),
        want["retry_after_ms"].as_u64().unwrap(),
        "{name}: {d:?}"
    );
    assert_eq!(
        ceil_ms(d.reset_after),
        want["reset_after_ms"].as_u64().unwrap(),
        "{name}: {d:?}"
    );
}

/// The keys a step names: `key`, or `keys` keys after `prefix`.
fn keys(e: &J) -> Vec<String> {
    match e["keys"].as_u64() {
        Some(n) => (0..n)
            .map(|i| format!("{}{i}", e["prefix"].as_str().unwrap()))
            .collect(),
        None => vec![e["key"].as_str().unwrap().to_owned()],
    }
}

#[test]
fn the_failure_policy_follows_its_golden_cases() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../protocol/client-cases/failure_policy.json"
    );
    let doc: J = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut steps_run = 0;
    for case in doc["cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let l = &case["limiter"];
        let policy = match l["policy"].as_str().unwrap() {
            "allow" => FailurePolicy::Allow,
            "last_known" => FailurePolicy::LastKnown,
            _ => FailurePolicy::Deny,
        };
        let instances = l["instances"]
            .as_u64()
            .unwrap_or(u64::from(DEFAULT_INSTANCES));
        let limit = Limit::new(l["rate"].as_f64().unwrap(), l["cap"].as_f64().unwrap()).unwrap();
        let mut fallback = Fallback::new(
            policy,
            limit,
            1.0 / instances as f64,
            l["deny_retry_after_ms"].as_u64().unwrap() * MS,
            l["max_keys"].as_u64().unwrap() as usize,
        )
        .unwrap();
        let health = Health::new(l["probe_interval_ms"].as_u64().unwrap() * MS);
        for step in case["steps"].as_array().unwrap() {
            steps_run += 1;
            let at = step["at_ms"].as_u64().unwrap_or(0) * MS;
            if let Some(key) = step.get("call") {
                let sends = health.may_call(at);
                assert_eq!(
                    sends,
                    step["sends"].as_bool().unwrap(),
                    "{name}: call {key} at {at}"
                );
            } else if let Some(r) = step.get("reply") {
                let every = step["every_ms"].as_u64().unwrap_or(0) * MS;
                for i in 0..step["times"].as_u64().unwrap_or(1) {
                    let now = at + i * every;
                    let ended = health.succeeded();
                    assert_eq!(
                        ended,
                        step["outage_ended"].as_bool().unwrap() && i == 0,
                        "{name}"
                    );
                    for key in keys(r) {
                        let granted = r["granted"].as_u64().unwrap();
                        fallback.observe(key.as_bytes(), granted, level(r), now);
                    }
                }
            } else if step.get("timeout").is_some() || step.get("error").is_some() {
                health.failed(at);
            } else if let Some(t) = step.get("take") {
                let n = t["n"].as_u64().unwrap();
                let per_call = t["limit"].as_array().map(|rc| {
                    Limit::new(rc[0].as_f64().unwrap(), rc[1].as_f64().unwrap()).unwrap()
                });
                let mut granted = 0;
                let mut last = None;
                for key in keys(t) {
                    for _ in 0..t["times"].as_u64().unwrap_or(1) {
                        let d = match per_call {
                            Some(limit) => fallback.decide_with(key.as_bytes(), n, limit, at),
                            None => fallback.decide(key.as_bytes(), n, at),
                        };
                        granted += u64::from(d.granted);
                        last = Some(d);
                    }
                }
                if let Some(want) = step.get("decision") {
                    check(name, &last.unwrap(), want);
                }
                if let Some(want) = step.get("granted_times") {
                    assert_eq!(granted, want.as_u64().unwrap(), "{name}: at {at}");
                }
            } else if let Some(r) = step.get("reserve") {
                let key = r["key"].as_str().unwrap();
                let wait = r["max_wait_ms"].as_u64().unwrap().saturating_mul(MS);
                let d = fallback.reserve(key.as_bytes(), r["n"].as_u64().unwrap(), wait, at);
                check(name, &d, &step["decision"]);
            } else if let Some(m) = step.get("meter") {
                let key = m["key"].as_str().unwrap();
                let rate = fallback.observed_rate(key.as_bytes()).unwrap();
                assert!(
                    (rate - m["rate"].as_f64().unwrap()).abs() < 1e-9,
                    "{name}: {rate}"
                );
            } else if let Some(down) = step.get("down") {
                assert_eq!(health.is_down(), down.as_bool().unwrap(), "{name}");
            } else if let Some(most) = step.get("keys_at_most") {
                assert!(fallback.keys() as u64 <= most.as_u64().unwrap(), "{name}");
            } else {
                panic!("{name}: unknown step {step}");
            }
        }
    }
    assert!(steps_run >= 80, "only {steps_run} steps");
}
