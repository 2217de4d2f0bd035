//! Writing a command's reply.

use super::{Ctx, Str};
use crate::reply::{Reply, Scalar};
use redis_module::raw;
use std::ffi::CStr;
use std::os::raw::{c_int, c_long};

/// Writes `r` as the call's reply.
pub fn reply(ctx: Ctx, r: &Reply) {
    match r {
        Reply::Int(v) => reply_integer(ctx, *v),
        Reply::Double(v) => reply_double(ctx, *v, is_resp3(ctx)),
        Reply::Null => reply_null(ctx),
        Reply::Ok => reply_ok(ctx),
        Reply::Text(s) => reply_text(ctx, s),
        Reply::Bytes(b) => reply_bytes(ctx, b),
        Reply::Key(s) => reply_string(ctx, *s),
        Reply::Array(items) => {
            reply_array(ctx, items.len());
            for item in items {
                reply(ctx, item);
            }
        }
        Reply::Row(row) => {
            reply_array(ctx, row.items().len());
            let mut resp3 = None;
            for item in row.items() {
                match *item {
                    Scalar::Int(v) => reply_integer(ctx, v),
                    Scalar::Double(v) => {
                        let resp3 = *resp3.get_or_insert_with(|| is_resp3(ctx));
                        reply_double(ctx, v, resp3)
                    }
                    Scalar::Null => reply_null(ctx),
                    Scalar::Text(s) => reply_text(ctx, s),
                }
            }
        }
        Reply::Map(pairs) => {
            reply_map(ctx, pairs.len());
            for (k, v) in pairs {
                reply(ctx, k);
                reply(ctx, v);
            }
        }
        Reply::Nothing => {}
    }
}

/// Writes an integer reply.
pub fn reply_int(ctx: Ctx, v: i64) {
    reply_integer(ctx, v);
}

fn reply_integer(ctx: Ctx, v: i64) {
    rm!(RedisModule_ReplyWithLongLong(ctx.0, v));
}

/// Whether the caller speaks RESP3 (asked once per reply, not per number).
fn is_resp3(ctx: Ctx) -> bool {
    rm!(RedisModule_GetContextFlags(ctx.0)) as u32 & raw::REDISMODULE_CTX_FLAGS_RESP3 != 0
}

/// A double: RESP3's double type, or under RESP2 a bulk string in the shortest form that
/// reads back as the same number (`0.1`, not Redis's `%.17g` `0.10000000000000001`, which
/// also costs some 4,000 instructions to format). Not inlined: the benchmark profile
/// reports its cost by name.
#[inline(never)]
fn reply_double(ctx: Ctx, v: f64, resp3: bool) {
    if resp3 {
        rm!(RedisModule_ReplyWithDouble(ctx.0, v));
        return;
    }
    reply_bytes(ctx, crate::number::Num::new(v).bytes());
}

fn reply_array(ctx: Ctx, len: usize) {
    rm!(RedisModule_ReplyWithArray(ctx.0, len as c_long));
}

/// A map of `len` pairs (a flat array of `2 * len` under RESP2).
fn reply_map(ctx: Ctx, len: usize) {
    rm!(RedisModule_ReplyWithMap(ctx.0, len as c_long));
}

/// A bulk string.
fn reply_text(ctx: Ctx, s: &CStr) {
    rm!(RedisModule_ReplyWithCString(ctx.0, s.as_ptr()));
}

/// A bulk string of any bytes.
fn reply_bytes(ctx: Ctx, s: &[u8]) {
    rm!(RedisModule_ReplyWithStringBuffer(
        ctx.0,
        s.as_ptr().cast(),
        s.len()
    ));
}

/// A Redis string as it is (a key name, say).
fn reply_string(ctx: Ctx, s: Str) {
    rm!(RedisModule_ReplyWithString(ctx.0, s.0));
}

fn reply_null(ctx: Ctx) {
    rm!(RedisModule_ReplyWithNull(ctx.0));
}

fn reply_ok(ctx: Ctx) {
    rm!(RedisModule_ReplyWithSimpleString(ctx.0, c"OK".as_ptr()));
}

/// `msg` must hold its own error code (`ERR ...`, `WRONGTYPE ...`).
pub fn reply_error(ctx: Ctx, msg: &CStr) {
    rm!(RedisModule_ReplyWithError(ctx.0, msg.as_ptr()));
}

pub fn reply_wrong_arity(ctx: Ctx) -> c_int {
    rm!(RedisModule_WrongArity(ctx.0))
}
