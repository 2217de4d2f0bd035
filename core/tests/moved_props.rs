//! The short form of a pinned take's effect (`RL.SETSTATE key full_at KEEP [HOLD t]`) is
//! checked by the one validator: for any state the full form accepts and any new fill
//! instant and hold, [`rl_core::validate_moved`] accepts exactly what the full form would
//! accept with every other part restated, and builds the same bucket (what RDB load
//! reads back).

use proptest::prelude::*;
use rl_core::{validate, validate_moved, validate_pin, Lease, Nanos, PinParts};

const MAX: Nanos = i64::MAX as Nanos;

fn instant() -> impl Strategy<Value = Nanos> {
    prop_oneof![
        Just(0u64),
        Just(MAX),
        Just(MAX + 1),
        Just(u64::MAX),
        0u64..4_000_000_000_000_000_000,
    ]
}

fn pin() -> impl Strategy<Value = Option<PinParts>> {
    prop_oneof![
        Just(None),
        (
            1u64..=3,
            instant(),
            0.001f64..1e6,
            0.001f64..1e6,
            any::<bool>()
        )
            .prop_map(|(kind, until, base_rate, base_cap, absent)| Some(PinParts {
                kind,
                until,
                base_rate,
                base_cap,
                absent,
            })),
        // A block or exempt pin over the bucket's own limit, and one over nothing.
        (2u64..=3, instant()).prop_map(|(kind, until)| Some(PinParts {
            kind,
            until,
            base_rate: f64::NAN,
            base_cap: f64::NAN,
            absent: false,
        })),
        (2u64..=3, instant()).prop_map(|(kind, until)| Some(PinParts {
            kind,
            until,
            base_rate: 1.0,
            base_cap: 1.0,
            absent: true,
        })),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4000))]

    #[test]
    fn the_short_form_accepts_what_the_full_form_accepts(
        full_at in instant(),
        limit in prop_oneof![
            (0.001f64..1e6, 0.001f64..1e6),
            Just((1.0, 1.0)),
        ],
        hold in instant(),
        span in prop_oneof![Just(0u64), 0u64..1_000_000_000_000],
        version in prop_oneof![Just(0u64), 0u64..1000],
        leases in prop::collection::vec((1u64..5, instant()), 0..3),
        ever_leased in any::<bool>(),
        pin in pin(),
        new_full_at in instant(),
        new_hold in instant(),
    ) {
        let (rate, cap) = limit;
        let last_id = if ever_leased || !leases.is_empty() { 10 } else { 0 };
        let leases: Vec<Lease> = leases
            .iter()
            .enumerate()
            .map(|(i, &(tokens, expires_at))| Lease { id: i as u64 + 1, tokens, expires_at })
            .collect();
        let full = |full_at, hold| {
            let (b, t) = validate(full_at, rate, cap, hold, span, version, last_id, leases.clone())?;
            match pin {
                Some(mut p) => {
                    if p.base_rate.is_nan() {
                        p.base_rate = rate;
                        p.base_cap = cap;
                    }
                    validate_pin(b, &t, p).map(|b| (b, t))
                }
                None => Ok((b, t)),
            }
        };
        // Only a state the module could hold is ever moved.
        let Ok((stored, table)) = full(full_at, hold) else {
            return Ok(());
        };
        let short = validate_moved(&stored, &table, new_full_at, new_hold);
        let restated = full(new_full_at, new_hold).map(|(b, _)| b);
        prop_assert_eq!(short, restated);
    }
}
