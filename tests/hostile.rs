//! A hostile client and a careless operator against the rules that keep a server whole:
//! whatever a command accepts survives every reload, sync and migration; a refused command
//! changes nothing; a corrupt payload is an error, never an abort.

mod support;

use std::time::Duration;
use support::*;

/// A small deterministic generator (xorshift64*), so a failure can be replayed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn pick<'a>(&mut self, from: &[&'a str]) -> &'a str {
        from[(self.next() % from.len() as u64) as usize]
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
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
            4 => args.extend(["VERSION".into(), rng.pick(&versions).into()]),
            0 => args.extend(["LASTID".into(), rng.pick(&ids).into()]),
            1 => args.extend(["PRUNE".into(), now.to_string()]),
            2 => args.extend(["DROP".into(), rng.pick(&ids).into()]),
            3 => args.extend([
                "ADD".into(),
                rng.pick(&ids).into(),
                rng.pick(&tokens).into(),
                (now + 600_000_000_000 + rng.below(10_000_000_000)).to_string(),
            ]),
            _ => args.push(rng.pick(&["BOGUS", "ADD", "LASTID"]).into()),
        }
    }
    args
}

fn run(c: &mut Connection, cmd: &str, args: &[String]) -> redis::RedisResult<Value> {
    redis::cmd(cmd).arg(args).query(c)
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

/// Generated states: every accepted one survives DEBUG RELOAD, DUMP/RESTORE, MIGRATE, an
/// AOF rewrite and restart, and a full sync to a new replica, with equal digests; every
/// refused one changed nothing.
#[test]
fn every_accepted_state_survives_reload_restore_migrate_aof_and_full_sync() {
    let mut s = Server::start(&["--appendonly", "yes", "--aof-use-rdb-preamble", "no"]);
    let mut c = s.internal_conn();
    // Keys go only when looked at, so "nothing changed" compares like with like.
    let _: () = redis::cmd("DEBUG")
        .arg("SET-ACTIVE-EXPIRE")
        .arg(0)
        .query(&mut c)
        .unwrap();
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
    rewrite_aof(&mut c);
    drop(c);
    s.restart();
    let mut c = s.conn();
    assert_eq!(dataset_digest(&mut c), digest_all, "AOF rewrite + restart");
    assert!(!s.exited());
}

/// A payload cut short or with flipped bits, under a valid CRC, is refused with an error
/// (or accepted as a valid bucket), and the server lives on.
#[test]
fn corrupt_restore_payloads_are_errors_not_aborts() {
    let mut s = Server::start(&["--sanitize-dump-payload", "yes"]);
    let mut c = s.conn();
    // Redis's own check value for its CRC-64.
    assert_eq!(crc64(b"123456789"), 0xe9c6_d914_c4b8_d9ca);
    // Slow limits (hours to full): the keys must still be there to DUMP on a busy machine.
    let _: i64 = redis::cmd("RL.TAKE")
        .arg(&["plain", "0.01", "100", "7"])
        .query(&mut c)
        .unwrap();
    let _: Vec<i64> = redis::cmd("RL.LEASE")
        .arg(&["leased", "0.001", "1000", "20", "600000"])
        .query(&mut c)
        .unwrap();
    let _: Vec<i64> = redis::cmd("RL.LEASE")
        .arg(&["leased", "0.001", "1000", "30", "600000"])
        .query(&mut c)
        .unwrap();
    // Encoding 3 carries the limit's version.
    let _: i64 = redis::cmd("RL.TAKE")
        .arg(&[
            "versioned",
            "0.01",
            "100",
            "7",
            "VERSION",
            "9007199254740991",
        ])
        .query(&mut c)
        .unwrap();
    let _: Vec<i64> = redis::cmd("RL.LEASE")
        .arg(&["vleased", "0.001", "1000", "20", "600000", "VERSION", "300"])
        .query(&mut c)
        .unwrap();
    let mut rng = Rng(42);
    let (mut tried, mut accepted) = (0, 0);
    for key in ["plain", "leased", "versioned", "vleased"] {
        let payload = dump(&mut c, key);
        let body = dump_body(&payload);
        // The CRC is Redis's: an untouched payload reseals to itself.
        assert_eq!(reseal(&payload, body), payload);
        let mut bodies: Vec<Vec<u8>> = (1..body.len()).map(|n| body[..n].to_vec()).collect();
        for _ in 0..300 {
            let mut b = body.to_vec();
            for _ in 0..1 + rng.below(3) {
                let i = 1 + rng.below(b.len() as u64 - 1) as usize;
                b[i] ^= 1 << rng.below(8);
            }
            bodies.push(b);
        }
        for b in bodies {
            tried += 1;
            let forged = reseal(&payload, &b);
            let reply = redis::cmd("RESTORE")
                .arg("x")
                .arg(0)
                .arg(forged)
                .arg("REPLACE")
                .query::<Value>(&mut c);
            if reply.is_ok() {
                accepted += 1;
                // Whatever was accepted behaves as a valid bucket.
                let _: Value = redis::cmd("RL.PEEK").arg("x").query(&mut c).unwrap();
                let t: redis::RedisResult<Value> =
                    redis::cmd("RL.TAKE").arg(&["x", "1", "10"]).query(&mut c);
                assert!(
                    t.is_ok() || t.as_ref().unwrap_err().code() == Some("WRONGTYPE"),
                    "{t:?}"
                );
                let _: () = redis::cmd("DEL").arg("x").query(&mut c).unwrap();
            }
        }
    }
    assert!(!s.exited(), "the server died: {}", s.log());
    let pong: String = redis::cmd("PING").query(&mut c).unwrap();
    assert_eq!(pong, "PONG");
    let _: () = redis::cmd("DEBUG").arg("RELOAD").query(&mut c).unwrap();
    assert!(tried > 1200 && accepted < tried, "{accepted} of {tried}");
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
    rewrite_aof(&mut c);
    drop(c);
    s.restart();
    let mut c = s.conn();
    assert_eq!(pttl(&mut c, "norm"), -1);
    assert_eq!(
        dataset_digest(&mut c),
        before,
        "AOF rewrite changed expiries"
    );
}

/// Cap alternating by one token at 1e15 (two app versions, say) mints nothing: what is
/// let out stays within `cap + rate * elapsed` of the smaller cap.
#[test]
fn alternating_caps_at_1e15_mint_nothing() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let start = std::time::Instant::now();
    // Start empty, so every grant is refill.
    let _: i64 = redis::cmd("RL.TAKE")
        .arg(&["k", "320000", "1e15", "1", "INIT", "0"])
        .query(&mut c)
        .unwrap();
    let mut out = 0i64;
    for round in 0..40 {
        let mut pipe = redis::pipe();
        for i in 0..1000 {
            let cap = if (round * 1000 + i) % 2 == 0 {
                "999999999999999"
            } else {
                "1e15"
            };
            pipe.cmd("RL.TAKE").arg(&["k", "320000", cap, "100"]);
        }
        let got: Vec<i64> = pipe.query(&mut c).unwrap();
        out += got.iter().sum::<i64>();
    }
    let elapsed = start.elapsed().as_secs_f64();
    let bound = 320_000.0 * elapsed;
    assert!(
        (out as f64) <= bound,
        "let out {out} in {elapsed:.3} s: more than {bound}"
    );
    // Counted on every write that changed the stored limit (denials write nothing).
    let changes = info_field(&mut c, "rl", "rl_limit_changes");
    assert!(
        (1..=40_000).contains(&changes),
        "rl_limit_changes {changes}"
    );
}

/// The rule for a key used with two limits: tokens carry over, clamped to the new cap; a
/// bucket written under a new limit keeps its key until it would have been full under the
/// old one, so a caller back on the old limit finds the tokens, not a fresh full bucket.
/// Counted in rl_limit_changes.
#[test]
fn a_flapping_limit_follows_the_documented_rule() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let remaining = |c: &mut Connection, rate: &str, cap: &str| -> f64 {
        let v: (i64, f64, i64, i64) = redis::cmd("RL.TAKE")
            .arg(&["k", rate, cap, "1", "WITHSTATE"])
            .query(c)
            .unwrap();
        v.1
    };
    let _: i64 = redis::cmd("RL.TAKE")
        .arg(&["k", "1", "1000", "990"])
        .query(&mut c)
        .unwrap();
    let before = info_field(&mut c, "rl", "rl_limit_changes");
    // Under (10, 10) the 10 tokens fill the bucket: one is taken, and 100 ms refill it.
    let write = server_ms(&mut c);
    let r = remaining(&mut c, "10", "10");
    let write = (write, server_ms(&mut c));
    assert!((8.9..=9.1).contains(&r), "{r}");
    assert_eq!(info_field(&mut c, "rl", "rl_limit_changes"), before + 1);
    std::thread::sleep(Duration::from_millis(250));
    // Full under (10, 10), but the key stays until idle as long as (1, 1000) takes to
    // fill: 1000 s (less the 9 tokens it held at that write).
    let exists: i64 = redis::cmd("EXISTS").arg("k").query(&mut c).unwrap();
    assert_eq!(
        exists, 1,
        "the key went before the old limit's bucket was full"
    );
    assert_expires_in(&mut c, "k", write, 990_000..=1_000_000);
    // Back to (1, 1000): the 10 tokens, less the one taken now.
    let r = remaining(&mut c, "1", "1000");
    assert!((8.9..=9.1).contains(&r), "{r}");
    let at: i64 = redis::cmd("PEXPIRETIME").arg("k").query(&mut c).unwrap();
    // The hold survives a reload and reaches a replica.
    let replica = Server::start(&[]);
    replicate(&replica, &s);
    wait_synced(&s, &replica);
    assert_eq!(digest(&mut replica.conn(), "k"), digest(&mut c, "k"));
    let _: () = redis::cmd("DEBUG").arg("RELOAD").query(&mut c).unwrap();
    let reloaded: i64 = redis::cmd("PEXPIRETIME").arg("k").query(&mut c).unwrap();
    assert_eq!(reloaded, at, "the reload moved the expiry");
}

#[test]
fn small_rules_return_says_what_it_credited_options_once_unknown_option_named() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let err = |c: &mut Connection, args: &[&str]| -> String {
        redis::cmd(args[0])
            .arg(&args[1..])
            .query::<Value>(c)
            .unwrap_err()
            .to_string()
    };
    assert!(err(&mut c, &["RL.TAKE", "k", "10", "10", "FOO"]).contains("unknown option 'FOO'"));
    assert!(err(&mut c, &["RL.TAKE", "k", "10", "10", "x1"]).contains("unknown option"));
    assert!(err(&mut c, &["RL.TAKE", "k", "10", "10", "-1"]).contains("n must be"));
    for args in [
        &["RL.TAKE", "k", "10", "10", "WITHSTATE", "WITHSTATE"][..],
        &["RL.TAKE", "k", "10", "10", "INIT", "1", "INIT", "2"],
        &[
            "RL.LEASE", "k", "10", "10", "5", "100", "MIN", "1", "MIN", "2",
        ],
        &[
            "RL.LEASE", "k", "10", "10", "5", "100", "INIT", "1", "init", "2",
        ],
        &[
            "RL.LEASE", "k", "10", "10", "5", "100", "RETURN", "1", "1", "RETURN", "2", "2",
        ],
        &["RL.MTAKE", "1", "k", "10", "10", "WITHSTATE", "WITHSTATE"],
        &["RL.MTAKE", "1", "k", "10", "10", "INIT", "1", "INIT", "1"],
    ] {
        let e = err(&mut c, args);
        assert!(e.contains("given twice"), "{args:?}: {e}");
    }
    let exists: i64 = redis::cmd("EXISTS").arg("k").query(&mut c).unwrap();
    assert_eq!(exists, 0);
    // A return into a bucket that refilled meanwhile says what it took back.
    let v: Vec<i64> = redis::cmd("RL.LEASE")
        .arg(&["r", "1000", "10", "5", "60000"])
        .query(&mut c)
        .unwrap();
    std::thread::sleep(Duration::from_millis(20));
    let credited: i64 = redis::cmd("RL.RETURN")
        .arg(&["r", &v[1].to_string(), "5"])
        .query(&mut c)
        .unwrap();
    assert_eq!(credited, 0, "the bucket was full again");
    // Leases may not hold more than i64::MAX tokens in all (PEEK adds them up).
    let mut ic = s.internal_conn();
    let big = "9223372036854775807";
    let far = (now_ns() + 600_000_000_000).to_string();
    let e = redis::cmd("RL.SETSTATE")
        .arg(&["w", "0", "1", "1", "LASTID", "2", "ADD", "1", big, &far])
        .query::<()>(&mut ic);
    assert!(e.is_ok(), "{e:?}");
    let e = redis::cmd("RL.SETSTATE")
        .arg(&["w", "0", "1", "1", "ADD", "2", big, &far])
        .query::<()>(&mut ic)
        .unwrap_err();
    assert!(e.to_string().contains("in all"), "{e}");
}

/// `COMMAND DOCS` lists every command's arguments (redis-cli's hints come from it).
#[test]
fn command_docs_list_the_arguments() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    for (cmd, args) in [
        (
            "RL.TAKE",
            &["key", "rate", "cap", "n", "WITHSTATE", "tokens", "VERSION"][..],
        ),
        (
            "RL.LEASE",
            &["ttl_ms", "m", "return", "lease_id", "unused", "VERSION"],
        ),
        ("RL.RESERVE", &["max_wait_ms", "VERSION"]),
        ("RL.RETURN", &["key", "lease_id", "unused"]),
        ("RL.PEEK", &["key"]),
        ("RL.MTAKE", &["n", "bucket", "key", "WITHSTATE", "VERSION"]),
    ] {
        let docs: Value = redis::cmd("COMMAND")
            .arg("DOCS")
            .arg(cmd)
            .query(&mut c)
            .unwrap();
        let text = format!("{docs:?}");
        for a in args {
            assert!(
                text.contains(&format!("\"{a}\"")),
                "{cmd} lacks {a}: {text}"
            );
        }
    }
}

/// The semaphore's effect command and payloads get the same treatment: generated
/// `RL.SETPERMITS` vectors either change nothing or leave a state every copy reproduces,
/// and corrupt `RESTORE` payloads of a semaphore are errors, not aborts.
#[test]
fn semaphore_effects_and_payloads_cannot_break_the_server() {
    let mut s = Server::start(&["--appendonly", "yes", "--aof-use-rdb-preamble", "no"]);
    let mut c = s.internal_conn();
    let _: () = redis::cmd("DEBUG")
        .arg("SET-ACTIVE-EXPIRE")
        .arg(0)
        .query(&mut c)
        .unwrap();
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
    // A real permit key for the payload attacks.
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
        let reply = redis::cmd("RESTORE")
            .arg("x")
            .arg(0)
            .arg(forged)
            .arg("REPLACE")
            .query::<Value>(&mut c);
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
    rewrite_aof(&mut c);
    drop(c);
    s.restart();
    let mut c = s.conn();
    assert_eq!(dataset_digest(&mut c), all, "AOF rewrite + restart");
}
