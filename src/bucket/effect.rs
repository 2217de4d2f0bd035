//! Effects, not commands: what replicas and the AOF receive.
//!
//! A write never replicates the command that made it (its outcome depends on the master's
//! clock at that instant); it replicates `RL.SETSTATE` with the resulting absolute state:
//!
//! `RL.SETSTATE key full_at rate cap [HOLD t SPAN d] [VERSION v] [PIN kind until base_rate base_cap absent] [LASTID id] [PRUNE t] [DROP id] [ADD id tokens expires_at]`
//!
//! or, for a pinned bucket whose write changed nothing but `full_at` and the hold,
//! `RL.SETSTATE key full_at KEEP [HOLD t]` (applied to the same state the master had).
//!
//! The same command rebuilds keys on AOF rewrite, so a replica, an AOF replay and an RDB
//! load all end with the master's bytes. The key's expiry is not sent: it is a function of
//! the state (see [`crate::bucket::stored::expires_at`]) and every side computes it the same way.

use crate::bucket::stored::StateMut;
use crate::effect::{Decimal, EffectArgs};
use crate::ffi::{self, Aof, Ctx, EffectArg, Str};
use rl_core::pin::Pin;
use rl_core::{Bucket, Lease, Nanos};

const SETSTATE: &std::ffi::CStr = c"RL.SETSTATE";

/// A bucket as its effect states it: the key, its new bucket, and the limit as the strings
/// that parse to it (the caller's own arguments where there are some: no formatting).
pub struct BucketEffect<'a> {
    pub key: Str,
    pub full_at: Nanos,
    pub rate: EffectArg<'a>,
    pub cap: EffectArg<'a>,
    /// The instant before which the key must not go even if full, and how long after each
    /// write it must stay (`HOLD t SPAN d`; 0 almost always: only after a limit change).
    pub keep_until: Nanos,
    pub keep_after_write: Nanos,
    /// The version of the bucket's limit (0: none, and not sent).
    pub version: u64,
    /// Its pin (`PIN kind until base_rate base_cap absent`; none: not sent).
    pub pin: Option<Pin>,
}

impl<'a> BucketEffect<'a> {
    /// The effect of `bucket` at `key`, its limit written as `rate` and `cap`. A bucket
    /// without a pin (the hot path: a pinned bucket's effect carries the stored limit, see
    /// [`with_stored_limit`], which adds the pin).
    pub fn new(key: Str, bucket: &Bucket, rate: EffectArg<'a>, cap: EffectArg<'a>) -> Self {
        debug_assert!(
            bucket.pin().is_none(),
            "a pinned bucket's effect carries its pin"
        );
        BucketEffect {
            key,
            full_at: bucket.full_at(),
            rate,
            cap,
            keep_until: bucket.keep_until(),
            keep_after_write: bucket.keep_after_write(),
            version: bucket.version(),
            pin: None,
        }
    }

    /// Whether the bucket has parts a lease-table effect does not carry (see [`leases`]).
    fn has_extras(&self) -> bool {
        self.keep_until != 0
            || self.keep_after_write != 0
            || self.version != 0
            || self.pin.is_some()
    }
}

/// A new bucket state and nothing else (a take: the hot path).
pub fn bucket(ctx: Ctx, h: &BucketEffect) {
    // `full_at` as text made here and passed as a buffer: Redis builds one string object
    // from it, where an integer argument (`l`) costs it a formatting and two allocations.
    let at = Decimal::new(h.full_at);
    if !h.has_extras() {
        ffi::replicate_head(ctx, SETSTATE, h.key, at.bytes(), h.rate, h.cap);
        return;
    }
    let head = [
        EffectArg::Str(h.key),
        EffectArg::Bytes(at.bytes()),
        h.rate,
        h.cap,
    ];
    // `... [HOLD t SPAN d] [VERSION v]`.
    let (hold, span, version) = (
        Decimal::new(h.keep_until),
        Decimal::new(h.keep_after_write),
        Decimal::new(h.version),
    );
    let mut args = EffectArgs::new();
    for a in head {
        args.push(a);
    }
    if h.keep_until != 0 || h.keep_after_write != 0 {
        args.push(EffectArg::Text(c"HOLD"))
            .push(EffectArg::Bytes(hold.bytes()))
            .push(EffectArg::Text(c"SPAN"))
            .push(EffectArg::Bytes(span.bytes()));
    }
    if h.version != 0 {
        args.push(EffectArg::Text(c"VERSION"))
            .push(EffectArg::Bytes(version.bytes()));
    }
    let pin = h.pin.map(PinText::new);
    if let Some(p) = &pin {
        p.push_onto(&mut args);
    }
    ffi::replicate(ctx, SETSTATE, args.get());
}

/// A write that moved only the instant a pinned bucket is full, and its hold (a take under
/// a pin: the hot path of a pinned key): `RL.SETSTATE key full_at KEEP [HOLD t]`, every
/// other part of the stored bucket kept. Its limit and pin, formatted, would cost twice
/// the decision.
pub fn moved(ctx: Ctx, key: Str, bucket: &Bucket) {
    let (at, hold) = (
        Decimal::new(bucket.full_at()),
        Decimal::new(bucket.keep_until()),
    );
    let mut args = EffectArgs::new();
    args.push(EffectArg::Str(key))
        .push(EffectArg::Bytes(at.bytes()))
        .push(EffectArg::Text(c"KEEP"));
    if bucket.keep_until() != 0 {
        args.keyword(c"HOLD", &hold);
    }
    ffi::replicate(ctx, SETSTATE, args.get());
}

/// A pin as the words of its effect: `PIN kind until base_rate base_cap absent` (the
/// integers as integers: one word each, so a pinned bucket's longest effect fits the
/// effect buffer).
struct PinText {
    kind: i64,
    until: i64,
    base_rate: String,
    base_cap: String,
    absent: i64,
}

impl PinText {
    fn new(p: Pin) -> PinText {
        PinText {
            kind: p.kind.code() as i64,
            // At most i64::MAX (the validator's bound).
            until: p.until.min(i64::MAX as u64) as i64,
            base_rate: stored_number(p.base.rate()),
            base_cap: stored_number(p.base.cap()),
            absent: p.absent as i64,
        }
    }

    fn push_onto<'a>(&'a self, args: &mut EffectArgs<'a>) {
        args.push(EffectArg::Text(c"PIN"))
            .push(EffectArg::Int(self.kind))
            .push(EffectArg::Int(self.until))
            .push(EffectArg::Bytes(self.base_rate.as_bytes()))
            .push(EffectArg::Bytes(self.base_cap.as_bytes()))
            .push(EffectArg::Int(self.absent));
    }
}

/// A new bucket state with lease changes: expired leases pruned at `now`, one lease
/// closed, one opened. A bucket with a hold or a limit version gets a second effect that
/// sets them (rare: only after a limit change or with `VERSION`; the table effect alone
/// would leave none).
pub fn leases(ctx: Ctx, h: &BucketEffect, now: Nanos, closed: Option<u64>, opened: Option<&Lease>) {
    lease_changes(ctx, h, now, closed, opened);
    if h.has_extras() {
        bucket(ctx, h);
    }
}

fn lease_changes(
    ctx: Ctx,
    h: &BucketEffect,
    now: Nanos,
    closed: Option<u64>,
    opened: Option<&Lease>,
) {
    // Numbers as text made here (see `bucket`): Redis copies each into one string object.
    let (full_at, now) = (Decimal::new(h.full_at), Decimal::new(now));
    let closed = closed.map(Decimal::new);
    let opened = opened.map(|l| [l.id, l.tokens, l.expires_at].map(Decimal::new));
    let mut args = EffectArgs::new();
    args.push(EffectArg::Str(h.key))
        .push(EffectArg::Bytes(full_at.bytes()))
        .push(h.rate)
        .push(h.cap)
        .keyword(c"PRUNE", &now);
    if let Some(id) = &closed {
        args.keyword(c"DROP", id);
    }
    if let Some([id, tokens, expires_at]) = &opened {
        args.keyword(c"ADD", id)
            .push(EffectArg::Bytes(tokens.bytes()))
            .push(EffectArg::Bytes(expires_at.bytes()));
    }
    ffi::replicate(ctx, SETSTATE, args.get());
}

/// Runs `f` with the head of `bucket`'s effect where no argument carries its limit
/// (`RL.RETURN`, `RL.REFUND`): the limit as the strings that parse back to it, made here and
/// freed after `f` (nothing in between can fail).
pub fn with_stored_limit(key: Str, bucket: &Bucket, f: impl FnOnce(&BucketEffect)) {
    let (rate, cap) = (
        stored_number(bucket.limit().rate()),
        stored_number(bucket.limit().cap()),
    );
    f(&BucketEffect {
        pin: bucket.pin(),
        ..BucketEffect::new(
            key,
            &bucket.without_pin(),
            EffectArg::Bytes(rate.as_bytes()),
            EffectArg::Bytes(cap.as_bytes()),
        )
    });
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
pub fn rewrite(aof: &Aof, key: Str, state: &StateMut) {
    let b: Bucket = state.bucket();
    let (rate, cap) = (
        stored_number(b.limit().rate()),
        stored_number(b.limit().cap()),
    );
    let head = [
        EffectArg::Str(key),
        EffectArg::Int(b.full_at() as i64),
        EffectArg::Bytes(rate.as_bytes()),
        EffectArg::Bytes(cap.as_bytes()),
    ];
    let with = |more: &[EffectArg]| {
        let mut args = EffectArgs::new();
        for a in head.iter().chain(more) {
            args.push(*a);
        }
        ffi::emit_aof(aof, SETSTATE, args.get());
    };
    match state.table() {
        None => with(&[]),
        Some(table) => {
            with(&[
                EffectArg::Text(c"LASTID"),
                EffectArg::Int(table.last_id() as i64),
            ]);
            for l in table.leases() {
                with(&[
                    EffectArg::Text(c"ADD"),
                    EffectArg::Int(l.id as i64),
                    EffectArg::Int(l.tokens as i64),
                    EffectArg::Int(l.expires_at as i64),
                ]);
            }
        }
    }
    if b.version() != 0 {
        // Last, so it is the bucket the key ends with (the commands above set neither a
        // hold nor a version).
        with(&[
            EffectArg::Text(c"HOLD"),
            EffectArg::Int(b.keep_until() as i64),
            EffectArg::Text(c"SPAN"),
            EffectArg::Int(b.keep_after_write() as i64),
            EffectArg::Text(c"VERSION"),
            EffectArg::Int(b.version() as i64),
        ]);
    } else if b.keep_until() != 0 || b.keep_after_write() != 0 {
        // Last, as above.
        with(&[
            EffectArg::Text(c"HOLD"),
            EffectArg::Int(b.keep_until() as i64),
            EffectArg::Text(c"SPAN"),
            EffectArg::Int(b.keep_after_write() as i64),
        ]);
    }
    if let Some(p) = b.pin() {
        // Last, with the hold and version again (each command sets the whole bucket).
        let p = PinText::new(p);
        let mut args = EffectArgs::new();
        for a in head.iter() {
            args.push(*a);
        }
        let (hold, span, version) = (
            Decimal::new(b.keep_until()),
            Decimal::new(b.keep_after_write()),
            Decimal::new(b.version()),
        );
        args.keyword(c"HOLD", &hold)
            .keyword(c"SPAN", &span)
            .keyword(c"VERSION", &version);
        p.push_onto(&mut args);
        ffi::emit_aof(aof, SETSTATE, args.get());
    }
    ffi::emit_aof(aof, c"PERSIST", &[EffectArg::Str(key)]);
}
