//! Reading the module's array replies without trusting their shape.

use redis::Value;

use crate::Error;

fn bad(what: &str, v: &Value) -> Error {
    Error::Reply(format!("{what}: {v:?}"))
}

/// The elements of an array reply of exactly `len` items.
pub(crate) fn array(v: Value, len: usize) -> Result<Vec<Value>, Error> {
    match v {
        Value::Array(items) if items.len() == len => Ok(items),
        other => Err(bad(&format!("expected an array of {len}"), &other)),
    }
}

/// A non-negative integer element.
pub(crate) fn count(v: &Value) -> Result<u64, Error> {
    match v {
        Value::Int(i) if *i >= 0 => Ok(*i as u64),
        other => Err(bad("expected a non-negative integer", other)),
    }
}

/// A number element: a double (RESP3) or its text (RESP2 bulk string).
pub(crate) fn number(v: &Value) -> Result<f64, Error> {
    let parsed = match v {
        Value::Double(d) => Some(*d),
        Value::Int(i) => Some(*i as f64),
        Value::BulkString(bytes) => std::str::from_utf8(bytes).ok().and_then(|s| s.parse().ok()),
        Value::SimpleString(s) => s.parse().ok(),
        _ => None,
    };
    parsed
        .filter(|d: &f64| d.is_finite())
        .ok_or_else(|| bad("expected a number", v))
}

/// An integer reply (`RL.RETURN`).
pub(crate) fn integer(v: Value) -> Result<u64, Error> {
    count(&v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_in_both_protocols() {
        assert_eq!(number(&Value::Double(2.5)).unwrap(), 2.5);
        assert_eq!(number(&Value::BulkString(b"0.25".to_vec())).unwrap(), 0.25);
        assert!(number(&Value::BulkString(b"nan".to_vec())).is_err());
        assert!(number(&Value::Nil).is_err());
    }

    #[test]
    fn shapes_are_checked() {
        assert!(array(Value::Array(vec![Value::Int(1)]), 4).is_err());
        assert!(count(&Value::Int(-1)).is_err());
        assert_eq!(count(&Value::Int(7)).unwrap(), 7);
    }
}
