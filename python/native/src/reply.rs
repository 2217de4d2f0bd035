//! A redis-py reply (bytes or str, int, float, None, list, dict, an error instance) as the
//! client core's neutral [`Reply`]: the one conversion every binding that parses a reply
//! uses. Anything else is a `ProtocolError`, never a panic.

use pyo3::exceptions::PyBaseException;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};

use rl_client_core::{ProtocolError, Reply};

/// Deepest nesting read (a reply of the commands parsed here is at most two deep).
const MAX_DEPTH: usize = 8;

pub fn to_reply(obj: &Bound<'_, PyAny>) -> Result<Reply, ProtocolError> {
    convert(obj, 0)
}

fn convert(obj: &Bound<'_, PyAny>, depth: usize) -> Result<Reply, ProtocolError> {
    if depth > MAX_DEPTH {
        return Err(ProtocolError("a reply nested too deep".into()));
    }
    let refused = || {
        ProtocolError(format!(
            "a reply of type {} is not a Redis reply",
            type_name(obj)
        ))
    };
    if obj.is_none() {
        return Ok(Reply::Nil);
    }
    if obj.is_instance_of::<PyBool>() {
        // RESP3's boolean: the commands parsed here never send one.
        return Err(refused());
    }
    if let Ok(b) = obj.cast::<PyBytes>() {
        return Ok(Reply::Bulk(b.as_bytes().to_vec()));
    }
    if obj.is_instance_of::<PyString>() {
        let text: String = obj.extract().map_err(|_| refused())?;
        return Ok(Reply::Bulk(text.into_bytes()));
    }
    if obj.is_instance_of::<PyInt>() {
        return obj
            .extract::<i64>()
            .map(Reply::Int)
            .map_err(|_| ProtocolError("an integer reply beyond 64 bits".into()));
    }
    if let Ok(f) = obj.cast::<PyFloat>() {
        return Ok(Reply::Double(f.value()));
    }
    if let Ok(list) = obj.cast::<PyList>() {
        return list
            .iter()
            .map(|x| convert(&x, depth + 1))
            .collect::<Result<_, _>>()
            .map(Reply::Array);
    }
    if let Ok(t) = obj.cast::<PyTuple>() {
        return t
            .iter()
            .map(|x| convert(&x, depth + 1))
            .collect::<Result<_, _>>()
            .map(Reply::Array);
    }
    if let Ok(d) = obj.cast::<PyDict>() {
        return d
            .iter()
            .map(|(k, v)| Ok((convert(&k, depth + 1)?, convert(&v, depth + 1)?)))
            .collect::<Result<_, _>>()
            .map(Reply::Map);
    }
    if obj.is_instance_of::<PyBaseException>() {
        // redis-py hands an error reply inside a pipeline or an array as an exception.
        return Ok(Reply::Error(
            obj.str().map(|s| s.to_string()).unwrap_or_default(),
        ));
    }
    Err(refused())
}

fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".into())
}
