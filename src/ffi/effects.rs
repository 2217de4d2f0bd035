//! Sending commands to replicas and the AOF (`RedisModule_Replicate`) and writing them on
//! AOF rewrite (`RedisModule_EmitAOF`).
//!
//! Both take a format string and C varargs. Here the arguments are a typed list
//! ([`EffectArg`]); the format is built from it and the call made with as many 64-bit
//! words as it needs. Every kind these formats read (`s`: a string pointer, `b`: a pointer
//! and a `size_t`, `c`: a C string, `l`: a `long long`) is one 64-bit integer-class word in
//! the C calling conventions of the 64-bit targets Redis runs on (x86-64 System V,
//! AArch64), so words of one Rust type carry them all.

use super::{Ctx, Str};
use redis_module::raw::RedisModuleIO;
use std::ffi::CStr;
use std::os::raw::c_char;

const _: () = assert!(std::mem::size_of::<usize>() == 8, "64-bit targets only");

/// One argument of an effect.
#[derive(Clone, Copy)]
pub enum EffectArg<'a> {
    /// A Redis string the running command holds (a key, an argument passed on as it is).
    Str(Str),
    /// Bytes Redis copies into a new string (a number formatted here).
    Bytes(&'a [u8]),
    /// A keyword.
    Text(&'static CStr),
    /// An integer Redis formats.
    Int(i64),
}

/// The most words an effect may take (the longest ones the module sends, a pinned bucket's
/// `RL.SETSTATE` with a hold and a version, and `RL.SETSHARES`, use 24 and 22). Kept small:
/// every grant's effect builds this buffer.
const MAX_WORDS: usize = 24;

/// The format string and the words of `args`.
struct Call {
    format: [u8; MAX_WORDS + 1],
    words: [usize; MAX_WORDS],
    len: usize,
}

impl Call {
    fn new(args: &[EffectArg]) -> Call {
        let mut call = Call {
            format: [0; MAX_WORDS + 1],
            words: [0; MAX_WORDS],
            len: 0,
        };
        for (i, a) in args.iter().enumerate() {
            let (kind, first, second) = match *a {
                EffectArg::Str(s) => (b's', s.0 as usize, None),
                EffectArg::Bytes(b) => (b'b', b.as_ptr() as usize, Some(b.len())),
                EffectArg::Text(t) => (b'c', t.as_ptr() as usize, None),
                EffectArg::Int(v) => (b'l', v as usize, None),
            };
            assert!(
                call.len + 1 + second.is_some() as usize <= MAX_WORDS,
                "an effect with too many arguments"
            );
            call.format[i] = kind;
            call.words[call.len] = first;
            call.len += 1;
            if let Some(w) = second {
                call.words[call.len] = w;
                call.len += 1;
            }
        }
        call
    }

    fn format(&self) -> *const c_char {
        self.format.as_ptr().cast()
    }
}

/// Calls the variadic `$f($a, $b, $fmt, w[0], .., w[k - 1])` for `k = $n`.
macro_rules! variadic {
    ($f:ident, $a:expr, $b:expr, $fmt:expr, $w:expr, $n:expr; $($k:literal: [$($i:literal)*])*) => {
        match $n {
            $($k => unsafe { $f($a, $b, $fmt $(, $w[$i])*) },)*
            _ => unreachable!("at most MAX_WORDS words"),
        }
    };
}

/// Calls `$f(first, cmd, format, words...)` for the call `$c`.
macro_rules! call_with_words {
    ($f:ident, $first:expr, $cmd:expr, $c:expr) => {
        variadic!($f, $first, $cmd, $c.format(), $c.words, $c.len;
            0: [] 1: [0] 2: [0 1] 3: [0 1 2] 4: [0 1 2 3] 5: [0 1 2 3 4] 6: [0 1 2 3 4 5]
            7: [0 1 2 3 4 5 6] 8: [0 1 2 3 4 5 6 7] 9: [0 1 2 3 4 5 6 7 8]
            10: [0 1 2 3 4 5 6 7 8 9] 11: [0 1 2 3 4 5 6 7 8 9 10]
            12: [0 1 2 3 4 5 6 7 8 9 10 11] 13: [0 1 2 3 4 5 6 7 8 9 10 11 12]
            14: [0 1 2 3 4 5 6 7 8 9 10 11 12 13] 15: [0 1 2 3 4 5 6 7 8 9 10 11 12 13 14]
            16: [0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15]
            17: [0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16]
            18: [0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17]
            19: [0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18]
            20: [0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19]
            21: [0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20]
            22: [0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21]
            23: [0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22]
            24: [0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23])
    };
}

/// Sends `cmd args...` to replicas and the AOF after the running command.
pub fn replicate(ctx: Ctx, cmd: &CStr, args: &[EffectArg]) {
    let call = Call::new(args);
    let f = api!(RedisModule_Replicate);
    // The status is ignored: it fails only for a command Redis does not know, and this
    // module sends only its own commands, `DEL` and `PERSIST`.
    let _ = call_with_words!(f, ctx.0, cmd.as_ptr(), call);
}

/// Sends `cmd key at rate cap` (a take's effect: the hot path) with a fixed format when the
/// limit is two strings the command holds, without building one argument by argument.
pub fn replicate_head(ctx: Ctx, cmd: &CStr, key: Str, at: &[u8], rate: EffectArg, cap: EffectArg) {
    let (EffectArg::Str(rate), EffectArg::Str(cap)) = (rate, cap) else {
        return replicate(
            ctx,
            cmd,
            &[EffectArg::Str(key), EffectArg::Bytes(at), rate, cap],
        );
    };
    let f = api!(RedisModule_Replicate);
    // SAFETY: the format names four arguments of these kinds (`b`: a pointer and its
    // length), each a live string or buffer for the call. The status is ignored, as above.
    let _ = unsafe {
        f(
            ctx.0,
            cmd.as_ptr(),
            c"sbss".as_ptr(),
            key.0,
            at.as_ptr(),
            at.len(),
            rate.0,
            cap.0,
        )
    };
}

/// The AOF being rewritten.
pub struct Aof(pub(super) *mut RedisModuleIO);

/// Writes `cmd args...` into the AOF being rewritten.
pub fn emit_aof(aof: &Aof, cmd: &CStr, args: &[EffectArg]) {
    let call = Call::new(args);
    let f = api!(RedisModule_EmitAOF);
    call_with_words!(f, aof.0, cmd.as_ptr(), call);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn format_and_words_follow_the_arguments() {
        let bytes = b"123";
        let c = Call::new(&[
            EffectArg::Bytes(bytes),
            EffectArg::Text(c"ADD"),
            EffectArg::Int(-7),
        ]);
        assert_eq!(&c.format[..4], b"bcl\0");
        assert_eq!(c.len, 4);
        assert_eq!(c.words[0], bytes.as_ptr() as usize);
        assert_eq!(c.words[1], 3);
        assert_eq!(c.words[3] as i64, -7);
    }

    /// A call of exactly `MAX_WORDS` words fits, whatever kinds of arguments end it (the
    /// longest effect, a pinned bucket's, ends with one-word integers).
    #[test]
    fn an_effect_of_exactly_the_most_words_fits() {
        let bytes = b"9";
        let mut args = vec![EffectArg::Bytes(bytes); MAX_WORDS / 2 - 1];
        args.extend([EffectArg::Int(1), EffectArg::Int(2)]);
        assert_eq!(Call::new(&args).len, MAX_WORDS);
        let too_many = std::panic::catch_unwind(|| {
            let mut more = args.clone();
            more.push(EffectArg::Int(3));
            Call::new(&more).len
        });
        assert!(too_many.is_err());
    }
}
