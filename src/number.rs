//! Numbers as text: the shortest decimal that parses back to exactly the same `f64`, fast
//! for the values a limiter mostly writes (whole numbers and a few decimals: `62.5`), on
//! the stack.

use std::io::Write;

/// Longest text: the exponent form of any `f64` (`-1.7976931348623157e308`) fits.
const CAP: usize = 40;

/// A number's text, on the stack.
pub struct Num {
    buf: [u8; CAP],
    len: usize,
}

const TWO_52: f64 = 4_503_599_627_370_496.0;

/// `10^k` for the decimals tried on the fast path: exact doubles.
const POW10: [f64; 7] = [1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6];

impl Num {
    pub fn new(x: f64) -> Num {
        let mut n = Num {
            buf: [0; CAP],
            len: 0,
        };
        if !n.fast(x) {
            n.general(x);
        }
        n
    }

    /// `digits / 10^k` for the fewest decimals `k <= 6` that give exactly `x`, if any: the
    /// text it prints is then the shortest that reads back as `x` (a shorter one would be
    /// found at a smaller `k`), and a correctly rounding parser reads it as `x` (the
    /// quotient of two exact doubles, rounded once).
    fn fast(&mut self, x: f64) -> bool {
        // Below 2^52 a step of the last decimal is wider than the spacing of doubles, so
        // at most one text with `k` decimals reads back as `x`: the one found here.
        if !(0.0..TWO_52).contains(&x) || x.is_sign_negative() {
            return false;
        }
        for (k, &p) in POW10.iter().enumerate() {
            let scaled = x * p;
            if scaled >= TWO_52 {
                return false;
            }
            // The product may be off by a rounding: its nearest integer is the candidate.
            let digits = scaled.round() as u64;
            if digits as f64 / p == x {
                self.write_fixed(digits, k);
                return true;
            }
        }
        false
    }

    fn write_fixed(&mut self, digits: u64, decimals: usize) {
        let mut tmp = [0u8; 24];
        let mut i = tmp.len();
        let mut d = digits;
        let mut written = 0;
        loop {
            if written == decimals && decimals > 0 {
                i -= 1;
                tmp[i] = b'.';
            }
            i -= 1;
            tmp[i] = b'0' + (d % 10) as u8;
            d /= 10;
            written += 1;
            if d == 0 && written > decimals {
                break;
            }
        }
        let s = &tmp[i..];
        self.buf[..s.len()].copy_from_slice(s);
        self.len = s.len();
    }

    /// Rust's shortest round-trip text: plain decimal when it fits, else the exponent form.
    fn general(&mut self, x: f64) {
        let mut out = &mut self.buf[..];
        if write!(out, "{x}").is_err() {
            out = &mut self.buf[..];
            let _ = write!(out, "{x:e}");
        }
        self.len = CAP - out.len();
    }

    /// An integer's text.
    pub fn int(n: u64) -> Num {
        let mut num = Num {
            buf: [0; CAP],
            len: 0,
        };
        num.write_fixed(n, 0);
        num
    }

    pub fn bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

#[cfg(test)]
mod tests {
    use super::Num;

    fn text(x: f64) -> String {
        String::from_utf8(Num::new(x).bytes().to_vec()).unwrap()
    }

    #[test]
    fn shortest_and_exact() {
        let mut cases = vec![
            0.0,
            -0.0,
            1.0,
            0.1,
            0.3,
            62.5,
            1e15,
            1e-9,
            1.0 / 3.0,
            123456.789,
            5e-324,
            1e-300,
            f64::MAX,
            -2.5,
            999999999999999.9,
            8999999999999999.0,
            0.000001,
            0.0000015,
            4503599627370497.5,
        ];
        let mut x = 0.7310585786300049f64;
        for _ in 0..20_000 {
            x = (x * 3.9 * (1.0 - x)).clamp(1e-6, 1.0 - 1e-6);
            cases.push(x * 10f64.powi((x * 1e6) as i32 % 24 - 8));
            cases.push((x * 1e6).round() / 1e3);
        }
        for x in cases {
            let t = text(x);
            assert_eq!(t.parse::<f64>().unwrap().to_bits(), x.to_bits(), "{t}");
            assert_eq!(
                crate::args::parse_number(t.as_bytes()).map(f64::to_bits),
                Some(x.to_bits()),
                "{t}"
            );
            // Rust's own shortest form, or its exponent form where that is too long.
            let std = format!("{x}");
            let std = if std.len() > 40 {
                format!("{x:e}")
            } else {
                std
            };
            assert_eq!(t, std);
        }
        assert_eq!(text(62.5), "62.5");
        assert_eq!(text(0.0), "0");
        assert_eq!(text(100.0), "100");
        assert_eq!(text(0.05), "0.05");
        assert_eq!(text(1e15), "1000000000000000");
        for n in [0, 7, 10, 1_796_156_813_907_882_057, u64::MAX] {
            assert_eq!(Num::int(n).bytes(), n.to_string().as_bytes());
        }
    }
}
