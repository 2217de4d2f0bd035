//! Whether Redis is believed up, and who may probe it while it is believed down.
//!
//! Lock-free (one atomic, no lock a fork could leave held), so every shell can share one
//! `Health` between its threads as is; time is passed in (nanoseconds on the shell's
//! monotonic clock, never 0: 0 means up).

use std::sync::atomic::{AtomicU64, Ordering};

use rl_core::Nanos;

/// Down-state of one limiter's Redis: after a failure, calls decide locally until
/// `probe_interval` has passed; then one caller probes and the others stay local.
#[derive(Debug)]
pub struct Health {
    /// The instant until which Redis is not asked; 0 = up.
    down_until: AtomicU64,
    probe_interval: Nanos,
}

impl Health {
    pub fn new(probe_interval: Nanos) -> Health {
        Health {
            down_until: AtomicU64::new(0),
            probe_interval,
        }
    }

    /// Whether a caller at `now` should ask Redis. While down, only the first caller past
    /// the probe instant gets `true` (it moves the instant on for the others).
    pub fn may_call(&self, now: Nanos) -> bool {
        let until = self.down_until.load(Ordering::Acquire);
        if until == 0 {
            return true;
        }
        now >= until
            && self
                .down_until
                .compare_exchange(
                    until,
                    self.next_probe(now),
                    Ordering::AcqRel,
                    Ordering::Acquire,
                )
                .is_ok()
    }

    /// Whether Redis is believed down right now.
    pub fn is_down(&self) -> bool {
        self.down_until() != 0
    }

    /// The instant of the next probe (0: up).
    pub fn down_until(&self) -> Nanos {
        self.down_until.load(Ordering::Acquire)
    }

    /// A call failed at `now` (an outage): decide locally until the next probe.
    pub fn failed(&self, now: Nanos) {
        self.down_until
            .store(self.next_probe(now), Ordering::Release);
    }

    /// A call succeeded; returns whether Redis had been down (the outage just ended).
    pub fn succeeded(&self) -> bool {
        // A plain load first: the common case (up) writes nothing shared.
        self.down_until.load(Ordering::Acquire) != 0
            && self.down_until.swap(0, Ordering::AcqRel) != 0
    }

    /// The probe instant after `now`: never 0, which would read as up.
    fn next_probe(&self, now: Nanos) -> Nanos {
        now.saturating_add(self.probe_interval).max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn one_probe_per_interval() {
        let t0 = 1_000 * MS;
        let h = Health::new(20 * MS);
        assert!(h.may_call(t0));
        h.failed(t0);
        assert!(h.is_down());
        assert!(!h.may_call(t0 + 19 * MS));
        assert!(
            h.may_call(t0 + 20 * MS),
            "first caller after the interval probes"
        );
        assert!(!h.may_call(t0 + 20 * MS), "the others stay local");
        assert!(!h.may_call(t0 + 39 * MS));
        assert!(h.may_call(t0 + 40 * MS), "one probe per interval");
        assert!(h.succeeded());
        assert!(h.may_call(t0 + 40 * MS));
        assert!(!h.succeeded());
    }

    #[test]
    fn extremes_stay_down_until_a_probe() {
        let h = Health::new(0);
        h.failed(0);
        assert!(h.is_down(), "a failure at instant 0 is still an outage");
        assert!(h.may_call(1));
        let h = Health::new(u64::MAX);
        h.failed(5);
        assert_eq!(h.down_until(), u64::MAX);
        assert!(!h.may_call(u64::MAX - 1));
        assert!(h.may_call(u64::MAX));
    }

    #[test]
    fn threads_race_for_one_probe() {
        let h = std::sync::Arc::new(Health::new(10 * MS));
        h.failed(MS);
        let probes: usize = (0..8)
            .map(|_| {
                let h = h.clone();
                std::thread::spawn(move || (0..1000).filter(|_| h.may_call(20 * MS)).count())
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|t| t.join().unwrap())
            .sum();
        assert_eq!(probes, 1);
    }
}
