//! Access control: RL commands sit in the ACL categories their effect calls for, PEEK
//! works under read-only key permissions, RL.SETSTATE is for the replication link only,
//! and on every server the ACL lines of docs/deploy.md ("ACL") do what they say.

mod support;

use support::*;

const TAKE: &[&str] = &["RL.TAKE", "k", "10", "10"];
const PEEK: &[&str] = &["RL.PEEK", "k"];
const LEASE: &[&str] = &["RL.LEASE", "k", "10", "10", "1", "1000"];
const RETURN: &[&str] = &["RL.RETURN", "k", "1", "1"];
const MTAKE: &[&str] = &["RL.MTAKE", "1", "{t}a", "10", "10", "{t}b", "10", "10"];
const SETSTATE: &[&str] = &["RL.SETSTATE", "k", "0", "10", "10"];

/// The categories `COMMAND INFO` lists for `cmd` (empty where the server cannot set them).
fn categories(c: &mut Connection, cmd: &str) -> String {
    let info: Value = redis::cmd("COMMAND").arg("INFO").arg(cmd).query(c).unwrap();
    format!("{info:?}")
}

#[test]
fn categories_where_the_server_has_them() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let take = categories(&mut c, "RL.TAKE");
    if !take.contains("@write") {
        // Redis 7.0: no API to set them; docs/deploy.md's explicit rules apply (next test).
        eprintln!("this server cannot set module ACL categories: skipped");
        assert!(!categories(&mut c, "RL.PEEK").contains("@read"));
        return;
    }
    assert!(take.contains("@fast"), "{take}");
    assert!(categories(&mut c, "RL.PEEK").contains("@read"));
    for cmd in ["RL.LEASE", "RL.RETURN", "RL.MTAKE"] {
        assert!(categories(&mut c, cmd).contains("@write"), "{cmd}");
    }

    // Everything but writes and dangerous commands: no RL write, PEEK yes.
    let mut reader = as_user(&s, "reader", "~* +@all -@write -@dangerous");
    for args in [TAKE, LEASE, RETURN, MTAKE, SETSTATE] {
        assert!(!allowed(&mut reader, args), "{args:?}");
    }
    assert!(allowed(&mut reader, PEEK));

    // Writes only: the RL writes, not PEEK.
    let mut writer = as_user(&s, "writer", "~* +@write");
    for args in [TAKE, LEASE, RETURN, MTAKE] {
        assert!(allowed(&mut writer, args), "{args:?}");
    }
    assert!(!allowed(&mut writer, PEEK));

    // The module's own category, where the server can create one.
    if take.contains("@ratelimit") {
        let mut rl = as_user(&s, "rl", "~* +@ratelimit");
        for args in [TAKE, LEASE, RETURN, MTAKE, PEEK] {
            assert!(allowed(&mut rl, args), "{args:?}");
        }
        assert!(!allowed(&mut rl, &["GET", "k"]));
        assert!(!allowed(&mut rl, SETSTATE));
    }

    // RL.SETSTATE is admin and dangerous.
    let mut ops = as_user(&s, "ops", "~* +@all -@dangerous");
    assert!(!allowed(&mut ops, SETSTATE));
    assert!(allowed(&mut ops, TAKE));
}

#[test]
fn peek_needs_only_read_permission_on_the_key() {
    let s = Server::start(&[]);
    let mut admin = s.conn();
    let _: i64 = redis::cmd("RL.TAKE")
        .arg(&["k", "10", "10"])
        .query(&mut admin)
        .unwrap();
    let mut ro = as_user(&s, "ro", "%R~* +rl.peek +rl.take");
    assert!(allowed(&mut ro, PEEK));
    assert!(
        !allowed(&mut ro, TAKE),
        "a write through a read-only key pattern"
    );
}

/// The ACL lines of docs/deploy.md, on every server (Redis 7.0 has no module categories).
#[test]
fn readme_acl_rules_do_what_they_say() {
    let s = Server::start(&[]);
    let mut app = as_user(
        &s,
        "app",
        "~* +rl.take +rl.lease +rl.return +rl.mtake +rl.peek +rl.reserve +rl.refund +rl.share +rl.acquire +rl.release +rl.renew",
    );
    for args in [TAKE, LEASE, RETURN, MTAKE, PEEK] {
        assert!(allowed(&mut app, args), "{args:?}");
    }
    for args in [
        &["RL.RESERVE", "r", "10", "10", "1", "0"][..],
        &["RL.REFUND", "r", "1"],
        &["RL.ACQUIRE", "p", "1", "1000"],
        &["RL.RELEASE", "p", "1"],
        &["RL.RENEW", "p", "1", "1000"],
        &["RL.SHARE", "sh", "10", "10", "h", "5", "1000"],
    ] {
        assert!(allowed(&mut app, args), "{args:?}");
    }
    assert!(!allowed(&mut app, &["RL.SETPERMITS", "p", "LASTID", "1"]));
    assert!(!allowed(&mut app, SETSTATE));
    assert!(!allowed(&mut app, &["GET", "k"]));

    let mut viewer = as_user(&s, "viewer", "%R~* +rl.peek");
    assert!(allowed(&mut viewer, PEEK));
    assert!(!allowed(&mut viewer, TAKE));

    let mut others = as_user(
        &s,
        "others",
        "~* +@all -@dangerous -rl.setstate -rl.setshares -rl.setpermits",
    );
    assert!(allowed(&mut others, TAKE));
    assert!(!allowed(&mut others, SETSTATE));
    assert!(!allowed(
        &mut others,
        &["RL.SETPERMITS", "p", "LASTID", "1"]
    ));
}

/// On servers with the `internal` command flag (Redis 8.0+), ordinary clients do not even
/// see RL.SETSTATE; elsewhere it is a client-callable command that ACL must deny.
#[test]
fn setstate_is_internal_where_the_server_can_hide_it() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let listed: Value = redis::cmd("COMMAND")
        .arg("INFO")
        .arg("RL.SETSTATE")
        .query(&mut c)
        .unwrap();
    let direct = redis::cmd("RL.SETSTATE")
        .arg(&["k", "0", "1", "1"])
        .query::<()>(&mut c);
    let internal_client = redis::cmd("DEBUG")
        .arg("MARK-INTERNAL-CLIENT")
        .query::<Value>(&mut s.conn())
        .is_ok();
    if internal_client {
        let e = direct.unwrap_err().to_string();
        assert!(e.contains("unknown command"), "{e}");
        assert_eq!(format!("{listed:?}"), "array([nil])");
        // The replication link and the AOF are internal: a replica still applies effects.
        let replica = Server::start(&[]);
        replicate(&replica, &s);
        let _: i64 = redis::cmd("RL.TAKE")
            .arg(&["k", "1", "10", "3"])
            .query(&mut c)
            .unwrap();
        wait_synced(&s, &replica);
        assert_eq!(digest(&mut replica.conn(), "k"), digest(&mut c, "k"));
    } else {
        assert!(direct.is_ok(), "{direct:?}");
    }
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

fn int(c: &mut Connection, args: &[&str]) -> i64 {
    query(c, args)
}

/// ACL: `%R~` users may RL.PEEK but not write; `+@ratelimit` (where it exists) and
/// `+@all -@dangerous` never reach RL.SETSTATE; key patterns apply to every RL.MTAKE key
/// (getkeys-api), options included.
#[test]
fn acl_key_patterns_peek_and_setstate() {
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

/// The internal setters write any state a key can hold: on every server, a user without
/// admin rights cannot call them (Redis 7.0 gives module commands no ACL category, so
/// `-@admin -@dangerous` alone did not reach them: the module checks the caller itself),
/// nor can a script, while an operator who may run `CONFIG SET` still can.
#[test]
fn internal_setters_are_refused_to_users_without_admin_rights_on_every_server() {
    let s = Server::start(&[]);
    let setters: &[&[&str]] = &[
        &["RL.SETSTATE", "k", "0", "10", "10"],
        &[
            "RL.SETSHARES",
            "sh",
            "10",
            "10",
            "1",
            "0",
            "h",
            "1,1,1,0,0,0,0",
        ],
        &["RL.SETPERMITS", "p", "LASTID", "1"],
    ];
    let mut app = as_user(&s, "app", "~* +@all -@admin -@dangerous");
    for args in setters {
        assert!(
            !allowed(&mut app, args),
            "{args:?} ran for a non-admin user"
        );
    }
    assert_eq!(
        query::<Value>(&mut s.conn(), &["EXISTS", "k", "sh", "p"]),
        Value::Int(0)
    );
    // A script runs on a client of its own: refused even for the default (admin) user.
    let mut admin = s.internal_conn();
    let script = redis::cmd("EVAL")
        .arg("return redis.call('RL.SETSTATE', KEYS[1], '0', '10', '10')")
        .arg(1)
        .arg("k")
        .query::<Value>(&mut admin);
    assert!(script.is_err(), "{script:?}");
    // An operator may (the tests forge states this way).
    for args in setters {
        let r = redis::cmd(args[0])
            .arg(&args[1..])
            .query::<Value>(&mut admin);
        let refused = r
            .as_ref()
            .err()
            .is_some_and(|e| e.to_string().contains("NOPERM"));
        assert!(!refused, "{args:?}: {r:?}");
    }
    // The application still runs what it needs.
    assert!(allowed(&mut app, &["RL.TAKE", "t", "1", "10"]));
}

/// Whether `args` was refused for want of permission (directly, `NOPERM`; in a script,
/// Redis 8.2+ and Valkey answer `ERR ACL failure in script: ... no permissions ...`).
fn refused(r: redis::RedisResult<Value>) -> bool {
    match r {
        Ok(_) => false,
        Err(e) => {
            let text = e.to_string();
            text.contains("NOPERM") || text.contains("no permissions")
        }
    }
}

/// Pinning is an operator's act on every server. Where the module's commands have ACL
/// categories (Redis 7.2+, Valkey) `-@admin` reaches RL.PIN and RL.UNPIN; on Redis 7.0 it
/// cannot (no categories for module commands), and the module holds them to the setters'
/// rule: a user allowed `CONFIG SET`, the replication link, or loading. So a user with
/// `+@all -@admin -@dangerous` can pin nowhere: not directly, not in a script, not in MULTI.
#[test]
fn an_application_with_most_rights_cannot_pin() {
    let s = Server::start(&[]);
    let mut admin = s.conn();
    ok_pin(&mut admin, &["RL.PIN", "pinned", "BLOCK"]);
    let mut app = as_user(&s, "app", "~* +@all -@admin -@dangerous");
    let eval = |what: &str, key: &str| {
        let script = format!(
            "return redis.call('{what}', KEYS[1]{})",
            if what == "RL.PIN" { ", 'EXEMPT'" } else { "" }
        );
        redis::cmd("EVAL").arg(script).arg(1).arg(key).clone()
    };
    for (name, args) in [
        ("RL.PIN", &["k", "EXEMPT"][..]),
        ("RL.PIN", &["k", "1000", "1000", "PX", "60000"]),
        ("RL.PIN", &["pinned", "EXEMPT"]),
        ("RL.UNPIN", &["pinned"]),
    ] {
        let key = args[0];
        let direct = redis::cmd(name).arg(args).query::<Value>(&mut app);
        assert!(refused(direct), "{name} {args:?}");
        assert!(
            refused(eval(name, key).query::<Value>(&mut app)),
            "EVAL {name} {key}"
        );
        // In MULTI: refused when queued (8.2, Valkey: EXECABORT) or in EXEC's reply (7.0).
        let _: () = redis::cmd("MULTI").query(&mut app).unwrap();
        let queued = redis::cmd(name).arg(args).query::<Value>(&mut app);
        let exec = redis::cmd("EXEC").query::<Value>(&mut app);
        let queued = refused(queued);
        assert!(queued || refused(exec), "MULTI {name} {args:?}");
    }
    // Nothing changed: `k` holds no pin, `pinned` still its BLOCK.
    assert_eq!(query::<Value>(&mut admin, &["RL.PINNED", "k"]), Value::Nil);
    assert_eq!(query::<i64>(&mut admin, &["EXISTS", "k"]), 0);
    let still: Value = query(&mut admin, &["RL.PINNED", "pinned"]);
    assert!(format!("{still:?}").contains("block"), "{still:?}");
    // RL.PINNED only reads: open to the application.
    assert!(allowed(&mut app, &["RL.PINNED", "pinned"]));
    assert!(allowed(&mut app, &["RL.TAKE", "t", "10", "10"]));

    // The refusal says what is needed where the module gave it (Redis 7.0).
    let text = redis::cmd("RL.PIN")
        .arg(&["k", "BLOCK"])
        .query::<Value>(&mut app)
        .unwrap_err()
        .to_string();
    let categories = categories(&mut admin, "RL.PIN").contains("@admin");
    if !categories {
        assert!(text.contains("CONFIG SET"), "{text}");
    }

    // An admin pins and unpins: directly, in MULTI, and in a script where the server checks
    // the script's user (with categories); on Redis 7.0 the module cannot see who runs a
    // script, so RL.PIN there is refused to everyone (docs/deploy.md "ACL").
    assert_eq!(query::<i64>(&mut admin, &["RL.UNPIN", "pinned"]), 1);
    let _: () = redis::cmd("MULTI").query(&mut admin).unwrap();
    let _: () = redis::cmd("RL.PIN")
        .arg(&["m", "BLOCK"])
        .query(&mut admin)
        .unwrap();
    let exec: Vec<Value> = redis::cmd("EXEC").query(&mut admin).unwrap();
    assert_eq!(exec, vec![Value::Okay], "MULTI RL.PIN as admin");
    let in_script = eval("RL.PIN", "e").query::<Value>(&mut admin);
    if categories {
        assert!(in_script.is_ok(), "{in_script:?}");
    } else {
        assert!(refused(in_script));
    }
}

/// A pin reaches replicas and survives an AOF restart whoever may call RL.PIN: the
/// replication link and AOF loading pass the module's check (Redis 7.0) and the server's.
#[test]
fn replicas_and_aof_replay_apply_pins() {
    let mut s = Server::start(&["--appendonly", "yes"]);
    let replica = Server::start(&[]);
    replicate(&replica, &s);
    let mut c = s.conn();
    ok_pin(&mut c, &["RL.PIN", "a", "5", "10", "PX", "600000"]);
    ok_pin(&mut c, &["RL.PIN", "b", "BLOCK"]);
    ok_pin(&mut c, &["RL.PIN", "u", "EXEMPT"]);
    assert_eq!(query::<i64>(&mut c, &["RL.UNPIN", "u"]), 1);
    wait_synced(&s, &replica);
    let mut r = replica.conn();
    for key in ["a", "b", "u"] {
        assert_eq!(
            digest(&mut r, key),
            digest(&mut c, key),
            "{key} on the replica"
        );
    }
    assert!(format!("{:?}", query::<Value>(&mut r, &["RL.PINNED", "b"])).contains("block"));
    assert_eq!(query::<Value>(&mut r, &["RL.PINNED", "u"]), Value::Nil);
    let before: Vec<String> = ["a", "b"].iter().map(|k| digest(&mut c, k)).collect();
    flush_aof(&s);
    drop(c);
    s.restart();
    let mut c = s.conn();
    let after: Vec<String> = ["a", "b"].iter().map(|k| digest(&mut c, k)).collect();
    assert_eq!(before, after, "pins after an AOF restart");
    assert!(format!("{:?}", query::<Value>(&mut c, &["RL.PINNED", "a"])).contains("rate"));
}

fn ok_pin(c: &mut Connection, args: &[&str]) {
    let r: Value = redis::cmd(args[0]).arg(&args[1..]).query(c).unwrap();
    assert_eq!(r, Value::Okay, "{args:?}");
}

/// docs/deploy.md's pinner line works on every server: `+rl.pin +rl.unpin` where the
/// categories exist, with `+config|set` for Redis 7.0, where the module asks for it; without
/// `+config|set` it pins only where ACL rules decide alone.
#[test]
fn the_documented_pinner_pins_on_every_server() {
    let s = Server::start(&[]);
    let mut admin = s.conn();
    let with_categories = categories(&mut admin, "RL.PIN").contains("@admin");
    let mut pinner = as_user(
        &s,
        "pinner",
        "~* +rl.pin +rl.unpin +rl.pinned +rl.top +config|set",
    );
    ok_pin(&mut pinner, &["RL.PIN", "p", "BLOCK", "PX", "60000"]);
    assert!(allowed(&mut pinner, &["RL.PINNED", "p"]));
    assert_eq!(query::<i64>(&mut pinner, &["RL.UNPIN", "p"]), 1);
    let mut bare = as_user(&s, "bare", "~* +rl.pin +rl.unpin +rl.pinned");
    let r = redis::cmd("RL.PIN")
        .arg(&["q", "BLOCK"])
        .query::<Value>(&mut bare);
    assert_eq!(r.is_ok(), with_categories, "{r:?}");
}
