//! Pins: an operator's limit on one key (`RL.PIN`), applied by the server to every command
//! on that key whatever limit the caller sends. What a client sends and reads for them.

use std::time::Duration;

use rl_core::Limit;

/// The kind of a live pin, as the server names it (`rate`, `block`, `exempt`).
pub use rl_core::pin::PinKind;

/// What [`Limiter::pin`](crate::Limiter::pin) sets on a key.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum PinSpec {
    /// `RL.PIN key rate cap`: every command on the key decides under this limit.
    Rate(Limit),
    /// `RL.PIN key BLOCK`: every take, lease and reservation is denied.
    Block,
    /// `RL.PIN key EXEMPT`: every take, lease and reservation is granted, nothing debited.
    Exempt,
}

impl PinSpec {
    /// The kind of pin this sets.
    pub fn kind(&self) -> PinKind {
        match self {
            PinSpec::Rate(_) => PinKind::Rate,
            PinSpec::Block => PinKind::Block,
            PinSpec::Exempt => PinKind::Exempt,
        }
    }
}

/// A key's live pin, as `RL.PINNED` shows it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PinInfo {
    /// Its kind.
    pub kind: PinKind,
    /// A rate pin's limit (`None` for `Block` and `Exempt`).
    pub limit: Option<Limit>,
    /// How long it has left; `None`: until unpinned.
    pub left: Option<Duration>,
}

/// `PX ms` for a pin lasting `duration`: whole milliseconds, rounded up (a pin never ends
/// before the time asked); zero is refused, as the server refuses `PX 0`.
pub(crate) fn px_ms(duration: Duration) -> Result<u64, crate::Error> {
    if duration.is_zero() {
        return Err(crate::Error::Request("a pin's duration must be positive"));
    }
    let ms = duration.as_nanos().div_ceil(1_000_000);
    Ok(ms.min(u128::from(u64::MAX)) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_round_trip_their_names() {
        for kind in [PinKind::Rate, PinKind::Block, PinKind::Exempt] {
            assert_eq!(PinKind::parse(kind.name()), Some(kind));
        }
        assert_eq!(PinKind::parse("RATE"), None);
    }

    #[test]
    fn durations_round_up_to_a_millisecond() {
        assert_eq!(px_ms(Duration::from_micros(1)).unwrap(), 1);
        assert_eq!(px_ms(Duration::from_millis(1500)).unwrap(), 1500);
        assert!(px_ms(Duration::ZERO).is_err());
    }
}
