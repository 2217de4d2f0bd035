//! What every effect is written with: its arguments on the stack, numbers as text made
//! here (Redis copies each into one string object, where an integer argument costs it a
//! formatting and two allocations), and the effect of a key that is gone.

use crate::ffi::{self, Ctx, EffectArg, Str};

/// The arguments of one effect, on the stack.
pub struct EffectArgs<'a> {
    list: [EffectArg<'a>; 16],
    len: usize,
}

impl<'a> EffectArgs<'a> {
    pub fn new() -> Self {
        EffectArgs {
            list: [EffectArg::Int(0); 16],
            len: 0,
        }
    }

    pub fn push(&mut self, a: EffectArg<'a>) -> &mut Self {
        self.list[self.len] = a;
        self.len += 1;
        self
    }

    pub fn keyword(&mut self, k: &'static std::ffi::CStr, v: &'a Decimal) -> &mut Self {
        self.push(EffectArg::Text(k))
            .push(EffectArg::Bytes(v.bytes()))
    }

    pub fn get(&self) -> &[EffectArg<'a>] {
        &self.list[..self.len]
    }
}

/// A `u64` in decimal, on the stack.
pub struct Decimal {
    buf: [u8; 20],
    start: usize,
}

/// `"00" "01" ... "99"`: two digits per step.
const DIGIT_PAIRS: &[u8; 200] = b"\
0001020304050607080910111213141516171819\
2021222324252627282930313233343536373839\
4041424344454647484950515253545556575859\
6061626364656667686970717273747576777879\
8081828384858687888990919293949596979899";

impl Decimal {
    pub fn new(n: u64) -> Decimal {
        let mut d = Decimal {
            buf: [0; 20],
            start: 20,
        };
        // Eight digits at a time in 32-bit arithmetic (cheaper than dividing the whole
        // 64-bit number by 100 per pair): an instant in ns has 19 digits.
        let mut n = n;
        while n >= 100_000_000 {
            let low = (n % 100_000_000) as u32;
            n /= 100_000_000;
            d.start -= 8;
            write_8_digits(&mut d.buf[d.start..d.start + 8], low);
        }
        let mut m = n as u32;
        while m >= 100 {
            let pair = (m % 100) as usize * 2;
            m /= 100;
            d.start -= 2;
            d.buf[d.start..d.start + 2].copy_from_slice(&DIGIT_PAIRS[pair..pair + 2]);
        }
        if m >= 10 {
            let pair = m as usize * 2;
            d.start -= 2;
            d.buf[d.start..d.start + 2].copy_from_slice(&DIGIT_PAIRS[pair..pair + 2]);
        } else {
            d.start -= 1;
            d.buf[d.start] = b'0' + m as u8;
        }
        d
    }

    pub fn bytes(&self) -> &[u8] {
        &self.buf[self.start..]
    }
}

/// `v` (below 10^8) as exactly eight digits, leading zeros kept.
fn write_8_digits(out: &mut [u8], v: u32) {
    let (hi, lo) = (v / 10_000, v % 10_000);
    for (i, part) in [hi / 100, hi % 100, lo / 100, lo % 100]
        .into_iter()
        .enumerate()
    {
        let pair = part as usize * 2;
        out[2 * i..2 * i + 2].copy_from_slice(&DIGIT_PAIRS[pair..pair + 2]);
    }
}

/// The key was deleted (its bucket is full again and holds no lease).
pub fn deleted(ctx: Ctx, key: Str) {
    ffi::replicate(ctx, c"DEL", &[EffectArg::Str(key)]);
}

#[cfg(test)]
mod tests {
    use super::Decimal;

    #[test]
    fn decimal_text() {
        let mut cases = vec![
            0,
            7,
            9,
            10,
            99,
            100,
            101,
            1_795_965_785_839_823_081,
            u64::MAX,
        ];
        cases.extend((0..64).map(|b| 1u64 << b));
        cases.extend((1..20).map(|e| 10u64.pow(e) - 1));
        cases.extend((1..20).map(|e| 10u64.pow(e)));
        cases.extend((1..20).map(|e| 10u64.pow(e) + 1));
        cases.extend([
            100_000_000,
            100_000_007,
            1_000_000_000_000_000_001,
            99_999_999,
        ]);
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..10_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            cases.push(x);
            cases.push(x >> (x % 64));
        }
        for n in cases {
            let d = Decimal::new(n);
            assert_eq!(d.bytes(), n.to_string().as_bytes());
        }
    }
}
