//! The one rule for what a stored bucket may hold.
//!
//! A state enters the keyspace two ways: a command writes it (`RL.SETSTATE`, the effect
//! replicas and the AOF apply, is the most general), and RDB load reads it (a restart, a
//! full sync, `RESTORE`, `MIGRATE`). If the first accepted something the second refuses, a
//! client could write a key that breaks every later reload, sync and migration. So both
//! call [`validate`] on the complete resulting state, and nothing else decides.

use crate::bucket::MAX_INSTANT;
use crate::{Bucket, Lease, LeaseTable, Limit, LimitError, Nanos, MAX_LEASES, MAX_VERSION};

/// Why a state was refused. The texts are the user-facing error messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateError {
    Limit(LimitError),
    FullAt,
    Hold,
    TooManyLeases,
    LeaseId,
    LeaseOrder,
    LeaseTokens,
    LeaseExpiry,
    HeldTotal,
    LastId,
    Version,
    PinKind,
    PinUntil,
    PinBase,
    PinAbsent,
}

impl StateError {
    pub fn message(self) -> &'static str {
        match self {
            StateError::Limit(e) => e.message(),
            StateError::FullAt => "full_at must be at most 9223372036854775807",
            StateError::Hold => "HOLD and SPAN must be at most 9223372036854775807",
            StateError::TooManyLeases => "too many live leases on this key (at most 1024)",
            StateError::LeaseId => "lease ids must be between 1 and the key's last id",
            StateError::LeaseOrder => "lease ids must be unique",
            StateError::LeaseTokens => "a lease must hold at least 1 token",
            StateError::LeaseExpiry => "lease expiry must be at most 9223372036854775807",
            StateError::HeldTotal => "leases may hold at most 9223372036854775807 tokens in all",
            StateError::LastId => "the last lease id must be at most 9223372036854775807",
            StateError::Version => "VERSION must be an integer from 0 to 9007199254740991",
            StateError::PinKind => "the pin kind must be 1 (rate), 2 (block) or 3 (exempt)",
            StateError::PinUntil => "the pin's end must be at most 9223372036854775807",
            StateError::PinBase => {
                "a block or exempt pin's base limit must be its bucket's own limit"
            }
            StateError::PinAbsent => {
                "a pin over an absent bucket must be on a full bucket without leases, hold or version, of limit 1 1 (block, exempt) or of the pin's own limit (rate)"
            }
        }
    }
}

impl std::fmt::Display for StateError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.message())
    }
}

impl std::error::Error for StateError {}

/// Largest number a stored field may hold: Redis replies and effects carry signed 64-bit
/// integers.
const MAX_FIELD: u64 = i64::MAX as u64;

/// A bucket and its lease table from their parts, if this module could have written them:
/// a valid limit, `full_at` within range, at most [`MAX_LEASES`] leases with ids in
/// `1..=last_id` ascending, each holding at least one token, their total and every number
/// within `i64`, and a limit version of at most [`MAX_VERSION`].
#[allow(clippy::too_many_arguments)]
pub fn validate(
    full_at: Nanos,
    rate: f64,
    cap: f64,
    keep_until: Nanos,
    keep_after_write: Nanos,
    version: u64,
    last_id: u64,
    leases: Vec<Lease>,
) -> Result<(Bucket, LeaseTable), StateError> {
    let limit = Limit::new(rate, cap).map_err(StateError::Limit)?;
    if full_at > MAX_INSTANT {
        return Err(StateError::FullAt);
    }
    if keep_until > MAX_INSTANT || keep_after_write > MAX_INSTANT {
        return Err(StateError::Hold);
    }
    if version > MAX_VERSION {
        return Err(StateError::Version);
    }
    if last_id > MAX_FIELD {
        return Err(StateError::LastId);
    }
    if leases.len() > MAX_LEASES {
        return Err(StateError::TooManyLeases);
    }
    let mut held: u64 = 0;
    for (i, l) in leases.iter().enumerate() {
        if l.id == 0 || l.id > last_id {
            return Err(StateError::LeaseId);
        }
        if i > 0 && leases[i - 1].id >= l.id {
            return Err(StateError::LeaseOrder);
        }
        if l.tokens == 0 {
            return Err(StateError::LeaseTokens);
        }
        if l.expires_at > MAX_FIELD {
            return Err(StateError::LeaseExpiry);
        }
        held = held
            .checked_add(l.tokens)
            .filter(|&h| h <= MAX_FIELD)
            .ok_or(StateError::HeldTotal)?;
    }
    Ok((
        Bucket::with_keep(full_at, limit, keep_until, keep_after_write).with_version(version),
        LeaseTable::from_validated(last_id, leases),
    ))
}

/// A pin as stored: its kind's code, its end (0: none), the limit it returns the bucket to,
/// and whether the key holds nothing under it (see [`crate::pin::Pin`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PinParts {
    pub kind: u64,
    pub until: Nanos,
    pub base_rate: f64,
    pub base_cap: f64,
    pub absent: bool,
}

impl From<crate::pin::Pin> for PinParts {
    fn from(p: crate::pin::Pin) -> PinParts {
        PinParts {
            kind: p.kind.code(),
            until: p.until,
            base_rate: p.base.rate(),
            base_cap: p.base.cap(),
            absent: p.absent,
        }
    }
}

/// `bucket` (a valid one, with its lease table `table`) full at `full_at` and kept until
/// `keep_until` instead, if this module could have written it: every other part stays, and
/// the whole is checked as [`validate`] and [`validate_pin`] check a state given in full.
pub fn validate_moved(
    bucket: &Bucket,
    table: &LeaseTable,
    full_at: Nanos,
    keep_until: Nanos,
) -> Result<Bucket, StateError> {
    let limit = bucket.limit();
    let (moved, _) = validate(
        full_at,
        limit.rate(),
        limit.cap(),
        keep_until,
        bucket.keep_after_write(),
        bucket.version(),
        0,
        Vec::new(),
    )?;
    match bucket.pin() {
        Some(p) => validate_pin(moved, table, p.into()),
        None => Ok(moved),
    }
}

/// `bucket` (from [`validate`], with its lease table `table`) pinned as `parts` says, if
/// this module could have written it.
pub fn validate_pin(
    bucket: Bucket,
    table: &LeaseTable,
    parts: PinParts,
) -> Result<Bucket, StateError> {
    use crate::pin::{Pin, PinKind};
    let kind = PinKind::from_code(parts.kind).ok_or(StateError::PinKind)?;
    if parts.until > MAX_INSTANT {
        return Err(StateError::PinUntil);
    }
    let base = Limit::new(parts.base_rate, parts.base_cap).map_err(StateError::Limit)?;
    if parts.absent {
        // A key that holds only the pin (`pin::pinned` on no bucket): a block or exempt
        // pin on the placeholder limit 1 1, a rate pin on its own limit (bucket and base).
        let placeholder = Limit::new(1.0, 1.0).map_err(StateError::Limit)?;
        let limit = if kind == PinKind::Rate {
            base
        } else {
            placeholder
        };
        let bare = bucket.full_at() == 0
            && bucket.limit() == limit
            && base == limit
            && table.is_empty()
            && table.last_id() == 0
            && bucket.keep_until() == 0
            && bucket.keep_after_write() == 0
            && bucket.version() == 0;
        if !bare {
            return Err(StateError::PinAbsent);
        }
    } else if kind != PinKind::Rate && base != bucket.limit() {
        return Err(StateError::PinBase);
    }
    Ok(bucket.with_pin(Some(Pin {
        kind,
        until: parts.until,
        base,
        absent: parts.absent,
    })))
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: Nanos = 1_700_000_000_000_000_000;

    fn l(id: u64, tokens: u64) -> Lease {
        Lease {
            id,
            tokens,
            expires_at: T0,
        }
    }

    #[test]
    fn accepts_what_the_module_writes() {
        assert!(validate(T0, 1.0, 10.0, 0, 0, 0, 0, vec![]).is_ok());
        assert!(validate(T0, 1.0, 10.0, 0, 0, 0, 5, vec![l(1, 1), l(5, 3)]).is_ok());
        let many: Vec<_> = (1..=MAX_LEASES as u64).map(|i| l(i, 1)).collect();
        assert!(validate(T0, 1.0, 10.0, 0, 0, 0, MAX_LEASES as u64, many).is_ok());
    }

    #[test]
    fn refuses_what_it_cannot() {
        let e = |r: Result<_, StateError>| r.err();
        assert_eq!(
            e(validate(T0, f64::NAN, 1.0, 0, 0, 0, 0, vec![])),
            Some(StateError::Limit(LimitError::Rate))
        );
        assert_eq!(
            e(validate(u64::MAX, 1.0, 1.0, 0, 0, 0, 0, vec![])),
            Some(StateError::FullAt)
        );
        assert_eq!(
            e(validate(T0, 1.0, 1.0, 0, 0, 0, 9, vec![l(0, 5)])),
            Some(StateError::LeaseId)
        );
        assert_eq!(
            e(validate(T0, 1.0, 1.0, 0, 0, 0, 4, vec![l(5, 5)])),
            Some(StateError::LeaseId)
        );
        assert_eq!(
            e(validate(T0, 1.0, 1.0, 0, 0, 0, 9, vec![l(5, 1), l(5, 1)])),
            Some(StateError::LeaseOrder)
        );
        assert_eq!(
            e(validate(T0, 1.0, 1.0, 0, 0, 0, 9, vec![l(5, 0)])),
            Some(StateError::LeaseTokens)
        );
        assert_eq!(
            e(validate(
                T0,
                1.0,
                1.0,
                0,
                0,
                0,
                9,
                vec![l(1, i64::MAX as u64), l(2, 1)]
            )),
            Some(StateError::HeldTotal)
        );
        assert_eq!(
            e(validate(T0, 1.0, 1.0, 0, 0, 0, u64::MAX, vec![])),
            Some(StateError::LastId)
        );
        assert_eq!(
            e(validate(T0, 1.0, 1.0, u64::MAX, 0, 0, 0, vec![])),
            Some(StateError::Hold)
        );
        assert_eq!(
            e(validate(T0, 1.0, 1.0, 0, 0, MAX_VERSION + 1, 0, vec![])),
            Some(StateError::Version)
        );
        let ok = validate(T0, 1.0, 1.0, 0, 0, MAX_VERSION, 0, vec![]).unwrap();
        assert_eq!(ok.0.version(), MAX_VERSION);
        let many: Vec<_> = (1..=MAX_LEASES as u64 + 1).map(|i| l(i, 1)).collect();
        assert_eq!(
            e(validate(T0, 1.0, 10.0, 0, 0, 0, 2000, many)),
            Some(StateError::TooManyLeases)
        );
    }
}
