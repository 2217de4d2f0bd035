//! RL.TAKE semantics against a real server.

mod support;
use std::time::Duration;
use support::*;

#[test]
fn grants_until_empty_then_denies() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    // One token per 1000 s: no refill between the calls, however slow they are.
    assert_eq!(take(&mut c, "k", 0.001, 3.0, 1), 1);
    assert_eq!(take(&mut c, "k", 0.001, 3.0, 2), 2);
    assert_eq!(take(&mut c, "k", 0.001, 3.0, 1), 0);
}

#[test]
fn fractional_rate_refills_slowly() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    // 0.5 tokens/s: one token every 2 s.
    // What refilled between the two calls is at most 0.5/s times the server time that
    // passed around them.
    let before = server_ms(&mut c);
    assert_eq!(take(&mut c, "k", 0.5, 1.0, 1), 1);
    let (granted, remaining, retry, reset) = take_state(&mut c, "k", 0.5, 1.0, 1);
    let passed = server_ms(&mut c) - before;
    assert_eq!(granted, 0);
    let refilled = 0.5 * (passed + 1) as f64 / 1000.0;
    assert!(
        (0.0..=refilled).contains(&remaining),
        "remaining {remaining} after {passed} ms"
    );
    let least = 2000 - passed - 1;
    assert!(
        (least..=2000).contains(&retry),
        "retry {retry} after {passed} ms"
    );
    assert!(
        (least..=2000).contains(&reset),
        "reset {reset} after {passed} ms"
    );
}

#[test]
fn retry_after_is_enough() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    // 2 tokens/s: the 3 asked for refill in 1.5 s, long after the second call on any
    // machine (a denial is what is checked).
    assert_eq!(take(&mut c, "k", 2.0, 5.0, 5), 5);
    let (granted, _, retry, _) = take_state(&mut c, "k", 2.0, 5.0, 3);
    assert_eq!(granted, 0);
    assert!((1..=1500).contains(&retry), "retry {retry}");
    std::thread::sleep(Duration::from_millis(retry as u64));
    assert_eq!(
        take(&mut c, "k", 2.0, 5.0, 3),
        3,
        "sleeping retry_after_ms must be enough"
    );
}

#[test]
fn withstate_on_grant() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let (granted, remaining, retry, reset) = take_state(&mut c, "k", 100.0, 10.0, 4);
    assert_eq!(granted, 4);
    assert!((remaining - 6.0).abs() < 0.01, "remaining {remaining}");
    assert_eq!(retry, 0);
    assert_eq!(reset, 40);
}

/// An emptied bucket reports 0 left, never a hair below (the time it owes is whole
/// nanoseconds, rounded up); only a bucket in debt is negative.
#[test]
fn an_emptied_bucket_reports_no_negative_remaining() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    for (i, (rate, cap)) in [
        (1e-9, 1.0),
        (0.3333, 2.0),
        (1e-9, 3.0),
        (7.7, 13.0),
        (3.0, 1e6),
    ]
    .into_iter()
    .enumerate()
    {
        let key = format!("e{i}");
        let (granted, remaining, _, _) = take_state(&mut c, &key, rate, cap, cap as u64);
        assert_eq!(granted, cap as i64, "{rate} {cap}");
        assert!(remaining >= 0.0, "{rate} {cap}: remaining {remaining}");
        let peeked = peek_tokens(&mut c, &key).unwrap();
        assert!(peeked >= 0.0, "{rate} {cap}: RL.PEEK tokens {peeked}");
    }
}

#[test]
fn ttl_is_time_to_full() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    // 10 tokens at 2/s: 5 s to refill (rounded up to whole ms, so up to 1 ms above).
    let before = server_ms(&mut c);
    assert_eq!(take(&mut c, "k", 2.0, 100.0, 10), 10);
    let after = server_ms(&mut c);
    assert_expires_in(&mut c, "k", (before, after), 5000..=5001);
    // The expiry is the moment the reply's reset_after_ms points at.
    let before = server_ms(&mut c);
    let (_, _, _, reset) = take_state(&mut c, "k", 2.0, 100.0, 1);
    let after = server_ms(&mut c);
    assert_expires_in(&mut c, "k", (before, after), reset..=reset + 1);
    // A full bucket and no key are the same: the key goes when the bucket is full.
    assert_eq!(take(&mut c, "short", 100.0, 10.0, 1), 1);
    std::thread::sleep(Duration::from_millis(150));
    let exists: i64 = c.exists("short").unwrap();
    assert_eq!(exists, 0);
}

#[test]
fn cap_change_carries_tokens_clamped() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    assert_eq!(take(&mut c, "k", 0.001, 10.0, 2), 2); // 8 left
    let (_, remaining, _, _) = take_state(&mut c, "k", 0.001, 5.0, 1); // clamped to 5, take 1
    assert!((remaining - 4.0).abs() < 0.01, "remaining {remaining}");
    let (_, remaining, _, _) = take_state(&mut c, "k", 0.001, 20.0, 1); // carried over: 4 - 1
    assert!((remaining - 3.0).abs() < 0.01, "remaining {remaining}");
}

#[test]
fn n_above_cap_is_an_error() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let err = redis::cmd("RL.TAKE")
        .arg("k")
        .arg(1)
        .arg(3)
        .arg(4)
        .query::<i64>(&mut c)
        .unwrap_err();
    assert!(err.to_string().contains("n must not exceed cap"), "{err}");
    let exists: i64 = c.exists("k").unwrap();
    assert_eq!(exists, 0);
}

#[test]
fn wrong_type_is_refused_and_untouched() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let _: () = c.set("s", "hello").unwrap();
    let err = redis::cmd("RL.TAKE")
        .arg("s")
        .arg(1)
        .arg(3)
        .query::<i64>(&mut c)
        .unwrap_err();
    assert_eq!(err.code(), Some("WRONGTYPE"), "{err}");
    let v: String = c.get("s").unwrap();
    assert_eq!(v, "hello");
}

#[test]
fn very_high_rate() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    for _ in 0..100 {
        assert_eq!(take(&mut c, "k", 1e9, 1e6, 1000), 1000);
    }
}

#[test]
fn command_metadata_is_right() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let keys: Vec<String> = redis::cmd("COMMAND")
        .arg("GETKEYS")
        .arg("RL.TAKE")
        .arg("bucket")
        .arg(1)
        .arg(2)
        .query(&mut c)
        .unwrap();
    assert_eq!(keys, vec!["bucket"]);
    let info: Value = redis::cmd("COMMAND")
        .arg("INFO")
        .arg("RL.TAKE")
        .query(&mut c)
        .unwrap();
    let text = format!("{info:?}");
    for flag in ["write", "denyoom", "fast"] {
        assert!(text.contains(flag), "flag {flag} missing: {text}");
    }
    // [name, arity, flags, first key, last key, step, ...] for each command. Redis checks
    // that the key is there; the rest of the arity is the module's (its error shows the
    // usage: tests/errors.rs).
    let arities = [
        ("RL.TAKE", -2),
        ("RL.LEASE", -2),
        ("RL.RETURN", -2),
        ("RL.PEEK", -2),
        ("RL.MTAKE", -2),
    ];
    for (name, arity) in arities {
        let info: Vec<Vec<Value>> = redis::cmd("COMMAND")
            .arg("INFO")
            .arg(name)
            .query(&mut c)
            .unwrap();
        assert_eq!(info[0][1], Value::Int(arity), "{name}");
    }
    let info: Vec<Vec<Value>> = redis::cmd("COMMAND")
        .arg("INFO")
        .arg("RL.TAKE")
        .query(&mut c)
        .unwrap();
    assert_eq!(info[0][3..6], [Value::Int(1), Value::Int(1), Value::Int(1)]);
}

#[test]
fn denied_call_dirties_nothing() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    assert_eq!(take(&mut c, "k", 0.001, 1.0, 1), 1);
    let before = info_field(&mut c, "persistence", "rdb_changes_since_last_save");
    let digest_before = digest(&mut c, "k");
    for _ in 0..10 {
        assert_eq!(take(&mut c, "k", 0.001, 1.0, 1), 0);
    }
    assert_eq!(
        info_field(&mut c, "persistence", "rdb_changes_since_last_save"),
        before
    );
    assert_eq!(digest(&mut c, "k"), digest_before);
}

#[test]
fn info_counts_decisions() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    take(&mut c, "k", 0.001, 3.0, 2);
    take(&mut c, "k", 0.001, 3.0, 2);
    let _ = redis::cmd("RL.TAKE")
        .arg("k")
        .arg("x")
        .arg(3)
        .query::<i64>(&mut c);
    assert_eq!(info_field(&mut c, "rl", "rl_calls"), 3);
    assert_eq!(info_field(&mut c, "rl", "rl_granted"), 1);
    assert_eq!(info_field(&mut c, "rl", "rl_denied"), 1);
    assert_eq!(info_field(&mut c, "rl", "rl_tokens_granted"), 2);
    assert_eq!(info_field(&mut c, "rl", "rl_errors"), 1);
}

#[test]
fn watch_sees_grants_but_not_denials() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let mut other = s.conn();
    assert_eq!(take(&mut c, "k", 0.001, 1.0, 1), 1);
    // A denial in between: the transaction still runs.
    let _: () = redis::cmd("WATCH").arg("k").query(&mut c).unwrap();
    assert_eq!(take(&mut other, "k", 0.001, 1.0, 1), 0);
    let ran: Value = redis::pipe().atomic().cmd("PING").query(&mut c).unwrap();
    assert_ne!(ran, Value::Nil, "a denied call touched the WATCHed key");
    // A grant in between: the transaction is aborted.
    assert_eq!(take(&mut c, "fast", 1e6, 10.0, 1), 1);
    let _: () = redis::cmd("WATCH").arg("fast").query(&mut c).unwrap();
    assert_eq!(take(&mut other, "fast", 1e6, 10.0, 1), 1);
    let ran: Option<Value> = redis::pipe().atomic().cmd("PING").query(&mut c).unwrap();
    assert_eq!(ran, None, "a grant must invalidate WATCH");
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

fn int(c: &mut Connection, args: &[&str]) -> i64 {
    query(c, args)
}

/// No token minted by rounding: the deficit of an `INIT tokens` bucket is `nanos_for(cap -
/// tokens)` with the subtraction rounded up (`round::sub_up`), not to nearest: at caps >=
/// 2^49 (one f64 step is 0.125 token) a nearest `cap - 0.95` would be `cap - 1`, and a
/// bucket told to start with 0.95 tokens would grant a token in the very call that created
/// it (same server instant: no refill at all).
///
/// Reproduce (any server):
///   RL.TAKE a 262144 562949953421313 1 INIT 0.95      -> 1   (should be 0)
///   RL.TAKE b 999999999999999 1e15 1 INIT 0.95        -> 1   (should be 0)
///   RL.TAKE c 262144 562949953421313 1 INIT 0.90      -> 0   (rounds the safe way)
/// (2^49 + 1 at 2^18/s: `(cap - 1) * 1e9 / rate` is a whole number of ns, so the ns
/// rounding of the debit does not hide the minted fraction.)
#[test]
fn init_rounding_mints_no_token_at_large_caps() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    for (key, rate, cap) in [
        ("a", "262144", "562949953421313"),
        ("b", "999999999999999", "1e15"),
    ] {
        let got = int(&mut c, &["RL.TAKE", key, rate, cap, "1", "INIT", "0.95"]);
        assert_eq!(
            got, 0,
            "RL.TAKE {key} {rate} {cap} 1 INIT 0.95 granted a token from a bucket created \
             with 0.95 tokens in the same instant (INIT rounded to nearest, not safe-side)"
        );
    }
}
