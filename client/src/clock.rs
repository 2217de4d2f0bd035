//! The two clocks the client reads: wall time for `rl-core` arithmetic, monotonic time
//! for deadlines.

use std::sync::OnceLock;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use rl_core::Nanos;

/// Wall-clock nanoseconds since the Unix epoch (what `rl-core` takes as `now`).
pub(crate) fn now_ns() -> Nanos {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos().min(u64::MAX as u128) as u64)
}

/// Monotonic nanoseconds since the first call in this process; never 0, so 0 can mean
/// "unset" in atomics.
pub(crate) fn mono_ns() -> u64 {
    static BASE: OnceLock<Instant> = OnceLock::new();
    let base = BASE.get_or_init(Instant::now);
    (base.elapsed().as_nanos().min(u64::MAX as u128) as u64).saturating_add(1)
}
