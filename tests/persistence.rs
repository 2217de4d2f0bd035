//! Buckets survive DEBUG RELOAD (RDB), an AOF rewrite plus restart, DUMP/RESTORE and COPY
//! with exactly the same state (equal `DEBUG DIGEST-VALUE`).

mod support;
use support::*;

/// A few buckets in different states: partly used, empty, fractional rate, changed limit.
/// Rates are slow enough that none fills (and expires) while a test runs, however slow the
/// machine: 30 s at the least.
fn fill(c: &mut Connection) -> Vec<String> {
    take(c, "a", 1.0, 100.0, 30);
    take(c, "b", 0.001, 5.0, 5);
    take(c, "c", 0.005, 2.5, 1);
    take(c, "d", 0.03, 10.0, 2);
    take(c, "d", 0.07, 6.0, 1);
    for i in 0..200 {
        take(
            c,
            &format!("many:{i}"),
            0.01 + i as f64 / 1000.0,
            1000.0,
            1 + i % 7,
        );
    }
    let mut keys: Vec<String> = ["a", "b", "c", "d"].iter().map(|s| s.to_string()).collect();
    keys.extend((0..200).map(|i| format!("many:{i}")));
    keys
}

fn digests(c: &mut Connection, keys: &[String]) -> Vec<String> {
    keys.iter().map(|k| digest(c, k)).collect()
}

#[test]
fn debug_reload_keeps_every_bucket() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let keys = fill(&mut c);
    let before = digests(&mut c, &keys);
    let ttl_before: i64 = redis::cmd("PEXPIRETIME").arg("a").query(&mut c).unwrap();
    let _: () = redis::cmd("DEBUG").arg("RELOAD").query(&mut c).unwrap();
    assert_eq!(digests(&mut c, &keys), before);
    let ttl_after: i64 = redis::cmd("PEXPIRETIME").arg("a").query(&mut c).unwrap();
    assert_eq!(ttl_before, ttl_after);
    // Still a working bucket after the reload.
    assert_eq!(take(&mut c, "b", 0.001, 5.0, 1), 0);
}

#[test]
fn aof_rewrite_and_restart_keep_every_bucket() {
    // Without the RDB preamble the rewrite is made of our own RL.SETSTATE commands.
    let mut s = Server::start(&["--appendonly", "yes", "--aof-use-rdb-preamble", "no"]);
    let mut c = s.conn();
    let keys = fill(&mut c);
    let before = digests(&mut c, &keys);
    let _: () = redis::cmd("BGREWRITEAOF").query(&mut c).unwrap_or(());
    wait_until(30, "AOF rewrite", || {
        info_field(&mut c, "persistence", "aof_rewrite_in_progress") == 0
            && info_field(&mut c, "persistence", "aof_rewrite_scheduled") == 0
    });
    // Writes after the rewrite land in the incremental AOF and replay too.
    take(&mut c, "a", 1.0, 100.0, 1);
    let mut before = before;
    before[0] = digest(&mut c, "a");
    drop(c);
    s.restart();
    let mut c = s.conn();
    let after = digests(&mut c, &keys);
    let differ: Vec<&String> = keys
        .iter()
        .zip(before.iter().zip(&after))
        .filter(|(_, (b, a))| b != a)
        .map(|(k, _)| k)
        .collect();
    assert!(differ.is_empty(), "changed by the restart: {differ:?}");
    let files: Vec<String> = std::fs::read_dir(s.dir.path().join("appendonlydir"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        files.iter().any(|f| f.ends_with(".base.aof")),
        "no AOF base: {files:?}"
    );
}

#[test]
fn dump_restore_and_copy_keep_the_state() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    take(&mut c, "src", 0.01, 10.0, 7);
    let d = digest(&mut c, "src");
    let dump: Vec<u8> = redis::cmd("DUMP").arg("src").query(&mut c).unwrap();
    let at: i64 = redis::cmd("PEXPIRETIME").arg("src").query(&mut c).unwrap();
    let _: () = redis::cmd("RESTORE")
        .arg("restored")
        .arg(at)
        .arg(dump)
        .arg("ABSTTL")
        .query(&mut c)
        .unwrap();
    assert_eq!(digest(&mut c, "restored"), d);
    let copied: i64 = redis::cmd("COPY")
        .arg("src")
        .arg("copied")
        .query(&mut c)
        .unwrap();
    assert_eq!(copied, 1);
    assert_eq!(digest(&mut c, "copied"), d);
    // The copy is independent.
    take(&mut c, "copied", 0.01, 10.0, 3);
    assert_eq!(digest(&mut c, "src"), d);
    let _: () = redis::cmd("RENAME")
        .arg("src")
        .arg("renamed")
        .query(&mut c)
        .unwrap();
    assert_eq!(digest(&mut c, "renamed"), d);
    let usage: i64 = redis::cmd("MEMORY")
        .arg("USAGE")
        .arg("renamed")
        .query(&mut c)
        .unwrap();
    assert!(usage > 0);
}
