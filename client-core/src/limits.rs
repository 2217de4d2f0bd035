//! Limit strings as `limits` and `slowapi` write them: `"5/minute"`, `"100 per hour"`,
//! `"10/5 seconds"`, `"10/second;500/minute"`, each optionally followed by `", burst 20"`.
//! The twin of the Python client's `redis_rl.limits`; both run the golden cases in
//! `protocol/limit_strings.json`.
//!
//! Grammar (ASCII, case-insensitive, spaces free):
//!
//! ```text
//! limits := limit ((";" | "," | "|") (limit | burst))*
//! limit  := count ("/" | "per") [every] unit
//! burst  := "burst" number          (the cap of the limit before it)
//! unit   := second | minute | hour | day | month | year   (plural with "s")
//!         | s | sec | secs | m | min | mins | h | hr | hrs | d
//! ```
//!
//! `month` is 30 days and `year` 360, as in `limits`. Anything else is refused with a
//! message (`"5/ms"` is not five per minute). Each limit is a token bucket of
//! `count / (every * unit)` tokens per second with a cap of `count` (or its burst): it lets
//! through up to `cap + rate * T` in any `T` seconds, so `"N/minute"` lets up to `2N` through
//! in one minute. For at most `N` in any minute write `"N/2 per minute, burst N/2"`.

use std::fmt;

use rl_core::Limit;

/// Limits in one string at most.
pub const MAX_LIMITS: usize = 8;
/// The longest an empty bucket may take to fill: 100 years.
const MAX_FILL_SECS: f64 = 100.0 * 365.25 * 86_400.0;

/// One limit of a limit string: `amount` per `period_secs`, bursts of `cap`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LimitSpec {
    /// Tokens per period.
    pub amount: f64,
    /// The period in seconds.
    pub period_secs: f64,
    /// The burst: `amount` unless a burst was given.
    pub cap: f64,
}

impl LimitSpec {
    /// Tokens per second.
    pub fn rate(&self) -> f64 {
        self.amount / self.period_secs
    }

    /// What a key gets appended to tell this limit's bucket from the others of its string
    /// (their periods differ): `"60s"`.
    pub fn suffix(&self) -> String {
        format!("{}s", num(self.period_secs))
    }

    /// The bucket's [`Limit`] (rate, cap).
    pub fn limit(&self) -> Result<Limit, LimitStringError> {
        Limit::new(self.rate(), self.cap)
            .map_err(|e| LimitStringError(format!("not a limit: {e:?}")))
    }
}

fn num(x: f64) -> String {
    if x.fract() == 0.0 && x.abs() < 1e15 {
        format!("{}", x as i64)
    } else {
        format!("{x}")
    }
}

/// A limit string that does not parse; the message says what is wrong and how to write it.
#[derive(Debug, Clone, PartialEq)]
pub struct LimitStringError(pub String);

impl fmt::Display for LimitStringError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for LimitStringError {}

const HELP: &str = "write it as '1000/second', '5/minute', '100 per hour', '10/5 seconds', \
several joined by ';' ('10/second;500/minute'), each optionally followed by ', burst 20'";

fn unit_secs(unit: &str) -> Option<f64> {
    Some(match unit {
        "s" | "sec" | "secs" | "second" | "seconds" => 1.0,
        "m" | "min" | "mins" | "minute" | "minutes" => 60.0,
        "h" | "hr" | "hrs" | "hour" | "hours" => 3600.0,
        "d" | "day" | "days" => 86_400.0,
        "month" | "months" => 2_592_000.0,
        "year" | "years" => 31_104_000.0,
        _ => return None,
    })
}

fn is_space(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\n' | '\r' | '\x0b' | '\x0c')
}

/// A cursor over one part of a limit string.
struct Scan<'a> {
    s: &'a str,
    i: usize,
}

impl<'a> Scan<'a> {
    fn spaces(&mut self) {
        while self.s[self.i..].starts_with(is_space) {
            self.i += 1;
        }
    }

    /// `[0-9]+(\.[0-9]+)?`
    fn number(&mut self) -> Option<f64> {
        let b = self.s.as_bytes();
        let start = self.i;
        let mut j = self.i;
        while j < b.len() && b[j].is_ascii_digit() {
            j += 1;
        }
        if j == start {
            return None;
        }
        if j + 1 < b.len() && b[j] == b'.' && b[j + 1].is_ascii_digit() {
            j += 1;
            while j < b.len() && b[j].is_ascii_digit() {
                j += 1;
            }
        }
        self.i = j;
        self.s[start..j].parse().ok()
    }

    fn word(&mut self) -> &'a str {
        let start = self.i;
        let b = self.s.as_bytes();
        while self.i < b.len() && b[self.i].is_ascii_alphabetic() {
            self.i += 1;
        }
        &self.s[start..self.i]
    }

    fn eat(&mut self, prefix: &str) -> bool {
        let rest = &self.s[self.i..];
        if rest.len() >= prefix.len()
            && rest.is_char_boundary(prefix.len())
            && rest[..prefix.len()].eq_ignore_ascii_case(prefix)
        {
            self.i += prefix.len();
            true
        } else {
            false
        }
    }

    fn done(&self) -> bool {
        self.i == self.s.len()
    }
}

/// `burst N`, the whole part.
fn burst(part: &str) -> Option<f64> {
    let mut sc = Scan { s: part, i: 0 };
    if !sc.eat("burst") {
        return None;
    }
    sc.spaces();
    let n = sc.number()?;
    sc.done().then_some(n)
}

/// `count (/|per) [every] unit`, the whole part: `(count, every, unit)`.
fn limit_part(part: &str) -> Option<(f64, Option<f64>, &str)> {
    let mut sc = Scan { s: part, i: 0 };
    let count = sc.number()?;
    sc.spaces();
    if !(sc.eat("/") || sc.eat("per")) {
        return None;
    }
    sc.spaces();
    let every = sc.number();
    if every.is_some() {
        sc.spaces();
    }
    let unit = sc.word();
    (!unit.is_empty() && sc.done()).then_some((count, every, unit))
}

fn is_number(part: &str) -> bool {
    let mut sc = Scan { s: part, i: 0 };
    sc.number().is_some() && sc.done()
}

fn check_cap(text: &str, cap: f64, rate: f64) -> Result<f64, LimitStringError> {
    if !(1.0..=1e15).contains(&cap) {
        return Err(err(text, "(a count or burst must be between 1 and 1e15)"));
    }
    if !(1e-9..=1e15).contains(&rate) {
        return Err(err(text, "(the rate must be 1e-9 to 1e15 per second)"));
    }
    if cap / rate > MAX_FILL_SECS {
        return Err(err(text, "(a bucket must refill within 100 years)"));
    }
    Ok(cap)
}

fn err(text: &str, why: &str) -> LimitStringError {
    LimitStringError(format!("not a limit: {text:?} {why}"))
}

/// Every limit of a limit string (`"10/second;500/minute"`), all meant to hold together.
pub fn parse_limits(text: &str) -> Result<Vec<LimitSpec>, LimitStringError> {
    let mut limits: Vec<LimitSpec> = Vec::new();
    for raw in text.split([';', ',', '|']) {
        let part = raw.trim_matches(is_space);
        if part.is_empty() {
            return Err(err(text, &format!("(an empty part; {HELP})")));
        }
        if let Some(b) = burst(part) {
            let Some(last) = limits.last_mut() else {
                return Err(err(text, "(a burst follows the limit it is for)"));
            };
            if last.cap != last.amount {
                return Err(err(text, "(two bursts for one limit)"));
            }
            last.cap = check_cap(text, b, last.rate())?;
            continue;
        }
        let Some((count, every, unit)) = limit_part(part) else {
            if is_number(part) && !limits.is_empty() {
                return Err(err(
                    text,
                    &format!(
                        "({part:?} alone is not a limit; a burst is written ', burst {part}')"
                    ),
                ));
            }
            return Err(err(text, &format!("({HELP})")));
        };
        let lower = unit.to_ascii_lowercase();
        let Some(secs) = unit_secs(&lower) else {
            let hint = if matches!(lower.as_str(), "ms" | "msec" | "millis") {
                " (milliseconds are not a unit here)"
            } else {
                ""
            };
            return Err(LimitStringError(format!(
                "not a limit: {text:?}: '{unit}' is not a unit{hint}; use second, minute, hour, \
                 day, month or year (or s, sec, m, min, h, hr, d)"
            )));
        };
        let every = every.unwrap_or(1.0);
        if count <= 0.0 || every <= 0.0 {
            return Err(err(text, "(the count and the period must be positive)"));
        }
        let period = every * secs;
        if limits.iter().any(|l| l.period_secs == period) {
            return Err(err(
                text,
                &format!(
                    "(two limits over the same period, {} s: keep the tighter one)",
                    num(period)
                ),
            ));
        }
        let cap = check_cap(text, count, count / period)?;
        limits.push(LimitSpec {
            amount: count,
            period_secs: period,
            cap,
        });
        if limits.len() > MAX_LIMITS {
            return Err(err(
                text,
                &format!("(at most {MAX_LIMITS} limits in one string)"),
            ));
        }
    }
    Ok(limits)
}

/// The one limit of a string holding one (`"5/minute, burst 10"`) as a [`Limit`]; a string
/// of several is refused: enforce those together, as rules do.
pub fn parse_limit(text: &str) -> Result<Limit, LimitStringError> {
    let limits = parse_limits(text)?;
    if limits.len() > 1 {
        return Err(LimitStringError(format!(
            "{text:?} holds {} limits, and this takes one (rate, cap): enforce several \
             together (RL.MTAKE, rules)",
            limits.len()
        )));
    }
    limits[0].limit()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn golden_cases() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../protocol/limit_strings.json"
        );
        let doc: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let cases = doc["cases"].as_array().unwrap();
        assert!(cases.len() > 40);
        for case in cases {
            let text = case["text"].as_str().unwrap();
            let got = parse_limits(text);
            if let Some(want) = case["error"].as_str() {
                let e = got.expect_err(text);
                assert!(e.0.contains(want), "{text:?}: {e} lacks {want:?}");
            } else {
                let want: Vec<LimitSpec> = case["limits"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|l| LimitSpec {
                        amount: l[0].as_f64().unwrap(),
                        period_secs: l[1].as_f64().unwrap(),
                        cap: l[2].as_f64().unwrap(),
                    })
                    .collect();
                assert_eq!(got.expect(text), want, "{text:?}");
            }
        }
    }

    #[test]
    fn single_limits() {
        let l = parse_limit("5/minute, burst 10").unwrap();
        assert_eq!((l.rate(), l.cap()), (5.0 / 60.0, 10.0));
        assert!(parse_limit("10/second;100/minute")
            .unwrap_err()
            .0
            .contains("holds 2"));
        assert_eq!(parse_limits("5/minute").unwrap()[0].suffix(), "60s");
    }
}
