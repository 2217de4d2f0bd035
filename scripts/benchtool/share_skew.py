"""Skewed demand on one key shared by a fleet of Python processes (`redis_rl.ShareLimiter`,
default settings): how much of the rate the fleet lets out while the sum of demands
exceeds it, how fast a fleet starting together gets there, how long a holder whose demand
steps up takes to get its share, and how many Redis calls that costs.

    target/python-venv/bin/python scripts/benchtool/share_skew.py \\
        --url redis://127.0.0.1:PORT/ [--scenario four|seed|moving] [--seconds 12]
        [--client python|rust] [--backend module|functions]

`--client rust` runs `target/release/examples/share_skew` (`cargo build --release -p
rl-client --example share_skew`) as each process instead; `--backend functions` makes the
limiters use the Functions library (`scripts/load-functions`).

Scenarios (rate 1,000/s, cap 1,000, every demand paced evenly, each process counting what
it was let out in 10 ms bins of a clock the processes share):

- `four`: 4 processes, one with a demand of 900/s, three of 200/s (1,500/s in all);
- `seed`: the seed's incident: 8 instances, 3 hot (400/s each), 5 light (60/s each);
- `moving`: 4 processes, the 900/s demand moving to the next process every 3 s (the
  others 200/s).

Every process creates its limiter at the shared start (a fleet starting together) and
closes it at the end. The parent prints one JSON object: let-out per second of the fleet,
the utilisation over the steady seconds (from the third on) against the rate, how late the
processes started and were first let out a token, the most let
out in any window of 50 ms to 2 s against `cap + rate * t` (`within`), the time after
each demand step until the process that stepped up lets out 95 % of its max-min share
in a 200 ms window (`converge_ms`), and `RL.SHARE` calls per second at the server.

The pure parts (`demand_at`, `analyse`) need only the standard library.
"""

import argparse
import json
import subprocess
import sys
import time

KEY = "bench:skew"
RATE, CAP = 1000.0, 1000.0
BIN_MS = 10
WINDOWS_MS = (50, 100, 250, 500, 1000, 2000)
LEAD_S = 4.0
MOVE_S = 3.0


def demands(scenario):
    """Each process's demand (tokens per second) when the hot spot is at process 0."""
    if scenario == "four" or scenario == "moving":
        return [900.0, 200.0, 200.0, 200.0]
    if scenario == "seed":
        return [400.0] * 3 + [60.0] * 5
    raise ValueError(scenario)


def demand_at(scenario, proc, t):
    """Process `proc`'s demand at `t` seconds after the start."""
    d = demands(scenario)
    if scenario != "moving":
        return d[proc]
    hot = int(t // MOVE_S) % len(d)
    return d[(proc - hot) % len(d)]


def max_min(wants, rate):
    """Max-min fair division of `rate` by `wants`."""
    order = sorted(range(len(wants)), key=lambda i: wants[i])
    out = [0.0] * len(wants)
    rest = rate
    for k, i in enumerate(order):
        share = min(wants[i], rest / (len(wants) - k))
        out[i] = share
        rest -= share
    return out


def analyse(scenario, seconds, children, server_calls, server_secs):
    """The JSON object of a run from each child's 10 ms bins (`[[bin, n], ...]`)."""
    nbins = int(seconds * 1000 / BIN_MS)
    per = []
    for c in children:
        b = [0] * nbins
        for i, n in c["bins"]:
            if 0 <= i < nbins:
                b[i] += n
        per.append(b)
    fleet = [sum(p[i] for p in per) for i in range(nbins)]
    per_sec = [sum(fleet[i : i + 1000 // BIN_MS]) for i in range(0, nbins, 1000 // BIN_MS)]
    # The same seconds counted from when the latest process made its limiter: a process
    # that came up, or got a CPU, late (a loaded machine) shifts the fleet's start.
    late = max((c.get("late_start_ms", 0.0) for c in children), default=0.0)
    shift = int(round(late / BIN_MS))
    after = [sum(fleet[i : i + 1000 // BIN_MS])
             for i in range(shift, nbins - 1000 // BIN_MS + 1, 1000 // BIN_MS)]  # fmt: skip
    steady = per_sec[2:]
    utilisation = sum(steady) / (RATE * len(steady)) if steady else 0.0
    windows = []
    within = True
    for w_ms in WINDOWS_MS:
        w = w_ms // BIN_MS
        best = max(sum(fleet[i : i + w]) for i in range(max(1, nbins - w + 1)))
        bound = CAP + RATE * (w_ms + BIN_MS) / 1000
        within = within and best <= bound
        windows.append([w_ms, best, bound])
    # Demand steps up: the process whose demand rose, until it lets out 95 % of its
    # max-min share within a 200 ms window.
    converge = []
    if scenario == "moving":
        n = len(children)
        w = 200 // BIN_MS
        for k in range(1, int(seconds / MOVE_S) + 1):
            t = k * MOVE_S
            if t >= seconds - 0.5:
                break
            proc = k % n
            wants = [demand_at(scenario, i, t) for i in range(n)]
            target = max_min(wants, RATE)[proc] * w * BIN_MS / 1000
            start = int(t * 1000 / BIN_MS)
            end = min(nbins, start + int(MOVE_S * 1000 / BIN_MS))
            got = None
            for i in range(start, end - w + 1):
                if sum(per[proc][i : i + w]) >= 0.95 * target:
                    got = (i + w - start) * BIN_MS
                    break
            converge.append(got)
    return {
        "scenario": scenario,
        "procs": len(children),
        "seconds": seconds,
        "rate": RATE,
        "demand": sum(demands(scenario)),
        "per_second": per_sec,
        "utilisation": utilisation,
        "second_second": per_sec[1] / RATE if len(per_sec) > 1 else None,
        "third_second": per_sec[2] / RATE if len(per_sec) > 2 else None,
        "second_after_start": after[1] / RATE if len(after) > 1 else None,
        "third_after_start": after[2] / RATE if len(after) > 2 else None,
        "windows": windows,
        "within": within,
        "converge_ms": converge,
        "server_calls_per_s": server_calls / server_secs if server_secs else None,
        "client_calls": sum(c["redis_calls"] for c in children),
        # The start-up: the latest a process made its limiter after the shared start (the
        # Python processes report it), and the latest a process was first let out a token.
        "late_start_ms": max((c.get("late_start_ms", 0.0) for c in children), default=0.0),
        "late_starts_ms": sorted(round(c.get("late_start_ms", 0.0)) for c in children),
        # Takes the processes made against what their paced demands asked for (a process
        # short of CPU makes them late, in bursts its local bucket cannot hold).
        "attempts": sum(c.get("attempts", 0) for c in children),
        "demanded": round(sum(demand_at(scenario, i, 0) for i in range(len(children)))
                          * seconds) if scenario != "moving" else None,  # fmt: skip
        "first_grant_ms": max((min((i for i, n in c["bins"] if n), default=nbins) * BIN_MS
                               for c in children), default=None),  # fmt: skip
        "fallback_decisions": sum(c["fallback_decisions"] for c in children),
        # Calls that outlived the client's timeout (the Python processes report them).
        "redis_timeouts": sum(c.get("redis_timeouts", 0) for c in children),
        # The Rust processes' calls by latency (rl_client's LATENCY_BUCKETS_US: 0.25 ms to
        # 250 ms, then slower), added up.
        "latency_buckets": [sum(b) for b in zip(*(c["latency_buckets"] for c in children
                                                  if "latency_buckets" in c))] or None,  # fmt: skip
    }


def child(args):
    import redis
    import redis_rl

    client = redis.Redis.from_url(args.url)
    t0 = time.monotonic() + (args.start - time.time_ns()) / 1e9
    time.sleep(max(0.0, t0 - time.monotonic()))
    # Created at the shared start: the fleet starts together (a process that came up, or was
    # scheduled, after it starts late: `late_start_ms`).
    late_start = max(0.0, time.monotonic() - t0)
    limiter = redis_rl.ShareLimiter(
        client, KEY, RATE, CAP, policy=redis_rl.DENY, backend=args.backend
    )
    nbins = int(args.seconds * 1000 / BIN_MS)
    bins = [0] * nbins
    due = 0.0
    made = 0
    last = 0.0
    clock, take = time.monotonic, limiter.take
    while True:
        t = clock() - t0
        if t >= args.seconds:
            break
        due += demand_at(args.scenario, args.proc, t) * (t - last)
        last = t
        at = int(t * 1000 / BIN_MS)
        while made < int(due):
            made += 1
            if take(1).granted:
                bins[at] += 1
        time.sleep(0.001)
    counts = limiter.metrics.snapshot()
    limiter.close()
    nonzero = [[i, n] for i, n in enumerate(bins) if n]
    print(json.dumps({"bins": nonzero, "redis_calls": counts["redis_calls"],
                      "fallback_decisions": counts["fallback_decisions"],
                      "late_start_ms": late_start * 1000,
                      "attempts": made, "granted": sum(bins),
                      "redis_timeouts": counts["redis_timeouts"]}), flush=True)  # fmt: skip


def share_calls(admin):
    total = 0
    for name, value in admin.info("commandstats").items():
        if name.lower() in ("cmdstat_rl.share", "cmdstat_fcall"):
            total += int(value["calls"])
    return total


def parent(args):
    import redis

    admin = redis.Redis.from_url(args.url)
    admin.delete(KEY)
    n = len(demands(args.scenario))
    start = time.time_ns() + int(args.lead * 1e9)
    common = ["--url", args.url, "--seconds", str(args.seconds), "--scenario", args.scenario,
              "--start", str(start)]  # fmt: skip
    if args.client == "rust":
        cmds = [[args.rust_bin, args.url, args.scenario, str(i), str(args.seconds), str(start),
                 args.backend] for i in range(n)]  # fmt: skip
    else:
        cmds = [[sys.executable, __file__, "--child", "--proc", str(i), "--backend",
                 args.backend, *common] for i in range(n)]  # fmt: skip
    procs = [subprocess.Popen(c, stdout=subprocess.PIPE, text=True) for c in cmds]
    try:
        time.sleep(max(0, start - time.time_ns()) / 1e9)
        before = share_calls(admin)
        began = time.monotonic()
        after = None
        children = []
        for p in procs:
            line = p.stdout.readline()
            if after is None:
                after = (share_calls(admin), time.monotonic() - began)
            if p.wait() != 0 or not line:
                sys.exit("share_skew: a child failed")
            children.append(json.loads(line))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    out = analyse(args.scenario, args.seconds, children, after[0] - before, after[1])
    out["client"], out["backend"] = args.client, args.backend
    print(json.dumps(out))
    return 0 if out["within"] else 1


def main(argv=None):
    ap = argparse.ArgumentParser(prog="share_skew.py")
    ap.add_argument("--url", required=True)
    ap.add_argument("--scenario", default="four", choices=["four", "seed", "moving"])
    ap.add_argument("--seconds", type=float, default=12.0)
    ap.add_argument("--client", default="python", choices=["python", "rust"])
    ap.add_argument("--backend", default="module", choices=["module", "functions"])
    ap.add_argument("--rust-bin", default="target/release/examples/share_skew")
    ap.add_argument("--lead", type=float, default=LEAD_S, help="seconds to the shared start")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--proc", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--start", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(args)
        return 0
    return parent(args)


if __name__ == "__main__":
    sys.exit(main())
