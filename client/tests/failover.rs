//! Redis going away mid-run: each failure policy takes over within the timeout, every
//! fallback decision is counted, and the limiters go back to Redis when it returns.

mod support;

use std::time::Duration;

use rl_client::{
    Decision, FailurePolicy, Limit, Limiter, LimiterConfig, PrefetchConfig, PrefetchLimiter, Source,
};
use support::Server;

/// Guard against a hang: far above the configured timeout, only hit if a call never ends.
const HANG: Duration = Duration::from_secs(20);

/// An outage here is Redis stopped (refused at once), not a slow call: the timeout is far
/// above any call's time on a loaded machine.
fn limiter_config(policy: FailurePolicy) -> LimiterConfig {
    LimiterConfig {
        timeout: Duration::from_secs(5),
        probe_interval: Duration::from_millis(100),
        policy,
        instances: 1,
        ..Default::default()
    }
}

fn frozen() -> Limit {
    Limit::new(0.001, 5.0).unwrap()
}

async fn take(limiter: &Limiter<redis::aio::ConnectionManager>, key: &str) -> Decision {
    tokio::time::timeout(HANG, limiter.take(key, 1))
        .await
        .expect("take hung")
        .unwrap()
}

/// Spends `key` to empty, stops Redis, and answers the decision made during the outage;
/// then restarts Redis and waits until decisions come from it again.
async fn through_an_outage(policy: FailurePolicy) -> (Decision, Decision) {
    let mut server = Server::start();
    let limiter = Limiter::new(server.manager().await, frozen(), limiter_config(policy)).unwrap();
    for _ in 0..5 {
        assert!(take(&limiter, "spent").await.allowed);
    }
    assert!(!take(&limiter, "spent").await.allowed);
    // Long enough for the observed rate to count (LastKnown).
    tokio::time::sleep(Duration::from_millis(150)).await;

    server.stop();
    let spent = take(&limiter, "spent").await;
    assert_eq!(spent.source, Source::Fallback, "{spent:?}");
    let fresh = take(&limiter, "fresh").await;
    assert_eq!(fresh.source, Source::Fallback);
    let during = limiter.metrics().snapshot();
    assert_eq!(during.fallback_decisions, 2);
    assert!(during.redis_errors >= 1);

    server.resume();
    let deadline = tokio::time::Instant::now() + HANG;
    loop {
        let d = take(&limiter, "after").await;
        if d.source == Source::Server {
            assert!(d.allowed, "a new server starts empty of keys: {d:?}");
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "never recovered");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let after = limiter.metrics().snapshot();
    assert_eq!(after.calls, after.granted + after.denied);
    (spent, fresh)
}

#[tokio::test]
async fn allow_fails_open_through_a_local_bucket() {
    let (spent, fresh) = through_an_outage(FailurePolicy::Allow).await;
    // What Redis granted was this instance's share: the local bucket does not grant it
    // again.
    assert!(!spent.allowed && fresh.allowed, "{spent:?} {fresh:?}");
}

#[tokio::test]
async fn last_known_keeps_the_last_level() {
    let (spent, fresh) = through_an_outage(FailurePolicy::LastKnown).await;
    assert!(
        !spent.allowed,
        "Redis last said the key was empty: {spent:?}"
    );
    assert!(spent.retry_after > Duration::from_secs(60));
    assert!(
        fresh.allowed,
        "a key with no history gets the configured limit"
    );
}

#[tokio::test]
async fn deny_fails_closed() {
    let (spent, fresh) = through_an_outage(FailurePolicy::Deny).await;
    assert!(!spent.allowed && !fresh.allowed);
    assert_eq!(fresh.retry_after, Duration::from_secs(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_redis_times_out_instead_of_hanging() {
    let server = Server::start();
    let config = LimiterConfig {
        timeout: Duration::from_secs(1),
        ..limiter_config(FailurePolicy::Allow)
    };
    let limiter = Limiter::new(server.manager().await, frozen(), config).unwrap();
    assert_eq!(take(&limiter, "k").await.source, Source::Server);

    // Returns once the server has stopped answering: the take below meets a Redis that
    // sleeps 4 s longer, past its 1 s timeout.
    let sleeper = server.debug_sleep(5.0);
    let d = take(&limiter, "k").await;
    assert_eq!(d.source, Source::Fallback);
    assert!(!sleeper.is_finished(), "answered before Redis woke up");
    let m = limiter.metrics().snapshot();
    assert_eq!(m.redis_timeouts, 1);
    assert_eq!(m.fallback_decisions, 1);
    sleeper.join().unwrap();

    let deadline = tokio::time::Instant::now() + HANG;
    while take(&limiter, "k").await.source != Source::Server {
        assert!(tokio::time::Instant::now() < deadline, "never recovered");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn prefetch_spends_held_tokens_then_falls_back_then_recovers() {
    let mut server = Server::start();
    let config = PrefetchConfig {
        batch: 5,
        ttl: Duration::from_secs(60),
        renew_at: 0.0,
        jitter: 0.0,
        limiter: limiter_config(FailurePolicy::Deny),
    };
    let limit = Limit::new(0.001, 100.0).unwrap();
    let limiter = PrefetchLimiter::new(server.manager().await, "k", limit, config).unwrap();
    let take = || async {
        tokio::time::timeout(HANG, limiter.take(1))
            .await
            .expect("take hung")
            .unwrap()
    };
    assert_eq!(take().await.source, Source::Server);

    server.stop();
    // The 4 held tokens are real grants: still spent while Redis is away.
    for _ in 0..4 {
        let d = take().await;
        assert_eq!((d.allowed, d.source), (true, Source::Lease));
    }
    let d = take().await;
    assert_eq!((d.allowed, d.source), (false, Source::Fallback));
    let m = limiter.metrics().snapshot();
    assert_eq!((m.fallback_decisions, m.granted, m.denied), (1, 5, 1));

    server.resume();
    let deadline = tokio::time::Instant::now() + HANG;
    loop {
        let d = take().await;
        if d.source != Source::Fallback {
            assert!(d.allowed, "{d:?}");
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "never recovered");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(limiter.close().await.unwrap(), 4);
    assert_eq!(server.info("rl", "rl_tokens_returned"), 4.0);
}

#[tokio::test]
async fn lazy_connection_reconnects_after_redis_restarts() {
    let mut server = Server::start();
    let config = limiter_config(FailurePolicy::Allow);
    let limiter = Limiter::from_client(server.client(), frozen(), config).unwrap();
    let take = |key: &'static str| {
        let limiter = limiter.clone();
        async move {
            tokio::time::timeout(HANG, limiter.take(key, 1))
                .await
                .expect("take hung")
                .unwrap()
        }
    };
    assert_eq!(take("a").await.source, Source::Server);

    server.stop();
    assert_eq!(take("a").await.source, Source::Fallback);
    // Redis down: callers are answered locally, not after a connection attempt each: at
    // most one probe per probe interval (100 ms), however long the 50 takes took.
    let calls = limiter.metrics().snapshot().redis_calls;
    let started = std::time::Instant::now();
    for _ in 0..50 {
        assert_eq!(take("b").await.source, Source::Fallback);
    }
    let probes = limiter.metrics().snapshot().redis_calls - calls;
    let intervals = started.elapsed().as_millis() as u64 / 100;
    assert!(
        probes <= intervals + 1,
        "{probes} probes in {intervals} intervals"
    );

    server.resume();
    let deadline = tokio::time::Instant::now() + HANG;
    while take("c").await.source != Source::Server {
        assert!(tokio::time::Instant::now() < deadline, "never recovered");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        server.info("rl", "rl_granted"),
        1.0,
        "the new server's first grant"
    );
}
