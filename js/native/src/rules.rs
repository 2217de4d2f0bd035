//! Rules documents and their checks (`Rules` in the TS shell): the client core's
//! [`Document`] (parsed and validated once, planned per request) and [`Check`] (the
//! `RL.MTAKE` calls one check makes, the replies and failures back in, the decision and the
//! refunds). The shell sends the calls through the user's client; what a request gets is
//! decided in the core, as in the Rust and Python clients.

use napi::{Env, JsUnknown};
use napi_derive::napi;

use rl_client_core::budget::Backend;
use rl_client_core::rules::{Check, CheckOptions, RuleDecision};
use rl_client_core::rules_doc::Document;
use rl_client_core::Reply;

use crate::guard::{count, guarded, invalid};
use crate::reply::to_reply;
use crate::strings;

/// One problem of a document that does not validate.
#[napi(object)]
pub struct RulesProblem {
    pub line: Option<u32>,
    pub field: String,
    pub message: String,
}

/// The problems of the document in `text` (none: it is valid).
#[napi]
pub fn rules_problems(text: String) -> napi::Result<Vec<RulesProblem>> {
    guarded(|| {
        Ok(match Document::parse(&text) {
            Ok(_) => Vec::new(),
            Err(e) => e
                .problems
                .into_iter()
                .map(|p| RulesProblem {
                    line: p.line,
                    field: p.field,
                    message: p.message,
                })
                .collect(),
        })
    })
}

/// A layer that applies to a request: its name and its buckets' keys.
#[napi(object)]
pub struct PlannedLayer {
    pub layer: String,
    pub keys: Vec<String>,
}

fn backend(functions: bool) -> Backend {
    if functions {
        Backend::Functions
    } else {
        Backend::Module
    }
}

/// A parsed, valid rules document.
#[napi]
pub struct RulesDocument {
    doc: Document,
    used: Vec<bool>,
}

#[napi]
impl RulesDocument {
    /// The document in `text` (YAML 1.2, JSON included); an invalid one throws (its problems:
    /// [`rules_problems`]).
    #[napi(constructor)]
    pub fn new(text: String) -> napi::Result<RulesDocument> {
        guarded(|| {
            let doc = Document::parse(&text).map_err(|e| invalid(e.to_string()))?;
            let used = doc.used_attributes();
            Ok(RulesDocument { doc, used })
        })
    }

    #[napi(getter)]
    pub fn prefix(&self) -> String {
        self.doc.prefix.clone()
    }

    /// The attributes a request may have, in the order `plan` and `check` take their values.
    #[napi(getter)]
    pub fn attributes(&self) -> Vec<String> {
        self.doc.attributes.clone()
    }

    /// Which of `attributes` some layer reads (the others need not be looked up).
    #[napi(getter)]
    pub fn used(&self) -> Vec<bool> {
        self.used.clone()
    }

    /// The layers that apply to a request whose attributes are `values` (in the order of
    /// `attributes`; null: absent).
    #[napi]
    pub fn plan(&self, values: Vec<Option<String>>) -> napi::Result<Vec<PlannedLayer>> {
        guarded(|| {
            let vals = self.values(&values)?;
            Ok(self
                .doc
                .plan_values(&vals)
                .into_iter()
                .map(|a| PlannedLayer {
                    layer: a.layer.name.clone(),
                    keys: a.buckets.iter().map(|b| b.key.clone()).collect(),
                })
                .collect())
        })
    }

    /// A check of a request: `cost` tokens from every bucket that applies. A cost no bucket
    /// could grant throws (`InvalidArg`) before any call.
    #[napi]
    pub fn check(
        &self,
        values: Vec<Option<String>>,
        cost: f64,
        fail_open: bool,
        cluster: bool,
    ) -> napi::Result<RulesCheck> {
        guarded(|| {
            let vals = self.values(&values)?;
            let applied = self.doc.plan_values(&vals);
            let options = CheckOptions {
                cost: count("cost", cost)?,
                fail_open,
                cluster,
            };
            Check::new(&applied, options)
                .map(|check| RulesCheck { check })
                .map_err(|e| invalid(e.0))
        })
    }
}

impl RulesDocument {
    fn values<'a>(&self, values: &'a [Option<String>]) -> napi::Result<Vec<Option<&'a str>>> {
        if values.len() != self.doc.attributes.len() {
            return Err(invalid(format!(
                "{} attribute values expected, got {}",
                self.doc.attributes.len(),
                values.len()
            )));
        }
        Ok(values.iter().map(|v| v.as_deref()).collect())
    }
}

/// A check's decision.
#[napi(object)]
pub struct RuleOutcome {
    pub granted: bool,
    pub remaining: f64,
    pub retry_after_ms: f64,
    pub reset_after_ms: f64,
    pub tokens: f64,
    pub limit: f64,
    pub layer: Option<String>,
    pub code: Option<String>,
    pub key: Option<String>,
    pub shadow_denied: Vec<String>,
    pub fallback: bool,
}

fn outcome(d: &RuleDecision) -> RuleOutcome {
    RuleOutcome {
        granted: d.granted,
        remaining: d.remaining,
        retry_after_ms: d.retry_after_ms as f64,
        reset_after_ms: d.reset_after_ms as f64,
        tokens: d.tokens as f64,
        limit: d.limit,
        layer: d.layer.clone(),
        code: d.code.clone(),
        key: d.key.clone(),
        shadow_denied: d.shadow_denied.clone(),
        fallback: d.fallback,
    }
}

/// One check in progress.
#[napi]
pub struct RulesCheck {
    check: Check,
}

#[napi]
impl RulesCheck {
    /// The call to send now (`functions`: for the Functions library), or null once decided.
    #[napi]
    pub fn command(&self, functions: bool) -> napi::Result<Option<Vec<String>>> {
        guarded(|| Ok(self.check.command(backend(functions)).map(strings)))
    }

    /// The reply to the last call; a malformed one's message is answered (null: read).
    #[napi]
    pub fn reply(&mut self, env: Env, reply: JsUnknown) -> napi::Result<Option<String>> {
        guarded(|| {
            let r = match to_reply(&env, reply) {
                Ok(r) => r,
                Err(e) => {
                    // No Redis value at all: malformed for every call a check makes.
                    let _ = self.check.reply(&Reply::Array(Vec::new()));
                    return Ok(Some(e.to_string()));
                }
            };
            Ok(self.check.reply(&r).err().map(|e| e.to_string()))
        })
    }

    /// The last call answered with an error reply.
    #[napi]
    pub fn error_reply(&mut self, text: String) -> napi::Result<()> {
        guarded(|| {
            let _ = self.check.reply(&Reply::Error(text));
            Ok(())
        })
    }

    /// The last call got no reply (an outage, a timeout, no backend).
    #[napi]
    pub fn failed(&mut self) -> napi::Result<()> {
        guarded(|| {
            self.check.failed();
            Ok(())
        })
    }

    /// The calls that give back what was taken for nothing (best effort).
    #[napi]
    pub fn refunds(&self, functions: bool) -> napi::Result<Vec<Vec<String>>> {
        guarded(|| {
            Ok(self
                .check
                .refunds(backend(functions))
                .into_iter()
                .map(strings)
                .collect())
        })
    }

    /// The decision, or null (a malformed reply ended the check).
    #[napi]
    pub fn decision(&self) -> napi::Result<Option<RuleOutcome>> {
        guarded(|| Ok(self.check.decision().map(outcome)))
    }
}
