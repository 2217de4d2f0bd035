//! The prefetch ledger's golden cases (`protocol/client-cases/prefetch.json`) through this
//! shell: each case's reply as redis-rs hands it over (a `redis::Value`), converted as every
//! reply of the client is, into the ledger `PrefetchLimiter` runs.

#[path = "../../client-core/tests/common/prefetch_cases.rs"]
mod prefetch_cases;

use redis::Value;
use serde_json::Value as J;

fn value(j: &J) -> Value {
    match j {
        J::Null => Value::Nil,
        J::Number(n) => Value::Int(n.as_i64().unwrap()),
        J::String(s) => Value::BulkString(s.clone().into_bytes()),
        J::Array(items) => Value::Array(items.iter().map(value).collect()),
        other => panic!("no reply form for {other}"),
    }
}

#[test]
fn the_prefetch_ledger_follows_its_golden_cases_through_redis_values() {
    let steps = prefetch_cases::run(&|j| rl_client::__core_reply(value(j)));
    assert!(steps >= 100, "only {steps} steps");
}
