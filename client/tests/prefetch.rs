//! `PrefetchLimiter` against a real server: batches, renewal ahead, expiry, leftovers, and
//! a fleet that never spends more than the bucket allows.

mod support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rl_client::{FailurePolicy, Limit, LimiterConfig, PrefetchConfig, PrefetchLimiter, Source};
use support::{eventually, Server};

fn config(batch: u64, ttl_ms: u64) -> PrefetchConfig {
    PrefetchConfig {
        batch,
        ttl: Duration::from_millis(ttl_ms),
        jitter: 0.0,
        limiter: LimiterConfig {
            // Generous: a slow test machine must not turn into fallback decisions.
            timeout: Duration::from_secs(5),
            policy: FailurePolicy::Deny,
            ..Default::default()
        },
        ..Default::default()
    }
}

fn frozen() -> Limit {
    Limit::new(0.001, 100.0).unwrap()
}

#[tokio::test]
async fn grants_from_a_batch_and_renews_before_running_out() {
    let server = Server::start();
    let cfg = PrefetchConfig {
        renew_at: 0.5,
        ..config(10, 60_000)
    };
    let limiter = PrefetchLimiter::new(server.manager().await, "k", frozen(), cfg).unwrap();

    let first = limiter.take(1).await.unwrap();
    assert_eq!((first.allowed, first.source), (true, Source::Server));
    assert_eq!(limiter.held(), 9);
    for _ in 0..4 {
        assert_eq!(limiter.take(1).await.unwrap().source, Source::Lease);
    }
    // 5 left of 10: at the threshold, so the next batch is on its way while 5 remain.
    let m = limiter.metrics().clone();
    eventually(10, "background renewal", || m.snapshot().leases == 2).await;
    assert_eq!(limiter.held(), 15);
    // Spending on never waits for Redis: every grant comes from a held batch.
    for _ in 0..10 {
        assert_eq!(limiter.take(1).await.unwrap().source, Source::Lease);
    }
    eventually(10, "second renewal", || m.snapshot().leases == 3).await;
    // That renewal settled the first lease (spent out) in the same call.
    let s = m.snapshot();
    assert_eq!((s.returns, s.tokens_returned), (1, 0));
    assert_eq!(server.info("rl", "rl_returns"), 1.0);
    assert_eq!(server.info("rl", "rl_leases_granted"), 3.0);
    assert_eq!(s.redis_calls, 3, "one call per batch");
    assert_eq!((s.granted, s.fallback_decisions), (15, 0));
}

#[tokio::test]
async fn expired_lease_is_never_spent() {
    let server = Server::start();
    let limiter =
        PrefetchLimiter::new(server.manager().await, "k", frozen(), config(10, 50)).unwrap();
    assert!(limiter.take(1).await.unwrap().allowed);
    assert_eq!(limiter.held(), 9);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(limiter.held(), 0, "an expired lease holds nothing");
    let d = limiter.take(1).await.unwrap();
    assert_eq!(d.source, Source::Server, "a new lease, not the expired one");
    let s = limiter.metrics().snapshot();
    assert_eq!((s.leases, s.leases_expired), (2, 1));
    // The server debited both batches: 80 of 100 left, nothing came back.
    let level: (i64, f64, i64, i64) = redis::cmd("RL.TAKE")
        .arg("k")
        .arg(0.001)
        .arg(100.0)
        .arg(1)
        .arg("WITHSTATE")
        .query(&mut server.conn())
        .unwrap();
    assert!((level.1 - 79.0).abs() < 0.01, "{level:?}");
}

#[tokio::test]
async fn close_returns_leftovers() {
    let server = Server::start();
    let limiter =
        PrefetchLimiter::new(server.manager().await, "k", frozen(), config(20, 60_000)).unwrap();
    assert!(limiter.take(1).await.unwrap().allowed);
    assert_eq!(limiter.close().await.unwrap(), 19);
    assert_eq!(limiter.held(), 0);
    assert_eq!(server.info("rl", "rl_returns"), 1.0);
    assert_eq!(server.info("rl", "rl_tokens_returned"), 19.0);
    assert_eq!(server.info("rl", "rl_leases_active"), 0.0);
    let s = limiter.metrics().snapshot();
    assert_eq!((s.returns, s.tokens_returned), (1, 19));

    // Dropping the last handle inside a runtime returns them too.
    let dropped =
        PrefetchLimiter::new(server.manager().await, "j", frozen(), config(20, 60_000)).unwrap();
    assert!(dropped.take(5).await.unwrap().allowed);
    drop(dropped);
    eventually(10, "returned on drop", || {
        server.info("rl", "rl_tokens_returned") == 34.0
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fleet_never_spends_more_than_the_bucket_allows() {
    let server = Server::start();
    let (rate, cap) = (200.0, 50.0);
    let limit = Limit::new(rate, cap).unwrap();
    let spent = Arc::new(AtomicU64::new(0));
    let run_for = Duration::from_millis(2500);

    let mut fleet = Vec::new();
    for _ in 0..8 {
        let cfg = PrefetchConfig {
            jitter: 0.1,
            ..config(10, 300)
        };
        fleet.push(PrefetchLimiter::new(server.manager().await, "shared", limit, cfg).unwrap());
    }
    let started = Instant::now();
    let mut tasks = Vec::new();
    for limiter in fleet.clone() {
        let spent = Arc::clone(&spent);
        tasks.push(tokio::spawn(async move {
            let mut last_spend = started;
            while started.elapsed() < run_for {
                let d = limiter.take(1).await.unwrap();
                if d.allowed {
                    spent.fetch_add(1, Ordering::Relaxed);
                    last_spend = Instant::now();
                } else {
                    tokio::time::sleep(d.retry_after.min(Duration::from_millis(5))).await;
                }
            }
            last_spend
        }));
    }
    let mut last_spend = started;
    for t in tasks {
        last_spend = last_spend.max(t.await.unwrap());
    }
    let elapsed = last_spend.duration_since(started).as_secs_f64();
    let spent = spent.load(Ordering::Relaxed);
    let bound = cap + rate * elapsed;
    println!("fleet spent {spent} in {elapsed:.3} s; bound {bound:.1}");
    assert!(spent as f64 <= bound, "spent {spent} > {bound}");
    assert!(spent >= cap as u64, "the full bucket was there to spend");

    let mut fallbacks = 0;
    for limiter in &fleet {
        limiter.close().await.unwrap();
        fallbacks += limiter.metrics().snapshot().fallback_decisions;
    }
    assert_eq!(fallbacks, 0, "every decision came from Redis or a lease");
    // Every token spent was debited by the server and not credited back.
    let leased = server.info("rl", "rl_lease_tokens_granted");
    let returned = server.info("rl", "rl_tokens_returned");
    assert!(
        leased - returned >= spent as f64,
        "{leased} - {returned} < {spent}"
    );
}
