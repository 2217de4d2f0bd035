//! A hostile review of pins on share keys (`RL.PIN` on an `RL.SHARE` key): what the other
//! share-pin tests left open.

mod support;

use std::collections::HashMap;
use support::*;

const LONG: &str = "3600000";

fn ok(c: &mut Connection, args: &[&str]) {
    let r: String = query(c, args);
    assert_eq!(r, "OK", "{args:?}");
}

/// `RL.STATS ns` as a map of counters.
fn ns_stats(c: &mut Connection, ns: &str) -> HashMap<String, i64> {
    let flat: Vec<Value> = query(c, &["RL.STATS", ns]);
    flat.chunks(2)
        .map(|kv| {
            let k = match &kv[0] {
                Value::BulkString(b) => String::from_utf8(b.clone()).unwrap(),
                Value::SimpleString(s) => s.clone(),
                other => panic!("{other:?}"),
            };
            let v = match &kv[1] {
                Value::Int(i) => *i,
                other => panic!("{other:?}"),
            };
            (k, v)
        })
        .collect()
}

/// docs/share.md: "a blocked holder's call counts as denied (and in `RL.TOP`)". A holder
/// reporting no demand (want 0) is granted when it gets nothing, but under `BLOCK` it is
/// refused whatever it wants: its call was counted as granted and left out of `RL.TOP`.
#[test]
fn a_blocked_holder_wanting_nothing_counts_as_denied() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    ok(&mut c, &["RL.PIN", "idle:s", "SHARES", "BLOCK"]);
    let _: Value = query(&mut c, &["RL.SHARE", "idle:s", "10", "10", "a", "0", LONG]);
    let st = ns_stats(&mut c, "idle");
    assert_eq!(
        (st["calls"], st["granted"], st["denied"]),
        (1, 0, 1),
        "{st:?}"
    );
    let top: Value = query(&mut c, &["RL.TOP"]);
    assert!(format!("{top:?}").contains("idle:s"), "{top:?}");
    // Unpinned, a holder that wants nothing and gets nothing is granted, as before.
    let _: Value = query(&mut c, &["RL.SHARE", "idle:t", "10", "10", "a", "0", LONG]);
    let _: Value = query(&mut c, &["RL.SHARE", "idle:t", "10", "10", "b", "0", LONG]);
    let st = ns_stats(&mut c, "idle");
    assert_eq!(
        (st["calls"], st["granted"], st["denied"]),
        (3, 2, 1),
        "{st:?}"
    );
}
