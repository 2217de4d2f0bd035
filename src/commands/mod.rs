//! The commands, one file each, and what they share.

pub mod acquire;
#[cfg(debug_assertions)]
pub mod debug_panic;
pub mod lease;
pub mod mtake;
pub mod peek;
pub mod refund;
pub mod reserve;
pub mod return_lease;
pub mod setpermits;
pub mod setshares;
pub mod setstate;
pub mod share;
pub mod stats;
pub mod take;
pub mod top;

use crate::args::Args;
use crate::boundary::{ArgDoc, Counting, Keys, Spec};
use crate::error::{Error, Result};
use crate::ffi::{Ctx, EffectArg};
use crate::grammar::Opt;
use crate::key::BucketKey;
use crate::stored::StateMut;
use rl_core::{Applied, Level, Limit, Nanos};

/// `rate cap` at argument `i`.
fn limit(args: &Args, i: usize) -> Result<Limit> {
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
        text: [0; 32],
        rate_len: 0,
        cap_len: 0,
        limit: None,
    });

struct RecentLimit {
    /// The rate's bytes, then the cap's.
    text: [u8; 32],
    rate_len: usize,
    cap_len: usize,
    limit: Option<Limit>,
}

impl RecentLimit {
    fn get(&self, rate: &[u8], cap: &[u8]) -> Option<Limit> {
        let limit = self.limit?;
        let (r, c) = (self.rate_len, self.cap_len);
        (rate.len() == r
            && cap.len() == c
            && self.text[..r] == *rate
            && self.text[r..r + c] == *cap)
            .then_some(limit)
    }

    fn put(&mut self, rate: &[u8], cap: &[u8], limit: Limit) {
        if rate.len() + cap.len() > self.text.len() {
            return;
        }
        self.text[..rate.len()].copy_from_slice(rate);
        self.text[rate.len()..rate.len() + cap.len()].copy_from_slice(cap);
        (self.rate_len, self.cap_len, self.limit) = (rate.len(), cap.len(), Some(limit));
    }
}

/// A request for `n` tokens must be one the bucket can ever grant; `what` names it.
fn fits(n: u64, limit: &Limit, what: &'static str) -> Result<()> {
    if n as f64 > limit.cap() {
        return Err(Error::Invalid(what));
    }
    Ok(())
}

/// A key's bucket as one call sees it.
struct Opened<'k> {
    /// The stored bucket (none for a new key, or a script hash being adopted).
    state: Option<StateMut<'k>>,
    /// Its level at `now` under the limit that decides the call: the call's own, or (a
    /// call with an older `VERSION`) the stored one.
    level: Level,
    /// The key holds the classic script's hash, adopted (`rl.adopt-script-keys`).
    adopted: bool,
    /// Stored even if the call is denied: a new bucket that starts below full (`INIT`),
    /// or a limit replaced by a newer `VERSION`.
    created: bool,
    /// Which limit decides the call (see [`rl_core::version`]).
    applied: Applied,
}

impl Opened<'_> {
    /// The call's `n` (or `MIN`) must fit the limit that decides it: under a stored, newer
    /// limit with a smaller cap, a stale call gets the error a call passing that limit
    /// would (nothing changes).
    fn fits(&self, n: u64, what: &'static str) -> Result<()> {
        fits(n, self.level.limit(), what)
    }

    /// Counts which limit decided the call (once it is decided).
    #[inline]
    fn count(&self) {
        count_applied(self.applied);
    }

    /// Stores the level's bucket and sends its effect if the call `granted`, or if the
    /// bucket must be stored even on a denial (`created`); for a command whose key is
    /// argument `i` with `rate cap` after it. Once per call.
    #[inline]
    fn write_if(
        &mut self,
        ctx: Ctx,
        key: &BucketKey,
        args: &Args,
        i: usize,
        granted: bool,
    ) -> Result<()> {
        if !(granted || self.created) {
            return Ok(());
        }
        let origin = Origin {
            adopted: self.adopted,
            applied: self.applied,
        };
        write_bucket(
            ctx,
            key,
            self.state.take(),
            self.level.bucket(),
            args,
            i,
            origin,
        )
    }
}

/// Counts a decided call by which limit decided it (`rl_limit_replaced`, `rl_limit_stale`,
/// `rl_limit_conflicts`).
fn count_applied(applied: Applied) {
    match applied {
        Applied::Replaced => crate::stats::LIMIT_REPLACED.add(1),
        Applied::Stale => crate::stats::LIMIT_STALE.add(1),
        Applied::Conflict => crate::stats::LIMIT_CONFLICTS.add(1),
        Applied::Created | Applied::Same => {}
    }
}

/// Opens the bucket of `key` for a call with `limit` at `version` (and `INIT tokens`, if
/// given).
fn open_bucket<'k>(
    key: &'k BucketKey,
    limit: Limit,
    version: u64,
    now: Nanos,
    init: Option<f64>,
) -> Result<Opened<'k>> {
    let (state, adopted) = crate::adopt::state(key, limit, now)?;
    let (level, applied, adopted) = match adopted {
        Some(level) => (level.with_version(version), Applied::Created, true),
        None => {
            let (level, applied) = level_of(state.as_ref(), limit, version, now, init);
            (level, applied, false)
        }
    };
    let created = !adopted && (created_below_full(state.as_ref(), &level) || applied.must_write());
    Ok(Opened {
        state,
        level,
        adopted,
        created,
        applied,
    })
}

fn level_of(
    state: Option<&StateMut>,
    limit: Limit,
    version: u64,
    now: Nanos,
    init: Option<f64>,
) -> (Level, Applied) {
    match (state, init) {
        (None, Some(tokens)) => (
            Level::starting_with(limit, tokens, now).with_version(version),
            Applied::Created,
        ),
        (state, _) => {
            rl_core::version::open(state.map(|s| s.bucket()).as_ref(), limit, version, now)
        }
    }
}

/// Where a bucket being written came from: what [`write_bucket`] must replace or send.
#[derive(Clone, Copy)]
struct Origin {
    /// The key held the classic script's hash (replaced first).
    adopted: bool,
    /// Which limit decided the call: under the stored one (`Stale`) the effect carries it.
    applied: Applied,
}

/// Stores `bucket` and sends its effect, for a command whose key is argument `i` with
/// `rate cap` after it (the caller's own strings go into the effect: nothing to format,
/// unless the call was decided under the stored limit). A script hash being adopted is
/// replaced first.
fn write_bucket(
    ctx: Ctx,
    key: &BucketKey,
    state: Option<StateMut>,
    bucket: rl_core::Bucket,
    args: &Args,
    i: usize,
    origin: Origin,
) -> Result<()> {
    // Everything fallible first: nothing may fail once the key is changed.
    let (name, rate, cap) = (args.raw(i)?, args.raw(i + 1)?, args.raw(i + 2)?);
    if origin.adopted {
        crate::adopt::replace(ctx, key, name);
    }
    key.store(state, bucket);
    if origin.applied == Applied::Stale {
        // The stored limit, not the caller's.
        crate::propagate::with_stored_limit(name, &bucket, |head| {
            crate::propagate::bucket(ctx, head)
        });
        return Ok(());
    }
    let head = crate::propagate::Head {
        key: name,
        full_at: bucket.full_at(),
        rate: EffectArg::Str(rate),
        cap: EffectArg::Str(cap),
        hold: bucket.hold(),
        span: bucket.span(),
        version: bucket.version(),
    };
    crate::propagate::bucket(ctx, &head);
    Ok(())
}

/// Whether a new bucket started below full must be stored even if the call is denied:
/// otherwise every call would start it afresh and it would never fill.
fn created_below_full(state: Option<&StateMut>, level: &Level) -> bool {
    state.is_none() && level.reset_after() > 0
}

const KEY: ArgDoc = ArgDoc::key(c"key");
const RATE: ArgDoc = ArgDoc::double(c"rate");
const CAP: ArgDoc = ArgDoc::double(c"cap");
const INIT: ArgDoc = Opt::Init.doc();
const WITHSTATE: ArgDoc = Opt::WithState.doc();
const SHADOW: ArgDoc = Opt::Shadow.doc();
const VERSION: ArgDoc = Opt::Version.doc();

const RESERVE_ARGS: &[ArgDoc] = &[
    KEY,
    RATE,
    CAP,
    ArgDoc::integer(c"n"),
    ArgDoc::integer(c"max_wait_ms"),
    INIT,
    SHADOW,
    VERSION,
];
const REFUND_ARGS: &[ArgDoc] = &[KEY, ArgDoc::integer(c"n")];
const ACQUIRE_ARGS: &[ArgDoc] = &[KEY, ArgDoc::integer(c"limit"), ArgDoc::integer(c"ttl_ms")];
const RELEASE_ARGS: &[ArgDoc] = &[KEY, ArgDoc::integer(c"permit_id")];
const RENEW_ARGS: &[ArgDoc] = &[
    KEY,
    ArgDoc::integer(c"permit_id"),
    ArgDoc::integer(c"ttl_ms"),
];
const SETPERMITS_ARGS: &[ArgDoc] = &[
    KEY,
    ArgDoc::integer(c"id").after(c"LASTID"),
    ArgDoc::integer(c"t").after(c"PRUNE"),
    ArgDoc::integer(c"id").after(c"DROP"),
    ArgDoc {
        token: Some(c"ADD"),
        optional: true,
        ..ArgDoc::block(c"permit", PERMIT_BLOCK)
    },
];
const PERMIT_BLOCK: &[ArgDoc] = &[ArgDoc::integer(c"id"), ArgDoc::integer(c"expires_at")];
const BUCKET_BLOCK: &[ArgDoc] = &[KEY, RATE, CAP];
const ADD_BLOCK: &[ArgDoc] = &[
    ArgDoc::integer(c"id"),
    ArgDoc::integer(c"tokens"),
    ArgDoc::integer(c"expires_at"),
];
const TAKE_ARGS: &[ArgDoc] = &[
    KEY,
    RATE,
    CAP,
    ArgDoc::integer(c"n").optional(),
    WITHSTATE,
    INIT,
    SHADOW,
    VERSION,
];
const LEASE_ARGS: &[ArgDoc] = &[
    KEY,
    RATE,
    CAP,
    ArgDoc::integer(c"n"),
    ArgDoc::integer(c"ttl_ms"),
    Opt::Min.doc(),
    Opt::Return.doc(),
    INIT,
    SHADOW,
    VERSION,
];
const RETURN_ARGS: &[ArgDoc] = &[
    KEY,
    ArgDoc::integer(c"lease_id"),
    ArgDoc::integer(c"unused"),
];
const PEEK_ARGS: &[ArgDoc] = &[KEY];
const MTAKE_ARGS: &[ArgDoc] = &[
    ArgDoc::integer(c"n"),
    ArgDoc::block(c"bucket", BUCKET_BLOCK).multiple(),
    WITHSTATE,
    INIT,
    SHADOW,
    VERSION,
];
const STATS_ARGS: &[ArgDoc] = &[ArgDoc {
    name: c"namespace",
    kind: redis_module::raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_STRING,
    token: None,
    optional: true,
    multiple: false,
    sub: &[],
}];
const TOP_ARGS: &[ArgDoc] = &[ArgDoc::integer(c"count").optional()];
const SETSTATE_ARGS: &[ArgDoc] = &[
    KEY,
    ArgDoc::integer(c"full_at"),
    RATE,
    CAP,
    VERSION,
    ArgDoc::integer(c"id").after(c"LASTID"),
    ArgDoc::integer(c"t").after(c"PRUNE"),
    ArgDoc::integer(c"id").after(c"DROP"),
    ArgDoc {
        token: Some(c"ADD"),
        optional: true,
        ..ArgDoc::block(c"lease", ADD_BLOCK)
    },
];

const SHARE_ARGS: &[ArgDoc] = &[
    KEY,
    RATE,
    CAP,
    ArgDoc::string(c"holder"),
    ArgDoc::double(c"want"),
    ArgDoc::integer(c"period_ms"),
    Opt::Release.doc(),
    VERSION,
];
const SHARE_ENTRY: &[ArgDoc] = &[
    ArgDoc::string(c"holder"),
    ArgDoc::string(c"want,rate,burst,lease_end,held_rate,held_burst,held_until"),
];
const SETSHARES_ARGS: &[ArgDoc] = &[
    KEY,
    RATE,
    CAP,
    ArgDoc::integer(c"version"),
    ArgDoc::integer(c"t").after(c"PRUNE"),
    ArgDoc {
        token: Some(c"SET"),
        ..ArgDoc::block(c"entry", SHARE_ENTRY)
    },
];

/// Every command, as Redis is told about it (registered in this order at load).
pub static COMMANDS: &[Spec] = &[
    Spec {
        name: c"RL.TAKE",
        func: take::take,
        counting: Counting::Here,
        flags: c"write deny-oom fast",
        keys: Keys::OneWritten,
        arity: -4,
        summary: c"Refills a token bucket and takes n tokens if they are all there",
        complexity: c"O(1)",
        acl: c"write fast",
        internal: false,
        args: TAKE_ARGS,
    },
    Spec {
        name: c"RL.LEASE",
        func: lease::lease,
        counting: Counting::Here,
        flags: c"write deny-oom",
        keys: Keys::OneWritten,
        arity: -6,
        summary: c"Takes a batch of tokens to spend until the lease expires",
        complexity: c"O(L) where L is the number of leases on the key (at most 1024)",
        acl: c"write",
        internal: false,
        args: LEASE_ARGS,
    },
    Spec {
        name: c"RL.RETURN",
        func: return_lease::return_lease,
        counting: Counting::Here,
        flags: c"write deny-oom",
        keys: Keys::OneWritten,
        arity: 4,
        summary: c"Gives back what a lease did not spend, once",
        complexity: c"O(L) where L is the number of leases on the key (at most 1024)",
        acl: c"write",
        internal: false,
        args: RETURN_ARGS,
    },
    Spec {
        name: c"RL.PEEK",
        func: peek::peek,
        counting: Counting::Here,
        flags: c"readonly",
        keys: Keys::OneRead,
        arity: 2,
        summary: c"Shows a bucket's state without taking anything",
        complexity: c"O(L) where L is the number of leases on the key (at most 1024)",
        acl: c"read",
        internal: false,
        args: PEEK_ARGS,
    },
    // Keys at 2, 5, 8...; options after them, so the command reports its keys itself
    // (getkeys-api) and counts its own calls (key-position requests are not calls).
    Spec {
        name: c"RL.MTAKE",
        func: mtake::mtake,
        counting: Counting::Elsewhere,
        flags: c"write deny-oom getkeys-api",
        keys: Keys::EveryThirdFrom2,
        arity: -5,
        summary: c"Takes n tokens from every bucket given, or from none",
        complexity: c"O(N) where N is the number of buckets (at most 64)",
        acl: c"write",
        internal: false,
        args: MTAKE_ARGS,
    },
    Spec {
        name: c"RL.RESERVE",
        func: reserve::reserve,
        counting: Counting::Here,
        flags: c"write deny-oom fast",
        keys: Keys::OneWritten,
        arity: -6,
        summary: c"Takes n tokens now, waiting in line for them if they come within max_wait_ms",
        complexity: c"O(1)",
        acl: c"write fast",
        internal: false,
        args: RESERVE_ARGS,
    },
    Spec {
        name: c"RL.REFUND",
        func: refund::refund,
        counting: Counting::Here,
        flags: c"write deny-oom fast",
        keys: Keys::OneWritten,
        arity: 3,
        summary: c"Gives tokens back to a bucket (a call that never went out)",
        complexity: c"O(1)",
        acl: c"write fast",
        internal: false,
        args: REFUND_ARGS,
    },
    Spec {
        name: c"RL.ACQUIRE",
        func: acquire::acquire,
        counting: Counting::Here,
        flags: c"write deny-oom",
        keys: Keys::OneWritten,
        arity: 4,
        summary: c"Takes a permit of a semaphore whose permits expire",
        complexity: c"O(P) where P is the number of permits on the key (at most 10000)",
        acl: c"write",
        internal: false,
        args: ACQUIRE_ARGS,
    },
    Spec {
        name: c"RL.RELEASE",
        func: acquire::release,
        counting: Counting::Here,
        flags: c"write",
        keys: Keys::OneWritten,
        arity: 3,
        summary: c"Releases a permit taken with RL.ACQUIRE",
        complexity: c"O(P) where P is the number of permits on the key (at most 10000)",
        acl: c"write",
        internal: false,
        args: RELEASE_ARGS,
    },
    Spec {
        name: c"RL.RENEW",
        func: acquire::renew,
        counting: Counting::Here,
        flags: c"write deny-oom",
        keys: Keys::OneWritten,
        arity: 4,
        summary: c"Extends a live permit's expiry (a call that takes longer)",
        complexity: c"O(P) where P is the number of permits on the key (at most 10000)",
        acl: c"write",
        internal: false,
        args: RENEW_ARGS,
    },
    // Not for clients: the effect of the semaphore commands.
    Spec {
        name: c"RL.SETPERMITS",
        func: setpermits::setpermits,
        counting: Counting::Elsewhere,
        flags: c"write deny-oom",
        keys: Keys::OneWritten,
        arity: -4,
        summary: c"Internal: sets a semaphore key's permits (what replicas and the AOF receive)",
        complexity: c"O(P) where P is the number of permits on the key (at most 10000)",
        acl: c"write admin dangerous",
        internal: true,
        args: SETPERMITS_ARGS,
    },
    Spec {
        name: c"RL.SHARE",
        func: share::share,
        counting: Counting::Here,
        flags: c"write deny-oom",
        keys: Keys::OneWritten,
        arity: -7,
        summary: c"Leases a holder its share of a rate (and of the cap, as a burst), divided max-min fair among the live holders",
        complexity: c"O(H) where H is the number of holders on the key (at most 4096)",
        acl: c"write",
        internal: false,
        args: SHARE_ARGS,
    },
    // Not for clients: the effect of RL.SHARE.
    Spec {
        name: c"RL.SETSHARES",
        func: setshares::setshares,
        counting: Counting::Elsewhere,
        flags: c"write deny-oom",
        keys: Keys::OneWritten,
        arity: -8,
        summary: c"Internal: sets a share key's limit and one holder (what replicas and the AOF receive)",
        complexity: c"O(H) where H is the number of holders on the key (at most 4096)",
        acl: c"write admin dangerous",
        internal: true,
        args: SETSHARES_ARGS,
    },
    // Observers: not counted in `calls`.
    Spec {
        name: c"RL.STATS",
        func: stats::stats,
        counting: Counting::Elsewhere,
        flags: c"readonly fast",
        keys: Keys::None,
        arity: -1,
        summary: c"Per-namespace counters: calls, granted, denied, shadow-denied, tokens granted",
        complexity: c"O(N) where N is the number of namespaces (rl.max-namespaces)",
        acl: c"read fast",
        internal: false,
        args: STATS_ARGS,
    },
    Spec {
        name: c"RL.TOP",
        func: top::top,
        counting: Counting::Elsewhere,
        flags: c"readonly",
        keys: Keys::None,
        arity: -1,
        summary: c"The keys denied most in a recent window",
        complexity: c"O(K log K) where K is rl.top-keys",
        acl: c"read",
        internal: false,
        args: TOP_ARGS,
    },
    // Not for clients: the effect replicas and the AOF apply. Not counted in `calls`.
    Spec {
        name: c"RL.SETSTATE",
        func: setstate::setstate,
        counting: Counting::Elsewhere,
        flags: c"write deny-oom",
        keys: Keys::OneWritten,
        arity: -5,
        summary: c"Internal: sets a bucket's state (what replicas and the AOF receive)",
        complexity: c"O(L) where L is the number of leases on the key (at most 1024)",
        acl: c"write admin dangerous",
        internal: true,
        args: SETSTATE_ARGS,
    },
    // Debug builds only.
    #[cfg(debug_assertions)]
    Spec {
        name: c"RL.DEBUG-PANIC",
        func: debug_panic::debug_panic,
        counting: Counting::Elsewhere,
        flags: c"readonly",
        keys: Keys::None,
        arity: 1,
        summary: c"Debug builds only: panics inside a command",
        complexity: c"O(1)",
        acl: c"admin dangerous",
        internal: false,
        args: &[],
    },
];

#[cfg(test)]
mod tests {
    use super::*;

    /// `COMMAND DOCS` shows exactly the options each command's parser takes.
    #[test]
    fn the_docs_list_the_options_the_parser_takes() {
        const MTAKE_OPTIONS: &[Opt] = &[Opt::WithState, Opt::Init, Opt::Shadow, Opt::Version];
        for (table, options) in [
            (TAKE_ARGS, take::OPTIONS),
            (LEASE_ARGS, lease::OPTIONS),
            (RESERVE_ARGS, reserve::OPTIONS),
            (MTAKE_ARGS, MTAKE_OPTIONS),
            (SHARE_ARGS, share::OPTIONS),
        ] {
            let documented: Vec<&std::ffi::CStr> = table.iter().filter_map(|a| a.token).collect();
            let parsed: Vec<&std::ffi::CStr> =
                options.iter().map(|o| o.doc().token.unwrap()).collect();
            assert_eq!(documented, parsed);
        }
    }
}
