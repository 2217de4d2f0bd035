#!/usr/bin/env python3
"""The incident replay: one skewed arrival trace, replayed against every approach.

Run through scripts/incident (which builds what is needed). Standard library only, except
the plots (matplotlib, from the venv scripts/incident makes). See docs/incident.md.

  incident.py --driver BIN --module SO [--smoke] [--plots]
"""

import argparse
import bisect
import datetime
import hashlib
import json
import os
import platform
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

RATE, CAP = 1000.0, 1000.0  # the partner quota: 1000 calls/s, burst 1000
BATCH, TTL_MS = 20, 2000  # PrefetchLimiter
MAX_WAIT_MS = 100  # RL.RESERVE pacing budget
PERIOD_MS = 1000  # ShareLimiter refresh period
PIN_RATE = 500.0  # mid-trace the partner asks for this: an operator pins the shared key
SEED = 20240611

# The scenario. Times in seconds. Before `scale_at` 8 instances run; 3 of them carry 84 %
# of the demand. At `scale_at` the autoscaler (reacting to the saturated hot instances)
# adds 8 more; the hot 3 keep their long-lived connections and 48 % of the demand.
FULL = dict(duration=12.0, warmup=2.0, scale_at=5.0, kill_at=0.5, stop_at=8.0, stop_for=2.0,
            pin_at=7.0)
SMOKE = dict(duration=2.0, warmup=0.5, scale_at=1.0, kill_at=None, stop_at=None, stop_for=0.0,
             pin_at=1.0)
BASE, EXTRA = 8, 8
HOT = [0, 1, 2]
DEMAND_BEFORE = {i: (700.0 if i in HOT else 80.0) for i in range(BASE)}  # 2500/s
DEMAND_AFTER = {i: (400.0 if i in HOT else 100.0) for i in range(BASE + EXTRA)}  # 2500/s

# (i) The hot spot moves: the seed's 8 instances, one of them hot (the seed's 700/s), the
# other 7 at the seed's 80/s (1,260/s in all against 1,000/s), the hot one moving to the
# next instance every `move_every` seconds; no scale-out. Its own trace, from the same seed.
MOVING_FULL = dict(duration=15.0, warmup=2.0, move_every=3.0)
MOVING_SMOKE = dict(duration=3.0, warmup=0.5, move_every=1.0)
MOVING_HOT, MOVING_COLD = 700.0, 80.0
# A moved hot spot has converged when its new instance lets out this much of its max-min
# share in a `CONVERGE_WINDOW` window (the skew bench's measure, scripts/benchtool/share_skew.py).
CONVERGE_FRACTION, CONVERGE_WINDOW = 0.95, 0.2
# Windows the moving run's let-out is checked in against `cap + rate * t + holders`.
WINDOWS_S = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0)
# Utilisation the moving run is held to while anyone is short (reported, not asserted:
# it depends on timing).
UTILISATION_TARGET = 0.97

# Commands that are central limiter calls (INFO commandstats names).
CENTRAL = ("evalsha", "rl.take", "rl.lease", "rl.return", "rl.reserve", "rl.share")


def make_trace(sc, path):
    """Poisson arrivals per instance, piecewise-constant rates, from SEED."""
    rng = random.Random(SEED)
    rows = []
    for inst in range(BASE + EXTRA):
        for (start, end, demand) in (
            (0.0, sc["scale_at"], DEMAND_BEFORE),
            (sc["scale_at"], sc["duration"], DEMAND_AFTER),
        ):
            rate = demand.get(inst, 0.0)
            if rate <= 0:
                continue
            t = start
            while True:
                t += rng.expovariate(rate)
                if t >= end:
                    break
                rows.append((int(t * 1e6), inst))
    rows.sort()
    with open(path, "w") as f:
        f.write("t_us,instance\n")
        for t, i in rows:
            f.write(f"{t},{i}\n")
    with open(path, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    return len(rows), digest


def moving_demand(sc, inst, t):
    """Instance `inst`'s demand at `t` in the moving run: hot while it holds the hot spot."""
    hot = int(t // sc["move_every"]) % BASE
    return MOVING_HOT if inst == hot else MOVING_COLD


def make_moving_trace(sc, path):
    """Poisson arrivals per instance for (i), piecewise-constant between moves, from SEED."""
    rng = random.Random(SEED)
    rows = []
    moves = int(sc["duration"] / sc["move_every"]) + 1
    for inst in range(BASE):
        for k in range(moves):
            start = k * sc["move_every"]
            end = min(sc["duration"], start + sc["move_every"])
            rate = moving_demand(sc, inst, start)
            t = start
            while True:
                t += rng.expovariate(rate)
                if t >= end:
                    break
                rows.append((int(t * 1e6), inst))
    rows.sort()
    with open(path, "w") as f:
        f.write("t_us,instance\n")
        for t, i in rows:
            f.write(f"{t},{i}\n")
    with open(path, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    return len(rows), digest


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Redis:
    """A throwaway redis-server with the module, on loopback."""

    def __init__(self, module):
        self.dir = tempfile.mkdtemp(prefix="rl-incident-")
        self.port = free_port()
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
             "--save", "", "--appendonly", "no", "--dir", self.dir,
             "--loadmodule", module],
            stdout=open(os.path.join(self.dir, "log"), "w"), stderr=subprocess.STDOUT)
        for _ in range(100):
            if self.cli("PING") == "PONG":
                return
            time.sleep(0.05)
        raise RuntimeError("redis-server did not start: " + open(os.path.join(self.dir, "log")).read())

    def cli(self, *args):
        r = subprocess.run(["redis-cli", "-p", str(self.port), *args],
                           capture_output=True, text=True, timeout=5)
        return r.stdout.strip()

    def url(self):
        return f"redis://127.0.0.1:{self.port}/"

    def close(self):
        try:
            os.kill(self.proc.pid, signal.SIGCONT)  # never leave it stopped
        except ProcessLookupError:
            pass
        self.proc.terminate()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


def runs_for(smoke):
    """(name, label, driver args, kind) per run."""
    runs = [
        ("local_static", "(a) local split, 125/s each, configured for 8", ["--approach", "local", "--local-limit", "static"], "local"),
    ]
    if not smoke:
        runs.append(("local_recompute", "(a') local split, new instances take 1000/16",
                     ["--approach", "local", "--local-limit", "recompute"], "local"))
    runs += [
        ("lua", "(b) seed Lua script, EVALSHA per call", ["--approach", "lua"], "central"),
        ("take", "(c) RL.TAKE per call (Limiter)", ["--approach", "take"], "central"),
        ("prefetch", f"(d) RL.LEASE batch {BATCH} (PrefetchLimiter)", ["--approach", "prefetch"], "lease"),
        ("reserve", f"(e) RL.RESERVE pacing, max wait {MAX_WAIT_MS} ms", ["--approach", "reserve"], "central"),
        ("share", f"(g) RL.SHARE rate shares, period {PERIOD_MS / 1000:g} s (ShareLimiter)",
         ["--approach", "share", "--period-ms", str(PERIOD_MS)], "share"),
    ]
    # The hot instance moves every few seconds (its own trace and scenario: `MOVING_*`).
    runs.append(("share_moving",
                 f"(i) RL.SHARE, the hot instance moves every {(MOVING_SMOKE if smoke else MOVING_FULL)['move_every']:g} s (ShareLimiter)",
                 ["--approach", "share", "--period-ms", str(PERIOD_MS)], "share_moving"))
    runs.append(("pin_take", f"(h) {PIN_RATE:g}/s pinned mid-trace, RL.TAKE per call (Limiter)",
                 ["--approach", "take"], "pin"))
    # The partner asks for 500/s mid-trace: `RL.PIN` on the shared key, no redeploy.
    if not smoke:
        runs.append(("pin_prefetch",
                     f"(h) {PIN_RATE:g}/s pinned mid-trace, RL.LEASE batch {BATCH} (PrefetchLimiter)",
                     ["--approach", "prefetch"], "pin"))
    runs.append(("pin_share",
                 f"(h) {PIN_RATE:g}/s pinned mid-trace, RL.SHARE period {PERIOD_MS / 1000:g} s (ShareLimiter)",
                 ["--approach", "share", "--period-ms", str(PERIOD_MS)], "pin"))
    if not smoke:
        for pol, label in (("allow", "Allow (instances=8)"), ("lastknown", "LastKnown"), ("deny", "Deny")):
            runs.append((f"fail_{pol}", f"(f) lease death + Redis stopped 2 s, {label}",
                         ["--approach", "prefetch", "--policy", pol, "--share", "0.125",
                          "--kill-instance", "max"], "failure"))
        for pol, label in (("allow", "Allow"), ("lastknown", "LastKnown"), ("deny", "Deny")):
            runs.append((f"fail_share_{pol}", f"(f) ShareLimiter: holder death + Redis stopped 2 s, {label}",
                         ["--approach", "share", "--period-ms", str(PERIOD_MS), "--policy", pol,
                          "--share", "0.125", "--kill-instance", "max"], "share_failure"))
    return runs


def load_run(prefix):
    meta = json.load(open(prefix + ".meta.json"))
    if not meta.get("available", True):
        return meta, None, None
    events = []
    with open(prefix + ".events.csv") as f:
        next(f)
        for line in f:
            p = line.rstrip("\n").split(",")
            events.append((int(p[0]), int(p[1]), int(p[2]), int(p[3]), int(p[4]), p[5], p[6]))
    samples = [json.loads(l) for l in open(prefix + ".samples.jsonl") if l.strip()]
    for s in samples:  # module commands show in upper case
        s["cmds"] = {k.lower(): v for k, v in s["cmds"].items()}
    if os.path.exists(prefix + ".shares.jsonl"):
        meta["shares"] = [json.loads(l) for l in open(prefix + ".shares.jsonl") if l.strip()]
    return meta, events, samples


def pct(values, q):
    if not values:
        return None
    v = sorted(values)
    k = min(len(v) - 1, max(0, int(round(q / 100.0 * (len(v) - 1)))))
    return v[k]


def max_window(sends, lo, hi, width=1.0):
    """Most sends in any window [x, x+width) inside [lo, hi] (sends sorted, seconds)."""
    if hi - lo < width:
        return bisect.bisect_left(sends, hi) - bisect.bisect_left(sends, lo)
    starts = [lo] + [s for s in sends if lo <= s <= hi - width]
    return max(bisect.bisect_left(sends, x + width) - bisect.bisect_left(sends, x) for x in starts)


def central_series(samples, lo, hi):
    """(calls/s, command µs/s, CPU %) between the first and last sample in [lo, hi]."""
    pts = [s for s in samples if lo * 1e6 <= s["t"] <= hi * 1e6]
    if len(pts) < 2:
        return None, None, None
    a, b = pts[0], pts[-1]
    dt = (b["t"] - a["t"]) / 1e6

    def tot(s, idx):
        return sum(s["cmds"].get(c, [0, 0])[idx] for c in CENTRAL)

    calls = (tot(b, 0) - tot(a, 0)) / dt
    usec = (tot(b, 1) - tot(a, 1)) / dt
    cpu = ((b["cpu_user"] + b["cpu_sys"]) - (a["cpu_user"] + a["cpu_sys"])) / dt * 100
    return calls, usec, cpu


def analyse(name, label, kind, meta, events, samples, sc):
    res = {"name": name, "label": label, "kind": kind, "available": True}
    if events is None:
        res["available"] = False
        return res
    # The moving run (i) has no scale-out: `scale` is None there.
    dur, warm, scale = sc["duration"], sc["warmup"], sc.get("scale_at")
    sends = sorted(e[4] / 1e6 for e in events if e[5] == "G")
    n = lambda lo, hi: bisect.bisect_left(sends, hi) - bisect.bisect_left(sends, lo)
    res["sent_total"] = len(sends)
    res["partner_mean"] = n(warm, dur) / (dur - warm)
    res["partner_mean_8"] = n(warm, scale) / (scale - warm) if scale else None
    res["partner_mean_16"] = n(scale, dur) / (dur - scale) if scale else None
    res["partner_max_1s"] = max_window(sends, warm, dur)
    res["partner_first_1s"] = n(0.0, 1.0) if dur >= 1.0 else None
    res["over_issue_max_1s"] = res["partner_max_1s"] - RATE
    # Bound: cumulative sends since the start <= cap + rate * t (t from the run's t0).
    worst = max((k + 1) - (CAP + RATE * s) for k, s in enumerate(sends)) if sends else 0.0
    res["bound_excess"] = worst  # > 0: let out more than cap + rate*t at some instant
    res["let_out_vs_bound"] = {"sent": len(sends), "bound_at_end": CAP + RATE * (sends[-1] if sends else 0)}
    decided = [e for e in events if e[5] in "GDE"]
    lat = [(e[4] if (e[5] == "G" and e[4] > 0) else e[3]) - e[2] for e in decided]
    res["latency_p50_us"] = pct(lat, 50)
    res["latency_p99_us"] = pct(lat, 99)
    res["latency_max_us"] = max(lat) if lat else None
    res["arrivals"] = len(events)
    res["denied"] = sum(1 for e in events if e[5] == "D")
    res["dropped_dead_instance"] = sum(1 for e in events if e[5] == "X")
    res["errors"] = sum(1 for e in events if e[5] == "E")
    res["fallback_granted"] = sum(1 for e in events if e[5] == "G" and e[6] == "F")
    res["per_instance_sent_16"] = {}
    for e in events:
        if scale is not None and e[5] == "G" and e[4] / 1e6 >= scale:
            res["per_instance_sent_16"][e[0]] = res["per_instance_sent_16"].get(e[0], 0) + 1
    calls, usec, cpu = central_series(samples, warm, dur)
    res["central_calls_per_s"] = calls
    res["redis_cmd_us_per_s"] = usec
    res["redis_cpu_pct"] = cpu
    res["client"] = meta.get("client", {})
    # 100 ms series for the plots.
    bins = int(dur * 10 + 0.5)
    series = [0] * bins
    for s in sends:
        if 0 <= s < dur:
            series[int(s * 10)] += 1
    res["series_sent_100ms"] = series
    cs = []
    for a, b in zip(samples, samples[1:]):
        dt = (b["t"] - a["t"]) / 1e6
        if dt <= 0:
            continue
        d = sum(b["cmds"].get(c, [0, 0])[0] - a["cmds"].get(c, [0, 0])[0] for c in CENTRAL)
        cs.append([round(b["t"] / 1e6, 3), round(d / dt, 1)])
    res["series_central_calls"] = cs
    if kind in ("failure", "share_failure"):
        res["failure"] = failure_details(meta, events, samples, sends, sc)
    if kind in ("share", "share_failure"):
        res["shares"] = share_details(meta, sc, res.get("failure"))
    if kind == "pin":
        res["pin"] = pin_details(meta, sends, dur)
        if meta.get("shares") is not None:
            res["pin"].update(pin_share_details(meta, res["pin"]))
    if kind == "share_moving":
        res["shares"] = {"series": [[round(r["t"] / 1e6, 2), r["rates"]] for r in meta.get("shares", [])]}
        res["moving"] = moving_details(meta, events, sends, sc, len({e[0] for e in events}))
    return res


def worst_windows(sends, holders):
    """`[[w, most sent in any w seconds, cap + rate * w + holders], ...]` (sends sorted)."""
    out = []
    for w in WINDOWS_S:
        most = max((bisect.bisect_left(sends, x + w) - k for k, x in enumerate(sends)), default=0)
        out.append([w, most, CAP + RATE * w + holders])
    return out


def moving_details(meta, events, sends, sc, holders):
    """(i): the fleet's let-out per second, the utilisation from the warm-up on, the time
    after each move until the newly hot instance lets out `CONVERGE_FRACTION` of its max-min
    share in a `CONVERGE_WINDOW`, and the most let out in every window against its bound."""
    dur, warm, every = sc["duration"], sc["warmup"], sc["move_every"]
    n = lambda xs, lo, hi: bisect.bisect_left(xs, hi) - bisect.bisect_left(xs, lo)
    per_second = [n(sends, k, k + 1) for k in range(int(dur))]
    per_inst = {}
    for e in events:
        if e[5] == "G":
            per_inst.setdefault(e[0], []).append(e[4] / 1e6)
    for v in per_inst.values():
        v.sort()
    converge = []
    k = 1
    while k * every < dur - 0.5:
        t = k * every
        hot = k % BASE
        demand = {i: moving_demand(sc, i, t) for i in range(BASE)}
        target = fair_shares(demand, RATE)[hot] * CONVERGE_WINDOW * CONVERGE_FRACTION
        mine = per_inst.get(hot, [])
        got = None
        x = t
        while x + CONVERGE_WINDOW <= min(dur, t + every) + 1e-9:
            if n(mine, x, x + CONVERGE_WINDOW) >= target:
                got = round(x + CONVERGE_WINDOW - t, 2)
                break
            x += 0.01
        converge.append({"at_s": t, "instance": hot, "after_s": got})
        k += 1
    windows = worst_windows(sends, holders)
    return {
        "scenario": sc,
        "demand": {"hot": MOVING_HOT, "cold": MOVING_COLD, "total": MOVING_HOT + MOVING_COLD * (BASE - 1)},
        "fair_hot": fair_shares({i: moving_demand(sc, i, 0) for i in range(BASE)}, RATE)[0],
        "per_second": per_second,
        "utilisation": n(sends, warm, dur) / (RATE * (dur - warm)),
        "target": UTILISATION_TARGET,
        "converge": converge,
        "windows": windows,
        "within": all(most <= bound for _, most, bound in windows),
        "holders": holders,
    }


def pin_details(meta, sends, dur):
    """After the operator's pin at `pinned_s`: how long until every later 1 s window holds
    at most the pinned rate (5 % and one call of slack: the last lease or two still being
    spent), the rate after it, and the bound the pin sets: sends since the pin <=
    pinned cap (its tokens carried over) + pinned rate * t."""
    at = meta["pinned_us"] / 1e6
    rate = meta["pin_rate"]
    n = lambda lo, hi: bisect.bisect_left(sends, hi) - bisect.bisect_left(sends, lo)
    # Windows start every 10 ms from the pin to the last full second of the run.
    starts = [at + k / 100 for k in range(int(max(0.0, dur - 1.0 - at) * 100) + 1)]
    over = [x for x in starts if n(x, x + 1.0) > rate * 1.05 + 1]
    settled = (max(over) + 0.01 - at) if over else 0.0
    after = [s for s in sends if s >= at]
    worst = max(((k + 1) - (rate + rate * (s - at)) for k, s in enumerate(after)), default=0.0)
    # The partner's rate in 100 ms steps from the pin: the first step at most the pinned
    # rate (same slack), and the lowest in the 2 s after the pin (a share key undershoots
    # while the shares given before the pin are still counted).
    steps = [n(at + k / 10, at + (k + 1) / 10) * 10 for k in range(int(max(0.0, dur - at) * 10))]
    first_low = next((k for k, v in enumerate(steps) if v <= rate * 1.05 + 10), None)
    return {
        "pinned_s": round(at, 3),
        "rate": rate,
        "first_100ms_within_s": round((first_low + 1) / 10, 1) if first_low is not None else None,
        "min_100ms_2s_after": min(steps[:20], default=None),
        "series_100ms_after": steps[:20],
        "settled_s": round(settled, 2),
        "rate_after": round(n(at + 1.0, dur) / (dur - at - 1.0), 1) if dur - at > 1.0 else None,
        "max_1s_after": max((n(x, x + 1.0) for x in starts), default=0),
        "bound_excess": worst,
    }


def pin_share_bound_slack(holders):
    """How far a pinned share key's let-out may exceed the pin's `cap + rate * t`: holders
    keep spending the shares they were given before the pin until those end (one lease, three
    periods, at most: docs/share.md), and their local buckets hold at most the old bursts
    (which sum to <= the old cap); plus a token of rounding per holder."""
    lease = 3 * PERIOD_MS / 1000
    return (CAP - PIN_RATE) + (RATE - PIN_RATE) * lease + holders + 1


def pin_share_details(meta, pin):
    """(h) for ShareLimiter: when the holders' shares (each instance's share rate, sampled
    every 100 ms) first sum to at most the pinned rate, and the slack the pin's bound has."""
    at = pin["pinned_s"]
    reached = None
    for row in meta["shares"]:
        t = row["t"] / 1e6
        if t >= at and sum(x for x in row["rates"] if x is not None) <= pin["rate"] + 1e-6:
            reached = round(t - at, 2)
            break
    holders = max((sum(1 for x in row["rates"] if x is not None) for row in meta["shares"]), default=0)
    return {"shares_within_pin_s": reached, "holders": holders,
            "bound_slack": pin_share_bound_slack(holders)}


def fair_shares(demand, rate):
    """Max-min fair division of `rate` by demand (water-filling)."""
    left, fair = rate, {}
    todo = sorted(demand.items(), key=lambda kv: kv[1])
    while todo:
        level = left / len(todo)
        i, d = todo[0]
        if d <= level:
            fair[i] = d
            left -= d
            todo.pop(0)
        else:
            for i, _ in todo:
                fair[i] = level
            break
    return fair


def share_details(meta, sc, failure):
    """Each instance's share over time; when the shares were fair after the scale-out."""
    rows = meta.get("shares", [])
    out = {"series": [[round(r["t"] / 1e6, 2), r["rates"]] for r in rows]}
    fair = fair_shares(DEMAND_AFTER, RATE)
    reached = None
    for r in rows:
        t = r["t"] / 1e6
        if t < sc["scale_at"]:
            continue
        rates = r["rates"]
        if all(rates[i] is not None and abs(rates[i] - f) <= 0.1 * f for i, f in fair.items()
               if i < len(rates)):
            reached = t - sc["scale_at"]
            break
    out["fair_after_scale_s"] = reached
    out["fair_share_16"] = fair
    if failure and failure.get("killed"):
        k = failure["killed"][0]
        dead, at = k["instance"], k["at_us"] / 1e6
        back = None
        for r in rows:
            t = r["t"] / 1e6
            live = sum(x for i, x in enumerate(r["rates"]) if i != dead and x is not None)
            if t > at and live >= 0.95 * RATE:
                back = t - at
                break
        out["dead_share_back_after_s"] = back
    return out


def failure_details(meta, events, samples, sends, sc):
    out = {}
    killed = meta.get("killed", [])
    kill_at = killed[0]["at_us"] / 1e6 if killed else sc["kill_at"]
    out["killed"] = killed
    # When did the dead instance's lease(s) expire on the server? rl_leases_expired rises.
    before = [s for s in samples if s["t"] <= kill_at * 1e6]
    base = before[-1]["leases_expired"] if before else 0
    expiries = [(s["t"] / 1e6, s["leases_expired"] - base) for s in samples
                if s["t"] > kill_at * 1e6 and s["leases_expired"] > base]
    out["leases_expired_first_seen_s"] = expiries[0][0] if expiries else None
    ttl = TTL_MS / 1000
    window = [c for t, c in expiries if t <= kill_at + ttl + 0.5]
    out["leases_expired_within_ttl"] = window[-1] if window else 0
    out["leases_expired_after_death_s"] = (expiries[0][0] - kill_at) if expiries else None
    lt = [(round(s["t"] / 1e6, 2), s["leased_tokens"]) for s in samples
          if kill_at - 0.5 <= s["t"] / 1e6 <= kill_at + 3.0]
    out["leased_tokens_around_death"] = lt
    stop, cont = meta.get("sigstop_us", 0) / 1e6, meta.get("sigcont_us", 0) / 1e6
    out["sigstop_s"], out["sigcont_s"] = stop, cont
    n = lambda lo, hi: bisect.bisect_left(sends, hi) - bisect.bisect_left(sends, lo)
    out["partner_rate_during_outage"] = n(stop, cont) / (cont - stop)
    out["partner_rate_1s_before"] = n(stop - 1, stop)
    out["partner_rate_1s_after"] = n(cont, cont + 1)
    out["outage_rate_first_1s"] = n(stop, stop + 1)
    out["outage_rate_second_1s"] = n(stop + 1, cont)
    out["sent_during_outage"] = n(stop, cont)
    out["excess_over_quota_during_outage"] = n(stop, cont) - RATE * (cont - stop)
    out["max_1s_around_outage"] = max_window(sends, stop - 1, min(sc["duration"], cont + 1))
    fb = [e for e in events if e[6] == "F"]
    out["fallback_decisions"] = len(fb)
    out["fallback_granted"] = sum(1 for e in fb if e[5] == "G")
    out["denied_during_outage"] = sum(1 for e in events if e[5] == "D" and stop <= e[3] / 1e6 < cont)
    last_fb = max((e[3] / 1e6 for e in fb), default=None)
    out["last_fallback_decision_s"] = last_fb
    out["fallback_ends_after_sigcont_s"] = (last_fb - cont) if last_fb else None
    first_fb = min((e[3] / 1e6 for e in fb), default=None)
    out["fallback_starts_after_sigstop_s"] = (first_fb - stop) if first_fb else None
    dec = [e for e in events if e[5] in "GDE" and stop <= e[2] / 1e6 < cont]
    out["latency_p99_during_outage_us"] = pct([e[3] - e[2] for e in dec], 99)
    out["latency_max_during_outage_us"] = max((e[3] - e[2] for e in dec), default=None)
    return out


def machine():
    cpu = "unknown"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    rv = subprocess.run(["redis-server", "--version"], capture_output=True, text=True).stdout.strip()
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    return {
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": cpu, "cores": os.cpu_count(), "kernel": platform.release(),
        "redis": rv, "python": platform.python_version(), "commit": commit,
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--driver", required=True)
    ap.add_argument("--module", required=True)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--plots", action="store_true")
    ap.add_argument("--out", default=None)
    ap.add_argument("--only", default=None, help="comma-separated run names")
    ap.add_argument("--merge", default=None,
                    help="a results.json whose runs of the same names the new ones replace "
                         "(the others, and their run's details, stay)")
    a = ap.parse_args()
    sc = SMOKE if a.smoke else FULL
    msc = MOVING_SMOKE if a.smoke else MOVING_FULL
    work = os.path.join(ROOT, "target", "incident-smoke" if a.smoke else "incident")
    os.makedirs(work, exist_ok=True)
    trace = os.path.join(work, "trace.csv")
    arrivals, digest = make_trace(sc, trace)
    print(f"trace: {arrivals} arrivals over {sc['duration']} s, seed {SEED}, sha256 {digest[:16]}")
    moving_trace = os.path.join(work, "moving_trace.csv")
    moving_arrivals, moving_digest = make_moving_trace(msc, moving_trace)
    results = {
        "machine": machine(), "module": a.module, "scenario": sc, "seed": SEED,
        "trace_sha256": digest, "arrivals": arrivals,
        "quota": {"rate": RATE, "cap": CAP}, "batch": BATCH, "ttl_ms": TTL_MS,
        "max_wait_ms": MAX_WAIT_MS, "period_ms": PERIOD_MS, "instances": {"before": BASE, "after": BASE + EXTRA, "hot": HOT},
        "demand_per_s": {"before": DEMAND_BEFORE, "after": DEMAND_AFTER}, "runs": [],
    }
    only = set(a.only.split(",")) if a.only else None
    known = {name for name, _, _, _ in runs_for(a.smoke)}
    if only and not only <= known:
        sys.exit(f"--only: unknown run(s) {', '.join(sorted(only - known))} (known: {', '.join(sorted(known))})")
    for name, label, extra, kind in runs_for(a.smoke):
        if only and name not in only:
            continue
        r = Redis(a.module)
        try:
            prefix = os.path.join(work, name)
            moving = kind == "share_moving"
            run_sc = dict(msc, scale_at=None) if moving else sc
            cmd = [a.driver, "--trace", moving_trace if moving else trace, "--redis", r.url(),
                   "--out", prefix,
                   "--rate", str(RATE), "--cap", str(CAP), "--batch", str(BATCH),
                   "--ttl-ms", str(TTL_MS), "--max-wait-ms", str(MAX_WAIT_MS),
                   "--scale-at", str(run_sc["scale_at"] or run_sc["duration"]),
                   "--base-instances", str(BASE),
                   "--lua", os.path.join(ROOT, "scripts", "token_bucket.lua"),
                   "--duration", str(run_sc["duration"] + 0.5)] + extra
            if kind in ("failure", "share_failure"):
                cmd += ["--kill-at", str(sc["kill_at"]), "--stop-at", str(sc["stop_at"]),
                        "--stop-for", str(sc["stop_for"])]
            if kind == "pin":
                cmd += ["--pin-at", str(sc["pin_at"]), "--pin-rate", str(PIN_RATE)]
            t = time.time()
            # (i) and (h) may be run alone and merged: they keep their own run's details.
            at = machine() if moving or kind == "pin" else None
            subprocess.run(cmd, check=True, timeout=run_sc["duration"] + 60)
            meta, events, samples = load_run(prefix)
            res = analyse(name, label, kind, meta, events, samples, run_sc)
            res["wall_s"] = round(time.time() - t, 1)
            if moving:
                # Its own trace, and its own run's details (it may be run alone and merged).
                res["trace"] = {"arrivals": moving_arrivals, "sha256": moving_digest, "seed": SEED}
            if at:
                res["machine"] = at
            results["runs"].append(res)
            if res["available"]:
                print(f"  {name}: partner mean {res['partner_mean']:.0f}/s, max 1 s {res['partner_max_1s']}, "
                      f"central {res['central_calls_per_s']:.0f}/s, bound excess {res['bound_excess']:.1f}")
            if res.get("moving"):
                mv = res["moving"]
                print(f"  {name}: per second {mv['per_second']}, utilisation {100 * mv['utilisation']:.1f} %, "
                      f"converged after each move {[c['after_s'] for c in mv['converge']]} s")
        finally:
            r.close()
    if a.merge:
        base = json.load(open(a.merge))
        new_runs = {r["name"]: r for r in results["runs"]}
        merged = [new_runs.pop(r["name"], r) for r in base["runs"]]
        results = dict(base, runs=merged + list(new_runs.values()))
    out = a.out or os.path.join(work, "results.json")
    with open(out, "w") as f:
        json.dump(results, f, indent=1, sort_keys=False)
    print(f"results: {out}")
    failures = check(results, a.smoke)
    if a.plots:
        import incident_report
        incident_report.write_all(results, ROOT)
    if failures:
        print("BOUND VIOLATIONS:\n  " + "\n  ".join(failures))
        sys.exit(1)
    print("bounds: ok")


def check(results, smoke):
    """The bounds every run must respect (not timings)."""
    bad = []
    inst = results["instances"]["after"]
    for r in results["runs"]:
        if not r["available"]:
            continue
        want = r["trace"]["arrivals"] if "trace" in r else results["arrivals"]
        if r["arrivals"] != want:
            bad.append(f"{r['name']}: replayed {r['arrivals']} arrivals of {want}")
        if r["kind"] == "local" and r["name"] == "local_static":
            # (a) the over-issue must show: after the scale-out the fleet sends > quota.
            if not r["partner_mean_16"] > 1.1 * RATE:
                bad.append(f"{r['name']}: no over-issue visible ({r['partner_mean_16']:.0f}/s after scale-out)")
        elif r["kind"] == "central":
            if r["bound_excess"] > 1.0:  # cap + rate*t, +1 for rounding
                bad.append(f"{r['name']}: let out {r['bound_excess']:.1f} over cap + rate*t")
        elif r["kind"] == "lease":
            # Each instance holds at most two live leases (the one being spent and the next).
            if r["bound_excess"] > 2 * BATCH * inst:
                bad.append(f"{r['name']}: let out {r['bound_excess']:.1f} over cap + rate*t + 2*batch*instances")
        elif r["kind"] == "share":
            # Each holder's bucket holds at most its burst (bursts sum to <= cap): cap +
            # rate*t, plus a token of rounding per holder.
            if r["bound_excess"] > inst + 1:
                bad.append(f"{r['name']}: let out {r['bound_excess']:.1f} over cap + rate*t + holders")
        elif r["kind"] == "share_moving":
            # As (g), and in every window of 50 ms to 2 s as well as every prefix.
            if r["bound_excess"] > inst + 1:
                bad.append(f"{r['name']}: let out {r['bound_excess']:.1f} over cap + rate*t + holders")
            for w, most, bound in r["moving"]["windows"]:
                if most > bound:
                    bad.append(f"{r['name']}: {most} let out in {w:g} s, over cap + rate*t + holders = {bound:g}")
        elif r["kind"] == "pin":
            # Before the pin the quota's bound; after it the pin's: its cap (tokens carried
            # over) + its rate * t, plus two batches per instance for leases in hand.
            p = r["pin"]
            # A share holder spends the share it had (and its bucket's burst) until it ends.
            if "bound_slack" in p:
                slack, pin_slack = inst + 1.0, p["bound_slack"]
            else:
                slack = pin_slack = 1.0 if "take" in r["name"] else 2 * BATCH * inst + 1.0
            if r["bound_excess"] > slack or p["bound_excess"] > pin_slack:
                bad.append(f"{r['name']}: let out {r['bound_excess']:.1f} over the quota's bound, "
                           f"{p['bound_excess']:.1f} over the pin's")
        if r["kind"] in ("central", "lease", "share", "share_moving", "pin") and r["sent_total"] == 0:
            bad.append(f"{r['name']}: nothing sent")
    return bad


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    main()
