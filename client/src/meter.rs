//! How fast Redis has been granting tokens to this instance for one key: the "last known
//! rate" the `LastKnown` failure policy keeps spending at.

use rl_core::{Nanos, NANOS_PER_SEC};

/// Length of one measuring window.
const WINDOW: Nanos = 1_000_000_000;

/// A windowed rate of granted tokens, smoothed over windows (each new window weighs half).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Meter {
    window_start: Nanos,
    window_tokens: f64,
    rate: Option<f64>,
}

impl Meter {
    /// Records `tokens` granted at `now`.
    pub(crate) fn add(&mut self, tokens: u64, now: Nanos) {
        if self.window_start == 0 || now < self.window_start {
            self.window_start = now;
            self.window_tokens = 0.0;
        }
        let elapsed = now - self.window_start;
        if elapsed >= WINDOW {
            // Close the window with what it saw; this grant opens the next one.
            let sample = self.window_tokens * NANOS_PER_SEC / elapsed as f64;
            self.rate = Some(self.rate.map_or(sample, |r| (r + sample) / 2.0));
            self.window_start = now;
            self.window_tokens = 0.0;
        }
        self.window_tokens += tokens as f64;
    }

    /// Tokens per second granted lately, or `None` with less than a tenth of a window seen.
    pub(crate) fn rate(&self, now: Nanos) -> Option<f64> {
        if self.rate.is_some() {
            return self.rate;
        }
        let elapsed = now.saturating_sub(self.window_start);
        (self.window_start != 0 && elapsed >= WINDOW / 10)
            .then(|| self.window_tokens * NANOS_PER_SEC / elapsed as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Nanos = 1_000_000_000;
    const T0: Nanos = 1_700_000_000 * S;

    #[test]
    fn measures_a_steady_rate() {
        let mut m = Meter::default();
        assert_eq!(m.rate(T0), None);
        for i in 0..=40 {
            m.add(1, T0 + i * S / 10); // 10 tokens a second
        }
        let r = m.rate(T0 + 4 * S).unwrap();
        assert!((r - 10.0).abs() < 1.0, "{r}");
    }

    #[test]
    fn partial_window_counts_after_a_tenth() {
        let mut m = Meter::default();
        m.add(5, T0);
        assert_eq!(m.rate(T0 + S / 20), None);
        let r = m.rate(T0 + S / 2).unwrap();
        assert!((r - 10.0).abs() < 1e-9, "{r}");
    }
}
