//! The per-call `SHADOW` option: decided, counted and evolved as under enforce, answered
//! as granted.

mod support;
use support::*;

fn tokens(c: &mut Connection, key: &str) -> f64 {
    let v: Vec<Value> = query(c, &["RL.PEEK", key]);
    let s: String = redis::from_redis_value(&v[1]).unwrap();
    s.parse().unwrap()
}

fn offset(c: &mut Connection) -> u64 {
    info_field(c, "replication", "master_repl_offset")
}

#[test]
fn take_shadow_grants_but_evolves_as_enforce() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    for key in ["e:1", "s:1"] {
        assert_eq!(take(&mut c, key, 0.001, 2.0, 2), 2);
    }
    let enforced: i64 = query(&mut c, &["RL.TAKE", "e:1", "0.001", "2", "1"]);
    let before = (
        offset(&mut c),
        info_field(&mut c, "persistence", "rdb_changes_since_last_save"),
    );
    let shadowed: i64 = query(&mut c, &["RL.TAKE", "s:1", "0.001", "2", "1", "SHADOW"]);
    let after = (
        offset(&mut c),
        info_field(&mut c, "persistence", "rdb_changes_since_last_save"),
    );
    assert_eq!((enforced, shadowed), (0, 1));
    assert_eq!(before, after, "a shadow denial writes nothing");
    assert!((tokens(&mut c, "e:1") - tokens(&mut c, "s:1")).abs() < 0.01);
    assert_eq!(info_field(&mut c, "rl", "rl_shadow_denied"), 1);
    assert_eq!(info_field(&mut c, "rl", "rl_denied"), 1);
    // WITHSTATE: granted as shadow mode answers.
    let v: (i64, f64, i64, i64) = redis::cmd("RL.TAKE")
        .arg("s:1")
        .arg(0.001)
        .arg(2)
        .arg(1)
        .arg("SHADOW")
        .arg("WITHSTATE")
        .query(&mut c)
        .unwrap();
    assert_eq!((v.0, v.2), (1, 0));
    // A grant under SHADOW is an ordinary grant.
    let g: i64 = query(&mut c, &["RL.TAKE", "s:2", "0.001", "2", "1", "SHADOW"]);
    assert_eq!(g, 1);
    assert!(tokens(&mut c, "s:2") < 1.01);
}

#[test]
fn mtake_and_lease_shadow() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    assert_eq!(take(&mut c, "m:a", 0.001, 1.0, 1), 1);
    let v: (i64, Value, i64) = redis::cmd("RL.MTAKE")
        .arg(1)
        .arg("m:a")
        .arg(0.001)
        .arg(1)
        .arg("m:b")
        .arg(1)
        .arg(5)
        .arg("SHADOW")
        .query(&mut c)
        .unwrap();
    assert_eq!(v.0, 1);
    assert_eq!(v.1, Value::Nil);
    // Nothing debited anywhere, as under enforce.
    assert_eq!(query::<Value>(&mut c, &["RL.PEEK", "m:b"]), Value::Nil);
    assert_eq!(info_field(&mut c, "rl", "rl_shadow_denied"), 1);

    assert_eq!(take(&mut c, "l:a", 0.001, 5.0, 5), 5);
    let off = offset(&mut c);
    let v: Vec<i64> = query(
        &mut c,
        &["RL.LEASE", "l:a", "0.001", "5", "3", "1000", "SHADOW"],
    );
    assert_eq!(v, vec![3, 0, 1000, 0], "n tokens under no lease");
    assert_eq!(offset(&mut c), off);
    let v: Vec<i64> = query(
        &mut c,
        &["RL.LEASE", "l:b", "1", "5", "3", "1000", "SHADOW"],
    );
    assert_eq!(v[0], 3);
    assert!(v[1] > 0, "a real lease when granted");
    assert_eq!(info_field(&mut c, "rl", "rl_shadow_denied"), 2);
}

#[test]
fn duplicate_and_misplaced_shadow_are_errors() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let cases: &[&[&str]] = &[
        &["RL.TAKE", "k", "1", "5", "SHADOW", "SHADOW"],
        &[
            "RL.TAKE",
            "k",
            "1",
            "5",
            "1",
            "shadow",
            "WITHSTATE",
            "Shadow",
        ],
        &["RL.MTAKE", "1", "k", "1", "5", "SHADOW", "SHADOW"],
        &["RL.LEASE", "k", "1", "5", "1", "100", "SHADOW", "SHADOW"],
    ];
    for args in cases {
        let mut cmd = redis::cmd(args[0]);
        args[1..].iter().for_each(|a| {
            cmd.arg(*a);
        });
        let e = cmd.query::<Value>(&mut c).unwrap_err().to_string();
        assert!(e.contains("option 'SHADOW' given twice"), "{args:?}: {e}");
    }
    let e = redis::cmd("RL.TAKE")
        .arg("k")
        .arg(1)
        .arg(5)
        .arg("SHADOWS")
        .query::<Value>(&mut c);
    assert!(e
        .unwrap_err()
        .to_string()
        .contains("unknown option 'SHADOWS'"));
    assert_eq!(
        query::<i64>(&mut c, &["DBSIZE"]),
        0,
        "errors change nothing"
    );
}
