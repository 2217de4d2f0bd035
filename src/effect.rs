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
    pub fn new(mut n: u64) -> Decimal {
        let mut d = Decimal {
            buf: [0; 20],
            start: 20,
        };
        while n >= 100 {
            let pair = (n % 100) as usize * 2;
            n /= 100;
            d.start -= 2;
            d.buf[d.start..d.start + 2].copy_from_slice(&DIGIT_PAIRS[pair..pair + 2]);
        }
        if n >= 10 {
            let pair = n as usize * 2;
            d.start -= 2;
            d.buf[d.start..d.start + 2].copy_from_slice(&DIGIT_PAIRS[pair..pair + 2]);
        } else {
            d.start -= 1;
            d.buf[d.start] = b'0' + n as u8;
        }
        d
    }

    pub fn bytes(&self) -> &[u8] {
        &self.buf[self.start..]
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
        for n in cases {
            let d = Decimal::new(n);
            assert_eq!(d.bytes(), n.to_string().as_bytes());
        }
    }
}
