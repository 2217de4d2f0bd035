//! `RL.TOP`: the keys denied most, recent first, bounded by `rl.top-keys`.

mod support;
use support::*;

fn top(c: &mut Connection, count: Option<u64>) -> Vec<(String, i64, i64)> {
    let mut cmd = redis::cmd("RL.TOP");
    if let Some(n) = count {
        cmd.arg(n);
    }
    cmd.query(c).unwrap()
}

#[test]
fn most_denied_first() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let deny = |c: &mut Connection, key: &str, times: usize| {
        for _ in 0..times {
            let _: i64 = query(c, &["RL.TAKE", key, "0.000001", "1", "1"]);
        }
    };
    deny(&mut c, "a:hot", 31); // one grant, 30 denials
    deny(&mut c, "b:warm", 11);
    deny(&mut c, "c:cold", 2);
    // Shadow denials are denials the operator wants to see too; MTAKE's refusing key.
    let _: i64 = query(
        &mut c,
        &["RL.TAKE", "c:cold", "0.000001", "1", "1", "SHADOW"],
    );
    let _: Value = query(
        &mut c,
        &[
            "RL.MTAKE", "1", "c:cold", "0.000001", "1", "d:free", "1", "9",
        ],
    );
    let rows = top(&mut c, None);
    assert_eq!(rows.len(), 3, "{rows:?}");
    assert_eq!(rows[0].0, "a:hot");
    assert!((29..=30).contains(&rows[0].1), "{rows:?}");
    assert_eq!(rows[1].0, "b:warm");
    assert!((9..=10).contains(&rows[1].1));
    assert_eq!(rows[2].0, "c:cold");
    assert!((2..=3).contains(&rows[2].1), "{rows:?}");
    assert!(rows.iter().all(|r| (0..5000).contains(&r.2)));
    assert_eq!(top(&mut c, Some(1)).len(), 1);
    // Grants are not denials.
    assert!(!rows.iter().any(|r| r.0 == "d:free"));
    for bad in ["0", "-1", "x"] {
        let e = redis::cmd("RL.TOP")
            .arg(bad)
            .query::<Value>(&mut c)
            .unwrap_err();
        assert!(
            e.to_string().contains("count must be a positive integer"),
            "{e}"
        );
    }
}

#[test]
fn bounded_by_config() {
    let s = Server::start(&["--rl.top-keys", "4"]);
    let mut c = s.conn();
    for i in 0..50 {
        let key = format!("k:{i}");
        let _: i64 = query(&mut c, &["RL.TAKE", &key, "0.000001", "1", "1"]);
        for _ in 0..(if i == 7 { 40 } else { 1 }) {
            let _: i64 = query(&mut c, &["RL.TAKE", &key, "0.000001", "1", "1"]);
        }
    }
    let rows = top(&mut c, Some(100));
    assert_eq!(rows.len(), 4);
    assert_eq!(rows[0].0, "k:7", "the heavy hitter stays: {rows:?}");
    // Resizing starts afresh; 0 turns it off.
    let _: () = query(&mut c, &["CONFIG", "SET", "rl.top-keys", "0"]);
    let _: i64 = query(&mut c, &["RL.TAKE", "k:7", "0.000001", "1", "1"]);
    assert!(top(&mut c, None).is_empty());
}
