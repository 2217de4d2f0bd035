//! The rules core under hostile input: any text as a document, any reply and any order of
//! replies, failures and error replies for a check. Nothing panics, every check ends
//! within its calls, and nothing is minted: refunds give back only what granted calls
//! took, and only when the decision does not keep it.

use std::collections::HashMap;

use proptest::prelude::*;
use rl_client_core::budget::Backend;
use rl_client_core::rules::{Check, CheckOptions};
use rl_client_core::rules_doc::Document;
use rl_client_core::Reply;

const MIXED: &str = "prefix: 'x:'\nlayers:\n  - {name: trial, key: 'ip:{ip}', limit: 2/day, shadow: true}\n  - {name: ip, key: 'ip:{ip}', limit: 5/day}\n  - {name: org, match: {org: ['acme', 'a?c*']}, key: 'org:{org}:{method}', limit: '1/s;10/minute'}\n  - {name: s2, key: 'u:{user}', limit: 3/s, shadow: true}\nattributes: [org]\n";

fn reply() -> impl Strategy<Value = Reply> {
    let leaf = prop_oneof![
        Just(Reply::Nil),
        any::<i64>().prop_map(Reply::Int),
        (-5i64..5).prop_map(Reply::Int),
        any::<f64>().prop_map(Reply::Double),
        proptest::collection::vec(any::<u8>(), 0..8).prop_map(Reply::Bulk),
        Just(Reply::Bulk(b"x:{ip:ip:a}:86400s".to_vec())),
        "[a-z]{0,4}".prop_map(Reply::Simple),
        "ERR [a-z]{0,6}".prop_map(Reply::Error),
    ];
    leaf.prop_recursive(3, 24, 5, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(Reply::Array),
            proptest::collection::vec((inner.clone(), inner), 0..3).prop_map(Reply::Map),
        ]
    })
}

/// A well-formed `RL.MTAKE` reply for `n` buckets, granted or not.
fn mtake(granted: bool, n: usize) -> Reply {
    Reply::Array(vec![
        Reply::Int(i64::from(granted)),
        Reply::Nil,
        Reply::Int(if granted { 0 } else { 1000 }),
        Reply::Array((0..n).map(|i| Reply::Int(i as i64)).collect()),
    ])
}

#[derive(Debug, Clone)]
enum Event {
    Reply(Reply),
    Wellformed(bool),
    ErrorReply,
    Failed,
}

fn event() -> impl Strategy<Value = Event> {
    prop_oneof![
        reply().prop_map(Event::Reply),
        any::<bool>().prop_map(Event::Wellformed),
        Just(Event::ErrorReply),
        Just(Event::Failed),
    ]
}

/// The number of buckets a command names (its keys).
fn keys(cmd: &[Vec<u8>]) -> usize {
    cmd.iter().filter(|a| a.starts_with(b"x:{")).count()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn any_text_is_a_document_or_problems(text in ".{0,200}") {
        let _ = Document::parse(&text);
    }

    #[test]
    fn any_edit_of_a_document_is_a_document_or_problems(
        at in 0usize..MIXED.len(),
        cut in 0usize..8,
        insert in "[\\[\\]{}:,'\"&*!\\- a-z0-9\n]{0,6}",
    ) {
        let mut text = MIXED.to_string();
        let at = (0..=at).rev().find(|i| text.is_char_boundary(*i)).unwrap_or(0);
        let end = (at + cut).min(text.len());
        let end = (end..=text.len()).find(|i| text.is_char_boundary(*i)).unwrap_or(text.len());
        text.replace_range(at..end, &insert);
        if let Err(e) = Document::parse(&text) {
            prop_assert!(!e.problems.is_empty());
        }
    }

    #[test]
    fn any_replies_in_any_order_end_a_check_and_mint_nothing(
        org in prop_oneof![Just("acme"), Just("abc"), Just("zz")],
        user in prop_oneof![Just(""), Just("u")],
        cost in 1u64..3,
        fail_open in any::<bool>(),
        cluster in any::<bool>(),
        functions in any::<bool>(),
        events in proptest::collection::vec(event(), 0..12),
    ) {
        let doc = Document::parse(MIXED).unwrap();
        let attrs: HashMap<String, String> = [("ip", "a"), ("org", org), ("method", "GET"), ("user", user)]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let applied = doc.plan(&attrs);
        let options = CheckOptions { cost, fail_open, cluster };
        let Ok(mut check) = Check::new(&applied, options) else {
            return Ok(()); // a cost above a cap: refused before any call (golden cases)
        };
        let backend = if functions { Backend::Functions } else { Backend::Module };
        let mut taken: Vec<usize> = Vec::new(); // buckets of each enforced call granted
        let mut calls = 0;
        let mut events = events.into_iter();
        while let Some(cmd) = check.command(backend) {
            calls += 1;
            prop_assert!(calls <= 8, "a check that does not end");
            let enforced = cmd.last().map(|a| a.as_slice()) == Some(b"WITHSTATE");
            let n = keys(&cmd);
            match events.next().unwrap_or(Event::Failed) {
                Event::Reply(r) => {
                    let granted = matches!(&r, Reply::Array(xs)
                        if xs.first().is_some_and(|g| matches!(g, Reply::Int(i) if *i > 0)));
                    if check.reply(&r).is_ok() && enforced && granted {
                        taken.push(n);
                    }
                }
                Event::Wellformed(granted) => {
                    check.reply(&mtake(granted, n)).unwrap();
                    if enforced && granted {
                        taken.push(n);
                    }
                }
                Event::ErrorReply => check.reply(&Reply::Error("ERR x".into())).unwrap(),
                Event::Failed => check.failed(),
            }
        }
        let refunds = check.refunds(backend);
        match check.decision() {
            Some(d) if d.granted && !d.fallback => {
                prop_assert!(refunds.is_empty());
                prop_assert_eq!(d.tokens, cost);
            }
            Some(d) => {
                prop_assert_eq!(d.tokens, if d.granted { cost } else { 0 });
                // Only what granted calls took, at most once each.
                prop_assert!(refunds.len() <= taken.iter().sum::<usize>());
            }
            None => prop_assert!(refunds.len() <= taken.iter().sum::<usize>()),
        }
        let n = cost.to_string().into_bytes();
        for r in &refunds {
            prop_assert_eq!(r.last(), Some(&n));
        }
    }
}
