//! `rl.adopt-script-keys yes`: a command that carries a limit (`RL.TAKE`, `RL.LEASE`,
//! `RL.RESERVE`, `RL.MTAKE`) on a key holding the seed Lua script's hash (exactly the fields
//! `tokens` and `ts`, as `scripts/token_bucket.lua` writes them) reads it as a bucket at the
//! same level, refilled to now under the call's limit (never above cap, rounded toward fewer
//! tokens). The hash is replaced by the bucket when the call writes (a grant); a denial leaves it as
//! it is (it holds the same level, and denials write nothing). The replacement replicates
//! as `DEL key` then the bucket's `RL.SETSTATE`, in one transaction, so replicas and the
//! AOF hold the same bucket. Any other hash, or adoption off: `WRONGTYPE`.

use crate::args::parse_number;
use crate::bucket::key::BucketKey;
use crate::bucket::stored::StateMut;
use crate::error::{Error, Result};
use crate::ffi::{Ctx, KeyKind, OpenKey, Str};
use crate::observe::stats;
use rl_core::{Level, Limit, Nanos};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

/// `rl.adopt-script-keys`: convert the seed Lua script's hashes into buckets.
static ADOPT: AtomicBool = AtomicBool::new(false);

pub fn adopt() -> bool {
    ADOPT.load(Relaxed)
}

pub fn set_adopt(v: bool) -> std::result::Result<(), crate::ffi::Refusal> {
    ADOPT.store(v, Relaxed);
    Ok(())
}

/// The key's bucket, or (adoption on) the script state it holds as a level at `now`.
pub fn state<'k>(
    key: &'k BucketKey,
    limit: Limit,
    now: Nanos,
) -> Result<(Option<StateMut<'k>>, Option<Level>)> {
    match key.state() {
        Err(Error::WrongType) if ADOPT.load(Relaxed) => {
            let level = script_state(key.open_key())
                .and_then(|(tokens, ts)| rl_core::adopt::script_level(tokens, ts, limit, now))
                .ok_or(Error::WrongType)?;
            Ok((None, Some(level)))
        }
        other => other.map(|s| (s, None)),
    }
}

/// `(tokens, ts)` if the key holds exactly the script's two fields, both numbers.
fn script_state(key: &OpenKey) -> Option<(f64, f64)> {
    if key.kind() != KeyKind::Hash || key.value_length() != 2 {
        return None;
    }
    let tokens = key.hash_field(c"tokens", parse_number)??;
    let ts = key.hash_field(c"ts", parse_number)??;
    Some((tokens, ts))
}

/// Replaces the script's hash (before the bucket is stored): the key is deleted here and
/// on replicas, whose next effect is the bucket's `RL.SETSTATE`.
pub fn replace(ctx: Ctx, key: &BucketKey, name: Str) {
    key.delete();
    crate::effect::deleted(ctx, name);
    stats::ADOPTED.add(1);
}
