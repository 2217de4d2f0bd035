//! Counters a service can export: plain atomics, read with [`Metrics::snapshot`].

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// Upper bounds (µs) of the Redis latency histogram buckets; a last bucket takes the rest.
pub const LATENCY_BUCKETS_US: [u64; 10] = [
    250, 500, 1_000, 2_000, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000,
];

/// Counters of one or more limiters (share one `Arc<Metrics>` to aggregate).
#[derive(Debug, Default)]
pub struct Metrics {
    calls: AtomicU64,
    granted: AtomicU64,
    denied: AtomicU64,
    tokens_granted: AtomicU64,
    leases: AtomicU64,
    lease_tokens: AtomicU64,
    leases_denied: AtomicU64,
    leases_expired: AtomicU64,
    returns: AtomicU64,
    tokens_returned: AtomicU64,
    fallback_decisions: AtomicU64,
    fallback_granted: AtomicU64,
    redis_errors: AtomicU64,
    redis_timeouts: AtomicU64,
    server_errors: AtomicU64,
    errors: AtomicU64,
    cancelled: AtomicU64,
    leases_lost: AtomicU64,
    reserve_wait_us: AtomicU64,
    refunds: AtomicU64,
    tokens_refunded: AtomicU64,
    permits_acquired: AtomicU64,
    permits_denied: AtomicU64,
    permits_released: AtomicU64,
    permits_renewed: AtomicU64,
    permits_lost: AtomicU64,
    redis_calls: AtomicU64,
    latency_sum_us: AtomicU64,
    latency_max_us: AtomicU64,
    latency_buckets: [AtomicU64; LATENCY_BUCKETS_US.len() + 1],
}

/// A copy of the counters at one instant. All counts are totals since the start.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MetricsSnapshot {
    /// Calls answered (`take`, `reserve`...): always `granted + denied + errors`. A call
    /// dropped before its answer (cancelled, timed out by its caller) is counted in
    /// `cancelled` instead.
    pub calls: u64,
    /// Decisions that allowed the request (from any source).
    pub granted: u64,
    /// Decisions that denied it (from any source).
    pub denied: u64,
    /// Tokens granted by allowed decisions.
    pub tokens_granted: u64,
    /// Leases Redis granted (`RL.LEASE` with tokens).
    pub leases: u64,
    /// Tokens received in leases.
    pub lease_tokens: u64,
    /// `RL.LEASE` calls that got no tokens (bucket empty).
    pub leases_denied: u64,
    /// Leases that reached their TTL locally with tokens unspent (those tokens are lost).
    pub leases_expired: u64,
    /// Leftovers settled with Redis (`RL.RETURN`, or `RETURN` inside `RL.LEASE`).
    pub returns: u64,
    /// Unspent tokens sent back in those settlements.
    pub tokens_returned: u64,
    /// Decisions made by the failure policy because Redis was unavailable.
    pub fallback_decisions: u64,
    /// Of those, the ones that allowed the request.
    pub fallback_granted: u64,
    /// Redis calls that failed for want of Redis (connection failures and timeouts: the
    /// outages the failure policy covers).
    pub redis_errors: u64,
    /// Of those, the calls that timed out.
    pub redis_timeouts: u64,
    /// Redis calls answered with an error reply (`WRONGTYPE`, `ERR too many live
    /// leases...`, an unknown command) or an unreadable reply: never outages.
    pub server_errors: u64,
    /// Calls answered with an error (an error reply, a missing module, a closed limiter).
    pub errors: u64,
    /// Calls dropped by their caller before they were answered (nothing is lost: a lease
    /// call they started completes in the background).
    pub cancelled: u64,
    /// Leases Redis may have granted that the client could neither spend nor return: a
    /// lease call whose reply never came (half-open connection), or a late lease whose
    /// return failed. Their tokens stay debited until the lease's TTL.
    pub leases_lost: u64,
    /// Total time `reserve` slept before its callers used their tokens, µs.
    pub reserve_wait_us: u64,
    /// `RL.REFUND` calls that credited tokens back.
    pub refunds: u64,
    /// Whole tokens those refunds credited.
    pub tokens_refunded: u64,
    /// Permits granted (`RL.ACQUIRE`, or locally by the failure policy).
    pub permits_acquired: u64,
    /// Permit requests denied (the limit was reached).
    pub permits_denied: u64,
    /// Permits given back (`RL.RELEASE`, explicitly or on drop).
    pub permits_released: u64,
    /// Background renewals that extended a permit (`RL.RENEW`).
    pub permits_renewed: u64,
    /// Permits found expired while still held (a renewal came too late, or Redis was away
    /// longer than the TTL): their slot may have gone to someone else.
    pub permits_lost: u64,
    /// Redis calls made (latency samples).
    pub redis_calls: u64,
    /// Sum of Redis call latencies, µs.
    pub latency_sum_us: u64,
    /// Slowest Redis call, µs.
    pub latency_max_us: u64,
    /// Calls per latency bucket: `latency_buckets[i]` counts calls of at most
    /// `LATENCY_BUCKETS_US[i]` µs (not cumulative); the last entry counts the slower ones.
    pub latency_buckets: Vec<u64>,
}

/// One caller-facing call in progress: counted in `cancelled` if dropped unanswered.
pub(crate) struct Answer<'a> {
    metrics: &'a Metrics,
    done: bool,
}

impl Answer<'_> {
    /// The call is answered with `decision` (counted in `calls` and its outcome).
    pub(crate) fn decided(mut self, allowed: bool, tokens: u64, fallback: bool) {
        self.done = true;
        self.metrics.decided(allowed, tokens, fallback);
    }

    /// The call is answered with an error.
    pub(crate) fn errored(mut self, e: &crate::Error) {
        self.done = true;
        self.metrics.errored(e);
    }
}

impl Drop for Answer<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.metrics.cancelled();
        }
    }
}

fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Relaxed);
}

impl Metrics {
    /// Fresh counters, all zero.
    pub fn new() -> Metrics {
        Metrics::default()
    }

    /// A caller-facing call starts: see [`Answer`].
    pub(crate) fn answer(&self) -> Answer<'_> {
        Answer {
            metrics: self,
            done: false,
        }
    }

    pub(crate) fn decided(&self, allowed: bool, tokens: u64, fallback: bool) {
        add(&self.calls, 1);
        if allowed {
            add(&self.granted, 1);
            add(&self.tokens_granted, tokens);
        } else {
            add(&self.denied, 1);
        }
        if fallback {
            add(&self.fallback_decisions, 1);
            if allowed {
                add(&self.fallback_granted, 1);
            }
        }
    }

    pub(crate) fn lease(&self, tokens: u64) {
        if tokens > 0 {
            add(&self.leases, 1);
            add(&self.lease_tokens, tokens);
        } else {
            add(&self.leases_denied, 1);
        }
    }

    /// A call answered with `e`.
    pub(crate) fn errored(&self, e: &crate::Error) {
        add(&self.calls, 1);
        add(&self.errors, 1);
        if matches!(e, crate::Error::Reply(_)) {
            add(&self.server_errors, 1);
        }
    }

    pub(crate) fn cancelled(&self) {
        add(&self.cancelled, 1);
    }

    pub(crate) fn lease_lost(&self) {
        add(&self.leases_lost, 1);
    }

    pub(crate) fn lease_expired(&self) {
        add(&self.leases_expired, 1);
    }

    pub(crate) fn returned(&self, tokens: u64) {
        add(&self.returns, 1);
        add(&self.tokens_returned, tokens);
    }

    pub(crate) fn reserve_waited(&self, wait: Duration) {
        add(
            &self.reserve_wait_us,
            wait.as_micros().min(u64::MAX as u128) as u64,
        );
    }

    pub(crate) fn refunded(&self, tokens: f64) {
        add(&self.refunds, 1);
        add(&self.tokens_refunded, tokens.max(0.0).floor() as u64);
    }

    pub(crate) fn permit(&self, granted: bool) {
        add(
            if granted {
                &self.permits_acquired
            } else {
                &self.permits_denied
            },
            1,
        );
    }

    pub(crate) fn permit_released(&self) {
        add(&self.permits_released, 1);
    }

    pub(crate) fn permit_renewed(&self) {
        add(&self.permits_renewed, 1);
    }

    pub(crate) fn permit_lost(&self) {
        add(&self.permits_lost, 1);
    }

    pub(crate) fn redis_call<T>(&self, took: Duration, outcome: &Result<T, crate::Error>) {
        let (failed, timed_out, server) = match outcome {
            Ok(_) => (false, false, false),
            Err(e) if e.is_server_error() => (false, false, true),
            Err(e) => (true, matches!(e, crate::Error::Timeout(_)), false),
        };
        if server {
            add(&self.server_errors, 1);
        }
        self.redis_latency(took, !failed, timed_out);
    }

    fn redis_latency(&self, took: Duration, ok: bool, timed_out: bool) {
        let us = took.as_micros().min(u64::MAX as u128) as u64;
        add(&self.redis_calls, 1);
        add(&self.latency_sum_us, us);
        self.latency_max_us.fetch_max(us, Relaxed);
        let bucket = LATENCY_BUCKETS_US
            .iter()
            .position(|le| us <= *le)
            .unwrap_or(LATENCY_BUCKETS_US.len());
        add(&self.latency_buckets[bucket], 1);
        if !ok {
            add(&self.redis_errors, 1);
        }
        if timed_out {
            add(&self.redis_timeouts, 1);
        }
    }

    /// The counters now.
    pub fn snapshot(&self) -> MetricsSnapshot {
        let get = |c: &AtomicU64| c.load(Relaxed);
        MetricsSnapshot {
            calls: get(&self.calls),
            granted: get(&self.granted),
            denied: get(&self.denied),
            tokens_granted: get(&self.tokens_granted),
            leases: get(&self.leases),
            lease_tokens: get(&self.lease_tokens),
            leases_denied: get(&self.leases_denied),
            leases_expired: get(&self.leases_expired),
            returns: get(&self.returns),
            tokens_returned: get(&self.tokens_returned),
            fallback_decisions: get(&self.fallback_decisions),
            fallback_granted: get(&self.fallback_granted),
            redis_errors: get(&self.redis_errors),
            redis_timeouts: get(&self.redis_timeouts),
            server_errors: get(&self.server_errors),
            errors: get(&self.errors),
            cancelled: get(&self.cancelled),
            leases_lost: get(&self.leases_lost),
            reserve_wait_us: get(&self.reserve_wait_us),
            refunds: get(&self.refunds),
            tokens_refunded: get(&self.tokens_refunded),
            permits_acquired: get(&self.permits_acquired),
            permits_denied: get(&self.permits_denied),
            permits_released: get(&self.permits_released),
            permits_renewed: get(&self.permits_renewed),
            permits_lost: get(&self.permits_lost),
            redis_calls: get(&self.redis_calls),
            latency_sum_us: get(&self.latency_sum_us),
            latency_max_us: get(&self.latency_max_us),
            latency_buckets: self.latency_buckets.iter().map(get).collect(),
        }
    }
}

impl MetricsSnapshot {
    /// The counters in the Prometheus text format, each name starting with `prefix`
    /// (e.g. `"rl_client"`); latency as a histogram in seconds.
    pub fn to_prometheus(&self, prefix: &str) -> String {
        let mut out = String::new();
        let counters = [
            ("calls_total", self.calls, "take calls"),
            ("granted_total", self.granted, "decisions that allowed"),
            ("denied_total", self.denied, "decisions that denied"),
            (
                "tokens_granted_total",
                self.tokens_granted,
                "tokens granted",
            ),
            ("leases_total", self.leases, "leases granted by redis"),
            (
                "lease_tokens_total",
                self.lease_tokens,
                "tokens received in leases",
            ),
            (
                "leases_denied_total",
                self.leases_denied,
                "lease calls that got nothing",
            ),
            (
                "leases_expired_total",
                self.leases_expired,
                "leases expired unspent",
            ),
            (
                "returns_total",
                self.returns,
                "leftovers settled with redis",
            ),
            (
                "tokens_returned_total",
                self.tokens_returned,
                "unspent tokens returned",
            ),
            (
                "fallback_decisions_total",
                self.fallback_decisions,
                "decisions by the failure policy",
            ),
            (
                "fallback_granted_total",
                self.fallback_granted,
                "fallback decisions that allowed",
            ),
            (
                "redis_errors_total",
                self.redis_errors,
                "failed redis calls",
            ),
            (
                "redis_timeouts_total",
                self.redis_timeouts,
                "redis calls that timed out",
            ),
            (
                "server_errors_total",
                self.server_errors,
                "redis error replies",
            ),
            ("errors_total", self.errors, "calls answered with an error"),
            (
                "cancelled_total",
                self.cancelled,
                "calls dropped before their answer",
            ),
            (
                "leases_lost_total",
                self.leases_lost,
                "leases neither spent nor returned",
            ),
            (
                "refunds_total",
                self.refunds,
                "refunds that credited tokens",
            ),
            (
                "tokens_refunded_total",
                self.tokens_refunded,
                "whole tokens refunded",
            ),
            (
                "permits_acquired_total",
                self.permits_acquired,
                "permits granted",
            ),
            (
                "permits_denied_total",
                self.permits_denied,
                "permit requests denied",
            ),
            (
                "permits_released_total",
                self.permits_released,
                "permits released",
            ),
            (
                "permits_renewed_total",
                self.permits_renewed,
                "permit renewals",
            ),
            (
                "permits_lost_total",
                self.permits_lost,
                "permits that expired while held",
            ),
        ];
        for (name, value, help) in counters {
            let _ = writeln!(out, "# HELP {prefix}_{name} {help}");
            let _ = writeln!(out, "# TYPE {prefix}_{name} counter");
            let _ = writeln!(out, "{prefix}_{name} {value}");
        }
        let name = format!("{prefix}_reserve_wait_seconds_total");
        let _ = writeln!(out, "# HELP {name} time reserve slept before use");
        let _ = writeln!(out, "# TYPE {name} counter");
        let _ = writeln!(out, "{name} {}", self.reserve_wait_us as f64 / 1e6);
        let name = format!("{prefix}_redis_latency_seconds");
        let _ = writeln!(out, "# HELP {name} redis call latency");
        let _ = writeln!(out, "# TYPE {name} histogram");
        let mut cumulative = 0;
        for (i, count) in self.latency_buckets.iter().enumerate() {
            cumulative += count;
            let le = LATENCY_BUCKETS_US
                .get(i)
                .map_or("+Inf".to_string(), |us| format!("{}", *us as f64 / 1e6));
            let _ = writeln!(out, "{name}_bucket{{le=\"{le}\"}} {cumulative}");
        }
        let _ = writeln!(out, "{name}_sum {}", self.latency_sum_us as f64 / 1e6);
        let _ = writeln!(out, "{name}_count {}", self.redis_calls);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_decisions_and_latency() {
        let m = Metrics::new();
        m.decided(true, 3, false);
        m.decided(false, 0, true);
        m.redis_latency(Duration::from_micros(700), true, false);
        m.redis_latency(Duration::from_secs(1), false, true);
        let s = m.snapshot();
        assert_eq!(
            (s.calls, s.granted, s.denied, s.tokens_granted),
            (2, 1, 1, 3)
        );
        assert_eq!((s.fallback_decisions, s.fallback_granted), (1, 0));
        assert_eq!((s.redis_calls, s.redis_errors, s.redis_timeouts), (2, 1, 1));
        assert_eq!(s.latency_buckets[2], 1);
        assert_eq!(*s.latency_buckets.last().unwrap(), 1);
        assert_eq!(s.latency_max_us, 1_000_000);
        let text = s.to_prometheus("rl");
        assert!(text.contains("rl_calls_total 2\n"));
        assert!(text.contains("rl_redis_latency_seconds_bucket{le=\"+Inf\"} 2\n"));
    }
}
