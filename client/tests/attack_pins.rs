//! `Limiter::take` on keys an operator pinned (`RL.PIN`): the server's decision, whatever
//! the pin, answers `RL.TAKE ... WITHSTATE` with a fifth element (the pin's kind), which
//! the client must read as the decision it is, not as an unexpected reply.

mod support;

use std::time::Duration;

use rl_client::{Limit, Limiter, LimiterConfig, Source};
use support::Server;

#[tokio::test]
async fn pinned_keys_get_the_servers_decision() {
    let server = Server::start();
    let config = LimiterConfig {
        timeout: Duration::from_secs(10),
        ..LimiterConfig::default()
    };
    let limiter = Limiter::new(
        server.manager().await,
        Limit::new(0.001, 5.0).unwrap(),
        config,
    )
    .unwrap();
    let mut c = server.conn();
    for (key, pin) in [
        ("blocked", &["BLOCK"][..]),
        ("vip", &["EXEMPT"]),
        ("slowed", &["0.001", "1"]),
    ] {
        let _: String = redis::cmd("RL.PIN")
            .arg(key)
            .arg(pin)
            .query(&mut c)
            .unwrap();
    }
    let d = limiter.take("blocked", 1).await;
    assert!(
        matches!(&d, Ok(d) if !d.allowed && d.source == Source::Server),
        "a blocked key: {d:?}"
    );
    for _ in 0..10 {
        let d = limiter.take("vip", 5).await;
        assert!(
            matches!(&d, Ok(d) if d.allowed && d.source == Source::Server),
            "an exempt key: {d:?}"
        );
    }
    let d = limiter.take("slowed", 1).await;
    assert!(matches!(&d, Ok(d) if d.allowed), "a rate pin: {d:?}");
    let d = limiter.take("slowed", 1).await;
    assert!(matches!(&d, Ok(d) if !d.allowed), "a rate pin: {d:?}");
}
