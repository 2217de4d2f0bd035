//! Hostile review of the short effect of a pinned take (`RL.SETSTATE key full_at KEEP [HOLD
//! t]`, applied to the state a copy already holds) and of the denial of a call needing more
//! than a live rate pin's cap, on real servers: every copy (replicas, chained replicas, a
//! promoted replica, AOF replay and rewrite, RDB reload) must end with the master's bytes,
//! whatever happens to the key between two takes; forged short effects change nothing.

mod support;

use support::*;

fn s(x: &str) -> String {
    x.to_string()
}

/// The replication stream and the AOF must never carry an effect a copy refuses: the
/// server logs each such error (Redis and Valkey: "== CRITICAL == This replica is sending
/// an error to its master").
fn assert_no_stream_errors(server: &Server, what: &str) {
    let log = server.log();
    assert!(
        !log.contains("CRITICAL") && !log.contains("panicked"),
        "{what}: {log}"
    );
}

const KEYS: [&str; 5] = ["k0", "k1", "k2", "k3", "k4"];

/// Lets every pin of a few ms end and has the master drop each key then past its time
/// (`DEL` on the stream), so that no copy compared afterwards holds a key another dropped
/// (every other expiry in the storm is minutes away or more).
fn settle(c: &mut Connection) {
    std::thread::sleep(std::time::Duration::from_millis(50));
    for db in ["0", "1"] {
        let _: () = query(c, &["SELECT", db]);
        for k in KEYS {
            let _: i64 = query(c, &["EXISTS", k]);
        }
    }
    let _: () = query(c, &["SELECT", "0"]);
}

/// Digests of every key in dbs 0 and 1.
fn digests(c: &mut Connection) -> Vec<String> {
    let mut out = Vec::new();
    for db in ["0", "1"] {
        let _: () = query(c, &["SELECT", db]);
        for k in KEYS {
            out.push(format!("{db}/{k} {}", digest(c, k)));
        }
    }
    let _: () = query(c, &["SELECT", "0"]);
    out
}

/// One random step of the storm on master connection `c`. Callers mostly pass each key's
/// own limit (so takes under a rate pin move only the fill instant and send the short
/// effect); between them the key is pinned, unpinned, versioned, leased, refunded,
/// renamed, copied, moved, swapped, restored, its expiry changed, taken in MULTI and in
/// scripts, and forged short effects are sent.
fn step(c: &mut Connection, rng: &mut Rng, leases: &mut Vec<(String, i64)>, version: &mut u64) {
    let key = rng.pick(&KEYS).to_string();
    let other = rng.pick(&KEYS).to_string();
    // Slow limits: nothing expires during the run (full in hours), so every copy compares
    // like with like.
    let (rate, cap) = if rng.chance(85) {
        (s("0.001"), s("500"))
    } else {
        let (r, c) = *rng.pick(&[("0.002", "20"), ("0.001", "8"), ("0.0005", "100")]);
        (s(r), s(c))
    };
    let n = (1 + rng.below(6)).to_string();
    let mut args: Vec<String> = match rng.below(30) {
        0..=9 => vec![s("RL.TAKE"), key, rate, cap, n],
        10 => vec![s("RL.TAKE"), key, rate, cap, n, s("WITHSTATE")],
        11 => {
            if other == key {
                vec![s("RL.TAKE"), key, rate, cap, n]
            } else {
                vec![
                    s("RL.MTAKE"),
                    n,
                    key,
                    rate.clone(),
                    cap.clone(),
                    other,
                    rate,
                    cap,
                ]
            }
        }
        12 => vec![
            s("RL.RESERVE"),
            key,
            rate,
            cap,
            n,
            rng.below(5000).to_string(),
        ],
        13 => {
            let mut a = vec![s("RL.LEASE"), key, rate, cap, n, s("86400000")];
            if rng.chance(50) {
                a.push(s("MIN"));
                a.push((1 + rng.below(4)).to_string());
            }
            a
        }
        14 => match leases.pop() {
            Some((k, id)) => vec![s("RL.RETURN"), k, id.to_string(), rng.below(4).to_string()],
            None => vec![s("RL.REFUND"), key, n],
        },
        15 => vec![s("RL.REFUND"), key, n],
        16 | 17 => {
            let mut a = vec![s("RL.PIN"), key];
            match rng.below(6) {
                0 => a.push(s("BLOCK")),
                1 => a.push(s("EXEMPT")),
                _ => {
                    let (r, c) = *rng.pick(&[("0.001", "3"), ("0.002", "400"), ("0.0005", "100")]);
                    a.push(s(r));
                    a.push(s(c));
                }
            }
            match rng.below(4) {
                0 => {
                    a.push(s("PX"));
                    a.push((1 + rng.below(20)).to_string());
                }
                1 => {
                    a.push(s("PX"));
                    a.push(s("100000000"));
                }
                _ => {}
            }
            a
        }
        18 => vec![s("RL.UNPIN"), key],
        19 => vec![s("RENAME"), key, other],
        20 => vec![s("COPY"), key, other, s("REPLACE")],
        21 => vec![s("MOVE"), key, s("1")],
        22 => vec![s("SWAPDB"), s("0"), s("1")],
        23 => {
            // DUMP and RESTORE under another name, with the same absolute expiry.
            let payload: Option<Vec<u8>> = redis::cmd("DUMP").arg(&key).query(c).unwrap();
            let at: i64 = query(c, &["PEXPIRETIME", &key]);
            if let Some(p) = payload {
                let mut cmd = redis::cmd("RESTORE");
                cmd.arg(&other).arg(at.max(0)).arg(p).arg("REPLACE");
                if at > 0 {
                    cmd.arg("ABSTTL");
                }
                let _ = cmd.query::<Value>(c);
            }
            return;
        }
        24 => {
            if rng.chance(50) {
                vec![s("PERSIST"), key]
            } else {
                vec![s("PEXPIRE"), key, s("900000000")]
            }
        }
        25 => {
            // Two takes and an unpin in one transaction.
            let _ = redis::pipe()
                .atomic()
                .cmd("RL.TAKE")
                .arg(&[&key, &rate, &cap, "1"])
                .cmd("RL.TAKE")
                .arg(&[&key, &rate, &cap, &n])
                .cmd(if rng.chance(30) {
                    "RL.UNPIN"
                } else {
                    "RL.PEEK"
                })
                .arg(&key)
                .query::<Value>(c);
            return;
        }
        26 => vec![
            s("EVAL"),
            // In db 1 first (the script's effects carry their db), then in the caller's.
            s("redis.call('SELECT', 1) \
               redis.call('RL.TAKE', KEYS[1], ARGV[1], ARGV[2], 1) \
               redis.call('SELECT', 0) \
               redis.call('RL.TAKE', KEYS[1], ARGV[1], ARGV[2], 1) \
               return redis.call('RL.TAKE', KEYS[1], ARGV[1], ARGV[2], ARGV[3])"),
            s("1"),
            key,
            rate,
            cap,
            n,
        ],
        27 => {
            // A forged short effect: valid or not, it must leave a state every copy takes
            // (full now, or an hour ahead and more: nothing expires during the run).
            let now = now_ns();
            let full_at = match rng.below(4) {
                0 => "0".to_string(),
                1 => (now + 3_600_000_000_000 + rng.below(1 << 40)).to_string(),
                2 => "9223372036854775808".to_string(),
                _ => "x".to_string(),
            };
            let mut a = vec![s("RL.SETSTATE"), key, full_at, s("KEEP")];
            match rng.below(4) {
                0 => {
                    a.push(s("HOLD"));
                    a.push((now + rng.below(1 << 40)).to_string());
                }
                1 => {
                    a.push(s("HOLD"));
                    a.push(s("-1"));
                }
                2 => a.push(s("HOLD")),
                _ => {}
            }
            a
        }
        28 => vec![s("DEL"), key],
        _ => vec![s("RL.PEEK"), key],
    };
    if rng.chance(10) && ["RL.TAKE", "RL.LEASE", "RL.RESERVE"].contains(&args[0].as_str()) {
        // Versions only grow (an older one is stale: decided under the stored limit).
        if rng.chance(30) {
            *version += 1;
        }
        args.push(s("VERSION"));
        args.push(version.to_string());
    }
    if let Ok(v) = storm_send(c, &args) {
        if args[0] == "RL.LEASE" {
            let r = ints(&v);
            if r[0] > 0 && r[1] > 0 {
                leases.push((args[1].clone(), r[1]));
            }
        }
    }
}

/// The short effects in the AOF files of `s`: the arguments `KEEP`, counted in the bytes (a
/// `RESTORE` payload may hold a CRLF, which a line-by-line reading takes for the end of an
/// argument; no other argument here is `KEEP`).
fn keep_effects(s: &Server) -> usize {
    let keep = b"\r\n$4\r\nKEEP\r\n";
    flush_aof(s);
    std::fs::read_dir(s.dir.path().join("appendonlydir"))
        .unwrap()
        .map(|e| std::fs::read(e.unwrap().path()).unwrap())
        .map(|b| b.windows(keep.len()).filter(|w| w == keep).count())
        .sum()
}

/// A storm of pinned takes between every kind of change to their keys, on a master with a
/// replica, a replica of that replica, then the replica promoted (the old master its
/// replica) and the storm going on there: every copy, the AOF replayed and rewritten, and an
/// RDB reload end with the same bytes, and no copy logs an error on the replication stream.
#[test]
fn pinned_takes_between_every_kind_of_change_leave_every_copy_identical() {
    // The master's AOF rewrites into an RDB preamble, the replica's into commands.
    let mut m = Server::start(&["--appendonly", "yes"]);
    let mut r1 = Server::start(&["--appendonly", "yes", "--aof-use-rdb-preamble", "no"]);
    let r2 = Server::start(&[]);
    replicate(&r1, &m);
    replicate(&r2, &r1);
    let mut c = m.internal_conn();
    no_active_expire(&mut c);
    let mut rng = Rng::seeded(0x2545_f491_4f6c_dd1d);
    let mut leases = Vec::new();
    let mut version = 1;
    for i in 0..6000 {
        step(&mut c, &mut rng, &mut leases, &mut version);
        if i == 3000 {
            // An RDB reload on the master alone (not replicated): what it loads is what
            // the copies hold, or the next short effect lands on different states. (A
            // master drops a key past its time at load without telling its replicas:
            // those go first.)
            settle(&mut c);
            let _: String = query(&mut c, &["DEBUG", "RELOAD"]);
        }
        if i == 4500 {
            let _: String = redis::cmd("BGREWRITEAOF").query(&mut c).unwrap();
        }
    }
    settle(&mut c);
    let want = digests(&mut c);
    wait_synced(&m, &r1);
    wait_synced(&r1, &r2);
    let kept = keep_effects(&r1);
    assert!(kept > 300, "the storm sent few short effects: {kept}");
    assert_eq!(digests(&mut r1.conn()), want, "replica");
    assert_eq!(digests(&mut r2.conn()), want, "replica of the replica");

    // Failover: the replica takes over, the old master follows it.
    let _: () = query(&mut r1.conn(), &["REPLICAOF", "NO", "ONE"]);
    replicate(&m, &r1);
    let mut c = r1.internal_conn();
    no_active_expire(&mut c);
    for _ in 0..4000 {
        step(&mut c, &mut rng, &mut leases, &mut version);
    }
    settle(&mut c);
    let want = digests(&mut c);
    let all = dataset_digest(&mut c);
    wait_synced(&r1, &m);
    wait_synced(&r1, &r2);
    assert_eq!(digests(&mut m.conn()), want, "old master, now a replica");
    assert_eq!(digests(&mut r2.conn()), want, "replica of the promoted one");
    assert_eq!(dataset_digest(&mut m.conn()), all);
    for (s, what) in [(&m, "old master"), (&r1, "promoted"), (&r2, "chained")] {
        assert_no_stream_errors(s, what);
    }
    let _: String = query(&mut c, &["DEBUG", "RELOAD"]);
    assert_eq!(dataset_digest(&mut c), all, "rdb reload");
    drop(c);
    r1.restart();
    let c = r1.conn();
    assert_eq!(digests(&mut r1.conn()), want, "aof replay");
    let mut c = r1.rewrite_aof_and_restart(c);
    assert_eq!(dataset_digest(&mut c), all, "aof rewrite");
    assert_no_stream_errors(&r1, "aof load");
    // The old master's AOF (rewritten in the middle of the storm, then fed by the promoted
    // replica's stream) replayed on its own.
    let _: () = query(&mut m.conn(), &["REPLICAOF", "NO", "ONE"]);
    m.restart();
    assert_eq!(digests(&mut m.conn()), want, "old master's aof replay");
    assert_no_stream_errors(&m, "old master's aof load");
}

/// The server's process id.
fn pid(server: &Server) -> u64 {
    info_field(&mut server.conn(), "server", "process_id")
}

/// A process stopped (`SIGSTOP`) until this is dropped (`SIGCONT`, also when a test
/// fails): a replica stopped reads its stream only once resumed.
struct Stopped(u64);

impl Stopped {
    fn new(pid: u64) -> Stopped {
        signal(pid, "-STOP");
        Stopped(pid)
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        signal(self.0, "-CONT");
    }
}

fn signal(pid: u64, sig: &str) {
    let st = std::process::Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .unwrap();
    assert!(st.success());
}

/// A pinned take in the same transaction as a `PEXPIRE` of a second: the master decides both at
/// one instant (the key is there), but a replica reading the stream later, and an AOF
/// replayed later, find the key past that expiry when the short effect comes. It must
/// apply there all the same (the copy holds what the master held), not fail with "needs a
/// key that holds a bucket": an error on the replication stream, or an AOF that no longer
/// loads.
#[test]
fn a_short_effect_finds_its_key_on_copies_that_read_it_after_its_expiry() {
    let mut m = Server::start(&["--appendonly", "yes", "--aof-use-rdb-preamble", "no"]);
    let r = Server::start(&[]);
    replicate(&r, &m);
    let mut c = m.conn();
    no_active_expire(&mut c);
    assert_eq!(take(&mut c, "k", 0.001, 500.0, 1), 1);
    let _: () = query(&mut c, &["RL.PIN", "k", "0.001", "100"]);
    wait_synced(&m, &r);
    let stopped = Stopped::new(pid(&r));
    // The master's transaction decides both at one instant, long before the second passes
    // (the take must see the key: checked below by the effect it sent).
    let (_, taken): (i64, i64) = redis::pipe()
        .atomic()
        .cmd("PEXPIRE")
        .arg(&["k", "1000"])
        .cmd("RL.TAKE")
        .arg(&["k", "0.001", "500", "2"])
        .query(&mut c)
        .unwrap();
    assert_eq!(taken, 2);
    assert_eq!(
        keep_effects(&m),
        1,
        "the take found no pinned key: {:?}",
        aof_commands(&m).last()
    );
    let want = digest(&mut c, "k");
    assert_ne!(want, "0".repeat(40));
    // The replica reads the stream once the expiry it carries has passed.
    std::thread::sleep(std::time::Duration::from_millis(1100));
    drop(stopped);
    wait_synced(&m, &r);
    assert_eq!(digest(&mut r.conn(), "k"), want, "replica");
    assert_no_stream_errors(&r, "replica");
    drop(c);
    m.restart();
    assert_eq!(digest(&mut m.conn(), "k"), want, "aof replay");
}

/// Forged short effects on keys of every type and every kind of pin: each is refused
/// with an error and changes nothing, or leaves a state every copy takes (the replica
/// applies it verbatim, an RDB reload and DUMP/RESTORE load it); none hits a panic.
#[test]
fn forged_short_effects_error_and_change_nothing_or_leave_a_loadable_state() {
    let s = Server::start(&["--rl.adopt-script-keys", "yes"]);
    let r = Server::start(&[]);
    replicate(&r, &s);
    let mut c = s.internal_conn();
    no_active_expire(&mut c);
    let now = now_ns();
    let setup: &[&[&str]] = &[
        &["SET", "str", "x"],
        &["HSET", "script", "tokens", "5", "ts", "1700000000"],
        &["HSET", "hash", "f", "v"],
        &["RPUSH", "list", "a"],
        &["SADD", "set", "a"],
        &["ZADD", "zset", "1", "a"],
        &["XADD", "stream", "*", "f", "v"],
        &["RL.ACQUIRE", "permits", "5", "100000"],
        &["RL.SHARE", "share", "10", "10", "h", "5", "100000"],
        &["RL.TAKE", "compact", "0.001", "500", "3"],
        &["RL.TAKE", "versioned", "0.001", "500", "3", "VERSION", "2"],
        &["RL.LEASE", "leased", "0.001", "500", "3", "86400000"],
        &["RL.TAKE", "rate", "0.001", "500", "3"],
        &["RL.PIN", "rate", "0.001", "30"],
        &["RL.TAKE", "ends", "0.001", "500", "3"],
        &["RL.PIN", "ends", "0.001", "30", "PX", "100000000"],
        &["RL.LEASE", "leasedpin", "0.001", "500", "3", "86400000"],
        &["RL.PIN", "leasedpin", "0.001", "30"],
        &["RL.TAKE", "blocked", "0.001", "500", "3"],
        &["RL.PIN", "blocked", "BLOCK"],
        &["RL.TAKE", "exempt", "0.001", "500", "3"],
        &["RL.PIN", "exempt", "EXEMPT", "PX", "100000000"],
        &["RL.PIN", "onlypin", "BLOCK"],
        &["RL.PIN", "onlyexempt", "EXEMPT"],
        &["RL.PIN", "ratenew", "0.001", "30"],
        &["RL.TAKE", "ended", "0.001", "500", "3"],
        &["RL.PIN", "ended", "0.001", "30", "PX", "1"],
    ];
    for a in setup {
        let _: Value = query(&mut c, a);
    }
    std::thread::sleep(std::time::Duration::from_millis(5));
    let keys = [
        "missing",
        "str",
        "script",
        "hash",
        "list",
        "set",
        "zset",
        "stream",
        "permits",
        "share",
        "compact",
        "versioned",
        "leased",
        "rate",
        "ends",
        "leasedpin",
        "blocked",
        "exempt",
        "onlypin",
        "onlyexempt",
        "ratenew",
        "ended",
    ];
    // An hour ahead: nothing the forms set expires during the test, however slow.
    let t = (now + 3_600_000_000_000).to_string();
    let forms: Vec<Vec<String>> = [
        vec!["0", "KEEP"],
        vec![&t, "KEEP"],
        vec![&t, "keep"],
        vec![&t, "KEEP", "HOLD", &t],
        vec![&t, "KEEP", "hold", "0"],
        vec!["0", "KEEP", "HOLD", "0"],
        vec![&t, "KEEP", "HOLD"],
        vec![&t, "KEEP", "HOLD", "-1"],
        vec![&t, "KEEP", "HOLD", "9223372036854775808"],
        vec![&t, "KEEP", "HOLD", "18446744073709551616"],
        vec![&t, "KEEP", "HOLD", "1.5"],
        vec![&t, "KEEP", "HOLD", &t, "HOLD", &t],
        vec![&t, "KEEP", "SPAN", &t],
        vec![&t, "KEEP", "x"],
        vec![&t, "KEEP", "HOLD", &t, "x"],
        vec!["-1", "KEEP"],
        vec!["1e3", "KEEP"],
        vec!["", "KEEP"],
        vec!["9223372036854775807", "KEEP"],
        vec!["9223372036854775808", "KEEP"],
        vec!["18446744073709551615", "KEEP"],
        vec![&t, "KEEP", "VERSION", "3"],
        vec![&t, "KEEP", "PIN", "1", "0", "1", "1", "0"],
    ]
    .iter()
    .map(|f| f.iter().map(|x| x.to_string()).collect())
    .collect();
    let mut accepted = 0;
    for k in keys {
        for f in &forms {
            // A key past its time (an accepted `0 KEEP` makes it so) goes when looked at.
            let _: i64 = query(&mut c, &["EXISTS", k]);
            let before = digest(&mut c, k);
            let ttl_before: i64 = query(&mut c, &["PEXPIRETIME", k]);
            let mut args = vec!["RL.SETSTATE".to_string(), k.to_string()];
            args.extend(f.iter().cloned());
            match storm_send(&mut c, &args) {
                Ok(_) => accepted += 1,
                Err(_) => {
                    assert_eq!(digest(&mut c, k), before, "{args:?} changed the key");
                    let ttl: i64 = query(&mut c, &["PEXPIRETIME", k]);
                    assert_eq!(ttl, ttl_before, "{args:?} changed the expiry");
                }
            }
        }
    }
    assert!(accepted > 0);
    let all = dataset_digest(&mut c);
    wait_synced(&s, &r);
    assert_eq!(dataset_digest(&mut r.conn()), all, "replica");
    assert_no_stream_errors(&r, "replica");
    for k in keys {
        let d = digest(&mut c, k);
        let payload: Option<Vec<u8>> = redis::cmd("DUMP").arg(k).query(&mut c).unwrap();
        if let Some(p) = payload {
            // The digest covers the expiry: the copy gets the same one.
            let at: i64 = query(&mut c, &["PEXPIRETIME", k]);
            let copy = format!("{k}:copy");
            let mut restore = redis::cmd("RESTORE");
            restore.arg(&copy).arg(at.max(0)).arg(p);
            if at > 0 {
                restore.arg("ABSTTL");
            }
            let _: () = restore
                .query(&mut c)
                .unwrap_or_else(|e| panic!("RESTORE of {k}: {e}"));
            assert_eq!(digest(&mut c, &copy), d, "{k}");
            let _: i64 = query(&mut c, &["DEL", &copy]);
        }
    }
    let _: String = query(&mut c, &["DEBUG", "RELOAD"]);
    assert_eq!(dataset_digest(&mut c), all, "rdb reload");
    assert!(!s.log().contains("panicked"));
}

fn info_rl(c: &mut Connection, field: &str) -> u64 {
    info_field(c, "rl", field)
}

/// A call needing more than a live rate pin's cap is a pinned denial in every count (the
/// command's denials, the pinned decisions, the namespace's denied and pinned, `RL.TOP`),
/// never an error, a shadow denial when it says `SHADOW`; it writes nothing (no effect in
/// the AOF, the same bytes), but a newer `VERSION`, which replaces the limit the pin
/// returns to, and it mints nothing.
#[test]
fn an_over_cap_call_is_a_pinned_denial_that_writes_nothing() {
    let s = Server::start(&["--appendonly", "yes", "--aof-use-rdb-preamble", "no"]);
    let mut c = s.conn();
    no_active_expire(&mut c);
    assert_eq!(take(&mut c, "ns:k", 0.001, 100.0, 1), 1);
    let _: () = query(&mut c, &["RL.PIN", "ns:k", "0.001", "4"]);
    let _: Vec<i64> = query(
        &mut c,
        &["RL.LEASE", "ns:l", "0.001", "100", "2", "86400000"],
    );
    let _: () = query(&mut c, &["RL.PIN", "ns:l", "0.001", "4", "PX", "100000000"]);
    let _: () = query(&mut c, &["CONFIG", "RESETSTAT"]);
    let effects = aof_commands(&s).len();
    let (dk, dl) = (digest(&mut c, "ns:k"), digest(&mut c, "ns:l"));
    let calls: &[&[&str]] = &[
        &["RL.TAKE", "ns:k", "0.001", "100", "5"],
        &[
            "RL.TAKE",
            "ns:k",
            "0.001",
            "100",
            "5",
            "WITHSTATE",
            "VERSION",
            "0",
        ],
        &["RL.RESERVE", "ns:k", "0.001", "100", "5", "86400000"],
        &["RL.LEASE", "ns:l", "0.001", "100", "9", "1000", "MIN", "5"],
        &[
            "RL.MTAKE", "5", "ns:k", "0.001", "100", "ns:l", "0.001", "100",
        ],
        &["RL.TAKE", "ns:l", "0.001", "100", "5", "SHADOW"],
    ];
    let replies: Vec<Value> = calls.iter().map(|a| query(&mut c, a)).collect();
    assert_eq!(replies[0], Value::Int(0));
    assert_eq!(ints(&replies[1])[2], 60_000);
    assert_eq!(ints(&replies[2])[..2], [0, 60_000]);
    assert_eq!(ints(&replies[3])[0], 0);
    assert_eq!(
        replies[5],
        Value::Int(5),
        "SHADOW answers a denial as a grant"
    );
    assert_eq!(aof_commands(&s).len(), effects, "a denial wrote an effect");
    assert_eq!(digest(&mut c, "ns:k"), dk);
    assert_eq!(digest(&mut c, "ns:l"), dl);
    assert_eq!(info_rl(&mut c, "rl_errors"), 0);
    assert_eq!(info_rl(&mut c, "rl_denied"), 2);
    assert_eq!(info_rl(&mut c, "rl_reserve_denied"), 1);
    assert_eq!(info_rl(&mut c, "rl_leases_denied"), 1);
    assert_eq!(info_rl(&mut c, "rl_mtake_denied"), 1);
    assert_eq!(info_rl(&mut c, "rl_shadow_denied"), 1);
    assert_eq!(info_rl(&mut c, "rl_pinned_decisions"), 7);
    let ns: std::collections::HashMap<String, u64> =
        redis::cmd("RL.STATS").arg("ns").query(&mut c).unwrap();
    assert_eq!(ns["calls"], 6, "{ns:?}");
    assert_eq!(ns["denied"], 5, "{ns:?}");
    assert_eq!(ns["shadow_denied"], 1, "{ns:?}");
    // Decisions, not calls: RL.MTAKE made one on each of its two pinned keys.
    assert_eq!(ns["pinned"], 7, "{ns:?}");
    let top: Value = query(&mut c, &["RL.TOP"]);
    assert!(format!("{top:?}").contains("ns:k"), "{top:?}");

    // A newer VERSION over the cap: denied, the limit the pin returns to replaced (and
    // sent in full); once the pin goes the bucket holds at most the pinned cap's tokens.
    let r: Value = query(
        &mut c,
        &[
            "RL.TAKE",
            "ns:k",
            "0.001",
            "200",
            "5",
            "WITHSTATE",
            "VERSION",
            "7",
        ],
    );
    assert_eq!(ints(&r)[..3], [0, 4, 60_000]);
    let last = aof_commands(&s).pop().unwrap();
    assert!(last.contains(&"PIN".to_string()), "{last:?}");
    assert_eq!(query::<i64>(&mut c, &["RL.UNPIN", "ns:k"]), 1);
    let r: Value = query(
        &mut c,
        &[
            "RL.TAKE",
            "ns:k",
            "0.001",
            "200",
            "5",
            "WITHSTATE",
            "VERSION",
            "7",
        ],
    );
    assert_eq!(ints(&r)[0], 0, "tokens minted: {r:?}");
    let peek: std::collections::HashMap<String, Value> =
        redis::cmd("RL.PEEK").arg("ns:k").query(&mut c).unwrap();
    let num = |k: &str| redis::from_redis_value::<f64>(&peek[k]).unwrap();
    assert_eq!(
        num("cap"),
        200.0,
        "the version kept aside governs: {peek:?}"
    );
    assert!(num("tokens") < 4.01, "tokens minted: {peek:?}");
}

/// A pinned key migrated (`MIGRATE`) to a server with a replica, then taken there: the
/// short effects land on the state the replica got from the migration.
#[test]
fn short_effects_after_a_migration_land_on_the_migrated_state() {
    let a = Server::start(&[]);
    let mut b = Server::start(&["--appendonly", "yes", "--aof-use-rdb-preamble", "no"]);
    let rb = Server::start(&[]);
    replicate(&rb, &b);
    let mut ca = a.conn();
    let _: Vec<i64> = query(&mut ca, &["RL.LEASE", "p", "0.001", "500", "3", "86400000"]);
    let _: Value = query(
        &mut ca,
        &["RL.TAKE", "p", "0.001", "500", "1", "VERSION", "4"],
    );
    let _: () = query(&mut ca, &["RL.PIN", "p", "0.001", "40", "PX", "100000000"]);
    assert_eq!(take(&mut ca, "p", 0.001, 500.0, 2), 2);
    let port = b.port.to_string();
    let _: () = query(&mut ca, &["MIGRATE", "127.0.0.1", &port, "p", "0", "5000"]);
    let mut cb = b.conn();
    for _ in 0..5 {
        let r: i64 = query(
            &mut cb,
            &["RL.TAKE", "p", "0.001", "500", "2", "VERSION", "4"],
        );
        assert_eq!(r, 2);
    }
    assert_eq!(keep_effects(&b), 5);
    let want = digest(&mut cb, "p");
    wait_synced(&b, &rb);
    assert_eq!(digest(&mut rb.conn(), "p"), want, "replica");
    assert_no_stream_errors(&rb, "replica");
    drop(cb);
    b.restart();
    assert_eq!(digest(&mut b.conn(), "p"), want, "aof replay");
}

/// The short form is as closed to clients as the full one: a user allowed every
/// command but `CONFIG`, or `RL.SETSTATE` explicitly (`+rl.setstate`) but not `CONFIG
/// SET`, cannot move a pinned bucket's fill instant with it (it would refill the bucket).
#[test]
fn clients_that_may_not_set_state_cannot_send_the_short_form() {
    let s = Server::start(&[]);
    let mut admin = s.conn();
    assert_eq!(take(&mut admin, "k", 0.001, 500.0, 400), 400);
    let _: () = query(&mut admin, &["RL.PIN", "k", "0.001", "500"]);
    let before = digest(&mut admin, "k");
    let keep: &[&str] = &["RL.SETSTATE", "k", "0", "KEEP"];
    for rules in ["~* +@all -config", "~* +rl.setstate +rl.take"] {
        let mut u = as_user(&s, "u", rules);
        let r = redis::cmd(keep[0]).arg(&keep[1..]).query::<Value>(&mut u);
        assert!(r.is_err(), "{rules}: {r:?}");
    }
    assert_eq!(digest(&mut admin, "k"), before);
}
