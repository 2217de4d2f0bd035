//! The golden protocol cases (`protocol/cases/*.json`) read by the client core's parsers:
//! every `RL.TAKE ... WITHSTATE`, `RL.RESERVE`, `RL.ACQUIRE` and `RL.PEEK` reply, in both
//! RESP versions as a client hands them over, parses to the numbers the case says. The
//! Python package runs the same cases through its extension (`python/tests/test_protocol.py`).

use std::path::Path;

use rl_client_core::commands::{parse_acquire, parse_peek, parse_reserve};
use rl_client_core::take::parse_take;
use rl_client_core::Reply;
use serde_json::Value as J;

/// Ids in a case count from the call's microsecond clock.
const BASE_US: i64 = 1_700_000_000_000_000;

fn tagged(j: &J) -> (&str, &J) {
    let m = j.as_object().expect("a tagged value");
    assert_eq!(m.len(), 1, "one tag: {j}");
    let (k, v) = m.iter().next().unwrap();
    (k.as_str(), v)
}

/// A case's typed reply as a client hands it over.
fn reply(j: &J) -> Reply {
    match j {
        J::Null => Reply::Nil,
        J::Number(n) => Reply::Int(n.as_i64().expect("an integer reply")),
        J::String(s) => Reply::Bulk(s.clone().into_bytes()),
        J::Array(a) => Reply::Array(a.iter().map(reply).collect()),
        J::Object(_) => {
            let (tag, x) = tagged(j);
            let f = || x.as_f64().expect("a number");
            let pairs = || -> Vec<(Reply, Reply)> {
                x.as_array()
                    .unwrap()
                    .iter()
                    .map(|p| (reply(&p[0]), reply(&p[1])))
                    .collect()
            };
            match tag {
                "simple" => Reply::Simple(x.as_str().unwrap().into()),
                "double" | "tokens" => Reply::Double(f()),
                "double_text" | "tokens_text" => Reply::Bulk(format!("{}", f()).into_bytes()),
                "ms" => Reply::Int(x.as_i64().unwrap()),
                "id" => Reply::Int(BASE_US + x.as_i64().unwrap()),
                "map" => Reply::Map(pairs()),
                "pairs" => Reply::Array(pairs().into_iter().flat_map(|(k, v)| [k, v]).collect()),
                other => panic!("unknown tag {other}"),
            }
        }
        J::Bool(_) => panic!("no boolean replies in the cases"),
    }
}

/// A number the case's RESP3 reply says, markers resolved.
fn plain(j: &J) -> f64 {
    match j {
        J::Number(n) => n.as_f64().unwrap(),
        J::Object(_) => match tagged(j) {
            ("id", x) => (BASE_US + x.as_i64().unwrap()) as f64,
            (_, x) => x.as_f64().expect("a number"),
        },
        other => panic!("a number expected, got {other}"),
    }
}

fn numbers(j: &J) -> Vec<f64> {
    j.as_array().expect("an array").iter().map(plain).collect()
}

fn check(args: &[J], resp3: &J, got: &Reply) -> Result<(), String> {
    let name = args[0].as_str().unwrap().to_ascii_uppercase();
    let withstate = args.iter().any(|a| {
        a.as_str()
            .is_some_and(|s| s.eq_ignore_ascii_case("WITHSTATE"))
    });
    let err = |e: rl_client_core::ProtocolError| e.to_string();
    let (have, want): (Vec<f64>, Vec<f64>) = match name.as_str() {
        "RL.TAKE" if withstate => {
            let t = parse_take(got).map_err(err)?;
            let want = numbers(&J::Array(resp3.as_array().unwrap()[..4].to_vec()));
            let pinned = resp3.as_array().unwrap().get(4).and_then(|p| p.as_str());
            if t.pinned.map(|p| p.name()) != pinned {
                return Err(format!("pinned {:?}, want {pinned:?}", t.pinned));
            }
            let have = [
                t.granted as f64,
                t.remaining,
                t.retry_after_ms as f64,
                t.reset_after_ms as f64,
            ];
            (have.to_vec(), want)
        }
        "RL.RESERVE" => {
            let r = parse_reserve(got).map_err(err)?;
            let have = [
                r.granted as f64,
                r.wait_ms as f64,
                r.remaining,
                r.reset_after_ms as f64,
            ];
            (have.to_vec(), numbers(resp3))
        }
        "RL.ACQUIRE" => {
            let r = parse_acquire(got).map_err(err)?;
            let have = [
                u8::from(r.granted) as f64,
                r.permit_id as f64,
                r.in_use as f64,
                r.retry_after_ms as f64,
            ];
            (have.to_vec(), numbers(resp3))
        }
        "RL.PEEK" => {
            let p = parse_peek(got).map_err(err)?;
            let Some(p) = p else {
                return if resp3.is_null() {
                    Ok(())
                } else {
                    Err("None for a bucket".into())
                };
            };
            let fields = tagged(resp3).1.as_array().unwrap();
            let field = |k: &str| fields.iter().find(|f| f[0] == k).map(|f| &f[1]);
            let mut have = vec![p.tokens, p.rate, p.cap, p.reset_after_ms as f64];
            let mut want: Vec<f64> = ["tokens", "rate", "cap", "reset_after_ms"]
                .iter()
                .map(|k| plain(field(k).expect("a field")))
                .collect();
            for (k, v) in [("leases", p.leases), ("leased_tokens", p.leased_tokens)] {
                have.push(v as f64);
                want.push(field(k).map_or(0.0, plain));
            }
            if let Some(v) = field("version").filter(|v| !v.is_null()) {
                have.push(p.version.map_or(-1.0, |x| x as f64));
                want.push(plain(v));
            } else if p.version.is_some() {
                return Err("a version the reply does not have".into());
            }
            (have, want)
        }
        _ => return Ok(()),
    };
    if have == want {
        Ok(())
    } else {
        Err(format!("parsed {have:?}, want {want:?}"))
    }
}

#[test]
fn golden_case_replies_parse_in_the_core() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../protocol/cases");
    let mut checked = 0;
    let mut failures = Vec::new();
    let mut paths: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    paths.sort();
    for path in paths
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
    {
        let doc: J = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        for case in doc["cases"].as_array().unwrap() {
            let resp3 = &case["resp3"];
            if resp3.get("error").is_some() {
                continue;
            }
            let args = case["args"].as_array().unwrap();
            let name = args[0].as_str().unwrap().to_ascii_uppercase();
            if !["RL.TAKE", "RL.RESERVE", "RL.ACQUIRE", "RL.PEEK"].contains(&name.as_str()) {
                continue;
            }
            for protocol in ["resp2", "resp3"] {
                if let Err(e) = check(args, resp3, &reply(&case[protocol])) {
                    failures.push(format!(
                        "{} / {} ({protocol}): {e}",
                        path.display(),
                        case["name"]
                    ));
                }
            }
            checked += 1;
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(checked >= 20, "only {checked} cases read: the cases moved?");
}
