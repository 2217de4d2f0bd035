//! The server's wall clock, read once per command.
//!
//! `RedisModule_Microseconds` does not exist on Redis 7.0, so this reads the system's
//! real-time clock (`CLOCK_REALTIME`, a vDSO call, no syscall). Wall time, not monotonic time, because the stored
//! instants must mean the same thing on a replica promoted after a failover.

use rl_core::Nanos;

pub fn now() -> Nanos {
    // Before 1970 (a badly set clock) reads as 0: stored instants never go below it.
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos().min(u128::from(u64::MAX)) as u64)
}
