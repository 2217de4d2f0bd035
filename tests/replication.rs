//! A real replica ends with the master's exact state: writes travel as effects (absolute
//! state), inside MULTI/EXEC and Lua too, and denied or refused calls send nothing. Lease
//! and permit effects (numbers written as text by the module) reach a replica and the AOF
//! exactly; a refused effect changes neither master nor replica.

mod support;
use std::time::Duration;
use support::*;

#[test]
fn replica_matches_master_after_mixed_workload() {
    let master = Server::start(&[]);
    let replica = Server::start(&[]);
    replicate(&replica, &master);
    let mut m = master.conn();
    // Slow limits (minutes to full): a key that expired on the master between the sync
    // and the digests would differ from the replica's until its DEL arrived.
    for i in 0..300 {
        let key = format!("k:{}", i % 17);
        take(&mut m, &key, 0.05 + (i % 3) as f64 / 100.0, 20.0, 1 + i % 4);
    }
    // Inside MULTI/EXEC.
    let _: Value = redis::pipe()
        .atomic()
        .cmd("RL.TAKE")
        .arg("tx")
        .arg(0.01)
        .arg(10)
        .arg(3)
        .cmd("RL.TAKE")
        .arg("tx")
        .arg(0.01)
        .arg(10)
        .arg(2)
        .cmd("RL.TAKE")
        .arg("k:1")
        .arg(0.05)
        .arg(20)
        .query(&mut m)
        .unwrap();
    // Inside a Lua script.
    let _: i64 = redis::cmd("EVAL")
        .arg("redis.call('RL.TAKE', KEYS[1], 0.02, 8, 3); return redis.call('RL.TAKE', KEYS[1], 0.02, 8, 1)")
        .arg(1)
        .arg("lua")
        .query(&mut m)
        .unwrap();
    // A lease too.
    let _: Value = redis::cmd("RL.LEASE")
        .arg("leased")
        .arg(10)
        .arg(100)
        .arg(20)
        .arg(60000)
        .query(&mut m)
        .unwrap();
    wait_synced(&master, &replica);
    let mut r = replica.conn();
    assert_eq!(dataset_digest(&mut r), dataset_digest(&mut m));
    for key in ["tx", "lua", "leased", "k:1", "k:16"] {
        assert_eq!(digest(&mut r, key), digest(&mut m, key), "key {key}");
    }
    let pexpire_m: i64 = redis::cmd("PEXPIRETIME").arg("tx").query(&mut m).unwrap();
    let pexpire_r: i64 = redis::cmd("PEXPIRETIME").arg("tx").query(&mut r).unwrap();
    assert_eq!(pexpire_m, pexpire_r);
}

#[test]
fn denied_call_sends_nothing_to_replicas() {
    let master = Server::start(&[]);
    let replica = Server::start(&[]);
    replicate(&replica, &master);
    let mut m = master.conn();
    assert_eq!(take(&mut m, "k", 0.001, 2.0, 2), 2);
    wait_synced(&master, &replica);
    let offset = info_field(&mut m, "replication", "master_repl_offset");
    for _ in 0..50 {
        assert_eq!(take(&mut m, "k", 0.001, 2.0, 1), 0);
    }
    assert_eq!(
        info_field(&mut m, "replication", "master_repl_offset"),
        offset
    );
    // A grant does move it: the check above can fail.
    assert_eq!(take(&mut m, "other", 1.0, 2.0, 1), 1);
    assert!(info_field(&mut m, "replication", "master_repl_offset") > offset);
}

#[test]
fn replica_does_not_rerun_the_algorithm() {
    // The replica applies the master's result even though its own clock would give another:
    // the effect carries the absolute state, so the replica's digest equals the master's
    // however late it applies it.
    let master = Server::start(&[]);
    let replica = Server::start(&[]);
    replicate(&replica, &master);
    let mut m = master.conn();
    take(&mut m, "slow", 1000.0, 1000.0, 999);
    std::thread::sleep(std::time::Duration::from_millis(50));
    take(&mut m, "slow", 1000.0, 1000.0, 1);
    wait_synced(&master, &replica);
    let mut r = replica.conn();
    assert_eq!(digest(&mut r, "slow"), digest(&mut m, "slow"));
}

/// Mixed lease / permit traffic on a few keys. Slow refill and one long lease or permit
/// per key keep every key alive while the test compares (no expiry races).
fn workload(m: &mut Connection) -> Vec<String> {
    let mut keys = Vec::new();
    let mut lease_ids: Vec<(String, i64)> = Vec::new();
    let mut permit_ids: Vec<(String, i64)> = Vec::new();
    for k in 0..4 {
        let key = format!("lease:{k}");
        let _: Vec<i64> = query(m, &["RL.LEASE", &key, "0.001", "100000", "1", "600000"]);
        keys.push(key);
        let key = format!("sem:{k}");
        let _: Vec<i64> = query(m, &["RL.ACQUIRE", &key, "1000", "600000"]);
        keys.push(key);
    }
    for i in 0..400u64 {
        let lk = format!("lease:{}", i % 4);
        let sk = format!("sem:{}", i % 4);
        let ttl = ["3", "40", "600000"][(i % 3) as usize];
        match i % 7 {
            0..=2 => {
                let n = (1 + i % 9).to_string();
                let r: Vec<i64> = query(m, &["RL.LEASE", &lk, "0.001", "100000", &n, ttl]);
                if r[0] > 0 {
                    lease_ids.push((lk.clone(), r[1]));
                }
            }
            3 => {
                if let Some((key, id)) = lease_ids.pop() {
                    let unused = (i % 4).to_string();
                    if i % 2 == 0 {
                        let _: i64 = query(m, &["RL.RETURN", &key, &id.to_string(), &unused]);
                    } else {
                        let _: Vec<i64> = query(
                            m,
                            &[
                                "RL.LEASE",
                                &key,
                                "0.001",
                                "100000",
                                "2",
                                ttl,
                                "RETURN",
                                &id.to_string(),
                                &unused,
                            ],
                        );
                    }
                }
            }
            4 | 5 => {
                let r: Vec<i64> = query(m, &["RL.ACQUIRE", &sk, "1000", ttl]);
                if r[0] > 0 {
                    permit_ids.push((sk.clone(), r[1]));
                }
            }
            _ => {
                if let Some((key, id)) = permit_ids.pop() {
                    if i % 2 == 0 {
                        let _: i64 = query(m, &["RL.RELEASE", &key, &id.to_string()]);
                    } else {
                        let _: redis::Value = query(m, &["RL.RENEW", &key, &id.to_string(), ttl]);
                    }
                }
            }
        }
        if i % 50 == 0 {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    keys
}

#[test]
fn lease_and_permit_effects_reach_replica_and_aof_exactly() {
    let master = Server::start(&["--appendonly", "yes", "--aof-use-rdb-preamble", "no"]);
    let replica = Server::start(&[]);
    replicate(&replica, &master);
    let mut m = master.conn();
    let keys = workload(&mut m);
    wait_synced(&master, &replica);
    let mut r = replica.conn();
    let want: Vec<String> = keys.iter().map(|k| digest(&mut m, k)).collect();
    let got: Vec<String> = keys.iter().map(|k| digest(&mut r, k)).collect();
    assert_eq!(got, want, "replica");
    assert_eq!(dataset_digest(&mut r), dataset_digest(&mut m));

    // Every effect in the AOF: its numbers plain decimal, within i64.
    let _: String = query(&mut m, &["CONFIG", "SET", "appendfsync", "always"]);
    let cmds = aof_commands(&master);
    let mut seen = (0, 0);
    for c in &cmds {
        let name = c[0].to_ascii_uppercase();
        let numbers: Vec<&String> = match name.as_str() {
            "RL.SETSTATE" => {
                seen.0 += 1;
                // key full_at rate cap, then keyword/number pairs (ADD has three numbers).
                std::iter::once(&c[2])
                    .chain(c[5..].iter().filter(|a| a.as_bytes()[0].is_ascii_digit()))
                    .collect()
            }
            "RL.SETPERMITS" => {
                seen.1 += 1;
                c[2..]
                    .iter()
                    .filter(|a| !a.as_bytes()[0].is_ascii_alphabetic())
                    .collect()
            }
            _ => continue,
        };
        for n in numbers {
            assert!(
                n.bytes().all(|b| b.is_ascii_digit())
                    && (n == "0" || !n.starts_with('0'))
                    && n.parse::<i64>().is_ok(),
                "{n:?} in {c:?}"
            );
        }
    }
    assert!(seen.0 > 100 && seen.1 > 50, "{seen:?}");

    // The AOF replayed ends with the same state.
    let _: String = query(&mut m, &["DEBUG", "LOADAOF"]);
    let replayed: Vec<String> = keys.iter().map(|k| digest(&mut m, k)).collect();
    assert_eq!(replayed, want, "AOF replay");
}

/// `RL.SETSTATE ... ADD` past the bound used to write the master, reply an error and send
/// nothing: the replica fell behind for good.
#[test]
fn a_refused_effect_changes_neither_master_nor_replica() {
    let master = Server::start(&[]);
    let replica = Server::start(&[]);
    replicate(&replica, &master);
    let mut m = master.internal_conn();
    let now = now_ns();
    let far = (now + 600_000_000_000).to_string();
    for id in 1..=1024u64 {
        let id = id.to_string();
        let _: () = redis::cmd("RL.SETSTATE")
            .arg(&["k", "0", "1", "100000", "ADD", &id, "1", &far])
            .query(&mut m)
            .unwrap();
    }
    let before = digest(&mut m, "k");
    // A different bucket and one lease too many: refused whole.
    let err = redis::cmd("RL.SETSTATE")
        .arg(&[
            "k",
            &now.to_string(),
            "1",
            "100000",
            "ADD",
            "5000",
            "1",
            &far,
        ])
        .query::<()>(&mut m)
        .unwrap_err();
    assert!(err.to_string().contains("too many live leases"), "{err}");
    assert_eq!(digest(&mut m, "k"), before);
    wait_synced(&master, &replica);
    let mut r = replica.conn();
    assert_eq!(digest(&mut r, "k"), before, "replica diverged");
}

fn cmd(c: &mut Connection, args: &[&str]) -> redis::RedisResult<Value> {
    redis::cmd(args[0]).arg(&args[1..]).query(c)
}

fn int(c: &mut Connection, args: &[&str]) -> i64 {
    query(c, args)
}

/// Rule 2: every refused call (bad options, duplicates, forged effects out of bounds)
/// changes nothing and sends nothing: replica digest and replication offset unchanged.
#[test]
fn refused_calls_send_nothing() {
    let master = Server::start(&[]);
    let replica = Server::start(&[]);
    replicate(&replica, &master);
    let mut c = master.internal_conn();
    assert_eq!(int(&mut c, &["RL.TAKE", "k", "1", "100", "10"]), 10);
    let v: Vec<i64> = redis::cmd("RL.LEASE")
        .arg(&["k", "1", "100", "5", "60000"])
        .query(&mut c)
        .unwrap();
    wait_synced(&master, &replica);
    let offset = info_field(&mut c, "replication", "master_repl_offset");
    let before = digest(&mut c, "k");
    let id = v[1].to_string();
    let far = (now_ns() + 60_000_000_000).to_string();
    for bad in [
        vec!["RL.TAKE", "k", "1", "100", "0"],
        vec!["RL.TAKE", "k", "1", "100", "101"],
        vec!["RL.TAKE", "k", "1", "100", "1", "INIT", "1", "INIT", "1"],
        vec!["RL.TAKE", "k", "nan", "100"],
        vec!["RL.TAKE", "k", "1e-10", "100"],
        vec!["RL.TAKE", "k", "1e-9", "1e15"],
        vec!["RL.LEASE", "k", "1", "100", "5", "0"],
        vec!["RL.LEASE", "k", "1", "100", "5", "86400001"],
        vec![
            "RL.LEASE", "k", "1", "100", "5", "100", "RETURN", &id, "1", "RETURN", &id, "1",
        ],
        vec!["RL.LEASE", "k", "1", "100", "5", "100", "MIN", "6"],
        vec!["RL.RETURN", "k", &id, "-1"],
        vec!["RL.RETURN", "k", "-1", "1"],
        vec!["RL.MTAKE", "1", "k", "1", "100", "k", "1", "100"],
        vec!["RL.MTAKE", "1", "k", "1", "100", "WITHSTATE", "WITHSTATE"],
        vec!["RL.SETSTATE", "k", "9223372036854775808", "1", "1"],
        vec!["RL.SETSTATE", "k", "0", "1", "1", "ADD", "0", "1", &far],
        vec!["RL.SETSTATE", "k", "0", "1", "1", "ADD", "99", "0", &far],
        vec!["RL.SETSTATE", "k", "0", "1", "1", "DROP", "1", "DROP", "2"],
        vec!["RL.SETSTATE", "k", "0", "1", "1", "ADD", "1"],
        vec!["RL.SETSTATE", "k", "0", "1", "1", "FOO"],
    ] {
        let r = cmd(&mut c, &bad);
        assert!(r.is_err(), "{bad:?} was accepted: {r:?}");
        let e = r.unwrap_err().to_string();
        assert!(!e.contains("internal error"), "{bad:?}: {e}");
        assert_eq!(digest(&mut c, "k"), before, "{bad:?} changed the key");
    }
    // Less than any effect: only the master's periodic PING (14 bytes) may have gone out.
    let sent = info_field(&mut c, "replication", "master_repl_offset") - offset;
    assert!(sent < 30, "refused calls sent {sent} bytes to the replica");
    assert_eq!(digest(&mut replica.conn(), "k"), before);
}
