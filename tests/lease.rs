//! RL.LEASE / RL.RETURN semantics against a real server: grants, returns, expiry, the bound,
//! persistence, replication, copies, INFO counters, bad input and concurrent holders.

mod support;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};
use support::*;

/// A rate so slow that nothing measurable refills while a test runs (0.001 tokens/s).
const SLOW: f64 = 0.001;

/// `RL.LEASE key rate cap n ttl_ms [extra...]` → (granted, lease_id, ttl_ms, retry_after_ms).
fn lease(
    c: &mut Connection,
    key: &str,
    rate: f64,
    cap: f64,
    n: u64,
    ttl_ms: u64,
    extra: &[&str],
) -> (i64, i64, i64, i64) {
    let v: Vec<i64> = redis::cmd("RL.LEASE")
        .arg(key)
        .arg(rate)
        .arg(cap)
        .arg(n)
        .arg(ttl_ms)
        .arg(extra)
        .query(c)
        .unwrap();
    assert_eq!(v.len(), 4, "reply {v:?}");
    (v[0], v[1], v[2], v[3])
}

/// `RL.RETURN key lease_id unused` → tokens credited.
fn give_back(c: &mut Connection, key: &str, id: i64, unused: u64) -> i64 {
    redis::cmd("RL.RETURN")
        .arg(key)
        .arg(id)
        .arg(unused)
        .query(c)
        .unwrap()
}

fn assert_near(actual: f64, expected: f64, what: &str) {
    assert!(
        (actual - expected).abs() < 0.05,
        "{what}: {actual}, expected {expected}"
    );
}

fn exists(c: &mut Connection, key: &str) -> bool {
    let n: i64 = c.exists(key).unwrap();
    n == 1
}

#[test]
fn partial_grants_and_min() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let (granted, id, ttl, retry) = lease(&mut c, "k", SLOW, 10.0, 8, 60_000, &[]);
    assert_eq!((granted, ttl, retry), (8, 60_000, 0));
    assert!(id > 0, "lease id {id}");
    // 2 left: asking for 5 with MIN 3 grants nothing and says how long until 3 are there
    // (1 more token at 0.001/s: 1000 s).
    let (granted, id0, ttl0, retry) = lease(&mut c, "k", SLOW, 10.0, 5, 60_000, &["MIN", "3"]);
    assert_eq!((granted, id0, ttl0), (0, 0, 0));
    assert!((990_000..=1_000_000).contains(&retry), "retry {retry}");
    assert_near(
        peek_tokens(&mut c, "k").unwrap(),
        2.0,
        "a denial debits nothing",
    );
    // MIN 2 takes the 2 that are there.
    let (granted, id2, _, retry) = lease(&mut c, "k", SLOW, 10.0, 5, 60_000, &["MIN", "2"]);
    assert_eq!((granted, retry), (2, 0));
    assert!(id2 > id, "ids grow: {id} then {id2}");
    // Empty: the default MIN 1 is not met.
    let (granted, id3, _, retry) = lease(&mut c, "k", SLOW, 10.0, 5, 60_000, &[]);
    assert_eq!((granted, id3), (0, 0));
    assert!(retry > 0, "retry {retry}");
    // n above cap is fine (only MIN must fit): the grant is what is there.
    let (granted, _, _, _) = lease(&mut c, "other", SLOW, 10.0, 50, 60_000, &[]);
    assert_eq!(granted, 10);
}

#[test]
fn return_credits_at_most_the_lease() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let (_, a, _, _) = lease(&mut c, "k", SLOW, 10.0, 5, 60_000, &[]);
    let (_, b, _, _) = lease(&mut c, "k", SLOW, 10.0, 4, 60_000, &[]);
    assert_ne!(a, b);
    assert_near(peek_tokens(&mut c, "k").unwrap(), 1.0, "after two leases");
    assert_eq!(give_back(&mut c, "k", a, 3), 3);
    assert_near(peek_tokens(&mut c, "k").unwrap(), 4.0, "after returning 3");
    // More than the lease holds: only its 4 come back.
    assert_eq!(give_back(&mut c, "k", b, 100), 4);
    assert_near(
        peek_tokens(&mut c, "k").unwrap(),
        8.0,
        "after returning lease b",
    );
    // Unknown ids credit nothing.
    assert_eq!(give_back(&mut c, "k", 12345, 5), 0);
    assert_eq!(give_back(&mut c, "nokey", a, 5), 0);
    assert!(!exists(&mut c, "nokey"), "a return to no key creates none");
}

#[test]
fn return_clamps_the_bucket_to_cap() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    // 100 tokens/s: the 5 leased are refilled after 50 ms.
    let (granted, id, _, _) = lease(&mut c, "k", 100.0, 10.0, 5, 60_000, &[]);
    assert_eq!(granted, 5);
    std::thread::sleep(Duration::from_millis(300));
    give_back(&mut c, "k", id, 5);
    // Clamped, the bucket holds 10, not 15: taking 10 leaves nothing.
    let (granted, remaining, _, _) = take_state(&mut c, "k", 100.0, 10.0, 10);
    assert_eq!(granted, 10);
    assert!(
        remaining < 1.0,
        "bucket went above cap: {remaining} left after taking 10"
    );
}

#[test]
fn double_return_credits_once() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let (_, id, _, _) = lease(&mut c, "k", SLOW, 10.0, 6, 60_000, &[]);
    let _ = lease(&mut c, "k", SLOW, 10.0, 1, 60_000, &[]); // keeps the key leased
    assert_eq!(give_back(&mut c, "k", id, 6), 6);
    let before = digest(&mut c, "k");
    let changes = info_field(&mut c, "persistence", "rdb_changes_since_last_save");
    assert_eq!(give_back(&mut c, "k", id, 6), 0);
    assert_eq!(give_back(&mut c, "k", id, 1), 0);
    assert_eq!(
        digest(&mut c, "k"),
        before,
        "a second return changed the bucket"
    );
    assert_eq!(
        info_field(&mut c, "persistence", "rdb_changes_since_last_save"),
        changes
    );
    assert_near(
        peek_tokens(&mut c, "k").unwrap(),
        9.0,
        "tokens after one return",
    );
}

#[test]
fn return_after_expiry_credits_nothing() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let (_, id, _, _) = lease(&mut c, "k", SLOW, 10.0, 6, 100, &[]);
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        exists(&mut c, "k"),
        "the bucket is not full yet: the key must stay"
    );
    assert_eq!(give_back(&mut c, "k", id, 6), 0);
    assert_near(
        peek_tokens(&mut c, "k").unwrap(),
        4.0,
        "an expired lease's tokens stay spent",
    );
    // Also through a renewal: RETURN of an expired lease credits nothing, the grant stands.
    let (granted, _, _, _) = lease(
        &mut c,
        "k",
        SLOW,
        10.0,
        4,
        60_000,
        &["RETURN", &id.to_string(), "6"],
    );
    assert_eq!(granted, 4);
    assert_near(peek_tokens(&mut c, "k").unwrap(), 0.0, "after the renewal");
}

#[test]
fn renewal_with_return_settles_first() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let (granted, a, _, _) = lease(&mut c, "k", SLOW, 10.0, 10, 60_000, &[]);
    assert_eq!(granted, 10);
    // The bucket is empty: only the 4 returned in the same call make the new grant possible.
    let (granted, b, ttl, retry) = lease(
        &mut c,
        "k",
        SLOW,
        10.0,
        6,
        30_000,
        &["RETURN", &a.to_string(), "4"],
    );
    assert_eq!((granted, ttl, retry), (4, 30_000, 0));
    assert!(b > a, "new id {b} after {a}");
    assert_eq!(
        give_back(&mut c, "k", a, 4),
        0,
        "the renewed lease is closed"
    );
    assert_eq!(info_field(&mut c, "rl", "rl_returns"), 1);
    assert_eq!(info_field(&mut c, "rl", "rl_tokens_returned"), 4);
    // A renewal that is denied still settles the old lease.
    let (granted, c_id, _, _) = lease(
        &mut c,
        "k",
        SLOW,
        10.0,
        5,
        30_000,
        &["MIN", "5", "RETURN", &b.to_string(), "3"],
    );
    assert_eq!((granted, c_id), (0, 0));
    assert_near(
        peek_tokens(&mut c, "k").unwrap(),
        3.0,
        "credit of a denied renewal",
    );
    assert_eq!(give_back(&mut c, "k", b, 3), 0);
}

#[test]
fn take_and_lease_share_a_key() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    assert_eq!(take(&mut c, "k", SLOW, 10.0, 3), 3);
    let (granted, id, _, _) = lease(&mut c, "k", SLOW, 10.0, 10, 60_000, &[]);
    assert_eq!(granted, 7, "the lease gets what the take left");
    assert_eq!(take(&mut c, "k", SLOW, 10.0, 1), 0);
    assert_eq!(give_back(&mut c, "k", id, 4), 4);
    assert_eq!(
        take(&mut c, "k", SLOW, 10.0, 4),
        4,
        "returned tokens are takeable"
    );
    assert_eq!(take(&mut c, "k", SLOW, 10.0, 1), 0);
    // A take on a leased key keeps its leases.
    let (_, id2, _, _) = lease(&mut c, "k2", SLOW, 10.0, 2, 60_000, &[]);
    assert_eq!(take(&mut c, "k2", SLOW, 10.0, 1), 1);
    assert_eq!(give_back(&mut c, "k2", id2, 2), 2);
}

#[test]
fn leases_survive_debug_reload() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let (_, a, _, _) = lease(&mut c, "k", SLOW, 10.0, 3, 600_000, &[]);
    let (_, b, _, _) = lease(&mut c, "k", SLOW, 10.0, 2, 600_000, &[]);
    let before = digest(&mut c, "k");
    let _: String = redis::cmd("DEBUG").arg("RELOAD").query(&mut c).unwrap();
    assert_eq!(digest(&mut c, "k"), before);
    assert_eq!(give_back(&mut c, "k", a, 3), 3);
    assert_eq!(give_back(&mut c, "k", b, 1), 1);
    assert_near(
        peek_tokens(&mut c, "k").unwrap(),
        9.0,
        "after reload and returns",
    );
}

/// Leases, a take and a return, rewritten into the AOF (as commands, or as an RDB preamble),
/// then more writes in the incremental AOF; a restart must rebuild the same bytes.
fn aof_round_trip(preamble: &str) {
    let mut s = Server::start(&["--appendonly", "yes", "--aof-use-rdb-preamble", preamble]);
    let mut c = s.conn();
    let (_, a, _, _) = lease(&mut c, "k", SLOW, 10.0, 3, 600_000, &[]);
    let (_, b, _, _) = lease(&mut c, "k", SLOW, 10.0, 2, 600_000, &[]);
    assert_eq!(take(&mut c, "k", SLOW, 10.0, 1), 1);
    let (_, x, _, _) = lease(&mut c, "other", SLOW, 10.0, 4, 600_000, &[]);
    rewrite_aof(&mut c);
    // After the rewrite: written to the incremental file.
    let (_, d, _, _) = lease(&mut c, "k", SLOW, 10.0, 1, 600_000, &[]);
    assert_eq!(give_back(&mut c, "other", x, 1), 1);
    let (dk, dother) = (digest(&mut c, "k"), digest(&mut c, "other"));
    let pttl_before: i64 = redis::cmd("PTTL").arg("k").query(&mut c).unwrap();
    drop(c);
    s.restart();
    let mut c = s.conn();
    assert_eq!(digest(&mut c, "k"), dk, "key k after restart");
    assert_eq!(digest(&mut c, "other"), dother, "key other after restart");
    let pttl: i64 = redis::cmd("PTTL").arg("k").query(&mut c).unwrap();
    assert!(
        pttl > 0 && pttl <= pttl_before,
        "pttl {pttl} (was {pttl_before})"
    );
    assert_eq!(give_back(&mut c, "k", a, 3), 3);
    assert_eq!(give_back(&mut c, "k", b, 2), 2);
    assert_eq!(give_back(&mut c, "k", d, 1), 1);
    assert_eq!(
        give_back(&mut c, "other", x, 1),
        0,
        "closed before the restart"
    );
    assert_near(
        peek_tokens(&mut c, "k").unwrap(),
        9.0,
        "after restart and returns",
    );
}

#[test]
fn leases_survive_aof_rewrite_and_restart() {
    aof_round_trip("no");
}

#[test]
fn leases_survive_aof_restart_with_rdb_preamble() {
    aof_round_trip("yes");
}

/// The last id handed out is part of the state (it is in the digest and in the RDB); an AOF
/// rewrite must keep it when the newest lease was already returned.
#[test]
fn aof_rewrite_keeps_last_id_after_a_return() {
    let mut s = Server::start(&["--appendonly", "yes", "--aof-use-rdb-preamble", "no"]);
    let mut c = s.conn();
    let (_, a, _, _) = lease(&mut c, "k", SLOW, 10.0, 3, 600_000, &[]);
    let (_, b, _, _) = lease(&mut c, "k", SLOW, 10.0, 2, 600_000, &[]);
    assert_eq!(give_back(&mut c, "k", b, 2), 2);
    rewrite_aof(&mut c);
    let before = digest(&mut c, "k");
    drop(c);
    s.restart();
    let mut c = s.conn();
    assert_eq!(
        digest(&mut c, "k"),
        before,
        "AOF rewrite + restart changed the bucket's state"
    );
    assert_eq!(give_back(&mut c, "k", a, 3), 3);
}

#[test]
fn leases_replicate_as_effects() {
    let master = Server::start(&[]);
    let replica = Server::start(&[]);
    let mut m = master.conn();
    // Before the link: reaches the replica by full sync (RDB).
    let (_, a, _, _) = lease(&mut m, "k", SLOW, 10.0, 3, 600_000, &[]);
    replicate(&replica, &master);
    // After: reaches it as effects.
    let (_, b, _, _) = lease(&mut m, "k", SLOW, 10.0, 2, 600_000, &[]);
    assert_eq!(give_back(&mut m, "k", a, 1), 1);
    assert_eq!(take(&mut m, "k", SLOW, 10.0, 1), 1);
    let (_, c_id, _, _) = lease(
        &mut m,
        "k",
        SLOW,
        10.0,
        2,
        600_000,
        &["RETURN", &b.to_string(), "2"],
    );
    let (_, short, _, _) = lease(&mut m, "k", SLOW, 10.0, 1, 50, &[]);
    std::thread::sleep(Duration::from_millis(150));
    // Prunes the expired one on both sides.
    let (_, d, _, _) = lease(&mut m, "k", SLOW, 10.0, 1, 600_000, &[]);
    // A key whose last lease is returned while full goes away on both sides.
    let (_, gone, _, _) = lease(&mut m, "gone", 1.0, 10.0, 5, 600_000, &[]);
    // At 1/s the bucket refills a little of the 5 between the two calls (all of them only
    // if 5 s went by): it takes back what it lacks, and ends full.
    let credited = give_back(&mut m, "gone", gone, 5);
    assert!((1..=5).contains(&credited), "{credited}");
    assert!(!exists(&mut m, "gone"));
    wait_synced(&master, &replica);
    let mut r = replica.conn();
    assert_eq!(
        digest(&mut r, "k"),
        digest(&mut m, "k"),
        "replica's bucket differs"
    );
    assert_eq!(
        dataset_digest(&mut r),
        dataset_digest(&mut m),
        "replica's dataset differs"
    );
    assert!(!exists(&mut r, "gone"));
    // Promoted, the replica honours the master's leases.
    let _: () = redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query(&mut r)
        .unwrap();
    assert_eq!(give_back(&mut r, "k", c_id, 2), 2);
    assert_eq!(give_back(&mut r, "k", d, 1), 1);
    assert_eq!(give_back(&mut r, "k", b, 2), 0, "closed on the master");
    assert_eq!(give_back(&mut r, "k", short, 1), 0, "expired on the master");
}

#[test]
fn copy_and_restore_keep_leases() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let (_, a, _, _) = lease(&mut c, "k", SLOW, 10.0, 3, 600_000, &[]);
    let (_, b, _, _) = lease(&mut c, "k", SLOW, 10.0, 2, 600_000, &[]);
    let original = digest(&mut c, "k");
    let copied: i64 = redis::cmd("COPY")
        .arg("k")
        .arg("copy")
        .query(&mut c)
        .unwrap();
    assert_eq!(copied, 1);
    let dump: Vec<u8> = redis::cmd("DUMP").arg("k").query(&mut c).unwrap();
    // With the original's expiry: DEBUG DIGEST-VALUE tells a key with an expiry from one without.
    let expires_at: i64 = redis::cmd("PEXPIRETIME").arg("k").query(&mut c).unwrap();
    let _: String = redis::cmd("RESTORE")
        .arg("restored")
        .arg(expires_at)
        .arg(dump)
        .arg("ABSTTL")
        .query(&mut c)
        .unwrap();
    assert_eq!(digest(&mut c, "copy"), original);
    assert_eq!(digest(&mut c, "restored"), original);
    // Each copy holds its own leases.
    assert_eq!(give_back(&mut c, "copy", a, 3), 3);
    assert_eq!(give_back(&mut c, "restored", a, 2), 2);
    assert_eq!(give_back(&mut c, "restored", b, 2), 2);
    assert_eq!(
        digest(&mut c, "k"),
        original,
        "returns on copies touched the original"
    );
    assert_eq!(give_back(&mut c, "k", a, 3), 3);
    assert_eq!(give_back(&mut c, "copy", a, 3), 0);
}

#[test]
fn key_ttl_covers_a_live_lease() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    // 1000 tokens/s: the 5 leased refill in 5 ms, but the lease lives a minute.
    let before = server_ms(&mut c);
    let (granted, id, _, _) = lease(&mut c, "k", 1000.0, 10.0, 5, 60_000, &[]);
    let after = server_ms(&mut c);
    assert_eq!(granted, 5);
    assert_expires_in(&mut c, "k", (before, after), 60_000..=60_000);
    std::thread::sleep(Duration::from_millis(100));
    assert!(exists(&mut c, "k"), "the key went while its lease was live");
    assert_eq!(
        give_back(&mut c, "k", id, 2),
        0,
        "full again: nothing to take back"
    );
    // Full and holding no lease: the same as no key.
    assert!(
        !exists(&mut c, "k"),
        "full bucket without leases kept its key"
    );
    // A lease shorter than the refill time: the refill time counts.
    let before = server_ms(&mut c);
    assert_eq!(lease(&mut c, "slow", 1.0, 10.0, 10, 100, &[]).0, 10);
    let after = server_ms(&mut c);
    assert_expires_in(&mut c, "slow", (before, after), 10_000..=10_000);
}

#[test]
fn live_leases_per_key_are_bounded() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let mut pipe = redis::pipe();
    for _ in 0..1024 {
        pipe.cmd("RL.LEASE")
            .arg("k")
            .arg(SLOW)
            .arg(2000)
            .arg(1)
            .arg(600_000);
    }
    let replies: Vec<Vec<i64>> = pipe.query(&mut c).unwrap();
    assert!(replies.iter().all(|r| r[0] == 1), "all 1024 granted");
    let first = replies[0][1];
    let before = digest(&mut c, "k");
    let err = redis::cmd("RL.LEASE")
        .arg("k")
        .arg(SLOW)
        .arg(2000)
        .arg(1)
        .arg(600_000)
        .query::<Vec<i64>>(&mut c)
        .unwrap_err();
    assert_eq!(err.code(), Some("ERR"), "{err}");
    assert!(err.to_string().contains("too many live leases"), "{err}");
    assert_eq!(
        digest(&mut c, "k"),
        before,
        "the refused lease changed the bucket"
    );
    assert_near(
        peek_tokens(&mut c, "k").unwrap(),
        976.0,
        "tokens after the refusal",
    );
    // A renewal frees its slot in the same call.
    let (granted, renewed, _, _) = lease(
        &mut c,
        "k",
        SLOW,
        2000.0,
        1,
        600_000,
        &["RETURN", &first.to_string(), "1"],
    );
    assert_eq!(granted, 1);
    assert!(redis::cmd("RL.LEASE")
        .arg("k")
        .arg(SLOW)
        .arg(2000)
        .arg(1)
        .arg(600_000)
        .query::<Vec<i64>>(&mut c)
        .is_err());
    // So does a return.
    assert_eq!(give_back(&mut c, "k", renewed, 1), 1);
    assert_eq!(lease(&mut c, "k", SLOW, 2000.0, 1, 600_000, &[]).0, 1);
    // And expiry.
    let mut pipe = redis::pipe();
    for _ in 0..1024 {
        pipe.cmd("RL.LEASE")
            .arg("short")
            .arg(SLOW)
            .arg(2000)
            .arg(1)
            .arg(1_000);
    }
    let replies: Vec<Vec<i64>> = pipe.query(&mut c).unwrap();
    assert!(replies.iter().all(|r| r[0] == 1), "all 1024 granted");
    std::thread::sleep(Duration::from_millis(1_500));
    assert_eq!(lease(&mut c, "short", SLOW, 2000.0, 1, 600_000, &[]).0, 1);
    let mut ping = s.conn();
    let pong: String = redis::cmd("PING").query(&mut ping).unwrap();
    assert_eq!(pong, "PONG");
}

#[test]
fn info_counts_leases() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let (_, a, _, _) = lease(&mut c, "k", SLOW, 10.0, 5, 600_000, &[]);
    lease(&mut c, "k", SLOW, 10.0, 8, 600_000, &["MIN", "8"]); // denied
                                                               // Expires 2 s from now: long after the checks that count it as active, on any machine.
    let (_, short, _, _) = lease(&mut c, "k", SLOW, 10.0, 2, 2_000, &[]);
    assert_eq!(info_field(&mut c, "rl", "rl_leases_granted"), 2);
    assert_eq!(info_field(&mut c, "rl", "rl_leases_denied"), 1);
    assert_eq!(info_field(&mut c, "rl", "rl_lease_tokens_granted"), 7);
    assert_eq!(info_field(&mut c, "rl", "rl_leases_active"), 2);
    assert_eq!(give_back(&mut c, "k", a, 3), 3);
    assert_eq!(give_back(&mut c, "k", a, 3), 0); // a double return is not a return
    assert_eq!(info_field(&mut c, "rl", "rl_returns"), 1);
    assert_eq!(info_field(&mut c, "rl", "rl_tokens_returned"), 3);
    assert_eq!(info_field(&mut c, "rl", "rl_leases_active"), 1);
    std::thread::sleep(Duration::from_millis(2_100));
    // The next write prunes the expired lease.
    let (_, b, _, _) = lease(&mut c, "k", SLOW, 10.0, 1, 600_000, &[]);
    assert_eq!(info_field(&mut c, "rl", "rl_leases_expired"), 1);
    assert_eq!(info_field(&mut c, "rl", "rl_leases_active"), 1);
    assert_eq!(give_back(&mut c, "k", short, 2), 0);
    assert_eq!(info_field(&mut c, "rl", "rl_returns"), 1);
    // Renewal: one return, one grant.
    lease(
        &mut c,
        "k",
        SLOW,
        10.0,
        2,
        600_000,
        &["RETURN", &b.to_string(), "1"],
    );
    assert_eq!(info_field(&mut c, "rl", "rl_returns"), 2);
    assert_eq!(info_field(&mut c, "rl", "rl_tokens_returned"), 4);
    assert_eq!(info_field(&mut c, "rl", "rl_leases_granted"), 4);
    assert_eq!(info_field(&mut c, "rl", "rl_lease_tokens_granted"), 10);
    assert_eq!(info_field(&mut c, "rl", "rl_leases_active"), 1);
    assert_eq!(info_field(&mut c, "rl", "rl_errors"), 0);
}

/// "Leases active now" must not count leases whose key expired (they will never be written
/// again, so pruning on the next write never happens).
#[test]
fn info_forgets_leases_of_an_expired_key() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    // 1000 tokens/s: full after 5 ms, so the key lives as long as the 2 s lease (long
    // enough to be counted first on any machine).
    lease(&mut c, "k", 1000.0, 10.0, 5, 2_000, &[]);
    assert_eq!(info_field(&mut c, "rl", "rl_leases_active"), 1);
    wait_until(30, "the key to expire", || !exists(&mut c, "k"));
    assert_eq!(
        info_field(&mut c, "rl", "rl_leases_active"),
        0,
        "an expired key's lease is still counted as active"
    );
    assert_eq!(
        info_field(&mut c, "rl", "rl_leases_expired"),
        1,
        "a lease that expired unreturned was not counted"
    );
}

/// "Leases active now" must count the leases a restart loads.
#[test]
fn info_counts_leases_loaded_at_startup() {
    let mut s = Server::start(&[]);
    let mut c = s.conn();
    lease(&mut c, "k", SLOW, 10.0, 2, 600_000, &[]);
    lease(&mut c, "k", SLOW, 10.0, 2, 600_000, &[]);
    assert_eq!(info_field(&mut c, "rl", "rl_leases_active"), 2);
    let _: String = redis::cmd("SAVE").query(&mut c).unwrap();
    drop(c);
    s.restart();
    let mut c = s.conn();
    assert!(exists(&mut c, "k"), "the RDB was not loaded");
    assert_eq!(
        info_field(&mut c, "rl", "rl_leases_active"),
        2,
        "leases loaded from the RDB are not counted as active"
    );
}

#[test]
fn bad_input_is_an_error_and_changes_nothing() {
    let mut s = Server::start(&[]);
    let mut c = s.conn();
    let (_, id, _, _) = lease(&mut c, "k", SLOW, 10.0, 5, 600_000, &[]);
    let id = id.to_string();
    let before = digest(&mut c, "k");
    let changes = info_field(&mut c, "persistence", "rdb_changes_since_last_save");
    let bad: Vec<Vec<&str>> = vec![
        vec!["RL.RETURN", "k", &id, "-1"],
        vec!["RL.RETURN", "k", &id, "1.5"],
        vec!["RL.RETURN", "k", &id, "abc"],
        vec!["RL.RETURN", "k", &id, ""],
        vec!["RL.RETURN", "k", "-3", "1"],
        vec!["RL.RETURN", "k", &id],
        vec!["RL.RETURN", "k", &id, "1", "extra"],
        vec!["RL.LEASE", "k", "0.001", "10", "5", "0"],
        vec!["RL.LEASE", "k", "0.001", "10", "5", "-1"],
        vec!["RL.LEASE", "k", "0.001", "10", "5", "86400001"],
        vec!["RL.LEASE", "k", "0.001", "10", "0", "1000"],
        vec!["RL.LEASE", "k", "0.001", "10", "2.5", "1000"],
        vec!["RL.LEASE", "k", "0.001", "10", "5", "1000", "MIN", "6"],
        vec!["RL.LEASE", "k", "0.001", "10", "5", "1000", "MIN", "0"],
        vec!["RL.LEASE", "k", "0.001", "10", "20", "1000", "MIN", "11"],
        vec!["RL.LEASE", "k", "0.001", "10", "5", "1000", "MIN"],
        vec!["RL.LEASE", "k", "0.001", "10", "5", "1000", "BOGUS"],
        vec![
            "RL.LEASE", "k", "0.001", "10", "5", "1000", "RETURN", &id, "-1",
        ],
        vec![
            "RL.LEASE", "k", "0.001", "10", "5", "1000", "RETURN", &id, "1.5",
        ],
        vec!["RL.LEASE", "k", "0.001", "10", "5", "1000", "RETURN", &id],
        vec![
            "RL.LEASE", "k", "0.001", "10", "5", "1000", "RETURN", &id, "1", "MIN", "9",
        ],
        vec!["RL.LEASE", "k", "0.001", "10", "5"],
        vec!["RL.LEASE", "k", "abc", "10", "5", "1000"],
        vec!["RL.LEASE", "k", "0.001", "-10", "5", "1000"],
        vec!["RL.LEASE", "k", "nan", "10", "5", "1000"],
    ];
    for args in &bad {
        let err = redis::cmd(args[0])
            .arg(&args[1..])
            .query::<Value>(&mut c)
            .unwrap_err();
        assert_eq!(err.code(), Some("ERR"), "{args:?}: {err}");
        assert_eq!(digest(&mut c, "k"), before, "{args:?} changed the bucket");
    }
    assert_eq!(
        info_field(&mut c, "persistence", "rdb_changes_since_last_save"),
        changes
    );
    // Calls with a wrong number of arguments are refused before the command runs, and not
    // counted (the declared arity: RL.RETURN exactly 4, RL.LEASE at least 6, the name
    // included).
    let arity = |a: &Vec<&str>| {
        if a[0] == "RL.RETURN" {
            a.len() == 4
        } else {
            a.len() >= 6
        }
    };
    let by_redis = bad.iter().filter(|a| !arity(a)).count();
    assert_eq!(by_redis, 3);
    assert_eq!(
        info_field(&mut c, "rl", "rl_errors"),
        (bad.len() - by_redis) as u64
    );
    // Bad input on a missing key creates none.
    for args in [
        vec!["RL.LEASE", "new", "0.001", "10", "5", "0"],
        vec!["RL.RETURN", "new", "1", "-1"],
    ] {
        assert!(
            redis::cmd(args[0])
                .arg(&args[1..])
                .query::<Value>(&mut c)
                .is_err(),
            "{args:?}"
        );
    }
    assert!(!exists(&mut c, "new"));
    // Another type: WRONGTYPE, untouched.
    let _: () = c.set("s", "hello").unwrap();
    for args in [
        vec!["RL.LEASE", "s", "1", "10", "5", "1000"],
        vec!["RL.RETURN", "s", "1", "1"],
    ] {
        let err = redis::cmd(args[0])
            .arg(&args[1..])
            .query::<Value>(&mut c)
            .unwrap_err();
        assert_eq!(err.code(), Some("WRONGTYPE"), "{args:?}: {err}");
    }
    let v: String = c.get("s").unwrap();
    assert_eq!(v, "hello");
    // The lease is still open, with all it held.
    assert_eq!(give_back(&mut c, "k", id.parse().unwrap(), 5), 5);
    assert!(!s.exited(), "the server crashed");
}

#[test]
fn concurrent_holders_never_keep_more_than_the_limit() {
    const CLIENTS: usize = 32;
    const RATE: f64 = 100.0;
    const CAP: f64 = 50.0;
    let run_for = Duration::from_millis(2_500);
    let s = Server::start(&[]);
    let barrier = Arc::new(Barrier::new(CLIENTS + 1));
    let mut threads = Vec::new();
    for t in 0..CLIENTS {
        let mut c = s.conn();
        let barrier = barrier.clone();
        threads.push(std::thread::spawn(move || {
            // A small xorshift per client: no shared state, no extra crate.
            let mut seed =
                0x9E37_79B9_7F4A_7C15u64 ^ (t as u64 + 1).wrapping_mul(0xD1B5_4A32_D192_ED03);
            let mut next = move |bound: u64| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                seed % bound
            };
            let (mut granted, mut credited, mut calls) = (0u64, 0u64, 0u64);
            // The lease this client holds: (id, tokens). Held leases live a minute, so a
            // return or renewal always finds them live and credits exactly min(unused, tokens).
            let mut held: Option<(i64, u64)> = None;
            barrier.wait();
            let deadline = Instant::now() + run_for;
            while Instant::now() < deadline {
                calls += 1;
                let n = 5 + next(16);
                match (next(6), held.take()) {
                    // Renew: settle the held lease and take a new one in one call.
                    (0 | 1, Some((id, tokens))) => {
                        let unused = next(tokens + 3); // sometimes more than the lease holds
                        let id = id.to_string();
                        let (g, new_id, _, _) = lease(
                            &mut c,
                            "k",
                            RATE,
                            CAP,
                            n,
                            60_000,
                            &["RETURN", &id, &unused.to_string()],
                        );
                        granted += g as u64;
                        credited += unused.min(tokens);
                        if g > 0 {
                            held = Some((new_id, g as u64));
                        }
                    }
                    // Return part of the held lease, sometimes twice.
                    (2 | 3, Some((id, tokens))) => {
                        let unused = next(tokens + 1);
                        let got = give_back(&mut c, "k", id, unused) as u64;
                        assert_eq!(
                            got,
                            unused.min(tokens),
                            "credit for unused {unused} of {tokens}"
                        );
                        credited += got;
                        if next(3) == 0 {
                            assert_eq!(
                                give_back(&mut c, "k", id, tokens),
                                0,
                                "double return credited"
                            );
                        }
                    }
                    // A plain take, keeping the held lease.
                    (5, kept) => {
                        granted += take(&mut c, "k", RATE, CAP, 1 + next(3)) as u64;
                        held = kept;
                    }
                    // A new lease; the held one (if any) is kept and never returned. Short
                    // leases are left to expire.
                    (_, kept) => {
                        let min = 1 + next(n);
                        let short = next(4) == 0;
                        let ttl = if short { 30 } else { 60_000 };
                        let (g, id, _, _) =
                            lease(&mut c, "k", RATE, CAP, n, ttl, &["MIN", &min.to_string()]);
                        assert!(
                            g == 0 || (min..=n).contains(&(g as u64)),
                            "granted {g} for n {n} min {min}"
                        );
                        granted += g as u64;
                        held = if g > 0 && !short {
                            Some((id, g as u64))
                        } else {
                            kept
                        };
                    }
                }
            }
            (granted, credited, calls)
        }));
    }
    let start = Instant::now();
    barrier.wait();
    let results: Vec<(u64, u64, u64)> = threads.into_iter().map(|h| h.join().unwrap()).collect();
    let elapsed = start.elapsed().as_secs_f64();
    let granted: u64 = results.iter().map(|r| r.0).sum();
    let calls: u64 = results.iter().map(|r| r.2).sum();
    let credited: u64 = results.iter().map(|r| r.1).sum();
    let mut c = s.conn();
    // The server's own counters agree with the replies.
    let server_granted = info_field(&mut c, "rl", "rl_lease_tokens_granted")
        + info_field(&mut c, "rl", "rl_tokens_granted");
    assert_eq!(
        server_granted, granted,
        "INFO and replies disagree on tokens granted"
    );
    assert_eq!(
        info_field(&mut c, "rl", "rl_tokens_returned"),
        credited,
        "INFO and replies disagree on tokens returned"
    );
    assert!(credited <= granted);
    let kept = (granted - credited) as f64;
    let bound = CAP + RATE * elapsed;
    eprintln!("{calls} calls in {elapsed:.2} s: granted {granted}, credited {credited}, kept {kept} <= {bound:.1}");
    assert!(granted > 0, "nothing granted");
    assert!(
        kept <= bound,
        "kept {kept} tokens, more than cap + rate * elapsed = {bound:.1}"
    );
    assert_eq!(info_field(&mut c, "rl", "rl_errors"), 0);
}

fn int(c: &mut Connection, args: &[&str]) -> i64 {
    query(c, args)
}

/// No token minted by leases and returns (plain and inside RL.LEASE ... RETURN, claiming more unused
/// than held) into a bucket near full and under a cap that changes from call to call never
/// let out more than the largest cap + rate * elapsed on the wall clock. (One long lease
/// stays open throughout so the key never expires: tests/limit_changes.rs covers the key
/// expiring between limits.) A replica and a reload agree at the end.
#[test]
fn lease_return_churn_under_changing_caps_lets_out_no_more_than_the_bound() {
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

/// RL.RETURN into a bucket that is full, or nearly, under a limit changed since the
/// lease, credits at most what the bucket lacks and never leaves it above cap.
#[test]
fn return_into_a_near_full_bucket_under_a_changed_limit() {
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
