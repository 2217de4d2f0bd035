//! Attacks on the client contract (docs/client-contract.md: "What a client guarantees under
//! cancellation, errors and outages"), each against a real server. Every test here failed before its fix.

mod support;

use std::time::Duration;

use rl_client::{
    Error, FailurePolicy, KeyedPrefetcher, Limit, LimiterConfig, PrefetchConfig, PrefetchLimiter,
    Semaphore, Source,
};
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
    assert!(
        fallback_allowed <= 25,
        "fallback allowed {fallback_allowed}"
    );
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
        assert_eq!(
            (m.fallback_decisions, m.errors, m.calls),
            (0, 3, 3),
            "{m:?}"
        );
    }
    // The kit's server stops with SHUTDOWN, unauthenticated.
    let authed = format!("redis://:secret@127.0.0.1:{}/", server.port);
    let mut c = redis::Client::open(authed)
        .unwrap()
        .get_connection()
        .unwrap();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("requirepass")
        .arg("")
        .query(&mut c)
        .unwrap();
}

/// Rule 6: `close()` returns what is held and leases nothing more. Before the fix
/// `KeyedPrefetcher::close` closed the limiters it had and forgot them: the next take of any
/// key made a fresh limiter and leased a batch nobody would return (a live lease after
/// close, counted nowhere).
#[tokio::test]
async fn a_closed_keyed_prefetcher_leases_nothing_more() {
    let server = Server::start();
    let keyed = KeyedPrefetcher::from_client(
        server.client(),
        Limit::new(0.001, 100.0).unwrap(),
        prefetch_config(FailurePolicy::Allow, 1),
    )
    .unwrap();
    assert!(keyed.take("a", 1).await.unwrap().allowed);
    assert_eq!(keyed.close().await.unwrap(), 19);
    for key in ["a", "b"] {
        assert!(
            matches!(keyed.take(key, 1).await, Err(Error::Closed)),
            "{key} after close"
        );
        assert_eq!(server.live_leases(key), 0, "{key}: a lease after close");
    }
    let m = keyed.metrics().snapshot();
    assert_eq!((m.leases, m.leases_lost, m.errors), (1, 0, 2), "{m:?}");
    assert_eq!(m.calls, m.granted + m.denied + m.errors, "{m:?}");
}

/// Rule 1 for permits: an `RL.ACQUIRE` whose caller gave up (its timeout, a dropped
/// future) still lands on the server; a permit it brings must be released, not left to
/// hold a slot nobody has until its TTL. Before the fix the call ran in the caller's future:
/// the limit-1 key stayed busy for the whole 60 s TTL after a timed-out acquire.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_acquired_after_its_caller_gave_up_is_released() {
    let server = Server::start();
    let config = LimiterConfig {
        timeout: Duration::from_millis(300),
        probe_interval: Duration::from_millis(100),
        policy: FailurePolicy::Deny,
        instances: 1,
        ..Default::default()
    };
    let semaphore = Semaphore::from_client(server.client(), config).unwrap();
    let ttl = Duration::from_secs(60);
    // Connect first.
    let p = semaphore.acquire("p", 1, ttl).await.unwrap().unwrap();
    p.release().await.unwrap();
    let sleeper = server.debug_sleep(1.0);
    // A caller that times out (the limiter's timeout: Deny answers busy)...
    let busy = semaphore.acquire("p", 1, ttl).await.unwrap();
    assert!(busy.is_err());
    // ...and one whose future is dropped.
    let dropped = tokio::time::timeout(
        Duration::from_millis(100),
        semaphore.acquire_from_server("q", 1, ttl),
    )
    .await;
    assert!(dropped.is_err());
    sleeper.join().unwrap();
    // The calls landed after the sleep: their permits go back, the slots are free again.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    for key in ["p", "q"] {
        loop {
            match semaphore.acquire_from_server(key, 1, ttl).await.unwrap() {
                Ok(permit) => {
                    permit.release().await.unwrap();
                    break;
                }
                Err(busy) => assert!(
                    std::time::Instant::now() < deadline,
                    "{key}: slot still held by a permit nobody has: {busy:?}"
                ),
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
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

/// Rule 2: `-OOM command not allowed when used memory > 'maxmemory'` is an error reply:
/// returned under every policy, never a grant (Allow) nor a denial (Deny).
#[tokio::test]
async fn oom_is_an_error_reply_not_an_outage() {
    let server = Server::start();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg(1)
        .query(&mut server.conn())
        .unwrap();
    for policy in [FailurePolicy::Allow, FailurePolicy::Deny] {
        let config = LimiterConfig {
            policy,
            ..Default::default()
        };
        let limit = Limit::new(1.0, 40.0).unwrap();
        let limiter =
            rl_client::Limiter::from_client(server.client(), limit, config.clone()).unwrap();
        let e = limiter.take("k", 1).await.unwrap_err();
        assert!(!e.is_outage() && e.is_server_error(), "{e:?}");
        assert!(e.to_string().contains("OOM"), "{e}");
        let prefetch = PrefetchLimiter::from_client(
            server.client(),
            "p",
            limit,
            PrefetchConfig {
                limiter: config,
                ..prefetch_config(policy, 1)
            },
        )
        .unwrap();
        let e = prefetch.take(1).await.unwrap_err();
        assert!(!e.is_outage() && e.is_server_error(), "{e:?}");
        for m in [limiter.metrics().snapshot(), prefetch.metrics().snapshot()] {
            assert_eq!(
                (m.fallback_decisions, m.errors, m.calls),
                (0, 1, 1),
                "{m:?}"
            );
        }
    }
}

/// Rules 1, 6 and the metrics under stress: 16 tasks take from one limiter while the
/// server stalls three times (`DEBUG SLEEP`, longer than the timeout, shorter than the
/// connection's response timeout), then `close()`: no panic, no hung task, every lease live
/// on the server after close is counted in `leases_lost`, and the counters add up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_tasks_through_stalls_then_close_leave_no_uncounted_lease() {
    let server = Server::start();
    let mut config = prefetch_config(FailurePolicy::Allow, 4);
    config.renew_at = 0.3;
    config.jitter = 0.1;
    config.limiter.timeout = Duration::from_millis(150);
    let limiter = PrefetchLimiter::from_client(
        server.client(),
        "k",
        Limit::new(200.0, 400.0).unwrap(),
        config,
    )
    .unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let tasks: Vec<_> = (0..16)
        .map(|_| {
            let l = limiter.clone();
            let stop = std::sync::Arc::clone(&stop);
            tokio::spawn(async move {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let started = std::time::Instant::now();
                    match tokio::time::timeout(Duration::from_millis(300), l.take(1)).await {
                        Ok(Ok(_)) | Err(_) => {}
                        Ok(Err(Error::Closed)) => return,
                        Ok(Err(e)) => panic!("{e}"),
                    }
                    assert!(started.elapsed() < Duration::from_secs(2));
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            })
        })
        .collect();
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let s = server.debug_sleep(0.8);
        tokio::task::spawn_blocking(move || s.join().unwrap())
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    limiter.close().await.unwrap();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(10), t)
            .await
            .expect("hung task")
            .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let m = limiter.metrics().snapshot();
    let live = server.live_leases("k") as u64;
    assert!(
        live <= m.leases_lost,
        "{live} live leases after close: {m:?}"
    );
    assert_eq!(m.calls, m.granted + m.denied + m.errors, "{m:?}");
}

/// Metrics: a take that falls back because Redis is slow (its lease call outlives the
/// timeout) is an outage and counts as one in `redis_timeouts` / `redis_errors`, as in the
/// Python client. Before the fix the policy decided with both at 0 (the call itself ended
/// well later, within the late-reply bound): an outage invisible in the metrics.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fallback_for_a_slow_redis_counts_a_timeout() {
    let server = Server::start();
    let limiter = PrefetchLimiter::from_client(
        server.client(),
        "k",
        Limit::new(0.001, 100.0).unwrap(),
        prefetch_config(FailurePolicy::Allow, 1),
    )
    .unwrap();
    assert_eq!(limiter.take(1).await.unwrap().source, Source::Server);
    let sleeper = server.debug_sleep(1.0);
    // More than the 19 held: this take needs a lease call.
    let d = limiter.take(20).await.unwrap();
    sleeper.join().unwrap();
    assert_eq!(d.source, Source::Fallback);
    let m = limiter.metrics().snapshot();
    assert!(m.redis_timeouts >= 1 && m.redis_errors >= 1, "{m:?}");
    assert_eq!(m.calls, m.granted + m.denied + m.errors, "{m:?}");
    limiter.close().await.unwrap();
}

// Attack 7: plain takes whose caller stopped waiting (`TakeFlight`).

fn take_config(timeout_ms: u64) -> LimiterConfig {
    LimiterConfig {
        timeout: Duration::from_millis(timeout_ms),
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
async fn attack7_many_timed_out_takes_are_each_refunded_once() {
    let server = Server::start();
    let limit = Limit::new(0.001, 100.0).unwrap();
    let limiter =
        rl_client::Limiter::from_client(server.client(), limit, take_config(200)).unwrap();
    assert!(limiter.take("k", 1).await.unwrap().allowed);
    let sleeper = server.debug_sleep(1.0);
    let mut tasks = Vec::new();
    for _ in 0..20 {
        let l = limiter.clone();
        tasks.push(tokio::spawn(async move { l.take("k", 2).await }));
    }
    for t in tasks {
        let d = t.await.unwrap().unwrap();
        assert_eq!(d.source, Source::Fallback, "{d:?}");
    }
    sleeper.join().unwrap();
    support::eventually(10, "the refunds", || {
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
async fn attack7_a_take_answered_after_the_response_timeout_is_not_lost_silently() {
    let server = Server::start();
    let limit = Limit::new(0.001, 100.0).unwrap();
    let limiter =
        rl_client::Limiter::from_client(server.client(), limit, take_config(200)).unwrap();
    assert!(limiter.take("k", 1).await.unwrap().allowed);
    let sleeper = server.debug_sleep(2.6);
    let d = limiter.take("k", 5).await.unwrap();
    assert_eq!(d.source, Source::Fallback, "{d:?}");
    sleeper.join().unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let t = server.tokens("k").unwrap();
    let s = limiter.metrics().snapshot();
    // The reply was cut at 2 s: the take ran, nothing could be refunded; at least it is
    // counted (as `leases_lost` counts a lease whose reply never came).
    assert!((t - 94.0).abs() < 0.1, "server holds {t}");
    assert_eq!((s.takes_lost, s.refunds), (1, 0), "{s:?}");
}

/// No panic: a take cancelled on a current-thread runtime that is dropped right after.
#[test]
fn attack7_a_take_cancelled_on_a_runtime_then_dropped_does_not_panic() {
    let server = Server::start();
    let limit = Limit::new(0.001, 100.0).unwrap();
    for _ in 0..5 {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let limiter =
            rl_client::Limiter::from_client(server.client(), limit, take_config(200)).unwrap();
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
