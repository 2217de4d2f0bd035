//! A validated `(rate, cap)` pair and the conversions between tokens and time under it.

use crate::{round, Nanos, NANOS_PER_SEC};

/// Smallest accepted rate or cap.
pub const MIN_VALUE: f64 = 1e-9;
/// Largest accepted rate or cap: far above any real quota.
pub const MAX_VALUE: f64 = 1e15;
/// Longest time an empty bucket may take to fill (`cap / rate`): 100 years. Keeps every
/// instant a bucket can reach inside `i64` milliseconds, which Redis expiries need.
pub const MAX_FILL_SECS: f64 = 100.0 * 365.25 * 86_400.0;

/// Why a `(rate, cap)` pair was refused. The texts are the user-facing error messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitError {
    Rate,
    Cap,
    FillTime,
}

impl std::fmt::Display for LimitError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.message())
    }
}

impl std::error::Error for LimitError {}

impl LimitError {
    pub fn message(self) -> &'static str {
        match self {
            LimitError::Rate => "rate must be a finite number between 1e-9 and 1e15",
            LimitError::Cap => "cap must be a finite number between 1e-9 and 1e15",
            LimitError::FillTime => "cap / rate must be at most 100 years",
        }
    }
}

/// How fast a bucket refills (`rate`, tokens per second) and how much it holds (`cap`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limit {
    rate: f64,
    cap: f64,
}

fn in_range(x: f64) -> bool {
    // NaN fails both comparisons; inf fails the upper bound.
    (MIN_VALUE..=MAX_VALUE).contains(&x)
}

impl Limit {
    pub fn new(rate: f64, cap: f64) -> Result<Limit, LimitError> {
        if !in_range(rate) {
            return Err(LimitError::Rate);
        }
        if !in_range(cap) {
            return Err(LimitError::Cap);
        }
        if cap / rate > MAX_FILL_SECS {
            return Err(LimitError::FillTime);
        }
        Ok(Limit { rate, cap })
    }

    pub fn rate(&self) -> f64 {
        self.rate
    }

    pub fn cap(&self) -> f64 {
        self.cap
    }

    /// Time to refill `tokens`, never less than exact (rounded up, with every step of the
    /// float arithmetic rounded up too): what a debit of `tokens` costs.
    pub fn nanos_for(&self, tokens: f64) -> Nanos {
        round::refill_nanos_ceil(tokens, self.rate)
    }

    /// Time to refill `tokens`, never more than exact: what a credit of `tokens` gives back.
    pub fn nanos_for_floor(&self, tokens: f64) -> Nanos {
        round::refill_nanos_floor(tokens, self.rate)
    }

    /// Tokens missing from a bucket that is `deficit` ns from full, never fewer than exact.
    pub fn tokens_for_up(&self, deficit: Nanos) -> f64 {
        round::tokens_in_up(deficit, self.rate)
    }

    /// Whether `ns` is certainly less than the time to refill `tokens` (`tokens >= 0`):
    /// decided with one nearest-rounded division and a margin far wider than its error
    /// (relative 1e-9 against a few 1e-16), so callers can skip the exactly rounded
    /// conversion when the answer is not close.
    pub fn clearly_below(&self, ns: Nanos, tokens: f64) -> bool {
        (ns as f64) < tokens * NANOS_PER_SEC / self.rate * (1.0 - 1e-9)
    }

    /// Whether `ns` is certainly more than the time to refill `tokens`, by at least 1 ns.
    pub fn clearly_above(&self, ns: Nanos, tokens: f64) -> bool {
        (ns as f64) > tokens * NANOS_PER_SEC / self.rate * (1.0 + 1e-9) + 1.0
    }

    /// Time for an empty bucket to fill.
    pub fn fill_nanos(&self) -> Nanos {
        self.nanos_for(self.cap)
    }

    /// Tokens missing from a bucket that is `deficit` ns from full (nearest: for display).
    pub fn tokens_for(&self, deficit: Nanos) -> f64 {
        deficit as f64 * self.rate / NANOS_PER_SEC
    }

    /// A limit rebuilt from a storage encoding of one that [`Limit::new`] accepted. Not
    /// validated again (the hot path decodes one per call).
    pub fn from_stored_parts(rate: f64, cap: f64) -> Limit {
        Limit { rate, cap }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_bad_values() {
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY, 1e16, 1e-10] {
            assert_eq!(Limit::new(bad, 10.0), Err(LimitError::Rate), "rate {bad}");
            assert_eq!(Limit::new(10.0, bad), Err(LimitError::Cap), "cap {bad}");
        }
        assert_eq!(Limit::new(1e-9, 1e6), Err(LimitError::FillTime));
        assert!(Limit::new(0.5, 1.0).is_ok());
        assert!(Limit::new(1e9, 1e9).is_ok());
    }

    #[test]
    fn time_token_conversions_round_the_safe_way() {
        let l = Limit::new(3.0, 10.0).unwrap();
        assert_eq!(l.nanos_for(1.0), 333_333_334);
        assert_eq!(l.nanos_for_floor(1.0), 333_333_333);
        assert_eq!(l.fill_nanos(), 3_333_333_334);
        assert!((l.tokens_for(1_000_000_000) - 3.0).abs() < 1e-12);
    }
}
