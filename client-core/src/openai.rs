//! What a token budget reserves for an OpenAI-compatible chat completion, and what it
//! settles: the estimate read from the request body, the actual read from the reply's
//! `usage` (a JSON body, or the last event of a stream). Every shell's integration (the
//! Python httpx transport under the `openai` SDK, the JavaScript one) hands the bytes
//! here, so they estimate and settle alike. No I/O.
//!
//! The estimate never aims low: an input estimate too low is an overage charged as debt at
//! the settle, one too high only holds headroom while the call runs (docs/budgets.md).
//! - input: the UTF-8 bytes of every message's text (and of tools and response formats,
//!   which the provider counts as prompt) divided by 3, rounded up (English runs about 4
//!   bytes a token, CJK text 3), plus 4 per message and 3 for the reply's priming, as
//!   OpenAI's counting guide does; an image part counts [`IMAGE_TOKENS`];
//! - output: `max_completion_tokens`, else `max_tokens`, else the caller's default, times
//!   `n` (choices).
//!
//! A stream without `stream_options.include_usage` reports no usage: the request is
//! rewritten to ask for it, and the usage event (no choices) is kept from the caller, who
//! did not ask for it, so its stream reads as it would have.

use serde_json::{Map, Value};

/// Tokens an image part is reserved at (OpenAI's high-detail tile cost for a large image
/// is about 1,100; a low-detail one 85).
pub const IMAGE_TOKENS: u64 = 1105;

/// Tokens each message adds beyond its text, and the reply's priming (OpenAI's cookbook).
const PER_MESSAGE: u64 = 4;
const PRIMING: u64 = 3;

/// What one chat completion reserves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Estimate {
    pub input: u64,
    pub output: u64,
    pub stream: bool,
    /// The body to send instead (the stream asks for its usage), when it changed.
    pub body: Option<Vec<u8>>,
    /// Whether the caller did not ask for the usage event (so it is kept from it).
    pub hide_usage: bool,
}

/// What a completion used, from its `usage`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    pub input: u64,
    pub output: u64,
}

fn text_tokens(bytes: usize) -> u64 {
    (bytes as u64).div_ceil(3)
}

fn content_tokens(content: &Value) -> u64 {
    match content {
        Value::String(s) => text_tokens(s.len()),
        Value::Array(parts) => parts
            .iter()
            .map(|p| match p.get("type").and_then(Value::as_str) {
                Some("image_url") | Some("input_image") | Some("image") => IMAGE_TOKENS,
                _ => match p.get("text") {
                    Some(Value::String(t)) => text_tokens(t.len()),
                    _ => text_tokens(p.to_string().len()),
                },
            })
            .fold(0u64, u64::saturating_add),
        Value::Null => 0,
        other => text_tokens(other.to_string().len()),
    }
}

fn count(v: Option<&Value>, what: &str) -> Result<Option<u64>, String> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(x) => x
            .as_u64()
            .map(Some)
            .ok_or_else(|| format!("{what} must be a non-negative integer, not {x}")),
    }
}

/// The estimate of a chat completion request `body` (the JSON the SDK sends);
/// `default_output`: the output reserved when the request sets no `max_tokens`.
pub fn estimate_chat(body: &[u8], default_output: u64) -> Result<Estimate, String> {
    let mut req: Map<String, Value> = match serde_json::from_slice(body) {
        Ok(Value::Object(m)) => m,
        Ok(_) => return Err("a chat completion request is a JSON object".into()),
        Err(e) => return Err(format!("the request body is not JSON: {e}")),
    };
    let messages = match req.get("messages") {
        Some(Value::Array(m)) => m,
        _ => return Err("a chat completion request has a messages array".into()),
    };
    let mut input = PRIMING;
    for m in messages {
        let text = m.get("content").map_or(0, content_tokens);
        let name = m
            .get("name")
            .and_then(Value::as_str)
            .map_or(0, |n| text_tokens(n.len()));
        let calls = m
            .get("tool_calls")
            .map_or(0, |c| text_tokens(c.to_string().len()));
        input = input
            .saturating_add(PER_MESSAGE)
            .saturating_add(text)
            .saturating_add(name)
            .saturating_add(calls);
    }
    for extra in ["tools", "functions", "response_format"] {
        if let Some(v) = req.get(extra) {
            input = input.saturating_add(text_tokens(v.to_string().len()));
        }
    }
    let most = match count(req.get("max_completion_tokens"), "max_completion_tokens")? {
        Some(x) => x,
        None => count(req.get("max_tokens"), "max_tokens")?.unwrap_or(default_output),
    };
    let choices = count(req.get("n"), "n")?.unwrap_or(1).max(1);
    let output = most.saturating_mul(choices).max(1);
    let stream = req.get("stream").and_then(Value::as_bool).unwrap_or(false);
    let asked = req
        .get("stream_options")
        .and_then(|o| o.get("include_usage"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let (body, hide_usage) = if stream && !asked {
        let options = req
            .entry("stream_options")
            .or_insert_with(|| Value::Object(Map::new()));
        if let Value::Object(o) = options {
            o.insert("include_usage".into(), Value::Bool(true));
        } else {
            *options = serde_json::json!({ "include_usage": true });
        }
        (serde_json::to_vec(&Value::Object(req)).ok(), true)
    } else {
        (None, false)
    };
    Ok(Estimate {
        input: input.max(1),
        output,
        stream,
        body,
        hide_usage,
    })
}

fn read_usage(v: &Value) -> Option<Usage> {
    let u = v.get("usage")?;
    let input = u
        .get("prompt_tokens")
        .or_else(|| u.get("input_tokens"))?
        .as_u64()?;
    let output = u
        .get("completion_tokens")
        .or_else(|| u.get("output_tokens"))?
        .as_u64()?;
    Some(Usage { input, output })
}

/// The usage of a non-streamed reply body (`None`: none there, say an error body).
pub fn chat_usage(body: &[u8]) -> Option<Usage> {
    read_usage(&serde_json::from_slice(body).ok()?)
}

/// Reads a streamed reply (server-sent events) as it passes: finds the usage event, and
/// keeps it from the caller when the caller did not ask for it. Fed the bytes as they
/// come, it hands back the bytes to pass on (whole events; a partial one waits for its
/// end).
#[derive(Debug, Default)]
pub struct StreamUsage {
    pending: Vec<u8>,
    /// How far `pending` was searched for an event's end (so a partial event fed a byte at a
    /// time is not searched again from its start: quadratic).
    searched: usize,
    hide: bool,
    usage: Option<Usage>,
}

/// Longest event held while waiting for its end: a stream that never ends one is passed
/// on as it is (and its usage, if any, missed: settled at the estimate).
const MAX_EVENT: usize = 1 << 20;

impl StreamUsage {
    /// `hide`: keep the usage event from the caller ([`Estimate::hide_usage`]).
    pub fn new(hide: bool) -> StreamUsage {
        StreamUsage {
            hide,
            ..StreamUsage::default()
        }
    }

    /// The usage seen so far.
    pub fn usage(&self) -> Option<Usage> {
        self.usage
    }

    /// Takes the next bytes of the stream; returns what to pass on.
    pub fn feed(&mut self, bytes: &[u8]) -> Vec<u8> {
        self.pending.extend_from_slice(bytes);
        let mut out = Vec::with_capacity(self.pending.len());
        let mut start = 0;
        let mut from = self.searched;
        while let Some(end) = find_event_end(&self.pending[start..], from) {
            from = 0;
            let event = &self.pending[start..start + end];
            let (seen, hidden) = scan(event, self.hide);
            if seen.is_some() {
                self.usage = seen;
            }
            if !hidden {
                out.extend_from_slice(event);
            }
            start += end;
        }
        self.pending.drain(..start);
        if self.pending.len() > MAX_EVENT {
            out.append(&mut self.pending);
        }
        // The last 2 bytes may begin an end still to come.
        self.searched = self.pending.len().saturating_sub(2);
        out
    }

    /// The stream ended: what is left to pass on.
    pub fn finish(&mut self) -> Vec<u8> {
        let rest = std::mem::take(&mut self.pending);
        self.searched = 0;
        let (seen, hidden) = scan(&rest, self.hide);
        if seen.is_some() {
            self.usage = seen;
        }
        if hidden {
            Vec::new()
        } else {
            rest
        }
    }
}

/// Reads one event: the usage it carries, and whether it is the usage event to keep from
/// the caller (`hide`, and no choices in it).
fn scan(event: &[u8], hide: bool) -> (Option<Usage>, bool) {
    let Ok(text) = std::str::from_utf8(event) else {
        return (None, false);
    };
    let data: String = text
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .map(str::trim_start)
        .collect::<Vec<_>>()
        .join("\n");
    if data.is_empty() || data == "[DONE]" {
        return (None, false);
    }
    let Ok(v) = serde_json::from_str::<Value>(&data) else {
        return (None, false);
    };
    let Some(usage) = read_usage(&v) else {
        return (None, false);
    };
    let no_choices = v
        .get("choices")
        .and_then(Value::as_array)
        .is_some_and(Vec::is_empty);
    (Some(usage), hide && no_choices)
}

/// Where the first event of `buf` ends (after its blank line), if it does, searching from
/// `from` (what was searched before holds no end).
fn find_event_end(buf: &[u8], from: usize) -> Option<usize> {
    let mut i = from;
    while i + 1 < buf.len() {
        if buf[i] == b'\n' && buf[i + 1] == b'\n' {
            return Some(i + 2);
        }
        if buf[i] == b'\n' && buf[i + 1] == b'\r' && buf.get(i + 2) == Some(&b'\n') {
            return Some(i + 3);
        }
        i += 1;
    }
    None
}

/// A budget's costs for an estimate: its `input` and `output` limits each their part, its
/// other token limit (`tokens`) both; `requests` is left to the budget (1).
pub fn costs<'a>(names: &[&'a str], e: &Estimate) -> Vec<(&'a str, u64)> {
    split(names, e.input, e.output)
}

/// A budget's actuals for a usage, as [`costs`] splits them.
pub fn actuals<'a>(names: &[&'a str], u: &Usage) -> Vec<(&'a str, u64)> {
    split(names, u.input, u.output)
}

fn split<'a>(names: &[&'a str], input: u64, output: u64) -> Vec<(&'a str, u64)> {
    names
        .iter()
        .filter_map(|&n| match n {
            "requests" => None,
            "input" => Some((n, input)),
            "output" => Some((n, output)),
            _ => Some((n, input.saturating_add(output))),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn estimates_input_generously_and_output_from_max_tokens() {
        let body = br#"{"model":"m","messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"Say hi"}],"max_tokens":50,"n":2}"#;
        let e = estimate_chat(body, 4096).unwrap();
        // 14 and 6 bytes: 5 and 2 tokens, 4 per message, 3 priming.
        assert_eq!(
            (e.input, e.output, e.stream, e.body),
            (3 + 9 + 6, 100, false, None)
        );
        let e = estimate_chat(br#"{"messages":[{"role":"user","content":[{"type":"text","text":"abc"},{"type":"image_url","image_url":{"url":"x"}}]}],"max_completion_tokens":7,"max_tokens":9}"#, 4096).unwrap();
        assert_eq!((e.input, e.output), (3 + 4 + 1 + IMAGE_TOKENS, 7));
        assert_eq!(
            estimate_chat(br#"{"messages":[]}"#, 4096).unwrap().output,
            4096
        );
        assert!(estimate_chat(b"[]", 1).unwrap_err().contains("object"));
        assert!(estimate_chat(b"{", 1).unwrap_err().contains("not JSON"));
        assert!(estimate_chat(br#"{"messages":[],"max_tokens":-1}"#, 1)
            .unwrap_err()
            .contains("max_tokens"));
    }

    #[test]
    fn a_stream_asks_for_its_usage_and_hides_it_from_a_caller_who_did_not() {
        let e = estimate_chat(br#"{"messages":[],"stream":true}"#, 10).unwrap();
        assert!(e.stream && e.hide_usage);
        let sent: Value = serde_json::from_slice(e.body.as_ref().unwrap()).unwrap();
        assert_eq!(sent["stream_options"]["include_usage"], Value::Bool(true));
        let asked = estimate_chat(
            br#"{"messages":[],"stream":true,"stream_options":{"include_usage":true}}"#,
            10,
        )
        .unwrap();
        assert!(!asked.hide_usage && asked.body.is_none());

        let stream = b"data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}],\"usage\":null}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":2,\"total_tokens\":11}}\n\ndata: [DONE]\n\n";
        for hide in [true, false] {
            // Fed a byte at a time, the same events pass.
            let mut s = StreamUsage::new(hide);
            let mut out: Vec<u8> = stream.iter().flat_map(|b| s.feed(&[*b])).collect();
            out.extend(s.finish());
            assert_eq!(
                s.usage(),
                Some(Usage {
                    input: 9,
                    output: 2
                })
            );
            let text = String::from_utf8(out).unwrap();
            assert_eq!(text.contains("prompt_tokens"), !hide);
            assert!(text.contains("\"hi\"") && text.ends_with("data: [DONE]\n\n"));
        }
    }

    #[test]
    fn usage_and_the_split_by_limit() {
        let u = chat_usage(br#"{"usage":{"prompt_tokens":12,"completion_tokens":30}}"#).unwrap();
        assert_eq!(
            u,
            Usage {
                input: 12,
                output: 30
            }
        );
        assert_eq!(chat_usage(br#"{"error":{}}"#), None);
        assert_eq!(actuals(&["tokens", "requests"], &u), [("tokens", 42)]);
        assert_eq!(
            actuals(&["input", "output", "requests"], &u),
            [("input", 12), ("output", 30)]
        );
    }

    #[test]
    fn a_large_event_fed_a_byte_at_a_time_is_read_in_linear_time() {
        let mut event = b"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":2},\"x\":\"".to_vec();
        event.extend(std::iter::repeat_n(b'x', 300_000));
        event.extend(b"\"}\n\n");
        let mut s = StreamUsage::new(true);
        let out: usize = event.iter().map(|b| s.feed(&[*b]).len()).sum();
        assert_eq!(out, 0, "hidden");
        assert_eq!(
            s.usage(),
            Some(Usage {
                input: 1,
                output: 2
            })
        );
    }

    proptest! {
        /// Any bytes, any split: never a panic, and without a usage event to hide every
        /// byte is passed on.
        #[test]
        fn any_stream_passes(bytes in proptest::collection::vec(any::<u8>(), 0..400), cut in 0usize..400) {
            let cut = cut.min(bytes.len());
            let mut s = StreamUsage::new(false);
            let mut out = s.feed(&bytes[..cut]);
            out.extend(s.feed(&bytes[cut..]));
            out.extend(s.finish());
            prop_assert_eq!(out, bytes);
        }

        #[test]
        fn any_body_is_estimated_or_refused(body in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = estimate_chat(&body, 100);
            let _ = chat_usage(&body);
        }
    }
}
