//! `RL.TOP [count]`: the keys denied most in a recent window, most first, as rows
//! `[key, denied, last_denied_ms_ago]` (default 10 rows).
//!
//! `denied` is the key's denials (shadow ones included) decayed with a half-life of 60 s,
//! rounded: a space-saving estimate that never undercounts (see `rl_core::top`). Keys over
//! 128 bytes are shown cut to 128.

use crate::args::Args;
use crate::error::{Error, Result};
use crate::ffi::{self, Ctx};
use crate::{clock, ops};

pub fn top(ctx: Ctx, args: Args) -> Result<()> {
    let count = match args.len() {
        0 => 10,
        1 => args.positive(0, "count must be a positive integer")? as usize,
        _ => return Err(Error::Arity),
    };
    let now = clock::now();
    let mut rows = 0;
    ops::top(count, now, |_, _, _| rows += 1);
    ffi::reply_array(ctx, rows);
    ops::top(count, now, |key, denied, ago| {
        ffi::reply_array(ctx, 3);
        ffi::reply_bytes(ctx, key);
        ffi::reply_integer(ctx, denied.round() as i64);
        ffi::reply_integer(ctx, ago.min(i64::MAX as u64) as i64);
    });
    Ok(())
}
