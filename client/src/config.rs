//! Limiter configuration: timeouts, the failure policy, and the lease batch and TTL.

use rl_core::MAX_VERSION;
use std::time::Duration;

use rl_core::Limit;

use crate::{Backend, Error};

/// `rate` tokens per second, bursts of `cap`: [`Limit::new`] with this crate's error type.
pub fn limit(rate: f64, cap: f64) -> Result<Limit, Error> {
    Ok(Limit::new(rate, cap)?)
}

/// What a limiter decides during an outage: Redis unreachable (connection refused, reset,
/// closed) or slow (a call exceeded [`LimiterConfig::timeout`]). Error replies are not
/// outages: they are returned to the caller. Every policy decision is counted in
/// [`Metrics`](crate::Metrics) as a fallback decision.
///
/// The local budgets are this instance's share of the fleet's limit:
/// [`LimiterConfig::instances`] divides the rate and the cap.
///
/// Pick per limiter, by what a wrong decision costs: `Allow` where
/// wrongly refusing costs more than letting a burst through (reads), `LastKnown` for steady
/// traffic where a short drift is acceptable, `Deny` for writes and costly operations.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum FailurePolicy {
    /// Fail open, through a local token bucket per key at `rate / instances`, cap
    /// `cap / instances` (at least one token). The bucket is kept across outages (a flap
    /// does not refill it) and is debited by what Redis grants this instance, so what one
    /// instance lets out, from Redis and locally, stays within its share over time.
    Allow,
    /// Keep spending at the share of the limit this instance was getting from Redis for the
    /// key (the tokens granted over the 2 s up to Redis's last answer, per second, over the
    /// rate), starting from that share of the last level Redis reported. A key with no
    /// history gets the `Allow` share.
    LastKnown,
    /// Fail closed: deny every request until Redis answers again, with
    /// [`LimiterConfig::deny_retry_after`] as the retry hint.
    Deny,
}

/// The default [`LimiterConfig::instances`]: a fleet of up to 4 instances stays within the
/// limit during an outage; set it to your fleet size.
pub const DEFAULT_INSTANCES: u32 = 4;

/// Settings every limiter has.
#[derive(Debug, Clone, PartialEq)]
pub struct LimiterConfig {
    /// Longest wait for one call (`take`, `reserve`...): past it the call counts as an
    /// outage and the policy decides. Every call returns within it. Keep it inside the
    /// request's latency budget. Default 200 ms.
    pub timeout: Duration,
    /// After a failed call, how long to decide locally before one call probes Redis again.
    /// Callers never wait for a Redis that is known to be down; recovery is at most this
    /// late. Default 500 ms.
    pub probe_interval: Duration,
    /// What to decide while Redis is unavailable. Default `Allow`: a limiter is a fuse,
    /// not a main switch.
    pub policy: FailurePolicy,
    /// How many instances (processes) share each limit. A failure policy's local budget is
    /// `rate / instances` and `cap / instances` (at least one token), so a fleet of at
    /// most `instances` stays within the limit while Redis is away. Default
    /// [`DEFAULT_INSTANCES`] (4), never the whole limit per instance: set your fleet size.
    pub instances: u32,
    /// The retry hint of a `Deny` fallback decision. Default 1 s.
    pub deny_retry_after: Duration,
    /// Most keys whose fallback state (local buckets, observed rates) is kept; beyond it
    /// the stalest are dropped. Default 100 000.
    pub max_keys: usize,
    /// The server side: the module's commands, the Functions library, or `Auto`.
    /// Default `Module`.
    pub backend: Backend,
    /// The version of this instance's limit, sent as `VERSION v` on every call that carries
    /// the limit (`take`, `reserve`, `mtake`, leases). A bucket keeps the newest limit any
    /// caller sent, so while a new limit rolls out instance by instance, old instances are
    /// decided under the new limit instead of flapping the bucket. Raise it with every
    /// change of the limit. `None` (default): not sent, the server's version 0.
    pub version: Option<u64>,
    /// What a bucket that does not exist yet starts with, sent as `INIT tokens` on every
    /// call that carries the limit: a warm start (`Some(0.0)` starts empty and ramps up at
    /// `rate`) for buckets whose full burst would hurt a downstream after a deploy or a
    /// flush. At most the limit's cap. `None` (default): a new bucket starts full.
    pub init: Option<f64>,
}

impl Default for LimiterConfig {
    fn default() -> Self {
        LimiterConfig {
            timeout: Duration::from_millis(200),
            probe_interval: Duration::from_millis(500),
            policy: FailurePolicy::Allow,
            instances: DEFAULT_INSTANCES,
            deny_retry_after: Duration::from_secs(1),
            max_keys: 100_000,
            backend: Backend::Module,
            version: None,
            init: None,
        }
    }
}

impl LimiterConfig {
    /// Checks every field; limiters call this when built.
    pub fn validate(&self) -> Result<(), Error> {
        if self.timeout.is_zero() {
            return Err(Error::Config("timeout must be positive"));
        }
        if self.max_keys == 0 {
            return Err(Error::Config("max_keys must be positive"));
        }
        if self.instances == 0 {
            return Err(Error::Config("instances must be positive"));
        }
        if self.version.is_some_and(|v| v > MAX_VERSION) {
            return Err(Error::Config("version must be at most 2^53 - 1"));
        }
        if self.init.is_some_and(|t| !(t >= 0.0 && t.is_finite())) {
            return Err(Error::Config("init must be a number of tokens, at least 0"));
        }
        Ok(())
    }
}

/// Settings of a [`PrefetchLimiter`](crate::PrefetchLimiter): how many tokens to lease at
/// once, for how long, and when to renew.
///
/// Sizing (see the README): `batch` should be of the order of what one instance spends
/// within its latency budget (one Redis round trip plus margin). A bigger batch means
/// fewer Redis calls but more over-issue: with `I` instances up to `2 * batch * I` tokens
/// are held locally at once (two leases per instance: the one spent and the next), spent or
/// not, and a key serves at most 512 instances (the module's 1024 live leases). A lease's
/// unspent tokens are returned on renewal and on
/// [`close`](crate::PrefetchLimiter::close); tokens a lease still holds when its TTL
/// passes are lost (the server keeps them debited), so `ttl` should comfortably exceed the
/// time an instance takes to spend a batch, yet stay short enough that a crashed instance
/// does not hold tokens for long.
#[derive(Debug, Clone, PartialEq)]
pub struct PrefetchConfig {
    /// Tokens asked for per lease. Default 20.
    pub batch: u64,
    /// Lease lifetime; the client stops spending a lease at `sent + ttl`, never later than
    /// the server's expiry. Default 2 s.
    pub ttl: Duration,
    /// Renew when the tokens left fall to this fraction of the batch, in `[0, 1)`. The
    /// renewal runs in the background while the rest is spent. Default 0.2 (renew after
    /// 80 % is spent).
    pub renew_at: f64,
    /// Spread of the renewal threshold, as a fraction of the batch, drawn anew for every
    /// lease, so a fleet that started together does not renew in lockstep. Default 0.1.
    pub jitter: f64,
    /// Timeouts, failure policy and fallback settings.
    pub limiter: LimiterConfig,
}

impl Default for PrefetchConfig {
    fn default() -> Self {
        PrefetchConfig {
            batch: 20,
            ttl: Duration::from_secs(2),
            renew_at: 0.2,
            jitter: 0.1,
            limiter: LimiterConfig::default(),
        }
    }
}

/// Longest TTL the server accepts: a day.
const MAX_TTL: Duration = Duration::from_secs(86_400);

impl PrefetchConfig {
    /// Checks every field; `PrefetchLimiter::new` calls this.
    pub fn validate(&self) -> Result<(), Error> {
        if self.batch == 0 {
            return Err(Error::Config("batch must be positive"));
        }
        if self.ttl < Duration::from_millis(1) || self.ttl > MAX_TTL {
            return Err(Error::Config("ttl must be between 1 ms and a day"));
        }
        if !(0.0..1.0).contains(&self.renew_at) {
            return Err(Error::Config("renew_at must be in [0, 1)"));
        }
        if !(0.0..=1.0).contains(&self.jitter) {
            return Err(Error::Config("jitter must be in [0, 1]"));
        }
        self.limiter.validate()
    }

    pub(crate) fn ttl_ms(&self) -> u64 {
        self.ttl.as_millis().clamp(1, MAX_TTL.as_millis()) as u64
    }
}

/// Refuses what the server would refuse for every state of the bucket.
pub(crate) fn check_request(n: u64, limit: &Limit) -> Result<(), Error> {
    if n == 0 {
        return Err(Error::Request("n must be positive"));
    }
    if n as f64 > limit.cap() {
        return Err(Error::Request("n must not exceed cap"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        assert!(LimiterConfig::default().validate().is_ok());
        assert!(PrefetchConfig::default().validate().is_ok());
    }

    #[test]
    fn bad_values_are_refused() {
        let bad = [
            PrefetchConfig {
                batch: 0,
                ..Default::default()
            },
            PrefetchConfig {
                ttl: Duration::ZERO,
                ..Default::default()
            },
            PrefetchConfig {
                renew_at: 1.0,
                ..Default::default()
            },
            PrefetchConfig {
                jitter: -0.1,
                ..Default::default()
            },
        ];
        for c in bad {
            assert!(c.validate().is_err(), "{c:?}");
        }
        let fleet = LimiterConfig {
            instances: 0,
            ..Default::default()
        };
        assert!(fleet.validate().is_err());
        // A rate of 0 is a configuration error, not a panic or an open door.
        assert!(matches!(limit(0.0, 10.0), Err(Error::Config(_))));
        assert!(matches!(limit(f64::NAN, 10.0), Err(Error::Config(_))));
    }
}
