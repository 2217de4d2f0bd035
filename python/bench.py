"""Decisions per second in one Python process: PrefetchLimiter.take() (batch 20) vs
Limiter.take() (one RL.TAKE per decision) vs the seed's Lua script (EVALSHA per decision).

Starts its own redis-server with the module on a free loopback port:

    python python/bench.py [--seconds 3] [--server redis-server] [--module path/to/libredis_rl.so]

RL_SERVER and RL_MODULE are honoured as in the tests. The bucket is large enough that every
decision is a grant, so the numbers are the cost of a grant.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from redis_rl import Limiter, PrefetchLimiter

REPO = Path(__file__).resolve().parents[1]
RATE, CAP = 1e9, 1e12  # never runs dry: every decision is a grant


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def measure(fn: Callable[[], object], seconds: float) -> float:
    for _ in range(200):  # warm up: connections, the first lease, the script cache
        fn()
    done = 0
    start = time.perf_counter()
    end = start + seconds
    while True:
        for _ in range(100):
            fn()
        done += 100
        if time.perf_counter() >= end:
            break
    return done / (time.perf_counter() - start)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--server", default=os.environ.get("RL_SERVER", "redis-server"))
    ap.add_argument(
        "--module",
        default=os.environ.get("RL_MODULE", str(REPO / "target" / "release" / "libredis_rl.so")),
    )
    args = ap.parse_args()

    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.Popen(
            [args.server, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
             "--dir", tmp, "--loadmodule", args.module],
            stdout=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            # The client cannot exceed the limiters' timeout (0.2 s) by itself (socket and
            # connect timeouts 0.1 s, retries off): calls run in the calling thread.
            r = redis.Redis(
                port=port,
                socket_timeout=0.1,
                socket_connect_timeout=0.1,
                retry=Retry(NoBackoff(), 0),
            )
            for _ in range(200):
                try:
                    r.ping()
                    break
                except redis.exceptions.ConnectionError:
                    time.sleep(0.02)
            version = r.info("server").get("redis_version", "?")
            lua = (REPO / "scripts" / "token_bucket.lua").read_text()
            sha = r.script_load(lua)

            prefetch = PrefetchLimiter(r, "bench:prefetch", RATE, CAP, batch=20, backend="module")
            limiter = Limiter(r, "bench:take", RATE, CAP, backend="module")

            def seed_lua() -> object:
                return r.evalsha(sha, 1, "bench:lua", RATE, CAP, 1)

            rows = [
                ("`PrefetchLimiter.take()`, batch 20", measure(prefetch.take, args.seconds)),
                ("`Limiter.take()` (`RL.TAKE ... WITHSTATE`)", measure(limiter.take, args.seconds)),
                ("seed Lua script (`EVALSHA`)", measure(seed_lua, args.seconds)),
            ]
            prefetch.close()
            calls = prefetch.metrics["redis_calls"]
        finally:
            proc.terminate()
            proc.wait()

    base = rows[1][1]
    print(
        f"{datetime.date.today()}, Redis {version}, Python {platform.python_version()}, "
        f"redis-py {redis.__version__}, {os.cpu_count()} cores ({platform.machine()}), "
        f"one process, one connection, {args.seconds:g} s per row"
    )
    print()
    print("| | decisions/s per process | vs `Limiter.take()` |")
    print("|---|---:|---:|")
    for name, rate in rows:
        print(f"| {name} | {rate:,.0f} | {rate / base:.2f}x |")
    print()
    print(f"(PrefetchLimiter made {calls} Redis calls in all.)", file=sys.stderr)


if __name__ == "__main__":
    main()
