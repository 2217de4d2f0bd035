//! `Semaphore` and its `Permit` guard against a real server: concurrency capped fleet-wide
//! as the holders see it, release on drop, a killed holder's slot freed after the TTL,
//! renewal keeping a long call's permit, and the failure policy while Redis is away.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rl_client::redis::aio::ConnectionManager;
use rl_client::{FailurePolicy, LimiterConfig, Semaphore, Source};
use support::Server;

async fn semaphore(server: &Server) -> Semaphore<ConnectionManager> {
    Semaphore::new(server.manager().await, LimiterConfig::default()).unwrap()
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
    let mut tasks = Vec::new();
    for t in 0..16 {
        let semaphore = instances[t % 2].clone();
        let (holding, most) = (Arc::clone(&holding), Arc::clone(&most));
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
                        tokio::time::sleep(Duration::from_millis(3)).await;
                        continue;
                    }
                };
                let now = holding.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
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
    assert!(most >= 2, "the tasks never overlapped: {most}");
    assert!(denied > 0, "16 tasks on 4 slots must have waited");
    let acquired: u64 = instances
        .iter()
        .map(|s| s.metrics().snapshot().permits_acquired)
        .sum();
    assert_eq!(acquired, 80);
    // Every slot is back (the background releases included).
    let check = semaphore(&server).await;
    support::eventually(5, "all permits released", || {
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

#[tokio::test]
async fn dropping_the_guard_releases_the_slot() {
    let server = Server::start();
    let semaphore = semaphore(&server).await;
    let permit = semaphore
        .acquire("k", 1, Duration::from_secs(60))
        .await
        .unwrap()
        .unwrap();
    assert_eq!((permit.source(), permit.in_use()), (Source::Server, 1));
    let busy = semaphore
        .acquire("k", 1, Duration::from_secs(60))
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(busy.in_use, 1);
    assert!(busy.retry_after > Duration::from_secs(50), "{busy:?}");
    drop(permit);
    // Released in the background, far sooner than the 60 s TTL.
    let started = Instant::now();
    while !free(&semaphore, "k").await {
        assert!(started.elapsed() < Duration::from_secs(2), "not released");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    // Dropped on a thread without a runtime while the runtime it came from still runs:
    // released too, through that runtime.
    let permit = semaphore
        .acquire("k", 1, Duration::from_secs(60))
        .await
        .unwrap()
        .unwrap();
    std::thread::spawn(move || drop(permit)).join().unwrap();
    let started = Instant::now();
    while !free(&semaphore, "k").await {
        assert!(started.elapsed() < Duration::from_secs(2), "not released");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
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
            let semaphore = Semaphore::from_client(client, LimiterConfig::default()).unwrap();
            semaphore.acquire(key, 1, ttl).await.unwrap().unwrap()
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
    let ttl = Duration::from_millis(600);
    for (key, leak) in [("leaked", true), ("dropped", false)] {
        let died = Instant::now();
        holder_dies_holding(server.url(), key, ttl, leak);
        assert!(!free(&semaphore, key).await, "{key}: released early");
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!free(&semaphore, key).await, "{key}: released early");
        while !free(&semaphore, key).await {
            assert!(died.elapsed() < ttl * 3, "{key}: never expired");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let freed = died.elapsed();
        assert!(freed >= ttl - Duration::from_millis(50), "{key}: {freed:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewal_keeps_a_long_call_past_its_ttl() {
    let server = Server::start();
    let holder = semaphore(&server).await;
    let other = semaphore(&server).await;
    let ttl = Duration::from_millis(300);
    let permit = holder.acquire("long", 1, ttl).await.unwrap().unwrap();
    // Four TTLs long: without renewal the slot would free after the first.
    let started = Instant::now();
    while started.elapsed() < ttl * 4 {
        assert!(
            !free(&other, "long").await,
            "lost at {:?}",
            started.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!permit.is_lost());
    assert!(holder.metrics().snapshot().permits_renewed >= 5);
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
    let ttl = Duration::from_secs(5);
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
            started.elapsed() < Duration::from_secs(10),
            "never recovered"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(b);
}
