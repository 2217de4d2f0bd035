"""One hot key shared by a fleet of Python processes (`redis_rl.ShareLimiter`, `RL.SHARE`):
decisions per second across the fleet, Redis calls per second, and what was let out against
its bound. The Python twin of client/examples/share_bench.rs, printing the same JSON object
as its `--json`; `scripts/bench` runs both (the "One hot key" section of BENCHMARKS.md).

    target/python-venv/bin/python scripts/benchtool/share_bench.py \\
        --url redis://127.0.0.1:PORT/ [--procs 8] [--seconds 10] [--rate 100000] [--cap 10000]
        [--lead 5]

Needs the redis_rl package (python/) and a server with the module at `--url` where the key
`bench:hot` does not exist. Starts `--procs` copies of itself; each holds one `ShareLimiter`
on the key (period 1 s, default settings but the failure policy: `DENY`, see
`fleet_limiter`) and calls `take(1)` in a tight loop on its main thread for `--seconds`
(the share refreshes on the limiter's thread), counting grants per millisecond of a clock
the processes share. The parent adds it up: decisions/s, `RL.SHARE`
calls/s at the server (`INFO commandstats`), and the most granted in any window of 50 ms to
2 s against `cap + rate * t + holders` (plus a millisecond for the bins), and in the whole
run against `cap + rate * T + holders`. Exits 1 when a bound is exceeded.

The pure parts (`worst_windows`, `summary`) need only the standard library: the bench tool's
tests import them.
"""

import argparse
import json
import subprocess
import sys
import time

KEY = "bench:hot"
WINDOWS_MS = (50, 100, 250, 500, 1000, 2000)
# Every process should be up and hold its first share before the shared start (one that is
# not takes from when it is: `late_start_ms`).
LEAD_S = 5.0


def worst_windows(bins, ms, rate, cap, holders):
    """`[[w, most granted in any w ms, bound], ...]` over 1 ms bins (a window of `w` bins
    spans up to `w + 1` ms of grants, so the bound takes `t = w + 1` ms); windows longer
    than the run are left out."""
    out = []
    for w in WINDOWS_MS:
        if w > ms:
            continue
        total = sum(bins[:w])
        best = total
        for i in range(w, len(bins)):
            total += bins[i] - bins[i - w]
            best = max(best, total)
        out.append([w, best, cap + rate * (w + 1) / 1000 + holders])
    return out


def summary(args, children, server_calls, server_secs):
    """The JSON object of a run from the children's reports (`decisions`, `granted`,
    `redis_calls`, `bins` as `[[ms, grants], ...]`)."""
    ms = int(args.seconds * 1000)
    bins = [0] * (ms + 1)
    for c in children:
        for i, n in c["bins"]:
            if i < len(bins):
                bins[i] += n
    granted = sum(c["granted"] for c in children)
    bound = args.cap + args.rate * args.seconds + args.procs
    windows = worst_windows(bins, ms, args.rate, args.cap, args.procs)
    within = granted <= bound and all(best <= b for _, best, b in windows)
    return {
        "client": "python",
        "procs": args.procs,
        "seconds": args.seconds,
        "rate": args.rate,
        "cap": args.cap,
        "decisions": sum(c["decisions"] for c in children),
        "granted": granted,
        "server_calls": server_calls,
        "server_secs": server_secs,
        "client_calls": sum(c["redis_calls"] for c in children),
        "bound": bound,
        "windows": windows,
        "within": within,
        # Decisions the failure policy made (DENY: none granted): calls that timed out.
        "fallback_decisions": sum(c.get("fallback_decisions", 0) for c in children),
        # The latest a process came up after the shared start (it took from then on).
        "late_start_ms": max((c.get("late_start_ms", 0.0) for c in children), default=0.0),
    }


def fleet_limiter(client, rate, cap):
    """The limiter each process holds: default settings but the failure policy. The bound
    this bench checks is that of shares; the failure policy decides outside it. A call
    that outlives the limiter's timeout (0.2 s: a loaded machine is enough) is an outage to
    the limiter, and the default ALLOW then lets out its own budget, for a holder that never
    saw the others the whole `rate` and `cap` (`instances` is 1 unless set). `DENY` lets out
    nothing but shares; `fallback_decisions` says how many decisions it made."""
    import redis_rl

    return redis_rl.ShareLimiter(client, KEY, rate, cap, policy=redis_rl.DENY)


def child(args):
    import redis

    client = redis.Redis.from_url(args.url)
    limiter = fleet_limiter(client, args.rate, args.cap)
    # The shared start on this process's monotonic clock, in the past if this process came
    # up late (it then takes from then on: its bins stay on the fleet's clock).
    t0 = time.monotonic() + (args.start - time.time_ns()) / 1e9
    late_start = max(0.0, time.monotonic() - t0)
    time.sleep(max(0.0, t0 - time.monotonic()))
    ms = int(args.seconds * 1000)
    bins = [0] * (ms + 1)
    decisions = granted = 0
    take, clock = limiter.take, time.monotonic
    while True:
        # A grant is binned at the clock read just before its take.
        t = clock()
        allowed = take(1).granted
        decisions += 1
        at = int((t - t0) * 1000)
        if at >= ms:
            break
        if allowed:
            granted += 1
            bins[at] += 1
    counts = limiter.metrics.snapshot()
    limiter.close()
    nonzero = [[i, n] for i, n in enumerate(bins) if n]
    print(json.dumps({"decisions": decisions, "granted": granted,
                      "redis_calls": counts["redis_calls"],
                      "fallback_decisions": counts["fallback_decisions"],
                      "late_start_ms": late_start * 1000, "bins": nonzero}), flush=True)  # fmt: skip


def share_calls(admin):
    for name, value in admin.info("commandstats").items():
        # Module commands keep the case they were registered with (cmdstat_RL.SHARE).
        if name.lower() == "cmdstat_rl.share":
            return int(value["calls"])
    return 0


def parent(args):
    import redis

    admin = redis.Redis.from_url(args.url)
    if admin.exists(KEY):
        sys.exit(f"share_bench: {KEY} exists on {args.url}: start from a fresh server")
    start = time.time_ns() + int(args.lead * 1e9)
    common = ["--url", args.url, "--seconds", str(args.seconds), "--rate", str(args.rate),
              "--cap", str(args.cap), "--start", str(start)]  # fmt: skip
    procs = [subprocess.Popen([sys.executable, __file__, "--child", *common],
                              stdout=subprocess.PIPE, text=True)
             for _ in range(args.procs)]  # fmt: skip
    try:
        time.sleep(max(0, start - time.time_ns()) / 1e9)
        before = share_calls(admin)
        began = time.monotonic()
        after = None
        children = []
        for p in procs:
            line = p.stdout.readline()
            if after is None:
                # The first child ends at the end of the run: the calls made during it.
                after = (share_calls(admin), time.monotonic() - began)
            if p.wait() != 0 or not line:
                sys.exit("share_bench: a child failed")
            children.append(json.loads(line))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    out = summary(args, children, after[0] - before, after[1])
    print(json.dumps(out))
    return 0 if out["within"] else 1


def main(argv=None):
    ap = argparse.ArgumentParser(prog="share_bench.py")
    ap.add_argument("--url", required=True)
    ap.add_argument("--procs", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--rate", type=float, default=100_000.0)
    ap.add_argument("--cap", type=float, default=10_000.0)
    ap.add_argument("--lead", type=float, default=LEAD_S, help="seconds to the shared start")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--start", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(args)
        return 0
    return parent(args)


if __name__ == "__main__":
    sys.exit(main())
