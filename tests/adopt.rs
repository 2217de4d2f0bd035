//! `rl.adopt-script-keys`: cutover from the seed Lua script without losing a bucket.

mod support;
use support::*;

const SCRIPT: &str = include_str!("../scripts/token_bucket.lua");

fn script(c: &mut Connection, key: &str, rate: &str, cap: &str, n: u64) -> i64 {
    redis::cmd("EVAL")
        .arg(SCRIPT)
        .arg(1)
        .arg(key)
        .arg(rate)
        .arg(cap)
        .arg(n)
        .query(c)
        .unwrap()
}

fn kind(c: &mut Connection, key: &str) -> String {
    query(c, &["TYPE", key])
}

#[test]
fn thousand_keys_carry_their_level_over() {
    let s = Server::start(&["--rl.adopt-script-keys", "yes"]);
    let mut c = s.conn();
    let (rate, cap) = (0.01, 100.0);
    // Each key's level and the server time the script stored it at (seconds, as Lua
    // prints a number: 14 significant digits, so 1e-4 s).
    let mut levels = Vec::new();
    for i in 0..1000u64 {
        let key = format!("api:{i}");
        script(&mut c, &key, "0.01", "100", i % 100);
        let t: f64 = query(&mut c, &["HGET", &key, "tokens"]);
        let ts: f64 = query(&mut c, &["HGET", &key, "ts"]);
        levels.push((t, ts));
    }
    let mut full = 0;
    for (i, (level, ts)) in levels.iter().enumerate() {
        let key = format!("api:{i}");
        let (granted, remaining, _, _) = take_state(&mut c, &key, rate, cap, 1);
        // At most the refill of the server time from the script's write to now.
        let now = (server_ms(&mut c) + 1) as f64 / 1000.0;
        let refill = (now - ts + 1e-4) * rate + 1e-9;
        let expect = level - 1.0;
        assert_eq!(granted, 1, "{key} at {level}");
        assert!(remaining >= expect - 1e-9, "{key}: {remaining} < {expect}");
        assert!(
            remaining <= expect + refill,
            "{key}: {remaining} > {expect} + {refill}"
        );
        if *level < cap && remaining >= cap - 1.0 {
            full += 1;
        }
        assert_eq!(kind(&mut c, &key), "rl-bucket");
    }
    assert_eq!(full, 0, "a key started full");
    assert_eq!(info_field(&mut c, "rl", "rl_adopted"), 1000);
}

#[test]
fn only_the_scripts_hash_and_only_when_on() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    script(&mut c, "k", "1", "10", 3);
    let wrong = |c: &mut Connection, key: &str| {
        let e = redis::cmd("RL.TAKE")
            .arg(key)
            .arg(1)
            .arg(10)
            .query::<i64>(c)
            .unwrap_err();
        assert!(e.to_string().contains("WRONGTYPE"), "{key}: {e}");
    };
    wrong(&mut c, "k");
    let _: () = query(&mut c, &["CONFIG", "SET", "rl.adopt-script-keys", "yes"]);
    let _: () = query(
        &mut c,
        &["HSET", "three", "tokens", "1", "ts", "1", "x", "1"],
    );
    let _: () = query(&mut c, &["HSET", "word", "tokens", "many", "ts", "1"]);
    let _: () = query(&mut c, &["HSET", "neg", "tokens", "-1", "ts", "1"]);
    let _: () = query(&mut c, &["HSET", "other", "tokens", "1", "at", "1"]);
    for key in ["three", "word", "neg", "other"] {
        let before = dump(&mut c, key);
        wrong(&mut c, key);
        let e = redis::cmd("RL.LEASE")
            .arg(key)
            .arg(1)
            .arg(10)
            .arg(1)
            .arg(100)
            .query::<Value>(&mut c);
        assert!(e.unwrap_err().to_string().contains("WRONGTYPE"));
        let e = redis::cmd("RL.MTAKE")
            .arg(1)
            .arg("free")
            .arg(1)
            .arg(10)
            .arg(key)
            .arg(1)
            .arg(10)
            .query::<Value>(&mut c);
        assert!(e.unwrap_err().to_string().contains("WRONGTYPE"));
        assert_eq!(dump(&mut c, key), before, "{key} changed");
    }
    assert_eq!(query::<Value>(&mut c, &["EXISTS", "free"]), Value::Int(0));
    // A denial leaves the script's hash (same level, and denials write nothing).
    script(&mut c, "low", "0.001", "1", 1);
    let off = info_field(&mut c, "replication", "master_repl_offset");
    assert_eq!(take(&mut c, "low", 0.001, 1.0, 1), 0);
    assert_eq!(kind(&mut c, "low"), "hash");
    assert_eq!(info_field(&mut c, "replication", "master_repl_offset"), off);
    // LEASE and MTAKE adopt too; read-only and limit-less commands do not.
    let v: Vec<i64> = query(&mut c, &["RL.LEASE", "k", "1", "10", "5", "1000"]);
    assert_eq!(v[0], 5);
    assert_eq!(kind(&mut c, "k"), "rl-bucket");
    script(&mut c, "m", "1", "10", 1);
    let v: (i64, Value, i64) = redis::cmd("RL.MTAKE")
        .arg(2)
        .arg("m")
        .arg(1)
        .arg(10)
        .arg("free")
        .arg(1)
        .arg(10)
        .query(&mut c)
        .unwrap();
    assert_eq!(v.0, 2);
    assert_eq!(kind(&mut c, "m"), "rl-bucket");
    script(&mut c, "p", "1", "10", 1);
    assert!(redis::cmd("RL.PEEK")
        .arg("p")
        .query::<Value>(&mut c)
        .is_err());
    assert_eq!(kind(&mut c, "p"), "hash");
}

#[test]
fn replicas_and_aof_hold_the_same_bucket() {
    let master = Server::start(&["--rl.adopt-script-keys", "yes", "--appendonly", "yes"]);
    let replica = Server::start(&[]);
    replicate(&replica, &master);
    let mut m = master.conn();
    // Slow enough that no bucket fills (and its key goes) while the test compares digests.
    for i in 0..50u64 {
        script(&mut m, &format!("r:{i}"), "0.02", "50", i);
    }
    for i in 0..50u64 {
        let _ = take(&mut m, &format!("r:{i}"), 0.02, 50.0, 1);
    }
    let _ = take(&mut m, "r:0", 0.005, 50.0, 1); // and a limit change after adoption
    wait_synced(&master, &replica);
    let mut r = replica.conn();
    assert_eq!(kind(&mut r, "r:7"), "rl-bucket");
    assert_eq!(dataset_digest(&mut m), dataset_digest(&mut r));
    for i in [0, 7, 49] {
        let k = format!("r:{i}");
        assert_eq!(digest(&mut m, &k), digest(&mut r, &k));
    }
    let before = dataset_digest(&mut m);
    let _: String = query(&mut m, &["DEBUG", "LOADAOF"]);
    assert_eq!(dataset_digest(&mut m), before, "AOF replay");
}

/// RL.RESERVE adopts the script's hash too, at its level (docs/migrating.md lists it with
/// RL.TAKE, RL.LEASE and RL.MTAKE); RL.PEEK, RL.RETURN and RL.REFUND do not.
#[test]
fn reserve_adopts_at_the_scripts_level_and_readers_do_not() {
    let s = Server::start(&["--rl.adopt-script-keys", "yes"]);
    let mut c = s.conn();
    // Left with 2 of 100 tokens, refilling one every 100 s.
    script(&mut c, "r", "0.01", "100", 98);
    for args in [
        &["RL.PEEK", "r"][..],
        &["RL.RETURN", "r", "1", "1"],
        &["RL.REFUND", "r", "1"],
    ] {
        let mut cmd = redis::cmd(args[0]);
        cmd.arg(&args[1..]);
        let e = cmd.query::<redis::Value>(&mut c).unwrap_err();
        assert!(e.to_string().contains("WRONGTYPE"), "{args:?}: {e}");
        assert_eq!(kind(&mut c, "r"), "hash", "{args:?} adopted it");
    }
    // Three tokens: two are there, the third comes in (up to) 100 s, within max_wait.
    let v: Vec<redis::Value> = query(&mut c, &["RL.RESERVE", "r", "0.01", "100", "3", "200000"]);
    assert_eq!(v[0], redis::Value::Int(3), "{v:?}");
    let wait: i64 = redis::from_redis_value(&v[1]).unwrap();
    assert!(
        (1..=100_000).contains(&wait),
        "waited {wait} ms: not the script's level"
    );
    assert_eq!(kind(&mut c, "r"), "rl-bucket");
    assert_eq!(info_field(&mut c, "rl", "rl_adopted"), 1);
}
