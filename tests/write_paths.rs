//! Every write path (and its options) reproduced exactly on a replica,
//! after DEBUG RELOAD and after an AOF rewrite (no RDB preamble) plus restart; calls that
//! must write nothing send nothing to replicas or the AOF; extreme accepted limits. After
//! every kind of write a key's expiry is its time to full, also for a key that lost it.

mod support;
use support::*;

/// Sends `args` (command name first) and returns the reply.
fn run(c: &mut Connection, args: &[&str]) -> Value {
    query(c, args)
}

/// `RL.LEASE` (arguments after the command name) → (granted, lease_id, ttl_ms, retry_ms).
fn lease(c: &mut Connection, args: &[&str]) -> (i64, i64, i64, i64) {
    let v: Vec<i64> = redis::cmd("RL.LEASE").arg(args).query(c).unwrap();
    assert_eq!(v.len(), 4, "reply {v:?}");
    (v[0], v[1], v[2], v[3])
}

fn int(c: &mut Connection, args: &[&str]) -> i64 {
    query(c, args)
}

/// For each key: (exists, digest, PEXPIRETIME).
fn snapshot(c: &mut Connection, keys: &[&str]) -> Vec<(String, bool, String, i64)> {
    keys.iter()
        .map(|k| {
            let exists: i64 = c.exists(*k).unwrap();
            let d = if exists == 1 {
                digest(c, k)
            } else {
                String::new()
            };
            let at: i64 = redis::cmd("PEXPIRETIME").arg(*k).query(c).unwrap();
            (k.to_string(), exists == 1, d, at)
        })
        .collect()
}

const KEYS: &[&str] = &[
    "t:init-denied",
    "t:init-granted",
    "t:plain",
    "l:a",
    "l:new-denied",
    "l:new2",
    "r:full",
    "m:a",
    "m:b",
    "m:c",
    "s:shadow",
    "tx",
    "lua",
    "x:max",
    "x:slowest",
];

/// Every command and option that writes, on a master with a replica and a command-form AOF.
fn workload(m: &mut Connection) {
    // TAKE: INIT on a new key, denied (stored: created below full) and granted.
    assert_eq!(
        int(
            m,
            &["RL.TAKE", "t:init-denied", "0.001", "10", "5", "INIT", "2"]
        ),
        0
    );
    assert_eq!(
        int(
            m,
            &["RL.TAKE", "t:init-granted", "0.001", "10", "1", "INIT", "3"]
        ),
        1
    );
    // A plain take, then a limit change.
    assert_eq!(int(m, &["RL.TAKE", "t:plain", "0.001", "10", "4"]), 4);
    assert_eq!(int(m, &["RL.TAKE", "t:plain", "0.002", "8", "1"]), 1);
    // LEASE: plain, MIN, renewal with RETURN, denied, an expired lease pruned by a later write.
    let (g, a1, _, _) = lease(m, &["l:a", "0.001", "100", "30", "600000"]);
    assert_eq!(g, 30);
    let (g, a2, _, _) = lease(m, &["l:a", "0.001", "100", "10", "600000", "MIN", "5"]);
    assert_eq!(g, 10);
    let a1s = a1.to_string();
    let (g, a3, _, _) = lease(
        m,
        &["l:a", "0.001", "100", "50", "600000", "RETURN", &a1s, "7"],
    );
    assert_eq!(g, 50);
    let (g, _, _, _) = lease(m, &["l:a", "0.001", "100", "1000", "600000", "MIN", "90"]);
    assert_eq!(g, 0);
    let (g, _short, _, _) = lease(m, &["l:a", "0.001", "100", "1", "1"]);
    assert_eq!(g, 1);
    std::thread::sleep(std::time::Duration::from_millis(20));
    let (g, _, _, _) = lease(m, &["l:a", "0.001", "100", "1", "600000"]);
    assert_eq!(g, 1);
    // A return that leaves leases, and a take on a leased bucket.
    assert_eq!(int(m, &["RL.RETURN", "l:a", &a2.to_string(), "3"]), 3);
    assert_eq!(int(m, &["RL.TAKE", "l:a", "0.001", "100", "2"]), 2);
    let _ = a3;
    // LEASE with INIT: denied on a new key (stored), and granted with a RETURN of nothing.
    let (g, _, _, _) = lease(
        m,
        &[
            "l:new-denied",
            "0.001",
            "100",
            "20",
            "600000",
            "MIN",
            "10",
            "INIT",
            "3",
        ],
    );
    assert_eq!(g, 0);
    let (g, _, _, _) = lease(
        m,
        &[
            "l:new2", "0.001", "100", "20", "600000", "INIT", "50", "RETURN", "12345", "1",
        ],
    );
    assert_eq!(g, 20);
    // A return that makes the bucket full: the key goes (DEL is the effect).
    let (g, rid, _, _) = lease(m, &["r:full", "0.0009765625", "100", "5", "600000"]);
    assert_eq!(g, 5);
    assert_eq!(int(m, &["RL.RETURN", "r:full", &rid.to_string(), "5"]), 5);
    let gone: i64 = m.exists("r:full").unwrap();
    assert_eq!(gone, 0, "a full bucket with no lease is deleted");
    // MTAKE: granted, denied, denied with INIT creating a bucket.
    let v = run(
        m,
        &[
            "RL.MTAKE",
            "2",
            "m:a",
            "0.001",
            "10",
            "m:b",
            "0.001",
            "5",
            "WITHSTATE",
        ],
    );
    assert!(matches!(&v, Value::Array(x) if x.len() == 4), "{v:?}");
    let v: (i64, Value, i64) = redis::cmd("RL.MTAKE")
        .arg(&["5", "m:a", "0.001", "10", "m:b", "0.001", "5"])
        .query(m)
        .unwrap();
    assert_eq!(v.0, 0);
    let v: (i64, Value, i64) = redis::cmd("RL.MTAKE")
        .arg(&["4", "m:a", "0.001", "10", "m:c", "0.001", "10", "INIT", "1"])
        .query(m)
        .unwrap();
    assert_eq!(v.0, 0);
    // Shadow mode: denials answered as grants, the same writes as enforcing.
    assert_eq!(int(m, &["RL.TAKE", "s:shadow", "0.001", "10", "9"]), 9);
    set_mode(m, "shadow");
    assert_eq!(int(m, &["RL.TAKE", "s:shadow", "0.001", "10", "5"]), 5);
    let (g, id, _, _) = lease(m, &["s:shadow", "0.001", "10", "6", "600000", "MIN", "6"]);
    assert_eq!((g, id), (6, 0));
    let (g, id, _, _) = lease(m, &["s:shadow", "0.001", "10", "6", "600000"]);
    assert_eq!(g, 1, "a real partial grant in shadow mode");
    assert!(id > 0);
    let v: (i64, Value, i64) = redis::cmd("RL.MTAKE")
        .arg(&["3", "s:shadow", "0.001", "10", "m:b", "0.001", "5"])
        .query(m)
        .unwrap();
    assert_eq!(v.0, 3);
    set_mode(m, "enforce");
    // MULTI/EXEC with a take, a lease and its return.
    let (_, tid, _, _) = lease(m, &["tx", "0.001", "50", "10", "600000"]);
    let _: Value = redis::pipe()
        .atomic()
        .cmd("RL.TAKE")
        .arg(&["tx", "0.001", "50", "3"])
        .cmd("RL.LEASE")
        .arg(&["tx", "0.001", "50", "4", "600000"])
        .cmd("RL.RETURN")
        .arg("tx")
        .arg(tid)
        .arg(6)
        .query(m)
        .unwrap();
    // A script doing the same.
    let _: Value = redis::cmd("EVAL")
        .arg(
            "local l = redis.call('RL.LEASE', KEYS[1], '0.001', '50', 8, 600000); \
             redis.call('RL.TAKE', KEYS[1], '0.001', '50', 2); \
             return redis.call('RL.RETURN', KEYS[1], string.format('%d', l[2]), 5)",
        )
        .arg(1)
        .arg("lua")
        .query(m)
        .unwrap();
    // Extreme accepted limits: the largest values, and the longest fill (100 years).
    assert_eq!(
        int(
            m,
            &["RL.TAKE", "x:max", "1000000", "1e15", "999999999999999"]
        ),
        999_999_999_999_999
    );
    let v: (i64, f64, i64, i64) = redis::cmd("RL.TAKE")
        .arg(&[
            "x:slowest",
            "1e-9",
            "3.15576",
            "1",
            "INIT",
            "0",
            "WITHSTATE",
        ])
        .query(m)
        .unwrap();
    assert_eq!(v.0, 0);
    // Rounded up to whole ms after float arithmetic: at most 1 ms over.
    assert!((0..=1).contains(&(v.2 - 1_000_000_000_000)), "1e9 s: {v:?}");
    assert!(
        (0..=1).contains(&(v.3 - 3_155_760_000_000)),
        "100 years: {v:?}"
    );
}

#[test]
fn every_write_path_is_reproduced_by_replica_reload_and_aof_rewrite() {
    let mut master = Server::start(&["--appendonly", "yes", "--aof-use-rdb-preamble", "no"]);
    let replica = Server::start(&[]);
    replicate(&replica, &master);
    let mut m = master.conn();
    workload(&mut m);
    wait_synced(&master, &replica);
    let mut r = replica.conn();
    let on_master = snapshot(&mut m, KEYS);
    assert_eq!(snapshot(&mut r, KEYS), on_master, "replica differs");
    assert_eq!(dataset_digest(&mut r), dataset_digest(&mut m));
    for (k, exists, _, at) in &on_master {
        if k != "r:full" {
            assert!(*exists && *at > 0, "{k} exists with an expiry");
        }
    }

    let _: String = redis::cmd("DEBUG").arg("RELOAD").query(&mut m).unwrap();
    assert_eq!(snapshot(&mut m, KEYS), on_master, "after DEBUG RELOAD");

    rewrite_aof(&mut m);
    drop(m);
    master.restart();
    let mut m = master.conn();
    assert_eq!(
        snapshot(&mut m, KEYS),
        on_master,
        "after an AOF rewrite and restart"
    );
}

#[test]
fn calls_that_change_nothing_send_nothing_to_replicas_or_the_aof() {
    // fsync always: every write is in the file before its reply. (With everysec a write
    // is held back while a background fsync runs, which a busy machine makes slow, so the
    // size read as the baseline could lack the setup's writes.)
    let s = Server::start(&["--appendonly", "yes", "--appendfsync", "always"]);
    let mut c = s.conn();
    assert_eq!(int(&mut c, &["RL.TAKE", "k", "0.001", "10", "10"]), 10);
    let (g, id, _, _) = lease(&mut c, &["l", "0.001", "10", "10", "600000"]);
    assert_eq!(g, 10);
    let _: () = c.set("str", "x").unwrap();
    let ids = id.to_string();
    assert_eq!(int(&mut c, &["RL.RETURN", "l", &ids, "0"]), 0);
    let offset = info_field(&mut c, "replication", "master_repl_offset");
    let aof = info_field(&mut c, "persistence", "aof_current_size");
    let (dk, dl) = (digest(&mut c, "k"), digest(&mut c, "l"));

    for mode in ["enforce", "shadow"] {
        set_mode(&mut c, mode);
        int(&mut c, &["RL.TAKE", "k", "0.001", "10", "1"]);
        let _ = run(
            &mut c,
            &["RL.TAKE", "k", "0.001", "10", "3", "WITHSTATE", "INIT", "5"],
        );
        lease(&mut c, &["k", "0.001", "10", "5", "1000"]);
        lease(
            &mut c,
            &[
                "k", "0.001", "10", "5", "1000", "MIN", "2", "RETURN", "99", "1",
            ],
        );
        lease(
            &mut c,
            &["l", "0.001", "10", "5", "1000", "RETURN", &ids, "3"],
        );
        assert_eq!(
            int(&mut c, &["RL.RETURN", "l", &ids, "5"]),
            0,
            "already closed"
        );
        assert_eq!(int(&mut c, &["RL.RETURN", "l", "1", "5"]), 0, "unknown");
        assert_eq!(int(&mut c, &["RL.RETURN", "none", "1", "5"]), 0, "no key");
        let _ = run(
            &mut c,
            &["RL.MTAKE", "1", "k", "0.001", "10", "l", "0.001", "10"],
        );
        let _ = run(&mut c, &["RL.PEEK", "k"]);
        let _ = run(&mut c, &["RL.PEEK", "l"]);
        let _ = run(&mut c, &["RL.PEEK", "none"]);
        // Errors: the new bucket before the wrong-typed key must not be created.
        for bad in [
            &[
                "RL.MTAKE", "1", "new", "0.001", "10", "str", "0.001", "10", "INIT", "0",
            ][..],
            &["RL.TAKE", "str", "0.001", "10", "1", "INIT", "0"],
            &["RL.LEASE", "str", "0.001", "10", "1", "1000", "INIT", "0"],
            &[
                "RL.LEASE", "new", "0.001", "10", "5", "1000", "MIN", "11", "INIT", "0",
            ],
            &["RL.TAKE", "new", "0.001", "10", "11", "INIT", "0"],
            &["RL.RETURN", "str", "1", "1"],
            &["RL.PEEK", "str"],
        ] {
            let mut cmd = redis::cmd(bad[0]);
            for a in &bad[1..] {
                cmd.arg(*a);
            }
            assert!(cmd.query::<Value>(&mut c).is_err(), "{bad:?} must fail");
        }
        let created: i64 = c.exists("new").unwrap();
        assert_eq!(created, 0, "{mode}: an error created a bucket");
    }
    set_mode(&mut c, "enforce");
    assert_eq!(
        info_field(&mut c, "replication", "master_repl_offset"),
        offset,
        "something was propagated"
    );
    assert_eq!(info_field(&mut c, "persistence", "aof_current_size"), aof);
    assert_eq!((digest(&mut c, "k"), digest(&mut c, "l")), (dk, dl));
}

#[test]
fn extreme_accepted_inputs_answer_without_internal_errors() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    // The whole of the largest bucket, in one take.
    let v: (i64, f64, i64, i64) = redis::cmd("RL.TAKE")
        .arg(&["big", "1e15", "1e15", "1000000000000000", "WITHSTATE"])
        .query(&mut c)
        .unwrap();
    assert_eq!(v.0, 1_000_000_000_000_000);
    assert!(v.1 >= 0.0 && v.3 <= 1000, "{v:?}");
    // A lease asking for i64::MAX tokens gets what is there; its return credits at most that.
    let (g, id, ttl, _) = lease(
        &mut c,
        &["huge", "1e15", "1e15", "9223372036854775807", "86400000"],
    );
    assert_eq!((g, ttl), (1_000_000_000_000_000, 86_400_000));
    let credited = int(
        &mut c,
        &["RL.RETURN", "huge", &id.to_string(), "9223372036854775807"],
    );
    // It takes back what the bucket lacks: at 1e15 tokens/s the microseconds between the
    // two calls refilled some of it already.
    assert!(
        (900_000_000_000_000..=1_000_000_000_000_000).contains(&credited),
        "{credited}"
    );
    let (g, _, _, _) = lease(
        &mut c,
        &[
            "huge",
            "1e15",
            "1e15",
            "9223372036854775807",
            "86400000",
            "MIN",
            "1000000000000000",
        ],
    );
    assert!(g == 0 || g == 1_000_000_000_000_000);
    // The smallest rate, and the longest fill allowed.
    let (g, _, _, retry) = lease(
        &mut c,
        &["tiny", "1e-9", "3.15576", "5", "1000", "INIT", "0"],
    );
    assert_eq!(g, 0);
    assert!(
        (0..=1).contains(&(retry - 1_000_000_000_000)),
        "1e9 s: {retry}"
    );
    let at: i64 = redis::cmd("PEXPIRETIME").arg("tiny").query(&mut c).unwrap();
    assert!(at > 0, "stored with an expiry: {at}");
    let v: (i64, f64, i64, i64) = redis::cmd("RL.TAKE")
        .arg(&["slowest", "1e-9", "3.15576", "3", "INIT", "0", "WITHSTATE"])
        .query(&mut c)
        .unwrap();
    assert_eq!(v.0, 0);
    assert!((0..=1).contains(&(v.2 - 3_000_000_000_000)), "{v:?}");
    assert!((0..=1).contains(&(v.3 - 3_155_760_000_000)), "{v:?}");
    let at: i64 = redis::cmd("PEXPIRETIME")
        .arg("slowest")
        .query(&mut c)
        .unwrap();
    let now_ms: i64 = {
        let t: (String, String) = redis::cmd("TIME").query(&mut c).unwrap();
        t.0.parse::<i64>().unwrap() * 1000
    };
    assert!(
        at - now_ms > 3_155_000_000_000,
        "expires in 100 years: {at}"
    );
    // Just over 100 years is refused.
    let err = redis::cmd("RL.TAKE")
        .arg(&["slowest2", "1e-9", "3.156", "1"])
        .query::<i64>(&mut c)
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("cap / rate must be at most 100 years"),
        "{err}"
    );
    assert_eq!(info_field(&mut c, "rl", "rl_errors"), 1, "only the refusal");
}

/// Over-issue: a limit change must carry tokens over from the exact old limit (a cap kept
/// as f32 rounds 1073741889 up to 1073741952: 63 tokens would appear).
#[test]
fn limit_change_mints_no_tokens_from_the_stored_cap_rounding() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    assert_eq!(
        int(&mut c, &["RL.TAKE", "k", "0.5", "1073741889", "1073741889"]),
        1_073_741_889
    );
    // The rate changes; the bucket is empty and refills 1 token per second at most.
    assert_eq!(
        int(&mut c, &["RL.TAKE", "k", "1", "1073741889", "50"]),
        0,
        "tokens minted by a limit change"
    );
}

/// Over-issue: a rate change too small for an f32 to see is still a change: an empty bucket
/// of 1e9 tokens at 0.5/s, read at 0.49999999/s, must not hold 20 tokens at once.
#[test]
fn rate_change_below_f32_precision_mints_no_tokens() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    assert_eq!(
        int(&mut c, &["RL.TAKE", "k", "0.5", "1000000000", "1000000000"]),
        1_000_000_000
    );
    assert_eq!(
        int(&mut c, &["RL.TAKE", "k", "0.49999999", "1000000000", "10"]),
        0,
        "10 tokens need 20 s at this rate"
    );
}

/// Over-issue: RL.RETURN credits exactly the unused tokens, computed with the exact rate.
#[test]
fn return_credits_no_more_than_the_unused_tokens() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let (g, id, _, _) = lease(&mut c, &["k", "0.7", "2000000000", "2000000000", "600000"]);
    assert_eq!(g, 2_000_000_000);
    assert_eq!(
        int(&mut c, &["RL.RETURN", "k", &id.to_string(), "1000000000"]),
        1_000_000_000
    );
    // 1e9 tokens are back; 10 more would take 14 s at 0.7/s.
    assert_eq!(
        int(&mut c, &["RL.TAKE", "k", "0.7", "2000000000", "1000000010"]),
        0,
        "the return credited more than it was given"
    );
}

/// INFO: DEBUG RELOAD frees and reloads every key; a live lease it reloads is not expired.
#[test]
fn debug_reload_counts_no_lease_as_expired() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let (g, id, _, _) = lease(&mut c, &["k", "0.001", "10", "5", "600000"]);
    assert_eq!(g, 5);
    let _: String = redis::cmd("DEBUG").arg("RELOAD").query(&mut c).unwrap();
    // The count must settle at the one lease once the old values are freed.
    gauge_settles(&mut c, "rl_leases_active", 1);
    assert_eq!(
        info_field(&mut c, "rl", "rl_leases_expired"),
        0,
        "a live lease counted as expired"
    );
    assert_eq!(int(&mut c, &["RL.RETURN", "k", &id.to_string(), "5"]), 5);
}

/// RL.RETURN of a whole lease leaves the bucket as it was (full, so the key goes).
#[test]
fn returning_a_whole_lease_restores_a_full_bucket() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let (g, id, _, _) = lease(&mut c, &["k", "0.001", "100", "5", "600000"]);
    assert_eq!(g, 5);
    assert_eq!(int(&mut c, &["RL.RETURN", "k", &id.to_string(), "5"]), 5);
    let exists: i64 = c.exists("k").unwrap();
    assert_eq!(exists, 0, "full with no lease left: the key is deleted");
    assert_eq!(int(&mut c, &["RL.TAKE", "k", "0.001", "100", "100"]), 100);
}

/// Limits whose numbers do not fit the compact encoding (1/3) are kept exact too, through
/// replication and a reload.
#[test]
fn limits_with_many_digits_stay_exact() {
    let master = Server::start(&[]);
    let replica = Server::start(&[]);
    replicate(&replica, &master);
    let mut c = master.conn();
    let third = format!("{}", 1.0f64 / 3.0);
    assert_eq!(int(&mut c, &["RL.TAKE", "k", &third, "30", "30"]), 30);
    assert_eq!(int(&mut c, &["RL.TAKE", "k", &third, "30", "1"]), 0);
    wait_synced(&master, &replica);
    let mut r = replica.conn();
    assert_eq!(digest(&mut r, "k"), digest(&mut c, "k"));
    let before = digest(&mut c, "k");
    let _: String = redis::cmd("DEBUG").arg("RELOAD").query(&mut c).unwrap();
    assert_eq!(digest(&mut c, "k"), before);
    let v: Vec<(String, Value)> = redis::cmd("RL.PEEK").arg("k").query(&mut c).unwrap();
    assert_eq!(v[1].0, "rate");
    let rate: f64 = redis::from_redis_value(&v[1].1).unwrap();
    assert_eq!(rate, 1.0 / 3.0);
}

/// After `PERSIST` or `RESTORE ... 0`, the next write makes the expiry the bucket's
/// time-to-full again; an AOF rewrite of a key without expiry keeps it without one.
#[test]
fn a_key_without_expiry_gets_it_back_on_the_next_write_and_aof_keeps_it_exact() {
    let mut s = Server::start(&["--appendonly", "yes", "--aof-use-rdb-preamble", "no"]);
    let mut c = s.conn();
    let take = |c: &mut Connection, key: &str| -> i64 {
        redis::cmd("RL.TAKE")
            .arg(&[key, "1", "1000"])
            .query(c)
            .unwrap()
    };
    let pttl =
        |c: &mut Connection, key: &str| -> i64 { redis::cmd("PTTL").arg(key).query(c).unwrap() };
    // Each take of one token at 1/s moves the moment the bucket is full again 1 s later
    // (from now, if it was full already): the expiry after a second take is 2 s after the
    // first one, or 1 s after the second. Server times bracket both takes.
    let takes_twice = |c: &mut Connection, key: &str, between: &mut dyn FnMut(&mut Connection)| {
        let first = server_ms(c);
        assert_eq!(take(c, key), 1);
        let first = (first, server_ms(c));
        between(c);
        assert_eq!(pttl(c, key), -1);
        assert_eq!(take(c, key), 1);
        let second = server_ms(c);
        let at: i64 = redis::cmd("PEXPIRETIME").arg(key).query(c).unwrap();
        let (lo, hi) = (
            first.0 + 2_000 - 1,
            (first.1 + 2_000).max(second + 1_000) + 1,
        );
        assert!(
            (lo..=hi).contains(&at),
            "{key}: PEXPIRETIME {at}, expected {lo}..={hi}"
        );
    };
    // The next write lands in the same millisecond often; either way the expiry is back.
    takes_twice(&mut c, "p", &mut |c| {
        let _: i64 = redis::cmd("PERSIST").arg("p").query(c).unwrap();
    });

    takes_twice(&mut c, "r", &mut |c| {
        let payload = dump(c, "r");
        let _: () = redis::cmd("RESTORE")
            .arg("r")
            .arg(0)
            .arg(&payload)
            .arg("REPLACE")
            .query(c)
            .unwrap();
        assert_eq!(pttl(c, "r"), -1);
        // A key left without expiry by RESTORE: an AOF rewrite and restart keep it so.
        let _: () = redis::cmd("RESTORE")
            .arg("norm")
            .arg(0)
            .arg(&payload)
            .query(c)
            .unwrap();
    });
    let before = dataset_digest(&mut c);
    let mut c = s.rewrite_aof_and_restart(c);
    assert_eq!(pttl(&mut c, "norm"), -1);
    assert_eq!(
        dataset_digest(&mut c),
        before,
        "AOF rewrite changed expiries"
    );
}

fn cmd(c: &mut Connection, args: &[&str]) -> redis::RedisResult<Value> {
    redis::cmd(args[0]).arg(&args[1..]).query(c)
}

/// Rule 4: after PERSIST, RESTORE ... 0, a hand-set EXPIRE (earlier or later), the next
/// write (take, lease, return, mtake) puts the expiry back at the bucket's time-to-full
/// (or its last lease), on the master and the replica alike.
#[test]
fn expiry_is_time_to_full_after_every_kind_of_write() {
    let master = Server::start(&[]);
    let replica = Server::start(&[]);
    replicate(&replica, &master);
    let mut c = master.conn();
    let pexpiretime =
        |c: &mut Connection, k: &str| -> i64 { redis::cmd("PEXPIRETIME").arg(k).query(c).unwrap() };
    // The key's expiry, and the moment PEEK says the bucket is full: its reset_after_ms
    // from the server time PEEK ran at (bracketed by two TIME readings; 1 ms each side for
    // rounding).
    let expiry_and_full_at =
        |c: &mut Connection, k: &str| -> (i64, std::ops::RangeInclusive<i64>) {
            let at = pexpiretime(c, k);
            let before = server_ms(c);
            let v: Vec<Value> = redis::cmd("RL.PEEK").arg(k).query(c).unwrap();
            let after = server_ms(c);
            let reset = match &v[7] {
                Value::Int(n) => *n,
                other => panic!("{other:?}"),
            };
            (at, before + reset - 1..=after + reset + 1)
        };
    assert_eq!(int(&mut c, &["RL.TAKE", "k", "0.01", "100", "10"]), 10);
    for tamper in [
        vec!["PERSIST", "k"],
        vec!["PEXPIRE", "k", "5000000"],
        vec!["PEXPIRE", "k", "500000"],
    ] {
        let _: Value = cmd(&mut c, &tamper).unwrap();
        for write in [
            vec!["RL.TAKE", "k", "0.01", "100", "1"],
            vec!["RL.MTAKE", "1", "k", "0.01", "100"],
        ] {
            let _: Value = cmd(&mut c, &write).unwrap();
            let (at, full_at) = expiry_and_full_at(&mut c, "k");
            assert!(
                full_at.contains(&at),
                "{tamper:?} then {write:?}: PEXPIRETIME {at}, full at {full_at:?}"
            );
            let _: Value = cmd(&mut c, &tamper).unwrap();
        }
    }
    // Lease: the expiry covers the lease; RETURN brings it back to time-to-full.
    let v: Vec<i64> = redis::cmd("RL.LEASE")
        .arg(&["k", "0.01", "100", "1", "86400000"])
        .query(&mut c)
        .unwrap();
    let _: i64 = redis::cmd("PERSIST").arg("k").query(&mut c).unwrap();
    let _ = int(&mut c, &["RL.RETURN", "k", &v[1].to_string(), "0"]);
    let (at, full_at) = expiry_and_full_at(&mut c, "k");
    assert!(
        full_at.contains(&at),
        "after RETURN: PEXPIRETIME {at}, full at {full_at:?}"
    );
    // RESTORE ... 0 then a write.
    let payload = dump(&mut c, "k");
    restore_replace(&mut c, "k", &payload).unwrap();
    assert_eq!(pexpiretime(&mut c, "k"), -1);
    assert_eq!(int(&mut c, &["RL.TAKE", "k", "0.01", "100", "1"]), 1);
    assert!(pexpiretime(&mut c, "k") > 0);
    wait_synced(&master, &replica);
    let mut r = replica.conn();
    assert_eq!(dataset_digest(&mut r), dataset_digest(&mut c));
}
