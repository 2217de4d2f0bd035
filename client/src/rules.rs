//! Layered limits from one document (docs/rules.md): the tokio shell over the client
//! core's documents and checks ([`rl_client_core::rules_doc`], [`rl_client_core::rules`];
//! the Python client runs the same code, and both run `protocol/rules_cases.json`).
//!
//! [`Rules::check`] takes every enforced layer's buckets with one `RL.MTAKE` (all or
//! nothing); with [`RulesConfig::cluster`], one per hash slot in document order, giving
//! back (`RL.REFUND`) what earlier slots granted when a later one refuses. The document is
//! read from a Redis hash (`version`, `document`, `updated_at`: what
//! `python -m redis_rl rules apply` writes); [`Rules::follow`] polls its version and swaps
//! a new document in whole, keeping the last good one when a stored document is invalid.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redis::Value;
use rl_client_core::budget::Backend as CoreBackend;
use rl_client_core::rules::{Check, CheckOptions};

use crate::backend::Selector;
use crate::budget::to_reply;
use crate::conn::{call, RedisConnection};
use crate::{Backend, Error, Metrics};

pub use rl_client_core::rules_doc::{
    Applied, BucketKey, Document, Layer, Problem, RulesError, BUILTIN_ATTRIBUTES, DEFAULT_CODE,
    DEFAULT_PREFIX, MAX_BUCKETS, MAX_TEXT,
};

// -- the engine ------------------------------------------------------------------------

/// How a [`Rules`] engine calls Redis.
#[derive(Debug, Clone)]
pub struct RulesConfig {
    /// Longest wait for one call.
    pub timeout: Duration,
    /// Let a request through when Redis fails or answers an error (counted in
    /// [`RulesStats::fail_open`]); `false` refuses it: a denial by the first enforced
    /// layer with `fallback` set, retry after 1 s (counted in [`RulesStats::fail_closed`]).
    pub fail_open: bool,
    /// Take bucket groups by hash slot (a cluster connection): one `RL.MTAKE` per slot,
    /// later refusals refunded. `false`: one `RL.MTAKE` for every bucket.
    pub cluster: bool,
    /// The server side.
    pub backend: Backend,
    /// The share of grants written to the decision log (every refusal is), 0 to 1.
    pub log_grants: f64,
}

impl Default for RulesConfig {
    fn default() -> Self {
        RulesConfig {
            timeout: Duration::from_millis(200),
            fail_open: true,
            cluster: false,
            backend: Backend::Module,
            log_grants: 0.0,
        }
    }
}

/// The engine's counters.
#[derive(Debug, Default)]
pub struct RulesStats {
    /// New documents put in force.
    pub reloads: AtomicU64,
    /// Stored documents refused as invalid (the last good one kept).
    pub refused_documents: AtomicU64,
    /// Polls that failed (Redis down, a wrong type), and absences of the key (once each).
    pub poll_errors: AtomicU64,
    /// Checks let through because Redis failed.
    pub fail_open: AtomicU64,
    /// Checks refused because Redis failed (`fail_open: false`).
    pub fail_closed: AtomicU64,
    /// Decisions by layer and outcome (`granted`, `denied`, `shadow_denied`).
    pub decisions: Mutex<HashMap<(String, &'static str), u64>>,
}

/// A decision of [`Rules::check`].
#[derive(Debug, Clone, PartialEq)]
pub struct RuleDecision {
    /// Granted.
    pub allowed: bool,
    /// The refusing layer, or when granted the binding one (fewest tokens left); `None`
    /// when no layer applied or the decision is a fail-open one.
    pub layer: Option<String>,
    /// The deciding layer's code.
    pub code: Option<String>,
    /// The deciding bucket's key.
    pub key: Option<String>,
    /// The deciding bucket's tokens left.
    pub remaining: f64,
    /// The deciding bucket's cap (`X-RateLimit-Limit`).
    pub limit: f64,
    /// The wait before a retry may be granted (zero when granted).
    pub retry_after: Duration,
    /// Shadow layers that would have refused.
    pub shadow_denied: Vec<String>,
    /// Decided without Redis (it failed): the failure policy's decision.
    pub fallback: bool,
}

impl RuleDecision {
    fn from_core(d: rl_client_core::rules::RuleDecision) -> RuleDecision {
        RuleDecision {
            allowed: d.granted,
            layer: d.layer,
            code: d.code,
            key: d.key,
            remaining: d.remaining,
            limit: d.limit,
            retry_after: Duration::from_millis(d.retry_after_ms),
            shadow_denied: d.shadow_denied,
            fallback: d.fallback,
        }
    }

    /// The 429 body: `{"code", "layer", "retry_after"}` (whole seconds, at least 1).
    pub fn body(&self) -> String {
        let q = |s: &Option<String>| match s {
            Some(s) => format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\"")),
            None => "null".into(),
        };
        let secs = self.retry_after.as_millis().div_ceil(1000).max(1);
        format!(
            "{{\"code\":{},\"layer\":{},\"retry_after\":{secs}}}",
            q(&self.code),
            q(&self.layer)
        )
    }
}

/// Layered limits from a document, checked over `RL.MTAKE`.
pub struct Rules<C: RedisConnection> {
    conn: C,
    current: RwLock<Arc<Document>>,
    key: Option<String>,
    refused: Mutex<Option<u64>>,
    missing: AtomicBool,
    selector: Selector,
    config: RulesConfig,
    metrics: Metrics,
    /// The engine's counters.
    pub stats: RulesStats,
}

fn bulk_text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        Value::Int(i) => Some(i.to_string()),
        _ => None,
    }
}

impl<C: RedisConnection> Rules<C> {
    /// A fixed document, not followed.
    pub fn from_text(conn: C, text: &str, config: RulesConfig) -> Result<Rules<C>, RulesError> {
        let doc = Document::parse(text)?;
        Ok(Rules::with(conn, doc, None, config))
    }

    fn with(conn: C, doc: Document, key: Option<String>, config: RulesConfig) -> Rules<C> {
        Rules {
            conn,
            current: RwLock::new(Arc::new(doc)),
            key,
            refused: Mutex::new(None),
            missing: AtomicBool::new(false),
            selector: Selector::new(config.backend),
            config,
            metrics: Metrics::new(),
            stats: RulesStats::default(),
        }
    }

    /// The document stored in the hash `key` (`rl:rules`), or an error saying why there is
    /// none (absent, invalid, Redis unreachable). Follow it with [`Rules::follow`].
    pub async fn from_redis(conn: C, key: &str, config: RulesConfig) -> Result<Rules<C>, Error> {
        let (version, text, at) = fetch(&conn, key, config.timeout, &Metrics::new()).await?;
        let (Some(version), Some(text)) = (version, text) else {
            return Err(Error::Config(
                "the rules key holds no document (apply one first)",
            ));
        };
        let mut doc = Document::parse(&text).map_err(|_| {
            Error::Config("the stored rules document does not validate (rules check)")
        })?;
        doc.version = Some(version);
        doc.updated_at = at;
        Ok(Rules::with(conn, doc, Some(key.to_string()), config))
    }

    /// The document in force.
    pub fn document(&self) -> Arc<Document> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Polls the stored version once; a new valid document is put in force (`Ok(true)`),
    /// an invalid one refused and counted (the current one kept).
    pub async fn refresh(&self) -> Result<bool, Error> {
        let Some(key) = &self.key else {
            return Ok(false);
        };
        let mut cmd = redis::cmd("HGET");
        cmd.arg(key).arg("version");
        let v = match call(&self.conn, &cmd, self.config.timeout, &self.metrics).await {
            Ok(v) => v,
            Err(e) => {
                self.stats.poll_errors.fetch_add(1, Relaxed);
                return Err(e);
            }
        };
        let Some(v) = bulk_text(&v).and_then(|s| s.parse::<u64>().ok()) else {
            // The key gone (a restart without persistence): counted once per absence.
            if !self.missing.swap(true, Relaxed) {
                self.stats.poll_errors.fetch_add(1, Relaxed);
                tracing::error!(target: "rl_client::rules", key = %key, keeping = ?current_version(self), "the rules key holds no document");
            }
            return Ok(false);
        };
        self.missing.store(false, Relaxed);
        let current = self.document().version;
        let refused = *self.refused.lock().unwrap_or_else(|e| e.into_inner());
        if Some(v) == current || Some(v) == refused {
            return Ok(false);
        }
        let (version, text, at) =
            match fetch(&self.conn, key, self.config.timeout, &self.metrics).await {
                Ok(x) => x,
                Err(e) => {
                    self.stats.poll_errors.fetch_add(1, Relaxed);
                    return Err(e);
                }
            };
        let (Some(version), Some(text)) = (version, text) else {
            return Ok(false);
        };
        match Document::parse(&text) {
            Ok(mut doc) => {
                doc.version = Some(version);
                doc.updated_at = at;
                *self.current.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(doc);
                *self.refused.lock().unwrap_or_else(|e| e.into_inner()) = None;
                self.stats.reloads.fetch_add(1, Relaxed);
                tracing::info!(target: "rl_client::rules", version, previous = ?current, "rules version in force");
                Ok(true)
            }
            Err(e) => {
                *self.refused.lock().unwrap_or_else(|e| e.into_inner()) = Some(version);
                self.stats.refused_documents.fetch_add(1, Relaxed);
                tracing::error!(target: "rl_client::rules", version, keeping = ?current, error = %e, "refused a stored rules document");
                Ok(false)
            }
        }
    }

    /// Polls every `every` on a task of its own while `rules` lives.
    pub fn follow(rules: &Arc<Rules<C>>, every: Duration) -> tokio::task::JoinHandle<()> {
        let weak: Weak<Rules<C>> = Arc::downgrade(rules);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let Some(rules) = weak.upgrade() else { return };
                let _ = rules.refresh().await; // counted; the current document stays
            }
        })
    }

    /// The decision log: every refusal and shadow refusal, a sample of grants, one
    /// `tracing` event each (target `rl_client::rules::decisions`).
    fn log(&self, d: &RuleDecision, doc: &Document, attrs: &HashMap<String, String>) {
        let sampled =
            self.config.log_grants > 0.0 && crate::jitter::unit() < self.config.log_grants;
        if d.allowed && d.shadow_denied.is_empty() && !sampled {
            return;
        }
        let attr = |k: &str| attrs.get(k).map(String::as_str).unwrap_or("");
        tracing::info!(
            target: "rl_client::rules::decisions",
            decision = if d.allowed { "granted" } else { "denied" },
            layer = d.layer.as_deref().unwrap_or(""),
            code = d.code.as_deref().unwrap_or(""),
            key = d.key.as_deref().unwrap_or(""),
            remaining = d.remaining,
            retry_after_ms = d.retry_after.as_millis() as u64,
            version = doc.version.unwrap_or(0),
            shadow_denied = ?d.shadow_denied,
            ip = attr("ip"),
            user = attr("user"),
            tier = attr("tier"),
            path = attr("path"),
            "rate limit decision"
        );
    }

    fn count(&self, layer: &str, outcome: &'static str) {
        let mut d = self
            .stats
            .decisions
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        *d.entry((layer.to_string(), outcome)).or_insert(0) += 1;
    }

    /// Takes a token from every layer that applies to `attrs`, or from none.
    pub async fn check(&self, attrs: &HashMap<String, String>) -> Result<RuleDecision, Error> {
        self.check_cost(attrs, 1).await
    }

    /// Takes `cost` tokens from every layer that applies to `attrs`, or from none. A cost
    /// of 0, or above the cap of a layer that applies, is [`Error::Request`] (before any
    /// call). Redis failing is the failure policy's decision ([`RulesConfig::fail_open`]),
    /// never an error; a malformed reply is [`Error::Reply`] (what was taken given back).
    pub async fn check_cost(
        &self,
        attrs: &HashMap<String, String>,
        cost: u64,
    ) -> Result<RuleDecision, Error> {
        let doc = self.document();
        let applied = doc.plan(attrs);
        let options = CheckOptions {
            cost,
            fail_open: self.config.fail_open,
            cluster: self.config.cluster,
        };
        let mut check = Check::new(&applied, options).map_err(|_| {
            Error::Request("the cost is 0 or above the cap of a layer that applies")
        })?;
        // No call is due when no enforced or shadow layer applies: no backend to ask for.
        let backend = match check.decision() {
            Some(_) => Ok(Backend::Module),
            None => self.selector.get(&self.conn, self.config.timeout).await,
        };
        match backend {
            Ok(b) => {
                let (conn, timeout, metrics) = (&self.conn, self.config.timeout, &self.metrics);
                let malformed = drive(&mut check, core_backend(b), |c| async move {
                    call(conn, &c, timeout, metrics).await
                })
                .await;
                if let Some(e) = malformed {
                    return Err(e);
                }
            }
            Err(e) => {
                tracing::warn!(target: "rl_client::rules", error = %e, "no backend to check with");
                while check.decision().is_none() {
                    check.failed();
                }
            }
        }
        let Some(d) = check.decision().cloned().map(RuleDecision::from_core) else {
            return Err(Error::Reply("RL.MTAKE: a check left undecided".into()));
        };
        if d.fallback {
            let counter = if d.allowed {
                &self.stats.fail_open
            } else {
                &self.stats.fail_closed
            };
            counter.fetch_add(1, Relaxed);
        } else {
            self.count(
                d.layer.as_deref().unwrap_or("_none"),
                if d.allowed { "granted" } else { "denied" },
            );
            for s in &d.shadow_denied {
                self.count(s, "shadow_denied");
            }
        }
        self.log(&d, &doc, attrs);
        Ok(d)
    }
}

/// Sends a check's calls one at a time and feeds back what came, then its refunds (best
/// effort: a refund lost to an outage costs its tokens until they refill). The error of a
/// malformed reply that left the check without a decision, if one did.
async fn drive<F, Fut>(check: &mut Check, backend: CoreBackend, mut send: F) -> Option<Error>
where
    F: FnMut(redis::Cmd) -> Fut,
    Fut: std::future::Future<Output = Result<Value, Error>>,
{
    let mut malformed = None;
    while let Some(args) = check.command(backend) {
        match send(cmd(&args)).await {
            Ok(v) => {
                if let Err(e) = check.reply(&to_reply(v)) {
                    tracing::warn!(target: "rl_client::rules", error = %e, "a malformed reply");
                    malformed = Some(Error::Reply(e.0));
                }
            }
            Err(Error::Server(e)) => {
                let _ = check.reply(&rl_client_core::Reply::Error(e));
            }
            Err(e) => {
                tracing::warn!(target: "rl_client::rules", error = %e, "Redis failed");
                check.failed();
            }
        }
    }
    for args in check.refunds(backend) {
        let _ = send(cmd(&args)).await;
    }
    malformed.filter(|_| check.decision().is_none())
}

fn core_backend(b: Backend) -> CoreBackend {
    match b {
        Backend::Functions => CoreBackend::Functions,
        _ => CoreBackend::Module,
    }
}

fn cmd(args: &[Vec<u8>]) -> redis::Cmd {
    let mut c = redis::cmd(std::str::from_utf8(&args[0]).unwrap_or("RL.MTAKE"));
    for a in &args[1..] {
        c.arg(a.as_slice());
    }
    c
}

fn current_version<C: RedisConnection>(rules: &Rules<C>) -> Option<u64> {
    rules.document().version
}

async fn fetch<C: RedisConnection>(
    conn: &C,
    key: &str,
    timeout: Duration,
    metrics: &Metrics,
) -> Result<(Option<u64>, Option<String>, Option<f64>), Error> {
    let mut cmd = redis::cmd("HMGET");
    cmd.arg(key)
        .arg("version")
        .arg("document")
        .arg("updated_at");
    let v = call(conn, &cmd, timeout, metrics).await?;
    let Value::Array(items) = v else {
        return Err(Error::Reply("HMGET: expected an array".into()));
    };
    let text = |i: usize| items.get(i).and_then(bulk_text);
    Ok((
        text(0).and_then(|s| s.parse().ok()),
        text(1),
        text(2)
            .and_then(|s| s.parse::<f64>().ok())
            .map(|ms| ms / 1000.0),
    ))
}

/// Stores `text` (validated first) as the next version under `key`; returns the version.
pub async fn apply_document<C: RedisConnection>(
    conn: &C,
    key: &str,
    text: &str,
) -> Result<u64, Error> {
    Document::parse(text).map_err(|_| Error::Config("the rules document does not validate"))?;
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    let mut pipe = redis::pipe();
    pipe.atomic()
        .cmd("HINCRBY")
        .arg(key)
        .arg("version")
        .arg(1)
        .cmd("HSET")
        .arg(key)
        .arg("document")
        .arg(text)
        .arg("updated_at")
        .arg(now_ms)
        .ignore();
    let mut c = conn.clone();
    let (version,): (u64,) = pipe.query_async(&mut c).await.map_err(Error::from_redis)?;
    Ok(version)
}

#[cfg(test)]
mod tests {
    //! protocol/rules_cases.json's checks through this shell: its commands as redis-rs
    //! packs them, its replies as redis-rs hands them over, its loop.
    use super::*;
    use serde_json::Value as J;
    use std::collections::VecDeque;

    fn value(j: &J) -> Value {
        match j {
            J::Null => Value::Nil,
            J::Number(n) => Value::Int(n.as_i64().unwrap()),
            J::String(s) => Value::BulkString(s.clone().into_bytes()),
            J::Array(xs) => Value::Array(xs.iter().map(value).collect()),
            other => panic!("no {other} in rules replies"),
        }
    }

    fn packed(c: &redis::Cmd) -> Vec<String> {
        c.args_iter()
            .map(|a| match a {
                redis::Arg::Simple(b) => String::from_utf8(b.to_vec()).unwrap(),
                redis::Arg::Cursor => panic!("no cursor"),
            })
            .collect()
    }

    fn strings(j: &J) -> Vec<String> {
        j.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_str().unwrap().to_string())
            .collect()
    }

    #[test]
    fn golden_checks_through_the_shell() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../protocol/rules_cases.json");
        let cases: J = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        for case in cases["checks"].as_array().unwrap() {
            let about = case["about"].as_str().unwrap();
            let d = &cases["documents"][case["document"].as_str().unwrap()];
            let text = match d["file"].as_str() {
                Some(f) => {
                    std::fs::read_to_string(format!("{}/../{f}", env!("CARGO_MANIFEST_DIR")))
                        .unwrap()
                }
                None => d["text"].as_str().unwrap().to_string(),
            };
            let doc = Document::parse(&text).unwrap();
            let attrs: HashMap<String, String> = case["attributes"]
                .as_object()
                .unwrap()
                .iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_string()))
                .collect();
            let options = CheckOptions {
                cost: case["cost"].as_u64().unwrap_or(1),
                fail_open: case["fail_open"].as_bool().unwrap_or(true),
                cluster: case["cluster"].as_bool().unwrap_or(false),
            };
            let backend = match case["backend"].as_str() {
                Some("functions") => CoreBackend::Functions,
                _ => CoreBackend::Module,
            };
            let applied = doc.plan(&attrs);
            let mut check = match Check::new(&applied, options) {
                Ok(c) => c,
                Err(e) => {
                    assert_eq!(Some(e.0.as_str()), case["cost_error"].as_str(), "{about}");
                    continue;
                }
            };
            let mut events: VecDeque<J> = case["events"].as_array().unwrap().clone().into();
            let mut refunds = Vec::new();
            let malformed = rt.block_on(drive(&mut check, backend, |c| {
                let got = packed(&c);
                let answer = match events.pop_front() {
                    None => {
                        refunds.push(got);
                        Ok(Value::Int(1))
                    }
                    Some(e) => {
                        assert_eq!(got, strings(&e["send"]), "{about}");
                        if let Some(r) = e.get("reply") {
                            Ok(value(r))
                        } else if let Some(t) = e["error_reply"].as_str() {
                            Err(Error::Server(t.into()))
                        } else {
                            Err(Error::Timeout(Duration::from_millis(200)))
                        }
                    }
                };
                async move { answer }
            }));
            assert!(events.is_empty(), "{about}: calls not made");
            let want: Vec<Vec<String>> = case["refunds"]
                .as_array()
                .unwrap()
                .iter()
                .map(strings)
                .collect();
            assert_eq!(refunds, want, "{about}");
            let want = &case["decision"];
            assert_eq!(malformed.is_some(), want.is_null(), "{about}");
            let Some(d) = check.decision().cloned().map(RuleDecision::from_core) else {
                continue;
            };
            assert_eq!(d.allowed, want["granted"].as_bool().unwrap(), "{about}");
            assert_eq!(d.layer.as_deref(), want["layer"].as_str(), "{about}");
            assert_eq!(d.key.as_deref(), want["key"].as_str(), "{about}");
            assert_eq!(d.remaining, want["remaining"].as_f64().unwrap(), "{about}");
            assert_eq!(
                d.retry_after.as_millis() as u64,
                want["retry_after_ms"].as_u64().unwrap(),
                "{about}"
            );
            assert_eq!(d.fallback, want["fallback"].as_bool().unwrap(), "{about}");
            assert_eq!(d.shadow_denied, strings(&want["shadow_denied"]), "{about}");
        }
    }
}
