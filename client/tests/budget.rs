//! `TokenBudget` against real servers: the module and the Functions library, reserve and
//! settle, all or nothing across limits, an outage under each failure policy.

mod support;

use std::time::Duration;

use support::{Plain, Server};

use rl_client::{Backend, BudgetConfig, Error, FailurePolicy, Limit, Source, TokenBudget};

fn frozen(cap: f64) -> Limit {
    Limit::new(1e-3, cap).unwrap()
}

fn config(backend: Backend, policy: FailurePolicy) -> BudgetConfig {
    BudgetConfig {
        timeout: Duration::from_secs(5),
        policy,
        backend,
        ..Default::default()
    }
}

#[tokio::test]
async fn reserve_and_settle_on_both_backends() {
    let module = Server::start();
    let library = Plain::with_library();
    for (backend, conn) in [
        (Backend::Module, module.manager().await),
        (Backend::Functions, library.manager().await),
    ] {
        let budget = TokenBudget::new(
            conn,
            "org:42",
            &[
                ("input", frozen(1000.0)),
                ("output", frozen(500.0)),
                ("requests", frozen(10.0)),
            ],
            config(backend, FailurePolicy::Deny),
        )
        .unwrap();
        let mut res = budget
            .reserve(&[("input", 600), ("output", 400)])
            .await
            .unwrap();
        assert!(res.granted && res.source == Source::Server, "{res:?}");
        assert_eq!(res.reserved[2], ("requests".to_string(), 1));
        // Output refuses: nothing is taken from input or requests either.
        let denied = budget
            .reserve(&[("input", 10), ("output", 200)])
            .await
            .unwrap();
        assert!(!denied.granted && denied.denied_by.as_deref() == Some("output"));
        assert!(denied.retry_after > Duration::ZERO);
        let back = budget
            .settle(&mut res, &[("input", 650), ("output", 100)])
            .await
            .unwrap();
        assert_eq!(
            back,
            Some(vec![Some(-50), Some(300), Some(0)]),
            "{backend:?}"
        );
        assert_eq!(budget.settle(&mut res, &[]).await.unwrap(), None, "once");
        assert!(!res.is_open());
        let c = budget.counters();
        assert_eq!((c.budget.granted, c.budget.denied), (1, 1));
        assert_eq!((c.budget.tokens_back, c.budget.tokens_overage), (300, 50));
        // What the shell refuses before sending anything.
        let err = budget.reserve(&[("inptu", 1)]).await.unwrap_err();
        assert!(
            matches!(err, Error::Budget(ref m) if m.contains("no limit \"inptu\"")),
            "{err}"
        );
        let err = budget.reserve(&[("input", 1)]).await.unwrap_err();
        assert!(err.to_string().contains("\"output\" needs a cost"), "{err}");
        let err = budget
            .reserve(&[("input", 1), ("output", 501)])
            .await
            .unwrap_err();
        assert!(err.to_string().contains("burst"), "{err}");
    }
    // The module's own state: the buckets hold what the calls used.
    assert_eq!(
        module.tokens("{org:42}:output").map(f64::round),
        Some(400.0)
    );
}

#[tokio::test]
async fn an_outage_is_decided_by_the_failure_policy_and_settles_locally() {
    for (policy, granted) in [
        (FailurePolicy::Allow, 2),
        (FailurePolicy::LastKnown, 1),
        (FailurePolicy::Deny, 0),
    ] {
        let mut server = Server::start();
        let cfg = BudgetConfig {
            timeout: Duration::from_millis(300),
            instances: 2,
            ..config(Backend::Module, policy)
        };
        let budget = TokenBudget::new(
            server.manager().await,
            "k",
            &[("tokens", frozen(100.0))],
            cfg,
        )
        .unwrap();
        // Redis reports 40 left; then it goes away.
        let mut r = budget.reserve(&[("tokens", 60)]).await.unwrap();
        budget.settle(&mut r, &[]).await.unwrap();
        server.stop();
        // Half of each limit locally: ALLOW from 50 full, LAST_KNOWN from half of 40.
        let mut out = Vec::new();
        for _ in 0..3 {
            out.push(budget.reserve(&[("tokens", 20)]).await.unwrap());
        }
        assert!(out.iter().all(|r| r.source == Source::Fallback));
        assert_eq!(
            out.iter().filter(|r| r.granted).count(),
            granted,
            "{policy:?}"
        );
        for r in out.iter_mut().filter(|r| r.granted) {
            let back = budget.settle(r, &[("tokens", 5)]).await.unwrap();
            assert_eq!(back, Some(vec![Some(15)]), "settled locally");
        }
        let c = budget.counters();
        assert_eq!(c.fallback_granted as usize, granted);
        assert_eq!(c.outages, 3);
    }
}
