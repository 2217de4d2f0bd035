//! protocol/client-cases/permit.json on the core: the semaphore's local permits while
//! Redis is unavailable.

use rl_client_core::permit::{Local, LocalPermits, Policy};
use serde_json::Value as J;

pub fn policy(name: &str) -> Policy {
    match name {
        "allow" => Policy::Allow,
        "last_known" => Policy::LastKnown,
        "deny" => Policy::Deny,
        other => panic!("unknown policy {other}"),
    }
}

#[test]
fn golden_permit_cases() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../protocol/client-cases/permit.json"
    );
    let cases: J = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    for case in cases["cases"].as_array().unwrap() {
        let about = case["about"].as_str().unwrap();
        let instances = case["instances"].as_u64().unwrap() as u32;
        let mut permits =
            LocalPermits::new(policy(case["policy"].as_str().unwrap()), instances, 1000);
        for step in case["steps"].as_array().unwrap() {
            if let Some(key) = step["release"].as_str() {
                permits.release(key);
                continue;
            }
            let key = step["acquire"].as_str().unwrap();
            let got = permits.acquire(key, step["limit"].as_u64().unwrap());
            let want = &step["want"];
            let in_use = want["in_use"].as_u64().unwrap();
            let expected = if want["granted"].as_bool().unwrap() {
                Local::Granted { in_use }
            } else {
                Local::Busy {
                    in_use,
                    retry_after_ms: want["retry_after_ms"].as_u64().unwrap(),
                }
            };
            assert_eq!(got, expected, "{about}: {step}");
        }
    }
}
