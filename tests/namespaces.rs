//! Per-namespace counters: `INFO rl` lines and `RL.STATS`, bounded cardinality, the
//! separator, `CONFIG RESETSTAT`, and which INFO sections show them; counters saturate
//! (never wrap, never shown negative).

mod support;
use std::collections::HashMap;
use support::*;

/// `rl_ns_<name>:calls=..,...` lines of `INFO rl`, parsed.
fn ns_lines(c: &mut Connection) -> HashMap<String, HashMap<String, u64>> {
    let info: String = redis::cmd("INFO").arg("rl").query(c).unwrap();
    info.lines()
        .filter_map(|l| l.strip_prefix("rl_ns_"))
        .map(|l| {
            let (name, fields) = l.trim().split_once(':').unwrap();
            let fields = fields
                .split(',')
                .map(|kv| {
                    let (k, v) = kv.split_once('=').unwrap();
                    (k.to_string(), v.parse().unwrap())
                })
                .collect();
            (name.to_string(), fields)
        })
        .collect()
}

fn stats(c: &mut Connection, ns: &str) -> Option<HashMap<String, u64>> {
    redis::cmd("RL.STATS").arg(ns).query(c).unwrap()
}

#[test]
fn counts_per_namespace_in_info_and_stats() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    // Slow enough that the drained bucket still denies the next call on any machine.
    assert_eq!(take(&mut c, "orders:1", 0.001, 2.0, 2), 2);
    assert_eq!(take(&mut c, "orders:2", 1.0, 2.0, 1), 1);
    assert_eq!(take(&mut c, "orders:1", 0.001, 2.0, 1), 0);
    let _: i64 = query(&mut c, &["RL.TAKE", "users:1", "0.001", "1", "1"]);
    let _: i64 = query(&mut c, &["RL.TAKE", "users:1", "0.001", "1", "1", "SHADOW"]);
    let _: Vec<i64> = query(&mut c, &["RL.LEASE", "leases:9", "1", "100", "30", "1000"]);
    // MTAKE: once per namespace, however many of its keys.
    let _: Value = query(
        &mut c,
        &[
            "RL.MTAKE", "1", "m:a", "1", "5", "m:b", "1", "5", "n:c", "1", "5",
        ],
    );
    // Argument errors are not calls.
    assert!(redis::cmd("RL.TAKE")
        .arg("bad:1")
        .arg("x")
        .arg("1")
        .query::<i64>(&mut c)
        .is_err());

    let lines = ns_lines(&mut c);
    let o = &lines["orders"];
    assert_eq!(
        (
            o["calls"],
            o["granted"],
            o["denied"],
            o["shadow_denied"],
            o["tokens_granted"]
        ),
        (3, 2, 1, 0, 3)
    );
    let u = &lines["users"];
    assert_eq!(
        (u["calls"], u["granted"], u["denied"], u["shadow_denied"]),
        (2, 1, 0, 1)
    );
    assert_eq!(lines["leases"]["tokens_granted"], 30);
    assert_eq!(lines["m"]["calls"], 1);
    assert_eq!(lines["m"]["tokens_granted"], 1);
    assert_eq!(lines["n"]["calls"], 1);
    assert!(!lines.contains_key("bad"));
    assert!(lines.contains_key("other"));

    assert_eq!(stats(&mut c, "orders").unwrap(), lines["orders"]);
    assert_eq!(stats(&mut c, "nosuch"), None);
    let all: HashMap<String, HashMap<String, u64>> = query(&mut c, &["RL.STATS"]);
    assert_eq!(all, lines);
    // Observers are not calls; bad input is a clear error.
    assert_eq!(info_field(&mut c, "rl", "rl_calls"), 8);
    let e = redis::cmd("RL.STATS")
        .arg("a")
        .arg("b")
        .query::<Value>(&mut c);
    assert!(e.unwrap_err().to_string().contains("wrong number"));
}

#[test]
fn bounded_cardinality_and_separator() {
    let s = Server::start(&["--rl.max-namespaces", "2", "--rl.namespace-separator", "."]);
    let mut c = s.conn();
    for k in ["a.1", "b.1", "c.1", "d.1", "a:x.2", "other.1"] {
        assert_eq!(take(&mut c, k, 1.0, 5.0, 1), 1);
    }
    let lines = ns_lines(&mut c);
    let names: Vec<&String> = lines.keys().collect();
    assert_eq!(lines.len(), 3, "{names:?}");
    assert_eq!(lines["a"]["calls"], 1);
    assert_eq!(lines["b"]["calls"], 1);
    // c, d, a:x (over the bound) and a namespace literally named other.
    assert_eq!(lines["other"]["calls"], 4);
    let sep: Vec<String> = query(&mut c, &["CONFIG", "GET", "rl.namespace-separator"]);
    assert_eq!(sep[1], ".");
    for bad in ["", "12345678"] {
        let e = redis::cmd("CONFIG")
            .arg("SET")
            .arg("rl.namespace-separator")
            .arg(bad)
            .query::<()>(&mut c);
        assert!(e.is_err(), "{bad:?}");
    }
    assert!(redis::cmd("CONFIG")
        .arg("SET")
        .arg("rl.max-namespaces")
        .arg("2000")
        .query::<()>(&mut c)
        .is_err());
    // Odd bytes in a namespace never break the INFO format.
    assert_eq!(take(&mut c, "we ird,=:x", 1.0, 5.0, 1), 1);
    let _: () = query(&mut c, &["CONFIG", "SET", "rl.max-namespaces", "10"]);
    assert_eq!(take(&mut c, "we ird,=:x.1", 1.0, 5.0, 1), 1);
    let lines = ns_lines(&mut c);
    assert!(lines.contains_key("we_ird___x"), "{:?}", lines.keys());
}

#[test]
fn resetstat_resets_counters_like_redis_own() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    assert_eq!(take(&mut c, "orders:1", 0.001, 1.0, 1), 1);
    assert_eq!(take(&mut c, "orders:1", 0.001, 1.0, 1), 0);
    // A CONFIG RESETSTAT refused by ACL resets nothing.
    let _: () = query(
        &mut c,
        &[
            "ACL", "SETUSER", "lim", "on", ">pw", "~*", "+@all", "-config",
        ],
    );
    let mut limited = s.conn();
    let _: () = query(&mut limited, &["AUTH", "lim", "pw"]);
    assert!(redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query::<()>(&mut limited)
        .is_err());
    assert_eq!(take(&mut c, "orders:2", 1.0, 1.0, 1), 1);
    assert_eq!(info_field(&mut c, "rl", "rl_calls"), 3);
    assert_eq!(ns_lines(&mut c)["orders"]["calls"], 3);
    // Queued and discarded: nothing.
    let _: () = query(&mut c, &["MULTI"]);
    let _: String = query(&mut c, &["CONFIG", "RESETSTAT"]);
    let _: () = query(&mut c, &["DISCARD"]);
    assert_eq!(info_field(&mut c, "rl", "rl_calls"), 3);

    let _: () = query(&mut c, &["CONFIG", "RESETSTAT"]);
    // Counting right after the reset is kept.
    assert_eq!(take(&mut c, "orders:3", 1.0, 1.0, 1), 1);
    assert_eq!(info_field(&mut c, "rl", "rl_calls"), 1);
    assert_eq!(info_field(&mut c, "rl", "rl_denied"), 0);
    let lines = ns_lines(&mut c);
    assert_eq!(lines["orders"]["calls"], 1);
    assert_eq!(lines["orders"]["denied"], 0);
    let top: Vec<Value> = query(&mut c, &["RL.TOP"]);
    assert!(top.is_empty());

    // Inside MULTI/EXEC too.
    let _: () = query(&mut c, &["MULTI"]);
    let _: String = query(&mut c, &["CONFIG", "RESETSTAT"]);
    let _: Value = query(&mut c, &["EXEC"]);
    assert_eq!(info_field(&mut c, "rl", "rl_calls"), 0);
}

#[test]
fn sections_that_show_the_counters() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    assert_eq!(take(&mut c, "orders:1", 1.0, 1.0, 1), 1);
    let section = |c: &mut Connection, arg: Option<&str>| -> String {
        let mut cmd = redis::cmd("INFO");
        if let Some(a) = arg {
            cmd.arg(a);
        }
        cmd.query(c).unwrap()
    };
    for arg in [None, Some("all"), Some("default")] {
        let info = section(&mut c, arg);
        assert!(
            !info.contains("rl_calls"),
            "INFO {arg:?} shows module fields"
        );
    }
    for arg in ["rl", "everything", "modules"] {
        let info = section(&mut c, Some(arg));
        assert!(info.contains("rl_calls:1"), "INFO {arg}");
        assert!(
            info.contains(
                "rl_ns_orders:calls=1,granted=1,denied=0,shadow_denied=0,tokens_granted=1"
            ),
            "INFO {arg}: {info}"
        );
    }
}

fn cmd(c: &mut Connection, args: &[&str]) -> redis::RedisResult<Value> {
    let mut k = redis::cmd(args[0]);
    for a in &args[1..] {
        k.arg(*a);
    }
    k.query(c)
}

fn stats_field(c: &mut Connection, ns: &str, field: &str) -> i64 {
    let v: Value = query(c, &["RL.STATS", ns]);
    let Value::Array(items) = v else {
        panic!("RL.STATS {ns}: {v:?}")
    };
    let at = items
        .iter()
        .position(|x| redis::from_redis_value::<String>(x).is_ok_and(|s| s == field))
        .unwrap_or_else(|| panic!("no {field} in {items:?}"));
    redis::from_redis_value(&items[at + 1]).unwrap()
}

/// Runs `count` grants of 1e15 tokens, each on a fresh key of namespace `ns` (a full
/// bucket at cap 1e15 grants them), pipelined.
fn grant_1e15_tokens(c: &mut Connection, ns: &str, from: usize, count: usize) {
    for chunk in (from..from + count).collect::<Vec<_>>().chunks(2000) {
        let mut p = redis::pipe();
        for i in chunk {
            p.cmd("RL.TAKE")
                .arg(format!("{ns}:{i}"))
                .arg("1e15")
                .arg("1e15")
                .arg("1000000000000000");
        }
        let replies: Vec<i64> = p.query(c).unwrap();
        assert!(replies.iter().all(|&r| r == 1_000_000_000_000_000));
    }
}

/// A command fails with no change at all, or succeeds: the per-namespace `tokens_granted`
/// counter saturates instead of overflowing. After 18,446 grants of 1e15 tokens in one
/// namespace (legal: cap 1e15, n 1e15, one fresh key each) the next grant still succeeds
/// (an overflow would panic after the bucket was written, or wrap), RL.STATS shows
/// i64::MAX and INFO the unsigned maximum.
#[test]
fn namespace_token_counters_saturate_and_a_grant_past_them_succeeds() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    grant_1e15_tokens(&mut c, "big", 0, 18_446);
    let reply = cmd(
        &mut c,
        &["RL.TAKE", "big:x", "1e15", "1e15", "1000000000000000"],
    );
    let exists: i64 = query(&mut c, &["EXISTS", "big:x"]);
    assert!(
        reply.is_ok(),
        "the 18,447th grant of 1e15 tokens answered {reply:?}, yet EXISTS big:x = {exists}: \
         an error reply that says nothing changed, after the bucket was written"
    );
    // And the counter did not wrap: it saturates (RL.STATS, a signed reply, shows
    // i64::MAX; INFO the unsigned value).
    let total = stats_field(&mut c, "big", "tokens_granted");
    assert_eq!(total, i64::MAX, "wrapped: {total}");
    let info: String = query(&mut c, &["INFO", "rl"]);
    assert!(
        info.contains("tokens_granted=18446744073709551615"),
        "{info}"
    );
}

/// RL.STATS replies counters as signed integers: a counter past i64::MAX (`tokens_granted`
/// after 9,224 grants of 1e15 tokens in one namespace) is shown clamped, never negative
/// (INFO rl, with unsigned fields, shows the exact value).
#[test]
fn stats_counters_past_i64_max_are_never_replied_negative() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    grant_1e15_tokens(&mut c, "neg", 0, 9_224);
    let shown = stats_field(&mut c, "neg", "tokens_granted");
    assert!(
        shown >= 0,
        "RL.STATS neg shows tokens_granted {shown} after 9,224 grants of 1e15 tokens"
    );
}
