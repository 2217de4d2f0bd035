//! A service built on the client starts while Redis is down, answers real HTTP requests
//! under its failure policy, and goes back to Redis once a server comes up on the port:
//! the example's own router and limiter (examples/http_service.rs), over TCP.

mod support;

#[allow(dead_code)]
#[path = "../examples/http_service.rs"]
mod http_service;

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use support::Server;

/// One HTTP/1.1 GET; answers the status code and the raw response (headers and body).
async fn get(addr: SocketAddr, path: &str, client_key: &str) -> (u16, String) {
    let exchange = async {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        let request = format!(
            "GET {path} HTTP/1.1\r\nHost: {addr}\r\nX-Client-Key: {client_key}\r\n\
             Connection: close\r\n\r\n"
        );
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut response = Vec::new();
        stream.read_to_end(&mut response).await.unwrap();
        String::from_utf8(response).unwrap()
    };
    // Far above the limiter's 200 ms timeout: only a hang gets here.
    let response = tokio::time::timeout(Duration::from_secs(10), exchange)
        .await
        .expect("the service did not answer");
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP response: {response:?}"));
    (status, response)
}

/// A counter's value in the `/metrics` text.
async fn metric(addr: SocketAddr, name: &str) -> u64 {
    let (status, text) = get(addr, "/metrics", "ops").await;
    assert_eq!(status, 200);
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .unwrap_or_else(|| panic!("no {name} in {text}"))
        .trim()
        .parse()
        .unwrap()
}

fn header<'a>(response: &'a str, name: &str) -> Option<&'a str> {
    response.lines().find_map(|l| {
        let (n, v) = l.split_once(':')?;
        n.eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_starts_and_serves_without_redis_then_recovers() {
    // Nothing listens on the port yet.
    let mut server = Server::stopped();
    // As the example's main builds it: 3 requests per key, refilling very slowly.
    // With a timeout far above any call's time on a loaded machine: once Redis is up,
    // every decision is its own (an outage here is a refused connection, answered at once).
    let config = rl_client::LimiterConfig {
        instances: 1,
        timeout: Duration::from_secs(10),
        ..Default::default()
    };
    let limiter = http_service::build_limiter_with(&server.url(), 0.01, 3.0, config).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let service = tokio::spawn(async move {
        axum::serve(
            listener,
            http_service::app(limiter).into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
    });

    // Redis is unreachable: fail open through a local bucket of the configured limit.
    for _ in 0..3 {
        let (status, response) = get(addr, "/", "alice").await;
        assert_eq!(status, 200, "{response}");
        assert_eq!(header(&response, "x-ratelimit-limit"), Some("3"));
    }
    let (status, response) = get(addr, "/", "alice").await;
    assert_eq!(status, 429, "the local bucket is spent: {response}");
    assert!(header(&response, "retry-after").is_some());
    assert_eq!(get(addr, "/", "bob").await.0, 200, "keys are independent");
    assert_eq!(metric(addr, "rl_client_fallback_decisions_total").await, 5);
    assert!(metric(addr, "rl_client_redis_errors_total").await >= 1);

    // Redis comes up on the port: the next probe reconnects and decisions come from it.
    server.resume();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let mut admin = server.conn();
    for i in 0.. {
        // A new key each time: a fallback answer spends only the local bucket of its key.
        let key = format!("carol{i}");
        assert_eq!(get(addr, "/", &key).await.0, 200);
        let exists: bool = redis::cmd("EXISTS")
            .arg(format!("rl:http:{key}"))
            .query(&mut admin)
            .unwrap();
        if exists {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "never recovered");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let fallbacks = metric(addr, "rl_client_fallback_decisions_total").await;
    let granted_before = server.info("rl", "rl_granted");
    for _ in 0..3 {
        assert_eq!(get(addr, "/", "dave").await.0, 200);
    }
    let (status, response) = get(addr, "/", "dave").await;
    assert_eq!(status, 429, "{response}");
    assert_eq!(header(&response, "x-ratelimit-remaining"), Some("0"));
    // Redis made all four decisions: it counted the grants, it holds the key, and the
    // failure policy decided nothing more.
    assert_eq!(server.info("rl", "rl_granted") - granted_before, 3.0);
    let peek: Vec<redis::Value> = redis::cmd("RL.PEEK")
        .arg("rl:http:dave")
        .query(&mut admin)
        .unwrap();
    let left: f64 = redis::from_redis_value(&peek[1]).unwrap();
    assert!(left < 1.0, "dave's bucket is spent on the server: {left}");
    assert_eq!(
        metric(addr, "rl_client_fallback_decisions_total").await,
        fallbacks
    );
    service.abort();
}
