//! How a bucket sits in memory as a Redis value: two encodings behind one pointer.
//!
//! A bucket is mostly overhead (Redis's own key, object and expiry entries), so the common
//! case is a bare 16 bytes: [`Compact`], the full instant plus the limit as two 32-bit
//! decimals. It is used when both numbers of the limit fit such a decimal exactly (every
//! limit written with up to 8 significant digits: `1000`, `0.5`, `0.001`, `16.6667`) and the
//! bucket never had a lease nor a limit version (`VERSION v`). Anything else is a
//! [`Full`]: the exact bucket (with its version) and its lease table. A `Full` starts with a word no `Compact` can hold ([`FULL_MARKER`]), so reading the
//! first word tells which one a pointer holds, as Redis's own types switch between a compact
//! and a general encoding.

use rl_core::{Bucket, LeaseTable, Limit, Nanos};

/// The first word of a [`Full`]; a [`Compact`]'s first word (`full_at`) never exceeds
/// `i64::MAX`.
const FULL_MARKER: u64 = u64::MAX;

/// Whether a value whose first word is `first` is a [`Full`] (else a [`Compact`]): what
/// [`crate::ffi`] reads to tell the two apart behind Redis's pointer.
pub fn is_full(first: u64) -> bool {
    first == FULL_MARKER
}

/// A decimal in 32 bits: a 27-bit mantissa and a 5-bit exponent, `m * 10^e`, `e` in -16..=15.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(transparent)]
struct Dec32(u32);

const POW10: [f64; 17] = [
    1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15, 1e16,
];
const MANTISSA_LIMIT: f64 = (1u32 << 27) as f64;

impl Dec32 {
    fn value(self) -> f64 {
        let m = f64::from(self.0 >> 5);
        let e = (self.0 & 31) as i32 - 16;
        // One exact operand each side and one rounding: the double nearest m * 10^e.
        if e >= 0 {
            m * POW10[e as usize]
        } else {
            m / POW10[(-e) as usize]
        }
    }

    /// The decimal that decodes to exactly `x`, if one exists: tried from the largest
    /// exponent (the fewest digits) down, and kept only if it decodes back to `x`.
    fn encode(x: f64) -> Option<Dec32> {
        if !(x > 0.0 && x.is_finite()) {
            return None;
        }
        let top = (x.log10().floor() as i32).clamp(-16, 15);
        for e in (-16..=top).rev() {
            let m = if e >= 0 {
                x / POW10[e as usize]
            } else {
                x * POW10[(-e) as usize]
            };
            let m = m.round();
            if m >= MANTISSA_LIMIT {
                return None;
            }
            let code = Dec32(((m as u32) << 5) | (e + 16) as u32);
            if m >= 1.0 && code.value() == x {
                return Some(code);
            }
        }
        None
    }
}

/// A bucket in 16 bytes (see the module docs for when it is used).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C)]
pub struct Compact {
    full_at: Nanos,
    rate: Dec32,
    cap: Dec32,
}

impl Compact {
    /// The compact form of `bucket`, if its limit fits it exactly and it has no hold and
    /// no version.
    pub fn of(bucket: &Bucket) -> Option<Compact> {
        if bucket.keep_until() != 0
            || bucket.keep_after_write() != 0
            || bucket.version() != 0
            || bucket.pin().is_some()
        {
            return None;
        }
        let limit = bucket.limit();
        Some(Compact {
            full_at: bucket.full_at(),
            rate: Dec32::encode(limit.rate())?,
            cap: Dec32::encode(limit.cap())?,
        })
    }

    pub fn bucket(&self) -> Bucket {
        // The codes were made from a valid limit by `of`.
        let limit = Limit::from_stored_parts(self.rate.value(), self.cap.value());
        Bucket::new(self.full_at, limit)
    }

    /// Stores `bucket` here if it fits: at once when the limit is unchanged (the hot path:
    /// nothing to encode), else if the new limit encodes. `false` if it does not fit.
    pub fn update(&mut self, bucket: &Bucket) -> bool {
        if bucket.keep_until() != 0
            || bucket.keep_after_write() != 0
            || bucket.version() != 0
            || bucket.pin().is_some()
        {
            return false;
        }
        if bucket.limit() == self.bucket().limit() {
            self.full_at = bucket.full_at();
            return true;
        }
        match Compact::of(bucket) {
            Some(c) => {
                crate::observe::stats::LIMIT_CHANGES.add(1);
                *self = c;
                true
            }
            None => false,
        }
    }
}

/// A bucket with an exact limit of any value, and its leases.
#[repr(C)]
pub struct Full {
    marker: u64,
    pub bucket: Bucket,
    pub table: LeaseTable,
}

/// Whether a table has ever held a lease (its last id is remembered while the key lives,
/// so ids are never handed out twice).
pub fn ever_leased(table: &LeaseTable) -> bool {
    !table.is_empty() || table.last_id() != 0
}

/// A bucket value owned by this module, before it is handed to Redis.
pub enum Stored {
    Compact(Box<Compact>),
    Full(Box<Full>),
}

/// A bucket value owned by Redis, borrowed for one command.
pub enum StateMut<'a> {
    Compact(&'a mut Compact),
    Full(&'a mut Full),
}

impl Stored {
    /// The encoding that fits.
    pub fn new(bucket: Bucket, table: LeaseTable) -> Stored {
        match Compact::of(&bucket) {
            Some(c) if !ever_leased(&table) => Stored::Compact(Box::new(c)),
            _ => Stored::Full(Box::new(Full {
                marker: FULL_MARKER,
                bucket,
                table,
            })),
        }
    }
}

impl StateMut<'_> {
    pub fn bucket(&self) -> Bucket {
        match self {
            StateMut::Compact(c) => c.bucket(),
            StateMut::Full(f) => f.bucket,
        }
    }

    /// The lease table, if the bucket ever had a lease.
    pub fn table(&self) -> Option<&LeaseTable> {
        match self {
            StateMut::Full(f) if ever_leased(&f.table) => Some(&f.table),
            _ => None,
        }
    }

    /// When the key may go: the bucket is full and no lease is live.
    pub fn expires_at(&self) -> Nanos {
        match self {
            // No leases, and no need to decode the limit (this runs on every write).
            StateMut::Compact(c) => c.full_at,
            StateMut::Full(f) => expires_at(&f.bucket, self.table()),
        }
    }

    /// Bytes the value holds (for `MEMORY USAGE`).
    pub fn mem_usage(&self) -> usize {
        match self {
            StateMut::Compact(_) => std::mem::size_of::<Compact>(),
            StateMut::Full(f) => {
                std::mem::size_of::<Full>() + std::mem::size_of_val(f.table.leases())
            }
        }
    }
}

pub fn expires_at(bucket: &Bucket, table: Option<&LeaseTable>) -> Nanos {
    let leases = table.and_then(LeaseTable::last_expiry).unwrap_or(0);
    bucket.expires_at().max(leases)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bucket(rate: f64, cap: f64) -> Bucket {
        Bucket::new(42, Limit::new(rate, cap).unwrap())
    }

    #[test]
    fn compact_is_16_bytes() {
        assert_eq!(std::mem::size_of::<Compact>(), 16);
    }

    #[test]
    fn decimals_round_trip_exactly() {
        for s in [
            "1",
            "0.5",
            "0.001",
            "0.1",
            "1000",
            "16.6667",
            "1e9",
            "1e15",
            "1e-9",
            "123456.78",
            "0.333",
            "99999999",
            "0.000123",
            "7.25",
            "2500000",
            "0.0009765625",
        ] {
            let x: f64 = s.parse().unwrap();
            let d = Dec32::encode(x).unwrap_or_else(|| panic!("{s} does not encode"));
            assert_eq!(d.value(), x, "{s}");
        }
        // Too many digits for 27 bits: the full encoding takes them.
        for x in [1.0 / 3.0, 1000.0 / 60.0, 0.1 + 0.2, 987654321.0] {
            assert_eq!(Dec32::encode(x), None, "{x}");
        }
        // Whatever encodes decodes back to exactly the same number.
        for i in 1..100_000u32 {
            for x in [
                f64::from(i) / 7.0,
                f64::from(i) * 0.001,
                f64::from(i) * 1.1,
                f64::from(i),
            ] {
                if let Some(d) = Dec32::encode(x) {
                    assert_eq!(d.value(), x);
                }
            }
        }
    }

    #[test]
    fn update_keeps_the_compact_form_when_it_can() {
        let mut c = Compact::of(&bucket(2.0, 10.0)).unwrap();
        assert!(c.update(&Bucket::new(99, Limit::new(2.0, 10.0).unwrap())));
        assert_eq!(c.bucket().full_at(), 99);
        assert!(c.update(&Bucket::new(100, Limit::new(0.25, 20.0).unwrap())));
        assert_eq!(c.bucket().limit(), Limit::new(0.25, 20.0).unwrap());
        assert!(!c.update(&Bucket::new(101, Limit::new(1.0 / 3.0, 20.0).unwrap())));
        // A versioned bucket takes the full form.
        let v = Bucket::new(102, Limit::new(0.25, 20.0).unwrap()).with_version(3);
        assert!(!c.update(&v));
        assert!(Compact::of(&v).is_none());
        match Stored::new(v, LeaseTable::default()) {
            Stored::Full(f) => assert_eq!(f.bucket.version(), 3),
            Stored::Compact(_) => panic!("lost the version"),
        }
    }
}
