//! What the core's case-driven tests share: a case's reply as the core's [`Reply`].

#[allow(dead_code)] // each test crate uses its part
pub mod prefetch_cases;

use rl_client_core::Reply;
use serde_json::Value as J;

/// Ids in a case count from the call's microsecond clock.
pub const BASE_US: i64 = 1_700_000_000_000_000;

/// A case's reply (a number an integer, a string a bulk string, null nil; tagged objects
/// for doubles, their texts, milliseconds and ids).
pub fn reply(j: &J) -> Reply {
    match j {
        J::Null => Reply::Nil,
        J::Number(n) => Reply::Int(n.as_i64().unwrap()),
        J::String(s) => Reply::Bulk(s.clone().into_bytes()),
        J::Array(items) => Reply::Array(items.iter().map(reply).collect()),
        J::Bool(_) => panic!("no booleans in replies"),
        J::Object(o) => {
            let (tag, x) = o.iter().next().unwrap();
            match tag.as_str() {
                "double" | "tokens" => Reply::Double(x.as_f64().unwrap()),
                "double_text" | "tokens_text" => {
                    Reply::Bulk(x.as_f64().unwrap().to_string().into_bytes())
                }
                "ms" => Reply::Int(x.as_i64().unwrap()),
                "id" => Reply::Int(BASE_US + x.as_i64().unwrap()),
                other => panic!("unknown reply tag {other}"),
            }
        }
    }
}
