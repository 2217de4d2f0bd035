//! The rl counters reach Prometheus through the exporter users run: Debian's
//! `prometheus-redis-exporter` (redis_exporter 1.45), with `scripts/rl-exporter.lua` as its
//! `-script` (it scrapes `INFO ALL`, which leaves module sections out, and has no option to
//! read them). `scripts/install-deps` installs it; where it is not installed the test says
//! so and skips.

mod support;
use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::Duration;
use support::*;

const EXPORTER: &str = "prometheus-redis-exporter";

fn scrape(port: u16) -> Option<String> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .ok()?;
    let mut body = String::new();
    s.read_to_string(&mut body).ok()?;
    body.contains("200 OK").then_some(body)
}

fn metric(body: &str, key: &str) -> Option<f64> {
    let prefix = format!("redis_script_values{{key=\"{key}\"}} ");
    body.lines()
        .find_map(|l| l.strip_prefix(&prefix)?.trim().parse().ok())
}

#[test]
fn exporter_publishes_global_and_namespace_counters() {
    if Command::new(EXPORTER).arg("-version").output().is_err() {
        eprintln!("SKIPPED: {EXPORTER} is not installed (apt-get install {EXPORTER}; scripts/install-deps does)");
        return;
    }
    let s = Server::start(&[]);
    let mut c = s.conn();
    assert_eq!(take(&mut c, "orders:1", 0.001, 2.0, 2), 2);
    assert_eq!(take(&mut c, "orders:1", 0.001, 2.0, 1), 0);
    let _: i64 = query(&mut c, &["RL.TAKE", "users:1", "0.001", "1", "1"]);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/rl-exporter.lua");
    let port = free_port();
    let mut exporter = Command::new(EXPORTER)
        .arg("-redis.addr")
        .arg(format!("redis://127.0.0.1:{}", s.port))
        .arg("-web.listen-address")
        .arg(format!("127.0.0.1:{port}"))
        .arg("-script")
        .arg(script)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut body = None;
    wait_until(20, "exporter up", || {
        body = scrape(port);
        body.is_some()
    });
    let _ = exporter.kill();
    let _ = exporter.wait();
    let body = body.unwrap();
    assert_eq!(metric(&body, "rl_calls"), Some(3.0), "{body}");
    assert_eq!(metric(&body, "rl_granted"), Some(2.0));
    assert_eq!(metric(&body, "rl_denied"), Some(1.0));
    assert_eq!(metric(&body, "rl_ns_calls;orders"), Some(2.0));
    assert_eq!(metric(&body, "rl_ns_denied;orders"), Some(1.0));
    assert_eq!(metric(&body, "rl_ns_tokens_granted;orders"), Some(2.0));
    assert_eq!(metric(&body, "rl_ns_granted;users"), Some(1.0));
    // Its own INFO scrape has no module section: without the script nothing rl_ shows.
    assert!(!body.lines().any(|l| l.starts_with("redis_rl_")));
}
