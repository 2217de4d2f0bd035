//! Buckets survive DEBUG RELOAD (RDB), an AOF rewrite plus restart, DUMP/RESTORE and COPY
//! with exactly the same state (equal `DEBUG DIGEST-VALUE`); so does every state
//! `RL.SETSTATE` accepts (random, and at every bound), through RESTORE, MIGRATE and a full
//! sync too: what a command accepts, every reload accepts.

mod support;
use support::*;

/// A few buckets in different states: partly used, empty, fractional rate, changed limit.
/// Rates are slow enough that none fills (and expires) while a test runs, however slow the
/// machine: 30 s at the least.
fn fill(c: &mut Connection) -> Vec<String> {
    take(c, "a", 1.0, 100.0, 30);
    take(c, "b", 0.001, 5.0, 5);
    take(c, "c", 0.005, 2.5, 1);
    take(c, "d", 0.03, 10.0, 2);
    take(c, "d", 0.07, 6.0, 1);
    for i in 0..200 {
        take(
            c,
            &format!("many:{i}"),
            0.01 + i as f64 / 1000.0,
            1000.0,
            1 + i % 7,
        );
    }
    let mut keys: Vec<String> = ["a", "b", "c", "d"].iter().map(|s| s.to_string()).collect();
    keys.extend((0..200).map(|i| format!("many:{i}")));
    keys
}

fn digests(c: &mut Connection, keys: &[String]) -> Vec<String> {
    keys.iter().map(|k| digest(c, k)).collect()
}

#[test]
fn debug_reload_keeps_every_bucket() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let keys = fill(&mut c);
    let before = digests(&mut c, &keys);
    let ttl_before: i64 = redis::cmd("PEXPIRETIME").arg("a").query(&mut c).unwrap();
    let _: () = redis::cmd("DEBUG").arg("RELOAD").query(&mut c).unwrap();
    assert_eq!(digests(&mut c, &keys), before);
    let ttl_after: i64 = redis::cmd("PEXPIRETIME").arg("a").query(&mut c).unwrap();
    assert_eq!(ttl_before, ttl_after);
    // Still a working bucket after the reload.
    assert_eq!(take(&mut c, "b", 0.001, 5.0, 1), 0);
}

#[test]
fn aof_rewrite_and_restart_keep_every_bucket() {
    // Without the RDB preamble the rewrite is made of our own RL.SETSTATE commands.
    let mut s = Server::start(&["--appendonly", "yes", "--aof-use-rdb-preamble", "no"]);
    let mut c = s.conn();
    let keys = fill(&mut c);
    let before = digests(&mut c, &keys);
    let _: () = redis::cmd("BGREWRITEAOF").query(&mut c).unwrap_or(());
    wait_until(30, "AOF rewrite", || {
        info_field(&mut c, "persistence", "aof_rewrite_in_progress") == 0
            && info_field(&mut c, "persistence", "aof_rewrite_scheduled") == 0
    });
    // Writes after the rewrite land in the incremental AOF and replay too.
    take(&mut c, "a", 1.0, 100.0, 1);
    let mut before = before;
    before[0] = digest(&mut c, "a");
    drop(c);
    s.restart();
    let mut c = s.conn();
    let after = digests(&mut c, &keys);
    let differ: Vec<&String> = keys
        .iter()
        .zip(before.iter().zip(&after))
        .filter(|(_, (b, a))| b != a)
        .map(|(k, _)| k)
        .collect();
    assert!(differ.is_empty(), "changed by the restart: {differ:?}");
    let files: Vec<String> = std::fs::read_dir(s.dir.path().join("appendonlydir"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        files.iter().any(|f| f.ends_with(".base.aof")),
        "no AOF base: {files:?}"
    );
}

#[test]
fn dump_restore_and_copy_keep_the_state() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    take(&mut c, "src", 0.01, 10.0, 7);
    let d = digest(&mut c, "src");
    let dump: Vec<u8> = redis::cmd("DUMP").arg("src").query(&mut c).unwrap();
    let at: i64 = redis::cmd("PEXPIRETIME").arg("src").query(&mut c).unwrap();
    let _: () = redis::cmd("RESTORE")
        .arg("restored")
        .arg(at)
        .arg(dump)
        .arg("ABSTTL")
        .query(&mut c)
        .unwrap();
    assert_eq!(digest(&mut c, "restored"), d);
    let copied: i64 = redis::cmd("COPY")
        .arg("src")
        .arg("copied")
        .query(&mut c)
        .unwrap();
    assert_eq!(copied, 1);
    assert_eq!(digest(&mut c, "copied"), d);
    // The copy is independent.
    take(&mut c, "copied", 0.01, 10.0, 3);
    assert_eq!(digest(&mut c, "src"), d);
    let _: () = redis::cmd("RENAME")
        .arg("src")
        .arg("renamed")
        .query(&mut c)
        .unwrap();
    assert_eq!(digest(&mut c, "renamed"), d);
    let usage: i64 = redis::cmd("MEMORY")
        .arg("USAGE")
        .arg("renamed")
        .query(&mut c)
        .unwrap();
    assert!(usage > 0);
}

fn run(c: &mut Connection, cmd: &str, args: &[String]) -> redis::RedisResult<Value> {
    redis::cmd(cmd).arg(args).query(c)
}

#[test]
fn a_state_with_lease_id_zero_is_refused_and_the_dataset_still_reloads() {
    let s = Server::start(&[]);
    let mut c = s.internal_conn();
    let args: Vec<String> = ["k", "0", "1", "10", "ADD", "0", "5", "9000000000000000000"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let err = run(&mut c, "RL.SETSTATE", &args).unwrap_err();
    assert!(err.to_string().contains("lease ids"), "{err}");
    let exists: i64 = redis::cmd("EXISTS").arg("k").query(&mut c).unwrap();
    assert_eq!(exists, 0, "a refused state was written");
    let _: () = redis::cmd("DEBUG").arg("RELOAD").query(&mut c).unwrap();
}

/// One generated `RL.SETSTATE` call: mostly plausible values, some at and past every bound.
fn setstate_args(rng: &mut Rng, key: &str) -> Vec<String> {
    let now = now_ns();
    let full_at = [
        "0".to_string(),
        now.to_string(),
        (now + 600_000_000_000).to_string(),
        "9223372036854775807".to_string(),
        "9223372036854775808".to_string(),
        "18446744073709551615".to_string(),
        "-1".to_string(),
    ];
    let good = [
        "1",
        "10",
        "0.5",
        "1e15",
        "1e-9",
        "0.001",
        "16.6667",
        "999999999999999",
    ];
    let bad = ["0", "-1", "nan", "inf", "1e16", "1e-10"];
    let number = |rng: &mut Rng| {
        if rng.below(8) == 0 {
            rng.pick(&bad)
        } else {
            rng.pick(&good)
        }
    };
    let ids = [
        "0",
        "1",
        "2",
        "7",
        "1024",
        "9223372036854775807",
        "9223372036854775808",
    ];
    let tokens = ["0", "1", "5", "9223372036854775807", "9000000000000000000"];
    let f = if rng.below(4) == 0 {
        rng.below(full_at.len() as u64)
    } else {
        rng.below(4)
    };
    let mut args = vec![
        key.to_string(),
        full_at[f as usize].clone(),
        number(rng).to_string(),
        number(rng).to_string(),
    ];
    let versions = [
        "0",
        "1",
        "7",
        "9007199254740991",
        "9007199254740992",
        "-1",
        "x",
    ];
    for _ in 0..rng.below(4) {
        match rng.below(6) {
            4 => args.extend(["VERSION".into(), rng.pick(&versions).to_string()]),
            0 => args.extend(["LASTID".into(), rng.pick(&ids).to_string()]),
            1 => args.extend(["PRUNE".into(), now.to_string()]),
            2 => args.extend(["DROP".into(), rng.pick(&ids).to_string()]),
            3 => args.extend([
                "ADD".into(),
                rng.pick(&ids).to_string(),
                rng.pick(&tokens).to_string(),
                (now + 600_000_000_000 + rng.below(10_000_000_000)).to_string(),
            ]),
            _ => args.push(rng.pick(&["BOGUS", "ADD", "LASTID"]).to_string()),
        }
    }
    args
}

/// One key's value digest and absolute expiry (looking expires it if it is due).
fn key_state(c: &mut Connection, key: &str) -> (String, i64) {
    let at: i64 = redis::cmd("PEXPIRETIME").arg(key).query(c).unwrap();
    (digest(c, key), at)
}

/// Every key's DEBUG DIGEST-VALUE and absolute expiry, sorted by key, after dropping the
/// keys already due (so that a reload, which skips them, compares equal).
fn keyspace(c: &mut Connection) -> Vec<(String, String, i64)> {
    let mut keys: Vec<String> = redis::cmd("KEYS").arg("*").query(c).unwrap();
    for k in &keys {
        let _: i64 = redis::cmd("EXISTS").arg(k).query(c).unwrap();
    }
    keys = redis::cmd("KEYS").arg("*").query(c).unwrap();
    keys.sort();
    keys.into_iter()
        .map(|k| {
            let (d, at) = key_state(c, &k);
            (k, d, at)
        })
        .collect()
}

/// Generated states: every accepted one survives DEBUG RELOAD, DUMP/RESTORE, MIGRATE, an
/// AOF rewrite and restart, and a full sync to a new replica, with equal digests; every
/// refused one changed nothing.
#[test]
fn every_accepted_state_survives_reload_restore_migrate_aof_and_full_sync() {
    let mut s = Server::start(&["--appendonly", "yes", "--aof-use-rdb-preamble", "no"]);
    let mut c = s.internal_conn();
    no_active_expire(&mut c);
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let (mut accepted, mut refused) = (0, 0);
    for i in 0..600 {
        // A few keys, so later calls build on earlier states (tables, bounds).
        let key = format!("k{}", i % 12);
        let args = setstate_args(&mut rng, &key);
        let before = key_state(&mut c, &key);
        match run(&mut c, "RL.SETSTATE", &args) {
            Ok(_) => accepted += 1,
            Err(e) => {
                refused += 1;
                assert!(
                    e.code() == Some("ERR") || e.code() == Some("WRONGTYPE"),
                    "{args:?}: {e}"
                );
                let after = key_state(&mut c, &key);
                // A key that came due meanwhile went by itself: not a change of ours.
                let due = before.1 >= 0 && before.1 <= (now_ns() / 1_000_000) as i64;
                if !(due && after.1 == -2) {
                    assert_eq!(after, before, "refused {args:?} changed data");
                }
            }
        }
    }
    // Fill one key to the lease bound, and try one past it.
    let now = now_ns();
    for id in 1..=1024u64 {
        let args: Vec<String> = ["full", "0", "1", "100000", "ADD"]
            .iter()
            .map(|s| s.to_string())
            .chain([
                id.to_string(),
                "1".into(),
                (now + 600_000_000_000).to_string(),
            ])
            .collect();
        run(&mut c, "RL.SETSTATE", &args).unwrap();
    }
    let before = dataset_digest(&mut c);
    let past: Vec<String> = ["full", "0", "1", "100000", "ADD", "1025", "1"]
        .iter()
        .map(|s| s.to_string())
        .chain([(now + 600_000_000_000).to_string()])
        .collect();
    assert!(run(&mut c, "RL.SETSTATE", &past).is_err());
    assert_eq!(dataset_digest(&mut c), before);
    assert!(
        accepted > 50 && refused > 50,
        "{accepted} accepted, {refused} refused"
    );

    let original = keyspace(&mut c);
    let digest_all = dataset_digest(&mut c);
    assert!(original.len() >= 5, "{original:?}");

    // DEBUG RELOAD (RDB save and load).
    let _: () = redis::cmd("DEBUG").arg("RELOAD").query(&mut c).unwrap();
    assert_eq!(dataset_digest(&mut c), digest_all, "DEBUG RELOAD");

    // DUMP / RESTORE of every key, under another name.
    for (k, d, at) in &original {
        let payload = dump(&mut c, k);
        // With its expiry (DIGEST-VALUE counts whether a key has one).
        let _: () = redis::cmd("RESTORE")
            .arg(format!("copy:{k}"))
            .arg((*at).max(0))
            .arg(payload)
            .arg("ABSTTL")
            .query(&mut c)
            .unwrap();
        assert_eq!(&digest(&mut c, &format!("copy:{k}")), d, "RESTORE {k}");
        let _: () = redis::cmd("DEL")
            .arg(format!("copy:{k}"))
            .query(&mut c)
            .unwrap();
    }

    // A full sync to a new replica.
    let replica = Server::start(&[]);
    replicate(&replica, &s);
    wait_synced(&s, &replica);
    let mut r = replica.conn();
    assert_eq!(dataset_digest(&mut r), digest_all, "full sync");
    drop(r);
    drop(replica);

    // MIGRATE every key to another server.
    let other = Server::start(&[]);
    let mut o = other.conn();
    for (k, d, _) in &original {
        let _: () = redis::cmd("MIGRATE")
            .arg("127.0.0.1")
            .arg(other.port)
            .arg(k)
            .arg(0)
            .arg(5000)
            .arg("COPY")
            .query(&mut c)
            .unwrap();
        assert_eq!(&digest(&mut o, k), d, "MIGRATE {k}");
    }

    // AOF rewrite and restart.
    let mut c = s.rewrite_aof_and_restart(c);
    assert_eq!(dataset_digest(&mut c), digest_all, "AOF rewrite + restart");
    assert!(!s.exited());
}

fn cmd(c: &mut Connection, args: &[&str]) -> redis::RedisResult<Value> {
    redis::cmd(args[0]).arg(&args[1..]).query(c)
}

/// Rule 3/6 on the state bounds: 1024 leases (the most), ids at the signed limit, lease
/// expiry at the last instant, full_at at the last instant: accepted by RL.SETSTATE, and
/// then DEBUG RELOAD, DUMP/RESTORE, an AOF rewrite + restart and a full sync all keep it
/// (digest and PEXPIRETIME).
#[test]
fn states_at_every_bound_survive_every_copy() {
    let mut s = Server::start(&["--appendonly", "yes", "--aof-use-rdb-preamble", "no"]);
    let mut c = s.internal_conn();
    let far = (now_ns() + 3_600_000_000_000).to_string();
    let max = i64::MAX.to_string();
    let ok = |c: &mut Connection, args: &[&str]| {
        let mut a = vec!["RL.SETSTATE"];
        a.extend_from_slice(args);
        cmd(c, &a).unwrap_or_else(|e| panic!("{a:?}: {e}"));
    };
    // A lease keeps the key alive (full_at 0 alone would be an expired key).
    let last = (i64::MAX - 1).to_string();
    ok(
        &mut c,
        &[
            "m", "0", "1", "1000", "LASTID", &last, "ADD", &last, "1", &far,
        ],
    );
    ok(&mut c, &["e", &max, "1e-9", "1e-9"]);
    ok(
        &mut c,
        &["x", "0", "1", "1", "LASTID", "5", "ADD", "5", "1", &max],
    );
    let mut p = redis::pipe();
    for id in 1..=1024u64 {
        p.cmd("RL.SETSTATE").arg(&[
            "many",
            &far,
            "1e9",
            "1e15",
            "ADD",
            &id.to_string(),
            "1000000000000",
            &far,
        ]);
    }
    let _: Vec<Value> = p.query(&mut c).unwrap();
    // The 1025th is refused and changes nothing.
    let before = digest(&mut c, "many");
    assert!(cmd(
        &mut c,
        &[
            "RL.SETSTATE",
            "many",
            &far,
            "1e9",
            "1e15",
            "ADD",
            "1025",
            "1",
            &far
        ]
    )
    .is_err());
    assert_eq!(digest(&mut c, "many"), before);
    // The last id: one lease more, then none.
    let v: Vec<i64> = redis::cmd("RL.LEASE")
        .arg(&["m", "1", "1000", "1", "1000"])
        .query(&mut c)
        .unwrap();
    assert_eq!(v[1], i64::MAX);
    let e = cmd(&mut c, &["RL.LEASE", "m", "1", "1000", "1", "1000"]).unwrap_err();
    assert!(e.to_string().contains("no lease id left"), "{e}");

    let keys = ["m", "e", "x", "many"];
    let snap = |c: &mut Connection| -> Vec<(String, i64)> {
        keys.iter()
            .map(|k| {
                let at: i64 = redis::cmd("PEXPIRETIME").arg(*k).query(c).unwrap();
                (digest(c, k), at)
            })
            .collect()
    };
    let want = snap(&mut c);
    let _: () = redis::cmd("DEBUG").arg("RELOAD").query(&mut c).unwrap();
    assert_eq!(snap(&mut c), want, "DEBUG RELOAD");
    for k in keys {
        let payload = dump(&mut c, k);
        // (DEBUG DIGEST-VALUE mixes in whether the key has an expiry: restore it too.)
        let at: i64 = redis::cmd("PEXPIRETIME").arg(k).query(&mut c).unwrap();
        let _: () = redis::cmd("RESTORE")
            .arg(format!("{k}:copy"))
            .arg(at)
            .arg(&payload)
            .arg("ABSTTL")
            .query(&mut c)
            .unwrap();
        assert_eq!(
            digest(&mut c, &format!("{k}:copy")),
            digest(&mut c, k),
            "RESTORE {k}"
        );
        let _: i64 = redis::cmd("DEL")
            .arg(format!("{k}:copy"))
            .query(&mut c)
            .unwrap();
    }
    let replica = Server::start(&[]);
    replicate(&replica, &s);
    wait_synced(&s, &replica);
    assert_eq!(snap(&mut replica.internal_conn()), want, "full sync");
    drop(replica);
    let mut c = s.rewrite_aof_and_restart(c);
    assert_eq!(snap(&mut c), want, "AOF rewrite + restart");
}

/// Why a whole-dataset `DEBUG DIGEST` can differ across a reload while every bucket is
/// equal: it hashes every key the dictionary still holds, a key whose expiry has passed but
/// that nothing has deleted yet included, and a load drops such keys (a master skips keys
/// already due when it loads an RDB; after an AOF restart the active expiry deletes them
/// at once). Here active expiry is off so the due key stays in memory, deterministically:
/// the two digests taken in one `MULTI` around `DEBUG RELOAD` differ by that key alone,
/// and every live key's value and absolute expiry (`keyspace`) are equal. Compare those,
/// not the dataset digest (docs/operations.md, "Checking a copy").
#[test]
fn a_dataset_digest_differs_only_by_keys_already_due() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let _: () = redis::cmd("DEBUG")
        .arg(&["SET-ACTIVE-EXPIRE", "0"])
        .query(&mut c)
        .unwrap();
    fill(&mut c);
    // Full again (and expired) 1 ms after this take.
    take(&mut c, "due", 1000.0, 1.0, 1);
    let at: i64 = redis::cmd("PEXPIRETIME").arg("due").query(&mut c).unwrap();
    wait_until(30, "the key's expiry passed", || {
        let (sec, us): (i64, i64) = redis::cmd("TIME").query(&mut c).unwrap();
        sec * 1000 + us / 1000 > at + 1
    });
    let before = {
        // keyspace() looks every key up, which would delete the due one: read the live
        // keys without it first, then put the same due key back by the same take.
        let live: Vec<(String, String, i64)> = keyspace(&mut c);
        assert!(live.iter().all(|(k, _, _)| k != "due"));
        take(&mut c, "due", 1000.0, 1.0, 1);
        let at: i64 = redis::cmd("PEXPIRETIME").arg("due").query(&mut c).unwrap();
        wait_until(30, "the key's expiry passed again", || {
            let (sec, us): (i64, i64) = redis::cmd("TIME").query(&mut c).unwrap();
            sec * 1000 + us / 1000 > at + 1
        });
        live
    };
    let replies: Vec<Value> = redis::pipe()
        .atomic()
        .cmd("DEBUG")
        .arg("DIGEST")
        .cmd("DEBUG")
        .arg("RELOAD")
        .cmd("DEBUG")
        .arg("DIGEST")
        .query(&mut c)
        .unwrap();
    let text = |v: &Value| match v {
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        Value::SimpleString(s) => s.clone(),
        other => format!("{other:?}"),
    };
    assert_ne!(
        text(&replies[0]),
        text(&replies[2]),
        "the reload dropped the due key: the dataset digests differ"
    );
    let keys: Vec<String> = redis::cmd("KEYS").arg("due").query(&mut c).unwrap();
    assert!(
        keys.is_empty(),
        "a master skips a due key when it loads: {keys:?}"
    );
    assert_eq!(
        keyspace(&mut c),
        before,
        "every live key's value and expiry"
    );
}
