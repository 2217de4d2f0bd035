//! Effects, not commands: what replicas and the AOF receive.
//!
//! A write never replicates the command that made it (its outcome depends on the master's
//! clock at that instant); it replicates `RL.SETSTATE` with the resulting absolute state:
//!
//! `RL.SETSTATE key full_at rate cap [HOLD t SPAN d] [VERSION v] [LASTID id] [PRUNE t] [DROP id] [ADD id tokens expires_at]`
//!
//! The same command rebuilds keys on AOF rewrite, so a replica, an AOF replay and an RDB
//! load all end with the master's bytes. The key's expiry is not sent: it is a function of
//! the state (see [`crate::stored::expires_at`]) and every side computes it the same way.

use crate::api::rm;
use crate::api::{Ctx, RStr};
use crate::stored::StateMut;
use redis_module::raw::RedisModuleIO;
use rl_core::{Bucket, Lease, Nanos};
use std::os::raw::c_char;

const SETSTATE: &std::ffi::CStr = c"RL.SETSTATE";

/// The head of an effect: the key, its new bucket, and the limit as the strings that
/// parse to it (the caller's own arguments where there are some: no formatting).
pub struct Head {
    pub key: *mut RStr,
    pub full_at: Nanos,
    pub rate: *mut RStr,
    pub cap: *mut RStr,
    /// The bucket's hold and span (0 almost always: only after a limit change).
    pub hold: Nanos,
    pub span: Nanos,
    /// The version of the bucket's limit (0: none, and not sent).
    pub version: u64,
}

impl Head {
    /// Whether the bucket has parts a lease-table effect does not carry (see [`leases`]).
    fn has_extras(&self) -> bool {
        self.hold != 0 || self.span != 0 || self.version != 0
    }
}

/// A new bucket state and nothing else (a take: the hot path).
pub fn bucket(ctx: *mut Ctx, h: &Head) {
    // `full_at` as text made here and passed as a buffer: Redis builds one string object
    // from it, where an integer argument (`l`) costs it a formatting and two allocations.
    let at = Decimal::new(h.full_at);
    if h.version != 0 {
        return versioned(ctx, h, &at);
    }
    if h.hold == 0 && h.span == 0 {
        rm!(RedisModule_Replicate(
            ctx,
            SETSTATE.as_ptr(),
            c"sbss".as_ptr(),
            h.key,
            at.ptr(),
            at.len(),
            h.rate,
            h.cap
        ));
        return;
    }
    let (hold, span) = (Decimal::new(h.hold), Decimal::new(h.span));
    rm!(RedisModule_Replicate(
        ctx,
        SETSTATE.as_ptr(),
        c"sbsscbcb".as_ptr(),
        h.key,
        at.ptr(),
        at.len(),
        h.rate,
        h.cap,
        c"HOLD".as_ptr(),
        hold.ptr(),
        hold.len(),
        c"SPAN".as_ptr(),
        span.ptr(),
        span.len()
    ));
}

/// [`bucket`] for a bucket with a limit version: `... [HOLD t SPAN d] VERSION v`.
fn versioned(ctx: *mut Ctx, h: &Head, at: &Decimal) {
    let version = Decimal::new(h.version);
    if h.hold == 0 && h.span == 0 {
        rm!(RedisModule_Replicate(
            ctx,
            SETSTATE.as_ptr(),
            c"sbsscb".as_ptr(),
            h.key,
            at.ptr(),
            at.len(),
            h.rate,
            h.cap,
            c"VERSION".as_ptr(),
            version.ptr(),
            version.len()
        ));
        return;
    }
    let (hold, span) = (Decimal::new(h.hold), Decimal::new(h.span));
    rm!(RedisModule_Replicate(
        ctx,
        SETSTATE.as_ptr(),
        c"sbsscbcbcb".as_ptr(),
        h.key,
        at.ptr(),
        at.len(),
        h.rate,
        h.cap,
        c"HOLD".as_ptr(),
        hold.ptr(),
        hold.len(),
        c"SPAN".as_ptr(),
        span.ptr(),
        span.len(),
        c"VERSION".as_ptr(),
        version.ptr(),
        version.len()
    ));
}

/// A `u64` in decimal, on the stack.
struct Decimal {
    buf: [u8; 20],
    start: usize,
}

impl Decimal {
    fn new(mut n: u64) -> Decimal {
        let mut d = Decimal {
            buf: [0; 20],
            start: 20,
        };
        loop {
            d.start -= 1;
            d.buf[d.start] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                return d;
            }
        }
    }

    fn ptr(&self) -> *const c_char {
        self.buf[self.start..].as_ptr().cast()
    }

    fn len(&self) -> usize {
        20 - self.start
    }
}

/// A new bucket state with lease changes: expired leases pruned at `now`, one lease
/// closed, one opened. A bucket with a hold or a limit version gets a second effect that
/// sets them (rare: only after a limit change or with `VERSION`; the table effect alone
/// would leave none).
pub fn leases(ctx: *mut Ctx, h: &Head, now: Nanos, closed: Option<u64>, opened: Option<&Lease>) {
    lease_changes(ctx, h, now, closed, opened);
    if h.has_extras() {
        bucket(ctx, h);
    }
}

fn lease_changes(ctx: *mut Ctx, h: &Head, now: Nanos, closed: Option<u64>, opened: Option<&Lease>) {
    let (cmd, at, now) = (SETSTATE.as_ptr(), h.full_at as i64, now as i64);
    let (prune, drop, add) = (c"PRUNE".as_ptr(), c"DROP".as_ptr(), c"ADD".as_ptr());
    match (closed, opened) {
        (None, None) => {
            rm!(RedisModule_Replicate(
                ctx,
                cmd,
                c"slsscl".as_ptr(),
                h.key,
                at,
                h.rate,
                h.cap,
                prune,
                now
            ))
        }
        (Some(id), None) => rm!(RedisModule_Replicate(
            ctx,
            cmd,
            c"slssclcl".as_ptr(),
            h.key,
            at,
            h.rate,
            h.cap,
            prune,
            now,
            drop,
            id as i64
        )),
        (None, Some(l)) => rm!(RedisModule_Replicate(
            ctx,
            cmd,
            c"slssclclll".as_ptr(),
            h.key,
            at,
            h.rate,
            h.cap,
            prune,
            now,
            add,
            l.id as i64,
            l.tokens as i64,
            l.expires_at as i64
        )),
        (Some(id), Some(l)) => rm!(RedisModule_Replicate(
            ctx,
            cmd,
            c"slssclclclll".as_ptr(),
            h.key,
            at,
            h.rate,
            h.cap,
            prune,
            now,
            drop,
            id as i64,
            add,
            l.id as i64,
            l.tokens as i64,
            l.expires_at as i64
        )),
    };
}

/// A change to a semaphore key: its last id, expired permits dropped at `prune`, one
/// permit dropped, one added (or its expiry replaced: a renewal).
pub struct PermitChange {
    pub key: *mut RStr,
    pub last_id: u64,
    pub prune: Nanos,
    pub drop: Option<u64>,
    pub add: Option<rl_core::Permit>,
}

pub fn permits(ctx: *mut Ctx, c: &PermitChange) {
    let cmd = c"RL.SETPERMITS".as_ptr();
    let (last, prune) = (c.last_id as i64, c.prune as i64);
    let (l, p) = (c"LASTID".as_ptr(), c"PRUNE".as_ptr());
    match (c.drop, c.add) {
        (Some(id), _) => rm!(RedisModule_Replicate(
            ctx,
            cmd,
            c"sclclcl".as_ptr(),
            c.key,
            l,
            last,
            p,
            prune,
            c"DROP".as_ptr(),
            id as i64
        )),
        (None, Some(a)) => rm!(RedisModule_Replicate(
            ctx,
            cmd,
            c"sclclcll".as_ptr(),
            c.key,
            l,
            last,
            p,
            prune,
            c"ADD".as_ptr(),
            a.id as i64,
            a.expires_at as i64
        )),
        (None, None) => rm!(RedisModule_Replicate(
            ctx,
            cmd,
            c"sclcl".as_ptr(),
            c.key,
            l,
            last,
            p,
            prune
        )),
    };
}

/// The key was deleted (its bucket is full again and holds no lease).
pub fn deleted(ctx: *mut Ctx, key: *mut RStr) {
    rm!(RedisModule_Replicate(
        ctx,
        c"DEL".as_ptr(),
        c"s".as_ptr(),
        key
    ));
}

/// Runs `f` with the head of `bucket`'s effect where no argument carries its limit
/// (`RL.RETURN`, `RL.REFUND`): the limit as the strings that parse back to it, made here and
/// freed after `f` (nothing in between can fail).
pub fn with_stored_limit(ctx: *mut Ctx, key: *mut RStr, bucket: &Bucket, f: impl FnOnce(&Head)) {
    let number = |x: f64| {
        let text = stored_number(x);
        rm!(RedisModule_CreateString(
            ctx,
            text.as_ptr().cast(),
            text.len()
        ))
    };
    let (rate, cap) = (number(bucket.limit().rate()), number(bucket.limit().cap()));
    f(&Head {
        key,
        full_at: bucket.full_at(),
        rate,
        cap,
        hold: bucket.hold(),
        span: bucket.span(),
        version: bucket.version(),
    });
    rm!(RedisModule_FreeString(ctx, rate));
    rm!(RedisModule_FreeString(ctx, cap));
}

/// The text of a stored number that parses back to exactly it: the shortest such form.
pub fn stored_number(x: f64) -> String {
    format!("{x}")
}

/// AOF rewrite: the commands that rebuild this key.
///
/// `RL.SETSTATE` sets the expiry the state implies; the key's actual expiry is restored
/// after it: Redis appends `PEXPIREAT` to what a module emits for every key that has an
/// expiry, and for one that has none (after `PERSIST`, or `RESTORE key 0`) the `PERSIST`
/// emitted here removes it again. So a rewritten AOF rebuilds the key exactly.
///
/// # Safety
/// `aof` and `key` must be the live arguments of an `aof_rewrite` callback.
pub unsafe fn rewrite(aof: *mut RedisModuleIO, key: *mut RStr, state: &StateMut) {
    rewrite_state(aof, key, state);
    let b = state.bucket();
    if b.version() != 0 {
        // Last, so it is the bucket the key ends with (the commands above set neither a
        // hold nor a version).
        let (rate, cap) = (
            stored_number(b.limit().rate()),
            stored_number(b.limit().cap()),
        );
        rm!(RedisModule_EmitAOF(
            aof,
            SETSTATE.as_ptr(),
            c"slbbclclcl".as_ptr(),
            key,
            b.full_at() as i64,
            rate.as_ptr().cast::<c_char>(),
            rate.len(),
            cap.as_ptr().cast::<c_char>(),
            cap.len(),
            c"HOLD".as_ptr(),
            b.hold() as i64,
            c"SPAN".as_ptr(),
            b.span() as i64,
            c"VERSION".as_ptr(),
            b.version() as i64
        ));
    } else if b.hold() != 0 || b.span() != 0 {
        // Last, so it is the bucket the key ends with (the commands above set none).
        let (rate, cap) = (
            stored_number(b.limit().rate()),
            stored_number(b.limit().cap()),
        );
        rm!(RedisModule_EmitAOF(
            aof,
            SETSTATE.as_ptr(),
            c"slbbclcl".as_ptr(),
            key,
            b.full_at() as i64,
            rate.as_ptr().cast::<c_char>(),
            rate.len(),
            cap.as_ptr().cast::<c_char>(),
            cap.len(),
            c"HOLD".as_ptr(),
            b.hold() as i64,
            c"SPAN".as_ptr(),
            b.span() as i64
        ));
    }
    rm!(RedisModule_EmitAOF(
        aof,
        c"PERSIST".as_ptr(),
        c"s".as_ptr(),
        key
    ));
}

unsafe fn rewrite_state(aof: *mut RedisModuleIO, key: *mut RStr, state: &StateMut) {
    let b: Bucket = state.bucket();
    let (rate, cap) = (
        stored_number(b.limit().rate()),
        stored_number(b.limit().cap()),
    );
    let (r, c) = (
        rate.as_ptr().cast::<c_char>(),
        cap.as_ptr().cast::<c_char>(),
    );
    let (cmd, at) = (SETSTATE.as_ptr(), b.full_at() as i64);
    let Some(table) = state.table() else {
        rm!(RedisModule_EmitAOF(
            aof,
            cmd,
            c"slbb".as_ptr(),
            key,
            at,
            r,
            rate.len(),
            c,
            cap.len()
        ));
        return;
    };
    let last = table.last_id() as i64;
    rm!(RedisModule_EmitAOF(
        aof,
        cmd,
        c"slbbcl".as_ptr(),
        key,
        at,
        r,
        rate.len(),
        c,
        cap.len(),
        c"LASTID".as_ptr(),
        last
    ));
    for l in table.leases() {
        rm!(RedisModule_EmitAOF(
            aof,
            cmd,
            c"slbbclll".as_ptr(),
            key,
            at,
            r,
            rate.len(),
            c,
            cap.len(),
            c"ADD".as_ptr(),
            l.id as i64,
            l.tokens as i64,
            l.expires_at as i64
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::Decimal;

    #[test]
    fn decimal_text() {
        for n in [0, 7, 10, 1_795_965_785_839_823_081, u64::MAX] {
            let d = Decimal::new(n);
            assert_eq!(&d.buf[d.start..], n.to_string().as_bytes());
            assert_eq!(d.len(), n.to_string().len());
        }
    }
}
