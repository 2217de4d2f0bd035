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

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redis::{Cmd, Value};
use rl_core::Limit;
use serde_yaml::Value as Yaml;

use crate::backend::Selector;
use crate::conn::{call, RedisConnection};
use crate::limits::{parse_limits, LimitSpec};
use crate::protocol::{count, number};
use crate::{Backend, Error, Metrics};

/// Attributes the middleware fills and the usual app-given ones.
pub const BUILTIN_ATTRIBUTES: [&str; 7] =
    ["ip", "path", "method", "host", "user", "tier", "api_key"];
/// Every bucket key starts with this unless the document says otherwise.
pub const DEFAULT_PREFIX: &str = "rl:rules:";
/// What a refusal says unless its layer has a `code`.
pub const DEFAULT_CODE: &str = "rate_limit_exceeded";
/// Buckets in one document at most (one `RL.MTAKE`).
pub const MAX_BUCKETS: usize = 64;
/// Bytes in one document at most.
pub const MAX_TEXT: usize = 1 << 20;
const LAYER_FIELDS: [&str; 6] = ["name", "match", "key", "limit", "code", "shadow"];
const TOP_FIELDS: [&str; 3] = ["prefix", "attributes", "layers"];

/// One problem of a document: the field (`layers[2].limit`) and what is wrong.
#[derive(Debug, Clone, PartialEq)]
pub struct Problem {
    /// Where: `layers[2].limit`, `prefix`, `(document)`.
    pub field: String,
    /// What is wrong, and how to write it.
    pub message: String,
}

/// A document that does not validate: every problem found.
#[derive(Debug, Clone, PartialEq)]
pub struct RulesError {
    /// The problems, in document order.
    pub problems: Vec<Problem>,
}

impl std::fmt::Display for RulesError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} problem(s):", self.problems.len())?;
        for p in &self.problems {
            write!(f, " {}: {};", p.field, p.message)?;
        }
        Ok(())
    }
}

impl std::error::Error for RulesError {}

/// `*` any run of characters (`/` included), `?` one character, the rest literal.
#[derive(Debug, Clone)]
struct Glob(Vec<char>);

impl Glob {
    fn matches(&self, text: &str) -> bool {
        let t: Vec<char> = text.chars().collect();
        let p = &self.0;
        let (mut i, mut j) = (0usize, 0usize);
        let mut star: Option<(usize, usize)> = None;
        while i < t.len() {
            if j < p.len() && (p[j] == '?' || (p[j] != '*' && p[j] == t[i])) {
                i += 1;
                j += 1;
            } else if j < p.len() && p[j] == '*' {
                star = Some((j, i));
                j += 1;
            } else if let Some((sj, si)) = star {
                j = sj + 1;
                i = si + 1;
                star = Some((sj, si + 1));
            } else {
                return false;
            }
        }
        p[j..].iter().all(|c| *c == '*')
    }
}

/// One layer of a document.
#[derive(Debug, Clone)]
pub struct Layer {
    /// Its name: the metric label and the deciding layer of a refusal.
    pub name: String,
    matches: Vec<(String, Vec<Glob>)>,
    /// The key template (`user:{user}`).
    pub key: String,
    /// Its limits, each a bucket.
    pub limits: Vec<LimitSpec>,
    /// The limit string as written.
    pub limit: String,
    /// What a refusal by this layer says.
    pub code: String,
    /// Decided and counted, never refusing.
    pub shadow: bool,
}

impl Layer {
    fn applies(&self, attrs: &HashMap<String, String>) -> bool {
        self.matches.iter().all(|(attr, globs)| {
            attrs
                .get(attr)
                .is_some_and(|v| globs.iter().any(|g| g.matches(v)))
        })
    }

    fn render(&self, attrs: &HashMap<String, String>) -> Option<String> {
        let mut out = String::with_capacity(self.key.len() + 16);
        for piece in split_template(&self.key) {
            match piece {
                Piece::Text(t) => out.push_str(t),
                Piece::Field(f) => match attrs.get(f) {
                    Some(v) if !v.is_empty() => out.push_str(v),
                    _ => return None,
                },
                Piece::Stray => return None,
            }
        }
        Some(out)
    }
}

enum Piece<'a> {
    Text(&'a str),
    Field(&'a str),
    Stray,
}

/// `{name}` placeholders (no braces inside) and the text between; a brace outside a
/// placeholder is `Stray`.
fn split_template(t: &str) -> Vec<Piece<'_>> {
    let mut out = Vec::new();
    let mut rest = t;
    while !rest.is_empty() {
        match rest.find(['{', '}']) {
            None => {
                out.push(Piece::Text(rest));
                break;
            }
            Some(i) => {
                if i > 0 {
                    out.push(Piece::Text(&rest[..i]));
                }
                let after = &rest[i..];
                if let Some(tail) = after.strip_prefix('}') {
                    out.push(Piece::Stray);
                    rest = tail;
                    continue;
                }
                match after[1..].find(['{', '}']) {
                    Some(j) if after.as_bytes()[1 + j] == b'}' => {
                        out.push(Piece::Field(&after[1..1 + j]));
                        rest = &after[j + 2..];
                    }
                    _ => {
                        out.push(Piece::Stray);
                        rest = &after[1..];
                    }
                }
            }
        }
    }
    out
}

/// A parsed, valid document.
#[derive(Debug, Clone)]
pub struct Document {
    /// Every bucket key starts with it.
    pub prefix: String,
    /// The layers, in order.
    pub layers: Vec<Layer>,
    /// The known attributes (built-in and declared).
    pub attributes: Vec<String>,
    /// The text it was parsed from.
    pub text: String,
    /// The stored version (`None` for a document given directly).
    pub version: Option<u64>,
    /// When it was applied (Unix seconds), if stored.
    pub updated_at: Option<f64>,
}

/// A bucket of a layer that applies: its key and limit.
#[derive(Debug, Clone, PartialEq)]
pub struct BucketKey {
    /// The Redis key.
    pub key: String,
    /// The bucket's limit.
    pub limit: Limit,
}

/// A layer that applies to a request, with its buckets.
#[derive(Debug, Clone)]
pub struct Applied<'a> {
    /// The layer.
    pub layer: &'a Layer,
    /// One bucket per limit of the layer.
    pub buckets: Vec<BucketKey>,
}

impl Document {
    /// Parses and validates a document (YAML; JSON is YAML), naming every problem.
    pub fn parse(text: &str) -> Result<Document, RulesError> {
        let mut problems = Vec::new();
        let mut bad = |field: String, message: String| problems.push(Problem { field, message });
        if text.len() > MAX_TEXT {
            bad("(document)".into(), format!("longer than {MAX_TEXT} bytes"));
            return Err(RulesError { problems });
        }
        let data: Yaml = match serde_yaml::from_str(text) {
            Ok(v) => v,
            Err(e) => {
                bad("(document)".into(), format!("not YAML or JSON: {e}"));
                return Err(RulesError { problems });
            }
        };
        let Some(map) = data.as_mapping() else {
            bad(
                "layers".into(),
                "a document is a mapping with a non-empty 'layers' list".into(),
            );
            return Err(RulesError { problems });
        };
        for k in map.keys() {
            let name = key_name(k);
            if !TOP_FIELDS.contains(&name.as_str()) {
                bad(
                    name,
                    format!("unknown field (a document has {})", TOP_FIELDS.join(", ")),
                );
            }
        }
        let mut prefix = DEFAULT_PREFIX.to_string();
        if let Some(p) = map.get("prefix") {
            match p.as_str() {
                Some(s) if !s.contains(['{', '}']) && s.chars().count() <= 100 => prefix = s.into(),
                _ => bad(
                    "prefix".into(),
                    "a string of at most 100 characters without '{' or '}'".into(),
                ),
            }
        }
        let mut attributes: Vec<String> =
            BUILTIN_ATTRIBUTES.iter().map(|s| s.to_string()).collect();
        match map.get("attributes") {
            None => {}
            Some(Yaml::Sequence(xs)) => {
                for (i, a) in xs.iter().enumerate() {
                    match a.as_str() {
                        Some(s) if is_attr(s) => attributes.push(s.into()),
                        _ => bad(
                            format!("attributes[{i}]"),
                            "an attribute name is a letter or _ then letters, digits, _".into(),
                        ),
                    }
                }
            }
            Some(_) => bad("attributes".into(), "a list of attribute names".into()),
        }
        let raw_layers = match map.get("layers") {
            Some(Yaml::Sequence(xs)) if !xs.is_empty() => xs,
            _ => {
                bad(
                    "layers".into(),
                    "a non-empty list of layers (to stop refusing, mark layers shadow: true)"
                        .into(),
                );
                return Err(RulesError { problems });
            }
        };
        let mut layers = Vec::new();
        let mut names: HashMap<String, usize> = HashMap::new();
        let mut buckets = 0;
        for (i, raw) in raw_layers.iter().enumerate() {
            let Some(layer) = parse_layer(raw, i, &attributes, &mut bad) else {
                continue;
            };
            if let Some(first) = names.get(&layer.name) {
                bad(
                    format!("layers[{i}].name"),
                    format!("'{}' is layer {first}'s name too", layer.name),
                );
            }
            names.entry(layer.name.clone()).or_insert(i);
            buckets += layer.limits.len();
            layers.push(layer);
        }
        if buckets > MAX_BUCKETS {
            bad(
                "layers".into(),
                format!("{buckets} buckets in all; at most {MAX_BUCKETS} (one RL.MTAKE)"),
            );
        }
        if !problems.is_empty() {
            return Err(RulesError { problems });
        }
        Ok(Document {
            prefix,
            layers,
            attributes,
            text: text.to_string(),
            version: None,
            updated_at: None,
        })
    }

    /// The layers that apply to `attrs`, in document order, with their bucket keys.
    pub fn plan(&self, attrs: &HashMap<String, String>) -> Vec<Applied<'_>> {
        let mut out = Vec::new();
        let mut claimed: HashSet<&str> = HashSet::new();
        for layer in &self.layers {
            if claimed.contains(layer.key.as_str()) || !layer.applies(attrs) {
                continue;
            }
            let Some(rendered) = layer.render(attrs) else {
                continue;
            };
            if !layer.shadow {
                claimed.insert(layer.key.as_str());
            }
            let base = format!("{}{{{}:{}}}", self.prefix, layer.name, rendered);
            let buckets = layer
                .limits
                .iter()
                .filter_map(|l| {
                    Some(BucketKey {
                        key: format!("{base}:{}", l.suffix()),
                        limit: l.limit().ok()?,
                    })
                })
                .collect();
            out.push(Applied { layer, buckets });
        }
        out
    }
}

fn key_name(k: &Yaml) -> String {
    match k {
        Yaml::String(s) => s.clone(),
        other => serde_yaml::to_string(other)
            .map(|s| s.trim().to_string())
            .unwrap_or_default(),
    }
}

fn is_attr(s: &str) -> bool {
    let mut cs = s.chars();
    matches!(cs.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && cs.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && s.len() <= 64
}

fn is_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}

fn parse_layer(
    raw: &Yaml,
    i: usize,
    attributes: &[String],
    bad: &mut impl FnMut(String, String),
) -> Option<Layer> {
    let at = |f: &str| format!("layers[{i}].{f}");
    let Some(map) = raw.as_mapping() else {
        bad(
            format!("layers[{i}]"),
            "a layer is a mapping with name, key and limit".into(),
        );
        return None;
    };
    let mut ok = true;
    for k in map.keys() {
        let name = key_name(k);
        if !LAYER_FIELDS.contains(&name.as_str()) {
            bad(
                at(&name),
                format!("unknown field (a layer has {})", LAYER_FIELDS.join(", ")),
            );
            ok = false;
        }
    }
    let name = map
        .get("name")
        .and_then(Yaml::as_str)
        .filter(|s| is_name(s));
    if name.is_none() {
        bad(at("name"), "required: 1 to 64 of A-Z a-z 0-9 _ . -".into());
        ok = false;
    }
    let key = map
        .get("key")
        .and_then(Yaml::as_str)
        .filter(|s| !s.is_empty());
    match key {
        None => {
            bad(
                at("key"),
                "required: a key template such as 'user:{user}'".into(),
            );
            ok = false;
        }
        Some(k) => {
            for piece in split_template(k) {
                match piece {
                    Piece::Stray => {
                        bad(
                            at("key"),
                            "'{' and '}' only around a placeholder ({ip})".into(),
                        );
                        ok = false;
                        break;
                    }
                    Piece::Field(f) if !attributes.iter().any(|a| a == f) => {
                        bad(
                            at("key"),
                            format!(
                                "unknown placeholder {{{f}}}: known are {} (declare others under 'attributes:')",
                                attributes.join(", ")
                            ),
                        );
                        ok = false;
                    }
                    _ => {}
                }
            }
        }
    }
    let limit = map.get("limit").and_then(Yaml::as_str);
    let mut limits = Vec::new();
    match limit {
        None => {
            bad(
                at("limit"),
                "required: a limit string such as '1000/minute'".into(),
            );
            ok = false;
        }
        Some(l) => match parse_limits(l) {
            Ok(xs) => limits = xs,
            Err(e) => {
                bad(at("limit"), e.0);
                ok = false;
            }
        },
    }
    let code = match map.get("code") {
        None => Some(DEFAULT_CODE),
        Some(c) => c.as_str().filter(|s| is_name(s)),
    };
    if code.is_none() {
        bad(at("code"), "1 to 64 of A-Z a-z 0-9 _ . -".into());
        ok = false;
    }
    let shadow = match map.get("shadow") {
        None => Some(false),
        Some(v) => v.as_bool(),
    };
    if shadow.is_none() {
        bad(at("shadow"), "true or false".into());
        ok = false;
    }
    let mut matches = Vec::new();
    match map.get("match") {
        None | Some(Yaml::Null) => {}
        Some(Yaml::Mapping(m)) => {
            for (attr, globs) in m {
                let attr = key_name(attr);
                let where_ = format!("layers[{i}].match.{attr}");
                if !attributes.contains(&attr) {
                    bad(
                        where_,
                        format!("unknown attribute: known are {}", attributes.join(", ")),
                    );
                    ok = false;
                    continue;
                }
                let items: Vec<&Yaml> = match globs {
                    Yaml::Sequence(xs) => xs.iter().collect(),
                    one => vec![one],
                };
                let texts: Option<Vec<String>> = items
                    .iter()
                    .map(|g| match g {
                        Yaml::String(s) => Some(s.clone()),
                        Yaml::Number(n) => Some(n.to_string()),
                        _ => None,
                    })
                    .collect();
                match texts {
                    Some(ts) if !ts.is_empty() => {
                        matches.push((attr, ts.iter().map(|t| Glob(t.chars().collect())).collect()))
                    }
                    _ => {
                        bad(where_, "a glob string or a non-empty list of them".into());
                        ok = false;
                    }
                }
            }
        }
        Some(_) => {
            bad(
                at("match"),
                "a mapping of attribute: glob (or a list of globs)".into(),
            );
            ok = false;
        }
    }
    if !ok {
        return None;
    }
    Some(Layer {
        name: name?.to_string(),
        matches,
        key: key?.to_string(),
        limits,
        limit: limit?.to_string(),
        code: code?.to_string(),
        shadow: shadow?,
    })
}

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
                Ok(RuleDecision {
                    allowed: true,
                    layer: None,
                    code: None,
                    key: None,
                    remaining: 0.0,
                    limit: 0.0,
                    retry_after: Duration::ZERO,
                    shadow_denied: Vec::new(),
                    fallback: true,
                })
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
            None => RuleDecision {
                allowed: true,
                layer: None,
                code: None,
                key: None,
                remaining: 0.0,
                limit: 0.0,
                retry_after: Duration::ZERO,
                shadow_denied,
                fallback: false,
            },
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

    fn cases() -> serde_json::Value {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../protocol/rules_cases.json");
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
    }

    fn document(cases: &serde_json::Value, name: &str) -> String {
        let d = &cases["documents"][name];
        match d["file"].as_str() {
            Some(f) => {
                std::fs::read_to_string(format!("{}/../{f}", env!("CARGO_MANIFEST_DIR"))).unwrap()
            }
            None => d["text"].as_str().unwrap().to_string(),
        }
    }

    #[test]
    fn golden_plans() {
        let cases = cases();
        for case in cases["plans"].as_array().unwrap() {
            let doc =
                Document::parse(&document(&cases, case["document"].as_str().unwrap())).unwrap();
            let attrs: HashMap<String, String> = case["attributes"]
                .as_object()
                .unwrap()
                .iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_string()))
                .collect();
            let got: Vec<(String, Vec<String>)> = doc
                .plan(&attrs)
                .iter()
                .map(|a| {
                    (
                        a.layer.name.clone(),
                        a.buckets.iter().map(|b| b.key.clone()).collect(),
                    )
                })
                .collect();
            let want: Vec<(String, Vec<String>)> = case["layers"]
                .as_array()
                .unwrap()
                .iter()
                .map(|l| {
                    let keys = l[1]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|k| k.as_str().unwrap().to_string());
                    (l[0].as_str().unwrap().to_string(), keys.collect())
                })
                .collect();
            assert_eq!(got, want, "{case}");
        }
    }

    #[test]
    fn golden_refusals() {
        for case in cases()["refused"].as_array().unwrap() {
            let text = case["text"].as_str().unwrap();
            let e = Document::parse(text).expect_err(text);
            let field = case["field"].as_str().unwrap();
            assert!(e.problems.iter().any(|p| p.field == field), "{text}: {e}");
        }
    }

    #[test]
    fn hostile_documents_are_refused() {
        let mut laughs = String::from("a: &a [x, x, x, x, x, x, x, x, x, x]\n");
        let names = "abcdefghij".as_bytes();
        for w in names.windows(2) {
            let (prev, name) = (w[0] as char, w[1] as char);
            let refs = vec![format!("*{prev}"); 10].join(", ");
            laughs += &format!("{name}: &{name} [{refs}]\n");
        }
        laughs += "layers: [{name: a, key: k, limit: 1/s}]\n";
        assert!(Document::parse(&laughs).is_err());
        let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        assert!(Document::parse(&deep).is_err());
        let long = format!("layers: []\n{}", "#".repeat(1 << 20));
        assert!(Document::parse(&long).unwrap_err().problems[0]
            .message
            .contains("longer"));
    }

    #[test]
    fn globs_and_slots() {
        let g = |p: &str| Glob(p.chars().collect());
        assert!(g("/v1/search/*").matches("/v1/search/a/b"));
        assert!(g("a?c*").matches("abc") && !g("a?c*").matches("ab"));
        assert!(g("*x*y").matches("axxzy") && !g("*x*y").matches("axyz"));
        assert!(g("").matches("") && !g("").matches("a") && g("*").matches(""));
        let hostile = "a".repeat(20_000);
        assert!(!g("*a*a*a*a*a*a*b").matches(&hostile)); // linear, not backtracking
        assert!(g("*a*a*a*a*a*a*b").matches(&(hostile + "b")));
        assert_eq!(slot(b"foo"), 12182);
        assert_eq!(slot(b"{user1000}.following"), slot(b"{user1000}.followers"));
    }
}
