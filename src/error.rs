//! The one error type of the commands, with the texts users see.

use crate::ffi::{self, Ctx};
use std::ffi::CString;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// Wrong number of arguments: Redis's own message.
    Arity,
    /// The key holds another type: Redis's own `WRONGTYPE` message.
    WrongType,
    /// `ERR <message>`.
    Invalid(&'static str),
    /// `ERR unknown option '<what>'`.
    UnknownOption(String),
    /// `ERR option '<what>' given twice`.
    DuplicateOption(String),
    /// `ERR <message> (<hint>)`: an error with advice made from the call's own arguments.
    Hinted(&'static str, String),
}

impl Error {
    pub fn reply(&self, ctx: Ctx) {
        match self {
            Error::Arity => {
                ffi::reply_wrong_arity(ctx);
            }
            Error::WrongType => ffi::reply_error(
                ctx,
                c"WRONGTYPE Operation against a key holding the wrong kind of value",
            ),
            other => {
                let text = match other {
                    Error::Invalid(msg) => format!("ERR {msg}"),
                    Error::UnknownOption(opt) => format!("ERR unknown option '{opt}'"),
                    Error::DuplicateOption(opt) => format!("ERR option '{opt}' given twice"),
                    Error::Hinted(msg, hint) => format!("ERR {msg} ({hint})"),
                    _ => unreachable!(),
                };
                // The texts are ours or lossy-decoded and cut short: a NUL cannot occur.
                let text = CString::new(text).unwrap_or_else(|_| c"ERR invalid input".into());
                ffi::reply_error(ctx, &text);
            }
        }
    }
}

impl From<rl_core::LimitError> for Error {
    fn from(e: rl_core::LimitError) -> Error {
        Error::Invalid(e.message())
    }
}

impl From<rl_core::StateError> for Error {
    fn from(e: rl_core::StateError) -> Error {
        Error::Invalid(e.message())
    }
}

impl From<rl_core::PermitError> for Error {
    fn from(e: rl_core::PermitError) -> Error {
        Error::Invalid(e.message())
    }
}

impl From<rl_core::LeaseError> for Error {
    fn from(e: rl_core::LeaseError) -> Error {
        Error::Invalid(e.message())
    }
}

pub type Result<T> = std::result::Result<T, Error>;
