//! The write path of the bucket commands, as code rather than a recipe each command
//! repeats: open the key -> apply version / adoption / init -> the command's pure `rl-core`
//! decision -> store -> emit the effect -> count (stats, namespace, top keys, shadow) ->
//! the command's reply.
//!
//! A single-bucket command hands [`run`] its parsed [`Request`], its [`CommandCounters`] and
//! its decision (a closure over the bucket's level at now); it gets back the decision, the
//! level after it and whether the client is answered as granted, and builds its reply from
//! them. `RL.LEASE` (a lease table beside the level) and `RL.MTAKE` (many buckets, all or
//! nothing) use the same steps one by one: [`open`], [`OpenBucket::store`] or
//! [`store_with_leases`], [`count`].
//!
//! Shadow: a command that takes `SHADOW` decides as when enforcing and stores what
//! enforcing would store; only the answer and the counts differ ([`answered`]).

use crate::args::Args;
use crate::bucket::adopt;
use crate::bucket::effect::{self, BucketEffect};
use crate::bucket::key::BucketKey;
use crate::bucket::stored::StateMut;
use crate::error::Result;
use crate::ffi::{Ctx, EffectArg};
use crate::grammar::Options;
use crate::observe::stats::{self, Counter};
use crate::observe::{namespaces, top};
use rl_core::namespace::{Id, Outcome};
use rl_core::pin::{Gate, Pin, PinKind};
use rl_core::{Applied, Lease, LeaseTable, Level, Limit, Nanos};

/// What every single-bucket command brings, once its arguments are read: the key is
/// argument 0 with `rate cap` at 1 and 2.
#[derive(Clone, Copy)]
pub struct Request {
    pub limit: Limit,
    /// `VERSION v` (0: none).
    pub version: u64,
    /// `INIT tokens`: what a new bucket starts with instead of full.
    pub init: Option<f64>,
    /// `SHADOW`: a denial answers as a grant.
    pub shadow: bool,
    /// The smallest request the call makes (`n`, or a lease's `MIN`), and the error when it
    /// exceeds the cap of the limit that decides the call.
    pub needs: u64,
    pub needs_too_much: &'static str,
}

impl Request {
    /// The request of a call with `limit` and the options it gave, whose smallest request
    /// is `needs` (refused with `too_much` beyond the deciding limit's cap).
    pub fn new(limit: Limit, opts: &Options, needs: u64, too_much: &'static str) -> Request {
        Request {
            limit,
            version: opts.version.unwrap_or(0),
            init: opts.init,
            shadow: opts.shadow,
            needs,
            needs_too_much: too_much,
        }
    }
}

/// The `INFO rl` counters one command's decisions move.
pub struct CommandCounters {
    /// Calls granted.
    pub granted: &'static Counter,
    /// Tokens granted (none: the command does not count them).
    pub tokens: Option<&'static Counter>,
    /// Calls denied (and answered so: shadow denials go to `rl_shadow_denied`).
    pub denied: &'static Counter,
}

/// A decision on one bucket: the tokens it grants (0: denied) and what else the command
/// needs for its reply.
pub struct Decision<T> {
    pub tokens: u64,
    pub detail: T,
}

/// What [`run`] hands back to build the reply.
pub struct Decided<T> {
    pub decision: Decision<T>,
    /// The bucket after the decision.
    pub level: Level,
    /// The kind of the live pin that decided the call, if one did.
    pub pinned: Option<PinKind>,
    /// Whether the client is answered as granted (a grant, or a shadow denial).
    pub answered: bool,
}

/// Runs one single-bucket command whose write is the bucket alone (`RL.TAKE`,
/// `RL.RESERVE`): every step but the parsing and the reply.
#[inline]
pub fn run<T>(
    ctx: Ctx,
    args: &Args,
    req: &Request,
    counters: &CommandCounters,
    decide: impl FnOnce(&mut Level) -> Result<Decision<T>>,
) -> Result<Decided<T>> {
    let name = args.bytes(0)?;
    let ns = namespaces::namespace_id(name);
    let now = crate::clock::now();
    match decide_and_store(ctx, args, req, now, decide) {
        Ok((decision, level, pinned)) => {
            let answered = count_outcome(counters, decision.tokens, req.shadow);
            // The call and its outcome in one visit to the namespace's counters.
            namespaces::count(ns, Some(outcome_of(decision.tokens, answered)));
            if pinned.is_some() {
                namespaces::pinned(ns);
            }
            if decision.tokens == 0 {
                top::denied(name, now);
            }
            Ok(Decided {
                decision,
                level,
                pinned,
                answered,
            })
        }
        Err(e) => {
            namespaces::count(ns, None);
            Err(e)
        }
    }
}

/// The steps of [`run`] from opening the key to the effect.
#[inline]
fn decide_and_store<T>(
    ctx: Ctx,
    args: &Args,
    req: &Request,
    now: Nanos,
    decide: impl FnOnce(&mut Level) -> Result<Decision<T>>,
) -> Result<(Decision<T>, Level, Option<PinKind>)> {
    let key = BucketKey::open(ctx, args.raw(0)?);
    let mut bucket = open(&key, req, now)?;
    let decision = decide(&mut bucket.level)?;
    count_limit_source(bucket.decided_by);
    if bucket.writes(decision.tokens) {
        bucket.store(ctx, &key, args, 0)?;
    }
    Ok((decision, bucket.level, bucket.pinned))
}

/// A key's bucket as one call sees it, before and after the decision.
pub struct OpenBucket<'k> {
    /// The stored bucket (none for a new key, or a script hash being adopted).
    pub stored: Option<StateMut<'k>>,
    /// Its level at `now` under the limit that decides the call: the call's own, or (a
    /// call with an older `VERSION`) the stored one. The decision changes it.
    pub level: Level,
    /// The key holds the classic script's hash, replaced by the bucket when the call
    /// writes (`rl.adopt-script-keys`).
    pub replaces_script: bool,
    /// Stored even if the call is denied: a new bucket that starts below full (`INIT`),
    /// or a limit replaced by a newer `VERSION`.
    pub store_even_if_denied: bool,
    /// Which limit decides the call (see [`rl_core::version`]).
    pub decided_by: Applied,
    /// The kind of the live pin that decides the call, if one does.
    pub pinned: Option<PinKind>,
    /// The pin stored with the bucket when the call writes.
    pub pin: Option<Pin>,
}

/// Opens the bucket of `key` for a call with `req`'s limit, version and init at `now`
/// (`req.needs` already checked against the call's own limit). The call's smallest request
/// must fit the limit that decides it: under a stored, newer limit with a smaller cap, a
/// stale call gets the error a call passing that limit would, and nothing changes.
#[inline]
pub fn open<'k>(key: &'k BucketKey, req: &Request, now: Nanos) -> Result<OpenBucket<'k>> {
    let (stored, script_level) = adopt::state(key, req.limit, now)?;
    let (level, decided_by, pinned, pin, replaces_script) = match script_level {
        Some(level) => (
            level.with_version(req.version),
            Applied::Created,
            None,
            None,
            true,
        ),
        None => {
            let o = level_of(stored.as_ref(), req, now);
            // The pin to store, asked only when one decided (an ended one goes at this
            // write).
            let pin = o.pinned.and_then(|_| {
                let b = stored.as_ref().map(|s| s.bucket());
                rl_core::pin::kept(b.as_ref(), req.limit, req.version, now)
            });
            (o.level, o.applied, o.pinned, pin, false)
        }
    };
    // A new bucket started below full is stored even on a denial: otherwise every call
    // would start it afresh and it would never fill.
    let store_even_if_denied = !replaces_script
        && ((stored.is_none() && level.reset_after() > 0) || decided_by.must_write());
    let mut level = level;
    if decided_by == Applied::Stale {
        // Decided under the stored, newer limit (every other outcome decides under the
        // call's own, which the request was checked against already, or a pinned one).
        crate::grammar::fits(req.needs, level.limit(), req.needs_too_much)?;
    } else if pinned == Some(PinKind::Rate) {
        let b = stored.as_ref().map(|s| s.bucket());
        let gate = rl_core::pin::over_cap_gate(b.as_ref(), req.needs as f64, now);
        if gate != Gate::Open {
            level = level.with_gate(gate);
        }
    }
    Ok(OpenBucket {
        stored,
        level,
        replaces_script,
        store_even_if_denied,
        decided_by,
        pinned,
        pin,
    })
}

fn level_of(state: Option<&StateMut>, req: &Request, now: Nanos) -> rl_core::pin::Opened {
    match (state, req.init) {
        (None, Some(tokens)) => rl_core::pin::Opened {
            level: Level::starting_with(req.limit, tokens, now).with_version(req.version),
            applied: Applied::Created,
            pinned: None,
        },
        (state, _) => rl_core::pin::open(
            state.map(|s| s.bucket()).as_ref(),
            req.limit,
            req.version,
            now,
        ),
    }
}

impl OpenBucket<'_> {
    /// Whether a decision that granted `tokens` (0: denied) is written: a grant (but an
    /// exempt one, which debits nothing), or a state that must be stored anyway.
    pub fn writes(&self, tokens: u64) -> bool {
        (tokens > 0 && self.level.gate() != Gate::Exempt) || self.store_even_if_denied
    }

    /// Whether the effect must carry the stored limit rather than the caller's strings.
    fn stored_limit(&self) -> bool {
        self.decided_by == Applied::Stale || self.pinned.is_some()
    }

    /// Stores the level's bucket and sends its effect, for a command whose key is argument
    /// `i` with `rate cap` after it: the caller's own strings go into the effect (nothing to
    /// format), unless the call was decided under the stored limit. A script hash being
    /// adopted is replaced first. Once per call.
    pub fn store(&mut self, ctx: Ctx, key: &BucketKey, args: &Args, i: usize) -> Result<()> {
        // Everything fallible first: nothing may fail once the key is changed.
        let (name, rate, cap) = (args.raw(i)?, args.raw(i + 1)?, args.raw(i + 2)?);
        if self.replaces_script {
            adopt::replace(ctx, key, name);
        }
        let bucket = self.level.bucket_with_pin(self.pin);
        // Under a pin the effect would carry the pinned limit and the pin as text: when
        // only the fill instant (and the hold) moved, it says just that.
        let moved_only = self.pinned.is_some()
            && self
                .stored
                .as_ref()
                .is_some_and(|s| s.bucket().moved(bucket.full_at(), bucket.keep_until()) == bucket);
        key.store(self.stored.take(), &bucket);
        if moved_only {
            effect::moved(ctx, name, &bucket);
            return Ok(());
        }
        if self.stored_limit() {
            // The stored (or pinned) limit, not the caller's.
            effect::with_stored_limit(name, &bucket, |e| effect::bucket(ctx, e));
            return Ok(());
        }
        let e = BucketEffect::new(name, &bucket, EffectArg::Str(rate), EffectArg::Str(cap));
        effect::bucket(ctx, &e);
        Ok(())
    }
}

/// What a lease call changes besides the level: the lease table and what the plan did.
pub struct LeaseWrite<'p> {
    pub plan: &'p rl_core::LeasePlan,
    pub request: &'p rl_core::LeaseRequest,
}

/// The store and effect steps of a call that changes the lease table too (`RL.LEASE`): the
/// plan is carried out on the table taken out of the bucket, both are stored, and the
/// effect carries the lease changes. Returns the lease opened, if any.
pub fn store_with_leases(
    ctx: Ctx,
    key: &BucketKey,
    args: &Args,
    bucket: OpenBucket,
    lease: LeaseWrite,
    now: Nanos,
) -> Result<Option<Lease>> {
    store_with_table(ctx, key, args, 0, bucket, now, |table| {
        let outcome = table.carry_out(lease.plan, lease.request, now);
        stats::LEASES_EXPIRED.add_shared(outcome.pruned as u64);
        let returned = lease.plan.returned;
        if returned.is_some() {
            stats::RETURNS.add(1);
            stats::TOKENS_RETURNED.add(lease.plan.credited);
        }
        (returned, outcome.opened)
    })
}

/// The store and effect steps of a call that changes the lease table of the bucket whose
/// key is argument `i` (`rate cap` after it): `change` works on the table taken out of the
/// bucket and says which lease it closed and which it opened; both are stored, and the
/// effect carries those changes. Returns the lease opened, if any. Nothing here fails once
/// the key is changed.
pub fn store_with_table(
    ctx: Ctx,
    key: &BucketKey,
    args: &Args,
    i: usize,
    mut bucket: OpenBucket,
    now: Nanos,
    change: impl FnOnce(&mut LeaseTable) -> (Option<u64>, Option<Lease>),
) -> Result<Option<Lease>> {
    let (name, rate, cap) = (args.raw(i)?, args.raw(i + 1)?, args.raw(i + 2)?);
    if bucket.replaces_script {
        adopt::replace(ctx, key, name);
    }
    let mut table: LeaseTable = key.detach_leases(&mut bucket.stored);
    let (returned, opened) = change(&mut table);
    let level_bucket = bucket.level.bucket_with_pin(bucket.pin);
    let stored_limit = bucket.stored_limit();
    key.store_with_leases(bucket.stored, level_bucket, table);
    if stored_limit {
        // Decided under the stored limit: the effect carries it, not the caller's.
        effect::with_stored_limit(name, &level_bucket, |e| {
            effect::leases(ctx, e, now, returned, opened.as_ref())
        });
    } else {
        let e = BucketEffect::new(
            name,
            &level_bucket,
            EffectArg::Str(rate),
            EffectArg::Str(cap),
        );
        effect::leases(ctx, &e, now, returned, opened.as_ref());
    }
    Ok(opened)
}

/// Counts a decided bucket by which limit decided it (`rl_limit_replaced`,
/// `rl_limit_stale`, `rl_limit_conflicts`).
#[inline]
pub fn count_limit_source(applied: Applied) {
    match applied {
        Applied::Replaced => stats::LIMIT_REPLACED.add(1),
        Applied::Stale => stats::LIMIT_STALE.add(1),
        Applied::Conflict => stats::LIMIT_CONFLICTS.add(1),
        Applied::Pinned => stats::PINNED_DECISIONS.add(1),
        Applied::Created | Applied::Same => {}
    }
}

/// The count step of a single-key decision that granted `tokens` (0: denied) on `key` in
/// namespace `ns`: the command's counters, the namespace's, and a denial (shadow or not)
/// in the most-denied keys. Returns whether the client is answered as granted.
#[inline]
pub fn count(
    counters: &CommandCounters,
    ns: Id,
    key: &[u8],
    now: Nanos,
    tokens: u64,
    shadow_option: bool,
) -> bool {
    let answered = count_outcome(counters, tokens, shadow_option);
    namespaces::record(ns, outcome_of(tokens, answered));
    if tokens == 0 {
        top::denied(key, now);
    }
    answered
}

/// The command's own counters for a decision that granted `tokens` (0: denied); returns
/// whether the client is answered as granted.
#[inline]
pub fn count_outcome(counters: &CommandCounters, tokens: u64, shadow_option: bool) -> bool {
    let answered = answered(tokens > 0, shadow_option);
    match (tokens > 0, answered) {
        (true, _) => {
            counters.granted.add(1);
            if let Some(t) = counters.tokens {
                t.add(tokens);
            }
        }
        (false, true) => stats::SHADOW_DENIED.add(1),
        (false, false) => counters.denied.add(1),
    }
    answered
}

/// What a call answers: granted if the bucket granted, or if the denial is only recorded
/// (`rl.mode shadow`, or the call's own `SHADOW` option).
#[inline]
pub fn answered(granted: bool, shadow_option: bool) -> bool {
    granted || shadow_option || crate::config::shadow()
}

/// The outcome a namespace counts for a call that granted `tokens` (0: denied) and was
/// `answered` as granted.
pub fn outcome_of(tokens: u64, answered: bool) -> Outcome {
    match (tokens, answered) {
        (0, true) => Outcome::ShadowDenied,
        (0, false) => Outcome::Denied,
        (t, _) => Outcome::Granted(t),
    }
}
