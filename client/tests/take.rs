//! `Limiter::take` against a real server: its decisions are the server's.

mod support;

use std::time::Duration;

use rl_client::{Error, Limit, Limiter, LimiterConfig, Source};
use support::Server;

/// Far above any call's time on a loaded machine: every decision here is the server's,
/// never a fallback for a slow call.
fn patient() -> LimiterConfig {
    LimiterConfig {
        timeout: Duration::from_secs(10),
        ..LimiterConfig::default()
    }
}

/// So slow that nothing refills during a test: every level is exact.
fn frozen() -> Limit {
    Limit::new(0.001, 5.0).unwrap()
}

#[tokio::test]
async fn decisions_match_the_server() {
    let server = Server::start();
    let limiter = Limiter::new(server.manager().await, frozen(), patient()).unwrap();

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
    let limiter = Limiter::new(server.manager().await, frozen(), patient()).unwrap();
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
    let limiter = Limiter::new(conn, frozen(), patient()).unwrap();
    for key in ["a", "b", "{tenant}:c"] {
        let d = limiter.take(key, 5).await.unwrap();
        assert!(d.allowed && d.source == Source::Server, "{d:?}");
        assert!(!limiter.take(key, 1).await.unwrap().allowed);
    }
}

/// The bucket's stored `(rate, cap, version)`, from `RL.PEEK` under RESP2.
fn stored_limit(server: &Server, key: &str) -> (f64, f64, u64) {
    let flat: Vec<redis::Value> = redis::cmd("RL.PEEK")
        .arg(key)
        .query(&mut server.conn())
        .unwrap();
    let field = |name: &str| -> String {
        let i = flat
            .iter()
            .position(|v| matches!(v, redis::Value::BulkString(b) if b == name.as_bytes()))
            .unwrap_or_else(|| panic!("PEEK without {name}"));
        match &flat[i + 1] {
            redis::Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
            redis::Value::Int(n) => n.to_string(),
            other => panic!("{other:?}"),
        }
    };
    (
        field("rate").parse().unwrap(),
        field("cap").parse().unwrap(),
        field("version").parse().unwrap(),
    )
}

#[tokio::test]
async fn a_newer_limit_version_wins_over_older_instances() {
    let server = Server::start();
    let config = |version| LimiterConfig {
        version,
        ..patient()
    };
    let old = Limiter::new(server.manager().await, frozen(), config(Some(1))).unwrap();
    let new_limit = Limit::new(0.001, 3.0).unwrap();
    let new = Limiter::new(server.manager().await, new_limit, config(Some(2))).unwrap();

    assert!(old.take("rollout", 1).await.unwrap().allowed);
    assert_eq!(stored_limit(&server, "rollout"), (0.001, 5.0, 1));
    // The new instance's limit replaces the old one (4 of 5 left, clamped to cap 3)...
    let d = new.take("rollout", 1).await.unwrap();
    assert!(d.allowed && (d.remaining - 2.0).abs() < 0.01, "{d:?}");
    assert_eq!(stored_limit(&server, "rollout"), (0.001, 3.0, 2));
    // ...and an old instance is decided under it: 2 left, not 3 of its own cap 5.
    let d = old.take("rollout", 1).await.unwrap();
    assert!(d.allowed && (d.remaining - 1.0).abs() < 0.01, "{d:?}");
    assert_eq!(stored_limit(&server, "rollout"), (0.001, 3.0, 2));

    // Without a version nothing is sent: an unversioned instance is the oldest (version 0).
    let plain = Limiter::new(server.manager().await, frozen(), patient()).unwrap();
    assert!(plain.take("rollout", 1).await.unwrap().allowed);
    assert!(!plain.take("rollout", 1).await.unwrap().allowed);
    assert_eq!(stored_limit(&server, "rollout"), (0.001, 3.0, 2));

    let too_new = LimiterConfig {
        version: Some(1 << 53),
        ..patient()
    };
    assert!(matches!(
        Limiter::new(server.manager().await, frozen(), too_new),
        Err(Error::Config(_))
    ));
}

#[tokio::test]
async fn init_starts_a_new_bucket_below_full() {
    let server = Server::start();
    let config = LimiterConfig {
        init: Some(2.0),
        ..patient()
    };
    let limiter = Limiter::new(server.manager().await, frozen(), config).unwrap();
    // A new bucket holds 2 of its 5: two takes, then a denial.
    assert!(limiter.take("warm", 1).await.unwrap().allowed);
    let d = limiter.take("warm", 1).await.unwrap();
    assert!(d.allowed && d.remaining.abs() < 0.01, "{d:?}");
    assert!(!limiter.take("warm", 1).await.unwrap().allowed);
    // INIT applies to new buckets only: an existing full one is left as it is.
    let plain = Limiter::new(server.manager().await, frozen(), patient()).unwrap();
    assert!(plain.take("full", 1).await.unwrap().allowed);
    let d = limiter.take("full", 1).await.unwrap();
    assert!(d.allowed && (d.remaining - 3.0).abs() < 0.01, "{d:?}");

    let bad = LimiterConfig {
        init: Some(-1.0),
        ..LimiterConfig::default()
    };
    assert!(matches!(
        Limiter::new(server.manager().await, frozen(), bad),
        Err(Error::Config(_))
    ));
}
