//! The server's wall clock, read once per command.
//!
//! `RedisModule_Microseconds` does not exist on Redis 7.0, so this reads `CLOCK_REALTIME`
//! directly (a vDSO call, no syscall). Wall time, not monotonic time, because the stored
//! instants must mean the same thing on a replica promoted after a failover.

use rl_core::Nanos;

pub fn now() -> Nanos {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer; CLOCK_REALTIME always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
    (ts.tv_sec.max(0) as u64) * 1_000_000_000 + ts.tv_nsec.max(0) as u64
}
