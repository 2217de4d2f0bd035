//! Versioned limits (`VERSION v`): a bucket keeps the newest limit it has seen, so callers
//! on two releases passing two limits cannot flap it. Two groups of callers on versions 1
//! and 2 share buckets; after the first version-2 call every decision follows version 2's
//! limit, and the version travels through every copy of the key.

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
    rewrite_aof(&mut c);
    drop(c);
    s.restart();
    let mut c = s.conn();
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
        // Encoding 3: full_at rate cap hold span version table ...; the id's low 10 bits
        // are the encoding version.
        assert_eq!(id & 1023, 3, "{key}");
        let version = match items[5] {
            Item::Uint(v) => v,
            _ => panic!("{items:?}"),
        };
        assert_eq!(version, peek_version(&mut c, key));
        let want = snapshot(&mut c, &[key]).remove(0);
        let mut v2 = items.clone();
        v2.remove(5);
        let mut v1 = v2.clone();
        let hold_span = v1.drain(3..5).collect::<Vec<_>>();
        for (encver, body) in [
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
            assert_eq!(got.1 .2, 0, "encoding {encver} of {key} loads as version 0");
            assert_eq!((got.1 .0, got.1 .1), (want.1 .0, want.1 .1));
            if version == 0 {
                // The very same bucket.
                assert_eq!(got, want, "encoding {encver} of {key}");
            }
            // And DUMPed again, in the new encoding, with version 0.
            let (_, again) = parse_body(dump_body(&dump(&mut c, &name)));
            assert_eq!(again[5], Item::Uint(0));
        }
    }
    // Encoding 3 with a version past 2^53 - 1 is refused, and the server lives.
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
    // An encoding from the future (4) is refused.
    let err = redis::cmd("RESTORE")
        .arg("future")
        .arg(0)
        .arg(reseal(&payload, &build_body((id & !1023) | 4, &items)))
        .query::<Value>(&mut c)
        .unwrap_err();
    assert!(err.to_string().contains("Bad data format"), "{err}");
    assert!(!s.exited());
}
