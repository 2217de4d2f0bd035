//! The exact pin-storm checker: every decision of a storm of takes, pins, unpins and
//! VERSION bumps, on the module and on the Functions library, checked against an
//! independent model of what the bucket may hold at the instant it decided.
//!
//! A server's wall clock is the test's: a small shim (`support/fake_clock.c`, loaded with
//! `LD_PRELOAD`) answers `clock_gettime(CLOCK_REALTIME)`, `gettimeofday` and `time` from a
//! word the test sets before each command. So the model knows each decision's instant to
//! the nanosecond, where a pipeline's `TIME` stamps only bracket it (the review's
//! "generous" model had to take the highest limit that could govern anywhere in a bracket,
//! and counted grants over it that it could not explain). Nothing here depends on how fast
//! the machine is: the clock moves only when the test moves it.
//!
//! The model (f64 tokens, written from docs/commands.md, not from rl-core):
//! - a bucket refills at the governing limit's rate up to its cap: a live rate pin's limit,
//!   else the limit of the newest `VERSION` seen (an older one is decided under it, an
//!   equal one with another limit applies that limit, as without versions);
//! - a limit change (a newer VERSION, a pin starting, a pin ending or lifted) carries the
//!   tokens over, clamped to the new cap; a pin with `PX` ends at its instant exactly;
//! - `BLOCK` denies and the bucket under it refills; `EXEMPT` grants and debits nothing;
//! - an absent key is a full bucket under the caller's limit; a rate pin on one starts, at
//!   the first call, with `min(caller's cap, pin's cap)`;
//! - a key that went is checked to have been full (under its limit, no pin live).
//!
//! A grant needs the model's tokens to cover it. The one documented allowance is counted
//! apart: a caller on an old VERSION that finds its key gone starts it under its old limit
//! (docs/commands.md, "Changing a limit": at most one bucket of its old cap, once).

mod support;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use support::*;

/// The shim, built into `dir` with the C compiler Rust links with (`cc`), else clang
/// (which scripts/install-deps installs for bindgen).
fn build_shim(dir: &Path) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/fake_clock.c");
    let so = dir.join("libfakeclock.so");
    let mut errors = String::new();
    for compiler in ["cc", "clang"] {
        let out = std::process::Command::new(compiler)
            .args(["-shared", "-fPIC", "-O2", "-o"])
            .arg(&so)
            .arg(&src)
            .arg("-ldl")
            .output();
        match out {
            Ok(out) if out.status.success() => return so,
            Ok(out) => errors += &format!("{compiler}: {}\n", String::from_utf8_lossy(&out.stderr)),
            Err(e) => errors += &format!("{compiler}: {e}\n"),
        }
    }
    panic!("cannot build the fake clock (a C compiler is needed):\n{errors}");
}

/// The word the shim reads: nanoseconds since the epoch, mapped shared from a file.
struct FakeClock {
    word: &'static AtomicU64,
    path: PathBuf,
}

impl FakeClock {
    fn new(dir: &Path) -> FakeClock {
        use std::os::unix::io::AsRawFd;
        let path = dir.join("clock");
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        f.set_len(8).unwrap();
        // SAFETY: an 8-byte shared mapping of a file we own, page-aligned, kept for the
        // process's life (leaked: the test process ends soon after).
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                8,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                f.as_raw_fd(),
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED, "mmap of the fake clock");
        // SAFETY: aligned, valid for the process's life, only accessed atomically.
        let word = unsafe { &*(p as *const AtomicU64) };
        FakeClock { word, path }
    }

    fn set(&self, ns: u64) {
        self.word.store(ns, Ordering::SeqCst);
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
struct Lim {
    rate: f64,
    cap: f64,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Rate(Lim),
    Block,
    Exempt,
}

#[derive(Clone, Copy, Debug)]
struct MPin {
    kind: Kind,
    /// When it ends (0: never).
    until: u64,
}

impl MPin {
    fn live_at(&self, t: u64) -> bool {
        self.until == 0 || t < self.until
    }
}

/// What the model holds for one key.
#[derive(Clone, Debug, Default)]
struct Model {
    /// A bucket is stored (not absent, not only a pin over nothing).
    present: bool,
    tokens: f64,
    /// The instant `tokens` is taken at.
    at: u64,
    /// The limit callers' versions resolve to (the bucket's own when no rate pin lives).
    base: Option<Lim>,
    version: u64,
    pin: Option<MPin>,
}

fn refill(tokens: f64, l: Lim, dt: u64) -> f64 {
    (tokens + l.rate * dt as f64 / 1e9).min(l.cap)
}

/// What the model says about one call.
#[derive(Debug, PartialEq)]
enum Verdict {
    /// May grant only with this many tokens there (and must deny without them).
    Tokens(f64),
    /// A live `BLOCK`, or a rate pin whose cap is below `n`: must deny.
    Deny,
    /// A live `EXEMPT`: grants, debits nothing.
    Exempt,
}

impl Model {
    /// Moves the model to `t`, ending a pin whose end has come (true if a rate pin over a
    /// bucket ended so).
    fn advance(&mut self, t: u64) -> bool {
        let mut ended = false;
        if let Some(p) = self.pin {
            if !p.live_at(t) {
                ended = self.present && matches!(p.kind, Kind::Rate(_));
                // Refill up to the pin's end under what governed, then without it.
                if self.present {
                    let end = p.until.max(self.at);
                    let governing = match p.kind {
                        Kind::Rate(l) => l,
                        _ => self.base.unwrap(),
                    };
                    self.tokens = refill(self.tokens, governing, end - self.at);
                    self.at = end;
                    self.tokens = self.tokens.min(self.base.unwrap().cap);
                }
                self.pin = None;
            }
        }
        if self.present {
            let governing = match self.pin {
                Some(MPin {
                    kind: Kind::Rate(l),
                    ..
                }) => l,
                _ => self.base.unwrap(),
            };
            self.tokens = refill(self.tokens, governing, t.saturating_sub(self.at));
            self.at = self.at.max(t);
        }
        ended
    }

    /// The server found no key at `t`: anything the model held must have been full and
    /// unpinned (else the key went early, and the next caller's fresh bucket mints).
    fn gone(&mut self, t: u64) -> Result<(), String> {
        let live_pin = self.pin.filter(|p| p.live_at(t));
        let r = if let Some(p) = live_pin {
            Err(format!("key went while its pin {p:?} lived"))
        } else if self.present && self.tokens < self.base.unwrap().cap - 1e-6 {
            Err(format!(
                "key went holding {} of {:?}",
                self.tokens,
                self.base.unwrap()
            ))
        } else {
            Ok(())
        };
        *self = Model::default();
        r
    }

    /// A take of `n` at `t` by a caller passing `limit` at `version`: the verdict, before
    /// the model is debited (by [`Model::taken`]), and whether what the call changed is
    /// stored even if it is denied (a newer VERSION is; a conflicting limit at the same
    /// version is not: a denial writes nothing then).
    fn take(&mut self, t: u64, limit: Lim, version: u64, n: f64) -> (Verdict, bool) {
        let newer = !self.present || version > self.version;
        let live = self.pin.filter(|p| p.live_at(t));
        match live.map(|p| p.kind) {
            Some(Kind::Block) => return (Verdict::Deny, false),
            Some(Kind::Exempt) => return (Verdict::Exempt, false),
            Some(Kind::Rate(pl)) => {
                if !self.present {
                    // The first call on a rate pin over nothing starts the bucket.
                    self.present = true;
                    self.tokens = limit.cap.min(pl.cap);
                    self.at = t;
                    self.base = Some(limit);
                    self.version = version;
                } else if version >= self.version {
                    // A newer version replaces the limit the pin returns to; an equal one
                    // with another limit applies it, as without versions.
                    self.base = Some(limit);
                    self.version = version;
                }
                if n > pl.cap {
                    return (Verdict::Deny, newer);
                }
            }
            None => {
                if !self.present {
                    self.present = true;
                    self.tokens = limit.cap;
                    self.at = t;
                    self.base = Some(limit);
                    self.version = version;
                } else if version >= self.version {
                    self.tokens = self.tokens.min(limit.cap);
                    self.base = Some(limit);
                    self.version = version;
                }
            }
        }
        (Verdict::Tokens(self.tokens), newer)
    }

    fn taken(&mut self, n: f64) {
        self.tokens -= n;
    }

    /// `RL.PIN` (the model already at its instant): a live rate pin's tokens go back to
    /// the callers' limit first, then into the new pin's (each clamped to the cap).
    fn pinned(&mut self, kind: Kind, until: u64) {
        // The bucket without its old pin, at `t`.
        if let Some(p) = self.pin.take() {
            if self.present {
                if let Kind::Rate(_) = p.kind {
                    self.tokens = self.tokens.min(self.base.unwrap().cap);
                }
            }
        }
        if let (Kind::Rate(pl), true) = (kind, self.present) {
            self.tokens = self.tokens.min(pl.cap);
        }
        self.pin = Some(MPin { kind, until });
    }

    fn unpinned(&mut self) {
        if let Some(p) = self.pin.take() {
            if self.present {
                if let Kind::Rate(_) = p.kind {
                    self.tokens = self.tokens.min(self.base.unwrap().cap);
                }
            }
        }
    }
}

/// One backend's spelling of the storm's commands.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Backend {
    Module,
    Functions,
}

impl Backend {
    fn take(self, key: &str, l: Lim, n: u64, v: u64) -> redis::Cmd {
        let args = [
            l.rate.to_string(),
            l.cap.to_string(),
            n.to_string(),
            "VERSION".into(),
            v.to_string(),
            "WITHSTATE".into(),
        ];
        match self {
            Backend::Module => {
                let mut c = redis::cmd("RL.TAKE");
                c.arg(key).arg(&args);
                c
            }
            Backend::Functions => {
                let mut c = redis::cmd("FCALL");
                c.arg("rl_take").arg(1).arg(key).arg(&args);
                c
            }
        }
    }

    fn pin(self, key: &str, kind: Kind, px: Option<u64>) -> redis::Cmd {
        let mut args: Vec<String> = match kind {
            Kind::Rate(l) => vec![l.rate.to_string(), l.cap.to_string()],
            Kind::Block => vec!["BLOCK".into()],
            Kind::Exempt => vec!["EXEMPT".into()],
        };
        if let Some(px) = px {
            args.extend(["PX".into(), px.to_string()]);
        }
        self.call("RL.PIN", "rl_pin", key, &args)
    }

    fn unpin(self, key: &str) -> redis::Cmd {
        self.call("RL.UNPIN", "rl_unpin", key, &[])
    }

    fn call(self, command: &str, function: &str, key: &str, args: &[String]) -> redis::Cmd {
        match self {
            Backend::Module => {
                let mut c = redis::cmd(command);
                c.arg(key).arg(args);
                c
            }
            Backend::Functions => {
                let mut c = redis::cmd("FCALL");
                c.arg(function).arg(1).arg(key).arg(args);
                c
            }
        }
    }
}

const RATES: [f64; 6] = [0.5, 2.0, 7.5, 30.0, 120.0, 200.0];
const CAPS: [f64; 6] = [1.0, 2.0, 3.0, 10.0, 40.0, 100.0];

fn random_limit(rng: &mut Rng) -> Lim {
    Lim {
        rate: *rng.pick(&RATES),
        cap: *rng.pick(&CAPS),
    }
}

/// What one storm found.
#[derive(Default, Debug)]
struct Findings {
    grants: u64,
    /// Grants the model could not cover, and keys that went early: each a line saying
    /// where and what.
    violations: Vec<String>,
    /// Denials where the model held enough (the model and the server disagree the other
    /// way: worth nothing to a caller, but a model that drifts would miss mints).
    under: Vec<String>,
    /// Tokens handed out by the documented allowance (a stale caller starting a gone key
    /// under its old, larger limit).
    stale_restarts: u64,
    /// The caps those callers' old limits had over the current one, summed (the most the
    /// allowance could have handed out).
    stale_restart_extra_cap: f64,
    /// Grants each backend made, in order (the backends must agree).
    decisions: Vec<bool>,
    /// What the storm went through, so a storm that misses a case fails.
    keys_gone: u64,
    rate_pins_ended: u64,
    pinned_grants: u64,
}

/// Runs `steps` storm steps on both backends in lockstep (the same call at the same
/// instant on each one's keys), the clock moved by the test.
/// `grain` is the clock's step in ns: 1000 when the Functions library runs (it reads the
/// server's `TIME`, in microseconds), 1 for the module alone.
fn storm(
    c: &mut Connection,
    clock: &FakeClock,
    backends: &[Backend],
    grain: u64,
    seed: u64,
    steps: usize,
    start: u64,
) -> Vec<Findings> {
    let mut rng = Rng(seed);
    let keys: Vec<Vec<String>> = backends
        .iter()
        .map(|b| (0..3).map(|i| format!("{{s}}:{b:?}:{i}")).collect())
        .collect();
    let mut models = vec![vec![Model::default(); 3]; backends.len()];
    // What each key went through lately, for a failure's message.
    let mut traces = vec![vec![Vec::<String>::new(); 3]; backends.len()];
    // The callers' limit per version; version `v` is current, `v - 1` stale (at 4x).
    let mut version = 1u64;
    let mut current = random_limit(&mut rng);
    let mut stale = current;
    let mut t = start;
    let mut found: Vec<Findings> = backends.iter().map(|_| Findings::default()).collect();
    // Pin ends, to land the clock on them (and a microsecond either side).
    let mut ends: Vec<u64> = Vec::new();
    for step in 0..steps {
        // Move the clock: mostly by microseconds to a few ms, sometimes to a pin's end,
        // sometimes far enough for keys to fill and go.
        let us = 1_000;
        t += match rng.below(100) {
            // Several calls at one instant (a pipeline's burst).
            0..=19 => 0,
            20..=59 => rng.below(2_000) * us,
            60..=84 => rng.below(20_000) * us,
            85..=94 => match ends.iter().find(|&&e| e > t + grain) {
                // Just before, at or just after an end.
                Some(&end) => end - t - grain + rng.below(3) * grain,
                None => rng.below(5_000) * us,
            },
            95..=97 => rng.below(3_000_000) * us,
            // Long enough for every limit here to fill (cap 400 at 2/s): keys go.
            _ => (200_000_000 + rng.below(200_000_000)) * us,
        };
        if grain == 1 {
            // Off the microsecond grid (the module reads nanoseconds).
            t += rng.below(1_000);
        }
        ends.retain(|&e| e + 5_000_000 > t);
        clock.set(t);
        let k = rng.below(3) as usize;
        enum Op {
            Take(Lim, u64, u64, bool),
            Pin(Kind, Option<u64>),
            Unpin,
            Bump,
        }
        let op = match rng.below(100) {
            0..=71 => {
                let stale_call = version > 1 && rng.chance(15);
                let n = 1 + rng.below(3);
                if stale_call {
                    Op::Take(stale, version - 1, n, true)
                } else {
                    Op::Take(current, version, n, false)
                }
            }
            72..=85 => {
                let kind = match rng.below(4) {
                    0 => Kind::Block,
                    1 => Kind::Exempt,
                    _ => Kind::Rate(random_limit(&mut rng)),
                };
                Op::Pin(kind, rng.chance(70).then(|| 1 + rng.below(50)))
            }
            86..=93 => Op::Unpin,
            _ => Op::Bump,
        };
        if let Op::Bump = op {
            // The callers move on; those left behind send the old version at 4x.
            version += 1;
            stale = Lim {
                rate: current.rate * 4.0,
                cap: current.cap * 4.0,
            };
            current = random_limit(&mut rng);
            continue;
        }
        for (bi, &backend) in backends.iter().enumerate() {
            let key = &keys[bi][k];
            let m = &mut models[bi][k];
            let f = &mut found[bi];
            let trace = &mut traces[bi][k];
            if trace.len() > 24 {
                trace.remove(0);
            }
            let exists: i64 = query(c, &["EXISTS", key]);
            f.rate_pins_ended += m.advance(t) as u64;
            if exists == 0 && (m.present || m.pin.is_some()) {
                f.keys_gone += 1;
            }
            if exists == 0 {
                if let Err(e) = m.gone(t) {
                    f.violations.push(format!("step {step} t={t} {key}: {e}"));
                }
            }
            match op {
                Op::Take(l, v, n, stale_call) => {
                    let was_present = m.present;
                    let before = m.clone();
                    let (verdict, kept_if_denied) = m.take(t, l, v, n as f64);
                    let r: redis::RedisResult<Vec<Value>> = backend.take(key, l, n, v).query(c);
                    trace.push(format!(
                        "t={t} exists={exists} take {n} {l:?} v{v} -> {r:?}; model {before:?}"
                    ));
                    let granted = match r {
                        Ok(r) => redis::from_redis_value::<i64>(&r[0]).unwrap() > 0,
                        Err(e) => {
                            // A stale caller's `n` above the stored cap is refused, and
                            // nothing changes: undo the model.
                            assert!(
                                e.to_string().contains("must not exceed cap"),
                                "step {step} {key}: {e}"
                            );
                            *m = before;
                            f.decisions.push(false);
                            continue;
                        }
                    };
                    f.decisions.push(granted);
                    if !granted && !kept_if_denied {
                        *m = before.clone();
                    }
                    let ctx = || {
                        format!(
                            "step {step} t={t} {key} take {n} under {l:?} v{v}, model {before:?} -> {verdict:?}"
                        )
                    };
                    match verdict {
                        Verdict::Deny if granted => {
                            f.violations.push(format!("granted: {}", ctx()))
                        }
                        Verdict::Exempt if !granted => f.under.push(format!("denied: {}", ctx())),
                        Verdict::Tokens(have) => {
                            if granted {
                                f.grants += 1;
                                f.pinned_grants += m.pin.is_some_and(|p| p.live_at(t)) as u64;
                                if have < n as f64 - 1e-6 {
                                    f.violations.push(format!(
                                        "granted with {have}: {}\n  {}",
                                        ctx(),
                                        trace.join("\n  ")
                                    ));
                                }
                                if stale_call && !was_present && m.pin.is_none() {
                                    f.stale_restarts += 1;
                                    f.stale_restart_extra_cap += (l.cap - current.cap).max(0.0);
                                }
                                m.taken(n as f64);
                            } else if have >= n as f64 + 1e-3 {
                                f.under.push(format!(
                                    "denied with {have}: {}\n  {}",
                                    ctx(),
                                    trace.join("\n  ")
                                ));
                            }
                        }
                        _ => {}
                    }
                }
                Op::Pin(kind, px) => {
                    let until = px.map_or(0, |px| t + px * 1_000_000);
                    let _: String = backend
                        .pin(key, kind, px)
                        .query(c)
                        .unwrap_or_else(|e| panic!("step {step} pin: {e}"));
                    m.pinned(kind, until);
                    trace.push(format!("t={t} exists={exists} pin {kind:?} px {px:?}"));
                    if until > 0 && bi == 0 {
                        ends.push(until);
                    }
                }
                Op::Unpin => {
                    let _: i64 = backend.unpin(key).query(c).unwrap();
                    m.unpinned();
                    trace.push(format!("t={t} exists={exists} unpin"));
                }
                Op::Bump => unreachable!(),
            }
        }
    }
    found
}

fn check(backend: Backend, f: &Findings) {
    eprintln!(
        "{backend:?}: {} grants checked ({} under a rate pin), {} keys gone, {} rate pins \
         ended by themselves, {} denials the model would have granted, {} stale restarts \
         (allowance: {} tokens of cap over the current limit)",
        f.grants,
        f.pinned_grants,
        f.keys_gone,
        f.rate_pins_ended,
        f.under.len(),
        f.stale_restarts,
        f.stale_restart_extra_cap
    );
    assert!(
        f.violations.is_empty(),
        "{backend:?}: {} decisions over the bound:\n{}",
        f.violations.len(),
        f.violations[..f.violations.len().min(20)].join("\n")
    );
    assert!(
        f.under.is_empty(),
        "{backend:?}: the model disagrees with {} denials (a model that drifts misses mints):\n{}",
        f.under.len(),
        f.under[..f.under.len().min(20)].join("\n")
    );
    assert!(
        f.grants > 500 && f.pinned_grants > 50 && f.keys_gone > 5 && f.rate_pins_ended > 20,
        "the storm missed what it is for: {} grants, {} pinned, {} keys gone, {} pins ended",
        f.grants,
        f.pinned_grants,
        f.keys_gone,
        f.rate_pins_ended
    );
}

/// A server whose wall clock the test holds, with the Functions library loaded, and the
/// instant its clock starts at; `None` on a server whose own clock does not follow the
/// wall clock at once (Valkey 9 adds TSC ticks to its last wall reading between cron
/// resyncs, so its `TIME` and key expiry would lag the test's instant by up to 100 ms).
fn server_on_a_fake_clock(work: &Path) -> Option<(Server, FakeClock, u64)> {
    let shim = build_shim(work);
    let clock = FakeClock::new(work);
    let s = Server::start_env(
        &[],
        &[
            ("LD_PRELOAD", shim.to_str().unwrap()),
            ("RL_FAKE_CLOCK", clock.path.to_str().unwrap()),
        ],
    );
    let mut c = s.conn();
    let lib =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/functions/rl.lua")).unwrap();
    let _: String = redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg("REPLACE")
        .arg(&lib)
        .query(&mut c)
        .unwrap();
    // Whole milliseconds from a little ahead of the real clock: the server has read the
    // real one until now, and the test's must not step back from it.
    let real = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let start = (real + 1_000) * 1_000_000;
    clock.set(start);
    let time: Vec<u64> = query(&mut c, &["TIME"]);
    let seen = time[0] * 1_000_000_000 + time[1] * 1_000;
    if seen != start {
        eprintln!(
            "skipped: {} reads {seen} where the test's clock says {start} (a cached wall \
             clock, as Valkey 9 keeps: the checker needs the server to read the clock at \
             every command)",
            server_binary()
        );
        return None;
    }
    // The module reads the same clock (its own `clock_gettime`): a bucket drained at
    // `start` holds what 10 s of the test's clock refill.
    let _: i64 = query(&mut c, &["RL.TAKE", "probe", "1", "100", "100"]);
    clock.set(start + 10_000_000_000);
    let peek: Value = query(&mut c, &["RL.PEEK", "probe"]);
    assert!(
        format!("{peek:?}").contains("\"10\""),
        "the module reads the test's clock: {peek:?}"
    );
    let _: i64 = query(&mut c, &["DEL", "probe"]);
    let start = start + 10_000_000_000;
    Some((s, clock, start))
}

/// Storms on the module and on the Functions library in lockstep, at whole microseconds:
/// every grant covered by the model, no key gone early, both backends deciding alike.
#[test]
fn pin_storms_grant_nothing_over_the_bound_at_exact_instants() {
    let work = tempfile::tempdir().unwrap();
    let Some((s, clock, start)) = server_on_a_fake_clock(work.path()) else {
        return;
    };
    let mut c = s.conn();
    let backends = [Backend::Module, Backend::Functions];
    let found = storm(
        &mut c,
        &clock,
        &backends,
        1_000,
        Rng::seeded(45).0,
        6_000,
        start,
    );
    check(Backend::Module, &found[0]);
    check(Backend::Functions, &found[1]);
    let first = found[0]
        .decisions
        .iter()
        .zip(&found[1].decisions)
        .position(|(a, b)| a != b);
    assert_eq!(first, None, "the backends decided differently");
}

/// The module alone, its clock off the microsecond grid (it reads nanoseconds: pin ends,
/// refills and carries at any nanosecond).
#[test]
fn pin_storms_on_the_module_hold_at_nanosecond_instants() {
    let work = tempfile::tempdir().unwrap();
    let Some((s, clock, start)) = server_on_a_fake_clock(work.path()) else {
        return;
    };
    let mut c = s.conn();
    let found = storm(
        &mut c,
        &clock,
        &[Backend::Module],
        1,
        Rng::seeded(46).0,
        6_000,
        start,
    );
    check(Backend::Module, &found[0]);
}
