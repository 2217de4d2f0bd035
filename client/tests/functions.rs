//! The `Functions` and `Auto` backends against a server without the module that has the
//! Functions library (`functions/rl.lua`) loaded: same API, same decisions.

mod support;

use std::time::Duration;

use support::{prefetch_config, Plain, Server, PATIENT};

use rl_client::{
    Backend, Error, FailurePolicy, Limit, Limiter, LimiterConfig, PrefetchConfig, PrefetchLimiter,
    Semaphore, Source,
};

fn frozen() -> Limit {
    Limit::new(0.001, 5.0).unwrap()
}

fn config(backend: Backend) -> LimiterConfig {
    LimiterConfig {
        timeout: Duration::from_secs(5),
        policy: FailurePolicy::Deny,
        backend,
        ..Default::default()
    }
}

#[tokio::test]
async fn functions_backend_decides_as_the_module() {
    let server = Plain::with_library();
    for backend in [Backend::Functions, Backend::Auto] {
        let key = format!("user:{backend:?}");
        let limiter = Limiter::new(server.manager().await, frozen(), config(backend)).unwrap();
        for left in (0..5).rev() {
            let d = limiter.take(&key, 1).await.unwrap();
            assert!(d.allowed, "{d:?}");
            assert_eq!((d.granted, d.source), (1, Source::Server));
            assert!((d.remaining - left as f64).abs() < 0.01, "{d:?}");
        }
        let denied = limiter.take(&key, 2).await.unwrap();
        assert!(!denied.allowed && denied.source == Source::Server);
        assert!(denied.retry_after > Duration::from_secs(1000), "{denied:?}");
        // The library's own state: a plain bucket is one string (docs/functions.md).
        let kind: String = redis::cmd("TYPE")
            .arg(&key)
            .query(&mut server.conn())
            .unwrap();
        assert_eq!(kind, "string");
    }
}

#[tokio::test]
async fn prefetch_over_functions() {
    let server = Plain::with_library();
    let config = PrefetchConfig {
        batch: 10,
        ttl: Duration::from_secs(5),
        jitter: 0.0,
        limiter: config(Backend::Auto),
        ..Default::default()
    };
    let limit = Limit::new(0.001, 100.0).unwrap();
    let limiter = PrefetchLimiter::new(server.manager().await, "partner", limit, config).unwrap();
    for _ in 0..3 {
        assert!(limiter.take(1).await.unwrap().allowed);
    }
    assert_eq!(limiter.close().await.unwrap(), 7);
    let leases: Vec<redis::Value> = redis::cmd("FCALL")
        .arg("rl_peek")
        .arg(1)
        .arg("partner")
        .query(&mut server.conn())
        .unwrap();
    // A map (a flat array under RESP2, in the library's own field order).
    let live = leases
        .chunks(2)
        .find(|kv| kv[0] == redis::Value::BulkString(b"leases".to_vec()))
        .map(|kv| kv[1].clone());
    assert_eq!(live, Some(redis::Value::Int(0)), "{leases:?}");
}

#[tokio::test]
async fn auto_without_either_names_both() {
    let server = Plain::start();
    let limiter = Limiter::new(server.manager().await, frozen(), config(Backend::Auto)).unwrap();
    let e = limiter.take_from_server("k", 1).await.unwrap_err();
    assert!(matches!(e, Error::Config(_)), "{e:?}");
    let text = e.to_string();
    assert!(
        text.contains("RL.TAKE") && text.contains("Functions"),
        "{text}"
    );
}

#[tokio::test]
async fn reserve_and_refund_over_functions_and_no_permits() {
    let server = Plain::with_library();
    let limiter = Limiter::new(
        server.manager().await,
        // A token every 10 s: the waits are seconds, whatever time the calls take.
        Limit::new(0.1, 2.0).unwrap(),
        config(Backend::Functions),
    )
    .unwrap();
    let max = Duration::from_secs(60);
    let r = limiter.reserve("q", 2, max).await.unwrap();
    assert!(r.allowed() && r.wait.is_zero(), "{r:?}");
    let r = limiter.reserve_nowait("q", 1, max).await.unwrap();
    assert_eq!(r.decision.source, Source::Server);
    assert!(r.allowed() && r.wait > Duration::from_secs(5), "{r:?}");
    assert!(r.decision.remaining < 0.0, "in debt: {r:?}");
    let denied = limiter
        .reserve_nowait("q", 1, Duration::from_millis(10))
        .await
        .unwrap();
    assert!(!denied.allowed() && denied.wait > Duration::from_secs(15));
    // In debt: nothing taken back (the coming tokens are promised), as with the module.
    let credited = limiter.refund("q", 1).await.unwrap();
    assert_eq!(credited, 0.0);
    // So a `reserve` dropped while it sleeps is refused too, and counted lost (the level
    // read after the refused refund shows the debt).
    let calls = limiter.metrics().snapshot().calls;
    let sleeping = tokio::spawn({
        let limiter = limiter.clone();
        async move { limiter.reserve("q", 1, max).await }
    });
    support::eventually(20, "the reservation", || {
        limiter.metrics().snapshot().calls == calls + 1
    })
    .await;
    sleeping.abort();
    assert!(sleeping.await.unwrap_err().is_cancelled());
    support::eventually(20, "the refused refund", || {
        limiter.metrics().snapshot().takes_lost == 1
    })
    .await;

    // Permits have no Functions equivalent: a clear error, not a fallback.
    let semaphore = Semaphore::new(server.manager().await, config(Backend::Auto)).unwrap();
    let e = semaphore
        .acquire("jobs", 2, Duration::from_secs(1))
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Config(_)), "{e:?}");
    assert!(e.to_string().contains("RL.ACQUIRE"), "{e}");
}

/// `VERSION v` over the library: two releases share a key with two limits; the
/// newer version's limit replaces the older one's (tokens carried over) and then decides
/// the older release's calls too, as with the module.
#[tokio::test]
async fn a_versioned_limit_over_functions_the_newer_wins() {
    let server = Plain::with_library();
    let versioned = |version| LimiterConfig {
        version: Some(version),
        ..config(Backend::Functions)
    };
    let old = Limiter::new(
        server.manager().await,
        Limit::new(0.000001, 10.0).unwrap(),
        versioned(1),
    )
    .unwrap();
    let new = Limiter::new(
        server.manager().await,
        Limit::new(0.000001, 4.0).unwrap(),
        versioned(2),
    )
    .unwrap();
    // Version 1 creates the bucket: cap 10, 9 left.
    let d = old.take("shared", 1).await.unwrap();
    assert!(d.allowed && (d.remaining - 9.0).abs() < 0.01, "{d:?}");
    // Version 2 replaces the limit: 9 tokens carried into cap 4, one taken.
    let d = new.take("shared", 1).await.unwrap();
    assert!(d.allowed && (d.remaining - 3.0).abs() < 0.01, "{d:?}");
    // Version 1's calls are now decided under version 2's cap of 4: 3 left in all, and
    // 5 at once (its own cap allows it) is more than the stored cap.
    let mut granted = 0;
    for _ in 0..5 {
        granted += old.take("shared", 1).await.unwrap().allowed as u32;
    }
    assert_eq!(granted, 3);
    let e = old.take("shared", 5).await;
    assert!(
        matches!(&e, Err(Error::Server(s)) if s.contains("n must not exceed cap")),
        "{e:?}"
    );
    let fields: Vec<redis::Value> = redis::cmd("FCALL")
        .arg("rl_peek")
        .arg(1)
        .arg("shared")
        .query(&mut server.conn())
        .unwrap();
    let field = |name: &[u8]| {
        fields
            .chunks(2)
            .find(|kv| kv[0] == redis::Value::BulkString(name.to_vec()))
            .map(|kv| kv[1].clone())
    };
    assert_eq!(field(b"version"), Some(redis::Value::Int(2)), "{fields:?}");
    assert_eq!(
        field(b"cap"),
        Some(redis::Value::BulkString(b"4".to_vec())),
        "{fields:?}"
    );
}

/// Rule 2 over the Functions library: its error replies (here `WRONGTYPE`, a key holding a
/// string) are returned, never a grant or a policy decision. (Found with `VERSION`, which
/// the library once refused; it now takes it as the module does.)
#[tokio::test]
async fn error_replies_of_the_functions_library_are_errors() {
    let server = Server::start();
    let source =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../functions/rl.lua"))
            .unwrap();
    let _: String = redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg("REPLACE")
        .arg(source)
        .query(&mut server.conn())
        .unwrap();
    let config = LimiterConfig {
        backend: rl_client::Backend::Functions,
        version: Some(2),
        policy: FailurePolicy::Allow,
        timeout: PATIENT,
        ..Default::default()
    };
    for key in ["k", "p"] {
        let _: () = redis::cmd("SET")
            .arg(key)
            .arg("not a bucket")
            .query(&mut server.conn())
            .unwrap();
    }
    let limit = Limit::new(1.0, 40.0).unwrap();
    let limiter = rl_client::Limiter::from_client(server.client(), limit, config.clone()).unwrap();
    let e = limiter.take("k", 1).await.unwrap_err();
    assert!(!e.is_outage() && e.is_server_error(), "{e:?}");
    let prefetch = PrefetchLimiter::from_client(
        server.client(),
        "p",
        limit,
        PrefetchConfig {
            limiter: config,
            ..prefetch_config(FailurePolicy::Allow, 1)
        },
    )
    .unwrap();
    let e = prefetch.take(1).await.unwrap_err();
    assert!(!e.is_outage() && e.is_server_error(), "{e:?}");
    for m in [limiter.metrics().snapshot(), prefetch.metrics().snapshot()] {
        assert_eq!(
            (m.granted, m.fallback_decisions, m.errors),
            (0, 0, 1),
            "{m:?}"
        );
    }
}
