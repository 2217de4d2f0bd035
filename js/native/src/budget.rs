//! Token budgets (`TokenBudget` in the TS shell): the client core's [`TokenBudget`] under
//! Node. The shell sends the commands it is handed, waits, and hands the replies back; what
//! a reservation gets, from Redis or from the failure policy, is decided in the core.

use std::collections::BTreeMap;

use napi::{Env, JsTypedArray, JsUnknown};
use napi_derive::napi;

use rl_client_core::budget::{Backend, Settled};
use rl_client_core::token_budget::{
    FailurePolicy, Grant as CoreGrant, SettleStep, Source, Ticket, TokenBudget,
};

use crate::backend;
use crate::guard::{count, guarded, invalid, nanos, protocol};
use crate::patch::LastCommands;
use crate::reply::to_reply;
use crate::typed::{f64s, u32s, Elements};

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

/// How many numbers a grant writes before each limit's remaining tokens: granted (0 or 1),
/// retry_after_ms, denied_by (the limit's index, -1 none), source (0 server, 1 fallback),
/// the count of remaining values that follow (-1: not known).
pub const GRANT_HEAD: usize = 5;

/// Where a settle's kind is written (`out[0]`): nothing to do, send the arguments returned,
/// or done locally (each limit's result in `out[1..]`).
const SETTLE_NOTHING: f64 = 0.0;
const SETTLE_SEND: f64 = 1.0;
const SETTLE_DONE: f64 = 2.0;

/// Each limit's result, NaN for none (nothing there to settle), into `out`.
fn write_settled(results: &[Settled], out: &mut [f64]) -> napi::Result<()> {
    if out.len() < results.len() {
        return Err(invalid("a Float64Array of one number per limit expected"));
    }
    for (slot, r) in out.iter_mut().zip(results) {
        *slot = r.signed().map_or(f64::NAN, |x| x as f64);
    }
    Ok(())
}

fn write_grant(g: &CoreGrant, out: &mut [f64]) -> napi::Result<()> {
    let remaining = g.remaining.as_deref().unwrap_or_default();
    if out.len() < GRANT_HEAD + remaining.len() {
        return Err(invalid(format!(
            "a Float64Array of {GRANT_HEAD} + one number per limit expected"
        )));
    }
    out[0] = f64::from(u8::from(g.granted));
    out[1] = g.retry_after_ms as f64;
    out[2] = g.denied_by.map_or(-1.0, |i| i as f64);
    out[3] = match g.source {
        Source::Server => 0.0,
        Source::Fallback => 1.0,
    };
    out[4] = g.remaining.as_ref().map_or(-1.0, |r| r.len() as f64);
    out[GRANT_HEAD..GRANT_HEAD + remaining.len()].copy_from_slice(remaining);
    Ok(())
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

/// One budget's decisions. The tickets of open reservations are kept here, by a number the
/// shell holds: a JS object per grant (a napi class instance) cost Node more than the rest
/// of the call. The shell forgets a ticket when its reservation is collected, and a settle
/// removes it (a settled ticket has nothing left to close).
#[napi]
pub struct BudgetCore {
    inner: TokenBudget,
    /// By number, which only grows (so a forget of a settled ticket frees nothing else):
    /// each insert is at the end.
    tickets: BTreeMap<u64, Ticket>,
    next_ticket: u64,
    commands: LastCommands<2>,
    settles: LastCommands<2>,
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
                .map(|inner| BudgetCore {
                    inner,
                    tickets: BTreeMap::new(),
                    next_ticket: 1,
                    commands: LastCommands::default(),
                    settles: LastCommands::default(),
                })
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

    /// Each limit's cost into `out` (one number per limit): `tokens` for a budget of one
    /// token limit, or `amounts[i]` tokens on the limit `names[i]`.
    #[napi]
    pub fn costs(
        &self,
        tokens: Option<f64>,
        names: Vec<String>,
        #[napi(ts_arg_type = "Float64Array")] amounts: JsTypedArray,
        #[napi(ts_arg_type = "Float64Array")] out: JsTypedArray,
    ) -> napi::Result<()> {
        guarded(|| {
            let (mut amounts, mut out) = (f64s(amounts)?, f64s(out)?);
            let (amounts, out) = (amounts.f64s(), out.f64s());
            let tokens = tokens.map(|t| count("tokens", t)).transpose()?;
            if names.len() != amounts.len() {
                return Err(invalid("one amount per limit name expected"));
            }
            let named: Vec<(&str, u64)> = names
                .iter()
                .zip(amounts.iter())
                .map(|(name, &n)| Ok((name.as_str(), count(name, n)?)))
                .collect::<napi::Result<_>>()?;
            let costs = self.inner.costs(tokens, &named).map_err(invalid)?;
            if out.len() != costs.len() {
                return Err(invalid("a Float64Array of one number per limit expected"));
            }
            for (slot, c) in out.iter_mut().zip(costs) {
                *slot = c as f64;
            }
            Ok(())
        })
    }

    /// The reservation's command, as a patch of the last one the shell holds (`have`): see
    /// `patch.rs` (`positions[0]` is `WHOLE` when the strings are the whole command).
    #[napi]
    pub fn reserve_command(
        &mut self,
        backend_name: String,
        #[napi(ts_arg_type = "Float64Array")] costs: JsTypedArray,
        have: bool,
        #[napi(ts_arg_type = "Uint32Array")] positions: JsTypedArray,
    ) -> napi::Result<Vec<String>> {
        guarded(|| {
            let costs = self.check(f64s(costs)?.f64s())?;
            let b = backend(&backend_name)?;
            let args = self.inner.reserve_command(b, &costs);
            self.commands
                .patch(slot(b), args, have, u32s(positions)?.u32s())
        })
    }

    /// The decision Redis's reply makes, into `out` (see `GRANT_HEAD`); its ticket (0: none
    /// to settle). An `Error` (unexpected reply) if the reply is malformed.
    #[napi]
    pub fn reserved(
        &mut self,
        env: Env,
        #[napi(ts_arg_type = "Float64Array")] costs: JsTypedArray,
        reply: JsUnknown,
        #[napi(ts_arg_type = "Float64Array")] out: JsTypedArray,
    ) -> napi::Result<f64> {
        guarded(|| {
            let costs = self.check(f64s(costs)?.f64s())?;
            let mut out = self.grant_out(out)?;
            let reply = to_reply(&env, reply).map_err(protocol)?;
            let g = self.inner.reserved(&costs, &reply).map_err(protocol)?;
            write_grant(&g, out.f64s())?;
            Ok(self.keep(g.ticket))
        })
    }

    /// The failure policy's decision while Redis does not answer, at `now_ms`
    /// (`performance.now()`), into `out`; its ticket (0: none).
    #[napi]
    pub fn outage(
        &mut self,
        #[napi(ts_arg_type = "Float64Array")] costs: JsTypedArray,
        now_ms: f64,
        #[napi(ts_arg_type = "Float64Array")] out: JsTypedArray,
    ) -> napi::Result<f64> {
        guarded(|| {
            let costs = self.check(f64s(costs)?.f64s())?;
            let mut out = self.grant_out(out)?;
            let g = self.inner.outage(&costs, nanos(now_ms)?);
            write_grant(&g, out.f64s())?;
            Ok(self.keep(g.ticket))
        })
    }

    /// Whether the ticket still has something to close.
    #[napi]
    pub fn open(&self, ticket: f64) -> bool {
        match self.tickets.get(&(ticket as u64)) {
            None | Some(Ticket::Nothing) => false,
            Some(Ticket::Server(r)) => r.open(),
            Some(Ticket::Local { settled, .. }) => !settled,
        }
    }

    /// Drops a ticket whose reservation the shell no longer holds (it expires in Redis as
    /// charged); an unknown one is ignored.
    #[napi]
    pub fn forget(&mut self, ticket: f64) {
        self.tickets.remove(&(ticket as u64));
    }

    /// What settling the ticket with each limit's actual use (NaN: its estimate) does:
    /// `out[0]` says (nothing, send the arguments returned as a patch of the last settle
    /// the shell holds (`have`; see `patch.rs`), or done: each limit's result in
    /// `out[1..]`, NaN for none).
    #[napi]
    // A call from JS takes its arguments flat (an object of them would cost a property
    // read each).
    #[allow(clippy::too_many_arguments)]
    pub fn settle(
        &mut self,
        backend_name: String,
        ticket: f64,
        #[napi(ts_arg_type = "Float64Array")] actual: JsTypedArray,
        now_ms: f64,
        #[napi(ts_arg_type = "Float64Array")] out: JsTypedArray,
        have: bool,
        #[napi(ts_arg_type = "Uint32Array")] positions: JsTypedArray,
    ) -> napi::Result<Option<Vec<String>>> {
        guarded(|| {
            let b = backend(&backend_name)?;
            let actual: Vec<Option<u64>> = f64s(actual)?
                .f64s()
                .iter()
                .map(|&a| (!a.is_nan()).then(|| count("actual", a)).transpose())
                .collect::<napi::Result<_>>()?;
            let now = nanos(now_ms)?;
            let mut out = f64s(out)?;
            let out = out.f64s();
            let mut positions = u32s(positions)?;
            if out.len() < 1 + self.inner.limits().len() || positions.u32s().is_empty() {
                return Err(invalid(
                    "a Float64Array of 1 + one number per limit, and a Uint32Array, expected",
                ));
            }
            let Some(mut t) = self.tickets.remove(&(ticket as u64)) else {
                out[0] = SETTLE_NOTHING;
                return Ok(None);
            };
            Ok(match self.inner.settle(b, &mut t, &actual, now) {
                SettleStep::Send(a) => {
                    out[0] = SETTLE_SEND;
                    Some(self.settles.patch(slot(b), a, have, positions.u32s())?)
                }
                SettleStep::Done(r) => {
                    out[0] = SETTLE_DONE;
                    write_settled(&r, &mut out[1..])?;
                    None
                }
                SettleStep::Nothing => {
                    out[0] = SETTLE_NOTHING;
                    None
                }
            })
        })
    }

    /// Each limit's result from Redis's reply to a settle, into `out`: tokens back
    /// (positive), charged (negative), or NaN (nothing there to settle); their count.
    #[napi]
    pub fn settled(
        &mut self,
        env: Env,
        reply: JsUnknown,
        #[napi(ts_arg_type = "Float64Array")] out: JsTypedArray,
    ) -> napi::Result<u32> {
        guarded(|| {
            let mut out = f64s(out)?;
            let reply = to_reply(&env, reply).map_err(protocol)?;
            let r = self.inner.settled(&reply).map_err(protocol)?;
            write_settled(&r, out.f64s())?;
            Ok(r.len() as u32)
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

/// The patch slot of a backend's commands.
fn slot(b: Backend) -> usize {
    match b {
        Backend::Module => 0,
        Backend::Functions => 1,
    }
}

impl BudgetCore {
    /// The array a grant is written into, checked before anything is decided (a bad call
    /// changes nothing).
    fn grant_out(&self, out: JsTypedArray) -> napi::Result<Elements> {
        let mut out = f64s(out)?;
        if out.f64s().len() < GRANT_HEAD + self.inner.limits().len() {
            return Err(invalid(format!(
                "a Float64Array of {GRANT_HEAD} + one number per limit expected"
            )));
        }
        Ok(out)
    }

    /// Keeps a ticket that has something to settle; its number (0: nothing to keep).
    fn keep(&mut self, ticket: Ticket) -> f64 {
        if matches!(ticket, Ticket::Nothing) {
            return 0.0;
        }
        let id = self.next_ticket;
        self.next_ticket += 1;
        self.tickets.insert(id, ticket);
        id as f64
    }

    /// Costs made by `costs()`: one per limit (anything else is a bug of the shell).
    fn check(&self, costs: &[f64]) -> napi::Result<Vec<u64>> {
        let costs: Vec<u64> = costs
            .iter()
            .map(|&x| count("cost", x))
            .collect::<napi::Result<_>>()?;
        if costs.len() != self.inner.limits().len() || costs.contains(&0) {
            return Err(invalid(
                "redis-rl internal error (please report it): costs not made by BudgetCore.costs",
            ));
        }
        Ok(costs)
    }
}
