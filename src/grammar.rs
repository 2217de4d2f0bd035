//! The options the bucket commands share, defined once: each option's keyword, its values,
//! how they are read and refused, and how `COMMAND DOCS` shows it. A command lists the
//! options it takes ([`Opt`]) once, in the list its entry in the command table points at
//! (so its parser, its `COMMAND DOCS`, its usage and `protocol/commands.json` agree), and
//! hands the arguments after its fixed ones to [`options`]; a repeated or unknown option
//! is refused the same way by every command. `rate cap` is read here too ([`limit`]).

use crate::arg_doc::ArgDoc;
use crate::args::Args;
use crate::error::{Error, Result};
use rl_core::Limit;

/// An option of the bucket commands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Opt {
    /// `WITHSTATE`: the long reply.
    WithState,
    /// `INIT tokens`: what a new bucket starts with instead of full.
    Init,
    /// `SHADOW`: answer granted, count what would have been denied.
    Shadow,
    /// `VERSION v`: the limit's version (the newest one a bucket saw governs).
    Version,
    /// `MIN m`: the smallest batch a lease accepts.
    Min,
    /// `RETURN lease_id unused`: give back a lease's unused tokens in the same call.
    Return,
    /// `RELEASE`: a share's holder gives it up (`RL.SHARE`).
    Release,
}

const ALL: [Opt; 7] = [
    Opt::WithState,
    Opt::Init,
    Opt::Shadow,
    Opt::Version,
    Opt::Min,
    Opt::Return,
    Opt::Release,
];

/// The error for a bad `VERSION v` (the same text as [`rl_core::StateError::Version`]).
pub const BAD_VERSION: &str = "VERSION must be an integer from 0 to 9007199254740991";

impl Opt {
    /// The keyword.
    pub const fn keyword(self) -> &'static str {
        match self {
            Opt::WithState => "WITHSTATE",
            Opt::Init => "INIT",
            Opt::Shadow => "SHADOW",
            Opt::Version => "VERSION",
            Opt::Min => "MIN",
            Opt::Return => "RETURN",
            Opt::Release => "RELEASE",
        }
    }

    /// How `COMMAND DOCS` shows it (and the usage in arity errors).
    pub const fn doc(self) -> ArgDoc {
        const RETURN_BLOCK: &[ArgDoc] = &[ArgDoc::integer(c"lease_id"), ArgDoc::integer(c"unused")];
        match self {
            Opt::WithState => ArgDoc::flag(c"WITHSTATE"),
            Opt::Init => ArgDoc::double(c"tokens").after(c"INIT"),
            Opt::Shadow => ArgDoc::flag(c"SHADOW"),
            Opt::Version => ArgDoc::integer(c"v").after(c"VERSION"),
            Opt::Min => ArgDoc::integer(c"m").after(c"MIN"),
            Opt::Return => ArgDoc::block(c"return", RETURN_BLOCK).after(c"RETURN"),
            Opt::Release => ArgDoc::flag(c"RELEASE"),
        }
    }

    /// The option `arg` names (any case), if any.
    fn of(arg: &[u8]) -> Option<Opt> {
        // One comparison per call in the common case: options differ in length but for
        // SHADOW and RETURN, VERSION and RELEASE.
        let candidates: &[Opt] = match arg.len() {
            3 => &[Opt::Min],
            4 => &[Opt::Init],
            6 => &[Opt::Shadow, Opt::Return],
            7 => &[Opt::Version, Opt::Release],
            9 => &[Opt::WithState],
            _ => &[],
        };
        candidates
            .iter()
            .copied()
            .find(|o| arg.eq_ignore_ascii_case(o.keyword().as_bytes()))
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// The options one call gave, their values read and checked.
#[derive(Clone, Copy, Debug, Default)]
pub struct Options {
    pub with_state: bool,
    pub shadow: bool,
    pub init: Option<f64>,
    pub version: Option<u64>,
    pub min: Option<u64>,
    pub returning: Option<(u64, u64)>,
    pub release: bool,
}

/// Reads the options from argument `from` to the end, for a command that takes `accepts`
/// under `limit` (which `INIT` must fit). Each value is checked where it stands, so the
/// first bad argument is the one the error names.
#[inline]
pub fn options(args: &Args, from: usize, accepts: &[Opt], limit: &Limit) -> Result<Options> {
    if from >= args.len() {
        return Ok(Options::default());
    }
    given(args, from, accepts, limit)
}

fn given(args: &Args, from: usize, accepts: &[Opt], limit: &Limit) -> Result<Options> {
    let mut out = Options::default();
    let mut seen = [false; ALL.len()];
    let mut i = from;
    while i < args.len() {
        let Some(opt) = Opt::of(args.bytes(i)?).filter(|o| accepts.contains(o)) else {
            return Err(args.unknown(i));
        };
        if std::mem::replace(&mut seen[opt.index()], true) {
            return Err(args.duplicate(i));
        }
        match opt {
            Opt::WithState => out.with_state = true,
            Opt::Shadow => out.shadow = true,
            Opt::Release => out.release = true,
            Opt::Init => out.init = Some(init_tokens(args, i + 1, limit)?),
            Opt::Version => out.version = Some(version(args, i + 1)?),
            Opt::Min => out.min = Some(args.positive(i + 1, "MIN must be a positive integer")?),
            Opt::Return => {
                let id = args.integer(i + 1, "lease_id must be a non-negative integer")?;
                let unused = args.integer(i + 2, "unused must be a non-negative integer")?;
                out.returning = Some((id, unused));
            }
        }
        i += 1 + values(opt);
    }
    Ok(out)
}

/// How many values follow the keyword.
fn values(opt: Opt) -> usize {
    match opt {
        Opt::WithState | Opt::Shadow | Opt::Release => 0,
        Opt::Init | Opt::Version | Opt::Min => 1,
        Opt::Return => 2,
    }
}

/// Whether argument `i` is `keyword` (any case): for commands that find their options
/// from the end (`RL.MTAKE`).
pub fn is(args: &Args, i: usize, opt: Opt) -> bool {
    args.bytes(i).is_ok_and(|b| Opt::of(b) == Some(opt))
}

/// The `v` of `VERSION v` at argument `i`: an integer `0..=2^53-1`.
pub fn version(args: &Args, i: usize) -> Result<u64> {
    match args.integer(i, BAD_VERSION)? {
        v if v <= rl_core::MAX_VERSION => Ok(v),
        _ => Err(Error::Invalid(BAD_VERSION)),
    }
}

/// The `tokens` of `INIT tokens` at argument `i`: what a bucket that does not exist yet
/// starts with instead of full (warm start).
pub fn init_tokens(args: &Args, i: usize, limit: &Limit) -> Result<f64> {
    let tokens = args.number(i, "INIT must be a number")?;
    if !(0.0..=limit.cap()).contains(&tokens) {
        return Err(Error::Invalid("INIT must be between 0 and cap"));
    }
    Ok(tokens)
}

/// `rate cap` at argument `i`.
pub fn limit(args: &Args, i: usize) -> Result<Limit> {
    let (rate, cap) = (args.bytes(i)?, args.bytes(i + 1)?);
    if let Some(limit) = RECENT_LIMIT.with(|r| r.get(rate, cap)) {
        return Ok(limit);
    }
    let rate_v = args.number(i, "rate is not a number")?;
    let cap_v = args.number(i + 1, "cap is not a number")?;
    let limit = Limit::new(rate_v, cap_v)?;
    RECENT_LIMIT.with(|r| r.put(rate, cap, limit));
    Ok(limit)
}

/// The last limit parsed, by its argument bytes: a fleet calls one key (or a few) with the
/// same `rate cap` strings, so most calls skip parsing both numbers.
static RECENT_LIMIT: crate::ffi::MainThread<RecentLimit> =
    crate::ffi::MainThread::new(RecentLimit {
        rate: [0; 16],
        cap: [0; 16],
        rate_len: 0,
        cap_len: 0,
        limit: None,
    });

struct RecentLimit {
    rate: [u8; 16],
    cap: [u8; 16],
    rate_len: usize,
    cap_len: usize,
    limit: Option<Limit>,
}

impl RecentLimit {
    fn get(&self, rate: &[u8], cap: &[u8]) -> Option<Limit> {
        let limit = self.limit?;
        let same = |held: &[u8], len: usize, given: &[u8]| {
            given.len() == len
                && held
                    .get(..len)
                    .is_some_and(|h| rl_core::bytes::equal(h, given))
        };
        (same(&self.rate, self.rate_len, rate) && same(&self.cap, self.cap_len, cap))
            .then_some(limit)
    }

    fn put(&mut self, rate: &[u8], cap: &[u8], limit: Limit) {
        if rate.len() > self.rate.len() || cap.len() > self.cap.len() {
            return;
        }
        self.rate[..rate.len()].copy_from_slice(rate);
        self.cap[..cap.len()].copy_from_slice(cap);
        (self.rate_len, self.cap_len, self.limit) = (rate.len(), cap.len(), Some(limit));
    }
}

/// A request for `n` tokens must be one the bucket can ever grant; `what` names it.
pub fn fits(n: u64, limit: &Limit, what: &'static str) -> Result<()> {
    if n as f64 > limit.cap() {
        return Err(Error::Invalid(what));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_keyword_is_found_in_any_case_and_only_it() {
        for o in ALL {
            assert_eq!(Opt::of(o.keyword().as_bytes()), Some(o));
            assert_eq!(Opt::of(o.keyword().to_lowercase().as_bytes()), Some(o));
            let doc = o.doc();
            assert_eq!(doc.token.unwrap().to_str().unwrap(), o.keyword());
            assert!(doc.optional);
        }
        for other in [
            &b"MINX"[..],
            b"INI",
            b"",
            b"SHADOWS",
            b"VERSIONS",
            b"\xff\xff\xff",
        ] {
            assert_eq!(Opt::of(other), None);
        }
    }

    #[test]
    fn values_follow_the_docs() {
        for o in ALL {
            let doc = o.doc();
            let shown = if doc.token.is_some() && doc.name == doc.token.unwrap() {
                0
            } else if doc.sub.is_empty() {
                1
            } else {
                doc.sub.len()
            };
            assert_eq!(values(o), shown, "{o:?}");
        }
    }
}
