//! The incident replay's load driver (`scripts/incident` runs it; see docs/incident.md).
//!
//! Replays one arrival trace against one approach and records what happened to every
//! arrival. Each instance of the trace is a separate task with its own Redis connection
//! and its own limiter; each request is its own task (a service handles requests
//! concurrently), so a slow Redis delays requests, not the arrival schedule.
//!
//! ```text
//! incident --trace FILE --approach A --redis URL --out PREFIX [options]
//!   A: local | lua | take | prefetch | reserve | share
//!   --local-limit static|recompute  local: every instance at quota/8, or quota/N at its start
//!   --scale-at S                   when the fleet grew (for `recompute`)
//!   --policy allow|lastknown|deny  failure policy of take/prefetch (allow uses --share)
//!   --kill-instance I --kill-at S  instance I stops at S holding its lease (never returned)
//!   --stop-at S --stop-for S       SIGSTOP redis-server at S, SIGCONT after
//!   --pin-at S --pin-rate R        at S an operator pins the shared key to R/s, cap R (RL.PIN)
//! ```
//!
//! Writes PREFIX.events.csv (one line per arrival), PREFIX.samples.jsonl (server counters
//! every 100 ms), PREFIX.meta.json, and for `share` PREFIX.shares.jsonl (each instance's
//! share rate every 100 ms; an instance joins the fleet at its first arrival).

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use redis::Value;
use rl_client::{
    limit, FailurePolicy, Limiter, LimiterConfig, PrefetchConfig, PrefetchLimiter, ShareConfig,
    ShareLimiter, Source,
};
use rl_core::{Bucket, Level, Limit};

const KEY: &str = "incident:partner";
const LUA_KEY: &str = "incident:partner:lua";

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

#[derive(Clone, Debug)]
struct Args {
    trace: String,
    approach: String,
    redis: String,
    out: String,
    rate: f64,
    cap: f64,
    base_instances: usize,
    local_limit: String,
    scale_at: f64,
    batch: u64,
    ttl_ms: u64,
    max_wait_ms: u64,
    policy: String,
    share: f64,
    /// An instance number, or `max`: the one holding the most leased tokens at `kill_at`.
    kill_instance: Option<String>,
    kill_at: f64,
    stop_at: Option<f64>,
    /// When an operator pins the shared key (`RL.PIN KEY rate rate`), and to what rate.
    pin_at: Option<f64>,
    pin_rate: f64,
    stop_for: f64,
    lua: String,
    duration: f64,
    period_ms: u64,
}

fn parse_args() -> Res<Args> {
    let mut a = Args {
        trace: String::new(),
        approach: String::new(),
        redis: "redis://127.0.0.1:6379/".into(),
        out: String::new(),
        rate: 1000.0,
        cap: 1000.0,
        base_instances: 8,
        local_limit: "static".into(),
        scale_at: f64::INFINITY,
        batch: 20,
        ttl_ms: 2000,
        max_wait_ms: 100,
        policy: "allow".into(),
        share: 0.125,
        kill_instance: None,
        kill_at: f64::INFINITY,
        stop_at: None,
        pin_at: None,
        pin_rate: 0.0,
        stop_for: 2.0,
        lua: "scripts/token_bucket.lua".into(),
        duration: 0.0,
        period_ms: 1000,
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < argv.len() {
        let v = argv.get(i + 1).cloned().ok_or("missing value")?;
        match argv[i].as_str() {
            "--trace" => a.trace = v,
            "--approach" => a.approach = v,
            "--redis" => a.redis = v,
            "--out" => a.out = v,
            "--rate" => a.rate = v.parse()?,
            "--cap" => a.cap = v.parse()?,
            "--base-instances" => a.base_instances = v.parse()?,
            "--local-limit" => a.local_limit = v,
            "--scale-at" => a.scale_at = v.parse()?,
            "--batch" => a.batch = v.parse()?,
            "--ttl-ms" => a.ttl_ms = v.parse()?,
            "--max-wait-ms" => a.max_wait_ms = v.parse()?,
            "--policy" => a.policy = v,
            "--share" => a.share = v.parse()?,
            "--kill-instance" => a.kill_instance = Some(v),
            "--kill-at" => a.kill_at = v.parse()?,
            "--stop-at" => a.stop_at = Some(v.parse()?),
            "--pin-at" => a.pin_at = Some(v.parse()?),
            "--pin-rate" => a.pin_rate = v.parse()?,
            "--stop-for" => a.stop_for = v.parse()?,
            "--lua" => a.lua = v,
            "--duration" => a.duration = v.parse()?,
            "--period-ms" => a.period_ms = v.parse()?,
            other => return Err(format!("unknown argument {other}").into()),
        }
        i += 2;
    }
    if a.trace.is_empty() || a.approach.is_empty() || a.out.is_empty() {
        return Err("--trace, --approach and --out are required".into());
    }
    Ok(a)
}

/// The trace: `t_us,instance` lines, sorted by time. Returns arrivals per instance.
fn load_trace(path: &str) -> Res<Vec<Vec<u64>>> {
    let text = std::fs::read_to_string(path)?;
    let mut per: Vec<Vec<u64>> = Vec::new();
    for line in text.lines() {
        if line.starts_with('#') || line.starts_with('t') || line.is_empty() {
            continue;
        }
        let (t, i) = line.split_once(',').ok_or("bad trace line")?;
        let (t, i): (u64, usize) = (t.trim().parse()?, i.trim().parse()?);
        if per.len() <= i {
            per.resize(i + 1, Vec::new());
        }
        per[i].push(t);
    }
    Ok(per)
}

/// One arrival's fate. Times in µs since the run's start.
#[derive(Clone, Copy)]
struct Event {
    inst: usize,
    arrival: u64,
    start: u64,
    decided: u64,
    /// When the call went to the partner (after any pacing wait); 0 = never.
    sent: u64,
    /// b'G' granted, b'D' denied, b'X' dropped (dead instance), b'E' limiter error.
    outcome: u8,
    /// b'S' server, b'L' lease, b'F' fallback, b'C' local bucket, b'-' none.
    source: u8,
}

enum Gate {
    Local {
        limit: Limit,
        bucket: Mutex<Option<Bucket>>,
    },
    Lua {
        conn: MultiplexedConnection,
        sha: String,
    },
    Take(Limiter<MultiplexedConnection>),
    Prefetch(PrefetchLimiter<MultiplexedConnection>),
    Reserve(MultiplexedConnection),
    /// Made at the instance's first arrival: a holder joins the fleet when it starts.
    Share {
        conn: MultiplexedConnection,
        config: ShareConfig,
        limiter: std::sync::OnceLock<ShareLimiter<MultiplexedConnection>>,
    },
}

struct Decided {
    allowed: bool,
    wait: Duration,
    source: u8,
    error: bool,
}

impl Gate {
    async fn decide(&self, args: &Args, now_ns: impl Fn() -> u64) -> Decided {
        let ok = |allowed: bool, source: u8| Decided {
            allowed,
            wait: Duration::ZERO,
            source,
            error: false,
        };
        let err = || Decided {
            allowed: false,
            wait: Duration::ZERO,
            source: b'-',
            error: true,
        };
        let timeout = Duration::from_millis(200);
        match self {
            Gate::Local { limit, bucket } => {
                let mut b = bucket.lock().unwrap();
                let mut level = Level::new(b.as_ref(), *limit, now_ns());
                let allowed = level.try_take(1.0);
                *b = Some(level.bucket());
                ok(allowed, b'C')
            }
            Gate::Lua { conn, sha } => {
                let mut conn = conn.clone();
                let mut cmd = redis::cmd("EVALSHA");
                cmd.arg(sha)
                    .arg(1)
                    .arg(LUA_KEY)
                    .arg(args.rate)
                    .arg(args.cap)
                    .arg(1);
                match tokio::time::timeout(timeout, cmd.query_async::<i64>(&mut conn)).await {
                    Ok(Ok(n)) => ok(n > 0, b'S'),
                    _ => err(),
                }
            }
            Gate::Take(l) => match l.take(KEY, 1).await {
                Ok(d) => ok(d.allowed, source_code(d.source)),
                Err(_) => err(),
            },
            Gate::Prefetch(l) => match l.take(1).await {
                Ok(d) => ok(d.allowed, source_code(d.source)),
                Err(_) => err(),
            },
            Gate::Share { limiter, .. } => match limiter.get().map(|l| l.try_take(1)) {
                Some(Ok(d)) => ok(d.allowed, source_code(d.source)),
                _ => err(),
            },
            Gate::Reserve(conn) => {
                let mut conn = conn.clone();
                let mut cmd = redis::cmd("RL.RESERVE");
                cmd.arg(KEY)
                    .arg(args.rate)
                    .arg(args.cap)
                    .arg(1)
                    .arg(args.max_wait_ms);
                match tokio::time::timeout(timeout, cmd.query_async::<Vec<Value>>(&mut conn)).await
                {
                    Ok(Ok(items)) if items.len() >= 2 => {
                        let granted = int(&items[0]).unwrap_or(0);
                        let wait_ms = int(&items[1]).unwrap_or(0).max(0) as u64;
                        Decided {
                            allowed: granted > 0,
                            wait: if granted > 0 {
                                Duration::from_millis(wait_ms)
                            } else {
                                Duration::ZERO
                            },
                            source: b'S',
                            error: false,
                        }
                    }
                    _ => err(),
                }
            }
        }
    }
}

fn source_code(s: Source) -> u8 {
    match s {
        Source::Server => b'S',
        Source::Lease => b'L',
        Source::Fallback => b'F',
        Source::Share => b'H',
    }
}

fn int(v: &Value) -> Option<i64> {
    match v {
        Value::Int(i) => Some(*i),
        Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse().ok(),
        Value::SimpleString(s) => s.parse().ok(),
        _ => None,
    }
}

fn policy(args: &Args) -> Res<FailurePolicy> {
    Ok(match args.policy.as_str() {
        "allow" => FailurePolicy::Allow,
        "lastknown" => FailurePolicy::LastKnown,
        "deny" => FailurePolicy::Deny,
        other => return Err(format!("unknown policy {other}").into()),
    })
}

async fn connect(url: &str) -> Res<MultiplexedConnection> {
    Ok(redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?)
}

/// `INFO` text → field map.
fn info_fields(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.to_string(), v.trim().to_string()))
        .collect()
}

/// Samples the server every 100 ms until `stop`: commandstats, CPU, `INFO rl`, and the
/// bucket's leased tokens. One JSON object per line.
async fn sampler(
    url: String,
    t0: Instant,
    done: Arc<std::sync::atomic::AtomicBool>,
) -> Res<Vec<String>> {
    let mut conn = connect(&url).await?;
    let mut lines = Vec::new();
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    while !done.load(std::sync::atomic::Ordering::Relaxed) {
        tick.tick().await;
        let t = t0.elapsed().as_micros() as u64;
        let mut cmd = redis::cmd("INFO");
        cmd.arg("commandstats").arg("cpu").arg("rl");
        let info = tokio::time::timeout(
            Duration::from_millis(150),
            cmd.query_async::<String>(&mut conn),
        )
        .await;
        let Ok(Ok(info)) = info else { continue };
        let t_reply = t0.elapsed().as_micros() as u64;
        let f = info_fields(&info);
        let mut cmds = Vec::new();
        for (k, v) in &f {
            if let Some(name) = k.strip_prefix("cmdstat_") {
                let get = |key: &str| {
                    v.split(',')
                        .find_map(|p| p.strip_prefix(&format!("{key}=")))
                        .unwrap_or("0")
                        .to_string()
                };
                cmds.push(format!("\"{name}\":[{},{}]", get("calls"), get("usec")));
            }
        }
        let num = |k: &str| f.get(k).cloned().unwrap_or_else(|| "0".into());
        let mut peek = redis::cmd("RL.PEEK");
        peek.arg(KEY);
        let leased = match tokio::time::timeout(
            Duration::from_millis(150),
            peek.query_async::<Value>(&mut conn),
        )
        .await
        {
            Ok(Ok(v)) => leased_tokens(&v).unwrap_or(0),
            _ => -1,
        };
        lines.push(format!(
            "{{\"t\":{t},\"t_reply\":{t_reply},\"cmds\":{{{}}},\"cpu_user\":{},\"cpu_sys\":{},\"leases_expired\":{},\"leases_active\":{},\"leased_tokens\":{leased}}}",
            cmds.join(","),
            num("used_cpu_user"),
            num("used_cpu_sys"),
            num("rl_leases_expired"),
            num("rl_leases_active"),
        ));
    }
    Ok(lines)
}

fn leased_tokens(v: &Value) -> Option<i64> {
    let pairs: Vec<(&Value, &Value)> = match v {
        Value::Array(items) => items
            .chunks(2)
            .filter(|c| c.len() == 2)
            .map(|c| (&c[0], &c[1]))
            .collect(),
        Value::Map(m) => m.iter().map(|(k, v)| (k, v)).collect(),
        _ => return Some(0),
    };
    for (k, val) in pairs {
        let name = match k {
            Value::BulkString(b) => String::from_utf8_lossy(b).to_string(),
            Value::SimpleString(s) => s.clone(),
            _ => continue,
        };
        if name == "leased_tokens" {
            return int(val);
        }
    }
    None
}

fn main() -> Res<()> {
    let args = parse_args()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(run(args))
}

async fn run(args: Args) -> Res<()> {
    let trace = load_trace(&args.trace)?;
    let instances = trace.len();
    let quota = limit(args.rate, args.cap)?;
    let mut meta: Vec<String> = vec![
        format!("\"approach\":\"{}\"", args.approach),
        format!("\"instances\":{instances}"),
        format!("\"arrivals\":{}", trace.iter().map(Vec::len).sum::<usize>()),
    ];

    // The server's pid (for SIGSTOP) and whether it knows RL.RESERVE.
    let mut admin = connect(&args.redis).await?;
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query_async(&mut admin)
        .await?;
    let pid = info_fields(&info)
        .get("process_id")
        .cloned()
        .ok_or("no process_id in INFO")?;
    let needs = match args.approach.as_str() {
        "reserve" => Some("RL.RESERVE"),
        "share" => Some("RL.SHARE"),
        _ => None,
    };
    if let Some(command) = needs {
        let v: Vec<Value> = redis::cmd("COMMAND")
            .arg("INFO")
            .arg(command)
            .query_async(&mut admin)
            .await?;
        let known = v.first().is_some_and(|x| !matches!(x, Value::Nil));
        if !known {
            std::fs::write(
                format!("{}.meta.json", args.out),
                format!(
                    "{{\"approach\":\"{}\",\"available\":false}}\n",
                    args.approach
                ),
            )?;
            println!("{command}: not available in this build");
            return Ok(());
        }
    }
    let sha: String = if args.approach == "lua" {
        let script = std::fs::read_to_string(&args.lua)?;
        redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(script)
            .query_async(&mut admin)
            .await?
    } else {
        String::new()
    };

    // One gate (limiter) and one connection per instance.
    let mut gates = Vec::new();
    for arrivals in &trace {
        let conn = connect(&args.redis).await?;
        let cfg = LimiterConfig {
            policy: policy(&args)?,
            // `--share` is the fraction of the limit each instance falls back to.
            instances: (1.0 / args.share).round().max(1.0) as u32,
            ..Default::default()
        };
        let gate = match args.approach.as_str() {
            "local" => {
                // Every instance gets quota/8 as configured for 8 instances; `recompute`
                // instances started after the scale-out divide by the fleet size then.
                let first = arrivals.first().copied().unwrap_or(0) as f64 / 1e6;
                let n = if args.local_limit == "recompute" && first >= args.scale_at {
                    instances
                } else {
                    args.base_instances
                } as f64;
                Gate::Local {
                    limit: limit(args.rate / n, args.cap / n)?,
                    bucket: Mutex::new(None),
                }
            }
            "lua" => Gate::Lua {
                conn,
                sha: sha.clone(),
            },
            "take" => Gate::Take(Limiter::new(conn, quota, cfg)?),
            "prefetch" => Gate::Prefetch(PrefetchLimiter::new(
                conn,
                KEY,
                quota,
                PrefetchConfig {
                    batch: args.batch,
                    ttl: Duration::from_millis(args.ttl_ms),
                    limiter: cfg,
                    ..Default::default()
                },
            )?),
            "reserve" => Gate::Reserve(conn),
            "share" => Gate::Share {
                conn,
                config: ShareConfig {
                    period: Duration::from_millis(args.period_ms),
                    limiter: cfg,
                    ..Default::default()
                },
                limiter: std::sync::OnceLock::new(),
            },
            other => return Err(format!("unknown approach {other}").into()),
        };
        gates.push(Arc::new(gate));
    }

    // Start 300 ms from now; trace times are relative to t0.
    let t0 = Instant::now() + Duration::from_millis(300);
    let us = move |at: Instant| at.saturating_duration_since(t0).as_micros() as u64;
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler_task = tokio::spawn(sampler(args.redis.clone(), t0, Arc::clone(&done)));

    // SIGSTOP / SIGCONT of redis-server.
    let stop_task = args.stop_at.map(|at| {
        let pid = pid.clone();
        let stop_for = args.stop_for;
        tokio::spawn(async move {
            tokio::time::sleep_until((t0 + Duration::from_secs_f64(at)).into()).await;
            let stopped = us(Instant::now());
            let _ = std::process::Command::new("kill")
                .args(["-STOP", &pid])
                .status();
            tokio::time::sleep(Duration::from_secs_f64(stop_for)).await;
            let _ = std::process::Command::new("kill")
                .args(["-CONT", &pid])
                .status();
            (stopped, us(Instant::now()))
        })
    });

    // The partner asks for less: an operator pins the shared key, no instance redeploys.
    let pin_task = args.pin_at.map(|at| {
        let (url, rate) = (args.redis.clone(), args.pin_rate);
        tokio::spawn(async move {
            tokio::time::sleep_until((t0 + Duration::from_secs_f64(at)).into()).await;
            let mut c = connect(&url).await?;
            let _: () = redis::cmd("RL.PIN")
                .arg(KEY)
                .arg(rate)
                .arg(rate)
                .query_async(&mut c)
                .await?;
            Ok::<u64, Box<dyn std::error::Error + Send + Sync>>(us(Instant::now()))
        })
    });

    // Which instance dies: fixed, or (`max`) the one holding the most tokens at kill_at.
    let dead = Arc::new(std::sync::atomic::AtomicUsize::new(usize::MAX));
    let started: Vec<u64> = trace
        .iter()
        .map(|a| a.first().copied().unwrap_or(u64::MAX))
        .collect();
    let kill_task = args.kill_instance.clone().map(|which| {
        let gates = gates.clone();
        let dead = Arc::clone(&dead);
        let at = args.kill_at;
        tokio::spawn(async move {
            tokio::time::sleep_until((t0 + Duration::from_secs_f64(at)).into()).await;
            let held = |g: &Gate| match g {
                Gate::Prefetch(l) => l.held(),
                // The holder of the largest share (its rate, in tokens per second).
                Gate::Share { limiter, .. } => limiter.get().map_or(0, |l| l.share().rate as u64),
                _ => 0,
            };
            let i = match which.parse::<usize>() {
                Ok(i) => i,
                // Among instances already serving; the lowest number wins a tie.
                Err(_) => (0..gates.len())
                    .filter(|&i| started[i] < (at * 1e6) as u64)
                    .max_by_key(|&i| (held(&gates[i]), std::cmp::Reverse(i)))
                    .unwrap_or(0),
            };
            // The instance stops here, holding what it leased. Leak a handle so no Drop
            // ever returns its lease.
            let h = held(&gates[i]);
            dead.store(i, std::sync::atomic::Ordering::SeqCst);
            if let Gate::Prefetch(l) = &*gates[i] {
                std::mem::forget(l.clone());
            }
            // A dead holder neither refreshes nor releases: its share ends with its lease.
            if let Gate::Share { limiter, .. } = &*gates[i] {
                if let Some(l) = limiter.get() {
                    l.abandon();
                }
            }
            (i, h, us(Instant::now()))
        })
    });

    // Each instance's share rate every 100 ms (null before it started).
    let shares_task = (args.approach == "share").then(|| {
        let gates = gates.clone();
        let done = Arc::clone(&done);
        tokio::spawn(async move {
            let mut lines = Vec::new();
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                tick.tick().await;
                let t = us(Instant::now());
                let rates: Vec<String> = gates
                    .iter()
                    .map(|g| match &**g {
                        Gate::Share { limiter, .. } => limiter
                            .get()
                            .map_or("null".to_string(), |l| format!("{:.2}", l.share().rate)),
                        _ => "null".to_string(),
                    })
                    .collect();
                lines.push(format!("{{\"t\":{t},\"rates\":[{}]}}", rates.join(",")));
            }
            lines
        })
    });

    let args = Arc::new(args);
    let mut dispatchers = Vec::new();
    for (i, arrivals) in trace.into_iter().enumerate() {
        let gate = Arc::clone(&gates[i]);
        let args = Arc::clone(&args);
        let dead = Arc::clone(&dead);
        dispatchers.push(tokio::spawn(async move {
            if let (
                Gate::Share {
                    conn,
                    config,
                    limiter,
                },
                Some(first),
            ) = (&*gate, arrivals.first())
            {
                tokio::time::sleep_until((t0 + Duration::from_micros(*first)).into()).await;
                let l = ShareLimiter::new(conn.clone(), KEY, quota, config.clone())
                    .expect("share limiter");
                let _ = limiter.set(l);
            }
            let events = Arc::new(Mutex::new(Vec::with_capacity(arrivals.len())));
            let mut handles = Vec::with_capacity(arrivals.len());
            for t in arrivals {
                tokio::time::sleep_until((t0 + Duration::from_micros(t)).into()).await;
                if dead.load(std::sync::atomic::Ordering::SeqCst) == i {
                    events.lock().unwrap().push(Event {
                        inst: i,
                        arrival: t,
                        start: 0,
                        decided: 0,
                        sent: 0,
                        outcome: b'X',
                        source: b'-',
                    });
                    continue;
                }
                let gate = Arc::clone(&gate);
                let args = Arc::clone(&args);
                let events = Arc::clone(&events);
                handles.push(tokio::spawn(async move {
                    let start = Instant::now();
                    let d = gate
                        .decide(&args, || {
                            start.saturating_duration_since(t0).as_nanos() as u64 + 1_000_000_000
                        })
                        .await;
                    let decided = Instant::now();
                    let mut sent = 0;
                    if d.allowed {
                        if !d.wait.is_zero() {
                            tokio::time::sleep(d.wait).await;
                        }
                        sent = us(Instant::now()).max(1);
                    }
                    events.lock().unwrap().push(Event {
                        inst: i,
                        arrival: t,
                        start: us(start),
                        decided: us(decided),
                        sent,
                        outcome: if d.error {
                            b'E'
                        } else if d.allowed {
                            b'G'
                        } else {
                            b'D'
                        },
                        source: d.source,
                    });
                }));
            }
            for h in handles {
                let _ = h.await;
            }
            let events = std::mem::take(&mut *events.lock().unwrap());
            events
        }));
    }

    let mut events = Vec::new();
    for d in dispatchers {
        events.extend(d.await?);
    }
    let mut killed = Vec::new();
    if let Some(k) = kill_task {
        let (i, h, at) = k.await?;
        killed.push(format!(
            "{{\"instance\":{i},\"held_tokens\":{h},\"at_us\":{at}}}"
        ));
    }
    // Keep sampling a little past the last arrival (expiries, the backlog after SIGCONT).
    let end = (args.duration * 1e6) as u64;
    let now = us(Instant::now());
    if end > now {
        tokio::time::sleep(Duration::from_micros(end - now)).await;
    }
    if let Some(t) = stop_task {
        let (stopped, resumed) = t.await?;
        meta.push(format!("\"sigstop_us\":{stopped},\"sigcont_us\":{resumed}"));
    }
    if let Some(t) = pin_task {
        let pinned = t.await?.map_err(|e| e.to_string())?;
        meta.push(format!(
            "\"pinned_us\":{pinned},\"pin_rate\":{}",
            args.pin_rate
        ));
    }
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let samples = sampler_task.await??;
    if let Some(t) = shares_task {
        let lines = t.await?;
        std::fs::write(
            format!("{}.shares.jsonl", args.out),
            lines.join("\n") + "\n",
        )?;
    }

    // Client-side counters summed over instances.
    let mut client: BTreeMap<&str, u64> = BTreeMap::new();
    for g in &gates {
        let s = match &**g {
            Gate::Take(l) => Some(l.metrics().snapshot()),
            Gate::Prefetch(l) => Some(l.metrics().snapshot()),
            Gate::Share { limiter, .. } => limiter.get().map(|l| l.metrics().snapshot()),
            _ => None,
        };
        if let Some(s) = s {
            for (k, v) in [
                ("redis_calls", s.redis_calls),
                ("redis_timeouts", s.redis_timeouts),
                ("redis_errors", s.redis_errors),
                ("fallback_decisions", s.fallback_decisions),
                ("fallback_granted", s.fallback_granted),
                ("leases", s.leases),
                ("lease_tokens", s.lease_tokens),
                ("leases_expired", s.leases_expired),
                ("leases_denied", s.leases_denied),
                ("returns", s.returns),
                ("tokens_returned", s.tokens_returned),
            ] {
                *client.entry(k).or_default() += v;
            }
        }
    }
    meta.push(format!(
        "\"client\":{{{}}}",
        client
            .iter()
            .map(|(k, v)| format!("\"{k}\":{v}"))
            .collect::<Vec<_>>()
            .join(",")
    ));
    meta.push(format!("\"killed\":[{}]", killed.join(",")));
    meta.push("\"available\":true".into());

    events.sort_by_key(|e| (e.arrival, e.inst));
    let mut f = std::io::BufWriter::new(std::fs::File::create(format!("{}.events.csv", args.out))?);
    writeln!(
        f,
        "inst,arrival_us,start_us,decided_us,sent_us,outcome,source"
    )?;
    for e in &events {
        writeln!(
            f,
            "{},{},{},{},{},{},{}",
            e.inst, e.arrival, e.start, e.decided, e.sent, e.outcome as char, e.source as char
        )?;
    }
    f.flush()?;
    std::fs::write(
        format!("{}.samples.jsonl", args.out),
        samples.join("\n") + "\n",
    )?;
    std::fs::write(
        format!("{}.meta.json", args.out),
        format!("{{{}}}\n", meta.join(",")),
    )?;
    let granted = events.iter().filter(|e| e.outcome == b'G').count();
    println!(
        "{}: {} arrivals, {} sent to the partner",
        args.approach,
        events.len(),
        granted
    );
    Ok(())
}
