//! The token bucket type (`rl-bucket`): how a bucket is kept in a key ([`key`], [`stored`]),
//! persisted ([`datatype`]), replicated ([`effect`]), adopted from the classic script's
//! hash ([`adopt`]), and the commands that work on it. The write commands run through
//! [`crate::pipeline`].

pub mod adopt;
pub mod budget;
pub mod datatype;
pub mod effect;
pub mod groups;
pub mod key;
pub mod lease;
pub mod mtake;
pub mod peek;
pub mod pin;
pub mod refund;
pub mod reserve;
pub mod return_lease;
pub mod setstate;
pub mod settle;
pub mod stored;
pub mod take;
