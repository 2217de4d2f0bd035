//! [`TokenBudget`]: reserve a call's estimate on several limits at once (`RL.BUDGET`), settle
//! the actual (`RL.SETTLE`); docs/budgets.md. The tokio/redis-rs shell over the client
//! core's [`rl_client_core::token_budget`]: every decision (costs, replies, the failure
//! policy's local buckets, settles) is made there, as for the Python package's
//! `TokenBudget`; this file sends what it is handed, with a timeout.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use redis::Value;
use rl_client_core::budget::{Backend as CoreBackend, Settled};
use rl_client_core::token_budget::{self as core, SettleStep, Source as CoreSource, Ticket};
use rl_client_core::Reply;
use rl_core::Limit;

use crate::backend::Selector;
use crate::clock::mono_ns;
use crate::conn::{call, RedisConnection};
use crate::{Backend, Error, FailurePolicy, Metrics, Source};

/// Settings of a [`TokenBudget`].
#[derive(Debug, Clone, PartialEq)]
pub struct BudgetConfig {
    /// How long a reservation may stay open: one not settled by then stays charged (never
    /// minted back). Default 10 minutes.
    pub ttl: Duration,
    /// How long each Redis call may take before the failure policy decides. Default 200 ms.
    pub timeout: Duration,
    /// What decides while Redis is unavailable: `Allow` spends local buckets at
    /// `1 / instances` of each limit starting full, `LastKnown` starting from the levels
    /// Redis last reported, `Deny` refuses. Default `Allow`.
    pub policy: FailurePolicy,
    /// How many instances share each limit (the local buckets' share). Default 4
    /// ([`rl_client_core::token_budget::DEFAULT_INSTANCES`]).
    pub instances: u32,
    /// The server side. Default `Module`.
    pub backend: Backend,
}

impl Default for BudgetConfig {
    fn default() -> Self {
        BudgetConfig {
            ttl: Duration::from_secs(600),
            timeout: Duration::from_millis(200),
            policy: FailurePolicy::Allow,
            instances: core::DEFAULT_INSTANCES,
            backend: Backend::Module,
        }
    }
}

/// A shared token budget: one or more named limits on one key (`tokens`; or `input` and
/// `output`, and `requests`, as providers count them), each the bucket `{key}:<name>` in
/// one hash slot, reserved all or nothing.
///
/// ```no_run
/// # async fn demo(conn: redis::aio::ConnectionManager) -> Result<(), rl_client::Error> {
/// use rl_client::{limit, BudgetConfig, TokenBudget};
/// let budget = TokenBudget::new(
///     conn,
///     "openai:gpt-4o",
///     &[("tokens", limit(800_000.0 / 60.0, 800_000.0)?), ("requests", limit(5000.0 / 60.0, 5000.0)?)],
///     BudgetConfig::default(),
/// )?;
/// let mut res = budget.reserve(&[("tokens", 1200 + 4096)]).await?;
/// if res.granted {
///     // ... the call; usage says 1180 + 950 ...
///     budget.settle(&mut res, &[("tokens", 2130)]).await?;
/// }
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct TokenBudget<C> {
    inner: Arc<Inner<C>>,
}

impl<C> Clone for TokenBudget<C> {
    fn clone(&self) -> Self {
        TokenBudget {
            inner: Arc::clone(&self.inner),
        }
    }
}

#[derive(Debug)]
struct Inner<C> {
    conn: C,
    /// Held only while a decision is made, never across an await.
    core: Mutex<core::TokenBudget>,
    timeout: Duration,
    backend: Selector,
    metrics: Metrics,
}

/// One reservation: granted or not, and what settles it.
#[derive(Debug)]
pub struct BudgetReservation {
    /// Whether every limit was reserved.
    pub granted: bool,
    /// How long until a retry could be granted, when denied.
    pub retry_after: Duration,
    /// The limit that refused (its wait is the longest), when denied.
    pub denied_by: Option<String>,
    /// Each limit's tokens after the call, in the budget's order, where known.
    pub remaining: Option<Vec<f64>>,
    /// [`Source::Server`], or [`Source::Fallback`] when the failure policy decided.
    pub source: Source,
    /// What was reserved on each limit, in the budget's order.
    pub reserved: Vec<(String, u64)>,
    ticket: Ticket,
}

impl BudgetReservation {
    /// Whether a settle still has something to close.
    pub fn is_open(&self) -> bool {
        match &self.ticket {
            Ticket::Nothing => false,
            Ticket::Server(r) => r.open(),
            Ticket::Local { settled, .. } => !settled,
        }
    }
}

/// A Redis value as the client core reads replies.
pub(crate) fn to_reply(v: Value) -> Reply {
    match v {
        Value::Nil => Reply::Nil,
        Value::Int(i) => Reply::Int(i),
        Value::Double(d) => Reply::Double(d),
        Value::BulkString(b) => Reply::Bulk(b),
        Value::SimpleString(s) => Reply::Simple(s),
        Value::Okay => Reply::Simple("OK".into()),
        Value::Array(items) | Value::Set(items) => {
            Reply::Array(items.into_iter().map(to_reply).collect())
        }
        Value::Map(pairs) => Reply::Map(
            pairs
                .into_iter()
                .map(|(k, v)| (to_reply(k), to_reply(v)))
                .collect(),
        ),
        Value::ServerError(e) => Reply::Error(format!("{e:?}")),
        // Booleans, big numbers, verbatim strings, attributes, pushes: no budget reply
        // has them; the parser refuses them as an unexpected shape.
        other => Reply::Error(format!("unexpected value {other:?}")),
    }
}

fn cmd(args: &[Vec<u8>]) -> redis::Cmd {
    let mut c = redis::cmd(std::str::from_utf8(&args[0]).unwrap_or("RL.BUDGET"));
    for a in &args[1..] {
        c.arg(a.as_slice());
    }
    c
}

impl<C: RedisConnection> TokenBudget<C> {
    /// A budget of `limits` (each a name and its limit) on `key` over `conn`.
    pub fn new(
        conn: C,
        key: &str,
        limits: &[(&str, Limit)],
        config: BudgetConfig,
    ) -> Result<Self, Error> {
        if config.timeout.is_zero() {
            return Err(Error::Config("timeout must be positive"));
        }
        if config.instances == 0 {
            return Err(Error::Config("instances must be positive"));
        }
        let policy = match config.policy {
            FailurePolicy::Allow => core::FailurePolicy::Allow,
            FailurePolicy::LastKnown => core::FailurePolicy::LastKnown,
            FailurePolicy::Deny => core::FailurePolicy::Deny,
        };
        let specs: Vec<(&str, f64, f64)> = limits
            .iter()
            .map(|(n, l)| (*n, l.rate(), l.cap()))
            .collect();
        let ttl_ms = u64::try_from(config.ttl.as_millis()).unwrap_or(u64::MAX);
        let share = 1.0 / f64::from(config.instances);
        let budget = core::TokenBudget::new(key, &specs, ttl_ms, policy, Some(share))
            .map_err(Error::Budget)?;
        Ok(TokenBudget {
            inner: Arc::new(Inner {
                conn,
                core: Mutex::new(budget),
                timeout: config.timeout,
                backend: Selector::new(config.backend),
                metrics: Metrics::new(),
            }),
        })
    }

    fn core(&self) -> MutexGuard<'_, core::TokenBudget> {
        // A panic cannot happen while the lock is held (the core's calls do not panic), and
        // if one did the state is still whole: keep using it.
        self.inner.core.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The budget's counters (the core's: reservations, tokens reserved, given back,
    /// charged, the failure policy's).
    pub fn counters(&self) -> core::Counters {
        self.core().counters()
    }

    async fn backend(&self) -> Result<CoreBackend, Error> {
        Ok(
            match self
                .inner
                .backend
                .get(&self.inner.conn, self.inner.timeout)
                .await?
            {
                Backend::Functions => CoreBackend::Functions,
                _ => CoreBackend::Module,
            },
        )
    }

    /// Reserves each named cost (`requests`, if the budget has it and it is not named,
    /// costs 1) on every limit, or nothing on any. An outage is decided by the failure
    /// policy; an error reply is returned.
    pub async fn reserve(&self, costs: &[(&str, u64)]) -> Result<BudgetReservation, Error> {
        let costs = self.core().costs(None, costs).map_err(Error::Budget)?;
        let outcome = async {
            let backend = self.backend().await?;
            let args = self.core().reserve_command(backend, &costs);
            call(
                &self.inner.conn,
                &cmd(&args),
                self.inner.timeout,
                &self.inner.metrics,
            )
            .await
        }
        .await;
        let grant = match outcome {
            Ok(value) => self
                .core()
                .reserved(&costs, &to_reply(value))
                .map_err(|e| Error::Reply(e.0))?,
            Err(e) if e.is_outage() => self.core().outage(&costs, mono_ns()),
            Err(e) => return Err(e),
        };
        let names: Vec<String> = {
            let core = self.core();
            core.limits().iter().map(|l| l.name.clone()).collect()
        };
        Ok(BudgetReservation {
            granted: grant.granted,
            retry_after: Duration::from_millis(grant.retry_after_ms),
            denied_by: grant.denied_by.map(|i| names[i].clone()),
            remaining: grant.remaining,
            source: match grant.source {
                CoreSource::Server => Source::Server,
                CoreSource::Fallback => Source::Fallback,
            },
            reserved: names.iter().cloned().zip(costs).collect(),
            ticket: grant.ticket,
        })
    }

    /// Settles `res` with what the call used, by limit name (a limit not named: its
    /// estimate). Once: a second settle sends nothing and answers `None`. Answers each
    /// limit's tokens given back (positive), charged (negative), or `None` where the
    /// reservation had expired (its estimate stays charged). An outage leaves the estimate
    /// charged and answers `None` (counted in `settles_lost`).
    pub async fn settle(
        &self,
        res: &mut BudgetReservation,
        actual: &[(&str, u64)],
    ) -> Result<Option<Vec<Option<i64>>>, Error> {
        let used: Vec<Option<u64>> = {
            let core = self.core();
            for (name, _) in actual {
                if !core.limits().iter().any(|l| l.name == *name) {
                    return Err(Error::Budget(format!("this budget has no limit {name:?}")));
                }
            }
            core.limits()
                .iter()
                .map(|l| {
                    actual
                        .iter()
                        .rev()
                        .find(|(n, _)| *n == l.name)
                        .map(|(_, a)| *a)
                })
                .collect()
        };
        let backend = match res.ticket {
            Ticket::Server(_) => self.backend().await?,
            _ => CoreBackend::Module,
        };
        let step = self
            .core()
            .settle(backend, &mut res.ticket, &used, mono_ns());
        let args = match step {
            SettleStep::Nothing => return Ok(None),
            SettleStep::Done(r) => return Ok(Some(signed(&r))),
            SettleStep::Send(args) => args,
        };
        match call(
            &self.inner.conn,
            &cmd(&args),
            self.inner.timeout,
            &self.inner.metrics,
        )
        .await
        {
            Ok(value) => {
                let r = self
                    .core()
                    .settled(&to_reply(value))
                    .map_err(|e| Error::Reply(e.0))?;
                Ok(Some(signed(&r)))
            }
            Err(e) if e.is_outage() => {
                self.core().settle_lost();
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }
}

fn signed(results: &[Settled]) -> Vec<Option<i64>> {
    results.iter().map(|r| r.signed()).collect()
}
