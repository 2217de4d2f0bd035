//! The OpenAI-compatible chat completion's decisions: the client core's estimate of a
//! request, the usage of its reply, and the stream reader that finds (and, when the caller
//! did not ask for it, hides) the usage event.

use napi::bindgen_prelude::Buffer;
use napi_derive::napi;

use rl_client_core::openai::{self, StreamUsage as CoreStream, Usage};

use crate::budget::NamedCost;
use crate::guard::{count, guarded, invalid};

/// What one chat completion reserves.
#[napi(object)]
pub struct ChatEstimate {
    pub input: f64,
    pub output: f64,
    pub stream: bool,
    /// The body to send instead (the stream asks for its usage), when it changed.
    pub body: Option<Buffer>,
    /// Whether the caller did not ask for the usage event (so it is kept from it).
    pub hide_usage: bool,
}

/// What a completion used.
#[napi(object)]
pub struct ChatUsage {
    pub input: f64,
    pub output: f64,
}

fn usage(u: Usage) -> ChatUsage {
    ChatUsage {
        input: u.input as f64,
        output: u.output as f64,
    }
}

/// The estimate of a request body (`max_tokens` or `default_output` for the output), or an
/// `Error` for a body that is no chat completion request.
#[napi]
pub fn estimate_chat(body: Buffer, default_output: f64) -> napi::Result<ChatEstimate> {
    guarded(|| {
        let e = openai::estimate_chat(&body, count("defaultOutput", default_output)?)
            .map_err(invalid)?;
        Ok(ChatEstimate {
            input: e.input as f64,
            output: e.output as f64,
            stream: e.stream,
            body: e.body.map(Into::into),
            hide_usage: e.hide_usage,
        })
    })
}

/// The `usage` of a reply body, or null.
#[napi]
pub fn chat_usage(body: Buffer) -> napi::Result<Option<ChatUsage>> {
    guarded(|| Ok(openai::chat_usage(&body).map(usage)))
}

/// The costs (or actuals) of each of a budget's limits for `input` and `output` tokens.
#[napi]
pub fn split_usage(names: Vec<String>, input: f64, output: f64) -> napi::Result<Vec<NamedCost>> {
    guarded(|| {
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let u = Usage {
            input: count("input", input)?,
            output: count("output", output)?,
        };
        Ok(openai::actuals(&names, &u)
            .into_iter()
            .map(|(n, c)| NamedCost {
                name: n.to_owned(),
                tokens: c as f64,
            })
            .collect())
    })
}

/// Reads a streamed reply (server-sent events) as it passes.
#[napi]
pub struct StreamUsage {
    inner: CoreStream,
}

#[napi]
impl StreamUsage {
    /// `hide`: keep the usage event from the caller (the estimate's `hideUsage`).
    #[napi(constructor)]
    pub fn new(hide: bool) -> StreamUsage {
        StreamUsage {
            inner: CoreStream::new(hide),
        }
    }

    /// Takes the next bytes of the stream; returns what to pass on.
    #[napi]
    pub fn feed(&mut self, chunk: Buffer) -> napi::Result<Buffer> {
        guarded(|| Ok(self.inner.feed(&chunk).into()))
    }

    /// The stream ended: what is left to pass on.
    #[napi]
    pub fn finish(&mut self) -> napi::Result<Buffer> {
        guarded(|| Ok(self.inner.finish().into()))
    }

    /// The usage seen so far.
    #[napi]
    pub fn usage(&self) -> Option<ChatUsage> {
        self.inner.usage().map(usage)
    }
}
