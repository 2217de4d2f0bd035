//! `PrefetchLimiter` against a real server: batches, renewal ahead, expiry, leftovers, and
//! a fleet that never spends more than the bucket allows.

mod support;

use std::time::{Duration, Instant};

use rl_client::{
    Error, FailurePolicy, KeyedPrefetcher, Limit, LimiterConfig, PrefetchConfig, PrefetchLimiter,
    Source,
};
use support::{eventually, prefetch_config, Server};

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
    // Long enough for the lease to arrive in time on a loaded machine; then waited out.
    let limiter =
        PrefetchLimiter::new(server.manager().await, "k", frozen(), config(10, 3_000)).unwrap();
    assert!(limiter.take(1).await.unwrap().allowed);
    assert_eq!(limiter.held(), 9);
    eventually(30, "the lease to expire", || limiter.held() == 0).await;
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
    let (instances, batch) = (8, 10);
    let limit = Limit::new(rate, cap).unwrap();
    let run_for = Duration::from_millis(2500);

    let mut fleet = Vec::new();
    for _ in 0..instances {
        let cfg = PrefetchConfig {
            jitter: 0.1,
            ..config(batch, 2_000)
        };
        fleet.push(PrefetchLimiter::new(server.manager().await, "shared", limit, cfg).unwrap());
    }
    let started = Instant::now();
    let mut tasks = Vec::new();
    for limiter in fleet.clone() {
        tasks.push(tokio::spawn(async move {
            // Every grant, as the interval its decision was made in: [asked, answered].
            let mut grants = Vec::new();
            while started.elapsed() < run_for {
                let asked = Instant::now();
                let d = limiter.take(1).await.unwrap();
                if d.allowed {
                    grants.push((asked, Instant::now()));
                } else {
                    tokio::time::sleep(d.retry_after.min(Duration::from_millis(5))).await;
                }
            }
            grants
        }));
    }
    let mut grants = Vec::new();
    for t in tasks {
        grants.extend(t.await.unwrap());
    }
    grants.sort();
    let spent = grants.len() as u64;
    let last_spend = grants.iter().map(|g| g.1).max().unwrap_or(started);
    let elapsed = last_spend.duration_since(started).as_secs_f64();
    let bound = cap + rate * elapsed;
    println!("fleet spent {spent} in {elapsed:.3} s; bound {bound:.1}");
    assert!(spent as f64 <= bound, "spent {spent} > {bound}");
    assert!(spent >= cap as u64, "the full bucket was there to spend");

    // Over any window of t seconds the fleet spends at most cap + rate * t plus what it
    // held when the window opened: up to two leases of at most `batch` per instance. A
    // grant counts in a window if its decision interval meets it (an over-count: the
    // check can only be stricter than the bound).
    let held = 2.0 * batch as f64 * instances as f64;
    let mut worst: f64 = f64::MIN;
    for t in [0.05, 0.1, 0.25, 0.5, 1.0] {
        let window = Duration::from_secs_f64(t);
        for (i, &(open, _)) in grants.iter().enumerate() {
            let close = open + window;
            let inside = grants[i..].iter().take_while(|g| g.0 <= close).count() as f64
                + grants[..i].iter().filter(|g| g.1 >= open).count() as f64;
            let excess = inside - (cap + rate * t);
            worst = worst.max(excess);
            assert!(
                inside <= cap + rate * t + held,
                "{inside} spent in a window of {t} s > {cap} + {rate} * {t} + {held}"
            );
        }
    }
    println!(
        "worst window: cap + rate * t + {worst:.0} (bound: + 2 * batch * instances = + {held})"
    );

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_holding_two_leases_each_bursts_within_the_stated_bound() {
    let server = Server::start();
    let (rate, cap) = (100.0, 100.0);
    let (instances, batch) = (4u64, 10u64);
    let limit = Limit::new(rate, cap).unwrap();
    // Renew at 9 of 10 left: one take leaves each instance holding two leases.
    let cfg = PrefetchConfig {
        renew_at: 0.95,
        ..config(batch, 60_000)
    };
    let mut fleet = Vec::new();
    for _ in 0..instances {
        fleet.push(
            PrefetchLimiter::new(server.manager().await, "burst", limit, cfg.clone()).unwrap(),
        );
    }
    for limiter in &fleet {
        assert!(limiter.take(1).await.unwrap().allowed);
    }
    for limiter in &fleet {
        let m = limiter.metrics().clone();
        eventually(10, "the second lease", || m.snapshot().leases == 2).await;
    }
    let held: u64 = fleet.iter().map(|l| l.held()).sum();
    assert_eq!(held, instances * (2 * batch - 1));
    // The bucket refills while the fleet holds its leases; then everyone spends at once.
    eventually(30, "the bucket to refill", || {
        server.tokens("burst").is_none_or(|t| t >= cap - 1e-6)
    })
    .await;
    let opened = Instant::now();
    let mut tasks = Vec::new();
    for limiter in fleet.clone() {
        tasks.push(tokio::spawn(async move {
            let mut spent = 0u64;
            loop {
                let d = limiter.take(1).await.unwrap();
                if !d.allowed {
                    return (spent, Instant::now());
                }
                spent += 1;
            }
        }));
    }
    let (mut spent, mut closed) = (0, opened);
    for t in tasks {
        let (s, at) = t.await.unwrap();
        spent += s;
        closed = closed.max(at);
    }
    let t = closed.duration_since(opened).as_secs_f64();
    let bound = cap + rate * t + (2 * batch * instances) as f64;
    let old = cap + rate * t + (batch * instances) as f64;
    println!(
        "burst: {spent} spent in {t:.3} s; cap + rate * t = {:.1}; old README bound \
         (+ batch * instances) {old:.1}; stated bound (+ 2 * batch * instances) {bound:.1}",
        cap + rate * t
    );
    assert!(spent as f64 <= bound, "{spent} > {bound}");
    for limiter in &fleet {
        limiter.close().await.unwrap();
    }
}

#[tokio::test]
async fn leases_carry_the_limit_version() {
    let server = Server::start();
    let mut cfg = config(10, 60_000);
    cfg.limiter.version = Some(7);
    let limiter = PrefetchLimiter::new(server.manager().await, "v", frozen(), cfg).unwrap();
    assert!(limiter.take(1).await.unwrap().allowed);
    let version: i64 = {
        let flat: Vec<redis::Value> = redis::cmd("RL.PEEK")
            .arg("v")
            .query(&mut server.conn())
            .unwrap();
        match flat.last() {
            Some(redis::Value::Int(v)) => *v,
            other => panic!("PEEK ends with {other:?}, not its version"),
        }
    };
    assert_eq!(version, 7);
    assert_eq!(server.info("rl", "rl_limit_replaced"), 0.0);
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
                    match tokio::time::timeout(Duration::from_millis(300), l.take(1)).await {
                        Ok(Ok(_)) | Err(_) => {}
                        Ok(Err(Error::Closed)) => return,
                        Ok(Err(e)) => panic!("{e}"),
                    }
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
