//! An HTTP service that limits each client key and answers 429 with `Retry-After` and the
//! `X-RateLimit-*` headers.
//!
//! Needs a Redis with the module loaded:
//!
//! ```sh
//! cargo build -p redis-rl
//! redis-server --port 6379 --loadmodule target/debug/libredis_rl.so &
//! cargo run -p rl-client --example http_service
//! curl -i -H 'X-Client-Key: alice' http://127.0.0.1:3000/
//! curl -s http://127.0.0.1:3000/metrics
//! ```
//!
//! Environment: `REDIS_URL` (default `redis://127.0.0.1:6379/`), `LISTEN`
//! (`127.0.0.1:3000`), `RATE` (requests per second per key, `5`), `CAP` (burst, `10`).
//! The key is the `X-Client-Key` header, else the peer's IP address.

use std::net::SocketAddr;

use axum::extract::{ConnectInfo, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use rl_client::redis::aio::ConnectionManager;
use rl_client::{limit, Decision, Limiter, LimiterConfig};

type AppLimiter = Limiter<ConnectionManager>;

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_string())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let redis_url = env_or("REDIS_URL", "redis://127.0.0.1:6379/");
    let listen: SocketAddr = env_or("LISTEN", "127.0.0.1:3000").parse()?;
    let rate: f64 = env_or("RATE", "5").parse()?;
    let cap: f64 = env_or("CAP", "10").parse()?;

    let conn = ConnectionManager::new(rl_client::redis::Client::open(redis_url)?).await?;
    let limiter = Limiter::new(conn, limit(rate, cap)?, LimiterConfig::default())?;
    let app = Router::new()
        .route("/", get(hello))
        .route("/metrics", get(metrics))
        .with_state(limiter);

    let listener = tokio::net::TcpListener::bind(listen).await?;
    println!("listening on http://{listen} ({rate}/s per key, bursts of {cap})");
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}

/// The client key: the `X-Client-Key` header, else the peer address.
fn client_key(headers: &HeaderMap, peer: SocketAddr) -> String {
    let id = headers
        .get("x-client-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
        .unwrap_or_else(|| peer.ip().to_string());
    format!("rl:http:{id}")
}

async fn hello(
    State(limiter): State<AppLimiter>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
) -> Response {
    let key = client_key(&headers, peer);
    match limiter.take(&key, 1).await {
        Ok(decision) if decision.allowed => with_headers(&decision, (StatusCode::OK, "hello\n")),
        Ok(decision) => {
            let body = format!(
                "{{\"error\":{{\"code\":\"rate_limit_exceeded\",\"retry_after\":{}}}}}\n",
                decision.retry_after_secs().max(1)
            );
            let headers = [("content-type", "application/json")];
            with_headers(&decision, (StatusCode::TOO_MANY_REQUESTS, headers, body))
        }
        // Only impossible requests (n above the cap) get here: Redis failures are decided
        // by the failure policy.
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

fn with_headers(decision: &Decision, response: impl IntoResponse) -> Response {
    let mut response = response.into_response();
    for (name, value) in decision.http_headers() {
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(&value),
        ) {
            response.headers_mut().insert(name, value);
        }
    }
    response
}

async fn metrics(State(limiter): State<AppLimiter>) -> String {
    limiter.metrics().snapshot().to_prometheus("rl_client")
}
