//! Property tests of rate shares: a fleet of simulated holders (each using its old share
//! until its answer arrives or its hold ends, its new one until its lease ends less its
//! margin) joining, leaving, dying, changing wants and the limit, with calls delayed both
//! ways. At every instant the shares holders may still use sum to at most the rate (the
//! bursts to at most the cap), counted exactly; the max-min division is met once everyone
//! has refreshed twice since the last change; a dead holder's share comes free exactly
//! when its lease ends.

use num_rational::BigRational;
use proptest::prelude::*;
use rl_core::pin::PinKind;
use rl_core::share::{SharePin, HOLD, LEASE_PERIODS};
use rl_core::{Limit, Nanos, ShareRequest, ShareTable};

const MS: Nanos = 1_000_000;
const T0: Nanos = 1_700_000_000_000 * MS;

fn exact(x: f64) -> BigRational {
    BigRational::from_float(x).unwrap()
}

fn zero() -> BigRational {
    BigRational::from_integer(0.into())
}

#[derive(Debug, Clone)]
enum Act {
    Call { want: f64, period_ms: u64 },
    Release,
    Die,
    Limit { which: usize, version: u64 },
}

fn act() -> impl Strategy<Value = Act> {
    prop_oneof![
        8 => (prop_oneof![Just(0.0), 0.0f64..300.0, Just(1e15)], prop_oneof![Just(10u64), 10u64..2000])
            .prop_map(|(want, period_ms)| Act::Call { want, period_ms }),
        1 => Just(Act::Release),
        1 => Just(Act::Die),
        1 => (0usize..3, 0u64..4).prop_map(|(which, version)| Act::Limit { which, version }),
    ]
}

/// A share a holder may use over `[from, until)`, given by a call decided under `rate`
/// and `cap` at `decided`.
#[derive(Debug, Clone)]
struct Use {
    rate: f64,
    burst: f64,
    from: Nanos,
    until: Nanos,
    decided: Nanos,
    limit: (f64, f64),
}

#[derive(Debug, Default, Clone)]
struct Sim {
    dead: bool,
    /// Its previous answer arrives then: it sends nothing before.
    ready_at: Nanos,
    /// The use it is on (an index into the list of uses).
    current: Option<usize>,
}

/// Whether the rates (or the bursts) in `uses` stay within the bound at every instant:
/// `Err` describes an instant above it.
fn check_uses(uses: &[Use], max_lease: Nanos, burst: bool) -> Result<(), String> {
    // The sum is a step function of half-open intervals: its maxima are at their starts.
    let mut instants: Vec<Nanos> = uses.iter().map(|u| u.from).collect();
    instants.extend(uses.iter().filter(|u| u.until > 0).map(|u| u.until - 1));
    for &t in &instants {
        let mut sum = zero();
        for u in uses.iter().filter(|u| u.from <= t && t < u.until) {
            sum += exact(if burst { u.burst } else { u.rate });
        }
        // The limits of the calls decided within a lease before `t`: a share in use at
        // `t` was given by one of them.
        let bound = uses
            .iter()
            .filter(|u| u.decided <= t && t <= u.decided + max_lease)
            .map(|u| if burst { u.limit.1 } else { u.limit.0 })
            .fold(0.0f64, f64::max);
        if sum > exact(bound) {
            return Err(format!(
                "at {}: {} > {bound} ({})",
                t - T0,
                sum,
                if burst { "bursts" } else { "rates" }
            ));
        }
    }
    Ok(())
}

/// The sum of what the server counts at `t` for every entry, exactly.
fn committed(t: &ShareTable, at: Nanos) -> (BigRational, BigRational) {
    t.holders().iter().fold((zero(), zero()), |(r, b), h| {
        (r + exact(h.rate_at(at)), b + exact(h.burst_at(at)))
    })
}

const LIMITS: [(f64, f64); 3] = [(100.0, 40.0), (7.0, 1000.0), (0.3, 0.001)];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn usable_shares_never_exceed_the_rate_at_any_instant(
        holders in 1usize..7,
        first in 0usize..3,
        events in prop::collection::vec(
            (0u64..400, 0usize..7, 0u64..600, 0u64..600, act()), 1..120),
    ) {
        let (mut rate, mut cap) = LIMITS[first];
        let mut version = 0u64;
        let mut table = ShareTable::new(Limit::new(rate, cap).unwrap(), 0);
        let mut sims = vec![Sim::default(); holders];
        let mut uses: Vec<Use> = Vec::new();
        let mut now = T0;
        let mut max_lease = HOLD;
        for (gap_ms, who, d1_ms, d2_ms, act) in events {
            now += gap_ms * MS;
            let who = who % holders;
            let (period_ms, want, release) = match act {
                Act::Limit { which, version: v } => {
                    (rate, cap) = LIMITS[which];
                    version = v;
                    continue;
                }
                Act::Die => {
                    sims[who].dead = true;
                    continue;
                }
                Act::Call { want, period_ms } => (period_ms, want, false),
                Act::Release => (100, 0.0, true),
            };
            let sim = &mut sims[who];
            if sim.dead || sim.ready_at > now {
                continue;
            }
            // Sent at `s`, decided now, answered at `answer`.
            let s = now.saturating_sub(d1_ms * MS).max(sim.ready_at);
            let answer = now + d2_ms * MS;
            let id = format!("holder-{who}");
            let limit = Limit::new(rate, cap).unwrap();
            let req = ShareRequest::new(id.as_bytes(), want, period_ms, release, limit, version)
                .unwrap();
            let before = table.clone();
            let d = table.decide(&req, now).unwrap();
            let resolved = (table.limit().rate(), table.limit().cap());
            // The server never raises what it counts above the rate in force (nor at all
            // when it was above already: a limit drop).
            let (r0, b0) = committed(&before, now);
            let (r1, b1) = committed(&table, now);
            prop_assert!(r1 <= exact(resolved.0).max(r0.clone()), "server rates {} > {}", r1, resolved.0);
            prop_assert!(b1 <= exact(resolved.1).max(b0.clone()), "server bursts {} > {}", b1, resolved.1);
            prop_assert!(d.reply.rate >= 0.0 && d.reply.burst >= 0.0);
            if !d.written {
                prop_assert_eq!(&table, &before);
            }
            // The holder's side: the old share until its answer or its hold, whichever
            // first; the new one from its answer to its lease end less its margin.
            if let Some(i) = sim.current.take() {
                let stop = answer.min(s + HOLD).max(uses[i].from);
                uses[i].until = uses[i].until.min(stop);
            }
            sim.ready_at = answer;
            let lease = d.reply.lease_ms * MS;
            max_lease = max_lease.max(lease);
            let margin = lease / 100 + 10 * MS;
            if lease > 0 && answer < s + lease - margin.min(lease) {
                uses.push(Use {
                    rate: d.reply.rate,
                    burst: d.reply.burst,
                    from: answer,
                    until: s + lease - margin.min(lease),
                    decided: now,
                    limit: resolved,
                });
                sim.current = Some(uses.len() - 1);
            }
            // The key's expiry is its last entry's end.
            if d.written {
                prop_assert_eq!(table.last_end(), Some(d.expires_at));
            }
        }
        check_uses(&uses, max_lease, false).map_err(TestCaseError::fail)?;
        check_uses(&uses, max_lease, true).map_err(TestCaseError::fail)?;
    }

    #[test]
    fn with_one_limit_the_bound_is_the_rate_itself(
        holders in 1usize..9,
        rate in 0.5f64..1000.0,
        cap in 0.5f64..1000.0,
        events in prop::collection::vec(
            (0u64..300, 0usize..9, 0u64..500, 0u64..500, 0.0f64..500.0, 10u64..1500, 0u8..10),
            1..150),
    ) {
        let limit = Limit::new(rate, cap).unwrap();
        let mut table = ShareTable::new(limit, 0);
        let mut sims = vec![Sim::default(); holders];
        let mut uses: Vec<Use> = Vec::new();
        let mut now = T0;
        for (gap_ms, who, d1_ms, d2_ms, want, period_ms, kind) in events {
            now += gap_ms * MS;
            let who = who % holders;
            let sim = &mut sims[who];
            if kind == 0 {
                sim.dead = true;
            }
            if sim.dead || sim.ready_at > now {
                continue;
            }
            let release = kind == 1;
            let s = now.saturating_sub(d1_ms * MS).max(sim.ready_at);
            let answer = now + d2_ms * MS;
            let id = [b'h', who as u8];
            let req = ShareRequest::new(&id, want, period_ms, release, limit, 0).unwrap();
            let d = table.decide(&req, now).unwrap();
            let (r, b) = committed(&table, now);
            prop_assert!(r <= exact(rate) && b <= exact(cap), "server {} {}", r, b);
            if let Some(i) = sim.current.take() {
                let stop = answer.min(s + HOLD).max(uses[i].from);
                uses[i].until = uses[i].until.min(stop);
            }
            sim.ready_at = answer;
            let lease = d.reply.lease_ms * MS;
            let margin = lease / 100 + 10 * MS;
            if lease > margin && answer < s + lease - margin {
                uses.push(Use {
                    rate: d.reply.rate,
                    burst: d.reply.burst,
                    from: answer,
                    until: s + lease - margin,
                    decided: now,
                    limit: (rate, cap),
                });
                sim.current = Some(uses.len() - 1);
            }
        }
        check_uses(&uses, Nanos::MAX / 4, false).map_err(TestCaseError::fail)?;
        check_uses(&uses, Nanos::MAX / 4, true).map_err(TestCaseError::fail)?;
    }

    #[test]
    fn max_min_fair_once_everyone_refreshed_twice(
        rate in 1.0f64..1000.0,
        cap in 1.0f64..1000.0,
        first in prop::collection::vec(prop_oneof![Just(0.0), 0.0f64..400.0], 1..14),
        second in prop::collection::vec(prop_oneof![Just(0.0), 0.0f64..400.0], 1..14),
    ) {
        let limit = Limit::new(rate, cap).unwrap();
        let mut table = ShareTable::new(limit, 0);
        let period_ms = 1000;
        let mut now = T0;
        // Round by round, one call per holder, the rounds a period apart.
        let round = |table: &mut ShareTable, wants: &[(usize, f64)], now: &mut Nanos| {
            *now += period_ms * MS;
            let mut got = Vec::new();
            for (k, &(id, want)) in wants.iter().enumerate() {
                let name = format!("h{id}");
                let req = ShareRequest::new(name.as_bytes(), want, period_ms, false, limit, 0).unwrap();
                got.push(table.decide(&req, *now + k as u64 * MS).unwrap().reply);
            }
            got
        };
        let a: Vec<(usize, f64)> = first.iter().copied().enumerate().collect();
        for _ in 0..2 {
            round(&mut table, &a, &mut now);
        }
        let got = round(&mut table, &a, &mut now);
        check_fair(rate, cap, &a, &got)?;
        // Some leave (release), some join, every want changes.
        now += period_ms * MS;
        for (id, _) in a.iter().skip(second.len()) {
            let name = format!("h{id}");
            let req = ShareRequest::new(name.as_bytes(), 0.0, period_ms, true, limit, 0).unwrap();
            table.decide(&req, now).unwrap();
        }
        let b: Vec<(usize, f64)> = second.iter().copied().enumerate().map(|(i, w)| (i * 2, w)).collect();
        for _ in 0..2 {
            round(&mut table, &b, &mut now);
        }
        let got = round(&mut table, &b, &mut now);
        check_fair(rate, cap, &b, &got)?;
    }
}

/// The division by a sort: proportional when the wants fit, else water-filling.
fn reference(rate: f64, wants: &[f64]) -> Vec<f64> {
    let n = wants.len() as f64;
    let sum: f64 = wants.iter().sum();
    if sum <= rate {
        return wants
            .iter()
            .map(|&w| if sum == 0.0 { rate / n } else { rate * w / sum })
            .collect();
    }
    let mut sorted = wants.to_vec();
    sorted.sort_by(f64::total_cmp);
    let mut rest = rate;
    let mut level = f64::INFINITY;
    for (i, w) in sorted.iter().enumerate() {
        let k = (sorted.len() - i) as f64;
        if w * k >= rest {
            level = rest / k;
            break;
        }
        rest -= w;
    }
    wants.iter().map(|&w| w.min(level)).collect()
}

fn check_fair(
    rate: f64,
    cap: f64,
    wants: &[(usize, f64)],
    got: &[rl_core::ShareReply],
) -> Result<(), TestCaseError> {
    let w: Vec<f64> = wants.iter().map(|&(_, w)| w).collect();
    let targets = reference(rate, &w);
    for (i, (t, r)) in targets.iter().zip(got).enumerate() {
        prop_assert!(
            (r.rate - t).abs() <= 1e-9 * rate,
            "holder {i} got {} of {t} (wants {w:?}, rate {rate})",
            r.rate
        );
        let tb = t * cap / rate;
        prop_assert!(
            (r.burst - tb).abs() <= 1e-9 * cap,
            "holder {i} burst {} of {tb}",
            r.burst
        );
        prop_assert_eq!(r.holders, wants.len() as u64);
    }
    Ok(())
}

/// Holders that die strand exactly their shares until their leases end: before, what is
/// free excludes them; at the end, exactly their shares come free.
#[test]
fn expiry_frees_exactly_the_dead_holders_share() {
    let limit = Limit::new(120.0, 12.0).unwrap();
    let mut table = ShareTable::new(limit, 0);
    let period = 1000;
    let mut now = T0;
    for round in 0..3 {
        for (k, h) in ["a", "b", "c", "d"].iter().enumerate() {
            let req = ShareRequest::new(h.as_bytes(), 30.0, period, false, limit, 0).unwrap();
            let d = table.decide(&req, now + k as u64).unwrap();
            if round == 2 {
                assert_eq!((d.reply.rate, d.reply.burst), (30.0, 3.0));
            }
        }
        now += period * MS;
    }
    // d dies at its last call (at `now - period + 3`); its lease ends 3 periods later.
    let d_end = now - period * MS + 3 + LEASE_PERIODS * period * MS;
    // a, b, c keep refreshing with a want of 60: d's 30 stays counted until d_end.
    while now < d_end {
        for (k, h) in ["a", "b", "c"].iter().enumerate() {
            let req = ShareRequest::new(h.as_bytes(), 60.0, period, false, limit, 0).unwrap();
            let d = table.decide(&req, now + k as u64).unwrap();
            assert!(d.reply.rate <= 30.0, "d's share is not given away early");
        }
        now += period * MS / 2;
    }
    // At d_end exactly d's 30 is free: the next caller gets its target of 40 if what the
    // others still hold allows; the total never passes the rate.
    let before: f64 = table.holders().iter().map(|h| h.rate_at(d_end - 1)).sum();
    let after: f64 = table.holders().iter().map(|h| h.rate_at(d_end)).sum();
    let d_share = table
        .holders()
        .iter()
        .find(|h| &*h.id == b"d")
        .map(|h| h.rate_at(d_end - 1))
        .unwrap();
    assert_eq!(d_share, 30.0);
    assert_eq!(before - after, d_share);
    let req = ShareRequest::new(b"a", 60.0, period, false, limit, 0).unwrap();
    let d = table.decide(&req, d_end).unwrap();
    assert_eq!(d.pruned, 1);
    assert_eq!(d.reply.holders, 3);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// The server's clock steps backwards (NTP, a promoted replica whose clock is behind):
    /// the server's instants run behind real time by a growing offset, the holders keep
    /// real (monotonic) time. Entries written before a step end later in real time than
    /// the server now thinks, so a step back only under-issues: the shares in use still
    /// sum to at most the rate (bursts the cap) at every real instant.
    #[test]
    fn a_clock_stepping_back_never_lets_the_fleet_exceed_the_rate(
        holders in 1usize..7,
        rate in 0.5f64..1000.0,
        cap in 0.5f64..1000.0,
        events in prop::collection::vec(
            (0u64..300, 0usize..7, 0u64..300, 0u64..300, 0.0f64..500.0, 10u64..1500,
             0u8..10, prop_oneof![4 => Just(0u64), 1 => 0u64..5000]),
            1..150),
    ) {
        let limit = Limit::new(rate, cap).unwrap();
        let mut table = ShareTable::new(limit, 0);
        let mut sims = vec![Sim::default(); holders];
        let mut uses: Vec<Use> = Vec::new();
        let (mut real, mut behind) = (T0, 0u64);
        for (gap_ms, who, d1_ms, d2_ms, want, period_ms, kind, step_ms) in events {
            real += gap_ms * MS;
            behind += step_ms * MS;
            let who = who % holders;
            let sim = &mut sims[who];
            if kind == 0 {
                sim.dead = true;
            }
            if sim.dead || sim.ready_at > real {
                continue;
            }
            let release = kind == 1;
            let s = real.saturating_sub(d1_ms * MS).max(sim.ready_at);
            let answer = real + d2_ms * MS;
            let id = [b'h', who as u8];
            let req = ShareRequest::new(&id, want, period_ms, release, limit, 0).unwrap();
            let d = table.decide(&req, real - behind).unwrap();
            if let Some(i) = sim.current.take() {
                let stop = answer.min(s + HOLD).max(uses[i].from);
                uses[i].until = uses[i].until.min(stop);
            }
            sim.ready_at = answer;
            let lease = d.reply.lease_ms * MS;
            let margin = lease / 100 + 10 * MS;
            if lease > margin && answer < s + lease - margin {
                uses.push(Use {
                    rate: d.reply.rate,
                    burst: d.reply.burst,
                    from: answer,
                    until: s + lease - margin,
                    decided: real,
                    limit: (rate, cap),
                });
                sim.current = Some(uses.len() - 1);
            }
        }
        check_uses(&uses, Nanos::MAX / 4, false).map_err(TestCaseError::fail)?;
        check_uses(&uses, Nanos::MAX / 4, true).map_err(TestCaseError::fail)?;
    }
}

/// A clock stepping forward is not covered by the bound: an entry's lease, kept in server
/// instants, ends early in real time while its holder (on a monotonic clock) still uses
/// it, so the server gives the same rate again. What this costs, exactly: after a forward
/// step of `d`, the fleet may use up to twice the rate for `min(d, lease)`.
#[test]
fn a_clock_stepping_forward_frees_shares_still_in_use() {
    let limit = Limit::new(100.0, 10.0).unwrap();
    let mut table = ShareTable::new(limit, 0);
    let a = ShareRequest::new(b"a", 100.0, 1000, false, limit, 0).unwrap();
    assert_eq!(table.decide(&a, T0).unwrap().reply.rate, 100.0);
    // Real time T0 + 1 s: holder a uses its share until about T0 + 2.96 s. The server's
    // clock steps 3 s forward.
    let b = ShareRequest::new(b"b", 100.0, 1000, false, limit, 0).unwrap();
    let got = table.decide(&b, T0 + 4000 * MS).unwrap().reply;
    assert_eq!(got.rate, 100.0, "a's share, still in use, is given again");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// A holder that asks for a period shorter than the hold, alone at first, then joined
    /// by others: its share shrinks, and what it gave up comes free once its hold ends,
    /// however short its period. Every holder calls again as the clients do: `refresh_ms`
    /// after the answer, less up to a tenth. The shrinking holder never calls within a
    /// hold that keeps more than its share counted, and within a period of it, its hold
    /// and a period of theirs, every holder is at its fair share (the bound holding at
    /// every call).
    #[test]
    fn a_short_period_holder_frees_what_it_gave_up_within_a_hold(
        l in 0usize..3,
        first_period in 10u64..250,
        first_want in prop_oneof![Just(0.0), 1.0f64..300.0, Just(1e15)],
        joining in prop::collection::vec((prop_oneof![1.0f64..300.0, Just(1e15)], 10u64..2000), 1..4),
        join_ms in 0u64..250,
        seed in any::<u64>(),
    ) {
        let (rate, cap) = LIMITS[l];
        let limit = Limit::new(rate, cap).unwrap();
        let mut table = ShareTable::new(limit, 0);
        let mut holders = vec![("a".to_string(), first_want, first_period)];
        for (i, &(w, p)) in joining.iter().enumerate() {
            holders.push((format!("n{i}"), w, p));
        }
        let mut seed = seed | 1;
        let mut jitter = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            0.9 + 0.1 * (seed >> 11) as f64 / (1u64 << 53) as f64
        };
        // When each calls next (the first alone at T0, the others joining later).
        let t_join = T0 + join_ms * MS;
        let mut next: Vec<Nanos> = (0..holders.len())
            .map(|i| if i == 0 { T0 } else { t_join + i as u64 })
            .collect();
        let mut last: Vec<Option<rl_core::ShareReply>> = vec![None; holders.len()];
        let mut last_at = vec![0; holders.len()];
        let eff = |p: u64| p.max(300) * MS;
        let longest = holders[1..].iter().map(|h| eff(h.2)).max().unwrap();
        let horizon = t_join + eff(first_period) + HOLD + longest + 100 * MS;
        loop {
            let (i, &now) = next.iter().enumerate().min_by_key(|&(_, t)| *t).unwrap();
            if now > horizon {
                break;
            }
            let (id, want, period) = &holders[i];
            // A call within a hold that keeps more than the share counted.
            if let Some(h) = table.holders().iter().find(|h| *h.id == *id.as_bytes()) {
                prop_assert!(
                    !h.shrank_within_hold(now),
                    "{id} called {} ms after its call that left {} held over its share {}",
                    (now - last_at[i]) / MS, h.held_rate, h.rate
                );
            }
            let req = ShareRequest::new(id.as_bytes(), *want, *period, false, limit, 0).unwrap();
            let d = table.decide(&req, now).unwrap();
            let (r, b) = committed(&table, now);
            prop_assert!(r <= exact(rate) && b <= exact(cap), "over the limit at {}", now - T0);
            last[i] = Some(d.reply);
            last_at[i] = now;
            next[i] = now + (d.reply.refresh_ms as f64 * jitter() * MS as f64) as Nanos;
        }
        let wants: Vec<(usize, f64)> = holders.iter().enumerate().map(|(i, h)| (i, h.1)).collect();
        let got: Vec<rl_core::ShareReply> = last.iter().map(|r| r.unwrap()).collect();
        check_fair(rate, cap, &wants, &got)?;
    }
}

/// Limits at the extremes (1e-9 and 1e15, within `cap / rate` of 100 years) and between.
const EXTREMES: [(f64, f64); 5] = [
    (1e-9, 1e-9),
    (1e15, 1e15),
    (1e15, 1e-9),
    (1e-9, 1.0),
    (100.0, 40.0),
];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Holders that call as told (`refresh_ms` after the answer, up to a tenth early), with
    /// periods of 10 to 400 ms, delays both ways up to 400 ms, wants that flap between
    /// nothing and everything, limits and versions changing among the extremes, and
    /// holders that release mid-hold (and come back as new holders): the server never
    /// counts more than the rate in force (nor more than before a drop), the shares in
    /// use never exceed the bound at any instant, and no holder calls within a hold that
    /// keeps more than its share counted. Calls are decided in server time order.
    #[test]
    fn holders_calling_as_told_at_extreme_limits_keep_the_bound_and_never_call_in_a_hold(
        holders in 1usize..6,
        first in 0usize..5,
        periods in prop::collection::vec(10u64..400, 6),
        steps in prop::collection::vec(
            (0u64..400, 0u64..400, prop_oneof![Just(0.0), Just(1e-9), 0.0f64..300.0, Just(1e15)],
             0u8..20, 0usize..5, 0u64..3, 0.9f64..1.0),
            1..150),
    ) {
        let (mut rate, mut cap) = EXTREMES[first];
        let mut version = 0u64;
        let mut table = ShareTable::new(Limit::new(rate, cap).unwrap(), 0);
        // Per holder: its id's generation, when its next call is sent and decided, its use.
        let mut gen = vec![0u32; holders];
        let mut sent: Vec<Nanos> = (0..holders as u64).map(|i| T0 + i * MS).collect();
        let mut decided = sent.clone();
        let mut current: Vec<Option<usize>> = vec![None; holders];
        let mut uses: Vec<Use> = Vec::new();
        let mut max_lease = HOLD;
        for (d1_ms, d2_ms, want, kind, which, v, jitter) in steps {
            let (who, &now) = decided.iter().enumerate().min_by_key(|&(_, t)| *t).unwrap();
            if kind == 0 {
                (rate, cap) = EXTREMES[which];
                version += v;
            }
            let release = kind == 1;
            let s = sent[who];
            let answer = now + d2_ms * MS;
            let id = format!("h{who}-{}", gen[who]);
            if let Some(h) = table.holders().iter().find(|h| *h.id == *id.as_bytes()) {
                prop_assert!(
                    !h.shrank_within_hold(now),
                    "{id} called within a hold that keeps {} over its share {}",
                    h.held_rate, h.rate
                );
            }
            let limit = Limit::new(rate, cap).unwrap();
            let req = ShareRequest::new(id.as_bytes(), want, periods[who], release, limit, version).unwrap();
            let before = table.clone();
            let d = table.decide(&req, now).unwrap();
            let resolved = (table.limit().rate(), table.limit().cap());
            let (r0, b0) = committed(&before, now);
            let (r1, b1) = committed(&table, now);
            prop_assert!(r1 <= exact(resolved.0).max(r0), "server rates {} > {}", r1, resolved.0);
            prop_assert!(b1 <= exact(resolved.1).max(b0), "server bursts {} > {}", b1, resolved.1);
            if d.written {
                prop_assert_eq!(table.last_end(), Some(d.expires_at));
            }
            if let Some(i) = current[who].take() {
                let stop = answer.min(s + HOLD).max(uses[i].from);
                uses[i].until = uses[i].until.min(stop);
            }
            let lease = d.reply.lease_ms * MS;
            max_lease = max_lease.max(lease);
            let margin = lease / 100 + 10 * MS;
            if lease > margin && answer < s + lease - margin {
                uses.push(Use {
                    rate: d.reply.rate,
                    burst: d.reply.burst,
                    from: answer,
                    until: s + lease - margin,
                    decided: now,
                    limit: resolved,
                });
                current[who] = Some(uses.len() - 1);
            }
            if release {
                // A released holder is gone; a new one (a new id) starts when it would
                // have called.
                gen[who] += 1;
                current[who] = None;
            }
            sent[who] = answer + (d.reply.refresh_ms as f64 * jitter * MS as f64) as Nanos;
            decided[who] = sent[who] + d1_ms * MS;
        }
        check_uses(&uses, max_lease, false).map_err(TestCaseError::fail)?;
        check_uses(&uses, max_lease, true).map_err(TestCaseError::fail)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Eager holders call at arbitrary times (as often as every millisecond, whatever
    /// `refresh_ms` said, their answers delayed), the others as told; an eager holder
    /// first holds the whole rate alone. The bound holds at every instant (the shares in
    /// use, as the holders' rules have them use each answer, never sum above the rate or
    /// the cap), what a holder gives up comes free within its old lease, and within one
    /// lease of the others joining (plus twice the longest gap an eager holder leaves
    /// between its calls, 400 ms), every holder's answer is its max-min share.
    #[test]
    fn holders_calling_at_arbitrary_times_keep_the_bound_and_converge_within_a_lease(
        l in 0usize..3,
        wants in prop::collection::vec(prop_oneof![Just(0.0), 1.0f64..300.0, Just(1e15)], 2..6),
        eager in prop::collection::vec(any::<bool>(), 6),
        gaps in prop::collection::vec(1u64..400, 64),
        delays in prop::collection::vec((0u64..60, 0u64..60), 64),
        period_ms in 300u64..1500,
        join_ms in 0u64..500,
    ) {
        let (rate, cap) = LIMITS[l];
        let limit = Limit::new(rate, cap).unwrap();
        let mut table = ShareTable::new(limit, 0);
        let n = wants.len();
        // Holder 0 is eager and alone first; the others join at `join`.
        let is_eager = |i: usize| i == 0 || eager[i];
        let join = T0 + join_ms * MS;
        let mut sent: Vec<Nanos> = (0..n).map(|i| if i == 0 { T0 } else { join + i as u64 }).collect();
        let mut decided = sent.clone();
        let mut current: Vec<Option<usize>> = vec![None; n];
        let mut last: Vec<Option<rl_core::ShareReply>> = vec![None; n];
        let mut last_at: Vec<Nanos> = vec![0; n];
        let mut uses: Vec<Use> = Vec::new();
        let lease = period_ms * LEASE_PERIODS * MS;
        // An eager holder may also wait up to 400 ms between calls: it shrinks at its first
        // call after the join, and the others may be in such a gap when its hold ends.
        let horizon = join + lease + 2 * 400 * MS;
        let mut k = 0usize;
        loop {
            let (who, &now) = decided.iter().enumerate().min_by_key(|&(_, t)| *t).unwrap();
            if now > horizon {
                break;
            }
            k += 1;
            let (d1, d2) = delays[k % delays.len()];
            let id = format!("h{who}");
            let req = ShareRequest::new(id.as_bytes(), wants[who], period_ms, false, limit, 0).unwrap();
            let before = table.clone();
            let d = table.decide(&req, now).unwrap();
            let (r1, b1) = committed(&table, now);
            prop_assert!(r1 <= exact(rate) && b1 <= exact(cap), "server over the limit");
            if !d.written {
                prop_assert_eq!(&table, &before);
            }
            // No entry holds more than its share past its hold, and a hold never ends
            // later than the lease it came from allowed.
            for h in table.holders() {
                prop_assert!(h.held_until <= now + HOLD);
            }
            let s = sent[who];
            let answer = now + d2 * MS;
            if let Some(i) = current[who].take() {
                let stop = answer.min(s + HOLD).max(uses[i].from);
                uses[i].until = uses[i].until.min(stop);
            }
            let lease_got = d.reply.lease_ms * MS;
            let margin = lease_got / 100 + 10 * MS;
            if lease_got > margin && answer < s + lease_got - margin {
                uses.push(Use {
                    rate: d.reply.rate,
                    burst: d.reply.burst,
                    from: answer,
                    until: s + lease_got - margin,
                    decided: now,
                    limit: (rate, cap),
                });
                current[who] = Some(uses.len() - 1);
            }
            last[who] = Some(d.reply);
            last_at[who] = now;
            sent[who] = if is_eager(who) {
                answer + gaps[k % gaps.len()] * MS
            } else {
                answer + d.reply.refresh_ms * MS
            };
            decided[who] = sent[who] + d1 * MS;
        }
        check_uses(&uses, lease, false).map_err(TestCaseError::fail)?;
        check_uses(&uses, lease, true).map_err(TestCaseError::fail)?;
        // Within a lease of the join (and the gaps), every holder is answered its max-min share
        // (an eager holder's last answer may come from its entry: the same share).
        let w: Vec<(usize, f64)> = wants.iter().copied().enumerate().collect();
        let got: Vec<rl_core::ShareReply> = last.iter().map(|r| r.unwrap()).collect();
        for (i, &at) in last_at.iter().enumerate() {
            prop_assert!(at + lease >= horizon, "holder {i} last called at {}", at - T0);
        }
        check_fair(rate, cap, &w, &got)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Holders calling as told (`refresh_ms` after the answer, up to a tenth early),
    /// settled; then every want steps (up or down, any holder). Within two periods and a
    /// hold of the step every holder's answer is its max-min share under the new wants
    /// (the holders cut by the division come back in half a period, the ones far short
    /// within a quarter, the others once a period), and the bound holds at every call.
    #[test]
    fn a_step_in_demand_is_met_within_two_periods_and_a_hold(
        l in 0usize..3,
        before in prop::collection::vec(prop_oneof![Just(0.0), 1.0f64..300.0, Just(1e15)], 2..6),
        after in prop::collection::vec(prop_oneof![Just(0.0), 1.0f64..300.0, Just(1e15)], 6),
        period_ms in 300u64..1500,
        step_ms in 0u64..3000,
        seed in any::<u64>(),
    ) {
        let (rate, cap) = LIMITS[l];
        let limit = Limit::new(rate, cap).unwrap();
        let mut table = ShareTable::new(limit, 0);
        let n = before.len();
        let mut seed = seed | 1;
        let mut jitter = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            0.9 + 0.1 * (seed >> 11) as f64 / (1u64 << 53) as f64
        };
        let period = period_ms * MS;
        let step = T0 + 4 * LEASE_PERIODS * period + step_ms * MS;
        let horizon = step + 2 * period + HOLD;
        let mut next: Vec<Nanos> = (0..n as u64).map(|i| T0 + i).collect();
        let mut last: Vec<Option<rl_core::ShareReply>> = vec![None; n];
        loop {
            let (i, &now) = next.iter().enumerate().min_by_key(|&(_, t)| *t).unwrap();
            if now > horizon {
                break;
            }
            let want = if now < step { before[i] } else { after[i] };
            let id = format!("h{i}");
            let req = ShareRequest::new(id.as_bytes(), want, period_ms, false, limit, 0).unwrap();
            let d = table.decide(&req, now).unwrap();
            let (r, b) = committed(&table, now);
            prop_assert!(r <= exact(rate) && b <= exact(cap), "over the limit");
            last[i] = Some(d.reply);
            next[i] = now + (d.reply.refresh_ms as f64 * jitter() * MS as f64) as Nanos;
        }
        let w: Vec<(usize, f64)> = (0..n).map(|i| (i, after[i])).collect();
        let got: Vec<rl_core::ShareReply> = last.iter().map(|r| r.unwrap()).collect();
        check_fair(rate, cap, &w, &got)?;
    }
}

/// Limits at the extremes a key may hold, for pins and callers alike.
const PIN_LIMITS: [(f64, f64); 5] = [
    (100.0, 40.0),
    (0.3, 0.001),
    (1e15, 1e15),
    (1e-9, 1e-9),
    (1e15, 1e-9),
];

#[derive(Debug, Clone)]
enum PinAct {
    Call {
        want: f64,
        period_ms: u64,
    },
    Release,
    Die,
    Limit {
        which: usize,
        version: u64,
    },
    /// `which` < 5: a rate pin to `PIN_LIMITS[which]`; 5 `BLOCK`; 6 `EXEMPT`. `px_ms` 0: no end.
    Pin {
        which: usize,
        px_ms: u64,
    },
    Unpin,
}

fn pin_act() -> impl Strategy<Value = PinAct> {
    prop_oneof![
        8 => (prop_oneof![Just(0.0), 0.0f64..300.0, Just(1e15)], prop_oneof![Just(10u64), 10u64..2000])
            .prop_map(|(want, period_ms)| PinAct::Call { want, period_ms }),
        1 => Just(PinAct::Release),
        1 => Just(PinAct::Die),
        1 => (0usize..5, 0u64..4).prop_map(|(which, version)| PinAct::Limit { which, version }),
        2 => (0usize..7, prop_oneof![Just(0u64), 1u64..3000]).prop_map(|(which, px_ms)| PinAct::Pin { which, px_ms }),
        1 => Just(PinAct::Unpin),
    ]
}

fn share_pin(which: usize, until: Nanos) -> SharePin {
    match which {
        0..5 => {
            let (r, c) = PIN_LIMITS[which];
            SharePin::new(PinKind::Rate, Some(Limit::new(r, c).unwrap()), until).unwrap()
        }
        5 => SharePin::new(PinKind::Block, None, until).unwrap(),
        _ => SharePin::new(PinKind::Exempt, None, until).unwrap(),
    }
}

/// What a stored table reloads as (RDB, RESTORE): the one validator's answer.
fn reloaded(t: &ShareTable) -> ShareTable {
    let (l, v, h, p) = t.clone().into_parts();
    ShareTable::validate_pinned(l.rate(), l.cap(), v, h, p).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    /// Pins set, replaced, ended by `PX` and removed among holders' calls, limit changes
    /// and deaths, at extreme limits, with calls delayed both ways; the key expires at its
    /// expiry as Redis would expire it. The shares holders may count (an `EXEMPT` answer
    /// counts nothing, by the operator's choice) never sum above the largest limit that
    /// governed a decision within a lease before (so within one lease of a pin they are
    /// within the pinned total); the server never raises what it counts above the limit
    /// that governs; a live pin keeps the key; a replica applying the effects and a reload
    /// of every state give the same table.
    #[test]
    fn pins_flapping_at_extremes_keep_the_bound_and_replicas_agree(
        holders in 1usize..6,
        first in 0usize..5,
        events in prop::collection::vec(
            (0u64..400, 0usize..6, 0u64..600, 0u64..600, pin_act()), 1..150),
    ) {
        let (mut rate, mut cap) = PIN_LIMITS[first];
        let mut version = 0u64;
        let mut table: Option<ShareTable> = None;
        let mut replica: Option<ShareTable> = None;
        let mut sims = vec![Sim::default(); holders];
        let mut uses: Vec<Use> = Vec::new();
        let mut now = T0;
        let mut max_lease = HOLD;
        for (gap_ms, who, d1_ms, d2_ms, act) in events {
            now += gap_ms * MS;
            // Redis expires the key at its expiry (the replica with its master).
            if table.as_ref().is_some_and(|t| t.expires_at() <= now) {
                prop_assert!(table.as_ref().unwrap().live_pin(now).is_none(), "a pinned key expired");
                table = None;
                replica = None;
            }
            let who = who % holders;
            let (period_ms, want, release) = match act {
                PinAct::Limit { which, version: v } => {
                    (rate, cap) = PIN_LIMITS[which];
                    version = v;
                    continue;
                }
                PinAct::Die => {
                    sims[who].dead = true;
                    continue;
                }
                PinAct::Pin { which, px_ms } => {
                    let p = share_pin(which, if px_ms == 0 { 0 } else { now + px_ms * MS });
                    let t = match table.as_mut() {
                        Some(t) => {
                            t.set_pin(Some(p), now);
                            t
                        }
                        None => {
                            let l = p.limit.unwrap_or(Limit::new(1.0, 1.0).unwrap());
                            table = Some(ShareTable::validate_pinned(l.rate(), l.cap(), 0, vec![], Some(p)).unwrap());
                            replica = Some(ShareTable::new(l, 0));
                            table.as_mut().unwrap()
                        }
                    };
                    let r = replica.as_mut().unwrap();
                    r.apply_pinned(t.limit(), t.version(), Some(now), None, t.pin().copied()).unwrap();
                    prop_assert_eq!(&*r, &*t);
                    prop_assert!(t.expires_at() > now);
                    continue;
                }
                PinAct::Unpin => {
                    if let Some(t) = table.as_mut().filter(|t| t.live_pin(now).is_some()) {
                        t.set_pin(None, now);
                        if t.holders().is_empty() {
                            // The key is deleted (and so on the replica).
                            table = None;
                            replica = None;
                        } else {
                            let r = replica.as_mut().unwrap();
                            r.apply_pinned(t.limit(), t.version(), Some(now), None, None).unwrap();
                            prop_assert_eq!(&*r, &*t);
                        }
                    }
                    continue;
                }
                PinAct::Call { want, period_ms } => (period_ms, want, false),
                PinAct::Release => (100, 0.0, true),
            };
            let sim = &mut sims[who];
            if sim.dead || sim.ready_at > now {
                continue;
            }
            let s = now.saturating_sub(d1_ms * MS).max(sim.ready_at);
            let answer = now + d2_ms * MS;
            let id = format!("holder-{who}");
            let limit = Limit::new(rate, cap).unwrap();
            let req = ShareRequest::new(id.as_bytes(), want, period_ms, release, limit, version)
                .unwrap();
            let t = table.get_or_insert_with(|| ShareTable::new(limit, version));
            let r = replica.get_or_insert_with(|| ShareTable::new(limit, version));
            let before = t.clone();
            let pin = t.live_pin(now).copied();
            let d = t.decide(&req, now).unwrap();
            prop_assert_eq!(d.pinned, pin.map(|p| p.kind));
            // The limit that governed: the pin's, else the callers' (resolved).
            let governed = match pin.and_then(|p| p.limit) {
                Some(l) => (l.rate(), l.cap()),
                None => (t.limit().rate(), t.limit().cap()),
            };
            let (r0, b0) = committed(&before, now);
            let (r1, b1) = committed(t, now);
            prop_assert!(r1 <= exact(governed.0).max(r0.clone()), "server rates {} > {}", r1, governed.0);
            prop_assert!(b1 <= exact(governed.1).max(b0.clone()), "server bursts {} > {}", b1, governed.1);
            if !d.written {
                prop_assert_eq!(&*t, &before);
            } else {
                let e = t.holders()[d.index].clone();
                r.apply_pinned(t.limit(), t.version(), Some(now), Some(e), t.pin().copied()).unwrap();
                prop_assert_eq!(&*r, &*t);
                prop_assert_eq!(t.expires_at(), d.expires_at);
                prop_assert!(t.pin().is_none_or(|p| p.live_at(now)), "an ended pin outlived a write");
            }
            if t.holders().is_empty() && t.pin().is_none() {
                // A call that wrote nothing on a key that did not exist: none is stored.
                table = None;
                replica = None;
            } else {
                prop_assert_eq!(&reloaded(t), &*t);
            }
            let blocked = pin.is_some_and(|p| p.kind == PinKind::Block) && !release;
            if blocked {
                prop_assert_eq!((d.reply.rate, d.reply.burst, d.reply.lease_ms), (0.0, 0.0, 0));
            }
            if let Some(i) = sim.current.take() {
                let stop = answer.min(s + HOLD).max(uses[i].from);
                uses[i].until = uses[i].until.min(stop);
            }
            sim.ready_at = answer;
            let exempt = pin.is_some_and(|p| p.kind == PinKind::Exempt) && !release;
            if exempt {
                // Uncounted by the holder; never past the pin's end.
                let until = pin.unwrap().until;
                prop_assert!(until == 0 || now + d.reply.lease_ms * MS <= until);
                continue;
            }
            let lease = d.reply.lease_ms * MS;
            max_lease = max_lease.max(lease);
            let margin = lease / 100 + 10 * MS;
            if lease > 0 && answer < s + lease - margin.min(lease) {
                uses.push(Use {
                    rate: d.reply.rate,
                    burst: d.reply.burst,
                    from: answer,
                    until: s + lease - margin.min(lease),
                    decided: now,
                    limit: governed,
                });
                sim.current = Some(uses.len() - 1);
            }
        }
        check_uses(&uses, max_lease, false).map_err(TestCaseError::fail)?;
        check_uses(&uses, max_lease, true).map_err(TestCaseError::fail)?;
    }

    /// A settled fleet calling as told (up to a tenth early); an operator pins the key to
    /// a lower limit (or `BLOCK`s it) at `pin_at`. From one lease after the pin (the
    /// holders' margins included) the shares in use sum to at most the pinned rate and
    /// cap, and the server's counted total is within them; once the pin is removed the
    /// holders are back under the callers' limit, never above it.
    #[test]
    fn holders_reach_the_pinned_total_within_one_lease(
        l in 0usize..3,
        p in 0usize..6,
        wants in prop::collection::vec(prop_oneof![Just(0.0), 1.0f64..300.0, Just(1e15)], 1..6),
        period_ms in 300u64..1500,
        pin_ms in 0u64..3000,
        seed in any::<u64>(),
    ) {
        let (rate, cap) = LIMITS[l];
        let limit = Limit::new(rate, cap).unwrap();
        let pin = share_pin(p, 0);
        let pinned = pin.limit.map_or((0.0, 0.0), |l| (l.rate(), l.cap()));
        let mut table = ShareTable::new(limit, 0);
        let n = wants.len();
        let mut seed = seed | 1;
        let mut jitter = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            0.9 + 0.1 * (seed >> 11) as f64 / (1u64 << 53) as f64
        };
        let period = period_ms * MS;
        let lease = period * LEASE_PERIODS;
        let pin_at = T0 + 2 * lease + pin_ms * MS;
        let unpin_at = pin_at + 2 * lease;
        let horizon = unpin_at + 2 * lease;
        let mut next: Vec<Nanos> = (0..n as u64).map(|i| T0 + i).collect();
        let mut current: Vec<Option<usize>> = vec![None; n];
        let mut uses: Vec<Use> = Vec::new();
        let (mut pinned_yet, mut unpinned_yet) = (false, false);
        loop {
            let (i, &now) = next.iter().enumerate().min_by_key(|&(_, t)| *t).unwrap();
            if now > horizon {
                break;
            }
            if !pinned_yet && now >= pin_at {
                table.set_pin(Some(pin), pin_at);
                pinned_yet = true;
            }
            if !unpinned_yet && now >= unpin_at {
                table.set_pin(None, unpin_at);
                unpinned_yet = true;
            }
            let id = format!("h{i}");
            let req = ShareRequest::new(id.as_bytes(), wants[i], period_ms, false, limit, 0).unwrap();
            let d = table.decide(&req, now).unwrap();
            let (r, b) = committed(&table, now);
            if now >= pin_at + lease + HOLD && now < unpin_at {
                prop_assert!(r <= exact(pinned.0) && b <= exact(pinned.1), "over the pin {} > {}", r, pinned.0);
            }
            prop_assert!(r <= exact(rate.max(pinned.0)) && b <= exact(cap.max(pinned.1)));
            // The holder uses its answer from when it comes (decided now, no delay here)
            // until its lease ends less its margin; the old one stops now.
            if let Some(k) = current[i].take() {
                uses[k].until = uses[k].until.min(now.max(uses[k].from));
            }
            let lease_got = d.reply.lease_ms * MS;
            let margin = lease_got / 100 + 10 * MS;
            if lease_got > margin {
                uses.push(Use {
                    rate: d.reply.rate,
                    burst: d.reply.burst,
                    from: now,
                    until: now + lease_got - margin,
                    decided: now,
                    limit: (rate, cap),
                });
                current[i] = Some(uses.len() - 1);
            }
            next[i] = now + (d.reply.refresh_ms.max(1) as f64 * jitter() * MS as f64) as Nanos;
        }
        // Every instant from one lease after the pin to its removal: within the pin.
        let mut instants: Vec<Nanos> = uses.iter().map(|u| u.from).collect();
        instants.extend(uses.iter().map(|u| u.until.saturating_sub(1)));
        instants.push(pin_at + lease);
        for &t in instants.iter().filter(|&&t| t >= pin_at + lease && t < unpin_at) {
            let live = uses.iter().filter(|u| u.from <= t && t < u.until);
            let (sr, sb) = live.fold((zero(), zero()), |(r, b), u| (r + exact(u.rate), b + exact(u.burst)));
            prop_assert!(sr <= exact(pinned.0) && sb <= exact(pinned.1),
                "at {} ms after the pin: {} > {}", (t - pin_at) / MS, sr, pinned.0);
        }
        // After the unpin, within a lease, within the callers' limit again.
        for &t in instants.iter().filter(|&&t| t >= unpin_at + lease) {
            let live = uses.iter().filter(|u| u.from <= t && t < u.until);
            let (sr, sb) = live.fold((zero(), zero()), |(r, b), u| (r + exact(u.rate), b + exact(u.burst)));
            prop_assert!(sr <= exact(rate) && sb <= exact(cap));
        }
    }
}
