//! `PrefetchLimiter` with many takes waiting for one lease call: a wait behind another's
//! call is no outage, a landed lease serves the line, and a call whose reply is lost after
//! its write counts as lost.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rl_client::{
    FailurePolicy, LazyConfig, LazyConnection, Limit, LimiterConfig, PrefetchConfig,
    PrefetchLimiter, Source,
};
use support::{eventually, prefetch_config, Proxy, Server};

fn frozen() -> Limit {
    Limit::new(0.001, 100.0).unwrap()
}

/// A connection through `proxy` whose own response timeout never ends a call here.
fn through(proxy: &Proxy) -> LazyConnection {
    let config = LazyConfig {
        connect_timeout: Duration::from_secs(5),
        response_timeout: Duration::from_secs(30),
    };
    LazyConnection::with_config(proxy.client(), config)
}

/// 500 tasks on one limiter; the background renewal's reply is held until every task's
/// own timeout has passed (but within the call's own bound). No take judges a call it did
/// not make: none falls back, every take is answered by Redis (granted from a lease, or
/// denied once Redis has no more), and the grants stay within `cap + rate * t`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn takes_waiting_behind_a_slow_renewal_wait_for_it_and_never_fall_back() {
    let server = Server::start();
    let proxy = Proxy::start(server.port).await;
    let timeout = Duration::from_secs(1);
    let cfg = PrefetchConfig {
        batch: 50,
        ttl: Duration::from_secs(60),
        renew_at: 0.5,
        jitter: 0.0,
        limiter: LimiterConfig {
            timeout,
            probe_interval: Duration::from_millis(100),
            policy: FailurePolicy::Deny,
            ..Default::default()
        },
    };
    let limiter = PrefetchLimiter::new(through(&proxy), "k", frozen(), cfg).unwrap();
    let began = Instant::now();
    let first = limiter.take(1).await.unwrap();
    assert_eq!((first.allowed, first.source), (true, Source::Server));
    proxy.hold();

    let started = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..500)
        .map(|_| {
            let limiter = limiter.clone();
            let started = Arc::clone(&started);
            tokio::spawn(async move {
                started.fetch_add(1, Ordering::SeqCst);
                limiter.take(1).await.unwrap()
            })
        })
        .collect();
    eventually(30, "every take started", || {
        started.load(Ordering::SeqCst) == 500
    })
    .await;
    // Every take's own timeout passes while the renewal's reply is held (a deadline is set
    // as its take starts, before `started` is seen here).
    tokio::time::sleep(timeout + Duration::from_millis(300)).await;
    let m = limiter.metrics().snapshot();
    assert_eq!(m.leases, 1, "the renewal's reply is held");
    proxy.release();

    let mut granted = first.granted;
    let mut sources = std::collections::BTreeMap::new();
    for task in tasks {
        let d = task.await.unwrap();
        granted += d.granted;
        *sources.entry(format!("{:?}", d.source)).or_insert(0) += 1;
        assert_ne!(d.source, Source::Fallback, "a take fell back: {sources:?}");
    }
    let m = limiter.metrics().snapshot();
    assert_eq!(m.fallback_decisions, 0, "{sources:?}");
    let bound = 100.0 + 0.001 * began.elapsed().as_secs_f64();
    assert!(granted as f64 <= bound, "granted {granted} > {bound}");
    // Redis had 100: every one of them was granted (nobody was denied while tokens were
    // on their way or held).
    assert_eq!(granted + limiter.held(), 100, "{sources:?}");
    limiter.close().await.unwrap();
}

/// A lease call whose reply is cut after its write (the connection closes before the
/// reply): Redis ran it, the lease is out of reach, and it counts in `leases_lost`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_call_cut_after_its_write_counts_as_lost() {
    let server = Server::start();
    let proxy = Proxy::start(server.port).await;
    let cfg = prefetch_config(FailurePolicy::Deny, 1);
    let limiter = PrefetchLimiter::new(through(&proxy), "k", frozen(), cfg).unwrap();
    // One batch of 20, spent out: the renewal at 0 left brings the next.
    for _ in 0..20 {
        assert!(limiter.take(1).await.unwrap().allowed);
    }
    let m = limiter.metrics().clone();
    eventually(10, "the renewal", || m.snapshot().leases == 2).await;
    assert_eq!(limiter.held(), 20);
    // Spent out again: the next renewal's reply is cut.
    proxy.cut_next_reply();
    let d = limiter.take(20).await.unwrap();
    assert_eq!((d.allowed, d.source), (true, Source::Lease));
    eventually(10, "the cut lease call", || {
        limiter.metrics().snapshot().leases_lost == 1
    })
    .await;
    // Redis ran the cut call: a third batch is out of the bucket.
    let t = server.tokens("k").unwrap();
    assert!((t - 40.0).abs() < 0.1, "server holds {t}");
    assert_eq!(limiter.metrics().snapshot().leases_lost, 1);
}

/// Takes waiting for one lease call are served in arrival order: with 15 tokens in Redis,
/// the first 15 takes in line get one each and the later ones are denied. (A
/// current-thread runtime runs the spawned takes in spawn order: that is their arrival.)
#[tokio::test(flavor = "current_thread")]
async fn takes_in_line_are_served_in_arrival_order() {
    let server = Server::start();
    let proxy = Proxy::start(server.port).await;
    let cfg = PrefetchConfig {
        batch: 10,
        ttl: Duration::from_secs(60),
        renew_at: 0.0,
        jitter: 0.0,
        limiter: LimiterConfig {
            // No deadline passes here: only the order is at stake.
            timeout: Duration::from_secs(60),
            policy: FailurePolicy::Deny,
            ..Default::default()
        },
    };
    let quota = Limit::new(0.001, 15.0).unwrap();
    let limiter = PrefetchLimiter::new(through(&proxy), "k", quota, cfg).unwrap();
    proxy.hold();
    let started = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..25)
        .map(|_| {
            let limiter = limiter.clone();
            let started = Arc::clone(&started);
            tokio::spawn(async move {
                started.fetch_add(1, Ordering::SeqCst);
                limiter.take(1).await.unwrap()
            })
        })
        .collect();
    eventually(30, "every take started", || {
        started.load(Ordering::SeqCst) == 25
    })
    .await;
    proxy.release();
    let mut allowed = Vec::new();
    for task in tasks {
        let d = task.await.unwrap();
        assert_ne!(d.source, Source::Fallback);
        allowed.push(d.allowed);
    }
    let expected: Vec<bool> = (0..25).map(|i| i < 15).collect();
    assert_eq!(allowed, expected);
}
