//! A limiter's takes (`Limiter` in the TS shell): the client core's [`TakeLimiter`]. The
//! shell sends the command it is handed, waits (with its timeout) and hands the reply back,
//! or says the call failed; the decision, from Redis or from the failure policy, is the
//! core's.

use napi::{Env, JsTypedArray, JsUnknown};
use napi_derive::napi;

use rl_client_core::budget::Backend;
use rl_client_core::take::{Decision, Pinned, TakeLimiter, TakePolicy};
use rl_client_core::token_budget::Source;

use crate::backend;
use crate::guard::{count, guarded, invalid, nanos, protocol};
use crate::patch::LastCommands;
use crate::reply::to_reply;
use crate::typed::{f64s, u32s, Elements};

/// How many numbers [`TakeCore::taken`] and [`TakeCore::outage`] write.
pub const SLOTS: usize = 8;

/// A decision as numbers, into the caller's `Float64Array` (filling a typed array costs Node
/// far less than making an object): granted (0 or 1), tokens, remaining, retry_after_ms,
/// reset_after_ms, limit, source (0 server, 1 fallback), pinned (0 none, 1 rate, 2 block,
/// 3 exempt).
pub(crate) fn write(d: &Decision, out: &mut [f64]) -> napi::Result<()> {
    if out.len() < SLOTS {
        return Err(invalid(format!("a Float64Array of {SLOTS} expected")));
    }
    out[0] = f64::from(u8::from(d.granted));
    out[1] = d.tokens as f64;
    out[2] = d.remaining;
    out[3] = d.retry_after_ms as f64;
    out[4] = d.reset_after_ms as f64;
    out[5] = d.limit;
    out[6] = match d.source {
        Source::Server => 0.0,
        Source::Fallback => 1.0,
    };
    out[7] = match d.pinned {
        None => 0.0,
        Some(Pinned::Rate) => 1.0,
        Some(Pinned::Block) => 2.0,
        Some(Pinned::Exempt) => 3.0,
    };
    Ok(())
}

/// The array a decision is written into, checked before anything is decided.
fn slots(out: JsTypedArray) -> napi::Result<Elements> {
    let mut out = f64s(out)?;
    if out.f64s().len() < SLOTS {
        return Err(invalid(format!("a Float64Array of {SLOTS} expected")));
    }
    Ok(out)
}

/// A limiter's counters.
#[napi(object)]
pub struct TakeCounters {
    pub granted: f64,
    pub denied: f64,
    pub tokens_granted: f64,
    pub fallback_granted: f64,
    pub fallback_denied: f64,
    pub outages: f64,
    pub errors: f64,
    pub errors_let_through: f64,
}

fn rebuild(
    granted: bool,
    remaining: f64,
    retry_after_ms: f64,
    reset_after_ms: f64,
    limit: f64,
) -> napi::Result<Decision> {
    Ok(Decision {
        granted,
        tokens: 0,
        remaining,
        retry_after_ms: count("retryAfterMs", retry_after_ms)?,
        reset_after_ms: count("resetAfterMs", reset_after_ms)?,
        limit,
        source: Source::Server,
        pinned: None,
    })
}

/// A decision's headers, flat (`[name, value, name, value, ...]`): `X-RateLimit-Limit`,
/// `-Remaining`, `-Reset`, and `Retry-After` when denied.
#[napi]
pub fn decision_headers(
    granted: bool,
    remaining: f64,
    retry_after_ms: f64,
    reset_after_ms: f64,
    limit: f64,
) -> napi::Result<Vec<String>> {
    guarded(|| {
        let d = rebuild(granted, remaining, retry_after_ms, reset_after_ms, limit)?;
        Ok(d.headers()
            .into_iter()
            .flat_map(|(k, v)| [k.to_owned(), v])
            .collect())
    })
}

/// The JSON body of a 429 for a denial that asks to retry after `retry_after_ms`.
#[napi]
pub fn too_many_body(retry_after_ms: f64) -> napi::Result<String> {
    guarded(|| Ok(rebuild(false, 0.0, retry_after_ms, 0.0, 1.0)?.too_many_body()))
}

/// One limiter's decisions.
#[napi]
pub struct TakeCore {
    inner: TakeLimiter,
    /// The last per-call-key command (a middleware's: only the key changes).
    commands: LastCommands<2>,
}

#[napi]
impl TakeCore {
    /// `policy`: `"allow"` or `"deny"`; `share`: 1 / instances (null: the core's default).
    #[napi(constructor)]
    pub fn new(
        key: String,
        rate: f64,
        cap: f64,
        policy: String,
        share: Option<f64>,
    ) -> napi::Result<TakeCore> {
        guarded(|| {
            let policy = match policy.as_str() {
                "allow" => TakePolicy::Allow,
                "deny" => TakePolicy::Deny,
                other => {
                    return Err(invalid(format!(
                        "failure policy {other:?}: 'allow' or 'deny'"
                    )))
                }
            };
            TakeLimiter::new(&key, rate, cap, policy, share)
                .map(|inner| TakeCore {
                    inner,
                    commands: LastCommands::default(),
                })
                .map_err(invalid)
        })
    }

    #[napi(getter)]
    pub fn rate(&self) -> f64 {
        self.inner.limit().rate()
    }

    #[napi(getter)]
    pub fn cap(&self) -> f64 {
        self.inner.limit().cap()
    }

    /// Refuses an `n` that could never be granted (0, a fraction, above the burst).
    #[napi]
    pub fn check(&self, n: f64) -> napi::Result<()> {
        guarded(|| self.inner.check(count("n", n)?).map_err(invalid))
    }

    /// The command (name first) that takes `n` tokens on the limiter's key, or on `key`, as
    /// a patch of the last one the shell holds (`have`): see `patch.rs` (`positions[0]` is
    /// `WHOLE` when the strings are the whole command).
    #[napi]
    pub fn command(
        &mut self,
        backend_name: String,
        n: f64,
        key: Option<String>,
        have: bool,
        #[napi(ts_arg_type = "Uint32Array")] positions: JsTypedArray,
    ) -> napi::Result<Vec<String>> {
        guarded(|| {
            let n = count("n", n)?;
            self.inner.check(n).map_err(invalid)?;
            let b = backend(&backend_name)?;
            let args = match key {
                None => self.inner.command(b, n),
                Some(k) if k.is_empty() => return Err(invalid("key must not be empty")),
                Some(k) => self.inner.command_on(b, k.as_bytes(), n),
            };
            let slot = match b {
                Backend::Module => 0,
                Backend::Functions => 1,
            };
            self.commands
                .patch(slot, args, have, u32s(positions)?.u32s())
        })
    }

    /// The decision Redis's reply makes, into `out` (see `SLOTS`); an `Error` (unexpected
    /// reply) if it is malformed. `now_ms` (`performance.now()`, the clock `outage` is
    /// given): what Redis granted comes off the key's local bucket then.
    #[napi]
    pub fn taken(
        &mut self,
        env: Env,
        n: f64,
        reply: JsUnknown,
        key: Option<String>,
        #[napi(ts_arg_type = "Float64Array")] out: JsTypedArray,
        now_ms: f64,
    ) -> napi::Result<()> {
        guarded(|| {
            // Checked before anything is decided: a bad call changes nothing.
            let mut out = slots(out)?;
            let n = count("n", n)?;
            let now = nanos(now_ms)?;
            let reply = match to_reply(&env, reply) {
                Ok(r) => r,
                Err(e) => {
                    self.inner.error();
                    return Err(protocol(e));
                }
            };
            match key {
                None => self.inner.taken(n, &reply, now),
                Some(k) => self.inner.taken_on(k.as_bytes(), n, &reply, now),
            }
            .map_err(protocol)
            .and_then(|d| write(&d, out.f64s()))
        })
    }

    /// The failure policy's decision while Redis does not answer, at `now_ms`
    /// (`performance.now()`), into `out`.
    #[napi]
    pub fn outage(
        &mut self,
        n: f64,
        now_ms: f64,
        key: Option<String>,
        #[napi(ts_arg_type = "Float64Array")] out: JsTypedArray,
    ) -> napi::Result<()> {
        guarded(|| {
            let mut out = slots(out)?;
            let n = count("n", n)?;
            let now = nanos(now_ms)?;
            let d = match key {
                None => self.inner.outage(n, now),
                Some(k) => self.inner.outage_on(k.as_bytes(), n, now),
            };
            write(&d, out.f64s())
        })
    }

    /// A call that ended in an error reply, raised to the caller.
    #[napi]
    pub fn error(&mut self) {
        self.inner.error()
    }

    /// A request a fail-open integration let through on an error.
    #[napi]
    pub fn let_through(&mut self) {
        self.inner.let_through()
    }

    #[napi]
    pub fn counters(&self) -> TakeCounters {
        let c = self.inner.counters();
        TakeCounters {
            granted: c.granted as f64,
            denied: c.denied as f64,
            tokens_granted: c.tokens_granted as f64,
            fallback_granted: c.fallback_granted as f64,
            fallback_denied: c.fallback_denied as f64,
            outages: c.outages as f64,
            errors: c.errors as f64,
            errors_let_through: c.errors_let_through as f64,
        }
    }
}
