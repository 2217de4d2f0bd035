//! The `rl-shares` module type: a key holding the holders of one rate share
//! (`RL.SHARE`). A type of its own, so a bucket or semaphore command on a share key (and
//! the reverse) is a `WRONGTYPE` error.
//!
//! RDB encoding version 2, per key: `rate cap version count` then per holder `id want
//! rate burst lease_end held_rate held_burst held_until` (doubles, unsigneds, the id a
//! string), then the pin: `kind` (0: none; 1 rate, 2 BLOCK, 3 EXEMPT) and, with one,
//! `until` and (a rate pin) its `rate cap`. Version 1 (no pin) still loads. The key's
//! expiry is its last entry's end, later under a pin ([`ShareTable::expires_at`]).
//!
//! Effects: `RL.SETSHARES key rate cap version prune_at holder
//! want,rate,burst,lease_end,held_rate,held_burst,held_until [pin]`: the limit, the
//! entries ended at `prune_at` dropped (0 on AOF rewrite: no entry ends at 0), one entry
//! set (its numbers in one argument: see [`EntryText`]), and the key's pin: `pin` is
//! `kind,until` (`BLOCK` 2, `EXEMPT` 3) or `1,until,rate,cap`, and without it the key has
//! none (so effects from before pins still apply). `RL.SETSHARES key rate cap version
//! prune_at pin` sets the pin alone (`0`: none), for `RL.PIN`/`RL.UNPIN` and a pinned key
//! with no holder. Positional, so that each call's effect makes as few objects in the
//! server as it can. Checked by [`ShareTable::apply_pinned`], which runs the checks RDB
//! load runs ([`ShareTable::validate_pinned`]) before anything changes.

pub mod command;
pub mod pin;
pub mod setshares;

use crate::error::{Error, Result};
use crate::ffi::{Access, Aof, Ctx, Digest, EffectArg, Io, OpenKey, Str, Value};
use crate::number::Num;
use crate::observe::stats;
use rl_core::pin::PinKind;
use rl_core::share::{Holder, SharePin, MAX_HOLDER_LEN};
use rl_core::{Limit, Nanos, ShareTable, MAX_HOLDERS};

pub const ENCODING_VERSION: i32 = 2;

pub fn save(io: &Io, t: &ShareTable) {
    io.save_double(t.limit().rate());
    io.save_double(t.limit().cap());
    io.save_unsigned(t.version());
    io.save_unsigned(t.holders().len() as u64);
    for h in t.holders() {
        io.save_bytes(&h.id);
        io.save_double(h.want);
        io.save_double(h.rate);
        io.save_double(h.burst);
        io.save_unsigned(h.lease_end);
        io.save_double(h.held_rate);
        io.save_double(h.held_burst);
        io.save_unsigned(h.held_until);
    }
    match t.pin() {
        None => io.save_unsigned(0),
        Some(p) => {
            io.save_unsigned(p.kind.code());
            io.save_unsigned(p.until);
            if let Some(l) = p.limit {
                io.save_double(l.rate());
                io.save_double(l.cap());
            }
        }
    }
}

/// Reads one value; `None` for an unknown encoding, an I/O error or a table
/// [`ShareTable::validate`] refuses.
pub fn load(io: &Io, encver: i32) -> Option<ShareTable> {
    if !(1..=ENCODING_VERSION).contains(&encver) {
        return None;
    }
    let rate = io.load_double();
    let cap = io.load_double();
    let version = io.load_unsigned();
    let count = io.load_unsigned();
    // A corrupt count must not make us read, or allocate, without end.
    if io.failed() || count > MAX_HOLDERS as u64 {
        return None;
    }
    let mut holders = Vec::with_capacity(count as usize);
    for _ in 0..count {
        // A longer id is refused here, before it is copied.
        let id = io.load_bytes(MAX_HOLDER_LEN)?;
        let h = Holder {
            id,
            want: io.load_double(),
            rate: io.load_double(),
            burst: io.load_double(),
            lease_end: io.load_unsigned(),
            held_rate: io.load_double(),
            held_burst: io.load_double(),
            held_until: io.load_unsigned(),
        };
        if io.failed() {
            return None;
        }
        holders.push(h);
    }
    let pin = if encver >= 2 { load_pin(io)? } else { None };
    let t = ShareTable::validate_pinned(rate, cap, version, holders, pin).ok()?;
    stats::SHARE_HOLDERS.add_shared(t.holders().len() as u64);
    pinned_keys(false, t.pin().is_some());
    Some(t)
}

/// The pin after the holders (encoding 2): `Some(None)` for none, `None` for a bad one.
fn load_pin(io: &Io) -> Option<Option<SharePin>> {
    let code = io.load_unsigned();
    if io.failed() {
        return None;
    }
    if code == 0 {
        return Some(None);
    }
    let kind = PinKind::from_code(code)?;
    let until = io.load_unsigned();
    let limit = if kind == PinKind::Rate {
        let (rate, cap) = (io.load_double(), io.load_double());
        Some(Limit::new(rate, cap).ok()?)
    } else {
        None
    };
    if io.failed() {
        return None;
    }
    SharePin::new(kind, limit, until).ok().map(Some)
}

/// Counts a key's pin coming (`after`) or going (`before`) in the pinned-keys gauge.
pub fn pinned_keys(before: bool, after: bool) {
    match (before, after) {
        (false, true) => stats::PINNED_KEYS.add_shared(1),
        (true, false) => stats::PINNED_KEYS.sub_shared(1),
        _ => {}
    }
}

/// Numbers joined by commas into one effect argument, in `N` bytes (41 per number: the
/// longest plain decimal text of one): each argument of an effect costs the server an
/// object to make and free.
pub struct Joined<const N: usize> {
    buf: [u8; N],
    len: usize,
}

impl<const N: usize> Joined<N> {
    fn empty() -> Self {
        Joined {
            buf: [0; N],
            len: 0,
        }
    }

    /// Appends one field (after a comma unless it is the first).
    fn push(&mut self, b: &[u8]) {
        if self.len > 0 {
            self.buf[self.len] = b',';
            self.len += 1;
        }
        self.buf[self.len..self.len + b.len()].copy_from_slice(b);
        self.len += b.len();
    }

    pub fn bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

/// A pin as the last argument of its effect: `kind,until` or `1,until,rate,cap`; `0` for
/// none.
pub type PinText = Joined<{ 4 * 41 }>;

impl PinText {
    pub fn new(pin: Option<&SharePin>) -> PinText {
        let mut t = PinText::empty();
        let Some(p) = pin else {
            t.push(b"0");
            return t;
        };
        t.push(Num::int(p.kind.code()).bytes());
        t.push(Num::int(p.until).bytes());
        if let Some(l) = p.limit {
            t.push(Num::new(l.rate()).bytes());
            t.push(Num::new(l.cap()).bytes());
        }
        t
    }
}

/// Reads a pin's text (see [`PinText`]): `Some(None)` for `0`, `None` for anything this
/// module does not write.
pub fn parse_pin(text: &[u8]) -> Option<Option<SharePin>> {
    use crate::args::{parse_integer, parse_number};
    if text == b"0" {
        return Some(None);
    }
    let mut fields = text.split(|&c| c == b',');
    let kind = PinKind::from_code(parse_integer(fields.next()?)?)?;
    let until = parse_integer(fields.next()?)?;
    let limit = if kind == PinKind::Rate {
        let rate = parse_number(fields.next()?)?;
        let cap = parse_number(fields.next()?)?;
        Some(Limit::new(rate, cap).ok()?)
    } else {
        None
    };
    if fields.next().is_some() {
        return None;
    }
    SharePin::new(kind, limit, until).ok().map(Some)
}

/// An entry's numbers as one argument, `want,rate,burst,lease_end,held_rate,held_burst,
/// held_until`: plain decimal text a reader can follow, in one string.
pub type EntryText = Joined<{ 7 * 41 }>;

impl EntryText {
    pub fn new(h: &Holder) -> EntryText {
        EntryText::build(h, None)
    }

    /// As [`EntryText::new`], reusing the texts of the numbers the last call wrote where
    /// they are the same (compared bit for bit): a holder refreshing an unchanged share,
    /// or a fleet of equal wants, sends the same numbers call after call.
    fn recent(h: &Holder) -> EntryText {
        RECENT_ENTRY.with(|r| EntryText::build(h, Some(r)))
    }

    fn build(h: &Holder, recent: Option<&mut RecentEntry>) -> EntryText {
        let mut t = EntryText::empty();
        let (given, held) = match recent {
            Some(r) => (Some(&mut r.given), Some(&mut r.held)),
            None => (None, None),
        };
        t.push_numbers([h.want, h.rate, h.burst], given);
        t.push(Num::int(h.lease_end).bytes());
        t.push_numbers([h.held_rate, h.held_burst], held);
        t.push(Num::int(h.held_until).bytes());
        t
    }

    /// Appends the texts of `xs`, from `recent` if they are its numbers (else formatted,
    /// and kept there).
    fn push_numbers<const N: usize>(&mut self, xs: [f64; N], recent: Option<&mut Texts<N>>) {
        let bits = xs.map(f64::to_bits);
        if let Some(r) = recent.as_ref().filter(|r| r.len > 0 && r.bits == bits) {
            self.push(&r.buf[..r.len]);
            return;
        }
        let start = self.len + usize::from(self.len > 0);
        for x in xs {
            self.push(Num::new(x).bytes());
        }
        if let Some(r) = recent {
            let text = &self.buf[start..self.len];
            r.buf[..text.len()].copy_from_slice(text);
            (r.bits, r.len) = (bits, text.len());
        }
    }
}

/// The texts of `N` numbers written together (comma-separated), and the numbers' bits;
/// empty (`len` 0) until a call fills it.
struct Texts<const N: usize> {
    bits: [u64; N],
    buf: [u8; 3 * 41],
    len: usize,
}

impl<const N: usize> Texts<N> {
    const EMPTY: Texts<N> = Texts {
        bits: [0; N],
        buf: [0; 3 * 41],
        len: 0,
    };
}

/// The last entry a call wrote: its given share's numbers and its held share's.
struct RecentEntry {
    given: Texts<3>,
    held: Texts<2>,
}

static RECENT_ENTRY: crate::ffi::MainThread<RecentEntry> =
    crate::ffi::MainThread::new(RecentEntry {
        given: Texts::EMPTY,
        held: Texts::EMPTY,
    });

/// Reads an entry's numbers (see [`EntryText`]) for holder `id`; `None` unless exactly
/// seven fields, numbers where numbers go and integers where times go.
pub fn parse_entry(id: &[u8], text: &[u8]) -> Option<Holder> {
    use crate::args::{parse_integer, parse_number};
    let mut fields = text.split(|&c| c == b',');
    let mut num = || parse_number(fields.next()?);
    let (want, rate, burst) = (num()?, num()?, num()?);
    let lease_end = parse_integer(fields.next()?)?;
    let mut num = || parse_number(fields.next()?);
    let (held_rate, held_burst) = (num()?, num()?);
    let held_until = parse_integer(fields.next()?)?;
    if fields.next().is_some() {
        return None;
    }
    Some(Holder {
        id: id.into(),
        want,
        rate,
        burst,
        lease_end,
        held_rate,
        held_burst,
        held_until,
    })
}

/// The texts of a limit in an effect: the caller's own arguments where its limit decided
/// the call (nothing to format), else the stored limit's shortest texts.
pub enum LimitText {
    Args { rate: Str, cap: Str },
    Stored,
}

/// The effect that sets `table`'s limit, the entry of `holder` (its id: a Redis string
/// where the caller has one) to the numbers `entry` (none: the pin alone), and the
/// table's pin, dropping entries ended at `prune` first.
fn with_effect(
    table: &ShareTable,
    key: Str,
    limit: LimitText,
    entry: Option<(EffectArg, &EntryText)>,
    prune: Option<Nanos>,
    send: impl FnOnce(&[EffectArg]),
) {
    let limit = match limit {
        LimitText::Args { rate, cap } => Err((rate, cap)),
        LimitText::Stored => Ok((
            Num::new(table.limit().rate()),
            Num::new(table.limit().cap()),
        )),
    };
    let (version, at) = (Num::int(table.version()), Num::int(prune.unwrap_or(0)));
    // An entry without a pin leaves no pin: only a pinned table pays for the text.
    let pin = (entry.is_none() || table.pin().is_some()).then(|| PinText::new(table.pin()));
    let mut args = [EffectArg::Int(0); 8];
    let mut len = 0;
    let mut push = |a| {
        args[len] = a;
        len += 1;
    };
    push(EffectArg::Str(key));
    match &limit {
        Err((rate, cap)) => {
            push(EffectArg::Str(*rate));
            push(EffectArg::Str(*cap));
        }
        Ok((rate, cap)) => {
            push(EffectArg::Bytes(rate.bytes()));
            push(EffectArg::Bytes(cap.bytes()));
        }
    }
    push(EffectArg::Bytes(version.bytes()));
    push(EffectArg::Bytes(at.bytes()));
    if let Some((holder, entry)) = entry {
        push(holder);
        push(EffectArg::Bytes(entry.bytes()));
    }
    if let Some(p) = &pin {
        push(EffectArg::Bytes(p.bytes()));
    }
    send(&args[..len]);
}

/// Replicates what a call did: the limit, entries ended at `now` dropped, entry `index`,
/// the pin.
pub fn propagate(
    ctx: Ctx,
    key: Str,
    limit: LimitText,
    holder: Str,
    table: &ShareTable,
    index: usize,
    now: Nanos,
) {
    let entry = EntryText::recent(&table.holders()[index]);
    with_effect(
        table,
        key,
        limit,
        Some((EffectArg::Str(holder), &entry)),
        Some(now),
        |args| crate::ffi::replicate(ctx, c"RL.SETSHARES", args),
    );
}

/// Replicates a pin set or removed at `now` (entries ended then dropped).
pub fn propagate_pin(ctx: Ctx, key: Str, table: &ShareTable, now: Nanos) {
    with_effect(table, key, LimitText::Stored, None, Some(now), |args| {
        crate::ffi::replicate(ctx, c"RL.SETSHARES", args)
    });
}

pub fn rewrite(aof: &Aof, key: Str, t: &ShareTable) {
    if t.holders().is_empty() {
        // A pinned key with no holder: the pin alone.
        with_effect(t, key, LimitText::Stored, None, None, |args| {
            crate::ffi::emit_aof(aof, c"RL.SETSHARES", args)
        });
    }
    for h in t.holders() {
        let entry = EntryText::new(h);
        let holder = EffectArg::Bytes(&h.id);
        with_effect(
            t,
            key,
            LimitText::Stored,
            Some((holder, &entry)),
            None,
            |args| crate::ffi::emit_aof(aof, c"RL.SETSHARES", args),
        );
    }
    // The key's actual expiry follows (Redis appends PEXPIREAT when it has one).
    crate::ffi::emit_aof(aof, c"PERSIST", &[EffectArg::Str(key)]);
}

pub fn mem_usage(t: &ShareTable) -> usize {
    std::mem::size_of::<ShareTable>()
        + std::mem::size_of_val(t.holders())
        + t.holders().iter().map(|h| h.id.len()).sum::<usize>()
}

pub fn digest(md: &Digest, t: &ShareTable) {
    md.add(t.limit().rate().to_bits());
    md.add(t.limit().cap().to_bits());
    md.add(t.version());
    for h in t.holders() {
        md.add(h.id.len() as u64);
        for chunk in h.id.chunks(8) {
            let mut w = [0u8; 8];
            w[..chunk.len()].copy_from_slice(chunk);
            md.add(u64::from_le_bytes(w));
        }
        for x in [h.want, h.rate, h.burst, h.held_rate, h.held_burst] {
            md.add(x.to_bits());
        }
        md.add(h.lease_end);
        md.add(h.held_until);
    }
    if let Some(p) = t.pin() {
        // A marker no holder's id length can be (at most 64).
        md.add(u64::MAX);
        md.add(p.kind.code());
        md.add(p.until);
        if let Some(l) = p.limit {
            md.add(l.rate().to_bits());
            md.add(l.cap().to_bits());
        }
    }
    md.end_sequence();
}

pub fn freed(t: ShareTable) {
    stats::SHARE_HOLDERS.sub_shared(t.holders().len() as u64);
    pinned_keys(t.pin().is_some(), false);
}

pub fn unlinked(t: &ShareTable) {
    stats::SHARE_HOLDERS_DROPPED.add_shared(t.holders().len() as u64);
}

pub fn copied(t: &ShareTable) -> ShareTable {
    stats::SHARE_HOLDERS.add_shared(t.holders().len() as u64);
    pinned_keys(false, t.pin().is_some());
    t.clone()
}

/// A share key opened for one command; closed (and signalled if written) when dropped.
pub struct ShareKey {
    key: OpenKey,
    modified: std::cell::Cell<bool>,
}

impl ShareKey {
    pub fn open(ctx: Ctx, name: Str) -> ShareKey {
        ShareKey {
            key: OpenKey::open(ctx, name, Access::Write),
            modified: std::cell::Cell::new(false),
        }
    }

    /// The table held here: `None` if the key does not exist, `WRONGTYPE` if it holds
    /// something else (a bucket or a semaphore included).
    // The table is owned by Redis's keyspace, not by this handle: borrowing it mutably
    // through `&self` lets a command change it and then update the key's expiry.
    #[allow(clippy::mut_from_ref)]
    pub fn table(&self) -> Result<Option<&mut ShareTable>> {
        match self.key.value() {
            Value::Empty => Ok(None),
            Value::Shares(t) => Ok(Some(t)),
            _ => Err(Error::WrongType),
        }
    }

    /// Stores `t` as the key's value (a new key), expiring at `expires_at`.
    pub fn create(&self, t: ShareTable, expires_at: Nanos) {
        let n = t.holders().len() as u64;
        let pinned = t.pin().is_some();
        stats::SHARE_HOLDERS.add_shared(n);
        if self.key.set_shares(t).is_err() {
            stats::SHARE_HOLDERS.sub_shared(n);
            return;
        }
        pinned_keys(false, pinned);
        self.expire_at(expires_at);
    }

    /// After the table was changed in place: the key expires when its last entry ends,
    /// or later under a pin ([`rl_core::NEVER`]: not while it holds). Set without reading
    /// the old expiry: every write moves it, almost always.
    pub fn expire_at(&self, at: Nanos) {
        self.modified.set(true);
        let ms = rl_core::expiry_ms(at);
        self.key.set_expire_ms(ms);
    }

    pub fn delete(&self) {
        self.modified.set(true);
        self.key.delete();
    }

    /// The key's name (for effects).
    pub fn name(&self) -> Str {
        self.key.name()
    }
}

impl Drop for ShareKey {
    /// Signals the key if a write changed it (then the key closes).
    fn drop(&mut self) {
        if self.modified.get() {
            self.key.signal_modified();
        }
    }
}

/// Counts entries leaving (`gone`) and entering (`came`) tables.
pub fn moved(gone: usize, came: usize) {
    stats::SHARE_HOLDERS_DROPPED.add_shared(gone as u64);
    stats::SHARE_HOLDERS.sub_shared(gone as u64);
    stats::SHARE_HOLDERS.add_shared(came as u64);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn holder(want: f64, rate: f64, burst: f64, held_rate: f64, held_burst: f64) -> Holder {
        Holder {
            id: Box::from(&b"h00"[..]),
            want,
            rate,
            burst,
            lease_end: 1_700_000_010_800_000_000,
            held_rate,
            held_burst,
            held_until: 1_700_000_000_250_000_000,
        }
    }

    #[test]
    fn an_entry_text_reusing_the_last_numbers_is_the_one_written_afresh() {
        let steady = holder(10.0, 62.5, 62_500_000.0, 62.5, 62_500_000.0);
        let shrinking = holder(10.0, 62.5, 62_500_000.0, 1000.0, 1e9);
        let cases = [
            steady.clone(),
            steady.clone(),
            shrinking.clone(),
            shrinking,
            holder(0.1, 0.0, -0.0, 0.0, 0.0),
            holder(0.1, -0.0, 0.0, 0.0, 0.0),
            holder(1e15, 1e-7, 123.456, 1e-300, 1e15),
            steady,
        ];
        for h in &cases {
            let text = EntryText::recent(h);
            assert_eq!(text.bytes(), EntryText::new(h).bytes());
            assert_eq!(parse_entry(b"h00", text.bytes()).as_ref(), Some(h));
        }
        assert_eq!(
            EntryText::recent(&cases[0]).bytes(),
            b"10,62.5,62500000,1700000010800000000,62.5,62500000,1700000000250000000"
        );
    }
}
