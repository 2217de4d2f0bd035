//! A real replica ends with the master's exact state: writes travel as effects (absolute
//! state), inside MULTI/EXEC and Lua too, and denied calls send nothing.

mod support;
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
