//! What a command answers, as a value. A handler returns one (or an error) once everything
//! fallible is done; the boundary writes it. So no reply is ever left half-written.

use crate::ffi::Str;
use std::ffi::CStr;

#[derive(Debug)]
pub enum Reply {
    Int(i64),
    /// RESP3's double; under RESP2 a bulk string in the shortest form that reads back as
    /// the same number.
    Double(f64),
    Null,
    /// `+OK`.
    Ok,
    /// A bulk string the module names (a field name).
    Text(&'static CStr),
    /// A bulk string of any bytes (a namespace, a key from the top-keys table).
    Bytes(Vec<u8>),
    /// A Redis string of the call, as it is (a key name).
    Key(Str),
    Array(Vec<Reply>),
    /// A short array of scalars, held inline: the hot paths' replies allocate nothing.
    Row(Row),
    /// Pairs: a map under RESP3, a flat array under RESP2.
    Map(Vec<(Reply, Reply)>),
    /// Nothing: the call answered through another channel (a keys-position request).
    Nothing,
}

/// One element of a [`Row`].
#[derive(Debug, Clone, Copy)]
pub enum Scalar {
    Int(i64),
    Double(f64),
    Null,
    /// A bulk string the module names (a pin's kind).
    Text(&'static CStr),
}

/// Up to five scalars (see [`Reply::Row`]).
#[derive(Debug, Clone, Copy)]
pub struct Row {
    items: [Scalar; 5],
    len: usize,
}

impl Row {
    pub fn items(&self) -> &[Scalar] {
        &self.items[..self.len]
    }
}

impl Reply {
    /// An array of up to five scalars (more is a bug: a panic, which the boundary answers
    /// with an error).
    pub fn row<const N: usize>(values: [Scalar; N]) -> Reply {
        let mut row = Row {
            items: [Scalar::Null; 5],
            len: N,
        };
        row.items[..N].copy_from_slice(&values);
        Reply::Row(row)
    }

    /// An array of up to four integers.
    pub fn ints<const N: usize>(values: [i64; N]) -> Reply {
        Reply::row(values.map(Scalar::Int))
    }

    /// A map whose keys are names.
    pub fn fields<const N: usize>(pairs: [(&'static CStr, Reply); N]) -> Reply {
        Reply::Map(
            pairs
                .into_iter()
                .map(|(k, v)| (Reply::Text(k), v))
                .collect(),
        )
    }

    /// A count as an integer reply (saturating: a reply holds an `i64`).
    pub fn count(v: u64) -> Reply {
        Reply::Int(v.min(i64::MAX as u64) as i64)
    }
}
