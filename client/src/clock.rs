//! The clocks the client reads. Every client-side duration (the local fallback buckets,
//! the observed rates, deadlines, leases, shares) is measured on the monotonic clock: a
//! step of the wall clock (NTP, a VM resumed, an operator) must neither refill a local
//! bucket at once (+1 h: a whole share let out) nor freeze it (-1 h: fail-open locked out
//! for an hour). The wall clock only seeds the jitter generator.

use std::sync::OnceLock;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use rl_core::Nanos;

/// Wall-clock nanoseconds since the Unix epoch: a seed, never a measure of time passed.
pub(crate) fn wall_ns() -> Nanos {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos().min(u64::MAX as u128) as u64);
    #[cfg(test)]
    let now = now.saturating_add_signed(test_step::get());
    now
}

/// Monotonic nanoseconds since the first call in this process; never 0, so 0 can mean
/// "unset" in atomics. What `rl-core` takes as `now` in the client (any origin will do:
/// the local buckets never meet the server's instants).
pub(crate) fn mono_ns() -> u64 {
    static BASE: OnceLock<Instant> = OnceLock::new();
    let base = BASE.get_or_init(Instant::now);
    (base.elapsed().as_nanos().min(u64::MAX as u128) as u64).saturating_add(1)
}

/// Unit tests step the wall clock (as NTP or an operator would) to show that nothing the
/// client times follows it.
#[cfg(test)]
pub(crate) mod test_step {
    use std::sync::atomic::{AtomicI64, Ordering};

    static STEP_NS: AtomicI64 = AtomicI64::new(0);

    pub(crate) fn get() -> i64 {
        STEP_NS.load(Ordering::SeqCst)
    }

    /// Moves the wall clock by `ns` (negative: back).
    pub(crate) fn step(ns: i64) {
        STEP_NS.fetch_add(ns, Ordering::SeqCst);
    }
}
