//! One hot key shared by a fleet of processes (`ShareLimiter`, `RL.SHARE`): decisions per
//! second across the fleet, Redis calls per second, and what was let out against its bound.
//! `scripts/bench` runs it (its "One hot key" section in BENCHMARKS.md); docs/share-bench.md
//! says what it measures.
//!
//! ```text
//! cargo build --release -p redis-rl
//! cargo run --release -p rl-client --example share_bench -- \
//!     --module target/release/libredis_rl.so [--procs 8] [--seconds 10] [--rate 100000] [--cap 10000]
//!     [--url redis://127.0.0.1:PORT/] [--json]
//! ```
//!
//! Starts a redis-server with the module on a free loopback port (or uses the server at
//! `--url`, whose key `bench:hot` must not exist), then `--procs` copies of itself; each
//! holds one `ShareLimiter` on the key (failure policy `Deny`) and calls `try_take(1)` in a
//! tight loop on one thread for `--seconds` (its refresh runs on a second thread), counting
//! grants per millisecond of a clock shared by the processes. The parent adds it up: decisions/s,
//! `RL.SHARE` calls/s (the server's `INFO commandstats`), and the most granted in any
//! window of 50 ms to 2 s against `cap + rate * t + holders` (plus a millisecond for the
//! bins), and in the whole run against `cap + rate * T + holders`. `--json` prints that as
//! one JSON object (the format scripts/benchtool/share_bench.py prints for the Python client).

use std::io::{BufRead, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rl_client::{limit, FailurePolicy, ShareConfig, ShareLimiter};

const KEY: &str = "bench:hot";

type Res<T> = Result<T, Box<dyn std::error::Error>>;

struct Args {
    module: String,
    procs: usize,
    seconds: f64,
    rate: f64,
    cap: f64,
    url: Option<String>,
    json: bool,
    child: Option<(String, u64)>,
}

fn args() -> Res<Args> {
    let mut a = Args {
        module: "target/release/libredis_rl.so".into(),
        procs: 8,
        seconds: 10.0,
        rate: 100_000.0,
        cap: 10_000.0,
        url: None,
        json: false,
        child: None,
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < argv.len() {
        let v = |k: usize| argv.get(i + k).cloned().ok_or("missing value");
        // How many arguments this option took, itself included.
        i += match argv[i].as_str() {
            "--module" => {
                a.module = v(1)?;
                2
            }
            "--procs" => {
                a.procs = v(1)?.parse()?;
                2
            }
            "--seconds" => {
                a.seconds = v(1)?.parse()?;
                2
            }
            "--rate" => {
                a.rate = v(1)?.parse()?;
                2
            }
            "--cap" => {
                a.cap = v(1)?.parse()?;
                2
            }
            "--url" => {
                a.url = Some(v(1)?);
                2
            }
            "--json" => {
                a.json = true;
                1
            }
            "--child" => {
                a.child = Some((v(1)?, v(2)?.parse()?));
                3
            }
            other => return Err(format!("unknown argument {other}").into()),
        };
    }
    Ok(a)
}

fn wall_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

fn main() -> Res<()> {
    let a = args()?;
    match a.child.clone() {
        Some((url, start)) => child(&a, &url, start),
        None => parent(&a),
    }
}

/// One process of the fleet: a holder, taking as fast as one thread can.
fn child(a: &Args, url: &str, start_wall: u64) -> Res<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let client = redis::Client::open(url)?;
    // Default settings but the failure policy: the bound checked here is that of shares. A
    // call that outlives the timeout (a loaded machine) is an outage to the limiter, and
    // `Allow` would then let out its own budget beside the shares (for a holder that never
    // saw the others, the whole rate: `instances` is 1 unless set).
    let mut config = ShareConfig::default();
    config.limiter.policy = FailurePolicy::Deny;
    let limiter = runtime.block_on(async {
        ShareLimiter::from_client(client, KEY, limit(a.rate, a.cap)?, config)
    })?;
    // The shared start on this process's monotonic clock, in the past if this process came
    // up late (it then takes from then on: its bins stay on the fleet's clock).
    let (now_wall, now) = (wall_ns(), Instant::now());
    let t0 = if start_wall >= now_wall {
        now + Duration::from_nanos(start_wall - now_wall)
    } else {
        now.checked_sub(Duration::from_nanos(now_wall - start_wall))
            .unwrap_or(now)
    };
    std::thread::sleep(t0.saturating_duration_since(Instant::now()));
    let ms = (a.seconds * 1000.0) as usize;
    let mut bins = vec![0u64; ms + 1];
    let (mut decisions, mut granted) = (0u64, 0u64);
    loop {
        let d = limiter.try_take(1)?;
        decisions += 1;
        if d.allowed {
            granted += 1;
        }
        // The clock is read once per 64 decisions, and at every grant.
        if d.allowed || decisions % 64 == 0 {
            let at = t0.elapsed().as_millis() as usize;
            if at >= ms {
                if d.allowed {
                    granted -= 1; // past the end: not counted in the run
                }
                break;
            }
            if d.allowed {
                bins[at] += 1;
            }
        }
    }
    let calls = limiter.metrics().snapshot().redis_calls;
    runtime.block_on(limiter.close())?;
    let nonzero: Vec<String> = bins
        .iter()
        .enumerate()
        .filter(|(_, &n)| n > 0)
        .map(|(i, n)| format!("[{i},{n}]"))
        .collect();
    println!(
        "{{\"decisions\":{decisions},\"granted\":{granted},\"redis_calls\":{calls},\"bins\":[{}]}}",
        nonzero.join(",")
    );
    Ok(())
}

struct Server {
    child: std::process::Child,
    port: u16,
    dir: std::path::PathBuf,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn start_server(module: &str) -> Res<Server> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let dir = std::env::temp_dir().join(format!("rl-share-bench-{port}"));
    std::fs::create_dir_all(&dir)?;
    let child = Command::new(std::env::var("RL_SERVER").unwrap_or("redis-server".into()))
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
        ])
        .args(["--appendonly", "no", "--loadmodule", module])
        .arg("--dir")
        .arg(&dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    let server = Server { child, port, dir };
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/"))?;
    for _ in 0..200 {
        if let Ok(mut c) = client.get_connection_with_timeout(Duration::from_millis(100)) {
            if redis::cmd("PING").query::<String>(&mut c).is_ok() {
                return Ok(server);
            }
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    Err("redis-server did not start".into())
}

fn share_calls(conn: &mut redis::Connection) -> Res<u64> {
    let info: String = redis::cmd("INFO").arg("commandstats").query(conn)?;
    Ok(info
        .lines()
        .find_map(|l| {
            // Module commands show in upper case.
            let (name, v) = l.split_once(':')?;
            name.eq_ignore_ascii_case("cmdstat_rl.share").then_some(v)
        })
        .and_then(|v| v.split(',').find_map(|p| p.strip_prefix("calls=")))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0))
}

fn parent(a: &Args) -> Res<()> {
    let server = match &a.url {
        Some(_) => None,
        None => Some(start_server(&a.module)?),
    };
    let url = match (&a.url, &server) {
        (Some(url), _) => url.clone(),
        (None, Some(s)) => format!("redis://127.0.0.1:{}/", s.port),
        (None, None) => unreachable!("a server is started when no --url is given"),
    };
    let mut admin = redis::Client::open(url.as_str())?.get_connection()?;
    // Everyone starts together, after every process is up and has its first share.
    let start = wall_ns() + 2_000_000_000;
    let exe = std::env::current_exe()?;
    let mut children = Vec::new();
    for _ in 0..a.procs {
        children.push(
            Command::new(&exe)
                .args(["--child", &url, &start.to_string()])
                .args(["--seconds", &a.seconds.to_string()])
                .args(["--rate", &a.rate.to_string(), "--cap", &a.cap.to_string()])
                .stdout(Stdio::piped())
                .spawn()?,
        );
    }
    std::thread::sleep(Duration::from_nanos(start.saturating_sub(wall_ns())));
    let calls_before = share_calls(&mut admin)?;
    let began = Instant::now();
    let ms = (a.seconds * 1000.0) as usize;
    let mut bins = vec![0u64; ms + 1];
    let (mut decisions, mut granted, mut client_calls) = (0u64, 0u64, 0u64);
    let mut calls_after = None;
    for mut c in children {
        let out = c.stdout.take().ok_or("no stdout")?;
        let line = std::io::BufReader::new(out)
            .lines()
            .next()
            .ok_or("a child printed nothing")??;
        if calls_after.is_none() {
            // The first child ends at the end of the run: the calls made during it.
            calls_after = Some((share_calls(&mut admin)?, began.elapsed()));
        }
        if !c.wait()?.success() {
            return Err("a child failed".into());
        }
        let v = parse_child(&line)?;
        decisions += v.0;
        granted += v.1;
        client_calls += v.2;
        for (i, n) in v.3 {
            if i < bins.len() {
                bins[i] += n;
            }
        }
    }
    let (calls_after, took) = calls_after.ok_or("no children")?;
    let secs = a.seconds;
    let holders = a.procs as f64;
    // Most granted in any window of `w` ms (bins of 1 ms: a window of w bins spans up to
    // w + 1 ms of grants, so the bound takes t = w + 1 ms).
    let mut worst: Vec<(usize, u64, f64)> = Vec::new();
    for w in [50usize, 100, 250, 500, 1000, 2000] {
        if w > ms {
            continue;
        }
        let mut sum: u64 = bins[..w].iter().sum();
        let mut best = sum;
        for i in w..bins.len() {
            sum += bins[i];
            sum -= bins[i - w];
            best = best.max(sum);
        }
        let bound = a.cap + a.rate * (w as f64 + 1.0) / 1000.0 + holders;
        worst.push((w, best, bound));
    }
    let total_bound = a.cap + a.rate * secs + holders;
    let server_calls = calls_after.saturating_sub(calls_before);
    let ok = granted as f64 <= total_bound && worst.iter().all(|(_, b, bound)| *b as f64 <= *bound);
    let mut out = std::io::stdout().lock();
    if a.json {
        let windows: Vec<String> = worst
            .iter()
            .map(|(w, best, bound)| format!("[{w},{best},{bound}]"))
            .collect();
        writeln!(
            out,
            "{{\"client\":\"rust\",\"procs\":{},\"seconds\":{secs},\"rate\":{},\"cap\":{},\
             \"decisions\":{decisions},\"granted\":{granted},\"server_calls\":{server_calls},\
             \"server_secs\":{},\"client_calls\":{client_calls},\"bound\":{total_bound},\
             \"windows\":[{}],\"within\":{ok}}}",
            a.procs,
            a.rate,
            a.cap,
            took.as_secs_f64(),
            windows.join(",")
        )?;
    } else {
        report(
            &mut out,
            a,
            &Totals {
                decisions,
                granted,
                server_calls,
                took,
                client_calls,
            },
        )?;
        writeln!(
            out,
            "let out: {granted} in {secs} s, bound cap + rate * T + holders = {total_bound:.0} ({})",
            verdict(granted as f64 <= total_bound)
        )?;
        for (w, best, bound) in &worst {
            writeln!(
                out,
                "  most in any {w} ms: {best}, bound {bound:.0} ({})",
                verdict(*best as f64 <= *bound)
            )?;
        }
    }
    drop(server);
    if !ok {
        return Err("let-out over its bound".into());
    }
    Ok(())
}

fn verdict(within: bool) -> &'static str {
    if within {
        "within"
    } else {
        "EXCEEDED"
    }
}

struct Totals {
    decisions: u64,
    granted: u64,
    server_calls: u64,
    took: Duration,
    client_calls: u64,
}

fn report(out: &mut impl Write, a: &Args, t: &Totals) -> Res<()> {
    let secs = a.seconds;
    writeln!(
        out,
        "{} processes, one key (rate {}, cap {}), {:.1} s",
        a.procs, a.rate, a.cap, secs
    )?;
    writeln!(
        out,
        "decisions: {} ({:.0}/s across the fleet), granted {} ({:.0}/s)",
        t.decisions,
        t.decisions as f64 / secs,
        t.granted,
        t.granted as f64 / secs
    )?;
    writeln!(
        out,
        "RL.SHARE calls: {:.1}/s at the server during the run ({} in {:.2} s), {} by the clients in all",
        t.server_calls as f64 / t.took.as_secs_f64(),
        t.server_calls,
        t.took.as_secs_f64(),
        t.client_calls
    )?;
    Ok(())
}

type ChildReport = (u64, u64, u64, Vec<(usize, u64)>);

/// The child's one JSON line (written by `child`, so a small hand parser does).
fn parse_child(line: &str) -> Res<ChildReport> {
    let field = |name: &str| -> Res<u64> {
        let at = line.find(&format!("\"{name}\":")).ok_or("missing field")? + name.len() + 3;
        let end = line[at..]
            .find(|c: char| !c.is_ascii_digit())
            .map_or(line.len(), |e| at + e);
        Ok(line[at..end].parse()?)
    };
    let bins_at = line.find("\"bins\":[").ok_or("no bins")? + 8;
    let body = &line[bins_at..line.len() - 2];
    let mut bins = Vec::new();
    for pair in body.split("],[") {
        let pair = pair.trim_matches(|c| c == '[' || c == ']');
        if pair.is_empty() {
            continue;
        }
        let (i, n) = pair.split_once(',').ok_or("bad bin")?;
        bins.push((i.parse()?, n.parse()?));
    }
    Ok((
        field("decisions")?,
        field("granted")?,
        field("redis_calls")?,
        bins,
    ))
}
