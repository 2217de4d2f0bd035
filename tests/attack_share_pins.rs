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

fn num(v: &Value) -> f64 {
    match v {
        Value::Double(d) => *d,
        Value::BulkString(b) => std::str::from_utf8(b).unwrap().parse().unwrap(),
        Value::Int(i) => *i as f64,
        other => panic!("{other:?}"),
    }
}

/// A fleet through a rate pin above the callers' limit, then a rate pin far below it that
/// ends by itself (`PX`): a lease after each change, the shares in use (as the holders'
/// rules let them be used) sum to at most the limit that governs then. A pin that raised
/// the limit must not leave more than the callers' rate in use a lease after the lower
/// pin's end.
#[test]
fn a_fleet_through_a_raising_pin_and_a_lowering_one_ending_by_itself_mints_nothing() {
    const MS: u64 = 1_000_000;
    let s = Server::start(&[]);
    let (rate, cap) = (100.0, 20.0);
    let deadline = now_ns() + 4_800 * MS;
    let mut threads = Vec::new();
    for h in 0..5u64 {
        let mut c = s.conn();
        threads.push(std::thread::spawn(move || {
            let mut seed = h.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
            let mut rnd = move |n: u64| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                seed % n
            };
            let mut calls = Vec::new();
            let id = format!("h{h}");
            while now_ns() < deadline {
                let want = (1 + rnd(400)).to_string();
                let sent = now_ns();
                let r: Vec<Value> = redis::cmd("RL.SHARE")
                    .arg(&["fleet", "100", "20", &id, &want, "300"])
                    .query(&mut c)
                    .unwrap();
                let answered = now_ns();
                let exempt = matches!(r.get(5), Some(Value::BulkString(b)) if b == b"exempt");
                assert!(!exempt);
                calls.push((sent, answered, num(&r[0]), num(&r[1]), num(&r[2]) as u64));
                let wait = (num(&r[3]) as u64).min(100);
                std::thread::sleep(std::time::Duration::from_millis(rnd(wait + 1)));
            }
            calls
        }));
    }
    let mut c = s.conn();
    // (sent, answered, rate and cap): a limit governs from between the two at the latest,
    // so its window runs from a lease after its answer to the next one's sending.
    let mut changes = Vec::new();
    std::thread::sleep(std::time::Duration::from_millis(500));
    let sent = now_ns();
    ok(&mut c, &["RL.PIN", "fleet", "1000", "200"]);
    changes.push((sent, now_ns(), (1000.0, 200.0)));
    std::thread::sleep(std::time::Duration::from_millis(1000));
    let sent = now_ns();
    ok(&mut c, &["RL.PIN", "fleet", "10", "2", "PX", "1500"]);
    let set = now_ns();
    changes.push((sent, set, (10.0, 2.0)));
    changes.push((sent + 1500 * MS, set + 1500 * MS, (rate, cap)));
    let calls: Vec<Vec<ShareCall>> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    let uses = share_uses(&calls);
    let lease = 900 * MS;
    let mut instants: Vec<u64> = uses.iter().map(|u| u.0).collect();
    instants.extend(changes.iter().map(|c| c.1 + lease));
    let mut checked = [0; 3];
    for &t in &instants {
        let (r, b) = uses
            .iter()
            .filter(|u| u.0 <= t && t < u.1)
            .fold((0.0, 0.0), |(r, b), u| (r + u.2, b + u.3));
        for (i, &(_, at, (ar, ac))) in changes.iter().enumerate() {
            let next = changes.get(i + 1).map_or(u64::MAX, |n| n.0);
            if t >= at + lease && t < next {
                checked[i] += 1;
                assert!(
                    r <= ar * (1.0 + 1e-12) && b <= ac * (1.0 + 1e-12),
                    "{r} / {b} in use {} ms after change {i}",
                    (t - at) / MS
                );
            }
        }
    }
    assert!(checked[2] > 0, "{checked:?}");
}
