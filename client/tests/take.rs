//! `Limiter::take` against a real server: its decisions are the server's.

mod support;

use std::time::Duration;

use rl_client::{Error, Limit, Limiter, LimiterConfig, Source};
use support::Server;

/// So slow that nothing refills during a test: every level is exact.
fn frozen() -> Limit {
    Limit::new(0.001, 5.0).unwrap()
}

#[tokio::test]
async fn decisions_match_the_server() {
    let server = Server::start();
    let limiter = Limiter::new(server.manager().await, frozen(), LimiterConfig::default()).unwrap();

    for left in (0..5).rev() {
        let d = limiter.take("user:1", 1).await.unwrap();
        assert!(d.allowed);
        assert_eq!((d.granted, d.source), (1, Source::Server));
        assert!((d.remaining - left as f64).abs() < 0.01, "{d:?}");
        assert_eq!(d.retry_after, Duration::ZERO);
    }
    let denied = limiter.take("user:1", 2).await.unwrap();
    assert!(!denied.allowed);
    assert_eq!(denied.granted, 0);

    // The same question asked directly gets the same answer.
    let raw: (i64, f64, u64, u64) = redis::cmd("RL.TAKE")
        .arg("user:1")
        .arg(0.001)
        .arg(5.0)
        .arg(2)
        .arg("WITHSTATE")
        .query(&mut server.conn())
        .unwrap();
    assert_eq!(raw.0, 0);
    assert!((raw.1 - denied.remaining).abs() < 0.01);
    // 2 tokens at 0.001/s: about 2000 s, as the server computes it.
    let diff = raw.2.abs_diff(denied.retry_after.as_millis() as u64);
    assert!(
        diff < 1_000,
        "server {} ms, decision {:?}",
        raw.2,
        denied.retry_after
    );
    assert_eq!(denied.http_headers().last().unwrap().0, "Retry-After");

    // Other keys are independent.
    assert!(limiter.take("user:2", 5).await.unwrap().allowed);

    let m = limiter.metrics().snapshot();
    assert_eq!(
        (m.calls, m.granted, m.denied, m.tokens_granted),
        (7, 6, 1, 10)
    );
    assert_eq!((m.fallback_decisions, m.redis_errors), (0, 0));
    assert_eq!(m.redis_calls, 7);
    assert_eq!(server.info("rl", "rl_granted"), 6.0);
    assert_eq!(server.info("rl", "rl_denied"), 2.0); // ours and the raw one
}

#[tokio::test]
async fn impossible_requests_are_errors_not_calls() {
    let server = Server::start();
    let limiter = Limiter::new(server.manager().await, frozen(), LimiterConfig::default()).unwrap();
    assert!(matches!(limiter.take("k", 6).await, Err(Error::Request(_))));
    assert!(matches!(limiter.take("k", 0).await, Err(Error::Request(_))));
    assert_eq!(limiter.metrics().snapshot().redis_calls, 0);
}

#[tokio::test]
async fn works_over_a_cluster_connection() {
    let server = Server::start_with(&["--cluster-enabled", "yes"]);
    let mut admin = server.conn();
    let _: () = redis::cmd("CLUSTER")
        .arg("ADDSLOTSRANGE")
        .arg(0)
        .arg(16383)
        .query(&mut admin)
        .unwrap();
    support::eventually(20, "cluster_state:ok", || {
        let info: String = redis::cmd("CLUSTER").arg("INFO").query(&mut admin).unwrap();
        info.contains("cluster_state:ok")
    })
    .await;

    let client = redis::cluster::ClusterClient::new(vec![server.url()]).unwrap();
    let conn = client.get_async_connection().await.unwrap();
    let limiter = Limiter::new(conn, frozen(), LimiterConfig::default()).unwrap();
    for key in ["a", "b", "{tenant}:c"] {
        let d = limiter.take(key, 5).await.unwrap();
        assert!(d.allowed && d.source == Source::Server, "{d:?}");
        assert!(!limiter.take(key, 1).await.unwrap().allowed);
    }
}
