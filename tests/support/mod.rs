//! Real servers for the integration tests: each test starts its own redis-server (or
//! valkey-server, with `RL_SERVER=/path/to/valkey-server`) in a temp dir, with the module
//! built from this tree, and stops it when dropped.

#![allow(dead_code)]

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub use redis::{Commands, Connection, Value};

pub mod cluster;

/// The server binary: `$RL_SERVER`, else `redis-server` from `PATH`.
pub fn server_binary() -> String {
    std::env::var("RL_SERVER").unwrap_or_else(|_| "redis-server".into())
}

/// `$RL_MODULE` if set (to run the suite against another build), else
/// `target/<profile>/libredis_rl.so`, next to the test binary's `deps/` folder.
pub fn module_path() -> PathBuf {
    if let Some(so) = std::env::var_os("RL_MODULE") {
        return PathBuf::from(so);
    }
    let exe = std::env::current_exe().expect("test binary path");
    let dir = exe.parent().and_then(Path::parent).expect("target dir");
    let so = dir.join(format!(
        "libredis_rl.{}",
        if cfg!(target_os = "macos") {
            "dylib"
        } else {
            "so"
        }
    ));
    assert!(
        so.exists(),
        "module not built at {} (run cargo build first)",
        so.display()
    );
    so
}

/// A free loopback port (for servers that must talk to each other over TCP).
///
/// Picked below the kernel's ephemeral range (32768+ on Linux): a port the kernel hands out
/// for `bind(0)` is one it also hands out as the local end of outgoing connections, and with
/// dozens of servers and clients running at once one of those took a cluster bus port
/// between this check and the server's own bind (CI, "bind: Address already in use").
/// [`Server::start`] still retries on a fresh port if the bind loses a race.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    // Test binaries run one after another, threads within one at once: start each process
    // at its own offset and step through the range, skipping ports something holds.
    let seed = std::process::id().wrapping_mul(7919)
        ^ std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
    let _ = NEXT.compare_exchange(0, seed | 1, Ordering::SeqCst, Ordering::SeqCst);
    const LOW: u32 = 20_000;
    const SPAN: u32 = 12_000;
    loop {
        let n = NEXT.fetch_add(1, Ordering::SeqCst);
        let port = (LOW + n % SPAN) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

/// Whether a server's log says it could not listen on its port (a lost race for it).
fn lost_port_race(log: &str) -> bool {
    log.contains("Address already in use")
}

/// The config file a server reads first, if its test wrote one ([`Server::try_start_conf`]).
const CONF: &str = "redis.conf";

fn spawn(dir: &Path, port: u16, extra: &[String], env: &[(String, String)]) -> Child {
    let mut cmd = Command::new(server_binary());
    cmd.envs(env.iter().map(|(k, v)| (k, v)));
    let conf = dir.join(CONF);
    if conf.exists() {
        cmd.arg(&conf);
    }
    cmd.arg("--port")
        .arg(port.to_string())
        .args([
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--enable-debug-command",
            "yes",
        ])
        .args(["--daemonize", "no", "--loglevel", "warning"])
        .arg("--dir")
        .arg(dir)
        .arg("--logfile")
        .arg(dir.join("server.log"));
    // A config file names the module itself: `CONFIG REWRITE` writes its `loadmodule`
    // line there, and a second one on the command line would load it twice. `extra` comes
    // right after the module's path: its first words are `loadmodule` arguments.
    if !conf.exists() {
        cmd.arg("--loadmodule").arg(module_path());
    }
    cmd.args(extra).stdout(Stdio::null()).stderr(Stdio::null());
    cmd.spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", server_binary()))
}

pub struct Server {
    /// The process, while it runs (see [`Server::stopped`], [`Server::kill`]).
    child: Option<Child>,
    pub dir: tempfile::TempDir,
    pub port: u16,
    extra: Vec<String>,
    /// Environment the process starts with besides the test's (`LD_PRELOAD` of a fake clock).
    env: Vec<(String, String)>,
}

impl Server {
    /// A server on a free loopback port with the module loaded and `extra` config args
    /// (`["--appendonly", "yes"]`, ...).
    pub fn start(extra: &[&str]) -> Server {
        let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        Server::start_with(|| extra.clone())
    }

    /// [`Server::start`] with config args made afresh for each try (a cluster node's bus
    /// port is a free port too, and is picked again if a bind loses its race).
    pub fn start_with(extra: impl Fn() -> Vec<String>) -> Server {
        Server::start_with_env(extra, &[])
    }

    /// [`Server::start`] with these environment variables set for the server process (and
    /// again on every restart).
    pub fn start_env(extra: &[&str], env: &[(&str, &str)]) -> Server {
        let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Server::start_with_env(|| extra.clone(), &env)
    }

    fn start_with_env(extra: impl Fn() -> Vec<String>, env: &[(String, String)]) -> Server {
        for _ in 0..5 {
            let dir = tempfile::tempdir().unwrap();
            let port = free_port();
            let extra = extra();
            let child = spawn(dir.path(), port, &extra, env);
            let mut server = Server {
                child: Some(child),
                dir,
                port,
                extra,
                env: env.to_vec(),
            };
            if server.wait_ready_or_exit() {
                return server;
            }
            let log = server.log();
            assert!(lost_port_race(&log), "server did not start: {log}");
            server.child = None;
        }
        panic!("no free port after 5 tries");
    }

    /// Starts a server that may refuse to start (a bad `loadmodule` argument): `Err` holds
    /// its log.
    pub fn try_start(extra: &[&str]) -> Result<Server, String> {
        Server::try_start_in(tempfile::tempdir().unwrap(), extra)
    }

    /// [`Server::try_start`] reading `conf` as its config file first (so `CONFIG REWRITE`
    /// works and rewrites it, and a restart reads it again); the kit's own settings follow
    /// it on the command line.
    pub fn try_start_conf(conf: &str, extra: &[&str]) -> Result<Server, String> {
        let dir = tempfile::tempdir().unwrap();
        let conf = format!("loadmodule {}\n{conf}", module_path().display());
        std::fs::write(dir.path().join(CONF), conf).unwrap();
        Server::try_start_in(dir, extra)
    }

    /// The config file's text, as the server last rewrote it.
    pub fn conf(&self) -> Vec<u8> {
        std::fs::read(self.dir.path().join(CONF)).unwrap_or_default()
    }

    fn try_start_in(dir: tempfile::TempDir, extra: &[&str]) -> Result<Server, String> {
        let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        let port = free_port();
        let mut child = spawn(dir.path(), port, &extra, &[]);
        let deadline = Instant::now() + Duration::from_secs(60);
        let url = format!("redis://127.0.0.1:{port}/");
        loop {
            if let Ok(Some(_)) = child.try_wait() {
                return Err(
                    std::fs::read_to_string(dir.path().join("server.log")).unwrap_or_default()
                );
            }
            if let Ok(client) = redis::Client::open(url.as_str()) {
                if let Ok(mut c) = client.get_connection_with_timeout(Duration::from_millis(200)) {
                    if redis::cmd("PING").query::<String>(&mut c).is_ok() {
                        return Ok(Server {
                            child: Some(child),
                            dir,
                            port,
                            extra,
                            env: Vec::new(),
                        });
                    }
                }
            }
            assert!(
                Instant::now() < deadline,
                "server neither started nor exited"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    pub fn conn(&self) -> Connection {
        let client = redis::Client::open(self.url()).unwrap();
        let conn = client
            .get_connection_with_timeout(Duration::from_secs(5))
            .unwrap();
        conn.set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        conn
    }

    /// A connection allowed to call internal commands: on servers with the `internal`
    /// command flag (Redis 8.0+) `RL.SETSTATE` is hidden from ordinary clients, and
    /// `DEBUG MARK-INTERNAL-CLIENT` lets a test act as the replication link would.
    pub fn internal_conn(&self) -> Connection {
        let mut c = self.conn();
        let _ = redis::cmd("DEBUG")
            .arg("MARK-INTERNAL-CLIENT")
            .query::<Value>(&mut c);
        c
    }

    fn wait_ready(&mut self) {
        assert!(
            self.wait_ready_or_exit(),
            "server did not start: {}",
            self.log()
        );
    }

    /// Waits until the server answers PING (true) or its process has exited (false).
    fn wait_ready_or_exit(&mut self) -> bool {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(child) = &mut self.child {
                if let Ok(Some(_)) = child.try_wait() {
                    return false;
                }
            }
            if let Ok(client) = redis::Client::open(self.url()) {
                if let Ok(mut c) = client.get_connection_with_timeout(Duration::from_millis(200)) {
                    // LOADING replies an error until the dataset is in.
                    if redis::cmd("PING").query::<String>(&mut c).is_ok() {
                        return true;
                    }
                }
            }
            assert!(
                Instant::now() < deadline,
                "server did not start: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }

    /// Stops the server (no save) and starts it again on the same dir, port and config.
    pub fn restart(&mut self) {
        self.stop();
        self.child = Some(spawn(self.dir.path(), self.port, &self.extra, &self.env));
        self.wait_ready();
    }

    /// Rewrites the AOF on `c`, closes it, restarts (so the rewritten AOF is what loads)
    /// and returns a new connection.
    pub fn rewrite_aof_and_restart(&mut self, mut c: Connection) -> Connection {
        rewrite_aof(&mut c);
        drop(c);
        self.restart();
        self.conn()
    }

    fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if let Ok(client) = redis::Client::open(self.url()) {
            if let Ok(mut c) = client.get_connection_with_timeout(Duration::from_millis(500)) {
                let _ = redis::cmd("SHUTDOWN").arg("NOSAVE").query::<()>(&mut c);
            }
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = child.kill();
        let _ = child.wait();
    }

    /// Kills the process hard (a crash, or Redis going away mid-run); the port and dir stay
    /// this server's, for [`Server::resume`].
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the process again on the same port, dir and config after [`Server::kill`] (or
    /// for the first time, after [`Server::stopped`]).
    pub fn resume(&mut self) {
        assert!(self.child.is_none(), "already running");
        self.child = Some(spawn(self.dir.path(), self.port, &self.extra, &self.env));
        self.wait_ready();
    }

    /// A server that is not running yet: a free port and a dir, for a client that must
    /// start while Redis is down ([`Server::resume`] starts it).
    pub fn stopped(extra: &[&str]) -> Server {
        Server {
            child: None,
            dir: tempfile::tempdir().unwrap(),
            port: free_port(),
            extra: extra.iter().map(|s| s.to_string()).collect(),
            env: Vec::new(),
        }
    }

    /// Whether the process has exited (a crash, if the test did not stop it).
    pub fn exited(&mut self) -> bool {
        match &mut self.child {
            Some(child) => matches!(child.try_wait(), Ok(Some(_))),
            None => true,
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

/// `DEBUG DIGEST-VALUE key` as hex.
pub fn digest(c: &mut Connection, key: &str) -> String {
    let v: Vec<String> = redis::cmd("DEBUG")
        .arg("DIGEST-VALUE")
        .arg(key)
        .query(c)
        .unwrap();
    v.into_iter().next().unwrap()
}

/// `DEBUG DIGEST` of the whole dataset.
pub fn dataset_digest(c: &mut Connection) -> String {
    redis::cmd("DEBUG").arg("DIGEST").query(c).unwrap()
}

/// One field of `INFO <section>`, as a number.
pub fn info_field(c: &mut Connection, section: &str, field: &str) -> u64 {
    let info: String = redis::cmd("INFO").arg(section).query(c).unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .unwrap_or_else(|| panic!("no {field} in INFO {section}:\n{info}"))
        .trim()
        .parse()
        .unwrap()
}

/// `RL.TAKE key rate cap n` → tokens granted (on one server or through a cluster client).
pub fn take(c: &mut impl redis::ConnectionLike, key: &str, rate: f64, cap: f64, n: u64) -> i64 {
    redis::cmd("RL.TAKE")
        .arg(key)
        .arg(rate)
        .arg(cap)
        .arg(n)
        .query(c)
        .unwrap()
}

/// `RL.TAKE key rate cap n WITHSTATE` → (granted, remaining, retry_after_ms, reset_after_ms).
pub fn take_state(
    c: &mut impl redis::ConnectionLike,
    key: &str,
    rate: f64,
    cap: f64,
    n: u64,
) -> (i64, f64, i64, i64) {
    let v: (i64, f64, i64, i64) = redis::cmd("RL.TAKE")
        .arg(key)
        .arg(rate)
        .arg(cap)
        .arg(n)
        .arg("WITHSTATE")
        .query(c)
        .unwrap();
    v
}

/// Waits until `f` holds, or panics after `secs` with `what`.
pub fn wait_until(secs: u64, what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Makes `replica` replicate `master` and waits until the link is up and in sync.
pub fn replicate(replica: &Server, master: &Server) {
    // The default waits 5 s for more replicas before a full sync starts.
    let mut m = master.conn();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("repl-diskless-sync-delay")
        .arg(0)
        .query(&mut m)
        .unwrap();
    let mut r = replica.conn();
    let _: () = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(master.port)
        .query(&mut r)
        .unwrap();
    wait_until(30, "replica link up", || {
        let info: String = redis::cmd("INFO").arg("replication").query(&mut r).unwrap();
        info.contains("master_link_status:up")
    });
}

/// Waits until `replica` has processed everything `master` sent so far.
pub fn wait_synced(master: &Server, replica: &Server) {
    let mut m = master.conn();
    let mut r = replica.conn();
    let target = info_field(&mut m, "replication", "master_repl_offset");
    wait_until(30, "replica offset", || {
        info_field(&mut r, "replication", "slave_repl_offset") >= target
    });
}

/// Sends `args` (command name first) and returns the reply as `T`; panics on an error reply.
pub fn query<T: redis::FromRedisValue>(c: &mut Connection, args: &[&str]) -> T {
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    cmd.query(c)
        .unwrap_or_else(|e| panic!("{args:?} failed: {e}"))
}

/// `CONFIG SET rl.mode <mode>`.
pub fn set_mode(c: &mut Connection, mode: &str) {
    let _: () = query(c, &["CONFIG", "SET", "rl.mode", mode]);
}

/// Runs `BGREWRITEAOF` and waits until that rewrite is done and succeeded.
pub fn rewrite_aof(c: &mut Connection) {
    wait_until(30, "no rewrite in progress", || {
        info_field(c, "persistence", "aof_rewrite_in_progress") == 0
            && info_field(c, "persistence", "aof_rewrite_scheduled") == 0
    });
    let before = info_field(c, "persistence", "aof_rewrites");
    let _: String = redis::cmd("BGREWRITEAOF").query(c).unwrap();
    wait_until(30, "BGREWRITEAOF done", || {
        info_field(c, "persistence", "aof_rewrites") > before
            && info_field(c, "persistence", "aof_rewrite_in_progress") == 0
    });
    let info: String = redis::cmd("INFO").arg("persistence").query(c).unwrap();
    assert!(info.contains("aof_last_bgrewrite_status:ok"), "{info}");
}

/// Redis's CRC-64 (Jones polynomial, reflected), which closes every DUMP payload.
pub fn crc64(data: &[u8]) -> u64 {
    let mut crc: u64 = 0;
    for &byte in data {
        crc ^= u64::from(byte);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0x95AC_9329_AC4B_C9B5
            } else {
                crc >> 1
            };
        }
    }
    crc
}

/// A DUMP payload with `body` (type byte and value) in place of the original's, and the
/// original's RDB version, closed with a valid CRC: what a hostile client can RESTORE.
pub fn reseal(original: &[u8], body: &[u8]) -> Vec<u8> {
    let version = &original[original.len() - 10..original.len() - 8];
    let mut out = body.to_vec();
    out.extend_from_slice(version);
    let crc = crc64(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// The body of a DUMP payload (without version and CRC).
pub fn dump_body(payload: &[u8]) -> &[u8] {
    &payload[..payload.len() - 10]
}

/// `DUMP key`.
pub fn dump(c: &mut Connection, key: &str) -> Vec<u8> {
    redis::cmd("DUMP").arg(key).query(c).unwrap()
}

/// Nanoseconds since the Unix epoch, on this machine's clock (the tests' servers share it).
pub fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

/// A connection logged in as a new ACL user `user` (password `pw`) made with `rules`.
pub fn as_user(s: &Server, user: &str, rules: &str) -> Connection {
    let mut admin = s.conn();
    let mut cmd = redis::cmd("ACL");
    cmd.arg("SETUSER")
        .arg(user)
        .arg("reset")
        .arg("on")
        .arg(">pw");
    for r in rules.split_whitespace() {
        cmd.arg(r);
    }
    let _: () = cmd.query(&mut admin).unwrap();
    let mut c = s.conn();
    let _: () = redis::cmd("AUTH")
        .arg(user)
        .arg("pw")
        .query(&mut c)
        .unwrap();
    c
}

/// Whether the current user may run `args` (command first): any reply but a refusal by
/// ACL (NOPERM) or an internal command hidden from it.
pub fn allowed(c: &mut Connection, args: &[&str]) -> bool {
    match redis::cmd(args[0]).arg(&args[1..]).query::<Value>(c) {
        Ok(_) => true,
        Err(e) => {
            let text = e.to_string();
            !(text.contains("NOPERM")
                || text.contains("no permissions")
                || text.contains("unknown command"))
        }
    }
}

/// The tokens `RL.PEEK` shows in a bucket (`None` for a missing key: a full bucket).
pub fn peek_tokens(c: &mut Connection, key: &str) -> Option<f64> {
    let v: Value = redis::cmd("RL.PEEK").arg(key).query(c).unwrap();
    let Value::Array(items) = v else {
        return None;
    };
    let at = items
        .iter()
        .position(|x| redis::from_redis_value::<String>(x).is_ok_and(|s| s == "tokens"))?;
    redis::from_redis_value(&items[at + 1]).ok()
}

/// The server's clock (`TIME`) in whole milliseconds since the epoch. Tests bracket a
/// command with two readings (`before <= when it ran <= after`) and compare expiries,
/// waits and refill against them, so that time passing on a slow or busy machine widens
/// the bracket instead of failing the test.
pub fn server_ms(c: &mut Connection) -> i64 {
    let (s, us): (String, String) = redis::cmd("TIME").query(c).unwrap();
    s.parse::<i64>().unwrap() * 1000 + us.parse::<i64>().unwrap() / 1000
}

/// Asserts that `key` expires `ttl` ms (a range, as the command computed it) after the
/// write that set it, which ran between the server times `during.0` and `during.1`
/// ([`server_ms`]); one ms of slack each side for rounding to whole ms.
pub fn assert_expires_in(
    c: &mut Connection,
    key: &str,
    during: (i64, i64),
    ttl: std::ops::RangeInclusive<i64>,
) {
    let at: i64 = redis::cmd("PEXPIRETIME").arg(key).query(c).unwrap();
    let (lo, hi) = (during.0 + ttl.start() - 1, during.1 + ttl.end() + 1);
    assert!(
        (lo..=hi).contains(&at),
        "{key}: PEXPIRETIME {at}, expected {ttl:?} ms after the write (server time {}..={}): \
         {lo}..={hi}",
        during.0,
        during.1
    );
}

/// A small deterministic generator (xorshift64*), so a failure can be replayed and every
/// run sends the same calls.
pub struct Rng(pub u64);

impl Rng {
    /// Seeded from `$SEED` (to replay a failure), else `default`.
    pub fn seeded(default: u64) -> Rng {
        Rng(std::env::var("SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(default))
    }

    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    pub fn pick<'a, T>(&mut self, xs: &'a [T]) -> &'a T {
        &xs[self.below(xs.len() as u64) as usize]
    }

    /// True `percent` times in a hundred.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// `RESTORE key 0 payload REPLACE`: the server's reply, refused or not.
pub fn restore_replace(c: &mut Connection, key: &str, payload: &[u8]) -> redis::RedisResult<Value> {
    redis::cmd("RESTORE")
        .arg(key)
        .arg(0)
        .arg(payload)
        .arg("REPLACE")
        .query(c)
}

/// Keys expire only when looked at (`DEBUG SET-ACTIVE-EXPIRE 0`), so "nothing changed"
/// compares like with like.
pub fn no_active_expire(c: &mut Connection) {
    let _: () = redis::cmd("DEBUG")
        .arg("SET-ACTIVE-EXPIRE")
        .arg(0)
        .query(c)
        .unwrap();
}

/// Makes `s` write out what its AOF buffer holds before this returns. Under `appendfsync
/// everysec` the server may put a write off for up to 2 s while a background fsync runs
/// (on a loaded machine), so a reply can arrive before its command is in the file; under
/// `always` every buffered write is made before the next reply (this one's included).
pub fn flush_aof(s: &Server) {
    let _: () = query(&mut s.conn(), &["CONFIG", "SET", "appendfsync", "always"]);
}

/// The RESP commands in the AOF files of `s` (arguments read by their lengths: a binary
/// `RESTORE` payload may hold line ends), each argument as text (lossy), once the server
/// wrote out what it holds ([`flush_aof`]).
pub fn aof_commands(s: &Server) -> Vec<Vec<String>> {
    flush_aof(s);
    let dir = s.dir.path().join("appendonlydir");
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "aof"))
        .collect();
    files.sort();
    let mut bytes = Vec::new();
    for p in files {
        bytes.extend(std::fs::read(p).unwrap());
    }
    // The number after a one-byte marker at `at`, up to its CRLF; the position after it.
    let number = |at: usize| -> (usize, usize) {
        let end = at + bytes[at..].windows(2).position(|w| w == b"\r\n").unwrap();
        let n = std::str::from_utf8(&bytes[at + 1..end])
            .unwrap()
            .parse()
            .unwrap();
        (n, end + 2)
    };
    let mut out = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        // An RDB preamble or anything else before a command: skip a byte.
        if bytes[at] != b'*' {
            at += 1;
            continue;
        }
        let (n, mut next) = number(at);
        let mut c = Vec::with_capacity(n);
        for _ in 0..n {
            let (len, body) = number(next);
            c.push(String::from_utf8_lossy(&bytes[body..body + len]).into_owned());
            next = body + len + 2;
        }
        out.push(c);
        at = next;
    }
    out
}

/// One holder's `RL.SHARE` call as a fleet test records it: when it was sent and answered
/// (ns, the test's clock), the share's rate and burst, and its `lease_ms`.
pub type ShareCall = (u64, u64, f64, f64, u64);

/// When holders may use the shares they were given, for the bound: per call, from its
/// answer to its lease's end (less a margin for the holder's own clock), as (from, until,
/// rate, burst); a holder's next call ends the previous share at its answer, or at the
/// server's hold (250 ms after it was sent) if that comes first.
pub fn share_uses(holders: &[Vec<ShareCall>]) -> Vec<(u64, u64, f64, f64)> {
    const MS: u64 = 1_000_000;
    let mut uses: Vec<(u64, u64, f64, f64)> = Vec::new();
    for calls in holders {
        let mut current: Option<usize> = None;
        for &(sent, answered, rate, burst, lease_ms) in calls {
            if let Some(i) = current.take() {
                let stop = answered.min(sent + 250 * MS).max(uses[i].0);
                uses[i].1 = uses[i].1.min(stop);
            }
            let lease = lease_ms * MS;
            let margin = lease / 100 + 10 * MS;
            if lease > margin && answered < sent + lease - margin {
                uses.push((answered, sent + lease - margin, rate, burst));
                current = Some(uses.len() - 1);
            }
        }
    }
    uses
}

/// A payload body cut at every length and with every byte set to a few telling values:
/// what a hostile or corrupt `RESTORE` may hand the module.
pub fn mutated_payloads(body: &[u8]) -> Vec<Vec<u8>> {
    let mut variants: Vec<Vec<u8>> = (1..body.len()).map(|n| body[..n].to_vec()).collect();
    for i in 1..body.len() {
        for v in [0u8, 1, 2, 3, 4, 0x7f, 0x80, 0xff] {
            let mut b = body.to_vec();
            b[i] = v;
            variants.push(b);
        }
    }
    variants
}

/// Waits until `INFO rl`'s gauge `field` reads `want`. After `DEBUG RELOAD` or `FLUSHALL`
/// the old dataset may be freed on a background thread (Valkey frees flushed data lazily by
/// default): a gauge that counts values settles once they are freed.
pub fn gauge_settles(c: &mut Connection, field: &str, want: u64) {
    wait_until(10, &format!("{field} to settle at {want}"), || {
        info_field(c, "rl", field) == want
    });
}

/// The integers of an array reply (`i64::MIN` for an element that is not one).
pub fn ints(v: &Value) -> Vec<i64> {
    match v {
        Value::Array(items) => items
            .iter()
            .map(|x| redis::from_redis_value::<i64>(x).unwrap_or(i64::MIN))
            .collect(),
        other => panic!("{other:?}"),
    }
}

/// Sends one command of a storm: refusals are fine, a caught panic is not.
pub fn storm_send(c: &mut Connection, args: &[String]) -> redis::RedisResult<Value> {
    let r = redis::cmd(&args[0]).arg(&args[1..]).query::<Value>(c);
    if let Err(e) = &r {
        let text = e.to_string();
        assert!(
            !text.contains("internal error") && !text.contains("panic"),
            "{args:?} hit a caught panic: {text}"
        );
    }
    r
}
