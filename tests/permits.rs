//! RL.ACQUIRE / RL.RELEASE / RL.RENEW: a semaphore whose permits expire. Its effects and
//! crafted payloads never break the server, and RDB load accepts only what commands create.

mod support;

use std::time::Duration;
use support::*;

fn acquire(c: &mut Connection, key: &str, limit: u64, ttl_ms: u64) -> (i64, i64, i64, i64) {
    redis::cmd("RL.ACQUIRE")
        .arg(key)
        .arg(limit)
        .arg(ttl_ms)
        .query(c)
        .unwrap()
}

fn release(c: &mut Connection, key: &str, id: i64) -> i64 {
    redis::cmd("RL.RELEASE").arg(key).arg(id).query(c).unwrap()
}

fn renew(c: &mut Connection, key: &str, id: i64, ttl_ms: u64) -> i64 {
    redis::cmd("RL.RENEW")
        .arg(key)
        .arg(id)
        .arg(ttl_ms)
        .query(c)
        .unwrap()
}

#[test]
fn permits_up_to_the_limit_expire_release_and_renew() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    // The first permit lives 2 s: the denial below must come before it expires, on any
    // machine.
    let (g1, a, in_use, _) = acquire(&mut c, "s", 2, 2_000);
    assert_eq!((g1, in_use), (1, 1));
    let (g2, b, in_use, _) = acquire(&mut c, "s", 2, 10_000);
    assert_eq!((g2, in_use), (1, 2));
    assert!(b > a && a > 0);
    let (g, id, in_use, retry) = acquire(&mut c, "s", 2, 1000);
    assert_eq!((g, id, in_use), (0, 0, 2));
    assert!((1..=2_000).contains(&retry), "retry {retry}");
    // A crashed holder (never releases) frees its slot after its ttl.
    std::thread::sleep(Duration::from_millis(retry as u64 + 50));
    let (g, c_id, in_use, _) = acquire(&mut c, "s", 2, 10_000);
    assert_eq!((g, in_use), (1, 2));
    assert!(c_id > b);
    assert_eq!(release(&mut c, "s", a), 0, "expired: not released");
    assert_eq!(release(&mut c, "s", b), 1);
    assert_eq!(release(&mut c, "s", b), 0, "released twice");
    assert_eq!(renew(&mut c, "s", b, 1000), 0);
    // The key lives as long as its last permit.
    let before = server_ms(&mut c);
    assert_eq!(renew(&mut c, "s", c_id, 60_000), 1);
    let after = server_ms(&mut c);
    assert_expires_in(&mut c, "s", (before, after), 60_000..=60_000);
    assert_eq!(release(&mut c, "s", c_id), 1);
    let exists: i64 = redis::cmd("EXISTS").arg("s").query(&mut c).unwrap();
    assert_eq!(exists, 0, "no permit left: no key");
    let n = info_field(&mut c, "rl", "rl_permits_acquired");
    assert_eq!(n, 3);
    assert_eq!(info_field(&mut c, "rl", "rl_permits_denied"), 1);
    assert_eq!(info_field(&mut c, "rl", "rl_permits_released"), 2);
    assert_eq!(info_field(&mut c, "rl", "rl_permits_in_use"), 0);
}

#[test]
fn a_bucket_and_a_semaphore_are_different_types() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    // Slow: the bucket must still be there (not full and gone) for the calls below.
    assert_eq!(take(&mut c, "bucket", 0.001, 10.0, 1), 1);
    assert_eq!(acquire(&mut c, "sem", 5, 10_000).0, 1);
    let before = dataset_digest(&mut c);
    for args in [
        &["RL.ACQUIRE", "bucket", "5", "1000"][..],
        &["RL.RELEASE", "bucket", "1"],
        &["RL.RENEW", "bucket", "1", "1000"],
        &["RL.TAKE", "sem", "1", "10"],
        &["RL.LEASE", "sem", "1", "10", "1", "100"],
        &["RL.RESERVE", "sem", "1", "10", "1", "100"],
        &["RL.REFUND", "sem", "1"],
        &["RL.PEEK", "sem"],
    ] {
        let e = redis::cmd(args[0])
            .arg(&args[1..])
            .query::<Value>(&mut c)
            .unwrap_err();
        assert_eq!(e.code(), Some("WRONGTYPE"), "{args:?}");
    }
    for bad in [
        &["RL.ACQUIRE", "x", "0", "1000"][..],
        &["RL.ACQUIRE", "x", "10001", "1000"],
        &["RL.ACQUIRE", "x", "5", "0"],
        &["RL.ACQUIRE", "x", "5", "86400001"],
        &["RL.RELEASE", "x", "-1"],
        &["RL.RENEW", "x", "1", "0"],
    ] {
        assert!(
            redis::cmd(bad[0])
                .arg(&bad[1..])
                .query::<Value>(&mut c)
                .is_err(),
            "{bad:?}"
        );
    }
    assert_eq!(dataset_digest(&mut c), before);
}

#[test]
fn permits_persist_copy_and_replicate_exactly() {
    let mut s = Server::start(&["--appendonly", "yes", "--aof-use-rdb-preamble", "no"]);
    let replica = Server::start(&[]);
    replicate(&replica, &s);
    let mut c = s.conn();
    let mut ids = Vec::new();
    for _ in 0..5 {
        ids.push(acquire(&mut c, "s", 10, 600_000).1);
    }
    assert_eq!(release(&mut c, "s", ids[1]), 1);
    assert_eq!(renew(&mut c, "s", ids[2], 900_000), 1);
    let offset = info_field(&mut c, "replication", "master_repl_offset");
    // Denials and no-ops send nothing.
    assert_eq!(acquire(&mut c, "s", 4, 1000).0, 0);
    assert_eq!(release(&mut c, "s", 12345), 0);
    assert_eq!(
        info_field(&mut c, "replication", "master_repl_offset"),
        offset
    );
    let before = digest(&mut c, "s");
    wait_synced(&s, &replica);
    assert_eq!(digest(&mut replica.conn(), "s"), before, "replica");
    let _: () = redis::cmd("COPY").arg("s").arg("s2").query(&mut c).unwrap();
    assert_eq!(digest(&mut c, "s2"), before, "COPY");
    let at: i64 = redis::cmd("PEXPIRETIME").arg("s").query(&mut c).unwrap();
    let payload = dump(&mut c, "s");
    let _: () = redis::cmd("RESTORE")
        .arg("s3")
        .arg(at)
        .arg(payload)
        .arg("ABSTTL")
        .query(&mut c)
        .unwrap();
    assert_eq!(digest(&mut c, "s3"), before, "RESTORE");
    let _: () = redis::cmd("DEBUG").arg("RELOAD").query(&mut c).unwrap();
    assert_eq!(digest(&mut c, "s"), before, "DEBUG RELOAD");
    let all = dataset_digest(&mut c);
    let mut c = s.rewrite_aof_and_restart(c);
    assert_eq!(dataset_digest(&mut c), all, "AOF rewrite + restart");
    assert_eq!(info_field(&mut c, "rl", "rl_permits_in_use"), 12);
}

#[test]
fn ten_thousand_permits_per_key_and_a_clear_error_beyond() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let mut pipe = redis::pipe();
    for _ in 0..10_000 {
        pipe.cmd("RL.ACQUIRE").arg(&["big", "10000", "600000"]);
    }
    let replies: Vec<(i64, i64, i64, i64)> = pipe.query(&mut c).unwrap();
    assert!(replies.iter().all(|r| r.0 == 1));
    assert_eq!(replies.last().unwrap().2, 10_000);
    let (g, _, in_use, _) = acquire(&mut c, "big", 10_000, 1000);
    assert_eq!((g, in_use), (0, 10_000));
    let e = redis::cmd("RL.ACQUIRE")
        .arg(&["big", "10001", "1000"])
        .query::<Value>(&mut c)
        .unwrap_err();
    assert!(e.to_string().contains("at most 10000"), "{e}");
}

fn run(c: &mut Connection, cmd: &str, args: &[String]) -> redis::RedisResult<Value> {
    redis::cmd(cmd).arg(args).query(c)
}

/// One key's value digest and absolute expiry (looking expires it if it is due).
fn key_state(c: &mut Connection, key: &str) -> (String, i64) {
    let at: i64 = redis::cmd("PEXPIRETIME").arg(key).query(c).unwrap();
    (digest(c, key), at)
}

/// The semaphore's effect command and payloads get the same treatment: generated
/// `RL.SETPERMITS` vectors either change nothing or leave a state every copy reproduces,
/// and corrupt `RESTORE` payloads of a semaphore are errors, not aborts.
#[test]
fn semaphore_effects_and_payloads_cannot_break_the_server() {
    let mut s = Server::start(&["--appendonly", "yes", "--aof-use-rdb-preamble", "no"]);
    let mut c = s.internal_conn();
    no_active_expire(&mut c);
    let mut rng = Rng(7);
    let now = now_ns();
    let ids = [
        "0",
        "1",
        "2",
        "9",
        "10000",
        "9223372036854775807",
        "9223372036854775808",
    ];
    let (mut accepted, mut refused) = (0, 0);
    for i in 0..400 {
        let key = format!("p{}", i % 6);
        let mut args = vec![key.clone()];
        if rng.below(8) != 0 {
            args.extend(["LASTID".to_string(), rng.pick(&ids).to_string()]);
        }
        for _ in 0..rng.below(3) {
            match rng.below(4) {
                0 => args.extend(["PRUNE".to_string(), now.to_string()]),
                1 => args.extend(["DROP".to_string(), rng.pick(&ids).to_string()]),
                2 => args.extend([
                    "ADD".to_string(),
                    rng.pick(&ids).to_string(),
                    (now + 600_000_000_000 + rng.below(1_000_000)).to_string(),
                ]),
                _ => args.push(rng.pick(&["ADD", "BOGUS", "LASTID"]).to_string()),
            }
        }
        let before = key_state(&mut c, &key);
        match run(&mut c, "RL.SETPERMITS", &args) {
            Ok(_) => accepted += 1,
            Err(e) => {
                refused += 1;
                assert!(e.code() == Some("ERR"), "{args:?}: {e}");
                assert_eq!(
                    key_state(&mut c, &key),
                    before,
                    "refused {args:?} changed data"
                );
            }
        }
    }
    assert!(
        accepted > 30 && refused > 30,
        "{accepted} accepted, {refused} refused"
    );
    // A real permit key for the crafted payloads.
    let _: Vec<i64> = redis::cmd("RL.ACQUIRE")
        .arg(&["real", "5", "600000"])
        .query(&mut c)
        .unwrap();
    let _: Vec<i64> = redis::cmd("RL.ACQUIRE")
        .arg(&["real", "5", "600000"])
        .query(&mut c)
        .unwrap();
    let all = dataset_digest(&mut c);
    let _: () = redis::cmd("DEBUG").arg("RELOAD").query(&mut c).unwrap();
    assert_eq!(dataset_digest(&mut c), all, "DEBUG RELOAD");
    let replica = Server::start(&[]);
    replicate(&replica, &s);
    wait_synced(&s, &replica);
    assert_eq!(dataset_digest(&mut replica.conn()), all, "full sync");
    drop(replica);

    let payload = dump(&mut c, "real");
    let body = dump_body(&payload);
    let mut bodies: Vec<Vec<u8>> = (1..body.len()).map(|n| body[..n].to_vec()).collect();
    for _ in 0..200 {
        let mut b = body.to_vec();
        let i = 1 + rng.below(b.len() as u64 - 1) as usize;
        b[i] ^= 1 << rng.below(8);
        bodies.push(b);
    }
    for b in bodies {
        let forged = reseal(&payload, &b);
        let reply = restore_replace(&mut c, "x", &forged);
        if reply.is_ok() {
            let r: redis::RedisResult<Value> = redis::cmd("RL.ACQUIRE")
                .arg(&["x", "5", "1000"])
                .query(&mut c);
            assert!(r.is_ok() || r.unwrap_err().code() == Some("WRONGTYPE"));
            let _: () = redis::cmd("DEL").arg("x").query(&mut c).unwrap();
        }
    }
    assert!(!s.exited(), "the server died: {}", s.log());
    let all = dataset_digest(&mut c);
    let mut c = s.rewrite_aof_and_restart(c);
    assert_eq!(dataset_digest(&mut c), all, "AOF rewrite + restart");
}

/// The states a command can create are exactly the states RDB load accepts: a permit
/// table with no permit (which no command leaves: the last release deletes the key) is
/// refused by RESTORE, or else an AOF rewrite and restart rebuild the dataset exactly.
#[test]
fn restore_of_an_empty_permit_table_is_refused_or_rebuilt_by_the_aof() {
    let mut s = Server::start(&["--appendonly", "yes", "--aof-use-rdb-preamble", "no"]);
    let mut c = s.conn();
    let _: Vec<i64> = query(&mut c, &["RL.ACQUIRE", "real", "5", "600000"]);
    let payload = dump(&mut c, "real");
    // Type byte (module type 2), 0x81 + 8-byte module id: the first 10 bytes.
    let mut body = dump_body(&payload)[..10].to_vec();
    // last_id 5, count 0, EOF.
    body.extend_from_slice(&[0x02, 0x05, 0x02, 0x00, 0x00]);
    let forged = reseal(&payload, &body);
    let reply = redis::cmd("RESTORE")
        .arg("p")
        .arg(0)
        .arg(forged)
        .query::<Value>(&mut c);
    if reply.is_err() {
        return; // refused: what the rule asks
    }
    let kind: String = query(&mut c, &["TYPE", "p"]);
    let ttl: i64 = query(&mut c, &["PTTL", "p"]);
    let all = dataset_digest(&mut c);
    let mut c = s.rewrite_aof_and_restart(c);
    let exists: i64 = query(&mut c, &["EXISTS", "p"]);
    assert_eq!(
        dataset_digest(&mut c),
        all,
        "RESTORE accepted an empty permit table ({kind}, PTTL {ttl}) that no command \
         creates; after AOF rewrite + restart EXISTS p = {exists}"
    );
}
