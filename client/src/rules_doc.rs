//! A rules document: parsing and validation (naming the field of every problem), and the
//! pure plan of one request (document + attributes -> the layers that apply, their keys and
//! limits). The twin of the Python client's `redis_rl.rules_doc`; [`crate::rules`] takes
//! the plan. The format is described there and in docs/rules.md.

use std::collections::{HashMap, HashSet};

use rl_core::Limit;
use serde_yaml::Value as Yaml;

use crate::limits::{parse_limits, LimitSpec};

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
    fn globs() {
        let g = |p: &str| Glob(p.chars().collect());
        assert!(g("/v1/search/*").matches("/v1/search/a/b"));
        assert!(g("a?c*").matches("abc") && !g("a?c*").matches("ab"));
        assert!(g("*x*y").matches("axxzy") && !g("*x*y").matches("axyz"));
        assert!(g("").matches("") && !g("").matches("a") && g("*").matches(""));
        let hostile = "a".repeat(20_000);
        assert!(!g("*a*a*a*a*a*a*b").matches(&hostile)); // linear, not backtracking
        assert!(g("*a*a*a*a*a*a*b").matches(&(hostile + "b")));
    }
}
