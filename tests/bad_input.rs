//! Hundreds of malformed calls: each gets a clear -ERR, no key changes, the server lives.
//! Corrupt `RESTORE` payloads are errors, never an abort.

mod support;
use support::*;

/// Arguments after the command name; `K` is an existing bucket.
fn malformed() -> Vec<(&'static str, Vec<Vec<u8>>)> {
    let mut calls: Vec<(&'static str, Vec<Vec<u8>>)> = Vec::new();
    let b = |parts: &[&[u8]]| parts.iter().map(|p| p.to_vec()).collect::<Vec<_>>();
    let bad_numbers: &[&[u8]] = &[
        b"",
        b"abc",
        b"nan",
        b"NaN",
        b"inf",
        b"-inf",
        b"infinity",
        b"0",
        b"-1",
        b"-0.5",
        b"1e400",
        b"1e16",
        b"1e-12",
        b"0x10",
        b" 1",
        b"1 ",
        b"1,5",
        b"\xff\xfe",
        b"1e",
        b"--1",
        b"9".repeat(400).leak(),
    ];
    for x in bad_numbers {
        calls.push(("RL.TAKE", b(&[b"K", x, b"10"])));
        calls.push(("RL.TAKE", b(&[b"K", b"10", x])));
        calls.push(("RL.LEASE", b(&[b"K", x, b"10", b"5", b"1000"])));
        calls.push(("RL.LEASE", b(&[b"K", b"10", x, b"5", b"1000"])));
        calls.push(("RL.TAKE", b(&[b"K", x, x, b"1", b"WITHSTATE"])));
        calls.push((
            "RL.LEASE",
            b(&[b"K", x, b"10", b"5", b"1000", b"MIN", b"2"]),
        ));
    }
    let bad_counts: &[&[u8]] = &[
        b"0",
        b"-1",
        b"1.5",
        b"1e3",
        b"abc",
        b"",
        b"+1",
        b"99999999999999999999",
        b"\xff",
        b"11",
    ];
    for n in bad_counts {
        calls.push(("RL.TAKE", b(&[b"K", b"10", b"10", n])));
        calls.push(("RL.TAKE", b(&[b"K", b"10", b"10", n, b"WITHSTATE"])));
        if *n != b"11" {
            calls.push(("RL.LEASE", b(&[b"K", b"10", b"10", b"5", n, b"MIN", b"1"])));
        }
        calls.push((
            "RL.LEASE",
            b(&[b"K", b"10", b"10", b"5", b"1000", b"MIN", n]),
        ));
        // 0 and 11 are fine as a lease id or an unused count.
        if !matches!(*n, b"0" | b"11") {
            calls.push(("RL.RETURN", b(&[b"K", n, b"1"])));
            calls.push(("RL.RETURN", b(&[b"K", b"1", n])));
        }
    }
    for opt in [&b"WITHSTAT"[..], b"FOO", b"\xff", b"WITHSTATE\x00", b"MIN"] {
        calls.push(("RL.TAKE", b(&[b"K", b"10", b"10", b"1", opt])));
        calls.push(("RL.TAKE", b(&[b"K", b"10", b"10", b"1", b"WITHSTATE", opt])));
        calls.push(("RL.LEASE", b(&[b"K", b"10", b"10", b"5", b"1000", opt])));
    }
    // Wrong arity.
    for n in 0..3 {
        calls.push(("RL.TAKE", (0..n).map(|_| b"K".to_vec()).collect()));
    }
    calls.push(("RL.TAKE", b(&[b"K", b"1", b"1", b"1", b"WITHSTATE", b"x"])));
    calls.push(("RL.LEASE", b(&[b"K", b"1", b"1", b"1"])));
    calls.push(("RL.RETURN", b(&[b"K", b"1"])));
    calls.push(("RL.RETURN", b(&[b"K", b"1", b"1", b"1"])));
    // Internally consistent but impossible requests.
    calls.push(("RL.TAKE", b(&[b"K", b"1e-9", b"1e6"])));
    calls.push((
        "RL.LEASE",
        b(&[b"K", b"10", b"10", b"5", b"1000", b"MIN", b"6"]),
    ));
    calls.push(("RL.LEASE", b(&[b"K", b"10", b"10", b"5", b"86400001"])));
    calls.push((
        "RL.LEASE",
        b(&[b"K", b"10", b"10", b"5", b"1000", b"RETURN", b"1"]),
    ));
    calls.push(("RL.SETSTATE", b(&[b"K", b"-1", b"1", b"1"])));
    calls.push(("RL.SETSTATE", b(&[b"K", b"1", b"nan", b"1"])));
    calls.push(("RL.SETSTATE", b(&[b"K", b"1", b"1", b"0"])));
    calls.push(("RL.SETSTATE", b(&[b"K", b"1", b"1", b"1", b"BOGUS"])));
    // Wrong type keys.
    for cmd in ["RL.TAKE", "RL.LEASE", "RL.RETURN", "RL.SETSTATE"] {
        let args = match cmd {
            "RL.TAKE" => b(&[b"S", b"1", b"1"]),
            "RL.LEASE" => b(&[b"S", b"1", b"1", b"1", b"1000"]),
            "RL.RETURN" => b(&[b"S", b"1", b"1"]),
            _ => b(&[b"S", b"1", b"1", b"1"]),
        };
        calls.push((cmd, args));
    }
    calls
}

#[test]
fn malformed_calls_get_errors_and_change_nothing() {
    let s = Server::start(&[]);
    // Internal, so that RL.SETSTATE (hidden from ordinary clients on Redis 8) is reached.
    let mut c = s.internal_conn();
    assert_eq!(take(&mut c, "K", 0.001, 10.0, 3), 3);
    let _: () = c.set("S", "a string").unwrap();
    let before = dataset_digest(&mut c);
    let calls = malformed();
    assert!(calls.len() >= 200, "only {} calls", calls.len());
    for (cmd, args) in &calls {
        let mut q = redis::cmd(cmd);
        for a in args {
            q.arg(&a[..]);
        }
        let shown = format!(
            "{cmd} {:?}",
            args.iter()
                .map(|a| String::from_utf8_lossy(a))
                .collect::<Vec<_>>()
        );
        match q.query::<Value>(&mut c) {
            Err(e) => {
                let code = e.code().unwrap_or("");
                assert!(
                    code == "ERR" || code == "WRONGTYPE",
                    "{shown}: unexpected error {e}"
                );
                let detail = e.detail().unwrap_or("");
                assert!(
                    !detail.is_empty() && !detail.contains("internal error"),
                    "{shown}: {e}"
                );
            }
            Ok(v) => panic!("{shown}: expected an error, got {v:?}"),
        }
        assert_eq!(
            dataset_digest(&mut c),
            before,
            "{shown} changed the dataset"
        );
    }
    let pong: String = redis::cmd("PING").query(&mut c).unwrap();
    assert_eq!(pong, "PONG");
    assert!(info_field(&mut c, "rl", "rl_errors") >= calls.len() as u64 - 10);
}

#[test]
fn a_panic_inside_a_command_is_an_error_reply() {
    // RL.DEBUG-PANIC exists in debug builds (the ones the tests load) and panics inside
    // the command boundary.
    let s = Server::start(&[]);
    let mut c = s.conn();
    let err = redis::cmd("RL.DEBUG-PANIC")
        .query::<Value>(&mut c)
        .unwrap_err();
    assert!(
        err.to_string().contains("internal error in redis-rl"),
        "{err}"
    );
    let pong: String = redis::cmd("PING").query(&mut c).unwrap();
    assert_eq!(pong, "PONG");
    assert_eq!(take(&mut c, "k", 1.0, 1.0, 1), 1);
}

/// A payload cut short or with flipped bits, under a valid CRC, is refused with an error
/// (or accepted as a valid bucket), and the server lives on.
#[test]
fn corrupt_restore_payloads_are_errors_not_aborts() {
    let mut s = Server::start(&["--sanitize-dump-payload", "yes"]);
    let mut c = s.conn();
    // Redis's own check value for its CRC-64.
    assert_eq!(crc64(b"123456789"), 0xe9c6_d914_c4b8_d9ca);
    // Slow limits (hours to full): the keys must still be there to DUMP on a busy machine.
    let _: i64 = redis::cmd("RL.TAKE")
        .arg(&["plain", "0.01", "100", "7"])
        .query(&mut c)
        .unwrap();
    let _: Vec<i64> = redis::cmd("RL.LEASE")
        .arg(&["leased", "0.001", "1000", "20", "600000"])
        .query(&mut c)
        .unwrap();
    let _: Vec<i64> = redis::cmd("RL.LEASE")
        .arg(&["leased", "0.001", "1000", "30", "600000"])
        .query(&mut c)
        .unwrap();
    // Encoding 3 carries the limit's version.
    let _: i64 = redis::cmd("RL.TAKE")
        .arg(&[
            "versioned",
            "0.01",
            "100",
            "7",
            "VERSION",
            "9007199254740991",
        ])
        .query(&mut c)
        .unwrap();
    let _: Vec<i64> = redis::cmd("RL.LEASE")
        .arg(&["vleased", "0.001", "1000", "20", "600000", "VERSION", "300"])
        .query(&mut c)
        .unwrap();
    let mut rng = Rng(42);
    let (mut tried, mut accepted) = (0, 0);
    for key in ["plain", "leased", "versioned", "vleased"] {
        let payload = dump(&mut c, key);
        let body = dump_body(&payload);
        // The CRC is Redis's: an untouched payload reseals to itself.
        assert_eq!(reseal(&payload, body), payload);
        let mut bodies: Vec<Vec<u8>> = (1..body.len()).map(|n| body[..n].to_vec()).collect();
        for _ in 0..300 {
            let mut b = body.to_vec();
            for _ in 0..1 + rng.below(3) {
                let i = 1 + rng.below(b.len() as u64 - 1) as usize;
                b[i] ^= 1 << rng.below(8);
            }
            bodies.push(b);
        }
        for b in bodies {
            tried += 1;
            let forged = reseal(&payload, &b);
            let reply = restore_replace(&mut c, "x", &forged);
            if reply.is_ok() {
                accepted += 1;
                // Whatever was accepted behaves as a valid bucket.
                let _: Value = redis::cmd("RL.PEEK").arg("x").query(&mut c).unwrap();
                let t: redis::RedisResult<Value> =
                    redis::cmd("RL.TAKE").arg(&["x", "1", "10"]).query(&mut c);
                assert!(
                    t.is_ok() || t.as_ref().unwrap_err().code() == Some("WRONGTYPE"),
                    "{t:?}"
                );
                let _: () = redis::cmd("DEL").arg("x").query(&mut c).unwrap();
            }
        }
    }
    assert!(!s.exited(), "the server died: {}", s.log());
    let pong: String = redis::cmd("PING").query(&mut c).unwrap();
    assert_eq!(pong, "PONG");
    let _: () = redis::cmd("DEBUG").arg("RELOAD").query(&mut c).unwrap();
    assert!(tried > 1200 && accepted < tried, "{accepted} of {tried}");
}
