//! Token budgets: reserve an estimate on several limits at once, settle the actual later.
//!
//! A call whose cost is known only after it completes (an LLM request: tokens per minute and
//! requests per minute, output tokens estimated from `max_tokens`) reserves its estimate on
//! every limit in one all-or-nothing step (`RL.BUDGET`), each limit with its own cost. Each
//! reservation is a lease ([`crate::LeaseTable`]) under one id shared by every key, so the
//! settle (`RL.SETTLE`) closes it exactly once:
//!
//! - `actual <= reserved`: the unused part goes back, at most what the bucket lacks, in debt
//!   too (see [`Level::credit_owed`]: one call's overage does not swallow the others'
//!   unused estimates; the refund allowance applies, as for `RL.REFUND`);
//! - `actual > reserved`: the overage is charged as debt, the level floored at `-cap`
//!   ([`charge`]), so no actual, however wrong, keeps a key from granting longer than
//!   `cap / rate` beyond an ordinary empty bucket (at most `2 * cap / rate` until full);
//! - a lease that is unknown, expired or already settled changes nothing: the reserved
//!   tokens stay charged (never minted), and a retried settle cannot credit or charge twice.

use crate::pin::Gate;
use crate::{AllOrNothing, LeaseError, LeaseTable, Level, Limit, Nanos, MAX_LEASES};

/// Most keys one budget may name.
pub const MAX_BUDGET_KEYS: usize = 64;

/// Takes `ns[i]` from `levels[i]` for every `i`, or nothing from any: every level is
/// looked at before any is debited. Denied: `worst` is the level with the longest wait
/// (the last of equals), `longest` that wait (`u64::MAX` if it can never grant).
pub fn reserve_all(levels: &mut [Level], ns: &[u64]) -> AllOrNothing {
    debug_assert_eq!(levels.len(), ns.len());
    let (worst, longest) = levels
        .iter()
        .zip(ns)
        .map(|(l, &n)| l.wait_for(n as f64).unwrap_or(u64::MAX))
        .enumerate()
        .max_by_key(|&(_, w)| w)
        .unwrap_or((0, 0));
    let granted = longest == 0;
    if granted {
        for (l, &n) in levels.iter_mut().zip(ns) {
            // Each has its `n` (its wait is 0), so each take succeeds.
            l.try_take(n as f64);
        }
    }
    AllOrNothing {
        granted,
        worst,
        longest,
    }
}

/// What an `RL.BUDGET` call will do, decided before anything changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BudgetPlan {
    pub outcome: AllOrNothing,
    /// The reservation id every key's lease takes (0: none recorded: denied, or every key
    /// exempt).
    pub id: u64,
}

impl BudgetPlan {
    /// Whether level `i` gets a lease: granted and not exempt (an exempt grant debits
    /// nothing, so there is nothing to settle).
    pub fn leases(&self, level: &Level) -> bool {
        self.id != 0 && level.gate() != Gate::Exempt
    }
}

/// Decides an `RL.BUDGET` call: [`reserve_all`] on the levels (each refilled to `now`,
/// changed to what they will store), then, on a grant, one reservation id for every key
/// that records a lease: larger than each one's last id and from the clock, so it is new
/// on every key (see [`LeaseTable::open`]). An error (a key already holding
/// [`MAX_LEASES`] live leases, or no id left) leaves everything to be dropped.
pub fn plan(
    levels: &mut [Level],
    ns: &[u64],
    tables: &[&LeaseTable],
    now: Nanos,
) -> Result<BudgetPlan, LeaseError> {
    let outcome = reserve_all(levels, ns);
    let mut id = 0;
    if outcome.granted {
        for (level, table) in levels.iter().zip(tables) {
            if level.gate() == Gate::Exempt {
                continue;
            }
            if table.count_live(now) >= MAX_LEASES {
                return Err(LeaseError::TooMany);
            }
            id = id.max(table.next_id(now));
        }
        if id > i64::MAX as u64 {
            return Err(LeaseError::IdsExhausted);
        }
    }
    Ok(BudgetPlan { outcome, id })
}

/// The most time an overage may leave a key owing: twice the fill time of the limit that
/// governs it now (`governing`: a rate pin's, or its own), and never more than twice its
/// own limit's (`own`, what the key is stored under). A debt is time owed and is kept
/// through limit changes, so one charged under a slow pin (twice *its* fill time: years at
/// `1e-9/s`) would otherwise outlive the pin as years owed under the key's own limit.
pub fn most_owed(governing: &Limit, own: &Limit) -> Nanos {
    governing
        .fill_nanos()
        .min(own.fill_nanos())
        .saturating_mul(2)
}

/// Charges `over` tokens used beyond a reservation as debt, as far as the time owed stays
/// within [`most_owed`] (the level at or above `-cap` of both limits); returns the whole
/// tokens charged. An exempt key is charged nothing (its grants debit nothing). A level
/// owing more already (a long `RL.RESERVE` queue) is charged nothing more.
pub fn charge(level: &mut Level, over: u64, own: &Limit) -> u64 {
    if level.gate() == Gate::Exempt || over == 0 {
        return 0;
    }
    let limit = *level.limit();
    let room = most_owed(&limit, own).saturating_sub(level.owed());
    // Whole tokens that fit the room; the debt itself is clamped to it in nanoseconds, so
    // it never passes the floor whatever the float rounding of this count.
    let fits = limit.tokens_for(room).floor();
    let charged = (over as f64).min(fits.max(0.0)) as u64;
    if charged > 0 {
        level.owe(limit.nanos_for(charged as f64).min(room));
    }
    charged
}

/// Settles one key's part of a reservation on `level` (the bucket refilled to `now` under
/// what governs it): `reserved - actual` back (in debt too), or `actual - reserved` charged
/// as bounded debt. Returns the tokens credited (positive) or charged (negative).
pub fn settle_level(level: &mut Level, reserved: u64, actual: u64) -> i64 {
    let own = *level.limit();
    settle_level_owning(level, reserved, actual, &own)
}

/// [`settle_level`] for a key stored under `own` and governed now by the level's limit (a
/// rate pin's): the debt bounded by both ([`most_owed`]).
pub fn settle_level_owning(level: &mut Level, reserved: u64, actual: u64, own: &Limit) -> i64 {
    if actual <= reserved {
        level.credit_owed(reserved - actual).min(i64::MAX as u64) as i64
    } else {
        -(charge(level, actual - reserved, own).min(i64::MAX as u64) as i64)
    }
}

/// Settles lease `id` of `table` with `actual`: `None` (nothing changes) if it is not live
/// at `now`; else the lease is closed, expired leases are dropped, and the level credited
/// or charged ([`settle_level`]). Returns the signed tokens and how many leases expired.
pub fn settle(
    table: &mut LeaseTable,
    level: &mut Level,
    id: u64,
    actual: u64,
    now: Nanos,
    own: &Limit,
) -> Option<(i64, usize)> {
    let reserved = table.live(id, now)?.tokens;
    let pruned = table.prune(now);
    table.remove(id);
    Some((settle_level_owning(level, reserved, actual, own), pruned))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Bucket, Limit};
    use proptest::prelude::*;

    const S: Nanos = 1_000_000_000;
    const T0: Nanos = 1_700_000_000 * S;

    fn limit(rate: f64, cap: f64) -> Limit {
        Limit::new(rate, cap).unwrap()
    }

    #[test]
    fn all_or_nothing_with_a_cost_per_key() {
        let tpm = limit(100.0, 1000.0);
        let rpm = limit(1.0, 10.0);
        let mut levels = [Level::new(None, tpm, T0), Level::new(None, rpm, T0)];
        let out = reserve_all(&mut levels, &[800, 1]);
        assert!(out.granted);
        assert!((levels[0].tokens() - 200.0).abs() < 1e-9);
        assert!((levels[1].tokens() - 9.0).abs() < 1e-9);
        // 300 more tokens are not there: nothing is taken from either.
        let before = levels;
        let out = reserve_all(&mut levels, &[300, 1]);
        assert!(!out.granted);
        assert_eq!(out.worst, 0);
        assert_eq!(out.longest, S);
        assert_eq!(levels, before);
    }

    #[test]
    fn one_id_new_on_every_key() {
        let lim = limit(1.0, 10.0);
        let mut a = LeaseTable::default();
        let b = LeaseTable::default();
        a.open(1, S, T0 + 5 * S).unwrap();
        let mut levels = [Level::new(None, lim, T0), Level::new(None, lim, T0)];
        let p = plan(&mut levels, &[1, 1], &[&a, &b], T0).unwrap();
        assert_eq!(p.id, a.last_id() + 1);
        assert!(p.id > b.next_id(T0));
    }

    #[test]
    fn a_full_table_is_an_error_only_on_a_grant() {
        let lim = limit(1.0, 10.0);
        let mut t = LeaseTable::default();
        for _ in 0..MAX_LEASES {
            t.open(1, S, T0).unwrap();
        }
        let mut levels = [Level::new(None, lim, T0)];
        assert_eq!(plan(&mut levels, &[1], &[&t], T0), Err(LeaseError::TooMany));
        let mut levels = [Level::new(None, lim, T0)];
        assert!(levels[0].try_take(10.0));
        assert!(!plan(&mut levels, &[1], &[&t], T0).unwrap().outcome.granted);
    }

    #[test]
    fn settle_credits_unused_and_charges_overage_down_to_minus_cap() {
        let lim = limit(10.0, 100.0);
        let mut l = Level::new(None, lim, T0);
        assert!(l.try_take(50.0));
        let mut c = l;
        assert_eq!(settle_level(&mut c, 50, 20), 30);
        assert!((c.tokens() - 80.0).abs() < 1e-9);
        let mut d = l;
        assert_eq!(settle_level(&mut d, 50, 120), -70);
        assert!((d.signed_tokens() + 20.0).abs() < 1e-6);
        // However wrong the actual, the level stops at -cap.
        let mut e = l;
        assert_eq!(settle_level(&mut e, 50, 1_000_000), -150);
        assert!(e.signed_tokens() >= -100.0 - 1e-6);
        assert!(e.reset_after() <= 2 * lim.fill_nanos());
        // Stored and read back in debt: nothing more is charged at the floor, and what
        // another reservation did not use still comes back (the debt shrinks).
        let mut e = Level::new(Some(&e.bucket()), lim, T0);
        assert!((e.signed_tokens() + 100.0).abs() < 1e-6);
        assert_eq!(settle_level(&mut e, 10, 50), 0);
        assert_eq!(settle_level(&mut e, 10, 0), 10);
        assert!((e.signed_tokens() + 90.0).abs() < 1e-6);
        // Back to full at most, whatever was unused.
        let mut f = Level::new(Some(&e.bucket()), lim, T0);
        assert_eq!(settle_level(&mut f, 1_000_000, 0), 190);
        assert_eq!(f.reset_after(), 0);
    }

    #[test]
    fn a_debt_under_a_slow_pin_is_bounded_by_the_keys_own_fill_time() {
        let own = limit(10.0, 100.0);
        let pin = limit(1e-9, 1.0);
        assert_eq!(most_owed(&pin, &own), 2 * own.fill_nanos());
        assert_eq!(most_owed(&own, &own), 2 * own.fill_nanos());
        assert_eq!(most_owed(&own, &pin), 2 * own.fill_nanos());
        // 20 s owed at most: 2e-8 tokens at 1e-9/s, so nothing whole is charged.
        let mut l = Level::new(None, pin, T0);
        assert_eq!(charge(&mut l, 1000, &own), 0);
        assert!(l.reset_after() <= 2 * own.fill_nanos());
        // Under a fast pin the pin's own floor binds.
        let fast = limit(1000.0, 1000.0);
        let mut f = Level::new(None, fast, T0);
        assert_eq!(charge(&mut f, 5000, &own), 2000);
    }

    #[test]
    fn settle_is_once_and_only_while_live() {
        let lim = limit(1.0, 10.0);
        let mut t = LeaseTable::default();
        let mut l = Level::new(None, lim, T0);
        assert!(l.try_take(5.0));
        let lease = t.open(5, S, T0).unwrap();
        let mut l2 = l;
        assert_eq!(settle(&mut t, &mut l2, lease.id, 2, T0, &lim), Some((3, 0)));
        assert_eq!(settle(&mut t, &mut l2, lease.id, 2, T0, &lim), None);
        let lease = t.open(5, S, T0).unwrap();
        assert_eq!(settle(&mut t, &mut l, lease.id, 0, T0 + S, &lim), None);
    }

    #[test]
    fn exempt_is_neither_charged_nor_credited() {
        let lim = limit(1.0, 10.0);
        let mut l = Level::new(None, lim, T0).with_gate(Gate::Exempt);
        assert_eq!(settle_level(&mut l, 1, 100), 0);
        assert_eq!(settle_level(&mut l, 5, 0), 0);
    }

    fn any_limit() -> impl Strategy<Value = Limit> {
        (0.01f64..1e6, 1.0f64..1e6).prop_filter_map("valid", |(r, c)| Limit::new(r, c).ok())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1024))]

        /// Reserve, then settle with any actual or let the lease expire: the bucket never
        /// holds more than it would had the call taken `min(actual, reserved)` outright
        /// (never minting), and never less than `-cap` (the debt floor).
        #[test]
        fn never_mints_and_debt_is_bounded(
            lim in any_limit(),
            start in 0.0f64..1.0,
            n_frac in 0.0f64..1.0,
            actual in prop_oneof![0u64..2_000_000, Just(u64::MAX >> 1)],
            elapsed in 0u64..(10 * S),
            expire in any::<bool>(),
        ) {
            let start_ns = (lim.fill_nanos() as f64 * start) as Nanos;
            let b = Bucket::new(T0 + start_ns, lim);
            let mut level = Level::new(Some(&b), lim, T0);
            let n = ((lim.cap() * n_frac).floor() as u64).max(1);
            let before = level;
            let mut levels = [level];
            let mut table = LeaseTable::default();
            let p = plan(&mut levels, &[n], &[&table], T0).unwrap();
            if !p.outcome.granted {
                prop_assert_eq!(levels[0], before);
                return Ok(());
            }
            level = levels[0];
            let lease = table.open_as(p.id, n, S, T0).unwrap();
            let now = T0 + elapsed;
            let stored = level.bucket();
            let mut later = Level::new(Some(&stored), lim, now);
            let settled_at = if expire { now + S } else { now };
            let result = settle(&mut table, &mut later, lease.id, actual, settled_at, &lim);
            // What a plain take of what was used leaves at `now`.
            let used = actual.min(n) as f64;
            let mut plain = Level::new(Some(&b), lim, T0);
            prop_assert!(plain.try_take(used) || used > plain.tokens());
            let plain_now = Level::new(Some(&plain.bucket()), lim, now);
            let eps = lim.cap() * 1e-9 + 1e-6;
            match result {
                None => {
                    prop_assert!(expire || elapsed >= S);
                    prop_assert!(later.signed_tokens() <= plain_now.signed_tokens() + eps);
                }
                Some((signed, _)) => {
                    prop_assert!(signed <= (n - actual.min(n)) as i64);
                    prop_assert!(later.signed_tokens() <= plain_now.signed_tokens() + eps);
                    prop_assert!(later.signed_tokens() >= -lim.cap() - eps);
                    prop_assert!(later.reset_after() <= 2 * lim.fill_nanos() + 1);
                    // A retry finds no lease: nothing twice.
                    prop_assert_eq!(settle(&mut table, &mut later, lease.id, actual, now, &lim), None);
                }
            }
        }

        /// Two reservations on one bucket settled in either order, one over its estimate
        /// and one under: the bucket ends where the two calls' actual uses put it (neither
        /// the cap nor the debt floor clipping), so one call's overage does not swallow the
        /// other's unused estimate.
        #[test]
        fn settles_in_either_order_end_at_the_actual_use(
            rate in 0.1f64..1e4,
            cap in 10.0f64..1e5,
            fa in 0.0f64..0.5,
            fb in 0.0f64..0.5,
            over in 0.0f64..0.9,
            under in 0.0f64..1.0,
            a_first in any::<bool>(),
        ) {
            let Ok(lim) = Limit::new(rate, cap) else { return Ok(()) };
            let na = ((cap * fa).floor() as u64).max(1);
            let nb = ((cap * fb).floor() as u64).max(1);
            // A uses more than it reserved (up to almost a cap more), B less.
            let aa = na + (cap * over).floor() as u64;
            let ab = (nb as f64 * under).floor() as u64;
            let mut levels = [Level::new(None, lim, T0)];
            let mut table = LeaseTable::default();
            let pa = plan(&mut levels, &[na], &[&table], T0).unwrap();
            prop_assume!(pa.outcome.granted);
            let la = table.open_as(pa.id, na, S, T0).unwrap();
            let pb = plan(&mut levels, &[nb], &[&table], T0).unwrap();
            prop_assume!(pb.outcome.granted);
            let lb = table.open_as(pb.id, nb, S, T0).unwrap();
            let mut level = levels[0];
            let order = if a_first { [(la.id, aa), (lb.id, ab)] } else { [(lb.id, ab), (la.id, aa)] };
            for (id, actual) in order {
                // Each settle reads the bucket as stored (a debt is then time behind now).
                level = Level::new(Some(&level.bucket()), lim, T0);
                prop_assert!(settle(&mut table, &mut level, id, actual, T0, &lim).is_some());
            }
            let want = cap - (aa + ab) as f64;
            prop_assume!(want >= -cap);
            let eps = 2.0 + cap * 1e-9;
            prop_assert!((level.signed_tokens() - want).abs() <= eps,
                "tokens {} want {}", level.signed_tokens(), want);
        }

        /// Several keys, any costs: granted on all or debited on none.
        #[test]
        fn all_or_nothing(
            parts in proptest::collection::vec((any_limit(), 0.0f64..1.0, 0.0f64..1.5), 1..6),
        ) {
            let mut levels: Vec<Level> = parts
                .iter()
                .map(|(lim, start, _)| {
                    let b = Bucket::new(T0 + (lim.fill_nanos() as f64 * start) as Nanos, *lim);
                    Level::new(Some(&b), *lim, T0)
                })
                .collect();
            let ns: Vec<u64> = parts
                .iter()
                .map(|(lim, _, f)| ((lim.cap() * f).floor() as u64).max(1))
                .collect();
            let before = levels.clone();
            let fits: Vec<bool> = before
                .iter()
                .zip(&ns)
                .map(|(l, &n)| l.wait_for(n as f64) == Some(0))
                .collect();
            let out = reserve_all(&mut levels, &ns);
            prop_assert_eq!(out.granted, fits.iter().all(|&f| f));
            if out.granted {
                for (j, l) in levels.iter().enumerate() {
                    let taken = before[j].tokens() - l.tokens();
                    prop_assert!(taken >= ns[j] as f64 - 1e-6 * parts[j].0.cap().max(1.0));
                }
            } else {
                prop_assert_eq!(&levels, &before);
                prop_assert!(!fits[out.worst]);
            }
        }
    }
}
