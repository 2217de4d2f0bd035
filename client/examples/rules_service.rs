//! An axum service limited by a rules document stored in Redis (docs/rules.md): an axum
//! middleware layer checks every request against the layers that apply (per IP, per path,
//! per user tier), answers 429 with the refusing layer's code, and follows the document
//! live.
//!
//! ```sh
//! cargo build -p redis-rl
//! redis-server --port 6379 --loadmodule target/debug/libredis_rl.so &
//! python -m redis_rl rules apply deploy/rules/seed.yaml --redis-url redis://127.0.0.1:6379
//! cargo run -p rl-client --example rules_service
//! curl -i -H 'X-User: 42' -H 'X-Tier: premium' http://127.0.0.1:3000/v1/search/q
//! ```
//!
//! Environment: `REDIS_URL` (default `redis://127.0.0.1:6379/`), `LISTEN`
//! (`127.0.0.1:3000`), `RULES_KEY` (`rl:rules`). The user and tier come from the `X-User`
//! and `X-Tier` headers here; a real service takes them from a verified token.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use rl_client::redis::aio::ConnectionManager;
use rl_client::rules::{RuleDecision, Rules, RulesConfig};

type AppRules = Arc<Rules<ConnectionManager>>;

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_string())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let client = rl_client::redis::Client::open(env_or("REDIS_URL", "redis://127.0.0.1:6379/"))?;
    let conn = client.get_connection_manager().await?;
    let key = env_or("RULES_KEY", "rl:rules");
    let rules: AppRules = Arc::new(Rules::from_redis(conn, &key, RulesConfig::default()).await?);
    let _follow = Rules::follow(&rules, Duration::from_millis(500));
    let app = Router::new()
        .route("/{*path}", get(|| async { "ok\n" }))
        .layer(middleware::from_fn_with_state(rules.clone(), limit));
    let listen: SocketAddr = env_or("LISTEN", "127.0.0.1:3000").parse()?;
    let listener = tokio::net::TcpListener::bind(listen).await?;
    println!(
        "listening on http://{listen}, rules version {:?}",
        rules.document().version
    );
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}

/// The layer: the request's attributes, one check, a 429 or the app's response, with the
/// binding layer's headers either way.
async fn limit(
    State(rules): State<AppRules>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    req: Request,
    next: Next,
) -> Response {
    let mut attrs = HashMap::new();
    attrs.insert("ip".to_string(), peer.ip().to_string());
    attrs.insert("path".to_string(), req.uri().path().to_string());
    attrs.insert("method".to_string(), req.method().to_string());
    for (attr, header) in [("user", "x-user"), ("tier", "x-tier")] {
        if let Some(v) = req.headers().get(header).and_then(|v| v.to_str().ok()) {
            attrs.insert(attr.to_string(), v.to_string());
        }
    }
    let d = match rules.check(&attrs).await {
        Ok(d) => d,
        // Only with fail_open: false; the default lets the request through instead.
        Err(e) => return (StatusCode::SERVICE_UNAVAILABLE, e.to_string()).into_response(),
    };
    let mut resp = if d.allowed {
        next.run(req).await
    } else {
        let mut r = (StatusCode::TOO_MANY_REQUESTS, d.body()).into_response();
        r.headers_mut()
            .insert("content-type", HeaderValue::from_static("application/json"));
        r
    };
    add_headers(&mut resp, &d);
    resp
}

fn add_headers(resp: &mut Response, d: &RuleDecision) {
    if d.layer.is_none() {
        return;
    }
    let h = resp.headers_mut();
    let mut set = |name: &'static str, value: String| {
        if let Ok(v) = HeaderValue::from_str(&value) {
            h.insert(name, v);
        }
    };
    set("x-ratelimit-limit", format!("{}", d.limit));
    set(
        "x-ratelimit-remaining",
        format!("{}", d.remaining.max(0.0).floor()),
    );
    if !d.allowed {
        let secs = d.retry_after.as_millis().div_ceil(1000).max(1);
        set("retry-after", secs.to_string());
    }
}
