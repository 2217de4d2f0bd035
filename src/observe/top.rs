//! `RL.TOP [count]`: the keys denied most in a recent window, most first, as rows
//! `[key, denied, last_denied_ms_ago]` (default 10 rows).
//!
//! `denied` is the key's denials (shadow ones included) decayed with a half-life of 60 s,
//! rounded: a space-saving estimate that never undercounts (see `rl_core::top`). Keys over
//! 128 bytes are shown cut to 128.
//!
//! The sketch lives on Redis's main thread (commands, config callbacks and `INFO` run
//! there), fixed in size: recording a denial allocates nothing.

use crate::args::Args;
use crate::clock;
use crate::error::{Error, Result};
use crate::ffi::Ctx;
use crate::ffi::{MainThread, Refusal};
use crate::reply::Reply;
use rl_core::top::Top;
use rl_core::Nanos;
use std::sync::atomic::{AtomicI64, Ordering::Relaxed};

pub fn top(_ctx: Ctx, args: Args) -> Result<Reply> {
    let count = match args.len() {
        0 => 10,
        1 => args.positive(0, "count must be a positive integer")? as usize,
        _ => return Err(Error::Arity),
    };
    let now = clock::now();
    let mut rows = Vec::new();
    rows_at(count, now, |key, denied, ago| {
        rows.push(Reply::Array(vec![
            Reply::Bytes(key.to_vec()),
            Reply::Int(denied.round() as i64),
            Reply::count(ago),
        ]));
    });
    Ok(Reply::Array(rows))
}

/// Denials fade from `RL.TOP` with this half-life.
pub const HALF_LIFE: Nanos = 60 * 1_000_000_000;

static TOP: MainThread<Option<Top>> = MainThread::new(None);

/// `rl.top-keys`: keys the most-denied sketch tracks (0 to 65536; default 128).
static TOP_KEYS: AtomicI64 = AtomicI64::new(128);

pub fn top_keys() -> i64 {
    TOP_KEYS.load(Relaxed)
}

/// Setting it allocates the sketch anew (and empties it); nothing else ever allocates
/// for it.
pub fn set_top_keys(v: i64) -> std::result::Result<(), Refusal> {
    TOP_KEYS.store(v, Relaxed);
    TOP.with(|t| *t = Some(Top::new(v.max(0) as usize, HALF_LIFE)));
    Ok(())
}

/// Allocates the sketch at load if no config set did.
pub fn init() {
    TOP.with(|t| {
        if t.is_none() {
            *t = Some(Top::new(TOP_KEYS.load(Relaxed).max(0) as usize, HALF_LIFE));
        }
    });
}

/// Records a denial of `key` (shadow or not).
#[inline]
pub fn denied(key: &[u8], now: Nanos) {
    TOP.with(|t| {
        if let Some(t) = t {
            t.record(key, now);
        }
    });
}

/// `RL.TOP`'s rows: (key, full length, denied, ms since the last denial).
fn rows_at(count: usize, now: Nanos, mut f: impl FnMut(&[u8], f64, u64)) -> usize {
    TOP.with(|t| {
        let Some(t) = t else { return 0 };
        let rows = t.top(count, now);
        for r in &rows {
            f(r.key, r.denied, now.saturating_sub(r.last) / 1_000_000);
        }
        rows.len()
    })
}

/// Forgets every denial (`CONFIG RESETSTAT`).
pub fn clear() {
    TOP.with(|t| {
        if let Some(t) = t {
            t.clear();
        }
    });
}
