//! A hostile review of the failure policy in the client core, through this crate's
//! `Limiter` against a real server (`RL_SERVER` selects Redis 7, 8 or Valkey): a hot key
//! among many during an outage, a young meter, flaps between them.

mod support;

use std::time::Duration;

use rl_client::{FailurePolicy, Limit, Limiter, LimiterConfig, Source};
use support::Server;

/// Far above any call's time on a loaded machine (Redis down is a refused connection here,
/// answered at once: no timeout is involved).
const PATIENT: Duration = Duration::from_secs(10);

fn config(policy: FailurePolicy, instances: u32, max_keys: usize) -> LimiterConfig {
    LimiterConfig {
        timeout: PATIENT,
        probe_interval: Duration::from_secs(3600), // one outage: no probe within a test
        policy,
        instances,
        max_keys,
        ..Default::default()
    }
}

/// Tokens that do not refill within a test.
fn frozen(cap: f64) -> Limit {
    Limit::new(0.001, cap).unwrap()
}

async fn allowed<C: rl_client::RedisConnection>(
    limiter: &Limiter<C>,
    key: &str,
    times: usize,
) -> u64 {
    let mut n = 0;
    for _ in 0..times {
        let d = limiter.take(key, 1).await.unwrap();
        assert_eq!(d.source, Source::Fallback, "{key}");
        n += u64::from(d.allowed);
    }
    n
}

/// Clearing a full map of local buckets refilled a hot key's drained one: with `max_keys`
/// 16, the hot key got its 8 again each time 16 keys had come. Fewer than `max_keys / 2`
/// keys between its calls now leave it drained, however many come in all.
#[tokio::test]
async fn a_hot_key_stays_drained_among_many_keys_during_an_outage() {
    for policy in [FailurePolicy::Allow, FailurePolicy::LastKnown] {
        let mut server = Server::start();
        let limiter =
            Limiter::from_client(server.client(), frozen(8.0), config(policy, 1, 16)).unwrap();
        assert_eq!(
            limiter.take("warm", 1).await.unwrap().source,
            Source::Server
        );
        server.stop();
        let mut hot = allowed(&limiter, "hot", 10).await;
        for round in 0..20 {
            for i in 0..6 {
                allowed(&limiter, &format!("cold:{round}:{i}"), 1).await;
            }
            hot += allowed(&limiter, "hot", 10).await;
        }
        assert_eq!(
            hot, 8,
            "{policy:?}: the share once, never refilled by other keys"
        );
    }
}

/// Four quick grants are no measured rate: `LastKnown` read them as 4 tokens over 0.25 s,
/// the whole limit, and spent all 96 tokens Redis reported on one instance of four. They
/// vouch for no more than the configured quarter: 24.
#[tokio::test]
async fn a_young_meter_vouches_for_the_configured_share_only() {
    let mut server = Server::start();
    let config = config(FailurePolicy::LastKnown, 4, 1000);
    let limiter = Limiter::from_client(server.client(), frozen(100.0), config).unwrap();
    for _ in 0..4 {
        let d = limiter.take("k", 1).await.unwrap();
        assert!(d.allowed && d.source == Source::Server);
    }
    server.stop();
    assert_eq!(allowed(&limiter, "k", 200).await, 24);
}
