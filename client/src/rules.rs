//! Layered limits from one document, the twin of the Python client's `redis_rl.rules`
//! (same format, same plans: both run `protocol/rules_cases.json`; docs/rules.md).
//!
//! ```yaml
//! prefix: "rl:rules:"          # optional
//! attributes: [org]            # optional: attributes beyond ip, path, method, host, user, tier, api_key
//! layers:
//!   - name: global_ip          # [A-Za-z0-9_.-]{1,64}, unique
//!     match: {path: "/v1/*"}   # attribute -> glob (or list of globs), all must match
//!     key: "ip:{ip}"           # {attribute} placeholders
//!     limit: "5000/minute"     # a limit string (rl_client::limits)
//!     code: ip_rate_limit      # optional: what a 429 says
//!     shadow: false            # optional: decide and count, never refuse
//! ```
//!
//! Layers with the same `key` template form a group: the first of them that matches
//! applies. Layers with different templates all apply. A layer whose key names an attribute
//! the request lacks (or has empty) does not apply.
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

use redis::{Cmd, Value};

use crate::backend::Selector;
use crate::conn::{call, RedisConnection};
use crate::protocol::{count, number};
use crate::{Backend, Error, Metrics};

pub use crate::rules_doc::{
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
    /// [`RulesStats::fail_open`]); `false` returns the error.
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
    /// Decided without Redis (it failed; `fail_open`).
    pub fallback: bool,
}

impl RuleDecision {
    /// Granted with no layer deciding: none applied, or Redis failed (`fallback`).
    fn no_layer(shadow_denied: Vec<String>, fallback: bool) -> RuleDecision {
        RuleDecision {
            allowed: true,
            layer: None,
            code: None,
            key: None,
            remaining: 0.0,
            limit: 0.0,
            retry_after: Duration::ZERO,
            shadow_denied,
            fallback,
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
        let doc = self.document();
        let applied = doc.plan(attrs);
        match self.take(&applied).await {
            Ok(d) => {
                self.count(
                    d.layer.as_deref().unwrap_or("_none"),
                    if d.allowed { "granted" } else { "denied" },
                );
                for s in &d.shadow_denied {
                    self.count(s, "shadow_denied");
                }
                self.log(&d, &doc, attrs);
                Ok(d)
            }
            Err(e) if self.config.fail_open => {
                self.stats.fail_open.fetch_add(1, Relaxed);
                tracing::warn!(target: "rl_client::rules", error = %e, "Redis failed; letting the request through");
                Ok(RuleDecision::no_layer(Vec::new(), true))
            }
            Err(e) => Err(e),
        }
    }

    async fn take(&self, applied: &[Applied<'_>]) -> Result<RuleDecision, Error> {
        let backend = self.selector.get(&self.conn, self.config.timeout).await?;
        let enforced: Vec<(&Applied<'_>, &BucketKey)> = applied
            .iter()
            .filter(|a| !a.layer.shadow)
            .flat_map(|a| a.buckets.iter().map(move |b| (a, b)))
            .collect();
        let groups = self.groups(&enforced);
        let mut taken: Vec<&[(&Applied<'_>, &BucketKey)]> = Vec::new();
        let mut best: Option<(f64, &Applied<'_>, &BucketKey)> = None;
        for group in &groups {
            let reply = match self.mtake(backend, group).await {
                Ok(r) => r,
                Err(e) => {
                    self.refund(backend, &taken).await;
                    return Err(e);
                }
            };
            if !reply.granted {
                self.refund(backend, &taken).await;
                let i = reply
                    .denied_by
                    .as_deref()
                    .and_then(|k| group.iter().position(|(_, b)| b.key == k))
                    .unwrap_or(0);
                let (a, b) = group[i];
                return Ok(RuleDecision {
                    allowed: false,
                    layer: Some(a.layer.name.clone()),
                    code: Some(a.layer.code.clone()),
                    key: Some(b.key.clone()),
                    remaining: reply.remaining.get(i).copied().unwrap_or(0.0).max(0.0),
                    limit: b.limit.cap(),
                    retry_after: Duration::from_millis(reply.retry_after_ms),
                    shadow_denied: Vec::new(),
                    fallback: false,
                });
            }
            for (i, (a, b)) in group.iter().enumerate() {
                let left = reply.remaining.get(i).copied().unwrap_or(b.limit.cap());
                if best.is_none_or(|(l, _, _)| left < l) {
                    best = Some((left, a, b));
                }
            }
            taken.push(group);
        }
        let mut shadow_denied = Vec::new();
        for a in applied.iter().filter(|a| a.layer.shadow) {
            let group: Vec<(&Applied<'_>, &BucketKey)> = a.buckets.iter().map(|b| (a, b)).collect();
            if !self.mtake(backend, &group).await?.granted {
                shadow_denied.push(a.layer.name.clone());
            }
        }
        Ok(match best {
            None => RuleDecision::no_layer(shadow_denied, false),
            Some((left, a, b)) => RuleDecision {
                allowed: true,
                layer: Some(a.layer.name.clone()),
                code: Some(a.layer.code.clone()),
                key: Some(b.key.clone()),
                remaining: left,
                limit: b.limit.cap(),
                retry_after: Duration::ZERO,
                shadow_denied,
                fallback: false,
            },
        })
    }

    fn groups<'a, 'b>(
        &self,
        buckets: &'b [(&'a Applied<'a>, &'a BucketKey)],
    ) -> Vec<Vec<(&'a Applied<'a>, &'a BucketKey)>> {
        if !self.config.cluster {
            return if buckets.is_empty() {
                Vec::new()
            } else {
                vec![buckets.to_vec()]
            };
        }
        let mut order: Vec<u16> = Vec::new();
        let mut by: HashMap<u16, Vec<(&'a Applied<'a>, &'a BucketKey)>> = HashMap::new();
        for x in buckets {
            let s = slot(x.1.key.as_bytes());
            if !by.contains_key(&s) {
                order.push(s);
            }
            by.entry(s).or_default().push(*x);
        }
        order.into_iter().filter_map(|s| by.remove(&s)).collect()
    }

    async fn mtake(
        &self,
        backend: Backend,
        group: &[(&Applied<'_>, &BucketKey)],
    ) -> Result<MTake, Error> {
        let mut cmd: Cmd;
        if backend == Backend::Functions {
            cmd = redis::cmd("FCALL");
            cmd.arg("rl_mtake").arg(group.len());
            for (_, b) in group {
                cmd.arg(&b.key);
            }
            cmd.arg(1);
            for (_, b) in group {
                cmd.arg(b.limit.rate()).arg(b.limit.cap());
            }
        } else {
            cmd = redis::cmd("RL.MTAKE");
            cmd.arg(1);
            for (_, b) in group {
                cmd.arg(&b.key).arg(b.limit.rate()).arg(b.limit.cap());
            }
        }
        cmd.arg("WITHSTATE");
        let v = call(&self.conn, &cmd, self.config.timeout, &self.metrics).await?;
        parse_mtake(v)
    }

    async fn refund(&self, backend: Backend, taken: &[&[(&Applied<'_>, &BucketKey)]]) {
        for group in taken {
            for (_, b) in group.iter() {
                let cmd = crate::protocol::refund_cmd(backend, &b.key, 1);
                // A refund lost to an outage costs its tokens until they refill.
                let _ = call(&self.conn, &cmd, self.config.timeout, &self.metrics).await;
            }
        }
    }
}

fn current_version<C: RedisConnection>(rules: &Rules<C>) -> Option<u64> {
    rules.document().version
}

struct MTake {
    granted: bool,
    denied_by: Option<String>,
    retry_after_ms: u64,
    remaining: Vec<f64>,
}

fn parse_mtake(v: Value) -> Result<MTake, Error> {
    let Value::Array(items) = v else {
        return Err(Error::Reply(format!(
            "RL.MTAKE WITHSTATE: expected an array, got {v:?}"
        )));
    };
    if items.len() != 4 {
        return Err(Error::Reply(format!(
            "RL.MTAKE WITHSTATE: expected 4 elements, got {items:?}"
        )));
    }
    let remaining = match &items[3] {
        Value::Array(xs) => xs.iter().map(number).collect::<Result<Vec<f64>, Error>>()?,
        _ => Vec::new(),
    };
    Ok(MTake {
        granted: count(&items[0])? > 0,
        denied_by: bulk_text(&items[1]),
        retry_after_ms: count(&items[2])?,
        remaining,
    })
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

/// The cluster hash slot of a key (CRC16/XMODEM of its hash tag, or of the whole key).
fn slot(key: &[u8]) -> u16 {
    let tagged = key
        .iter()
        .position(|&c| c == b'{')
        .and_then(|s| {
            key[s + 1..]
                .iter()
                .position(|&c| c == b'}')
                .filter(|&e| e > 0)
                .map(|e| &key[s + 1..s + 1 + e])
        })
        .unwrap_or(key);
    let mut crc: u16 = 0;
    for &b in tagged {
        crc ^= (b as u16) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16384
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots() {
        assert_eq!(slot(b"foo"), 12182);
        assert_eq!(slot(b"{user1000}.following"), slot(b"{user1000}.followers"));
    }
}
