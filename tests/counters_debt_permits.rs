//! RL.RESERVE / RL.REFUND, the semaphore, counters and CONFIG RESETSTAT against a hostile
//! client: each `rule…` test is a defect a review found (it failed before its fix), each
//! `guard_…` test an attack that held.

mod support;

use support::*;

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

// ===================================================================================
// Defects
// ===================================================================================

/// Rule 2 (and 1): a command fails with no change at all, or succeeds.
///
/// The per-namespace `tokens_granted` counter is a `u64` added with `+=`
/// (`rl_core::namespace::Counts::record`). After 18,446 grants of 1e15 tokens in one
/// namespace (legal: cap 1e15, n 1e15, one fresh key each, or one key with RL.RESERVE in
/// debt at rate 1e15) the next grant overflows it. In a build with overflow checks it
/// panics AFTER the bucket was written and its effect queued for replicas: the client is
/// told `ERR internal error in redis-rl; the call changed nothing`, yet the key exists and
/// the replica gets it. In a release build it wraps and RL.STATS shows a tiny total.
///
/// Reproduction: 18,446 × `RL.TAKE big:<i> 1e15 1e15 1000000000000000`, then
/// `RL.TAKE big:x 1e15 1e15 1000000000000000` → ERR ... changed nothing; `EXISTS big:x` → 1.
#[test]
fn rule2_namespace_token_counter_overflow_errors_after_writing() {
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

/// RESP: RL.STATS replies every counter as a signed integer (`v as i64`), so a counter
/// past i64::MAX is shown negative. `tokens_granted` gets there after 9,224 grants of 1e15
/// tokens in one namespace (INFO rl, which uses unsigned fields, shows the right value).
///
/// Reproduction: 9,224 × `RL.TAKE neg:<i> 1e15 1e15 1000000000000000`; `RL.STATS neg` →
/// `tokens_granted -9222744073709551616`.
#[test]
fn stats_counters_past_i64_max_are_replied_negative() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    grant_1e15_tokens(&mut c, "neg", 0, 9_224);
    let shown = stats_field(&mut c, "neg", "tokens_granted");
    assert!(
        shown >= 0,
        "RL.STATS neg shows tokens_granted {shown} after 9,224 grants of 1e15 tokens"
    );
}

/// CONFIG RESETSTAT must reset the module's counters as it does Redis's own.
///
/// `src/observe/resetstat.rs` decides a reset happened when `total_commands_processed` is below
/// what it was when the filter saw the command. It checks lazily (next module command or
/// INFO), so if more commands run after the reset than had run before it, the drop is no
/// longer visible and the reset is lost: the module's counters keep their old values.
///
/// Reproduction: fresh server; `RL.TAKE a:1 1 10 3`; `CONFIG RESETSTAT`; 50 × `PING`;
/// `INFO rl` → `rl_calls:1` (Redis's own counters were reset).
#[test]
fn resetstat_is_lost_when_more_commands_follow_it_than_preceded_it() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    assert_eq!(take(&mut c, "a:1", 1.0, 10.0, 3), 3);
    let _: () = query(&mut c, &["CONFIG", "RESETSTAT"]);
    let before = info_field(&mut c, "stats", "total_commands_processed");
    assert!(before < 10, "Redis reset its own counters: {before}");
    for _ in 0..200 {
        let _: String = query(&mut c, &["PING"]);
    }
    assert_eq!(
        info_field(&mut c, "rl", "rl_calls"),
        0,
        "CONFIG RESETSTAT did not reset rl_calls"
    );
    let ns: Value = query(&mut c, &["RL.STATS", "a"]);
    assert_eq!(
        ns,
        Value::Nil,
        "CONFIG RESETSTAT did not reset the namespaces"
    );
}

/// Rule 3: the states a command can create are exactly the states RDB load accepts.
///
/// `rl-permit`'s `rdb_load` accepts a table with no permit at all (`count 0`), which no
/// command leaves (the last release deletes the key). Such a key never expires, and its
/// AOF rewrite (`RL.SETPERMITS key LASTID id`, then `PERSIST`) creates nothing: after
/// BGREWRITEAOF and a restart the key is gone, so the AOF no longer reproduces the data.
///
/// Reproduction: `RESTORE p 0 <07 + rl-permit module id + 02 05 02 00 00 + version + crc>`
/// → OK; `TYPE p` → rl-permit; BGREWRITEAOF; restart → `EXISTS p` = 0.
#[test]
fn rule3_restore_accepts_an_empty_permit_table_that_aof_cannot_rebuild() {
    let mut s = Server::start(&["--appendonly", "yes", "--aof-use-rdb-preamble", "no"]);
    let mut c = s.conn();
    let _: Vec<i64> = query(&mut c, &["RL.ACQUIRE", "real", "5", "600000"]);
    let payload = dump(&mut c, "real");
    // Type byte (module type 2), 0x81 + 8-byte module id: the first 10 bytes.
    let mut body = dump_body(&payload)[..10].to_vec();
    // last_id 5, count 0, EOF.
    body.extend_from_slice(&[0x02, 0x05, 0x02, 0x00, 0x00]);
    let forged = reseal(&payload, &body);
    let reply = redis::cmd("RESTORE")
        .arg("p")
        .arg(0)
        .arg(forged)
        .query::<Value>(&mut c);
    if reply.is_err() {
        return; // refused: what the rule asks
    }
    let kind: String = query(&mut c, &["TYPE", "p"]);
    let ttl: i64 = query(&mut c, &["PTTL", "p"]);
    let all = dataset_digest(&mut c);
    rewrite_aof(&mut c);
    drop(c);
    s.restart();
    let mut c = s.conn();
    let exists: i64 = query(&mut c, &["EXISTS", "p"]);
    assert_eq!(
        dataset_digest(&mut c),
        all,
        "RESTORE accepted an empty permit table ({kind}, PTTL {ttl}) that no command \
         creates; after AOF rewrite + restart EXISTS p = {exists}"
    );
}

/// Rule 5: tokens are never minted (reservations: uses after their waits within
/// cap + rate*t + 1 in every window, refunds mixed in).
///
/// RL.REFUND into a bucket in debt "pays the debt first": it moves the bucket's full
/// instant back. But the reservations that made the debt were already told when to use
/// their tokens, and those instants do not move. The refunded tokens (present now, owed to
/// no one who can use them now) become future tokens a new caller is granted at the same
/// instants the earlier reservations use theirs.
///
/// Reproduction (rate 1/s, cap 10): `RL.TAKE k 1 10 10` (A holds 10, unused);
/// `RL.RESERVE k 1 10 10 20000` → B waits 10 s; `RL.REFUND k 10` (A gives them back) →
/// 10; `RL.RESERVE k 1 10 10 20000` → C waits 10 s. B and C each use 10 tokens at
/// t0 + 10 s: 20 tokens in one instant from a bucket of cap 10.
#[test]
fn rule5_refund_into_debt_lets_a_later_reservation_reuse_the_queued_instants() {
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

// ===================================================================================
// Guards: attacks that held
// ===================================================================================

/// Rule 5 in the core the commands call: random TAKE / RESERVE under three alternating
/// limits (refunds are left out: a refund into debt mints, see the rule5 test above, and
/// a refund after the key expired credits tokens the refill already gave back), with the key dropped whenever Redis
/// would have expired it between calls. Every use (a take at once, a reservation after
/// its wait) is recorded; in every window the uses stay within the largest cap + the
/// largest rate × the window + 1.
#[test]
fn guard_core_take_reserve_three_limits_and_expiry_mint_nothing() {
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
