//! A rules document: parsing and validation (naming the line and field of every problem),
//! and the pure plan of one request (document + attributes -> the layers that apply, their
//! keys and limits). Both clients' `Rules` take their plans from here; [`crate::rules`]
//! turns a plan into `RL.MTAKE` calls and a decision. The format (docs/rules.md):
//!
//! ```yaml
//! prefix: "rl:rules:"          # optional
//! attributes: [org]            # optional: attributes beyond ip, path, method, host, user, tier, api_key
//! layers:
//!   - name: global_ip          # [A-Za-z0-9_.-]{1,64}, unique
//!     match: {path: "/v1/*"}   # attribute -> glob (or list of globs), all must match
//!     key: "ip:{ip}"           # {attribute} placeholders
//!     limit: "5000/minute"     # a limit string (crate::limits)
//!     code: ip_rate_limit      # optional: what a 429 says
//!     shadow: false            # optional: decide and count, never refuse
//! ```
//!
//! Layers with the same `key` template form a group: the first of them that matches
//! applies. Layers with different templates all apply. A layer whose key names an attribute
//! the request lacks (or has empty) does not apply. A shadow layer never claims its group.

use std::collections::{HashMap, HashSet};

use rl_core::Limit;

use crate::limits::{parse_limits, LimitSpec};
use crate::rules_yaml::{self, Node, Value};

/// Attributes the middleware fills and the usual app-given ones.
pub const BUILTIN_ATTRIBUTES: [&str; 7] =
    ["ip", "path", "method", "host", "user", "tier", "api_key"];
/// Every bucket key starts with this unless the document says otherwise.
pub const DEFAULT_PREFIX: &str = "rl:rules:";
/// What a refusal says unless its layer has a `code`.
pub const DEFAULT_CODE: &str = "rate_limit_exceeded";
/// Buckets in one document at most (every layer matching at once fits one `RL.MTAKE`).
pub const MAX_BUCKETS: usize = 64;
/// Bytes in one document at most.
pub const MAX_TEXT: usize = 1 << 20;
const LAYER_FIELDS: [&str; 6] = ["name", "match", "key", "limit", "code", "shadow"];
const TOP_FIELDS: [&str; 3] = ["prefix", "attributes", "layers"];

/// One problem of a document: where (line and field) and what is wrong.
#[derive(Debug, Clone, PartialEq)]
pub struct Problem {
    /// The line (from 1) of the field, or of the nearest enclosing one; `None` when the
    /// text has no lines to name (JSON, a document too long to read).
    pub line: Option<u32>,
    /// Where: `layers[2].limit`, `prefix`, `(document)`.
    pub field: String,
    /// What is wrong, and how to write it.
    pub message: String,
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if let Some(line) = self.line {
            write!(f, "line {line}: ")?;
        }
        write!(f, "{}: {}", self.field, self.message)
    }
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
            write!(f, " {p};")?;
        }
        Ok(())
    }
}

impl std::error::Error for RulesError {}

/// `*` any run of characters (`/` included), `?` one character, the rest literal. Matching
/// takes time linear in the text times the pattern at worst: a backtracking matcher would
/// take exponential time on `*a*a*a*b` against a long attacker-chosen path.
#[derive(Debug, Clone)]
pub struct Glob {
    pattern: Vec<char>,
    /// No wildcard: the text must equal it.
    literal: Option<String>,
    /// `prefix*` with no other wildcard: the common case, a `starts_with`.
    prefix: Option<String>,
}

impl Glob {
    pub fn new(pattern: &str) -> Glob {
        let wild = |s: &str| s.contains(['*', '?']);
        let prefix = pattern
            .strip_suffix('*')
            .filter(|body| !wild(body))
            .map(str::to_owned);
        Glob {
            pattern: pattern.chars().collect(),
            literal: (!wild(pattern)).then(|| pattern.to_owned()),
            prefix,
        }
    }

    /// Whether `text` matches the whole pattern.
    pub fn matches(&self, text: &str) -> bool {
        if let Some(l) = &self.literal {
            return text == l;
        }
        if let Some(p) = &self.prefix {
            return text.starts_with(p.as_str());
        }
        let t: Vec<char> = text.chars().collect();
        let p = &self.pattern;
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

/// A piece of a key template: text, or the index of an attribute in
/// [`Document::attributes`].
#[derive(Debug, Clone)]
enum Piece {
    Text(String),
    Field(usize),
}

/// One layer of a document.
#[derive(Debug, Clone)]
pub struct Layer {
    /// Its name: the metric label and the deciding layer of a refusal.
    pub name: String,
    /// `(attribute index, globs)`: every attribute must match one of its globs.
    matches: Vec<(usize, Vec<Glob>)>,
    template: Vec<Piece>,
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
    /// The line (from 1) the layer starts on, when the text has lines.
    pub line: Option<u32>,
    /// Each limit's rate and cap as a command sends them, formatted once (formatting
    /// floats is most of what building a check's command costs).
    pub(crate) numbers: Vec<(Vec<u8>, Vec<u8>)>,
}

impl Layer {
    fn applies(&self, values: &[Option<&str>]) -> bool {
        self.matches.iter().all(|(attr, globs)| {
            values
                .get(*attr)
                .copied()
                .flatten()
                .is_some_and(|v| globs.iter().any(|g| g.matches(v)))
        })
    }

    fn render(&self, values: &[Option<&str>]) -> Option<String> {
        let mut out = String::with_capacity(self.key.len() + 16);
        for piece in &self.template {
            match piece {
                Piece::Text(t) => out.push_str(t),
                Piece::Field(f) => match values.get(*f).copied().flatten() {
                    Some(v) if !v.is_empty() => out.push_str(v),
                    _ => return None,
                },
            }
        }
        Some(out)
    }
}

/// `{name}` placeholders (no braces inside) and the text between; `Err` on a brace
/// outside a placeholder.
fn split_template(t: &str) -> Result<Vec<(bool, &str)>, ()> {
    let mut out = Vec::new();
    let mut rest = t;
    while !rest.is_empty() {
        match rest.find(['{', '}']) {
            None => {
                out.push((false, rest));
                break;
            }
            Some(i) => {
                if i > 0 {
                    out.push((false, &rest[..i]));
                }
                let after = &rest[i..];
                if after.starts_with('}') {
                    return Err(());
                }
                match after[1..].find(['{', '}']) {
                    Some(j) if after.as_bytes()[1 + j] == b'}' => {
                        out.push((true, &after[1..1 + j]));
                        rest = &after[j + 2..];
                    }
                    _ => return Err(()),
                }
            }
        }
    }
    Ok(out)
}

/// A parsed, valid document.
#[derive(Debug, Clone)]
pub struct Document {
    /// Every bucket key starts with it.
    pub prefix: String,
    /// The layers, in order.
    pub layers: Vec<Layer>,
    /// The known attributes (built-in and declared); a plan reads them in this order.
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
    /// Its rendered key with the prefix and the layer's hash tag (the buckets' common
    /// start).
    pub base: String,
    /// One bucket per limit of the layer.
    pub buckets: Vec<BucketKey>,
}

/// Collects problems; a problem's line is its node's, else the enclosing one's.
struct Problems(Vec<Problem>);

impl Problems {
    fn bad(&mut self, line: Option<u32>, field: impl Into<String>, message: impl Into<String>) {
        self.0.push(Problem {
            line,
            field: field.into(),
            message: message.into(),
        });
    }

    /// The pairs of a mapping, with every key given twice named.
    fn pairs<'n>(&mut self, node: &'n Node, at: &str) -> Option<&'n [(Node, Node)]> {
        let Value::Map(pairs) = &*node.value else {
            return None;
        };
        let mut seen = HashSet::new();
        for (k, _) in pairs {
            let name = k.key_name();
            if !seen.insert(name.clone()) {
                self.bad(k.line, join(at, &name), "given twice");
            }
        }
        Some(pairs)
    }
}

fn join(at: &str, name: &str) -> String {
    if at.is_empty() {
        name.to_string()
    } else {
        format!("{at}.{name}")
    }
}

/// A field of a mapping: its key's line and its value.
fn field<'n>(pairs: &'n [(Node, Node)], name: &str) -> Option<(Option<u32>, &'n Node)> {
    pairs
        .iter()
        .find(|(k, _)| k.as_str() == Some(name))
        .map(|(k, v)| (k.line, v))
}

impl Document {
    /// Parses and validates a document (YAML; JSON is YAML, and JSON that YAML refuses is
    /// read as JSON), naming every problem with its line.
    pub fn parse(text: &str) -> Result<Document, RulesError> {
        let mut p = Problems(Vec::new());
        if text.len() > MAX_TEXT {
            p.bad(None, "(document)", format!("longer than {MAX_TEXT} bytes"));
            return Err(RulesError { problems: p.0 });
        }
        let root = match rules_yaml::read(text) {
            Ok(n) => n,
            Err(e) => {
                p.bad(e.line, "(document)", e.message);
                return Err(RulesError { problems: p.0 });
            }
        };
        let Some(map) = p.pairs(&root, "") else {
            p.bad(
                root.line,
                "layers",
                "a document is a mapping with a non-empty 'layers' list",
            );
            return Err(RulesError { problems: p.0 });
        };
        for (k, _) in map {
            let name = k.key_name();
            if !TOP_FIELDS.contains(&name.as_str()) {
                let known = TOP_FIELDS.join(", ");
                p.bad(
                    k.line,
                    name,
                    format!("unknown field (a document has {known})"),
                );
            }
        }
        let mut prefix = DEFAULT_PREFIX.to_string();
        if let Some((line, v)) = field(map, "prefix") {
            match v.as_str() {
                Some(s) if !s.contains(['{', '}']) && s.chars().count() <= 100 => prefix = s.into(),
                _ => p.bad(
                    line,
                    "prefix",
                    "a string of at most 100 characters without '{' or '}'",
                ),
            }
        }
        let mut attributes: Vec<String> =
            BUILTIN_ATTRIBUTES.iter().map(|s| s.to_string()).collect();
        match field(map, "attributes") {
            None => {}
            Some((_, v)) if matches!(&*v.value, Value::Seq(_)) => {
                let Value::Seq(xs) = &*v.value else {
                    unreachable!()
                };
                for (i, a) in xs.iter().enumerate() {
                    match a.as_str() {
                        Some(s) if is_attr(s) => {
                            if !attributes.iter().any(|x| x == s) {
                                attributes.push(s.into());
                            }
                        }
                        _ => p.bad(
                            a.line,
                            format!("attributes[{i}]"),
                            "an attribute name is a letter or _ then letters, digits, _",
                        ),
                    }
                }
            }
            Some((line, _)) => p.bad(line, "attributes", "a list of attribute names"),
        }
        let raw_layers = match field(map, "layers") {
            Some((_, v)) => match &*v.value {
                Value::Seq(xs) if !xs.is_empty() => xs,
                _ => {
                    p.bad(v.line, "layers", NON_EMPTY);
                    return Err(RulesError { problems: p.0 });
                }
            },
            None => {
                p.bad(root.line, "layers", NON_EMPTY);
                return Err(RulesError { problems: p.0 });
            }
        };
        let mut layers = Vec::new();
        let mut names: HashMap<String, usize> = HashMap::new();
        let mut buckets = 0;
        for (i, raw) in raw_layers.iter().enumerate() {
            let Some(layer) = parse_layer(raw, i, &attributes, &mut p) else {
                continue;
            };
            if let Some(first) = names.get(&layer.name) {
                let line = raw.get("name").and_then(|n| n.line).or(raw.line);
                p.bad(
                    line,
                    format!("layers[{i}].name"),
                    format!("'{}' is layer {first}'s name too", layer.name),
                );
            }
            names.entry(layer.name.clone()).or_insert(i);
            buckets += layer.limits.len();
            layers.push(layer);
        }
        if buckets > MAX_BUCKETS {
            p.bad(
                None,
                "layers",
                format!("{buckets} buckets in all; at most {MAX_BUCKETS} (one RL.MTAKE)"),
            );
        }
        if !p.0.is_empty() {
            p.0.sort_by_key(|x| x.line.unwrap_or(u32::MAX));
            return Err(RulesError { problems: p.0 });
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
        let values: Vec<Option<&str>> = self
            .attributes
            .iter()
            .map(|a| attrs.get(a).map(String::as_str))
            .collect();
        self.plan_values(&values)
    }

    /// Which of [`Document::attributes`] some layer reads (matches on or puts in its key):
    /// a shell need not look the others up.
    pub fn used_attributes(&self) -> Vec<bool> {
        let mut used = vec![false; self.attributes.len()];
        for layer in &self.layers {
            for (a, _) in &layer.matches {
                used[*a] = true;
            }
            for piece in &layer.template {
                if let Piece::Field(a) = piece {
                    used[*a] = true;
                }
            }
        }
        used
    }

    /// As [`Document::plan`], the request's attributes given in the order of
    /// [`Document::attributes`] (`None`: absent): a shell reads only those.
    pub fn plan_values(&self, values: &[Option<&str>]) -> Vec<Applied<'_>> {
        let mut out = Vec::new();
        let mut claimed: HashSet<&str> = HashSet::new();
        for layer in &self.layers {
            if claimed.contains(layer.key.as_str()) || !layer.applies(values) {
                continue;
            }
            let Some(rendered) = layer.render(values) else {
                continue;
            };
            if !layer.shadow {
                claimed.insert(layer.key.as_str());
            }
            // A hash tag per layer: its limits' buckets share a slot (one RL.MTAKE in a
            // cluster).
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
            out.push(Applied {
                layer,
                base,
                buckets,
            });
        }
        out
    }
}

const NON_EMPTY: &str = "a non-empty list of layers (to stop refusing, mark layers shadow: true)";

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

fn parse_layer(raw: &Node, i: usize, attributes: &[String], p: &mut Problems) -> Option<Layer> {
    let here = format!("layers[{i}]");
    let at = |f: &str| format!("layers[{i}].{f}");
    let Some(map) = p.pairs(raw, &here) else {
        p.bad(
            raw.line,
            here,
            "a layer is a mapping with name, key and limit",
        );
        return None;
    };
    let mut ok = true;
    for (k, _) in map {
        let name = k.key_name();
        if !LAYER_FIELDS.contains(&name.as_str()) {
            let known = LAYER_FIELDS.join(", ");
            p.bad(
                k.line,
                at(&name),
                format!("unknown field (a layer has {known})"),
            );
            ok = false;
        }
    }
    // Where a field is, or where the layer is when the field is missing.
    let line_of = |f: &str| field(map, f).map_or(raw.line, |(l, _)| l);
    let name = field(map, "name")
        .and_then(|(_, v)| v.as_str())
        .filter(|s| is_name(s));
    if name.is_none() {
        p.bad(
            line_of("name"),
            at("name"),
            "required: 1 to 64 of A-Z a-z 0-9 _ . -",
        );
        ok = false;
    }
    let key = field(map, "key")
        .and_then(|(_, v)| v.as_str())
        .filter(|s| !s.is_empty());
    let mut template = Vec::new();
    match key {
        None => {
            p.bad(
                line_of("key"),
                at("key"),
                "required: a key template such as 'user:{user}'",
            );
            ok = false;
        }
        Some(k) => match split_template(k) {
            Err(()) => {
                p.bad(
                    line_of("key"),
                    at("key"),
                    "'{' and '}' only around a placeholder ({ip})",
                );
                ok = false;
            }
            Ok(pieces) => {
                for (is_field, text) in pieces {
                    if !is_field {
                        template.push(Piece::Text(text.to_string()));
                    } else if let Some(a) = attributes.iter().position(|a| a == text) {
                        template.push(Piece::Field(a));
                    } else {
                        p.bad(
                            line_of("key"),
                            at("key"),
                            format!(
                                "unknown placeholder {{{text}}}: known are {} (declare others under 'attributes:')",
                                attributes.join(", ")
                            ),
                        );
                        ok = false;
                    }
                }
            }
        },
    }
    let limit = field(map, "limit").and_then(|(_, v)| v.as_str());
    let mut limits = Vec::new();
    match limit {
        None => {
            p.bad(
                line_of("limit"),
                at("limit"),
                "required: a limit string such as '1000/minute'",
            );
            ok = false;
        }
        Some(l) => match parse_limits(l) {
            Ok(xs) => limits = xs,
            Err(e) => {
                p.bad(line_of("limit"), at("limit"), e.0);
                ok = false;
            }
        },
    }
    let code = match field(map, "code") {
        None => Some(DEFAULT_CODE),
        Some((_, c)) => c.as_str().filter(|s| is_name(s)),
    };
    if code.is_none() {
        p.bad(line_of("code"), at("code"), "1 to 64 of A-Z a-z 0-9 _ . -");
        ok = false;
    }
    let shadow = match field(map, "shadow") {
        None => Some(false),
        Some((_, v)) => match &*v.value {
            Value::Bool(b) => Some(*b),
            _ => None,
        },
    };
    if shadow.is_none() {
        p.bad(line_of("shadow"), at("shadow"), "true or false");
        ok = false;
    }
    let mut matches = Vec::new();
    if let Some((line, m)) = field(map, "match") {
        match &*m.value {
            Value::Null => {}
            Value::Map(_) => {
                for (attr, globs) in p.pairs(m, &at("match")).unwrap_or_default() {
                    let name = attr.key_name();
                    let where_ = format!("layers[{i}].match.{name}");
                    let Some(index) = attributes.iter().position(|a| *a == name) else {
                        p.bad(
                            attr.line,
                            where_,
                            format!("unknown attribute: known are {}", attributes.join(", ")),
                        );
                        ok = false;
                        continue;
                    };
                    let items: Vec<&Node> = match &*globs.value {
                        Value::Seq(xs) => xs.iter().collect(),
                        _ => vec![globs],
                    };
                    let texts: Option<Vec<&str>> = items
                        .iter()
                        .map(|g| match &*g.value {
                            Value::Str(s) | Value::Number(s) => Some(s.as_str()),
                            _ => None,
                        })
                        .collect();
                    match texts {
                        Some(ts) if !ts.is_empty() => {
                            matches.push((index, ts.into_iter().map(Glob::new).collect()))
                        }
                        _ => {
                            p.bad(
                                attr.line,
                                where_,
                                "a glob string or a non-empty list of them",
                            );
                            ok = false;
                        }
                    }
                }
            }
            _ => {
                p.bad(
                    line,
                    at("match"),
                    "a mapping of attribute: glob (or a list of globs)",
                );
                ok = false;
            }
        }
    }
    if !ok {
        return None;
    }
    Some(Layer {
        name: name?.to_string(),
        matches,
        template,
        key: key?.to_string(),
        limit: limit?.to_string(),
        code: code?.to_string(),
        shadow: shadow?,
        line: raw.line,
        numbers: limits
            .iter()
            .map(|l| (crate::rules::number(l.rate()), crate::rules::number(l.cap)))
            .collect(),
        limits,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn problems_name_their_lines() {
        let text = "layers:\n  - name: a\n    key: \"u:{usr}\"\n    limit: 5/ms\n    bogus: 1\n  - name: b\n    key: x\n    limit: \"5/minute\"\n    shadow: maybe\n    match: {verb: GET}\n";
        let e = Document::parse(text).unwrap_err();
        let got: Vec<(Option<u32>, &str)> = e
            .problems
            .iter()
            .map(|p| (p.line, p.field.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                (Some(3), "layers[0].key"),
                (Some(4), "layers[0].limit"),
                (Some(5), "layers[0].bogus"),
                (Some(9), "layers[1].shadow"),
                (Some(10), "layers[1].match.verb"),
            ]
        );
        let twice =
            Document::parse("layers:\n  - name: a\n    name: b\n    key: k\n    limit: 1/s\n")
                .unwrap_err();
        assert!(twice.problems.iter().any(|p| p.line == Some(3)
            && p.field == "layers[0].name"
            && p.message == "given twice"));
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
        // A match list aliased many times over is read once per use, not expanded.
        let mut wide = String::from("x: &p ['a*', 'b*']\nlayers:\n");
        for i in 0..60 {
            wide += &format!("  - {{name: l{i}, key: 'k{i}', limit: 1/s, match: {{path: *p}}}}\n");
        }
        assert_eq!(Document::parse(&wide).unwrap_err().problems.len(), 1); // only "x"
    }

    #[test]
    fn globs() {
        let g = Glob::new;
        assert!(g("/v1/search/*").matches("/v1/search/a/b"));
        assert!(g("a?c*").matches("abc") && !g("a?c*").matches("ab"));
        assert!(g("*x*y").matches("axxzy") && !g("*x*y").matches("axyz"));
        assert!(g("").matches("") && !g("").matches("a") && g("*").matches(""));
        let hostile = "a".repeat(20_000);
        assert!(!g("*a*a*a*a*a*a*b").matches(&hostile)); // linear, not backtracking
        assert!(g("*a*a*a*a*a*a*b").matches(&(hostile + "b")));
    }
}
