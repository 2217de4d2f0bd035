//! Opening a bucket's key and writing it back with its expiry.

use crate::bucket::stored::{self, Compact, StateMut, Stored};
use crate::error::{Error, Result};
use crate::ffi::{Access, Ctx, MainThread, OpenKey, Str, Value};
use crate::observe::stats;
use rl_core::expiry_ms;
use rl_core::{Bucket, LeaseTable, Limit, Nanos};

/// A key opened for one command; closed when dropped.
///
/// The module turns off Redis's implicit "modified" signal on closing a writable key (see
/// `lib.rs`): a denied call opens the key for writing but changes nothing, and must not
/// break a client's `WATCH`. Writes mark the key, and closing signals only those.
pub struct BucketKey {
    key: OpenKey,
    modified: std::cell::Cell<bool>,
    /// The expiry (ms) the state implied when its lease table was taken out to change it:
    /// if the new state implies another one, the expiry is set without reading it first.
    expiry_before: std::cell::Cell<Option<i64>>,
}

impl BucketKey {
    /// Opens a key to write it. A key whose expiry has passed reads as absent, as always;
    /// where the server allows it, its value is kept for the write to reuse (see
    /// [`OpenKey::open_bucket`]).
    #[inline]
    pub fn open(ctx: Ctx, name: Str) -> BucketKey {
        BucketKey::with(OpenKey::open_bucket(ctx, name))
    }

    /// Opens a key only to read it (read-only commands; replicas serve these).
    pub fn open_read(ctx: Ctx, name: Str) -> BucketKey {
        BucketKey::with(OpenKey::open(ctx, name, Access::Read))
    }

    #[inline]
    fn with(key: OpenKey) -> BucketKey {
        BucketKey {
            key,
            modified: std::cell::Cell::new(false),
            expiry_before: std::cell::Cell::new(None),
        }
    }

    /// The bucket held here: `None` if the key does not exist, `WRONGTYPE` if it holds
    /// something else.
    pub fn state(&self) -> Result<Option<StateMut<'_>>> {
        match self.key.value() {
            Value::Empty => Ok(None),
            Value::Bucket(state) => Ok(Some(state)),
            _ => Err(Error::WrongType),
        }
    }

    /// Stores a bucket and its leases into a key that holds no bucket (a new key, or one
    /// whose time passed): into the expired compact bucket in place when the new one is
    /// compact too (no key added, no value allocated), else as a new value.
    fn put_new(&self, bucket: Bucket, table: LeaseTable, expires_at: Nanos) {
        if !stored::ever_leased(&table) {
            if let Some(c) = compact_of(&bucket) {
                if let Some(old) = self.key.expired_compact() {
                    *old = c;
                    self.key.reused();
                    return self.expire_at(expires_at);
                }
                return self.put(Stored::Compact(Box::new(c)), expires_at);
            }
        }
        self.put(Stored::new(bucket, table), expires_at)
    }

    /// Stores a new value (replacing any) and sets the key's expiry.
    pub fn put(&self, stored: Stored, expires_at: Nanos) {
        // The value replaced, if any, leaves the gauge when Redis frees it.
        if matches!(&stored, Stored::Full(f) if f.bucket.pin().is_some()) {
            stats::PINNED_KEYS.add_shared(1);
        }
        if self.key.set_bucket(stored) {
            self.expire_at(expires_at);
        }
    }

    /// Sets the expiry to `at`, rounded up to Redis's milliseconds so the key never goes
    /// before the bucket is full.
    pub fn expire_at(&self, at: Nanos) {
        self.modified.set(true);
        self.key.set_expire_ms(expiry_ms(at));
    }

    /// Makes the expiry `at` if it is not already: a hot key's full instant often moves by
    /// less than a millisecond, and reading the expiry costs less than setting it. (The
    /// key's actual expiry is read, not assumed: `PERSIST` or `RESTORE ... 0` may have
    /// removed it.)
    fn keep_expiry_at(&self, at: Nanos) {
        self.modified.set(true);
        if self.key.expire_ms() != expiry_ms(at) {
            self.expire_at(at);
        }
    }

    /// Sets the expiry to `at`: directly if the state implied another one before (`before`,
    /// in ms), else only if the key's actual expiry differs.
    fn move_expiry(&self, before: Option<i64>, at: Nanos) {
        if before == Some(expiry_ms(at)) {
            self.keep_expiry_at(at);
        } else {
            self.expire_at(at);
        }
    }

    /// Writes a new bucket state, leaving any leases as they are.
    pub fn store(&self, state: Option<StateMut>, bucket: &Bucket) {
        let bucket = *bucket;
        let Some(mut s) = state else {
            return self.put_new(bucket, LeaseTable::default(), bucket.expires_at());
        };
        let before = expiry_ms(s.expires_at());
        let in_place = match &mut s {
            StateMut::Compact(c) => c.update(&bucket),
            StateMut::Full(f) => {
                count_limit_change(&f.bucket, &bucket);
                count_pin_change(&f.bucket, &bucket);
                f.bucket = bucket;
                true
            }
        };
        if !in_place {
            // The new limit (or a hold) does not fit the compact form.
            if let StateMut::Compact(c) = &s {
                count_limit_change(&c.bucket(), &bucket);
            }
            return self.put(
                Stored::new(bucket, LeaseTable::default()),
                bucket.expires_at(),
            );
        }
        if expiry_ms(s.expires_at()) == before {
            self.keep_expiry_at(s.expires_at());
        } else {
            self.expire_at(s.expires_at());
        }
    }

    /// Replaces a bucket and its whole lease table (an effect that sets them).
    pub fn replace(&self, mut state: Option<StateMut>, bucket: Bucket, table: LeaseTable) {
        self.detach_leases(&mut state);
        self.store_with_leases(state, bucket, table);
    }

    /// Moves the lease table out of a bucket to change it; [`BucketKey::store_with_leases`]
    /// puts it back.
    pub fn detach_leases(&self, state: &mut Option<StateMut>) -> LeaseTable {
        match state {
            Some(StateMut::Full(f)) => {
                self.expiry_before.set(Some(expiry_ms(stored::expires_at(
                    &f.bucket,
                    Some(&f.table),
                ))));
                let table = std::mem::take(&mut f.table);
                stats::LEASES_ACTIVE.sub_shared(table.leases().len() as u64);
                table
            }
            _ => LeaseTable::default(),
        }
    }

    /// Writes a bucket state with its leases (taken out by [`detach_leases`]), in the
    /// encoding that fits: a bucket that had leases keeps its table (see [`Stored::new`]).
    pub fn store_with_leases(&self, state: Option<StateMut>, bucket: Bucket, table: LeaseTable) {
        stats::LEASES_ACTIVE.add_shared(table.leases().len() as u64);
        let expires = stored::expires_at(&bucket, Some(&table));
        match state {
            Some(StateMut::Full(f)) => {
                count_limit_change(&f.bucket, &bucket);
                count_pin_change(&f.bucket, &bucket);
                f.bucket = bucket;
                f.table = table;
                self.move_expiry(self.expiry_before.get(), expires);
            }
            Some(StateMut::Compact(c)) if !stored::ever_leased(&table) => {
                let before = expiry_ms(c.bucket().full_at());
                if c.update(&bucket) {
                    self.move_expiry(Some(before), expires);
                } else {
                    // A new limit that does not fit, or a version.
                    count_limit_change(&c.bucket(), &bucket);
                    self.put(Stored::new(bucket, table), expires);
                }
            }
            Some(StateMut::Compact(c)) => {
                count_limit_change(&c.bucket(), &bucket);
                self.put(Stored::new(bucket, table), expires);
            }
            None => self.put_new(bucket, table, expires),
        }
    }

    /// The open key, for readers of other types (see `adopt`).
    pub fn open_key(&self) -> &OpenKey {
        &self.key
    }

    pub fn delete(&self) {
        self.modified.set(true);
        self.key.delete();
    }
}

impl Drop for BucketKey {
    /// Signals the key if a write changed it (then the key closes).
    fn drop(&mut self) {
        if self.modified.get() {
            self.key.signal_modified();
        }
    }
}

/// Keeps `rl_pinned_keys` when a bucket changed in place gains or loses its pin.
fn count_pin_change(old: &Bucket, new: &Bucket) {
    match (old.pin().is_some(), new.pin().is_some()) {
        (false, true) => stats::PINNED_KEYS.add_shared(1),
        (true, false) => stats::PINNED_KEYS.sub_shared(1),
        _ => {}
    }
}

/// The last limit a new compact bucket was made for, with that bucket.
static LAST_COMPACT: MainThread<Option<(Limit, Compact)>> = MainThread::new(None);

/// The compact form of a new `bucket` ([`Compact::of`]), from the last one made when the
/// limit is the same: per-caller limits put one limit on many keys, and encoding it costs
/// more than everything else a new key's value needs.
fn compact_of(bucket: &Bucket) -> Option<Compact> {
    LAST_COMPACT.with(|last| {
        if let Some((limit, c)) = last {
            if *limit == bucket.limit() {
                // The same limit: only the instant (and no hold, no version) to check.
                let mut c = *c;
                return c.update(bucket).then_some(c);
            }
        }
        let c = Compact::of(bucket)?;
        *last = Some((bucket.limit(), c));
        Some(c)
    })
}

/// Counts a write that stores a bucket under a limit other than the one it had.
fn count_limit_change(old: &Bucket, new: &Bucket) {
    if old.limit() != new.limit() {
        stats::LIMIT_CHANGES.add(1);
    }
}
