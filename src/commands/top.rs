//! `RL.TOP [count]`: the keys denied most in a recent window, most first, as rows
//! `[key, denied, last_denied_ms_ago]` (default 10 rows).
//!
//! `denied` is the key's denials (shadow ones included) decayed with a half-life of 60 s,
//! rounded: a space-saving estimate that never undercounts (see `rl_core::top`). Keys over
//! 128 bytes are shown cut to 128.

use crate::args::Args;
use crate::error::{Error, Result};
use crate::ffi::Ctx;
use crate::reply::Reply;
use crate::{clock, ops};

pub fn top(_ctx: Ctx, args: Args) -> Result<Reply> {
    let count = match args.len() {
        0 => 10,
        1 => args.positive(0, "count must be a positive integer")? as usize,
        _ => return Err(Error::Arity),
    };
    let now = clock::now();
    let mut rows = Vec::new();
    ops::top(count, now, |key, denied, ago| {
        rows.push(Reply::Array(vec![
            Reply::Bytes(key.to_vec()),
            Reply::Int(denied.round() as i64),
            Reply::count(ago),
        ]));
    });
    Ok(Reply::Array(rows))
}
