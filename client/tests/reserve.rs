//! `Limiter::reserve` and `refund` against a real server: reservations sleep their wait,
//! queue fairly, never let uses exceed the bucket, and are denied without sleeping when
//! the wait is too long; refunds credit tokens back; the failure policy reserves locally.

mod support;

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use rl_client::{FailurePolicy, Limit, Limiter, LimiterConfig, Source};
use support::Server;

fn frozen() -> Limit {
    Limit::new(0.001, 5.0).unwrap()
}

/// 100 tokens that do not refill within a test.
fn frozen_100() -> Limit {
    Limit::new(0.001, 100.0).unwrap()
}

/// Far above any call's time on a loaded machine: every decision here is the server's.
fn patient() -> LimiterConfig {
    LimiterConfig {
        timeout: Duration::from_secs(10),
        ..LimiterConfig::default()
    }
}

/// A limiter of `rate`/s, bursts of `cap`, over `server`.
async fn limiter_of(
    server: &Server,
    rate: f64,
    cap: f64,
) -> Limiter<redis::aio::ConnectionManager> {
    let limit = Limit::new(rate, cap).unwrap();
    Limiter::new(server.manager().await, limit, patient()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reservations_sleep_and_queue_within_the_bucket() {
    let server = Server::start();
    let (rate, cap) = (20.0, 5.0);
    let limiter = limiter_of(&server, rate, cap).await;
    let uses = Arc::new(Mutex::new(Vec::new()));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for t in 0..8 {
        let limiter = limiter.clone();
        let uses = Arc::clone(&uses);
        tasks.push(tokio::spawn(async move {
            let mut waits = Vec::new();
            for _ in 0..4 {
                let r = limiter
                    .reserve("queue", 1, Duration::from_secs(5))
                    .await
                    .unwrap();
                assert!(r.allowed(), "task {t}: {r:?}");
                assert_eq!(r.decision.source, Source::Server);
                // Used now: after the wait reserve slept.
                uses.lock().unwrap().push(Instant::now());
                waits.push(r.wait);
            }
            waits
        }));
    }
    let mut waits = Vec::new();
    for task in tasks {
        waits.extend(task.await.unwrap());
    }
    let mut uses = uses.lock().unwrap().clone();
    uses.sort();
    assert_eq!(uses.len(), 32);
    // 5 at once, then one every 50 ms: the last of 32 at least 1.35 s in (later on a
    // slow machine, never sooner).
    let took = uses.last().unwrap().duration_since(start);
    assert!(
        took >= Duration::from_millis(1300),
        "did not wait: {took:?}"
    );
    // In every window of uses, no more than the bucket allows (+1 for rounding).
    for i in 0..uses.len() {
        for j in i..uses.len() {
            let t = uses[j].duration_since(uses[i]).as_secs_f64();
            let used = (j - i + 1) as f64;
            assert!(
                used <= cap + rate * t + 1.0,
                "{used} uses in {t:.3} s (bound {:.1})",
                cap + rate * t + 1.0
            );
        }
    }
    let m = limiter.metrics().snapshot();
    assert_eq!((m.granted, m.denied, m.fallback_decisions), (32, 0, 0));
    let slept: Duration = waits.iter().sum();
    assert_eq!(m.reserve_wait_us, slept.as_micros() as u64);
}

#[tokio::test]
async fn too_long_a_wait_is_denied_without_sleeping() {
    let server = Server::start();
    // A token every 10 s, bursts of 2: the waits below are seconds, whatever time the
    // calls themselves take.
    let limiter = limiter_of(&server, 0.1, 2.0).await;
    let r = limiter.reserve("k", 2, Duration::ZERO).await.unwrap();
    assert!(r.allowed() && r.wait.is_zero(), "{r:?}");

    let r = limiter
        .reserve("k", 1, Duration::from_millis(500))
        .await
        .unwrap();
    assert!(!r.allowed(), "{r:?}");
    assert_eq!(
        limiter.metrics().snapshot().reserve_wait_us,
        0,
        "a denial sleeps"
    );
    assert!(r.wait > Duration::from_secs(5), "the wait needed: {r:?}");
    assert_eq!(r.decision.retry_after, r.wait);

    // Granted within a long enough max_wait: the token the bucket will have next.
    let first = limiter
        .reserve_nowait("k", 1, Duration::from_secs(60))
        .await
        .unwrap();
    assert!(
        first.allowed() && first.wait > Duration::from_secs(5),
        "{first:?}"
    );
    assert!(first.decision.remaining < 0.0, "in debt: {first:?}");
    // The next one queues behind it.
    let second = limiter
        .reserve_nowait("k", 1, Duration::from_secs(60))
        .await
        .unwrap();
    assert!(second.allowed() && second.wait > first.wait, "{second:?}");
    // A take waits behind the queue too.
    let d = limiter.take("k", 1).await.unwrap();
    assert!(
        !d.allowed && d.retry_after > Duration::from_secs(15),
        "{d:?}"
    );
    // Impossible requests are errors, not calls.
    assert!(limiter.reserve("k", 3, Duration::ZERO).await.is_err());
    assert!(limiter
        .reserve("k", 1, Duration::from_secs(86_401))
        .await
        .is_err());

    // `reserve` sleeps the wait it was given (a token every 100 ms, bursts of 1).
    let paced = limiter_of(&server, 10.0, 1.0).await;
    assert!(paced
        .reserve("s", 1, Duration::ZERO)
        .await
        .unwrap()
        .allowed());
    let asked = Instant::now();
    let r = paced.reserve("s", 1, Duration::from_secs(5)).await.unwrap();
    assert!(r.allowed(), "{r:?}");
    assert!(asked.elapsed() >= r.wait, "reserve sleeps the wait");
    let slept = paced.metrics().snapshot().reserve_wait_us;
    assert_eq!(slept, r.wait.as_micros() as u64);
}

#[tokio::test]
async fn refunds_credit_tokens_back() {
    let server = Server::start();
    let limiter = Limiter::new(server.manager().await, frozen(), patient()).unwrap();
    assert!(limiter.take("k", 5).await.unwrap().allowed);
    assert!(!limiter.take("k", 1).await.unwrap().allowed);
    let credited = limiter.refund("k", 2).await.unwrap();
    assert!((credited - 2.0).abs() < 1e-6, "{credited}");
    assert!(limiter.take("k", 2).await.unwrap().allowed);
    assert!(!limiter.take("k", 1).await.unwrap().allowed);
    // Never above the cap: 10 asked, 5 missing.
    let credited = limiter.refund("k", 10).await.unwrap();
    assert!((credited - 5.0).abs() < 0.01, "{credited}");
    assert_eq!(limiter.refund("k", 1).await.unwrap(), 0.0, "full already");
    assert_eq!(limiter.refund("absent", 1).await.unwrap(), 0.0);
    assert!(limiter.refund("k", 0).await.is_err());

    // A bucket in debt takes nothing back: its coming tokens are promised to the callers
    // waiting, so the next reservation still queues behind them.
    // A token every 10 s: the waits are seconds, whatever time the calls take.
    let slow = limiter_of(&server, 0.1, 1.0).await;
    let max = Duration::from_secs(60);
    assert!(slow
        .reserve_nowait("q", 1, max)
        .await
        .unwrap()
        .wait
        .is_zero());
    let second = slow.reserve_nowait("q", 1, max).await.unwrap();
    assert!(second.wait > Duration::from_secs(5), "{second:?}");
    // The second caller gave up: its refund credits nothing, the next one waits longer.
    assert_eq!(slow.refund("q", 1).await.unwrap(), 0.0);
    let third = slow.reserve_nowait("q", 1, max).await.unwrap();
    assert!(third.wait > second.wait, "{third:?} vs {second:?}");
    let m = slow.metrics().snapshot();
    assert_eq!(m.tokens_refunded, 0);
}

/// A `reserve` dropped while it sleeps until its turn sends its tokens back (`RL.REFUND`),
/// but the bucket is in debt until that turn and takes nothing back: the reservation counts
/// in `takes_lost`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reservation_dropped_while_it_sleeps_is_lost_to_the_debt() {
    let server = Server::start();
    // A token every 10 s: the second reservation sleeps for seconds.
    let slow = limiter_of(&server, 0.1, 1.0).await;
    let max = Duration::from_secs(60);
    assert!(slow.reserve("q", 1, max).await.unwrap().wait.is_zero());
    let sleeping = tokio::spawn({
        let slow = slow.clone();
        async move { slow.reserve("q", 1, max).await }
    });
    support::eventually(20, "the reservation's debt", || {
        server.tokens("q").is_some_and(|t| t < -0.5)
    })
    .await;
    sleeping.abort();
    assert!(sleeping.await.unwrap_err().is_cancelled());
    support::eventually(20, "the refused refund", || {
        slow.metrics().snapshot().takes_lost == 1
    })
    .await;
    let m = slow.metrics().snapshot();
    assert_eq!((m.refunds, m.tokens_refunded, m.reserve_wait_us), (0, 0, 0));
}

#[tokio::test]
async fn reserve_falls_back_by_policy_while_redis_is_down() {
    // No server on the port: a lazily connected limiter decides locally.
    let server = Server::stopped();
    let config = |policy| LimiterConfig {
        policy,
        probe_interval: Duration::from_secs(3600),
        instances: 1,
        ..Default::default()
    };
    // A token every 10 s, bursts of 2: the local waits are seconds.
    let limit = Limit::new(0.1, 2.0).unwrap();
    let allow = Limiter::from_client(server.client(), limit, config(FailurePolicy::Allow)).unwrap();
    let max = Duration::from_secs(60);
    for _ in 0..2 {
        let r = allow.reserve_nowait("k", 1, max).await.unwrap();
        assert_eq!((r.allowed(), r.decision.source), (true, Source::Fallback));
        assert!(r.wait.is_zero(), "{r:?}");
    }
    let r = allow.reserve_nowait("k", 1, max).await.unwrap();
    assert!(r.allowed() && r.wait > Duration::from_secs(5), "{r:?}");
    assert!(r.decision.remaining < 0.0, "in debt locally: {r:?}");
    let r = allow.reserve("k", 1, Duration::from_secs(1)).await.unwrap();
    assert!(!r.allowed() && r.wait > Duration::from_secs(5), "{r:?}");

    // A local reservation dropped while it sleeps sends nothing to Redis (Redis never
    // debited it): no refund, nothing counted lost.
    let before = allow.metrics().snapshot();
    let sleeping = tokio::spawn({
        let allow = allow.clone();
        async move { allow.reserve("k", 1, max).await }
    });
    support::eventually(20, "the local reservation", || {
        allow.metrics().snapshot().calls == before.calls + 1
    })
    .await;
    sleeping.abort();
    assert!(sleeping.await.unwrap_err().is_cancelled());
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let m = allow.metrics().snapshot();
        assert_eq!(
            (m.redis_calls, m.takes_lost),
            (before.redis_calls, 0),
            "{m:?}"
        );
    }

    // The local wait is slept too (a token every 100 ms, bursts of 1).
    let paced = Limit::new(10.0, 1.0).unwrap();
    let allow = Limiter::from_client(server.client(), paced, config(FailurePolicy::Allow)).unwrap();
    assert!(allow.reserve("p", 1, max).await.unwrap().allowed());
    let asked = Instant::now();
    let r = allow.reserve("p", 1, max).await.unwrap();
    assert_eq!((r.allowed(), r.decision.source), (true, Source::Fallback));
    assert!(asked.elapsed() >= r.wait, "the local wait is slept too");
    let slept = allow.metrics().snapshot().reserve_wait_us;
    assert_eq!(slept, r.wait.as_micros() as u64);

    let deny = Limiter::from_client(server.client(), limit, config(FailurePolicy::Deny)).unwrap();
    let r = deny.reserve("k", 1, max).await.unwrap();
    assert_eq!((r.allowed(), r.decision.source), (false, Source::Fallback));
    assert!(deny.refund("k", 1).await.unwrap_err().is_unavailable());
}

/// Polls `f` once with a waker that raises `woken` (nobody else polls it).
fn poll_flagged<F: Future + Unpin>(f: &mut F, woken: &Arc<Flag>) -> Poll<F::Output> {
    woken.0.store(false, Ordering::SeqCst);
    let waker = Waker::from(Arc::clone(woken));
    Pin::new(f).poll(&mut Context::from_waker(&waker))
}

#[derive(Default)]
struct Flag(AtomicBool);

impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// Waits until `f` was woken (something it waits for happened), without polling it.
async fn until_woken(woken: &Flag, what: &str) {
    support::eventually(20, what, || woken.0.load(Ordering::SeqCst)).await;
}

/// A reservation whose reply has landed but whose caller drops it before polling it again
/// (the instant between the two): the grant is refunded, the bucket is whole again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reservation_dropped_as_its_reply_lands_is_refunded() {
    let server = Server::start();
    let limiter = Limiter::new(server.manager().await, frozen_100(), patient()).unwrap();
    assert!(limiter.take("warm", 1).await.unwrap().allowed);
    let woken = Arc::new(Flag::default());
    for call in 0..2 {
        let mut f: Pin<Box<dyn Future<Output = _> + Send>> = if call == 0 {
            Box::pin(limiter.reserve_nowait("k", 30, Duration::from_secs(1)))
        } else {
            Box::pin(limiter.reserve("k", 30, Duration::from_secs(1)))
        };
        // Sent while Redis sleeps: no reply can come before the caller polls again.
        let sleeper = server.debug_sleep(1.0);
        assert!(poll_flagged(&mut f, &woken).is_pending());
        sleeper.join().unwrap();
        until_woken(&woken, "the reply").await;
        drop(f);
        // The bucket refilled a hair meanwhile: the refund credits what it lacks (a full
        // bucket is deleted).
        support::eventually(20, "the refund", || {
            limiter.metrics().snapshot().refunds == call + 1
        })
        .await;
        assert!(server.tokens("k").is_none(), "full again");
    }
    let m = limiter.metrics().snapshot();
    assert_eq!(
        (m.calls, m.cancelled, m.refunds, m.takes_lost),
        (1, 2, 2, 0)
    );
}

/// A `reserve` whose sleep has ended but whose caller drops it before polling it again
/// never handed its tokens over: they are refunded (the bucket has paid its debt by then,
/// so it takes them), once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reservation_dropped_as_its_sleep_ends_is_refunded_once() {
    let server = Server::start();
    // 2 tokens a second, bursts of 1000: a reservation of 10 past an empty bucket waits
    // seconds; the refund after it is credited whole unless the drop comes minutes late.
    let paced = limiter_of(&server, 2.0, 1000.0).await;
    assert!(paced.take("k", 1000).await.unwrap().allowed);
    let woken = Arc::new(Flag::default());
    let mut f = Box::pin(paced.reserve("k", 10, Duration::from_secs(60)));
    // Sent while Redis sleeps: the reply comes after this poll, the sleep after the next.
    let sleeper = server.debug_sleep(1.0);
    assert!(poll_flagged(&mut f, &woken).is_pending());
    sleeper.join().unwrap();
    until_woken(&woken, "the reply").await;
    assert!(poll_flagged(&mut f, &woken).is_pending(), "sleeps its wait");
    until_woken(&woken, "the end of the sleep").await;
    drop(f);
    support::eventually(20, "the refund", || paced.metrics().snapshot().refunds == 1).await;
    let m = paced.metrics().snapshot();
    assert_eq!(
        (m.tokens_refunded, m.takes_lost, m.reserve_wait_us),
        (10, 0, 0)
    );
    assert_eq!((m.calls, m.granted, m.cancelled), (2, 2, 0));
}

/// 200 reservations at once on one key, each given up at a random instant (its caller's
/// timeout of 0-3 ms, or none): whatever instant each was dropped at, the bucket on the
/// server ends holding exactly the tokens of the reservations kept (the refill over the
/// test is negligible), nothing lost, nothing minted, and the counters add up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reservations_cancelled_at_random_leave_the_bucket_with_exactly_what_was_kept() {
    let server = Server::start();
    let cap = 300.0;
    let limit = Limit::new(0.001, cap).unwrap();
    let limiter = Limiter::new(server.manager().await, limit, patient()).unwrap();
    assert!(limiter.take("warm", 1).await.unwrap().allowed);
    let mut next = random_below(0x9e37_79b9_7f4a_7c15);
    let tasks: Vec<_> = (0..200)
        .map(|_| {
            let limiter = limiter.clone();
            let n = 1 + next(5);
            let sleeps = next(2) == 0;
            let patience = next(4000);
            tokio::spawn(async move {
                let reserve = async {
                    let r = if sleeps {
                        limiter.reserve("k", n, Duration::ZERO).await
                    } else {
                        limiter.reserve_nowait("k", n, Duration::ZERO).await
                    };
                    r.unwrap()
                };
                if patience >= 3000 {
                    return Some(reserve.await);
                }
                tokio::time::timeout(Duration::from_micros(patience), reserve)
                    .await
                    .ok()
            })
        })
        .collect();
    let (mut kept, mut answered) = (0, 0);
    for task in tasks {
        if let Some(r) = task.await.unwrap() {
            answered += 1;
            kept += r.decision.granted;
        }
    }
    let want = cap - kept as f64;
    support::eventually(30, "the refunds", || {
        server.tokens("k").is_some_and(|t| (t - want).abs() < 0.1)
    })
    .await;
    let m = limiter.metrics().snapshot();
    assert_eq!(m.takes_lost, 0, "{m:?}");
    assert_eq!(m.calls, m.granted + m.denied + m.errors, "{m:?}");
    assert_eq!(
        (m.calls, m.calls + m.cancelled),
        (answered + 1, 201),
        "{m:?}"
    );
    assert_eq!(m.tokens_granted, kept + 1, "{m:?}");
}

/// A seeded xorshift: each call answers a number below its argument (the same sequence on
/// every run).
fn random_below(mut seed: u64) -> impl FnMut(u64) -> u64 {
    move |m| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % m
    }
}

/// A runtime shut down while a `reserve` sleeps (its refund to send on drop), while one is
/// in flight under `DEBUG SLEEP`, and while a timed-out one waits for its late reply, ends
/// without a panic, on either scheduler; the three grants it leaves unrefunded count in
/// `takes_lost`.
#[test]
fn a_runtime_shut_down_with_refunds_pending_does_not_panic() {
    let server = Server::start();
    let max = Duration::from_secs(60);
    for multi in [false, true] {
        let rt = if multi {
            let mut b = tokio::runtime::Builder::new_multi_thread();
            b.worker_threads(2);
            b
        } else {
            tokio::runtime::Builder::new_current_thread()
        }
        .enable_all()
        .build()
        .unwrap();
        let key = format!("q{multi}");
        let (slow, sleeper) = rt.block_on(async {
            // A token every 10 s: the second reservation sleeps for seconds.
            let limit = Limit::new(0.1, 1.0).unwrap();
            let slow = Limiter::new(server.patient_lazy(), limit, patient()).unwrap();
            assert!(slow.reserve(&key, 1, max).await.unwrap().wait.is_zero());
            tokio::spawn({
                let (slow, key) = (slow.clone(), key.clone());
                async move { slow.reserve(&key, 1, max).await }
            });
            support::eventually(20, "the reservation's debt", || {
                server.tokens(&key).is_some_and(|t| t < -0.5)
            })
            .await;
            let sleeper = server.debug_sleep(4.0);
            // Polled here once (sent), then left to a task the shutdown drops.
            let mut in_flight = Box::pin({
                let (slow, key) = (slow.clone(), key.clone());
                async move { slow.reserve_nowait(&key, 1, max).await }
            });
            let woken = Arc::new(Flag::default());
            assert!(poll_flagged(&mut in_flight, &woken).is_pending());
            tokio::spawn(in_flight);
            let late =
                tokio::time::timeout(Duration::from_millis(10), slow.reserve_nowait(&key, 1, max))
                    .await;
            assert!(late.is_err(), "Redis sleeps");
            tokio::task::yield_now().await;
            (slow, sleeper)
        });
        drop(rt);
        // Three grants that may stay debited, none refunded: all counted.
        let m = slow.metrics().snapshot();
        assert!(!sleeper.is_finished(), "shut down while Redis slept");
        assert_eq!((m.takes_lost, m.refunds), (3, 0), "multi {multi}: {m:?}");
        drop(slow);
        sleeper.join().unwrap();
    }
}

/// 200 reservations of one token each on a bucket they overdraw (up to the debt a day's
/// `max_wait` allows), given up at random instants (in flight, as the reply lands, while
/// sleeping until their turn) or kept: every token the bucket lacks is one a caller kept or
/// one counted in `takes_lost` (refused by the debt). Nothing minted, nothing uncounted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reservations_into_debt_cancelled_at_random_are_kept_or_counted_lost() {
    let server = Server::start();
    let cap = 50.0;
    let limit = Limit::new(0.001, cap).unwrap();
    let limiter = Limiter::new(server.manager().await, limit, patient()).unwrap();
    assert!(limiter.take("warm", 1).await.unwrap().allowed);
    let day = Duration::from_secs(86_400);
    let mut next = random_below(0x2545_f491_4f6c_dd1d);
    let tasks: Vec<_> = (0..200)
        .map(|_| {
            let limiter = limiter.clone();
            let sleeps = next(2) == 0;
            let patience = next(4000);
            tokio::spawn(async move {
                let reserve = async {
                    let r = if sleeps {
                        limiter.reserve("k", 1, day).await
                    } else {
                        limiter.reserve_nowait("k", 1, day).await
                    };
                    r.unwrap()
                };
                // A `reserve` past the bucket sleeps for hours: all of those give up.
                if !sleeps && patience >= 3000 {
                    return Some(reserve.await);
                }
                tokio::time::timeout(Duration::from_micros(patience), reserve)
                    .await
                    .ok()
            })
        })
        .collect();
    let mut kept = 0;
    for task in tasks {
        if let Some(r) = task.await.unwrap() {
            kept += r.decision.granted;
        }
    }
    // Every reservation sent has run once this call, sent after them, is answered.
    let level = limiter.peek("k").await.unwrap().unwrap();
    assert!(level < 0.0, "the bucket went into debt: {level}");
    support::eventually(30, "every grant kept, refunded or counted lost", || {
        let lacks = cap - server.tokens("k").unwrap_or(cap);
        let m = limiter.metrics().snapshot();
        (lacks - (kept + m.takes_lost) as f64).abs() < 0.1
    })
    .await;
    let m = limiter.metrics().snapshot();
    assert_eq!(m.calls, m.granted + m.denied + m.errors, "{m:?}");
    assert!(m.takes_lost > 0, "{m:?}");
}
