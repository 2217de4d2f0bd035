//! Parsing command arguments straight from the argument bytes (no allocation).

use crate::error::{Error, Result};
use crate::ffi::Str;

/// The arguments of one call, without the command name.
#[derive(Clone, Copy)]
pub struct Args<'a> {
    argv: &'a [Str],
}

impl<'a> Args<'a> {
    /// The arguments after the command name in `argv`.
    pub fn new(argv: &'a [Str]) -> Args<'a> {
        Args {
            argv: argv.get(1..).unwrap_or(&[]),
        }
    }

    pub fn len(&self) -> usize {
        self.argv.len()
    }

    /// The raw argument `i` (for keys, and for values passed on verbatim).
    pub fn raw(&self, i: usize) -> Result<Str> {
        self.argv.get(i).copied().ok_or(Error::Arity)
    }

    pub fn bytes(&self, i: usize) -> Result<&'a [u8]> {
        self.argv.get(i).map(Str::bytes).ok_or(Error::Arity)
    }

    /// A decimal number; range checks are the caller's.
    pub fn number(&self, i: usize, what: &'static str) -> Result<f64> {
        parse_number(self.bytes(i)?).ok_or(Error::Invalid(what))
    }

    /// A non-negative integer.
    pub fn integer(&self, i: usize, what: &'static str) -> Result<u64> {
        parse_integer(self.bytes(i)?).ok_or(Error::Invalid(what))
    }

    /// A positive integer.
    pub fn positive(&self, i: usize, what: &'static str) -> Result<u64> {
        positive(self.bytes(i)?, what)
    }

    /// Whether argument `i` is the option `name` (case-insensitive).
    pub fn is(&self, i: usize, name: &str) -> bool {
        self.bytes(i)
            .is_ok_and(|b| b.eq_ignore_ascii_case(name.as_bytes()))
    }

    /// Argument `i` as it may be shown in an error: at most 64 bytes, lossy, no NUL.
    fn shown(&self, i: usize) -> String {
        let b = self.bytes(i).unwrap_or(&[]);
        String::from_utf8_lossy(&b[..b.len().min(64)]).replace('\0', "?")
    }

    /// The error for an option argument `i` that no rule matched.
    pub fn unknown(&self, i: usize) -> Error {
        Error::UnknownOption(self.shown(i))
    }

    /// The error for an option argument `i` given a second time (every command refuses a
    /// repeated option rather than guessing which one was meant).
    pub fn duplicate(&self, i: usize) -> Error {
        Error::DuplicateOption(self.shown(i).to_ascii_uppercase())
    }
}

/// Whether an argument starts like a number (an optional count where options start).
pub fn looks_numeric(b: &[u8]) -> bool {
    matches!(b.first(), Some(b'0'..=b'9' | b'-' | b'+' | b'.'))
}

/// A positive integer.
pub fn positive(b: &[u8], what: &'static str) -> Result<u64> {
    match parse_integer(b) {
        Some(0) | None => Err(Error::Invalid(what)),
        Some(n) => Ok(n),
    }
}

pub fn parse_number(b: &[u8]) -> Option<f64> {
    // `f64::from_str` takes "inf" and "nan": the range checks that follow refuse them.
    plain_decimal(b).or_else(|| std::str::from_utf8(b).ok()?.parse().ok())
}

/// The common spellings of a rate or cap (`1000`, `0.5`) without the general parser: up
/// to 15 significant digits and an optional point. The digits are an integer below 2^53
/// and `10^k` (k <= 15) is exact, so one division rounds exactly as `f64::from_str` does.
fn plain_decimal(b: &[u8]) -> Option<f64> {
    const POW10: [f64; 16] = [
        1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15,
    ];
    if b.is_empty() || b.len() > 16 {
        return None;
    }
    let (mut digits, mut scale, mut point, mut count) = (0u64, 0usize, false, 0usize);
    for &c in b {
        match c {
            b'0'..=b'9' => {
                digits = digits * 10 + u64::from(c - b'0');
                count += 1;
                scale += usize::from(point);
            }
            b'.' if !point => point = true,
            _ => return None,
        }
    }
    // "." alone, or more digits than the fast path can hold exactly.
    if count == 0 || count > 15 {
        return None;
    }
    Some(digits as f64 / POW10[scale])
}

pub fn parse_integer(b: &[u8]) -> Option<u64> {
    // Digits only (no sign, no spaces), and at most i64::MAX so Redis can take it back.
    if b.is_empty() || b.len() > 19 {
        return None;
    }
    let mut n: u64 = 0;
    for d in b {
        if !d.is_ascii_digit() {
            return None;
        }
        n = n * 10 + u64::from(d - b'0');
    }
    (n <= i64::MAX as u64).then_some(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers() {
        assert_eq!(parse_number(b"0.5"), Some(0.5));
        assert_eq!(parse_number(b"1e9"), Some(1e9));
        assert_eq!(parse_number(b"abc"), None);
        assert_eq!(parse_number(b" 1"), None);
        assert_eq!(parse_number(&[0xff, b'1']), None);
        assert!(parse_number(b"nan").is_some_and(f64::is_nan));
        assert_eq!(parse_number(b"."), None);
        assert_eq!(parse_number(b"1.2.3"), None);
    }

    #[test]
    fn fast_path_rounds_like_the_general_parser() {
        let cases = [
            "0",
            "1",
            "0.1",
            "0.3",
            "1000",
            "123456789012345",
            "0.000000001",
            "3.14159265358979",
            "999999999999999",
            "1.",
            ".5",
            "00012.500",
            "0.000000000000001",
            "7.7",
            "1e9",
            "1234567890123456",
            "0.1234567890123456",
        ];
        for s in cases {
            let std: f64 = s.parse().unwrap();
            assert_eq!(parse_number(s.as_bytes()), Some(std), "{s}");
        }
        // A sweep of short decimals.
        for i in 0..20_000u64 {
            for s in [
                format!("{i}"),
                format!("{}.{}", i / 1000, i % 1000),
                format!("0.{i:05}"),
            ] {
                let std: f64 = s.parse().unwrap();
                assert_eq!(parse_number(s.as_bytes()), Some(std), "{s}");
            }
        }
    }

    #[test]
    fn integers() {
        assert_eq!(parse_integer(b"20"), Some(20));
        assert_eq!(parse_integer(b"0"), Some(0));
        assert_eq!(parse_integer(b"9223372036854775807"), Some(i64::MAX as u64));
        for bad in [
            &b""[..],
            b"-1",
            b"+1",
            b"1.0",
            b"1e3",
            b"9223372036854775808",
            b"99999999999999999999",
            b" 1",
        ] {
            assert_eq!(
                parse_integer(bad),
                None,
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }
}
