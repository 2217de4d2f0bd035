//! Local decisions while Redis is unavailable, by the limiter's [`FailurePolicy`]: the
//! client core's [`Fallback`](rl_client_core::fallback::Fallback) under this crate's lock,
//! its answers as this crate's [`Decision`].

use std::sync::Mutex;
use std::time::Duration;

use rl_client_core::fallback::{Fallback as Core, LocalDecision};
use rl_client_core::token_budget::FailurePolicy as CorePolicy;
use rl_core::{Limit, Nanos};

use crate::{Decision, FailurePolicy, LimiterConfig, Source};

/// Per-key local state of one limiter's failure policy.
#[derive(Debug)]
pub(crate) struct Fallback {
    cap: f64,
    core: Mutex<Core>,
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic elsewhere while holding the lock leaves plain data behind; keep serving.
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn nanos(d: Duration) -> Nanos {
    d.as_nanos().min(u64::MAX as u128) as Nanos
}

impl Fallback {
    pub(crate) fn new(limit: Limit, config: &LimiterConfig) -> Fallback {
        let policy = match config.policy {
            FailurePolicy::Allow => CorePolicy::Allow,
            FailurePolicy::LastKnown => CorePolicy::LastKnown,
            FailurePolicy::Deny => CorePolicy::Deny,
        };
        // In range whatever the config: a share in (0, 1], at least one key.
        let share = 1.0 / f64::from(config.instances.max(1));
        let core = Core::new(
            policy,
            limit,
            share,
            nanos(config.deny_retry_after),
            config.max_keys.max(1),
        )
        .expect("a share in (0, 1] and a positive max_keys are valid");
        Fallback {
            cap: limit.cap(),
            core: Mutex::new(core),
        }
    }

    /// Records what Redis granted for `key` (and the level it reported, if any).
    pub(crate) fn observe(&self, key: &str, granted: u64, level: Option<f64>, now: Nanos) {
        lock(&self.core).observe(key.as_bytes(), granted, level, now);
    }

    /// The policy's decision for `n` tokens of `key` at `now`.
    pub(crate) fn decide(&self, key: &str, n: u64, now: Nanos) -> Decision {
        let d = lock(&self.core).decide(key.as_bytes(), n, now);
        self.decision(&d)
    }

    /// The policy's decision for `n` tokens of `key` under `limit` (a per-call limit).
    pub(crate) fn decide_with(&self, key: &str, n: u64, limit: Limit, now: Nanos) -> Decision {
        let d = lock(&self.core).decide_with(key.as_bytes(), n, limit, now);
        self.decision(&d)
    }

    /// The policy's answer to a reservation of `n` tokens of `key` waiting at most
    /// `max_wait`: the decision and the wait before use (granted), or the wait that would
    /// have been needed (denied).
    pub(crate) fn reserve(
        &self,
        key: &str,
        n: u64,
        max_wait: Duration,
        now: Nanos,
    ) -> (Decision, Duration) {
        let d = lock(&self.core).reserve(key.as_bytes(), n, nanos(max_wait), now);
        let wait = Duration::from_nanos(d.retry_after);
        if d.granted {
            let reset = Duration::from_nanos(d.reset_after);
            let decision = Decision::granted(n, d.remaining, reset, self.cap, Source::Fallback);
            return (decision, wait);
        }
        (self.decision(&d), wait)
    }

    fn decision(&self, d: &LocalDecision) -> Decision {
        let reset = Duration::from_nanos(d.reset_after);
        if d.granted {
            Decision::granted(d.tokens, d.remaining, reset, self.cap, Source::Fallback)
        } else {
            let retry = Duration::from_nanos(d.retry_after);
            Decision::denied(d.remaining, retry, reset, self.cap, Source::Fallback)
        }
    }
}

/// The failure policy's golden cases (`protocol/client-cases/failure_policy.json`) through
/// this crate's wrappers: its config, its clock-free entry points, its `Decision`s.
#[cfg(test)]
mod golden {
    use super::*;
    use crate::health::Health;
    use serde_json::Value as J;

    const MS: u64 = 1_000_000;

    fn ms(d: Duration) -> u64 {
        d.as_nanos().div_ceil(1_000_000) as u64
    }

    fn check(name: &str, d: &Decision, retry: Duration, want: &J) {
        assert_eq!(
            d.allowed,
            want["granted"].as_bool().unwrap(),
            "{name}: {d:?}"
        );
        assert!(
            (d.remaining - want["remaining"].as_f64().unwrap()).abs() < 1e-6,
            "{name}: {d:?}"
        );
        assert_eq!(
            ms(retry),
            want["retry_after_ms"].as_u64().unwrap(),
            "{name}: {d:?}"
        );
        assert_eq!(
            ms(d.reset_after),
            want["reset_after_ms"].as_u64().unwrap(),
            "{name}: {d:?}"
        );
        assert_eq!(d.source, Source::Fallback);
    }

    /// A reply's level: a number, `null`, or `"NaN"` / `"inf"` / `"-inf"` (no JSON number).
    fn level(r: &J) -> Option<f64> {
        r["level"]
            .as_f64()
            .or_else(|| r["level"].as_str().map(|s| s.parse().unwrap()))
    }

    fn keys(e: &J) -> Vec<String> {
        match e["keys"].as_u64() {
            Some(n) => (0..n)
                .map(|i| format!("{}{i}", e["prefix"].as_str().unwrap()))
                .collect(),
            None => vec![e["key"].as_str().unwrap().to_owned()],
        }
    }

    #[test]
    fn the_wrappers_follow_the_failure_policy_cases() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../protocol/client-cases/failure_policy.json"
        );
        let doc: J = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let mut steps_run = 0;
        for case in doc["cases"].as_array().unwrap() {
            let name = case["name"].as_str().unwrap();
            let l = &case["limiter"];
            let mut config = LimiterConfig {
                policy: match l["policy"].as_str().unwrap() {
                    "allow" => FailurePolicy::Allow,
                    "last_known" => FailurePolicy::LastKnown,
                    _ => FailurePolicy::Deny,
                },
                deny_retry_after: Duration::from_millis(l["deny_retry_after_ms"].as_u64().unwrap()),
                probe_interval: Duration::from_millis(l["probe_interval_ms"].as_u64().unwrap()),
                max_keys: l["max_keys"].as_u64().unwrap() as usize,
                ..LimiterConfig::default()
            };
            // `instances` null: the config's default, as a user who does not set it gets.
            if let Some(i) = l["instances"].as_u64() {
                config.instances = i as u32;
            }
            let limit =
                Limit::new(l["rate"].as_f64().unwrap(), l["cap"].as_f64().unwrap()).unwrap();
            let fallback = Fallback::new(limit, &config);
            let health = Health::new(config.probe_interval);
            for step in case["steps"].as_array().unwrap() {
                steps_run += 1;
                let at = step["at_ms"].as_u64().unwrap_or(0) * MS;
                if step.get("call").is_some() {
                    assert_eq!(
                        health.may_call_at(at),
                        step["sends"].as_bool().unwrap(),
                        "{name}"
                    );
                } else if let Some(r) = step.get("reply") {
                    let every = step["every_ms"].as_u64().unwrap_or(0) * MS;
                    for i in 0..step["times"].as_u64().unwrap_or(1) {
                        let ended = health.succeeded();
                        assert_eq!(
                            ended,
                            step["outage_ended"].as_bool().unwrap() && i == 0,
                            "{name}"
                        );
                        for key in keys(r) {
                            let g = r["granted"].as_u64().unwrap();
                            fallback.observe(&key, g, level(r), at + i * every);
                        }
                    }
                } else if step.get("timeout").is_some() || step.get("error").is_some() {
                    health.failed_at(at);
                    assert!(health.is_down());
                } else if let Some(t) = step.get("take") {
                    let n = t["n"].as_u64().unwrap();
                    let per_call = t["limit"].as_array().map(|rc| {
                        Limit::new(rc[0].as_f64().unwrap(), rc[1].as_f64().unwrap()).unwrap()
                    });
                    let (mut granted, mut last) = (0, None);
                    for key in keys(t) {
                        for _ in 0..t["times"].as_u64().unwrap_or(1) {
                            let d = match per_call {
                                Some(limit) => fallback.decide_with(&key, n, limit, at),
                                None => fallback.decide(&key, n, at),
                            };
                            granted += u64::from(d.allowed);
                            last = Some(d);
                        }
                    }
                    if let Some(want) = step.get("decision") {
                        let d = last.unwrap();
                        check(name, &d, d.retry_after, want);
                    }
                    if let Some(want) = step.get("granted_times") {
                        assert_eq!(granted, want.as_u64().unwrap(), "{name}: at {at}");
                    }
                } else if let Some(r) = step.get("reserve") {
                    let max_wait = Duration::from_millis(r["max_wait_ms"].as_u64().unwrap());
                    let key = r["key"].as_str().unwrap();
                    let (d, wait) = fallback.reserve(key, r["n"].as_u64().unwrap(), max_wait, at);
                    check(name, &d, wait, &step["decision"]);
                } else if let Some(m) = step.get("meter") {
                    let key = m["key"].as_str().unwrap();
                    let rate = lock(&fallback.core).observed_rate(key.as_bytes()).unwrap();
                    assert!((rate - m["rate"].as_f64().unwrap()).abs() < 1e-9, "{name}");
                } else if let Some(down) = step.get("down") {
                    assert_eq!(health.is_down(), down.as_bool().unwrap(), "{name}");
                } else if let Some(most) = step.get("keys_at_most") {
                    assert!(lock(&fallback.core).keys() as u64 <= most.as_u64().unwrap());
                } else {
                    panic!("{name}: unknown step {step}");
                }
            }
        }
        assert!(steps_run >= 80, "only {steps_run} steps");
    }
}
