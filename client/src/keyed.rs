//! [`KeyedPrefetcher`]: prefetching for many keys under one limit, one object.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use rl_core::Limit;

use crate::fallback::lock;
use crate::lazy::LazyConnection;
use crate::{Decision, Error, Metrics, PrefetchConfig, PrefetchLimiter, RedisConnection};

/// A [`PrefetchLimiter`] per key, made on the key's first `take`, all under one limit and
/// config and counting into one [`Metrics`]. At most `config.limiter.max_keys` keys are
/// kept: beyond that the limiters of all other keys are closed (their leftovers returned)
/// and made again on demand.
///
/// Cheap to clone; clones share the limiters.
#[derive(Debug, Clone)]
pub struct KeyedPrefetcher<C: RedisConnection> {
    conn: C,
    limit: Limit,
    config: PrefetchConfig,
    metrics: Arc<Metrics>,
    limiters: Arc<Mutex<HashMap<String, PrefetchLimiter<C>>>>,
    /// `close` was called (set under the map's lock): no limiter is made any more.
    closed: Arc<AtomicBool>,
}

impl KeyedPrefetcher<LazyConnection> {
    /// Over `client`, connecting lazily (see [`LazyConnection`]).
    pub fn from_client(
        client: redis::Client,
        limit: Limit,
        config: PrefetchConfig,
    ) -> Result<Self, Error> {
        KeyedPrefetcher::new(LazyConnection::new(client), limit, config)
    }
}

impl<C: RedisConnection> KeyedPrefetcher<C> {
    /// Prefetching limiters of `limit` over `conn`, one per key.
    pub fn new(conn: C, limit: Limit, config: PrefetchConfig) -> Result<Self, Error> {
        config.validate()?;
        if config.batch as f64 > limit.cap() {
            return Err(Error::Config("batch must not exceed cap"));
        }
        Ok(KeyedPrefetcher {
            conn,
            limit,
            config,
            metrics: Arc::new(Metrics::new()),
            limiters: Arc::new(Mutex::new(HashMap::new())),
            closed: Arc::new(AtomicBool::new(false)),
        })
    }

    /// The counters of every key's limiter.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// The limiter of `key` (made now if new).
    pub fn limiter(&self, key: &str) -> PrefetchLimiter<C> {
        let mut limiters = lock(&self.limiters);
        if let Some(l) = limiters.get(key) {
            return l.clone();
        }
        if self.closed.load(Ordering::Acquire) {
            // After `close`: a limiter that answers `Error::Closed` and leases nothing.
            let made = PrefetchLimiter::with_metrics(
                self.conn.clone(),
                key,
                self.limit,
                self.config.clone(),
                Arc::clone(&self.metrics),
            )
            .expect("the config was checked in new");
            made.mark_closed();
            return made;
        }
        if limiters.len() >= self.config.limiter.max_keys {
            // Dropped limiters return their leftovers (best effort).
            limiters.clear();
        }
        let made = PrefetchLimiter::with_metrics(
            self.conn.clone(),
            key,
            self.limit,
            self.config.clone(),
            Arc::clone(&self.metrics),
        )
        .expect("the config was checked in new");
        limiters.insert(key.to_owned(), made.clone());
        made
    }

    /// [`PrefetchLimiter::take`] on `key`'s limiter.
    pub async fn take(&self, key: &str, n: u64) -> Result<Decision, Error> {
        self.limiter(key).take(n).await
    }

    /// Closes every key's limiter (returning their leftovers); answers the tokens credited.
    /// Nothing is leased after it: later takes, of any key, answer [`Error::Closed`].
    pub async fn close(&self) -> Result<u64, Error> {
        let limiters: Vec<_> = {
            let mut map = lock(&self.limiters);
            self.closed.store(true, Ordering::Release);
            map.drain().map(|(_, l)| l).collect()
        };
        let mut credited = 0;
        let mut failure = None;
        for l in limiters {
            match l.close().await {
                Ok(c) => credited += c,
                Err(e) => failure = failure.or(Some(e)),
            }
        }
        failure.map_or(Ok(credited), Err)
    }
}
