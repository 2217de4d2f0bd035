//! Rules documents and checks (`redis_rl.Rules`, `redis_rl.AsyncRules`): the client core's
//! [`Document`] and [`Check`] under Python. Python reads the document's text, sends the
//! calls a check hands it, and hands back the replies; the validation (with lines), the
//! plan and the decision are the core's, the Rust client's too.
//!
//! A document is immutable once parsed (`frozen`: threads share it without a lock); a
//! check lives for one request and holds no lock.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyString};

use rl_client_core::budget::Backend;
use rl_client_core::rules::{Check, CheckOptions, RuleDecision};
use rl_client_core::rules_doc::{Document, Glob};

use crate::guard::guarded;
use crate::reply::to_reply;

/// A problem: `(line or None, field, message)`.
type ProblemTuple = (Option<u32>, String, String);
/// A layer: `(name, key, limit, code, shadow, line, [(amount, period_secs, cap)])`.
type LayerTuple = (
    String,
    String,
    String,
    String,
    bool,
    Option<u32>,
    Vec<(f64, f64, f64)>,
);
/// A layer that applies: `(layer index, base key, [(key, rate, cap)])`.
type AppliedTuple = (usize, String, Vec<(String, f64, f64)>);
/// An `RL.MTAKE` reply: `(granted, denied_by, retry_after_ms, remaining)`.
type MTakeTuple = (u64, Option<Vec<u8>>, u64, Option<Vec<f64>>);
/// A decision: `(granted, remaining, retry_after_ms, reset_after_ms, tokens, limit,
/// fallback, layer, code, key, shadow_denied)`.
type DecisionTuple = (
    bool,
    f64,
    u64,
    u64,
    u64,
    f64,
    bool,
    Option<String>,
    Option<String>,
    Option<String>,
    Vec<String>,
);

/// A parsed, valid rules document.
#[pyclass(module = "redis_rl._core", frozen)]
pub struct RulesDocument {
    doc: Document,
    /// The attributes some layer reads ([`Document::used_attributes`]): only those are
    /// looked up in a request's mapping.
    used: Vec<bool>,
}

/// The request's value of each attribute the document knows, in its order: absent or
/// `None` is absent; anything but a string is read as `str()` makes it.
fn values(
    doc: &Document,
    used: &[bool],
    attrs: &Bound<'_, PyAny>,
) -> PyResult<Vec<Option<String>>> {
    let dict = attrs.cast::<PyDict>().ok();
    doc.attributes
        .iter()
        .zip(used)
        .map(|(name, used)| {
            if !used {
                return Ok(None);
            }
            let v = match dict {
                Some(d) => d.get_item(name)?,
                None => {
                    let got = attrs.call_method1("get", (name,))?;
                    (!got.is_none()).then_some(got)
                }
            };
            match v {
                None => Ok(None),
                Some(v) if v.is_none() => Ok(None),
                Some(v) => match v.cast::<PyString>() {
                    Ok(s) => Ok(Some(s.extract::<String>()?)),
                    Err(_) => Ok(Some(v.str()?.extract::<String>()?)),
                },
            }
        })
        .collect()
}

fn backend(functions: bool) -> Backend {
    if functions {
        Backend::Functions
    } else {
        Backend::Module
    }
}

/// A call's arguments: the command's name a `str` (redis-py's cluster client looks its
/// routing up by name), the rest `bytes`.
fn args<'py>(py: Python<'py>, args: &[Vec<u8>]) -> Vec<Bound<'py, PyAny>> {
    args.iter()
        .enumerate()
        .map(|(i, a)| match (i, std::str::from_utf8(a)) {
            (0, Ok(name)) => PyString::new(py, name).into_any(),
            _ => PyBytes::new(py, a).into_any(),
        })
        .collect()
}

#[pymethods]
impl RulesDocument {
    /// The document in `text`, or the problems found: `(document, [])` or `(None,
    /// problems)`.
    #[staticmethod]
    fn parse(text: &str) -> PyResult<(Option<RulesDocument>, Vec<ProblemTuple>)> {
        guarded(|| match Document::parse(text) {
            Ok(doc) => {
                let used = doc.used_attributes();
                Ok((Some(RulesDocument { doc, used }), Vec::new()))
            }
            Err(e) => Ok((
                None,
                e.problems
                    .into_iter()
                    .map(|p| (p.line, p.field, p.message))
                    .collect(),
            )),
        })
    }

    fn prefix(&self) -> PyResult<String> {
        guarded(|| Ok(self.doc.prefix.clone()))
    }

    fn attributes(&self) -> PyResult<Vec<String>> {
        guarded(|| Ok(self.doc.attributes.clone()))
    }

    fn layers(&self) -> PyResult<Vec<LayerTuple>> {
        guarded(|| Ok(self.layer_tuples()))
    }

    /// The layers that apply to `attrs`: `[(layer index, base key, [(key, rate, cap)])]`.
    fn plan(&self, attrs: &Bound<'_, PyAny>) -> PyResult<Vec<AppliedTuple>> {
        guarded(|| {
            let owned = values(&self.doc, &self.used, attrs)?;
            let vals: Vec<Option<&str>> = owned.iter().map(|v| v.as_deref()).collect();
            Ok(self
                .doc
                .plan_values(&vals)
                .into_iter()
                .map(|a| {
                    let index = self
                        .doc
                        .layers
                        .iter()
                        .position(|l| std::ptr::eq(l, a.layer))
                        .unwrap_or(0);
                    let buckets = a
                        .buckets
                        .iter()
                        .map(|b| (b.key.clone(), b.limit.rate(), b.limit.cap()))
                        .collect();
                    (index, a.base, buckets)
                })
                .collect())
        })
    }

    /// A check of `attrs`: `cost` tokens from every bucket that applies, or `ValueError`
    /// for a cost no bucket could grant.
    fn check(
        &self,
        attrs: &Bound<'_, PyAny>,
        cost: u64,
        fail_open: bool,
        cluster: bool,
    ) -> PyResult<RulesCheck> {
        guarded(|| {
            let owned = values(&self.doc, &self.used, attrs)?;
            let vals: Vec<Option<&str>> = owned.iter().map(|v| v.as_deref()).collect();
            let applied = self.doc.plan_values(&vals);
            let options = CheckOptions {
                cost,
                fail_open,
                cluster,
            };
            let check = Check::new(&applied, options).map_err(|e| PyValueError::new_err(e.0))?;
            Ok(RulesCheck { check })
        })
    }
}

impl RulesDocument {
    fn layer_tuples(&self) -> Vec<LayerTuple> {
        self.doc
            .layers
            .iter()
            .map(|l| {
                (
                    l.name.clone(),
                    l.key.clone(),
                    l.limit.clone(),
                    l.code.clone(),
                    l.shadow,
                    l.line,
                    l.limits
                        .iter()
                        .map(|x| (x.amount, x.period_secs, x.cap))
                        .collect(),
                )
            })
            .collect()
    }
}

/// One check in progress (see `rl_client_core::rules::Check`).
#[pyclass(module = "redis_rl._core")]
pub struct RulesCheck {
    check: Check,
}

fn decision_tuple(d: &RuleDecision) -> DecisionTuple {
    (
        d.granted,
        d.remaining,
        d.retry_after_ms,
        d.reset_after_ms,
        d.tokens,
        d.limit,
        d.fallback,
        d.layer.clone(),
        d.code.clone(),
        d.key.clone(),
        d.shadow_denied.clone(),
    )
}

#[pymethods]
impl RulesCheck {
    /// The call to send now (for the Functions library with `functions`), or `None` once
    /// decided.
    fn command<'py>(
        &self,
        py: Python<'py>,
        functions: bool,
    ) -> PyResult<Option<Vec<Bound<'py, PyAny>>>> {
        guarded(|| Ok(self.check.command(backend(functions)).map(|a| args(py, &a))))
    }

    /// As [`RulesCheck::command`], the call packed as RESP (what redis-py's connection
    /// sends with `send_packed_command`): the packing costs Python nothing.
    fn packed<'py>(
        &self,
        py: Python<'py>,
        functions: bool,
    ) -> PyResult<Option<Bound<'py, PyBytes>>> {
        guarded(|| {
            Ok(self.check.command(backend(functions)).map(|a| {
                let mut out =
                    Vec::with_capacity(16 + a.iter().map(|x| x.len() + 16).sum::<usize>());
                out.extend_from_slice(format!("*{}\r\n", a.len()).as_bytes());
                for x in &a {
                    out.extend_from_slice(format!("${}\r\n", x.len()).as_bytes());
                    out.extend_from_slice(x);
                    out.extend_from_slice(b"\r\n");
                }
                PyBytes::new(py, &out)
            }))
        })
    }

    /// The reply to the last call; a malformed one's message is returned (`None`: read).
    fn reply(&mut self, reply: &Bound<'_, PyAny>) -> PyResult<Option<String>> {
        guarded(|| {
            let r = match to_reply(reply) {
                Ok(r) => r,
                Err(e) => return Ok(Some(self.malformed(e))),
            };
            Ok(self.check.reply(&r).err().map(|e| e.to_string()))
        })
    }

    /// The last call answered with an error reply.
    fn error_reply(&mut self, text: &str) -> PyResult<()> {
        guarded(|| {
            let _ = self
                .check
                .reply(&rl_client_core::Reply::Error(text.to_owned()));
            Ok(())
        })
    }

    /// The last call got no reply (an outage, a timeout, no backend).
    fn failed(&mut self) -> PyResult<()> {
        guarded(|| {
            self.check.failed();
            Ok(())
        })
    }

    /// The calls that give back what was taken for nothing (send them best effort).
    fn refunds<'py>(
        &self,
        py: Python<'py>,
        functions: bool,
    ) -> PyResult<Vec<Vec<Bound<'py, PyAny>>>> {
        guarded(|| {
            let calls = self.check.refunds(backend(functions));
            Ok(calls.iter().map(|a| args(py, a)).collect())
        })
    }

    /// The decision, or `None` (a malformed reply ended the check).
    fn decision(&self) -> PyResult<Option<DecisionTuple>> {
        guarded(|| Ok(self.check.decision().map(decision_tuple)))
    }
}

impl RulesCheck {
    /// A reply that is no Redis value at all: malformed, as the core decides for one.
    fn malformed(&mut self, e: rl_client_core::ProtocolError) -> String {
        // An array of the wrong length is malformed for every call a check makes.
        let _ = self.check.reply(&rl_client_core::Reply::Array(Vec::new()));
        e.to_string()
    }
}

/// An `RL.MTAKE` reply (any number of remaining counts): `(granted, denied_by,
/// retry_after_ms, remaining)`; a malformed one raises `ValueError` with the reason.
#[pyfunction]
fn parse_mtake(reply: &Bound<'_, PyAny>) -> PyResult<MTakeTuple> {
    guarded(|| {
        let r = to_reply(reply)
            .and_then(|r| rl_client_core::rules::parse_mtake(&r, None))
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        Ok((r.granted, r.denied_by, r.retry_after_ms, r.remaining))
    })
}

/// A glob of a rules document (`*` any run, `?` one character), for tests and tools.
#[pyclass(module = "redis_rl._core", frozen, name = "Glob")]
pub struct PyGlob {
    glob: Glob,
}

#[pymethods]
impl PyGlob {
    #[new]
    fn new(pattern: &str) -> PyResult<PyGlob> {
        guarded(|| {
            Ok(PyGlob {
                glob: Glob::new(pattern),
            })
        })
    }

    fn fullmatch(&self, text: &str) -> PyResult<bool> {
        guarded(|| Ok(self.glob.matches(text)))
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<RulesDocument>()?;
    m.add_class::<RulesCheck>()?;
    m.add_class::<PyGlob>()?;
    m.add_function(wrap_pyfunction!(parse_mtake, m)?)?;
    Ok(())
}
