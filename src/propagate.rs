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

use crate::ffi::{self, Aof, Ctx, EffectArg, Str};
use crate::stored::StateMut;
use rl_core::{Bucket, Lease, Nanos};

const SETSTATE: &std::ffi::CStr = c"RL.SETSTATE";

/// The head of an effect: the key, its new bucket, and the limit as the strings that
/// parse to it (the caller's own arguments where there are some: no formatting).
pub struct Head<'a> {
    pub key: Str,
    pub full_at: Nanos,
    pub rate: EffectArg<'a>,
    pub cap: EffectArg<'a>,
    /// The bucket's hold and span (0 almost always: only after a limit change).
    pub hold: Nanos,
    pub span: Nanos,
    /// The version of the bucket's limit (0: none, and not sent).
    pub version: u64,
}

impl Head<'_> {
    /// Whether the bucket has parts a lease-table effect does not carry (see [`leases`]).
    fn has_extras(&self) -> bool {
        self.hold != 0 || self.span != 0 || self.version != 0
    }
}

/// The arguments of one effect, on the stack.
struct EffectArgs<'a> {
    list: [EffectArg<'a>; 16],
    len: usize,
}

impl<'a> EffectArgs<'a> {
    fn new() -> Self {
        EffectArgs {
            list: [EffectArg::Int(0); 16],
            len: 0,
        }
    }

    fn push(&mut self, a: EffectArg<'a>) -> &mut Self {
        self.list[self.len] = a;
        self.len += 1;
        self
    }

    fn keyword(&mut self, k: &'static std::ffi::CStr, v: &'a Decimal) -> &mut Self {
        self.push(EffectArg::Text(k))
            .push(EffectArg::Bytes(v.bytes()))
    }

    fn get(&self) -> &[EffectArg<'a>] {
        &self.list[..self.len]
    }
}

/// A new bucket state and nothing else (a take: the hot path).
pub fn bucket(ctx: Ctx, h: &Head) {
    // `full_at` as text made here and passed as a buffer: Redis builds one string object
    // from it, where an integer argument (`l`) costs it a formatting and two allocations.
    let at = Decimal::new(h.full_at);
    let head = [
        EffectArg::Str(h.key),
        EffectArg::Bytes(at.bytes()),
        h.rate,
        h.cap,
    ];
    if !h.has_extras() {
        ffi::replicate(ctx, SETSTATE, &head);
        return;
    }
    // `... [HOLD t SPAN d] [VERSION v]`.
    let (hold, span, version) = (
        Decimal::new(h.hold),
        Decimal::new(h.span),
        Decimal::new(h.version),
    );
    let mut args = EffectArgs::new();
    for a in head {
        args.push(a);
    }
    if h.hold != 0 || h.span != 0 {
        args.push(EffectArg::Text(c"HOLD"))
            .push(EffectArg::Bytes(hold.bytes()))
            .push(EffectArg::Text(c"SPAN"))
            .push(EffectArg::Bytes(span.bytes()));
    }
    if h.version != 0 {
        args.push(EffectArg::Text(c"VERSION"))
            .push(EffectArg::Bytes(version.bytes()));
    }
    ffi::replicate(ctx, SETSTATE, args.get());
}

/// A `u64` in decimal, on the stack.
struct Decimal {
    buf: [u8; 20],
    start: usize,
}

/// `"00" "01" ... "99"`: two digits per step.
const DIGIT_PAIRS: &[u8; 200] = b"\
0001020304050607080910111213141516171819\
2021222324252627282930313233343536373839\
4041424344454647484950515253545556575859\
6061626364656667686970717273747576777879\
8081828384858687888990919293949596979899";

impl Decimal {
    fn new(mut n: u64) -> Decimal {
        let mut d = Decimal {
            buf: [0; 20],
            start: 20,
        };
        while n >= 100 {
            let pair = (n % 100) as usize * 2;
            n /= 100;
            d.start -= 2;
            d.buf[d.start..d.start + 2].copy_from_slice(&DIGIT_PAIRS[pair..pair + 2]);
        }
        if n >= 10 {
            let pair = n as usize * 2;
            d.start -= 2;
            d.buf[d.start..d.start + 2].copy_from_slice(&DIGIT_PAIRS[pair..pair + 2]);
        } else {
            d.start -= 1;
            d.buf[d.start] = b'0' + n as u8;
        }
        d
    }

    fn bytes(&self) -> &[u8] {
        &self.buf[self.start..]
    }
}

/// A new bucket state with lease changes: expired leases pruned at `now`, one lease
/// closed, one opened. A bucket with a hold or a limit version gets a second effect that
/// sets them (rare: only after a limit change or with `VERSION`; the table effect alone
/// would leave none).
pub fn leases(ctx: Ctx, h: &Head, now: Nanos, closed: Option<u64>, opened: Option<&Lease>) {
    lease_changes(ctx, h, now, closed, opened);
    if h.has_extras() {
        bucket(ctx, h);
    }
}

fn lease_changes(ctx: Ctx, h: &Head, now: Nanos, closed: Option<u64>, opened: Option<&Lease>) {
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

/// A change to a semaphore key: its last id, expired permits dropped at `prune`, one
/// permit dropped, one added (or its expiry replaced: a renewal).
pub struct PermitChange {
    pub key: Str,
    pub last_id: u64,
    pub prune: Nanos,
    pub drop: Option<u64>,
    pub add: Option<rl_core::Permit>,
}

pub fn permits(ctx: Ctx, c: &PermitChange) {
    let (last_id, prune) = (Decimal::new(c.last_id), Decimal::new(c.prune));
    let drop = c.drop.map(Decimal::new);
    let add = c.add.map(|a| [a.id, a.expires_at].map(Decimal::new));
    let mut args = EffectArgs::new();
    args.push(EffectArg::Str(c.key))
        .keyword(c"LASTID", &last_id)
        .keyword(c"PRUNE", &prune);
    match (&drop, &add) {
        (Some(id), _) => {
            args.keyword(c"DROP", id);
        }
        (None, Some([id, expires_at])) => {
            args.keyword(c"ADD", id)
                .push(EffectArg::Bytes(expires_at.bytes()));
        }
        (None, None) => {}
    }
    ffi::replicate(ctx, c"RL.SETPERMITS", args.get());
}

/// The key was deleted (its bucket is full again and holds no lease).
pub fn deleted(ctx: Ctx, key: Str) {
    ffi::replicate(ctx, c"DEL", &[EffectArg::Str(key)]);
}

/// Runs `f` with the head of `bucket`'s effect where no argument carries its limit
/// (`RL.RETURN`, `RL.REFUND`): the limit as the strings that parse back to it, made here and
/// freed after `f` (nothing in between can fail).
pub fn with_stored_limit(key: Str, bucket: &Bucket, f: impl FnOnce(&Head)) {
    let (rate, cap) = (
        stored_number(bucket.limit().rate()),
        stored_number(bucket.limit().cap()),
    );
    f(&Head {
        key,
        full_at: bucket.full_at(),
        rate: EffectArg::Bytes(rate.as_bytes()),
        cap: EffectArg::Bytes(cap.as_bytes()),
        hold: bucket.hold(),
        span: bucket.span(),
        version: bucket.version(),
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
            EffectArg::Int(b.hold() as i64),
            EffectArg::Text(c"SPAN"),
            EffectArg::Int(b.span() as i64),
            EffectArg::Text(c"VERSION"),
            EffectArg::Int(b.version() as i64),
        ]);
    } else if b.hold() != 0 || b.span() != 0 {
        // Last, as above.
        with(&[
            EffectArg::Text(c"HOLD"),
            EffectArg::Int(b.hold() as i64),
            EffectArg::Text(c"SPAN"),
            EffectArg::Int(b.span() as i64),
        ]);
    }
    ffi::emit_aof(aof, c"PERSIST", &[EffectArg::Str(key)]);
}

#[cfg(test)]
mod tests {
    use super::Decimal;

    #[test]
    fn decimal_text() {
        let mut cases = vec![
            0,
            7,
            9,
            10,
            99,
            100,
            101,
            1_795_965_785_839_823_081,
            u64::MAX,
        ];
        cases.extend((0..64).map(|b| 1u64 << b));
        cases.extend((1..20).map(|e| 10u64.pow(e) - 1));
        cases.extend((1..20).map(|e| 10u64.pow(e)));
        for n in cases {
            let d = Decimal::new(n);
            assert_eq!(d.bytes(), n.to_string().as_bytes());
        }
    }
}
