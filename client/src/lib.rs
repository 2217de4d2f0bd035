//! Async Rust client for the redis-rl module: a distributed token bucket as native Redis
//! commands (`RL.TAKE`, `RL.LEASE`, `RL.RESERVE`, `RL.ACQUIRE`...).
//!
//! - [`Limiter`]: one `RL.TAKE ... WITHSTATE` call per request; any number of keys under
//!   one limit. Its [`Decision`] carries what an HTTP 429 needs
//!   ([`Decision::http_headers`]). [`Limiter::reserve`] waits in line instead of being
//!   denied (`RL.RESERVE`), [`Limiter::refund`] gives unused tokens back.
//!   [`Limiter::pin`] sets an operator's pin on a key (`RL.PIN`: a rate, a block or an
//!   exemption that every client's calls on it obey); [`Decision::pinned`] says when one
//!   decided.
//! - [`PrefetchLimiter`]: leases tokens in batches and grants locally, renewing ahead with
//!   jitter, honouring lease expiry and returning leftovers.
//! - [`Semaphore`]: at most `limit` calls in flight per key, fleet-wide; its [`Permit`]
//!   guard releases on drop and renews while held, and expires if its holder dies.
//! - [`ShareLimiter`]: one hot key shared by a fleet: each instance holds a rate share
//!   (`RL.SHARE`) and decides every take locally, never waiting for Redis.
//! - [`TokenBudget`]: reserve a call's estimate on several limits at once (`RL.BUDGET`),
//!   settle the actual (`RL.SETTLE`): an LLM provider's tokens and requests per minute,
//!   shared by a fleet (docs/budgets.md).
//! - [`KeyedPrefetcher`]: one prefetching limiter per key, made on first use, for many keys
//!   under one limit.
//! - All take a [`FailurePolicy`] for outages (Redis unreachable, or slower than the
//!   timeout every call has), count everything in [`Metrics`], and recover when Redis
//!   answers again. Error replies are returned, never turned into grants: see the README's
//!   "What a client guarantees under cancellation, errors and outages".
//!
//! The connection is any [`RedisConnection`]: a single-node
//! [`redis::aio::ConnectionManager`] or [`redis::aio::MultiplexedConnection`], or a
//! [`redis::cluster_async::ClusterConnection`], or a [`LazyConnection`] (what the
//! `from_client` constructors use), which needs no server to be created, so a service can
//! start while Redis is down. This crate does not build the module.

#![warn(missing_docs)]

mod backend;
mod budget;
mod clock;
mod config;
mod conn;
mod decision;
mod error;
mod fallback;
mod health;
mod jitter;
mod keyed;
mod lazy;
mod limiter;
/// Limit strings: the client core's ([`rl_client_core::limits`]), re-exported here.
pub use rl_client_core::limits;
mod metrics;
mod permit;
mod pin;
mod prefetch;
mod protocol;
pub mod rules;
mod share;

pub use backend::Backend;
pub use budget::{BudgetConfig, BudgetReservation, TokenBudget};
pub use config::{limit, FailurePolicy, LimiterConfig, PrefetchConfig, DEFAULT_INSTANCES};
pub use conn::RedisConnection;
pub use decision::{Decision, Reservation, Source};
pub use error::Error;
pub use keyed::KeyedPrefetcher;
pub use lazy::{LazyConfig, LazyConnection};
pub use limiter::Limiter;
pub use limits::{parse_limit, parse_limits, LimitSpec, LimitStringError};
pub use metrics::{Metrics, MetricsSnapshot, LATENCY_BUCKETS_US};
pub use permit::{Busy, Permit, Semaphore};
pub use pin::{PinInfo, PinKind, PinSpec};
pub use prefetch::PrefetchLimiter;
pub use rl_core::{Limit, LimitError};
pub use rules::{RuleDecision, Rules, RulesConfig, RulesError};
pub use share::{ShareConfig, ShareInfo, ShareLimiter};

/// A redis-rs reply as the client core reads it (the conversion every reply of this client
/// goes through), for the golden state-machine cases run through this shell
/// (`tests/prefetch_cases.rs`). Not part of the API.
#[doc(hidden)]
pub fn __core_reply(v: redis::Value) -> rl_client_core::Reply {
    budget::to_reply(v)
}

/// The redis crate this client is built on, for building connections of the same version.
pub use redis;
