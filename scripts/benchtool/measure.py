"""Runs the measurements and returns the results as one JSON-ready dict.

Everything runs against servers this module starts itself (free loopback ports, a temp dir,
the release build of the module loaded) and stops at the end.
"""

import datetime
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from . import spec
from .callgrind import Callgrind
from .resp import RedisError, Server, encode

ROOT = Path(__file__).resolve().parent.parent.parent
LUA_SCRIPT = ROOT / "scripts" / "token_bucket.lua"
SCHEMA = 1


def module_path():
    target = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
    if not target.is_absolute():
        target = ROOT / target
    return target / "release" / "libredis_rl.so"


def log(msg):
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def run(argv, **kw):
    return subprocess.run(argv, check=True, capture_output=True, text=True, **kw).stdout


def build_module():
    """Builds the release module (a no-op when it is up to date); needs cargo if it is missing."""
    so = module_path()
    if shutil.which("cargo"):
        log("building the release module (cargo build --release -p redis-rl)")
        subprocess.run(["cargo", "build", "--release", "-p", "redis-rl", "--quiet"], cwd=ROOT,
                       check=True)  # fmt: skip
    if not so.exists():
        sys.exit(f"scripts/bench: {so} is missing and cargo could not build it")
    return so


def resolve_server(name):
    """The binary for a server key of spec.SERVERS."""
    if name == "redis7":
        return os.environ.get("RL_SERVER", "redis-server")
    script = {"redis8": "redis8-server", "valkey9": "valkey-server"}[name]
    return run([str(ROOT / "scripts" / script)]).strip()


class Run:
    """One measuring run: its counts, its temp dir, the module and the Lua script."""

    def __init__(self, counts, tmp, module):
        self.c, self.tmp, self.module = counts, tmp, module
        self.n = 0

    def server(self, binary, name, **kw):
        self.n += 1
        return Server(binary, self.module, LUA_SCRIPT, self.tmp, f"{self.n:02d}-{name}", **kw)


# ---------------------------------------------------------------------------------------------
# Throughput, latency and server time per call.


def subst(args, sha):
    return [sha if a == "SHA" else a for a in args]


def redis_benchmark(server, row, pipeline, n):
    argv = ["redis-benchmark", "-h", "127.0.0.1", "-p", str(server.port), "-c",
            str(spec.CLIENTS), "-n", str(n), "-P", str(pipeline), "--csv"]  # fmt: skip
    if row["rand"]:
        argv += ["-r", str(row["rand"])]
    argv += subst(row["args"], server.sha)
    lines = [ln for ln in run(argv).splitlines() if ln.startswith('"')]
    values = [v.strip('"') for v in lines[-1].split('","')]
    # "test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms",
    # "p99_latency_ms","max_latency_ms"
    return {"rps": float(values[1]), "p50": float(values[4]), "p99": float(values[6])}


def command_stats(server, name):
    stats = server.conn.info("commandstats")
    # Module commands keep the case they were registered with (cmdstat_RL.TAKE).
    line = next((v for k, v in stats.items() if k.lower() == f"cmdstat_{name}"), None)
    if line is None:
        return {"calls": 0, "usec": 0, "failed_calls": 0}
    fields = dict(kv.split("=") for kv in line.split(","))
    return {k: float(v) for k, v in fields.items()}


def rl_counters(server):
    info = server.conn.info("rl")
    return {k: int(v) for k, v in info.items() if v.isdigit()}


def measure_row(server, row, counts, samples):
    server.call("FLUSHALL")
    for pre in row["pre"]:
        server.call(*subst(pre, server.sha))
    server.call("CONFIG", "RESETSTAT")
    before = rl_counters(server)
    p1 = redis_benchmark(server, row, 1, counts.n_p1)
    p16 = redis_benchmark(server, row, 16, counts.n_p16)
    stats = command_stats(server, row["stat"])
    after = rl_counters(server)
    key = row["key"]
    if stats["failed_calls"] or stats["calls"] < counts.n_p1 + counts.n_p16:
        raise RuntimeError(f"{key}: {stats} (errors or missing calls)")
    # Each row must measure the path it is named for.
    if row["expect"] and row["stat"].startswith("rl."):
        denied = after.get("rl_denied", 0) - before.get("rl_denied", 0)
        granted = after.get("rl_granted", 0) - before.get("rl_granted", 0)
        if (row["expect"] == "granted" and denied) or (row["expect"] == "denied" and granted):
            raise RuntimeError(f"{key}: {granted} granted, {denied} denied")
    if row["expect"] and row["stat"] in ("evalsha", "fcall"):
        k = [a for a in row["args"] if ":" in a][0].replace("__rand_int__", "000000000001")
        args = subst(row["args"], server.sha)
        reply = server.call(*[k if ":" in a else a for a in args])
        if (reply == 0) != (row["expect"] == "denied"):
            raise RuntimeError(f"{key}: a check call replied {reply}")
    s = samples[key]
    s["rps1"].append(p1["rps"])
    s["rps16"].append(p16["rps"])
    s["p50"].append(p1["p50"])
    s["p99"].append(p1["p99"])
    s["usec"].append(stats["usec"] / stats["calls"])


def throughput_section(r, binary):
    samples = {row["key"]: {f: [] for f in ["rps1", "rps16", "p50", "p99", "usec"]}
               for row in spec.THROUGHPUT_ROWS}  # fmt: skip
    server = r.server(binary, "throughput")
    try:
        for rep in range(r.c.repeats):
            for row in spec.THROUGHPUT_ROWS:
                log(f"repeat {rep + 1}/{r.c.repeats}: {row['label']}")
                measure_row(server, row, r.c, samples)
        sha = server.sha
    finally:
        server.stop()
    rows = []
    for row in spec.THROUGHPUT_ROWS:
        s = samples[row["key"]]
        rows.append({
            "key": row["key"], "label": row["label"], "args": row["args"], "rand": row["rand"],
            "incr": row["incr"], "lua": row["lua"], "samples": s,
            "median": {f: statistics.median(v) for f, v in s.items()},
        })  # fmt: skip
    return {"rows": rows, "sha": sha}


# ---------------------------------------------------------------------------------------------
# Memory per live bucket, and what idle buckets cost.


def pipe_fill(server, tmp, name, commands):
    """Sends generated commands through `redis-cli --pipe` (no collisions, no randomness)."""
    path = Path(tmp) / f"{name}.resp"
    with open(path, "wb") as f:
        for args in commands:
            f.write(encode(args))
    with open(path, "rb") as f:
        out = subprocess.run(
            ["redis-cli", "-p", str(server.port), "--pipe"],
            stdin=f, check=True, capture_output=True, text=True,
        ).stdout  # fmt: skip
    path.unlink()
    m = re.search(r"errors: (\d+), replies: (\d+)", out)
    if not m or m.group(1) != "0":
        raise RuntimeError(f"{name}: redis-cli --pipe said: {out.strip()}")


def settled_memory(server):
    """used_memory once incremental rehashing and lazy frees are done (it stops moving)."""
    last = server.used_memory()
    for _ in range(40):
        time.sleep(0.25)
        now = server.used_memory()
        if now == last:
            return now
        last = now
    return last


def memory_layout(r, binary, name, make):
    server = r.server(binary, name)
    try:
        base = settled_memory(server)
        pipe_fill(server, r.tmp, name, make(server.sha))
        keys = server.call("DBSIZE")
        if keys != r.c.buckets:
            raise RuntimeError(f"{name}: {keys} keys, expected {r.c.buckets}")
        used = settled_memory(server)
        sample = server.call("MEMORY", "USAGE", "b:1")
        return {"bytes": (used - base) / r.c.buckets, "keys": keys, "usage": sample}
    finally:
        server.stop()


def idle_layout(r, binary, name, make, wait_empty):
    """Fills buckets that are full again after 1 ms, then waits: what do they hold?"""
    server = r.server(binary, name)
    try:
        base = settled_memory(server)
        pipe_fill(server, r.tmp, name, make(server.sha))
        started = time.time()
        deadline = started + (120 if wait_empty else 5)
        keys = server.call("DBSIZE")
        while time.time() < deadline and (keys > 0 or not wait_empty):
            time.sleep(0.5)
            keys = server.call("DBSIZE")
        waited = time.time() - started
        used = settled_memory(server)
        return {"keys": keys, "bytes": used - base, "waited": waited}
    finally:
        server.stop()


MEMORY_TTL = "1000000"


def memory_section(r, binary):
    # Refill 0.001 tokens/s, one token taken: the bucket is full (and our key expires) in
    # 1000 s, so every bucket is live while it is measured. The Lua layouts and the floor
    # get the same 1000 s expiry.
    n = r.c.buckets

    def ours(_sha):
        return (("RL.TAKE", f"b:{i}", "0.001", "10", "1") for i in range(n))

    def lua_with_expiry(sha):
        for i in range(n):
            yield ("EVALSHA", sha, "1", f"b:{i}", "0.001", "10", "1")
            yield ("PEXPIRE", f"b:{i}", MEMORY_TTL)

    def lua_as_seeded(sha):
        return (("EVALSHA", sha, "1", f"b:{i}", "0.001", "10", "1") for i in range(n))

    def floor(_sha):
        return (("SET", f"b:{i}", "1732897000123456", "PX", MEMORY_TTL) for i in range(n))

    def functions(_sha):
        # The library's hash expires at its time-to-full, as the module's key does.
        return (("FCALL", "rl_take", "1", f"b:{i}", "0.001", "10", "1") for i in range(n))

    layouts = {}
    for name, make in [("floor", floor), ("ours", ours), ("lua_expiry", lua_with_expiry),
                       ("lua_seed", lua_as_seeded), ("functions", functions)]:  # fmt: skip
        log(f"memory: {n} buckets, {name}")
        layouts[name] = memory_layout(r, binary, f"mem_{name}", make)

    # Idle: buckets refilled in 1 ms (1000 tokens/s, cap 10, one taken), then left alone.
    def ours_idle(_sha):
        return (("RL.TAKE", f"b:{i}", "1000", "10", "1") for i in range(n))

    def lua_idle(sha):
        return (("EVALSHA", sha, "1", f"b:{i}", "1000", "10", "1") for i in range(n))

    log("idle: RL.TAKE buckets")
    idle = {"ours": idle_layout(r, binary, "idle_ours", ours_idle, wait_empty=True)}
    log("idle: Lua script buckets")
    idle["lua"] = idle_layout(r, binary, "idle_lua", lua_idle, wait_empty=False)
    return {"buckets": n, "layouts": layouts, "idle": idle}


# ---------------------------------------------------------------------------------------------
# Profile: callgrind instruction counts (they do not drift with machine load).


def analyse_profile(cg, workload, flavor, per):
    """The numbers the report needs from one dump; absent functions are recorded, not zeroed."""
    root = spec.ROOTS[workload["root"]][flavor]
    missing = []
    result = {"key": workload["key"], "name": workload["name"], "root": root,
              "command": " ".join(workload["args"]) + (f"  (-r {workload['rand']})"
                                                       if workload["rand"] else ""),
              "request": cg.total / per, "instr": None, "tree": [], "parts": {},
              "missing": missing}  # fmt: skip
    if cg.has(root):
        # redis-benchmark sends whole pipelines, so a few more calls than asked for arrive:
        # divide by the calls the profile counted.
        per = cg.calls_to(root) or per
        result["calls"] = per
        result["request"] = cg.total / per
        result["instr"] = cg.inclusive(root) / per
        result["tree"] = cg.tree(root, per)
    else:
        missing.append(root)
    # Every tracked part of every module workload is recorded (None when absent), so the
    # renderer can tell "not called" from "renamed".
    for part in sorted(set(workload["parts"]) | set(workload["absent"])):
        fn = spec.PARTS[part].get(flavor)
        if fn is None:
            continue
        value = cg.inclusive(fn) / per if cg.has(fn) else None
        result["parts"][part] = {"fn": fn, "instr": value}
        if value is None and part in workload["parts"]:
            missing.append(fn)
    return result


def profile_one(r, binary, flavor, index, workload):
    out = Path(r.tmp) / f"callgrind-{flavor}-{index}.out"
    wrapper = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}"]
    server = r.server(binary, f"prof-{flavor}-{workload['key']}", wrapper=wrapper,
                      ready_timeout=180)  # fmt: skip
    calls = r.c.profile_calls
    try:
        argv = subst(workload["args"], server.sha)
        for p in workload["pre"]:
            server.call(*subst(p, server.sha))
        bench = ["redis-benchmark", "-p", str(server.port), "-c", "4", "-P", "16", "-q"]
        if workload["rand"]:
            bench += ["-r", str(workload["rand"])]
        # Warm up (first touch of keys, allocator caches), then count only the workload.
        run(bench + ["-n", str(max(calls // 4, 100))] + argv)
        run(["callgrind_control", "-z", str(server.proc.pid)])
        run(bench + ["-n", str(calls)] + argv)
        run(["callgrind_control", "-d", str(server.proc.pid)])
    finally:
        server.stop()
    dump = Path(str(out) + ".1")
    cg = Callgrind.from_file(dump)
    result = analyse_profile(cg, workload, flavor, calls)
    dump.unlink()
    return result


def profile_server(r, name):
    info = spec.SERVERS[name]
    binary = resolve_server(name)
    version = run([binary, "--version"]).strip()
    log(f"profile (callgrind) on {version}")
    workloads = []
    for i, w in enumerate(spec.PROFILES):
        log(f"  {info['label']}: {w['name']}")
        workloads.append(profile_one(r, binary, info["flavor"], i, w))
    return {"label": info["label"], "flavor": info["flavor"], "binary": binary,
            "version": version, "calls": r.c.profile_calls, "workloads": workloads}


# ---------------------------------------------------------------------------------------------


def machine():
    model = "unknown CPU"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemTotal"):
                mem = f", {int(line.split()[1]) / 1024 / 1024:.1f} GiB RAM"
    except OSError:
        pass
    load = ", load average %.2f %.2f %.2f at start" % os.getloadavg()
    return f"{model}, {os.cpu_count()} CPUs{mem}, Linux {platform.release()}{load}"


def git_revision():
    try:
        rev = run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"]).strip()
        dirty = run(["git", "-C", str(ROOT), "status", "--porcelain", "--", "src", "core",
                     "Cargo.toml", "Cargo.lock"])  # fmt: skip
        return rev + (" (with uncommitted changes to the module)" if dirty.strip() else "")
    except (subprocess.CalledProcessError, OSError):
        return "unknown"


def check_tools(profile):
    primary = os.environ.get("RL_SERVER", "redis-server")
    for tool in [primary, "redis-benchmark", "redis-cli"]:
        if not shutil.which(tool):
            sys.exit(f"scripts/bench: {tool} not found (Debian: apt-get install redis-server)")
    if profile and not (shutil.which("valgrind") and shutil.which("callgrind_control")):
        sys.exit("scripts/bench: valgrind not found (Debian: apt-get install valgrind), "
                 "or BENCH_PROFILE=0 to skip the profile")  # fmt: skip


def measure(counts, profile=True, servers=("redis7", "redis8", "valkey9")):
    t0 = time.time()
    started = datetime.datetime.now(datetime.timezone.utc)
    check_tools(profile)
    load_at_start = machine()
    module = build_module()
    primary = os.environ.get("RL_SERVER", "redis-server")
    tmp = tempfile.mkdtemp(prefix="rl-bench-")
    try:
        r = Run(counts, tmp, module)
        throughput = throughput_section(r, primary)
        memory = memory_section(r, primary)
        profiles = {}
        if profile:
            for name in servers:
                profiles[name] = profile_server(r, name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {
        "schema": SCHEMA,
        "meta": {
            "date": started.strftime("%Y-%m-%d %H:%M"),
            "minutes": (time.time() - t0) / 60,
            "quick": counts.quick,
            "counts": counts.as_dict(),
            "clients": spec.CLIENTS,
            "machine": load_at_start,
            "server": run([primary, "--version"]).strip(),
            "client": run(["redis-benchmark", "--version"]).strip(),
            "module_commit": git_revision(),
            "lua_sha": throughput["sha"],
            "limits": {"grant": spec.GRANT_LIMIT, "deny": spec.DENY_LIMIT,
                       "lease_ttl_ms": spec.LEASE_TTL_MS, "lease_keys": spec.LEASE_KEYS,
                       "random_keys": spec.RANDOM_KEYS},  # fmt: skip
        },
        "throughput": throughput["rows"],
        "memory": memory,
        "profiles": profiles,
    }
