//! Share limiters (`ShareLimiter` in the TS shell): the client core's share holder, both
//! halves in one object. Node runs one call at a time on its thread, so the takers' side
//! ([`Holder`]) and the refresh side ([`Refresh`]) need no mailbox between them (Python's
//! threads do): each event the refresh side makes is applied to the holder at once, in order.
//! The shell only sends the command it is handed, waits (with its timeout) and reports the
//! reply, the outage or the error reply; a take is one call, from memory.

use napi::{Env, JsTypedArray, JsUnknown};
use napi_derive::napi;

use rl_client_core::share::{self as core, FailurePolicy, PinKind, Policy, ShareKey, MS};
use rl_client_core::share_holder::{Event, Holder, Refresh};

use crate::guard::{count, guarded, invalid, nanos, protocol};
use crate::reply::to_reply;
use crate::typed::f64s;
use crate::{backend, strings};

/// How many numbers [`ShareCore::take`] writes (the layout of `take.rs`'s decisions:
/// granted, tokens, remaining, retry_after_ms, reset_after_ms, limit, source (0 share,
/// 1 fallback), pinned (0 none, 1 rate, 2 block, 3 exempt)).
pub const SLOTS: usize = 8;

fn pin_code(kind: Option<PinKind>) -> f64 {
    match kind {
        None => 0.0,
        Some(PinKind::Rate) => 1.0,
        Some(PinKind::Block) => 2.0,
        Some(PinKind::Exempt) => 3.0,
    }
}

fn pin_name(kind: Option<PinKind>) -> Option<String> {
    kind.map(|k| k.name().to_owned())
}

/// A share limiter's counters (this process).
#[napi(object)]
pub struct ShareCounters {
    pub granted: f64,
    pub denied: f64,
    pub tokens_granted: f64,
    pub fallback_granted: f64,
    pub fallback_denied: f64,
    /// Calls that were an outage (timeout, no connection).
    pub outages: f64,
    /// Error replies (and malformed replies) to `RL.SHARE`, and takes that threw one.
    pub errors: f64,
    /// `RL.SHARE` calls sent.
    pub redis_calls: f64,
}

/// What the holder holds now.
#[napi(object)]
pub struct ShareInfo {
    /// Tokens per second this instance may use (0 when it may use none).
    pub rate: f64,
    pub burst: f64,
    /// Tokens in the local bucket.
    pub tokens: f64,
    /// Live holders of the key at the last answer (0 before any).
    pub holders: f64,
    /// Whether the failure policy is deciding.
    pub fallback: bool,
    /// The kind of the operator's pin behind the last answer.
    pub pinned: Option<String>,
}

#[derive(Default)]
struct Counts {
    granted: u64,
    denied: u64,
    tokens_granted: u64,
    fallback_granted: u64,
    fallback_denied: u64,
    outages: u64,
    errors: u64,
    redis_calls: u64,
}

/// One holder of a shared key.
#[napi]
pub struct ShareCore {
    holder: Holder,
    refresh: Refresh,
    cap: f64,
    counts: Counts,
}

fn ms_ns(what: &str, ms: f64) -> napi::Result<u64> {
    if ms.is_finite() && ms >= 0.0 {
        Ok((ms * 1e6) as u64)
    } else {
        Err(invalid(format!("{what}: milliseconds expected, got {ms}")))
    }
}

#[napi]
impl ShareCore {
    /// `policy`: `"allow"`, `"last_known"` or `"deny"`; `allow_share`: the share of
    /// `rate / holders` the `allow` policy lets through; `instances`: holders assumed before
    /// any answer; `version`: the protocol version to ask for (null: the server's); times
    /// in milliseconds, `now_ms` on `performance.now()`.
    #[napi(constructor)]
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        key: String,
        rate: f64,
        cap: f64,
        period_ms: f64,
        version: Option<f64>,
        headroom: f64,
        policy: String,
        allow_share: f64,
        instances: f64,
        allow_for_ms: f64,
        deny_retry_after_ms: f64,
        now_ms: f64,
    ) -> napi::Result<ShareCore> {
        guarded(|| {
            let policy = match policy.as_str() {
                "allow" => FailurePolicy::Allow,
                "last_known" => FailurePolicy::LastKnown,
                "deny" => FailurePolicy::Deny,
                other => {
                    return Err(invalid(format!(
                        "failurePolicy {other:?}: 'allow', 'last_known' or 'deny'"
                    )))
                }
            };
            if key.is_empty() {
                return Err(invalid("key must not be empty"));
            }
            if !(rate.is_finite() && rate > 0.0 && cap.is_finite() && cap > 0.0) {
                return Err(invalid("rate and cap must be finite numbers above 0"));
            }
            if !(headroom.is_finite() && headroom >= 0.0) {
                return Err(invalid("headroom must be a finite number, at least 0"));
            }
            if !(allow_share.is_finite() && allow_share >= 0.0) {
                return Err(invalid(
                    "the policy's share must be a finite number, at least 0",
                ));
            }
            if !(10.0..=3_600_000.0).contains(&period_ms) {
                return Err(invalid("period must be between 10 ms and 3600 s"));
            }
            let period_ms = period_ms.round() as u64;
            let instances = count("instances", instances)?;
            if instances == 0 {
                return Err(invalid("instances must be a positive integer"));
            }
            let version = version.map(|v| count("version", v)).transpose()?;
            let now = nanos(now_ms)?;
            let policy = Policy {
                policy,
                allow_share,
                rate,
                cap,
                instances,
                allow_for: ms_ns("allowFor", allow_for_ms)?,
            };
            let key = ShareKey {
                key: key.into_bytes(),
                rate,
                cap,
                period_ms,
                version,
            };
            Ok(ShareCore {
                holder: Holder::new(
                    policy,
                    period_ms * MS,
                    ms_ns("denyRetryAfter", deny_retry_after_ms)?,
                    now,
                ),
                refresh: Refresh::new(key, headroom, now),
                cap,
                counts: Counts::default(),
            })
        })
    }

    /// Decides on `n` tokens at `now_ms` into `out` (see [`SLOTS`]): `true`, or `false`
    /// when the last call was answered with an error reply and no share may be used (the
    /// shell throws that error; counted). A bad `n` throws and changes nothing.
    #[napi]
    pub fn take(
        &mut self,
        n: f64,
        #[napi(ts_arg_type = "Float64Array")] out: JsTypedArray,
        now_ms: f64,
    ) -> napi::Result<bool> {
        guarded(|| {
            let mut out = f64s(out)?;
            let out = out.f64s();
            if out.len() < SLOTS {
                return Err(invalid(format!("a Float64Array of {SLOTS} expected")));
            }
            let n = count("n", n)?;
            if n == 0 {
                return Err(invalid("n must be a positive integer"));
            }
            if n as f64 > self.cap {
                return Err(invalid("n must not exceed cap (it could never be granted)"));
            }
            let now = nanos(now_ms)?;
            let Some(t) = self.holder.take(n, now) else {
                self.counts.errors += 1;
                return Ok(false);
            };
            let c = &mut self.counts;
            match (t.allowed, t.fallback) {
                (true, false) => c.granted += 1,
                (false, false) => c.denied += 1,
                (true, true) => c.fallback_granted += 1,
                (false, true) => c.fallback_denied += 1,
            }
            c.tokens_granted += t.tokens;
            out[0] = f64::from(u8::from(t.allowed));
            out[1] = t.tokens as f64;
            out[2] = t.remaining;
            out[3] = t.retry_after_ms() as f64;
            out[4] = t.reset_after_ms() as f64;
            out[5] = self.cap;
            out[6] = f64::from(u8::from(t.fallback));
            out[7] = pin_code(t.pinned);
            Ok(true)
        })
    }

    /// The `RL.SHARE` call to send at `now_ms` for `holder` (its sending applied).
    #[napi]
    pub fn send(
        &mut self,
        backend_name: String,
        holder: String,
        now_ms: f64,
    ) -> napi::Result<Vec<String>> {
        guarded(|| {
            let b = backend(&backend_name)?;
            let now = nanos(now_ms)?;
            let attempted = self.holder.attempted();
            let (cmd, event) = self.refresh.send(b, holder.as_bytes(), attempted, now);
            self.holder.apply(&event);
            self.counts.redis_calls += 1;
            Ok(strings(cmd))
        })
    }

    /// `RL.SHARE ... RELEASE` for `holder`.
    #[napi]
    pub fn release_command(
        &self,
        backend_name: String,
        holder: String,
    ) -> napi::Result<Vec<String>> {
        guarded(|| {
            let b = backend(&backend_name)?;
            Ok(strings(self.refresh.release_command(b, holder.as_bytes())))
        })
    }

    /// The reply to the call sent at `sent_ms` came at `at_ms`: milliseconds until the next
    /// call. A reply that is not `RL.SHARE`'s throws (`unexpected reply`) and changes
    /// nothing: the shell then reports it with [`ShareCore::failed`].
    #[napi]
    pub fn answered(
        &mut self,
        env: Env,
        reply: JsUnknown,
        sent_ms: f64,
        at_ms: f64,
        jitter: f64,
    ) -> napi::Result<f64> {
        guarded(|| {
            let sent = nanos(sent_ms)?;
            let at = nanos(at_ms)?;
            let reply = to_reply(&env, reply).map_err(protocol)?;
            let (event, next) = self
                .refresh
                .answered(&reply, sent, at, jitter)
                .map_err(protocol)?;
            self.holder.apply(&event);
            Ok(next as f64 / 1e6)
        })
    }

    /// The call was an outage at `at_ms` (`refused`: it never left): milliseconds until the
    /// next call (`probe_ms`, at most a period).
    #[napi]
    pub fn outage(&mut self, refused: bool, at_ms: f64, probe_ms: f64) -> napi::Result<f64> {
        guarded(|| {
            let at = nanos(at_ms)?;
            let (event, next) = self.refresh.outage(refused, at, ms_ns("probe", probe_ms)?);
            self.holder.apply(&event);
            self.counts.outages += 1;
            Ok(next as f64 / 1e6)
        })
    }

    /// The call was answered with an error reply (or a malformed one): milliseconds until
    /// the next call.
    #[napi]
    pub fn failed(&mut self) -> napi::Result<f64> {
        guarded(|| {
            let (event, next) = self.refresh.failed();
            debug_assert_eq!(event, Event::Failed);
            self.holder.apply(&event);
            self.counts.errors += 1;
            Ok(next as f64 / 1e6)
        })
    }

    /// Whether to call before the next call is due (the demand strayed), at `now_ms`.
    #[napi]
    pub fn drifted(&mut self, now_ms: f64) -> napi::Result<bool> {
        guarded(|| {
            let now = nanos(now_ms)?;
            let attempted = self.holder.attempted();
            Ok(self.refresh.drifted(now, attempted))
        })
    }

    /// What the holder holds at `now_ms`.
    #[napi]
    pub fn info(&mut self, now_ms: f64) -> napi::Result<ShareInfo> {
        guarded(|| {
            let i = self.holder.info(nanos(now_ms)?);
            Ok(ShareInfo {
                rate: i.rate,
                burst: i.burst,
                tokens: i.tokens,
                holders: i.holders as f64,
                fallback: i.fallback,
                pinned: pin_name(i.pinned),
            })
        })
    }

    /// Tokens asked for so far (granted or denied).
    #[napi]
    pub fn attempted(&self) -> f64 {
        self.holder.attempted() as f64
    }

    /// What this holder counted so far.
    #[napi]
    pub fn counters(&self) -> ShareCounters {
        let c = &self.counts;
        ShareCounters {
            granted: c.granted as f64,
            denied: c.denied as f64,
            tokens_granted: c.tokens_granted as f64,
            fallback_granted: c.fallback_granted as f64,
            fallback_denied: c.fallback_denied as f64,
            outages: c.outages as f64,
            errors: c.errors as f64,
            redis_calls: c.redis_calls as f64,
        }
    }
}

/// Checks a reply is `RL.SHARE`'s (a release's): throws `unexpected reply` if not.
#[napi]
pub fn check_share_reply(env: Env, reply: JsUnknown) -> napi::Result<()> {
    guarded(|| {
        let reply = to_reply(&env, reply).map_err(protocol)?;
        if let rl_client_core::Reply::Error(text) = &reply {
            return Err(protocol(rl_client_core::ProtocolError(format!(
                "RL.SHARE: an error reply {text:?}"
            ))));
        }
        core::parse_share(&reply).map(|_| ()).map_err(protocol)
    })
}
