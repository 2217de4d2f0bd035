"""Runs the measurements and returns the results as one JSON-ready dict.

Everything runs against servers this module starts itself (free loopback ports, a temp dir,
the release build of the module loaded) and stops at the end.
"""

import datetime
import json
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
                      ready_timeout=180, extra=["--enable-debug-command", "local"])  # fmt: skip
    calls = r.c.profile_calls
    try:
        argv = subst(workload["args"], server.sha)
        for p in workload["pre"]:
            server.call(*subst(p, server.sha))
        bench = ["redis-benchmark", "-p", str(server.port), "-c", "4", "-P", "16", "-q"]
        if workload["rand"]:
            bench += ["-r", str(workload["rand"])]
        # Warm up (first touch of keys, allocator caches), then count only the workload.
        warm = calls * workload["warm"] if workload["warm"] else max(calls // 4, 100)
        run(bench + ["-n", str(warm)] + argv)
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
# The Functions library against the seed script (spec.LIBRARY_CASES): instructions per call
# under callgrind in one server per server kind, and server time per call on Redis 7.0, the
# library's and the seed script's calls in the same run.


def library_bench(server, args, rand, n, clients=4):
    bench = ["redis-benchmark", "-h", "127.0.0.1", "-p", str(server.port), "-c", str(clients),
             "-P", "16", "-q", "-n", str(n)]  # fmt: skip
    if rand:
        bench += ["-r", str(rand)]
    run(bench + subst(args, server.sha))


def library_warm(server, case, calls):
    for p in case["pre"]:
        server.call(*subst(p, server.sha))
    # Random keys: each created before the timed calls (3x their number: 95% of them).
    return 3 * case["rand"] if case["rand"] and case["rand"] > calls else max(calls // 4, 100)


def library_source(rev):
    """functions/rl.lua at git revision `rev`."""
    return run(["git", "show", f"{rev}:functions/rl.lua"], cwd=ROOT)


def library_profile(r, name, before=False):
    """Instructions per call of every library case and its seed script call, one server;
    `before`: the library's calls only, with spec.LIBRARY_BEFORE_REV's library loaded."""
    info = spec.SERVERS[name]
    binary = resolve_server(name)
    version = run([binary, "--version"]).strip()
    flavor = info["flavor"]
    log(f"library profile (callgrind) on {version}")
    tag = "before" if before else "now"
    out = Path(r.tmp) / f"callgrind-library-{flavor}-{tag}.out"
    wrapper = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}"]
    server = r.server(binary, f"prof-library-{flavor}-{tag}", wrapper=wrapper,
                      ready_timeout=180)
    calls = r.c.library_calls
    cases, dumps = {}, 0
    try:
        if before:
            server.call("FUNCTION", "LOAD", "REPLACE", library_source(spec.LIBRARY_BEFORE_REV))
        for case in spec.LIBRARY_CASES:
            got = {}
            for side in ("fn",) if before else ("fn", "seed"):
                args = case[side]
                if args is None:
                    continue
                log(f"  {info['label']}: {case['key']} ({side}{', before' if before else ''})")
                warm = library_warm(server, case, calls)
                library_bench(server, args, case["rand"], warm)
                run(["callgrind_control", "-z", str(server.proc.pid)])
                library_bench(server, args, case["rand"], calls)
                run(["callgrind_control", "-d", str(server.proc.pid)])
                dumps += 1
                dump = Path(f"{out}.{dumps}")
                cg = Callgrind.from_file(dump)
                root = "fcallCommand" if side == "fn" else spec.ROOTS["lua"][flavor]
                per = cg.calls_to(root) or calls
                got[side] = cg.inclusive(root) / per if cg.has(root) else None
                dump.unlink()
            cases[case["key"]] = got
    finally:
        server.stop()
    return {"label": info["label"], "flavor": flavor, "version": version, "calls": calls,
            "cases": cases}


def library_times(r, binary):
    """Server µs per call (INFO commandstats) of each case's library and seed calls, in one
    server, interleaved, spec.LIBRARY_ROUNDS rounds."""
    server = r.server(binary, "library-time")
    n = r.c.library_timed
    rounds = {c["key"]: {"fn": [], "seed": []} for c in spec.LIBRARY_CASES}
    try:
        for case in spec.LIBRARY_CASES:
            library_warm(server, case, n)
        for _ in range(spec.LIBRARY_ROUNDS):
            for case in spec.LIBRARY_CASES:
                for side, stat in (("fn", "fcall"), ("seed", "evalsha")):
                    if case[side] is None:
                        continue
                    library_bench(server, case[side], case["rand"], max(n // 20, 100),
                                  clients=spec.CLIENTS)
                    server.call("CONFIG", "RESETSTAT")
                    library_bench(server, case[side], case["rand"], n, clients=spec.CLIENTS)
                    rounds[case["key"]][side].append(command_stats(server, stat)["usec_per_call"])
    finally:
        server.stop()
    return {"calls": n, "rounds": rounds, "version": run([binary, "--version"]).strip()}


def library_section(r, servers, binary):
    profiles = {}
    for name in servers:
        profiles[name] = library_profile(r, name)
        profiles[name]["before"] = library_profile(r, name, before=True)["cases"]
    return {"profiles": profiles, "times": library_times(r, binary),
            "before_rev": spec.LIBRARY_BEFORE_REV}


# ---------------------------------------------------------------------------------------------
# The per-caller path side by side: every peer in one server per server kind.


def percaller_server(r, name, cell):
    """Server µs/call of every row of spec.PERCALLER_ROWS on random keys and on one hot key,
    on one server (medians of the repeats, interleaved)."""
    binary = resolve_server(name)
    extra = ["--loadmodule", cell] if cell else []
    rows = [row for row in spec.PERCALLER_ROWS if cell or not row.get("cell")]
    samples = {f"{row['key']}_{mode}": [] for row in rows for mode in spec.PERCALLER_MODES}
    server = r.server(binary, f"percaller-{name}", extra=extra)
    n = r.c.n_p16
    try:
        for rep in range(r.c.repeats):
            for row in rows:
                for mode in spec.PERCALLER_MODES:
                    log(f"  {spec.SERVERS[name]['label']} {rep + 1}/{r.c.repeats}: "
                        f"{row['label']}, {mode}")  # fmt: skip
                    server.call("FLUSHALL")
                    server.call("CONFIG", "RESETSTAT")
                    args = subst(row["args"], server.sha)
                    argv = ["redis-benchmark", "-h", "127.0.0.1", "-p", str(server.port), "-c",
                            str(spec.CLIENTS), "-n", str(n), "-P", "16", "-q"]  # fmt: skip
                    if mode == "rand":
                        argv += ["-r", str(spec.RANDOM_KEYS)]
                    else:
                        args = [a.replace("__rand_int__", "hot") for a in args]
                    run(argv + args)
                    stats = command_stats(server, row["stat"])
                    if stats["failed_calls"] or stats["calls"] < n:
                        raise RuntimeError(f"{name} {row['key']} {mode}: {stats}")
                    samples[f"{row['key']}_{mode}"].append(stats["usec"] / stats["calls"])
    finally:
        server.stop()
    return {"label": spec.SERVERS[name]["label"], "version": run([binary, "--version"]).strip(),
            "usec": {k: statistics.median(v) for k, v in samples.items()},
            "samples": samples}  # fmt: skip


def percaller_section(r, servers):
    cell = os.environ.get("CELL_MODULE") or None
    out = {"calls": r.c.n_p16, "repeats": r.c.repeats, "keys": spec.RANDOM_KEYS,
           "cell": None, "servers": {}}  # fmt: skip
    if cell:
        out["cell"] = {"module": Path(cell).name, "sha256": run(["sha256sum", cell]).split()[0]}
    for name in servers:
        log(f"per-caller path on {spec.SERVERS[name]['label']}")
        out["servers"][name] = percaller_server(r, name, cell)
    return out


# ---------------------------------------------------------------------------------------------
# RL.SHARE at scale: server time per call and memory per holder on one key.


def server_cpu(server):
    """CPU seconds the server process used (user + system, `INFO cpu`): unlike the wall time
    `INFO commandstats` adds up, it does not grow while the server waits for a CPU."""
    info = server.conn.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def share_scale(r, binary, holders):
    """One key with `holders` holders (each wants 10/s of 1000/s), settled by rounds of calls
    apart by more than the hold, then `share_calls` calls round-robin: server µs per call
    (`INFO commandstats`, the median of `share_batches` batches) and server CPU µs per call
    (the whole request: reading, parsing, the command, the reply), `used_memory` per holder,
    `MEMORY USAGE` of the key."""
    server = r.server(binary, f"share-{holders}")
    key = "rl:share"

    def call(i):
        return ["RL.SHARE", key, *spec.GRANT_LIMIT, spec.share_holder(i), spec.SHARE_WANT,
                spec.SHARE_PERIOD_MS]  # fmt: skip

    try:
        base = settled_memory(server)
        for _ in range(spec.SHARE_ROUNDS):
            replies = server.conn.pipeline([call(i) for i in range(holders)])
            time.sleep(spec.SHARE_ROUND_GAP_S)
        live = replies[-1][4]
        if live != holders:
            raise RuntimeError(f"RL.SHARE at {holders} holders: the key has {live}")
        # The timed calls in batches, each timed alone: a batch whose server was descheduled
        # mid-call (the machine is shared) does not move the median.
        n, batches = r.c.share_calls, r.c.share_batches
        usec, cpu = [], []
        for b in range(batches):
            server.call("CONFIG", "RESETSTAT")
            per = n // batches
            cpu0 = server_cpu(server)
            server.conn.pipeline([call(i % holders) for i in range(b * per, (b + 1) * per)])
            cpu.append((server_cpu(server) - cpu0) * 1e6 / per)
            stats = command_stats(server, "rl.share")
            if stats["failed_calls"] or stats["calls"] != per:
                raise RuntimeError(f"RL.SHARE at {holders} holders: {stats} (errors or missing "
                                   f"calls)")  # fmt: skip
            usec.append(stats["usec"] / stats["calls"])
        used = settled_memory(server)
        return {"holders": holders, "calls": n, "batches": usec,
                "usec": statistics.median(usec), "cpu_batches": cpu,
                "cpu_usec": statistics.median(cpu),
                "bytes_per_holder": (used - base) / holders,
                "usage": server.call("MEMORY", "USAGE", key)}  # fmt: skip
    finally:
        server.stop()


def share_section(r, binary):
    out = []
    for holders in r.c.share_holders:
        log(f"RL.SHARE at {holders} holders")
        out.append(share_scale(r, binary, holders))
    return {"limit": spec.GRANT_LIMIT, "want": spec.SHARE_WANT, "period_ms": spec.SHARE_PERIOD_MS,
            "rounds": spec.SHARE_ROUNDS, "scale": out}  # fmt: skip


# ---------------------------------------------------------------------------------------------
# One hot key: a fleet of processes sharing one key through ShareLimiter (Rust and Python).


def python_env():
    """target/python-venv (as scripts/test-python makes it) with the redis_rl package."""
    venv = ROOT / "target" / "python-venv"
    python = venv / "bin" / "python"
    if not python.exists():
        log(f"making {venv}")
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    probe = subprocess.run([str(python), "-c", "import redis, redis_rl"], capture_output=True,
                           check=False)  # fmt: skip
    if probe.returncode != 0:
        log("installing the Python package into it (pip install -e ./python)")
        subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                        "-e", str(ROOT / "python")], check=True)  # fmt: skip
    return python


def rust_share_bench(quick):
    """Builds client/examples/share_bench.rs (release; debug for the smoke run, which the
    test build has already compiled)."""
    profile = [] if quick else ["--release"]
    log(f"building the share_bench example (cargo build {' '.join(profile)} -p rl-client "
        f"--example share_bench)")  # fmt: skip
    subprocess.run(["cargo", "build", *profile, "-p", "rl-client", "--example", "share_bench",
                    "--quiet"], cwd=ROOT, check=True)  # fmt: skip
    target = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
    if not target.is_absolute():
        target = ROOT / target
    return target / ("debug" if quick else "release") / "examples" / "share_bench"


def parse_hot(text):
    """The JSON object a share bench prints last (the Rust example's `--json`, or
    share_bench.py), checked for the fields the report needs."""
    lines = [ln for ln in text.splitlines() if ln.startswith("{")]
    if not lines:
        raise ValueError(f"no JSON object in the share bench's output: {text[-300:]!r}")
    v = json.loads(lines[-1])
    need = ["client", "procs", "seconds", "rate", "cap", "decisions", "granted",
            "server_calls", "server_secs", "client_calls", "bound", "windows", "within"]  # fmt: skip
    missing = [k for k in need if k not in v]
    if missing:
        raise ValueError(f"share bench output without {', '.join(missing)}: {lines[-1][:300]}")
    if not v["seconds"] > 0 or not v["server_secs"] > 0:
        raise ValueError(f"share bench output with no duration: {lines[-1][:300]}")
    for w in v["windows"]:
        if len(w) != 3:
            raise ValueError(f"share bench window {w!r}: expected [ms, most, bound]")
    return v


def hot_run(r, binary, client, argv):
    server = r.server(binary, f"hot-{client}")
    url = f"redis://127.0.0.1:{server.port}/"
    rate, cap = spec.HOT_LIMIT
    argv = argv + ["--url", url, "--procs", str(r.c.hot_procs), "--seconds",
                   str(r.c.hot_seconds), "--rate", str(rate), "--cap", str(cap)]  # fmt: skip
    try:
        load_before = os.getloadavg()
        # Its exit status is read below, with its output.
        done = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, check=False,
                              timeout=120 + 2 * r.c.hot_seconds)  # fmt: skip
        load_after = os.getloadavg()
    finally:
        server.stop()
    try:
        v = parse_hot(done.stdout)
    except ValueError as e:
        raise RuntimeError(f"{client} share bench (exit {done.returncode}): {e}\n"
                           f"{done.stderr[-2000:]}") from None  # fmt: skip
    if done.returncode != 0 and v["within"]:
        raise RuntimeError(f"{client} share bench failed (exit {done.returncode}): "
                           f"{done.stdout[-1000:]}{done.stderr[-1000:]}")  # fmt: skip
    if not v["within"]:
        # Recorded, not raised: the report shows the windows over their bound and its check
        # fails, so the run is kept for a look.
        log(f"{client} share bench: LET-OUT OVER ITS BOUND: {done.stdout[-1000:]}")
    v["load_before"], v["load_after"] = list(load_before), list(load_after)
    return v


def hotkey_section(r, binary):
    rust = rust_share_bench(r.c.quick)
    python = python_env()
    out = {}
    log(f"one hot key: {r.c.hot_procs} Rust processes, {r.c.hot_seconds} s")
    out["rust"] = hot_run(r, binary, "rust", [str(rust), "--json"])
    log(f"one hot key: {r.c.hot_procs} Python processes, {r.c.hot_seconds} s")
    # Python processes take seconds to come up on a busy machine (the smoke run's two, less).
    script = [str(python), str(ROOT / "scripts" / "benchtool" / "share_bench.py")]
    out["python"] = hot_run(r, binary, "python", script + ["--lead", "2" if r.c.quick else "5"])
    out["cpus"] = os.cpu_count()
    return out


# ---------------------------------------------------------------------------------------------
# RL.SHARE under skew: fleets of ShareLimiter processes with skewed demand (share_skew.py).


def rust_share_skew(quick):
    """Builds client/examples/share_skew.rs as rust_share_bench builds its twin."""
    profile = [] if quick else ["--release"]
    log(f"building the share_skew example (cargo build {' '.join(profile)} -p rl-client "
        f"--example share_skew)")  # fmt: skip
    subprocess.run(["cargo", "build", *profile, "-p", "rl-client", "--example", "share_skew",
                    "--quiet"], cwd=ROOT, check=True)  # fmt: skip
    target = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
    if not target.is_absolute():
        target = ROOT / target
    return target / ("debug" if quick else "release") / "examples" / "share_skew"


def parse_skew(text):
    """The JSON object share_skew.py prints last, checked for the fields the report needs."""
    lines = [ln for ln in text.splitlines() if ln.startswith("{")]
    if not lines:
        raise ValueError(f"no JSON object in the skew bench's output: {text[-300:]!r}")
    v = json.loads(lines[-1])
    need = ["scenario", "procs", "seconds", "rate", "per_second", "utilisation",
            "second_second", "third_second", "windows", "within", "converge_ms",
            "server_calls_per_s", "client", "backend"]  # fmt: skip
    missing = [k for k in need if k not in v]
    if missing:
        raise ValueError(f"skew bench output without {', '.join(missing)}: {lines[-1][:300]}")
    return v


def skew_run(r, binary, python, rust, case):
    client, backend, scenario = case
    server = r.server(binary, f"skew-{client}-{backend}-{scenario}")
    argv = [str(python), str(ROOT / "scripts" / "benchtool" / "share_skew.py"),
            "--url", f"redis://127.0.0.1:{server.port}/", "--scenario", scenario,
            "--seconds", str(r.c.skew_seconds), "--client", client, "--backend", backend,
            "--rust-bin", str(rust), "--lead", "2" if r.c.quick else "4"]  # fmt: skip
    try:
        load_before = os.getloadavg()
        # Its exit status is read below, with its output.
        done = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, check=False,
                              timeout=120 + 2 * r.c.skew_seconds)  # fmt: skip
        load_after = os.getloadavg()
    finally:
        server.stop()
    try:
        v = parse_skew(done.stdout)
    except ValueError as e:
        raise RuntimeError(f"skew bench {case} (exit {done.returncode}): {e}\n"
                           f"{done.stderr[-2000:]}") from None  # fmt: skip
    if not v["within"]:
        # Recorded, not raised: the report marks it and its check fails.
        log(f"skew bench {case}: LET-OUT OVER ITS BOUND: {v['windows']}")
    v["load_before"], v["load_after"] = list(load_before), list(load_after)
    return v


def skew_section(r, binary):
    python = python_env()
    rust = rust_share_skew(r.c.quick) if any(c[0] == "rust" for c in r.c.skew_cases) else None
    runs = []
    for case in r.c.skew_cases:
        log(f"skew: {', '.join(case)}, {r.c.skew_seconds} s")
        runs.append(skew_run(r, binary, python, rust, case))
    return {"seconds": r.c.skew_seconds, "runs": runs, "cpus": os.cpu_count()}


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


def now():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M")


def measure(counts, profile=True, servers=("redis7", "redis8", "valkey9"), only=None):
    """Measures every section, or the sections named in `only` (spec.SECTIONS); the results
    hold only what was measured, with when, at which commit and under which load
    (`sections`): `merge` puts a partial run into an earlier one."""
    only = list(spec.SECTIONS) if only is None else only
    if not profile and "profile" in only:
        only = [s for s in only if s != "profile"]
    t0 = time.time()
    started = datetime.datetime.now(datetime.timezone.utc)
    check_tools(profile and ("profile" in only or "library" in only))
    load_at_start = machine()
    module = build_module()
    primary = os.environ.get("RL_SERVER", "redis-server")
    commit = git_revision()
    tmp = tempfile.mkdtemp(prefix="rl-bench-")
    measured, sections = {}, {}
    try:
        r = Run(counts, tmp, module)
        runners = {
            "throughput": lambda: throughput_section(r, primary),
            "memory": lambda: memory_section(r, primary),
            "profile": lambda: {name: profile_server(r, name) for name in servers},
            "share": lambda: share_section(r, primary),
            "hotkey": lambda: hotkey_section(r, primary),
            "skew": lambda: skew_section(r, primary),
            "percaller": lambda: percaller_section(r, servers),
            "library": lambda: library_section(r, servers if profile else [], primary),
        }
        for name in spec.SECTIONS:
            if name not in only:
                continue
            s0 = time.time()
            at, load = now(), os.getloadavg()
            measured[name] = runners[name]()
            sections[name] = {"date": at, "minutes": (time.time() - s0) / 60,
                              "module_commit": commit, "quick": counts.quick,
                              "load_start": list(load), "load_end": list(os.getloadavg())}  # fmt: skip
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    throughput = measured.get("throughput", {"rows": [], "sha": None})
    results = {
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
            "module_commit": commit,
            "lua_sha": throughput["sha"],
            "limits": {"grant": spec.GRANT_LIMIT, "deny": spec.DENY_LIMIT,
                       "lease_ttl_ms": spec.LEASE_TTL_MS, "lease_keys": spec.LEASE_KEYS,
                       "random_keys": spec.RANDOM_KEYS},  # fmt: skip
        },
        "sections": sections,
    }
    for name, key in spec.SECTIONS.items():
        if name in measured:
            results[key] = throughput["rows"] if name == "throughput" else measured[name]
    return results


def merge(base, part):
    """`base` with the sections `part` measured replaced by `part`'s (and their `sections`
    entries); everything else, the meta included, stays `base`'s."""
    out = dict(base)
    out["sections"] = dict(base.get("sections") or legacy_sections(base))
    for name, key in spec.SECTIONS.items():
        if name in part.get("sections", {}):
            out[key] = part[key]
            out["sections"][name] = part["sections"][name]
            if name == "throughput":
                out["meta"] = dict(out["meta"], lua_sha=part["meta"]["lua_sha"])
    return out


def legacy_sections(results):
    """The `sections` of a results file from before they were recorded: every section it
    has was measured in its one run."""
    meta = results["meta"]
    m = re.search(r"load average ([\d.]+) ([\d.]+) ([\d.]+)", meta.get("machine", ""))
    load = [float(x) for x in m.groups()] if m else None
    return {name: {"date": meta["date"], "minutes": None, "module_commit": meta["module_commit"],
                   "quick": meta["quick"], "load_start": load, "load_end": None}
            for name, key in spec.SECTIONS.items() if results.get(key)}  # fmt: skip
