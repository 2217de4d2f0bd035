//! Writes to keys whose time has passed (the per-caller path: a bucket refilled to full and
//! its key went away). Where the server lets a module open such a key without deleting it
//! (`REDISMODULE_OPEN_KEY_ACCESS_EXPIRED`, Redis 8.0+), a compact bucket is reused in place
//! and the write propagates its one effect, no `DEL`; elsewhere the server deletes the key
//! first, as it always did. Either way a replica and an AOF replay end with the master's
//! exact state, and the reply is the one an absent key gets.

mod support;
use std::time::Duration;
use support::*;

/// Whether this server reuses expired buckets in place (the module says so at load): Redis
/// 8.0 and later do (`REDISMODULE_OPEN_KEY_ACCESS_EXPIRED`), Redis 7 and Valkey do not.
fn reuses(s: &Server) -> bool {
    let log = s.log();
    assert!(log.contains("expired buckets written to are"), "{log}");
    let says = log.contains("expired buckets written to are reused in place");
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query(&mut s.conn())
        .unwrap();
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.trim().to_string())
    };
    let valkey =
        field("valkey_version:").is_some() || field("server_name:") == Some("valkey".into());
    let major: u32 = field("redis_version:")
        .unwrap()
        .split('.')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(says, !valkey && major >= 8, "{info}");
    says
}

fn cmd(c: &mut redis::Connection, args: &[&str]) -> redis::RedisResult<redis::Value> {
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    cmd.query(c)
}

/// Keys of every kind a write can find expired, each set to go within 30 ms.
fn first_round(m: &mut redis::Connection) -> Vec<String> {
    let mut keys = Vec::new();
    for i in 0..20 {
        // Compact buckets (reused where the server allows it).
        let k = format!("c:{i}");
        assert_eq!(take(m, &k, 100.0, 10.0, 1 + i % 3), (1 + i % 3) as i64);
        keys.push(k);
    }
    for i in 0..5 {
        // A lease table, a version, a limit the compact form cannot hold: deleted first.
        let k = format!("l:{i}");
        let _: redis::Value = cmd(m, &["RL.LEASE", &k, "100", "10", "2", "20"]).unwrap();
        keys.push(k);
        let k = format!("v:{i}");
        let _: i64 = query(m, &["RL.TAKE", &k, "100", "10", "1", "VERSION", "3"]);
        keys.push(k);
        let k = format!("o:{i}");
        let _: i64 = query(m, &["RL.TAKE", &k, "333.3333333333", "1", "1"]);
        keys.push(k);
        // Another kind: a write finds WRONGTYPE until it expires.
        let k = format!("s:{i}");
        let _: () = query(m, &["SET", &k, "x", "PX", "20"]);
        keys.push(k);
    }
    keys
}

#[test]
fn writes_to_expired_keys_reach_replica_and_aof_exactly() {
    let master = Server::start(&[
        "--appendonly",
        "yes",
        "--aof-use-rdb-preamble",
        "no",
        "--loglevel",
        "notice",
    ]);
    let replica = Server::start(&[]);
    replicate(&replica, &master);
    let mut m = master.conn();
    no_active_expire(&mut m);
    let keys = first_round(&mut m);
    wait_synced(&master, &replica);
    std::thread::sleep(Duration::from_millis(80));
    let expired_before = info_field(&mut m, "stats", "expired_keys");

    // Every write finds its key expired: an absent key's answers, under the caller's limit
    // (a slow one, so that the keys live while they are compared).
    for (i, k) in keys.iter().enumerate() {
        let got: redis::Value = match i % 4 {
            0 => cmd(&mut m, &["RL.TAKE", k, "0.01", "10", "10", "WITHSTATE"]).unwrap(),
            1 => cmd(&mut m, &["RL.RESERVE", k, "0.01", "10", "3", "0"]).unwrap(),
            2 => cmd(&mut m, &["RL.LEASE", k, "0.01", "10", "4", "60000"]).unwrap(),
            _ => cmd(&mut m, &["RL.TAKE", k, "0.5", "20", "2"]).unwrap(),
        };
        if i % 4 == 0 {
            // A full bucket of 10 under the caller's limit: granted, 0 left.
            let v: (i64, f64, i64, i64) = redis::from_redis_value(&got).unwrap();
            assert_eq!((v.0, v.1), (10, 0.0), "{k}");
        }
    }
    // MTAKE across a reused key and a new one.
    let _: redis::Value = cmd(
        &mut m,
        &["RL.MTAKE", "1", "c:1", "0.01", "10", "new:1", "0.01", "10"],
    )
    .unwrap();
    wait_synced(&master, &replica);

    let mut r = replica.conn();
    let want: Vec<String> = keys.iter().map(|k| digest(&mut m, k)).collect();
    let got: Vec<String> = keys.iter().map(|k| digest(&mut r, k)).collect();
    assert_eq!(got, want, "replica");
    assert_eq!(dataset_digest(&mut r), dataset_digest(&mut m));
    let ttl = |c: &mut redis::Connection| -> Vec<i64> {
        keys.iter()
            .map(|k| query::<i64>(c, &["PEXPIRETIME", k]))
            .collect()
    };
    assert_eq!(ttl(&mut r), ttl(&mut m), "expiry on the replica");

    // What the writes propagated: no DEL of a compact bucket where it is reused, a DEL
    // (or UNLINK) of every other expired key.
    let _: () = query(&mut m, &["CONFIG", "SET", "appendfsync", "always"]);
    let deleted: Vec<String> = aof_commands(&master)
        .into_iter()
        .filter(|c| matches!(c[0].to_ascii_uppercase().as_str(), "DEL" | "UNLINK"))
        .map(|c| c[1].clone())
        .collect();
    let compact = keys.iter().filter(|k| k.starts_with("c:")).count() as u64;
    let others = keys.len() as u64 - compact;
    let expired = info_field(&mut m, "stats", "expired_keys") - expired_before;
    if reuses(&master) {
        assert!(
            deleted.iter().all(|k| !k.starts_with("c:")),
            "a reused bucket was deleted: {deleted:?}"
        );
        assert_eq!(expired, others, "expired by the server");
    } else {
        assert!(keys.iter().all(|k| deleted.contains(k)), "{deleted:?}");
        assert_eq!(expired, keys.len() as u64);
    }

    // The AOF replayed ends with the same state.
    let _: String = query(&mut m, &["DEBUG", "LOADAOF"]);
    let replayed: Vec<String> = keys.iter().map(|k| digest(&mut m, k)).collect();
    assert_eq!(replayed, want, "AOF replay");
    assert_eq!(ttl(&mut m), ttl(&mut r), "expiry after the AOF replay");
}

/// A call that writes nothing (a refused call, a refund to an absent key) finds an expired
/// bucket absent, and the server expires it as it always did: deleted, its `DEL` sent.
#[test]
fn a_call_that_writes_nothing_leaves_an_expired_bucket_alone() {
    let master = Server::start(&["--appendonly", "yes", "--aof-use-rdb-preamble", "no"]);
    let replica = Server::start(&[]);
    replicate(&replica, &master);
    let mut m = master.conn();
    no_active_expire(&mut m);
    assert_eq!(take(&mut m, "k", 100.0, 10.0, 1), 1);
    std::thread::sleep(Duration::from_millis(50));
    // n beyond a full bucket's tokens: refused before anything; a refund to a full bucket.
    assert!(cmd(&mut m, &["RL.TAKE", "k", "100", "10", "11"]).is_err());
    let _: redis::Value = cmd(&mut m, &["RL.REFUND", "k", "3"]).unwrap();
    // Deleted by the call itself (an EXISTS would delete it too).
    assert_eq!(query::<i64>(&mut m, &["DBSIZE"]), 0);
    assert_eq!(peek_tokens(&mut m, "k"), None);
    wait_synced(&master, &replica);
    let mut r = replica.conn();
    assert_eq!(query::<i64>(&mut r, &["EXISTS", "k"]), 0);
    // And the next write makes a full bucket under its caller's limit.
    let v = take_state(&mut m, "k", 0.01, 5.0, 5);
    assert_eq!((v.0, v.1), (5, 0.0));
    wait_synced(&master, &replica);
    assert_eq!(digest(&mut r, "k"), digest(&mut m, "k"));
}
