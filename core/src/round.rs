//! Arithmetic rounded toward the safe side.
//!
//! A bucket converts between tokens and nanoseconds with `f64`. Rounding to nearest is
//! right on average and wrong for a limiter: a debit rounded down or a credit rounded up
//! lets out a fraction of a token more than the limit, and a fraction per call adds up
//! (at a cap of 1e15 one `f64` step is 0.125 tokens). So every conversion that decides what
//! a caller may take is rounded in the direction that keeps tokens in the bucket, and is
//! exact when the exact result is representable (`1000` tokens/s and one token is still
//! exactly 1,000,000 ns).
//!
//! Each function computes the nearest `f64`, then asks an exact error term which side of
//! the true value it fell on (`mul_add` gives the exact residual of a product or a
//! quotient; `two_sum` that of a sum) and steps one unit outward when it fell on the wrong
//! side.

use crate::Nanos;

/// Nanoseconds per second.
const NS: f64 = 1e9;

/// `a * b`, rounded up: never below the exact product.
pub fn mul_up(a: f64, b: f64) -> f64 {
    let p = a * b;
    if a.mul_add(b, -p) > 0.0 {
        p.next_up()
    } else {
        p
    }
}

/// `a * b`, rounded down.
pub fn mul_down(a: f64, b: f64) -> f64 {
    let p = a * b;
    if a.mul_add(b, -p) < 0.0 {
        p.next_down()
    } else {
        p
    }
}

/// `a / b` for `b > 0`, rounded up.
pub fn div_up(a: f64, b: f64) -> f64 {
    let q = a / b;
    // The remainder of a correctly rounded quotient is exact: a = q*b + r.
    if (-q).mul_add(b, a) > 0.0 {
        q.next_up()
    } else {
        q
    }
}

/// `a / b` for `b > 0`, rounded down.
pub fn div_down(a: f64, b: f64) -> f64 {
    let q = a / b;
    if (-q).mul_add(b, a) < 0.0 {
        q.next_down()
    } else {
        q
    }
}

/// The rounding error of `a + b`: exact `a + b = s + err`.
fn two_sum(a: f64, b: f64) -> (f64, f64) {
    let s = a + b;
    let bb = s - a;
    (s, (a - (s - bb)) + (b - bb))
}

/// `a - b`, rounded up.
pub fn sub_up(a: f64, b: f64) -> f64 {
    let (s, err) = two_sum(a, -b);
    if err > 0.0 {
        s.next_up()
    } else {
        s
    }
}

/// `a - b`, rounded down.
pub fn sub_down(a: f64, b: f64) -> f64 {
    let (s, err) = two_sum(a, -b);
    if err < 0.0 {
        s.next_down()
    } else {
        s
    }
}

/// `a + b`, rounded up.
pub fn add_up(a: f64, b: f64) -> f64 {
    sub_up(a, -b)
}

/// A count of nanoseconds as an `f64` no smaller than it.
pub fn nanos_up(ns: Nanos) -> f64 {
    let x = ns as f64;
    // Above 2^53 the conversion rounds to nearest; `x as u64` saturates at u64::MAX.
    if (x as u64) < ns {
        x.next_up()
    } else {
        x
    }
}

/// A count of nanoseconds as an `f64` no larger than it.
pub fn nanos_down(ns: Nanos) -> f64 {
    let x = ns as f64;
    if x >= 18_446_744_073_709_551_616.0 || (x as u64) > ns {
        x.next_down()
    } else {
        x
    }
}

/// How many tokens a debit may round in the caller's favour to land on a whole number of
/// nanoseconds: 1e-12. A rate written in decimal (`1e-6`) is not a binary double, so one
/// token at `1e-6`/s is 1e15 ns and a 0.045 ns fraction (4.5e-17 tokens); charging that
/// fraction as a whole extra nanosecond would make `INIT 1` hold 0.999999999999999 tokens.
/// Counting it as 1e15 ns lets out at most 1e-12 tokens more per call (a token per 10^12
/// calls), never a float step of a large cap (0.125 tokens at 1e15: not snapped).
const SNAP_TOKENS_NS: f64 = 1e-12 * NS;

/// Time to refill `tokens` at `rate`, rounded up to whole nanoseconds: what a debit costs.
/// Saturates at `u64::MAX` (the callers bound it).
pub fn refill_nanos_ceil(tokens: f64, rate: f64) -> Nanos {
    // Two orders of the same product and quotient; each bound is safe, the smaller is kept
    // (`1e15 / 1e15 * 1e9` is exact where `1e15 * 1e9` is not).
    let a = div_up(mul_up(tokens, NS), rate);
    if exact_ratio(tokens, rate) {
        return a.ceil() as Nanos;
    }
    let up = a.min(mul_up(div_up(tokens, rate), NS));
    let near = (tokens * NS / rate).round();
    if (up - near) * rate <= SNAP_TOKENS_NS {
        return near as Nanos;
    }
    up.ceil() as Nanos
}

/// Time to refill `tokens` at `rate`, rounded down to whole nanoseconds: what a credit
/// gives back, or the largest deficit that still holds some amount.
pub fn refill_nanos_floor(tokens: f64, rate: f64) -> Nanos {
    let a = div_down(mul_down(tokens, NS), rate);
    if exact_ratio(tokens, rate) {
        return a.floor().max(0.0) as Nanos;
    }
    let down = a.max(mul_down(div_down(tokens, rate), NS));
    let near = (tokens * NS / rate).round();
    if (near - down) * rate <= SNAP_TOKENS_NS {
        return near.max(0.0) as Nanos;
    }
    down.floor().max(0.0) as Nanos
}

/// Whether `tokens * 1e9 / rate` is computed with no rounding at all (the common case:
/// then one order is enough).
fn exact_ratio(tokens: f64, rate: f64) -> bool {
    let p = tokens * NS;
    let q = p / rate;
    tokens.mul_add(NS, -p) == 0.0 && (-q).mul_add(rate, p) == 0.0
}

/// Tokens refilled in `ns` at `rate`, rounded up (tokens missing from a bucket that far
/// from full: never fewer than the exact count).
pub fn tokens_in_up(ns: Nanos, rate: f64) -> f64 {
    div_up(mul_up(nanos_up(ns), rate), NS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use num_rational::BigRational;

    fn exact(x: f64) -> BigRational {
        BigRational::from_float(x).unwrap()
    }

    fn sample() -> Vec<f64> {
        let mut v = vec![
            1e-9,
            1e-6,
            0.001,
            0.1,
            0.3,
            0.5,
            1.0,
            3.0,
            7.0,
            10.0,
            1000.0,
            320000.0,
            1e9,
            1e15,
            999999999999999.0,
            1e18,
            3.125e18,
        ];
        let mut x = 0.7310585786300049f64;
        for _ in 0..600 {
            x = (x * 3.9 * (1.0 - x)).clamp(1e-6, 1.0 - 1e-6);
            v.push(x * 10f64.powi((x * 1e6) as i32 % 30 - 12));
        }
        v
    }

    #[test]
    fn every_operation_rounds_outward_and_by_at_most_one_step() {
        let s = sample();
        for (i, &a) in s.iter().enumerate() {
            for &b in s.iter().skip(i % 7).step_by(23) {
                let (ea, eb) = (exact(a), exact(b));
                let p = &ea * &eb;
                let (up, down) = (mul_up(a, b), mul_down(a, b));
                assert!(exact(up) >= p && exact(down) <= p, "{a}*{b}");
                assert!(up == down || up == down.next_up(), "{a}*{b}");
                let q = &ea / &eb;
                let (up, down) = (div_up(a, b), div_down(a, b));
                assert!(exact(up) >= q && exact(down) <= q, "{a}/{b}");
                assert!(up == down || up == down.next_up(), "{a}/{b}");
                let d = &ea - &eb;
                let (up, down) = (sub_up(a, b), sub_down(a, b));
                assert!(exact(up) >= d && exact(down) <= d, "{a}-{b}");
                assert!(up == down || up == down.next_up(), "{a}-{b}");
            }
        }
    }

    #[test]
    fn nanosecond_conversions_round_outward() {
        let s = sample();
        let ns = BigRational::from_integer(1_000_000_000u64.into());
        for (i, &t) in s.iter().enumerate() {
            for &rate in s.iter().skip(i % 5).step_by(31) {
                let v = exact(t) * &ns / exact(rate);
                if v > BigRational::from_integer(u64::MAX.into()) {
                    continue;
                }
                let (c, f) = (refill_nanos_ceil(t, rate), refill_nanos_floor(t, rate));
                // Safe side, but for a whole number within 1e-12 tokens of the exact value.
                let slack = BigRational::from_float(SNAP_TOKENS_NS / rate).unwrap();
                assert!(
                    BigRational::from_integer(c.into()) >= &v - &slack,
                    "{t}@{rate}"
                );
                assert!(
                    BigRational::from_integer(f.into()) <= &v + &slack,
                    "{t}@{rate}"
                );
                let (fc, ff) = (
                    BigRational::from_integer(c.into()),
                    BigRational::from_integer(f.into()),
                );
                // And tight: within a nanosecond, or a few float steps of large values.
                let step = &v * BigRational::from_float(4.0 * f64::EPSILON).unwrap()
                    + BigRational::from_integer(1.into());
                assert!(
                    fc < &v + &step + &slack && ff > &v - &step - &slack,
                    "{t}@{rate}"
                );
            }
        }
        for &rate in &s {
            for d in [
                0u64,
                1,
                999,
                1 << 40,
                (1 << 53) + 1,
                (1 << 61) + 7,
                i64::MAX as u64,
            ] {
                let v = BigRational::from_integer(d.into()) * exact(rate) / &ns;
                assert!(exact(tokens_in_up(d, rate)) >= v, "{d}@{rate}");
            }
        }
    }

    #[test]
    fn exact_results_stay_exact() {
        assert_eq!(refill_nanos_ceil(1.0, 1000.0), 1_000_000);
        assert_eq!(refill_nanos_floor(1.0, 1000.0), 1_000_000);
        assert_eq!(refill_nanos_ceil(1.0, 1.0), 1_000_000_000);
        assert_eq!(refill_nanos_ceil(1.0, 3.0), 333_333_334);
        assert_eq!(refill_nanos_floor(1.0, 3.0), 333_333_333);
        assert_eq!(tokens_in_up(1_000_000, 1000.0), 1.0);
        assert_eq!(sub_up(1e15, 1.0), 999999999999999.0);
        // 1e15 * 1e9 is not a double, 1e15 / 1e15 * 1e9 is.
        assert_eq!(refill_nanos_ceil(1e15, 1e15), 1_000_000_000);
        assert_eq!(refill_nanos_floor(1e15, 1e15), 1_000_000_000);
        // Decimal rates behave as written: one token at 1e-6/s is 1e15 ns.
        assert_eq!(refill_nanos_ceil(1.0, 1e-6), 1_000_000_000_000_000);
        assert_eq!(refill_nanos_floor(4.0, 1e-6), 4_000_000_000_000_000);
        for ns in [
            0u64,
            1,
            (1 << 53) + 1,
            (1 << 60) + 3,
            i64::MAX as u64,
            u64::MAX,
        ] {
            assert!(exact(nanos_up(ns)) >= BigRational::from_integer(ns.into()));
            assert!(exact(nanos_down(ns)) <= BigRational::from_integer(ns.into()));
        }
    }
}
