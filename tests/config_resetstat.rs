//! `CONFIG RESETSTAT` resets the module's counters exactly when Redis resets its own: also
//! when it runs inside `MULTI` / `EXEC` long after it was queued, and never when the
//! transaction did not run it.

mod support;

use support::*;

fn rl_calls(c: &mut Connection) -> u64 {
    info_field(c, "rl", "rl_calls")
}

/// Sends `n` PINGs in one pipeline (other clients' traffic).
fn pings(c: &mut Connection, n: usize) {
    let mut p = redis::pipe();
    for _ in 0..n {
        p.cmd("PING");
    }
    let _: Vec<String> = p.query(c).unwrap();
}

/// A transaction is often queued by one client while others keep the server busy: the
/// reset happens at `EXEC`, however many commands came between.
#[test]
fn a_resetstat_queued_in_multi_resets_at_exec_after_any_traffic() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let mut other = s.conn();
    for traffic in [0, 3, 20_050] {
        for _ in 0..5 {
            take(&mut c, "a:1", 1.0, 1e9, 1);
        }
        assert!(rl_calls(&mut c) >= 5);
        let _: () = query(&mut c, &["MULTI"]);
        let _: String = query(&mut c, &["CONFIG", "RESETSTAT"]);
        pings(&mut other, traffic);
        let _: Vec<String> = query(&mut c, &["EXEC"]);
        // Redis's own statistics were reset...
        let stats: String = query(&mut c, &["INFO", "commandstats"]);
        assert!(!stats.contains("cmdstat_RL.TAKE"), "{stats}");
        // ...and so must the module's.
        assert_eq!(
            rl_calls(&mut c),
            0,
            "after {traffic} commands between MULTI's CONFIG RESETSTAT and EXEC"
        );
        let ns: Value = query(&mut c, &["RL.STATS", "a"]);
        assert_eq!(
            ns,
            Value::Nil,
            "after {traffic} commands: the namespace survived"
        );
    }
}

/// A module command queued after the reset in the same transaction counts after it, as
/// Redis's own statistics do; one queued before it is reset with them.
#[test]
fn counts_inside_exec_follow_the_reset() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    take(&mut c, "a:1", 1.0, 1e9, 1);
    let _: () = query(&mut c, &["MULTI"]);
    for args in [
        &["RL.TAKE", "a:1", "1", "1000000000"][..],
        &["CONFIG", "RESETSTAT"],
        &["RL.TAKE", "a:1", "1", "1000000000"],
        &["RL.TAKE", "b:1", "1", "1000000000"],
    ] {
        let _: String = query(&mut c, args);
    }
    let _: Value = query(&mut c, &["EXEC"]);
    assert_eq!(rl_calls(&mut c), 2);
    let redis_calls: String = query(&mut c, &["INFO", "commandstats"]);
    assert!(
        redis_calls.contains("cmdstat_RL.TAKE:calls=2,"),
        "{redis_calls}"
    );
}

/// A transaction that never ran its `CONFIG RESETSTAT` (discarded, or aborted by `WATCH`)
/// resets nothing, not even at a later `EXEC` of other commands.
#[test]
fn a_resetstat_that_exec_never_ran_resets_nothing() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let mut other = s.conn();
    for _ in 0..3 {
        take(&mut c, "a:1", 1.0, 1e9, 1);
    }
    // Discarded.
    let _: () = query(&mut c, &["MULTI"]);
    let _: String = query(&mut c, &["CONFIG", "RESETSTAT"]);
    let _: () = query(&mut c, &["DISCARD"]);
    pings(&mut other, 20_050);
    // Aborted by WATCH.
    let _: () = query(&mut c, &["WATCH", "w"]);
    let _: () = query(&mut c, &["MULTI"]);
    let _: String = query(&mut c, &["CONFIG", "RESETSTAT"]);
    let _: () = query(&mut other, &["SET", "w", "1"]);
    let aborted: Value = query(&mut c, &["EXEC"]);
    assert_eq!(aborted, Value::Nil);
    // A later transaction of other commands.
    let _: () = query(&mut c, &["MULTI"]);
    let _: String = query(&mut c, &["PING"]);
    let _: Value = query(&mut c, &["EXEC"]);
    assert_eq!(rl_calls(&mut c), 3);
    let stats: String = query(&mut c, &["INFO", "commandstats"]);
    assert!(stats.contains("cmdstat_RL.TAKE:calls=3,"), "{stats}");
}

/// CONFIG RESETSTAT resets the module's counters as it does Redis's own, even when more
/// commands run after the reset than had run before it (`src/observe/resetstat.rs` notices the
/// reset lazily, at the next module command or INFO, and must not miss it then).
#[test]
fn resetstat_holds_when_more_commands_follow_it_than_preceded_it() {
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

/// The gauges count what keys hold now, not what happened since a reset: `CONFIG
/// RESETSTAT` leaves them as they are, and the releases, leases and holders that follow
/// move them from there (a gauge zeroed by the reset would read 0 while permits are held,
/// and its later releases would be lost against that 0).
#[test]
fn resetstat_keeps_the_gauges() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let mut permit = 0;
    for key in ["s1", "s1", "s2"] {
        let r: Vec<i64> = query(&mut c, &["RL.ACQUIRE", key, "5", "60000"]);
        assert_eq!(r[0], 1);
        permit = r[1];
    }
    let _: Vec<i64> = query(&mut c, &["RL.LEASE", "b", "1", "10", "2", "60000"]);
    let _: Vec<redis::Value> = query(&mut c, &["RL.SHARE", "sh", "10", "10", "h1", "5", "60000"]);
    let gauges = |c: &mut Connection| {
        ["rl_permits_in_use", "rl_leases_active", "rl_share_holders"]
            .map(|f| info_field(c, "rl", f))
    };
    assert_eq!(gauges(&mut c), [3, 1, 1]);

    let _: String = query(&mut c, &["CONFIG", "RESETSTAT"]);
    pings(&mut c, 1);
    assert_eq!(rl_calls(&mut c), 0, "the counters were reset");
    assert_eq!(gauges(&mut c), [3, 1, 1], "the gauges were not");

    let released: i64 = query(&mut c, &["RL.RELEASE", "s2", &permit.to_string()]);
    assert_eq!(released, 1);
    assert_eq!(info_field(&mut c, "rl", "rl_permits_in_use"), 2);
}
