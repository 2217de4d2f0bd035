//! The values of this module's types as Redis holds them: raw pointers made from boxes.
//!
//! A bucket value is a boxed [`Compact`](crate::bucket::stored::Compact) or a boxed
//! [`Full`](crate::bucket::stored::Full), told apart by their first word (see
//! [`crate::bucket::stored::is_full`]); a semaphore value is a boxed [`PermitTable`].

use crate::bucket::stored::{self, StateMut, Stored};
use rl_core::{PermitTable, ShareTable};
use std::os::raw::c_void;

pub fn bucket_into_raw(s: Stored) -> *mut c_void {
    match s {
        Stored::Compact(b) => Box::into_raw(b).cast(),
        Stored::Full(l) => Box::into_raw(l).cast(),
    }
}

/// # Safety
/// `p` must come from [`bucket_into_raw`] and not be used afterwards.
pub unsafe fn bucket_from_raw(p: *mut c_void) -> Stored {
    if stored::is_full(*p.cast::<u64>()) {
        Stored::Full(Box::from_raw(p.cast()))
    } else {
        Stored::Compact(Box::from_raw(p.cast()))
    }
}

/// # Safety
/// `p` must come from [`bucket_into_raw`] and stay valid and unaliased for `'a`.
pub unsafe fn bucket_mut<'a>(p: *mut c_void) -> StateMut<'a> {
    if stored::is_full(*p.cast::<u64>()) {
        StateMut::Full(&mut *p.cast())
    } else {
        StateMut::Compact(&mut *p.cast())
    }
}

pub fn permits_into_raw(t: PermitTable) -> *mut c_void {
    Box::into_raw(Box::new(t)).cast()
}

/// # Safety
/// `p` must come from [`permits_into_raw`] and not be used afterwards.
pub unsafe fn permits_from_raw(p: *mut c_void) -> PermitTable {
    *Box::from_raw(p.cast::<PermitTable>())
}

/// # Safety
/// `p` must come from [`permits_into_raw`] and stay valid and unaliased for `'a`.
pub unsafe fn permits_mut<'a>(p: *mut c_void) -> &'a mut PermitTable {
    &mut *p.cast::<PermitTable>()
}

pub fn shares_into_raw(t: ShareTable) -> *mut c_void {
    Box::into_raw(Box::new(t)).cast()
}

/// # Safety
/// `p` must come from [`shares_into_raw`] and not be used afterwards.
pub unsafe fn shares_from_raw(p: *mut c_void) -> ShareTable {
    *Box::from_raw(p.cast::<ShareTable>())
}

/// # Safety
/// `p` must come from [`shares_into_raw`] and stay valid and unaliased for `'a`.
pub unsafe fn shares_mut<'a>(p: *mut c_void) -> &'a mut ShareTable {
    &mut *p.cast::<ShareTable>()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rl_core::{Bucket, LeaseTable, Limit};

    fn bucket(rate: f64, cap: f64) -> Bucket {
        Bucket::new(42, Limit::new(rate, cap).unwrap())
    }

    #[test]
    fn encodings_follow_the_limit_and_the_leases() {
        let b = bucket(0.001, 10.0);
        let p = bucket_into_raw(Stored::new(b, LeaseTable::default()));
        match unsafe { bucket_mut(p) } {
            StateMut::Compact(c) => assert_eq!(c.bucket(), b),
            StateMut::Full(_) => panic!("0.001 and 10 fit the compact form"),
        }
        drop(unsafe { bucket_from_raw(p) });

        let odd = bucket(1.0 / 3.0, 10.0);
        let p = bucket_into_raw(Stored::new(odd, LeaseTable::default()));
        match unsafe { bucket_mut(p) } {
            StateMut::Full(f) => assert!(f.bucket == odd && f.bucket.limit().rate() == 1.0 / 3.0),
            StateMut::Compact(_) => panic!("1/3 does not fit 27 bits"),
        }
        drop(unsafe { bucket_from_raw(p) });

        let mut t = LeaseTable::default();
        t.open(3, 10, 5_000).unwrap();
        let p = bucket_into_raw(Stored::new(b, t.clone()));
        match unsafe { bucket_mut(p) } {
            StateMut::Full(f) => assert!(f.bucket == b && f.table == t),
            StateMut::Compact(_) => panic!("lost the leases"),
        }
        drop(unsafe { bucket_from_raw(p) });
    }
}
