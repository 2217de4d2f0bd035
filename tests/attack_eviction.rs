//! Hostile review of the eviction count (`rl_keys_evicted`, `evicted` per namespace): only
//! `rl` keys the server evicted are counted, never another key that took the name of an
//! `rl` key gone some other way (deleted, overwritten, renamed over).

mod support;

use support::*;

/// `rl_keys_evicted` and the namespace's `evicted` after the server evicts the one key with
/// an expiry (`volatile-lru`), a string named like an `rl` key that `unlink` removed before.
fn evict_string_named(unlink: &[&str]) -> (u64, u64) {
    let s = Server::start(&["--maxmemory", "1gb", "--maxmemory-policy", "volatile-lru"]);
    let mut c = s.conn();
    assert_eq!(take(&mut c, "k:1", 1.0, 10.0, 1), 1);
    let _: () = query(&mut c, &["SET", "other", "x"]);
    let _: Value = query(&mut c, unlink);
    // `k:1` is now a string, the only key that may be evicted.
    if query::<i64>(&mut c, &["EXISTS", "k:1"]) == 0 {
        let _: () = query(&mut c, &["SET", "k:1", "hello"]);
    }
    assert_eq!(query::<String>(&mut c, &["TYPE", "k:1"]), "string");
    let _: i64 = query(&mut c, &["PEXPIRE", "k:1", "100000000"]);
    let _: () = query(&mut c, &["CONFIG", "SET", "maxmemory", "1"]);
    let _: () = query(&mut c, &["CONFIG", "SET", "maxmemory", "0"]);
    assert_eq!(query::<i64>(&mut c, &["EXISTS", "k:1"]), 0, "not evicted");
    assert_eq!(info_field(&mut c, "stats", "evicted_keys"), 1);
    let ns: Vec<Value> = query(&mut c, &["RL.STATS", "k"]);
    let at = ns
        .iter()
        .position(|v| redis::from_redis_value::<String>(v).is_ok_and(|s| s == "evicted"))
        .unwrap();
    let per_ns: u64 = redis::from_redis_value(&ns[at + 1]).unwrap();
    (info_field(&mut c, "rl", "rl_keys_evicted"), per_ns)
}

#[test]
fn a_string_that_took_the_name_of_a_deleted_rl_key_is_not_counted_when_evicted() {
    assert_eq!(evict_string_named(&["DEL", "k:1"]), (0, 0));
}

#[test]
fn a_string_written_over_an_rl_key_is_not_counted_when_evicted() {
    assert_eq!(evict_string_named(&["SET", "k:1", "over"]), (0, 0));
}

#[test]
fn a_string_renamed_over_an_rl_key_is_not_counted_when_evicted() {
    assert_eq!(evict_string_named(&["RENAME", "other", "k:1"]), (0, 0));
}

/// The same inside one transaction: the `rl` key deleted, its name taken by a string and
/// the string evicted (`CONFIG SET maxmemory` evicts at once) with no command starting in
/// between. Name matching cannot tell this from an eviction of the `rl` key; the server's
/// key event (`RedisModuleEvent_Key`, subevent `EVICTED`, Redis 7.2+ and Valkey) carries
/// the evicted key's value, whose type tells.
#[test]
#[ignore = "finding: counted as an rl key (fix: count from RedisModuleEvent_Key where the server has it)"]
fn a_string_that_took_an_rl_keys_name_in_the_same_transaction_is_not_counted() {
    let s = Server::start(&["--maxmemory", "1gb", "--maxmemory-policy", "volatile-lru"]);
    let mut c = s.conn();
    assert_eq!(take(&mut c, "k:1", 1.0, 10.0, 1), 1);
    let _: Value = redis::pipe()
        .atomic()
        .cmd("DEL")
        .arg("k:1")
        .cmd("SET")
        .arg(&["k:1", "hello", "PX", "100000000"])
        .cmd("CONFIG")
        .arg(&["SET", "maxmemory", "1"])
        .query(&mut c)
        .unwrap();
    let _: () = query(&mut c, &["CONFIG", "SET", "maxmemory", "0"]);
    assert_eq!(query::<i64>(&mut c, &["EXISTS", "k:1"]), 0, "not evicted");
    assert_eq!(info_field(&mut c, "stats", "evicted_keys"), 1);
    assert_eq!(info_field(&mut c, "rl", "rl_keys_evicted"), 0);
}
