//! The answer to one request for tokens, and its HTTP rendering.

use std::time::Duration;

use crate::PinKind;

/// Where a decision was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// Redis decided (`RL.TAKE`, or an `RL.LEASE` call made for this request).
    Server,
    /// Spent from a batch this instance leased earlier; no Redis call.
    Lease,
    /// Decided locally by the failure policy because Redis was unavailable.
    Fallback,
    /// Decided by the local bucket of this instance's rate share (`RL.SHARE`); no Redis
    /// call.
    Share,
}

/// A rate-limit decision.
///
/// `remaining`, `retry_after` and `reset_after` are the bucket's state as Redis reported it
/// for [`Source::Server`] decisions of [`Limiter`](crate::Limiter), and the local state
/// (the lease batch, or the local fallback bucket) otherwise.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// Whether the request may go ahead.
    pub allowed: bool,
    /// Tokens granted: the `n` asked for, or 0 when denied.
    pub granted: u64,
    /// Tokens left after this decision (fractional: buckets refill continuously).
    pub remaining: f64,
    /// How long until the same request could succeed; zero when allowed.
    pub retry_after: Duration,
    /// How long until the bucket is full again (zero when not known locally).
    pub reset_after: Duration,
    /// The bucket's capacity: the `X-RateLimit-Limit` value.
    pub limit: f64,
    /// Who decided.
    pub source: Source,
    /// The kind of the operator's pin (`RL.PIN`) that decided, when one did: `Rate` (the
    /// pin's limit, not this limiter's, decided), `Block` (denied; `retry_after` is the
    /// time left of the pin, or a minute for a pin without an end) or `Exempt` (granted,
    /// nothing debited: never refund it). [`Limiter`](crate::Limiter) takes say so (the
    /// fifth element of `RL.TAKE ... WITHSTATE`), and
    /// [`ShareLimiter`](crate::ShareLimiter) takes (the pin behind its last share: `Block`
    /// denied locally, `Exempt` granted uncounted); other decisions answer `None`.
    pub pinned: Option<PinKind>,
}

/// What a reservation ([`Limiter::reserve`](crate::Limiter::reserve)) decided.
///
/// A granted reservation is debited at once; its tokens may be used after `wait`.
/// `decision.remaining` is the bucket's level after it, negative while the bucket is in
/// debt (reservations queued ahead of their refill). Denied (the wait would exceed the
/// caller's `max_wait`): nothing was debited, and `wait` and `decision.retry_after` are
/// the wait that would have been needed.
#[derive(Debug, Clone, PartialEq)]
pub struct Reservation {
    /// The decision; see above for `remaining` and `retry_after`.
    pub decision: Decision,
    /// Granted: how long the caller waits before using the tokens (what
    /// [`Limiter::reserve`](crate::Limiter::reserve) slept). Denied: the wait needed.
    pub wait: Duration,
}

impl Reservation {
    /// Whether the tokens were reserved.
    pub fn allowed(&self) -> bool {
        self.decision.allowed
    }
}

fn ceil_secs(d: Duration) -> u64 {
    d.as_nanos().div_ceil(1_000_000_000).min(u64::MAX as u128) as u64
}

impl Decision {
    /// `n` tokens granted; `remaining` and `reset_after` as the decider knows them.
    pub fn granted(
        n: u64,
        remaining: f64,
        reset_after: Duration,
        limit: f64,
        source: Source,
    ) -> Decision {
        Decision {
            allowed: true,
            granted: n,
            remaining,
            retry_after: Duration::ZERO,
            reset_after,
            limit,
            source,
            pinned: None,
        }
    }

    /// Nothing granted: the same request could succeed after `retry_after`.
    pub fn denied(
        remaining: f64,
        retry_after: Duration,
        reset_after: Duration,
        limit: f64,
        source: Source,
    ) -> Decision {
        Decision {
            allowed: false,
            granted: 0,
            remaining,
            retry_after,
            reset_after,
            limit,
            source,
            pinned: None,
        }
    }

    /// What the server answered: `granted` tokens (0: denied) and the bucket's state.
    pub(crate) fn from_server(
        granted: u64,
        remaining: f64,
        retry_after: Duration,
        reset_after: Duration,
        limit: f64,
        pinned: Option<PinKind>,
    ) -> Decision {
        let decision = if granted > 0 {
            Decision::granted(granted, remaining, reset_after, limit, Source::Server)
        } else {
            Decision::denied(remaining, retry_after, reset_after, limit, Source::Server)
        };
        Decision { pinned, ..decision }
    }

    /// `Retry-After` in whole seconds, rounded up (a client that waits that long is not
    /// early).
    pub fn retry_after_secs(&self) -> u64 {
        ceil_secs(self.retry_after)
    }

    /// `X-RateLimit-Reset`: seconds until the bucket is full, rounded up.
    pub fn reset_after_secs(&self) -> u64 {
        ceil_secs(self.reset_after)
    }

    /// `X-RateLimit-Remaining`: whole tokens left.
    pub fn remaining_whole(&self) -> u64 {
        self.remaining.max(0.0).floor() as u64
    }

    /// The response headers for this decision: `X-RateLimit-Limit`,
    /// `X-RateLimit-Remaining`, `X-RateLimit-Reset`, and `Retry-After` when denied.
    pub fn http_headers(&self) -> Vec<(&'static str, String)> {
        let mut headers = vec![
            ("X-RateLimit-Limit", format_limit(self.limit)),
            ("X-RateLimit-Remaining", self.remaining_whole().to_string()),
            ("X-RateLimit-Reset", self.reset_after_secs().to_string()),
        ];
        if !self.allowed {
            headers.push(("Retry-After", self.retry_after_secs().max(1).to_string()));
        }
        headers
    }
}

/// A cap as a header value: an integer when it is one (the usual case), else the float.
fn format_limit(cap: f64) -> String {
    if cap.fract() == 0.0 && cap.abs() < 1e15 {
        format!("{}", cap as i64)
    } else {
        format!("{cap}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn denied() -> Decision {
        Decision {
            allowed: false,
            granted: 0,
            remaining: 0.7,
            retry_after: Duration::from_millis(1001),
            reset_after: Duration::from_millis(9_500),
            limit: 100.0,
            source: Source::Server,
            pinned: None,
        }
    }

    #[test]
    fn headers_round_the_way_a_client_expects() {
        let h = denied().http_headers();
        let get = |name| h.iter().find(|(n, _)| *n == name).map(|(_, v)| v.as_str());
        assert_eq!(get("X-RateLimit-Limit"), Some("100"));
        assert_eq!(get("X-RateLimit-Remaining"), Some("0"));
        assert_eq!(get("X-RateLimit-Reset"), Some("10"));
        assert_eq!(get("Retry-After"), Some("2"));
    }

    #[test]
    fn allowed_has_no_retry_after() {
        let d = Decision {
            allowed: true,
            granted: 1,
            retry_after: Duration::ZERO,
            ..denied()
        };
        assert!(d.http_headers().iter().all(|(n, _)| *n != "Retry-After"));
    }

    #[test]
    fn fractional_limit_is_kept() {
        assert_eq!(format_limit(2.5), "2.5");
        assert_eq!(format_limit(7.0), "7");
    }
}
