//! Versioned limits (`VERSION v`): a bucket keeps the newest limit it has seen, so callers
//! on two releases passing two limits cannot flap it. Two groups of callers on versions 1
//! and 2 share buckets; after the first version-2 call every decision follows version 2's
//! limit, and the version travels through every copy of the key. A stale caller never gets
//! more than the stored (newer) limit allows, a storm of versions leaves master, replica,
//! AOF replay and RDB reload byte-identical, and forged effects and corrupt payloads of
//! versioned buckets change nothing and never hurt the server.

mod support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use support::*;

/// `RL.PEEK key` as a field map (`None`: no key).
fn peek(c: &mut Connection, key: &str) -> Option<HashMap<String, Value>> {
    let v: Value = redis::cmd("RL.PEEK").arg(key).query(c).unwrap();
    let items = match v {
        Value::Nil => return None,
        Value::Array(items) => items,
        other => panic!("PEEK: {other:?}"),
    };
    let fields: Vec<String> = items
        .iter()
        .step_by(2)
        .map(|x| redis::from_redis_value(x).unwrap())
        .collect();
    // `version` is the last field.
    assert_eq!(
        fields.last().map(String::as_str),
        Some("version"),
        "{fields:?}"
    );
    Some(
        fields
            .into_iter()
            .zip(items.into_iter().skip(1).step_by(2))
            .collect(),
    )
}

/// The stored limit and version as PEEK shows them: `(rate, cap, version)`.
fn stored(c: &mut Connection, key: &str) -> (f64, f64, u64) {
    let p = peek(c, key).unwrap_or_else(|| panic!("{key} is gone"));
    let f = |name: &str| -> f64 { redis::from_redis_value(&p[name]).unwrap() };
    let version: u64 = redis::from_redis_value(&p["version"]).unwrap();
    (f("rate"), f("cap"), version)
}

fn peek_version(c: &mut Connection, key: &str) -> u64 {
    stored(c, key).2
}

/// `RL.TAKE key rate cap n WITHSTATE VERSION v` → (granted, remaining).
fn take_v(c: &mut Connection, key: &str, limit: (f64, f64), n: u64, v: u64) -> (i64, f64) {
    let (granted, remaining, _, _): (i64, f64, i64, i64) = redis::cmd("RL.TAKE")
        .arg(key)
        .arg(limit.0)
        .arg(limit.1)
        .arg(n)
        .arg("WITHSTATE")
        .arg("VERSION")
        .arg(v)
        .query(c)
        .unwrap();
    (granted, remaining)
}

fn counters(c: &mut Connection) -> (u64, u64, u64) {
    (
        info_field(c, "rl", "rl_limit_replaced"),
        info_field(c, "rl", "rl_limit_stale"),
        info_field(c, "rl", "rl_limit_conflicts"),
    )
}

/// Version 1's limit: faster and larger. Version 2's: slower and smaller. Both take many
/// seconds to fill, so no key can fill and expire while the test runs, however slowly the
/// calls come (a key that went would be a full bucket to the next caller, whatever its
/// version: the stored version goes with the key).
const A: (f64, f64) = (4.0, 50.0);
const B: (f64, f64) = (1.0, 20.0);
const KEYS: [&str; 3] = ["shared:1", "shared:2", "shared:3"];

#[test]
fn two_versions_under_load_follow_the_newest_limit() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let (g1, g2, calls) = (2usize, 2usize, 300usize);

    // Phase 1: group 1 alone (version 1, limit A).
    let run_group = |version: u64, limit: (f64, f64), calls: usize, after_switch: bool| {
        let mut conn = s.conn();
        move || {
            let mut granted: HashMap<&str, u64> = HashMap::new();
            for i in 0..calls {
                let key = KEYS[i % KEYS.len()];
                let (got, remaining) = take_v(&mut conn, key, limit, 1 + (i % 3) as u64, version);
                if after_switch {
                    // Every decision follows B: the level shown is B's (at most B's cap).
                    assert!(
                        remaining <= B.1,
                        "v{version} saw {remaining} tokens under B"
                    );
                }
                *granted.entry(key).or_default() += got as u64;
            }
            granted
        }
    };
    let phase1: Vec<_> = (0..g1)
        .map(|_| std::thread::spawn(run_group(1, A, calls, false)))
        .collect();
    for t in phase1 {
        t.join().unwrap();
    }
    for key in KEYS {
        assert_eq!(stored(&mut c, key), (A.0, A.1, 1));
    }
    assert_eq!(counters(&mut c), (0, 0, 0));

    // The first version-2 call on each key (a denial would replace it too: see below).
    let start = now_ns();
    let mut out: HashMap<&str, u64> = HashMap::new();
    for key in KEYS {
        let (got, remaining) = take_v(&mut c, key, B, 1, 2);
        assert!(remaining <= B.1);
        *out.entry(key).or_default() += got as u64;
        assert_eq!(stored(&mut c, key), (B.0, B.1, 2));
    }
    assert_eq!(counters(&mut c).0, KEYS.len() as u64);

    // Phase 2: both groups at once, and a watcher: the keys never go, never go back to A.
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = {
        let mut w = s.conn();
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut looks = 0u64;
            while !stop.load(Ordering::Relaxed) || looks == 0 {
                for key in KEYS {
                    assert_eq!(stored(&mut w, key), (B.0, B.1, 2), "{key}");
                    let at: i64 = redis::cmd("PEXPIRETIME").arg(key).query(&mut w).unwrap();
                    assert!(at > 0, "{key} has no expiry ({at})");
                }
                looks += 1;
            }
            looks
        })
    };
    let go = Arc::new(Barrier::new(g1 + g2));
    let both: Vec<_> = (0..g1 + g2)
        .map(|i| {
            let (version, limit) = if i < g1 { (1, A) } else { (2, B) };
            let mut f = run_group(version, limit, calls, true);
            let go = go.clone();
            std::thread::spawn(move || {
                go.wait();
                (version, f())
            })
        })
        .collect();
    for t in both {
        let (_, granted) = t.join().unwrap();
        for (k, n) in granted {
            *out.entry(k).or_default() += n;
        }
    }
    // A version-1 call granted for certain (5 tokens refunded first; not to full, so the
    // key stays): it is decided and stored under B.
    let mut credited = 0.0;
    for key in KEYS {
        credited += query::<f64>(&mut c, &["RL.REFUND", key, "5"]);
        let (got, remaining) = take_v(&mut c, key, A, 3, 1);
        assert_eq!(got, 3);
        assert!(remaining <= B.1 - 3.0, "{remaining}");
        *out.entry(key).or_default() += 3;
        assert_eq!(stored(&mut c, key), (B.0, B.1, 2));
    }
    let (_, stale_now, conflicts) = counters(&mut c);
    // Every call of group 1 in phase 2 was decided under B, and counted as stale.
    assert_eq!(stale_now, (g1 * calls + KEYS.len()) as u64);
    assert_eq!(conflicts, 0);

    // Phase 3: group 1 has stopped; group 2 goes on, and the stale count stays.
    let rest: Vec<_> = (0..g2)
        .map(|_| std::thread::spawn(run_group(2, B, calls, true)))
        .collect();
    for t in rest {
        for (k, n) in t.join().unwrap() {
            *out.entry(k).or_default() += n;
        }
    }
    let end = now_ns();
    stop.store(true, Ordering::Relaxed);
    assert!(watcher.join().unwrap() > 0);
    assert_eq!(
        counters(&mut c),
        (KEYS.len() as u64, (g1 * calls + KEYS.len()) as u64, 0)
    );

    // Let-out since the first version-2 call, less what the refunds gave back: within B's
    // bound (the server decided every call between `start` and `end`).
    let elapsed = (end - start) as f64 / 1e9;
    let bound = B.1 + B.0 * elapsed + 1.0;
    let total: f64 = KEYS.iter().map(|k| out[k] as f64).sum::<f64>() - credited;
    for key in KEYS {
        let got = out[key] as f64;
        assert!(
            got <= bound + credited,
            "{key}: let out {got} > {bound} in {elapsed} s"
        );
        assert_eq!(stored(&mut c, key), (B.0, B.1, 2));
    }
    assert!(
        total <= KEYS.len() as f64 * bound,
        "let out {total} > {} in {elapsed} s",
        KEYS.len() as f64 * bound
    );
    assert!(!s.log().contains("panic"), "{}", s.log());
}

#[test]
fn a_denied_upgrading_call_still_replaces_the_limit_and_replicates() {
    let master = Server::start(&[]);
    let replica = Server::start(&[]);
    replicate(&replica, &master);
    let mut c = master.conn();
    // Version 1 empties the bucket.
    assert_eq!(take_v(&mut c, "k", (0.001, 10.0), 10, 1).0, 10);
    // Version 2, denied (no token), still replaces the limit.
    let (got, _) = take_v(&mut c, "k", (0.002, 5.0), 1, 2);
    assert_eq!(got, 0);
    assert_eq!(stored(&mut c, "k"), (0.002, 5.0, 2));
    assert_eq!(counters(&mut c), (1, 0, 0));
    // A version-1 call now is decided under version 2's limit, and changes nothing.
    let d = digest(&mut c, "k");
    assert_eq!(take_v(&mut c, "k", (0.001, 10.0), 1, 1).0, 0);
    assert_eq!(digest(&mut c, "k"), d);
    assert_eq!(counters(&mut c), (1, 1, 0));
    // The replica holds the same bytes.
    wait_synced(&master, &replica);
    let mut r = replica.conn();
    assert_eq!(digest(&mut r, "k"), d);
    assert_eq!(stored(&mut r, "k"), (0.002, 5.0, 2));

    // The same with RL.LEASE, RL.RESERVE and RL.MTAKE.
    let _: Vec<i64> = query(
        &mut c,
        &[
            "RL.LEASE", "l", "0.001", "10", "10", "60000", "VERSION", "1",
        ],
    );
    let v: Vec<i64> = query(
        &mut c,
        &["RL.LEASE", "l", "0.002", "5", "1", "60000", "VERSION", "2"],
    );
    assert_eq!(v[0], 0);
    assert_eq!(stored(&mut c, "l"), (0.002, 5.0, 2));
    let _: Vec<Value> = query(
        &mut c,
        &["RL.RESERVE", "r", "0.001", "10", "10", "0", "VERSION", "1"],
    );
    let v: Vec<Value> = query(
        &mut c,
        &["RL.RESERVE", "r", "0.002", "5", "1", "0", "VERSION", "2"],
    );
    assert_eq!(v[0], Value::Int(0));
    assert_eq!(stored(&mut c, "r"), (0.002, 5.0, 2));
    let _: Vec<Value> = query(
        &mut c,
        &[
            "RL.MTAKE", "10", "m1", "0.001", "10", "m2", "0.001", "10", "VERSION", "1",
        ],
    );
    let v: Vec<Value> = query(
        &mut c,
        &[
            "RL.MTAKE", "1", "m1", "0.002", "5", "m2", "1", "20", "VERSION", "2",
        ],
    );
    assert_eq!(v[0], Value::Int(0));
    assert_eq!(stored(&mut c, "m1"), (0.002, 5.0, 2));
    assert_eq!(stored(&mut c, "m2"), (1.0, 20.0, 2));
    assert_eq!(counters(&mut c), (5, 1, 0));
    wait_synced(&master, &replica);
    for key in ["k", "l", "r", "m1", "m2"] {
        assert_eq!(digest(&mut r, key), digest(&mut c, key), "{key}");
        let pm: i64 = redis::cmd("PEXPIRETIME").arg(key).query(&mut c).unwrap();
        let pr: i64 = redis::cmd("PEXPIRETIME").arg(key).query(&mut r).unwrap();
        assert_eq!(pm, pr, "{key}");
    }
    assert_eq!(dataset_digest(&mut r), dataset_digest(&mut c));
}

/// A stale call behaves as if it had passed the stored limit: `n` above the stored cap is
/// the error that limit gives (nothing changes), and the key's expiry follows the stored
/// limit, so a caller with a smaller cap never makes it expire early.
#[test]
fn stale_calls_are_decided_under_the_stored_limit() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    // Version 2 (slow, large) is stored; half used.
    assert_eq!(take_v(&mut c, "k", (1.0, 1000.0), 500, 2).0, 500);
    let expiry: i64 = redis::cmd("PEXPIRETIME").arg("k").query(&mut c).unwrap();
    // Version 1 with a small cap: decided under version 2's limit (it had 500 tokens).
    let (got, remaining) = take_v(&mut c, "k", (100.0, 10.0), 5, 1);
    assert_eq!(got, 5);
    assert!(remaining > 400.0, "{remaining}");
    assert_eq!(stored(&mut c, "k"), (1.0, 1000.0, 2));
    let after: i64 = redis::cmd("PEXPIRETIME").arg("k").query(&mut c).unwrap();
    // Some 500 tokens to refill at 1/s: the key stays for minutes (under the old caller's
    // limit, 10 tokens at 100/s, it would go within 0.1 s).
    let now_ms = (now_ns() / 1_000_000) as i64;
    assert!(after - now_ms > 100_000, "{expiry} -> {after} at {now_ms}");

    // A stored cap smaller than the stale call's n: the stored limit's error.
    // Slow limits: the buckets must not refill (or expire) while the calls below run.
    assert_eq!(take_v(&mut c, "small", (0.001, 5.0), 1, 3).0, 1);
    let before = digest(&mut c, "small");
    let counted = counters(&mut c);
    for args in [
        &["RL.TAKE", "small", "1", "100", "6", "VERSION", "2"][..],
        &[
            "RL.RESERVE",
            "small",
            "1",
            "100",
            "6",
            "1000",
            "VERSION",
            "2",
        ],
        &[
            "RL.LEASE", "small", "1", "100", "20", "1000", "MIN", "6", "VERSION", "2",
        ],
        &["RL.MTAKE", "6", "small", "1", "100", "VERSION", "2"],
    ] {
        let err = redis::cmd(args[0])
            .arg(&args[1..])
            .query::<Value>(&mut c)
            .unwrap_err();
        let want = if args[0] == "RL.LEASE" {
            "MIN must not exceed cap"
        } else {
            "n must not exceed cap"
        };
        assert_eq!(err.detail(), Some(want), "{args:?}: {err}");
        assert_eq!(digest(&mut c, "small"), before, "{args:?} changed the key");
    }
    // Errors are not decisions: nothing counted.
    assert_eq!(counters(&mut c), counted);
    // A stale lease (n above the stored cap, MIN within it) takes what the stored limit has.
    let v: Vec<i64> = query(
        &mut c,
        &[
            "RL.LEASE", "small", "1", "100", "20", "60000", "VERSION", "2",
        ],
    );
    assert_eq!(v[0], 4);
    assert_eq!(stored(&mut c, "small"), (0.001, 5.0, 3));

    // One VERSION for every bucket of RL.MTAKE, each compared with its own.
    assert_eq!(take_v(&mut c, "old", (0.01, 10.0), 1, 1).0, 1);
    assert_eq!(take_v(&mut c, "new", (0.01, 10.0), 1, 3).0, 1);
    let before = counters(&mut c);
    let v: Vec<Value> = query(
        &mut c,
        &[
            "RL.MTAKE", "1", "old", "2", "20", "new", "2", "20", "VERSION", "2",
        ],
    );
    assert_eq!(v[0], Value::Int(1));
    assert_eq!(stored(&mut c, "old"), (2.0, 20.0, 2));
    assert_eq!(stored(&mut c, "new"), (0.01, 10.0, 3));
    let after = counters(&mut c);
    assert_eq!((after.0 - before.0, after.1 - before.1), (1, 1));
}

#[test]
fn equal_versions_with_other_limits_are_conflicts_and_resetstat_clears_the_counters() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    take_v(&mut c, "k", (1.0, 10.0), 1, 4);
    take_v(&mut c, "k", (1.0, 10.0), 1, 4);
    assert_eq!(counters(&mut c), (0, 0, 0));
    // Same version, another limit: the call's limit applies (as without versions).
    take_v(&mut c, "k", (2.0, 8.0), 1, 4);
    assert_eq!(stored(&mut c, "k"), (2.0, 8.0, 4));
    assert_eq!(counters(&mut c), (0, 0, 1));
    take_v(&mut c, "k", (2.0, 8.0), 1, 5);
    take_v(&mut c, "k", (2.0, 8.0), 1, 1);
    assert_eq!(counters(&mut c), (1, 1, 1));
    let _: () = query(&mut c, &["CONFIG", "RESETSTAT"]);
    assert_eq!(counters(&mut c), (0, 0, 0));

    // Without VERSION on a bucket never versioned: as before, and version 0. (Slow limits
    // from here on: at 1/s "v" was full, and gone, a second later.)
    assert_eq!(take(&mut c, "plain", 0.01, 10.0, 3), 3);
    assert_eq!(stored(&mut c, "plain"), (0.01, 10.0, 0));
    // An unversioned call on a versioned bucket is an older version: stale.
    take_v(&mut c, "v", (0.01, 10.0), 1, 1);
    assert_eq!(take(&mut c, "v", 5.0, 50.0, 1), 1);
    assert_eq!(stored(&mut c, "v"), (0.01, 10.0, 1));
    assert_eq!(counters(&mut c), (0, 1, 0));
    // RL.REFUND and RL.RETURN keep the version.
    let _: f64 = query(&mut c, &["RL.REFUND", "v", "1"]);
    assert_eq!(peek_version(&mut c, "v"), 1);
    let l: Vec<i64> = query(
        &mut c,
        &["RL.LEASE", "v", "0.01", "10", "3", "60000", "VERSION", "1"],
    );
    let _: i64 = query(&mut c, &["RL.RETURN", "v", &l[1].to_string(), "1"]);
    assert_eq!(peek_version(&mut c, "v"), 1);
    // The largest version is taken.
    take_v(&mut c, "max", (1.0, 10.0), 1, 9_007_199_254_740_991);
    assert_eq!(peek_version(&mut c, "max"), 9_007_199_254_740_991);
}

#[test]
fn a_bad_version_is_an_error_and_changes_nothing() {
    let s = Server::start(&[]);
    let mut c = s.internal_conn();
    take_v(&mut c, "k", (1.0, 10.0), 1, 2);
    let _: Vec<i64> = query(
        &mut c,
        &["RL.LEASE", "k", "1", "10", "1", "60000", "VERSION", "2"],
    );
    let before = dataset_digest(&mut c);
    let counted = counters(&mut c);
    let msg = "VERSION must be an integer from 0 to 9007199254740991";
    for bad in [
        "-1",
        "9007199254740992",
        "18446744073709551616",
        "1.5",
        "1e3",
        "abc",
        "",
        " 1",
    ] {
        for args in [
            vec!["RL.TAKE", "k", "1", "10", "1", "VERSION", bad],
            vec!["RL.TAKE", "new", "1", "10", "VERSION", bad],
            vec!["RL.RESERVE", "k", "1", "10", "1", "0", "VERSION", bad],
            vec!["RL.LEASE", "k", "1", "10", "1", "1000", "VERSION", bad],
            vec![
                "RL.MTAKE", "1", "k", "1", "10", "new", "1", "10", "VERSION", bad,
            ],
            vec!["RL.SETSTATE", "k", "0", "1", "10", "VERSION", bad],
            vec![
                "RL.SETSTATE",
                "k",
                "0",
                "1",
                "10",
                "VERSION",
                bad,
                "LASTID",
                "9",
            ],
        ] {
            let err = redis::cmd(args[0])
                .arg(&args[1..])
                .query::<Value>(&mut c)
                .unwrap_err();
            assert_eq!(err.code(), Some("ERR"), "{args:?}: {err}");
            assert_eq!(err.detail(), Some(msg), "{args:?}: {err}");
        }
    }
    for args in [
        vec!["RL.TAKE", "k", "1", "10", "VERSION", "1", "VERSION", "1"],
        vec![
            "RL.RESERVE",
            "k",
            "1",
            "10",
            "1",
            "0",
            "VERSION",
            "3",
            "VERSION",
            "3",
        ],
        vec![
            "RL.LEASE", "k", "1", "10", "1", "1000", "VERSION", "3", "VERSION", "3",
        ],
        vec![
            "RL.MTAKE", "1", "k", "1", "10", "VERSION", "3", "VERSION", "3",
        ],
        vec![
            "RL.SETSTATE",
            "k",
            "0",
            "1",
            "10",
            "VERSION",
            "3",
            "VERSION",
            "3",
        ],
    ] {
        let err = redis::cmd(args[0])
            .arg(&args[1..])
            .query::<Value>(&mut c)
            .unwrap_err();
        assert_eq!(
            err.detail(),
            Some("option 'VERSION' given twice"),
            "{args:?}: {err}"
        );
    }
    // VERSION without its value.
    for args in [
        vec!["RL.TAKE", "k", "1", "10", "1", "VERSION"],
        vec!["RL.LEASE", "k", "1", "10", "1", "1000", "VERSION"],
        vec!["RL.RESERVE", "k", "1", "10", "1", "0", "VERSION"],
        vec!["RL.MTAKE", "1", "k", "1", "10", "VERSION"],
    ] {
        assert!(
            redis::cmd(args[0])
                .arg(&args[1..])
                .query::<Value>(&mut c)
                .is_err(),
            "{args:?}"
        );
    }
    assert_eq!(dataset_digest(&mut c), before);
    assert_eq!(counters(&mut c), counted);
    let exists: i64 = query(&mut c, &["EXISTS", "new"]);
    assert_eq!(exists, 0);
}

/// Keys with versions in every form: compact-sized, after a limit change (a hold), with
/// leases. Returns the keys.
fn versioned_keys(c: &mut Connection) -> Vec<&'static str> {
    // Slow limits (hours to full): the keys must outlive replication, reloads and restarts
    // on a busy machine; expiry is not what is checked.
    take_v(c, "plain", (0.01, 100.0), 3, 0);
    take_v(c, "v", (0.01, 100.0), 3, 7);
    take_v(c, "changed", (0.01, 100.0), 30, 1);
    take_v(c, "changed", (0.005, 50.0), 1, 2);
    let _: Vec<i64> = query(
        c,
        &[
            "RL.LEASE",
            "leased",
            "0.01",
            "100",
            "20",
            "600000",
            "VERSION",
            "9007199254740991",
        ],
    );
    let _: Vec<i64> = query(
        c,
        &[
            "RL.LEASE", "leased", "0.01", "100", "5", "600000", "VERSION", "1",
        ],
    );
    let _: Vec<i64> = query(
        c,
        &[
            "RL.LEASE", "leased2", "0.01", "100", "5", "600000", "VERSION", "3",
        ],
    );
    let _: Vec<i64> = query(
        c,
        &[
            "RL.LEASE", "leased2", "0.02", "100", "5", "600000", "VERSION", "4",
        ],
    );
    // Stale grants, under the stored limits: their effects carry those, not the callers'.
    assert_eq!(take_v(c, "changed", (3.0, 300.0), 1, 1).0, 1);
    let v: Vec<i64> = query(
        c,
        &[
            "RL.LEASE", "leased2", "0.5", "7", "2", "600000", "VERSION", "3",
        ],
    );
    assert_eq!(v[0], 2);
    let v: Vec<Value> = query(c, &["RL.RESERVE", "v", "9", "90", "1", "0", "VERSION", "6"]);
    assert_eq!(v[0], Value::Int(1));
    let v: Vec<Value> = query(
        c,
        &[
            "RL.MTAKE", "1", "v", "9", "90", "changed", "9", "90", "VERSION", "1",
        ],
    );
    assert_eq!(v[0], Value::Int(1));
    vec!["plain", "v", "changed", "leased", "leased2"]
}

fn snapshot(c: &mut Connection, keys: &[&str]) -> Vec<(String, (f64, f64, u64), i64)> {
    keys.iter()
        .map(|k| {
            let at: i64 = redis::cmd("PEXPIRETIME").arg(*k).query(c).unwrap();
            (digest(c, k), stored(c, k), at)
        })
        .collect()
}

#[test]
fn reload_restore_migrate_replica_and_aof_carry_the_version() {
    let mut s = Server::start(&["--appendonly", "yes", "--aof-use-rdb-preamble", "no"]);
    let replica = Server::start(&[]);
    replicate(&replica, &s);
    let mut c = s.conn();
    let keys = versioned_keys(&mut c);
    let want = snapshot(&mut c, &keys);
    let versions: Vec<u64> = want.iter().map(|w| w.1 .2).collect();
    assert_eq!(versions, [0, 7, 2, 9_007_199_254_740_991, 4]);

    // A replica (effects).
    wait_synced(&s, &replica);
    let mut r = replica.conn();
    assert_eq!(snapshot(&mut r, &keys), want, "replica");
    for k in &keys {
        assert_eq!(
            dump(&mut r, k),
            dump(&mut c, k),
            "DUMP of {k} on the replica"
        );
    }
    // A full sync to a new replica (RDB).
    let fresh = Server::start(&[]);
    replicate(&fresh, &s);
    wait_synced(&s, &fresh);
    assert_eq!(snapshot(&mut fresh.conn(), &keys), want, "full sync");
    drop(fresh);

    // DEBUG RELOAD.
    let _: () = query(&mut c, &["DEBUG", "RELOAD"]);
    assert_eq!(snapshot(&mut c, &keys), want, "DEBUG RELOAD");

    // DUMP / RESTORE under other names.
    for (k, w) in keys.iter().zip(&want) {
        let payload = dump(&mut c, k);
        let _: () = redis::cmd("RESTORE")
            .arg(format!("copy:{k}"))
            .arg(w.2)
            .arg(payload)
            .arg("ABSTTL")
            .query(&mut c)
            .unwrap();
        let got = snapshot(&mut c, &[&format!("copy:{k}")]);
        assert_eq!(&got[0], w, "RESTORE {k}");
        let _: () = query(&mut c, &["DEL", &format!("copy:{k}")]);
    }

    // MIGRATE.
    let other = Server::start(&[]);
    let mut o = other.conn();
    for k in &keys {
        let _: () = redis::cmd("MIGRATE")
            .arg("127.0.0.1")
            .arg(other.port)
            .arg(*k)
            .arg(0)
            .arg(5000)
            .arg("COPY")
            .query(&mut c)
            .unwrap();
    }
    // (MIGRATE sends a relative TTL: the expiry may move by a millisecond.)
    let without_expiry = |v: Vec<(String, (f64, f64, u64), i64)>| -> Vec<_> {
        v.into_iter().map(|(d, s, _)| (d, s)).collect()
    };
    assert_eq!(
        without_expiry(snapshot(&mut o, &keys)),
        without_expiry(want.clone()),
        "MIGRATE"
    );

    // AOF: the effects replayed, then a rewrite (the module's own commands) replayed.
    drop(c);
    drop(r);
    drop(replica);
    s.restart();
    let mut c = s.conn();
    assert_eq!(snapshot(&mut c, &keys), want, "AOF replay");
    let mut c = s.rewrite_aof_and_restart(c);
    assert_eq!(snapshot(&mut c, &keys), want, "AOF rewrite + restart");
    assert!(!s.exited());
}

/// One element of a module value's RDB payload.
#[derive(Debug, Clone, PartialEq)]
enum Item {
    Uint(u64),
    Double([u8; 8]),
}

/// The RDB length encoding (what `RedisModule_SaveUnsigned` writes after its opcode).
fn rdb_len(out: &mut Vec<u8>, n: u64) {
    if n < 1 << 6 {
        out.push(n as u8);
    } else if n < 1 << 14 {
        out.push(0x40 | (n >> 8) as u8);
        out.push(n as u8);
    } else if n <= u64::from(u32::MAX) {
        out.push(0x80);
        out.extend_from_slice(&(n as u32).to_be_bytes());
    } else {
        out.push(0x81);
        out.extend_from_slice(&n.to_be_bytes());
    }
}

fn read_len(b: &[u8], at: &mut usize) -> u64 {
    let first = b[*at];
    *at += 1;
    match first >> 6 {
        0 => u64::from(first & 0x3f),
        1 => {
            let n = (u64::from(first & 0x3f) << 8) | u64::from(b[*at]);
            *at += 1;
            n
        }
        _ if first == 0x80 => {
            let n = u32::from_be_bytes(b[*at..*at + 4].try_into().unwrap());
            *at += 4;
            u64::from(n)
        }
        _ if first == 0x81 => {
            let n = u64::from_be_bytes(b[*at..*at + 8].try_into().unwrap());
            *at += 8;
            n
        }
        _ => panic!("not a length: {first:#x}"),
    }
}

/// A DUMP body of a module value: (module id, items).
fn parse_body(body: &[u8]) -> (u64, Vec<Item>) {
    assert_eq!(body[0], 7, "RDB_TYPE_MODULE_2");
    let mut at = 1;
    let id = read_len(body, &mut at);
    let mut items = Vec::new();
    loop {
        match read_len(body, &mut at) {
            0 => break,
            2 => items.push(Item::Uint(read_len(body, &mut at))),
            4 => {
                items.push(Item::Double(body[at..at + 8].try_into().unwrap()));
                at += 8;
            }
            op => panic!("opcode {op}"),
        }
    }
    assert_eq!(at, body.len());
    (id, items)
}

fn build_body(id: u64, items: &[Item]) -> Vec<u8> {
    let mut out = vec![7];
    rdb_len(&mut out, id);
    for item in items {
        match item {
            Item::Uint(n) => {
                out.push(2);
                rdb_len(&mut out, *n);
            }
            Item::Double(d) => {
                out.push(4);
                out.extend_from_slice(d);
            }
        }
    }
    out.push(0);
    out
}

/// Payloads in the encodings written before versions (2: with hold and span; 1: without)
/// still load, as version 0, with everything else as it was.
#[test]
fn old_encodings_load_as_version_0() {
    let mut s = Server::start(&[]);
    let mut c = s.conn();
    // Slow limits: RESTORE ... ABSTTL of an expiry already past would create nothing.
    take_v(&mut c, "plain", (0.01, 100.0), 3, 0);
    take(&mut c, "changed", 0.01, 100.0, 30);
    take(&mut c, "changed", 0.005, 50.0, 1);
    let _: Vec<i64> = query(
        &mut c,
        &["RL.LEASE", "leased", "0.01", "100", "20", "600000"],
    );
    take_v(&mut c, "versioned", (0.01, 100.0), 3, 5);
    for key in ["plain", "changed", "leased", "versioned"] {
        let payload = dump(&mut c, key);
        let (id, items) = parse_body(dump_body(&payload));
        // Encoding 4: full_at rate cap hold span version pin table ...; the id's low 10
        // bits are the encoding version.
        assert_eq!(id & 1023, 4, "{key}");
        assert_eq!(items[6], Item::Uint(0), "no pin");
        let version = match items[5] {
            Item::Uint(v) => v,
            _ => panic!("{items:?}"),
        };
        assert_eq!(version, peek_version(&mut c, key));
        let want = snapshot(&mut c, &[key]).remove(0);
        let mut v3 = items.clone();
        v3.remove(6);
        let mut v2 = v3.clone();
        v2.remove(5);
        let mut v1 = v2.clone();
        let hold_span = v1.drain(3..5).collect::<Vec<_>>();
        for (encver, body) in [
            (3, build_body((id & !1023) | 3, &v3)),
            (2, build_body((id & !1023) | 2, &v2)),
            (1, build_body((id & !1023) | 1, &v1)),
        ] {
            // Version 1 has no hold: only for keys without one.
            if encver == 1 && hold_span != [Item::Uint(0), Item::Uint(0)] {
                continue;
            }
            let name = format!("old{encver}:{key}");
            let _: () = redis::cmd("RESTORE")
                .arg(&name)
                .arg(want.2)
                .arg(reseal(&payload, &body))
                .arg("ABSTTL")
                .query(&mut c)
                .unwrap_or_else(|e| panic!("encoding {encver} of {key}: {e}"));
            let got = snapshot(&mut c, &[&name]).remove(0);
            if encver < 3 {
                assert_eq!(got.1 .2, 0, "encoding {encver} of {key} loads as version 0");
            }
            assert_eq!((got.1 .0, got.1 .1), (want.1 .0, want.1 .1));
            if version == 0 || encver == 3 {
                // The very same bucket.
                assert_eq!(got, want, "encoding {encver} of {key}");
            }
            // And DUMPed again, in the new encoding, with version 0.
            let (_, again) = parse_body(dump_body(&dump(&mut c, &name)));
            if encver < 3 {
                assert_eq!(again[5], Item::Uint(0));
            }
            assert_eq!(again[6], Item::Uint(0));
        }
    }
    // Encoding 4 with a version past 2^53 - 1 is refused, and the server lives.
    let payload = dump(&mut c, "versioned");
    let (id, mut items) = parse_body(dump_body(&payload));
    items[5] = Item::Uint(1 << 53);
    let err = redis::cmd("RESTORE")
        .arg("bad")
        .arg(0)
        .arg(reseal(&payload, &build_body(id, &items)))
        .query::<Value>(&mut c)
        .unwrap_err();
    assert!(err.to_string().contains("Bad data format"), "{err}");
    items[5] = Item::Uint((1 << 53) - 1);
    let _: () = redis::cmd("RESTORE")
        .arg("good")
        .arg(0)
        .arg(reseal(&payload, &build_body(id, &items)))
        .query(&mut c)
        .unwrap();
    assert_eq!(peek_version(&mut c, "good"), (1 << 53) - 1);
    // An encoding from the future (5) is refused.
    let err = redis::cmd("RESTORE")
        .arg("future")
        .arg(0)
        .arg(reseal(&payload, &build_body((id & !1023) | 5, &items)))
        .query::<Value>(&mut c)
        .unwrap_err();
    assert!(err.to_string().contains("Bad data format"), "{err}");
    assert!(!s.exited());
}

/// `RL.PEEK key` → (rate, cap, version), `None` for no key.
fn peek_limit(c: &mut Connection, key: &str) -> Option<(f64, f64, u64)> {
    let v: Value = redis::cmd("RL.PEEK").arg(key).query(c).unwrap();
    let Value::Array(items) = v else {
        return None;
    };
    let field = |name: &str| -> &Value {
        let at = items
            .iter()
            .position(|x| redis::from_redis_value::<String>(x).is_ok_and(|s| s == name))
            .unwrap_or_else(|| panic!("PEEK has no {name}"));
        &items[at + 1]
    };
    Some((
        redis::from_redis_value(field("rate")).unwrap(),
        redis::from_redis_value(field("cap")).unwrap(),
        redis::from_redis_value(field("version")).unwrap(),
    ))
}

fn call<T: AsRef<str>>(c: &mut Connection, args: &[T]) -> redis::RedisResult<Value> {
    let mut cmd = redis::cmd(args[0].as_ref());
    for a in &args[1..] {
        cmd.arg(a.as_ref());
    }
    cmd.query(c)
}

// ---------------------------------------------------------------------------------------
// A version lives with its key (by design: idle state costs nothing; docs/commands.md,
// "Changing a limit"): once a version-2 bucket is full again and its key goes, a
// caller still on version 1 creates a fresh bucket under its own, older limit. The bound
// docs/commands.md states instead: that caller gets at most one bucket of its old cap, once, and
// the next version-2 call puts version 2's limit back, with no more than its cap.
// ---------------------------------------------------------------------------------------

/// After the key went, returns what a version-1 caller then got, and checks the limit a
/// version-2 call restores.
fn stale_caller_after_the_key_went(c: &mut Connection, key: &str, v2: (&str, &str)) -> f64 {
    // A version-1 caller asks for its own (old, 100x larger) cap at once: a fresh bucket.
    // (At 0.01/s: not a token refills before the next call, however slow the machine.)
    let got: i64 = query(c, &["RL.TAKE", key, "0.01", "1000", "1000", "VERSION", "1"]);
    assert_eq!(
        got, 1000,
        "the documented case: a fresh bucket under version 1"
    );
    // The next version-2 call replaces the limit again; what the bucket holds is clamped to
    // version 2's cap (here: empty, so it is denied).
    let again: i64 = query(c, &["RL.TAKE", key, v2.0, v2.1, "1", "VERSION", "2"]);
    assert_eq!(
        again, 0,
        "version 2 found tokens the version-1 caller had taken"
    );
    assert_eq!(
        peek_limit(c, key),
        Some((v2.0.parse().unwrap(), v2.1.parse().unwrap(), 2))
    );
    // And version 1 is stale again: its n above the stored cap is refused.
    let r = call(c, &["RL.TAKE", key, "0.01", "1000", "1000", "VERSION", "1"]);
    assert!(r.is_err(), "a stale call got {r:?}");
    got as f64
}

#[test]
fn a_stale_caller_after_the_key_went_gets_one_old_bucket_then_is_stale_again() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    // Version 2: 10 tokens at 1 per 1000 s. Then the key goes (as when it is full again: a
    // refund to full deletes it, an idle one expires).
    let got: i64 = query(
        &mut c,
        &["RL.TAKE", "k", "0.001", "10", "1", "VERSION", "2"],
    );
    assert_eq!(got, 1);
    let _: i64 = query(&mut c, &["DEL", "k"]);
    stale_caller_after_the_key_went(&mut c, "k", ("0.001", "10"));
}

fn exists(c: &mut Connection, key: &str) -> bool {
    query::<i64>(c, &["EXISTS", key]) == 1
}

/// The same through expiry, with no command deleting anything.
#[test]
fn a_stale_caller_after_the_newer_bucket_expired_gets_one_old_bucket_then_is_stale_again() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    // Version 2: 2 tokens at 100/s (full 10 ms after a take), created by a version-2
    // caller (no earlier limit, so no hold keeps the key).
    let got: i64 = query(&mut c, &["RL.TAKE", "k", "100", "2", "1", "VERSION", "2"]);
    assert_eq!(got, 1);
    wait_until(30, "the version-2 bucket to fill and expire", || {
        !exists(&mut c, "k")
    });
    // At 100/s the version-2 call a moment later may find a token refilled: use a frozen
    // version-2 limit for the rest (the replacement is what is checked).
    stale_caller_after_the_key_went(&mut c, "k", ("0.001", "2"));
}

/// Which of `keys` exist just before and just after `args`, and its reply: `EXISTS`, the
/// call and `EXISTS` again in one `MULTI`/`EXEC`, where the server's time stands still, so
/// no key can expire in between (as it could between two round trips on a busy machine: a
/// bucket at 330000/s is full, and its key gone, a millisecond after a grant). A call that
/// fails changes nothing: then the keys are looked at afterwards.
fn exists_around_call(
    c: &mut Connection,
    keys: &[&str],
    args: &[String],
) -> (Vec<bool>, Vec<bool>, redis::RedisResult<Value>) {
    let mut pipe = redis::pipe();
    pipe.atomic();
    for key in keys {
        pipe.cmd("EXISTS").arg(*key);
    }
    let mut cmd = redis::cmd(&args[0]);
    cmd.arg(&args[1..]);
    pipe.add_command(cmd);
    for key in keys {
        pipe.cmd("EXISTS").arg(*key);
    }
    let found = |v: &[Value]| -> Vec<bool> {
        v.iter()
            .map(|v| redis::from_redis_value::<i64>(v).unwrap() == 1)
            .collect()
    };
    match pipe.query::<Vec<Value>>(c) {
        Ok(replies) => {
            let n = keys.len();
            let (before, after) = (found(&replies[..n]), found(&replies[n + 1..]));
            (before, after, Ok(replies[n].clone()))
        }
        Err(e) => {
            let now: Vec<bool> = keys.iter().map(|key| exists(c, key)).collect();
            (now.clone(), now, Err(e))
        }
    }
}

// ---------------------------------------------------------------------------------------
// Never minted: a ledger of what went out, per key lifetime.
// ---------------------------------------------------------------------------------------

/// Limits at the extremes: caps from 1 to 1e15, rates from 1e-9 to 3.2e5 (every fill time
/// within the 100-year bound). `(rate, cap)` as sent.
const LIMITS: &[(&str, &str)] = &[
    ("1e-9", "1"),
    ("0.000001", "1000"),
    ("0.001", "5"),
    ("0.001", "1000000"),
    ("320000", "1e15"),
    ("330000", "999999999999999"),
    ("0.5", "7.5"),
    ("0.0033333333333", "3"),
];

const VERSIONS: &[u64] = &[0, 1, 2, 3, 9_007_199_254_740_990, 9_007_199_254_740_991];

fn rl_max_version() -> u64 {
    VERSIONS[VERSIONS.len() - 1]
}

/// One key's lifetime (from the call that created it until it went): what it started
/// with, what went out net of what came back, and the most refill it could have had.
#[derive(Default, Clone)]
struct Ledger {
    start: f64,
    out: f64,
    refill: f64,
    /// The stored rate and when it was last seen.
    rate: f64,
    seen: Option<std::time::Instant>,
}

impl Ledger {
    /// The key's refill since it was last looked at, at most its stored rate (a limit is
    /// replaced only by a call, which is followed by a look).
    fn advance(&mut self, now: std::time::Instant) {
        if let Some(seen) = self.seen {
            self.refill += self.rate * now.duration_since(seen).as_secs_f64();
        }
        self.seen = Some(now);
    }

    fn bound(&self) -> f64 {
        // One float step of slack at the largest cap (0.125 tokens at 1e15): the ledger
        // itself adds in doubles.
        (self.start + self.refill) * (1.0 + 1e-15) + 1e-6
    }
}

/// A long seeded run of every command with random limits and versions (older, newer and
/// equal ones, leases returned across version changes, reservations in debt across
/// version changes, refunds after a change, several buckets at once with `RL.MTAKE`): for
/// every key lifetime, what went out minus what came back never exceeds what the bucket
/// started with plus the refill of the limits it held meanwhile.
#[test]
fn version_and_limit_flapping_never_mints() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let keys = ["{m}a", "{m}b", "{m}c"];
    let mut ledgers: Vec<Option<Ledger>> = vec![None; keys.len()];
    // Each key's leases: (id, tokens).
    let mut leases: Vec<Vec<(u64, u64)>> = vec![Vec::new(); keys.len()];
    let mut grants = 0;
    let mut current = 1u64;
    for step in 0..2500 {
        let k = rng.below(keys.len() as u64) as usize;
        let (rate, cap) = *rng.pick(LIMITS);
        // Versions mostly rise one at a time around a current one (older, equal and newer
        // callers at once); near the end they jump to the top of the range.
        if rng.chance(8) {
            current += 1;
        }
        if step == 2200 {
            current = VERSIONS[VERSIONS.len() - 2];
        }
        let version = match rng.below(6) {
            0 => 0,
            1 => current.saturating_sub(1),
            2 => (current + 1).min(rl_max_version()),
            _ => current,
        };
        let capf: f64 = cap.parse().unwrap();
        let n = match rng.below(4) {
            0 => 1,
            1 => 3,
            2 => (capf as u64).max(1),
            _ => 1 + rng.below(capf.min(1e6) as u64),
        };
        let mut args: Vec<String> = Vec::new();
        let mut opts: Vec<String> = Vec::new();
        if rng.chance(85) {
            opts.extend(["VERSION".into(), version.to_string()]);
        }
        let init = if rng.chance(10) {
            let t = rng.below(capf.min(1e6) as u64 + 1);
            opts.extend(["INIT".into(), t.to_string()]);
            Some(t as f64)
        } else {
            None
        };
        // The keys this call may create, and what each would start with.
        let mut touched: Vec<(usize, f64)> = Vec::new();
        let mut returned_at_most = 0.0;
        let op = rng.below(100);
        let kind;
        if op < 30 {
            kind = "take";
            args.extend([
                "RL.TAKE".into(),
                keys[k].into(),
                rate.into(),
                cap.into(),
                n.to_string(),
            ]);
            touched.push((k, capf));
        } else if op < 50 {
            kind = "lease";
            args.extend([
                "RL.LEASE".into(),
                keys[k].into(),
                rate.into(),
                cap.into(),
                n.to_string(),
                "1000000".into(),
            ]);
            if let Some(&(id, tokens)) = leases[k].last() {
                if rng.chance(50) {
                    let unused = rng.below(n + 2);
                    args.extend(["RETURN".into(), id.to_string(), unused.to_string()]);
                    // What the return part credits is not in the reply: at most this (so
                    // the ledger may undercount what went out, never overcount it).
                    returned_at_most = unused.min(tokens) as f64;
                    leases[k].pop();
                }
            }
            touched.push((k, capf));
        } else if op < 60 {
            kind = "return";
            let id = leases[k].pop().map_or(1, |l| l.0);
            args.extend([
                "RL.RETURN".into(),
                keys[k].into(),
                id.to_string(),
                rng.below(2 * n + 1).to_string(),
            ]);
            opts.clear();
        } else if op < 72 {
            kind = "reserve";
            args.extend([
                "RL.RESERVE".into(),
                keys[k].into(),
                rate.into(),
                cap.into(),
                n.to_string(),
                rng.pick(&["0", "1000", "86400000"]).to_string(),
            ]);
            touched.push((k, capf));
        } else if op < 80 {
            kind = "refund";
            args.extend(["RL.REFUND".into(), keys[k].into(), n.to_string()]);
            opts.clear();
        } else {
            kind = "mtake";
            args.extend(["RL.MTAKE".into(), String::new()]);
            let mut fit = u64::MAX;
            for (j, key) in keys.iter().enumerate() {
                if j == k || rng.chance(50) {
                    let (r, cp) = *rng.pick(LIMITS);
                    args.extend([key.to_string(), r.into(), cp.into()]);
                    let cpf: f64 = cp.parse().unwrap();
                    fit = fit.min(cpf as u64);
                    touched.push((j, cpf));
                }
            }
            args[1] = n.min(fit).max(1).to_string();
        }
        if let Some(t) = init {
            for x in touched.iter_mut() {
                x.1 = t;
            }
        }
        args.extend(opts);

        // Which keys exist before: a missing one starts a new lifetime (a full bucket
        // under the limit that creates it, or INIT).
        let before = std::time::Instant::now();
        let (existed, exist_after, reply) = exists_around_call(&mut c, &keys, &args);
        let absent: Vec<bool> = existed.iter().map(|e| !e).collect();
        let after = std::time::Instant::now();
        if std::env::var("TRACE").is_ok() {
            eprintln!("{step}: {args:?} absent {absent:?} -> {reply:?}");
        }
        for (j, l) in ledgers.iter_mut().enumerate() {
            if absent[j] {
                *l = None;
                leases[j].clear();
            }
            if let Some(l) = l {
                l.advance(after);
            }
        }
        let int = |v: &Value| -> i64 { redis::from_redis_value(v).unwrap() };
        let mut out: Vec<(usize, f64)> = Vec::new();
        match (&reply, kind) {
            (Err(_), _) => {}
            (Ok(v), "take") => out.push((k, int(v) as f64)),
            (Ok(Value::Array(a)), "lease") => {
                out.push((k, int(&a[0]) as f64 - returned_at_most));
                if int(&a[1]) != 0 {
                    leases[k].push((int(&a[1]) as u64, int(&a[0]) as u64));
                }
            }
            (Ok(v), "return") => out.push((k, -(int(v) as f64))),
            (Ok(Value::Array(a)), "reserve") => out.push((k, int(&a[0]) as f64)),
            (Ok(v), "refund") => out.push((k, -redis::from_redis_value::<f64>(v).unwrap())),
            (Ok(Value::Array(a)), "mtake") => {
                let g = int(&a[0]) as f64;
                for &(j, _) in &touched {
                    out.push((j, g));
                }
            }
            (Ok(v), _) => panic!("step {step}: {args:?} -> {v:?}"),
        }
        if reply.is_ok() && kind != "return" && kind != "refund" {
            grants += 1;
        }
        for &(j, _) in &touched {
            if absent[j] && exist_after[j] {
                let start = touched.iter().find(|x| x.0 == j).unwrap().1;
                ledgers[j] = Some(Ledger {
                    start,
                    seen: Some(before),
                    ..Ledger::default()
                });
            }
        }
        for (j, amount) in out {
            if let Some(l) = ledgers[j].as_mut() {
                l.out += amount;
            } else if amount > 0.0 {
                // Every grant stores its bucket, so a grant leaves a key.
                panic!("step {step}: {args:?} granted {amount} but left no key");
            }
        }
        // The reservation's promise: a grant with a wait uses refill still to come.
        if let (Ok(Value::Array(a)), "reserve") = (&reply, kind) {
            if let Some(l) = ledgers[k].as_mut() {
                let wait_s = int(&a[1]) as f64 / 1000.0;
                let max_rate = LIMITS
                    .iter()
                    .map(|(r, _)| r.parse::<f64>().unwrap())
                    .fold(0.0, f64::max);
                l.refill += wait_s * max_rate.min(l.rate.max(rate.parse().unwrap()));
            }
        }
        for (j, key) in keys.iter().enumerate() {
            let Some(l) = ledgers[j].as_mut() else {
                continue;
            };
            match peek_limit(&mut c, key) {
                Some((r, _, _)) => l.rate = l.rate.max(r),
                None => {
                    // Gone (refunded or returned to full): the lifetime ends here.
                    assert!(
                        l.out <= l.bound(),
                        "step {step}: {key} let out {} in a lifetime that started with {} \
                         and refilled at most {}",
                        l.out,
                        l.start,
                        l.refill
                    );
                    ledgers[j] = None;
                    continue;
                }
            }
            assert!(
                l.out <= l.bound(),
                "step {step}: {args:?} -> {reply:?}: {key} let out {} in a lifetime that \
                 started with {} and refilled at most {} (stored {:?})",
                l.out,
                l.start,
                l.refill,
                peek_limit(&mut c, key)
            );
        }
    }
    eprintln!(
        "grants {grants}, replaced {} stale {} conflicts {} errors {}",
        info_field(&mut c, "rl", "rl_limit_replaced"),
        info_field(&mut c, "rl", "rl_limit_stale"),
        info_field(&mut c, "rl", "rl_limit_conflicts"),
        info_field(&mut c, "rl", "rl_errors")
    );
    assert!(grants > 500, "the run granted too little to mean anything");
    // Every kind of decision happened.
    for f in ["rl_limit_replaced", "rl_limit_stale", "rl_limit_conflicts"] {
        assert!(info_field(&mut c, "rl", f) > 10, "{f}");
    }
}

// ---------------------------------------------------------------------------------------
// Copies: a storm of versions on a master; its replica, its AOF replayed (before and after
// a rewrite) and its RDB reloaded all hold the same bytes and expiries.
// ---------------------------------------------------------------------------------------

/// One random call of the storm (every command that writes a bucket, every option).
fn storm_call(rng: &mut Rng, keys: &[&str], current: u64, leases: &mut [Vec<u64>]) -> Vec<String> {
    let k = rng.below(keys.len() as u64) as usize;
    let (rate, cap) = *rng.pick(STORM_LIMITS);
    let version = match rng.below(5) {
        0 => 0,
        1 => current.saturating_sub(1),
        2 => current + 1,
        _ => current,
    };
    let n = rng.pick(&["1", "2", "5"]).to_string();
    let mut a: Vec<String> = Vec::new();
    let op = rng.below(100);
    if op < 25 {
        a.extend(["RL.TAKE", keys[k], rate, cap, &n].map(String::from));
    } else if op < 45 {
        a.extend(["RL.LEASE", keys[k], rate, cap, &n, "600000"].map(String::from));
        if let Some(id) = leases[k].pop() {
            a.extend(["RETURN".into(), id.to_string(), rng.below(3).to_string()]);
        }
        if rng.chance(20) {
            a.extend(["MIN".into(), "1".into()]);
        }
    } else if op < 55 {
        let id = leases[k].pop().unwrap_or(1);
        return [
            "RL.RETURN".into(),
            keys[k].into(),
            id.to_string(),
            rng.below(4).to_string(),
        ]
        .to_vec();
    } else if op < 70 {
        let wait = rng.pick(&["0", "5000", "86400000"]);
        a.extend(["RL.RESERVE", keys[k], rate, cap, &n, wait].map(String::from));
    } else if op < 78 {
        return ["RL.REFUND", keys[k], &n].map(String::from).to_vec();
    } else {
        a.extend(["RL.MTAKE".into(), "1".into()]);
        for (j, key) in keys.iter().enumerate() {
            if j == k || rng.chance(40) {
                let (r, cp) = *rng.pick(STORM_LIMITS);
                a.extend([key.to_string(), r.into(), cp.into()]);
            }
        }
        if rng.chance(30) {
            a.push("WITHSTATE".into());
        }
    }
    if rng.chance(10) {
        a.extend(["INIT".into(), "1".into()]);
    }
    if rng.chance(5) {
        a.push("SHADOW".into());
    }
    if rng.chance(90) {
        a.extend(["VERSION".into(), version.to_string()]);
    }
    a
}

/// Limits that take minutes or more to fill from empty (so no key of the storm expires
/// while the copies are compared), written as a caller might: shortest form or not,
/// exactly representable or not, at the extremes.
const STORM_LIMITS: &[(&str, &str)] = &[
    ("0.01", "10"),
    ("0.0100", "10.0"),
    ("1e-9", "1"),
    ("0.001", "1e15"),
    ("3.3333333333333335", "100000"),
    ("1000", "1e15"),
    ("0.1", "7.25"),
    ("1.5e-3", "33.333333333333336"),
];

/// Every key with its DUMP and absolute expiry (ms), skipping keys that could expire
/// before the copies are compared.
fn copy_state(c: &mut Connection) -> Vec<(String, Vec<u8>, i64)> {
    let mut keys: Vec<String> = query(c, &["KEYS", "*"]);
    keys.sort();
    keys.into_iter()
        .filter_map(|k| {
            let at: i64 = query(c, &["PEXPIRETIME", &k]);
            let pttl: i64 = query(c, &["PTTL", &k]);
            (pttl == -1 || pttl > 120_000).then(|| (k.clone(), dump(c, &k), at))
        })
        .collect()
}

fn copy_state_of(
    c: &mut Connection,
    keys: &[(String, Vec<u8>, i64)],
) -> Vec<(String, Vec<u8>, i64)> {
    keys.iter()
        .map(|(k, _, _)| {
            let at: i64 = query(c, &["PEXPIRETIME", k]);
            let d: Option<Vec<u8>> = redis::cmd("DUMP").arg(k).query(c).unwrap();
            (k.clone(), d.unwrap_or_default(), at)
        })
        .collect()
}

#[test]
fn a_version_storm_leaves_replica_aof_and_rdb_byte_identical() {
    let mut m = Server::start(&["--appendonly", "yes", "--aof-use-rdb-preamble", "no"]);
    let replica = Server::start(&[]);
    replicate(&replica, &m);
    let mut c = m.conn();
    let mut rng = Rng(0xD1B5_4A32_D192_ED03);
    let keys = ["{s}1", "{s}2", "{s}3", "{s}4"];
    let mut leases: Vec<Vec<u64>> = vec![Vec::new(); keys.len()];
    let mut current = 1u64;
    for step in 0..1500 {
        if rng.chance(10) {
            current += 1;
        }
        if step == 1200 {
            current = 9_007_199_254_740_989;
        }
        let args = storm_call(&mut rng, &keys, current, &mut leases);
        if let Ok(Value::Array(a)) = call(&mut c, &args) {
            if args[0] == "RL.LEASE" {
                let id: u64 = redis::from_redis_value(&a[1]).unwrap();
                if id != 0 {
                    let k = keys.iter().position(|k| *k == args[1]).unwrap();
                    leases[k].push(id);
                }
            }
        }
    }
    // The storm reached every version path.
    for f in ["rl_limit_replaced", "rl_limit_stale", "rl_limit_conflicts"] {
        assert!(info_field(&mut c, "rl", f) > 10, "{f}");
    }
    let want = copy_state(&mut c);
    assert!(want.len() >= 3, "too few keys left: {}", want.len());
    let versions: Vec<u64> = want
        .iter()
        .filter_map(|(k, _, _)| peek_limit(&mut c, k).map(|p| p.2))
        .collect();
    assert!(
        versions.iter().any(|&v| v > 9_007_199_254_740_000),
        "{versions:?}"
    );

    wait_synced(&m, &replica);
    assert_eq!(copy_state_of(&mut replica.conn(), &want), want, "replica");

    m.restart();
    let mut c = m.conn();
    assert_eq!(copy_state_of(&mut c, &want), want, "AOF replay");

    rewrite_aof(&mut c);
    m.restart();
    let mut c = m.conn();
    assert_eq!(copy_state_of(&mut c, &want), want, "rewritten AOF replay");

    let _: () = query(&mut c, &["DEBUG", "RELOAD"]);
    assert_eq!(copy_state_of(&mut c, &want), want, "DEBUG RELOAD");
}

// ---------------------------------------------------------------------------------------
// Crafted payloads and forged effects.
// ---------------------------------------------------------------------------------------

/// Every truncation and many single-byte changes of a versioned bucket's DUMP payload
/// (with leases, a hold and the largest version), resealed with a valid CRC: RESTORE
/// either refuses it or stores a state that every later copy accepts (DUMP again, RESTORE
/// that, DEBUG RELOAD); the server never dies.
#[test]
fn corrupt_payloads_of_versioned_buckets_never_hurt_the_server() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let top = "9007199254740991";
    let _: Value = query(
        &mut c,
        &[
            "RL.LEASE", "v", "0.01", "100", "7", "600000", "VERSION", "5",
        ],
    );
    let _: Value = query(
        &mut c,
        &[
            "RL.LEASE", "v", "0.01", "100", "3", "600000", "VERSION", "5",
        ],
    );
    // A newer, smaller limit: a hold and span; then the top version.
    let _: Value = query(
        &mut c,
        &["RL.TAKE", "v", "0.001", "50", "1", "VERSION", "6"],
    );
    let _: Value = query(
        &mut c,
        &["RL.TAKE", "v", "0.001", "50", "1", "VERSION", top],
    );
    assert_eq!(peek_limit(&mut c, "v").unwrap().2, 9_007_199_254_740_991);
    let original = dump(&mut c, "v");
    let body = dump_body(&original).to_vec();

    let mut bodies: Vec<Vec<u8>> = (0..body.len()).map(|n| body[..n].to_vec()).collect();
    for i in 0..body.len() {
        for x in [0x00u8, 0xFF, 0x7F, 0x80, 0x01, 0x40, 0xC0, 0x20] {
            if body[i] != x {
                let mut b = body.clone();
                b[i] = x;
                bodies.push(b);
            }
            let mut b = body.clone();
            b[i] ^= x;
            bodies.push(b);
        }
        // Bytes inserted and removed shift every later field.
        let mut b = body.clone();
        b.insert(i, 0x01);
        bodies.push(b);
        let mut b = body.clone();
        b.remove(i);
        bodies.push(b);
    }
    let mut accepted = 0;
    for (i, b) in bodies.iter().enumerate() {
        let payload = reseal(&original, b);
        let r = restore_replace(&mut c, "x", &payload);
        if r.is_err() {
            continue;
        }
        accepted += 1;
        // Accepted: a state the module can read, copy and reload.
        let peek: redis::RedisResult<Value> = redis::cmd("RL.PEEK").arg("x").query(&mut c);
        assert!(peek.is_ok(), "payload {i}: PEEK {peek:?}");
        let again: Option<Vec<u8>> = redis::cmd("DUMP").arg("x").query(&mut c).unwrap();
        if let Some(again) = again {
            let r = restore_replace(&mut c, "y", &again);
            assert!(r.is_ok(), "payload {i}: its own DUMP is refused: {r:?}");
        }
        let _: Value = query(&mut c, &["DEL", "x", "y"]);
    }
    assert!(accepted > 0, "not even the unchanged payload was accepted");
    let pong: String = query(&mut c, &["PING"]);
    assert_eq!(pong, "PONG");
    // Every accepted one was deleted; the original still reloads.
    let _: () = query(&mut c, &["DEBUG", "RELOAD"]);
    assert_eq!(peek_limit(&mut c, "v").unwrap().2, 9_007_199_254_740_991);
}

/// Forged effects with versions at and past the extremes, in every position and
/// combination: a refused one is a clear error and changes nothing (not the key, not its
/// expiry), an accepted one stores exactly the version given.
#[test]
fn forged_setstate_versions_are_exact_or_refused_with_no_change() {
    let s = Server::start(&[]);
    let mut c = s.internal_conn();
    let far = (now_ns() + 3_600_000_000_000).to_string();
    let set = |c: &mut Connection, extra: &[&str]| -> redis::RedisResult<Value> {
        let mut a = vec!["RL.SETSTATE", "f", far.as_str(), "0.01", "100"];
        a.extend_from_slice(extra);
        call(c, &a)
    };
    set(
        &mut c,
        &["VERSION", "7", "LASTID", "3", "ADD", "2", "4", &far],
    )
    .unwrap();
    let before = (
        dump(&mut c, "f"),
        query::<i64>(&mut c, &["PEXPIRETIME", "f"]),
    );
    let refused: &[&[&str]] = &[
        &["VERSION", "9007199254740992"],
        &["VERSION", "18446744073709551615"],
        &["VERSION", "18446744073709551616"],
        &["VERSION", "-1"],
        &["VERSION", "-0"],
        &["VERSION", "+1"],
        &["VERSION", " 1"],
        &["VERSION", "1 "],
        &["VERSION", "1.0"],
        &["VERSION", "1e3"],
        &["VERSION", "0x10"],
        &["VERSION", ""],
        &["VERSION", "nan"],
        &["VERSION"],
        &["VERSION", "1", "VERSION", "1"],
        &["VERSION", "1", "HOLD", "1", "SPAN", "1", "VERSION", "2"],
        &["HOLD", "1", "VERSION", "9007199254740992", "SPAN", "1"],
        &["VERSION", "9007199254740992", "ADD", "9", "1", "1"],
        &[
            "LASTID",
            "3",
            "VERSION",
            "99999999999999999999",
            "DROP",
            "2",
        ],
        &["VERSION", "1", "ADD", "0", "1", "1"],
    ];
    for extra in refused {
        let r = set(&mut c, extra);
        assert!(r.is_err(), "{extra:?} accepted");
        let after = (
            dump(&mut c, "f"),
            query::<i64>(&mut c, &["PEXPIRETIME", "f"]),
        );
        assert_eq!(after, before, "{extra:?} changed the key");
    }
    for (extra, want) in [
        (
            &["VERSION", "9007199254740991"][..],
            9_007_199_254_740_991u64,
        ),
        (&["VERSION", "0"][..], 0),
        (
            &["HOLD", "0", "SPAN", "0", "VERSION", "9007199254740990"][..],
            9_007_199_254_740_990,
        ),
        (&["VERSION", "007"][..], 7),
        (&["VERSION", "1", "PRUNE", "0"][..], 1),
        (&["DROP", "2", "VERSION", "2"][..], 2),
    ] {
        set(&mut c, extra).unwrap();
        assert_eq!(peek_limit(&mut c, "f").unwrap().2, want, "{extra:?}");
        // The state it made is one a reload accepts.
        let d = dump(&mut c, "f");
        restore_replace(&mut c, "g", &d).unwrap();
        assert_eq!(
            peek_limit(&mut c, "g").unwrap().2,
            want,
            "{extra:?} restored"
        );
    }
}

// ---------------------------------------------------------------------------------------
// Expiry: after every write, the key lives exactly until its bucket is full, past any hold
// and any live lease.
// ---------------------------------------------------------------------------------------
fn read_len_of_moved(b: &[u8], at: &mut usize) -> u64 {
    let first = b[*at];
    *at += 1;
    match first >> 6 {
        0 => u64::from(first & 0x3f),
        1 => {
            let n = (u64::from(first & 0x3f) << 8) | u64::from(b[*at]);
            *at += 1;
            n
        }
        _ if first == 0x80 => {
            let n = u32::from_be_bytes(b[*at..*at + 4].try_into().unwrap());
            *at += 4;
            u64::from(n)
        }
        _ if first == 0x81 => {
            let n = u64::from_be_bytes(b[*at..*at + 8].try_into().unwrap());
            *at += 8;
            n
        }
        _ => panic!("not a length: {first:#x}"),
    }
}

/// The unsigned fields of a bucket's DUMP (rate and cap left out): `full_at, hold, span,
/// version, pin (0: none), table, [last_id, (id, tokens, expires_at)...]`.
fn stored_fields(payload: &[u8]) -> Vec<u64> {
    let body = dump_body(payload);
    assert_eq!(body[0], 7, "RDB_TYPE_MODULE_2");
    let mut at = 1;
    read_len_of_moved(body, &mut at);
    let mut out = Vec::new();
    loop {
        match read_len_of_moved(body, &mut at) {
            0 => break,
            2 => out.push(read_len_of_moved(body, &mut at)),
            4 => at += 8,
            op => panic!("opcode {op}"),
        }
    }
    out
}

/// The instant (ns) a stored bucket may go: full, past its hold and its last lease.
fn may_go_at(fields: &[u64]) -> u64 {
    let (full_at, hold) = (fields[0], fields[1]);
    assert_eq!(fields[4], 0, "no pin in these tests");
    let leases = fields.get(7..).unwrap_or(&[]);
    let last_lease = leases.chunks(3).map(|l| l[2]).max().unwrap_or(0);
    full_at.max(hold).max(last_lease)
}

#[test]
fn after_every_versioned_write_the_expiry_is_the_time_to_full() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let mut rng = Rng(0x2545_F491_4F6C_DD1D);
    let keys = ["{e}1", "{e}2", "{e}3"];
    let mut leases: Vec<Vec<u64>> = vec![Vec::new(); keys.len()];
    let mut current = 1u64;
    let mut checked = 0;
    for step in 0..1500 {
        if rng.chance(10) {
            current += 1;
        }
        let args = storm_call(&mut rng, &keys, current, &mut leases);
        let reply = call(&mut c, &args);
        if let Ok(Value::Array(a)) = &reply {
            if args[0] == "RL.LEASE" {
                let id: u64 = redis::from_redis_value(&a[1]).unwrap();
                if id != 0 {
                    let k = keys.iter().position(|k| *k == args[1]).unwrap();
                    leases[k].push(id);
                }
            }
        }
        for key in keys {
            let Some(payload): Option<Vec<u8>> = redis::cmd("DUMP").arg(key).query(&mut c).unwrap()
            else {
                continue;
            };
            let fields = stored_fields(&payload);
            let want = may_go_at(&fields).div_ceil(1_000_000) as i64;
            let got: i64 = query(&mut c, &["PEXPIRETIME", key]);
            assert_eq!(
                got, want,
                "step {step}: {args:?} -> {reply:?}: {key} expires at {got}, its state \
                 {fields:?} at {want}"
            );
            checked += 1;
        }
    }
    assert!(checked > 1000, "{checked}");
}

// ---------------------------------------------------------------------------------------
// The Functions library takes VERSION as the module does.
// ---------------------------------------------------------------------------------------

/// The Functions library takes `VERSION v` as the module does (the clients send it from
/// their configuration on every call, whatever the backend): no `ERR unknown option
/// 'VERSION'`, no wrong number of arguments from `rl_mtake`, and replies that match the
/// module's.
#[test]
fn the_functions_library_takes_version_as_the_module_does() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let source =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/functions/rl.lua")).unwrap();
    let _: String = redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg("REPLACE")
        .arg(source)
        .query(&mut c)
        .unwrap();
    // Version 2 stores a small limit; a version-1 call asking its own larger cap is decided
    // under version 2's (n above the stored cap), exactly as `RL.TAKE` does.
    let module: Vec<redis::RedisResult<Value>> = vec![
        call(&mut c, &["RL.TAKE", "m", "1", "10", "1", "VERSION", "2"]),
        call(
            &mut c,
            &["RL.TAKE", "m", "100", "1000", "500", "VERSION", "1"],
        ),
        call(&mut c, &["RL.MTAKE", "1", "m", "1", "10", "VERSION", "3"]),
    ];
    let library: Vec<redis::RedisResult<Value>> = vec![
        call(
            &mut c,
            &["FCALL", "rl_take", "1", "f", "1", "10", "1", "VERSION", "2"],
        ),
        call(
            &mut c,
            &[
                "FCALL", "rl_take", "1", "f", "100", "1000", "500", "VERSION", "1",
            ],
        ),
        call(
            &mut c,
            &[
                "FCALL", "rl_mtake", "1", "f", "1", "1", "10", "VERSION", "3",
            ],
        ),
    ];
    let text = |r: &redis::RedisResult<Value>| match r {
        Ok(v) => format!("{v:?}"),
        Err(e) => e.detail().unwrap_or_default().to_string(),
    };
    let module: Vec<String> = module.iter().map(text).collect();
    let library: Vec<String> = library.iter().map(text).collect();
    assert_eq!(library, module);
}

// ---------------------------------------------------------------------------------------
// RL.MTAKE's keys with VERSION: Cluster routing and the call agree on them.
// ---------------------------------------------------------------------------------------

/// `COMMAND GETKEYS` and the call read the same keys, whatever the options and however
/// the keys are named (a key may be called `VERSION`, `INIT` or `WITHSTATE`: options are
/// read from the end, and `rate cap` are numbers); a malformed option list has no keys and
/// the call is an error that changes nothing.
#[test]
fn mtake_keys_with_version_are_the_same_for_routing_and_the_call() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let cases: &[(&[&str], &[&str])] = &[
        (&["1", "a", "1", "2", "VERSION", "3"], &["a"]),
        (
            &[
                "1",
                "a",
                "1",
                "2",
                "b",
                "1",
                "2",
                "VERSION",
                "3",
                "WITHSTATE",
            ],
            &["a", "b"],
        ),
        (
            &["1", "a", "1", "2", "VERSION", "3", "INIT", "1", "SHADOW"],
            &["a"],
        ),
        (
            &["1", "VERSION", "1", "2", "VERSION", "9007199254740991"],
            &["VERSION"],
        ),
        (
            &["1", "INIT", "1", "2", "WITHSTATE", "1", "2", "VERSION", "0"],
            &["INIT", "WITHSTATE"],
        ),
        (
            &["1", "a", "1", "2", "VERSION", "1", "2"],
            &["a", "VERSION"],
        ),
    ];
    for (args, keys) in cases {
        let mut getkeys = vec!["COMMAND", "GETKEYS", "RL.MTAKE"];
        getkeys.extend_from_slice(args);
        let got: Vec<String> = query(&mut c, &getkeys);
        assert_eq!(&got, keys, "{args:?}");
        let mut mtake = vec!["RL.MTAKE"];
        mtake.extend_from_slice(args);
        let r: Value = query(&mut c, &mtake);
        assert!(matches!(r, Value::Array(_)), "{args:?}: {r:?}");
        for k in *keys {
            assert!(exists(&mut c, k), "{args:?}: {k} not written");
        }
        let _: Value = query(&mut c, &["FLUSHALL"]);
    }
    for bad in [
        &["1", "a", "1", "2", "VERSION"][..],
        &["1", "a", "1", "2", "VERSION", "3", "VERSION", "4"],
        &["1", "a", "1", "VERSION", "3"],
        &["1", "a", "1", "2", "b", "VERSION", "3"],
    ] {
        let mut mtake = vec!["RL.MTAKE"];
        mtake.extend_from_slice(bad);
        assert!(call(&mut c, &mtake).is_err(), "{bad:?}");
        let keys: Vec<String> = query(&mut c, &["KEYS", "*"]);
        assert!(keys.is_empty(), "{bad:?} wrote {keys:?}");
    }
    // The docs show the option on every command that carries a limit (the internal
    // effect's to an internal client: Redis 8 hides it from the others).
    let mut c = s.internal_conn();
    for cmd in [
        "RL.TAKE",
        "RL.LEASE",
        "RL.RESERVE",
        "RL.MTAKE",
        "RL.SETSTATE",
    ] {
        let docs: Value = query(&mut c, &["COMMAND", "DOCS", cmd]);
        assert!(
            format!("{docs:?}").contains("\"VERSION\""),
            "{cmd}: {docs:?}"
        );
    }
}
