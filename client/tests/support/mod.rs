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
