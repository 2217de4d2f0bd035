//! The argument shape of the commands that name several buckets, each as a group of
//! arguments (`RL.MTAKE`: `key rate cap`; `RL.BUDGET`: `key rate cap n`), with options after
//! the last group.

use crate::args::Args;
use crate::error::{Error, Result};
use crate::grammar::{self, Opt};

/// Most buckets one call may name.
pub const MAX_BUCKETS: usize = 64;

/// Where the groups end and what options follow them.
pub struct Shape {
    /// Arguments `first..end` are the groups.
    pub end: usize,
    pub with_state: bool,
    /// Argument index of `INIT`'s value.
    pub init_at: Option<usize>,
    /// Argument index of `VERSION`'s value.
    pub version_at: Option<usize>,
    pub shadow: bool,
}

/// Reads the options from the end (those in `allowed`), then checks that arguments
/// `first..` are whole groups of `size`, at most [`MAX_BUCKETS`]. Options are read from
/// the end: a group ends with numbers, so a `WITHSTATE` or `INIT x` there cannot be part of
/// one.
pub fn shape(args: &Args, first: usize, size: usize, allowed: &[Opt]) -> Result<Shape> {
    let mut s = Shape {
        end: args.len(),
        with_state: false,
        init_at: None,
        version_at: None,
        shadow: false,
    };
    let is = |i: usize, o: Opt| allowed.contains(&o) && grammar::is(args, i, o);
    loop {
        if s.end > first && is(s.end - 1, Opt::WithState) {
            if s.with_state {
                return Err(args.duplicate(s.end - 1));
            }
            s.with_state = true;
            s.end -= 1;
        } else if s.end > first && is(s.end - 1, Opt::Shadow) {
            if s.shadow {
                return Err(args.duplicate(s.end - 1));
            }
            s.shadow = true;
            s.end -= 1;
        } else if s.end > first + 1 && is(s.end - 2, Opt::Init) {
            if s.init_at.is_some() {
                return Err(args.duplicate(s.end - 2));
            }
            s.init_at = Some(s.end - 1);
            s.end -= 2;
        } else if s.end > first + 1 && is(s.end - 2, Opt::Version) {
            if s.version_at.is_some() {
                return Err(args.duplicate(s.end - 2));
            }
            s.version_at = Some(s.end - 1);
            s.end -= 2;
        } else {
            break;
        }
    }
    let grouped = s.end.saturating_sub(first);
    if grouped == 0 || !grouped.is_multiple_of(size) {
        return Err(Error::Arity);
    }
    if grouped / size > MAX_BUCKETS {
        return Err(Error::Invalid("at most 64 buckets per call"));
    }
    Ok(s)
}

/// Refuses the key at argument `i` if an earlier group (from `first`, every `size`) named
/// it: one bucket cannot be two limits. Checked group by group, after each group's own
/// arguments, so the first error in the arguments is the one answered.
pub fn not_named_before(args: &Args, first: usize, i: usize, size: usize) -> Result<()> {
    let name = args.bytes(i)?;
    if (first..i)
        .step_by(size)
        .any(|j| args.bytes(j).is_ok_and(|b| b == name))
    {
        return Err(Error::Invalid("a key appears twice"));
    }
    Ok(())
}
