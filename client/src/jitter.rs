//! A tiny xorshift generator for renewal jitter: not for anything security-related.

use std::cell::Cell;

thread_local! {
    static STATE: Cell<u64> = Cell::new(seed());
}

fn seed() -> u64 {
    // Mix the wall clock with a per-thread address so instances and threads started at the
    // same instant still draw different thresholds.
    let local = 0u8;
    let addr = &local as *const u8 as u64;
    let s = crate::clock::wall_ns() ^ addr.rotate_left(32) ^ 0x9E37_79B9_7F4A_7C15;
    if s == 0 {
        0x2545_F491_4F6C_DD1D
    } else {
        s
    }
}

/// A uniform number in `[0, 1)`.
pub(crate) fn unit() -> f64 {
    STATE.with(|state| {
        let mut x = state.get();
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        state.set(x);
        (x >> 11) as f64 / (1u64 << 53) as f64
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unit_is_in_range_and_varies() {
        let draws: Vec<f64> = (0..1000).map(|_| unit()).collect();
        assert!(draws.iter().all(|x| (0.0..1.0).contains(x)));
        let low = draws.iter().filter(|x| **x < 0.5).count();
        assert!((300..700).contains(&low), "{low} of 1000 below 0.5");
    }
}
