//! protocol/rules_cases.json on the core: the plans of requests, the documents refused with
//! the field named, and checks (the calls made, the replies or failures fed back, the
//! decision and the refunds).

mod common;

use std::collections::HashMap;

use rl_client_core::budget::Backend;
use rl_client_core::rules::{Check, CheckOptions, RuleDecision};
use rl_client_core::rules_doc::Document;
use rl_client_core::Reply;
use serde_json::Value as J;

fn cases() -> J {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../protocol/rules_cases.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn document(cases: &J, name: &str) -> Document {
    let d = &cases["documents"][name];
    let text = match d["file"].as_str() {
        Some(f) => {
            std::fs::read_to_string(format!("{}/../{f}", env!("CARGO_MANIFEST_DIR"))).unwrap()
        }
        None => d["text"].as_str().unwrap().to_string(),
    };
    Document::parse(&text).unwrap()
}

fn attributes(case: &J) -> HashMap<String, String> {
    case["attributes"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_string()))
        .collect()
}

fn texts(args: &[Vec<u8>]) -> Vec<String> {
    args.iter()
        .map(|a| String::from_utf8(a.clone()).unwrap())
        .collect()
}

fn strings(j: &J) -> Vec<String> {
    j.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_str().unwrap().to_string())
        .collect()
}

fn opt(j: &J) -> Option<String> {
    j.as_str().map(str::to_string)
}

/// A case's decision as the core's.
fn decision(j: &J) -> RuleDecision {
    RuleDecision {
        granted: j["granted"].as_bool().unwrap(),
        remaining: j["remaining"].as_f64().unwrap(),
        retry_after_ms: j["retry_after_ms"].as_u64().unwrap(),
        reset_after_ms: j["reset_after_ms"].as_u64().unwrap(),
        tokens: j["tokens"].as_u64().unwrap(),
        limit: j["limit"].as_f64().unwrap(),
        layer: opt(&j["layer"]),
        code: opt(&j["code"]),
        key: opt(&j["key"]),
        shadow_denied: strings(&j["shadow_denied"]),
        fallback: j["fallback"].as_bool().unwrap(),
    }
}

#[test]
fn golden_plans() {
    let cases = cases();
    for case in cases["plans"].as_array().unwrap() {
        let doc = document(&cases, case["document"].as_str().unwrap());
        let got: Vec<(String, Vec<String>)> = doc
            .plan(&attributes(case))
            .iter()
            .map(|a| {
                let keys = a.buckets.iter().map(|b| b.key.clone()).collect();
                (a.layer.name.clone(), keys)
            })
            .collect();
        let want: Vec<(String, Vec<String>)> = case["layers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| (l[0].as_str().unwrap().to_string(), strings(&l[1])))
            .collect();
        assert_eq!(got, want, "{case}");
    }
}

#[test]
fn golden_refusals() {
    for case in cases()["refused"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let e = Document::parse(text).expect_err(text);
        let field = case["field"].as_str().unwrap();
        assert!(e.problems.iter().any(|p| p.field == field), "{text}: {e}");
    }
}

#[test]
fn golden_checks() {
    let cases = cases();
    for case in cases["checks"].as_array().unwrap() {
        let about = case["about"].as_str().unwrap();
        let doc = document(&cases, case["document"].as_str().unwrap());
        let options = CheckOptions {
            cost: case["cost"].as_u64().unwrap_or(1),
            fail_open: case["fail_open"].as_bool().unwrap_or(true),
            cluster: case["cluster"].as_bool().unwrap_or(false),
        };
        let backend = match case["backend"].as_str() {
            Some("functions") => Backend::Functions,
            _ => Backend::Module,
        };
        let applied = doc.plan(&attributes(case));
        let mut check = match Check::new(&applied, options) {
            Ok(c) => c,
            Err(e) => {
                assert_eq!(Some(e.0.as_str()), case["cost_error"].as_str(), "{about}");
                continue;
            }
        };
        assert!(case["cost_error"].is_null(), "{about}: no cost error");
        for event in case["events"].as_array().unwrap() {
            let sent = check
                .command(backend)
                .unwrap_or_else(|| panic!("{about}: no call"));
            assert_eq!(texts(&sent), strings(&event["send"]), "{about}");
            if let Some(r) = event.get("reply") {
                let got = check.reply(&common::reply(r));
                let malformed = event["protocol_error"].as_bool().unwrap_or(false);
                assert_eq!(got.is_err(), malformed, "{about}: {got:?}");
            } else if let Some(e) = event["error_reply"].as_str() {
                check.reply(&Reply::Error(e.into())).unwrap();
            } else {
                assert!(event["error"].is_string(), "{about}: an event");
                check.failed();
            }
        }
        assert_eq!(check.command(backend), None, "{about}: a call left");
        let want = (!case["decision"].is_null()).then(|| decision(&case["decision"]));
        assert_eq!(check.decision(), want.as_ref(), "{about}");
        let refunds: Vec<Vec<String>> = check.refunds(backend).iter().map(|c| texts(c)).collect();
        let want: Vec<Vec<String>> = case["refunds"]
            .as_array()
            .unwrap()
            .iter()
            .map(strings)
            .collect();
        assert_eq!(refunds, want, "{about}");
    }
}
