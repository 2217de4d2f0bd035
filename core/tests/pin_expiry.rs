//! The expiry a pinned bucket asks for: at that instant the key may go because nothing is
//! lost with it. Whatever sequence of takes (callers on two limits, with versions) and pins
//! (rate, block, exempt; with and without an end; replaced and removed), the stored state
//! at its own `expires_at` is as absent or full under what governs it then; and a pin
//! without an end never lets the key go.

use proptest::prelude::*;
use rl_core::pin::{self, PinKind};
use rl_core::{Bucket, Limit, Nanos, NEVER};

const T0: Nanos = 1_700_000_000_000_000_000;
const MS: Nanos = 1_000_000;

#[derive(Debug, Clone)]
enum Op {
    Take {
        n: u64,
        caller: usize,
        version: u64,
    },
    Pin {
        kind: usize,
        limit: usize,
        px_ms: u64,
    },
    Unpin,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (1u64..15, 0usize..2, 0u64..3).prop_map(|(n, caller, version)| Op::Take { n, caller, version }),
        3 => (0usize..3, 0usize..3, prop_oneof![Just(0u64), 1u64..3000]).prop_map(|(kind, limit, px_ms)| Op::Pin { kind, limit, px_ms }),
        1 => Just(Op::Unpin),
    ]
}

/// Limits spanning slow and fast, small and large caps.
fn limit() -> impl Strategy<Value = (f64, f64)> {
    prop_oneof![
        (0.001f64..2.0, 1.0f64..200.0),
        (50.0f64..5000.0, 1.0f64..2000.0)
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    #[test]
    fn a_pinned_key_expires_only_when_nothing_is_lost(
        callers in prop::collection::vec(limit(), 2),
        pins in prop::collection::vec(limit(), 3),
        ops in prop::collection::vec((0u64..400 * MS, op()), 1..80),
    ) {
        let callers: Vec<Limit> = callers.iter().map(|&(r, c)| Limit::new(r, c).unwrap()).collect();
        let pins: Vec<Limit> = pins.iter().map(|&(r, c)| Limit::new(r, c).unwrap()).collect();
        let mut stored: Option<Bucket> = None;
        let mut now = T0;
        for (dt, op) in ops {
            now += dt;
            if stored.is_some_and(|b| b.expires_at() <= now) {
                stored = None;
            }
            match op {
                Op::Take { n, caller, version } => {
                    let o = pin::open(stored.as_ref(), callers[caller], version, now);
                    let mut level = o.level;
                    let exempt = level.gate() == pin::Gate::Exempt;
                    let granted = level.try_take(n as f64);
                    if (granted && !exempt) || o.applied.must_write() {
                        stored = Some(level.bucket());
                    }
                }
                Op::Pin { kind, limit, px_ms } => {
                    let until = if px_ms == 0 { 0 } else { now + px_ms * MS };
                    let kind = [PinKind::Rate, PinKind::Block, PinKind::Exempt][kind];
                    let limit = (kind == PinKind::Rate).then_some(pins[limit]);
                    stored = Some(pin::pinned(stored.as_ref(), kind, limit, until, now));
                }
                Op::Unpin => {
                    if let Some(b) = stored {
                        if b.pin().is_some_and(|p| p.live_at(now)) {
                            stored = pin::unpinned(&b, now);
                        }
                    }
                }
            }
            let Some(b) = stored else { continue };
            let at = b.expires_at();
            if let Some(p) = b.pin() {
                if p.until == 0 {
                    prop_assert_eq!(at, NEVER, "a pin without an end let its key go");
                    continue;
                }
                prop_assert!(at >= p.until, "the key goes before its pin ends");
            }
            // At its expiry the key is as absent, or its bucket is full under what governs
            // it then: the next caller's full bucket is no more than it held.
            if let Some((level, _)) = pin::level_of_stored(&b, at) {
                prop_assert_eq!(level.reset_after(), 0, "not full when the key goes: {:?}", b);
            }
        }
    }
}
