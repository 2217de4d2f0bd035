//! Pins (`RL.PIN`, `RL.UNPIN`, `RL.PINNED`): an operator's limit decided inside the same
//! command, on a real server: the replies, the expiry a pin keeps, and the same bytes on a
//! replica, after an AOF rewrite and replay, an RDB reload and DUMP/RESTORE; forged pins
//! refused by the one validator; share and permit keys refused.

mod support;

use support::*;

fn take_state(c: &mut Connection, key: &str, rate: &str, cap: &str, n: u64) -> Vec<Value> {
    redis::cmd("RL.TAKE")
        .arg(&[key, rate, cap])
        .arg(n)
        .arg("WITHSTATE")
        .query(c)
        .unwrap()
}

fn int(v: &Value) -> i64 {
    match v {
        Value::Int(n) => *n,
        other => panic!("{other:?}"),
    }
}

fn text(v: &Value) -> String {
    match v {
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        Value::SimpleString(s) => s.clone(),
        other => panic!("{other:?}"),
    }
}

fn ok(c: &mut Connection, args: &[&str]) {
    let r: String = redis::cmd(args[0]).arg(&args[1..]).query(c).unwrap();
    assert_eq!(r, "OK", "{args:?}");
}

fn pttl(c: &mut Connection, key: &str) -> i64 {
    query(c, &["PTTL", key])
}

#[test]
fn a_rate_pin_decides_whatever_the_caller_sends_and_says_so() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    // Slow limits: nothing refills noticeably during the test.
    assert_eq!(take(&mut c, "k", 0.001, 100.0, 90), 90);
    ok(&mut c, &["RL.PIN", "k", "0.001", "5"]);
    // The 10 tokens left carry over, clamped to the pinned cap.
    let r = take_state(&mut c, "k", "0.001", "100", 5);
    assert_eq!(int(&r[0]), 5);
    assert_eq!(text(&r[4]), "rate");
    let r = take_state(&mut c, "k", "1000", "1000", 1);
    assert_eq!(int(&r[0]), 0, "a caller's larger limit is ignored");
    // RL.PINNED: the pin; RL.PEEK: the pinned limit and the kind.
    let p: Vec<Value> = query(&mut c, &["RL.PINNED", "k"]);
    assert_eq!(text(&p[0]), "kind");
    assert_eq!(text(&p[1]), "rate");
    assert_eq!(int(&p[7]), -1);
    let peek: Vec<Value> = query(&mut c, &["RL.PEEK", "k"]);
    assert_eq!(text(&peek[peek.len() - 1]), "rate");
    // No expiry while pinned, even when full.
    assert_eq!(pttl(&mut c, "k"), -1);
    // Unpinned: the tokens (about 0) carry back; the callers' limit governs again.
    assert_eq!(query::<i64>(&mut c, &["RL.UNPIN", "k"]), 1);
    assert_eq!(query::<i64>(&mut c, &["RL.UNPIN", "k"]), 0);
    assert_eq!(query::<Value>(&mut c, &["RL.PINNED", "k"]), Value::Nil);
    let r = take_state(&mut c, "k", "0.001", "100", 1);
    assert_eq!(int(&r[0]), 0);
    assert_eq!(r.len(), 4, "an unpinned decision's reply is as before");
    assert!(pttl(&mut c, "k") > 0);
}

/// A call needing more at once than a rate pin's cap is denied until the pin ends, as a
/// block would deny it, not refused with an error a client would count as an outage (and
/// let through, failing open): its own limit allowed it.
#[test]
fn a_call_above_a_rate_pins_cap_is_denied_until_the_pin_ends() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    assert_eq!(take(&mut c, "k", 0.001, 100.0, 10), 10);
    ok(&mut c, &["RL.PIN", "k", "0.001", "5"]);
    ok(&mut c, &["RL.PIN", "t", "0.001", "5", "PX", "100000"]);
    let before = digest(&mut c, "k");
    let r = take_state(&mut c, "k", "0.001", "100", 6);
    assert_eq!(int(&r[0]), 0);
    assert_eq!(
        int(&r[2]),
        60_000,
        "no end: retry in a minute, as BLOCK says"
    );
    assert_eq!(text(&r[4]), "rate");
    let r = take_state(&mut c, "t", "0.001", "100", 6);
    assert_eq!(int(&r[0]), 0);
    assert!(
        (99_000..=100_000).contains(&int(&r[2])),
        "the pin's time left: {r:?}"
    );
    let r: Vec<Value> = query(
        &mut c,
        &["RL.RESERVE", "k", "0.001", "100", "6", "86400000"],
    );
    assert_eq!((int(&r[0]), int(&r[1])), (0, 60_000));
    let r: Vec<i64> = query(
        &mut c,
        &["RL.LEASE", "k", "0.001", "100", "9", "1000", "MIN", "6"],
    );
    assert_eq!(r[0], 0);
    let r: Vec<Value> = query(
        &mut c,
        &["RL.MTAKE", "6", "k", "0.001", "100", "other", "1", "100"],
    );
    assert_eq!(
        (int(&r[0]), text(&r[1]), int(&r[2])),
        (0, "k".into(), 60_000)
    );
    assert_eq!(digest(&mut c, "k"), before, "a denial changes nothing");
    assert_eq!(query::<i64>(&mut c, &["EXISTS", "other"]), 0);
    // What fits the pinned cap is decided as usual.
    assert_eq!(take(&mut c, "k", 0.001, 100.0, 5), 5);
    // Once the pin is gone the caller's own limit decides again.
    assert_eq!(query::<i64>(&mut c, &["RL.UNPIN", "t"]), 1);
    assert_eq!(
        take(&mut c, "t", 0.001, 100.0, 6),
        6,
        "nothing was taken under the pin"
    );
    assert_eq!(query::<i64>(&mut c, &["RL.UNPIN", "k"]), 1);
    assert_eq!(
        take(&mut c, "k", 0.001, 100.0, 1),
        0,
        "the pin's tokens carried over"
    );
    let counted: String = redis::cmd("INFO").arg("rl").query(&mut c).unwrap();
    assert!(counted.contains("rl_pinned_decisions:"), "{counted}");
}

#[test]
fn block_and_exempt() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    // A key pinned before anyone used it.
    ok(&mut c, &["RL.PIN", "abuser", "BLOCK"]);
    let r = take_state(&mut c, "abuser", "10", "100", 1);
    assert_eq!(int(&r[0]), 0);
    assert_eq!(
        int(&r[2]),
        60_000,
        "a block without an end says: retry in a minute"
    );
    assert_eq!(text(&r[4]), "block");
    let lease: Vec<i64> = query(&mut c, &["RL.LEASE", "abuser", "10", "100", "5", "1000"]);
    assert_eq!(lease[0], 0);
    let reserve: Vec<Value> = query(
        &mut c,
        &["RL.RESERVE", "abuser", "10", "100", "1", "100000"],
    );
    assert_eq!(int(&reserve[0]), 0);
    let m: Vec<Value> = query(
        &mut c,
        &["RL.MTAKE", "1", "abuser", "10", "100", "other", "10", "100"],
    );
    assert_eq!(int(&m[0]), 0);
    assert_eq!(
        query::<i64>(&mut c, &["EXISTS", "other"]),
        0,
        "all or nothing"
    );
    // With an end: the wait is what is left of it.
    ok(&mut c, &["RL.PIN", "abuser", "BLOCK", "PX", "50000"]);
    let r = take_state(&mut c, "abuser", "10", "100", 1);
    assert!((40_000..=50_000).contains(&int(&r[2])), "{r:?}");
    let t = pttl(&mut c, "abuser");
    assert!(
        (40_000..=50_001).contains(&t),
        "the key lives as long as its pin: {t}"
    );
    // Lifting it: the key held nothing, so it is gone.
    assert_eq!(query::<i64>(&mut c, &["RL.UNPIN", "abuser"]), 1);
    assert_eq!(query::<i64>(&mut c, &["EXISTS", "abuser"]), 0);

    // EXEMPT: granted, nothing debited, nothing written.
    assert_eq!(take(&mut c, "vip", 0.001, 10.0, 10), 10);
    ok(&mut c, &["RL.PIN", "vip", "EXEMPT"]);
    let before = digest(&mut c, "vip");
    for _ in 0..20 {
        let r = take_state(&mut c, "vip", "0.001", "10", 3);
        assert_eq!(int(&r[0]), 3);
        assert_eq!(text(&r[4]), "exempt");
    }
    let lease: Vec<i64> = query(&mut c, &["RL.LEASE", "vip", "0.001", "10", "5", "1000"]);
    assert_eq!(
        lease[..2],
        [5, 0],
        "an exempt lease records nothing to return"
    );
    assert_eq!(digest(&mut c, "vip"), before);
    // Refunds credit nothing while exempt (nothing was debited).
    assert_eq!(query::<String>(&mut c, &["RL.REFUND", "vip", "5"]), "0");
    assert_eq!(query::<i64>(&mut c, &["RL.UNPIN", "vip"]), 1);
    assert_eq!(
        take(&mut c, "vip", 0.001, 10.0, 1),
        0,
        "still drained underneath"
    );
}

#[test]
fn a_pin_ends_by_itself_and_carries_its_tokens_over() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    ok(&mut c, &["RL.PIN", "p", "0.001", "3", "PX", "200"]);
    assert_eq!(take(&mut c, "p", 1000.0, 1000.0, 3), 3);
    assert_eq!(take(&mut c, "p", 1000.0, 1000.0, 1), 0);
    std::thread::sleep(std::time::Duration::from_millis(250));
    // After the end: the callers' limit, from the tokens the pin left (about 0), refilling
    // at 1000/s since the pin's end, so a few hundred at most: never a full 1000.
    let r = take_state(&mut c, "p", "1000", "1000", 1000);
    assert_eq!(int(&r[0]), 0, "{r:?}");
    assert_eq!(r.len(), 4, "an ended pin decides nothing");
    assert_eq!(query::<Value>(&mut c, &["RL.PINNED", "p"]), Value::Nil);
}

#[test]
fn pins_replicate_persist_and_restore_exactly() {
    let mut s = Server::start(&["--appendonly", "yes", "--aof-use-rdb-preamble", "no"]);
    let replica = Server::start(&[]);
    replicate(&replica, &s);
    let mut c = s.internal_conn();
    assert_eq!(take(&mut c, "a", 0.001, 100.0, 60), 60);
    ok(&mut c, &["RL.PIN", "a", "0.001", "7", "PX", "100000000"]);
    assert_eq!(take(&mut c, "a", 0.001, 100.0, 2), 2);
    ok(&mut c, &["RL.PIN", "b", "BLOCK"]);
    ok(&mut c, &["RL.PIN", "e", "EXEMPT", "PX", "100000000"]);
    let _: Vec<i64> = query(&mut c, &["RL.LEASE", "l", "0.001", "50", "10", "86400000"]);
    ok(&mut c, &["RL.PIN", "l", "0.002", "20"]);
    let _: Vec<i64> = query(&mut c, &["RL.LEASE", "l", "0.001", "50", "3", "86400000"]);
    let _: Value = query(
        &mut c,
        &["RL.TAKE", "v", "0.001", "10", "1", "VERSION", "3"],
    );
    ok(&mut c, &["RL.PIN", "v", "0.001", "2"]);
    let _: Value = query(
        &mut c,
        &["RL.TAKE", "v", "0.001", "20", "1", "VERSION", "4"],
    );
    let keys = ["a", "b", "e", "l", "v"];
    let digests: Vec<String> = keys.iter().map(|k| digest(&mut c, k)).collect();
    wait_synced(&s, &replica);
    let mut r = replica.internal_conn();
    for (k, d) in keys.iter().zip(&digests) {
        assert_eq!(&digest(&mut r, k), d, "replica, {k}");
    }
    // DUMP/RESTORE under another name.
    for k in keys {
        let payload = dump(&mut c, k);
        let copy = format!("{k}-copy");
        // With the key's expiry (or none: a pin without an end), as MIGRATE moves it.
        let at: i64 = query(&mut c, &["PEXPIRETIME", k]);
        let _: () = redis::cmd("RESTORE")
            .arg(&copy)
            .arg(at.max(0))
            .arg(&payload)
            .arg("ABSTTL")
            .query(&mut c)
            .unwrap();
        assert_eq!(digest(&mut c, &copy), digest(&mut c, k), "restore {k}");
        let _: i64 = query(&mut c, &["DEL", &copy]);
    }
    // RDB reload.
    let _: String = query(&mut c, &["DEBUG", "RELOAD"]);
    for (k, d) in keys.iter().zip(&digests) {
        assert_eq!(&digest(&mut c, k), d, "rdb reload, {k}");
    }
    // AOF: replayed as written, and after a rewrite.
    drop(c);
    s.restart();
    let mut c = s.internal_conn();
    for (k, d) in keys.iter().zip(&digests) {
        assert_eq!(&digest(&mut c, k), d, "aof replay, {k}");
    }
    let mut c = s.rewrite_aof_and_restart(c);
    for (k, d) in keys.iter().zip(&digests) {
        assert_eq!(&digest(&mut c, k), d, "aof rewrite, {k}");
    }
    assert_eq!(pttl(&mut c, "b"), -1);
    // Unpinning replicates too.
    for k in keys {
        let _: i64 = query(&mut c, &["RL.UNPIN", k]);
    }
}

/// A take under a rate pin moves only the instant its bucket is full: its effect says just
/// that (`RL.SETSTATE key full_at KEEP`), and every copy still ends with the master's
/// bytes, whatever else the key holds (leases, a version, a pin set before any bucket), and
/// when a newer version or the pin's end changes more than that.
#[test]
fn a_pinned_take_replicates_only_its_fill_instant() {
    let mut s = Server::start(&["--appendonly", "yes", "--aof-use-rdb-preamble", "no"]);
    let replica = Server::start(&[]);
    replicate(&replica, &s);
    let mut c = s.internal_conn();
    assert_eq!(take(&mut c, "a", 0.001, 100.0, 10), 10);
    let _: Vec<i64> = query(&mut c, &["RL.LEASE", "l", "0.001", "50", "10", "86400000"]);
    let _: Value = query(
        &mut c,
        &["RL.TAKE", "v", "0.001", "100", "1", "VERSION", "3"],
    );
    let keys = ["a", "l", "v", "new", "ends"];
    for k in &keys[..4] {
        ok(&mut c, &["RL.PIN", k, "0.001", "40", "PX", "100000000"]);
    }
    ok(&mut c, &["RL.PIN", "ends", "0.001", "40", "PX", "50"]);
    for k in keys {
        for i in 0..4 {
            let got = take(&mut c, k, 5.0, 5.0, 2);
            match k {
                // Pinned before any bucket: it starts full under the callers' limit (5),
                // never the pin's cap (40), so two takes of 2 and then nothing.
                "new" => assert_eq!(got, if i < 2 { 2 } else { 0 }, "{k} {i}"),
                // Its pin ends after 50 ms: what the last two get depends on when.
                "ends" if i >= 2 => {}
                _ => assert_eq!(got, 2, "{k} {i}"),
            }
        }
    }
    // A newer version during the pin changes the limit kept aside: sent in full.
    let _: Value = query(
        &mut c,
        &["RL.TAKE", "v", "0.001", "12", "1", "VERSION", "4"],
    );
    assert_eq!(take(&mut c, "v", 5.0, 5.0, 1), 1);
    // A pin that has ended goes at the next write: sent in full.
    std::thread::sleep(std::time::Duration::from_millis(100));
    assert_eq!(take(&mut c, "ends", 0.001, 40.0, 1), 1);
    assert_eq!(query::<Value>(&mut c, &["RL.PINNED", "ends"]), Value::Nil);

    let kept: Vec<String> = aof_commands(&s)
        .into_iter()
        .filter(|a| a.len() >= 4 && a[0] == "RL.SETSTATE" && a[3] == "KEEP")
        .map(|a| a[1].clone())
        .collect();
    for k in keys {
        let n = kept.iter().filter(|x| *x == k).count();
        // Pinned before any bucket: the first take writes the bucket whole, the second
        // only its fill instant, and the denials after them nothing.
        let want = if matches!(k, "new" | "ends") { 1 } else { 3 };
        assert!(n >= want, "{k}: {n} KEEP effects in {kept:?}");
    }
    let digests: Vec<String> = keys.iter().map(|k| digest(&mut c, k)).collect();
    wait_synced(&s, &replica);
    let mut r = replica.internal_conn();
    for (k, d) in keys.iter().zip(&digests) {
        assert_eq!(&digest(&mut r, k), d, "replica, {k}");
    }
    drop(c);
    s.restart();
    let mut c = s.internal_conn();
    for (k, d) in keys.iter().zip(&digests) {
        assert_eq!(&digest(&mut c, k), d, "aof replay, {k}");
    }

    // The short form is checked as a state given in full is, and changes nothing when
    // refused.
    let refused = |c: &mut Connection, args: &[&str], want: &str| {
        let before = digest(c, args[1]);
        let mut cmd = redis::cmd(args[0]);
        cmd.arg(&args[1..]);
        let e = cmd.query::<Value>(c).unwrap_err().to_string();
        assert!(e.contains(want), "{args:?}: {e}");
        assert_eq!(digest(c, args[1]), before, "{args:?}");
    };
    refused(
        &mut c,
        &["RL.SETSTATE", "nokey", "5", "KEEP"],
        "holds a bucket",
    );
    assert_eq!(query::<i64>(&mut c, &["EXISTS", "nokey"]), 0);
    let _: () = query(&mut c, &["SET", "str", "x"]);
    refused(&mut c, &["RL.SETSTATE", "str", "5", "KEEP"], "WRONGTYPE");
    refused(
        &mut c,
        &["RL.SETSTATE", "a", "18446744073709551615", "KEEP"],
        "non-negative",
    );
    refused(
        &mut c,
        &["RL.SETSTATE", "a", "9223372036854775808", "KEEP"],
        "full_at",
    );
    ok(&mut c, &["RL.PIN", "blocked", "BLOCK"]);
    refused(&mut c, &["RL.SETSTATE", "blocked", "5", "KEEP"], "pin");
    refused(&mut c, &["RL.SETSTATE", "a", "5", "KEEP", "x"], "");
    refused(
        &mut c,
        &["RL.SETSTATE", "a", "5", "KEEP", "HOLD", "-1"],
        "HOLD",
    );
    refused(
        &mut c,
        &["RL.SETSTATE", "a", "5", "KEEP", "HOLD", "1", "x"],
        "",
    );
}

#[test]
fn unpinning_replicates() {
    let s = Server::start(&[]);
    let replica = Server::start(&[]);
    replicate(&replica, &s);
    let mut c = s.internal_conn();
    assert_eq!(take(&mut c, "a", 0.001, 100.0, 60), 60);
    ok(&mut c, &["RL.PIN", "a", "0.001", "7"]);
    ok(&mut c, &["RL.PIN", "gone", "BLOCK"]);
    assert_eq!(query::<i64>(&mut c, &["RL.UNPIN", "a"]), 1);
    assert_eq!(query::<i64>(&mut c, &["RL.UNPIN", "gone"]), 1);
    wait_synced(&s, &replica);
    let mut r = replica.internal_conn();
    assert_eq!(digest(&mut r, "a"), digest(&mut c, "a"));
    assert_eq!(query::<i64>(&mut r, &["EXISTS", "gone"]), 0);
    assert_eq!(query::<Value>(&mut r, &["RL.PINNED", "a"]), Value::Nil);
}

#[test]
fn forged_pins_are_refused_by_the_one_validator() {
    let s = Server::start(&[]);
    let mut c = s.internal_conn();
    let refused = |c: &mut Connection, pin: &[&str], want: &str| {
        let mut cmd = redis::cmd("RL.SETSTATE");
        cmd.arg(&["f", "0", "1", "1"]).arg(pin);
        let e = cmd.query::<Value>(c).unwrap_err().to_string();
        assert!(e.contains(want), "{pin:?}: {e}");
        assert_eq!(query::<i64>(c, &["EXISTS", "f"]), 0);
    };
    refused(&mut c, &["PIN", "9", "0", "1", "1", "0"], "pin kind");
    refused(
        &mut c,
        &["PIN", "1", "18446744073709551615", "1", "1", "0"],
        "non-negative",
    );
    refused(&mut c, &["PIN", "1", "0", "nan", "1", "0"], "rate");
    refused(&mut c, &["PIN", "2", "0", "5", "5", "0"], "base limit");
    // A rate pin over an absent bucket: on the pin's own limit only (bucket and base).
    refused(&mut c, &["PIN", "1", "0", "2", "2", "1"], "absent");
    ok(
        &mut c,
        &[
            "RL.SETSTATE",
            "g",
            "0",
            "1",
            "1",
            "PIN",
            "1",
            "0",
            "1",
            "1",
            "1",
        ],
    );
    assert_eq!(query::<i64>(&mut c, &["PTTL", "g"]), -1);
    refused(&mut c, &["PIN", "2", "0", "1", "1", "2"], "absent flag");
    // What the module writes is accepted.
    ok(
        &mut c,
        &[
            "RL.SETSTATE",
            "f",
            "0",
            "1",
            "1",
            "PIN",
            "2",
            "0",
            "1",
            "1",
            "1",
        ],
    );
    assert_eq!(query::<i64>(&mut c, &["PTTL", "f"]), -1);
}

#[test]
fn pins_refuse_mismatched_types_and_bad_input() {
    let mut s = Server::start(&[]);
    let mut c = s.conn();
    let _: Value = query(&mut c, &["RL.SHARE", "sh", "10", "10", "h", "5", "1000"]);
    let _: Value = query(&mut c, &["RL.TAKE", "b", "1", "10"]);
    let _: () = query(&mut c, &["SET", "str", "x"]);
    let e = redis::cmd("RL.PIN")
        .arg(&["sh", "PERMITS", "3"])
        .query::<Value>(&mut c)
        .unwrap_err();
    assert!(e.to_string().contains("holds shares"), "{e}");
    for key in ["b", "str"] {
        let e = redis::cmd("RL.PIN")
            .arg(&[key, "SHARES", "BLOCK"])
            .query::<Value>(&mut c)
            .unwrap_err();
        let want = if key == "str" {
            "WRONGTYPE"
        } else {
            "not a share key"
        };
        assert!(e.to_string().contains(want), "{e}");
    }
    let e = redis::cmd("RL.PIN")
        .arg(&["str", "BLOCK"])
        .query::<Value>(&mut c)
        .unwrap_err();
    assert!(e.to_string().contains("WRONGTYPE"), "{e}");
    for bad in [
        &["k", "BLOCK", "PX"][..],
        &["k", "BLOCK", "PX", "0"],
        &["k", "BLOCK", "EX", "10"],
        &["k", "0", "10"],
        &["k", "10"],
        &["k", "10", "10", "PX", "-1"],
        &["k", "10", "10", "PX", "99999999999999999"],
        &["k", "SHARES"],
        &["k", "SHARES", "10"],
        &["k", "SHARES", "0", "10"],
        &["k", "SHARES", "BLOCK", "PX", "0"],
        &["k", "SHARES", "10", "10", "PX", "1", "x"],
        &["k", "SHARES", "PERMITS", "3"],
    ] {
        let r = redis::cmd("RL.PIN").arg(bad).query::<Value>(&mut c);
        assert!(r.is_err(), "{bad:?}: {r:?}");
        assert_eq!(query::<i64>(&mut c, &["EXISTS", "k"]), 0, "{bad:?}");
    }
    assert!(!s.exited());
}

#[test]
fn pinning_is_an_operators_act() {
    let s = Server::start(&[]);
    let mut app = as_user(
        &s,
        "app",
        "~* +rl.take +rl.lease +rl.return +rl.mtake +rl.peek +rl.reserve +rl.refund +rl.pinned",
    );
    assert!(allowed(&mut app, &["RL.TAKE", "k", "1", "10"]));
    assert!(allowed(&mut app, &["RL.PINNED", "k"]));
    assert!(!allowed(&mut app, &["RL.PIN", "k", "BLOCK"]));
    assert!(!allowed(&mut app, &["RL.UNPIN", "k"]));
    let info: Value = query(&mut s.conn(), &["COMMAND", "INFO", "RL.PIN"]);
    if format!("{info:?}").contains("@write") {
        // Where module commands have categories: @admin, never @ratelimit.
        assert!(format!("{info:?}").contains("@admin"), "{info:?}");
        assert!(!format!("{info:?}").contains("@ratelimit"), "{info:?}");
        let mut most = as_user(&s, "most", "~* +@all -@admin");
        assert!(!allowed(&mut most, &["RL.PIN", "k", "BLOCK"]));
    }
}

#[test]
fn pins_and_pinned_decisions_are_counted() {
    let s = Server::start(&[]);
    let mut c = s.internal_conn();
    let gauge = |c: &mut Connection| info_field(c, "rl", "rl_pinned_keys");
    ok(&mut c, &["RL.PIN", "acme:a", "0.001", "5"]);
    ok(&mut c, &["RL.PIN", "acme:b", "BLOCK"]);
    ok(&mut c, &["RL.PIN", "acme:b", "EXEMPT"]);
    assert_eq!(gauge(&mut c), 2);
    assert_eq!(info_field(&mut c, "rl", "rl_pins_set"), 3);
    for _ in 0..3 {
        let _: i64 = query(&mut c, &["RL.TAKE", "acme:a", "10", "10"]);
        let _: i64 = query(&mut c, &["RL.TAKE", "acme:b", "10", "10"]);
    }
    let _: i64 = query(&mut c, &["RL.TAKE", "acme:c", "10", "10"]);
    assert_eq!(info_field(&mut c, "rl", "rl_pinned_decisions"), 6);
    let stats: Vec<Value> = query(&mut c, &["RL.STATS", "acme"]);
    let i = stats
        .iter()
        .position(|v| matches!(v, Value::BulkString(b) if b == b"pinned"))
        .unwrap();
    assert_eq!(int(&stats[i + 1]), 6);
    // COPY and RESTORE add a pinned key; DEL, UNPIN and a flush take them away.
    let _: i64 = query(&mut c, &["COPY", "acme:a", "acme:copy"]);
    assert_eq!(gauge(&mut c), 3);
    let payload = dump(&mut c, "acme:b");
    restore_replace(&mut c, "acme:restored", &payload).unwrap();
    assert_eq!(gauge(&mut c), 4);
    let _: i64 = query(&mut c, &["DEL", "acme:copy"]);
    assert_eq!(query::<i64>(&mut c, &["RL.UNPIN", "acme:a"]), 1);
    assert_eq!(gauge(&mut c), 2);
    assert_eq!(info_field(&mut c, "rl", "rl_pins_removed"), 1);
    let _: String = query(&mut c, &["DEBUG", "RELOAD"]);
    gauge_settles(&mut c, "rl_pinned_keys", 2);
    // A gauge: CONFIG RESETSTAT leaves it.
    let _: () = query(&mut c, &["CONFIG", "RESETSTAT"]);
    assert_eq!(gauge(&mut c), 2);
    let _: () = query(&mut c, &["FLUSHALL"]);
    gauge_settles(&mut c, "rl_pinned_keys", 0);
}

fn acquire(c: &mut Connection, key: &str, limit: u64) -> Vec<i64> {
    query(c, &["RL.ACQUIRE", key, &limit.to_string(), "600000"])
}

#[test]
fn semaphore_keys_take_permits_block_and_exempt_pins() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    assert_eq!(acquire(&mut c, "s", 5)[0], 1);
    assert_eq!(acquire(&mut c, "s", 5)[0], 1);
    ok(&mut c, &["RL.PIN", "s", "PERMITS", "2"]);
    let denied = acquire(&mut c, "s", 5);
    assert_eq!(
        denied[..3],
        [0, 0, 2],
        "the pinned limit, whatever the caller sends"
    );
    let p: Vec<Value> = query(&mut c, &["RL.PINNED", "s"]);
    assert_eq!(text(&p[1]), "permits");
    assert_eq!(int(&p[3]), 2);
    assert_eq!(pttl(&mut c, "s"), -1);
    // BLOCK on the existing semaphore key; EXEMPT lets through unrecorded (id 0).
    ok(&mut c, &["RL.PIN", "s", "BLOCK", "PX", "60000"]);
    let blocked = acquire(&mut c, "s", 100);
    assert_eq!(blocked[0], 0);
    assert!((50_000..=60_000).contains(&blocked[3]), "{blocked:?}");
    ok(&mut c, &["RL.PIN", "s", "EXEMPT"]);
    let before = digest(&mut c, "s");
    assert_eq!(acquire(&mut c, "s", 1)[..2], [1, 0]);
    assert_eq!(digest(&mut c, "s"), before);
    assert_eq!(query::<i64>(&mut c, &["RL.RELEASE", "s", "0"]), 0);
    assert_eq!(query::<i64>(&mut c, &["RL.UNPIN", "s"]), 1);
    assert!(pttl(&mut c, "s") > 0, "back to its permits' expiry");
    // A semaphore pinned before use holds the pin alone; unpinning it removes the key.
    ok(&mut c, &["RL.PIN", "fresh", "PERMITS", "BLOCK"]);
    assert_eq!(query::<String>(&mut c, &["TYPE", "fresh"]), "rl-permit");
    assert_eq!(acquire(&mut c, "fresh", 3)[0], 0);
    assert_eq!(query::<i64>(&mut c, &["RL.UNPIN", "fresh"]), 1);
    assert_eq!(query::<i64>(&mut c, &["EXISTS", "fresh"]), 0);
    // Released permits under a pin keep the key while the pin holds.
    ok(&mut c, &["RL.PIN", "r", "PERMITS", "1"]);
    let got = acquire(&mut c, "r", 9);
    assert_eq!(got[0], 1);
    assert_eq!(
        query::<i64>(&mut c, &["RL.RELEASE", "r", &got[1].to_string()]),
        1
    );
    assert_eq!(query::<i64>(&mut c, &["EXISTS", "r"]), 1);
    assert_eq!(pttl(&mut c, "r"), -1);
    // The wrong form for each type says which to use.
    let e = redis::cmd("RL.PIN")
        .arg(&["s", "5", "5"])
        .query::<Value>(&mut c)
        .unwrap_err();
    assert!(e.to_string().contains("PERMITS n"), "{e}");
    assert_eq!(take(&mut c, "b", 1.0, 5.0, 1), 1);
    let e = redis::cmd("RL.PIN")
        .arg(&["b", "PERMITS", "3"])
        .query::<Value>(&mut c)
        .unwrap_err();
    assert!(e.to_string().contains("token bucket"), "{e}");
    for bad in [
        &["x", "PERMITS"][..],
        &["x", "PERMITS", "0"],
        &["x", "PERMITS", "10001"],
    ] {
        assert!(
            redis::cmd("RL.PIN")
                .arg(bad)
                .query::<Value>(&mut c)
                .is_err(),
            "{bad:?}"
        );
        assert_eq!(query::<i64>(&mut c, &["EXISTS", "x"]), 0);
    }
}

#[test]
fn semaphore_pins_replicate_persist_and_restore_exactly() {
    let mut s = Server::start(&["--appendonly", "yes", "--aof-use-rdb-preamble", "no"]);
    let replica = Server::start(&[]);
    replicate(&replica, &s);
    let mut c = s.internal_conn();
    acquire(&mut c, "a", 5);
    acquire(&mut c, "a", 5);
    ok(&mut c, &["RL.PIN", "a", "PERMITS", "3", "PX", "100000000"]);
    acquire(&mut c, "a", 5);
    ok(&mut c, &["RL.PIN", "b", "PERMITS", "BLOCK"]);
    acquire(&mut c, "e", 5);
    ok(&mut c, &["RL.PIN", "e", "EXEMPT"]);
    let keys = ["a", "b", "e"];
    let digests: Vec<String> = keys.iter().map(|k| digest(&mut c, k)).collect();
    wait_synced(&s, &replica);
    let mut r = replica.internal_conn();
    for (k, d) in keys.iter().zip(&digests) {
        assert_eq!(&digest(&mut r, k), d, "replica, {k}");
    }
    let _: String = query(&mut c, &["DEBUG", "RELOAD"]);
    for (k, d) in keys.iter().zip(&digests) {
        assert_eq!(&digest(&mut c, k), d, "rdb reload, {k}");
    }
    drop(c);
    s.restart();
    let c = s.internal_conn();
    let mut c = s.rewrite_aof_and_restart(c);
    for (k, d) in keys.iter().zip(&digests) {
        assert_eq!(&digest(&mut c, k), d, "aof rewrite, {k}");
    }
    assert_eq!(info_field(&mut c, "rl", "rl_pinned_keys"), 3);
    for k in keys {
        assert_eq!(query::<i64>(&mut c, &["RL.UNPIN", k]), 1);
    }
    assert_eq!(info_field(&mut c, "rl", "rl_pinned_keys"), 0);
    // Forged: a pin's limit out of range, or on BLOCK, is refused and changes nothing.
    for pin in [
        &["PIN", "1", "0", "0"][..],
        &["PIN", "2", "0", "3"],
        &["PIN", "7", "0", "0"],
    ] {
        let r = redis::cmd("RL.SETPERMITS")
            .arg(&["f", "LASTID", "0"])
            .arg(pin)
            .query::<Value>(&mut c);
        assert!(r.is_err(), "{pin:?}");
        assert_eq!(query::<i64>(&mut c, &["EXISTS", "f"]), 0);
    }
}

/// Issue 45 item 3: a pin on an absent key never hands it the pin's cap. `RL.PIN k 0.001
/// 100`, then 110 takes of 1 under `1 2`: the key starts full under the callers' limit (2
/// tokens), so at most 2 plus what 1/s refills meanwhile are granted.
#[test]
fn a_pin_on_an_absent_key_starts_it_no_fuller_than_unpinned() {
    let s = Server::start(&[]);
    let mut c = s.internal_conn();
    ok(&mut c, &["RL.PIN", "k", "0.001", "100"]);
    let granted: i64 = (0..110).map(|_| take(&mut c, "k", 1.0, 2.0, 1)).sum();
    // The pinned rate is 0.001/s: refill over this loop is far below one token.
    assert_eq!(granted, 2);
}
