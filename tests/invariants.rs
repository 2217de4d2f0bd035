//! The project's invariants against a hostile client, on real servers: a hostile review of
//! the hardening work wrote these.
//!
//! Part 1: defects that review found (each failed before its fix), named after the rule
//! they broke, with the reproduction.
//!
//! Part 2: attacks that did not break anything, kept because they are cheap and pin down
//! behaviour a later change could break.

mod support;
use std::time::{Duration, Instant};
use support::*;

fn cmd(c: &mut Connection, args: &[&str]) -> redis::RedisResult<Value> {
    redis::cmd(args[0]).arg(&args[1..]).query(c)
}

fn int(c: &mut Connection, args: &[&str]) -> i64 {
    query(c, args)
}

// ============================================================================================
// Part 1: defects found by review (each failed before its fix)
// ============================================================================================

/// Rule 5 (no token minted by rounding). `Level::starting_with` computes the deficit of an
/// `INIT tokens` bucket as `nanos_for(cap - tokens)` with a subtraction rounded to NEAREST,
/// not `round::sub_up`: at caps >= 2^49 (one f64 step is 0.125 token) `cap - 0.95` rounds
/// to `cap - 1`, so a bucket told to start with 0.95 tokens starts with 1 and grants a
/// token in the very call that created it (same server instant: no refill at all).
///
/// Reproduce (any server):
///   RL.TAKE a 262144 562949953421313 1 INIT 0.95      -> 1   (should be 0)
///   RL.TAKE b 999999999999999 1e15 1 INIT 0.95        -> 1   (should be 0)
///   RL.TAKE c 262144 562949953421313 1 INIT 0.90      -> 0   (rounds the safe way)
/// (2^49 + 1 at 2^18/s: `(cap - 1) * 1e9 / rate` is a whole number of ns, so the ns
/// rounding of the debit does not hide the minted fraction.)
#[test]
fn rule5_init_rounding_mints_a_token_at_large_caps() {
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

/// Rule 5 (no token minted by limit changes; let-out within cap + rate * elapsed). Two
/// callers disagree on a key's limit (or a rollout is rolled back): a caller with a small
/// cap makes one grant, which stores the bucket under the small cap; it is full again
/// under that cap within `small_cap / rate`, the key expires, and the next caller with the
/// large cap finds NO key, which is a FULL large bucket. The deficit the large-cap caller
/// had dug is forgotten, so a full large burst comes out again at once.
///
/// Reproduce (any server), within ~50 ms:
///   RL.TAKE f 1 1000 999     -> 999   (1 token left under (1, 1000))
///   RL.TAKE f 1000 10 1      -> 1     (stored under (1000, 10): 0 of 10, full in 10 ms)
///   (sleep 30 ms: the key expires)
///   RL.TAKE f 1 1000 1000    -> 1000  (no key = full)
/// 2000 tokens in ~40 ms; even with the largest cap and the largest rate of the two limits
/// the bound is 1000 + 1000 * 0.04 = 1040. (tests/hostile.rs asserts this behaviour as
/// "documented", but docs/commands.md ("Changing a limit") only says tokens carry over when the limit changes, and
/// here they do not.)
#[test]
fn rule5_cap_flap_through_key_expiry_mints_a_full_burst() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let start = Instant::now();
    let mut out = 0;
    out += int(&mut c, &["RL.TAKE", "f", "1", "1000", "999"]);
    out += int(&mut c, &["RL.TAKE", "f", "1000", "10", "1"]);
    std::thread::sleep(Duration::from_millis(30));
    out += int(&mut c, &["RL.TAKE", "f", "1", "1000", "1000"]);
    let elapsed = start.elapsed().as_secs_f64();
    let bound = 1000.0 + 1000.0 * elapsed;
    assert!(
        out as f64 <= bound,
        "let out {out} tokens in {elapsed:.3} s; the largest cap + largest rate * elapsed \
         allows {bound:.0}: the limit change through an expired key minted a full burst"
    );
}

/// ACL rule: a user with `+@all -@write -@dangerous` must not write buckets. On Redis 7.0
/// (the default server, listed as fully supported in docs/deploy.md) the module cannot set
/// command categories and registers its commands with none, so the category rules do not
/// apply at all: such a "read-only" user can RL.TAKE, RL.LEASE, RL.MTAKE and even
/// RL.SETSTATE (forge any bucket state, which replicas and the AOF then carry). docs/deploy.md
/// ("ACL") says so; tests/acl.rs skips the check on 7.0.
///
/// Reproduce on redis-server 7.0.15:
///   ACL SETUSER u on nopass +@all -@write -@dangerous ~*
///   AUTH u x ; RL.SETSTATE k 1 1 1    -> OK   (should be NOPERM)
///   RL.TAKE k 1 10                    -> 1    (should be NOPERM)
/// (On Redis 8.2 and Valkey 9 every one of these is refused.)
#[test]
fn acl_read_only_user_cannot_write_buckets() {
    let s = Server::start(&[]);
    let info: Value = redis::cmd("COMMAND")
        .arg("INFO")
        .arg("RL.TAKE")
        .query(&mut s.conn())
        .unwrap();
    if !format!("{info:?}").contains("@write") {
        // Redis 7.0 has no API to put a module command in a category: `-@write` cannot
        // reach it. docs/deploy.md ("ACL") says so and gives the rules that name the commands
        // (tested in tests/acl.rs on every server).
        eprintln!("this server cannot set module ACL categories: skipped");
        return;
    }
    let mut reader = as_user(&s, "reader", "~* +@all -@write -@dangerous");
    let mut let_through = Vec::new();
    for args in [
        &["RL.TAKE", "k", "1", "10"][..],
        &["RL.LEASE", "k", "1", "10", "1", "1000"],
        &["RL.MTAKE", "1", "k", "1", "10"],
        &["RL.SETSTATE", "k", "1", "1", "1"],
    ] {
        if allowed(&mut reader, args) {
            let_through.push(args[0]);
        }
    }
    assert!(
        let_through.is_empty(),
        "a +@all -@write -@dangerous user ran {let_through:?}"
    );
    // And it must still be able to read.
    assert!(allowed(&mut reader, &["RL.PEEK", "k"]));
}

// ============================================================================================
// Part 2: GUARDS (attacks that held)
// ============================================================================================

/// Rule 5 without expiry in the way: a key used with rates alternating between 1e-9-ish
/// and 1e15-ish extremes and caps alternating too, drained so it never expires, lets out no
/// more than the largest cap + the largest rate * elapsed, measured on the wall clock.
#[test]
fn guard_rate_and_cap_flapping_at_extremes_mints_nothing_while_the_key_lives() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    // (rate, cap) pairs, all accepted (cap / rate <= 100 years).
    let limits = [
        ("0.000001", "1000"),
        ("1", "1000"),
        ("0.5", "999"),
        ("0.000031", "1000"),
        ("1.0000000000000002", "1000"),
    ];
    let start = Instant::now();
    let mut out = 0i64;
    // Start empty.
    let _ = int(&mut c, &["RL.TAKE", "x", "1", "1000", "1", "INIT", "0"]);
    for round in 0..2000 {
        let (rate, cap) = limits[round % limits.len()];
        out += int(&mut c, &["RL.TAKE", "x", rate, cap, "1"]);
    }
    let elapsed = start.elapsed().as_secs_f64();
    let bound = 0.0 + 1.0 * elapsed + 1.0; // started empty; max rate 1; one token slack for ms
    assert!(
        out as f64 <= bound,
        "let out {out} in {elapsed:.3}s > {bound:.1}"
    );
    let exists: i64 = c.exists("x").unwrap();
    assert_eq!(exists, 1);
}

/// Rule 5: leases and returns (plain and inside RL.LEASE ... RETURN, claiming more unused
/// than held) into a bucket near full and under a cap that changes from call to call never
/// let out more than the largest cap + rate * elapsed on the wall clock. (One long lease
/// stays open throughout so the key never expires: see the defect above for what happens
/// when it does.) A replica and a reload agree at the end.
#[test]
fn guard_lease_return_churn_under_changing_caps_lets_out_no_more_than_the_bound() {
    let master = Server::start(&[]);
    let replica = Server::start(&[]);
    replicate(&replica, &master);
    let mut c = master.conn();
    let caps = ["100", "50", "100", "10", "100"];
    let rate = 20.0;
    let start = Instant::now();
    let anchor: Vec<i64> = redis::cmd("RL.LEASE")
        .arg(&["b", "20", "100", "1", "600000"])
        .query(&mut c)
        .unwrap();
    // Let out so far; a LEASE ... RETURN's credit is not in its reply, so it is counted as
    // zero: `out` over-estimates, and the bound still has to hold.
    let mut out: i64 = anchor[0];
    let mut held: Vec<(i64, i64)> = Vec::new();
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for _ in 0..1500 {
        let cap = caps[(next() % caps.len() as u64) as usize];
        match next() % 4 {
            0 => out += int(&mut c, &["RL.TAKE", "b", "20", cap, "1"]),
            1 => {
                let v: Vec<i64> = redis::cmd("RL.LEASE")
                    .arg(&["b", "20", cap, "7", "60000"])
                    .query(&mut c)
                    .unwrap();
                if v[0] > 0 {
                    out += v[0];
                    held.push((v[1], v[0]));
                }
            }
            2 if !held.is_empty() => {
                let (id, tokens) = held.remove((next() % held.len() as u64) as usize);
                let claim = (tokens + 5).to_string();
                let credited = int(&mut c, &["RL.RETURN", "b", &id.to_string(), &claim]);
                assert!(
                    (0..=tokens).contains(&credited),
                    "credited {credited} of {tokens}"
                );
                out -= credited;
            }
            3 if !held.is_empty() => {
                let (id, tokens) = held.remove(0);
                let (id, tokens) = (id.to_string(), (tokens + 5).to_string());
                let v: Vec<i64> = redis::cmd("RL.LEASE")
                    .arg(&["b", "20", cap, "3", "60000", "RETURN", &id, &tokens])
                    .query(&mut c)
                    .unwrap();
                if v[0] > 0 {
                    out += v[0];
                    held.push((v[1], v[0]));
                }
            }
            _ => {}
        }
    }
    let elapsed = start.elapsed().as_secs_f64();
    let bound = 100.0 + rate * elapsed;
    assert!(
        out as f64 <= bound,
        "let out {out} in {elapsed:.3}s > {bound:.1}"
    );
    wait_synced(&master, &replica);
    assert_eq!(digest(&mut replica.conn(), "b"), digest(&mut c, "b"));
    let before = digest(&mut c, "b");
    let _: () = redis::cmd("DEBUG").arg("RELOAD").query(&mut c).unwrap();
    assert_eq!(digest(&mut c, "b"), before);
}

/// Rule 5: RL.RETURN into a bucket that is full, or nearly, under a limit changed since the
/// lease, credits at most what the bucket lacks and never leaves it above cap.
#[test]
fn guard_return_into_a_near_full_bucket_under_a_changed_limit() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let v: Vec<i64> = redis::cmd("RL.LEASE")
        .arg(&["n", "0.001", "100", "100", "60000"])
        .query(&mut c)
        .unwrap();
    assert_eq!(v[0], 100);
    // Another caller shrinks the cap: 0 tokens of 2.
    assert_eq!(int(&mut c, &["RL.TAKE", "n", "1", "2", "1"]), 0);
    // A third grows it back after a grant under cap 2 is impossible (0 tokens): nothing
    // stored, so a return goes into (0.001, 100) with 0 tokens.
    let credited = int(&mut c, &["RL.RETURN", "n", &v[1].to_string(), "100"]);
    assert_eq!(credited, 100);
    let peek: Vec<Value> = redis::cmd("RL.PEEK")
        .arg("n")
        .query(&mut c)
        .unwrap_or_default();
    // Full and no lease left: the key is gone.
    assert!(peek.is_empty(), "{peek:?}");

    // Near full under a smaller cap: lease 5 of 10, a caller with cap 6 takes 1 (5 -> 5 of 6
    // after carry: 5 tokens, 4 after the take), then the return of 5 credits at most 2.
    let v: Vec<i64> = redis::cmd("RL.LEASE")
        .arg(&["m", "0.001", "10", "5", "60000"])
        .query(&mut c)
        .unwrap();
    assert_eq!(v[0], 5);
    assert_eq!(int(&mut c, &["RL.TAKE", "m", "0.001", "6", "1"]), 1);
    let credited = int(&mut c, &["RL.RETURN", "m", &v[1].to_string(), "5"]);
    assert_eq!(
        credited, 2,
        "a bucket 2 short of its cap took back {credited}"
    );
    let t: (i64, f64, i64, i64) = redis::cmd("RL.TAKE")
        .arg(&["m", "0.001", "6", "6", "WITHSTATE"])
        .query(&mut c)
        .unwrap();
    assert_eq!(t.0, 6, "{t:?}");
    assert!(t.1 < 1e-6, "{t:?}");
}

/// Rule 3/6 on the state bounds: 1024 leases (the most), ids at the signed limit, lease
/// expiry at the last instant, full_at at the last instant: accepted by RL.SETSTATE, and
/// then DEBUG RELOAD, DUMP/RESTORE, an AOF rewrite + restart and a full sync all keep it
/// (digest and PEXPIRETIME).
#[test]
fn guard_states_at_every_bound_survive_every_copy() {
    let mut s = Server::start(&["--appendonly", "yes", "--aof-use-rdb-preamble", "no"]);
    let mut c = s.internal_conn();
    let far = (now_ns() + 3_600_000_000_000).to_string();
    let max = i64::MAX.to_string();
    let ok = |c: &mut Connection, args: &[&str]| {
        let mut a = vec!["RL.SETSTATE"];
        a.extend_from_slice(args);
        cmd(c, &a).unwrap_or_else(|e| panic!("{a:?}: {e}"));
    };
    // A lease keeps the key alive (full_at 0 alone would be an expired key).
    let last = (i64::MAX - 1).to_string();
    ok(
        &mut c,
        &[
            "m", "0", "1", "1000", "LASTID", &last, "ADD", &last, "1", &far,
        ],
    );
    ok(&mut c, &["e", &max, "1e-9", "1e-9"]);
    ok(
        &mut c,
        &["x", "0", "1", "1", "LASTID", "5", "ADD", "5", "1", &max],
    );
    let mut p = redis::pipe();
    for id in 1..=1024u64 {
        p.cmd("RL.SETSTATE").arg(&[
            "many",
            &far,
            "1e9",
            "1e15",
            "ADD",
            &id.to_string(),
            "1000000000000",
            &far,
        ]);
    }
    let _: Vec<Value> = p.query(&mut c).unwrap();
    // The 1025th is refused and changes nothing.
    let before = digest(&mut c, "many");
    assert!(cmd(
        &mut c,
        &[
            "RL.SETSTATE",
            "many",
            &far,
            "1e9",
            "1e15",
            "ADD",
            "1025",
            "1",
            &far
        ]
    )
    .is_err());
    assert_eq!(digest(&mut c, "many"), before);
    // The last id: one lease more, then none.
    let v: Vec<i64> = redis::cmd("RL.LEASE")
        .arg(&["m", "1", "1000", "1", "1000"])
        .query(&mut c)
        .unwrap();
    assert_eq!(v[1], i64::MAX);
    let e = cmd(&mut c, &["RL.LEASE", "m", "1", "1000", "1", "1000"]).unwrap_err();
    assert!(e.to_string().contains("no lease id left"), "{e}");

    let keys = ["m", "e", "x", "many"];
    let snap = |c: &mut Connection| -> Vec<(String, i64)> {
        keys.iter()
            .map(|k| {
                let at: i64 = redis::cmd("PEXPIRETIME").arg(*k).query(c).unwrap();
                (digest(c, k), at)
            })
            .collect()
    };
    let want = snap(&mut c);
    let _: () = redis::cmd("DEBUG").arg("RELOAD").query(&mut c).unwrap();
    assert_eq!(snap(&mut c), want, "DEBUG RELOAD");
    for k in keys {
        let payload = dump(&mut c, k);
        // (DEBUG DIGEST-VALUE mixes in whether the key has an expiry: restore it too.)
        let at: i64 = redis::cmd("PEXPIRETIME").arg(k).query(&mut c).unwrap();
        let _: () = redis::cmd("RESTORE")
            .arg(format!("{k}:copy"))
            .arg(at)
            .arg(&payload)
            .arg("ABSTTL")
            .query(&mut c)
            .unwrap();
        assert_eq!(
            digest(&mut c, &format!("{k}:copy")),
            digest(&mut c, k),
            "RESTORE {k}"
        );
        let _: i64 = redis::cmd("DEL")
            .arg(format!("{k}:copy"))
            .query(&mut c)
            .unwrap();
    }
    let replica = Server::start(&[]);
    replicate(&replica, &s);
    wait_synced(&s, &replica);
    assert_eq!(snap(&mut replica.internal_conn()), want, "full sync");
    drop(replica);
    rewrite_aof(&mut c);
    drop(c);
    s.restart();
    let mut c = s.conn();
    assert_eq!(snap(&mut c), want, "AOF rewrite + restart");
}

/// Rule 4: after PERSIST, RESTORE ... 0, a hand-set EXPIRE (earlier or later), the next
/// write (take, lease, return, mtake) puts the expiry back at the bucket's time-to-full
/// (or its last lease), on the master and the replica alike.
#[test]
fn guard_expiry_is_time_to_full_after_every_kind_of_write() {
    let master = Server::start(&[]);
    let replica = Server::start(&[]);
    replicate(&replica, &master);
    let mut c = master.conn();
    let pexpiretime =
        |c: &mut Connection, k: &str| -> i64 { redis::cmd("PEXPIRETIME").arg(k).query(c).unwrap() };
    // The key's expiry, and the moment PEEK says the bucket is full: its reset_after_ms
    // from the server time PEEK ran at (bracketed by two TIME readings; 1 ms each side for
    // rounding).
    let expiry_and_full_at =
        |c: &mut Connection, k: &str| -> (i64, std::ops::RangeInclusive<i64>) {
            let at = pexpiretime(c, k);
            let before = server_ms(c);
            let v: Vec<Value> = redis::cmd("RL.PEEK").arg(k).query(c).unwrap();
            let after = server_ms(c);
            let reset = match &v[7] {
                Value::Int(n) => *n,
                other => panic!("{other:?}"),
            };
            (at, before + reset - 1..=after + reset + 1)
        };
    assert_eq!(int(&mut c, &["RL.TAKE", "k", "0.01", "100", "10"]), 10);
    for tamper in [
        vec!["PERSIST", "k"],
        vec!["PEXPIRE", "k", "5000000"],
        vec!["PEXPIRE", "k", "500000"],
    ] {
        let _: Value = cmd(&mut c, &tamper).unwrap();
        for write in [
            vec!["RL.TAKE", "k", "0.01", "100", "1"],
            vec!["RL.MTAKE", "1", "k", "0.01", "100"],
        ] {
            let _: Value = cmd(&mut c, &write).unwrap();
            let (at, full_at) = expiry_and_full_at(&mut c, "k");
            assert!(
                full_at.contains(&at),
                "{tamper:?} then {write:?}: PEXPIRETIME {at}, full at {full_at:?}"
            );
            let _: Value = cmd(&mut c, &tamper).unwrap();
        }
    }
    // Lease: the expiry covers the lease; RETURN brings it back to time-to-full.
    let v: Vec<i64> = redis::cmd("RL.LEASE")
        .arg(&["k", "0.01", "100", "1", "86400000"])
        .query(&mut c)
        .unwrap();
    let _: i64 = redis::cmd("PERSIST").arg("k").query(&mut c).unwrap();
    let _ = int(&mut c, &["RL.RETURN", "k", &v[1].to_string(), "0"]);
    let (at, full_at) = expiry_and_full_at(&mut c, "k");
    assert!(
        full_at.contains(&at),
        "after RETURN: PEXPIRETIME {at}, full at {full_at:?}"
    );
    // RESTORE ... 0 then a write.
    let payload = dump(&mut c, "k");
    let _: () = redis::cmd("RESTORE")
        .arg("k")
        .arg(0)
        .arg(&payload)
        .arg("REPLACE")
        .query(&mut c)
        .unwrap();
    assert_eq!(pexpiretime(&mut c, "k"), -1);
    assert_eq!(int(&mut c, &["RL.TAKE", "k", "0.01", "100", "1"]), 1);
    assert!(pexpiretime(&mut c, "k") > 0);
    wait_synced(&master, &replica);
    let mut r = replica.conn();
    assert_eq!(dataset_digest(&mut r), dataset_digest(&mut c));
}

/// Rule 2: every refused call (bad options, duplicates, forged effects out of bounds)
/// changes nothing and sends nothing: replica digest and replication offset unchanged.
#[test]
fn guard_refused_calls_send_nothing() {
    let master = Server::start(&[]);
    let replica = Server::start(&[]);
    replicate(&replica, &master);
    let mut c = master.internal_conn();
    assert_eq!(int(&mut c, &["RL.TAKE", "k", "1", "100", "10"]), 10);
    let v: Vec<i64> = redis::cmd("RL.LEASE")
        .arg(&["k", "1", "100", "5", "60000"])
        .query(&mut c)
        .unwrap();
    wait_synced(&master, &replica);
    let offset = info_field(&mut c, "replication", "master_repl_offset");
    let before = digest(&mut c, "k");
    let id = v[1].to_string();
    let far = (now_ns() + 60_000_000_000).to_string();
    for bad in [
        vec!["RL.TAKE", "k", "1", "100", "0"],
        vec!["RL.TAKE", "k", "1", "100", "101"],
        vec!["RL.TAKE", "k", "1", "100", "1", "INIT", "1", "INIT", "1"],
        vec!["RL.TAKE", "k", "nan", "100"],
        vec!["RL.TAKE", "k", "1e-10", "100"],
        vec!["RL.TAKE", "k", "1e-9", "1e15"],
        vec!["RL.LEASE", "k", "1", "100", "5", "0"],
        vec!["RL.LEASE", "k", "1", "100", "5", "86400001"],
        vec![
            "RL.LEASE", "k", "1", "100", "5", "100", "RETURN", &id, "1", "RETURN", &id, "1",
        ],
        vec!["RL.LEASE", "k", "1", "100", "5", "100", "MIN", "6"],
        vec!["RL.RETURN", "k", &id, "-1"],
        vec!["RL.RETURN", "k", "-1", "1"],
        vec!["RL.MTAKE", "1", "k", "1", "100", "k", "1", "100"],
        vec!["RL.MTAKE", "1", "k", "1", "100", "WITHSTATE", "WITHSTATE"],
        vec!["RL.SETSTATE", "k", "9223372036854775808", "1", "1"],
        vec!["RL.SETSTATE", "k", "0", "1", "1", "ADD", "0", "1", &far],
        vec!["RL.SETSTATE", "k", "0", "1", "1", "ADD", "99", "0", &far],
        vec!["RL.SETSTATE", "k", "0", "1", "1", "DROP", "1", "DROP", "2"],
        vec!["RL.SETSTATE", "k", "0", "1", "1", "ADD", "1"],
        vec!["RL.SETSTATE", "k", "0", "1", "1", "FOO"],
    ] {
        let r = cmd(&mut c, &bad);
        assert!(r.is_err(), "{bad:?} was accepted: {r:?}");
        let e = r.unwrap_err().to_string();
        assert!(!e.contains("internal error"), "{bad:?}: {e}");
        assert_eq!(digest(&mut c, "k"), before, "{bad:?} changed the key");
    }
    // Less than any effect: only the master's periodic PING (14 bytes) may have gone out.
    let sent = info_field(&mut c, "replication", "master_repl_offset") - offset;
    assert!(sent < 30, "refused calls sent {sent} bytes to the replica");
    assert_eq!(digest(&mut replica.conn(), "k"), before);
}

/// ACL: `%R~` users may RL.PEEK but not write; `+@ratelimit` (where it exists) and
/// `+@all -@dangerous` never reach RL.SETSTATE; key patterns apply to every RL.MTAKE key
/// (getkeys-api), options included.
#[test]
fn guard_acl_key_patterns_peek_and_setstate() {
    let s = Server::start(&[]);
    let mut admin = s.conn();
    assert_eq!(int(&mut admin, &["RL.TAKE", "a1", "0.001", "10", "1"]), 1);
    let mut ro = as_user(&s, "ro", "%R~* +@all");
    assert!(allowed(&mut ro, &["RL.PEEK", "a1"]));
    for w in [
        &["RL.TAKE", "a1", "1", "10"][..],
        &["RL.MTAKE", "1", "a1", "1", "10", "WITHSTATE"],
        &["RL.LEASE", "a1", "1", "10", "1", "100"],
    ] {
        assert!(
            !allowed(&mut ro, w),
            "{w:?} through a read-only key pattern"
        );
    }
    let mut a_only = as_user(&s, "aonly", "~a* +@all");
    assert!(allowed(
        &mut a_only,
        &[
            "RL.MTAKE",
            "1",
            "a1",
            "1",
            "10",
            "a2",
            "1",
            "10",
            "INIT",
            "1",
            "WITHSTATE"
        ]
    ));
    assert!(!allowed(
        &mut a_only,
        &[
            "RL.MTAKE",
            "1",
            "a1",
            "1",
            "10",
            "b1",
            "1",
            "10",
            "INIT",
            "1",
            "WITHSTATE"
        ]
    ));
    let exists: i64 = admin.exists("b1").unwrap();
    assert_eq!(exists, 0);
    let mut ops = as_user(&s, "ops", "~* +@all -@dangerous");
    assert!(
        !allowed(&mut ops, &["RL.SETSTATE", "z", "0", "1", "1"]) || {
            // Redis 7.0: no categories at all (see acl_read_only_user_cannot_write_buckets).
            let info: Value = redis::cmd("COMMAND")
                .arg("INFO")
                .arg("RL.TAKE")
                .query(&mut admin)
                .unwrap();
            !format!("{info:?}").contains("@write")
        }
    );
    let cats: Value = redis::cmd("COMMAND")
        .arg("INFO")
        .arg("RL.TAKE")
        .query(&mut admin)
        .unwrap();
    if format!("{cats:?}").contains("@ratelimit") {
        let mut rl = as_user(&s, "rl", "~* +@ratelimit");
        assert!(!allowed(&mut rl, &["RL.SETSTATE", "z", "0", "1", "1"]));
        assert!(allowed(&mut rl, &["RL.TAKE", "z", "1", "1"]));
    }
}

/// COMMAND GETKEYS for RL.MTAKE with options in every order, keys named like options, and
/// the most buckets.
#[test]
fn guard_mtake_getkeys_with_options() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let keys = |c: &mut Connection, args: &[&str]| -> redis::RedisResult<Vec<String>> {
        redis::cmd("COMMAND")
            .arg("GETKEYS")
            .arg("RL.MTAKE")
            .arg(args)
            .query(c)
    };
    assert_eq!(
        keys(
            &mut c,
            &["1", "a", "1", "1", "b", "2", "2", "INIT", "1", "WITHSTATE"]
        )
        .unwrap(),
        ["a", "b"]
    );
    assert_eq!(
        keys(&mut c, &["1", "a", "1", "1", "WITHSTATE", "INIT", "1"]).unwrap(),
        ["a"]
    );
    assert_eq!(
        keys(&mut c, &["1", "INIT", "1", "1", "WITHSTATE", "2", "2"]).unwrap(),
        ["INIT", "WITHSTATE"]
    );
    assert!(keys(&mut c, &["1", "a", "1", "1", "WITHSTATE", "WITHSTATE"]).is_err());
    let mut many = vec!["1".to_string()];
    for i in 0..64 {
        many.extend([format!("k{i}"), "1".into(), "1".into()]);
    }
    many.push("WITHSTATE".into());
    let refs: Vec<&str> = many.iter().map(String::as_str).collect();
    assert_eq!(keys(&mut c, &refs).unwrap().len(), 64);
    // The command agrees with GETKEYS: a key named INIT is a key.
    let v: Vec<Value> = redis::cmd("RL.MTAKE")
        .arg(&[
            "1",
            "INIT",
            "1",
            "1",
            "WITHSTATE",
            "2",
            "2",
            "INIT",
            "1",
            "WITHSTATE",
        ])
        .query(&mut c)
        .unwrap();
    assert_eq!(v.len(), 4);
    let e: i64 = c.exists(&["INIT", "WITHSTATE"]).unwrap();
    assert_eq!(e, 2);
}

/// RESP3: every reply has the documented type (doubles are doubles, PEEK a map, MTAKE's
/// denied_by a string), and errors stay errors.
#[test]
fn guard_resp3_replies() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let _: Value = redis::cmd("HELLO").arg(3).query(&mut c).unwrap();
    let v: Value = cmd(&mut c, &["RL.TAKE", "k", "1", "10", "2", "WITHSTATE"]).unwrap();
    let Value::Array(items) = v else {
        panic!("{v:?}")
    };
    assert!(matches!(items[0], Value::Int(2)), "{items:?}");
    assert!(
        matches!(items[1], Value::Double(d) if (7.9..=8.1).contains(&d)),
        "{items:?}"
    );
    let v: Value = cmd(&mut c, &["RL.PEEK", "k"]).unwrap();
    let Value::Map(m) = &v else {
        panic!("PEEK under RESP3: {v:?}")
    };
    // Six fields, then `version` (issue 17), last and an integer.
    assert_eq!(m.len(), 7);
    assert!(matches!(m[1].1, Value::Double(r) if r == 1.0), "{m:?}");
    assert!(
        matches!(&m[6], (Value::SimpleString(k), Value::Int(0)) if k == "version")
            || matches!(&m[6], (Value::BulkString(k), Value::Int(0)) if k == b"version"),
        "{m:?}"
    );
    let v: Value = cmd(
        &mut c,
        &["RL.MTAKE", "9", "k", "1", "10", "j", "1", "10", "WITHSTATE"],
    )
    .unwrap();
    let Value::Array(items) = v else { panic!() };
    assert!(
        matches!(&items[1], Value::BulkString(b) if b == b"k"),
        "{items:?}"
    );
    let Value::Array(rem) = &items[3] else {
        panic!("{items:?}")
    };
    assert!(rem.iter().all(|x| matches!(x, Value::Double(_))), "{rem:?}");
    let v: Value = cmd(&mut c, &["RL.PEEK", "nokey"]).unwrap();
    assert_eq!(v, Value::Nil);
    assert!(cmd(&mut c, &["RL.TAKE", "k", "1", "10", "11"]).is_err());
    let v: Value = cmd(&mut c, &["RL.LEASE", "k", "1", "10", "3", "1000"]).unwrap();
    assert!(matches!(&v, Value::Array(a) if a.len() == 4), "{v:?}");
}

/// loadmodule arguments: an empty value, a repeated name with conflicting values and a
/// trailing empty argument are refused or resolved without loading in a surprise mode.
#[test]
fn guard_loadmodule_odd_arguments() {
    for args in [&["mode", ""][..], &["mode", "shadow", ""], &["", "shadow"]] {
        if let Ok(s) = Server::try_start(args) {
            // Loaded: it must at least be in a mode someone asked for.
            let v: Vec<String> = redis::cmd("CONFIG")
                .arg("GET")
                .arg("rl.mode")
                .query(&mut s.conn())
                .unwrap();
            panic!("{args:?} loaded in mode {}", v[1]);
        }
    }
}
