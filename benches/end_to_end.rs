//! Per-call latency over one connection to a real redis-server with the module loaded:
//! `RL.TAKE` against `INCR` (the floor) and the classic Lua token-bucket script (`scripts/token_bucket.lua`) via
//! `EVALSHA`, on the same keys. `cargo build --release && cargo bench --bench end_to_end`.
//!
//! The server is started here on a free loopback port in a temp dir (`$RL_SERVER`, else
//! `redis-server` from `PATH`) and stopped at the end. Round trips dominate these numbers;
//! `scripts/bench` measures server time per call and throughput.

use criterion::{criterion_group, criterion_main, Criterion};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const LUA: &str = include_str!("../scripts/token_bucket.lua");
const GRANT: [&str; 2] = ["1000", "1000000000"];
const DENY: [&str; 2] = ["0.000001", "1"];
const RANDOM_KEYS: u64 = 100_000;

struct Server {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Server {
    fn start() -> Server {
        let dir = tempfile::tempdir().unwrap();
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let binary = std::env::var("RL_SERVER").unwrap_or_else(|_| "redis-server".into());
        let child = Command::new(&binary)
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .arg("--dir")
            .arg(dir.path())
            .arg("--loadmodule")
            .arg(module_path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {binary}: {e}"));
        let server = Server {
            child,
            port,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while server.try_conn().is_none() {
            assert!(Instant::now() < deadline, "{binary} did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        server
    }

    fn try_conn(&self) -> Option<redis::Connection> {
        let client = redis::Client::open(format!("redis://127.0.0.1:{}/", self.port)).ok()?;
        let mut conn = client.get_connection().ok()?;
        redis::cmd("PING").query::<String>(&mut conn).ok()?;
        Some(conn)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `libredis_rl.so` of the profile this bench was built with (`target/release/` for
/// `cargo bench`), next to the bench binary's `deps/` folder.
fn module_path() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().and_then(Path::parent).unwrap();
    let so = dir.join(if cfg!(target_os = "macos") {
        "libredis_rl.dylib"
    } else {
        "libredis_rl.so"
    });
    assert!(
        so.exists(),
        "module not built at {} (run cargo build --release first)",
        so.display()
    );
    so
}

fn take(key: &str, limit: [&str; 2]) -> redis::Cmd {
    let mut c = redis::cmd("RL.TAKE");
    c.arg(key).arg(limit[0]).arg(limit[1]).arg(1);
    c
}

fn script(sha: &str, key: &str, limit: [&str; 2]) -> redis::Cmd {
    let mut c = redis::cmd("EVALSHA");
    c.arg(sha)
        .arg(1)
        .arg(key)
        .arg(limit[0])
        .arg(limit[1])
        .arg(1);
    c
}

fn per_call(c: &mut Criterion) {
    let server = Server::start();
    let mut conn = server.try_conn().expect("connection");
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(LUA)
        .query(&mut conn)
        .unwrap();
    // Empty the deny buckets: their only token is taken once here.
    let _: i64 = take("rl:deny", DENY).query(&mut conn).unwrap();
    let _: i64 = script(&sha, "lua:deny", DENY).query(&mut conn).unwrap();

    let mut g = c.benchmark_group("per_call");
    let fixed: Vec<(&str, redis::Cmd, i64)> = vec![
        ("incr", redis::cmd("INCR").arg("k:1").clone(), -1),
        ("rl_take_grant", take("rl:grant", GRANT), 1),
        ("evalsha_grant", script(&sha, "lua:grant", GRANT), 1),
        ("rl_take_deny", take("rl:deny", DENY), 0),
        ("evalsha_deny", script(&sha, "lua:deny", DENY), 0),
    ];
    for (name, cmd, expect) in &fixed {
        let got: i64 = cmd.query(&mut conn).unwrap();
        assert!(*expect < 0 || got == *expect, "{name}: {got}");
        g.bench_function(*name, |b| b.iter(|| cmd.query::<i64>(&mut conn).unwrap()));
    }

    let withstate = take("rl:ws", GRANT).arg("WITHSTATE").clone();
    g.bench_function("rl_take_withstate", |b| {
        b.iter(|| withstate.query::<redis::Value>(&mut conn).unwrap())
    });
    let mut lease = redis::cmd("RL.LEASE");
    // A 1 ms ttl keeps the live leases on this one key well under the 1024 a key may hold.
    lease
        .arg("rl:lease")
        .arg(GRANT[0])
        .arg(GRANT[1])
        .arg(20)
        .arg(1);
    g.bench_function("rl_lease_20", |b| {
        b.iter(|| lease.query::<redis::Value>(&mut conn).unwrap())
    });

    // 100k random keys: the key changes every call (the same sequence for each command).
    let mut i = 0u64;
    let mut next_key = |prefix: &str| {
        i = (i + 7919) % RANDOM_KEYS;
        format!("{prefix}:{i}")
    };
    g.bench_function("incr_random", |b| {
        b.iter(|| {
            let key = next_key("k");
            redis::cmd("INCR").arg(key).query::<i64>(&mut conn).unwrap()
        })
    });
    g.bench_function("rl_take_random", |b| {
        b.iter(|| {
            let key = next_key("rl");
            take(&key, GRANT).query::<i64>(&mut conn).unwrap()
        })
    });
    g.bench_function("evalsha_random", |b| {
        b.iter(|| {
            let key = next_key("lua");
            script(&sha, &key, GRANT).query::<i64>(&mut conn).unwrap()
        })
    });
    g.finish();
}

criterion_group!(benches, per_call);
criterion_main!(benches);
