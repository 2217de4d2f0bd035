//! `redis_rl.openai`'s decisions: the client core's estimate of a chat completion request,
//! the usage of its reply, and the stream reader that finds (and, when the caller did not
//! ask for it, hides) the usage event.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use rl_client_core::openai::{self, StreamUsage as CoreStream, Usage};

use crate::guard::guarded;

/// `(input, output, stream, body_to_send_or_None, hide_usage)`.
type EstimateTuple<'py> = (u64, u64, bool, Option<Bound<'py, PyBytes>>, bool);

/// The estimate of a request body, or `ValueError`.
#[pyfunction]
fn estimate_chat<'py>(
    py: Python<'py>,
    body: &[u8],
    default_output: u64,
) -> PyResult<EstimateTuple<'py>> {
    guarded(|| {
        let e = openai::estimate_chat(body, default_output).map_err(PyValueError::new_err)?;
        Ok((
            e.input,
            e.output,
            e.stream,
            e.body.map(|b| PyBytes::new(py, &b)),
            e.hide_usage,
        ))
    })
}

/// `(input, output)` of a reply body's `usage`, or `None`.
#[pyfunction]
fn chat_usage(body: &[u8]) -> PyResult<Option<(u64, u64)>> {
    guarded(|| Ok(openai::chat_usage(body).map(|u| (u.input, u.output))))
}

/// The costs (or actuals) of each of a budget's limits for `input` and `output` tokens.
#[pyfunction]
fn split(names: Vec<String>, input: u64, output: u64) -> PyResult<Vec<(String, u64)>> {
    guarded(|| {
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        Ok(openai::actuals(&names, &Usage { input, output })
            .into_iter()
            .map(|(n, c)| (n.to_owned(), c))
            .collect())
    })
}

/// Reads a streamed reply as it passes (see the core's `StreamUsage`).
#[pyclass(module = "redis_rl._core")]
pub struct StreamUsage {
    inner: CoreStream,
}

#[pymethods]
impl StreamUsage {
    #[new]
    fn new(hide: bool) -> StreamUsage {
        StreamUsage {
            inner: CoreStream::new(hide),
        }
    }

    fn feed<'py>(&mut self, py: Python<'py>, chunk: &[u8]) -> PyResult<Bound<'py, PyBytes>> {
        guarded(|| Ok(PyBytes::new(py, &self.inner.feed(chunk))))
    }

    fn finish<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        guarded(|| Ok(PyBytes::new(py, &self.inner.finish())))
    }

    fn usage(&self) -> Option<(u64, u64)> {
        self.inner.usage().map(|u| (u.input, u.output))
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(estimate_chat, m)?)?;
    m.add_function(wrap_pyfunction!(chat_usage, m)?)?;
    m.add_function(wrap_pyfunction!(split, m)?)?;
    m.add_class::<StreamUsage>()?;
    Ok(())
}
