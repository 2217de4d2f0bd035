//! Token budgets (`TokenBudget` in the TS shell): the client core's [`TokenBudget`] under
//! Node. The shell sends the commands it is handed, waits, and hands the replies back; what
//! a reservation gets, from Redis or from the failure policy, is decided in the core.

use napi::{Env, JsUnknown};
use napi_derive::napi;

use rl_client_core::budget::Settled;
use rl_client_core::token_budget::{
    FailurePolicy, Grant as CoreGrant, SettleStep, Ticket, TokenBudget,
};

use crate::guard::{count, guarded, invalid, nanos, protocol};
use crate::reply::to_reply;
use crate::take::source;
use crate::{backend, strings};

/// One limit of a budget.
#[napi(object)]
pub struct BudgetLimitSpec {
    pub name: String,
    /// Tokens per second.
    pub rate: f64,
    /// The burst.
    pub cap: f64,
}

/// One limit of a budget as the core made it: its bucket's key too.
#[napi(object)]
pub struct BudgetLimitInfo {
    pub name: String,
    pub key: String,
    pub rate: f64,
    pub cap: f64,
}

/// A cost by limit name.
#[napi(object)]
pub struct NamedCost {
    pub name: String,
    pub tokens: f64,
}

/// One reservation's decision, and what settles it (opaque to JS).
#[napi]
pub struct Grant {
    /// Whether every limit was reserved.
    #[napi(readonly)]
    pub granted: bool,
    #[napi(readonly)]
    pub retry_after_ms: f64,
    /// The index of the limit that refused, when denied.
    #[napi(readonly)]
    pub denied_by: Option<u32>,
    /// Each limit's tokens after the call, where known.
    #[napi(readonly)]
    pub remaining: Option<Vec<f64>>,
    /// `"server"` or `"fallback"`.
    #[napi(readonly)]
    pub source: String,
    ticket: Ticket,
}

#[napi]
impl Grant {
    /// Whether a settle still has something to close.
    #[napi]
    pub fn open(&self) -> bool {
        match &self.ticket {
            Ticket::Nothing => false,
            Ticket::Server(r) => r.open(),
            Ticket::Local { settled, .. } => !settled,
        }
    }
}

fn grant(g: CoreGrant) -> Grant {
    Grant {
        granted: g.granted,
        retry_after_ms: g.retry_after_ms as f64,
        denied_by: g.denied_by.map(|i| i as u32),
        remaining: g.remaining,
        source: source(g.source),
        ticket: g.ticket,
    }
}

/// What a settle does: `send` these arguments and hand the reply to `settled`, `done`
/// (settled locally: each limit's tokens back, positive, or charged, negative), or
/// `nothing`.
#[napi(object)]
pub struct SettleStepJs {
    pub kind: String,
    pub args: Option<Vec<String>>,
    pub results: Option<Vec<Option<f64>>>,
}

fn signed(results: &[Settled]) -> Vec<Option<f64>> {
    results
        .iter()
        .map(|r| r.signed().map(|x| x as f64))
        .collect()
}

/// A budget's counters.
#[napi(object)]
pub struct BudgetCountersJs {
    pub granted: f64,
    pub denied: f64,
    pub reserved_tokens: f64,
    pub settled: f64,
    pub refunded_tokens: f64,
    pub overage_tokens: f64,
    pub unmatched: f64,
    pub fallback_granted: f64,
    pub fallback_denied: f64,
    pub outages: f64,
    pub settles_lost: f64,
}

/// One budget's decisions.
#[napi]
pub struct BudgetCore {
    inner: TokenBudget,
}

fn counts(what: &str, xs: &[f64]) -> napi::Result<Vec<u64>> {
    xs.iter().map(|&x| count(what, x)).collect()
}

#[napi]
impl BudgetCore {
    /// `policy`: `"allow"`, `"last_known"` or `"deny"`; `share`: 1 / instances (null: the
    /// core's default).
    #[napi(constructor)]
    pub fn new(
        key: String,
        limits: Vec<BudgetLimitSpec>,
        ttl_ms: f64,
        policy: String,
        share: Option<f64>,
    ) -> napi::Result<BudgetCore> {
        guarded(|| {
            let policy = match policy.as_str() {
                "allow" => FailurePolicy::Allow,
                "last_known" => FailurePolicy::LastKnown,
                "deny" => FailurePolicy::Deny,
                other => {
                    return Err(invalid(format!(
                        "failure policy {other:?}: 'allow', 'last_known' or 'deny'"
                    )))
                }
            };
            let limits: Vec<(&str, f64, f64)> = limits
                .iter()
                .map(|l| (l.name.as_str(), l.rate, l.cap))
                .collect();
            TokenBudget::new(&key, &limits, count("ttlMs", ttl_ms)?, policy, share)
                .map(|inner| BudgetCore { inner })
                .map_err(invalid)
        })
    }

    #[napi]
    pub fn limits(&self) -> Vec<BudgetLimitInfo> {
        self.inner
            .limits()
            .iter()
            .map(|l| BudgetLimitInfo {
                name: l.name.clone(),
                key: String::from_utf8_lossy(&l.key).into_owned(),
                rate: l.limit.rate(),
                cap: l.limit.cap(),
            })
            .collect()
    }

    /// Each limit's cost: `tokens` for a budget of one token limit, or `named` costs.
    #[napi]
    pub fn costs(&self, tokens: Option<f64>, named: Vec<NamedCost>) -> napi::Result<Vec<f64>> {
        guarded(|| {
            let tokens = tokens.map(|t| count("tokens", t)).transpose()?;
            let named: Vec<(&str, u64)> = named
                .iter()
                .map(|c| Ok((c.name.as_str(), count(&c.name, c.tokens)?)))
                .collect::<napi::Result<_>>()?;
            self.inner
                .costs(tokens, &named)
                .map(|c| c.into_iter().map(|x| x as f64).collect())
                .map_err(invalid)
        })
    }

    #[napi]
    pub fn reserve_command(
        &self,
        backend_name: String,
        costs: Vec<f64>,
    ) -> napi::Result<Vec<String>> {
        guarded(|| {
            let costs = self.check(&costs)?;
            Ok(strings(
                self.inner.reserve_command(backend(&backend_name)?, &costs),
            ))
        })
    }

    /// The decision Redis's reply makes; an `Error` (unexpected reply) if it is malformed.
    #[napi]
    pub fn reserved(&mut self, env: Env, costs: Vec<f64>, reply: JsUnknown) -> napi::Result<Grant> {
        guarded(|| {
            let costs = self.check(&costs)?;
            let reply = to_reply(&env, reply).map_err(protocol)?;
            self.inner
                .reserved(&costs, &reply)
                .map(grant)
                .map_err(protocol)
        })
    }

    /// The failure policy's decision while Redis does not answer, at `now_ms`
    /// (`performance.now()`).
    #[napi]
    pub fn outage(&mut self, costs: Vec<f64>, now_ms: f64) -> napi::Result<Grant> {
        guarded(|| {
            let costs = self.check(&costs)?;
            Ok(grant(self.inner.outage(&costs, nanos(now_ms)?)))
        })
    }

    /// What settling `grant` with each limit's actual use (null: its estimate) does.
    #[napi]
    pub fn settle(
        &mut self,
        backend_name: String,
        grant: &mut Grant,
        actual: Vec<Option<f64>>,
        now_ms: f64,
    ) -> napi::Result<SettleStepJs> {
        guarded(|| {
            let b = backend(&backend_name)?;
            let actual: Vec<Option<u64>> = actual
                .iter()
                .map(|a| a.map(|x| count("actual", x)).transpose())
                .collect::<napi::Result<_>>()?;
            let now = nanos(now_ms)?;
            Ok(
                match self.inner.settle(b, &mut grant.ticket, &actual, now) {
                    SettleStep::Send(a) => SettleStepJs {
                        kind: "send".into(),
                        args: Some(strings(a)),
                        results: None,
                    },
                    SettleStep::Done(r) => SettleStepJs {
                        kind: "done".into(),
                        args: None,
                        results: Some(signed(&r)),
                    },
                    SettleStep::Nothing => SettleStepJs {
                        kind: "nothing".into(),
                        args: None,
                        results: None,
                    },
                },
            )
        })
    }

    /// Each limit's result from Redis's reply to a settle: tokens back (positive), charged
    /// (negative), or null (nothing there to settle).
    #[napi]
    pub fn settled(&mut self, env: Env, reply: JsUnknown) -> napi::Result<Vec<Option<f64>>> {
        guarded(|| {
            let reply = to_reply(&env, reply).map_err(protocol)?;
            self.inner
                .settled(&reply)
                .map(|r| signed(&r))
                .map_err(protocol)
        })
    }

    #[napi]
    pub fn settle_lost(&mut self) {
        self.inner.settle_lost()
    }

    #[napi]
    pub fn counters(&self) -> BudgetCountersJs {
        let c = self.inner.counters();
        BudgetCountersJs {
            granted: c.budget.granted as f64,
            denied: c.budget.denied as f64,
            reserved_tokens: c.budget.reserved_tokens as f64,
            settled: c.budget.settled as f64,
            refunded_tokens: c.budget.tokens_back as f64,
            overage_tokens: c.budget.tokens_overage as f64,
            unmatched: c.budget.unmatched as f64,
            fallback_granted: c.fallback_granted as f64,
            fallback_denied: c.fallback_denied as f64,
            outages: c.outages as f64,
            settles_lost: c.settles_lost as f64,
        }
    }
}

impl BudgetCore {
    /// Costs made by `costs()`: one per limit (anything else is a bug of the shell).
    fn check(&self, costs: &[f64]) -> napi::Result<Vec<u64>> {
        let costs = counts("cost", costs)?;
        if costs.len() != self.inner.limits().len() || costs.contains(&0) {
            return Err(invalid(
                "redis-rl internal error (please report it): costs not made by BudgetCore.costs",
            ));
        }
        Ok(costs)
    }
}
