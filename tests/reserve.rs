//! RL.RESERVE (wait instead of reject) and RL.REFUND (give tokens back); no token minted by
//! reservations, refunds into debt, or limits that alternate while keys expire.

mod support;

use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};
use support::*;

/// `RL.RESERVE key rate cap n max_wait_ms` → (granted, wait_ms, remaining, reset_after_ms).
fn reserve(
    c: &mut Connection,
    key: &str,
    rate: &str,
    cap: &str,
    n: u64,
    max_wait: u64,
) -> (i64, i64, f64, i64) {
    redis::cmd("RL.RESERVE")
        .arg(&[key, rate, cap])
        .arg(n)
        .arg(max_wait)
        .query(c)
        .unwrap()
}

fn refund(c: &mut Connection, key: &str, n: u64) -> f64 {
    redis::cmd("RL.REFUND").arg(key).arg(n).query(c).unwrap()
}

#[test]
fn reservations_queue_in_debt_and_other_commands_wait_behind() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    // 10 tokens at 1/s: the first 10 now, then 5 more 5 s later. What refilled meanwhile
    // is at most the server time that passed since `t0` (1 token/s, 1 ms of wait per ms).
    let t0 = server_ms(&mut c);
    assert_eq!(reserve(&mut c, "k", "1", "10", 10, 0).0, 10);
    let (g, wait, remaining, reset) = reserve(&mut c, "k", "1", "10", 5, 10_000);
    let t1 = server_ms(&mut c);
    let passed = t1 - t0 + 1;
    assert_eq!(g, 5);
    assert!(
        (5_000 - passed..=5_000).contains(&wait),
        "wait {wait}, {passed} ms"
    );
    assert!(
        (-5.0..=-5.0 + passed as f64 / 1000.0).contains(&remaining),
        "{remaining}, {passed} ms"
    );
    assert!(
        (15_000 - passed..=15_000).contains(&reset),
        "{reset}, {passed} ms"
    );
    // A later caller queues behind: its wait includes the debt (one token more, less the
    // time since the first reservation).
    let (g, wait2, _, _) = reserve(&mut c, "k", "1", "10", 1, 10_000);
    let passed = server_ms(&mut c) - t0 + 1;
    assert_eq!(g, 1);
    assert!(
        (wait + 1_000 - passed - 1..=wait + 1_000 + 1).contains(&wait2),
        "{wait2} after {wait}, {passed} ms"
    );
    // Nothing is granted while in debt (6 s at least); PEEK shows the negative level.
    assert_eq!(take(&mut c, "k", 1.0, 10.0, 1), 0);
    let lease: Vec<i64> = redis::cmd("RL.LEASE")
        .arg(&["k", "1", "10", "5", "1000"])
        .query(&mut c)
        .unwrap();
    let passed = server_ms(&mut c) - t0 + 1;
    assert_eq!(lease[0], 0);
    // Its retry points no earlier than the queued reservation's use.
    assert!(
        lease[3] + passed >= wait2,
        "{lease:?}, {wait2}, {passed} ms"
    );
    let peek: Vec<Value> = redis::cmd("RL.PEEK").arg("k").query(&mut c).unwrap();
    let tokens: f64 = redis::from_redis_value(&peek[1]).unwrap();
    let passed = server_ms(&mut c) - t0 + 1;
    assert!(
        (-6.0..=-6.0 + passed as f64 / 1000.0).contains(&tokens),
        "{tokens}, {passed} ms"
    );
    // A reservation whose wait would be too long is denied, writes nothing, and says the
    // wait it would have needed.
    let offset = info_field(&mut c, "replication", "master_repl_offset");
    let before = digest(&mut c, "k");
    let (g, need, _, _) = reserve(&mut c, "k", "1", "10", 5, 100);
    assert_eq!(g, 0);
    assert!(need > 1000, "{need}");
    assert_eq!(digest(&mut c, "k"), before);
    assert_eq!(
        info_field(&mut c, "replication", "master_repl_offset"),
        offset
    );
    // The debt never exceeds rate * max_wait.
    let (_, _, remaining, _) = reserve(&mut c, "d", "100", "1", 1, 0);
    assert_eq!(remaining, 0.0);
    let mut last = 0.0;
    for _ in 0..30 {
        let (g, _, remaining, _) = reserve(&mut c, "d", "100", "1", 1, 200);
        if g == 1 {
            last = remaining;
        }
    }
    assert!(last >= -20.0 - 1e-9, "debt {last} beyond rate * max_wait");
}

#[test]
fn refunds_credit_what_the_bucket_lacks_and_nothing_in_debt() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    assert_eq!(refund(&mut c, "none", 5), 0.0);
    let exists: i64 = redis::cmd("EXISTS").arg("none").query(&mut c).unwrap();
    assert_eq!(exists, 0, "a refund created a key");
    assert_eq!(take(&mut c, "k", 0.001, 10.0, 4), 4);
    let got = refund(&mut c, "k", 3);
    assert!((got - 3.0).abs() < 1e-9, "{got}");
    // Never above cap: about 1 lacking.
    let got = refund(&mut c, "k", 5);
    assert!((0.99..=1.0).contains(&got), "{got}");
    let exists: i64 = redis::cmd("EXISTS").arg("k").query(&mut c).unwrap();
    assert_eq!(exists, 0, "full again and nothing held: no key");
    // In debt, nothing is taken back: the coming tokens are promised to a waiting caller.
    // (0.1/s: 20 s in debt; the level read back is -2 plus what the server time that
    // passed refilled.)
    let t0 = server_ms(&mut c);
    assert_eq!(reserve(&mut c, "d", "0.1", "2", 2, 0).0, 2);
    assert_eq!(reserve(&mut c, "d", "0.1", "2", 2, 30_000).0, 2);
    let before = digest(&mut c, "d");
    assert_eq!(refund(&mut c, "d", 1), 0.0);
    assert_eq!(
        digest(&mut c, "d"),
        before,
        "a refund into debt changed the bucket"
    );
    let (_, remaining, _, _) = take_state(&mut c, "d", 0.1, 2.0, 1);
    let refilled = 0.1 * (server_ms(&mut c) - t0 + 1) as f64 / 1000.0;
    assert!(
        (-2.0 - 1e-9..=-2.0 + refilled).contains(&remaining),
        "{remaining}, refilled at most {refilled}"
    );
    // Wrong type, bad input: errors, nothing changed.
    let _: () = c.set("str", "x").unwrap();
    let e = redis::cmd("RL.REFUND")
        .arg(&["str", "1"])
        .query::<f64>(&mut c)
        .unwrap_err();
    assert_eq!(e.code(), Some("WRONGTYPE"));
    for bad in [&["d", "0"][..], &["d", "-1"], &["d", "x"]] {
        assert!(redis::cmd("RL.REFUND")
            .arg(bad)
            .query::<f64>(&mut c)
            .is_err());
    }
    for bad in [
        &["k", "1", "10", "11", "0"][..],
        &["k", "1", "10", "1", "86400001"],
        &["k", "1", "10", "1", "-1"],
        &["k", "1", "10", "1", "5", "INIT", "1", "INIT", "1"],
        &["k", "1", "10", "1", "5", "FOO"],
    ] {
        assert!(
            redis::cmd("RL.RESERVE")
                .arg(bad)
                .query::<Value>(&mut c)
                .is_err(),
            "{bad:?}"
        );
    }
}

#[test]
fn debt_survives_reload_aof_and_reaches_a_replica() {
    let mut s = Server::start(&["--appendonly", "yes", "--aof-use-rdb-preamble", "no"]);
    let replica = Server::start(&[]);
    replicate(&replica, &s);
    let mut c = s.conn();
    assert_eq!(reserve(&mut c, "k", "0.01", "5", 5, 0).0, 5);
    assert_eq!(reserve(&mut c, "k", "0.01", "5", 3, 600_000).0, 3);
    let _ = refund(&mut c, "k", 1);
    let before = digest(&mut c, "k");
    wait_synced(&s, &replica);
    assert_eq!(digest(&mut replica.conn(), "k"), before, "replica");
    // The promoted replica keeps the debt: a take there is denied.
    let mut r = replica.conn();
    let _: () = redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query(&mut r)
        .unwrap();
    assert_eq!(take(&mut r, "k", 0.01, 5.0, 1), 0);
    let _: () = redis::cmd("DEBUG").arg("RELOAD").query(&mut c).unwrap();
    assert_eq!(digest(&mut c, "k"), before, "DEBUG RELOAD");
    let mut c = s.rewrite_aof_and_restart(c);
    assert_eq!(digest(&mut c, "k"), before, "AOF rewrite + restart");
}

/// 32 clients each reserve a token and use it after sleeping the wait they were told: in
/// any window of length t the uses are at most cap + rate * t (+1 for rounding).
///
/// A use's moment is the one the server promised: its time at the grant plus the wait.
/// The grant ran between the call's send and its reply, so each use is known to lie in
/// `[sent + wait, replied + wait]`; a set of uses must fit cap + rate * (the widest span
/// those intervals allow) + 1. (When a client thread actually wakes is up to the machine's
/// scheduler: a busy machine wakes several late at once.)
#[test]
fn thirty_two_waiting_clients_stay_within_the_rate() {
    let s = Server::start(&[]);
    let (rate, cap) = (100.0, 20.0);
    let uses: Arc<Mutex<Vec<(Instant, Instant)>>> = Arc::default();
    let clients = 32;
    let ready = Arc::new(Barrier::new(clients));
    let threads: Vec<_> = (0..clients)
        .map(|_| {
            let url = s.url();
            let (uses, ready) = (uses.clone(), ready.clone());
            std::thread::spawn(move || {
                let mut c = redis::Client::open(url).unwrap().get_connection().unwrap();
                // All connected before the 2 s start.
                ready.wait();
                let start = Instant::now();
                while start.elapsed() < Duration::from_secs(2) {
                    let sent = Instant::now();
                    let (g, wait, _, _) = reserve(&mut c, "q", "100", "20", 1, 500);
                    let replied = Instant::now();
                    if g == 1 {
                        let wait = Duration::from_millis(wait as u64);
                        uses.lock().unwrap().push((sent + wait, replied + wait));
                        std::thread::sleep(wait);
                    } else {
                        std::thread::sleep(Duration::from_millis(20));
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let mut uses = uses.lock().unwrap().clone();
    uses.sort();
    assert!(uses.len() > 150, "only {} uses", uses.len());
    let mut worst = f64::MIN;
    for i in 0..uses.len() {
        let mut latest = uses[i].1;
        for j in i..uses.len() {
            latest = latest.max(uses[j].1);
            let t = (latest - uses[i].0).as_secs_f64();
            let over = (j - i + 1) as f64 - (cap + rate * t + 1.0);
            worst = worst.max(over);
        }
    }
    assert!(
        worst <= 0.0,
        "a window saw {worst} uses over cap + rate * t + 1"
    );
}

/// No token minted by a refund into debt: reservations already told when to use their
/// tokens keep those instants, so a refund into a bucket in debt must not let a later
/// reservation be promised the same instant (rate 1/s, cap 10: A takes 10, B reserves 10
/// and waits 10 s, A refunds 10, C reserves 10: B and C must not both use 10 tokens at
/// t0 + 10 s).
#[test]
fn a_refund_into_debt_lets_no_later_reservation_reuse_the_queued_instants() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let t0 = now_ns();
    assert_eq!(take(&mut c, "k", 1.0, 10.0, 10), 10);
    let b: (i64, i64, f64, i64) = query(&mut c, &["RL.RESERVE", "k", "1", "10", "10", "20000"]);
    let tb = now_ns() - t0;
    assert_eq!(b.0, 10, "{b:?}");
    let credited: f64 = query(&mut c, &["RL.REFUND", "k", "10"]);
    let cres: (i64, i64, f64, i64) = query(&mut c, &["RL.RESERVE", "k", "1", "10", "10", "20000"]);
    let tc = now_ns() - t0;
    if cres.0 == 0 {
        return;
    }
    // Use instants in ms since t0 (the call's end bounds its start).
    let use_b = tb as f64 / 1e6 + b.1 as f64;
    let use_c = tc as f64 / 1e6 + cres.1 as f64;
    let window_s = (use_c - use_b).abs() / 1000.0;
    let used = 20.0;
    assert!(
        used <= 10.0 + 1.0 * window_s + 1.0,
        "refund of {credited} into debt: B uses 10 at +{use_b:.0} ms, C uses 10 at          +{use_c:.0} ms: {used} tokens within {window_s:.3} s, bound {}",
        10.0 + window_s + 1.0
    );
}

/// No token minted in the core the commands call: random TAKE / RESERVE under three
/// alternating limits (refunds left out: a refund after the key expired credits tokens the
/// refill already gave back), with the key dropped whenever Redis would have expired it
/// between calls. Every use (a take at once, a reservation after its wait) is recorded; in
/// every window the uses stay within the largest cap + the largest rate × the window + 1.
#[test]
fn core_take_reserve_three_limits_and_expiry_mint_nothing() {
    use rl_core::{Bucket, Level, Limit};
    const S: u64 = 1_000_000_000;
    let limits = [
        Limit::new(1.0, 20.0).unwrap(),
        Limit::new(50.0, 5.0).unwrap(),
        Limit::new(4.0, 12.0).unwrap(),
    ];
    let (max_cap, max_rate) = (20.0, 50.0);
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut rnd = move |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    for round in 0..300 {
        let mut now = 1_700_000_000 * S;
        let mut stored: Option<Bucket> = None;
        let mut uses: Vec<(u64, f64)> = Vec::new();
        // Tokens taken at once and not used yet: what may be refunded.
        let mut unused: f64 = 0.0;
        for _ in 0..60 {
            now += match rnd(4) {
                0 => 0,
                1 => rnd(1_000_000),
                2 => rnd(S),
                _ => rnd(30 * S),
            };
            if let Some(b) = stored {
                if rl_core::ceil_millis(b.expires_at()) * 1_000_000 <= now {
                    stored = None;
                }
            }
            let limit = limits[rnd(3) as usize];
            let mut level = Level::new(stored.as_ref(), limit, now);
            let write = match rnd(2) {
                0 => {
                    let n = 1 + rnd(limit.cap() as u64);
                    let ok = level.try_take(n as f64);
                    if ok {
                        uses.push((now, n as f64));
                    }
                    ok
                }
                1 => {
                    let n = 1 + rnd(limit.cap() as u64);
                    match level.reserve(n as f64, rnd(20 * S)) {
                        Some((true, wait)) => {
                            uses.push((now + wait, n as f64));
                            true
                        }
                        _ => false,
                    }
                }
                _ => {
                    // Refunds into debt mint (see rule5_refund_into_debt_...): this guard
                    // refunds only into a bucket that is not in debt.
                    let in_debt = stored.is_some_and(|b| {
                        Level::new(Some(&b), b.limit(), now).signed_tokens() < 0.0
                    });
                    match stored {
                        Some(b) if unused >= 1.0 && !in_debt => {
                            // RL.REFUND: under the stored limit.
                            level = Level::new(Some(&b), b.limit(), now);
                            let n = 1 + rnd(unused as u64);
                            let credited = level.refund(n);
                            unused -= n as f64;
                            credited > 0.0
                        }
                        _ => false,
                    }
                }
            };
            if write {
                stored = Some(level.bucket());
            }
            if std::env::var("A2_TRACE").is_ok_and(|r| r == round.to_string()) {
                eprintln!(
                    "t={} lim=({}, {}) write={write} signed={} stored={:?} unused={unused} last_use={:?}",
                    (now - 1_700_000_000 * S) as f64 / S as f64,
                    limit.rate(),
                    limit.cap(),
                    level.signed_tokens(),
                    stored,
                    uses.last()
                );
            }
        }
        // Tokens held back and never refunded count as used at the end.
        uses.sort_by_key(|u| u.0);
        for i in 0..uses.len() {
            let mut sum = 0.0;
            for j in i..uses.len() {
                sum += uses[j].1;
                let t = (uses[j].0 - uses[i].0) as f64 / S as f64;
                assert!(
                    sum <= max_cap + max_rate * t + 1.0 + unused,
                    "round {round}: {sum} used in {t} s: {uses:?}"
                );
            }
        }
    }
}
