//! Adopting the seed Lua script's buckets (`scripts/token_bucket.lua`: a hash of `tokens`
//! and `ts`, seconds) without losing their level.

use crate::{round, Level, Limit, Nanos};

/// The level of a bucket the script left at `tokens` at `ts` (seconds since the epoch),
/// refilled to `now` under `limit` as the script would have, never above `cap`, rounded
/// toward fewer tokens. `None` for values the script never writes (negative, not finite).
pub fn script_level(tokens: f64, ts: f64, limit: Limit, now: Nanos) -> Option<Level> {
    if !tokens.is_finite() || !ts.is_finite() || tokens < 0.0 || ts < 0.0 {
        return None;
    }
    // The script's instant, rounded later (so less refill), then 1 µs more: `ts` is a
    // float of seconds, good to about 0.25 µs at today's dates.
    let at = round::mul_up(ts, 1e9).min(u64::MAX as f64 / 2.0) as Nanos + 1_000;
    let elapsed = now.saturating_sub(at);
    let refill = round::div_down(
        round::mul_down(round::nanos_down(elapsed), limit.rate()),
        1e9,
    );
    let level = round::sub_down(tokens, -refill).min(limit.cap());
    Some(Level::starting_with(limit, level, now))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: Nanos = 1_000_000_000;

    #[test]
    fn carries_over() {
        let limit = Limit::new(2.0, 10.0).unwrap();
        let now = 1_700_000_000 * SEC;
        let ts = 1_700_000_000.0 - 1.5;
        let l = script_level(3.0, ts, limit, now).unwrap();
        assert!(l.tokens() <= 6.0 && l.tokens() > 5.99, "{}", l.tokens());
        // Never above the cap, however long ago.
        let l = script_level(9.0, 1.0, limit, now).unwrap();
        assert_eq!(l.tokens(), 10.0);
        // A script state from the future (clock skew) refills nothing.
        let l = script_level(4.0, 1_700_000_100.0, limit, now).unwrap();
        assert!(l.tokens() <= 4.0 && l.tokens() > 3.99);
        // Above the new cap: clamped.
        let l = script_level(50.0, 1_700_000_000.0, limit, now).unwrap();
        assert_eq!(l.tokens(), 10.0);
        for (t, s) in [
            (-1.0, 1.0),
            (f64::NAN, 1.0),
            (1.0, f64::INFINITY),
            (1.0, -5.0),
        ] {
            assert!(script_level(t, s, limit, now).is_none());
        }
    }
}
