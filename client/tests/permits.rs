//! `Semaphore` and its `Permit` guard against a real server: concurrency capped fleet-wide
//! as the holders see it, release on drop, a killed holder's slot freed after the TTL,
//! renewal keeping a long call's permit, and the failure policy while Redis is away.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rl_client::redis::aio::ConnectionManager;
use rl_client::{FailurePolicy, LimiterConfig, Semaphore, Source};
use support::{Server, TIMEOUT};

async fn semaphore(server: &Server) -> Semaphore<ConnectionManager> {
    // Far above any call's time on a loaded machine: every answer here is the server's.
    let config = LimiterConfig {
        timeout: Duration::from_secs(10),
        ..LimiterConfig::default()
    };
    Semaphore::new(server.manager().await, config).unwrap()
}

/// Whether a permit of `key` (limit 1) can be had now; releases it at once if so.
async fn free(semaphore: &Semaphore<ConnectionManager>, key: &str) -> bool {
    match semaphore
        .acquire(key, 1, Duration::from_secs(10))
        .await
        .unwrap()
    {
        Ok(permit) => {
            assert!(permit.release().await.unwrap());
            true
        }
        Err(busy) => {
            assert_eq!(busy.source, Source::Server);
            false
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn permits_cap_concurrency_across_sixteen_tasks() {
    let server = Server::start();
    let limit = 4;
    // Two "instances": two semaphores over two connections, on one key.
    let instances = [semaphore(&server).await, semaphore(&server).await];
    let holding = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    // The first four permits are held until all four are held at once and some task was
    // denied meanwhile: the limit is met however the tasks are scheduled.
    let acquired = Arc::new(AtomicUsize::new(0));
    let refused = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for t in 0..16 {
        let semaphore = instances[t % 2].clone();
        let (holding, most) = (Arc::clone(&holding), Arc::clone(&most));
        let (acquired, refused) = (Arc::clone(&acquired), Arc::clone(&refused));
        tasks.push(tokio::spawn(async move {
            let mut done = 0;
            let mut denied = 0;
            while done < 5 {
                let permit = match semaphore
                    .acquire("downstream", limit, Duration::from_secs(10))
                    .await
                    .unwrap()
                {
                    Ok(permit) => permit,
                    Err(busy) => {
                        assert!(busy.in_use >= limit, "{busy:?}");
                        denied += 1;
                        refused.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(3)).await;
                        continue;
                    }
                };
                let now = holding.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                if acquired.fetch_add(1, Ordering::SeqCst) < limit as usize {
                    let deadline = Instant::now() + Duration::from_secs(60);
                    while most.load(Ordering::SeqCst) < limit as usize
                        || refused.load(Ordering::SeqCst) == 0
                    {
                        assert!(Instant::now() < deadline, "the first four never met");
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
                // Counted out before the slot is given back.
                holding.fetch_sub(1, Ordering::SeqCst);
                if t % 2 == 0 {
                    assert!(permit.release().await.unwrap());
                } else {
                    drop(permit); // released in the background
                }
                done += 1;
            }
            denied
        }));
    }
    let mut denied = 0;
    for task in tasks {
        denied += task.await.unwrap();
    }
    let most = most.load(Ordering::SeqCst);
    assert!(most as u64 <= limit, "{most} held at once, limit {limit}");
    assert_eq!(most as u64, limit, "the first four are held at once");
    assert!(denied > 0, "16 tasks on 4 slots must have waited");
    let acquired: u64 = instances
        .iter()
        .map(|s| s.metrics().snapshot().permits_acquired)
        .sum();
    assert_eq!(acquired, 80);
    // Every slot is back (the background releases included).
    let check = semaphore(&server).await;
    support::eventually(60, "all permits released", || {
        server.info("rl", "rl_permits_released") == 80.0
    })
    .await;
    assert_eq!(server.info("rl", "rl_permits_in_use"), 0.0);
    assert!(check
        .acquire("downstream", limit, Duration::from_secs(1))
        .await
        .unwrap()
        .is_ok());
}

/// Polls until a permit of `key` can be had (released in the background), with a generous
/// deadline far below the permits' TTL of an hour.
async fn until_free(semaphore: &Semaphore<ConnectionManager>, key: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !free(semaphore, key).await {
        assert!(Instant::now() < deadline, "not released");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn dropping_the_guard_releases_the_slot() {
    let server = Server::start();
    let semaphore = semaphore(&server).await;
    let hour = Duration::from_secs(3600);
    let permit = semaphore.acquire("k", 1, hour).await.unwrap().unwrap();
    assert_eq!((permit.source(), permit.in_use()), (Source::Server, 1));
    let busy = semaphore.acquire("k", 1, hour).await.unwrap().unwrap_err();
    assert_eq!(busy.in_use, 1);
    assert!(busy.retry_after > Duration::from_secs(3000), "{busy:?}");
    drop(permit);
    // Released in the background, not at the end of its TTL.
    until_free(&semaphore, "k").await;

    // Dropped on a thread without a runtime while the runtime it came from still runs:
    // released too, through that runtime.
    let permit = semaphore.acquire("k", 1, hour).await.unwrap().unwrap();
    std::thread::spawn(move || drop(permit)).join().unwrap();
    until_free(&semaphore, "k").await;
    assert!(semaphore.metrics().snapshot().permits_released >= 4);
}

/// A holder in its own runtime (a process of its own) that dies holding a permit: `leak`
/// forgets the guard, else the guard outlives the runtime and is dropped without one.
fn holder_dies_holding(url: String, key: &'static str, ttl: Duration, leak: bool) {
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let permit = runtime.block_on(async {
            let client = rl_client::redis::Client::open(url).unwrap();
            let config = LimiterConfig {
                timeout: Duration::from_secs(10),
                ..LimiterConfig::default()
            };
            let semaphore = Semaphore::from_client(client, config).unwrap();
            let permit = semaphore.acquire(key, 1, ttl).await.unwrap().unwrap();
            assert_eq!(permit.source(), Source::Server);
            permit
        });
        if leak {
            std::mem::forget(permit);
            drop(runtime); // the process ends: no release, no renewal
        } else {
            drop(runtime);
            drop(permit); // no runtime: must not panic, and cannot release
        }
    })
    .join()
    .expect("the holder panicked");
}

#[tokio::test]
async fn a_killed_holder_frees_its_slot_after_the_ttl() {
    let server = Server::start();
    let semaphore = semaphore(&server).await;
    let ttl = Duration::from_secs(2);
    for (key, leak) in [("leaked", true), ("dropped", false)] {
        // Before the holder asks: its permit expires at least `ttl` after this.
        let born = Instant::now();
        holder_dies_holding(server.url(), key, ttl, leak);
        // Free at a moment known to be before `born + ttl`: released early. (On a machine
        // too slow to look within the TTL there is nothing to see here.)
        loop {
            let got = free(&semaphore, key).await;
            let seen_by = born.elapsed();
            assert!(!got || seen_by >= ttl, "{key}: free {seen_by:?} after");
            if got {
                break;
            }
            assert!(seen_by < ttl * 30, "{key}: never expired");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewal_keeps_a_long_call_past_its_ttl() {
    let server = Server::start();
    let holder = semaphore(&server).await;
    let other = semaphore(&server).await;
    // Renewed every 1 s: a renewal late by up to a second on a loaded machine is in time.
    let ttl = Duration::from_secs(2);
    let permit = holder.acquire("long", 1, ttl).await.unwrap().unwrap();
    // Three TTLs long: without renewal the slot would free after the first.
    let started = Instant::now();
    while started.elapsed() < ttl * 3 {
        assert!(
            !free(&other, "long").await,
            "lost at {:?}",
            started.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!permit.is_lost());
    // Held past three TTLs: renewed at least twice.
    assert!(holder.metrics().snapshot().permits_renewed >= 2);
    assert!(permit.release().await.unwrap(), "still held when released");
    assert!(free(&other, "long").await);
    // Renewal stopped with the guard: nothing renews a released permit.
    let renewed = holder.metrics().snapshot().permits_renewed;
    tokio::time::sleep(ttl).await;
    assert_eq!(holder.metrics().snapshot().permits_renewed, renewed);
}

#[tokio::test]
async fn permits_fall_back_by_policy_while_redis_is_down() {
    let mut server = Server::stopped();
    let config = |policy| LimiterConfig {
        policy,
        probe_interval: Duration::from_millis(100),
        instances: 2,
        ..Default::default()
    };
    let ttl = Duration::from_secs(3600);
    // Half of 4 slots locally (2 instances).
    let allow = Semaphore::from_client(server.client(), config(FailurePolicy::Allow)).unwrap();
    let a = allow.acquire("k", 4, ttl).await.unwrap().unwrap();
    let b = allow.acquire("k", 4, ttl).await.unwrap().unwrap();
    assert_eq!((a.source(), b.in_use()), (Source::Fallback, 2));
    let busy = allow.acquire("k", 4, ttl).await.unwrap().unwrap_err();
    assert_eq!((busy.source, busy.in_use), (Source::Fallback, 2));
    drop(a);
    let c = allow.acquire("k", 4, ttl).await.unwrap().unwrap();
    assert!(c.release().await.unwrap());

    let deny = Semaphore::from_client(server.client(), config(FailurePolicy::Deny)).unwrap();
    let busy = deny.acquire("k", 4, ttl).await.unwrap().unwrap_err();
    assert_eq!(busy.source, Source::Fallback);

    // Redis comes up: permits come from it again.
    server.resume();
    let started = Instant::now();
    loop {
        if let Ok(p) = deny.acquire("k", 4, ttl).await.unwrap() {
            assert_eq!(p.source(), Source::Server);
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "never recovered"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(b);
}

/// Rule 1 for permits: an `RL.ACQUIRE` whose caller gave up (its timeout, a dropped
/// future) still lands on the server; a permit it brings must be released, not left to
/// hold a slot nobody has until its TTL. Before the fix the call ran in the caller's future:
/// the limit-1 key stayed busy for the whole 60 s TTL after a timed-out acquire.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_acquired_after_its_caller_gave_up_is_released() {
    let server = Server::start();
    let config = LimiterConfig {
        timeout: TIMEOUT,
        probe_interval: Duration::from_millis(100),
        policy: FailurePolicy::Deny,
        instances: 1,
        ..Default::default()
    };
    // Late replies arrive (the default response timeout would cut them after 2 s).
    let semaphore = Semaphore::new(server.patient_lazy(), config).unwrap();
    let ttl = Duration::from_secs(60);
    // Connect first.
    let p = semaphore.acquire("p", 1, ttl).await.unwrap().unwrap();
    p.release().await.unwrap();
    let sleeper = server.debug_sleep(4.0);
    // A caller that times out (the limiter's timeout: Deny answers busy)...
    let busy = semaphore.acquire("p", 1, ttl).await.unwrap();
    assert!(busy.is_err());
    // ...and one whose future is dropped.
    let dropped = tokio::time::timeout(
        Duration::from_millis(10),
        semaphore.acquire_from_server("q", 1, ttl),
    )
    .await;
    assert!(dropped.is_err());
    assert!(
        !sleeper.is_finished(),
        "answered by Redis, not by the timeout"
    );
    sleeper.join().unwrap();
    // The calls landed after the sleep: their permits go back, the slots are free again.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
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

/// protocol/client-cases/permit.json through the Semaphore: every acquire finds Redis
/// away (a server not started: refused), the failure policy decides; a release drops the
/// oldest permit of its key held.
#[tokio::test]
async fn golden_permit_cases_through_the_semaphore() {
    use serde_json::Value as J;
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../protocol/client-cases/permit.json"
    );
    let cases: J = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let server = Server::stopped();
    for case in cases["cases"].as_array().unwrap() {
        let about = case["about"].as_str().unwrap();
        let policy = match case["policy"].as_str().unwrap() {
            "allow" => FailurePolicy::Allow,
            "last_known" => FailurePolicy::LastKnown,
            _ => FailurePolicy::Deny,
        };
        let config = LimiterConfig {
            policy,
            instances: case["instances"].as_u64().unwrap() as u32,
            deny_retry_after: Duration::from_secs(1),
            ..Default::default()
        };
        let semaphore = Semaphore::from_client(server.client(), config).unwrap();
        let mut held = Vec::new();
        for step in case["steps"].as_array().unwrap() {
            if let Some(key) = step["release"].as_str() {
                let i = held.iter().position(|(k, _)| k == key).unwrap();
                drop(held.remove(i));
                continue;
            }
            let key = step["acquire"].as_str().unwrap();
            let limit = step["limit"].as_u64().unwrap();
            let got = semaphore
                .acquire(key, limit, Duration::from_secs(60))
                .await
                .unwrap();
            let want = &step["want"];
            let in_use = want["in_use"].as_u64().unwrap();
            match got {
                Ok(permit) => {
                    assert!(want["granted"].as_bool().unwrap(), "{about}: {step}");
                    assert_eq!(permit.source(), Source::Fallback, "{about}");
                    assert_eq!(permit.in_use(), in_use, "{about}: {step}");
                    held.push((key.to_owned(), permit));
                }
                Err(busy) => {
                    assert!(!want["granted"].as_bool().unwrap(), "{about}: {step}");
                    assert_eq!(busy.source, Source::Fallback, "{about}");
                    assert_eq!(busy.in_use, in_use, "{about}: {step}");
                    let retry = want["retry_after_ms"].as_u64().unwrap();
                    assert_eq!(busy.retry_after, Duration::from_millis(retry), "{about}");
                }
            }
        }
    }
}
