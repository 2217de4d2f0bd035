//! Limit strings (`"5/minute"`, `"10/second;500/minute, burst 20"`): the client core's
//! parser, so every client reads a limit string the same way, message for message.

use napi_derive::napi;

use crate::guard::{guarded, invalid};

/// One limit of a limit string.
#[napi(object)]
pub struct LimitSpec {
    /// Tokens per period.
    pub amount: f64,
    /// The period in seconds.
    pub period_secs: f64,
    /// The burst: `amount` unless a burst was given.
    pub cap: f64,
    /// Tokens per second.
    pub rate: f64,
}

/// Every limit of `text`, or an `Error` saying what is wrong and how to write it.
#[napi]
pub fn parse_limits(text: String) -> napi::Result<Vec<LimitSpec>> {
    guarded(|| {
        rl_client_core::limits::parse_limits(&text)
            .map(|limits| {
                limits
                    .iter()
                    .map(|l| LimitSpec {
                        amount: l.amount,
                        period_secs: l.period_secs,
                        cap: l.cap,
                        rate: l.rate(),
                    })
                    .collect()
            })
            .map_err(|e| invalid(e.to_string()))
    })
}
