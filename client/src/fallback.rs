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
