//! A prefetching limiter's decisions (`PrefetchLimiter` in the TS shell): the client core's
//! prefetch [`Ledger`] (what is held, when to renew, what a lease call leaves, the waiting
//! line), its [`Health`] (whether Redis is believed down, who probes) and a [`TakeLimiter`]
//! for the failure policy's local decisions and the take counters. The shell sends the calls
//! it is handed, waits with its timers and hands replies and failures back.
//!
//! Node runs one call at a time: no lock here. Times are `performance.now()` milliseconds.

use napi::bindgen_prelude::Float64Array;
use napi::{Env, JsUnknown};
use napi_derive::napi;

use rl_client_core::health::Health;
use rl_client_core::lease::{parse_lease, LeaseTarget};
use rl_client_core::prefetch::{
    Begin, Failure, Judged, Landed, Lease, Ledger, LedgerConfig, LedgerCounters, Local,
};
use rl_client_core::take::{TakeLimiter, TakePolicy};
use rl_client_core::Reply;

use crate::guard::{count, guarded, invalid, nanos, protocol};
use crate::reply::to_reply;
use crate::{backend, strings};

/// How often one caller probes a Redis believed down (the Rust client's default).
const PROBE_INTERVAL_MS: f64 = 500.0;

/// A lease call the ledger hands out: `kind` is `send` (with `command`), `busy` (the call in
/// the air is `flight`) or `closed`.
#[napi(object)]
pub struct Began {
    pub kind: String,
    pub flight: f64,
    pub command: Option<Vec<String>>,
}

/// What a landed call left: `kind` `granted` (`value`: tokens held after), `denied`
/// (`value`: retry_after_ms), `stale` or `closed`; `give_back`: `[id, left]` pairs to return.
#[napi(object)]
pub struct Landing {
    pub kind: String,
    pub served: bool,
    pub value: f64,
    pub give_back: Vec<Vec<f64>>,
}

/// A take decided from what is held: `kind` `granted` (`value`: left), `denied` (`value`:
/// retry_after_ms) or `ask`.
#[napi(object)]
pub struct LocalTake {
    pub kind: String,
    pub value: f64,
    pub renew: bool,
}

/// A prefetching limiter's counters: the ledger's and the takes'.
#[napi(object)]
pub struct PrefetchCounters {
    pub leases: f64,
    pub lease_tokens: f64,
    pub leases_denied: f64,
    pub leases_expired: f64,
    pub leases_lost: f64,
    pub returns: f64,
    pub tokens_returned: f64,
    pub slow_calls: f64,
    pub memory_grants: f64,
    pub memory_tokens: f64,
    pub fallback_granted: f64,
    pub fallback_denied: f64,
    pub outages: f64,
    pub errors: f64,
}

fn pairs(leases: &[Lease]) -> Vec<Vec<f64>> {
    leases
        .iter()
        .map(|l| vec![l.id as f64, l.left as f64])
        .collect()
}

fn lease(id: f64, left: f64) -> napi::Result<Lease> {
    Ok(Lease {
        id: count("lease id", id)?,
        left: count("left", left)?,
        expires: 0,
    })
}

/// One prefetching limiter's state.
#[napi]
pub struct PrefetchCore {
    ledger: Ledger,
    health: Health,
    policy: TakeLimiter,
}

#[napi]
impl PrefetchCore {
    /// `timeout_ms`: the limiter's timeout (null: none); `policy`: `allow` or `deny`;
    /// `share`: 1 / instances (null: the core's default).
    #[napi(constructor)]
    #[allow(clippy::too_many_arguments)] // the limiter's settings, named
    pub fn new(
        key: String,
        rate: f64,
        cap: f64,
        batch: f64,
        ttl_ms: f64,
        renew_at: f64,
        jitter: f64,
        timeout_ms: Option<f64>,
        policy: String,
        share: Option<f64>,
        init: Option<f64>,
        version: Option<f64>,
    ) -> napi::Result<PrefetchCore> {
        guarded(|| {
            let take_policy = match policy.as_str() {
                "allow" => TakePolicy::Allow,
                "deny" => TakePolicy::Deny,
                other => {
                    return Err(invalid(format!(
                        "failure policy {other:?}: 'allow' or 'deny'"
                    )))
                }
            };
            let policy = TakeLimiter::new(&key, rate, cap, take_policy, share).map_err(invalid)?;
            let timeout = match timeout_ms {
                None => 0,
                Some(t) => nanos(t)?,
            };
            let version = version.map(|v| count("version", v)).transpose()?;
            let ledger = Ledger::new(
                LeaseTarget {
                    key: key.into_bytes(),
                    rate,
                    cap,
                    init,
                    version,
                },
                LedgerConfig {
                    batch: count("batch", batch)?,
                    ttl_ms: count("ttlMs", ttl_ms)?,
                    renew_at,
                    jitter,
                    timeout,
                },
            )
            .map_err(invalid)?;
            Ok(PrefetchCore {
                ledger,
                health: Health::new(nanos(PROBE_INTERVAL_MS)?),
                policy,
            })
        })
    }

    #[napi(getter)]
    pub fn rate(&self) -> f64 {
        self.policy.limit().rate()
    }

    #[napi(getter)]
    pub fn cap(&self) -> f64 {
        self.policy.limit().cap()
    }

    /// Refuses an `n` that could never be granted (0, a fraction, above the burst).
    #[napi]
    pub fn check(&self, n: f64) -> napi::Result<()> {
        guarded(|| self.policy.check(count("n", n)?).map_err(invalid))
    }

    /// Forgets the leases, the call in the air and the denial (the golden cases' forked
    /// child; Node has no fork, the step is the core's).
    #[napi]
    pub fn forget(&mut self) -> napi::Result<()> {
        guarded(|| {
            self.ledger.forget();
            Ok(())
        })
    }

    /// The hot path: `n` from memory, answering the tokens left, or -1 (nothing changed:
    /// the shell's full path decides). No allocation.
    #[napi]
    pub fn grant(&mut self, n: f64, now_ms: f64) -> napi::Result<f64> {
        guarded(|| {
            Ok(match self.ledger.grant(count("n", n)?, nanos(now_ms)?) {
                Some(left) => left as f64,
                None => -1.0,
            })
        })
    }

    /// A take from what is held (`down`: the shell believes Redis down or is closed).
    #[napi]
    pub fn take(&mut self, n: f64, now_ms: f64, down: bool) -> napi::Result<LocalTake> {
        guarded(|| {
            let (kind, value, renew) = match self.ledger.take(count("n", n)?, nanos(now_ms)?, down)
            {
                Local::Granted { left, renew } => ("granted", left, renew),
                Local::Denied { retry_after_ms } => ("denied", retry_after_ms, false),
                Local::Ask => ("ask", 0, false),
            };
            Ok(LocalTake {
                kind: kind.to_owned(),
                value: value as f64,
                renew,
            })
        })
    }

    #[napi]
    pub fn renewal_due(&self, now_ms: f64, down: bool) -> napi::Result<bool> {
        guarded(|| Ok(self.ledger.renewal_due(nanos(now_ms)?, down)))
    }

    #[napi]
    pub fn begin(&mut self, backend_name: String, need: f64, now_ms: f64) -> napi::Result<Began> {
        guarded(|| {
            let b = backend(&backend_name)?;
            Ok(
                match self.ledger.begin(b, count("need", need)?, nanos(now_ms)?) {
                    Begin::Send { flight, command } => Began {
                        kind: "send".into(),
                        flight: flight as f64,
                        command: Some(strings(command)),
                    },
                    Begin::Busy { flight } => Began {
                        kind: "busy".into(),
                        flight: flight as f64,
                        command: None,
                    },
                    Begin::Closed => Began {
                        kind: "closed".into(),
                        flight: 0.0,
                        command: None,
                    },
                },
            )
        })
    }

    /// The reply to call `flight`; a malformed one (or one that is no reply at all) ends the
    /// call all the same and is thrown as an unexpected reply.
    #[napi]
    pub fn landed(
        &mut self,
        env: Env,
        flight: f64,
        reply: JsUnknown,
        now_ms: f64,
        draw: f64,
    ) -> napi::Result<Landing> {
        guarded(|| {
            let flight = count("flight", flight)?;
            let now = nanos(now_ms)?;
            let landing = match to_reply(&env, reply) {
                Ok(r) => {
                    let landing = self.ledger.landed(flight, &r, now, draw);
                    // What Redis leased is spent from the share the failure policy would
                    // let out locally too (as the Rust shell's `observe`).
                    if let (Ok(_), Ok(lease)) = (&landing, parse_lease(&r)) {
                        self.policy.observe(lease.tokens, now);
                    }
                    landing
                }
                Err(e) => {
                    let _ = self.ledger.landed(flight, &Reply::Nil, now, draw);
                    Err(e)
                }
            }
            .map_err(protocol)?;
            let give_back = pairs(&landing.give_back);
            let (kind, served, value) = match landing.landed {
                Landed::Granted { served, left } => ("granted", served, left),
                Landed::Denied { retry_after_ms } => ("denied", false, retry_after_ms),
                Landed::Stale => ("stale", false, 0),
                Landed::Closed => ("closed", false, 0),
            };
            Ok(Landing {
                kind: kind.into(),
                served,
                value: value as f64,
                give_back,
            })
        })
    }

    /// A failed call: `kind` `refused` (an error reply), `not_sent` or `unknown`; answers
    /// the `[id, left]` leases to return.
    #[napi]
    pub fn failed(
        &mut self,
        flight: f64,
        kind: String,
        now_ms: f64,
    ) -> napi::Result<Vec<Vec<f64>>> {
        guarded(|| {
            let failure = match kind.as_str() {
                "refused" => Failure::Refused,
                "not_sent" => Failure::NotSent,
                "unknown" => Failure::Unknown,
                other => {
                    return Err(invalid(format!(
                        "failure {other:?}: refused, not_sent or unknown"
                    )))
                }
            };
            Ok(pairs(&self.ledger.failed(
                count("flight", flight)?,
                failure,
                nanos(now_ms)?,
            )))
        })
    }

    /// Its own caller gives up on call `flight`: the tokens it brought (null: none yet).
    #[napi]
    pub fn give_up(&mut self, flight: f64) -> napi::Result<Option<f64>> {
        guarded(|| {
            Ok(self
                .ledger
                .give_up(count("flight", flight)?)
                .map(|t| t as f64))
        })
    }

    #[napi]
    pub fn claim(&mut self, flight: f64) -> napi::Result<Option<f64>> {
        guarded(|| {
            Ok(self
                .ledger
                .claim(count("flight", flight)?)
                .map(|t| t as f64))
        })
    }

    #[napi]
    pub fn has_ended(&self, flight: f64) -> napi::Result<bool> {
        guarded(|| Ok(self.ledger.has_ended(count("flight", flight)?)))
    }

    #[napi]
    pub fn release(&mut self, flight: f64, claimed: bool, now_ms: f64) -> napi::Result<()> {
        guarded(|| {
            self.ledger
                .release(count("flight", flight)?, claimed, nanos(now_ms)?);
            Ok(())
        })
    }

    /// `wait`, `ended`, `outage_first` or `outage`.
    #[napi]
    pub fn judge(&mut self, flight: f64, now_ms: f64, limit_ms: f64) -> napi::Result<String> {
        guarded(|| {
            let j = self
                .ledger
                .judge(count("flight", flight)?, nanos(now_ms)?, nanos(limit_ms)?);
            Ok(match j {
                Judged::Wait => "wait",
                Judged::Ended => "ended",
                Judged::Outage { first: true } => "outage_first",
                Judged::Outage { first: false } => "outage",
            }
            .into())
        })
    }

    /// Closes the ledger: the `[id, left]` leases to return.
    #[napi]
    pub fn close(&mut self, now_ms: f64) -> napi::Result<Vec<Vec<f64>>> {
        guarded(|| Ok(pairs(&self.ledger.close(nanos(now_ms)?))))
    }

    #[napi(getter)]
    pub fn closed(&self) -> bool {
        self.ledger.closed()
    }

    #[napi]
    pub fn held(&mut self, now_ms: f64) -> napi::Result<f64> {
        guarded(|| Ok(self.ledger.held(nanos(now_ms)?) as f64))
    }

    #[napi(getter)]
    pub fn in_flight(&self) -> bool {
        self.ledger.in_flight()
    }

    /// How long a lease call's reply is awaited, in milliseconds: `max(10 s, ttl + timeout
    /// + 1 s)`, the bound every client keeps.
    #[napi(getter)]
    pub fn late_bound_ms(&self) -> f64 {
        self.ledger.late_bound() as f64 / 1e6
    }

    #[napi]
    pub fn return_command(
        &self,
        backend_name: String,
        lease_id: f64,
        left: f64,
    ) -> napi::Result<Vec<String>> {
        guarded(|| {
            let l = lease(lease_id, left)?;
            Ok(strings(self.ledger.return_of(backend(&backend_name)?, &l)))
        })
    }

    /// A return's reply read (the tokens credited back); a malformed one is thrown.
    #[napi]
    pub fn parse_return(&self, env: Env, reply: JsUnknown) -> napi::Result<f64> {
        guarded(|| {
            let r = to_reply(&env, reply).map_err(protocol)?;
            rl_client_core::lease::parse_return(&r)
                .map(|t| t as f64)
                .map_err(protocol)
        })
    }

    #[napi]
    pub fn returned(&mut self, lease_id: f64, left: f64, ok: bool) -> napi::Result<()> {
        guarded(|| {
            self.ledger.returned(&lease(lease_id, left)?, ok);
            Ok(())
        })
    }

    /// Stands `n` in the ledger's line (`front`: for its own call; `again`: its number if it
    /// stood there already): its number.
    #[napi]
    pub fn enter_line(&mut self, n: f64, front: bool, again: Option<f64>) -> napi::Result<f64> {
        guarded(|| {
            let again = again.map(|a| count("again", a)).transpose()?;
            Ok(self.ledger.enter_line(count("n", n)?, front, again) as f64)
        })
    }

    /// Leaves the line: the waiter to wake next (null: none).
    #[napi]
    pub fn leave_line(&mut self, waiter: f64) -> napi::Result<Option<f64>> {
        guarded(|| {
            Ok(self
                .ledger
                .leave_line(count("waiter", waiter)?)
                .map(|w| w as f64))
        })
    }

    /// A call ended (`granted`: it brought tokens): the waiters to wake.
    #[napi]
    pub fn wake(&mut self, granted: bool) -> napi::Result<Vec<f64>> {
        guarded(|| {
            Ok(self
                .ledger
                .wake(granted)
                .into_iter()
                .map(|w| w as f64)
                .collect())
        })
    }

    /// Whether a caller at `now_ms` should ask Redis (while it is believed down, one probe
    /// per interval).
    #[napi]
    pub fn may_call(&self, now_ms: f64) -> napi::Result<bool> {
        guarded(|| Ok(self.health.may_call(nanos(now_ms)?.max(1))))
    }

    #[napi(getter)]
    pub fn down(&self) -> bool {
        self.health.is_down()
    }

    /// A call failed as an outage at `now_ms`.
    #[napi]
    pub fn call_failed(&mut self, now_ms: f64) -> napi::Result<()> {
        guarded(|| {
            self.health.failed(nanos(now_ms)?.max(1));
            Ok(())
        })
    }

    /// Redis answered.
    #[napi]
    pub fn call_succeeded(&mut self) {
        self.health.succeeded();
    }

    /// The failure policy's decision on `n` at `now_ms`, into `out` (the `Limiter`'s slots).
    #[napi]
    pub fn outage(&mut self, n: f64, now_ms: f64, mut out: Float64Array) -> napi::Result<()> {
        guarded(|| {
            let d = self.policy.outage(count("n", n)?, nanos(now_ms)?);
            crate::take::write(&d, &mut out)
        })
    }

    /// An error reply raised to the caller.
    #[napi]
    pub fn error(&mut self) {
        self.policy.error()
    }

    #[napi]
    pub fn counters(&self) -> PrefetchCounters {
        let l: LedgerCounters = self.ledger.counters();
        let t = self.policy.counters();
        PrefetchCounters {
            leases: l.leases as f64,
            lease_tokens: l.lease_tokens as f64,
            leases_denied: l.leases_denied as f64,
            leases_expired: l.leases_expired as f64,
            leases_lost: l.leases_lost as f64,
            returns: l.returns as f64,
            tokens_returned: l.tokens_returned as f64,
            slow_calls: l.slow_calls as f64,
            memory_grants: l.memory_grants as f64,
            memory_tokens: l.memory_tokens as f64,
            fallback_granted: t.fallback_granted as f64,
            fallback_denied: t.fallback_denied as f64,
            outages: t.outages as f64,
            errors: t.errors as f64,
        }
    }
}
