//! `loadmodule` arguments: names and values case-insensitive; anything unknown or invalid
//! refuses the load with one log line naming it and what is accepted.

mod support;

use support::*;

fn mode(s: &Server) -> String {
    let v: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("rl.mode")
        .query(&mut s.conn())
        .unwrap();
    v[1].clone()
}

#[test]
fn known_arguments_in_any_case() {
    for (args, want) in [
        (&["mode", "shadow"][..], "shadow"),
        (&["MODE", "SHADOW"], "shadow"),
        (&["mode", "Shadow"], "shadow"),
        (&["rl.mode", "shadow"], "shadow"),
        (&["mode", "enforce"], "enforce"),
        (&[], "enforce"),
    ] {
        let mut with_log = args.to_vec();
        with_log.extend(["--loglevel", "notice"]);
        let s = Server::try_start(&with_log).unwrap_or_else(|log| panic!("{args:?}: {log}"));
        assert_eq!(mode(&s), want, "{args:?}");
        assert!(
            s.log().contains(&format!("loaded, mode {want}")),
            "the effective mode is not in the log: {}",
            s.log()
        );
    }
}

#[test]
fn unknown_or_invalid_arguments_refuse_the_load() {
    for (args, says) in [
        (&["mdoe", "shadow"][..], "unknown argument 'mdoe'"),
        (&["shadow"], "unknown argument 'shadow'"),
        (&["mode"], "needs a value"),
        (&["mode", "shadw"], "invalid value 'shadw'"),
        (
            &["mode", "shadow", "extra", "1"],
            "unknown argument 'extra'",
        ),
    ] {
        match Server::try_start(args) {
            Ok(_) => panic!("{args:?} loaded"),
            Err(log) => {
                assert!(
                    log.contains(says),
                    "{args:?}: the log does not say {says:?}:\n{log}"
                );
                assert!(
                    log.contains("accepted") || log.contains("enforce or shadow"),
                    "{log}"
                );
            }
        }
    }
}

#[test]
fn config_set_takes_values_in_any_case() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("rl.mode")
        .arg("SHADOW")
        .query(&mut c)
        .unwrap();
    assert_eq!(mode(&s), "shadow");
}

/// loadmodule arguments: an empty value, a repeated name with conflicting values and a
/// trailing empty argument are refused or resolved without loading in a surprise mode.
#[test]
fn loadmodule_odd_arguments() {
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
