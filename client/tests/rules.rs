//! `Rules` on a real server: the shipped seed document (with limits small enough to reach)
//! refuses by the right layer with the right code and debits nothing elsewhere; a stored
//! document is followed, a broken one refused.

mod support;

use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use rl_client::rules::{apply_document, Rules, RulesConfig};
use support::{eventually, Server};

fn seed() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/rules/seed.yaml");
    std::fs::read_to_string(path).unwrap()
}

/// The seed with limits that do not refill within a test.
fn small_seed() -> String {
    seed()
        .replace("\"5000/minute;100/second\"", "\"6/day;5/hour\"")
        .replace("\"5000/minute\"", "\"8/day\"")
        .replace("\"300/minute\"", "\"3/day\"")
        .replace("\"1000/minute\"", "\"4/day\"")
}

fn patient() -> RulesConfig {
    RulesConfig {
        timeout: Duration::from_secs(10),
        fail_open: false,
        ..RulesConfig::default()
    }
}

fn attrs(ip: &str, user: &str, tier: &str, path: &str) -> HashMap<String, String> {
    [("ip", ip), ("user", user), ("tier", tier), ("path", path)]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[tokio::test]
async fn each_seed_layer_refuses_with_its_code() {
    let server = Server::start();
    let rules = Rules::from_text(server.manager().await, &small_seed(), patient()).unwrap();
    let day = |k: &str| server.tokens(&format!("rl:rules:{{{k}}}:86400s"));

    for _ in 0..4 {
        assert!(
            rules
                .check(&attrs("1", "f", "free", "/"))
                .await
                .unwrap()
                .allowed
        );
    }
    let d = rules.check(&attrs("1", "f", "free", "/")).await.unwrap();
    assert_eq!(
        (d.allowed, d.layer.as_deref(), d.code.as_deref()),
        (false, Some("free_user"), Some("user_rate_limit"))
    );
    assert!(d.retry_after > Duration::ZERO && d.limit == 4.0);
    assert_eq!(day("global_ip:ip:1").unwrap().floor(), 4.0);

    for _ in 0..5 {
        assert!(
            rules
                .check(&attrs("2", "p", "premium", "/"))
                .await
                .unwrap()
                .allowed
        );
    }
    let d = rules.check(&attrs("2", "p", "premium", "/")).await.unwrap();
    assert_eq!(d.layer.as_deref(), Some("premium_user"));
    assert_eq!(
        d.key.as_deref(),
        Some("rl:rules:{premium_user:user:p}:3600s")
    );

    for _ in 0..3 {
        assert!(
            rules
                .check(&attrs("3", "q", "premium", "/v1/search/x"))
                .await
                .unwrap()
                .allowed
        );
    }
    let d = rules
        .check(&attrs("3", "q", "premium", "/v1/search/x"))
        .await
        .unwrap();
    assert_eq!(
        (d.layer.as_deref(), d.code.as_deref()),
        (Some("api_search"), Some("search_rate_limit"))
    );
    assert_eq!(day("global_ip:ip:3").unwrap().floor(), 5.0);
    assert!(d.body().contains("\"layer\":\"api_search\""));

    for i in 0..8 {
        assert!(
            rules
                .check(&attrs("4", &format!("u{i}"), "free", "/"))
                .await
                .unwrap()
                .allowed
        );
    }
    let d = rules.check(&attrs("4", "u8", "free", "/")).await.unwrap();
    assert_eq!(
        (d.layer.as_deref(), d.code.as_deref()),
        (Some("global_ip"), Some("ip_rate_limit"))
    );
    assert_eq!(day("free_user:user:u8"), None); // never made
}

#[tokio::test]
async fn follows_the_stored_document_and_refuses_a_broken_one() {
    let server = Server::start();
    let conn = server.manager().await;
    let doc =
        |limit: &str| format!("layers:\n  - {{name: ip, key: 'ip:{{ip}}', limit: '{limit}'}}\n");
    assert!(Rules::from_redis(conn.clone(), "rl:rules", patient())
        .await
        .is_err());
    assert_eq!(
        apply_document(&conn, "rl:rules", &doc("1/day"))
            .await
            .unwrap(),
        1
    );
    let rules = Arc::new(
        Rules::from_redis(conn.clone(), "rl:rules", patient())
            .await
            .unwrap(),
    );
    let _poll = Rules::follow(&rules, Duration::from_millis(20));
    assert_eq!(rules.document().version, Some(1));
    apply_document(&conn, "rl:rules", &doc("3/day"))
        .await
        .unwrap();
    eventually(15, "version 2", || rules.document().version == Some(2)).await;
    assert_eq!(rules.document().layers[0].limit, "3/day");

    let mut c = server.conn();
    let _: () = redis::cmd("HSET")
        .arg("rl:rules")
        .arg("document")
        .arg("layers: [{name: x}]")
        .query(&mut c)
        .unwrap();
    let _: i64 = redis::cmd("HINCRBY")
        .arg("rl:rules")
        .arg("version")
        .arg(1)
        .query(&mut c)
        .unwrap();
    eventually(15, "the broken document refused", || {
        rules.stats.refused_documents.load(Relaxed) == 1
    })
    .await;
    assert_eq!(rules.document().version, Some(2));
    assert!(
        rules
            .check(&attrs("9", "u", "free", "/"))
            .await
            .unwrap()
            .allowed
    );
}

/// Divergence 6 against a server that is not there (refused): failing closed is a denial
/// by the first enforced layer, failing open a grant, both fallback decisions; a cost
/// above a layer's cap is the caller's error before any call.
#[tokio::test]
async fn redis_away_is_the_failure_policys_decision() {
    let server = Server::stopped();
    let conn = || rl_client::LazyConnection::new(server.client());
    let closed = Rules::from_text(conn(), &seed(), patient()).unwrap();
    let d = closed
        .check_cost(&attrs("1", "u", "free", "/"), 2)
        .await
        .unwrap();
    assert!(!d.allowed && d.fallback, "{d:?}");
    assert_eq!(d.layer.as_deref(), Some("global_ip"));
    assert_eq!(d.code.as_deref(), Some("ip_rate_limit"));
    assert_eq!(d.retry_after, Duration::from_secs(1));
    assert_eq!(closed.stats.fail_closed.load(Relaxed), 1);

    let open = Rules::from_text(conn(), &seed(), RulesConfig::default()).unwrap();
    let d = open.check(&attrs("1", "u", "free", "/")).await.unwrap();
    assert!(d.allowed && d.fallback && d.layer.is_none(), "{d:?}");
    assert_eq!(open.stats.fail_open.load(Relaxed), 1);

    let e = open
        .check_cost(&attrs("1", "u", "free", "/"), 5000 + 1)
        .await;
    assert!(matches!(e, Err(rl_client::Error::Request(_))), "{e:?}");
    let e = open.check_cost(&attrs("1", "u", "free", "/"), 0).await;
    assert!(matches!(e, Err(rl_client::Error::Request(_))), "{e:?}");
}
