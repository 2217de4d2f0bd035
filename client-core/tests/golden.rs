//! The golden cases of token budgets (`protocol/cases/budget.json`) through the client
//! core: every reply that is not an error, in both protocols, reads back as the case says;
//! and the commands the core builds from a case's parts are the case's own arguments.

use rl_client_core::budget::{self, Backend, Part, Settled};
use serde_json::Value as J;

mod common;

use common::{reply, BASE_US};

fn arg(j: &J) -> String {
    match j {
        J::String(s) => s.clone(),
        J::Object(o) => (BASE_US + o["id"].as_i64().unwrap()).to_string(),
        other => panic!("argument {other}"),
    }
}

#[test]
fn budget_cases_read_back_and_commands_match() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../protocol/cases/budget.json");
    let doc: J = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut checked = 0;
    for case in doc["cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let args: Vec<String> = case["args"].as_array().unwrap().iter().map(arg).collect();
        if case["resp3"].get("error").is_some() {
            continue;
        }
        match args[0].as_str() {
            "RL.BUDGET" => {
                // ttl, then key rate cap n groups, then options.
                let ttl: u64 = args[1].parse().unwrap();
                let mut parts = Vec::new();
                let mut i = 2;
                while i + 3 < args.len() && args[i + 1].parse::<f64>().is_ok() {
                    parts.push(Part {
                        key: args[i].as_bytes(),
                        rate: args[i + 1].parse().unwrap(),
                        cap: args[i + 2].parse().unwrap(),
                        n: args[i + 3].parse().unwrap(),
                    });
                    i += 4;
                }
                let opts = &args[i..];
                let version = opts
                    .iter()
                    .position(|o| o == "VERSION")
                    .map(|at| opts[at + 1].parse().unwrap());
                if opts
                    .iter()
                    .all(|o| o == "VERSION" || o.parse::<u64>().is_ok())
                {
                    let built: Vec<String> =
                        budget::budget_command(Backend::Module, ttl, &parts, version)
                            .into_iter()
                            .map(|a| String::from_utf8(a).unwrap())
                            .collect();
                    assert_eq!(built, args, "{name}: the command");
                }
                let want = &case["resp3"];
                for protocol in ["resp2", "resp3"] {
                    let r = budget::parse_budget(&reply(&case[protocol]), parts.len())
                        .unwrap_or_else(|e| panic!("{name} ({protocol}): {e}"));
                    assert_eq!(r.granted, want[0] == 1, "{name}");
                    let id = match &want[1] {
                        J::Object(o) => (BASE_US + o["id"].as_i64().unwrap()) as u64,
                        n => n.as_u64().unwrap(),
                    };
                    assert_eq!(r.id, id, "{name}");
                    assert_eq!(
                        r.denied_by.map(|k| String::from_utf8(k).unwrap()),
                        want[2].as_str().map(str::to_string),
                        "{name}"
                    );
                    assert_eq!(r.remaining.is_some(), want.get(4).is_some(), "{name}");
                }
                checked += 1;
            }
            "RL.SETTLE" => {
                let used: Vec<(&[u8], u64)> = args[2..]
                    .chunks(2)
                    .map(|p| (p[0].as_bytes(), p[1].parse().unwrap()))
                    .collect();
                let id: u64 = args[1].parse().unwrap();
                let built: Vec<String> = budget::settle_command(Backend::Module, id, &used)
                    .into_iter()
                    .map(|a| String::from_utf8(a).unwrap())
                    .collect();
                assert_eq!(built, args, "{name}: the command");
                for protocol in ["resp2", "resp3"] {
                    let got = budget::parse_settle(&reply(&case[protocol]), used.len())
                        .unwrap_or_else(|e| panic!("{name} ({protocol}): {e}"));
                    let want: Vec<Settled> = case["resp3"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|x| match x.as_i64() {
                            None => Settled::Unmatched,
                            Some(i) if i >= 0 => Settled::Credited(i as u64),
                            Some(i) => Settled::Charged(i.unsigned_abs()),
                        })
                        .collect();
                    assert_eq!(got, want, "{name} ({protocol})");
                }
                checked += 1;
            }
            other => panic!("{name}: {other} in budget.json"),
        }
    }
    assert!(checked >= 15, "{checked} cases");
}
