//! The arithmetic of redis-rl, with no Redis and no clock.
//!
//! Time enters every function as a number ([`Nanos`], nanoseconds since the Unix epoch read
//! by the caller), so everything here is deterministic and tested without a server. The
//! Redis module is thin glue over this crate, and a client can run the same math locally.
//!
//! A bucket is stored as the instant it will be full again (`full_at`, the "theoretical
//! arrival time" of GCRA) plus the limit it was written under. That is the token count and
//! its timestamp folded into one number: `tokens(now) = cap - (full_at - now) * rate`. It
//! keeps a bucket small, and "the key expires when the bucket is full" is just
//! `PEXPIREAT full_at`.

pub mod adopt;
mod bucket;
pub mod budget;
pub mod bytes;
mod lease;
mod limit;
pub mod namespace;
mod permits;
pub mod pin;
pub mod round;
pub mod share;
mod state;
pub mod top;
pub mod version;

pub use bucket::{expiry_ms, take_all, AllOrNothing, Bucket, Level, NEVER};
pub use lease::{
    Lease, LeaseError, LeaseOutcome, LeasePlan, LeaseRequest, LeaseTable, Settled, MAX_LEASES,
    NO_LEASES,
};
pub use limit::{Limit, LimitError, MAX_FILL_SECS, MAX_VALUE, MIN_VALUE};
pub use permits::{Acquired, Permit, PermitError, PermitPin, PermitTable, MAX_PERMITS};
pub use share::{Holder, ShareError, SharePin, ShareReply, ShareRequest, ShareTable, MAX_HOLDERS};
pub use state::{validate, validate_moved, validate_pin, PinParts, StateError};
pub use version::{Applied, MAX_VERSION};

/// A point in time: nanoseconds since the Unix epoch, as read by the caller.
pub type Nanos = u64;

/// Nanoseconds per second, as a float for rate arithmetic.
pub const NANOS_PER_SEC: f64 = 1e9;

/// Rounds a duration up to whole milliseconds (a client that waits that long is not early).
pub fn ceil_millis(ns: Nanos) -> u64 {
    ns.div_ceil(1_000_000)
}
