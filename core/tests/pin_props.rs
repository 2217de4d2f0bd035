//! Property tests of pins: any sequence of takes (callers on two limits, with versions),
//! pins of every kind set, replaced, ended by time or removed, and key expiry keeps every
//! pinned bucket within its pinned cap, never grants through a block, debits nothing for
//! an exempt grant, and lets out no more than `cap + rate * elapsed` for the largest limit
//! involved (exempt grants, which count nothing by design, aside).

use proptest::prelude::*;
use rl_core::pin::{self, Gate, PinKind};
use rl_core::{Bucket, Limit, Nanos};

const T0: Nanos = 1_700_000_000_000_000_000;
const MS: Nanos = 1_000_000;

#[derive(Debug, Clone)]
enum Op {
    Take { n: u64, caller: usize, version: u64 },
    PinRate { limit: usize, px_ms: u64 },
    Block { px_ms: u64 },
    Exempt { px_ms: u64 },
    Unpin,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (1u64..15, 0usize..2, 0u64..3).prop_map(|(n, caller, version)| Op::Take { n, caller, version }),
        2 => (0usize..3, prop_oneof![Just(0u64), 1u64..3000]).prop_map(|(limit, px_ms)| Op::PinRate { limit, px_ms }),
        1 => prop_oneof![Just(0u64), 1u64..3000].prop_map(|px_ms| Op::Block { px_ms }),
        1 => prop_oneof![Just(0u64), 1u64..3000].prop_map(|px_ms| Op::Exempt { px_ms }),
        1 => Just(Op::Unpin),
    ]
}

fn step() -> impl Strategy<Value = Nanos> {
    prop_oneof![8 => 0u64..200 * MS, 1 => 0u64..5_000 * MS]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    #[test]
    fn pins_never_mint(
        callers in prop::collection::vec((1.0f64..200.0, 20.0f64..150.0), 2),
        pins in prop::collection::vec((0.5f64..300.0, 15.0f64..200.0), 3),
        ops in prop::collection::vec((step(), op()), 1..150),
    ) {
        let callers: Vec<Limit> = callers.iter().map(|&(r, c)| Limit::new(r, c).unwrap()).collect();
        let pins: Vec<Limit> = pins.iter().map(|&(r, c)| Limit::new(r, c).unwrap()).collect();
        let rate_max = callers.iter().chain(&pins).map(|l| l.rate()).fold(0.0, f64::max);
        let cap_max = callers.iter().chain(&pins).map(|l| l.cap()).fold(0.0, f64::max);
        let mut stored: Option<Bucket> = None;
        let mut now = T0;
        let mut out = 0.0f64;
        for (dt, op) in ops {
            now += dt;
            // The key's expiry, as Redis applies it.
            if stored.is_some_and(|b| b.expires_at() <= now) {
                stored = None;
            }
            match op {
                Op::Take { n, caller, version } => {
                    let o = pin::open(stored.as_ref(), callers[caller], version, now);
                    let mut level = o.level;
                    let before = level.tokens();
                    if let Some(PinKind::Rate) = o.pinned {
                        let p = stored.and_then(|b| b.pin()).unwrap();
                        prop_assert!(p.live_at(now));
                        prop_assert!(level.tokens() <= level.limit().cap() + 1e-9);
                    }
                    let gate = level.gate();
                    let granted = level.try_take(n as f64);
                    match gate {
                        Gate::Blocked(_) => prop_assert!(!granted),
                        Gate::Exempt => {
                            // Granted, nothing debited, nothing written.
                            prop_assert_eq!(level.tokens(), before);
                            continue;
                        }
                        Gate::Open => {}
                    }
                    if granted {
                        out += n as f64;
                    }
                    if granted || o.applied.must_write() {
                        let kept = pin::kept(stored.as_ref(), callers[caller], version, now);
                        stored = Some(level.bucket().with_pin(kept));
                    }
                }
                Op::PinRate { limit, px_ms } => {
                    let until = if px_ms == 0 { 0 } else { now + px_ms * MS };
                    let b = pin::pinned(stored.as_ref(), PinKind::Rate, Some(pins[limit]), until, now);
                    // A key that held nothing holds only the pin (None: as absent) until
                    // its first call; any other starts at most full under the pinned cap.
                    if let Some((l, _)) = pin::level_of_stored(&b, now) {
                        prop_assert!(l.tokens() <= pins[limit].cap() + 1e-9);
                    }
                    stored = Some(b);
                }
                Op::Block { px_ms } | Op::Exempt { px_ms } => {
                    let kind = if matches!(op, Op::Block { .. }) { PinKind::Block } else { PinKind::Exempt };
                    let until = if px_ms == 0 { 0 } else { now + px_ms * MS };
                    let before = stored.and_then(|b| pin::level_of_stored(&b, now)).map(|(l, _)| l.tokens());
                    let b = pin::pinned(stored.as_ref(), kind, None, until, now);
                    let after = pin::level_of_stored(&b, now).map(|(l, _)| l.tokens());
                    // Blocking or exempting moves no token.
                    if let (Some(x), Some(y)) = (before, after) {
                        prop_assert!(y <= x + 1e-6, "{x} -> {y}");
                    }
                    stored = Some(b);
                }
                Op::Unpin => {
                    if let Some(b) = stored {
                        if b.pin().is_some_and(|p| p.live_at(now)) {
                            let before = pin::level_of_stored(&b, now).map(|(l, _)| l.tokens());
                            stored = pin::unpinned(&b, now);
                            let after = stored.and_then(|b| pin::level_of_stored(&b, now)).map(|(l, _)| l.tokens());
                            if let (Some(x), Some(y), Some(p)) = (before, after, b.pin()) {
                                if p.kind == PinKind::Rate {
                                    prop_assert!(y <= x + 1e-6, "unpin minted: {x} -> {y}");
                                }
                            }
                        }
                    }
                }
            }
            let elapsed = (now - T0) as f64 / 1e9;
            prop_assert!(
                out <= cap_max + rate_max * elapsed + 1e-6,
                "let out {out} > {cap_max} + {rate_max} * {elapsed}"
            );
        }
    }
}

/// A key pinned before anyone used it, then left: with a BLOCK or EXEMPT pin it holds no
/// bucket once the pin ends (a full bucket under the caller's limit, as absent); with a
/// rate pin the tokens carry over and nothing appears.
#[test]
fn a_key_pinned_before_use() {
    let caller = Limit::new(10.0, 100.0).unwrap();
    let small = Limit::new(1.0, 5.0).unwrap();
    let b = pin::pinned(None, PinKind::Block, None, T0 + 1000 * MS, T0);
    let mut l = pin::open(Some(&b), caller, 0, T0).level;
    assert!(!l.try_take(1.0));
    assert_eq!(l.wait_for(1.0), Some(1000 * MS));
    let l = pin::open(Some(&b), caller, 0, T0 + 1000 * MS).level;
    assert_eq!(l.tokens(), 100.0);
    assert!(pin::level_of_stored(&b, T0 + 1000 * MS).is_none());

    let b = pin::pinned(None, PinKind::Rate, Some(small), T0 + 1000 * MS, T0);
    let o = pin::open(Some(&b), caller, 0, T0);
    let mut l = o.level;
    assert_eq!(l.tokens(), 5.0);
    assert!(l.try_take(5.0));
    let b = l.bucket().with_pin(pin::kept(Some(&b), caller, 0, T0));
    // The pin ends at T0 + 1 s: 1 token refilled under it, then 10/s under the caller's.
    let o = pin::open(Some(&b), caller, 0, T0 + 1500 * MS);
    assert!(
        (o.level.tokens() - 6.0).abs() < 1e-6,
        "{}",
        o.level.tokens()
    );
    assert!(o.pinned.is_none());
    assert!(pin::kept(Some(&b), caller, 0, T0 + 1500 * MS).is_none());
    // A permanent pin keeps the key: no expiry.
    let b = pin::pinned(None, PinKind::Exempt, None, 0, T0);
    assert_eq!(b.expires_at(), rl_core::NEVER);
}

/// A rate pin keeps the callers' limit aside: a newer VERSION during the pin replaces it,
/// and the bucket returns to it when the pin ends; an older one changes nothing.
#[test]
fn versions_during_a_rate_pin() {
    let v1 = Limit::new(10.0, 100.0).unwrap();
    let v2 = Limit::new(20.0, 50.0).unwrap();
    let pinned = Limit::new(1.0, 10.0).unwrap();
    let mut l = pin::open(None, v1, 1, T0).level;
    assert!(l.try_take(1.0));
    let b = pin::pinned(Some(&l.bucket()), PinKind::Rate, Some(pinned), 0, T0);
    let o = pin::open(Some(&b), v2, 2, T0);
    assert_eq!(o.applied, rl_core::Applied::Replaced);
    assert_eq!(o.level.limit(), &pinned);
    let b = o.level.bucket().with_pin(pin::kept(Some(&b), v2, 2, T0));
    assert_eq!(b.pin().unwrap().base, v2);
    assert_eq!(b.version(), 2);
    let o = pin::open(Some(&b), v1, 1, T0);
    assert_eq!(o.applied, rl_core::Applied::Pinned);
    assert_eq!(pin::kept(Some(&b), v1, 1, T0).unwrap().base, v2);
    let after = pin::unpinned(&b, T0).unwrap();
    assert_eq!(after.limit(), v2);
    assert!(after.pin().is_none());
    // The 10 tokens under the pin carry over (a stale caller then sees v2's limit).
    let o = pin::open(Some(&after), v1, 1, T0);
    assert_eq!(o.applied, rl_core::Applied::Stale);
    assert!(o.level.tokens() <= 10.0);
}

/// A call needing more at once than a live rate pin's cap is blocked for the pin's time
/// left (a minute without an end), and only then: within the cap, after the pin's end, or
/// under another kind of pin the gate stays open.
#[test]
fn a_call_above_a_rate_pins_cap_waits_for_the_pin_to_end() {
    let caller = Limit::new(10.0, 100.0).unwrap();
    let small = Limit::new(1.0, 5.0).unwrap();
    let ends = pin::pinned(None, PinKind::Rate, Some(small), T0 + 1000 * MS, T0);
    assert_eq!(
        pin::over_cap_gate(Some(&ends), 6.0, T0 + 250 * MS),
        Gate::Blocked(750 * MS)
    );
    assert_eq!(pin::over_cap_gate(Some(&ends), 5.0, T0), Gate::Open);
    assert_eq!(
        pin::over_cap_gate(Some(&ends), 6.0, T0 + 1000 * MS),
        Gate::Open
    );
    let forever = pin::pinned(None, PinKind::Rate, Some(small), 0, T0);
    assert_eq!(
        pin::over_cap_gate(Some(&forever), 6.0, T0),
        Gate::Blocked(pin::BLOCKED_RETRY)
    );
    let exempt = pin::pinned(None, PinKind::Exempt, None, 0, T0);
    assert_eq!(pin::over_cap_gate(Some(&exempt), 6.0, T0), Gate::Open);
    assert_eq!(pin::over_cap_gate(None, 6.0, T0), Gate::Open);
    let unpinned = pin::open(None, caller, 0, T0).level.bucket();
    assert_eq!(pin::over_cap_gate(Some(&unpinned), 600.0, T0), Gate::Open);
    // The level a blocked call sees grants nothing and says how long.
    let mut l = pin::open(Some(&forever), caller, 0, T0)
        .level
        .with_gate(pin::over_cap_gate(Some(&forever), 6.0, T0));
    assert!(!l.try_take(6.0));
    assert_eq!(l.wait_for(6.0), Some(pin::BLOCKED_RETRY));
}

/// A rate pin on a key that held nothing never hands it more than the callers' limit holds:
/// `RL.PIN k 0.001 100`, then callers on `1 2`: the bucket starts with min(2, 100) tokens,
/// as a drained key pinned the same way would start with what it held (issue: 100 of 110
/// were granted when the pin started the key full under its own cap).
#[test]
fn a_rate_pin_on_an_absent_key_starts_it_no_fuller_than_the_callers_limit() {
    let caller = Limit::new(1.0, 2.0).unwrap();
    let pinned = Limit::new(0.001, 100.0).unwrap();
    let mut stored = pin::pinned(None, PinKind::Rate, Some(pinned), 0, T0);
    assert!(
        pin::level_of_stored(&stored, T0).is_none(),
        "holds only the pin"
    );
    let mut granted = 0;
    for i in 0..110u64 {
        let now = T0 + i * MS;
        let o = pin::open(Some(&stored), caller, 0, now);
        assert_eq!(o.pinned, Some(PinKind::Rate));
        let mut level = o.level;
        assert!(level.tokens() <= 2.0 + 1e-9, "{}", level.tokens());
        if level.try_take(1.0) {
            granted += 1;
        }
        let kept = pin::kept(Some(&stored), caller, 0, now);
        stored = level.bucket().with_pin(kept);
    }
    assert_eq!(granted, 2);
    // The pin keeps the callers' limit as the one to return to.
    let p = stored.pin().unwrap();
    assert!(!p.absent);
    assert_eq!(p.base, caller);
    // A caller whose cap is above the pin's starts the key at the pin's cap.
    let small = Limit::new(1.0, 5.0).unwrap();
    let stored = pin::pinned(None, PinKind::Rate, Some(small), 0, T0);
    let o = pin::open(Some(&stored), Limit::new(10.0, 100.0).unwrap(), 0, T0);
    assert_eq!(o.level.tokens(), 5.0);
}
