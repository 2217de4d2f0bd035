//! `Limiter::take` against a real server: its decisions are the server's.

mod support;

use std::time::Duration;

use rl_client::{Error, FailurePolicy, Limit, Limiter, LimiterConfig, Source};
use support::{Server, TIMEOUT};

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

// Plain takes whose caller stopped waiting (`TakeFlight`).
fn take_config(timeout: Duration) -> LimiterConfig {
    LimiterConfig {
        timeout,
        probe_interval: Duration::from_millis(100),
        policy: FailurePolicy::Deny,
        instances: 1,
        ..Default::default()
    }
}

/// Rule 1, many at once: 20 concurrent takes of 2 all time out behind a `DEBUG SLEEP`; every
/// grant that lands later is refunded once: the bucket is back where it was, 20 refunds of 2,
/// and the decisions add up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_timed_out_takes_are_each_refunded_once() {
    let server = Server::start();
    let limit = Limit::new(0.001, 100.0).unwrap();
    // Late replies arrive (the default response timeout would cut them after 2 s).
    let limiter =
        rl_client::Limiter::new(server.patient_lazy(), limit, take_config(TIMEOUT)).unwrap();
    assert!(limiter.take("k", 1).await.unwrap().allowed);
    let sleeper = server.debug_sleep(4.0);
    let mut tasks = Vec::new();
    for _ in 0..20 {
        let l = limiter.clone();
        tasks.push(tokio::spawn(async move { l.take("k", 2).await }));
    }
    for t in tasks {
        let d = t.await.unwrap().unwrap();
        assert_eq!(d.source, Source::Fallback, "{d:?}");
    }
    assert!(
        !sleeper.is_finished(),
        "answered by Redis, not by the timeout"
    );
    sleeper.join().unwrap();
    support::eventually(60, "the refunds", || {
        limiter.metrics().snapshot().refunds == 20
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let s = limiter.metrics().snapshot();
    assert_eq!((s.refunds, s.tokens_refunded), (20, 40), "{s:?}");
    assert_eq!(s.calls, s.granted + s.denied + s.errors, "{s:?}");
    let t = server.tokens("k").unwrap();
    assert!((t - 99.0).abs() < 0.1, "server holds {t}");
}

/// Rule 1: a take whose caller gave up while Redis stalled for longer than the connection's
/// `response_timeout` (2 s by default). The `RL.TAKE` still runs when Redis wakes and
/// debits the bucket, but the background call was cut at 2 s (not `LATE_REPLY`), so its
/// grant is never refunded nor counted anywhere: 5 tokens silently lost. Now counted in
/// `takes_lost`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_take_answered_after_the_response_timeout_is_not_lost_silently() {
    let server = Server::start();
    let limit = Limit::new(0.001, 100.0).unwrap();
    // Replies are cut after 1 s; Redis sleeps 4 s: the take's reply comes later than that
    // unless it was sent 3 s into the sleep.
    let lazy = rl_client::LazyConnection::with_config(
        server.client(),
        rl_client::LazyConfig {
            response_timeout: Duration::from_secs(1),
            ..Default::default()
        },
    );
    let limiter =
        rl_client::Limiter::new(lazy, limit, take_config(Duration::from_millis(900))).unwrap();
    assert!(limiter.take("k", 1).await.unwrap().allowed);
    let sleeper = server.debug_sleep(4.0);
    let d = limiter.take("k", 5).await.unwrap();
    assert_eq!(d.source, Source::Fallback, "{d:?}");
    assert!(
        !sleeper.is_finished(),
        "answered by Redis, not by the timeout"
    );
    sleeper.join().unwrap();
    support::eventually(60, "the take to be given up", || {
        limiter.metrics().snapshot().takes_lost == 1
    })
    .await;
    // Given up, but the take ran when Redis woke.
    support::eventually(60, "the take to run", || {
        server.tokens("k").is_some_and(|t| t < 95.0)
    })
    .await;
    let t = server.tokens("k").unwrap();
    let s = limiter.metrics().snapshot();
    // The reply was cut at 2 s: the take ran, nothing could be refunded; at least it is
    // counted (as `leases_lost` counts a lease whose reply never came).
    assert!((t - 94.0).abs() < 0.1, "server holds {t}");
    assert_eq!((s.takes_lost, s.refunds), (1, 0), "{s:?}");
}

/// No panic: a take cancelled on a current-thread runtime that is dropped right after.
#[test]
fn a_take_cancelled_on_a_runtime_then_dropped_does_not_panic() {
    let server = Server::start();
    let limit = Limit::new(0.001, 100.0).unwrap();
    for _ in 0..5 {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let limiter = rl_client::Limiter::from_client(
            server.client(),
            limit,
            take_config(Duration::from_millis(200)),
        )
        .unwrap();
        rt.block_on(async {
            assert!(limiter.take("k", 1).await.unwrap().allowed);
        });
        let sleeper = server.debug_sleep(0.5);
        rt.block_on(async {
            let _ = tokio::time::timeout(Duration::from_millis(20), limiter.take("k", 3)).await;
        });
        drop(rt);
        drop(limiter);
        sleeper.join().unwrap();
    }
}
