//! Counters a service can export: plain atomics, read with [`Metrics::snapshot`].

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// Upper bounds (µs) of the Redis latency histogram buckets; a last bucket takes the rest.
pub const LATENCY_BUCKETS_US: [u64; 10] = [
    250, 500, 1_000, 2_000, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000,
];

/// Declares every counter once: its field in [`Metrics`] (an atomic) and in
/// [`MetricsSnapshot`] (with its doc), its copy in [`Metrics::snapshot`], and, for the
/// `exported` ones, its Prometheus counter `<prefix>_<name>_total` with its help text.
macro_rules! counters {
    (
        exported { $( $(#[doc = $doc:literal])* $name:ident: $help:literal, )* }
        internal { $( $(#[doc = $idoc:literal])* $iname:ident, )* }
    ) => {
        /// Counters of one or more limiters (share one `Arc<Metrics>` to aggregate).
        #[derive(Debug, Default)]
        pub struct Metrics {
            $( $name: AtomicU64, )*
            $( $iname: AtomicU64, )*
            latency_buckets: [AtomicU64; LATENCY_BUCKETS_US.len() + 1],
        }

        /// A copy of the counters at one instant. All counts are totals since the start.
        #[derive(Debug, Clone, Default, PartialEq, Eq)]
        pub struct MetricsSnapshot {
            $( $(#[doc = $doc])* pub $name: u64, )*
            $( $(#[doc = $idoc])* pub $iname: u64, )*
            /// Calls per latency bucket: `latency_buckets[i]` counts calls of at most
            /// `LATENCY_BUCKETS_US[i]` µs (not cumulative); the last entry counts the slower
            /// ones.
            pub latency_buckets: Vec<u64>,
        }

        impl Metrics {
            /// The counters now.
            pub fn snapshot(&self) -> MetricsSnapshot {
                let get = |c: &AtomicU64| c.load(Relaxed);
                MetricsSnapshot {
                    $( $name: get(&self.$name), )*
                    $( $iname: get(&self.$iname), )*
                    latency_buckets: self.latency_buckets.iter().map(get).collect(),
                }
            }
        }

        impl MetricsSnapshot {
            /// The exported counters: name (without `_total`), value, help.
            fn exported(&self) -> Vec<(&'static str, u64, &'static str)> {
                vec![ $( (stringify!($name), self.$name, $help), )* ]
            }
        }
    };
}

counters! {
    exported {
        /// Calls answered (`take`, `reserve`...): always `granted + denied + errors`. A call
        /// dropped before its answer (cancelled, timed out by its caller) is counted in
        /// `cancelled` instead.
        calls: "take calls",
        /// Decisions that allowed the request (from any source).
        granted: "decisions that allowed",
        /// Decisions that denied it (from any source).
        denied: "decisions that denied",
        /// Tokens granted by allowed decisions.
        tokens_granted: "tokens granted",
        /// Leases Redis granted (`RL.LEASE` with tokens).
        leases: "leases granted by redis",
        /// Tokens received in leases.
        lease_tokens: "tokens received in leases",
        /// `RL.LEASE` calls that got no tokens (bucket empty).
        leases_denied: "lease calls that got nothing",
        /// Leases that reached their TTL locally with tokens unspent (those tokens are lost).
        leases_expired: "leases expired unspent",
        /// Leftovers settled with Redis (`RL.RETURN`, or `RETURN` inside `RL.LEASE`).
        returns: "leftovers settled with redis",
        /// Unspent tokens sent back in those settlements.
        tokens_returned: "unspent tokens returned",
        /// Decisions made by the failure policy because Redis was unavailable.
        fallback_decisions: "decisions by the failure policy",
        /// Of those, the ones that allowed the request.
        fallback_granted: "fallback decisions that allowed",
        /// Redis calls that failed for want of Redis (connection failures and timeouts: the
        /// outages the failure policy covers).
        redis_errors: "failed redis calls",
        /// Of those, the calls that timed out.
        redis_timeouts: "redis calls that timed out",
        /// Redis calls answered with an error reply (`WRONGTYPE`, `ERR too many live
        /// leases...`, an unknown command) or an unreadable reply: never outages.
        server_errors: "redis error replies",
        /// Calls answered with an error (an error reply, a missing module, a closed limiter).
        errors: "calls answered with an error",
        /// Calls dropped by their caller before they were answered (nothing is lost: a lease
        /// call they started completes in the background).
        cancelled: "calls dropped before their answer",
        /// Leases Redis may have granted that the client could neither spend nor return: a
        /// lease call whose reply never came (half-open connection), or a late lease whose
        /// return failed. Their tokens stay debited until the lease's TTL.
        leases_lost: "leases neither spent nor returned",
        /// Plain takes (`RL.TAKE`) and reservations whose caller stopped waiting (or dropped
        /// `reserve` while it slept) and whose grant could not be refunded: the late reply
        /// never came (the connection's `response_timeout` or the late bound cut it while
        /// Redis may still have run the call), or the refund failed, found the bucket in debt
        /// (it takes nothing back then), or was never sent (the runtime shut down first). A
        /// grant they got stays debited.
        takes_lost: "abandoned takes neither answered nor refunded",
        /// `RL.REFUND` calls that credited tokens back.
        refunds: "refunds that credited tokens",
        /// Whole tokens those refunds credited.
        tokens_refunded: "whole tokens refunded",
        /// Permits granted (`RL.ACQUIRE`, or locally by the failure policy).
        permits_acquired: "permits granted",
        /// Permit requests denied (the limit was reached).
        permits_denied: "permit requests denied",
        /// Permits given back (`RL.RELEASE`, explicitly or on drop).
        permits_released: "permits released",
        /// Background renewals that extended a permit (`RL.RENEW`).
        permits_renewed: "permit renewals",
        /// Permits found expired while still held (a renewal came too late, or Redis was away
        /// longer than the TTL): their slot may have gone to someone else.
        permits_lost: "permits that expired while held",
    }
    internal {
        /// Total time `reserve` slept before its callers used their tokens, µs (exported in
        /// seconds).
        reserve_wait_us,
        /// Redis calls made (latency samples; the latency histogram's count).
        redis_calls,
        /// Sum of Redis call latencies, µs (the histogram's sum, in seconds).
        latency_sum_us,
        /// Slowest Redis call, µs.
        latency_max_us,
    }
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

    /// What a prefetch ledger counted since it was last drained.
    pub(crate) fn ledger(&self, c: &rl_client_core::prefetch::LedgerCounters) {
        add(&self.leases, c.leases);
        add(&self.lease_tokens, c.lease_tokens);
        add(&self.leases_denied, c.leases_denied);
        add(&self.leases_expired, c.leases_expired);
        add(&self.leases_lost, c.leases_lost);
        add(&self.returns, c.returns);
        add(&self.tokens_returned, c.tokens_returned);
        // A call judged slow while in the air: an outage for the failure policy.
        add(&self.redis_errors, c.slow_calls);
        add(&self.redis_timeouts, c.slow_calls);
    }

    pub(crate) fn lease_lost(&self) {
        add(&self.leases_lost, 1);
    }

    pub(crate) fn take_lost(&self) {
        add(&self.takes_lost, 1);
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

    /// A call still in flight outlived a caller's timeout: an outage for the failure policy
    /// (counted once per call; its latency is counted when it ends).
    pub(crate) fn slow_call(&self) {
        add(&self.redis_errors, 1);
        add(&self.redis_timeouts, 1);
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
}

impl MetricsSnapshot {
    /// The counters in the Prometheus text format, each name starting with `prefix`
    /// (e.g. `"rl_client"`); latency as a histogram in seconds.
    pub fn to_prometheus(&self, prefix: &str) -> String {
        let mut out = String::new();
        for (name, value, help) in self.exported() {
            let _ = writeln!(out, "# HELP {prefix}_{name}_total {help}");
            let _ = writeln!(out, "# TYPE {prefix}_{name}_total counter");
            let _ = writeln!(out, "{prefix}_{name}_total {value}");
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
