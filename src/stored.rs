//! How a bucket sits in memory as a Redis value: two encodings behind one pointer.
//!
//! Most buckets never see a lease, and a bucket is mostly overhead (Redis's own key, object
//! and expiry entries), so the common encoding is the bare 16-byte [`Bucket`]. A bucket with
//! live leases becomes a [`Leased`], which starts with a word no bucket can hold
//! ([`LEASED_MARKER`]); reading that first word tells which one a pointer holds, as Redis's
//! own types switch between a compact and a general encoding.

use rl_core::{Bucket, LeaseTable, Nanos};
use std::os::raw::c_void;

/// The first word of a [`Leased`]; a [`Bucket`]'s first word (`full_at`) never exceeds
/// `i64::MAX`.
const LEASED_MARKER: u64 = u64::MAX;

#[repr(C)]
pub struct Leased {
    marker: u64,
    pub bucket: Bucket,
    pub table: LeaseTable,
}

impl Leased {
    pub fn new(bucket: Bucket, table: LeaseTable) -> Leased {
        Leased {
            marker: LEASED_MARKER,
            bucket,
            table,
        }
    }
}

/// A bucket value owned by this module, before it is handed to Redis.
pub enum Stored {
    Plain(Box<Bucket>),
    Leased(Box<Leased>),
}

/// A bucket value owned by Redis, borrowed for one command.
pub enum StateMut<'a> {
    Plain(&'a mut Bucket),
    Leased(&'a mut Leased),
}

impl Stored {
    /// The encoding that fits: plain for a bucket that never had a lease. One that had some
    /// stays leased while its key lives, so the last lease id is remembered and ids are
    /// never handed out twice.
    pub fn new(bucket: Bucket, table: LeaseTable) -> Stored {
        if table.is_empty() && table.last_id() == 0 {
            Stored::Plain(Box::new(bucket))
        } else {
            Stored::Leased(Box::new(Leased::new(bucket, table)))
        }
    }

    pub fn into_raw(self) -> *mut c_void {
        match self {
            Stored::Plain(b) => Box::into_raw(b).cast(),
            Stored::Leased(l) => Box::into_raw(l).cast(),
        }
    }

    /// # Safety
    /// `p` must come from [`Stored::into_raw`] and not be used afterwards.
    pub unsafe fn from_raw(p: *mut c_void) -> Stored {
        if *p.cast::<u64>() == LEASED_MARKER {
            Stored::Leased(Box::from_raw(p.cast()))
        } else {
            Stored::Plain(Box::from_raw(p.cast()))
        }
    }
}

impl StateMut<'_> {
    /// # Safety
    /// `p` must come from [`Stored::into_raw`] and stay valid and unaliased for `'a`.
    pub unsafe fn from_raw<'a>(p: *mut c_void) -> StateMut<'a> {
        if *p.cast::<u64>() == LEASED_MARKER {
            StateMut::Leased(&mut *p.cast())
        } else {
            StateMut::Plain(&mut *p.cast())
        }
    }

    pub fn bucket(&self) -> &Bucket {
        match self {
            StateMut::Plain(b) => b,
            StateMut::Leased(l) => &l.bucket,
        }
    }

    pub fn set_bucket(&mut self, bucket: Bucket) {
        match self {
            StateMut::Plain(b) => **b = bucket,
            StateMut::Leased(l) => l.bucket = bucket,
        }
    }

    pub fn table(&self) -> Option<&LeaseTable> {
        match self {
            StateMut::Plain(_) => None,
            StateMut::Leased(l) => Some(&l.table),
        }
    }

    /// When the key may go: the bucket is full and no lease is live.
    pub fn expires_at(&self) -> Nanos {
        expires_at(self.bucket(), self.table())
    }
}

pub fn expires_at(bucket: &Bucket, table: Option<&LeaseTable>) -> Nanos {
    let leases = table.and_then(LeaseTable::last_expiry).unwrap_or(0);
    bucket.full_at().max(leases)
}

/// Bytes a value holds (for `MEMORY USAGE`).
pub fn mem_usage(state: &StateMut) -> usize {
    match state {
        StateMut::Plain(_) => std::mem::size_of::<Bucket>(),
        StateMut::Leased(l) => {
            std::mem::size_of::<Leased>() + std::mem::size_of_val(l.table.leases())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_both_encodings() {
        let b = Bucket::from_parts(42, 1.0, 2.0).unwrap();
        let p = Stored::new(b, LeaseTable::default()).into_raw();
        assert!(matches!(unsafe { StateMut::from_raw(p) }, StateMut::Plain(x) if *x == b));
        drop(unsafe { Stored::from_raw(p) });

        let mut t = LeaseTable::default();
        t.open(3, 10, 5_000).unwrap();
        let p = Stored::new(b, t.clone()).into_raw();
        match unsafe { StateMut::from_raw(p) } {
            StateMut::Leased(l) => assert!(l.bucket == b && l.table == t),
            StateMut::Plain(_) => panic!("lost the leases"),
        }
        drop(unsafe { Stored::from_raw(p) });
    }
}
