//! Property tests of the bucket arithmetic: any sequence of takes, leases, returns and clock
//! steps (forward and back) keeps the bucket in `[0, cap]` and never lets out more than
//! `cap + rate * elapsed`, where `elapsed` runs to the latest instant the clock showed.

use proptest::prelude::*;
use rl_core::{
    take_all, Applied, Bucket, LeaseRequest, LeaseTable, Level, Limit, Nanos, MAX_LEASES,
};

const T0: Nanos = 1_700_000_000_000_000_000;

#[derive(Debug, Clone)]
enum Op {
    Take { n: u64 },
    Lease { n: u64, min: u64, ttl_ms: u64 },
    Return { which: usize, unused: u64 },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (1u64..20).prop_map(|n| Op::Take { n }),
        (1u64..30, 1u64..5, 1u64..500).prop_map(|(n, min, ttl_ms)| Op::Lease { n, min, ttl_ms }),
        (0usize..8, 0u64..30).prop_map(|(which, unused)| Op::Return { which, unused }),
    ]
}

/// A clock step in ns: mostly forward, sometimes backwards.
fn step() -> impl Strategy<Value = i64> {
    prop_oneof![
        8 => 0i64..200_000_000,
        1 => -2_000_000_000i64..0,
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn bucket_stays_in_range_and_bounded(
        rate in 0.1f64..5000.0,
        cap in 20.0f64..200.0,
        ops in prop::collection::vec((step(), op()), 1..200),
    ) {
        let limit = Limit::new(rate, cap).unwrap();
        let mut stored: Option<Bucket> = None;
        let mut table = LeaseTable::default();
        let mut now = T0;
        // The bucket comes into being (full) at the first call.
        let mut first: Option<Nanos> = None;
        let mut latest = 0;
        // Tokens let out, less what was credited back.
        let mut out: f64 = 0.0;
        for (dt, op) in ops {
            now = now.saturating_add_signed(dt);
            let start = *first.get_or_insert(now);
            latest = latest.max(now);
            let mut level = Level::new(stored.as_ref(), limit, now);
            prop_assert!(level.tokens() >= 0.0 && level.tokens() <= cap);
            table.prune(now);
            match op {
                Op::Take { n } => {
                    let before = level.tokens();
                    let there = level.wait_for(n as f64) == Some(0);
                    let taken = level.try_take(n as f64);
                    // The quick check agrees with the exact one.
                    prop_assert_eq!(taken, there);
                    if taken {
                        prop_assert!(before >= n as f64 - 1e-6);
                        out += n as f64;
                    } else {
                        // A denial's promised wait is exact: waiting it grants.
                        if let Some(wait) = level.wait_for(n as f64) {
                            prop_assert!(wait > 0);
                            let b = level.bucket();
                            let mut later = Level::new(Some(&b), limit, now + wait);
                            prop_assert!(later.try_take(n as f64));
                            let mut almost = Level::new(Some(&b), limit, now + wait - 1);
                            prop_assert!(!almost.try_take(n as f64));
                        }
                    }
                }
                Op::Lease { n, min, ttl_ms } => {
                    // The shipped decision: no return in this call.
                    let req = LeaseRequest { n, min, ttl: ttl_ms * 1_000_000, returning: None };
                    let live_before = table.count_live(now);
                    match table.plan(&mut level, &req, now) {
                        Ok(plan) => {
                            prop_assert!(plan.granted == 0 || (plan.granted >= min && plan.granted <= n));
                            let outcome = table.carry_out(&plan, &req, now);
                            prop_assert_eq!(outcome.opened.map_or(0, |l| l.tokens), plan.granted);
                            out += plan.granted as f64;
                        }
                        Err(e) => prop_assert_eq!(e, rl_core::LeaseError::TooMany),
                    }
                    prop_assert!(table.count_live(now) <= MAX_LEASES.max(live_before));
                }
                Op::Return { which, unused } => {
                    // RL.LEASE ... RETURN through the shipped decision, asking for nothing new.
                    let id = table.leases().get(which).map_or(7, |l| l.id);
                    let held = table.live(id, now).map(|l| l.tokens);
                    let req = LeaseRequest { n: 0, min: 0, ttl: 1, returning: Some((id, unused)) };
                    let before = level.tokens();
                    if let Ok(plan) = table.plan(&mut level, &req, now) {
                        prop_assert_eq!(plan.granted, 0);
                        prop_assert!(plan.credited <= held.unwrap_or(0).min(unused));
                        prop_assert_eq!(plan.returned.is_some(), held.is_some());
                        let _ = table.carry_out(&plan, &req, now);
                        // Return once: the same lease again is not live.
                        let again = table.plan(&mut level.clone(), &req, now);
                        prop_assert!(again.map_or(true, |p| p.returned.is_none()));
                        // What the bucket gained is what came back.
                        out -= level.tokens() - before;
                    }
                }
            }
            prop_assert!(level.tokens() >= 0.0 && level.tokens() <= cap);
            stored = Some(level.bucket());
            let bound = cap + rate * (latest - start) as f64 / 1e9;
            prop_assert!(out <= bound + 1e-6, "let out {} > bound {}", out, bound);
        }
    }

    #[test]
    fn limit_changes_carry_tokens_clamped(
        r1 in 0.1f64..1000.0, c1 in 1.0f64..100.0,
        r2 in 0.1f64..1000.0, c2 in 1.0f64..100.0,
        take in 0.0f64..1.0, dt in 0u64..5_000_000_000,
    ) {
        let (l1, l2) = (Limit::new(r1, c1).unwrap(), Limit::new(r2, c2).unwrap());
        let mut level = Level::new(None, l1, T0);
        prop_assert!(level.try_take((take * c1).floor()));
        let b = level.bucket();
        let carried = Level::new(Some(&b), l2, T0 + dt);
        let old = Level::new(Some(&b), l1, T0 + dt);
        let expected = old.tokens().min(c2);
        prop_assert!((carried.tokens() - expected).abs() <= 1e-4 * c1.max(c2));
    }
}

/// The exact tokens of a bucket `deficit` ns from full under `limit`.
fn exact_tokens(limit: &Limit, deficit: Nanos) -> num_rational::BigRational {
    use num_rational::BigRational;
    let f = |x: f64| BigRational::from_float(x).unwrap();
    let ns = BigRational::from_integer(1_000_000_000u64.into());
    f(limit.cap()) - BigRational::from_integer(deficit.into()) * f(limit.rate()) / ns
}

/// A rate or cap anywhere in the accepted range, log-uniform, sometimes a round number.
fn extreme() -> impl Strategy<Value = f64> {
    prop_oneof![
        (-9.0f64..15.0).prop_map(|e| 10f64.powf(e)),
        (-9i32..=15).prop_map(|e| 10f64.powi(e)),
        (1u64..1_000_000_000_000_000).prop_map(|n| n as f64),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// A limit change never creates a token, across the whole range: the tokens after the
    /// change (exactly, as rationals) are at most the tokens before, and at most the new cap.
    #[test]
    fn limit_changes_never_mint_at_any_scale(
        r1 in extreme(), c1 in extreme(), r2 in extreme(), c2 in extreme(),
        fraction in 0.0f64..1.0, dt in 0u64..10_000_000_000,
    ) {
        let (Ok(l1), Ok(l2)) = (Limit::new(r1, c1), Limit::new(r2, c2)) else {
            return Ok(());
        };
        let full_at = T0 + (l1.fill_nanos() as f64 * fraction) as u64;
        let b = Bucket::new(full_at, l1);
        let now = T0 + dt;
        let before = Level::new(Some(&b), l1, now);
        let after = Level::new(Some(&b), l2, now);
        let before_exact = exact_tokens(&l1, before.reset_after());
        let after_exact = exact_tokens(&l2, after.reset_after());
        let zero = num_rational::BigRational::from_integer(0.into());
        let bound = if before_exact > zero { before_exact } else { zero.clone() };
        // A debit within 1e-12 tokens of a whole nanosecond counts as it (see
        // rl_core::round): allow that much, no more.
        let slack = num_rational::BigRational::from_float(2e-12).unwrap();
        prop_assert!(after_exact <= bound + slack, "minted: {l1:?} -> {l2:?}");
        // And the bucket is stored no later than the level says.
        prop_assert_eq!(after.bucket().full_at(), now + after.reset_after());
    }
}

/// The attack that found the rounding: a cap alternating by one token at 1e15 over 200,000
/// calls, each taking one token, lets out no more than `cap + rate * elapsed`.
#[test]
fn alternating_caps_at_1e15_let_out_no_more_than_the_bound() {
    let (a, b) = (
        Limit::new(320_000.0, 1e15).unwrap(),
        Limit::new(320_000.0, 999_999_999_999_999.0).unwrap(),
    );
    // Start empty so every grant comes from refill.
    let mut stored = Level::starting_with(a, 0.0, T0).bucket();
    let mut out = 0u64;
    let mut now = T0;
    for i in 0..200_000u64 {
        now += 3_000; // 0.96 tokens of refill per call
        let limit = if i % 2 == 0 { b } else { a };
        let mut level = Level::new(Some(&stored), limit, now);
        if level.try_take(1.0) {
            out += 1;
        }
        stored = level.bucket();
    }
    let bound = 320_000.0 * (now - T0) as f64 / 1e9;
    assert!(out as f64 <= bound, "let out {out} > {bound}");
    // Same rate, so the carry-over is exact in time: nothing is lost either.
    assert!(out as f64 > bound - 2.0, "let out only {out} of {bound}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    /// Callers disagreeing on a key's limit (two app versions) never let out more than the
    /// largest of their limits would alone, even when the key expires between calls (an
    /// absent key is a full bucket): a limit change holds the key until the bucket would
    /// have been full under the old limit.
    #[test]
    fn flapping_limits_through_key_expiry_mint_nothing(
        limits in prop::collection::vec((0.5f64..2000.0, 1.0f64..2000.0), 2..4),
        calls in prop::collection::vec((0usize..4, 0.0f64..1.0, 0u64..2_000_000_000), 1..150),
    ) {
        let limits: Vec<Limit> = limits
            .iter()
            .filter_map(|&(r, c)| Limit::new(r, c).ok())
            .collect();
        prop_assume!(limits.len() >= 2);
        let max_cap = limits.iter().map(Limit::cap).fold(0.0, f64::max);
        let max_rate = limits.iter().map(Limit::rate).fold(0.0, f64::max);
        let mut stored: Option<Bucket> = None;
        let mut now = T0;
        let mut out = 0.0;
        for (which, fraction, dt) in calls {
            now += dt;
            // The key expires: nothing stored any more.
            if stored.is_some_and(|b| b.expires_at() <= now) {
                stored = None;
            }
            let limit = limits[which % limits.len()];
            let n = (fraction * limit.cap()).floor().max(1.0) as u64;
            let mut level = Level::new(stored.as_ref(), limit, now);
            if level.try_take(n as f64) {
                out += n as f64;
                stored = Some(level.bucket());
            }
            let bound = max_cap + max_rate * (now - T0) as f64 / 1e9;
            prop_assert!(out <= bound + 1e-6, "let out {} > {}", out, bound);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// RL.RESERVE's promise: callers who use their tokens after the wait they were told
    /// never use more than `cap + rate * t` in any window of length `t`; the debt never
    /// exceeds `rate * max_wait`; a take gets nothing while the bucket is in debt.
    #[test]
    fn reservations_used_after_their_wait_stay_within_the_bound(
        rate in 1.0f64..1000.0,
        cap in 1.0f64..100.0,
        calls in prop::collection::vec((1u64..20, 0u64..50_000_000, 0u64..3_000_000_000, 0u8..4), 1..120),
    ) {
        // Kinds: 0 take and use now, 1 reserve and use after the wait, 2 take and hold
        // (not used), 3 refund what is held (a call that never went out).
        let limit = Limit::new(rate, cap).unwrap();
        let mut stored: Option<Bucket> = None;
        let mut now = T0;
        let mut uses: Vec<(Nanos, f64)> = Vec::new();
        let mut held = 0u64;
        let mut refunded = 0.0;
        for (n, dt, max_wait, kind) in calls {
            now += dt;
            let n = (n as f64).min(cap.floor()).max(1.0);
            let mut level = Level::new(stored.as_ref(), limit, now);
            match kind {
                0 | 2 => {
                    let in_debt = level.signed_tokens() < 0.0;
                    if level.try_take(n) {
                        prop_assert!(!in_debt, "a take was granted in debt");
                        if kind == 0 {
                            uses.push((now, n));
                        } else {
                            held += n as u64;
                        }
                    }
                }
                1 => {
                    if let Some((true, wait)) = level.reserve(n, max_wait) {
                        prop_assert!(wait <= max_wait);
                        let debt = -level.signed_tokens();
                        prop_assert!(debt <= rate * max_wait as f64 / 1e9 + 1e-6, "debt {debt}");
                        uses.push((now + wait, n));
                    }
                }
                _ => {
                    let back = level.refund(held);
                    prop_assert!(back <= held as f64 + 1e-9);
                    refunded += back;
                    held = 0;
                }
            }
            stored = Some(level.bucket());
        }
        uses.sort_by_key(|u| u.0);
        for i in 0..uses.len() {
            let mut sum = 0.0;
            for j in i..uses.len() {
                sum += uses[j].1;
                let t = (uses[j].0 - uses[i].0) as f64 / 1e9;
                // `+ 1` for rounding, as docs/commands.md states for RL.RESERVE; and what was
                // refunded: a bucket cannot tell whether the tokens given back would have
                // been refilled over its cap meanwhile (docs/commands.md, RL.REFUND, says so).
                prop_assert!(sum <= cap + rate * t + 1.0 + refunded, "{} used in {} s", sum, t);
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// The semaphore: never more than `limit` permits live at once, a release or renew
    /// succeeds only for a live permit and only once for a release, and the table stays
    /// one that validation accepts.
    #[test]
    fn permits_never_exceed_the_limit(
        limit in 1u64..8,
        ops in prop::collection::vec((0u8..3, 0usize..10, 1u64..300, 0u64..80), 1..200),
    ) {
        use rl_core::{Acquired, PermitTable};
        const MS: u64 = 1_000_000;
        let mut t = PermitTable::default();
        let mut now = T0;
        let mut held: Vec<u64> = Vec::new();
        for (op, which, ttl_ms, dt_ms) in ops {
            now += dt_ms * MS;
            match op {
                0 => {
                    if let (Acquired::Granted(p), _) = t.acquire(limit, ttl_ms * MS, now).unwrap() {
                        held.push(p.id);
                    }
                }
                1 => {
                    if let Some(&id) = held.get(which) {
                        if t.release(id, now) {
                            prop_assert!(!t.release(id, now), "released twice");
                        }
                    }
                }
                _ => {
                    if let Some(&id) = held.get(which) {
                        let live = t.permits().iter().any(|p| p.id == id && p.expires_at > now);
                        prop_assert_eq!(t.renew(id, ttl_ms * MS, now).is_some(), live);
                    }
                }
            }
            prop_assert!(t.in_use(now) as u64 <= limit);
            let (last, permits) = t.clone().into_parts();
            // A table with permits is one RDB load accepts (an empty one is no key).
            prop_assert!(permits.is_empty() || PermitTable::validate(last, permits).is_ok());
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// RL.MTAKE's decision: every bucket debited or none, and when none, the reported
    /// bucket is one whose wait is the longest.
    #[test]
    fn mtake_is_all_or_nothing(
        buckets in prop::collection::vec((1.0f64..100.0, 1.0f64..50.0, 0.0f64..1.0), 1..8),
        n in 1u64..20,
    ) {
        let now = T0;
        let mut levels: Vec<Level> = buckets
            .iter()
            .map(|&(rate, cap, full)| Level::starting_with(Limit::new(rate, cap).unwrap(), full * cap, now))
            .collect();
        let before: Vec<f64> = levels.iter().map(Level::tokens).collect();
        let waits: Vec<u64> = levels.iter().map(|l| l.wait_for(n as f64).unwrap_or(u64::MAX)).collect();
        let d = take_all(&mut levels, n as f64);
        let after: Vec<f64> = levels.iter().map(Level::tokens).collect();
        if d.granted {
            prop_assert!(waits.iter().all(|&w| w == 0));
            for (b, a) in before.iter().zip(&after) {
                prop_assert!((b - a - n as f64).abs() < 1e-6);
            }
        } else {
            prop_assert_eq!(&before, &after);
            prop_assert_eq!(d.longest, *waits.iter().max().unwrap());
            prop_assert_eq!(waits[d.worst], d.longest);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    /// Versioned limits (`VERSION v`): callers on several versions share a bucket. Versions
    /// never decrease; an older version never changes the stored limit; a newer one
    /// replaces it without minting (the tokens right after are at most those right before,
    /// and at most the new cap); and from each write of a new limit on, the let-out stays
    /// within `cap + rate * elapsed` of the limit in force (only a newer version, or the
    /// same version with another limit, can replace it, and that starts a new window).
    #[test]
    fn versioned_limits_replace_without_minting_and_never_go_back(
        limits in prop::collection::vec((0.5f64..2000.0, 1.0f64..500.0), 2..4),
        calls in prop::collection::vec((0usize..4, 0u64..4, 0.0f64..1.0, step()), 1..200),
    ) {
        let limits: Vec<Limit> = limits
            .iter()
            .filter_map(|&(r, c)| Limit::new(r, c).ok())
            .collect();
        prop_assume!(!limits.is_empty());
        let mut stored: Option<Bucket> = None;
        let mut now = T0;
        let mut latest = T0;
        // Since the limit in force was set: when, and tokens let out since.
        let mut window: Option<(Nanos, f64)> = None;
        for (which, version, fraction, dt) in calls {
            now = now.saturating_add_signed(dt);
            latest = latest.max(now);
            let limit = limits[which % limits.len()];
            let n = (fraction * limit.cap()).floor().max(1.0) as u64;
            let before = stored;
            let (mut level, applied) = rl_core::version::open(stored.as_ref(), limit, version, now);
            match before {
                None => prop_assert_eq!(applied, Applied::Created),
                Some(b) => {
                    prop_assert!(level.version() >= b.version(), "version went back");
                    prop_assert_eq!(level.version(), version.max(b.version()));
                    if version < b.version() {
                        prop_assert_eq!(applied, Applied::Stale);
                        prop_assert_eq!(*level.limit(), b.limit());
                    } else {
                        prop_assert_eq!(*level.limit(), limit);
                    }
                    if applied == Applied::Replaced {
                        let old = Level::new(Some(&b), b.limit(), now);
                        prop_assert!(level.tokens() <= old.tokens().max(0.0) + 1e-9, "minted");
                        prop_assert!(level.tokens() <= limit.cap());
                    }
                }
            }
            // A stale caller asking for more than the stored cap gets an error: no change.
            if n as f64 > level.limit().cap() {
                continue;
            }
            let granted = level.try_take(n as f64);
            if granted || applied.must_write() || stored.is_none() {
                stored = Some(level.bucket());
            }
            let b = stored.unwrap();
            if before.is_none_or(|old| old.limit() != b.limit()) {
                // A new limit in force (written): a new window, from the tokens carried over
                // (at most its cap).
                window = Some((now, 0.0));
            }
            if applied == Applied::Stale {
                // An older version never changes the stored limit or version.
                prop_assert_eq!(b.limit(), before.unwrap().limit());
                prop_assert_eq!(b.version(), before.unwrap().version());
            }
            let (since, out) = window.as_mut().unwrap();
            if granted {
                *out += n as f64;
            }
            let force = b.limit();
            let bound = force.cap() + force.rate() * (latest - *since) as f64 / 1e9;
            prop_assert!(*out <= bound + 1e-6, "let out {} > {} under {:?}", out, bound, force);
        }
    }
}
