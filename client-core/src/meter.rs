//! How fast Redis has been granting tokens to this instance for one key: the "last known
//! rate" the `LastKnown` failure policy keeps spending at while Redis is away.
//!
//! Decided once (docs/client-contract.md, "The observed rate"): the tokens Redis granted
//! in the [`WINDOW`] (2 s) up to its last answer, divided by the time that window covers.
//! A sliding window, not a smoothed average: what a user reads as "the rate it was
//! getting just before the outage" is exactly this, and the sum over a fleet is bounded by
//! what Redis let out over one window (`rate + cap / 2` tokens a second), whatever the
//! skew between instances. Measured up to the last answer, not up to `now`: an outage
//! stops the answers, and the rate it falls back to is the one Redis last showed (a key
//! that was quiet before the outage keeps the rate of its last traffic, not a decay to 0).

use rl_core::{Nanos, NANOS_PER_SEC};

/// The span the rate is measured over, up to the last answer.
pub const WINDOW: Nanos = 2 * 1_000_000_000;
/// Grants are summed in slots of this length (the window's resolution: 5%).
pub const SLOT: Nanos = 100_000_000;
const SLOTS: usize = (WINDOW / SLOT) as usize;
/// A meter younger than this divides by it: one first grant is not an infinite rate.
pub const MIN_SPAN: Nanos = 250_000_000;

/// Tokens granted per slot over the last [`WINDOW`] before the last answer.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Meter {
    /// Tokens granted in slot number `k` at `k % SLOTS`, for the `SLOTS` slots up to
    /// `newest` (older ones are zeroed as the window moves on).
    slots: [u64; SLOTS],
    /// The slot number (`instant / SLOT`) of the last answer.
    newest: u64,
    /// The instant of the first answer; `None`: nothing seen yet.
    first: Option<Nanos>,
    /// The instant of the last answer (never moves back: a clock that stepped back counts
    /// its grants at the last instant seen).
    last: Nanos,
}

impl Meter {
    /// Records an answer from Redis granting `tokens` (0 for a denial: it still says the
    /// rate is what it is) at `now`.
    pub fn add(&mut self, tokens: u64, now: Nanos) {
        let now = match self.first {
            None => {
                self.first = Some(now);
                self.slots = [0; SLOTS];
                self.newest = now / SLOT;
                now
            }
            Some(_) => now.max(self.last),
        };
        self.last = now;
        let slot = now / SLOT;
        if slot > self.newest {
            // The slots the window left since the last answer start empty (at most all).
            let gone = (slot - self.newest).min(SLOTS as u64);
            for k in 0..gone {
                self.slots[((slot - k) % SLOTS as u64) as usize] = 0;
            }
            self.newest = slot;
        }
        let at = &mut self.slots[(slot % SLOTS as u64) as usize];
        *at = at.saturating_add(tokens);
    }

    /// Whether the rate speaks for the traffic up to `now`: the meter has seen a whole
    /// window of answers (the 1.9 s of whole slots the rate divides by at least), and its
    /// last is at most a window before `now`. A younger meter
    /// divides a burst by its age (one burst of the cap read as four caps a second); an
    /// older one measured a window no other instance's overlaps (a fleet whose instances
    /// each burst at a different hour each read the whole limit). Neither bounds a fleet.
    pub fn vouches_at(&self, now: Nanos) -> bool {
        self.first.is_some_and(|first| {
            self.last - first >= WINDOW - SLOT && now.saturating_sub(self.last) <= WINDOW
        })
    }

    /// Tokens a second Redis granted over the window up to its last answer; `None` before
    /// any answer.
    pub fn rate(&self) -> Option<f64> {
        let first = self.first?;
        let total: f64 = self.slots.iter().map(|&t| t as f64).sum();
        // The window starts at the oldest slot it holds (or the first answer, if later).
        let window_start = (self.newest + 1)
            .saturating_sub(SLOTS as u64)
            .saturating_mul(SLOT);
        let span = self.last - first.max(window_start).min(self.last);
        let span = span.max(MIN_SPAN);
        Some(total * NANOS_PER_SEC / span as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const S: Nanos = 1_000_000_000;
    const T0: Nanos = 1_700_000_000 * S;

    #[test]
    fn measures_a_steady_rate_over_the_last_window() {
        let mut m = Meter::default();
        assert_eq!(m.rate(), None);
        for i in 0..=40 {
            m.add(1, T0 + i * S / 10); // 10 tokens a second for 4 s
        }
        let r = m.rate().unwrap();
        assert!((r - 10.0).abs() < 0.6, "{r}");
        // Then 2 s at 40 a second: the window holds only those.
        for i in 1..=80 {
            m.add(1, T0 + 4 * S + i * S / 40);
        }
        let r = m.rate().unwrap();
        assert!((r - 40.0).abs() < 2.5, "{r}");
    }

    #[test]
    fn a_young_meter_divides_by_its_age_at_least_a_quarter_second() {
        let mut m = Meter::default();
        m.add(5, T0);
        assert_eq!(m.rate(), Some(20.0), "5 tokens over the minimum span");
        m.add(5, T0 + S);
        assert_eq!(m.rate(), Some(10.0));
        let mut denied = Meter::default();
        denied.add(0, T0);
        assert_eq!(
            denied.rate(),
            Some(0.0),
            "denials are a rate of 0, not no history"
        );
    }

    #[test]
    fn the_rate_stays_the_last_one_seen_after_a_pause() {
        let mut m = Meter::default();
        for i in 0..=20 {
            m.add(2, T0 + i * S / 10);
        }
        let before = m.rate();
        // Nothing for an hour: no decay (the outage keeps what Redis last showed).
        assert_eq!(m.rate(), before);
        // An answer after the pause: the old window is gone (1 token over the 1.9 s of
        // whole slots before it: the answer's own slot has just begun).
        m.add(1, T0 + 3600 * S);
        let r = m.rate().unwrap();
        assert!((r - 1.0 / 1.9).abs() < 1e-9, "{r}");
    }

    #[test]
    fn a_clock_that_steps_back_counts_at_the_last_instant() {
        let mut m = Meter::default();
        m.add(4, T0 + S);
        m.add(4, T0); // back a second
        assert_eq!(m.rate(), Some(32.0), "8 tokens over the minimum span");
        m.add(1, 0);
        m.add(1, u64::MAX);
        assert!(m.rate().unwrap().is_finite());
    }

    #[test]
    fn only_a_whole_recent_window_vouches() {
        let mut m = Meter::default();
        assert!(!m.vouches_at(T0));
        m.add(20, T0);
        assert!(!m.vouches_at(T0), "one burst: a young meter");
        m.add(0, T0 + WINDOW - SLOT - 1);
        assert!(!m.vouches_at(T0 + WINDOW - SLOT));
        m.add(0, T0 + WINDOW);
        assert!(m.vouches_at(T0 + WINDOW) && m.vouches_at(T0 + 2 * WINDOW));
        assert!(
            !m.vouches_at(T0 + 2 * WINDOW + 1),
            "quiet for more than a window"
        );
        m.add(1, 0); // a clock stepped back: counted at the last instant
        assert!(m.vouches_at(T0 + WINDOW));
    }

    proptest! {
        /// The rate never says more than what the window it covers held, per second of
        /// at least the minimum span, and never panics whatever the instants.
        #[test]
        fn the_rate_is_the_window_total_over_its_span(
            steps in proptest::collection::vec((0u64..3 * S, 0u64..1000), 1..200),
            back in proptest::collection::vec(any::<bool>(), 200),
        ) {
            let mut m = Meter::default();
            let mut now = T0;
            let mut seen: Vec<(Nanos, u64)> = Vec::new();
            for (i, (dt, n)) in steps.into_iter().enumerate() {
                now = if back[i] { now.saturating_sub(dt) } else { now + dt };
                m.add(n, now);
                let at = seen.last().map_or(now, |&(t, _)| now.max(t));
                seen.push((at, n));
                let r = m.rate().unwrap();
                prop_assert!(r.is_finite() && r >= 0.0);
                let last = seen.last().unwrap().0;
                let total: u64 = seen.iter().filter(|&&(t, _)| t + WINDOW > last).map(|&(_, n)| n).sum();
                prop_assert!(r <= total as f64 * NANOS_PER_SEC / MIN_SPAN as f64 + 1e-6);
            }
        }
    }
}
