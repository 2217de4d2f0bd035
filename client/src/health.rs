//! Whether Redis is believed up, and who may probe it while it is believed down: the
//! client core's lock-free [`Health`](rl_client_core::health::Health) on this crate's
//! monotonic clock.

use std::time::Duration;

use rl_core::Nanos;

use crate::clock::mono_ns;

/// Down-state of one limiter's Redis: after a failure, calls decide locally until
/// `probe_interval` has passed; then one caller probes and the others stay local.
#[derive(Debug)]
pub(crate) struct Health {
    core: rl_client_core::health::Health,
}

impl Health {
    pub(crate) fn new(probe_interval: Duration) -> Health {
        let interval = probe_interval.as_nanos().min(u64::MAX as u128) as Nanos;
        Health {
            core: rl_client_core::health::Health::new(interval),
        }
    }

    /// Whether this caller should ask Redis now. While down, only the first caller past
    /// the probe instant gets `true` (it moves the instant on for the others).
    pub(crate) fn may_call(&self) -> bool {
        self.may_call_at(mono_ns())
    }

    pub(crate) fn may_call_at(&self, now: Nanos) -> bool {
        self.core.may_call(now)
    }

    /// Whether Redis is believed down right now.
    pub(crate) fn is_down(&self) -> bool {
        self.core.is_down()
    }

    /// A call failed: decide locally until the next probe.
    pub(crate) fn failed(&self) {
        self.failed_at(mono_ns());
    }

    pub(crate) fn failed_at(&self, now: Nanos) {
        self.core.failed(now);
    }

    /// A call succeeded; returns whether Redis had been down (the outage just ended).
    pub(crate) fn succeeded(&self) -> bool {
        self.core.succeeded()
    }
}
