//! `CONFIG RESETSTAT` resets the module's counters too, as it does Redis's own.
//!
//! No server event reports it (the module API has none: see the event list in
//! `redismodule.h`, Redis 7.0 to 8.2 and Valkey 9), so a command filter notices the
//! command, and the reset is confirmed from Redis's own statistics before the module's
//! counters go. A reset that ran leaves `cmdstat_config|resetstat` at exactly one call
//! (every command's statistics are zeroed, then that call is counted), with a `usec` of
//! its own; one that ACL refused or that a `MULTI` never executed leaves it as it was.
//! (`total_commands_processed` dropping confirms it too.) The check runs in the filter of the
//! next command (any command), and before the next module command and `INFO`, so no count
//! made after the reset is lost and no reset is overwritten by the next one.
//!
//! A reset that was not confirmed at the next command was refused, or queued in a `MULTI`:
//! it stays armed for `EXEC` alone (which runs the queued one however late it comes), so
//! other commands do not each pay for reading Redis's statistics meanwhile.

use crate::ffi::{self, Filter};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// `total_commands_processed + 1` when the filter saw `CONFIG RESETSTAT` (0: none pending).
pub static PENDING: AtomicU64 = AtomicU64::new(0);
/// `cmdstat_config|resetstat` (calls, usec) when the filter saw it.
static SEEN_CALLS: AtomicU64 = AtomicU64::new(0);
static SEEN_USEC: AtomicU64 = AtomicU64::new(0);

/// `calls` and `usec` of `cmdstat_config|resetstat` (0, 0 before any call).
fn resetstat_stats() -> Option<(u64, u64)> {
    ffi::server_info_text(c"commandstats", c"cmdstat_config|resetstat", |text| {
        let field = |name: &str| -> u64 {
            text.and_then(|t| {
                t.split(',')
                    .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
                    .and_then(|v| v.parse().ok())
            })
            .unwrap_or(0)
        };
        (field("calls"), field("usec"))
    })
}

/// A reset not confirmed at the next command (its `PENDING` value, 0: none): checked again
/// at each `EXEC`, until it is confirmed or another `CONFIG RESETSTAT` replaces it.
static AT_EXEC: AtomicU64 = AtomicU64::new(0);

fn commands_processed() -> Option<u64> {
    ffi::server_info_u64(c"stats", c"total_commands_processed")
}

/// The command filter: every command passes through (a few instructions for all but
/// `CONFIG RESETSTAT`).
///
/// A reset still pending is settled first, at the next command after it: one `CONFIG
/// RESETSTAT` right after another would otherwise replace the first's record before it was
/// confirmed, and the second alone cannot always be told from a refused one (both leave
/// `calls=1`).
pub fn filter(f: &Filter) {
    if PENDING.load(Relaxed) != 0 {
        check();
        // Not confirmed at the command after it: refused, or queued in a `MULTI`.
        let pending = PENDING.swap(0, Relaxed);
        if pending != 0 {
            AT_EXEC.store(pending, Relaxed);
        }
    }
    let is = |i: usize, want: &[u8]| f.arg(i).is_some_and(|a| a.eq_ignore_ascii_case(want));
    let at_exec = AT_EXEC.load(Relaxed);
    if at_exec != 0 && f.len() == 1 && is(0, b"exec") {
        // Armed for the commands `EXEC` runs and the one after it.
        PENDING.store(at_exec, Relaxed);
        return;
    }
    if f.len() != 2 || !is(0, b"config") || !is(1, b"resetstat") {
        return;
    }
    if let (Some(v), Some((calls, usec))) = (commands_processed(), resetstat_stats()) {
        SEEN_CALLS.store(calls, Relaxed);
        SEEN_USEC.store(usec, Relaxed);
        PENDING.store(v + 1, Relaxed);
        AT_EXEC.store(0, Relaxed);
    }
}

/// Resets the module's counters if Redis's were reset since the filter saw the command.
pub fn check() {
    let pending = PENDING.load(Relaxed);
    if pending == 0 {
        return;
    }
    let (Some(now), Some((calls, usec))) = (commands_processed(), resetstat_stats()) else {
        return;
    };
    let (seen_calls, seen_usec) = (SEEN_CALLS.load(Relaxed), SEEN_USEC.load(Relaxed));
    let ran = calls == 1 && (seen_calls != 1 || usec != seen_usec);
    if ran || now < pending - 1 {
        PENDING.store(0, Relaxed);
        AT_EXEC.store(0, Relaxed);
        super::reset();
    }
}
