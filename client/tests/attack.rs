//! Attacks on the client contract (README: "What a client guarantees under cancellation,
//! errors and outages"), each against a real server. Every test here failed before its fix.

mod support;

use std::time::Duration;

use rl_client::{FailurePolicy, Limit, LimiterConfig, PrefetchConfig, PrefetchLimiter, Source};
use support::Server;

fn prefetch_config(policy: FailurePolicy, instances: u32) -> PrefetchConfig {
    PrefetchConfig {
        batch: 20,
        ttl: Duration::from_secs(60),
        renew_at: 0.0,
        jitter: 0.0,
        limiter: LimiterConfig {
            timeout: Duration::from_millis(300),
            probe_interval: Duration::from_millis(100),
            policy,
            instances,
            ..Default::default()
        },
    }
}

/// Rule 4: under `LastKnown` a prefetching limiter's fallback budget is its share of the
/// limit (cap / instances) and an outage does not refill it. Before the fix, a lease left no
/// level behind (`observe(.., None)`), so every outage started a full local bucket of the
/// whole cap (the measured rate clamps to the limit's rate: one share = the whole limit),
/// and every lease in between reset it: 100 per flap per instance where 25 were due once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefetch_last_known_budget_is_a_share_and_survives_flaps() {
    let mut server = Server::start();
    // 100 tokens that do not refill within the test; 4 instances: a share of 25.
    let limit = Limit::new(0.001, 100.0).unwrap();
    let limiter = PrefetchLimiter::from_client(
        server.client(),
        "k",
        limit,
        prefetch_config(FailurePolicy::LastKnown, 4),
    )
    .unwrap();
    let mut fallback_allowed = 0;
    for _flap in 0..3 {
        // Up: spend a lease (one call to Redis), so the meter has a rate.
        let d = limiter.take(1).await.unwrap();
        assert!(d.allowed);
        while limiter.held() > 0 {
            assert!(limiter.take(1).await.unwrap().allowed);
        }
        tokio::time::sleep(Duration::from_millis(150)).await;
        server.stop();
        for _ in 0..200 {
            let d = limiter.take(1).await.unwrap();
            if d.source == Source::Fallback && d.allowed {
                fallback_allowed += 1;
            }
        }
        server.resume();
        // Wait for the limiter to be back on Redis (a probe per 100 ms).
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            tokio::time::sleep(Duration::from_millis(120)).await;
            if limiter.take(1).await.unwrap().source != Source::Fallback {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "never recovered");
        }
    }
    println!("fallback allowed over 3 flaps: {fallback_allowed}");
    // The share of 25, once (not 100 per flap).
    assert!(fallback_allowed <= 25, "fallback allowed {fallback_allowed}");
}

/// Rule 2: an authentication failure (`WRONGPASS` at connect, `NOAUTH` on a call) is an
/// error reply, never an outage: under `Allow` it must not fail open.
#[tokio::test]
async fn authentication_failures_are_errors_not_outages() {
    let server = Server::start();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("requirepass")
        .arg("secret")
        .query(&mut server.conn())
        .unwrap();
    let wrong = format!("redis://:wrong@127.0.0.1:{}/", server.port);
    let none = server.url();
    for url in [wrong, none] {
        let client = redis::Client::open(url.as_str()).unwrap();
        let config = LimiterConfig {
            policy: FailurePolicy::Allow,
            ..Default::default()
        };
        let limiter =
            rl_client::Limiter::from_client(client.clone(), Limit::new(1.0, 5.0).unwrap(), config)
                .unwrap();
        for _ in 0..3 {
            let e = limiter.take("k", 1).await.unwrap_err();
            assert!(!e.is_outage() && e.is_server_error(), "{url}: {e:?}");
        }
        let prefetch = PrefetchLimiter::from_client(
            client,
            "p",
            Limit::new(1.0, 40.0).unwrap(),
            prefetch_config(FailurePolicy::Allow, 4),
        )
        .unwrap();
        let e = prefetch.take(1).await.unwrap_err();
        assert!(!e.is_outage() && e.is_server_error(), "{url}: {e:?}");
        let m = limiter.metrics().snapshot();
        assert_eq!((m.fallback_decisions, m.errors, m.calls), (0, 3, 3), "{m:?}");
    }
    // The kit's server stops with SHUTDOWN, unauthenticated.
    let authed = format!("redis://:secret@127.0.0.1:{}/", server.port);
    let mut c = redis::Client::open(authed).unwrap().get_connection().unwrap();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("requirepass")
        .arg("")
        .query(&mut c)
        .unwrap();
}
