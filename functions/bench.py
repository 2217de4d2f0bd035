"""Server time per call of the Functions library against the module and the seed script.

Starts its own redis-server (RL_SERVER, default redis-server) with the module (RL_MODULE,
default target/release/libredis_rl.so, then target/debug) and the library loaded, runs each
case for RL_BENCH_CALLS calls (default 20000) on its own keys, and reads
INFO commandstats usec_per_call (fcall, rl.take / rl.lease, evalsha). Memory per live
bucket: used_memory before and after 10000 buckets created by each backend.
RL_BENCH_ROUNDS=k: k interleaved rounds of the take cases, medians reported.
RL_LIBRARY=path benchmarks another version of the library (e.g. `git show REV:functions/rl.lua`).
Run: target/functions-venv/bin/python functions/bench.py
"""

import os
import platform
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "tests"))
from servers import ROOT, Server  # noqa: E402

CALLS = int(os.environ.get("RL_BENCH_CALLS", "20000"))
# Rounds of every take case, interleaved (library, module, seed, then the next case); the
# median of each is reported. Each run is preceded by 500 unmeasured calls (the first calls
# on a fresh server pay for allocator growth and cold caches: a first case measured cold read
# up to 4x its warm cost).
ROUNDS = int(os.environ.get("RL_BENCH_ROUNDS", "1"))
SEED = open(os.path.join(ROOT, "scripts", "token_bucket.lua")).read()


def usec(r, cmd):
    for name, fields in r.info("commandstats").items():
        if name.lower() == f"cmdstat_{cmd}" and isinstance(fields, dict):
            return float(fields["usec_per_call"])
    return float("nan")


def run(r, name, args_of, stat):
    pipe = r.pipeline(transaction=False)
    for i in range(500):
        pipe.execute_command(*args_of(i))
    pipe.execute()
    r.config_resetstat()
    pipe = r.pipeline(transaction=False)
    for i in range(CALLS):
        pipe.execute_command(*args_of(i))
        if i % 500 == 499:
            pipe.execute()
    pipe.execute()
    return usec(r, stat)


def main():
    module = os.environ.get("RL_MODULE")
    if not module:
        for p in ("target/release/libredis_rl.so", "target/debug/libredis_rl.so"):
            if os.path.exists(os.path.join(ROOT, p)):
                module = os.path.join(ROOT, p)
                break
    os.environ["RL_MODULE"] = module or ""
    import servers
    servers.MODULE = module
    with Server(module=bool(module)) as s:
        s.load_library()
        r = s.client()
        sha = r.script_load(SEED)
        rows = []
        big = ("1000000", "1000000")  # never empties: every call is a grant
        tiny = ("0.000001", "1")  # empty after the first call: every call is a denial
        busy = ("1000000", "1000000000")  # drained slowly: the expiry moves < 1 ms per call
        cases = [
            ("grant, full bucket (expiry moves every call)", big, 1),
            ("grant, busy bucket (expiry moves < 1 ms)", busy, 10),
            ("deny", tiny, 1),
        ]
        samples = {label: ([], [], []) for label, _, _ in cases}
        for _ in range(ROUNDS):
            for label, (rate, cap), n in cases:
                fs, ms, ss = samples[label]
                fs.append(run(r, label, lambda i: ("FCALL", "rl_take", 1, f"f:{label}", rate,
                                                   cap, n), "fcall"))
                ms.append(run(r, label, lambda i: ("RL.TAKE", f"m:{label}", rate, cap, n),
                              "rl.take") if module else float("nan"))
                ss.append(run(r, label, lambda i: ("EVALSHA", sha, 1, f"s:{label}", rate, cap,
                                                   n), "evalsha"))
                r.delete(f"f:{label}", f"m:{label}", f"s:{label}")
        for label, _, _ in cases:
            fn, md, sd = (statistics.median(x) for x in samples[label])
            ratios = sorted(f / s for f, s in zip(samples[label][0], samples[label][2]))
            rows.append((f"take, {label}", fn, md, sd))
            if ROUNDS > 1:
                print(f"# {label}: library/seed per round {', '.join(f'{x:.2f}' for x in ratios)}")
        # Lease 20 and return it (renewal in one call: RETURN rides on the next lease).
        fn = run(r, "lease", lambda i: ("FCALL", "rl_lease", 1, f"f:lease:{i // 8}", "1000000",
                                        "1000000", 20, 1000), "fcall")
        md = run(r, "lease", lambda i: ("RL.LEASE", f"m:lease:{i // 8}", "1000000", "1000000", 20, 1000),
                 "rl.lease") if module else float("nan")
        rows.append(("lease 20 (8 live leases per key)", fn, md,
                     float("nan")))
        # Memory per live bucket.
        mem = {}
        # (0.001 tokens/s: full, and the keys gone, 1000 s after; at 1/s some went during the
        # fill on a loaded machine and were not counted.)
        for label, cmd in (("library", lambda i: ("FCALL", "rl_take", 1, f"mf:{i}", "0.001", 10)),
                           ("module", lambda i: ("RL.TAKE", f"mm:{i}", "0.001", 10)),
                           ("seed", lambda i: ("EVALSHA", sha, 1, f"ms:{i}", "0.001", 10, 1))):
            if label == "module" and not module:
                continue
            before = r.info("memory")["used_memory"]
            pipe = r.pipeline(transaction=False)
            for i in range(10000):
                pipe.execute_command(*cmd(i))
            pipe.execute()
            mem[label] = (r.info("memory")["used_memory"] - before) / 10000
        version = r.info("server")["redis_version"]
    print(f"# {time.strftime('%Y-%m-%d')}, {platform.node()}, {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} cpus, server {version}, {CALLS} calls per case (pipelined), "
          f"median of {ROUNDS} round(s)\n")
    print("| call | FCALL (library) µs | module µs | EVALSHA seed script µs | library / seed |")
    print("|---|---|---|---|---|")
    for label, fn, md, sd in rows:
        ratio = f"{fn / sd:.2f}x" if sd == sd else "-"
        print(f"| {label} | {fn:.2f} | {md:.2f} | {sd:.2f} | {ratio} |")
    print("\n| bytes per live bucket | " + " | ".join(f"{k}: {v:.0f}" for k, v in mem.items())
          + " |")


if __name__ == "__main__":
    main()
