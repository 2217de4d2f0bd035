//! The client's integration tests use the module's test kit (`tests/support`: one server
//! launcher for the whole workspace, honouring `RL_SERVER`), with what async clients need on
//! top: a reconnecting connection manager and a client for lazy connections.

#![allow(dead_code)]

#[path = "../../../tests/support/mod.rs"]
#[allow(unused_imports)]
mod kit;

use std::time::{Duration, Instant};

use redis::aio::{ConnectionManager, ConnectionManagerConfig};

/// A real redis-server with the module built from this tree: a free loopback port, a temp
/// dir, no persistence; stopped on drop.
pub struct Server {
    inner: kit::Server,
    pub port: u16,
}

impl Server {
    /// A server with the module loaded.
    pub fn start() -> Server {
        Server::start_with(&[])
    }

    /// A server with extra config arguments (e.g. `["--cluster-enabled", "yes"]`).
    pub fn start_with(extra: &[&str]) -> Server {
        Server::wrap(kit::Server::start(extra))
    }

    /// A server that is not running yet (a client starting while Redis is down).
    pub fn stopped() -> Server {
        Server::wrap(kit::Server::stopped(&[]))
    }

    fn wrap(inner: kit::Server) -> Server {
        let port = inner.port;
        Server { inner, port }
    }

    pub fn url(&self) -> String {
        self.inner.url()
    }

    /// Starts the process again on the same port and dir (after `stop`).
    pub fn resume(&mut self) {
        self.inner.resume();
    }

    /// Kills the process (Redis goes away mid-run); the port stays ours for `resume`.
    pub fn stop(&mut self) {
        self.inner.kill();
    }

    /// A blocking connection for checks (INFO, raw commands).
    pub fn conn(&self) -> redis::Connection {
        self.inner.conn()
    }

    /// A connection manager that reconnects quickly (tests restart the server).
    pub async fn manager(&self) -> ConnectionManager {
        let client = redis::Client::open(self.url()).unwrap();
        let config = ConnectionManagerConfig::new()
            .set_number_of_retries(1)
            .set_factor(10)
            .set_max_delay(100)
            .set_connection_timeout(Duration::from_millis(500))
            .set_response_timeout(Duration::from_secs(5));
        ConnectionManager::new_with_config(client, config)
            .await
            .unwrap()
    }

    /// A client for `LazyConnection` / `from_client` constructors (no I/O).
    pub fn client(&self) -> redis::Client {
        redis::Client::open(self.url()).unwrap()
    }

    /// A lazy connection whose calls are given up only after 30 s: a reply that comes after
    /// a long `DEBUG SLEEP` arrives, however slow the machine (the default response
    /// timeout of 2 s would cut it).
    pub fn patient_lazy(&self) -> rl_client::LazyConnection {
        rl_client::LazyConnection::with_config(
            self.client(),
            rl_client::LazyConfig {
                response_timeout: Duration::from_secs(30),
                ..rl_client::LazyConfig::default()
            },
        )
    }

    /// Makes this server a replica of `master`, in sync.
    pub fn replicate(&self, master: &Server) {
        kit::replicate(&self.inner, &master.inner);
        kit::wait_synced(&master.inner, &self.inner);
    }

    /// Waits until this replica has everything `master` sent so far.
    pub fn synced_with(&self, master: &Server) {
        kit::wait_synced(&master.inner, &self.inner);
    }

    /// `RL.PEEK`'s tokens of `key` (`None`: no key, a full bucket).
    pub fn tokens(&self, key: &str) -> Option<f64> {
        kit::peek_tokens(&mut self.conn(), key)
    }

    /// `RL.PEEK`'s live leases of `key` (0 for no key).
    pub fn live_leases(&self, key: &str) -> i64 {
        let v: redis::Value = redis::cmd("RL.PEEK")
            .arg(key)
            .query(&mut self.conn())
            .unwrap();
        let items = match v {
            redis::Value::Nil => return 0,
            redis::Value::Array(items) => items,
            redis::Value::Map(pairs) => pairs.into_iter().flat_map(|(k, v)| [k, v]).collect(),
            other => panic!("RL.PEEK: {other:?}"),
        };
        items
            .chunks(2)
            .find(|kv| kv[0] == redis::Value::BulkString(b"leases".to_vec()))
            .map(|kv| redis::from_redis_value(&kv[1]).unwrap())
            .unwrap_or(0)
    }

    /// Runs `DEBUG SLEEP secs` on its own connection (the server answers nobody until it
    /// ends) and returns once the server has stopped answering; join the handle to wait for
    /// the end.
    pub fn debug_sleep(&self, secs: f64) -> std::thread::JoinHandle<()> {
        let mut conn = self.conn();
        let mut probe = self.conn();
        let sleeper = std::thread::spawn(move || {
            let _: () = redis::cmd("DEBUG")
                .arg("SLEEP")
                .arg(secs)
                .query(&mut conn)
                .unwrap();
        });
        // A PING that goes unanswered for 50 ms: the sleep has begun.
        probe
            .set_read_timeout(Some(Duration::from_millis(50)))
            .unwrap();
        while redis::cmd("PING").query::<String>(&mut probe).is_ok() {
            assert!(
                !sleeper.is_finished(),
                "DEBUG SLEEP ended before it was seen"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        sleeper
    }

    /// One field of `INFO <section>` as a number.
    pub fn info(&self, section: &str, field: &str) -> f64 {
        let info: String = redis::cmd("INFO")
            .arg(section)
            .query(&mut self.conn())
            .unwrap();
        info.lines()
            .find_map(|l| l.strip_prefix(&format!("{field}:")))
            .unwrap_or_else(|| panic!("no {field} in INFO {section}:\n{info}"))
            .trim()
            .parse()
            .unwrap()
    }
}

/// Polls `f` until it holds, or panics after `secs` with `what`.
pub async fn eventually(secs: u64, what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A redis-server (`RL_SERVER`, default `redis-server`) without the module: what a client
/// meets when the module was not loaded. Killed on drop.
pub struct Plain {
    child: std::process::Child,
    pub port: u16,
    _dir: tempfile::TempDir,
}

impl Plain {
    pub fn start() -> Plain {
        let port = kit::free_port();
        let dir = tempfile::tempdir().unwrap();
        let child = std::process::Command::new(kit::server_binary())
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
            ])
            .arg("--dir")
            .arg(dir.path())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("cannot start redis-server");
        let plain = Plain {
            child,
            port,
            _dir: dir,
        };
        let client = plain.client();
        kit::wait_until(10, "plain server", || {
            client
                .get_connection_with_timeout(Duration::from_millis(200))
                .is_ok()
        });
        plain
    }

    /// [`Plain::start`] with the Functions library (`functions/rl.lua`) loaded.
    pub fn with_library() -> Plain {
        let plain = Plain::start();
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../functions/rl.lua");
        let source = std::fs::read_to_string(path).unwrap();
        let name: String = redis::cmd("FUNCTION")
            .arg("LOAD")
            .arg("REPLACE")
            .arg(source)
            .query(&mut plain.conn())
            .unwrap();
        assert_eq!(name, "rl");
        plain
    }

    pub fn client(&self) -> redis::Client {
        redis::Client::open(format!("redis://127.0.0.1:{}/", self.port)).unwrap()
    }

    /// A blocking connection (for the test's own commands).
    pub fn conn(&self) -> redis::Connection {
        self.client()
            .get_connection_with_timeout(Duration::from_millis(500))
            .unwrap()
    }

    /// A reconnecting async connection for the limiters.
    pub async fn manager(&self) -> redis::aio::ConnectionManager {
        redis::aio::ConnectionManager::new(self.client())
            .await
            .unwrap()
    }
}

impl Drop for Plain {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A TCP proxy in front of a server that can make the connections it carries half-open:
/// after [`Proxy::freeze`], the connections open at that moment stay open but forward
/// nothing more (a peer that vanished without closing, a network partition), while new
/// connections go through. The tokio runtime of the test drives it.
pub struct Proxy {
    pub port: u16,
    frozen: std::sync::Arc<std::sync::atomic::AtomicU64>,
    modes: std::sync::Arc<Modes>,
    accepted: std::sync::Arc<std::sync::atomic::AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    pub async fn start(upstream: u16) -> Proxy {
        use std::sync::atomic::{AtomicU64, Ordering};
        use std::sync::Arc;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let frozen = Arc::new(AtomicU64::new(0));
        let accepted = Arc::new(AtomicU64::new(0));
        let modes = Arc::new(Modes::default());
        let (f, a, m) = (
            Arc::clone(&frozen),
            Arc::clone(&accepted),
            Arc::clone(&modes),
        );
        let task = tokio::spawn(async move {
            loop {
                let Ok((down, _)) = listener.accept().await else {
                    return;
                };
                // Connections are numbered from 1; those up to `frozen` are frozen.
                let number = a.fetch_add(1, Ordering::SeqCst) + 1;
                let f = Arc::clone(&f);
                let m = Arc::clone(&m);
                tokio::spawn(async move {
                    let Ok(up) = tokio::net::TcpStream::connect(("127.0.0.1", upstream)).await
                    else {
                        return;
                    };
                    let (dr, dw) = down.into_split();
                    let (ur, uw) = up.into_split();
                    let a = pump(dr, uw, number, Arc::clone(&f), None);
                    let b = pump(ur, dw, number, f, Some(m));
                    let _ = tokio::join!(a, b);
                });
            }
        });
        Proxy {
            port,
            frozen,
            modes,
            accepted,
            task,
        }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    pub fn client(&self) -> redis::Client {
        redis::Client::open(self.url()).unwrap()
    }

    /// Every connection open now forwards nothing more, and never closes.
    pub fn freeze(&self) {
        use std::sync::atomic::Ordering;
        let n = self.accepted.load(Ordering::SeqCst);
        self.frozen.store(n, Ordering::SeqCst);
    }

    /// Replies are held (every connection, new ones too) until [`Proxy::release`]; the
    /// requests still reach the server.
    pub fn hold(&self) {
        self.modes.held.send_replace(true);
    }

    /// Forwards the held replies and those that follow.
    pub fn release(&self) {
        self.modes.held.send_replace(false);
    }

    /// The next reply on any connection is not forwarded: the connection is closed instead
    /// (the request reached the server, its reply is lost). Cuts once.
    pub fn cut_next_reply(&self) {
        self.modes
            .cut
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> u64 {
        self.accepted.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What a proxy does to replies.
#[derive(Default)]
struct Modes {
    held: tokio::sync::watch::Sender<bool>,
    cut: std::sync::atomic::AtomicBool,
}

/// Forwards `from` to `to`; `replies` for the server-to-client direction.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    number: u64,
    frozen: std::sync::Arc<std::sync::atomic::AtomicU64>,
    replies: Option<std::sync::Arc<Modes>>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let read = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(read) => read,
        };
        if frozen.load(std::sync::atomic::Ordering::SeqCst) >= number {
            // Half-open: keep both sockets, forward nothing, ever.
            std::future::pending::<()>().await;
        }
        if let Some(modes) = &replies {
            if modes.cut.swap(false, std::sync::atomic::Ordering::SeqCst) {
                // Close the client's side: it sees the connection end after its write.
                let _ = to.shutdown().await;
                return;
            }
            let mut held = modes.held.subscribe();
            let _ = held.wait_for(|held| !held).await;
        }
        if to.write_all(&buf[..read]).await.is_err() {
            return;
        }
    }
}

/// Where the timeout is not the point: far above any call's time on a loaded machine (a
/// healthy call must never be taken for an outage).
pub const PATIENT: Duration = Duration::from_secs(10);

/// A call's timeout where one must pass while Redis sleeps: the `DEBUG SLEEP`s here are
/// at least 3 s, so a call answered while Redis still sleeps was answered by its timeout.
pub const TIMEOUT: Duration = Duration::from_secs(1);

/// A prefetching limiter's config for failure tests: no background renewal (every lease is
/// one a take asked for), [`TIMEOUT`] on calls, quick probes.
pub fn prefetch_config(
    policy: rl_client::FailurePolicy,
    instances: u32,
) -> rl_client::PrefetchConfig {
    rl_client::PrefetchConfig {
        batch: 20,
        ttl: Duration::from_secs(60),
        renew_at: 0.0,
        jitter: 0.0,
        limiter: rl_client::LimiterConfig {
            timeout: TIMEOUT,
            probe_interval: Duration::from_millis(100),
            policy,
            instances,
            ..Default::default()
        },
    }
}
