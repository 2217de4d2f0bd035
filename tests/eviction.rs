//! Eviction: under `maxmemory` with an evicting policy the server may delete any key, a
//! drained bucket among them, which then comes back full. The module cannot stop it; it
//! says so (a warning in the log at load and when the config starts evicting,
//! `rl_eviction_risk` in `INFO rl`) and counts every `rl` key evicted (`rl_keys_evicted`,
//! `evicted` per namespace in `RL.STATS`), and nothing else.

mod support;

use support::*;

fn stats_field(c: &mut Connection, ns: &str, field: &str) -> i64 {
    let v: Vec<Value> = redis::cmd("RL.STATS").arg(ns).query(c).unwrap();
    let i = v
        .iter()
        .position(|x| {
            matches!(x, Value::BulkString(b) if b == field.as_bytes())
                || matches!(x, Value::SimpleString(s) if s == field)
        })
        .unwrap_or_else(|| panic!("{field} in {v:?}"));
    match &v[i + 1] {
        Value::Int(n) => *n,
        other => panic!("{other:?}"),
    }
}

/// Keys of `kind` (a `TYPE` name) left in the keyspace.
fn count_type(c: &mut Connection, kind: &str) -> u64 {
    let keys: Vec<String> = query(c, &["KEYS", "*"]);
    keys.iter()
        .filter(|k| query::<String>(c, &["TYPE", k]) == kind)
        .count() as u64
}

#[test]
fn every_evicted_rl_key_is_counted_and_nothing_else() {
    let s = Server::start(&["--maxmemory", "3mb", "--maxmemory-policy", "allkeys-random"]);
    let mut c = s.conn();
    assert_eq!(info_field(&mut c, "rl", "rl_eviction_risk"), 1);
    let (buckets, shares, permits, strings) = (20000u64, 1000u64, 1000u64, 20000u64);
    let mut pipe = redis::pipe();
    for i in 0..buckets {
        // Drained, and slow to refill: none expires during the test.
        pipe.cmd("RL.TAKE")
            .arg(format!("b:{i}"))
            .arg(0.001)
            .arg(5)
            .arg(5);
    }
    for i in 0..shares {
        pipe.cmd("RL.SHARE")
            .arg(format!("s:{i}"))
            .arg(10)
            .arg(10)
            .arg("h")
            .arg(5)
            .arg(600_000);
    }
    for i in 0..permits {
        pipe.cmd("RL.ACQUIRE")
            .arg(format!("p:{i}"))
            .arg(3)
            .arg(600_000);
    }
    for i in 0..strings {
        pipe.cmd("SET").arg(format!("str:{i}")).arg("x".repeat(100));
    }
    // Replies include OOM errors once memory is full of what cannot go: ignore them.
    let _: redis::RedisResult<Vec<Value>> = pipe.query(&mut c);
    // Stop evicting before counting (every command runs the eviction loop first).
    let _: () = query(&mut c, &["CONFIG", "SET", "maxmemory", "0"]);
    let evicted_all = info_field(&mut c, "stats", "evicted_keys");
    let counted = info_field(&mut c, "rl", "rl_keys_evicted");
    assert!(counted > 0, "nothing evicted: raise the load");
    let left = count_type(&mut c, "rl-bucket")
        + count_type(&mut c, "rl-shares")
        + count_type(&mut c, "rl-permit");
    // Nothing expires here, so every rl key missing was evicted, and every one counted.
    assert_eq!(counted, buckets + shares + permits - left);
    let strings_left = count_type(&mut c, "string");
    assert_eq!(
        evicted_all - counted,
        strings - strings_left,
        "strings counted as rl keys"
    );
    let per_ns = stats_field(&mut c, "b", "evicted")
        + stats_field(&mut c, "s", "evicted")
        + stats_field(&mut c, "p", "evicted");
    assert_eq!(per_ns as u64, counted);
    assert!(s.log().contains("rate-limit key(s)"), "{}", s.log());
    // CONFIG RESETSTAT zeroes the count like every other counter.
    let _: () = query(&mut c, &["CONFIG", "RESETSTAT"]);
    assert_eq!(info_field(&mut c, "rl", "rl_keys_evicted"), 0);
}

#[test]
fn the_log_warns_at_load_and_when_the_policy_starts_evicting() {
    let s = Server::start(&["--maxmemory", "100mb", "--maxmemory-policy", "volatile-lru"]);
    let mut c = s.conn();
    assert!(s.log().contains("WARNING maxmemory is set"), "{}", s.log());
    assert_eq!(info_field(&mut c, "rl", "rl_eviction_risk"), 1);
    let _: () = query(&mut c, &["CONFIG", "SET", "maxmemory-policy", "noeviction"]);
    assert_eq!(info_field(&mut c, "rl", "rl_eviction_risk"), 0);

    let s = Server::start(&[]);
    let mut c = s.conn();
    assert_eq!(info_field(&mut c, "rl", "rl_eviction_risk"), 0);
    assert!(!s.log().contains("WARNING maxmemory"), "{}", s.log());
    // A policy alone is no risk without maxmemory; both together are.
    let _: () = query(
        &mut c,
        &["CONFIG", "SET", "maxmemory-policy", "allkeys-lru"],
    );
    assert_eq!(info_field(&mut c, "rl", "rl_eviction_risk"), 0);
    let _: () = query(&mut c, &["CONFIG", "SET", "maxmemory", "1gb"]);
    assert_eq!(info_field(&mut c, "rl", "rl_eviction_risk"), 1);
    assert!(
        s.log()
            .contains("WARNING maxmemory is set with maxmemory-policy allkeys-lru"),
        "{}",
        s.log()
    );
}

/// `noeviction` refuses writes when memory is full: no key is lost, nothing is counted.
#[test]
fn noeviction_refuses_writes_and_loses_nothing() {
    let s = Server::start(&["--maxmemory", "3mb", "--maxmemory-policy", "noeviction"]);
    let mut c = s.conn();
    let mut refused = 0;
    let mut created = 0u64;
    for i in 0..40000 {
        match redis::cmd("RL.TAKE")
            .arg(format!("b:{i}"))
            .arg(0.001)
            .arg(5)
            .arg(5)
            .query::<i64>(&mut c)
        {
            Ok(_) => created += 1,
            Err(e) => {
                assert!(e.to_string().contains("OOM"), "{e}");
                refused += 1;
                if refused > 10 {
                    break;
                }
            }
        }
    }
    assert!(refused > 0, "memory never filled");
    assert_eq!(count_type(&mut c, "rl-bucket"), created);
    assert_eq!(info_field(&mut c, "rl", "rl_keys_evicted"), 0);
    assert_eq!(info_field(&mut c, "stats", "evicted_keys"), 0);
}

/// The module listens to evictions only once the server may evict (listening costs every
/// write command of the server a little): a `CONFIG SET` that makes it evict starts the
/// count.
#[test]
fn counting_starts_when_a_config_change_makes_the_server_evict() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let _: () = query(
        &mut c,
        &["CONFIG", "SET", "maxmemory-policy", "allkeys-random"],
    );
    let _: () = query(&mut c, &["CONFIG", "SET", "maxmemory", "3mb"]);
    let mut pipe = redis::pipe();
    for i in 0..30000u64 {
        pipe.cmd("RL.TAKE")
            .arg(format!("b:{i}"))
            .arg(0.001)
            .arg(5)
            .arg(5);
    }
    let _: redis::RedisResult<Vec<Value>> = pipe.query(&mut c);
    let _: () = query(&mut c, &["CONFIG", "SET", "maxmemory", "0"]);
    let counted = info_field(&mut c, "rl", "rl_keys_evicted");
    assert!(counted > 0, "nothing evicted");
    assert_eq!(counted, 30000 - count_type(&mut c, "rl-bucket"));
    assert_eq!(counted, info_field(&mut c, "stats", "evicted_keys"));
}
