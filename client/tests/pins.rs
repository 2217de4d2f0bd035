//! Pins (`RL.PIN`, `RL.UNPIN`, `RL.PINNED`) through the client against a real server: the
//! limiter sets and reads them, its decisions say when one decided, and a prefetching
//! limiter obeys one at its next lease call and never returns an exempt lease.

mod support;

use std::time::Duration;

use rl_client::{
    Error, FailurePolicy, Limit, Limiter, LimiterConfig, PinKind, PinSpec, PrefetchLimiter, Source,
};
use support::{eventually, Server, PATIENT};

fn patient() -> LimiterConfig {
    LimiterConfig {
        timeout: PATIENT,
        ..LimiterConfig::default()
    }
}

/// So slow that nothing refills during a test: every level is exact.
fn frozen(cap: f64) -> Limit {
    Limit::new(0.001, cap).unwrap()
}

/// How many times the server ran `command` (as the server names it, `RL.RETURN`), from `INFO
/// commandstats`.
fn calls(server: &Server, command: &str) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut server.conn())
        .unwrap();
    let prefix = format!("cmdstat_{command}:calls=");
    info.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map_or(0, |rest| rest.split(',').next().unwrap().parse().unwrap())
}

#[tokio::test]
async fn a_rate_pin_decides_whatever_limit_the_limiter_sends() {
    let server = Server::start();
    let limiter = Limiter::new(server.manager().await, frozen(5.0), patient()).unwrap();
    assert_eq!(limiter.pinned("acme").await.unwrap(), None);

    limiter
        .pin("acme", PinSpec::Rate(frozen(2.0)), None)
        .await
        .unwrap();
    let info = limiter.pinned("acme").await.unwrap().unwrap();
    assert_eq!(info.kind, PinKind::Rate);
    assert_eq!(info.limit, Some(frozen(2.0)));
    assert_eq!(info.left, None, "no end without a duration");

    for _ in 0..2 {
        let d = limiter.take("acme", 1).await.unwrap();
        assert!(d.allowed, "{d:?}");
        assert_eq!((d.source, d.pinned), (Source::Server, Some(PinKind::Rate)));
    }
    // The limiter's own limit would grant 3 more; the pin's cap of 2 is spent.
    let d = limiter.take("acme", 1).await.unwrap();
    assert!(!d.allowed, "{d:?}");
    assert_eq!(d.pinned, Some(PinKind::Rate));

    // An unpinned key answers as before.
    let other = limiter.take("other", 1).await.unwrap();
    assert_eq!((other.allowed, other.pinned), (true, None));

    assert!(limiter.unpin("acme").await.unwrap());
    assert!(
        !limiter.unpin("acme").await.unwrap(),
        "nothing left to unpin"
    );
    assert_eq!(limiter.pinned("acme").await.unwrap(), None);
    // The empty bucket carried over into the limiter's limit: still nothing to take.
    let d = limiter.take("acme", 1).await.unwrap();
    assert_eq!((d.allowed, d.pinned), (false, None), "{d:?}");
}

#[tokio::test]
async fn a_block_pin_denies_for_its_time_left_or_a_minute() {
    let server = Server::start();
    let limiter = Limiter::new(server.manager().await, frozen(5.0), patient()).unwrap();

    limiter.pin("abuser", PinSpec::Block, None).await.unwrap();
    let d = limiter.take("abuser", 1).await.unwrap();
    assert!(!d.allowed);
    assert_eq!(d.pinned, Some(PinKind::Block));
    assert_eq!(d.retry_after, Duration::from_secs(60), "{d:?}");
    assert_eq!(
        d.http_headers().last().unwrap(),
        &("Retry-After", "60".into())
    );

    // Pinning again replaces the pin and its end.
    let ten_minutes = Duration::from_secs(600);
    limiter
        .pin("abuser", PinSpec::Block, Some(ten_minutes))
        .await
        .unwrap();
    let info = limiter.pinned("abuser").await.unwrap().unwrap();
    assert_eq!((info.kind, info.limit), (PinKind::Block, None));
    let left = info.left.expect("a pin with an end");
    assert!(left <= ten_minutes && !left.is_zero(), "{left:?}");
    let d = limiter.take("abuser", 1).await.unwrap();
    assert!(!d.allowed);
    assert!(
        d.retry_after <= ten_minutes && d.retry_after > Duration::from_secs(60),
        "the pin's time left: {d:?}"
    );
    // A block holds only the pin on a key that held nothing: no tokens were touched.
    assert_eq!(server.tokens("abuser"), None);
}

#[tokio::test]
async fn an_exempt_pin_grants_without_debiting() {
    let server = Server::start();
    let limiter = Limiter::new(server.manager().await, frozen(5.0), patient()).unwrap();
    assert!(limiter.take("vip", 3).await.unwrap().allowed);

    limiter.pin("vip", PinSpec::Exempt, None).await.unwrap();
    for _ in 0..20 {
        let d = limiter.take("vip", 5).await.unwrap();
        assert!(d.allowed, "{d:?}");
        assert_eq!(d.pinned, Some(PinKind::Exempt));
    }
    assert!(limiter.unpin("vip").await.unwrap());
    // The 2 tokens left before the pin are still there: nothing was debited under it.
    let t = server.tokens("vip").unwrap();
    assert!((t - 2.0).abs() < 0.01, "server holds {t}");
    assert!(limiter.take("vip", 2).await.unwrap().allowed);
    assert!(!limiter.take("vip", 1).await.unwrap().allowed);
}

#[tokio::test]
async fn bad_pins_are_errors() {
    let server = Server::start();
    let limiter = Limiter::new(server.manager().await, frozen(5.0), patient()).unwrap();
    let zero = limiter.pin("k", PinSpec::Block, Some(Duration::ZERO)).await;
    assert!(matches!(zero, Err(Error::Request(_))), "{zero:?}");
    // A share key is pinned as any (RL.SHARE's reply then names the pin).
    let _: redis::Value = redis::cmd("RL.SHARE")
        .arg(&["shares", "10", "10", "h", "5", "1000"])
        .query(&mut server.conn())
        .unwrap();
    limiter.pin("shares", PinSpec::Exempt, None).await.unwrap();
    let info = limiter.pinned("shares").await.unwrap().unwrap();
    assert_eq!(info.kind, PinKind::Exempt);
    let reply: Vec<redis::Value> = redis::cmd("RL.SHARE")
        .arg(&["shares", "10", "10", "h", "5", "1000"])
        .query(&mut server.conn())
        .unwrap();
    assert_eq!(reply[5], redis::Value::BulkString(b"exempt".to_vec()));
    let _: () = redis::cmd("SET")
        .arg("plain")
        .arg("x")
        .query(&mut server.conn())
        .unwrap();
    assert!(matches!(
        limiter.pinned("plain").await,
        Err(Error::Server(_))
    ));
}

/// A prefetching limiter spends the batch it holds, and obeys a pin from its next lease
/// call on (at most a batch, or a lease's TTL, after the pin is set).
#[tokio::test]
async fn a_prefetching_limiter_obeys_a_pin_at_its_next_lease() {
    let server = Server::start();
    let config = support::prefetch_config(FailurePolicy::Deny, 1);
    let config = rl_client::PrefetchConfig {
        limiter: LimiterConfig {
            timeout: PATIENT,
            ..config.limiter
        },
        ..config
    };
    let limiter =
        PrefetchLimiter::new(server.manager().await, "api", frozen(100.0), config).unwrap();
    let admin = Limiter::new(server.manager().await, frozen(100.0), patient()).unwrap();
    assert!(limiter.take(1).await.unwrap().allowed);
    admin.pin("api", PinSpec::Block, None).await.unwrap();
    // The 19 held are spent locally...
    for _ in 0..19 {
        let d = limiter.take(1).await.unwrap();
        assert_eq!((d.allowed, d.source), (true, Source::Lease), "{d:?}");
    }
    // ...then the next lease is denied, for the minute a pin without an end answers (less
    // the time since the lease call, as the limiter counts it down locally).
    let d = limiter.take(1).await.unwrap();
    assert!(!d.allowed, "{d:?}");
    let minute = Duration::from_secs(60);
    assert!(
        d.retry_after <= minute && d.retry_after > minute / 2,
        "{d:?}"
    );
    assert_eq!(calls(&server, "RL.LEASE"), 2);
    limiter.close().await.unwrap();
}

/// Leases granted under an `EXEMPT` pin have id 0: the client spends them and never
/// settles or returns them (neither `RETURN` inside `RL.LEASE` nor `RL.RETURN`).
#[tokio::test]
async fn an_exempt_lease_is_never_returned() {
    let server = Server::start();
    let config = support::prefetch_config(FailurePolicy::Deny, 1);
    let config = rl_client::PrefetchConfig {
        limiter: LimiterConfig {
            timeout: PATIENT,
            ..config.limiter
        },
        ..config
    };
    let admin = Limiter::new(server.manager().await, frozen(100.0), patient()).unwrap();
    admin.pin("free", PinSpec::Exempt, None).await.unwrap();
    let limiter =
        PrefetchLimiter::new(server.manager().await, "free", frozen(100.0), config).unwrap();
    // Three batches of 20: the second and third lease calls would settle the one before.
    for _ in 0..50 {
        assert!(limiter.take(1).await.unwrap().allowed);
    }
    assert_eq!(limiter.held(), 10);
    let credited = limiter.close().await.unwrap();
    assert_eq!(credited, 0);
    let m = limiter.metrics().snapshot();
    assert_eq!((m.leases, m.returns, m.tokens_returned), (3, 0, 0), "{m:?}");
    assert_eq!(calls(&server, "RL.RETURN"), 0);
    assert_eq!(calls(&server, "RL.LEASE"), 3);
    // Nothing was debited: the key holds only the pin.
    assert_eq!(server.tokens("free"), None);
}

/// An exempt grant nobody waited for (its caller timed out) debited nothing: it is not
/// refunded (a refund landing after the pin ended would credit tokens never taken).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exempt_grant_nobody_waited_for_is_not_refunded() {
    let server = Server::start();
    let config = LimiterConfig {
        timeout: Duration::from_secs(1),
        probe_interval: Duration::from_millis(100),
        policy: FailurePolicy::Deny,
        instances: 1,
        ..LimiterConfig::default()
    };
    let limiter = Limiter::new(server.patient_lazy(), frozen(5.0), config).unwrap();
    limiter.pin("vip", PinSpec::Exempt, None).await.unwrap();
    let before = limiter.metrics().snapshot().redis_calls;
    let sleeper = server.debug_sleep(4.0);
    let d = limiter.take("vip", 1).await.unwrap();
    assert_eq!((d.allowed, d.source), (false, Source::Fallback), "{d:?}");
    assert!(!sleeper.is_finished(), "answered by the timeout");
    sleeper.join().unwrap();
    // The late reply lands (a refund would be sent right then, on the same connection, so
    // before the take below).
    eventually(20, "the late reply", || {
        limiter.metrics().snapshot().redis_calls > before
    })
    .await;
    let after = limiter.take("vip", 1).await.unwrap();
    assert_eq!(after.pinned, Some(PinKind::Exempt));
    assert_eq!(calls(&server, "RL.REFUND"), 0);
    assert_eq!(calls(&server, "RL.TAKE"), 2);
    let m = limiter.metrics().snapshot();
    assert_eq!((m.refunds, m.takes_lost), (0, 0), "{m:?}");
}
