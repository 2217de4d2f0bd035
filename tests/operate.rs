//! Operating it safely: shadow mode, RL.PEEK, RL.MTAKE and INIT warm starts.

mod support;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use support::*;

fn mode(c: &mut Connection) -> String {
    let v: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("rl.mode")
        .query(c)
        .unwrap();
    v[1].clone()
}

/// 32 threads × 20 calls of one token on one key whose bucket (cap 100) does not refill
/// during the test: returns (answered as granted, tokens left in the bucket).
fn hammer(s: &Server, key: &str) -> (i64, f64) {
    let answered = Arc::new(AtomicI64::new(0));
    let threads: Vec<_> = (0..32)
        .map(|_| {
            let (mut c, answered, key) = (s.conn(), answered.clone(), key.to_string());
            std::thread::spawn(move || {
                for _ in 0..20 {
                    answered.fetch_add(take(&mut c, &key, 1e-6, 100.0, 1), Ordering::Relaxed);
                }
            })
        })
        .collect();
    threads.into_iter().for_each(|t| t.join().unwrap());
    let mut c = s.conn();
    let (_, left, _, _) = take_state(&mut c, key, 1e-6, 100.0, 100);
    (answered.load(Ordering::Relaxed), left)
}

#[test]
fn shadow_mode_answers_granted_and_counts_what_enforce_denies() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    assert_eq!(mode(&mut c), "enforce");
    let (granted, left) = hammer(&s, "enforced");
    assert_eq!(granted, 100);
    let denied = info_field(&mut c, "rl", "rl_denied");
    assert_eq!(
        denied,
        640 - 100 + 1,
        "the 540 of the load, plus the final look"
    );

    set_mode(&mut c, "shadow");
    assert_eq!(mode(&mut c), "shadow");
    let (answered, shadow_left) = hammer(&s, "shadowed");
    assert_eq!(answered, 640, "shadow mode answers every call as granted");
    // The bucket evolved exactly as when enforcing: the same tokens are left.
    assert!((shadow_left - left).abs() < 1e-3, "{shadow_left} vs {left}");
    assert_eq!(info_field(&mut c, "rl", "rl_shadow_denied"), 540 + 1);
    assert_eq!(
        info_field(&mut c, "rl", "rl_denied"),
        denied,
        "no real denial in shadow mode"
    );
    let info: String = redis::cmd("INFO").arg("rl").query(&mut c).unwrap();
    assert!(info.contains("rl_mode:shadow"), "{info}");

    // Back to enforce at runtime: no restart, no state lost.
    set_mode(&mut c, "enforce");
    assert_eq!(take(&mut c, "shadowed", 1e-6, 100.0, 1), 0);
    let (_, still) = peek_fields(&mut c, "shadowed");
    assert!((still - left).abs() < 1e-3);
}

#[test]
fn shadow_mode_from_loadmodule_args_and_rejects_unknown_values() {
    // Extra args follow `--loadmodule path`, so this is `loadmodule path mode shadow`.
    let s = Server::start(&["mode", "shadow"]);
    let mut c = s.conn();
    assert_eq!(mode(&mut c), "shadow");
    assert_eq!(take(&mut c, "k", 1e-6, 1.0, 1), 1);
    assert_eq!(
        take(&mut c, "k", 1e-6, 1.0, 1),
        1,
        "shadow: answered as granted"
    );
    let err = redis::cmd("CONFIG")
        .arg("SET")
        .arg("rl.mode")
        .arg("sometimes")
        .query::<()>(&mut c);
    assert!(err.is_err());
    assert_eq!(mode(&mut c), "shadow");
}

/// `RL.PEEK key` as a map → (fields, tokens).
fn peek_fields(c: &mut Connection, key: &str) -> (Vec<(String, Value)>, f64) {
    let v: Vec<(String, Value)> = redis::cmd("RL.PEEK").arg(key).query(c).unwrap();
    let tokens = v
        .iter()
        .find(|(k, _)| k == "tokens")
        .map(|(_, v)| redis::from_redis_value::<f64>(v).unwrap())
        .unwrap();
    (v, tokens)
}

#[test]
fn peek_shows_state_and_writes_nothing() {
    let master = Server::start(&[]);
    let replica = Server::start(&[]);
    replicate(&replica, &master);
    let mut c = master.conn();
    let missing: Value = redis::cmd("RL.PEEK").arg("nothing").query(&mut c).unwrap();
    assert_eq!(missing, Value::Nil);
    take(&mut c, "k", 0.001, 10.0, 4);
    let _: Value = redis::cmd("RL.LEASE")
        .arg("k")
        .arg(0.001)
        .arg(10.0)
        .arg(3)
        .arg(60_000)
        .query(&mut c)
        .unwrap();
    wait_synced(&master, &replica);
    let offset = info_field(&mut c, "replication", "master_repl_offset");
    let dirty = info_field(&mut c, "persistence", "rdb_changes_since_last_save");
    let digest_before = digest(&mut c, "k");
    let (fields, tokens) = peek_fields(&mut c, "k");
    let get = |name: &str| {
        fields
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .unwrap()
    };
    assert!((tokens - 3.0).abs() < 0.01, "tokens {tokens}");
    assert_eq!(redis::from_redis_value::<f64>(&get("rate")).unwrap(), 0.001);
    assert_eq!(redis::from_redis_value::<f64>(&get("cap")).unwrap(), 10.0);
    let reset: i64 = redis::from_redis_value(&get("reset_after_ms")).unwrap();
    assert!((6_990_000..=7_000_000).contains(&reset), "reset {reset}");
    assert_eq!(redis::from_redis_value::<i64>(&get("leases")).unwrap(), 1);
    assert_eq!(
        redis::from_redis_value::<i64>(&get("leased_tokens")).unwrap(),
        3
    );
    for _ in 0..20 {
        peek_fields(&mut c, "k");
    }
    assert_eq!(
        info_field(&mut c, "replication", "master_repl_offset"),
        offset
    );
    assert_eq!(
        info_field(&mut c, "persistence", "rdb_changes_since_last_save"),
        dirty
    );
    assert_eq!(digest(&mut c, "k"), digest_before);
    // Replicas answer it too (it is read-only).
    let mut r = replica.conn();
    let (_, on_replica) = peek_fields(&mut r, "k");
    assert!((on_replica - tokens).abs() < 0.01);
}

fn mtake(c: &mut Connection, args: &[&str]) -> Value {
    let mut cmd = redis::cmd("RL.MTAKE");
    for a in args {
        cmd.arg(*a);
    }
    cmd.query(c).unwrap()
}

#[test]
fn mtake_is_all_or_nothing() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    // user: 5 tokens, api: 2 tokens, global: 100; none refills during the test.
    let triple = [
        "2",
        "{t}user",
        "1e-6",
        "5",
        "{t}api",
        "1e-6",
        "2",
        "{t}global",
        "1e-6",
        "100",
    ];
    let granted = mtake(&mut c, &triple);
    assert_eq!(
        granted,
        Value::Array(vec![Value::Int(2), Value::Nil, Value::Int(0)])
    );
    let before: Vec<String> = ["{t}user", "{t}api", "{t}global"]
        .iter()
        .map(|k| digest(&mut c, k))
        .collect();
    // api is empty now: nothing may be debited anywhere.
    let denied = mtake(&mut c, &triple);
    match denied {
        Value::Array(v) => {
            assert_eq!(v[0], Value::Int(0));
            assert_eq!(v[1], Value::BulkString(b"{t}api".to_vec()));
            let retry: i64 = redis::from_redis_value(&v[2]).unwrap();
            assert!(retry > 1_000_000_000, "retry {retry}");
        }
        other => panic!("{other:?}"),
    }
    let after: Vec<String> = ["{t}user", "{t}api", "{t}global"]
        .iter()
        .map(|k| digest(&mut c, k))
        .collect();
    assert_eq!(before, after, "a denied RL.MTAKE debited something");
    // WITHSTATE: every bucket's remaining tokens.
    let v = mtake(
        &mut c,
        &[
            "1",
            "{t}user",
            "1e-6",
            "5",
            "{t}global",
            "1e-6",
            "100",
            "WITHSTATE",
        ],
    );
    let (g, _, _, rem): (i64, Value, i64, Vec<f64>) = redis::from_redis_value(&v).unwrap();
    assert_eq!(g, 1);
    assert!(
        (rem[0] - 2.0).abs() < 0.01 && (rem[1] - 97.0).abs() < 0.01,
        "{rem:?}"
    );
    assert_eq!(info_field(&mut c, "rl", "rl_mtake_granted"), 2);
    assert_eq!(info_field(&mut c, "rl", "rl_mtake_denied"), 1);
}

#[test]
fn mtake_declares_its_keys_and_checks_input() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let keys: Vec<String> = redis::cmd("COMMAND")
        .arg("GETKEYS")
        .arg("RL.MTAKE")
        .arg(1)
        .arg("a")
        .arg(1)
        .arg(5)
        .arg("b")
        .arg(1)
        .arg(5)
        .arg("WITHSTATE")
        .arg("INIT")
        .arg(2)
        .query(&mut c)
        .unwrap();
    assert_eq!(keys, vec!["a", "b"]);
    for bad in [
        vec!["1", "a", "1"],
        vec!["0", "a", "1", "5"],
        vec!["1", "a", "1", "5", "a", "1", "5"],
        vec!["6", "a", "1", "5"],
        vec!["1", "a", "x", "5"],
        vec!["1", "a", "1", "5", "INIT", "9"],
    ] {
        let mut cmd = redis::cmd("RL.MTAKE");
        for a in &bad {
            cmd.arg(*a);
        }
        assert!(cmd.query::<Value>(&mut c).is_err(), "{bad:?} should fail");
    }
    let exists: i64 = c.exists("a").unwrap();
    assert_eq!(exists, 0);
}

#[test]
fn mtake_replicates_every_bucket() {
    let master = Server::start(&[]);
    let replica = Server::start(&[]);
    replicate(&replica, &master);
    let mut m = master.conn();
    for _ in 0..5 {
        mtake(
            &mut m,
            &[
                "1", "x", "0.01", "10", "y", "0.01", "3", "z", "0.01", "7", "INIT", "2",
            ],
        );
    }
    wait_synced(&master, &replica);
    let mut r = replica.conn();
    for k in ["x", "y", "z"] {
        assert_eq!(digest(&mut r, k), digest(&mut m, k), "key {k}");
    }
}

#[test]
fn init_sets_how_full_a_new_bucket_starts() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let v: (i64, f64, i64, i64) = redis::cmd("RL.TAKE")
        .arg("new")
        .arg(1)
        .arg(100)
        .arg(1)
        .arg("INIT")
        .arg(10)
        .arg("WITHSTATE")
        .query(&mut c)
        .unwrap();
    assert_eq!(v.0, 1);
    assert!((v.1 - 9.0).abs() < 0.01, "{v:?}");
    // INIT only applies to a bucket that does not exist yet.
    let v: (i64, f64, i64, i64) = redis::cmd("RL.TAKE")
        .arg("new")
        .arg(1)
        .arg(100)
        .arg(1)
        .arg("INIT")
        .arg(100)
        .arg("WITHSTATE")
        .query(&mut c)
        .unwrap();
    assert!((v.1 - 8.0).abs() < 0.01, "{v:?}");
    // A bucket created empty is stored even though the call is denied, so it fills with time.
    let v: (i64, f64, i64, i64) = redis::cmd("RL.TAKE")
        .arg("cold")
        .arg(10)
        .arg(100)
        .arg(1)
        .arg("INIT")
        .arg(0)
        .arg("WITHSTATE")
        .query(&mut c)
        .unwrap();
    assert_eq!(v.0, 0);
    assert_eq!(v.2, 100);
    std::thread::sleep(std::time::Duration::from_millis(v.2 as u64));
    let again: i64 = redis::cmd("RL.TAKE")
        .arg("cold")
        .arg(10)
        .arg(100)
        .arg(1)
        .arg("INIT")
        .arg(0)
        .query(&mut c)
        .unwrap();
    assert_eq!(again, 1);
    // RL.LEASE takes INIT too.
    let v: (i64, i64, i64, i64) = redis::cmd("RL.LEASE")
        .arg("leased")
        .arg(1)
        .arg(100)
        .arg(20)
        .arg(1000)
        .arg("INIT")
        .arg(5)
        .query(&mut c)
        .unwrap();
    assert_eq!(v.0, 5);
    let err = redis::cmd("RL.TAKE")
        .arg("x")
        .arg(1)
        .arg(10)
        .arg("INIT")
        .arg(11)
        .query::<i64>(&mut c)
        .unwrap_err();
    assert!(
        err.to_string().contains("INIT must be between 0 and cap"),
        "{err}"
    );
}
