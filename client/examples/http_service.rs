//! An HTTP service that limits each client key and answers 429 with `Retry-After` and the
//! `X-RateLimit-*` headers.
//!
//! With a Redis that has the module loaded:
//!
//! ```sh
//! cargo build -p redis-rl
//! redis-server --port 6379 --loadmodule target/debug/libredis_rl.so &
//! cargo run -p rl-client --example http_service
//! curl -i -H 'X-Client-Key: alice' http://127.0.0.1:3000/
//! curl -s http://127.0.0.1:3000/metrics
//! ```
//!
//! It starts and serves without Redis too: the limiter connects lazily
//! (`Limiter::from_client`), decides by its failure policy (here `Allow`: a local bucket
//! per key) while Redis is unreachable, and goes back to Redis when it answers.
//!
//! Environment: `REDIS_URL` (default `redis://127.0.0.1:6379/`), `LISTEN`
//! (`127.0.0.1:3000`), `RATE` (requests per second per key, `5`), `CAP` (burst, `10`),
//! `INSTANCES` (how many copies of the service share the limit, `1`: each falls back to
//! `RATE / INSTANCES`, `CAP / INSTANCES` while Redis is away).
//! The key is the `X-Client-Key` header, else the peer's IP address.

use std::net::SocketAddr;

use axum::extract::{ConnectInfo, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use rl_client::{limit, Decision, LazyConnection, Limiter, LimiterConfig};

/// The limiter the service uses: over a lazily connecting connection.
pub type AppLimiter = Limiter<LazyConnection>;

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_string())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let redis_url = env_or("REDIS_URL", "redis://127.0.0.1:6379/");
    let listen: SocketAddr = env_or("LISTEN", "127.0.0.1:3000").parse()?;
    let rate: f64 = env_or("RATE", "5").parse()?;
    let cap: f64 = env_or("CAP", "10").parse()?;
    let instances: u32 = env_or("INSTANCES", "1").parse()?;

    let limiter = build_limiter(&redis_url, rate, cap, instances)?;
    // A server without the module is a configuration error: say so and stop. Redis down
    // is not: serve under the failure policy until it is back.
    match limiter.check().await {
        Err(e) if !e.is_outage() => return Err(e.into()),
        Err(e) => eprintln!("redis unreachable ({e}): serving under the failure policy"),
        Ok(_) => {}
    }
    let app = app(limiter);

    let listener = tokio::net::TcpListener::bind(listen).await?;
    println!("listening on http://{listen} ({rate}/s per key, bursts of {cap})");
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}

/// The limiter of `rate` requests a second per key, bursts of `cap`, shared by
/// `instances` copies of the service. No I/O: it connects at the first request, so the
/// service starts whether or not Redis is up, and fails open (`FailurePolicy::Allow`, the
/// default) through a local bucket of `rate / instances`, `cap / instances` per key while
/// it is unreachable.
pub fn build_limiter(
    redis_url: &str,
    rate: f64,
    cap: f64,
    instances: u32,
) -> Result<AppLimiter, Box<dyn std::error::Error>> {
    let config = LimiterConfig {
        instances,
        ..LimiterConfig::default()
    };
    build_limiter_with(redis_url, rate, cap, config)
}

/// [`build_limiter`] with every setting of the limiter given.
pub fn build_limiter_with(
    redis_url: &str,
    rate: f64,
    cap: f64,
    config: LimiterConfig,
) -> Result<AppLimiter, Box<dyn std::error::Error>> {
    let client = rl_client::redis::Client::open(redis_url)?;
    Ok(Limiter::from_client(client, limit(rate, cap)?, config)?)
}

/// The service's routes: `/` (limited per client key) and `/metrics`. Serve it with
/// `into_make_service_with_connect_info::<SocketAddr>()` (the key falls back to the peer
/// address).
pub fn app(limiter: AppLimiter) -> Router {
    Router::new()
        .route("/", get(hello))
        .route("/metrics", get(metrics))
        .with_state(limiter)
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
        // Impossible requests and error replies (a misused key, the module not loaded) get
        // here; outages are decided by the failure policy.
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
