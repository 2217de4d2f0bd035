//! The module's configs (`rl.*`) and its load: every value is kept byte for byte through
//! `CONFIG SET`, `CONFIG GET`, `CONFIG REWRITE` and a restart, a value the module refuses
//! is a clear error (from `CONFIG SET` or from redis.conf), reading configs never hurts the
//! server, `CONFIG RESETSTAT` always resets, and a refused load says why in the log.

mod support;

use support::*;

fn config_get(c: &mut Connection, name: &str) -> Vec<u8> {
    let v: Vec<Vec<u8>> = redis::cmd("CONFIG").arg("GET").arg(name).query(c).unwrap();
    assert_eq!(v.len(), 2, "CONFIG GET {name}: {v:?}");
    v[1].clone()
}

fn config_set(c: &mut Connection, name: &str, value: &[u8]) -> redis::RedisResult<()> {
    redis::cmd("CONFIG")
        .arg("SET")
        .arg(name)
        .arg(value)
        .query(c)
}

/// Every way configs are read: one, all (what monitoring runs), and the rewrite.
fn read_every_config(s: &Server) {
    let mut c = s.conn();
    let all: Vec<Vec<u8>> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("*")
        .query(&mut c)
        .unwrap();
    assert!(all.len() > 20, "{}", all.len());
    let rl: Vec<Vec<u8>> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("rl.*")
        .query(&mut c)
        .unwrap();
    assert_eq!(rl.len(), 10, "five rl.* configs, name and value each");
}

#[test]
fn a_nul_separator_is_refused_and_reading_configs_never_crashes() {
    let mut s = Server::start(&[]);
    let mut c = s.conn();
    for bad in [&b"\x00"[..], b"a\x00", b"\x00\x00\x00"] {
        let e = config_set(&mut c, "rl.namespace-separator", bad).unwrap_err();
        assert!(e.to_string().contains("NUL"), "{bad:?}: {e}");
        assert_eq!(config_get(&mut c, "rl.namespace-separator"), b":");
    }
    read_every_config(&s);
    assert!(!s.exited(), "the server died: {}", s.log());
}

#[test]
fn a_separator_keeps_its_exact_bytes_through_rewrite_and_restart() {
    let mut s = Server::try_start_conf("", &[]).unwrap_or_else(|log| panic!("{log}"));
    let mut c = s.conn();
    let sep = b"\xff\xfe";
    config_set(&mut c, "rl.namespace-separator", sep).unwrap();
    assert_eq!(config_get(&mut c, "rl.namespace-separator"), sep);
    read_every_config(&s);
    let _: () = redis::cmd("CONFIG").arg("REWRITE").query(&mut c).unwrap();
    s.restart();
    let mut c = s.conn();
    assert_eq!(config_get(&mut c, "rl.namespace-separator"), sep);
    // Namespaces still split at those bytes.
    let key: &[u8] = b"orders\xff\xfe42";
    let got: i64 = redis::cmd("RL.TAKE")
        .arg(key)
        .arg(1)
        .arg(5)
        .query(&mut c)
        .unwrap();
    assert_eq!(got, 1);
    let stats: redis::Value = query(&mut c, &["RL.STATS", "orders"]);
    assert_ne!(stats, redis::Value::Nil, "no namespace 'orders'");
}

#[test]
fn a_nul_separator_in_redis_conf_refuses_the_load_with_its_reason() {
    match Server::try_start_conf("rl.namespace-separator \"a\\x00\"\n", &[]) {
        Ok(_) => panic!("a NUL separator loaded from redis.conf"),
        Err(log) => {
            assert!(log.contains("NUL"), "the log does not say why: {log}");
            assert!(!log.contains("crashed by signal"), "{log}");
        }
    }
}

/// A typo in a long redis.conf or command line: the log names the config and the value
/// (Redis's own range check named neither the value nor, in a file, the line).
#[test]
fn a_bad_value_at_start_is_named_in_the_log_with_its_value() {
    let cases: [(&str, &str, &str); 4] = [
        ("", "rl.max-namespaces", "99999"),
        ("", "rl.top-keys", "-5"),
        ("", "rl.namespace-separator", "abcdefgh"),
        ("conf", "rl.max-namespaces", "4096"),
    ];
    for (from, name, value) in cases {
        let started = if from == "conf" {
            Server::try_start_conf(&format!("{name} {value}\n"), &[])
        } else {
            Server::try_start(&[&format!("--{name}"), value])
        };
        let Err(log) = started else {
            panic!("{name} {value} loaded");
        };
        assert!(
            log.lines()
                .any(|l| l.contains(name) && l.contains(&format!("(got '{value}')"))),
            "{name} {value}: no log line names both:\n{log}"
        );
        assert!(
            log.contains("value refused (see the line above)"),
            "the module's line: {log}"
        );
    }
}

/// The typos Redis names only in part (an unknown rl.* name: not at all on Redis 7.0; a bad
/// mode or yes/no: without the value): the module names the redis.conf line, the config and
/// the value; a good config file gets no such line.
#[test]
fn a_typo_in_redis_conf_is_named_with_its_line_and_value() {
    for (line, want) in [
        (
            "rl.modee shadow",
            "redis.conf line 3: unknown config 'rl.modee' (value 'shadow')",
        ),
        (
            "rl.mode shadw",
            "redis.conf line 3: invalid value 'shadw' for rl.mode (accepted: enforce, shadow)",
        ),
        (
            "rl.adopt-script-keys maybe",
            "invalid value 'maybe' for rl.adopt-script-keys (accepted: yes, no)",
        ),
    ] {
        // try_start_conf puts the loadmodule line first.
        let Err(log) = Server::try_start_conf(&format!("# a comment\n{line}\n"), &[]) else {
            panic!("{line} loaded");
        };
        assert!(log.contains(want), "{line}: the log lacks {want:?}:\n{log}");
    }
    let s = Server::try_start_conf("rl.mode SHADOW\nrl.adopt-script-keys yes\n", &[])
        .unwrap_or_else(|log| panic!("{log}"));
    assert!(!s.log().contains("redis-rl: redis.conf"), "{}", s.log());
}

#[test]
fn a_bad_number_or_mode_is_refused_and_changes_nothing() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    for (name, bad) in [
        ("rl.max-namespaces", "2000"),
        ("rl.max-namespaces", "-1"),
        ("rl.top-keys", "70000"),
        ("rl.mode", "shadw"),
        ("rl.adopt-script-keys", "maybe"),
        ("rl.namespace-separator", "12345678"),
        ("rl.namespace-separator", ""),
    ] {
        let before = config_get(&mut c, name);
        let e = config_set(&mut c, name, bad.as_bytes()).unwrap_err();
        // The module's own checks quote the value (Redis's enum and yes/no checks do not
        // reach it).
        if !matches!(name, "rl.mode" | "rl.adopt-script-keys") {
            assert!(
                e.to_string().contains(&format!("(got '{bad}')")),
                "{name} {bad}: {e}"
            );
        }
        assert_eq!(config_get(&mut c, name), before, "{name}");
    }
    read_every_config(&s);
}

/// Two resets in a row: the first must not be forgotten when the second comes before any
/// other command (each can leave `cmdstat_config|resetstat` looking the same).
#[test]
fn every_config_resetstat_resets_even_twice_in_a_row() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    for round in 0..200 {
        assert_eq!(take(&mut c, "a:1", 1.0, 1e9, 1), 1);
        let _: () = query(&mut c, &["CONFIG", "RESETSTAT"]);
        let _: () = query(&mut c, &["CONFIG", "RESETSTAT"]);
        assert_eq!(
            info_field(&mut c, "rl", "rl_calls"),
            0,
            "round {round}: rl_calls survived two resets"
        );
        let ns: redis::Value = query(&mut c, &["RL.STATS", "a"]);
        assert_eq!(
            ns,
            redis::Value::Nil,
            "round {round}: the namespace survived"
        );
    }
}

#[test]
fn loading_the_module_twice_says_why_it_is_refused() {
    let s = Server::start(&["--enable-module-command", "yes", "--loglevel", "notice"]);
    let mut c = s.conn();
    let path = module_path();
    let e = redis::cmd("MODULE")
        .arg("LOAD")
        .arg(path.to_str().unwrap())
        .query::<()>(&mut c)
        .unwrap_err();
    assert!(e.to_string().contains("Error loading"), "{e}");
    let log = s.log();
    assert!(
        log.contains("a module named 'rl' is already loaded"),
        "the log does not say why: {log}"
    );
    assert_eq!(
        take(&mut c, "k", 1.0, 5.0, 1),
        1,
        "the loaded module still works"
    );
}

/// What `CONFIG SET` changed and `CONFIG REWRITE` saved is what a restart loads, also when
/// the `loadmodule` line carries a `mode` argument (which `CONFIG REWRITE` keeps as it is).
#[test]
fn a_mode_set_and_rewritten_survives_a_restart_whatever_loadmodule_says() {
    for (arg, set) in [("shadow", "enforce"), ("enforce", "shadow")] {
        let mut s = Server::try_start_conf("", &[]).unwrap_or_else(|log| panic!("{log}"));
        std::fs::write(
            s.dir.path().join("redis.conf"),
            format!("loadmodule {} mode {arg}\n", module_path().display()),
        )
        .unwrap();
        s.restart();
        let mut c = s.conn();
        assert_eq!(config_get(&mut c, "rl.mode"), arg.as_bytes());
        config_set(&mut c, "rl.mode", set.as_bytes()).unwrap();
        let _: () = redis::cmd("CONFIG").arg("REWRITE").query(&mut c).unwrap();
        s.restart();
        let mut c = s.conn();
        assert_eq!(
            String::from_utf8_lossy(&config_get(&mut c, "rl.mode")),
            set,
            "loadmodule ... mode {arg}, then CONFIG SET rl.mode {set} and CONFIG REWRITE: \
             the restart loads another mode; redis.conf:\n{}",
            String::from_utf8_lossy(&s.conf())
        );
    }
}
