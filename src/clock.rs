//! The server's wall clock, read once per command.
//!
//! `RedisModule_Microseconds` does not exist on Redis 7.0, so this reads the system's
//! real-time clock (`CLOCK_REALTIME`, a vDSO call, no syscall; see [`crate::ffi::realtime`]).
//! Wall time, not monotonic time, because the stored instants must mean the same thing on a
//! replica promoted after a failover.

use rl_core::Nanos;

pub fn now() -> Nanos {
    crate::ffi::realtime()
}
