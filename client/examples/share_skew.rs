//! One process of `scripts/benchtool/share_skew.py --client rust`: a `ShareLimiter` (default
//! settings but the failure policy, `Deny`) created at the fleet's shared start, taking one
//! token at a time at this process's paced demand, counting what it was let out in 10 ms
//! bins. Prints one JSON line, the one the Python child prints (`bins` as `[[bin, n], ...]`,
//! `redis_calls`, `fallback_decisions`, `late_start_ms`, `redis_timeouts`, and the calls'
//! `latency_buckets` (`rl_client::LATENCY_BUCKETS_US`)).
//!
//!     share_skew URL SCENARIO PROC SECONDS START_NS [module|functions]
//!
//! The scenarios and their demands are `share_skew.py`'s (`demand_at` there and here).

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rl_client::{limit, Backend, FailurePolicy, ShareConfig, ShareLimiter};

const KEY: &str = "bench:skew";
const RATE: f64 = 1000.0;
const CAP: f64 = 1000.0;
const BIN_MS: f64 = 10.0;
const MOVE_S: f64 = 3.0;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

fn demands(scenario: &str) -> Res<Vec<f64>> {
    Ok(match scenario {
        "four" | "moving" => vec![900.0, 200.0, 200.0, 200.0],
        "seed" => vec![400.0, 400.0, 400.0, 60.0, 60.0, 60.0, 60.0, 60.0],
        other => return Err(format!("unknown scenario {other}").into()),
    })
}

fn demand_at(scenario: &str, d: &[f64], proc: usize, t: f64) -> f64 {
    if scenario != "moving" {
        return d[proc];
    }
    let hot = (t / MOVE_S) as usize % d.len();
    d[(proc + d.len() - hot) % d.len()]
}

fn main() -> Res<()> {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    if argv.len() < 5 {
        return Err("usage: share_skew URL SCENARIO PROC SECONDS START_NS [BACKEND]".into());
    }
    let (url, scenario) = (&argv[0], argv[1].as_str());
    let proc: usize = argv[2].parse()?;
    let seconds: f64 = argv[3].parse()?;
    let start_wall: u64 = argv[4].parse()?;
    let d = demands(scenario)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let wall = SystemTime::now().duration_since(UNIX_EPOCH)?.as_nanos() as u64;
    std::thread::sleep(Duration::from_nanos(start_wall.saturating_sub(wall)));
    let t0 = Instant::now();
    // How late this process made its limiter after the shared start (it came up, or was
    // scheduled, late): `late_start_ms`.
    let woke = SystemTime::now().duration_since(UNIX_EPOCH)?.as_nanos() as u64;
    let late_ms = woke.saturating_sub(start_wall) as f64 / 1e6;
    let mut config = ShareConfig::default();
    config.limiter.policy = FailurePolicy::Deny;
    if argv.get(5).map(String::as_str) == Some("functions") {
        config.limiter.backend = Backend::Functions;
    }
    let client = redis::Client::open(url.as_str())?;
    // Created at the shared start: the fleet starts together.
    let limiter = runtime
        .block_on(async { ShareLimiter::from_client(client, KEY, limit(RATE, CAP)?, config) })?;
    let mut bins = vec![0u64; (seconds * 1000.0 / BIN_MS) as usize];
    let (mut due, mut made, mut last) = (0.0f64, 0u64, 0.0f64);
    loop {
        let t = t0.elapsed().as_secs_f64();
        if t >= seconds {
            break;
        }
        due += demand_at(scenario, &d, proc, t) * (t - last);
        last = t;
        let at = (t * 1000.0 / BIN_MS) as usize;
        while made < due as u64 {
            made += 1;
            if limiter.try_take(1)?.allowed {
                bins[at] += 1;
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let m = limiter.metrics().snapshot();
    runtime.block_on(limiter.close())?;
    let nonzero: Vec<String> = (bins.iter().enumerate())
        .filter(|(_, &n)| n > 0)
        .map(|(i, n)| format!("[{i},{n}]"))
        .collect();
    println!(
        "{{\"bins\":[{}],\"redis_calls\":{},\"fallback_decisions\":{},\"late_start_ms\":{:.1},\"redis_timeouts\":{},\"latency_buckets\":{:?}}}",
        nonzero.join(","),
        m.redis_calls,
        m.fallback_decisions,
        late_ms,
        m.redis_timeouts,
        m.latency_buckets
    );
    Ok(())
}
