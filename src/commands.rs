//! The command table: every command as Redis is told about it (flags, keys, arity, ACL
//! categories, docs and arguments), each pointing at its handler in the room of the type it
//! works on. `protocol/commands.json` is written from this table (see `protocol.rs`).

use crate::arg_doc::ArgDoc;
use crate::boundary::{CallsCounted, Keys, Spec};
use crate::bucket::{
    budget, lease, mtake, peek, pin, refund, reserve, return_lease, setstate, settle, take,
};
use crate::grammar::Opt;
use crate::observe::{rl_stats, top};
use crate::semaphore::{acquire, setpermits};
use crate::share::{command as share, setshares};

const KEY: ArgDoc = ArgDoc::key(c"key");
const RATE: ArgDoc = ArgDoc::double(c"rate");
const CAP: ArgDoc = ArgDoc::double(c"cap");
const VERSION: ArgDoc = Opt::Version.doc();

const RESERVE_ARGS: &[ArgDoc] = &[
    KEY,
    RATE,
    CAP,
    ArgDoc::integer(c"n"),
    ArgDoc::integer(c"max_wait_ms"),
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
const TAKE_ARGS: &[ArgDoc] = &[KEY, RATE, CAP, ArgDoc::integer(c"n").optional()];
const LEASE_ARGS: &[ArgDoc] = &[
    KEY,
    RATE,
    CAP,
    ArgDoc::integer(c"n"),
    ArgDoc::integer(c"ttl_ms"),
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
];
const BUDGET_BLOCK: &[ArgDoc] = &[KEY, RATE, CAP, ArgDoc::integer(c"n")];
const BUDGET_ARGS: &[ArgDoc] = &[
    ArgDoc::integer(c"ttl_ms"),
    ArgDoc::block(c"reservation", BUDGET_BLOCK).multiple(),
];
const SETTLE_BLOCK: &[ArgDoc] = &[KEY, ArgDoc::integer(c"actual")];
const SETTLE_ARGS: &[ArgDoc] = &[
    ArgDoc::integer(c"reservation_id"),
    ArgDoc::block(c"settlement", SETTLE_BLOCK).multiple(),
];
const STATS_ARGS: &[ArgDoc] = &[ArgDoc {
    name: c"namespace",
    kind: redis_module::raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_STRING,
    token: None,
    optional: true,
    multiple: false,
    sub: &[],
}];
const PIN_ARGS: &[ArgDoc] = &[
    KEY,
    ArgDoc::string(
        c"rate cap | BLOCK | EXEMPT | PERMITS n|BLOCK|EXEMPT | SHARES rate cap|BLOCK|EXEMPT",
    ),
    ArgDoc::integer(c"ms").after(c"PX"),
];
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
];
const SETSHARES_ARGS: &[ArgDoc] = &[
    KEY,
    RATE,
    CAP,
    ArgDoc::integer(c"version"),
    ArgDoc::integer(c"prune_at"),
    ArgDoc::string(c"holder"),
    ArgDoc::string(c"want,rate,burst,lease_end,held_rate,held_burst,held_until"),
    ArgDoc::string(c"pin").optional(),
];

/// Every command, as Redis is told about it (registered in this order at load).
pub static COMMANDS: &[Spec] = &[
    Spec {
        name: c"RL.TAKE",
        func: take::take,
        counted: CallsCounted::AtBoundary,
        flags: c"write deny-oom fast",
        keys: Keys::OneWritten,
        arity: -4,
        summary: c"Refills a token bucket and takes n tokens if they are all there",
        complexity: c"O(1)",
        acl: c"write fast",
        internal: false,
        args: TAKE_ARGS,
        options: take::OPTIONS,
    },
    Spec {
        name: c"RL.LEASE",
        func: lease::lease,
        counted: CallsCounted::AtBoundary,
        flags: c"write deny-oom",
        keys: Keys::OneWritten,
        arity: -6,
        summary: c"Takes a batch of tokens to spend until the lease expires",
        complexity: c"O(L) where L is the number of leases on the key (at most 1024)",
        acl: c"write",
        internal: false,
        args: LEASE_ARGS,
        options: lease::OPTIONS,
    },
    Spec {
        name: c"RL.RETURN",
        func: return_lease::return_lease,
        counted: CallsCounted::AtBoundary,
        flags: c"write deny-oom",
        keys: Keys::OneWritten,
        arity: 4,
        summary: c"Gives back what a lease did not spend, once",
        complexity: c"O(L) where L is the number of leases on the key (at most 1024)",
        acl: c"write",
        internal: false,
        args: RETURN_ARGS,
        options: &[],
    },
    Spec {
        name: c"RL.PEEK",
        func: peek::peek,
        counted: CallsCounted::AtBoundary,
        flags: c"readonly",
        keys: Keys::OneRead,
        arity: 2,
        summary: c"Shows a bucket's state without taking anything",
        complexity: c"O(L) where L is the number of leases on the key (at most 1024)",
        acl: c"read",
        internal: false,
        args: PEEK_ARGS,
        options: &[],
    },
    // Keys at 2, 5, 8...; options after them, so the command reports its keys itself
    // (getkeys-api) and counts its own calls (key-position requests are not calls).
    Spec {
        name: c"RL.MTAKE",
        func: mtake::mtake,
        counted: CallsCounted::ByHandler,
        flags: c"write deny-oom getkeys-api",
        keys: Keys::EveryThirdFrom2,
        arity: -5,
        summary: c"Takes n tokens from every bucket given, or from none",
        complexity: c"O(N) where N is the number of buckets (at most 64)",
        acl: c"write",
        internal: false,
        args: MTAKE_ARGS,
        options: mtake::OPTIONS,
    },
    // Keys at 2, 6, 10...; options after them, as RL.MTAKE.
    Spec {
        name: c"RL.BUDGET",
        func: budget::budget,
        counted: CallsCounted::ByHandler,
        flags: c"write deny-oom getkeys-api",
        keys: Keys::EveryFourthFrom2,
        arity: -6,
        summary: c"Reserves a cost on every bucket given, each its own n, or on none, until RL.SETTLE or ttl_ms",
        complexity: c"O(N*L) where N is the number of buckets (at most 64) and L the leases on each (at most 1024)",
        acl: c"write",
        internal: false,
        args: BUDGET_ARGS,
        options: budget::OPTIONS,
    },
    Spec {
        name: c"RL.SETTLE",
        func: settle::settle,
        counted: CallsCounted::AtBoundary,
        flags: c"write deny-oom",
        keys: Keys::EverySecondFrom2,
        arity: -4,
        summary: c"Settles an RL.BUDGET reservation with what was used: the unused part back, an overage as debt (at most cap)",
        complexity: c"O(N*L) where N is the number of buckets (at most 64) and L the leases on each (at most 1024)",
        acl: c"write",
        internal: false,
        args: SETTLE_ARGS,
        options: &[],
    },
    Spec {
        name: c"RL.RESERVE",
        func: reserve::reserve,
        counted: CallsCounted::AtBoundary,
        flags: c"write deny-oom fast",
        keys: Keys::OneWritten,
        arity: -6,
        summary: c"Takes n tokens now, waiting in line for them if they come within max_wait_ms",
        complexity: c"O(1)",
        acl: c"write fast",
        internal: false,
        args: RESERVE_ARGS,
        options: reserve::OPTIONS,
    },
    Spec {
        name: c"RL.REFUND",
        func: refund::refund,
        counted: CallsCounted::AtBoundary,
        flags: c"write deny-oom fast",
        keys: Keys::OneWritten,
        arity: 3,
        summary: c"Gives tokens back to a bucket (a call that never went out)",
        complexity: c"O(1)",
        acl: c"write fast",
        internal: false,
        args: REFUND_ARGS,
        options: &[],
    },
    Spec {
        name: c"RL.ACQUIRE",
        func: acquire::acquire,
        counted: CallsCounted::AtBoundary,
        flags: c"write deny-oom",
        keys: Keys::OneWritten,
        arity: 4,
        summary: c"Takes a permit of a semaphore whose permits expire",
        complexity: c"O(P) where P is the number of permits on the key (at most 10000)",
        acl: c"write",
        internal: false,
        args: ACQUIRE_ARGS,
        options: &[],
    },
    Spec {
        name: c"RL.RELEASE",
        func: acquire::release,
        counted: CallsCounted::AtBoundary,
        flags: c"write",
        keys: Keys::OneWritten,
        arity: 3,
        summary: c"Releases a permit taken with RL.ACQUIRE",
        complexity: c"O(P) where P is the number of permits on the key (at most 10000)",
        acl: c"write",
        internal: false,
        args: RELEASE_ARGS,
        options: &[],
    },
    Spec {
        name: c"RL.RENEW",
        func: acquire::renew,
        counted: CallsCounted::AtBoundary,
        flags: c"write deny-oom",
        keys: Keys::OneWritten,
        arity: 4,
        summary: c"Extends a live permit's expiry (a call that takes longer)",
        complexity: c"O(P) where P is the number of permits on the key (at most 10000)",
        acl: c"write",
        internal: false,
        args: RENEW_ARGS,
        options: &[],
    },
    // Not for clients: the effect of the semaphore commands.
    Spec {
        name: c"RL.SETPERMITS",
        func: setpermits::setpermits,
        counted: CallsCounted::Never,
        flags: c"write deny-oom",
        keys: Keys::OneWritten,
        arity: -4,
        summary: c"Internal: sets a semaphore key's permits (what replicas and the AOF receive)",
        complexity: c"O(P) where P is the number of permits on the key (at most 10000)",
        acl: c"write admin dangerous",
        internal: true,
        args: SETPERMITS_ARGS,
        options: &[],
    },
    Spec {
        name: c"RL.SHARE",
        func: share::share,
        counted: CallsCounted::AtBoundary,
        flags: c"write deny-oom",
        keys: Keys::OneWritten,
        arity: -7,
        summary: c"Leases a holder its share of a rate (and of the cap, as a burst), divided max-min fair among the live holders",
        complexity: c"O(H) where H is the number of holders on the key (at most 4096)",
        acl: c"write",
        internal: false,
        args: SHARE_ARGS,
        options: share::OPTIONS,
    },
    // Not for clients: the effect of RL.SHARE.
    Spec {
        name: c"RL.SETSHARES",
        func: setshares::setshares,
        counted: CallsCounted::Never,
        flags: c"write deny-oom",
        keys: Keys::OneWritten,
        arity: -7,
        summary: c"Internal: sets a share key's limit, one holder and its pin (what replicas and the AOF receive)",
        complexity: c"O(H) where H is the number of holders on the key (at most 4096)",
        acl: c"write admin dangerous",
        internal: true,
        args: SETSHARES_ARGS,
        options: &[],
    },
    // An operator's pins: `@admin` and never `@ratelimit`, so an application allowed to take
    // is not allowed to pin (RL.PINNED only reads).
    Spec {
        name: c"RL.PIN",
        func: pin::pin,
        counted: CallsCounted::AtBoundary,
        flags: c"write deny-oom",
        keys: Keys::OneWritten,
        arity: -3,
        summary: c"Pins a key's limit (rate cap, BLOCK, EXEMPT; PERMITS n on a semaphore key; SHARES on a share key), applied by every command on it whatever limit the caller sends",
        complexity: c"O(1)",
        acl: c"write admin",
        internal: false,
        args: PIN_ARGS,
        options: &[],
    },
    Spec {
        name: c"RL.UNPIN",
        func: pin::unpin,
        counted: CallsCounted::AtBoundary,
        flags: c"write",
        keys: Keys::OneWritten,
        arity: 2,
        summary: c"Removes a key's pin; its tokens carry over into the callers' limit",
        complexity: c"O(1)",
        acl: c"write admin",
        internal: false,
        args: PEEK_ARGS,
        options: &[],
    },
    Spec {
        name: c"RL.PINNED",
        func: pin::pinned,
        counted: CallsCounted::Never,
        flags: c"readonly fast",
        keys: Keys::OneRead,
        arity: 2,
        summary: c"Shows a key's live pin, or nil",
        complexity: c"O(1)",
        acl: c"read fast",
        internal: false,
        args: PEEK_ARGS,
        options: &[],
    },
    // Observers: not counted in `calls`.
    Spec {
        name: c"RL.STATS",
        func: rl_stats::stats,
        counted: CallsCounted::Never,
        flags: c"readonly fast",
        keys: Keys::None,
        arity: -1,
        summary: c"Per-namespace counters: calls, granted, denied, shadow-denied, tokens granted",
        complexity: c"O(N) where N is the number of namespaces (rl.max-namespaces)",
        acl: c"read fast",
        internal: false,
        args: STATS_ARGS,
        options: &[],
    },
    Spec {
        name: c"RL.TOP",
        func: top::top,
        counted: CallsCounted::Never,
        flags: c"readonly",
        keys: Keys::None,
        arity: -1,
        summary: c"The keys denied most in a recent window",
        complexity: c"O(K log K) where K is rl.top-keys",
        acl: c"read",
        internal: false,
        args: TOP_ARGS,
        options: &[],
    },
    // Not for clients: the effect replicas and the AOF apply. Not counted in `calls`.
    Spec {
        name: c"RL.SETSTATE",
        func: setstate::setstate,
        counted: CallsCounted::Never,
        flags: c"write deny-oom",
        keys: Keys::OneWritten,
        arity: -4,
        summary: c"Internal: sets a bucket's state (what replicas and the AOF receive)",
        complexity: c"O(L) where L is the number of leases on the key (at most 1024)",
        acl: c"write admin dangerous",
        internal: true,
        args: SETSTATE_ARGS,
        options: &[],
    },
    // Debug builds only.
    #[cfg(debug_assertions)]
    Spec {
        name: c"RL.DEBUG-PANIC",
        func: debug_panic,
        counted: CallsCounted::Never,
        flags: c"readonly",
        keys: Keys::None,
        arity: 1,
        summary: c"Debug builds only: panics inside a command",
        complexity: c"O(1)",
        acl: c"admin dangerous",
        internal: false,
        args: &[],
        options: &[],
    },
];

/// `RL.DEBUG-PANIC`, in debug builds only: panics inside a command, so the tests can show
/// the boundary answers an error and the server lives on.
#[cfg(debug_assertions)]
fn debug_panic(
    _ctx: crate::ffi::Ctx,
    _args: crate::args::Args,
) -> crate::error::Result<crate::reply::Reply> {
    panic!("RL.DEBUG-PANIC asked for a panic");
}
