//! Observation: what the module tells about the calls it decides, never part of a decision.
//! The `INFO rl` counters ([`stats`]), the per-namespace counters and `RL.STATS`
//! ([`namespaces`], [`rl_stats`]), the most-denied keys and `RL.TOP` ([`top`]), and
//! `CONFIG RESETSTAT` resetting them ([`resetstat`]).

pub mod eviction;
pub mod namespaces;
pub mod resetstat;
pub mod rl_stats;
pub mod stats;
pub mod top;

/// Sets up what observation needs at load.
pub fn init() {
    top::init();
}

/// Forgets every count (`CONFIG RESETSTAT`), but the gauges.
pub fn reset() {
    stats::reset();
    namespaces::reset();
    top::clear();
}
