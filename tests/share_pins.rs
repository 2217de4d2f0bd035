//! Pins on share keys (`RL.PIN`, `RL.UNPIN`, `RL.PINNED` on an `RL.SHARE` key) on a real
//! server: replies under each kind (RESP2 and RESP3, unpinned replies unchanged), a key
//! pinned before any holder, expiry, counters, a storm of calls and pins against a replica,
//! the AOF (replayed and rewritten), RDB reload and DUMP/RESTORE, a version-1 payload,
//! forged effects and payloads, and a fleet of holders under pin changes.

mod support;

use std::time::Duration;
use support::*;

const MS: u64 = 1_000_000;
/// A period long enough that no lease ends during a test unless the test wants it to.
const LONG: &str = "3600000";

fn ok(c: &mut Connection, args: &[&str]) {
    let r: String = query(c, args);
    assert_eq!(r, "OK", "{args:?}");
}

/// An `RL.SHARE` reply as values (five, or six when a pin decided).
fn share(c: &mut Connection, args: &[&str]) -> Vec<Value> {
    let v: Value = redis::cmd("RL.SHARE").arg(args).query(c).unwrap();
    match v {
        Value::Array(items) => items,
        other => panic!("{other:?}"),
    }
}

fn num(v: &Value) -> f64 {
    match v {
        Value::Double(d) => *d,
        Value::BulkString(b) => std::str::from_utf8(b).unwrap().parse().unwrap(),
        Value::Int(i) => *i as f64,
        other => panic!("{other:?}"),
    }
}

fn kind(items: &[Value]) -> Option<String> {
    match items.get(5) {
        None => None,
        Some(Value::BulkString(b)) => Some(String::from_utf8(b.clone()).unwrap()),
        Some(other) => panic!("{other:?}"),
    }
}

/// The server's clock, ms.
fn server_ms(c: &mut Connection) -> i64 {
    let t: Vec<i64> = query(c, &["TIME"]);
    t[0] * 1000 + t[1] / 1000
}

fn pexpiretime(c: &mut Connection, key: &str) -> i64 {
    query(c, &["PEXPIRETIME", key])
}

#[test]
fn each_kind_of_pin_answers_as_documented_and_unpinned_replies_are_unchanged() {
    let mut s = Server::start(&[]);
    let mut c = s.conn();
    let unpinned = share(&mut c, &["k", "100", "10", "a", "50", LONG]);
    assert_eq!(unpinned.len(), 5);
    ok(&mut c, &["RL.PIN", "k", "10", "1"]);
    let pinned: Value = query(&mut c, &["RL.PINNED", "k"]);
    assert_eq!(
        format!("{pinned:?}"),
        format!(
            "{:?}",
            Value::Array(vec![
                Value::BulkString(b"kind".to_vec()),
                Value::BulkString(b"rate".to_vec()),
                Value::BulkString(b"rate".to_vec()),
                Value::BulkString(b"10".to_vec()),
                Value::BulkString(b"cap".to_vec()),
                Value::BulkString(b"1".to_vec()),
                Value::BulkString(b"ms_left".to_vec()),
                Value::Int(-1),
            ])
        )
    );
    // a's 100 stays counted until its lease ends: b gets nothing of the pinned 10.
    let r = share(&mut c, &["k", "100", "10", "b", "50", LONG]);
    assert_eq!((num(&r[0]), kind(&r).as_deref()), (0.0, Some("rate")));
    assert_eq!(pexpiretime(&mut c, "k"), -1, "a pinned key never expires");

    ok(&mut c, &["RL.PIN", "k", "BLOCK", "PX", "100000"]);
    let r = share(&mut c, &["k", "100", "10", "a", "50", LONG]);
    assert_eq!(kind(&r).as_deref(), Some("block"));
    assert_eq!((num(&r[0]), num(&r[1]), num(&r[2])), (0.0, 0.0, 0.0));
    let refresh = num(&r[3]);
    assert!((99_000.0..=100_000.0).contains(&refresh), "{refresh}");
    let end = pexpiretime(&mut c, "k");
    assert!(
        end > 0,
        "ends with the pin or the last entry, whichever is later"
    );

    ok(&mut c, &["RL.PIN", "k", "EXEMPT", "PX", "2000"]);
    let r = share(&mut c, &["k", "100", "10", "a", "50", LONG]);
    assert_eq!(kind(&r).as_deref(), Some("exempt"));
    assert_eq!((num(&r[0]), num(&r[1])), (100.0, 10.0));
    assert!(num(&r[2]) <= 2000.0 && num(&r[3]) <= 2000.0, "{r:?}");

    // RESP3: doubles, the kind a string.
    let _: Value = query(&mut c, &["HELLO", "3"]);
    let r = share(&mut c, &["k", "100", "10", "a", "50", LONG]);
    assert!(matches!(r[0], Value::Double(x) if x == 100.0), "{r:?}");
    assert!(
        matches!(&r[5], Value::BulkString(b) if b == b"exempt")
            || matches!(&r[5], Value::SimpleString(t) if t == "exempt"),
        "{r:?}"
    );
    let _: Value = query(&mut c, &["HELLO", "2"]);

    assert_eq!(query::<i64>(&mut c, &["RL.UNPIN", "k"]), 1);
    assert_eq!(query::<i64>(&mut c, &["RL.UNPIN", "k"]), 0);
    assert_eq!(query::<Value>(&mut c, &["RL.PINNED", "k"]), Value::Nil);
    let r = share(&mut c, &["k", "100", "10", "a", "50", LONG]);
    assert_eq!(r.len(), 5, "{r:?}");
    assert!(pexpiretime(&mut c, "k") > 0);
    assert!(!s.exited());
}

#[test]
fn a_key_pinned_before_any_holder_and_its_expiry() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    ok(&mut c, &["RL.PIN", "p", "SHARES", "5", "5"]);
    assert_eq!(query::<String>(&mut c, &["TYPE", "p"]), "rl-shares");
    assert_eq!(pexpiretime(&mut c, "p"), -1);
    let r = share(&mut c, &["p", "100", "100", "a", "100", "1000"]);
    assert_eq!(
        (num(&r[0]), num(&r[1]), kind(&r).as_deref()),
        (5.0, 5.0, Some("rate"))
    );
    assert_eq!(pexpiretime(&mut c, "p"), -1);
    // Unpinned: at its last entry's end, as before.
    let before = now_ns() / MS;
    assert_eq!(query::<i64>(&mut c, &["RL.UNPIN", "p"]), 1);
    let end = pexpiretime(&mut c, "p");
    // (Times are rounded up to the millisecond.)
    assert!(
        end as u64 >= before + 2_000 && end as u64 <= now_ns() / MS + 3_001,
        "{end}"
    );
    // The pin alone, removed: no key.
    ok(&mut c, &["RL.PIN", "q", "SHARES", "BLOCK"]);
    assert_eq!(query::<i64>(&mut c, &["RL.UNPIN", "q"]), 1);
    assert_eq!(query::<i64>(&mut c, &["EXISTS", "q"]), 0);
    // With an end: the key stays until it, then goes.
    let before = now_ns() / MS;
    ok(&mut c, &["RL.PIN", "x", "SHARES", "EXEMPT", "PX", "300"]);
    let end = pexpiretime(&mut c, "x");
    assert!(
        end as u64 >= before + 300 && end as u64 <= now_ns() / MS + 301,
        "{end}"
    );
    wait_until(10, "x expired", || {
        query::<i64>(&mut c, &["EXISTS", "x"]) == 0
    });
    // On an existing share key SHARES may be said or not.
    ok(&mut c, &["RL.PIN", "p", "SHARES", "BLOCK"]);
    let r = share(&mut c, &["p", "100", "100", "a", "100", "1000"]);
    assert_eq!(kind(&r).as_deref(), Some("block"));
}

#[test]
fn pins_on_share_keys_are_counted() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    share(&mut c, &["orders:s", "10", "10", "a", "1", LONG]);
    ok(&mut c, &["RL.PIN", "orders:s", "BLOCK"]);
    ok(&mut c, &["RL.PIN", "orders:t", "SHARES", "1", "1"]);
    assert_eq!(info_field(&mut c, "rl", "rl_pins_set"), 2);
    assert_eq!(info_field(&mut c, "rl", "rl_pinned_keys"), 2);
    share(&mut c, &["orders:s", "10", "10", "a", "1", LONG]);
    share(&mut c, &["orders:t", "10", "10", "a", "1", LONG]);
    assert_eq!(info_field(&mut c, "rl", "rl_pinned_decisions"), 2);
    let stats: Value = query(&mut c, &["RL.STATS", "orders"]);
    let text = format!("{stats:?}");
    assert!(text.contains("pinned"), "{text}");
    // What a blocked share key denies is in RL.TOP.
    let top: Value = query(&mut c, &["RL.TOP"]);
    assert!(format!("{top:?}").contains("orders:s"), "{top:?}");
    assert_eq!(query::<i64>(&mut c, &["RL.UNPIN", "orders:s"]), 1);
    assert_eq!(info_field(&mut c, "rl", "rl_pins_removed"), 1);
    assert_eq!(info_field(&mut c, "rl", "rl_pinned_keys"), 1);
    // Copied, reloaded, deleted: the gauge follows.
    let _: () = query(&mut c, &["COPY", "orders:t", "orders:u"]);
    assert_eq!(info_field(&mut c, "rl", "rl_pinned_keys"), 2);
    let _: String = query(&mut c, &["DEBUG", "RELOAD"]);
    gauge_settles(&mut c, "rl_pinned_keys", 2);
    let _: () = query(&mut c, &["DEL", "orders:t", "orders:u"]);
    assert_eq!(info_field(&mut c, "rl", "rl_pinned_keys"), 0);
}

/// Random holders' calls (wants, periods, releases, versions) and pins of every kind set,
/// replaced, lifted and ending by themselves (`PX` of a few ms) on a few share keys, some
/// pinned before any holder: the replica, the AOF (replayed and rewritten), an RDB reload
/// and DUMP/RESTORE of every key hold the same bytes and expiries, and no call hits a
/// caught panic.
#[test]
fn share_pin_storms_leave_replica_aof_rdb_and_restore_identical() {
    let mut s = Server::start(&["--appendonly", "yes", "--aof-use-rdb-preamble", "no"]);
    let replica = Server::start(&[]);
    replicate(&replica, &s);
    let mut c = s.conn();
    no_active_expire(&mut c);
    let keys = ["s0", "s1", "s2", "s3"];
    let limits = [
        ("100", "10"),
        ("0.001", "5"),
        ("1000000000000000", "1000000000000000"),
        ("0.000000001", "0.000000001"),
        ("7", "1000"),
    ];
    let mut rng = Rng::seeded(0x5eed_5a4e_0000_0033);
    for step in 0..2500 {
        let key = rng.pick(&keys).to_string();
        let (rate, cap) = *rng.pick(&limits);
        let (rate, cap) = (rate.to_string(), cap.to_string());
        let holder = format!("h{}", rng.below(5));
        let args: Vec<String> = match rng.below(10) {
            0..=4 => {
                let want = ["0", "1", "50", "1e15", "0.3"][rng.below(5) as usize];
                let period = ["10", "300", "1000", "50"][rng.below(4) as usize];
                let mut a = vec![
                    "RL.SHARE".into(),
                    key,
                    rate,
                    cap,
                    holder,
                    want.into(),
                    period.into(),
                ];
                if rng.chance(10) {
                    a.push("RELEASE".into());
                }
                if rng.chance(20) {
                    a.push("VERSION".into());
                    a.push(rng.below(4).to_string());
                }
                a
            }
            5 | 6 => {
                let mut a = vec!["RL.PIN".into(), key];
                if rng.chance(50) {
                    a.push("SHARES".into());
                }
                match rng.below(3) {
                    0 => a.push("BLOCK".into()),
                    1 => a.push("EXEMPT".into()),
                    _ => {
                        a.push(rate);
                        a.push(cap);
                    }
                }
                if rng.chance(60) {
                    a.push("PX".into());
                    a.push((1 + rng.below(30)).to_string());
                }
                a
            }
            7 => vec!["RL.UNPIN".into(), key],
            8 => vec!["RL.PINNED".into(), key],
            _ => vec![
                "RL.SHARE".into(),
                key,
                rate,
                cap,
                holder,
                "1".into(),
                "300".into(),
            ],
        };
        let _ = storm_send(&mut c, &args);
        if step % 7 == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    let digests: Vec<String> = keys.iter().map(|k| digest(&mut c, k)).collect();
    let expiries: Vec<i64> = keys.iter().map(|k| pexpiretime(&mut c, k)).collect();
    wait_synced(&s, &replica);
    let mut r = replica.conn();
    for ((k, d), e) in keys.iter().zip(&digests).zip(&expiries) {
        assert_eq!(&digest(&mut r, k), d, "replica, {k}");
        assert_eq!(pexpiretime(&mut r, k), *e, "replica expiry, {k}");
    }
    // From here on time passes (restarts): a key whose expiry comes meanwhile may be gone
    // (a load skips it); every key still there holds the same bytes.
    let same = |c: &mut Connection, what: &str| {
        let now: i64 = server_ms(c);
        for ((k, d), e) in keys.iter().zip(&digests).zip(&expiries) {
            let lasts = *e == -1 || *e > now + 60_000;
            let got = digest(c, k);
            if lasts || query::<i64>(c, &["EXISTS", k]) == 1 {
                assert_eq!(&got, d, "{what}, {k}");
            }
        }
    };
    for ((k, d), e) in keys.iter().zip(&digests).zip(&expiries) {
        if *e != -1 && *e < server_ms(&mut c) + 60_000 {
            continue;
        }
        let payload = dump(&mut c, k);
        let _: () = redis::cmd("RESTORE")
            .arg("copy")
            .arg((*e).max(0))
            .arg(&payload)
            .arg("ABSTTL")
            .query(&mut c)
            .unwrap();
        assert_eq!(&digest(&mut c, "copy"), d, "DUMP/RESTORE {k}");
        let _: i64 = query(&mut c, &["DEL", "copy"]);
    }
    let _: String = query(&mut c, &["DEBUG", "RELOAD"]);
    same(&mut c, "rdb reload");
    drop(c);
    s.restart();
    let mut c = s.conn();
    same(&mut c, "aof replay");
    let mut c = s.rewrite_aof_and_restart(c);
    same(&mut c, "aof rewrite");
    assert!(!s.exited());
}

/// Payloads written before pins (encoding 1) still load, as unpinned tables.
#[test]
fn a_version_1_payload_loads() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    share(&mut c, &["k", "10", "4", "a", "3", LONG]);
    share(&mut c, &["k", "10", "4", "b", "5", LONG]);
    let payload = dump(&mut c, "k");
    let body = dump_body(&payload);
    // Type 7 (module), the id as a 64-bit length (0x81 then 8 bytes big-endian; the low
    // 10 bits the encoding), ..., the pin (opcode 2, 0), EOF (0).
    assert_eq!((body[0], body[1]), (7, 0x81));
    let id = u64::from_be_bytes(body[2..10].try_into().unwrap());
    assert_eq!(id & 1023, 2);
    assert_eq!(&body[body.len() - 3..], &[2, 0, 0]);
    let mut v1 = body[..body.len() - 3].to_vec();
    v1.push(0);
    v1[2..10].copy_from_slice(&((id & !1023) | 1).to_be_bytes());
    let exp = pexpiretime(&mut c, "k");
    let _: () = redis::cmd("RESTORE")
        .arg("old")
        .arg(exp)
        .arg(reseal(&payload, &v1))
        .arg("ABSTTL")
        .query(&mut c)
        .unwrap();
    assert_eq!(digest(&mut c, "old"), digest(&mut c, "k"));
    // The same body claiming encoding 2 lacks its pin: refused.
    let mut short = v1.clone();
    short[2..10].copy_from_slice(&id.to_be_bytes());
    assert!(restore_replace(&mut c, "bad", &reseal(&payload, &short)).is_err());
    // A version-3 payload is from a later module: refused.
    let mut later = body.to_vec();
    later[2..10].copy_from_slice(&((id & !1023) | 3).to_be_bytes());
    assert!(restore_replace(&mut c, "bad", &reseal(&payload, &later)).is_err());
    assert_eq!(query::<i64>(&mut c, &["EXISTS", "bad"]), 0);
}

/// Pinned payloads cut at every length and mutated at every byte: each is refused, or
/// loads a table that copies exactly and takes every command without harm.
#[test]
fn forged_restore_payloads_of_pinned_share_keys_never_hurt_the_server() {
    let mut s = Server::start(&[]);
    let mut c = s.conn();
    share(&mut c, &["r", "10", "4", "a", "3", LONG]);
    ok(&mut c, &["RL.PIN", "r", "2", "1", "PX", "100000000"]);
    ok(&mut c, &["RL.PIN", "b", "SHARES", "BLOCK"]);
    share(&mut c, &["e", "10", "4", "a", "3", LONG]);
    ok(&mut c, &["RL.PIN", "e", "EXEMPT"]);
    let commands: [&[&str]; 5] = [
        &["RL.SHARE", "t", "10", "10", "z", "1", "100"],
        &["RL.SHARE", "t", "10", "10", "a", "1", "100", "RELEASE"],
        &["RL.PINNED", "t"],
        &["RL.PIN", "t", "1", "1", "PX", "5"],
        &["RL.UNPIN", "t"],
    ];
    let mut loaded = 0;
    for key in ["r", "b", "e"] {
        let payload = dump(&mut c, key);
        let body = dump_body(&payload).to_vec();
        for b in mutated_payloads(&body) {
            let forged = reseal(&payload, &b);
            if restore_replace(&mut c, "t", &forged).is_err() {
                continue;
            }
            loaded += 1;
            let d = digest(&mut c, "t");
            let again = dump(&mut c, "t");
            let _ = restore_replace(&mut c, "t2", &again).unwrap();
            assert_eq!(digest(&mut c, "t2"), d);
            for cmd in commands {
                let args: Vec<String> = cmd.iter().map(|s| s.to_string()).collect();
                let _ = storm_send(&mut c, &args);
            }
        }
    }
    assert!(loaded > 0);
    assert!(!s.exited(), "the server went down: {}", s.log());
    assert!(!s.log().contains("panicked"), "{}", s.log());
}

/// The effect with a pin: every pin text this module does not write is refused with
/// nothing changed; the ones it writes are accepted.
#[test]
fn forged_pin_effects_are_refused() {
    let s = Server::start(&[]);
    let mut c = s.internal_conn();
    let t = "1800000000000000000";
    let entry = format!("1,1,1,{t},0,0,{t}");
    let before = dataset_digest(&mut c);
    for pin in [
        "",
        "4,0",
        "1,0",
        "1,0,1",
        "2,0,1,1",
        "1,0,0,1",
        "1,0,1,nan",
        "2,-1",
        "2,9223372036854775808",
        "3,0,",
        "0,0",
        "00",
        "2",
        "2,1.5",
    ] {
        let r = redis::cmd("RL.SETSHARES")
            .arg(&["k", "10", "10", "0", "0", pin])
            .query::<Value>(&mut c);
        assert!(r.is_err(), "{pin:?} accepted alone");
        let r = redis::cmd("RL.SETSHARES")
            .arg(&["k", "10", "10", "0", "0", "a", &entry, pin])
            .query::<Value>(&mut c);
        assert!(r.is_err(), "{pin:?} accepted with an entry");
    }
    // No pin on a key that holds nothing: no table.
    let r = redis::cmd("RL.SETSHARES")
        .arg(&["k", "10", "10", "0", "0", "0"])
        .query::<Value>(&mut c);
    assert!(r.is_err());
    // An entry's effect carries a pin or nothing, never `0`.
    let r = redis::cmd("RL.SETSHARES")
        .arg(&["k", "10", "10", "0", "0", "a", &entry, "0"])
        .query::<Value>(&mut c);
    assert!(r.is_err());
    assert_eq!(dataset_digest(&mut c), before);
    for pin in [
        "2,0",
        "3,5",
        "1,0,1e15,1e15",
        "1,9223372036854775807,1e-9,1",
    ] {
        let _: () = redis::cmd("RL.SETSHARES")
            .arg(&["k", "10", "10", "0", "0", pin])
            .query(&mut c)
            .unwrap();
        let _: () = redis::cmd("RL.SETSHARES")
            .arg(&["k", "10", "10", "0", "0", "a", &entry, pin])
            .query(&mut c)
            .unwrap();
    }
    // The old form (no pin) unpins.
    let _: () = redis::cmd("RL.SETSHARES")
        .arg(&["k", "10", "10", "0", "0", "a", &entry])
        .query(&mut c)
        .unwrap();
    assert_eq!(query::<Value>(&mut c, &["RL.PINNED", "k"]), Value::Nil);
}

/// Holders call as a fleet (each using its old share until its answer or 250 ms after it
/// sent the call, its new one until its lease ends less the client margin) while an
/// operator pins the key lower, then blocks it, then unpins it. From one lease after each
/// change (the answer to the operator's call on this machine's clock, which the server
/// shares) the shares in use sum to at most what that change allows, and never above the
/// callers' limit.
#[test]
fn a_fleet_under_pin_changes_reaches_the_pinned_total_within_a_lease() {
    let s = Server::start(&[]);
    let (rate, cap) = (100.0, 20.0);
    let deadline = now_ns() + 3_600 * MS;
    let mut threads = Vec::new();
    for h in 0..5u64 {
        let mut c = s.conn();
        threads.push(std::thread::spawn(move || {
            let mut seed = h.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
            let mut rnd = move |n: u64| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                seed % n
            };
            let mut calls = Vec::new();
            let id = format!("h{h}");
            while now_ns() < deadline {
                let want = (1 + rnd(60)).to_string();
                let sent = now_ns();
                let r = share(&mut c, &["fleet", "100", "20", &id, &want, "300"]);
                let answered = now_ns();
                calls.push((sent, answered, num(&r[0]), num(&r[1]), num(&r[2]) as u64));
                let wait = (num(&r[3]) as u64).min(100);
                std::thread::sleep(Duration::from_millis(rnd(wait + 1)));
            }
            calls
        }));
    }
    let mut c = s.conn();
    // (sent, answered, rate and cap allowed): a change applies between the two, so its
    // window runs from a lease after its answer to the next one's sending.
    let mut changes = Vec::new();
    for (after_ms, args) in [
        (700, &["RL.PIN", "fleet", "10", "2"][..]),
        (1200, &["RL.PIN", "fleet", "BLOCK"][..]),
        (1200, &["RL.UNPIN", "fleet"][..]),
    ] {
        std::thread::sleep(Duration::from_millis(after_ms));
        let sent = now_ns();
        let _: Value = query(&mut c, args);
        let allowed = match args.get(2) {
            Some(&"10") => (10.0, 2.0),
            Some(&"BLOCK") => (0.0, 0.0),
            _ => (rate, cap),
        };
        changes.push((sent, now_ns(), allowed));
    }
    let calls: Vec<Vec<ShareCall>> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    let uses = share_uses(&calls);
    assert!(uses.iter().any(|u| u.2 > 0.0));
    let lease = 900 * MS;
    let mut instants: Vec<u64> = uses.iter().map(|u| u.0).collect();
    instants.extend(changes.iter().map(|c| c.1 + lease));
    let mut checked = 0;
    for &t in &instants {
        let (r, b) = uses
            .iter()
            .filter(|u| u.0 <= t && t < u.1)
            .fold((0.0, 0.0), |(r, b), u| (r + u.2, b + u.3));
        // Summed in f64 here: allow its own rounding, nothing more.
        assert!(
            r <= rate * (1.0 + 1e-12) && b <= cap * (1.0 + 1e-12),
            "{r} at {t}"
        );
        // The last change a lease or more before t, if the next has not come yet.
        for (i, &(_, at, (ar, ac))) in changes.iter().enumerate() {
            let next = changes.get(i + 1).map_or(u64::MAX, |n| n.0);
            if t >= at + lease && t < next {
                checked += 1;
                assert!(
                    r <= ar * (1.0 + 1e-12) && b <= ac * (1.0 + 1e-12),
                    "{r} / {b} in use {} ms after change {i}",
                    (t - at) / MS
                );
            }
        }
    }
    assert!(checked > 0);
}

/// A chain of replicas and a failover carry share pins: the promoted replica decides under
/// the pin (a holder gets no more than the pinned rate minus what is counted), and its own
/// replica stays identical.
#[test]
fn chained_replicas_and_failover_carry_share_pins() {
    let a = Server::start(&[]);
    let b = Server::start(&[]);
    let cc = Server::start(&[]);
    replicate(&b, &a);
    replicate(&cc, &b);
    let mut m = a.conn();
    share(&mut m, &["r", "100", "10", "a", "100", LONG]);
    ok(&mut m, &["RL.PIN", "r", "10", "1", "PX", "100000000"]);
    ok(&mut m, &["RL.PIN", "x", "SHARES", "EXEMPT"]);
    share(&mut m, &["bl", "100", "10", "a", "100", LONG]);
    ok(&mut m, &["RL.PIN", "bl", "BLOCK"]);
    let keys = ["r", "x", "bl"];
    let digests: Vec<String> = keys.iter().map(|k| digest(&mut m, k)).collect();
    wait_synced(&a, &b);
    wait_synced(&b, &cc);
    let mut last = cc.conn();
    for (k, d) in keys.iter().zip(&digests) {
        assert_eq!(&digest(&mut last, k), d, "replica of a replica, {k}");
        assert_eq!(pexpiretime(&mut last, k), pexpiretime(&mut m, k), "{k}");
    }
    drop(m);
    drop(a);
    let _: () = query(&mut b.conn(), &["REPLICAOF", "NO", "ONE"]);
    let mut m = b.conn();
    // a still holds 100 (counted until its lease ends): b's holder gets none of the 10.
    let r = share(&mut m, &["r", "100", "10", "b", "100", LONG]);
    assert_eq!((num(&r[0]), kind(&r).as_deref()), (0.0, Some("rate")));
    let r = share(&mut m, &["x", "100", "10", "b", "100", LONG]);
    assert_eq!(kind(&r).as_deref(), Some("exempt"));
    let r = share(&mut m, &["bl", "100", "10", "a", "100", LONG]);
    assert_eq!((num(&r[0]), kind(&r).as_deref()), (0.0, Some("block")));
    assert_eq!(query::<i64>(&mut m, &["RL.UNPIN", "bl"]), 1);
    wait_synced(&b, &cc);
    for k in keys {
        assert_eq!(
            digest(&mut last, k),
            digest(&mut m, k),
            "after failover, {k}"
        );
        assert_eq!(pexpiretime(&mut last, k), pexpiretime(&mut m, k), "{k}");
    }
}

/// Pins with an end on share keys expire by themselves while holders call, with active
/// expiry on: the master and its replica end with the same keys, values and expiries, and
/// a key that held only the pin is gone from both.
#[test]
fn share_pins_ending_by_themselves_leave_the_replica_identical() {
    let s = Server::start(&[]);
    let replica = Server::start(&[]);
    replicate(&replica, &s);
    let mut c = s.conn();
    ok(&mut c, &["RL.PIN", "alone", "SHARES", "BLOCK", "PX", "50"]);
    share(&mut c, &["k", "100", "10", "a", "10", "300"]);
    ok(&mut c, &["RL.PIN", "k", "5", "5", "PX", "100"]);
    for i in 0..20 {
        let holder = format!("h{}", i % 3);
        let _ = share(&mut c, &["k", "100", "10", &holder, "10", "300"]);
        std::thread::sleep(Duration::from_millis(10));
    }
    wait_until(10, "the pin-only key gone", || {
        query::<i64>(&mut c, &["EXISTS", "alone"]) == 0
    });
    // The rate pin ended: the next write drops it and decides under the callers' limit.
    let r = share(&mut c, &["k", "100", "10", "h9", "10", "300"]);
    assert_eq!(r.len(), 5, "{r:?}");
    assert_eq!(query::<Value>(&mut c, &["RL.PINNED", "k"]), Value::Nil);
    let d = digest(&mut c, "k");
    let e = pexpiretime(&mut c, "k");
    wait_synced(&s, &replica);
    let mut r = replica.conn();
    assert_eq!(digest(&mut r, "k"), d);
    assert_eq!(pexpiretime(&mut r, "k"), e);
    assert_eq!(query::<i64>(&mut r, &["EXISTS", "alone"]), 0);
    assert_eq!(info_field(&mut c, "rl", "rl_pinned_keys"), 0);
}

/// A replica that attaches after the keys were pinned gets them by a full sync (the RDB
/// encoding 2 over the wire): the same values and expiries.
#[test]
fn a_full_sync_carries_share_pins() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    share(&mut c, &["r", "100", "10", "a", "100", LONG]);
    ok(&mut c, &["RL.PIN", "r", "10", "1", "PX", "100000000"]);
    ok(&mut c, &["RL.PIN", "only", "SHARES", "BLOCK"]);
    share(&mut c, &["e", "1e-9", "1e-9", "a", "0", "300"]);
    ok(&mut c, &["RL.PIN", "e", "EXEMPT", "PX", "100000"]);
    let keys = ["r", "only", "e"];
    let before: Vec<(String, i64)> = keys
        .iter()
        .map(|k| (digest(&mut c, k), pexpiretime(&mut c, k)))
        .collect();
    let replica = Server::start(&[]);
    replicate(&replica, &s);
    wait_synced(&s, &replica);
    let mut r = replica.conn();
    for (k, (d, e)) in keys.iter().zip(&before) {
        assert_eq!(&digest(&mut r, k), d, "{k}");
        assert_eq!(pexpiretime(&mut r, k), *e, "{k}");
    }
    assert_eq!(info_field(&mut r, "rl", "rl_pinned_keys"), 3);
}
