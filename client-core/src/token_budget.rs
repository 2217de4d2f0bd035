//! A token budget's decisions, for every shell's `TokenBudget`: which buckets a budget has,
//! what one reservation costs on each, what a reply or an outage decides, and what a settle
//! sends. The commands and replies themselves are [`crate::budget`]'s.
//!
//! A budget is one or more named limits on one key (`tokens`, or `input` and `output` as
//! providers count them, plus `requests` when the provider limits requests too), each its
//! own bucket `{key}:<name>` in one hash slot, reserved all or nothing in one `RL.BUDGET`.
//!
//! While Redis cannot answer, the failure policy decides with local buckets run by the
//! server's own arithmetic (rl-core's [`Level`]: the same reserve, credit and bounded debt),
//! at `share` of each limit (one instance's part of the fleet's quota):
//! - `Allow`: the local buckets start full;
//! - `LastKnown`: they start at `share` of the level Redis last reported for the limit
//!   (full if it never reported one);
//! - `Deny`: every reservation is refused until Redis answers.
//!
//! A grant made locally settles locally (nothing is sent: Redis never saw it). Time is
//! passed in (nanoseconds on any monotonic clock the shell keeps).

use rl_core::{Bucket, Level, Limit, Nanos};

use crate::budget::{
    budget_command, parse_budget, parse_settle, settle_command, Backend, BudgetCounters, Part,
    Reservation, Settled,
};
use crate::reply::{ProtocolError, Reply};

/// The name of the limit every reservation costs 1 on (a provider's requests per minute).
pub const REQUESTS: &str = "requests";

/// What a budget decides while Redis cannot answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailurePolicy {
    Allow,
    LastKnown,
    Deny,
}

/// One named limit of a budget and its bucket.
#[derive(Debug, Clone, PartialEq)]
pub struct BudgetLimit {
    pub name: String,
    pub key: Vec<u8>,
    pub limit: Limit,
}

/// The bucket of limit `name` on `key`: `{key}:name`, or `key:name` if `key` has a hash tag
/// already (so every limit of a budget shares the key's slot).
pub fn bucket_key(key: &str, name: &str) -> String {
    let tagged = key
        .find('{')
        .is_some_and(|open| key[open + 1..].find('}').is_some_and(|close| close > 0));
    if tagged {
        format!("{key}:{name}")
    } else {
        format!("{{{key}}}:{name}")
    }
}

/// Who decided a reservation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Server,
    /// The failure policy, because Redis did not answer.
    Fallback,
}

/// What settles a grant: the server's reservation, or the local buckets' costs.
#[derive(Debug, Clone, PartialEq)]
pub enum Ticket {
    /// Nothing to settle: denied, or a grant that recorded nothing (exempt, shadow).
    Nothing,
    Server(Reservation),
    Local {
        costs: Vec<u64>,
        settled: bool,
    },
}

/// One reservation's decision.
#[derive(Debug, Clone, PartialEq)]
pub struct Grant {
    pub granted: bool,
    pub retry_after_ms: u64,
    /// The index of the limit that refused (the longest wait), when denied.
    pub denied_by: Option<usize>,
    /// Each limit's tokens after the call, where known.
    pub remaining: Option<Vec<f64>>,
    pub source: Source,
    pub ticket: Ticket,
}

/// What a settle does: send these arguments and hand the reply to
/// [`TokenBudget::settle_reply`], or nothing to send (settled locally, or already).
#[derive(Debug, Clone, PartialEq)]
pub enum SettleStep {
    Send(Vec<Vec<u8>>),
    /// Settled without Redis; each limit's result.
    Done(Vec<Settled>),
    /// Settled before, or nothing was recorded: nothing changes.
    Nothing,
}

/// A budget's counters: the server's replies ([`BudgetCounters`]) and the failure policy's.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    pub budget: BudgetCounters,
    /// Reservations decided by the failure policy, granted and denied.
    pub fallback_granted: u64,
    pub fallback_denied: u64,
    /// Calls that found Redis unreachable or slow (reservations and settles).
    pub outages: u64,
    /// Settles never confirmed (the reply was lost): the server may or may not have
    /// applied it; a retry would change nothing if it had.
    pub settles_lost: u64,
}

/// A token budget's state: its limits, its failure policy's local buckets, what Redis last
/// reported, and its counters. No I/O, no clock reads; not thread-safe by itself (each
/// shell holds it under its own lock, so a fork cannot inherit a lock held here).
#[derive(Debug, Clone)]
pub struct TokenBudget {
    limits: Vec<BudgetLimit>,
    ttl_ms: u64,
    policy: FailurePolicy,
    share: f64,
    /// The local buckets the failure policy spends from, made at the first outage and kept
    /// when Redis answers again, refilling as time passes: dropped, a Redis that flaps would
    /// hand each outage a full share again (a review measured five times the share in
    /// 20 ms); kept, what the policy lets out over any stretch of outages stays within
    /// `share * (cap + rate * t)`.
    local: Option<Vec<Bucket>>,
    /// Each limit's level as Redis last reported it.
    last_reported: Vec<Option<f64>>,
    counters: Counters,
}

/// How many instances a budget assumes share each limit when the shell is not told
/// (`instances`): the failure policy's local buckets are a quarter of each limit, so a
/// fleet of up to four stays within it through an outage (the Rust client's limiters'
/// default too).
pub const DEFAULT_INSTANCES: u32 = 4;

/// The longest a reservation may stay open before its lease expires on the server: a day.
pub const MAX_TTL_MS: u64 = 86_400_000;

impl TokenBudget {
    /// A budget of `limits` (name, rate per second, burst) on `key`; a reservation not settled
    /// within `ttl_ms` stays charged. `share`: this instance's part of each limit when the
    /// failure policy decides (`1 / instances`; `None`: `1 / DEFAULT_INSTANCES`).
    pub fn new(
        key: &str,
        limits: &[(&str, f64, f64)],
        ttl_ms: u64,
        policy: FailurePolicy,
        share: Option<f64>,
    ) -> Result<TokenBudget, String> {
        let share = share.unwrap_or(1.0 / f64::from(DEFAULT_INSTANCES));
        if key.is_empty() {
            return Err("key must not be empty".into());
        }
        if limits.is_empty() {
            return Err("a budget needs at least one limit".into());
        }
        if limits.len() > rl_core::budget::MAX_BUDGET_KEYS {
            return Err(format!(
                "a budget has at most {} limits",
                rl_core::budget::MAX_BUDGET_KEYS
            ));
        }
        if !(1..=MAX_TTL_MS).contains(&ttl_ms) {
            return Err(format!(
                "ttl_ms must be between 1 and {MAX_TTL_MS} (a day): how long a reservation may \
                 stay open before it stays charged"
            ));
        }
        if !(share > 0.0 && share <= 1.0) {
            return Err("share must be in (0, 1]: 1 / instances".into());
        }
        let mut out: Vec<BudgetLimit> = Vec::with_capacity(limits.len());
        for &(name, rate, cap) in limits {
            if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
                return Err(format!(
                    "limit name {name:?}: letters, digits and _ only (it names the bucket)"
                ));
            }
            if out.iter().any(|l| l.name == name) {
                return Err(format!("limit {name:?} is given twice"));
            }
            let limit = Limit::new(rate, cap)
                .map_err(|e| format!("limit {name:?} ({rate}/s, burst {cap}): {}", e.message()))?;
            out.push(BudgetLimit {
                name: name.to_owned(),
                key: bucket_key(key, name).into_bytes(),
                limit,
            });
        }
        Ok(TokenBudget {
            last_reported: vec![None; out.len()],
            limits: out,
            ttl_ms,
            policy,
            share,
            local: None,
            counters: Counters::default(),
        })
    }

    pub fn limits(&self) -> &[BudgetLimit] {
        &self.limits
    }

    pub fn counters(&self) -> Counters {
        self.counters
    }

    /// Each limit's cost for one reservation: `named` gives a cost by limit name; `tokens`
    /// is the cost of the budget's one token limit (every limit but `requests`), for a
    /// budget that has one. `requests`, when not named, costs 1.
    pub fn costs(&self, tokens: Option<u64>, named: &[(&str, u64)]) -> Result<Vec<u64>, String> {
        for (name, _) in named {
            if !self.limits.iter().any(|l| l.name == *name) {
                return Err(format!(
                    "this budget has no limit {name:?} (its limits: {})",
                    self.names()
                ));
            }
        }
        let token_limits = self.limits.iter().filter(|l| l.name != REQUESTS).count();
        if tokens.is_some() && token_limits != 1 {
            return Err(format!(
                "this budget has the limits {}: reserve each by name",
                self.names()
            ));
        }
        let mut costs = Vec::with_capacity(self.limits.len());
        for l in &self.limits {
            let given = named
                .iter()
                .rev()
                .find(|(n, _)| *n == l.name)
                .map(|(_, c)| *c);
            let cost = match given {
                Some(c) => c,
                None if l.name == REQUESTS => 1,
                None => tokens.ok_or_else(|| {
                    format!(
                        "limit {:?} needs a cost (its limits: {})",
                        l.name,
                        self.names()
                    )
                })?,
            };
            if cost == 0 {
                return Err(format!(
                    "limit {:?}: a cost must be at least 1 (every limit of a reservation is \
                     settled, so each reserves something)",
                    l.name
                ));
            }
            if cost as f64 > l.limit.cap() {
                return Err(format!(
                    "limit {:?}: a cost of {cost} is above its burst of {} and could never be \
                     reserved (raise the burst, or split the call)",
                    l.name,
                    l.limit.cap()
                ));
            }
            costs.push(cost);
        }
        Ok(costs)
    }

    fn names(&self) -> String {
        self.limits
            .iter()
            .map(|l| l.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    }

    fn parts<'a>(limits: &'a [BudgetLimit], costs: &[u64]) -> Vec<Part<'a>> {
        limits
            .iter()
            .zip(costs)
            .map(|(l, &n)| Part {
                key: &l.key,
                rate: l.limit.rate(),
                cap: l.limit.cap(),
                n,
            })
            .collect()
    }

    /// The command that reserves `costs` (from [`TokenBudget::costs`]), with each limit's
    /// level after the call (`WITHSTATE`: what `LastKnown` starts from).
    pub fn reserve_command(&self, backend: Backend, costs: &[u64]) -> Vec<Vec<u8>> {
        let mut args = budget_command(
            backend,
            self.ttl_ms,
            &Self::parts(&self.limits, costs),
            None,
        );
        args.push(b"WITHSTATE".to_vec());
        args
    }

    /// Decides a reservation from Redis's reply to [`TokenBudget::reserve_command`].
    pub fn reserved(&mut self, costs: &[u64], reply: &Reply) -> Result<Grant, ProtocolError> {
        let parts = Self::parts(&self.limits, costs);
        let r = parse_budget(reply, parts.len())?;
        let denied_by = match &r.denied_by {
            None => None,
            Some(k) => Some(
                self.limits
                    .iter()
                    .position(|l| &l.key == k)
                    .ok_or_else(|| {
                        ProtocolError(format!(
                            "RL.BUDGET denied_by: {:?} is none of the budget's keys",
                            String::from_utf8_lossy(k)
                        ))
                    })?,
            ),
        };
        let ticket = match Reservation::granted(&parts, &r) {
            Some(res) if res.open() => Ticket::Server(res),
            _ => Ticket::Nothing,
        };
        self.counters.budget.reserved(&parts, &r);
        if let Some(rem) = &r.remaining {
            for (last, &x) in self.last_reported.iter_mut().zip(rem) {
                *last = Some(x);
            }
        }
        Ok(Grant {
            granted: r.granted,
            retry_after_ms: r.retry_after_ms,
            denied_by,
            remaining: r.remaining,
            source: Source::Server,
            ticket,
        })
    }

    fn local_levels(&mut self, now: Nanos) -> Vec<Level> {
        let share = self.share;
        let limits: Vec<Limit> = self
            .limits
            .iter()
            .map(|l| Limit::from_stored_parts(l.limit.rate() * share, l.limit.cap() * share))
            .collect();
        let local = self.local.get_or_insert_with(|| {
            limits
                .iter()
                .zip(&self.last_reported)
                .map(|(limit, last)| {
                    let start = match (self.policy, last) {
                        (FailurePolicy::LastKnown, Some(x)) => x * share,
                        _ => limit.cap(),
                    };
                    Level::starting_with(*limit, start, now).bucket_with_pin(None)
                })
                .collect()
        });
        local
            .iter()
            .zip(&limits)
            .map(|(b, limit)| Level::new(Some(b), *limit, now))
            .collect()
    }

    fn store_local(&mut self, levels: &[Level]) {
        self.local = Some(levels.iter().map(|l| l.bucket_with_pin(None)).collect());
    }

    /// Decides a reservation Redis did not answer (unreachable, slower than the timeout),
    /// as the failure policy says, at `now`.
    pub fn outage(&mut self, costs: &[u64], now: Nanos) -> Grant {
        self.counters.outages += 1;
        if self.policy == FailurePolicy::Deny {
            self.counters.fallback_denied += 1;
            return Grant {
                granted: false,
                retry_after_ms: 1000,
                denied_by: None,
                remaining: None,
                source: Source::Fallback,
                ticket: Ticket::Nothing,
            };
        }
        let mut levels = self.local_levels(now);
        // A cost above a local bucket's cap (share < 1) can never be granted locally: it is
        // denied until Redis answers (granting it, or a part of it, would let out more than
        // the share).
        let ns = costs.to_vec();
        let outcome = rl_core::budget::reserve_all(&mut levels, &ns);
        let remaining = Some(levels.iter().map(Level::tokens).collect());
        if outcome.granted {
            self.store_local(&levels);
            self.counters.fallback_granted += 1;
            Grant {
                granted: true,
                retry_after_ms: 0,
                denied_by: None,
                remaining,
                source: Source::Fallback,
                ticket: Ticket::Local {
                    costs: ns,
                    settled: false,
                },
            }
        } else {
            self.counters.fallback_denied += 1;
            Grant {
                granted: false,
                retry_after_ms: if outcome.longest == u64::MAX {
                    1000
                } else {
                    outcome.longest.div_ceil(1_000_000).max(1)
                },
                denied_by: Some(outcome.worst),
                remaining,
                source: Source::Fallback,
                ticket: Ticket::Nothing,
            }
        }
    }

    /// What settling `ticket` with each limit's actual use does (`None`: the estimate, for a
    /// limit whose actual is not known). A local grant settles at once, at `now`.
    pub fn settle(
        &mut self,
        backend: Backend,
        ticket: &mut Ticket,
        actual: &[Option<u64>],
        now: Nanos,
    ) -> SettleStep {
        match ticket {
            Ticket::Nothing => SettleStep::Nothing,
            Ticket::Server(res) => match res.settlement(actual) {
                None => SettleStep::Nothing,
                Some(used) => {
                    let used: Vec<(&[u8], u64)> =
                        used.iter().map(|(k, a)| (k.as_slice(), *a)).collect();
                    SettleStep::Send(settle_command(backend, res.id, &used))
                }
            },
            Ticket::Local { costs, settled } => {
                if *settled {
                    return SettleStep::Nothing;
                }
                *settled = true;
                let costs = costs.clone();
                let mut levels = self.local_levels(now);
                let results: Vec<Settled> = levels
                    .iter_mut()
                    .zip(&costs)
                    .enumerate()
                    .map(|(i, (level, &reserved))| {
                        let used = actual.get(i).copied().flatten().unwrap_or(reserved);
                        match rl_core::budget::settle_level(level, reserved, used) {
                            t if t >= 0 => Settled::Credited(t as u64),
                            t => Settled::Charged(t.unsigned_abs()),
                        }
                    })
                    .collect();
                self.store_local(&levels);
                self.counters.budget.settled(&results);
                SettleStep::Done(results)
            }
        }
    }

    /// Reads Redis's reply to a settle [`TokenBudget::settle`] sent.
    pub fn settled(&mut self, reply: &Reply) -> Result<Vec<Settled>, ProtocolError> {
        let results = parse_settle(reply, self.limits.len())?;
        self.counters.budget.settled(&results);
        Ok(results)
    }

    /// A settle whose reply never came: whether it applied is unknown (a retry would find
    /// nothing if it had; the reservation expires charged if it had not).
    pub fn settle_lost(&mut self) {
        self.counters.outages += 1;
        self.counters.settles_lost += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const SEC: Nanos = 1_000_000_000;

    fn budget(policy: FailurePolicy, share: f64) -> TokenBudget {
        TokenBudget::new(
            "org:42",
            &[
                ("requests", 1.0, 10.0),
                ("input", 100.0, 1000.0),
                ("output", 10.0, 500.0),
            ],
            60_000,
            policy,
            Some(share),
        )
        .unwrap()
    }

    #[test]
    fn keys_share_the_keys_slot() {
        assert_eq!(bucket_key("org:42", "input"), "{org:42}:input");
        assert_eq!(bucket_key("{org}:gpt", "input"), "{org}:gpt:input");
        // `{}` is no tag: Redis hashes the whole key.
        assert_eq!(bucket_key("a{}b", "input"), "{a{}b}:input");
    }

    #[test]
    fn costs_by_name_requests_cost_one() {
        let b = budget(FailurePolicy::Allow, 1.0);
        assert_eq!(
            b.costs(None, &[("input", 30), ("output", 200)]).unwrap(),
            [1, 30, 200]
        );
        assert!(b.costs(Some(5), &[]).unwrap_err().contains("by name"));
        assert!(b
            .costs(None, &[("input", 30)])
            .unwrap_err()
            .contains("\"output\" needs a cost"));
        assert!(b
            .costs(None, &[("inptu", 3)])
            .unwrap_err()
            .contains("no limit \"inptu\""));
        assert!(b
            .costs(None, &[("input", 0), ("output", 1)])
            .unwrap_err()
            .contains("at least 1"));
        assert!(b
            .costs(None, &[("input", 1001), ("output", 1)])
            .unwrap_err()
            .contains("burst"));
        let one = TokenBudget::new(
            "k",
            &[("tokens", 10.0, 100.0)],
            1000,
            FailurePolicy::Deny,
            None,
        )
        .unwrap();
        assert_eq!(one.costs(Some(7), &[]).unwrap(), [7]);
    }

    #[test]
    fn bad_specs_are_refused_with_what_to_do() {
        let new = |limits: &[(&str, f64, f64)], ttl, share| {
            TokenBudget::new("k", limits, ttl, FailurePolicy::Allow, Some(share)).unwrap_err()
        };
        assert!(new(&[], 1, 1.0).contains("at least one"));
        assert!(new(&[("a", 1.0, 1.0), ("a", 1.0, 1.0)], 1, 1.0).contains("twice"));
        assert!(new(&[("a b", 1.0, 1.0)], 1, 1.0).contains("letters"));
        assert!(new(&[("a", 0.0, 1.0)], 1, 1.0).contains("\"a\""));
        assert!(new(&[("a", 1.0, 1.0)], 0, 1.0).contains("ttl_ms"));
        assert!(new(&[("a", 1.0, 1.0)], 1, 0.0).contains("share"));
    }

    #[test]
    fn deny_refuses_allow_spends_a_share_locally_and_settles_there() {
        let mut deny = budget(FailurePolicy::Deny, 1.0);
        let g = deny.outage(&[1, 10, 10], 0);
        assert!(!g.granted && g.ticket == Ticket::Nothing && g.source == Source::Fallback);

        // A quarter of each limit: 2.5 requests, 250 input, 125 output tokens.
        let mut b = budget(FailurePolicy::Allow, 0.25);
        let mut g = b.outage(&[1, 200, 100], 0);
        assert!(g.granted);
        let denied = b.outage(&[1, 200, 100], 0);
        assert!(!denied.granted);
        // Output waits longest: 75 tokens at 2.5/s (input: 150 at 25/s).
        assert_eq!(denied.denied_by, Some(2));
        // The first call used 20 input, 10 output: 180 and 90 come back.
        let step = b.settle(
            Backend::Module,
            &mut g.ticket,
            &[None, Some(20), Some(10)],
            0,
        );
        assert_eq!(
            step,
            SettleStep::Done(vec![
                Settled::Credited(0),
                Settled::Credited(180),
                Settled::Credited(90)
            ])
        );
        assert_eq!(
            b.settle(Backend::Module, &mut g.ticket, &[], 0),
            SettleStep::Nothing
        );
        assert!(b.outage(&[1, 200, 100], 0).granted);
        let c = b.counters();
        assert_eq!(
            (c.fallback_granted, c.fallback_denied, c.outages),
            (2, 1, 3)
        );
    }

    #[test]
    fn last_known_starts_from_what_redis_reported() {
        let mut b = budget(FailurePolicy::LastKnown, 0.5);
        let reply = Reply::Array(vec![
            Reply::Int(1),
            Reply::Int(5),
            Reply::Nil,
            Reply::Int(0),
            Reply::Array(vec![
                Reply::Double(9.0),
                Reply::Double(100.0),
                Reply::Double(40.0),
            ]),
        ]);
        let g = b.reserved(&[1, 1, 1], &reply).unwrap();
        assert!(matches!(g.ticket, Ticket::Server(_)));
        // Half of output's 40: 20 there, not the 250 a full local bucket would hold.
        assert!(!b.outage(&[1, 1, 21], 0).granted);
        assert!(b.outage(&[1, 1, 20], 0).granted);
        // A flap (Redis answering in between) does not refill it: the 20 are spent.
        b.reserved(&[1, 1, 1], &reply).unwrap();
        assert!(!b.outage(&[1, 1, 20], 0).granted, "kept across outages");
        // A cost above the local bucket's cap is denied, not granted in part.
        let mut small = budget(FailurePolicy::Allow, 0.25);
        let g = small.outage(&[1, 1, 126], 0);
        assert!(!g.granted && g.retry_after_ms == 1000 && g.denied_by == Some(2));
    }

    #[test]
    fn a_denial_names_its_limit_and_a_foreign_key_is_a_protocol_error() {
        let mut b = budget(FailurePolicy::Allow, 1.0);
        let denied = |key: &str| {
            Reply::Array(vec![
                Reply::Int(0),
                Reply::Int(0),
                Reply::Bulk(key.as_bytes().to_vec()),
                Reply::Int(1500),
            ])
        };
        let g = b.reserved(&[1, 1, 1], &denied("{org:42}:output")).unwrap();
        assert_eq!(
            (g.granted, g.denied_by, g.retry_after_ms),
            (false, Some(2), 1500)
        );
        assert!(b.reserved(&[1, 1, 1], &denied("elsewhere")).is_err());
    }

    proptest! {
        /// Whatever the order of outages, settles and actuals, the local buckets never let
        /// out more than `share * (cap + rate * elapsed)` plus the overages charged: the
        /// failure policy mints nothing.
        #[test]
        fn local_grants_stay_within_the_share(
            steps in proptest::collection::vec((0u64..3 * SEC, 1u64..300, 0u64..600, any::<bool>()), 1..60),
            share in 0.05f64..=1.0,
        ) {
            let mut b = TokenBudget::new("k", &[("tokens", 50.0, 400.0)], 1000, FailurePolicy::Allow, Some(share)).unwrap();
            let (mut now, mut out, mut over) = (0u64, 0f64, 0f64);
            let mut open: Vec<(Ticket, u64)> = Vec::new();
            for (dt, cost, actual, settle) in steps {
                now += dt;
                let g = b.outage(&[cost], now);
                if g.granted {
                    let Ticket::Local { costs, .. } = &g.ticket else { panic!("local") };
                    out += costs[0] as f64;
                    open.push((g.ticket.clone(), costs[0]));
                }
                if settle {
                    if let Some((mut t, reserved)) = open.pop() {
                        if let SettleStep::Done(r) = b.settle(Backend::Module, &mut t, &[Some(actual)], now) {
                            match r[0] {
                                Settled::Credited(x) => out -= x as f64,
                                Settled::Charged(x) => { out += x as f64; over += x as f64 }
                                Settled::Unmatched => {}
                            }
                            prop_assert!(actual >= reserved || matches!(r[0], Settled::Credited(_)));
                        }
                    }
                }
                let bound = share * (400.0 + 50.0 * now as f64 / SEC as f64) + over;
                prop_assert!(out <= bound + 1e-6, "{out} let out, bound {bound}");
            }
        }

        /// Any reply to a reservation or a settle is read or refused: never a panic.
        #[test]
        fn any_reply_is_read_or_refused(i in any::<i64>(), d in any::<f64>(), k in "[a-z{}:]{0,12}") {
            let mut b = budget(FailurePolicy::Allow, 1.0);
            for reply in [
                Reply::Array(vec![Reply::Int(i), Reply::Int(i), Reply::Bulk(k.clone().into_bytes()), Reply::Int(i)]),
                Reply::Array(vec![Reply::Int(1), Reply::Int(i), Reply::Nil, Reply::Int(0), Reply::Array(vec![Reply::Double(d); 3])]),
                Reply::Array(vec![Reply::Int(i); 3]),
                Reply::Simple(k.clone()),
            ] {
                let _ = b.reserved(&[1, 1, 1], &reply);
                let _ = b.settled(&reply);
            }
        }
    }
}
