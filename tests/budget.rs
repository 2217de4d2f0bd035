//! RL.BUDGET / RL.SETTLE against a real server: a cost per key reserved all or nothing,
//! settled once with the actual (the unused part back, an overage charged down to -cap),
//! reservations that are never settled staying charged, errors that change nothing, key
//! positions, and replicas, AOF and RDB after storms of budgets, settles and pins.

mod support;
use support::*;

/// A rate so slow that nothing measurable refills while a test runs.
const SLOW: &str = "0.001";

/// `RL.BUDGET ttl_ms key rate cap n ...` → (granted, reservation id, denied_by, retry ms).
fn budget(c: &mut Connection, ttl_ms: u64, parts: &[(&str, &str, &str, u64)]) -> Vec<Value> {
    let mut cmd = redis::cmd("RL.BUDGET");
    cmd.arg(ttl_ms);
    for (k, r, cap, n) in parts {
        cmd.arg(*k).arg(*r).arg(*cap).arg(*n);
    }
    cmd.query(c).unwrap()
}

fn int(v: &Value) -> i64 {
    redis::from_redis_value(v).unwrap()
}

/// `RL.SETTLE id key actual ...` → per key: Some(signed tokens) or None (no live lease).
fn settle(c: &mut Connection, id: i64, parts: &[(&str, u64)]) -> Vec<Option<i64>> {
    let mut cmd = redis::cmd("RL.SETTLE");
    cmd.arg(id);
    for (k, a) in parts {
        cmd.arg(*k).arg(*a);
    }
    cmd.query(c).unwrap()
}

fn tokens(c: &mut Connection, key: &str) -> f64 {
    peek_tokens(c, key).unwrap_or(f64::NAN)
}

#[test]
fn all_or_nothing_with_a_cost_per_key() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    // Requests and tokens of one provider limit, as an LLM call costs them.
    let r = budget(
        &mut c,
        60_000,
        &[("{o}:rpm", SLOW, "10", 1), ("{o}:tpm", SLOW, "1000", 700)],
    );
    assert_eq!(int(&r[0]), 1);
    let id = int(&r[1]);
    assert!(id > 0);
    assert_eq!(r[2], Value::Nil);
    assert!((tokens(&mut c, "{o}:rpm") - 9.0).abs() < 0.01);
    assert!((tokens(&mut c, "{o}:tpm") - 300.0).abs() < 0.01);
    // 400 more tokens are not there: the request is not reserved either.
    let before = (digest(&mut c, "{o}:rpm"), digest(&mut c, "{o}:tpm"));
    let r = budget(
        &mut c,
        60_000,
        &[("{o}:rpm", SLOW, "10", 1), ("{o}:tpm", SLOW, "1000", 400)],
    );
    assert_eq!((int(&r[0]), int(&r[1])), (0, 0));
    assert_eq!(redis::from_redis_value::<String>(&r[2]).unwrap(), "{o}:tpm");
    assert!(int(&r[3]) > 0);
    assert_eq!(
        before,
        (digest(&mut c, "{o}:rpm"), digest(&mut c, "{o}:tpm")),
        "a denied budget changes no key"
    );
    // The call used 200 tokens: 500 come back, the request stays spent.
    assert_eq!(
        settle(&mut c, id, &[("{o}:rpm", 1), ("{o}:tpm", 200)]),
        vec![Some(0), Some(500)]
    );
    assert!((tokens(&mut c, "{o}:tpm") - 800.0).abs() < 0.01);
    assert!((tokens(&mut c, "{o}:rpm") - 9.0).abs() < 0.01);
    // Once only.
    assert_eq!(
        settle(&mut c, id, &[("{o}:rpm", 0), ("{o}:tpm", 0)]),
        vec![None, None]
    );
    assert!((tokens(&mut c, "{o}:tpm") - 800.0).abs() < 0.01);
    assert_eq!(info_field(&mut c, "rl", "rl_budgets_granted"), 1);
    assert_eq!(info_field(&mut c, "rl", "rl_budgets_denied"), 1);
    assert_eq!(info_field(&mut c, "rl", "rl_tokens_settled_back"), 500);
    assert_eq!(info_field(&mut c, "rl", "rl_settles_unmatched"), 2);
}

/// An overage is charged as debt, never below -cap, whatever the actual; the key then
/// grants again after at most twice its fill time. (A slow rate: nothing the test checks
/// moves with how long the machine takes between calls.)
#[test]
fn an_overage_is_debt_floored_at_minus_cap() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let r = budget(&mut c, 60_000, &[("k", "0.01", "100", 50)]);
    let id = int(&r[1]);
    assert_eq!(settle(&mut c, id, &[("k", 80)]), vec![Some(-30)]);
    assert!((tokens(&mut c, "k") - 20.0).abs() < 0.05);
    let r = budget(&mut c, 60_000, &[("k", "0.01", "100", 20)]);
    let id = int(&r[1]);
    assert_eq!(int(&r[0]), 1);
    let charged = settle(&mut c, id, &[("k", u64::MAX >> 1)])[0].unwrap();
    assert_eq!(charged, -100, "charged down to -cap");
    let t = tokens(&mut c, "k");
    assert!((-100.0..=-99.9).contains(&t), "tokens {t}");
    // The key expires when full again: 2 * cap / rate = 20000 s away, not later.
    let pttl: i64 = query(&mut c, &["PTTL", "k"]);
    assert!((19_990_000..=20_000_001).contains(&pttl), "PTTL {pttl}");
    // A reservation now waits for the debt to be paid: 101 tokens at 0.01/s.
    let r = budget(&mut c, 60_000, &[("k", "0.01", "100", 1)]);
    assert_eq!(int(&r[0]), 0);
    assert!(int(&r[3]) > 10_000_000, "retry {}", int(&r[3]));
    assert_eq!(info_field(&mut c, "rl", "rl_tokens_overage"), 130);
    // Nothing more is charged at the floor.
    let r = budget(&mut c, 60_000, &[("j", "0.01", "100", 100)]);
    let id = int(&r[1]);
    assert_eq!(settle(&mut c, id, &[("j", 1000)]), vec![Some(-100)]);
}

/// An overage settled under a slow rate pin owes at most twice the fill time of the key's
/// own limit once the pin is gone (a debt is time owed: charged as twice the pin's fill
/// time, `1e-9/s`, it was 31 years).
#[test]
fn a_debt_charged_under_a_slow_pin_does_not_outlive_it() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    for (pin_rate, pin_cap) in [("1e-9", "1"), ("0.001", "1"), ("1000", "1000")] {
        let key = format!("x{pin_rate}");
        let r = budget(&mut c, 60_000, &[(&key, "10", "100", 10)]);
        let id = int(&r[1]);
        let _: String = query(&mut c, &["RL.PIN", &key, pin_rate, pin_cap]);
        let charged = settle(&mut c, id, &[(&key, 1000)])[0].unwrap();
        assert!(charged <= 0, "{charged}");
        let _: i64 = query(&mut c, &["RL.UNPIN", &key]);
        // Its own limit fills in 10 s: at most 20 s owed (and the key expires then).
        let pttl: i64 = query(&mut c, &["PTTL", &key]);
        assert!(pttl <= 20_000, "pin {pin_rate}/{pin_cap}: PTTL {pttl}");
        let r = budget(&mut c, 60_000, &[(&key, "10", "100", 1)]);
        assert!(
            int(&r[0]) == 1 || int(&r[3]) <= 20_000,
            "retry {}",
            int(&r[3])
        );
    }
}

/// Two calls in flight: one uses more than it reserved (the key goes into debt), the other
/// less: what the second did not use still comes back, so the key ends where the two
/// actual uses put it.
#[test]
fn an_overage_does_not_swallow_another_calls_unused_estimate() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let a = int(&budget(&mut c, 60_000, &[("k", SLOW, "1000", 600)])[1]);
    let b = int(&budget(&mut c, 60_000, &[("k", SLOW, "1000", 300)])[1]);
    assert_eq!(settle(&mut c, a, &[("k", 1000)]), vec![Some(-400)]);
    assert!((tokens(&mut c, "k") + 300.0).abs() < 0.01, "in debt");
    assert_eq!(settle(&mut c, b, &[("k", 50)]), vec![Some(250)]);
    // Used 1050 of 1000: 50 owed.
    assert!((tokens(&mut c, "k") + 50.0).abs() < 0.01);
}

/// A reservation that is never settled stays charged: when its lease expires nothing comes
/// back, and a late settle changes nothing.
#[test]
fn an_unsettled_reservation_stays_charged() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let r = budget(&mut c, 20, &[("k", SLOW, "10", 6)]);
    let id = int(&r[1]);
    std::thread::sleep(std::time::Duration::from_millis(60));
    assert_eq!(settle(&mut c, id, &[("k", 0)]), vec![None]);
    assert!((tokens(&mut c, "k") - 4.0).abs() < 0.01);
}

/// Every error changes nothing: bad arguments, a key of another type in the middle.
#[test]
fn errors_change_nothing() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let r = budget(
        &mut c,
        60_000,
        &[("a", SLOW, "10", 5), ("b", SLOW, "10", 5)],
    );
    let id = int(&r[1]);
    let _: () = c.set("str", "x").unwrap();
    let before = dataset_digest(&mut c);
    let bad: &[&[&str]] = &[
        &["RL.SETTLE", "x", "a", "1"],
        &["RL.SETTLE", "1", "a"],
        &["RL.SETTLE", "1", "a", "-1"],
        &["RL.SETTLE", "1", "a", "1", "a", "1"],
        &["RL.BUDGET", "0", "a", "1", "10", "1"],
        &["RL.BUDGET", "1000", "a", "1", "10", "11"],
        &[
            "RL.BUDGET",
            "1000",
            "a",
            "1",
            "10",
            "1",
            "a",
            "1",
            "10",
            "1",
        ],
        &["RL.BUDGET", "1000", "a", "1", "10"],
        &["RL.BUDGET", "1000", "a", "1", "10", "1", "INIT", "1"],
        &[
            "RL.BUDGET",
            "1000",
            "a",
            "1",
            "10",
            "1",
            "str",
            "1",
            "10",
            "1",
        ],
        &[
            "RL.BUDGET",
            "1000",
            "a",
            "1",
            "10",
            "1",
            "VERSION",
            "1",
            "VERSION",
            "2",
        ],
    ];
    for args in bad {
        let e = redis::cmd(args[0])
            .arg(&args[1..])
            .query::<Value>(&mut c)
            .expect_err(&format!("{args:?}"));
        assert!(!e.to_string().is_empty());
    }
    let id_text = id.to_string();
    let e = redis::cmd("RL.SETTLE")
        .arg(&[&id_text, "a", "1", "str", "1", "b", "1"])
        .query::<Value>(&mut c)
        .unwrap_err();
    assert!(e.to_string().contains("WRONGTYPE"), "{e}");
    assert_eq!(dataset_digest(&mut c), before, "no error changed anything");
    // The reservation is still there on both keys.
    assert_eq!(
        settle(&mut c, id, &[("a", 5), ("b", 0)]),
        vec![Some(0), Some(5)]
    );
}

/// Redis (and a Cluster's routing) finds the keys among the arguments, options after them
/// included.
#[test]
fn key_positions() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let keys: Vec<String> = query(
        &mut c,
        &[
            "COMMAND",
            "GETKEYS",
            "RL.BUDGET",
            "1000",
            "a",
            "1",
            "2",
            "1",
            "VERSION",
            "1",
            "2",
            "3",
            "WITHSTATE",
            "SHADOW",
        ],
    );
    assert_eq!(keys, ["a", "VERSION"]);
    let keys: Vec<String> = query(
        &mut c,
        &["COMMAND", "GETKEYS", "RL.SETTLE", "5", "a", "1", "b", "2"],
    );
    assert_eq!(keys, ["a", "b"]);
}

/// Storms of budgets over several keys, settles (under, at, over the estimate, absurd,
/// twice, late), pins of every kind and versions: the replica, the AOF and an RDB reload
/// all hold the master's exact keys.
#[test]
fn budget_storms_leave_replica_aof_and_rdb_identical() {
    let mut s = Server::start(&["--appendonly", "yes", "--aof-use-rdb-preamble", "no"]);
    let replica = Server::start(&[]);
    replicate(&replica, &s);
    let mut c = s.conn();
    no_active_expire(&mut c);
    let keys = ["{t}:a", "{t}:b", "{t}:c"];
    // Fast limits: the storm takes half a second, and a key in debt under a slow limit
    // would deny the rest of it (a debt is time owed, kept through limit changes).
    let limits = [
        ("100000", "100"),
        ("100000", "100"),
        ("200", "50"),
        ("1000000", "1000000"),
        ("5000", "5"),
    ];
    let mut rng = Rng::seeded(43);
    let mut open: Vec<(i64, Vec<(String, u64)>)> = Vec::new();
    // Budgets denied (or all exempt) and refused with an error.
    let mut outcomes = [0u64; 3];
    // The storm runs until it has granted and settled enough (not a fixed number of
    // steps): how many are denied depends on how much time the machine lets pass.
    let (mut grants, mut settles) = (0u64, 0u64);
    let mut step = 0u64;
    while step < 2500 || (step < 40_000 && (grants < 200 || settles < 200)) {
        step += 1;
        match rng.below(20) {
            0..=10 => {
                let k = 1 + rng.below(3) as usize;
                let start = rng.below(3) as usize;
                let mut args: Vec<String> =
                    vec!["RL.BUDGET".into(), (1 + rng.below(1000)).to_string()];
                let mut parts = Vec::new();
                for j in 0..k {
                    let key = keys[(start + j) % 3];
                    let (r, cap) = *rng.pick(&limits);
                    let n = 1 + rng.below(cap.parse::<f64>().unwrap().min(8.0) as u64);
                    args.extend([key.into(), r.into(), cap.into(), n.to_string()]);
                    parts.push((key.to_string(), n));
                }
                if rng.chance(20) {
                    args.extend(["VERSION".into(), rng.below(3).to_string()]);
                }
                if rng.chance(10) {
                    args.push("SHADOW".into());
                }
                match redis::cmd(&args[0]).arg(&args[1..]).query(&mut c) {
                    Ok(Value::Array(v)) if int(&v[0]) == 1 && int(&v[1]) > 0 => {
                        open.push((int(&v[1]), parts));
                        grants += 1;
                    }
                    Ok(_) => outcomes[1] += 1,
                    Err(_) => outcomes[2] += 1,
                }
            }
            11..=17 => {
                let Some((id, parts)) = (if rng.chance(85) {
                    open.pop()
                } else {
                    open.first().cloned()
                }) else {
                    continue;
                };
                let mut args = vec!["RL.SETTLE".to_string(), id.to_string()];
                for (k, n) in parts {
                    let actual = match rng.below(10) {
                        0..=1 => 0,
                        2..=4 => n,
                        5..=6 => n / 2,
                        7..=8 => n * 3 + 1,
                        _ => 1 << 40,
                    };
                    args.extend([k, actual.to_string()]);
                }
                let _: Value = redis::cmd(&args[0]).arg(&args[1..]).query(&mut c).unwrap();
                settles += 1;
            }
            18 => {
                let key = *rng.pick(&keys);
                let mut args = vec!["RL.PIN", key];
                let (r, cap) = *rng.pick(&limits);
                match rng.below(3) {
                    0 => args.push("BLOCK"),
                    1 => args.push("EXEMPT"),
                    _ => args.extend([r, cap]),
                }
                // Mostly short pins: a pin without an end would decide the storm.
                if rng.chance(90) {
                    args.extend(["PX", "3"]);
                }
                let _: String = query(&mut c, &args);
            }
            _ => {
                let key = *rng.pick(&keys);
                let _: i64 = query(&mut c, &["RL.UNPIN", key]);
            }
        }
        if step.is_multiple_of(11) {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
    let settled = info_field(&mut c, "rl", "rl_settles");
    let granted = info_field(&mut c, "rl", "rl_budgets_granted");
    let overage = info_field(&mut c, "rl", "rl_tokens_overage");
    // Many are denied: a key settled far over its estimate owes twice its fill time.
    assert!(
        settled > 150 && granted > 150,
        "{settled} settled, {granted} budgets granted, {outcomes:?}"
    );
    assert!(overage > 0);
    // Every key is then either gone (read, so its deletion is in the AOF and on the
    // replica) or held by a pin without an end: nothing expires between the digests and
    // the restarts (a lease lasts at most 1 s, a debt at most 2 s at these limits).
    std::thread::sleep(std::time::Duration::from_millis(2200));
    for k in keys {
        let _: i64 = query(&mut c, &["EXISTS", k]);
    }
    let all = dataset_digest(&mut c);
    let digests: Vec<String> = keys.iter().map(|k| digest(&mut c, k)).collect();
    wait_synced(&s, &replica);
    let mut r = replica.conn();
    for (k, d) in keys.iter().zip(&digests) {
        assert_eq!(&digest(&mut r, k), d, "replica, {k}");
    }
    assert_eq!(dataset_digest(&mut r), all, "replica dataset");
    let _: String = query(&mut c, &["DEBUG", "RELOAD"]);
    assert_eq!(dataset_digest(&mut c), all, "rdb reload");
    drop(c);
    s.restart();
    let mut c = s.conn();
    assert_eq!(dataset_digest(&mut c), all, "aof replay");
    let mut c = s.rewrite_aof_and_restart(c);
    assert_eq!(dataset_digest(&mut c), all, "aof rewrite");
}
