//! A rules document read into a tree that remembers the line of every node, so that each
//! problem the validator finds names its line (`rules.yaml:4: layers[0].limit: ...`, as a
//! compiler writes it). serde_yaml's values have no positions; libyaml's events do, so the
//! tree is built from them here. JSON that YAML refuses (a tab before it) is read as JSON,
//! without lines.
//!
//! Hostile documents stay cheap: an alias shares its anchor's node (a "billion laughs"
//! document stays as small as its text in memory), nesting deeper than [`MAX_DEPTH`] is
//! refused before the tree holds it (a deep tree would also be dropped recursively), and so
//! is a tree whose aliases expand it past [`MAX_EXPANDED`]: the validator walks the tree as
//! its aliases name it, so a 1 MiB text naming billions of nodes would otherwise hang the
//! host or exhaust its memory.

use std::collections::HashMap;
use std::ffi::CStr;
use std::mem::MaybeUninit;
use std::rc::Rc;

use unsafe_libyaml as unsafe_sys;

/// Nesting of collections at most (a rules document needs four).
pub const MAX_DEPTH: usize = 64;

/// The size a document may have with its aliases expanded, in nodes plus scalar bytes: four
/// times the longest text read (`rules_doc::MAX_TEXT`), so that a document without
/// aliases never meets it and one with aliases costs at most a few passes over 1 MiB.
pub const MAX_EXPANDED: u64 = 4 << 20;

/// A scalar's value under YAML 1.2's core schema (what serde_yaml resolves), or a
/// collection.
#[derive(Debug, PartialEq)]
pub enum Value {
    Null,
    Bool(bool),
    /// An integer or a float, as written.
    Number(String),
    Str(String),
    Seq(Vec<Node>),
    /// Pairs in document order (a key given twice stays twice: the validator names it).
    Map(Vec<(Node, Node)>),
}

/// A value and the line (from 1) it starts on; `None` for JSON.
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    pub line: Option<u32>,
    pub value: Rc<Value>,
}

impl Node {
    pub fn as_str(&self) -> Option<&str> {
        match &*self.value {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    /// A mapping key as a name: a string as it is, anything else as written.
    pub fn key_name(&self) -> String {
        match &*self.value {
            Value::Str(s) | Value::Number(s) => s.clone(),
            Value::Bool(b) => b.to_string(),
            Value::Null => "null".into(),
            Value::Seq(_) | Value::Map(_) => "(a collection)".into(),
        }
    }

    /// The value under `name` in a mapping (the first, when given twice).
    pub fn get(&self, name: &str) -> Option<&Node> {
        match &*self.value {
            Value::Map(pairs) => pairs
                .iter()
                .find(|(k, _)| k.as_str() == Some(name))
                .map(|(_, v)| v),
            _ => None,
        }
    }
}

/// Why a text is not a document: the message and its line, if known.
#[derive(Debug, Clone, PartialEq)]
pub struct Unreadable {
    pub line: Option<u32>,
    pub message: String,
}

/// The document in `text`: YAML, or JSON when YAML refuses it.
pub fn read(text: &str) -> Result<Node, Unreadable> {
    match read_yaml(text) {
        Ok(node) => Ok(node),
        Err(yaml) => match serde_json::from_str::<serde_json::Value>(text) {
            Ok(json) => from_json(&json, 0).ok_or(Unreadable {
                line: None,
                message: "nested too deeply".into(),
            }),
            Err(_) => Err(yaml),
        },
    }
}

fn from_json(v: &serde_json::Value, depth: usize) -> Option<Node> {
    use serde_json::Value as J;
    if depth > MAX_DEPTH {
        return None;
    }
    let value = match v {
        J::Null => Value::Null,
        J::Bool(b) => Value::Bool(*b),
        J::Number(n) => Value::Number(n.to_string()),
        J::String(s) => Value::Str(s.clone()),
        J::Array(xs) => Value::Seq(
            xs.iter()
                .map(|x| from_json(x, depth + 1))
                .collect::<Option<_>>()?,
        ),
        J::Object(m) => Value::Map(
            m.iter()
                .map(|(k, x)| Some((plain(Value::Str(k.clone())), from_json(x, depth + 1)?)))
                .collect::<Option<_>>()?,
        ),
    };
    Some(plain(value))
}

fn plain(value: Value) -> Node {
    Node {
        line: None,
        value: Rc::new(value),
    }
}

/// A collection being read.
enum Open {
    Seq(Vec<Node>),
    Map(Vec<(Node, Node)>, Option<Node>),
}

struct Frame {
    open: Open,
    line: u32,
    anchor: Option<Vec<u8>>,
    /// The collection's size so far with its aliases expanded ([`MAX_EXPANDED`]).
    expanded: u64,
}

/// The parser, deleted however reading ends.
struct Parser(Box<MaybeUninit<unsafe_sys::yaml_parser_t>>);

impl Drop for Parser {
    fn drop(&mut self) {
        // SAFETY: only made by `read_yaml` after yaml_parser_initialize succeeded.
        unsafe { unsafe_sys::yaml_parser_delete(self.0.as_mut_ptr()) }
    }
}

/// An event, deleted once read.
struct Event(MaybeUninit<unsafe_sys::yaml_event_t>);

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: only made once yaml_parser_parse filled it.
        unsafe { unsafe_sys::yaml_event_delete(self.0.as_mut_ptr()) }
    }
}

unsafe fn c_text(p: *const u8) -> Option<Vec<u8>> {
    if p.is_null() {
        None
    } else {
        Some(
            CStr::from_ptr(p as *const std::ffi::c_char)
                .to_bytes()
                .to_vec(),
        )
    }
}

fn unreadable(parser: &unsafe_sys::yaml_parser_t, text: &str) -> Unreadable {
    // SAFETY: libyaml sets `problem` to a static C string (or leaves it null).
    let problem = unsafe { c_text(parser.problem as *const u8) }
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_else(|| "unreadable".into());
    // The reader (a control character such as NUL, a bad encoding) reports a byte offset
    // and leaves the mark at the start: the line is counted from the offset.
    let line = if parser.error == unsafe_sys::YAML_READER_ERROR {
        let at = (parser.problem_offset as usize).min(text.len());
        text.as_bytes()[..at]
            .iter()
            .filter(|&&b| b == b'\n')
            .count() as u32
            + 1
    } else {
        parser.problem_mark.line as u32 + 1
    };
    Unreadable {
        line: Some(line),
        message: format!("not YAML or JSON: {problem} at line {line}"),
    }
}

/// YAML 1.2's core schema for a plain scalar (serde_yaml's resolution).
fn resolve(text: &str) -> Value {
    match text {
        "" | "~" | "null" | "Null" | "NULL" => Value::Null,
        "true" | "True" | "TRUE" => Value::Bool(true),
        "false" | "False" | "FALSE" => Value::Bool(false),
        _ if text.parse::<i64>().is_ok()
            || (text.parse::<f64>().is_ok()
                && !text
                    .chars()
                    .any(|c| c.is_ascii_alphabetic() && c != 'e' && c != 'E')) =>
        {
            Value::Number(text.to_string())
        }
        _ => Value::Str(text.to_string()),
    }
}

fn read_yaml(text: &str) -> Result<Node, Unreadable> {
    let mut parser = Parser(Box::new(MaybeUninit::uninit()));
    // SAFETY: the parser lives in its box until dropped (libyaml keeps pointers into it);
    // the input outlives the parser (both end with this function).
    unsafe {
        if unsafe_sys::yaml_parser_initialize(parser.0.as_mut_ptr()).fail {
            return Err(Unreadable {
                line: None,
                message: "out of memory".into(),
            });
        }
        unsafe_sys::yaml_parser_set_encoding(parser.0.as_mut_ptr(), unsafe_sys::YAML_UTF8_ENCODING);
        unsafe_sys::yaml_parser_set_input_string(
            parser.0.as_mut_ptr(),
            text.as_ptr(),
            text.len() as u64,
        );
    }
    // Each anchor's node and its expanded size.
    let mut anchors: HashMap<Vec<u8>, (Node, u64)> = HashMap::new();
    let mut stack: Vec<Frame> = Vec::new();
    let mut root: Option<Node> = None;
    loop {
        let mut event = Event(MaybeUninit::uninit());
        // SAFETY: the parser is initialized; a filled event is deleted by its Drop, an
        // unfilled one is not made into an `Event` that a failure would delete.
        let e = unsafe {
            if unsafe_sys::yaml_parser_parse(parser.0.as_mut_ptr(), event.0.as_mut_ptr()).fail {
                let why = unreadable(&*parser.0.as_ptr(), text);
                std::mem::forget(event);
                return Err(why);
            }
            &*event.0.as_ptr()
        };
        let line = e.start_mark.line as u32 + 1;
        let done: Option<(Node, Option<Vec<u8>>, u64)> = match e.type_ {
            unsafe_sys::YAML_STREAM_END_EVENT => break,
            unsafe_sys::YAML_DOCUMENT_START_EVENT if root.is_some() => {
                return Err(Unreadable {
                    line: Some(line),
                    message: "one document per text ('---' starts a second)".into(),
                })
            }
            unsafe_sys::YAML_SCALAR_EVENT => {
                // SAFETY: a scalar event's union member is `scalar`; value has length bytes.
                let (anchor, tag, bytes, style) = unsafe {
                    let s = &e.data.scalar;
                    (
                        c_text(s.anchor),
                        c_text(s.tag),
                        std::slice::from_raw_parts(s.value, s.length as usize),
                        s.style,
                    )
                };
                let text = String::from_utf8_lossy(bytes).into_owned();
                let value = if style == unsafe_sys::YAML_PLAIN_SCALAR_STYLE
                    && tag.as_deref() != Some(b"tag:yaml.org,2002:str")
                {
                    resolve(&text)
                } else {
                    Value::Str(text)
                };
                let expanded = 1 + bytes.len() as u64;
                Some((
                    Node {
                        line: Some(line),
                        value: Rc::new(value),
                    },
                    anchor,
                    expanded,
                ))
            }
            unsafe_sys::YAML_ALIAS_EVENT => {
                // SAFETY: an alias event's union member is `alias`.
                let name = unsafe { c_text(e.data.alias.anchor) }.unwrap_or_default();
                let Some((target, expanded)) = anchors.get(&name) else {
                    return Err(Unreadable {
                        line: Some(line),
                        message: "not YAML or JSON: an alias to no anchor".into(),
                    });
                };
                let node = Node {
                    line: Some(line),
                    value: target.value.clone(),
                };
                Some((node, None, *expanded))
            }
            unsafe_sys::YAML_SEQUENCE_START_EVENT | unsafe_sys::YAML_MAPPING_START_EVENT => {
                if stack.len() >= MAX_DEPTH {
                    return Err(Unreadable {
                        line: Some(line),
                        message: "nested too deeply".into(),
                    });
                }
                let seq = e.type_ == unsafe_sys::YAML_SEQUENCE_START_EVENT;
                // SAFETY: the union member matches the event type.
                let anchor = unsafe {
                    if seq {
                        c_text(e.data.sequence_start.anchor)
                    } else {
                        c_text(e.data.mapping_start.anchor)
                    }
                };
                stack.push(Frame {
                    open: if seq {
                        Open::Seq(Vec::new())
                    } else {
                        Open::Map(Vec::new(), None)
                    },
                    line,
                    anchor,
                    expanded: 1,
                });
                None
            }
            unsafe_sys::YAML_SEQUENCE_END_EVENT | unsafe_sys::YAML_MAPPING_END_EVENT => {
                let Some(frame) = stack.pop() else {
                    return Err(Unreadable {
                        line: Some(line),
                        message: "not YAML or JSON: a collection closed that was never opened"
                            .into(),
                    });
                };
                let value = match frame.open {
                    Open::Seq(items) => Value::Seq(items),
                    Open::Map(pairs, _) => Value::Map(pairs),
                };
                Some((
                    Node {
                        line: Some(frame.line),
                        value: Rc::new(value),
                    },
                    frame.anchor,
                    frame.expanded,
                ))
            }
            _ => None,
        };
        let Some((node, anchor, expanded)) = done else {
            continue;
        };
        if let Some(parent) = stack.last_mut() {
            // Sizes add up through every open collection to the root, so the check at the
            // parent bounds the whole tree.
            parent.expanded = parent.expanded.saturating_add(expanded);
            if parent.expanded > MAX_EXPANDED {
                return Err(Unreadable {
                    line: Some(line),
                    message: format!(
                        "aliases expand the document past {MAX_EXPANDED} nodes and bytes \
                         (a rules document needs far fewer)"
                    ),
                });
            }
        }
        if let Some(a) = anchor {
            anchors.insert(a, (node.clone(), expanded));
        }
        match stack.last_mut() {
            None => root = Some(node),
            Some(Frame {
                open: Open::Seq(items),
                ..
            }) => items.push(node),
            Some(Frame {
                open: Open::Map(pairs, key),
                ..
            }) => match key.take() {
                None => *key = Some(node),
                Some(k) => pairs.push((k, node)),
            },
        }
    }
    Ok(root.unwrap_or_else(|| Node {
        line: Some(1),
        value: Rc::new(Value::Null),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_scalars_and_aliases() {
        let n = read("a: 1\nb:\n  - x\n  - 'true'\n  - true\nc: &x [1]\nd: *x\n").unwrap();
        let b = n.get("b").unwrap();
        assert_eq!(b.line, Some(3));
        let Value::Seq(items) = &*b.value else {
            panic!()
        };
        assert_eq!(*items[1].value, Value::Str("true".into()));
        assert_eq!(*items[2].value, Value::Bool(true));
        assert_eq!(items[2].line, Some(5));
        assert!(Rc::ptr_eq(
            &n.get("c").unwrap().value,
            &n.get("d").unwrap().value
        ));
        assert_eq!(*n.get("a").unwrap().value, Value::Number("1".into()));
    }

    #[test]
    fn json_yaml_refuses_and_garbage() {
        assert!(read("\t{\"a\": [1]}").unwrap().get("a").is_some());
        let e = read("a: [1").unwrap_err();
        assert!(e.message.starts_with("not YAML or JSON"), "{e:?}");
        assert!(read(&"[".repeat(100)).is_err());
        assert!(read("a: *nothing").is_err());
        assert!(read("a: 1\n---\nb: 2\n").is_err());
        assert_eq!(*read("").unwrap().value, Value::Null);
    }
}
