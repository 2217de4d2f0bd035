//! The demand a share holder reports as its `want` (`RL.SHARE`'s fifth argument): tokens
//! asked for per second, granted or denied, measured between calls, and a stray from the
//! last report seen early. Time is passed in (nanoseconds, monotonic).

use std::collections::VecDeque;

use crate::share::{HOLD, MS};

const NANOS_PER_SEC: f64 = 1e9;

/// The measured demand: attempted tokens per second (granted and denied) over the span since
/// the last call, so that a step either way is in the next call's want in full; `want`
/// adds `headroom`. Between calls the refresh task notes the attempts at each tick, so that
/// a demand that strays from the one last reported is seen over the latest [`RECENT`]
/// ([`Demand::drifted`]) and reported early, as its level since it moved.
#[derive(Debug, Clone, PartialEq)]
pub struct Demand {
    last: Option<f64>,
    attempted: f64,
    since: u64,
    /// `(instant, attempts since the last call)` at the refresh task's ticks, over the
    /// latest [`HISTORY`].
    ticks: VecDeque<(u64, f64)>,
    /// No early call within this long of the last one: [`SHORTEST`] after a call that
    /// shrank the share (the server would answer a call within its hold from the entry,
    /// without taking the want), else 0.
    gate: u64,
}

/// Shortest span a sample is taken over: calls closer together (a holder sent back soon
/// to pick up what another frees) keep the last want and go on counting, so that a holder
/// asking a few times a second is not measured at 0 over a few milliseconds.
const MIN_SAMPLE: u64 = HOLD;
/// No early call within this long of a call that shrank the share (its hold).
pub const SHORTEST: u64 = rl_core::share::SHORTEST_PERIOD_MS * MS;
/// The span a stray is looked for over: short, so that a demand that stepped is seen soon.
const RECENT: u64 = 150 * MS;
/// A demand that strayed this far (a fraction of the one last reported) is reported early.
const DRIFT: f64 = 0.25;
/// An early report is the demand since the instant it moved (the split of the ticks that
/// fits two rates best), measured over at least this long: a mix of the old and new
/// levels would keep a holder whose demand fell holding most of what it no longer uses.
const SETTLED: u64 = 100 * MS;
/// The ticks kept to find that instant.
const HISTORY: u64 = 1000 * MS;
/// How much better (log-likelihood) two rates split at an instant must fit the ticks than
/// one rate for the demand to have moved at that instant rather than before the last call.
const SPLIT: f64 = 5.0;

/// Log-likelihood (up to terms that do not depend on the split) of `count` Poisson
/// arrivals over `span` seconds at their own rate.
fn fit(count: f64, span: f64) -> f64 {
    if count <= 0.0 || span <= 0.0 {
        0.0
    } else {
        count * (count / span).ln() - count
    }
}

impl Demand {
    pub fn new(now: u64) -> Demand {
        Demand {
            last: None,
            attempted: 0.0,
            since: now,
            ticks: VecDeque::new(),
            gate: SHORTEST,
        }
    }

    pub fn attempt(&mut self, n: f64) {
        self.attempted += n;
    }

    /// The answer to the last call shrank the holder's share (`shrank`) or not: how soon
    /// it may call early again.
    pub fn answered(&mut self, shrank: bool) {
        self.gate = if shrank { SHORTEST } else { 0 };
    }

    /// Notes this tick; answers the demand over the latest [`RECENT`] (at least), `None`
    /// within the gate or [`SETTLED`] of the last call.
    fn recent(&mut self, now: u64, pending: f64) -> Option<f64> {
        let total = self.attempted + pending;
        self.ticks.push_back((now, total));
        while self.ticks.len() > 1 && now.saturating_sub(self.ticks[1].0) >= HISTORY {
            self.ticks.pop_front();
        }
        if now.saturating_sub(self.since) < self.gate.max(SETTLED) {
            return None;
        }
        let (t, n) = (self.ticks.iter().rev())
            .find(|&&(t, _)| now.saturating_sub(t) >= RECENT)
            .copied()
            .unwrap_or((self.since, 0.0));
        Some((total - n) * NANOS_PER_SEC / now.saturating_sub(t).max(1) as f64)
    }

    /// The demand since it moved: the ticks since the last call split where two rates fit
    /// them best, the rate after the split (`None` while that is under [`SETTLED`]); the
    /// rate since the call if no split fits much better than none.
    fn since_move(&self, now: u64) -> Option<f64> {
        let &(_, total) = self.ticks.back()?;
        let (t0, n0) = if now.saturating_sub(self.since) <= HISTORY {
            (self.since, 0.0)
        } else {
            self.ticks[0]
        };
        let secs = |a: u64, b: u64| b.saturating_sub(a) as f64 / NANOS_PER_SEC;
        let mut best: Option<(f64, u64, f64)> = None;
        for &(t, n) in &self.ticks {
            if t <= t0 || t >= now {
                continue;
            }
            let score = fit(n - n0, secs(t0, t)) + fit(total - n, secs(t, now));
            if best.is_none_or(|(s, _, _)| score > s) {
                best = Some((score, t, n));
            }
        }
        match best {
            // No instant fits much better than none: the demand moved before the last call
            // (within its gate), and all of the span since is at its new level.
            Some((s, _, _)) if s - fit(total - n0, secs(t0, now)) < SPLIT => {
                Some((total - n0) / secs(t0, now).max(1e-9))
            }
            None => Some((total - n0) / secs(t0, now).max(1e-9)),
            Some((_, t, n)) => {
                (now.saturating_sub(t) >= SETTLED).then(|| (total - n) / secs(t, now))
            }
        }
    }

    /// The demand since it moved ([`Demand::since_move`]) if the recent demand strayed from
    /// the one the last call reported by more than [`DRIFT`] of it and more than chance
    /// would (three standard deviations of a Poisson count over the span): the holder
    /// calls early, so that a holder whose demand fell gives back what it no longer uses
    /// and one whose demand rose asks for it, instead of waiting a whole period.
    /// `pending`: attempts not yet added. Not while both demands are well above the
    /// holder's `share` (if it has one): its want is then above the division's level
    /// either way, and reporting it changes nothing (a tight loop's demand swings with the
    /// CPU it gets).
    pub fn drifted(&mut self, now: u64, pending: f64, share: f64) -> Option<f64> {
        let last = self.last?;
        let rate = self.recent(now, pending)?;
        if 0.0 < share * (1.0 + DRIFT) && share * (1.0 + DRIFT) < rate.min(last) {
            return None;
        }
        let span = RECENT as f64 / NANOS_PER_SEC;
        let expected = last * span;
        let gap = (rate - last).abs() * span;
        if gap > DRIFT * expected && gap > 3.0 * expected.sqrt() + 2.0 {
            self.since_move(now)
        } else {
            None
        }
    }

    /// Closes the sample since the last call and answers `sample * (1 + headroom)` (the
    /// `recent` demand instead, when the call is early for it), or `initial` before
    /// anything was measured.
    pub fn want(&mut self, now: u64, headroom: f64, initial: f64, recent: Option<f64>) -> f64 {
        let dt = now.saturating_sub(self.since);
        if dt >= MIN_SAMPLE || recent.is_some() {
            self.last = Some(recent.unwrap_or(self.attempted * NANOS_PER_SEC / dt as f64));
            self.attempted = 0.0;
            self.since = now;
            self.ticks.clear();
        }
        match self.last {
            None => initial,
            Some(d) => (d * (1.0 + headroom)).clamp(0.0, 1e15),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;
    const T0: u64 = 1_000 * S;

    #[test]
    fn want_is_the_demand_since_the_last_call_and_a_stray_is_reported_early() {
        let mut d = Demand::new(T0);
        assert_eq!(d.want(T0, 0.5, 123.0, None), 123.0, "nothing measured yet");
        // 100 attempts a second for a second: 100, with headroom 150.
        d.attempt(100.0);
        let mut now = T0 + S;
        assert!((d.want(now, 0.5, 123.0, None) - 150.0).abs() < 1e-6);
        // A step to 1000/s is in the next want in full.
        d.attempt(1000.0);
        now += S;
        assert!((d.want(now, 0.0, 0.0, None) - 1000.0).abs() < 1e-6);
        // Calls closer than the shortest sample keep the last want.
        d.attempt(1e9);
        assert!((d.want(now + MS, 0.0, 0.0, None) - 1000.0).abs() < 1e-6);
        let mut d = Demand::new(T0);
        d.attempt(1000.0);
        now = T0 + S;
        d.want(now, 0.0, 0.0, None);
        // At 1000/s, ticks every 25 ms: no stray; never within SHORTEST of the first call.
        let tick = 25 * MS;
        let mut pending = 0.0;
        for k in 1..=40u64 {
            pending += 25.0;
            assert_eq!(
                d.drifted(now + k * tick, pending, f64::INFINITY),
                None,
                "tick {k}"
            );
        }
        // The demand falls to 200/s: seen within 200 ms, reported as its level since the
        // fall (not a mix of the two, which would keep most of what the holder no longer
        // uses).
        let mut seen = None;
        for k in 41..=80u64 {
            pending += 5.0;
            if let Some(r) = d.drifted(now + k * tick, pending, f64::INFINITY) {
                seen = Some((k, r));
                break;
            }
        }
        let (k, r) = seen.expect("a fall to a fifth is reported");
        assert!(k <= 48 && (r - 200.0).abs() < 1e-6, "tick {k}: {r}");
        let mut at = now + k * tick;
        assert!((d.want(at, 0.0, 0.0, Some(r)) - r).abs() < 1e-9);
        // The answer did not shrink the share: a rise is reported early without waiting
        // out the call's hold, as soon as it is settled.
        d.answered(false);
        pending = 0.0;
        let mut seen = None;
        for k in 1..=12u64 {
            pending += 25.0;
            if let Some(r) = d.drifted(at + k * tick, pending, f64::INFINITY) {
                seen = Some((k, r));
                break;
            }
        }
        let (k, r) = seen.expect("a rise to five times is reported");
        assert!(k <= 5 && (r - 1000.0).abs() < 1e-6, "tick {k}: {r}");
        at += k * tick;
        d.want(at, 0.0, 0.0, Some(r));
        // After an answer that shrank the share, no early call within SHORTEST of the
        // call: the server would answer it from the entry (the call's hold) and not take
        // the want.
        d.answered(true);
        pending = 0.0;
        for k in 1..=11u64 {
            pending += 1.0;
            assert_eq!(
                d.drifted(at + k * tick, pending, f64::INFINITY),
                None,
                "tick {k}"
            );
        }
        assert!(d
            .drifted(at + 325 * MS, pending + 1.0, f64::INFINITY)
            .is_some());
    }
}
