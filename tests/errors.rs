//! Error replies that say what to do: a wrong number of arguments shows the command's
//! usage (made from the same table as `COMMAND DOCS`), and redis-cell's argument habit gets
//! the equivalent call.

mod support;
use std::time::Duration;

use support::*;

fn error_of(c: &mut Connection, args: &[&str]) -> String {
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    match cmd.query::<redis::Value>(c) {
        Ok(v) => panic!("{args:?} answered {v:?}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn a_wrong_number_of_arguments_shows_the_usage_and_changes_nothing() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    assert_eq!(take(&mut c, "k", 1.0, 5.0, 1), 1);
    let before = digest(&mut c, "k");
    let calls = info_field(&mut c, "rl", "rl_calls");
    for (args, usage) in [
        (
            &["RL.TAKE", "k"][..],
            "RL.TAKE key rate cap [n] [WITHSTATE] [INIT tokens] [SHADOW] [VERSION v]",
        ),
        (&["RL.TAKE", "k", "1"], "RL.TAKE key rate cap [n]"),
        (
            &["RL.LEASE", "k", "1", "5", "2"],
            "RL.LEASE key rate cap n ttl_ms [MIN m] [RETURN lease_id unused]",
        ),
        (&["RL.RETURN", "k", "1"], "RL.RETURN key lease_id unused"),
        (
            &["RL.RETURN", "k", "1", "2", "3"],
            "RL.RETURN key lease_id unused",
        ),
        (&["RL.PEEK", "k", "x"], "RL.PEEK key"),
        (
            &["RL.MTAKE", "1", "k"],
            "RL.MTAKE n key rate cap [key rate cap ...]",
        ),
        (
            &["RL.RESERVE", "k", "1", "5"],
            "RL.RESERVE key rate cap n max_wait_ms",
        ),
        (&["RL.ACQUIRE", "k", "1"], "RL.ACQUIRE key limit ttl_ms"),
    ] {
        let e = error_of(&mut c, args);
        assert!(e.contains("wrong number of arguments"), "{args:?}: {e}");
        assert!(e.contains(usage), "{args:?}: {e} lacks {usage:?}");
    }
    assert_eq!(digest(&mut c, "k"), before);
    // Refused before the command ran, as when Redis refused it: not a call.
    assert_eq!(info_field(&mut c, "rl", "rl_calls"), calls);
    // A call without its key is still Redis's own refusal (Cluster routes on the key).
    let e = error_of(&mut c, &["RL.TAKE"]);
    assert!(e.contains("wrong number of arguments"), "{e}");
}

#[test]
fn redis_cell_arguments_get_the_equivalent_call() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    // CL.THROTTLE k 15 30 60: a burst of 15 (16 at once), 30 tokens per 60 s.
    let e = error_of(&mut c, &["RL.TAKE", "k", "15", "30", "60"]);
    assert!(e.contains("n must not exceed cap"), "{e}");
    assert!(e.contains("redis-cell"), "{e}");
    assert!(e.contains("RL.TAKE key 0.5 16"), "{e}");
    assert_eq!(exists(&mut c, "k"), 0);
    // The call it suggests works, and allows the burst redis-cell would.
    for _ in 0..16 {
        assert_eq!(take(&mut c, "k", 0.5, 16.0, 1), 1);
    }
    // An ordinary n over cap has no hint.
    let e = error_of(&mut c, &["RL.TAKE", "k", "0.5", "16", "20", "WITHSTATE"]);
    assert!(!e.contains("redis-cell"), "{e}");
}

fn exists(c: &mut Connection, key: &str) -> i64 {
    query(c, &["EXISTS", key])
}

/// The limit a redis-cell hint suggests (`RL.TAKE key <rate> <cap>`), if the error has one.
fn suggested(e: &str) -> Option<(String, String)> {
    const AT: &str = "the same limit here is RL.TAKE key ";
    let rest = &e[e.find(AT)? + AT.len()..];
    let mut words = rest.split([' ', ':']);
    Some((words.next()?.to_owned(), words.next()?.to_owned()))
}

#[test]
fn a_redis_cell_hint_only_suggests_a_call_that_works() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    // redis-cell's max_burst count period, where count / period or max_burst + 1 is a limit
    // RL.TAKE refuses: the hint must not send the caller to another error.
    for (rate, cap, n) in [
        // count / period below the smallest rate (1e-9 tokens per second).
        ("1", "0.001", "9007199254740991"),
        ("1", "0.000000001", "1000"),
        // max_burst + 1 above the largest cap (1e15).
        ("1000000000000000", "1", "2"),
        // A limit that takes more than 100 years to fill.
        ("100000", "1", "1000000"),
        // Ordinary ones, whose hint must work too.
        ("15", "30", "60"),
        ("3", "1", "3"),
        ("999999999999999", "1", "2"),
    ] {
        let e = error_of(&mut c, &["RL.TAKE", "k", rate, cap, n]);
        assert!(e.contains("n must not exceed cap"), "{rate} {cap} {n}: {e}");
        if let Some((r, cp)) = suggested(&e) {
            let got: redis::RedisResult<i64> = redis::cmd("RL.TAKE")
                .arg("hinted")
                .arg(&r)
                .arg(&cp)
                .query(&mut c);
            assert!(
                got.is_ok(),
                "RL.TAKE k {rate} {cap} {n} suggests RL.TAKE key {r} {cp}, which fails: {got:?}"
            );
            let _: i64 = query(&mut c, &["DEL", "hinted"]);
        }
        assert_eq!(exists(&mut c, "k"), 0);
    }
    // The ordinary case still gets its hint.
    let e = error_of(&mut c, &["RL.TAKE", "k", "3", "1", "3"]);
    assert!(e.contains("RL.TAKE key 0.3333333333333333 4"), "{e}");
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
