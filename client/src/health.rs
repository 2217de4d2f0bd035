//! Whether Redis is believed up, and who may probe it while it is believed down.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::clock::mono_ns;

/// Down-state of one limiter's Redis: after a failure, calls decide locally until
/// `probe_interval` has passed; then one caller probes and the others stay local.
#[derive(Debug)]
pub(crate) struct Health {
    /// Monotonic ns until which Redis is not asked; 0 = up.
    down_until: AtomicU64,
    probe_interval: u64,
}

impl Health {
    pub(crate) fn new(probe_interval: Duration) -> Health {
        Health {
            down_until: AtomicU64::new(0),
            probe_interval: probe_interval.as_nanos().min(u64::MAX as u128) as u64,
        }
    }

    /// Whether this caller should ask Redis now. While down, only the first caller past
    /// the probe instant gets `true` (it moves the instant on for the others).
    pub(crate) fn may_call(&self) -> bool {
        self.may_call_at(mono_ns())
    }

    /// [`may_call`](Self::may_call) at monotonic instant `now`.
    fn may_call_at(&self, now: u64) -> bool {
        let until = self.down_until.load(Ordering::Acquire);
        if until == 0 {
            return true;
        }
        now >= until
            && self
                .down_until
                .compare_exchange(
                    until,
                    now.saturating_add(self.probe_interval),
                    Ordering::AcqRel,
                    Ordering::Acquire,
                )
                .is_ok()
    }

    /// Whether Redis is believed down right now.
    pub(crate) fn is_down(&self) -> bool {
        self.down_until.load(Ordering::Acquire) != 0
    }

    /// A call failed: decide locally until the next probe.
    pub(crate) fn failed(&self) {
        self.failed_at(mono_ns());
    }

    /// [`failed`](Self::failed) at monotonic instant `now`.
    fn failed_at(&self, now: u64) {
        let next = now.saturating_add(self.probe_interval);
        self.down_until.store(next, Ordering::Release);
    }

    /// A call succeeded; returns whether Redis had been down (the outage just ended).
    pub(crate) fn succeeded(&self) -> bool {
        self.down_until.swap(0, Ordering::AcqRel) != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_probe_per_interval() {
        const MS: u64 = 1_000_000;
        let t0 = 1_000 * MS;
        let h = Health::new(Duration::from_millis(20));
        assert!(h.may_call_at(t0));
        h.failed_at(t0);
        assert!(h.is_down());
        assert!(!h.may_call_at(t0 + 19 * MS));
        assert!(
            h.may_call_at(t0 + 20 * MS),
            "first caller after the interval probes"
        );
        assert!(!h.may_call_at(t0 + 20 * MS), "the others stay local");
        assert!(!h.may_call_at(t0 + 39 * MS));
        assert!(h.may_call_at(t0 + 40 * MS), "one probe per interval");
        assert!(h.succeeded());
        assert!(h.may_call_at(t0 + 40 * MS));
        assert!(!h.succeeded());
    }
}
