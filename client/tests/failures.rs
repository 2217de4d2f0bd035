//! The client under real failures, each against real servers: cancelled and
//! timed-out takes under `DEBUG SLEEP`, error replies of each kind, a missing module,
//! half-open connections, startup with Redis down, Redis killed and restarted, flapping
//! outages under each policy, the fleet bound at 512 instances, and the lower items (stale
//! leases, close, drop, metrics that add up). The shared contract is docs/client-contract.md:
//! "What a client guarantees under cancellation, errors and outages".

mod support;

use std::time::{Duration, Instant};

use rl_client::{
    Backend, Decision, Error, FailurePolicy, LazyConfig, LazyConnection, Limit, Limiter,
    LimiterConfig, PrefetchConfig, PrefetchLimiter, Source,
};
use support::{eventually, Plain, Proxy, Server, PATIENT};

/// Guard against a hang: far above any configured timeout.
const HANG: Duration = Duration::from_secs(30);

/// A call's timeout where a test needs one to pass while Redis sleeps (under `DEBUG SLEEP`
/// of at least 3 s: a call answered while Redis still sleeps was answered by its timeout,
/// however slow the machine), and where a healthy call must not be taken for an outage.
const TIMEOUT_MS: u64 = 1_000;

/// Where the timeout is not the point: far above any call's time on a loaded machine.
const PATIENT_MS: u64 = 10_000;

const POLICIES: [FailurePolicy; 3] = [
    FailurePolicy::Allow,
    FailurePolicy::LastKnown,
    FailurePolicy::Deny,
];

fn limiter_config(policy: FailurePolicy, timeout_ms: u64) -> LimiterConfig {
    LimiterConfig {
        timeout: Duration::from_millis(timeout_ms),
        probe_interval: Duration::from_millis(100),
        policy,
        instances: 1,
        ..Default::default()
    }
}

fn prefetch_config(policy: FailurePolicy, timeout_ms: u64) -> PrefetchConfig {
    PrefetchConfig {
        batch: 20,
        ttl: Duration::from_secs(60),
        // No background renewal: every lease in these tests is one a take asked for.
        renew_at: 0.0,
        jitter: 0.0,
        limiter: limiter_config(policy, timeout_ms),
    }
}

/// 100 tokens that do not refill within a test.
fn frozen() -> Limit {
    Limit::new(0.001, 100.0).unwrap()
}

/// A prefetching limiter on `server`'s key "k": [`frozen`], [`prefetch_config`], over a
/// connection that waits out every `DEBUG SLEEP` here (late replies arrive).
fn prefetcher(
    server: &Server,
    policy: FailurePolicy,
    timeout_ms: u64,
) -> PrefetchLimiter<LazyConnection> {
    PrefetchLimiter::new(
        server.patient_lazy(),
        "k",
        frozen(),
        prefetch_config(policy, timeout_ms),
    )
    .unwrap()
}

fn assert_adds_up(m: &rl_client::MetricsSnapshot) {
    assert_eq!(m.calls, m.granted + m.denied + m.errors, "{m:?}");
}

/// A lazy connection through `proxy`, replaced once calls on it go unanswered for
/// `response_timeout`.
fn through(proxy: &Proxy, response_timeout: Duration) -> LazyConnection {
    let config = LazyConfig {
        connect_timeout: Duration::from_millis(500),
        response_timeout,
    };
    LazyConnection::with_config(proxy.client(), config)
}

async fn timed<T>(f: impl std::future::Future<Output = T>) -> (T, Duration) {
    let started = Instant::now();
    let out = tokio::time::timeout(HANG, f).await.expect("hung");
    (out, started.elapsed())
}

// 1. Cancellation never loses tokens.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_takes_lose_no_tokens() {
    let server = Server::start();
    let limiter = prefetcher(&server, FailurePolicy::Deny, PATIENT_MS);
    assert!(limiter.take(1).await.unwrap().allowed);
    assert_eq!(limiter.held(), 19);

    // Redis stalls; five callers give up on takes that need a lease (a request timeout,
    // a client gone): their futures are dropped while the lease call is in flight.
    let sleeper = server.debug_sleep(3.0);
    for _ in 0..5 {
        let cancelled = tokio::time::timeout(Duration::from_millis(10), limiter.take(20)).await;
        assert!(
            cancelled.is_err(),
            "Redis is asleep: the take cannot be answered"
        );
    }
    sleeper.join().unwrap();

    // The one lease call they started completed on its own task and was installed: the
    // older lease's 19 and the new batch of 20 are held, nothing was lost.
    eventually(20, "the lease to be installed", || limiter.held() == 39).await;
    let t = server.tokens("k").unwrap();
    assert!((t - 60.0).abs() < 0.1, "server holds {t}");
    let m = limiter.metrics().snapshot();
    assert_eq!((m.cancelled, m.leases, m.leases_lost), (5, 2, 0), "{m:?}");
    assert_adds_up(&m);
    let d = limiter.take(1).await.unwrap();
    assert_eq!((d.allowed, d.source), (true, Source::Lease));

    // Everything held goes back: the server is where it would be after 2 tokens spent.
    assert_eq!(limiter.close().await.unwrap(), 38);
    let t = server.tokens("k").unwrap_or(100.0);
    assert!((t - 98.0).abs() < 0.1, "server holds {t}");
    assert_adds_up(&limiter.metrics().snapshot());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_take_past_its_timeout_falls_back_and_its_lease_arrives_later() {
    let server = Server::start();
    let limiter = prefetcher(&server, FailurePolicy::Deny, TIMEOUT_MS);
    assert!(limiter.take(1).await.unwrap().allowed);
    let sleeper = server.debug_sleep(4.0);
    let (d, _) = timed(limiter.take(20)).await;
    let d = d.unwrap();
    assert_eq!((d.allowed, d.source), (false, Source::Fallback), "{d:?}");
    assert!(
        !sleeper.is_finished(),
        "answered by Redis, not by the timeout"
    );
    sleeper.join().unwrap();
    // The lease call went on after the caller's timeout and installed its batch.
    eventually(20, "the late lease", || limiter.held() == 39).await;
    let m = limiter.metrics().snapshot();
    assert_eq!((m.leases, m.leases_lost, m.fallback_decisions), (2, 0, 1));
    assert_adds_up(&m);
    assert_eq!(limiter.close().await.unwrap(), 39);
}

/// A plain `take` whose caller stopped waiting (its timeout passed, or its future was
/// dropped) while Redis slept: the `RL.TAKE` still ran when Redis woke and debited the
/// bucket for a caller that had already been answered by the policy (or was gone). The
/// call now completes on its own task and the grant is refunded: nothing spent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_take_nobody_waited_for_is_refunded() {
    nobody_waited_for(Ask::Take).await;
}

/// The same for `reserve` (`RL.RESERVE`; granted without a wait: the bucket is not in
/// debt, so the refund credits it all).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reservation_nobody_waited_for_is_refunded() {
    nobody_waited_for(Ask::Reserve).await;
}

#[derive(Clone, Copy)]
enum Ask {
    Take,
    Reserve,
}

async fn ask<C: rl_client::RedisConnection>(
    limiter: &Limiter<C>,
    what: Ask,
    n: u64,
) -> Result<Decision, Error> {
    match what {
        Ask::Take => limiter.take("k", n).await,
        Ask::Reserve => {
            let max = Duration::from_secs(60);
            limiter.reserve("k", n, max).await.map(|r| r.decision)
        }
    }
}

async fn nobody_waited_for(what: Ask) {
    let server = Server::start();
    let limiter = Limiter::new(
        server.patient_lazy(),
        frozen(),
        limiter_config(FailurePolicy::Deny, TIMEOUT_MS),
    )
    .unwrap();
    assert!(limiter.take("k", 1).await.unwrap().allowed);
    let sleeper = server.debug_sleep(4.0);
    // Timed out: the policy answers.
    let (d, _) = timed(ask(&limiter, what, 5)).await;
    let d = d.unwrap();
    assert_eq!((d.allowed, d.source), (false, Source::Fallback), "{d:?}");
    // Cancelled: the caller's future is dropped mid-call (the probe after the timeout is
    // allowed again after `probe_interval`).
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert!(
        tokio::time::timeout(Duration::from_millis(10), ask(&limiter, what, 7))
            .await
            .is_err()
    );
    assert!(
        !sleeper.is_finished(),
        "answered by Redis, not by the timeout"
    );
    sleeper.join().unwrap();
    eventually(20, "the refunds", || {
        limiter.metrics().snapshot().tokens_refunded == 12
    })
    .await;
    let t = server.tokens("k").unwrap_or(100.0);
    assert!((t - 99.0).abs() < 0.1, "server holds {t}");
    let m = limiter.metrics().snapshot();
    assert_eq!((m.refunds, m.takes_lost), (2, 0));
}

/// A reservation nobody waited for, granted from a bucket not in debt, whose refund finds
/// the bucket in debt (a reservation into debt ran right behind it, on the same connection):
/// the bucket takes nothing back, so the grant stays debited and counts in `takes_lost`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_grant_whose_refund_finds_the_bucket_in_debt_counts_as_lost() {
    let server = Server::start();
    let conn = server.patient_lazy();
    let limiter = Limiter::new(
        conn.clone(),
        frozen(),
        limiter_config(FailurePolicy::Deny, TIMEOUT_MS),
    )
    .unwrap();
    // The same connection, a caller that waits for its answer.
    let patient = Limiter::new(
        conn,
        frozen(),
        limiter_config(FailurePolicy::Deny, PATIENT_MS),
    )
    .unwrap();
    assert!(limiter.take("k", 1).await.unwrap().allowed);
    let day = Duration::from_secs(86_400);
    let sleeper = server.debug_sleep(4.0);
    // Runs when Redis wakes (50 of 99 tokens, no debt), its caller gone by then.
    let (r, _) = timed(limiter.reserve_nowait("k", 50, Duration::from_secs(1))).await;
    assert_eq!(r.unwrap().decision.source, Source::Fallback);
    // Runs right behind it: 100 tokens of the 49 left, into debt.
    let queued = tokio::spawn(async move { patient.reserve_nowait("k", 100, day).await });
    assert!(
        !sleeper.is_finished(),
        "both reservations were sent while Redis slept"
    );
    sleeper.join().unwrap();
    let queued = queued.await.unwrap().unwrap();
    assert!(
        queued.allowed() && queued.decision.remaining < 0.0,
        "{queued:?}"
    );
    eventually(20, "the refused refund", || {
        limiter.metrics().snapshot().takes_lost == 1
    })
    .await;
    let m = limiter.metrics().snapshot();
    assert_eq!((m.refunds, m.tokens_refunded), (0, 0));
    let t = server.tokens("k").unwrap();
    assert!((t + 51.0).abs() < 0.1, "server holds {t}");
}

/// A reservation sent on a connection that went half-open (a proxy that forwards nothing
/// more): its caller falls back at its timeout, and the call, cut by the connection's
/// response timeout, counts in `takes_lost` (Redis may have run it; nothing is refunded).
/// Redis never saw it here: its bucket is unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reservation_on_a_half_open_connection_counts_as_lost_and_refunds_nothing() {
    let server = Server::start();
    let proxy = Proxy::start(server.port).await;
    let lazy = through(&proxy, Duration::from_secs(2));
    let limiter = Limiter::new(
        lazy,
        frozen(),
        limiter_config(FailurePolicy::Deny, TIMEOUT_MS),
    )
    .unwrap();
    assert_eq!(limiter.take("k", 1).await.unwrap().source, Source::Server);
    proxy.freeze();
    let max = Duration::from_secs(60);
    let (r, _) = timed(limiter.reserve("k", 5, max)).await;
    let r = r.unwrap();
    assert_eq!((r.allowed(), r.decision.source), (false, Source::Fallback));
    eventually(20, "the cut call", || {
        limiter.metrics().snapshot().takes_lost == 1
    })
    .await;
    let m = limiter.metrics().snapshot();
    assert_eq!((m.refunds, m.tokens_refunded), (0, 0));
    assert_adds_up(&m);
    let t = server.tokens("k").unwrap();
    assert!((t - 99.0).abs() < 0.1, "server holds {t}");
}

// 2. Error replies are errors, never outages.

#[tokio::test]
async fn error_replies_are_returned_never_granted_under_any_policy() {
    let server = Server::start();
    let _: () = redis::cmd("SET")
        .arg("plain-string")
        .arg("x")
        .query(&mut server.conn())
        .unwrap();
    // A key that already has the most live leases the module allows.
    let mut pipe = redis::pipe();
    for _ in 0..1024 {
        pipe.cmd("RL.LEASE")
            .arg("crowded")
            .arg(1000)
            .arg(100_000)
            .arg(1)
            .arg(60_000)
            .ignore();
    }
    let _: () = pipe.query(&mut server.conn()).unwrap();

    for policy in POLICIES {
        let limiter = Limiter::from_client(
            server.client(),
            frozen(),
            limiter_config(policy, PATIENT_MS),
        )
        .unwrap();
        for _ in 0..20 {
            let e = limiter.take("plain-string", 1).await.unwrap_err();
            assert!(
                matches!(&e, Error::Server(t) if t.contains("WRONGTYPE")),
                "{e:?}"
            );
            let e = limiter
                .reserve("plain-string", 1, Duration::from_secs(1))
                .await
                .unwrap_err();
            assert!(e.is_server_error() && !e.is_outage(), "{e:?}");
        }
        // Redis is not down for everyone else.
        assert_eq!(
            limiter.take("fine", 1).await.unwrap().source,
            Source::Server
        );
        let m = limiter.metrics().snapshot();
        assert_eq!((m.server_errors, m.errors), (40, 40), "{policy:?} {m:?}");
        assert_eq!((m.redis_errors, m.fallback_decisions), (0, 0), "{policy:?}");
        assert_eq!(m.granted, 1);
        assert_adds_up(&m);

        for key in ["plain-string", "crowded"] {
            let prefetch = PrefetchLimiter::from_client(
                server.client(),
                key,
                Limit::new(1000.0, 100_000.0).unwrap(),
                prefetch_config(policy, PATIENT_MS),
            )
            .unwrap();
            for _ in 0..20 {
                let e = prefetch.take(1).await.unwrap_err();
                let want = if key == "crowded" {
                    "too many live leases"
                } else {
                    "WRONGTYPE"
                };
                assert!(matches!(&e, Error::Server(t) if t.contains(want)), "{e:?}");
            }
            let m = prefetch.metrics().snapshot();
            assert_eq!((m.granted, m.fallback_decisions, m.redis_errors), (0, 0, 0));
            assert_eq!((m.errors, m.server_errors), (20, 20), "{policy:?} {m:?}");
            assert_adds_up(&m);
        }
    }
}

#[tokio::test]
async fn a_missing_module_is_a_clear_error_naming_the_fix() {
    let plain = Plain::start();
    for policy in POLICIES {
        for backend in [Backend::Module, Backend::Auto] {
            let config = LimiterConfig {
                backend,
                ..limiter_config(policy, PATIENT_MS)
            };
            let limiter = Limiter::from_client(plain.client(), frozen(), config.clone()).unwrap();
            // At startup...
            let e = limiter.check().await.unwrap_err();
            assert!(
                e.to_string().contains("loadmodule") && !e.is_outage(),
                "{e}"
            );
            // ...and at first use.
            let e = limiter.take("k", 1).await.unwrap_err();
            assert!(matches!(e, Error::Config(_)), "{e:?}");
            assert!(e.to_string().contains("loadmodule"), "{e}");
            let prefetch = PrefetchLimiter::from_client(
                plain.client(),
                "k",
                frozen(),
                PrefetchConfig {
                    limiter: config,
                    ..prefetch_config(policy, PATIENT_MS)
                },
            )
            .unwrap();
            let e = prefetch.take(1).await.unwrap_err();
            assert!(e.to_string().contains("loadmodule"), "{e}");
            for m in [limiter.metrics().snapshot(), prefetch.metrics().snapshot()] {
                assert_eq!((m.granted, m.fallback_decisions, m.errors), (0, 0, 1));
            }
        }
    }
    // With the module: the check passes; with Redis down it is an outage, not a config
    // error (a service may start anyway).
    let mut server = Server::start();
    let config = limiter_config(FailurePolicy::Allow, PATIENT_MS);
    let limiter = Limiter::from_client(server.client(), frozen(), config).unwrap();
    assert_eq!(limiter.check().await.unwrap(), Backend::Module);
    server.stop();
    assert!(limiter.check().await.unwrap_err().is_outage());
}

// 3. Recovery: startup with Redis down, restarts, half-open connections.

/// Takes from `limiter` until Redis decides again; answers how long that took.
async fn until_server(
    take: impl Fn() -> std::pin::Pin<Box<dyn std::future::Future<Output = Decision> + Send>>,
) -> Duration {
    let started = Instant::now();
    loop {
        let (d, _) = timed(take()).await;
        if d.source != Source::Fallback {
            return started.elapsed();
        }
        assert!(started.elapsed() < HANG, "never recovered");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn starts_with_redis_down_serves_its_policy_and_recovers_after_restarts() {
    let mut server = Server::stopped();
    // Redis down is a refused connection here, answered at once: no timeout involved.
    let config = LimiterConfig {
        instances: 2,
        ..limiter_config(FailurePolicy::Allow, PATIENT_MS)
    };
    let limit = Limit::new(0.001, 10.0).unwrap();
    let limiter = Limiter::from_client(server.client(), limit, config.clone()).unwrap();
    let prefetch = PrefetchLimiter::from_client(
        server.client(),
        "p",
        limit,
        PrefetchConfig {
            batch: 2,
            limiter: config,
            ..prefetch_config(FailurePolicy::Allow, PATIENT_MS)
        },
    )
    .unwrap();
    // Nothing listens: each decides from its share (10 / 2 instances), within its timeout.
    for _ in 0..2 {
        let mut allowed = 0;
        for _ in 0..8 {
            let (d, _) = timed(limiter.take("k", 1)).await;
            let d = d.unwrap();
            assert_eq!(d.source, Source::Fallback);
            allowed += u64::from(d.allowed);
            let (d, _) = timed(prefetch.take(1)).await;
            // A lease still held from before the outage is spent first.
            assert_ne!(d.unwrap().source, Source::Server);
        }
        assert!(allowed <= 5, "at most the share: {allowed}");

        // Redis comes up (or back): both go back to it within the documented bound.
        server.resume();
        let l = limiter.clone();
        let back = until_server(move || {
            let l = l.clone();
            Box::pin(async move { l.take("fresh", 1).await.unwrap() })
        })
        .await;
        let p = prefetch.clone();
        let back_p = until_server(move || {
            let p = p.clone();
            Box::pin(async move { p.take(1).await.unwrap() })
        })
        .await;
        println!("recovered after {back:?} (Limiter), then {back_p:?} (PrefetchLimiter)");
        server.stop();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_half_open_connection_is_detected_and_replaced() {
    let server = Server::start();
    let proxy = Proxy::start(server.port).await;
    let lazy = through(&proxy, Duration::from_millis(800));
    let limiter = Limiter::new(
        lazy.clone(),
        frozen(),
        limiter_config(FailurePolicy::Deny, TIMEOUT_MS),
    )
    .unwrap();
    let prefetch = PrefetchLimiter::new(
        lazy,
        "p",
        frozen(),
        prefetch_config(FailurePolicy::Deny, TIMEOUT_MS),
    )
    .unwrap();
    assert_eq!(limiter.take("k", 1).await.unwrap().source, Source::Server);
    assert!(prefetch.take(20).await.unwrap().allowed);
    assert_eq!(proxy.accepted(), 1);

    // The connection stays open but nothing comes back on it, ever.
    proxy.freeze();
    // Nothing comes back on the frozen connection: whatever answers is the timeout.
    let (d, _) = timed(limiter.take("k", 1)).await;
    assert_eq!(d.unwrap().source, Source::Fallback);
    let (d, _) = timed(prefetch.take(1)).await;
    // Its lease call may already go out on a new connection (the replacement below, racing
    // this call on a loaded machine): then Redis answers it. Or the limiter's refill ahead,
    // sent before the freeze, landed first: then the take is served from that lease. Never
    // an answer from the frozen connection.
    let d = d.unwrap();
    assert!(
        d.source == Source::Fallback || d.source == Source::Lease || proxy.accepted() > 1,
        "{d:?} with one connection, frozen"
    );

    // The silent connection is replaced by a new one, and decisions come from Redis again.
    let l = limiter.clone();
    let back = until_server(move || {
        let l = l.clone();
        Box::pin(async move { l.take("k", 1).await.unwrap() })
    })
    .await;
    let p = prefetch.clone();
    until_server(move || {
        let p = p.clone();
        Box::pin(async move { p.take(1).await.unwrap() })
    })
    .await;
    println!("half-open connection replaced after {back:?}");
    assert!(proxy.accepted() >= 2, "a new connection");
    // A lease call that timed out on the silent connection never got its answer: counted.
    // (On a loaded machine the take above may be served from a refill that landed before
    // the freeze, or by a new connection: then no lease call need have timed out.)
    let m = prefetch.metrics().snapshot();
    if m.redis_timeouts > 0 {
        assert!(m.leases_lost >= 1, "{m:?}");
    }
    assert_adds_up(&m);
}

// 4. Local state: fleet shares that carry across flaps, per-size denials.

/// Fallback grants of one key over three outages; Redis answers in between.
async fn flapping(policy: FailurePolicy) -> u64 {
    let mut server = Server::start();
    // Redis down is a refused connection here, answered at once: no timeout involved.
    let config = LimiterConfig {
        instances: 2,
        ..limiter_config(policy, PATIENT_MS)
    };
    // 8 tokens, refilling 0.01/s: this instance's share is 4.
    let limiter =
        Limiter::from_client(server.client(), Limit::new(0.01, 8.0).unwrap(), config).unwrap();
    assert_eq!(
        limiter.take("warm", 1).await.unwrap().source,
        Source::Server
    );
    let mut allowed = 0;
    for flap in 0..3 {
        server.stop();
        for _ in 0..10 {
            let d = limiter.take("k", 1).await.unwrap();
            assert_eq!(d.source, Source::Fallback);
            allowed += u64::from(d.allowed);
        }
        server.resume();
        let l = limiter.clone();
        until_server(move || {
            let l = l.clone();
            Box::pin(async move { l.take(&format!("probe{flap}"), 1).await.unwrap() })
        })
        .await;
    }
    assert_adds_up(&limiter.metrics().snapshot());
    allowed
}

#[tokio::test]
async fn flapping_outages_do_not_refill_the_allow_budget() {
    // The share of 4 once, not a fresh bucket per flap (nor the whole 8 per instance).
    assert_eq!(flapping(FailurePolicy::Allow).await, 4);
}

#[tokio::test]
async fn flapping_outages_do_not_refill_the_last_known_budget() {
    assert_eq!(flapping(FailurePolicy::LastKnown).await, 4);
}

#[tokio::test]
async fn flapping_outages_under_deny_grant_nothing() {
    assert_eq!(flapping(FailurePolicy::Deny).await, 0);
}

#[tokio::test]
async fn a_denied_large_take_does_not_deny_small_ones() {
    let server = Server::start();
    let limiter = prefetcher(&server, FailurePolicy::Deny, PATIENT_MS);
    // 93 of 100 left on the server.
    let _: redis::Value = redis::cmd("RL.TAKE")
        .arg("k")
        .arg(0.001)
        .arg(100.0)
        .arg(7)
        .query(&mut server.conn())
        .unwrap();
    let big = limiter.take(95).await.unwrap();
    assert_eq!((big.allowed, big.source), (false, Source::Server));
    assert!(big.retry_after > Duration::from_secs(60), "{big:?}");
    // The same size again is denied locally, without a call...
    let calls = limiter.metrics().snapshot().redis_calls;
    assert!(!limiter.take(96).await.unwrap().allowed);
    assert_eq!(limiter.metrics().snapshot().redis_calls, calls);
    // ...but 59 small takes are not: the server has the tokens.
    for _ in 0..59 {
        let d = limiter.take(1).await.unwrap();
        assert!(d.allowed, "{d:?}");
    }
    assert_adds_up(&limiter.metrics().snapshot());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_call_returns_within_its_timeout_under_debug_sleep() {
    let server = Server::start();
    let timeout = Duration::from_millis(TIMEOUT_MS);
    // An established connection, and fresh limiters on it and on their own: their first
    // call also resolves the backend (`Auto`) or connects.
    let connected = LazyConnection::new(server.client());
    let warm = Limiter::new(
        connected.clone(),
        frozen(),
        limiter_config(FailurePolicy::Allow, PATIENT_MS),
    )
    .unwrap();
    assert_eq!(warm.take("warm", 1).await.unwrap().source, Source::Server);
    let mut limiters = Vec::new();
    let mut prefetchers = Vec::new();
    for backend in [Backend::Module, Backend::Auto] {
        let config = LimiterConfig {
            backend,
            ..limiter_config(FailurePolicy::Allow, TIMEOUT_MS)
        };
        let prefetch = PrefetchConfig {
            limiter: config.clone(),
            ..prefetch_config(FailurePolicy::Allow, TIMEOUT_MS)
        };
        limiters.push(Limiter::from_client(server.client(), frozen(), config.clone()).unwrap());
        limiters.push(Limiter::new(connected.clone(), frozen(), config).unwrap());
        prefetchers.push(
            PrefetchLimiter::from_client(server.client(), "p", frozen(), prefetch.clone()).unwrap(),
        );
        prefetchers.push(PrefetchLimiter::new(connected.clone(), "q", frozen(), prefetch).unwrap());
    }
    // Long enough for every call to meet its timeout (two in a row, each at most 1 s, plus
    // a probe interval) while Redis still sleeps.
    let sleeper = server.debug_sleep(6.0);
    let mut calls = Vec::new();
    for i in 0..4 {
        for l in &limiters {
            let l = l.clone();
            calls.push(tokio::spawn(async move {
                let started = Instant::now();
                l.take("k", 1).await.unwrap();
                l.reserve_nowait("k", 1, Duration::from_secs(1))
                    .await
                    .unwrap();
                started.elapsed() / 2
            }));
        }
        for p in &prefetchers {
            let p = p.clone();
            calls.push(tokio::spawn(async move {
                let started = Instant::now();
                p.take(1 + i).await.unwrap();
                started.elapsed()
            }));
        }
    }
    let mut slowest = Duration::ZERO;
    for call in calls {
        slowest = slowest.max(call.await.unwrap());
    }
    println!("slowest call under DEBUG SLEEP 6: {slowest:?} (timeout {timeout:?})");
    // Every call was answered while Redis slept: by its timeout, not by Redis.
    assert!(
        !sleeper.is_finished(),
        "a call waited for Redis: {slowest:?}"
    );
    sleeper.join().unwrap();
}

// 5. The fleet bound at the stated instance count.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_serves_512_prefetching_instances_and_the_513th_gets_an_error() {
    let server = Server::start();
    let conn = server.manager().await;
    let limit = Limit::new(0.001, 1_000_000.0).unwrap();
    // Batch 2 renewing at 1 left: after one take each instance holds two live leases.
    let config = PrefetchConfig {
        batch: 2,
        renew_at: 0.5,
        ..prefetch_config(FailurePolicy::Allow, PATIENT_MS)
    };
    let metrics = std::sync::Arc::new(rl_client::Metrics::new());
    let fleet: Vec<_> = (0..512)
        .map(|_| {
            PrefetchLimiter::with_metrics(
                conn.clone(),
                "fleet",
                limit,
                config.clone(),
                metrics.clone(),
            )
            .unwrap()
        })
        .collect();
    for instance in &fleet {
        assert_eq!(instance.take(1).await.unwrap().source, Source::Server);
    }
    eventually(30, "every renewal", || metrics.snapshot().leases == 1024).await;
    assert_eq!(
        server.live_leases("fleet"),
        1024,
        "two live leases per instance"
    );
    // Spending on renews (settling the older lease in the same call): still 1024.
    for _ in 0..3 {
        for instance in &fleet {
            assert!(instance.take(1).await.unwrap().allowed);
        }
    }
    eventually(30, "renewals", || {
        fleet.iter().all(|i| i.held() > 0) && metrics.snapshot().leases >= 1024 + 512
    })
    .await;
    assert!(server.live_leases("fleet") <= 1024);
    let m = metrics.snapshot();
    assert_eq!((m.errors, m.server_errors, m.fallback_decisions), (0, 0, 0));

    // One instance more is over the module's bound: an error, not a grant.
    let extra = PrefetchLimiter::new(conn.clone(), "fleet", limit, config).unwrap();
    let e = extra.take(1).await.unwrap_err();
    assert!(
        matches!(&e, Error::Server(t) if t.contains("too many live leases")),
        "{e:?}"
    );
    assert_eq!(extra.metrics().snapshot().granted, 0);
    for instance in &fleet {
        instance.close().await.unwrap();
    }
    assert_eq!(server.live_leases("fleet"), 0);
}

// 6. The lower items.

#[tokio::test]
async fn no_grant_from_a_lease_that_arrives_after_its_ttl() {
    let server = Server::start();
    let limiter = PrefetchLimiter::from_client(
        server.client(),
        "k",
        frozen(),
        PrefetchConfig {
            ttl: Duration::from_millis(20),
            ..prefetch_config(FailurePolicy::Deny, PATIENT_MS)
        },
    )
    .unwrap();
    // Connect first, so the round trip below is the slow one.
    let _ = limiter.take(1).await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let sleeper = server.debug_sleep(1.0);
    let d = limiter.take(1).await.unwrap();
    sleeper.join().unwrap();
    assert!(!d.allowed, "granted from a lease past its TTL: {d:?}");
    let m = limiter.metrics().snapshot();
    // The stale lease went back (or, if that failed, is counted).
    eventually(10, "the stale lease settled", || {
        let m = limiter.metrics().snapshot();
        m.returns + m.leases_lost >= 1
    })
    .await;
    assert_eq!(m.fallback_decisions, 0);
    assert_adds_up(&m);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_does_not_lease_again() {
    let server = Server::start();
    let limiter = prefetcher(&server, FailurePolicy::Allow, PATIENT_MS);
    assert!(limiter.take(1).await.unwrap().allowed);
    // Tasks keep calling take while the service shuts down.
    let busy: Vec<_> = (0..4)
        .map(|_| {
            let l = limiter.clone();
            tokio::spawn(async move {
                loop {
                    match l.take(1).await {
                        Err(Error::Closed) => return,
                        Ok(_) => tokio::time::sleep(Duration::from_millis(1)).await,
                        Err(e) => panic!("{e}"),
                    }
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(50)).await;
    limiter.close().await.unwrap();
    for task in busy {
        tokio::time::timeout(HANG, task).await.unwrap().unwrap();
    }
    let granted = server.info("rl", "rl_leases_granted");
    assert!(matches!(limiter.take(1).await, Err(Error::Closed)));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(server.info("rl", "rl_leases_granted"), granted);
    assert_eq!(server.live_leases("k"), 0, "nothing held after close");
    assert_adds_up(&limiter.metrics().snapshot());
}

/// `close()` during a lease call Redis is slow to answer: before, it waited for that call
/// up to its late bound (10 s + timeout) and held up the shutdown; now it returns within the
/// limiter's timeout, and the call returns its own lease when it lands: nothing is left live.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_does_not_wait_out_a_slow_lease_call() {
    let server = Server::start();
    let limiter = prefetcher(&server, FailurePolicy::Deny, TIMEOUT_MS);
    assert!(limiter.take(1).await.unwrap().allowed);
    let sleeper = server.debug_sleep(5.0);
    // This take needs a new lease, which stays in the air while Redis sleeps.
    let (d, _) = timed(limiter.take(20)).await;
    assert_eq!(d.unwrap().source, Source::Fallback);
    let (credited, took) = timed(limiter.close()).await;
    assert!(!sleeper.is_finished(), "close waited for Redis: {took:?}");
    // The held lease's return waits for Redis too; it is credited when Redis wakes.
    assert!(credited.is_err() || credited.unwrap() == 19);
    sleeper.join().unwrap();
    eventually(20, "the late lease to be returned", || {
        server.live_leases("k") == 0
    })
    .await;
    let t = server.tokens("k").unwrap_or(100.0);
    assert!((t - 99.0).abs() < 0.1, "server holds {t}");
    assert!(matches!(limiter.take(1).await, Err(Error::Closed)));
}

/// A lease call that was settling the older lease (`RETURN` in the same call) ends in an
/// error reply after `close()`: the older lease, taken out for settling, went back into the
/// closed limiter's state (held, spendable by nobody, returned only on drop). Now it is
/// returned (here the key is a string by then, so the return fails too: nothing is held).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settling_lease_that_fails_after_close_is_not_put_back() {
    let server = Server::start();
    let mut config = prefetch_config(FailurePolicy::Deny, TIMEOUT_MS);
    config.renew_at = 0.5; // renew in the background at 10 left
    let limiter = PrefetchLimiter::new(server.patient_lazy(), "k", frozen(), config).unwrap();
    // Two leases: the older one (10 left) is settled by the next lease call.
    assert!(limiter.take(1).await.unwrap().allowed);
    assert!(limiter.take(9).await.unwrap().allowed);
    eventually(20, "the renewal", || limiter.held() == 30).await;
    let sleeper = server.debug_sleep(5.0);
    // Written to the server before the lease call is sent: the key is a string when the
    // lease call runs.
    let mut admin = std::net::TcpStream::connect(("127.0.0.1", server.port)).unwrap();
    std::io::Write::write_all(&mut admin, b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nx\r\n").unwrap();
    let (d, took) = timed(limiter.take(40)).await;
    assert_eq!(d.unwrap().source, Source::Fallback);
    // Returns the newer lease (which times out: Redis sleeps); the older one is in the air.
    let (_, closed) = timed(limiter.close()).await;
    assert!(
        !sleeper.is_finished(),
        "take ({took:?}) or close ({closed:?}) waited for Redis"
    );
    sleeper.join().unwrap();
    let mut reply = [0u8; 5];
    std::io::Read::read_exact(&mut admin, &mut reply).unwrap();
    assert_eq!(&reply, b"+OK\r\n");
    eventually(30, "a closed limiter to hold nothing", || {
        limiter.held() == 0
    })
    .await;
}

#[test]
fn dropping_the_limiter_at_the_end_of_main_returns_its_leftovers() {
    let server = Server::start();
    // What `#[tokio::main]` does: a multi-threaded runtime, dropped when main returns.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let config = prefetch_config(FailurePolicy::Deny, PATIENT_MS);
    runtime.block_on(async {
        let limiter = PrefetchLimiter::from_client(server.client(), "k", frozen(), config).unwrap();
        assert!(limiter.take(5).await.unwrap().allowed);
        // The end of main: the limiter goes out of scope, then the runtime.
    });
    drop(runtime);
    assert_eq!(server.info("rl", "rl_tokens_returned"), 15.0);
    assert_eq!(server.live_leases("k"), 0);
}

// "Also": a keyed prefetcher, per-call limits, PEEK and MTAKE.

#[tokio::test]
async fn a_keyed_prefetcher_leases_per_key() {
    let server = Server::start();
    let keyed = rl_client::KeyedPrefetcher::from_client(
        server.client(),
        frozen(),
        prefetch_config(FailurePolicy::Deny, PATIENT_MS),
    )
    .unwrap();
    for key in ["a", "b", "a", "c"] {
        assert!(keyed.take(key, 1).await.unwrap().allowed);
    }
    assert_eq!(keyed.limiter("a").held(), 18);
    let m = keyed.metrics().snapshot();
    assert_eq!((m.leases, m.granted), (3, 4));
    assert_eq!(keyed.close().await.unwrap(), 18 + 19 + 19);
    assert_eq!(server.live_leases("a"), 0);
}

#[tokio::test]
async fn per_call_limits_peek_and_mtake() {
    let server = Server::start();
    let limiter = Limiter::from_client(
        server.client(),
        frozen(),
        limiter_config(FailurePolicy::Deny, PATIENT_MS),
    )
    .unwrap();
    assert_eq!(
        limiter.peek("k").await.unwrap(),
        None,
        "no key: a full bucket"
    );
    let tight = Limit::new(0.001, 2.0).unwrap();
    for allowed in [true, true, false] {
        assert_eq!(
            limiter.take_with("k", 1, tight).await.unwrap().allowed,
            allowed
        );
    }
    let left = limiter.peek("k").await.unwrap().unwrap();
    assert!(left < 1.0, "{left}");
    assert!(limiter.mtake(&["{a}x", "{a}y"], 60).await.unwrap());
    assert!(!limiter.mtake(&["{a}x", "{a}y"], 60).await.unwrap());
    let x = limiter.peek("{a}x").await.unwrap().unwrap();
    assert!((x - 40.0).abs() < 0.1, "{x}");
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
            timeout: PATIENT,
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
            support::prefetch_config(FailurePolicy::Allow, 4),
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
            timeout: PATIENT,
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
                ..support::prefetch_config(policy, 1)
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
        support::prefetch_config(FailurePolicy::Allow, 1),
    )
    .unwrap();
    assert_eq!(limiter.take(1).await.unwrap().source, Source::Server);
    let sleeper = server.debug_sleep(3.0);
    // More than the 19 held: this take needs a lease call.
    let d = limiter.take(20).await.unwrap();
    assert!(
        !sleeper.is_finished(),
        "answered by Redis, not by the timeout"
    );
    sleeper.join().unwrap();
    assert_eq!(d.source, Source::Fallback);
    let m = limiter.metrics().snapshot();
    assert!(m.redis_timeouts >= 1 && m.redis_errors >= 1, "{m:?}");
    assert_eq!(m.calls, m.granted + m.denied + m.errors, "{m:?}");
    limiter.close().await.unwrap();
}
