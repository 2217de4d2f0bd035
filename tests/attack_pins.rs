//! Hostile review of pins (`RL.PIN`, `RL.UNPIN`, `RL.PINNED`) on a real server: every
//! case here broke an invariant (or guards one a storm of calls could break) before its fix.

mod support;

use support::*;

fn ok(c: &mut Connection, args: &[&str]) {
    let r: String = redis::cmd(args[0]).arg(&args[1..]).query(c).unwrap();
    assert_eq!(r, "OK", "{args:?}");
}

fn pexpiretime(c: &mut Connection, key: &str) -> i64 {
    query(c, &["PEXPIRETIME", key])
}

/// Random calls of every command that writes a bucket, on a few keys, with pins of every
/// kind set, replaced, lifted and ending by themselves (`PX` of a few ms) between them,
/// with versions, leases and reservations: the master's keys and its replica's, its AOF
/// (replayed and rewritten) and its RDB (reloaded) hold the same bytes, and no call hits a
/// caught panic.
#[test]
fn pin_storms_leave_replica_aof_and_rdb_identical() {
    let mut s = Server::start(&["--appendonly", "yes", "--aof-use-rdb-preamble", "no"]);
    let replica = Server::start(&[]);
    replicate(&replica, &s);
    let mut c = s.conn();
    // Keys go only when the test asks (a read): the master and the replica compare alike.
    no_active_expire(&mut c);
    let keys = ["k0", "k1", "k2", "k3"];
    // Slow limits mostly (nothing refills noticeably), and extremes.
    let limits = [
        ("0.001", "5"),
        ("0.002", "20"),
        ("1000", "10"),
        ("0.000000001", "1"),
        ("1000000", "1000000000"),
        ("1000000000000000", "1000000000000000"),
        ("0.5", "0.5"),
    ];
    let mut rng = Rng::seeded(0x9e37_79b9_7f4a_7c15);
    let mut leases: Vec<(String, i64)> = Vec::new();
    for step in 0..3000 {
        let key = rng.pick(&keys).to_string();
        let (rate, cap) = *rng.pick(&limits);
        let (rate, cap) = (rate.to_string(), cap.to_string());
        let n = (1 + rng.below(6)).to_string();
        let mut args: Vec<String> = match rng.below(13) {
            0 | 1 => vec!["RL.TAKE".into(), key, rate, cap, n, "WITHSTATE".into()],
            2 => vec![
                "RL.LEASE".into(),
                key,
                rate,
                cap,
                n,
                (1 + rng.below(200_000)).to_string(),
            ],
            3 => match leases.pop() {
                Some((k, id)) => vec![
                    "RL.RETURN".into(),
                    k,
                    id.to_string(),
                    rng.below(4).to_string(),
                ],
                None => vec!["RL.REFUND".into(), key, n],
            },
            4 => vec!["RL.REFUND".into(), key, n],
            5 => vec![
                "RL.RESERVE".into(),
                key,
                rate,
                cap,
                n,
                rng.below(5000).to_string(),
            ],
            6 => {
                let other = rng.pick(&keys).to_string();
                if other == key {
                    vec!["RL.TAKE".into(), key, rate, cap, n]
                } else {
                    let (r2, c2) = *rng.pick(&limits);
                    vec![
                        "RL.MTAKE".into(),
                        n,
                        key,
                        rate,
                        cap,
                        other,
                        r2.into(),
                        c2.into(),
                    ]
                }
            }
            7 | 8 => {
                let mut a = vec!["RL.PIN".into(), key];
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
            9 => vec!["RL.UNPIN".into(), key],
            10 => vec!["RL.PEEK".into(), key],
            11 => vec!["RL.PINNED".into(), key],
            _ => vec!["RL.TAKE".into(), key, rate, cap, n],
        };
        if rng.chance(20) && ["RL.TAKE", "RL.LEASE", "RL.RESERVE"].contains(&args[0].as_str()) {
            args.push("VERSION".into());
            args.push(rng.below(4).to_string());
        }
        if let Ok(v) = storm_send(&mut c, &args) {
            if args[0] == "RL.LEASE" {
                let r = ints(&v);
                if r[0] > 0 && r[1] > 0 {
                    leases.push((args[1].clone(), r[1]));
                }
            }
        }
        if step % 7 == 0 {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
    let digests: Vec<String> = keys.iter().map(|k| digest(&mut c, k)).collect();
    let all = dataset_digest(&mut c);
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
    assert!(!s.exited());
}

/// A rate pin with an end keeps its key until the bucket it returns to is full: the key
/// must not expire at the pin's end (nor when the pinned bucket is full) while the tokens
/// carried over at that end are below the returning limit's cap, or the next caller finds
/// a full bucket: tokens minted.
#[test]
fn a_rate_pin_with_an_end_keeps_its_key_until_the_bucket_it_returns_to_is_full() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    // Callers at 1000/s, cap 1000 (full in 1 s), drained; a pin to cap 1 for 500 ms: when
    // it ends the bucket holds at most 1 token of 1000 and is full 999 ms later, not before.
    // Drained and pinned in one transaction: the bucket is there (not full) when pinned,
    // however slow the machine.
    let before = server_ms(&mut c);
    let (taken, pinned): (i64, String) = redis::pipe()
        .atomic()
        .cmd("RL.TAKE")
        .arg(&["plain", "1000", "1000", "1000"])
        .cmd("RL.PIN")
        .arg(&["plain", "1000000", "1", "PX", "500"])
        .query(&mut c)
        .unwrap();
    assert_eq!((taken, pinned.as_str()), (1000, "OK"));
    let at = pexpiretime(&mut c, "plain");
    assert!(
        at >= before + 500 + 999 - 1,
        "the key goes at {at}, {} ms after the pin was set: before the bucket it returns \
         to is full ({} ms at least)",
        at - before,
        500 + 999
    );

    // The limit it returns to replaced meanwhile by a newer VERSION, much slower: at the
    // pin's end its 10 tokens carry over into a cap of 100 refilling at 0.001/s.
    let _: Value = query(
        &mut c,
        &["RL.TAKE", "v", "1000", "1000", "1", "VERSION", "1"],
    );
    let before = server_ms(&mut c);
    ok(&mut c, &["RL.PIN", "v", "1000", "10", "PX", "300"]);
    let r: Vec<Value> = query(
        &mut c,
        &[
            "RL.TAKE",
            "v",
            "0.001",
            "100",
            "1",
            "VERSION",
            "2",
            "WITHSTATE",
        ],
    );
    assert_eq!(r[0], Value::Int(1), "{r:?}");
    let at = pexpiretime(&mut c, "v");
    assert!(
        at >= before + 300 + 80_000_000,
        "the key goes {} ms after the pin was set, though the bucket it returns to is \
         about 90000 s from full then",
        at - before
    );
    // Long after the pin's end, well before 90 tokens could refill: still about 10.
    std::thread::sleep(std::time::Duration::from_millis(1200));
    let r: Vec<Value> = query(
        &mut c,
        &[
            "RL.TAKE",
            "v",
            "0.001",
            "100",
            "100",
            "VERSION",
            "2",
            "WITHSTATE",
        ],
    );
    assert_eq!(r[0], Value::Int(0), "tokens minted at the pin's end: {r:?}");
}

/// An `EXEMPT` key grants every take, lease and reservation the caller's limit allows,
/// whatever limit its bucket underneath was last written under (there, a smaller cap):
/// not a denial with no wait (a caller retrying at once, for ever), not an error.
#[test]
fn an_exempt_key_grants_what_the_callers_limit_allows() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    assert_eq!(take(&mut c, "x", 0.001, 10.0, 1), 1);
    ok(&mut c, &["RL.PIN", "x", "EXEMPT"]);
    let before = digest(&mut c, "x");
    let r: Vec<Value> = query(&mut c, &["RL.TAKE", "x", "0.001", "100", "50", "WITHSTATE"]);
    assert_eq!(r[0], Value::Int(50), "an exempt key denied a take: {r:?}");
    let r = redis::cmd("RL.RESERVE")
        .arg(&["x", "0.001", "100", "50", "1000"])
        .query::<Value>(&mut c);
    assert!(
        matches!(&r, Ok(v) if ints(v)[0] == 50),
        "an exempt key refused a reservation: {r:?}"
    );
    let r: Vec<Value> = query(
        &mut c,
        &["RL.MTAKE", "50", "x", "0.001", "100", "y", "0.001", "100"],
    );
    assert_eq!(r[0], Value::Int(50), "{r:?}");
    let r: Vec<i64> = query(&mut c, &["RL.LEASE", "x", "0.001", "100", "50", "1000"]);
    assert_eq!(r[..2], [50, 0], "an exempt lease is the whole of it: {r:?}");
    assert_eq!(digest(&mut c, "x"), before, "nothing debited");
}

/// States forged with `RL.SETSTATE ... PIN` at the edges the validator accepts (instants at
/// 0, now and `i64::MAX`, limits from 1e-9 to 1e15, versions at their bound, pins of every
/// kind, ended or not, with leases), then every command on them: no call hits a caught
/// panic, and every state a command leaves loads back (`DUMP`/`RESTORE`) to the same bytes.
#[test]
fn every_command_on_forged_pinned_states_leaves_a_state_that_loads() {
    let s = Server::start(&[]);
    let mut c = s.internal_conn();
    let now = now_ns();
    let mut rng = Rng::seeded(7);
    let instants = [
        0u64,
        1,
        now,
        now - 1_000_000_000,
        now + 1_000_000_000,
        now + 3_000_000_000_000_000_000,
        i64::MAX as u64,
    ];
    let limits = [
        ("0.000000001", "1"),
        ("0.001", "5"),
        ("1", "1"),
        ("1000000", "1000000000"),
        ("1000000000000000", "1000000000000000"),
        ("0.5", "1000"),
    ];
    let mut checked = 0;
    for round in 0..400 {
        let key = format!("f{round}");
        let (rate, cap) = *rng.pick(&limits);
        let mut forge: Vec<String> = vec![
            "RL.SETSTATE".into(),
            key.clone(),
            rng.pick(&instants).to_string(),
            rate.into(),
            cap.into(),
        ];
        if rng.chance(30) {
            forge.extend([
                "HOLD".into(),
                rng.pick(&instants).to_string(),
                "SPAN".into(),
                rng.pick(&[0u64, 1_000_000_000, 3_000_000_000_000_000_000])
                    .to_string(),
            ]);
        }
        if rng.chance(30) {
            forge.extend([
                "VERSION".into(),
                rng.pick(&[1u64, 2, 9_007_199_254_740_991]).to_string(),
            ]);
        }
        let absent = rng.chance(20);
        let kind = 1 + rng.below(3);
        let (base_rate, base_cap) = if kind == 1 || rng.chance(10) {
            *rng.pick(&limits)
        } else if absent {
            ("1", "1")
        } else {
            (rate, cap)
        };
        forge.extend([
            "PIN".into(),
            kind.to_string(),
            rng.pick(&[
                0u64,
                1,
                now + 50_000_000,
                now + 1_000_000_000,
                i64::MAX as u64,
            ])
            .to_string(),
            base_rate.into(),
            base_cap.into(),
            (absent as u8).to_string(),
        ]);
        if rng.chance(30) {
            forge.extend([
                "LASTID".into(),
                "7".into(),
                "ADD".into(),
                "7".into(),
                (1 + rng.below(3)).to_string(),
                (now + 100_000_000_000).to_string(),
            ]);
        }
        if storm_send(&mut c, &forge).is_err() || query::<i64>(&mut c, &["EXISTS", &key]) == 0 {
            // Refused, or a state whose key has gone already (full, no pin left).
            continue;
        }
        checked += 1;
        let (r2, c2) = *rng.pick(&limits);
        let (r2, c2) = (r2.to_string(), c2.to_string());
        let n = (1 + rng.below(3)).to_string();
        let calls: Vec<Vec<String>> = vec![
            vec!["RL.PEEK".into(), key.clone()],
            vec!["RL.PINNED".into(), key.clone()],
            vec![
                "RL.TAKE".into(),
                key.clone(),
                r2.clone(),
                c2.clone(),
                n.clone(),
                "WITHSTATE".into(),
            ],
            vec![
                "RL.TAKE".into(),
                key.clone(),
                r2.clone(),
                c2.clone(),
                n.clone(),
                "VERSION".into(),
                "9007199254740991".into(),
            ],
            vec![
                "RL.LEASE".into(),
                key.clone(),
                r2.clone(),
                c2.clone(),
                n.clone(),
                "1000".into(),
                "RETURN".into(),
                "7".into(),
                "1".into(),
            ],
            vec!["RL.RETURN".into(), key.clone(), "7".into(), "0".into()],
            vec!["RL.REFUND".into(), key.clone(), n.clone()],
            vec![
                "RL.RESERVE".into(),
                key.clone(),
                r2.clone(),
                c2.clone(),
                n.clone(),
                "86400000".into(),
            ],
            vec![
                "RL.MTAKE".into(),
                n.clone(),
                key.clone(),
                r2.clone(),
                c2.clone(),
                "other".into(),
                "1".into(),
                "10".into(),
            ],
            vec!["RL.PIN".into(), key.clone(), r2.clone(), c2.clone()],
            vec![
                "RL.PIN".into(),
                key.clone(),
                "BLOCK".into(),
                "PX".into(),
                "5000".into(),
            ],
            vec!["RL.UNPIN".into(), key.clone()],
        ];
        // Each call on its own copy of the forged state, then the state it leaves loaded back.
        let forged = dump(&mut c, &key);
        for call in calls {
            let _ = restore_replace(&mut c, &key, &forged).unwrap();
            let _ = storm_send(&mut c, &call);
            // Kept from here on (the digest counts whether a key has an expiry, and the
            // copy below has none); gone already: nothing to load.
            let _: i64 = query(&mut c, &["PERSIST", &key]);
            if query::<i64>(&mut c, &["EXISTS", &key]) == 0 {
                continue;
            }
            let payload = dump(&mut c, &key);
            let r = restore_replace(&mut c, "copy", &payload);
            assert!(r.is_ok(), "{forge:?} then {call:?}: does not load: {r:?}");
            assert_eq!(
                digest(&mut c, "copy"),
                digest(&mut c, &key),
                "{forge:?} then {call:?}"
            );
        }
    }
    assert!(checked > 50, "only {checked} forged states accepted");
    assert!(!s.log().contains("panicked"), "{}", s.log());
}

/// `RESTORE` payloads of encoding 4 (a pin) cut short at every byte and with every byte
/// replaced by edge values: each is refused or loads a state every command then handles;
/// the server never goes down and no call hits a caught panic.
#[test]
fn forged_restore_payloads_of_pinned_buckets_never_hurt_the_server() {
    let mut s = Server::start(&[]);
    let mut c = s.conn();
    let _: Vec<i64> = query(&mut c, &["RL.LEASE", "a", "0.001", "50", "10", "86400000"]);
    ok(&mut c, &["RL.PIN", "a", "0.002", "20", "PX", "100000000"]);
    ok(&mut c, &["RL.PIN", "b", "BLOCK", "PX", "100000000"]);
    let _: Value = query(&mut c, &["RL.TAKE", "e", "1", "10", "3", "VERSION", "5"]);
    ok(&mut c, &["RL.PIN", "e", "EXEMPT"]);
    let commands: [&[&str]; 7] = [
        &["RL.TAKE", "t", "1", "10", "1", "WITHSTATE"],
        &["RL.LEASE", "t", "1", "10", "2", "1000", "RETURN", "1", "1"],
        &["RL.RETURN", "t", "1", "1"],
        &["RL.REFUND", "t", "1"],
        &["RL.RESERVE", "t", "1", "10", "2", "1000"],
        &["RL.PEEK", "t"],
        &["RL.UNPIN", "t"],
    ];
    let mut loaded = 0;
    for key in ["a", "b", "e"] {
        let payload = dump(&mut c, key);
        let body = dump_body(&payload).to_vec();
        for b in mutated_payloads(&body) {
            let forged = reseal(&payload, &b);
            if restore_replace(&mut c, "t", &forged).is_err() {
                continue;
            }
            loaded += 1;
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

/// A rate pin to a very slow limit (1e-9/s: 31 years to fill) that ended keeps its key
/// only as long as the bucket it returns to needs to fill (a few seconds here), before and
/// after the key's next write: no caller passes the pinned limit, so its fill time is no
/// reason to keep an idle key.
#[test]
fn an_ended_rate_pin_keeps_its_key_no_longer_than_the_bucket_needs() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let before = server_ms(&mut c);
    let (taken, pinned): (i64, String) = redis::pipe()
        .atomic()
        .cmd("RL.TAKE")
        .arg(&["k", "1", "10", "1"])
        .cmd("RL.PIN")
        .arg(&["k", "0.000000001", "1", "PX", "100"])
        .query(&mut c)
        .unwrap();
    assert_eq!((taken, pinned.as_str()), (1, "OK"));
    let after = server_ms(&mut c);
    // At most: the pin's 100 ms, then 10 s at 1/s.
    let at = pexpiretime(&mut c, "k");
    assert!(
        at <= after + 100 + 10_000 + 1,
        "an idle key kept {} ms after the pin was set",
        at - before
    );
    std::thread::sleep(std::time::Duration::from_millis(150));
    let during = server_ms(&mut c);
    assert_eq!(take(&mut c, "k", 1.0, 10.0, 1), 1);
    let after = server_ms(&mut c);
    assert_expires_in(&mut c, "k", (during, after), 0..=10_000);
}

/// Whether `key` holds a live `EXEMPT` pin now.
fn exempt(c: &mut Connection, key: &str) -> bool {
    let v: Value = query(c, &["RL.PINNED", key]);
    matches!(&v, Value::Array(items) if items.get(1).is_some_and(|k| redis::from_redis_value::<String>(k).is_ok_and(|k| k == "exempt")))
        || matches!(&v, Value::Map(items) if items.iter().any(|(_, k)| redis::from_redis_value::<String>(k).is_ok_and(|k| k == "exempt")))
}

/// Slow limits only (at most 0.01 tokens/s: nothing refills during the test), pins of
/// every kind set, replaced, lifted and ending by themselves between takes, leases
/// (returned), reservations, refunds of what was taken, versions: what each key lets out
/// (grants, less what came back) never exceeds the largest cap involved. Exempt grants,
/// which debit nothing by design, are not counted.
#[test]
fn pin_storms_mint_no_tokens() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let keys = ["m0", "m1", "m2"];
    let limits = [
        ("0.01", "5"),
        ("0.001", "20"),
        ("0.000001", "1"),
        ("0.005", "12"),
    ];
    let cap_max = 20.0;
    let mut rng = Rng::seeded(11);
    let mut out = [0f64; 3];
    let mut refundable = [0u64; 3];
    let mut leases: Vec<(usize, i64, i64)> = Vec::new();
    let started = std::time::Instant::now();
    for step in 0..2500 {
        let k = rng.below(3) as usize;
        let key = keys[k];
        let (rate, cap) = *rng.pick(&limits);
        let n = 1 + rng.below(4);
        let ns = n.to_string();
        let version = rng.below(3).to_string();
        let free = exempt(&mut c, key);
        match rng.below(10) {
            0 | 1 => {
                let r = redis::cmd("RL.TAKE")
                    .arg(&[key, rate, cap, &ns, "VERSION", &version, "WITHSTATE"])
                    .query::<Vec<Value>>(&mut c);
                if let Ok(r) = r {
                    let granted: u64 = redis::from_redis_value(&r[0]).unwrap();
                    let pinned = r
                        .get(4)
                        .and_then(|p| redis::from_redis_value::<String>(p).ok());
                    if granted > 0 && pinned.as_deref() != Some("exempt") {
                        out[k] += granted as f64;
                        refundable[k] += granted;
                    }
                }
            }
            2 => {
                let r = redis::cmd("RL.LEASE")
                    .arg(&[key, rate, cap, &ns, "100000"])
                    .query::<Vec<i64>>(&mut c);
                if let Ok(r) = r {
                    if r[0] > 0 && r[1] > 0 {
                        out[k] += r[0] as f64;
                        leases.push((k, r[1], r[0]));
                    }
                }
            }
            3 => {
                if let Some((k, id, got)) = leases.pop() {
                    let unused = rng.below(got as u64 + 1);
                    let credited: i64 = query(
                        &mut c,
                        &["RL.RETURN", keys[k], &id.to_string(), &unused.to_string()],
                    );
                    assert!(credited as u64 <= unused);
                    out[k] -= credited as f64;
                }
            }
            4 => {
                if refundable[k] > 0 {
                    let m = 1 + rng.below(refundable[k]);
                    let credited: String = query(&mut c, &["RL.REFUND", key, &m.to_string()]);
                    let credited: f64 = credited.parse().unwrap();
                    assert!(credited <= m as f64 + 1e-9);
                    refundable[k] -= m;
                    out[k] -= credited;
                }
            }
            5 => {
                let r = redis::cmd("RL.RESERVE")
                    .arg(&[key, rate, cap, &ns, &rng.below(3000).to_string()])
                    .query::<Vec<Value>>(&mut c);
                if let Ok(r) = r {
                    let granted: u64 = redis::from_redis_value(&r[0]).unwrap();
                    if granted > 0 && !free {
                        out[k] += granted as f64;
                    }
                }
            }
            6 => {
                let j = (k + 1 + rng.below(2) as usize) % 3;
                let (r2, c2) = *rng.pick(&limits);
                let free_j = exempt(&mut c, keys[j]);
                let r = redis::cmd("RL.MTAKE")
                    .arg(&[&ns, key, rate, cap, keys[j], r2, c2])
                    .query::<Vec<Value>>(&mut c);
                if let Ok(r) = r {
                    let granted: u64 = redis::from_redis_value(&r[0]).unwrap();
                    if granted > 0 {
                        if !free {
                            out[k] += granted as f64;
                        }
                        if !free_j {
                            out[j] += granted as f64;
                        }
                    }
                }
            }
            7 | 8 => {
                let px = (1 + rng.below(20)).to_string();
                let (pr, pc) = *rng.pick(&limits);
                let mut args = vec![key];
                match rng.below(3) {
                    0 => args.push("BLOCK"),
                    1 => args.push("EXEMPT"),
                    _ => args.extend([pr, pc]),
                }
                if rng.chance(70) {
                    args.extend(["PX", &px]);
                }
                let _: String = redis::cmd("RL.PIN").arg(&args).query(&mut c).unwrap();
            }
            _ => {
                let _: i64 = query(&mut c, &["RL.UNPIN", key]);
            }
        }
        let elapsed = started.elapsed().as_secs_f64();
        for (i, o) in out.iter().enumerate() {
            assert!(
                *o <= cap_max + 0.01 * elapsed + 1e-6,
                "step {step}: {} let out {o} tokens (cap at most {cap_max})",
                keys[i]
            );
        }
        if step % 5 == 0 {
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
    }
}

/// A replica of a replica applies the effects its master passes on (the internal setters'
/// check lets the replication link through at every hop), and a promoted replica goes on
/// from the same pins.
#[test]
fn chained_replicas_and_failover_carry_pins() {
    let a = Server::start(&[]);
    let b = Server::start(&[]);
    let cc = Server::start(&[]);
    replicate(&b, &a);
    replicate(&cc, &b);
    let mut m = a.conn();
    assert_eq!(take(&mut m, "r", 0.001, 100.0, 60), 60);
    ok(&mut m, &["RL.PIN", "r", "0.001", "7", "PX", "100000000"]);
    assert_eq!(take(&mut m, "r", 0.001, 100.0, 2), 2);
    ok(&mut m, &["RL.PIN", "x", "EXEMPT"]);
    let _: Vec<i64> = query(&mut m, &["RL.LEASE", "l", "0.001", "50", "10", "86400000"]);
    ok(&mut m, &["RL.PIN", "l", "BLOCK"]);
    let keys = ["r", "x", "l"];
    let digests: Vec<String> = keys.iter().map(|k| digest(&mut m, k)).collect();
    wait_synced(&a, &b);
    wait_synced(&b, &cc);
    let mut last = cc.conn();
    for (k, d) in keys.iter().zip(&digests) {
        assert_eq!(&digest(&mut last, k), d, "replica of a replica, {k}");
    }
    // Failover: the middle replica becomes the master; its replica follows it.
    drop(m);
    drop(a);
    let _: () = query(&mut b.conn(), &["REPLICAOF", "NO", "ONE"]);
    let mut m = b.conn();
    assert_eq!(take(&mut m, "r", 0.001, 100.0, 5), 5);
    assert_eq!(
        take(&mut m, "r", 0.001, 100.0, 1),
        0,
        "the pin's cap of 7 holds"
    );
    assert_eq!(query::<i64>(&mut m, &["RL.UNPIN", "l"]), 1);
    wait_synced(&b, &cc);
    for k in keys {
        assert_eq!(
            digest(&mut last, k),
            digest(&mut m, k),
            "after failover, {k}"
        );
    }
}
