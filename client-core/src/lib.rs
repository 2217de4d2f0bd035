//! The client decisions of redis-rl, with no I/O: nothing here opens a connection, waits,
//! spawns or reads a clock (time, where a decision needs it, is passed in). A shell (the
//! Rust client over tokio and redis-rs, the Python package over redis-py through PyO3, a
//! JavaScript package through napi-rs) moves the bytes and fits its language; what a
//! request gets is decided here, once. The model: quinn-proto and rustls under their
//! shells.
//!
//! - [`limits`]: limit strings (`"10/second;500/minute, burst 20"`).
//! - [`commands`]: `RL.TAKE` with its options and `RL.RESERVE` for both backends, and the
//!   replies of `RL.RESERVE`, `RL.ACQUIRE` and `RL.PEEK`.
//! - [`reply`]: a reply as any Redis client hands it over, and the one error a malformed
//!   reply is ([`ProtocolError`]).
//! - [`budget`]: token budgets (`RL.BUDGET` / `RL.SETTLE`): the commands for the module and
//!   the Functions library, their replies, the reservation a caller holds and its counters.
//! - [`openai`]: what a budget reserves for an OpenAI-compatible chat completion and what it
//!   settles (the estimate from the request, the usage from the reply or its stream).
//! - [`fallback`], [`health`], [`meter`]: a limiter's failure policy (the local buckets per
//!   key while Redis is away, who may probe it, the rate Redis was granting), for every
//!   shell's limiters.
//! - [`lease`] and [`prefetch`]: the lease commands (`RL.LEASE`, `RL.RETURN`) and the
//!   prefetch ledger (the leases a `PrefetchLimiter` holds, when it renews, what a landed
//!   or failed call leaves, the late-reply bound, the waiting line).
//! - [`token_budget`]: a token budget's decisions (its named limits and buckets, costs,
//!   the failure policy's local buckets, settles), for every shell's `TokenBudget`.
//! - [`permit`]: the semaphore's failure policy (the local permits while Redis is away).
//! - [`rules_doc`] (read by [`rules_yaml`], which keeps every node's line): a rules
//!   document validated with the line and field of every problem, and a request's plan;
//!   [`rules`]: one check of it (`RL.MTAKE` calls out, replies in, a decision and refunds).
//! - [`share`], [`share_demand`], [`share_holder`]: a share of a key's rate (`RL.SHARE`):
//!   its command and reply, the local bucket, when a share may be used, the failure
//!   policy's share, the demand reported, and the holder every shell's `ShareLimiter` wraps.

pub mod budget;
pub mod commands;
pub mod fallback;
pub mod health;
pub mod lease;
pub mod limits;
pub mod meter;
pub mod openai;
pub mod permit;
pub mod prefetch;
pub mod reply;
pub mod rules;
pub mod rules_doc;
pub mod rules_yaml;
pub mod share;
pub mod share_demand;
pub mod share_holder;
pub mod take;
pub mod token_budget;

pub use reply::{ProtocolError, Reply};

/// What a panic said (its `&str` or `String` payload), for the shells' guards: each turns a
/// panic at its boundary into its language's error with this message, never an abort.
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_owned())
}
