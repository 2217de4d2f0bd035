//! Permits: a distributed semaphore whose permits expire, so a crashed holder frees its
//! slot after its TTL. `RL.ACQUIRE` / `RL.RELEASE` / `RL.RENEW`.
//!
//! A key holds the live permits (id and expiry), ids ascending, at most [`MAX_PERMITS`].
//! The limit is an argument of each `RL.ACQUIRE` (like a bucket's rate and cap), so a
//! config change needs no command of its own.

use crate::pin::{PinKind, BLOCKED_RETRY};
use crate::Nanos;

/// Most permits one key may hold: far above any real limit of concurrent calls to one
/// downstream.
pub const MAX_PERMITS: usize = 10_000;

/// Largest number a stored field may hold (Redis integers are signed 64-bit).
const MAX_FIELD: u64 = i64::MAX as u64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Permit {
    /// Unique within the key while it lives, never reused (ids follow the clock).
    pub id: u64,
    /// The permit frees itself at this instant.
    pub expires_at: Nanos,
}

/// What `RL.ACQUIRE` decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Acquired {
    /// A permit was granted.
    Granted(Permit),
    /// `limit` permits are live: the earliest frees itself in `retry_after` (or a `BLOCK`
    /// pin refuses: its time left, or [`BLOCKED_RETRY`]).
    Denied { retry_after: Nanos },
    /// An `EXEMPT` pin lets the call through: nothing is recorded (permit id 0).
    Exempt,
}

/// An operator's pin on a semaphore key (`RL.PIN key PERMITS n|BLOCK|EXEMPT [PX ms]`):
/// `Rate` here means "at most `limit` permits", whatever limit the callers send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PermitPin {
    pub kind: PinKind,
    /// The pinned limit (`Rate`); 0 for `BLOCK` and `EXEMPT`.
    pub limit: u64,
    /// When it ends (0: at `RL.UNPIN`).
    pub until: Nanos,
}

impl PermitPin {
    pub fn live_at(&self, now: Nanos) -> bool {
        self.until == 0 || now < self.until
    }
}

/// Why a permit table or request was refused. The texts are the user-facing messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PermitError {
    TooMany,
    IdsExhausted,
    Id,
    Order,
    Expiry,
    LastId,
    Empty,
    PinLimit,
    PinUntil,
}

impl PermitError {
    pub fn message(self) -> &'static str {
        match self {
            PermitError::TooMany => "too many permits on this key (at most 10000)",
            PermitError::IdsExhausted => "no permit id left on this key",
            PermitError::Id => "permit ids must be between 1 and the key's last id",
            PermitError::Order => "permit ids must be unique",
            PermitError::Expiry => "permit expiry must be at most 9223372036854775807",
            PermitError::LastId => "the last permit id must be at most 9223372036854775807",
            PermitError::Empty => "a permit key holds at least one permit (or a pin)",
            PermitError::PinLimit => {
                "a PERMITS pin's limit must be 1 to 10000 (0 for BLOCK and EXEMPT)"
            }
            PermitError::PinUntil => "the pin's end must be at most 9223372036854775807",
        }
    }
}

/// The permits of one key.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PermitTable {
    last_id: u64,
    permits: Vec<Permit>,
    pin: Option<PermitPin>,
}

impl PermitTable {
    /// A table from stored parts (RDB, an effect), if this module could have written them:
    /// the one check both use.
    ///
    /// A stored table holds at least one permit: a key whose last permit goes is deleted,
    /// so an empty one is nothing a command leaves (and nothing an AOF rewrite rebuilds).
    pub fn validate(last_id: u64, permits: Vec<Permit>) -> Result<PermitTable, PermitError> {
        PermitTable::validate_pinned(last_id, permits, None)
    }

    /// [`PermitTable::validate`] for a table that may hold a pin: then it may hold no
    /// permit (a key pinned before anyone used it, or whose permits all went).
    pub fn validate_pinned(
        last_id: u64,
        permits: Vec<Permit>,
        pin: Option<PermitPin>,
    ) -> Result<PermitTable, PermitError> {
        if last_id > MAX_FIELD {
            return Err(PermitError::LastId);
        }
        if let Some(p) = pin {
            let limit_ok = match p.kind {
                PinKind::Rate => (1..=MAX_PERMITS as u64).contains(&p.limit),
                PinKind::Block | PinKind::Exempt => p.limit == 0,
            };
            if !limit_ok {
                return Err(PermitError::PinLimit);
            }
            if p.until > MAX_FIELD {
                return Err(PermitError::PinUntil);
            }
        }
        if permits.is_empty() && pin.is_none() {
            return Err(PermitError::Empty);
        }
        if permits.len() > MAX_PERMITS {
            return Err(PermitError::TooMany);
        }
        for (i, p) in permits.iter().enumerate() {
            if p.id == 0 || p.id > last_id {
                return Err(PermitError::Id);
            }
            if i > 0 && permits[i - 1].id >= p.id {
                return Err(PermitError::Order);
            }
            if p.expires_at > MAX_FIELD {
                return Err(PermitError::Expiry);
            }
        }
        Ok(PermitTable {
            last_id,
            permits,
            pin,
        })
    }

    /// Its pin, live or ended.
    pub fn pin(&self) -> Option<PermitPin> {
        self.pin
    }

    /// Its pin if it still governs at `now`.
    pub fn live_pin(&self, now: Nanos) -> Option<PermitPin> {
        self.pin.filter(|p| p.live_at(now))
    }

    /// Sets (or removes) its pin.
    pub fn set_pin(&mut self, pin: Option<PermitPin>) {
        self.pin = pin;
    }

    /// When the key may go: its last permit's expiry, not before a pin ends, never while a
    /// pin without an end holds ([`crate::NEVER`]); `None` for a key that holds nothing.
    pub fn expires_at(&self) -> Option<Nanos> {
        let permits = self.last_expiry();
        match self.pin {
            None => permits,
            Some(p) if p.until == 0 => Some(crate::NEVER),
            Some(p) => Some(permits.unwrap_or(0).max(p.until)),
        }
    }

    /// Whether the key holds anything at `now` that keeps it: a permit, or a live pin.
    pub fn holds_anything(&self, now: Nanos) -> bool {
        !self.permits.is_empty() || self.live_pin(now).is_some()
    }

    pub fn last_id(&self) -> u64 {
        self.last_id
    }

    /// Permits recorded, ids ascending (some may have expired since the last write).
    pub fn permits(&self) -> &[Permit] {
        &self.permits
    }

    /// Permits live at `now`.
    pub fn in_use(&self, now: Nanos) -> usize {
        self.permits.iter().filter(|p| p.expires_at > now).count()
    }

    /// When the last permit expires (the key's expiry), or `None` if there is none.
    pub fn last_expiry(&self) -> Option<Nanos> {
        self.permits.iter().map(|p| p.expires_at).max()
    }

    /// Drops permits expired by `now`; returns how many.
    pub fn prune(&mut self, now: Nanos) -> usize {
        let before = self.permits.len();
        self.permits.retain(|p| p.expires_at > now);
        before - self.permits.len()
    }

    /// Takes a permit for `ttl` if fewer than `limit` are live at `now`. A grant drops
    /// the expired permits too (returned with it, to count); a denial or an error changes
    /// nothing. Ids follow the clock (microseconds) and only grow.
    pub fn acquire(
        &mut self,
        limit: u64,
        ttl: Nanos,
        now: Nanos,
    ) -> Result<(Acquired, usize), PermitError> {
        let limit = match self.live_pin(now) {
            None => limit,
            Some(p) => match p.kind {
                PinKind::Rate => p.limit,
                PinKind::Exempt => return Ok((Acquired::Exempt, 0)),
                PinKind::Block => {
                    let retry_after = match p.until {
                        0 => BLOCKED_RETRY,
                        until => until - now,
                    };
                    return Ok((Acquired::Denied { retry_after }, 0));
                }
            },
        };
        let live = self.in_use(now);
        if live as u64 >= limit {
            let earliest = self
                .permits
                .iter()
                .filter(|p| p.expires_at > now)
                .map(|p| p.expires_at)
                .min()
                .unwrap_or(now);
            let retry_after = earliest - now;
            return Ok((Acquired::Denied { retry_after }, 0));
        }
        if live >= MAX_PERMITS {
            return Err(PermitError::TooMany);
        }
        let id = self.last_id.saturating_add(1).max(now / 1000);
        if id > MAX_FIELD {
            return Err(PermitError::IdsExhausted);
        }
        let pruned = self.prune(now);
        let permit = Permit {
            id,
            expires_at: now.saturating_add(ttl).min(MAX_FIELD),
        };
        self.last_id = id;
        self.permits.push(permit);
        // A pin that has ended goes with this write.
        self.pin = self.live_pin(now);
        Ok((Acquired::Granted(permit), pruned))
    }

    /// Releases permit `id` if it is live at `now`.
    pub fn release(&mut self, id: u64, now: Nanos) -> bool {
        match self.permits.binary_search_by_key(&id, |p| p.id) {
            Ok(i) if self.permits[i].expires_at > now => {
                self.permits.remove(i);
                true
            }
            _ => false,
        }
    }

    /// Extends permit `id` to `now + ttl` if it is live at `now`; returns the new permit.
    pub fn renew(&mut self, id: u64, ttl: Nanos, now: Nanos) -> Option<Permit> {
        match self.permits.binary_search_by_key(&id, |p| p.id) {
            Ok(i) if self.permits[i].expires_at > now => {
                self.permits[i].expires_at = now.saturating_add(ttl).min(MAX_FIELD);
                Some(self.permits[i])
            }
            _ => None,
        }
    }

    /// Records a permit as an effect says (inserted, or its expiry replaced), keeping ids
    /// ascending. No bound is checked: the caller validates the whole result.
    pub fn put(&mut self, permit: Permit) {
        match self.permits.binary_search_by_key(&permit.id, |p| p.id) {
            Ok(i) => self.permits[i] = permit,
            Err(i) => self.permits.insert(i, permit),
        }
        self.last_id = self.last_id.max(permit.id);
    }

    /// Removes permit `id` whatever its state (an effect).
    pub fn remove(&mut self, id: u64) {
        self.permits.retain(|p| p.id != id);
    }

    /// Raises the last id handed out (an effect).
    pub fn raise_last_id(&mut self, id: u64) {
        self.last_id = self.last_id.max(id);
    }

    /// The parts, to validate or store.
    pub fn into_parts(self) -> (u64, Vec<Permit>) {
        (self.last_id, self.permits)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Nanos = 1_000_000;
    const T0: Nanos = 1_700_000_000_000 * MS;

    #[test]
    fn acquire_up_to_the_limit_then_wait_for_the_earliest() {
        let mut t = PermitTable::default();
        let a = t.acquire(2, 100 * MS, T0).unwrap().0;
        let b = t.acquire(2, 300 * MS, T0 + MS).unwrap().0;
        assert!(matches!(a, Acquired::Granted(_)) && matches!(b, Acquired::Granted(_)));
        assert_eq!(
            t.acquire(2, 100 * MS, T0 + 10 * MS).unwrap().0,
            Acquired::Denied {
                retry_after: 90 * MS
            }
        );
        // A crashed holder's permit frees itself (and goes with the next grant).
        assert!(matches!(
            t.acquire(2, 100 * MS, T0 + 100 * MS).unwrap(),
            (Acquired::Granted(_), 1)
        ));
        assert_eq!(t.in_use(T0 + 100 * MS), 2);
    }

    #[test]
    fn release_and_renew_only_live_permits_once() {
        let mut t = PermitTable::default();
        let (Acquired::Granted(p), _) = t.acquire(5, 100 * MS, T0).unwrap() else {
            panic!()
        };
        assert!(t.renew(p.id, 500 * MS, T0 + 50 * MS).is_some());
        assert_eq!(t.last_expiry(), Some(T0 + 550 * MS));
        assert!(t.release(p.id, T0 + 200 * MS));
        assert!(!t.release(p.id, T0 + 200 * MS));
        assert!(t.renew(p.id, MS, T0).is_none());
        let (Acquired::Granted(q), _) = t.acquire(5, 100 * MS, T0).unwrap() else {
            panic!()
        };
        assert!(q.id > p.id);
        assert!(!t.release(q.id, T0 + 100 * MS), "expired");
    }

    #[test]
    fn bounded_and_validated() {
        let mut t = PermitTable::default();
        for i in 0..MAX_PERMITS as u64 {
            assert!(matches!(
                t.acquire(u64::MAX, 10 * MS, T0 + i).unwrap().0,
                Acquired::Granted(_)
            ));
        }
        assert_eq!(t.acquire(u64::MAX, MS, T0), Err(PermitError::TooMany));
        let p = |id, expires_at| Permit { id, expires_at };
        assert!(PermitTable::validate(5, vec![p(1, T0), p(5, T0)]).is_ok());
        assert_eq!(PermitTable::validate(5, vec![]), Err(PermitError::Empty));
        assert_eq!(
            PermitTable::validate(4, vec![p(5, T0)]),
            Err(PermitError::Id)
        );
        assert_eq!(
            PermitTable::validate(4, vec![p(0, T0)]),
            Err(PermitError::Id)
        );
        assert_eq!(
            PermitTable::validate(4, vec![p(2, T0), p(2, T0)]),
            Err(PermitError::Order)
        );
        assert_eq!(
            PermitTable::validate(4, vec![p(2, u64::MAX)]),
            Err(PermitError::Expiry)
        );
        assert_eq!(
            PermitTable::validate(u64::MAX, vec![p(1, T0)]),
            Err(PermitError::LastId)
        );
    }
}
