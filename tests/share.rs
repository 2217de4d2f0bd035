//! RL.SHARE: rate shares leased to holders, on a real server: replies (RESP2 and RESP3),
//! bad input, types, RELEASE, the holder limit, versions, expiry, persistence and
//! replication, forged effects and payloads, and a fleet of holders whose usable shares
//! never sum above the rate.

mod support;

use std::time::Duration;
use support::*;

const MS: u64 = 1_000_000;
/// A period long enough that no lease ends during a test unless the test wants it to.
const LONG: &str = "3600000";

type ShareReply = (f64, f64, i64, i64, i64);

fn share(c: &mut Connection, args: &[&str]) -> ShareReply {
    let mut cmd = redis::cmd("RL.SHARE");
    for a in args {
        cmd.arg(*a);
    }
    cmd.query(c)
        .unwrap_or_else(|e| panic!("RL.SHARE {args:?}: {e}"))
}

fn share_err(c: &mut Connection, args: &[&str]) -> String {
    let mut cmd = redis::cmd("RL.SHARE");
    for a in args {
        cmd.arg(*a);
    }
    match cmd.query::<Value>(c) {
        Ok(v) => panic!("RL.SHARE {args:?} answered {v:?}"),
        Err(e) => e.to_string(),
    }
}

/// The server's clock (`TIME`) in ns.
fn server_ns(c: &mut Connection) -> u64 {
    let (s, us): (u64, u64) = redis::cmd("TIME").query(c).unwrap();
    s * 1_000_000_000 + us * 1000
}

fn pexpiretime(c: &mut Connection, key: &str) -> i64 {
    redis::cmd("PEXPIRETIME").arg(key).query(c).unwrap()
}

/// How much the master has propagated so far (it has a replica: see [`with_replica`]).
fn offset(c: &mut Connection) -> u64 {
    info_field(c, "replication", "master_repl_offset")
}

/// A master with a replica attached, so that `master_repl_offset` counts what it sends.
fn with_replica() -> (Server, Server) {
    let s = Server::start(&[]);
    let replica = Server::start(&[]);
    replicate(&replica, &s);
    (s, replica)
}

#[test]
fn a_lone_holder_gets_the_rate_and_a_newcomer_what_is_free() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    // A newcomer is told to come back after 300 ms, with what it measured by then.
    assert_eq!(
        share(&mut c, &["k", "100", "50", "a", "10", "1000"]),
        (100.0, 50.0, 3000, 300, 1)
    );
    // Nothing free for b: 0, and told to come back within a period.
    let (rate, burst, lease, refresh, holders) =
        share(&mut c, &["k", "100", "50", "b", "10", "1000"]);
    assert_eq!((rate, burst, lease, holders), (0.0, 0.0, 3000, 2));
    assert!((10..=1000).contains(&refresh), "{refresh}");
    // a refreshes: half; its old share is held 250 ms, so b still gets nothing at once...
    assert_eq!(
        share(&mut c, &["k", "100", "50", "a", "10", "1000"]),
        (50.0, 25.0, 3000, 1000, 2)
    );
    let (rate, _, _, refresh, _) = share(&mut c, &["k", "100", "50", "b", "10", "1000"]);
    if rate == 0.0 {
        assert!(
            (10..=250).contains(&refresh),
            "come back when a's hold ends: {refresh}"
        );
        // ... and its half once the hold is over.
        wait_until(10, "a's hold to end", || {
            share(&mut c, &["k", "100", "50", "b", "10", "1000"]).0 == 50.0
        });
    } else {
        assert_eq!(rate, 50.0, "the hold had ended already");
    }
    assert_eq!(info_field(&mut c, "rl", "rl_share_holders"), 2);
    let ty: String = redis::cmd("TYPE").arg("k").query(&mut c).unwrap();
    assert_eq!(ty, "rl-shares");
}

/// A holder asking for a 50 ms period is told to call every 300 ms (its lease 900 ms), so
/// it never calls within its previous call's hold (250 ms): when its share shrinks, what it
/// gave up comes free when that hold ends, however often it asked to call. Both holders
/// call again as told (`refresh_ms` after the answer, on the server's clock).
#[test]
fn a_short_period_holder_lets_go_of_what_it_gave_up() {
    let s = Server::start(&[]);
    let (mut a, mut b) = (s.conn(), s.conn());
    assert_eq!(
        share(&mut a, &["k", "100", "50", "a", "10", "50"]),
        (100.0, 50.0, 900, 300, 1)
    );
    let mut next_a = server_ns(&mut a) + 300 * MS;
    let got = share(&mut b, &["k", "100", "50", "b", "10", "50"]);
    assert_eq!((got.0, got.2, got.4), (0.0, 900, 2));
    let mut next_b = server_ns(&mut b) + got.3 as u64 * MS;
    let (mut a_calls, mut b_rate) = (0, 0.0);
    wait_until(30, "b to get its half", || {
        if server_ns(&mut a) >= next_a {
            let r = share(&mut a, &["k", "100", "50", "a", "10", "50"]);
            assert_eq!(r, (50.0, 25.0, 900, 300, 2), "a's half, every 300 ms");
            next_a = server_ns(&mut a) + r.3 as u64 * MS;
            a_calls += 1;
        }
        if server_ns(&mut b) >= next_b {
            let r = share(&mut b, &["k", "100", "50", "b", "10", "50"]);
            assert!((10..=300).contains(&r.3), "{r:?}");
            next_b = server_ns(&mut b) + r.3 as u64 * MS;
            b_rate = r.0;
        }
        b_rate == 50.0
    });
    assert!(a_calls >= 1);
}

#[test]
fn replies_are_doubles_under_resp3_and_strings_under_resp2() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let v: Value = redis::cmd("RL.SHARE")
        .arg(&["k", "0.3", "7", "a", "1", "100"])
        .query(&mut c)
        .unwrap();
    let Value::Array(items) = v else {
        panic!("{v:?}")
    };
    assert_eq!(items.len(), 5);
    assert!(
        matches!(&items[0], Value::BulkString(b) if b == b"0.3"),
        "{items:?}"
    );
    assert!(
        matches!(&items[1], Value::BulkString(b) if b == b"7"),
        "{items:?}"
    );
    assert_eq!(
        &items[2..],
        &[Value::Int(900), Value::Int(300), Value::Int(1)]
    );
    let _: Value = redis::cmd("HELLO").arg(3).query(&mut c).unwrap();
    let v: Value = redis::cmd("RL.SHARE")
        .arg(&["k", "0.3", "7", "a", "1", "100"])
        .query(&mut c)
        .unwrap();
    let Value::Array(items) = v else {
        panic!("{v:?}")
    };
    assert!(
        matches!(items[0], Value::Double(r) if r == 0.3),
        "{items:?}"
    );
    assert!(
        matches!(items[1], Value::Double(b) if b == 7.0),
        "{items:?}"
    );
    assert_eq!(
        &items[2..],
        &[Value::Int(900), Value::Int(300), Value::Int(1)]
    );
}

#[test]
fn bad_input_is_a_clear_error_that_changes_nothing() {
    let (s, _replica) = with_replica();
    let mut c = s.conn();
    share(&mut c, &["k", "10", "10", "a", "1", LONG]);
    let long = "x".repeat(65);
    let before = dataset_digest(&mut c);
    let at = offset(&mut c);
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["k", "10", "10", "", "1", "100"],
            "holder must be 1 to 64 bytes",
        ),
        (
            vec!["k", "10", "10", &long, "1", "100"],
            "holder must be 1 to 64 bytes",
        ),
        (
            vec!["k", "10", "10", "b", "-1", "100"],
            "want must be a finite number",
        ),
        (
            vec!["k", "10", "10", "b", "nan", "100"],
            "want must be a finite number",
        ),
        (
            vec!["k", "10", "10", "b", "inf", "100"],
            "want must be a finite number",
        ),
        (
            vec!["k", "10", "10", "b", "1e16", "100"],
            "want must be a finite number",
        ),
        (
            vec!["k", "10", "10", "b", "many", "100"],
            "want must be a finite number",
        ),
        (
            vec!["k", "10", "10", "b", "1", "9"],
            "period_ms must be an integer from 10 to 3600000",
        ),
        (
            vec!["k", "10", "10", "b", "1", "3600001"],
            "period_ms must be an integer",
        ),
        (
            vec!["k", "10", "10", "b", "1", "-5"],
            "period_ms must be an integer",
        ),
        (
            vec!["k", "10", "10", "b", "1", "1.5"],
            "period_ms must be an integer",
        ),
        (
            vec!["k", "0", "10", "b", "1", "100"],
            "rate must be a finite number",
        ),
        (
            vec!["k", "10", "nan", "b", "1", "100"],
            "cap must be a finite number",
        ),
        (
            vec!["k", "10", "10", "b", "1", "100", "FOO"],
            "unknown option 'FOO'",
        ),
        (
            vec!["k", "10", "10", "b", "1", "100", "RELEASE", "release"],
            "given twice",
        ),
        (
            vec![
                "k", "10", "10", "b", "1", "100", "VERSION", "1", "VERSION", "2",
            ],
            "given twice",
        ),
        (
            vec!["k", "10", "10", "b", "1", "100", "VERSION", "-1"],
            "VERSION must be an integer",
        ),
        (
            vec![
                "k",
                "10",
                "10",
                "b",
                "1",
                "100",
                "VERSION",
                "9007199254740992",
            ],
            "VERSION must be",
        ),
        (
            vec!["k", "10", "10", "b", "1", "100", "VERSION"],
            "wrong number of arguments",
        ),
    ];
    for (args, text) in &cases {
        let e = share_err(&mut c, args);
        assert!(e.contains(text), "{args:?}: {e}");
    }
    let e = share_err(&mut c, &["k", "10", "10", "b", "1"]);
    assert!(e.contains("wrong number of arguments"), "{e}");
    assert_eq!(dataset_digest(&mut c), before);
    assert_eq!(offset(&mut c), at, "nothing propagated");
    // -0 is 0; 64 bytes and 1e15 are fine.
    share(&mut c, &["k", "10", "10", "b", "-0", "100"]);
    share(&mut c, &["k", "10", "10", &long[..64], "1e15", "100"]);
}

#[test]
fn share_keys_and_other_keys_are_different_types() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    assert_eq!(take(&mut c, "bucket", 1.0, 10.0, 1), 1);
    let _: Value = redis::cmd("RL.ACQUIRE")
        .arg(&["sem", "5", "10000"])
        .query(&mut c)
        .unwrap();
    let _: () = redis::cmd("SET").arg("str").arg("x").query(&mut c).unwrap();
    share(&mut c, &["sh", "10", "10", "a", "1", LONG]);
    let before = dataset_digest(&mut c);
    for key in ["bucket", "sem", "str"] {
        let e = share_err(&mut c, &[key, "10", "10", "a", "1", "100"]);
        assert!(e.starts_with("WRONGTYPE"), "{key}: {e}");
    }
    for args in [
        &["RL.TAKE", "sh", "1", "10"][..],
        &["RL.LEASE", "sh", "1", "10", "1", "100"],
        &["RL.RESERVE", "sh", "1", "10", "1", "100"],
        &["RL.REFUND", "sh", "1"],
        &["RL.RETURN", "sh", "1", "1"],
        &["RL.PEEK", "sh"],
        &["RL.MTAKE", "1", "sh", "1", "10"],
        &["RL.ACQUIRE", "sh", "5", "1000"],
        &["RL.RELEASE", "sh", "1"],
        &["RL.RENEW", "sh", "1", "1000"],
    ] {
        let e = redis::cmd(args[0])
            .arg(&args[1..])
            .query::<Value>(&mut c)
            .unwrap_err();
        assert_eq!(e.code(), Some("WRONGTYPE"), "{args:?}");
    }
    assert_eq!(dataset_digest(&mut c), before);
}

#[test]
fn release_gives_the_share_up_and_an_unknown_release_writes_nothing() {
    let (s, _replica) = with_replica();
    let mut c = s.conn();
    share(&mut c, &["k", "10", "10", "a", "1", LONG]);
    share(&mut c, &["k", "10", "10", "b", "1", LONG]);
    let at = offset(&mut c);
    let before = dataset_digest(&mut c);
    for who in ["nobody", "c"] {
        assert_eq!(
            share(&mut c, &["k", "10", "10", who, "1", "500", "RELEASE"]),
            (0.0, 0.0, 0, 500, 2)
        );
    }
    // On a missing key too, and no key is made.
    assert_eq!(
        share(&mut c, &["none", "10", "10", "a", "1", "500", "RELEASE"]),
        (0.0, 0.0, 0, 500, 0)
    );
    assert_eq!(dataset_digest(&mut c), before);
    assert_eq!(offset(&mut c), at);
    assert_eq!(
        share(&mut c, &["k", "10", "10", "a", "1", "500", "RELEASE"]),
        (0.0, 0.0, 0, 500, 1)
    );
    assert!(offset(&mut c) > at);
    assert_eq!(info_field(&mut c, "rl", "rl_shares_released"), 1);
    // Released twice: the second has no live lease, so it writes nothing.
    let at = offset(&mut c);
    share(&mut c, &["k", "10", "10", "a", "1", "500", "RELEASE"]);
    assert_eq!(offset(&mut c), at);
    // b releases too: the key lives until the last hold ends (250 ms), then is gone.
    let t0 = server_ns(&mut c);
    share(&mut c, &["k", "10", "10", "b", "1", "500", "RELEASE"]);
    let t1 = server_ns(&mut c);
    let exp = pexpiretime(&mut c, "k") as u64;
    assert!(
        (t0 + 250 * MS).div_ceil(MS) <= exp && exp <= (t1 + 250 * MS).div_ceil(MS),
        "expires when b's hold ends: {exp} not in {t0}..{t1} + 250 ms"
    );
    wait_until(10, "the key to expire", || {
        redis::cmd("EXISTS").arg("k").query::<i64>(&mut c).unwrap() == 0
    });
    assert_eq!(info_field(&mut c, "rl", "rl_share_holders"), 0);
}

#[test]
fn the_key_expires_when_its_last_lease_or_hold_ends() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let t0 = server_ns(&mut c);
    share(&mut c, &["k", "10", "10", "long", "1", "20000"]);
    share(&mut c, &["k", "10", "10", "short", "1", "10"]);
    let t1 = server_ns(&mut c);
    let exp = pexpiretime(&mut c, "k") as u64;
    // The 60 s lease, not the 900 ms one (nor its 250 ms hold).
    assert!(
        (t0 + 60_000 * MS).div_ceil(MS) <= exp && exp <= (t1 + 60_000 * MS).div_ceil(MS),
        "{exp}"
    );
    // A key with only short leases goes when the last lease ends: 900 ms (a period under
    // 300 ms is raised to 300).
    let t0 = server_ns(&mut c);
    share(&mut c, &["q", "10", "10", "a", "1", "10"]);
    let t1 = server_ns(&mut c);
    let exp = pexpiretime(&mut c, "q") as u64;
    assert!(
        (t0 + 900 * MS).div_ceil(MS) <= exp && exp <= (t1 + 900 * MS).div_ceil(MS),
        "{exp}"
    );
    // Released, it goes when its hold (250 ms) ends.
    let t0 = server_ns(&mut c);
    share(&mut c, &["q", "10", "10", "a", "1", "10", "RELEASE"]);
    let t1 = server_ns(&mut c);
    let exp = pexpiretime(&mut c, "q") as u64;
    assert!(
        (t0 + 250 * MS).div_ceil(MS) <= exp && exp <= (t1 + 250 * MS).div_ceil(MS),
        "{exp}"
    );
    wait_until(10, "q to expire", || {
        redis::cmd("EXISTS").arg("q").query::<i64>(&mut c).unwrap() == 0
    });
    assert_eq!(info_field(&mut c, "rl", "rl_share_holders_dropped"), 1);
}

#[test]
fn four_thousand_ninety_six_holders_and_a_clear_error_beyond() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let mut pipe = redis::pipe();
    for i in 0..4096 {
        pipe.cmd("RL.SHARE")
            .arg(&["big", "1000", "1000", &format!("holder-{i}"), "1", LONG]);
    }
    let replies: Vec<ShareReply> = pipe.query(&mut c).unwrap();
    assert_eq!(replies.last().unwrap().4, 4096);
    let before = dataset_digest(&mut c);
    let e = share_err(&mut c, &["big", "1000", "1000", "one-more", "1", LONG]);
    assert!(
        e.contains("too many holders on this key (at most 4096)"),
        "{e}"
    );
    assert_eq!(dataset_digest(&mut c), before);
    // A holder already there still refreshes.
    assert_eq!(
        share(&mut c, &["big", "1000", "1000", "holder-7", "1", LONG]).4,
        4096
    );
    assert_eq!(info_field(&mut c, "rl", "rl_share_holders"), 4096);
    let mem: i64 = redis::cmd("MEMORY")
        .arg("USAGE")
        .arg("big")
        .query(&mut c)
        .unwrap();
    assert!(mem > 4096 * 72, "{mem}");
}

#[test]
fn the_newest_version_of_the_limit_governs() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let v2 = ["100", "10", "a", "1", LONG, "VERSION", "2"];
    assert_eq!(share(&mut c, &[&["k"][..], &v2].concat()).0, 100.0);
    // An older caller is decided under version 2's limit.
    let r = share(&mut c, &["k", "5", "1", "b", "1", LONG, "VERSION", "1"]);
    assert_eq!(r.4, 2);
    assert!(r.0 <= 100.0);
    assert_eq!(info_field(&mut c, "rl", "rl_limit_stale"), 1);
    // A newer one replaces it: a is still counted at 100, so c gets nothing (never more
    // than the new rate in all).
    let r = share(&mut c, &["k", "5", "1", "c", "1", LONG, "VERSION", "3"]);
    assert_eq!((r.0, r.1), (0.0, 0.0));
    assert_eq!(info_field(&mut c, "rl", "rl_limit_replaced"), 1);
    // a refreshes under version 3: at most the new rate.
    let r = share(&mut c, &["k", "5", "1", "a", "1", LONG, "VERSION", "3"]);
    assert!(r.0 <= 5.0 && r.1 <= 1.0, "{r:?}");
}

/// Every way a key is copied or rebuilt gives the same bytes.
#[test]
fn shares_persist_copy_and_replicate_exactly() {
    let mut s = Server::start(&["--appendonly", "yes", "--aof-use-rdb-preamble", "no"]);
    let replica = Server::start(&[]);
    replicate(&replica, &s);
    let mut c = s.conn();
    for (who, want) in [("a", "1"), ("b", "0.3"), ("c", "1e15"), ("d", "0")] {
        share(&mut c, &["k", "0.7", "3", who, want, LONG]);
    }
    share(&mut c, &["k", "0.7", "3", "a", "2", LONG]);
    share(&mut c, &["k", "0.7", "3", "b", "1", "1000", "RELEASE"]);
    share(&mut c, &["k", "9", "3", "c", "1", LONG, "VERSION", "4"]);
    share(&mut c, &["k", "1", "1", "d", "5", LONG, "VERSION", "2"]);
    share(&mut c, &["k2", "1e-9", "1e-9", "\u{0}\u{ff}x", "1", LONG]);
    let before = digest(&mut c, "k");
    let all = dataset_digest(&mut c);
    let exp = pexpiretime(&mut c, "k");
    wait_synced(&s, &replica);
    let mut r = replica.conn();
    assert_eq!(digest(&mut r, "k"), before, "replica");
    assert_eq!(dataset_digest(&mut r), all, "replica dataset");
    assert_eq!(pexpiretime(&mut r, "k"), exp, "replica expiry");
    let _: () = redis::cmd("COPY").arg("k").arg("k3").query(&mut c).unwrap();
    assert_eq!(digest(&mut c, "k3"), before, "COPY");
    let payload = dump(&mut c, "k");
    let _: () = redis::cmd("RESTORE")
        .arg("k4")
        .arg(exp)
        .arg(payload)
        .arg("ABSTTL")
        .query(&mut c)
        .unwrap();
    assert_eq!(digest(&mut c, "k4"), before, "RESTORE");
    let all = dataset_digest(&mut c);
    let _: () = redis::cmd("DEBUG").arg("RELOAD").query(&mut c).unwrap();
    assert_eq!(dataset_digest(&mut c), all, "DEBUG RELOAD");
    assert_eq!(pexpiretime(&mut c, "k"), exp);
    // AOF replay of the effects...
    drop(c);
    s.restart();
    let mut c = s.conn();
    assert_eq!(digest(&mut c, "k"), before, "AOF replay");
    assert_eq!(pexpiretime(&mut c, "k"), exp);
    // ... and of a rewritten AOF.
    let all = dataset_digest(&mut c);
    rewrite_aof(&mut c);
    drop(c);
    s.restart();
    let mut c = s.conn();
    assert_eq!(dataset_digest(&mut c), all, "AOF rewrite + restart");
    assert_eq!(pexpiretime(&mut c, "k"), exp);
    assert_eq!(info_field(&mut c, "rl", "rl_share_holders"), 4 * 3 + 1);
    // Every number in the AOF is plain text a reader can follow.
    let dir = s.dir.path().join("appendonlydir");
    let text: String = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| std::fs::read(e.unwrap().path()).unwrap())
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .collect();
    assert!(text.contains("RL.SETSHARES"), "{text}");
}

/// What a forged effect or payload would need to get in: each is refused with nothing
/// changed, and the server lives.
#[test]
fn forged_effects_and_payloads_are_refused() {
    let s = Server::start(&[]);
    let mut c = s.internal_conn();
    share(&mut c, &["k", "10", "10", "a", "1", LONG]);
    assert_eq!(take(&mut c, "bucket", 1.0, 10.0, 1), 1);
    let before = dataset_digest(&mut c);
    let t = "1800000000000000000";
    // The entry's fields: want, rate, burst, lease_end, held_rate, held_burst, held_until.
    let fields = ["1", "1", "1", t, "0", "0", t];
    let entry = |i: usize, v: &str| {
        let mut f: Vec<&str> = fields.to_vec();
        f[i] = v;
        f.join(",")
    };
    let args = |key: &str, rate: &str, cap: &str, version: &str, holder: &str, entry: String| {
        [key, rate, cap, version, "0", holder]
            .iter()
            .map(|s| s.to_string())
            .chain([entry])
            .collect::<Vec<String>>()
    };
    let good = args("k", "10", "10", "0", "b", fields.join(","));
    // The good one is accepted on a copy of the key (so the dataset is not changed here).
    let _: () = redis::cmd("COPY")
        .arg("k")
        .arg("k-copy")
        .query(&mut c)
        .unwrap();
    let mut on_copy = good.clone();
    on_copy[0] = "k-copy".into();
    let _: () = redis::cmd("RL.SETSHARES")
        .arg(&on_copy)
        .query(&mut c)
        .unwrap();
    let _: () = redis::cmd("DEL").arg("k-copy").query(&mut c).unwrap();
    let mut forged: Vec<Vec<String>> = vec![
        args("k", "0", "10", "0", "b", fields.join(",")),
        args("k", "10", "nan", "0", "b", fields.join(",")),
        args("k", "10", "10", "9007199254740992", "b", fields.join(",")),
        args("k", "10", "10", "0", "", fields.join(",")),
        args("k", "10", "10", "0", &"x".repeat(65), fields.join(",")),
        args("k", "10", "10", "0", "b", fields[..6].join(",")),
        args("k", "10", "10", "0", "b", fields.join(",") + ",1"),
        args("k", "10", "10", "0", "b", fields.join(";")),
        args("k", "10", "10", "0", "b", String::new()),
    ];
    for (i, v) in [
        (0, "nan"),
        (0, "-1"),
        (0, "1e16"),
        (1, "inf"),
        (1, "-0"),
        (2, "-1e-300"),
        (3, "9223372036854775808"),
        (3, "-1"),
        (3, "1.5"),
        (4, "nan"),
        (5, "1e300"),
        (6, "x"),
        (6, ""),
    ] {
        forged.push(args("k", "10", "10", "0", "b", entry(i, v)));
    }
    forged.push(good[..6].to_vec());
    let mut more = good.clone();
    more.push("x".into());
    forged.push(more);
    let mut prune = good.clone();
    prune[4] = "-1".into();
    forged.push(prune);
    for args in &forged {
        let r = redis::cmd("RL.SETSHARES").arg(args).query::<Value>(&mut c);
        assert!(r.is_err(), "{args:?} accepted");
    }
    // On another type: WRONGTYPE.
    let mut on_bucket = good.clone();
    on_bucket[0] = "bucket".into();
    let e = redis::cmd("RL.SETSHARES")
        .arg(&on_bucket)
        .query::<Value>(&mut c)
        .unwrap_err();
    assert_eq!(e.code(), Some("WRONGTYPE"));
    assert_eq!(dataset_digest(&mut c), before);

    // Payloads: every truncation and a few flipped bytes are refused (or, if a flip
    // still decodes, load a table the validator accepts); the server stays up.
    let payload = dump(&mut c, "k");
    let body = dump_body(&payload).to_vec();
    for cut in 1..body.len() {
        let p = reseal(&payload, &body[..cut]);
        let r = redis::cmd("RESTORE")
            .arg("x")
            .arg(0)
            .arg(p)
            .arg("REPLACE")
            .query::<Value>(&mut c);
        if r.is_ok() {
            // The footer read as data can make a valid table: then every copy of it is
            // exact.
            accepted_is_valid(&mut c, "x");
        }
    }
    for i in 1..body.len() {
        for flip in [0x01u8, 0x80, 0xff] {
            let mut b = body.clone();
            b[i] ^= flip;
            let p = reseal(&payload, &b);
            let r = redis::cmd("RESTORE")
                .arg("x")
                .arg(0)
                .arg(p)
                .arg("REPLACE")
                .query::<Value>(&mut c);
            if r.is_ok() {
                accepted_is_valid(&mut c, "x");
            }
        }
    }
    let pong: String = redis::cmd("PING").query(&mut c).unwrap();
    assert_eq!(pong, "PONG");
    // A restored forgery is still a table RL.SHARE can work on without harm.
    let _: i64 = redis::cmd("EXISTS").arg("x").query(&mut c).unwrap();
    let _ = redis::cmd("RL.SHARE")
        .arg(&["x", "10", "10", "a", "1", "100"])
        .query::<Value>(&mut c);
}

/// A restored table copies exactly and takes calls.
fn accepted_is_valid(c: &mut Connection, key: &str) {
    let d = digest(c, key);
    let p = dump(c, key);
    let _: () = redis::cmd("RESTORE")
        .arg("copy")
        .arg(0)
        .arg(p)
        .arg("REPLACE")
        .query(c)
        .unwrap();
    assert_eq!(digest(c, "copy"), d);
    let r = redis::cmd("RL.SHARE")
        .arg(&[key, "10", "10", "z", "1", "100"])
        .query::<Value>(c);
    if let Err(e) = r {
        assert!(e.to_string().contains("too many holders"), "{e}");
    }
}

/// Several holders call with random wants and periods, each using its old share until its
/// answer arrives or 250 ms after it sent the call, its new one until its lease ends (less
/// the client margin): the shares in use, summed at every instant, never pass the rate,
/// nor the bursts the cap. Times are the holders' clock, which the server shares (same
/// machine), so the server's instant of a call lies between its sending and its answer.
#[test]
fn a_fleet_never_uses_more_than_the_rate() {
    let s = Server::start(&[]);
    let (rate, cap) = (100.0, 20.0);
    let mut threads = Vec::new();
    for h in 0..6u64 {
        let mut c = s.conn();
        threads.push(std::thread::spawn(move || {
            let mut seed = h.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
            let mut rnd = move |n: u64| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                seed % n
            };
            // (sent, answered, rate, burst, lease_ms)
            let mut calls = Vec::new();
            for i in 0..40 {
                let want = (rnd(60) as f64).to_string();
                let period = (10 + rnd(60)).to_string();
                let release = h == 5 && i % 10 == 9;
                let mut args = vec!["fleet", "100", "20", "", &want, &period];
                let id = format!("h{h}");
                args[3] = &id;
                if release {
                    args.push("RELEASE");
                }
                let sent = now_ns();
                let r = share(&mut c, &args);
                let answered = now_ns();
                calls.push((sent, answered, r.0, r.1, r.2 as u64));
                std::thread::sleep(Duration::from_millis(rnd(r.3 as u64 + 1).min(60)));
            }
            calls
        }));
    }
    let calls: Vec<Vec<ShareCall>> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    let uses = share_uses(&calls);
    assert!(uses.iter().any(|u| u.2 > 0.0));
    for &(t, _, _, _) in &uses {
        let (r, b) = uses
            .iter()
            .filter(|u| u.0 <= t && t < u.1)
            .fold((0.0, 0.0), |(r, b), u| (r + u.2, b + u.3));
        // Summed in f64 here: allow its own rounding, nothing more.
        assert!(r <= rate * (1.0 + 1e-12), "{r} in use at {t}");
        assert!(b <= cap * (1.0 + 1e-12), "{b} bursts at {t}");
    }
}

#[test]
fn counted_documented_and_in_the_write_category() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    share(&mut c, &["orders:share", "10", "10", "a", "1", LONG]);
    share(&mut c, &["orders:share", "10", "10", "b", "1", LONG]);
    let calls = info_field(&mut c, "rl", "rl_calls");
    assert_eq!(calls, 2);
    assert_eq!(info_field(&mut c, "rl", "rl_shares_granted"), 1);
    assert_eq!(info_field(&mut c, "rl", "rl_shares_short"), 1);
    let ns: Value = redis::cmd("RL.STATS").arg("orders").query(&mut c).unwrap();
    let text = format!("{ns:?}");
    assert!(text.contains("calls") && text.contains("int(2)"), "{text}");
    let info: Value = redis::cmd("COMMAND")
        .arg("INFO")
        .arg("RL.SHARE")
        .query(&mut c)
        .unwrap();
    let info = format!("{info:?}");
    assert!(info.contains("write") && info.contains("denyoom"), "{info}");
    assert!(
        info.contains("RW") || info.contains("\"RW\""),
        "key spec: {info}"
    );
    let docs: Value = redis::cmd("COMMAND")
        .arg("DOCS")
        .arg("RL.SHARE")
        .query(&mut c)
        .unwrap();
    let docs = format!("{docs:?}");
    for word in ["holder", "want", "period_ms", "RELEASE", "VERSION"] {
        assert!(docs.contains(word), "{word}: {docs}");
    }
    let keys: Vec<String> = redis::cmd("COMMAND")
        .arg(&["GETKEYS", "RL.SHARE", "k", "1", "1", "h", "1", "100"])
        .query(&mut c)
        .unwrap();
    assert_eq!(keys, vec!["k".to_string()]);
    // The effect is for the replication link: not in @ratelimit, admin and dangerous.
    let set: Value = redis::cmd("COMMAND")
        .arg("INFO")
        .arg("RL.SETSHARES")
        .query(&mut c)
        .unwrap();
    let set = format!("{set:?}");
    if info.contains("@write") {
        assert!(set == "array([nil])" || set.contains("@dangerous"), "{set}");
    }
}

/// Two rollouts fighting over a key (limits flapping at one version, then a newer version
/// with a smaller limit): no call gets more than the limit it was decided under, the
/// shares given never sum above the largest limit in force, and a replica follows exactly.
#[test]
fn flapping_limits_and_a_drop_never_give_more_than_the_limit() {
    let (s, replica) = with_replica();
    let mut c = s.conn();
    let limits = [("100", 100.0), ("10", 10.0)];
    let mut given: Vec<(String, f64)> = Vec::new();
    for round in 0..6 {
        for h in 0..8 {
            let (text, rate) = limits[(round + h) % 2];
            let id = format!("h{h}");
            let r = share(&mut c, &["flap", text, text, &id, "30", LONG]);
            assert!(r.0 <= rate && r.1 <= rate, "{r:?} under {rate}");
            given.retain(|(who, _)| *who != id);
            given.push((id, r.0));
            let sum: f64 = given.iter().map(|(_, r)| r).sum();
            assert!(sum <= 100.0 * (1.0 + 1e-12), "{sum}");
        }
    }
    // A newer version drops the limit: every call from now on gets at most its share of
    // 5, and nothing while the old shares still exceed it.
    for h in 0..8 {
        let id = format!("h{h}");
        let r = share(&mut c, &["flap", "5", "5", &id, "30", LONG, "VERSION", "1"]);
        assert!(r.0 <= 5.0 && r.1 <= 5.0, "{r:?}");
    }
    // An old caller is held to the new limit too (once the holds of the calls that shrank
    // the shares are over: a call within one is answered from its entry).
    std::thread::sleep(Duration::from_millis(300));
    for h in 0..8 {
        let id = format!("h{h}");
        let r = share(&mut c, &["flap", "100", "100", &id, "30", LONG]);
        assert!(r.0 <= 5.0 && r.1 <= 5.0, "stale {r:?}");
    }
    assert!(info_field(&mut c, "rl", "rl_limit_conflicts") > 0);
    assert!(info_field(&mut c, "rl", "rl_limit_stale") >= 8);
    wait_synced(&s, &replica);
    assert_eq!(digest(&mut replica.conn(), "flap"), digest(&mut c, "flap"));
}

/// Replaces the first occurrence of `from` in `body` with `to` (a test's own forgery).
fn replace_once(body: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    let at: Vec<usize> = (0..=body.len() - from.len())
        .filter(|&i| &body[i..i + from.len()] == from)
        .collect();
    assert!(!at.is_empty(), "{from:?} in {body:?}");
    let mut out = body[..at[0]].to_vec();
    out.extend_from_slice(to);
    out.extend_from_slice(&body[at[0] + from.len()..]);
    out
}

/// Payloads crafted field by field (each under a valid CRC): holders out of order or
/// twice, a count above 4,096 or above what follows, and every double of an entry as NaN,
/// an infinity, -0 or a negative number: each is refused, nothing changes, the server
/// lives, and the genuine payload still restores exactly.
#[test]
fn crafted_payloads_with_bad_order_counts_and_numbers_are_refused() {
    let mut s = Server::start(&[]);
    let mut c = s.conn();
    // Distinct wants so each double of the payload can be found by its bytes.
    share(&mut c, &["k", "10", "4", "a", "3", LONG]);
    share(&mut c, &["k", "10", "4", "b", "5", LONG]);
    let before = dataset_digest(&mut c);
    let payload = dump(&mut c, "k");
    let body = dump_body(&payload).to_vec();
    let double = |x: f64| {
        let mut v = vec![4u8];
        v.extend_from_slice(&x.to_le_bytes());
        v
    };
    // Module strings are opcode 5 then an RDB string ("a": length 1).
    let (ida, idb) = ([5u8, 1, b'a'], [5u8, 1, b'b']);
    let mut forged: Vec<(String, Vec<u8>)> = Vec::new();
    // Unsorted: b's entry under a's id and the reverse.
    let swapped = replace_once(&replace_once(&body, &ida, &[5, 1, b'#']), &idb, &ida);
    forged.push((
        "unsorted".into(),
        replace_once(&swapped, &[5, 1, b'#'], &idb),
    ));
    forged.push(("duplicate".into(), replace_once(&body, &idb, &ida)));
    // The count (opcode 2, an RDB length) sits just before the first id.
    let count = |n: &[u8]| {
        let mut from = vec![2u8, 2];
        from.extend_from_slice(&ida);
        let mut to = vec![2u8];
        to.extend_from_slice(n);
        to.extend_from_slice(&ida);
        replace_once(&body, &from, &to)
    };
    forged.push(("count 4097".into(), count(&[0x50, 0x01])));
    forged.push(("count 3".into(), count(&[3])));
    forged.push(("count 0".into(), count(&[0])));
    for bad in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, -0.0, -1.0, 1e16] {
        // The limit's rate and cap are the payload's first doubles; 3 is a's want.
        for (what, good) in [("want", 3.0), ("limit rate", 10.0), ("limit cap", 4.0)] {
            forged.push((
                format!("{what} {bad}"),
                replace_once(&body, &double(good), &double(bad)),
            ));
        }
    }
    for (what, b) in &forged {
        let r = redis::cmd("RESTORE")
            .arg("x")
            .arg(0)
            .arg(reseal(&payload, b))
            .query::<Value>(&mut c);
        assert!(r.is_err(), "{what}: accepted {r:?}");
        assert_eq!(dataset_digest(&mut c), before, "{what}");
    }
    let exp = pexpiretime(&mut c, "k");
    let _: () = redis::cmd("RESTORE")
        .arg("x")
        .arg(exp)
        .arg(&payload)
        .arg("ABSTTL")
        .query(&mut c)
        .unwrap();
    assert_eq!(digest(&mut c, "x"), digest(&mut c, "k"));
    assert!(!s.exited());
}

/// MIGRATE and RENAME move a table whole: the same digest, and an expiry never before the
/// last entry's end (MIGRATE carries a relative TTL, so the target's expiry may be later
/// by the transfer's milliseconds, never earlier on one machine's clock).
#[test]
fn migrate_and_rename_move_the_table_and_never_shorten_its_expiry() {
    let s = Server::start(&[]);
    let other = Server::start(&[]);
    let mut c = s.conn();
    share(&mut c, &["k", "10", "4", "a", "3", LONG]);
    share(&mut c, &["k", "10", "4", "b", "5", "1000"]);
    let d = digest(&mut c, "k");
    let exp = pexpiretime(&mut c, "k");
    let _: () = redis::cmd("RENAME")
        .arg("k")
        .arg("r")
        .query(&mut c)
        .unwrap();
    assert_eq!(digest(&mut c, "r"), d, "RENAME");
    assert_eq!(pexpiretime(&mut c, "r"), exp, "RENAME expiry");
    let _: () = redis::cmd("MIGRATE")
        .arg("127.0.0.1")
        .arg(other.port)
        .arg("r")
        .arg(0)
        .arg(5000)
        .query(&mut c)
        .unwrap();
    let mut o = other.conn();
    assert_eq!(digest(&mut o, "r"), d, "MIGRATE");
    let at = pexpiretime(&mut o, "r");
    assert!(at >= exp, "MIGRATE expiry {at} before {exp}");
    assert_eq!(info_field(&mut o, "rl", "rl_share_holders"), 2);
    assert_eq!(info_field(&mut c, "rl", "rl_share_holders"), 0);
    // The target takes calls on the moved table: a's share is still counted.
    let (rate, ..) = share(&mut o, &["r", "10", "4", "c", "1", LONG]);
    assert!(rate <= 10.0 - 3.0 * 10.0 / 8.0 + 1e-9, "{rate}");
}

/// At 4,096 entries: a newcomer's error propagates nothing; a dead entry's place is taken
/// (pruned by the same call, on the master and in the effect the replica applies); a
/// RELEASEd holder's entry counts until its hold ends; an effect adding a 4,097th entry
/// is refused with nothing changed.
#[test]
fn a_full_key_frees_places_only_as_entries_end_and_replicas_agree() {
    let (s, replica) = with_replica();
    let mut c = s.conn();
    let mut pipe = redis::pipe();
    for i in 1..4096 {
        pipe.cmd("RL.SHARE")
            .arg(&["big", "1000", "1000", &format!("holder-{i}"), "1", LONG]);
    }
    let _: Vec<ShareReply> = pipe.query(&mut c).unwrap();
    // holder-0 calls with a 10 ms period (raised to 300): its entry ends 900 ms later.
    share(&mut c, &["big", "1000", "1000", "holder-0", "1", "10"]);
    let t0 = server_ns(&mut c);
    // holder-1 releases: its entry is held for 250 ms, and still takes a place.
    share(
        &mut c,
        &["big", "1000", "1000", "holder-1", "1", LONG, "RELEASE"],
    );
    wait_synced(&s, &replica);
    let at = offset(&mut c);
    let before = dataset_digest(&mut c);
    if server_ns(&mut c) < t0 + 200 * MS {
        let e = share_err(&mut c, &["big", "1000", "1000", "one-more", "1", LONG]);
        assert!(e.contains("too many holders"), "{e}");
        assert_eq!(dataset_digest(&mut c), before);
        assert_eq!(offset(&mut c), at, "a refused call propagates nothing");
    }
    // A forged effect adding a 4,097th entry is refused on the replica's side too.
    let mut ic = s.internal_conn();
    let far = (t0 + 3_600_000_000 * MS).to_string();
    let entry = format!("1,0,0,{far},0,0,{far}");
    let r = redis::cmd("RL.SETSHARES")
        .arg(&["big", "1000", "1000", "0", "0", "forged", &entry])
        .query::<Value>(&mut ic);
    let e = r.unwrap_err().to_string();
    assert!(e.contains("too many holders"), "{e}");
    assert_eq!(dataset_digest(&mut c), before);
    assert_eq!(offset(&mut c), at);
    // Once holder-0's and holder-1's entries end, two newcomers fit (the dead pruned).
    wait_until(30, "the short entries end", || {
        server_ns(&mut c) > t0 + 1000 * MS
    });
    share(&mut c, &["big", "1000", "1000", "one-more", "1", LONG]);
    share(&mut c, &["big", "1000", "1000", "two-more", "1", LONG]);
    let e = share_err(&mut c, &["big", "1000", "1000", "three-more", "1", LONG]);
    assert!(e.contains("too many holders"), "{e}");
    assert_eq!(info_field(&mut c, "rl", "rl_share_holders"), 4096);
    wait_synced(&s, &replica);
    let mut r = replica.conn();
    assert_eq!(digest(&mut r, "big"), digest(&mut c, "big"), "replica");
    assert_eq!(pexpiretime(&mut r, "big"), pexpiretime(&mut c, "big"));
    assert_eq!(info_field(&mut r, "rl", "rl_share_holders"), 4096);
}

/// The longest period at the largest limit and version: the lease (three hours) and the
/// expiry computed without overflow, a short holder sent back within the period, and a
/// period raised to 300 beside it.
#[test]
fn the_longest_period_at_the_largest_limit_does_not_overflow() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let v = ["VERSION", "9007199254740991"];
    let t0 = server_ns(&mut c);
    let a = share(
        &mut c,
        &["k", "1e15", "1e15", "a", "1e15", LONG, v[0], v[1]],
    );
    let t1 = server_ns(&mut c);
    assert_eq!(a, (1e15, 1e15, 10_800_000, 300, 1));
    let exp = pexpiretime(&mut c, "k") as u64;
    assert!(
        (t0 + 10_800_000 * MS).div_ceil(MS) <= exp && exp <= (t1 + 10_800_000 * MS).div_ceil(MS),
        "{exp}"
    );
    // A newcomer at a raised period gets nothing yet: far short, sent back within a
    // quarter of its (raised) period, a's lease ending three hours away.
    let b = share(
        &mut c,
        &["k", "1e15", "1e15", "b", "1e15", "10", v[0], v[1]],
    );
    assert_eq!(b, (0.0, 0.0, 900, 75, 2));
    // a comes down to its fair half (the other half held for a's hold).
    let a = share(
        &mut c,
        &["k", "1e15", "1e15", "a", "1e15", LONG, v[0], v[1]],
    );
    assert_eq!((a.0, a.2, a.3), (5e14, 10_800_000, 3_600_000));
    assert!(pexpiretime(&mut c, "k") as u64 >= exp);
}

/// A holder that calls far more often than told (every 120 ms, against `refresh_ms`):
/// A (wants 900) alone first holds the whole rate; B (100) and C (600) join and call as
/// told. However often A calls, what it gave up comes free: B and C reach their max-min
/// shares (100 and 450 of 1,000) and A its 450. Each of A's calls within the hold of
/// its last decided call is answered from its entry and writes nothing; the calls it
/// makes after that hold are decided, so its larger old share is held 250 ms, no longer.
#[test]
fn an_eager_holder_does_not_starve_the_others() {
    let s = Server::start(&[]);
    let (mut a, mut bc) = (s.conn(), s.conn());
    let call = |c: &mut Connection, id: &str, want: &str| {
        share(c, &["eager", "1000", "1000", id, want, "1000"])
    };
    assert_eq!(call(&mut a, "A", "900").0, 1000.0);
    let mut next = [0u64; 2];
    let mut got = [0.0f64; 2];
    let mut a_rate = 1000.0;
    let mut a_last = 0;
    wait_until(30, "B and C at their max-min shares", || {
        let now = server_ns(&mut bc);
        for (i, (id, want)) in [("B", "100"), ("C", "600")].iter().enumerate() {
            if now >= next[i] {
                let r = call(&mut bc, id, want);
                got[i] = r.0;
                next[i] = server_ns(&mut bc) + r.3 as u64 * MS;
            }
        }
        if now >= a_last + 120 * MS {
            a_rate = call(&mut a, "A", "900").0;
            a_last = now;
        }
        got == [100.0, 450.0] && a_rate == 450.0
    });
}
