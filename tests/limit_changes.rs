//! Changing a limit (docs/commands.md, "Changing a limit"): tokens carry over clamped and
//! rounded down, a key is kept while an old limit could still see it, and no sequence of
//! rate and cap changes, at any scale, lets out more than the documented bound.

mod support;
use std::time::{Duration, Instant};

use support::*;

/// Cap alternating by one token at 1e15 (two app versions, say) mints nothing: what is
/// let out stays within `cap + rate * elapsed` of the smaller cap.
#[test]
fn alternating_caps_at_1e15_mint_nothing() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let start = std::time::Instant::now();
    // Start empty, so every grant is refill.
    let _: i64 = redis::cmd("RL.TAKE")
        .arg(&["k", "320000", "1e15", "1", "INIT", "0"])
        .query(&mut c)
        .unwrap();
    let mut out = 0i64;
    for round in 0..40 {
        let mut pipe = redis::pipe();
        for i in 0..1000 {
            let cap = if (round * 1000 + i) % 2 == 0 {
                "999999999999999"
            } else {
                "1e15"
            };
            pipe.cmd("RL.TAKE").arg(&["k", "320000", cap, "100"]);
        }
        let got: Vec<i64> = pipe.query(&mut c).unwrap();
        out += got.iter().sum::<i64>();
    }
    let elapsed = start.elapsed().as_secs_f64();
    let bound = 320_000.0 * elapsed;
    assert!(
        (out as f64) <= bound,
        "let out {out} in {elapsed:.3} s: more than {bound}"
    );
    // Counted on every write that changed the stored limit (denials write nothing).
    let changes = info_field(&mut c, "rl", "rl_limit_changes");
    assert!(
        (1..=40_000).contains(&changes),
        "rl_limit_changes {changes}"
    );
}

/// The rule for a key used with two limits: tokens carry over, clamped to the new cap; a
/// bucket written under a new limit keeps its key until it would have been full under the
/// old one, so a caller back on the old limit finds the tokens, not a fresh full bucket.
/// Counted in rl_limit_changes.
#[test]
fn a_flapping_limit_follows_the_documented_rule() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let remaining = |c: &mut Connection, rate: &str, cap: &str| -> f64 {
        let v: (i64, f64, i64, i64) = redis::cmd("RL.TAKE")
            .arg(&["k", rate, cap, "1", "WITHSTATE"])
            .query(c)
            .unwrap();
        v.1
    };
    let _: i64 = redis::cmd("RL.TAKE")
        .arg(&["k", "1", "1000", "990"])
        .query(&mut c)
        .unwrap();
    let before = info_field(&mut c, "rl", "rl_limit_changes");
    // Under (10, 10) the 10 tokens fill the bucket: one is taken, and 100 ms refill it.
    let write = server_ms(&mut c);
    let r = remaining(&mut c, "10", "10");
    let write = (write, server_ms(&mut c));
    assert!((8.9..=9.1).contains(&r), "{r}");
    assert_eq!(info_field(&mut c, "rl", "rl_limit_changes"), before + 1);
    std::thread::sleep(Duration::from_millis(250));
    // Full under (10, 10), but the key stays until idle as long as (1, 1000) takes to
    // fill: 1000 s (less the 9 tokens it held at that write).
    let exists: i64 = redis::cmd("EXISTS").arg("k").query(&mut c).unwrap();
    assert_eq!(
        exists, 1,
        "the key went before the old limit's bucket was full"
    );
    assert_expires_in(&mut c, "k", write, 990_000..=1_000_000);
    // Back to (1, 1000): the 10 tokens, less the one taken now.
    let r = remaining(&mut c, "1", "1000");
    assert!((8.9..=9.1).contains(&r), "{r}");
    let at: i64 = redis::cmd("PEXPIRETIME").arg("k").query(&mut c).unwrap();
    // The hold survives a reload and reaches a replica.
    let replica = Server::start(&[]);
    replicate(&replica, &s);
    wait_synced(&s, &replica);
    assert_eq!(digest(&mut replica.conn(), "k"), digest(&mut c, "k"));
    let _: () = redis::cmd("DEBUG").arg("RELOAD").query(&mut c).unwrap();
    let reloaded: i64 = redis::cmd("PEXPIRETIME").arg("k").query(&mut c).unwrap();
    assert_eq!(reloaded, at, "the reload moved the expiry");
}

fn int(c: &mut Connection, args: &[&str]) -> i64 {
    query(c, args)
}

/// No token minted by limit changes (let-out within the largest cap + the largest rate *
/// elapsed). Two callers disagree on a key's limit (or a rollout is rolled back): a caller
/// with a small cap makes one grant, which stores the bucket under the small cap, full
/// again under that cap within `small_cap / rate`. The key must not expire then: the next
/// caller with the large cap would find no key, a full large bucket, and the deficit it had
/// dug would be forgotten. The key is held for the old limit's fill time instead:
///   RL.TAKE f 1 1000 999     -> 999   (1 token left under (1, 1000))
///   RL.TAKE f 1000 10 1      -> 1     (stored under (1000, 10): 0 of 10, full in 10 ms)
///   (sleep 30 ms: the key stays)
///   RL.TAKE f 1 1000 1000    -> 0     (the deficit is still there)
#[test]
fn a_cap_flap_through_key_expiry_lets_out_at_most_the_documented_bound() {
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

/// Without expiry in the way: a key used with rates alternating between 1e-9-ish
/// and 1e15-ish extremes and caps alternating too, drained so it never expires, lets out no
/// more than the largest cap + the largest rate * elapsed, measured on the wall clock.
#[test]
fn rate_and_cap_flapping_at_extremes_mints_nothing_while_the_key_lives() {
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
