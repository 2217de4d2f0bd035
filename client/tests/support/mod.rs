//! A real redis-server for the client's integration tests: a free loopback port, a temp
//! dir, the module built from this tree, no persistence; stopped on drop.

#![allow(dead_code)]

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use redis::aio::{ConnectionManager, ConnectionManagerConfig};

/// `target/<profile>/libredis_rl.so`: the test binary is `target/<profile>/deps/<name>`.
pub fn module_path() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let dir = exe.parent().and_then(Path::parent).expect("target dir");
    let so = dir.join(if cfg!(target_os = "macos") {
        "libredis_rl.dylib"
    } else {
        "libredis_rl.so"
    });
    assert!(
        so.exists(),
        "module not built at {} (run `cargo build -p redis-rl` first)",
        so.display()
    );
    so
}

fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

pub struct Server {
    child: Option<Child>,
    dir: tempfile::TempDir,
    pub port: u16,
    extra: Vec<String>,
}

impl Server {
    /// A server with the module loaded.
    pub fn start() -> Server {
        Server::start_with(&[])
    }

    /// A server not started yet: its port is chosen (free now) and nothing listens on it
    /// until `resume`.
    pub fn stopped() -> Server {
        Server {
            child: None,
            dir: tempfile::tempdir().unwrap(),
            port: free_port(),
            extra: Vec::new(),
        }
    }

    /// A server with extra config arguments (e.g. `["--cluster-enabled", "yes"]`).
    pub fn start_with(extra: &[&str]) -> Server {
        let mut server = Server {
            child: None,
            dir: tempfile::tempdir().unwrap(),
            port: free_port(),
            extra: extra.iter().map(|s| s.to_string()).collect(),
        };
        server.resume();
        server
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Starts the process again on the same port and dir (after `stop`).
    pub fn resume(&mut self) {
        assert!(self.child.is_none(), "already running");
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .args(["--enable-debug-command", "yes", "--loglevel", "warning"])
            .arg("--dir")
            .arg(self.dir.path())
            .arg("--logfile")
            .arg(self.dir.path().join("server.log"))
            .arg("--loadmodule")
            .arg(module_path())
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("cannot start redis-server");
        self.child = Some(child);
        self.wait_ready();
    }

    fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if self.ping() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "redis-server did not start: {}",
                std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn ping(&self) -> bool {
        let Ok(client) = redis::Client::open(self.url()) else {
            return false;
        };
        let Ok(mut conn) = client.get_connection_with_timeout(Duration::from_millis(200)) else {
            return false;
        };
        redis::cmd("PING").query::<String>(&mut conn).is_ok()
    }

    /// Kills the process (Redis goes away mid-run); the port stays ours for `resume`.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// A blocking connection for checks (INFO, raw commands).
    pub fn conn(&self) -> redis::Connection {
        let client = redis::Client::open(self.url()).unwrap();
        let conn = client
            .get_connection_with_timeout(Duration::from_secs(5))
            .unwrap();
        conn.set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        conn
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

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
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
