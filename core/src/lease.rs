//! Leases: batches of tokens taken from a bucket in one call and spent by their holder
//! until they expire, with what is left returnable exactly once.
//!
//! The tokens of a lease are debited from the bucket when it is granted (see
//! [`crate::Level::take_up_to`]), so leases never let out more than single takes would; the
//! table only remembers what each live lease holds, so that a return can credit at most that,
//! at most once, and only before expiry.

use crate::{Level, Nanos};

/// Most live leases one bucket may hold. A fleet renews one lease per instance, so this is
/// the largest fleet that can share one key through leases.
pub const MAX_LEASES: usize = 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    /// Unique within the key, never reused: see [`LeaseTable::open`].
    pub id: u64,
    /// Tokens granted.
    pub tokens: u64,
    /// Its holder may spend its tokens until this instant.
    pub expires_at: Nanos,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseError {
    /// The bucket already holds [`MAX_LEASES`] live leases.
    TooMany,
    /// Ids must fit a signed 64-bit integer (only a forged state can get there).
    IdsExhausted,
}

impl LeaseError {
    pub fn message(self) -> &'static str {
        match self {
            LeaseError::TooMany => "too many live leases on this key (at most 1024)",
            LeaseError::IdsExhausted => "no lease id left on this key",
        }
    }
}

/// What a return did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settled {
    /// The lease was live: it is closed and `credited` tokens go back to the bucket.
    Returned { credited: u64 },
    /// Unknown, expired or already returned: nothing is credited.
    NotLive,
}

/// What an `RL.LEASE` call asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseRequest {
    /// Tokens wanted (a grant is `min(n, whole tokens there)`).
    pub n: u64,
    /// Fewest tokens worth a lease (1 by default).
    pub min: u64,
    /// How long the holder may spend them.
    pub ttl: Nanos,
    /// The caller's previous lease to settle first: `(lease_id, unused)`.
    pub returning: Option<(u64, u64)>,
}

/// What an `RL.LEASE` call will do, decided before anything changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeasePlan {
    /// The lease being returned, if it is live.
    pub returned: Option<u64>,
    /// Tokens the bucket takes back from it.
    pub credited: u64,
    /// Tokens granted in a new lease (0: none).
    pub granted: u64,
}

impl LeasePlan {
    /// Whether the call changes the bucket or its table.
    pub fn writes(&self) -> bool {
        self.granted > 0 || self.returned.is_some()
    }
}

/// What carrying out a plan did to the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseOutcome {
    /// Expired leases dropped on the way.
    pub pruned: usize,
    /// The new lease.
    pub opened: Option<Lease>,
}

/// The table of a bucket that never had a lease.
pub const NO_LEASES: LeaseTable = LeaseTable {
    last_id: 0,
    leases: Vec::new(),
};

/// The live leases of one bucket.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LeaseTable {
    last_id: u64,
    leases: Vec<Lease>,
}

impl LeaseTable {
    /// A table from parts [`crate::validate`] accepted (the only way in from outside).
    pub(crate) fn from_validated(last_id: u64, leases: Vec<Lease>) -> LeaseTable {
        LeaseTable { last_id, leases }
    }

    pub fn last_id(&self) -> u64 {
        self.last_id
    }

    /// Live leases, oldest first (ids ascending).
    pub fn leases(&self) -> &[Lease] {
        &self.leases
    }

    pub fn is_empty(&self) -> bool {
        self.leases.is_empty()
    }

    /// Tokens held by the leases recorded (validated states keep this within `i64`).
    pub fn held(&self) -> u64 {
        self.leases
            .iter()
            .fold(0u64, |sum, l| sum.saturating_add(l.tokens))
    }

    /// When the last live lease expires.
    pub fn last_expiry(&self) -> Option<Nanos> {
        self.leases.iter().map(|l| l.expires_at).max()
    }

    /// Drops leases that expired by `now`; returns how many.
    pub fn prune(&mut self, now: Nanos) -> usize {
        let before = self.leases.len();
        self.leases.retain(|l| l.expires_at > now);
        before - self.leases.len()
    }

    /// Lease `id` if it is live at `now`.
    pub fn live(&self, id: u64, now: Nanos) -> Option<&Lease> {
        let i = self.leases.binary_search_by_key(&id, |l| l.id).ok()?;
        Some(&self.leases[i]).filter(|l| l.expires_at > now)
    }

    /// Leases live at `now`.
    pub fn count_live(&self, now: Nanos) -> usize {
        self.leases.iter().filter(|l| l.expires_at > now).count()
    }

    /// Removes lease `id` whatever its state (a replayed effect; no credit is computed).
    pub fn remove(&mut self, id: u64) {
        self.leases.retain(|l| l.id != id);
    }

    /// Inserts a lease recorded elsewhere (a replayed effect), keeping ids ascending. No
    /// bound is checked here: the caller validates the whole resulting state.
    pub fn insert(&mut self, lease: Lease) {
        match self.leases.binary_search_by_key(&lease.id, |l| l.id) {
            Ok(i) => self.leases[i] = lease,
            Err(i) => self.leases.insert(i, lease),
        }
        self.last_id = self.last_id.max(lease.id);
    }

    /// The parts, to validate or store.
    pub fn into_parts(self) -> (u64, Vec<Lease>) {
        (self.last_id, self.leases)
    }

    /// Raises the last id handed out (a replayed effect).
    pub fn raise_last_id(&mut self, id: u64) {
        self.last_id = self.last_id.max(id);
    }

    pub fn has_room(&self) -> bool {
        self.leases.len() < MAX_LEASES
    }

    /// Records a lease of `tokens` until `now + ttl`.
    ///
    /// Ids come from the clock (microseconds) and only grow, so an id is not reused even after
    /// the key expired and was created again: a late return of an old lease cannot close a new one.
    pub fn open(&mut self, tokens: u64, ttl: Nanos, now: Nanos) -> Result<Lease, LeaseError> {
        self.open_as(self.next_id(now), tokens, ttl, now)
    }

    /// The smallest id this table could hand out at `now` (see [`LeaseTable::open`]).
    pub fn next_id(&self, now: Nanos) -> u64 {
        self.last_id.saturating_add(1).max(now / 1000)
    }

    /// Records a lease of `tokens` until `now + ttl` under an id chosen for several tables
    /// at once (`RL.BUDGET`: one reservation id on every key): `id` must be at least
    /// [`LeaseTable::next_id`], so ids still only grow and none is reused.
    pub fn open_as(
        &mut self,
        id: u64,
        tokens: u64,
        ttl: Nanos,
        now: Nanos,
    ) -> Result<Lease, LeaseError> {
        if !self.has_room() {
            return Err(LeaseError::TooMany);
        }
        if id > i64::MAX as u64 || id <= self.last_id {
            return Err(LeaseError::IdsExhausted);
        }
        let lease = Lease {
            id,
            tokens,
            expires_at: now.saturating_add(ttl),
        };
        self.last_id = id;
        self.leases.push(lease);
        Ok(lease)
    }

    /// Decides an `RL.LEASE` call on `level` (the bucket refilled to `now`): settle the
    /// returned lease if it is live (crediting `min(unused, its tokens)`, as much as fits
    /// below cap), then grant `min(n, whole tokens there)` if that is at least `min` and a
    /// slot is free. `level` is changed to what it will store; the table is not: an error
    /// (every slot taken and nothing returned, or no id left) leaves both to be dropped.
    pub fn plan(
        &self,
        level: &mut Level,
        req: &LeaseRequest,
        now: Nanos,
    ) -> Result<LeasePlan, LeaseError> {
        let returning = req
            .returning
            .and_then(|(id, unused)| self.live(id, now).map(|l| (id, unused.min(l.tokens))));
        let live = self.count_live(now) - usize::from(returning.is_some());
        let credited = returning.map_or(0, |(_, c)| level.credit_up_to(c));
        let granted = if live < MAX_LEASES {
            level.take_up_to(req.n, req.min)
        } else {
            0
        };
        if granted == 0 && live >= MAX_LEASES && returning.is_none() {
            return Err(LeaseError::TooMany);
        }
        if granted > 0 && self.last_id >= i64::MAX as u64 {
            return Err(LeaseError::IdsExhausted);
        }
        Ok(LeasePlan {
            returned: returning.map(|(id, _)| id),
            credited,
            granted,
        })
    }

    /// Carries out a plan made by [`LeaseTable::plan`] at the same `now`: drops expired
    /// leases, closes the returned one, opens the granted one.
    pub fn carry_out(&mut self, plan: &LeasePlan, req: &LeaseRequest, now: Nanos) -> LeaseOutcome {
        let pruned = self.prune(now);
        if let (Some(id), Some((_, unused))) = (plan.returned, req.returning) {
            self.settle(id, unused, now);
        }
        // The plan checked room and ids, so this cannot fail; if it did, the tokens stay
        // debited (the safe side) rather than the table being lost with an error.
        let opened = (plan.granted > 0)
            .then(|| self.open(plan.granted, req.ttl, now).ok())
            .flatten();
        LeaseOutcome { pruned, opened }
    }

    /// Closes lease `id` if it is live at `now`, crediting `min(unused, its tokens)`.
    pub fn settle(&mut self, id: u64, unused: u64, now: Nanos) -> Settled {
        match self.leases.binary_search_by_key(&id, |l| l.id) {
            Ok(i) if self.leases[i].expires_at > now => {
                let lease = self.leases.remove(i);
                Settled::Returned {
                    credited: unused.min(lease.tokens),
                }
            }
            _ => Settled::NotLive,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Nanos = 1_000_000;
    const T0: Nanos = 1_700_000_000_000 * MS;

    #[test]
    fn ids_grow_and_follow_the_clock() {
        let mut t = LeaseTable::default();
        let a = t.open(5, 100 * MS, T0).unwrap();
        let b = t.open(5, 100 * MS, T0).unwrap();
        assert_eq!(a.id, T0 / 1000);
        assert_eq!(b.id, a.id + 1);
        // A table recreated later (the key expired) still hands out larger ids.
        let mut fresh = LeaseTable::default();
        assert!(fresh.open(1, MS, T0 + MS).unwrap().id > b.id);
    }

    #[test]
    fn settle_credits_once_and_at_most_the_lease() {
        let mut t = LeaseTable::default();
        let l = t.open(5, 100 * MS, T0).unwrap();
        assert_eq!(
            t.settle(l.id, 9, T0 + MS),
            Settled::Returned { credited: 5 }
        );
        assert_eq!(t.settle(l.id, 9, T0 + MS), Settled::NotLive);
        let l = t.open(5, 100 * MS, T0).unwrap();
        assert_eq!(t.settle(l.id, 2, T0), Settled::Returned { credited: 2 });
        assert_eq!(t.settle(12345, 1, T0), Settled::NotLive);
    }

    #[test]
    fn expired_leases_credit_nothing_and_are_pruned() {
        let mut t = LeaseTable::default();
        let l = t.open(5, 100 * MS, T0).unwrap();
        assert_eq!(t.settle(l.id, 5, T0 + 100 * MS), Settled::NotLive);
        t.open(3, 200 * MS, T0).unwrap();
        assert_eq!(t.held(), 8);
        assert_eq!(t.prune(T0 + 150 * MS), 1);
        assert_eq!(t.held(), 3);
        assert_eq!(t.last_expiry(), Some(T0 + 200 * MS));
    }

    #[test]
    fn table_is_bounded() {
        let mut t = LeaseTable::default();
        for _ in 0..MAX_LEASES {
            t.open(1, MS, T0).unwrap();
        }
        assert_eq!(t.open(1, MS, T0), Err(LeaseError::TooMany));
        assert_eq!(t.prune(T0 + MS), MAX_LEASES);
        assert!(t.open(1, MS, T0).is_ok());
    }

    #[test]
    fn ids_stop_at_the_signed_limit() {
        let (b, mut t) = crate::validate(T0, 1.0, 1.0, 0, 0, 0, i64::MAX as u64, vec![]).unwrap();
        let _ = b;
        assert_eq!(t.open(1, MS, T0), Err(LeaseError::IdsExhausted));
    }
}
