"""What the Python client costs per decision, next to the raw redis-py call it makes.

Starts its own redis-server with the module on a Unix socket in a temp dir and measures,
in one process on one connection, microseconds per call of:

- the raw ``RL.TAKE key rate cap 1 WITHSTATE`` through redis-py (sync and asyncio), and
  ``Limiter.take()`` / ``AsyncLimiter.take()``, which make exactly that call, over the Unix
  socket and over TCP, with the recommended client and with redis-py's defaults (no
  socket timeout, retries on), and once through the client (``own_pool=False``);
- ``PrefetchLimiter.take()`` / ``AsyncPrefetchLimiter.take()`` (batch 20; most takes are
  served from memory, one ``RL.LEASE`` per ~20), and a ``PrefetchLimiter.take()`` served
  from memory only (a batch no round spends);
- ``ShareLimiter.take()`` (every take from the local bucket at the share: no Redis call);
- the seed's Lua script (``EVALSHA``);
- ``Rules.check()`` on the seed's rules document (3 layers, 4 buckets for a premium user
  on the search path: one ``RL.MTAKE``), next to ``Limiter.take()`` (python/bench_rules.py
  has the rules' own rows).

    python python/bench.py [--seconds 0.2] [--rounds 20] [--rows raw,limiter,...] [--module ...]

RL_SERVER and RL_MODULE are honoured as in the tests. Rows are measured in rounds, taking
turns, and each row keeps its best round, so that a neighbour's burst on a shared machine
does not land on one row only. Each row reports wall time and this process's CPU time per
call (``time.process_time``: the client's own work, all its threads, not the server's and
not the time spent waiting for a core): on a shared machine the CPU figures and their
ratios are the ones that hold from run to run. The last column pairs each round's row
with its raw call in the same round and reports the median of those ratios: the
figure least moved by neighbours. The bucket never runs dry: every decision is a grant.
The limiters make their calls on a connection pool of their own, in the calling thread or
task, whatever the client's settings (``own_pool=False``: through the client).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Awaitable, Callable, Dict, List, Optional, Set, Tuple

import redis
import redis.asyncio as aredis
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.retry import Retry

from redis_rl import (
    AsyncLimiter,
    AsyncPrefetchLimiter,
    Limiter,
    PrefetchLimiter,
    Rules,
    ShareLimiter,
)

REPO = Path(__file__).resolve().parents[1]
RATE, CAP = 1e9, 1e12  # never runs dry: every decision is a grant
BATCH = 20
HUGE = "1000000000/second"
#: The seed's rules document (deploy/rules/seed.yaml) with limits no round spends.
SEED_RULES = (
    (REPO / "deploy" / "rules" / "seed.yaml")
    .read_text()
    .replace('"5000/minute;100/second"', '"1000000000/minute;1000000000/second"')
    .replace('"5000/minute"', f'"{HUGE}"')
    .replace('"300/minute"', f'"{HUGE}"')
    .replace('"1000/minute"', f'"{HUGE}"')
)
#: A premium user on the search path: every layer of the seed but free_user applies.
RULES_ATTRS = {"ip": "10.0.0.1", "user": "42", "tier": "premium", "path": "/v1/search/q"}


#: Microseconds per call: wall time, and this process's CPU time (every thread of it).
Sample = Tuple[float, float]


def measure(fn: Callable[[], object], seconds: float) -> Sample:
    done = 0
    cpu = time.process_time()
    start = time.perf_counter()
    end = start + seconds
    while True:
        for _ in range(100):
            fn()
        done += 100
        if time.perf_counter() >= end:
            break
    wall = time.perf_counter() - start
    return wall / done * 1e6, (time.process_time() - cpu) / done * 1e6


async def ameasure(fn: Callable[[], Awaitable[object]], seconds: float) -> Sample:
    done = 0
    cpu = time.process_time()
    start = time.perf_counter()
    end = start + seconds
    while True:
        for _ in range(100):
            await fn()
        done += 100
        if time.perf_counter() >= end:
            break
    wall = time.perf_counter() - start
    return wall / done * 1e6, (time.process_time() - cpu) / done * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=float, default=0.2, help="per row and round")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--rows", help="comma-separated rows to measure (default: all)")
    ap.add_argument("--server", default=os.environ.get("RL_SERVER", "redis-server"))
    ap.add_argument(
        "--module",
        default=os.environ.get("RL_MODULE", str(REPO / "target" / "release" / "libredis_rl.so")),
    )
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        sock = os.path.join(tmp, "redis.sock")
        port = free_port()
        proc = subprocess.Popen(
            [args.server, "--port", str(port), "--bind", "127.0.0.1", "--unixsocket", sock,
             "--save", "", "--dir", tmp, "--loadmodule", args.module],
            stdout=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            only = set(args.rows.split(",")) if args.rows else None
            samples, version = run(sock, port, args.seconds, args.rounds, only)
        finally:
            proc.terminate()
            proc.wait()
    report(samples, version, args.seconds, args.rounds)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


Row = Tuple[str, Callable[[], object]]


def run(
    sock: str, port: int, seconds: float, rounds: int, only: Optional[Set[str]] = None
) -> Tuple[Dict[str, List[Sample]], str]:
    # The recommended setup: the client cannot outlive the limiters' timeout (0.2 s) by
    # itself (socket and connect timeouts 0.1 s, retries off).
    r = redis.Redis(
        unix_socket_path=sock,
        socket_timeout=0.1,
        socket_connect_timeout=0.1,
        retry=Retry(NoBackoff(), 0),
    )
    # The same over TCP, and redis-py's defaults (no socket timeout, retries on) on both.
    rt = redis.Redis(
        port=port, socket_timeout=0.1, socket_connect_timeout=0.1, retry=Retry(NoBackoff(), 0)
    )
    rd = redis.Redis(unix_socket_path=sock)
    rdt = redis.Redis(port=port)
    deadline = time.monotonic() + 10
    while True:
        try:
            r.ping()
            break
        except redis.exceptions.ConnectionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)
    version = str(r.info("server").get("redis_version", "?"))
    sha = r.script_load((REPO / "scripts" / "token_bucket.lua").read_text())
    limiter = Limiter(r, "bench:take", RATE, CAP, backend="module")
    prefetch = PrefetchLimiter(r, "bench:prefetch", RATE, CAP, batch=BATCH, backend="module")
    # A batch no round of the benchmark spends: every take is served from memory.
    memory = PrefetchLimiter(
        r, "bench:memory", RATE, CAP, batch=10_000_000, ttl=3600, backend="module"
    )
    # The only holder: the whole rate, its bucket full long before the first round.
    share = ShareLimiter(r, "bench:share", RATE, CAP, backend="module")
    while share.share().tokens < 1e6:
        time.sleep(0.01)
    raw = ("RL.TAKE", "bench:raw", "1000000000", "1000000000000", 1, "WITHSTATE")
    rules = Rules.from_text(r, SEED_RULES, backend="module")
    limiter_tcp = Limiter(rt, "bench:take-tcp", RATE, CAP, backend="module")
    limiter_default = Limiter(rd, "bench:take-default", RATE, CAP, backend="module")
    limiter_default_tcp = Limiter(rdt, "bench:take-default-tcp", RATE, CAP, backend="module")
    # Through the client (no pool of the limiter's own): a worker thread per take.
    limiter_client_tcp = Limiter(
        rdt, "bench:take-client-tcp", RATE, CAP, backend="module", own_pool=False
    )

    loop = asyncio.new_event_loop()
    ar = aredis.Redis(
        unix_socket_path=sock,
        socket_timeout=0.1,
        socket_connect_timeout=0.1,
        retry=AsyncRetry(NoBackoff(), 0),
    )
    alimiter = AsyncLimiter(ar, "bench:atake", RATE, CAP, backend="module")
    art = aredis.Redis(
        port=port, socket_timeout=0.1, socket_connect_timeout=0.1, retry=AsyncRetry(NoBackoff(), 0)
    )
    ard, ardt = aredis.Redis(unix_socket_path=sock), aredis.Redis(port=port)
    alimiter_tcp = AsyncLimiter(art, "bench:atake-tcp", RATE, CAP, backend="module")
    alimiter_default = AsyncLimiter(ard, "bench:atake-default", RATE, CAP, backend="module")
    alimiter_default_tcp = AsyncLimiter(ardt, "bench:atake-dtcp", RATE, CAP, backend="module")
    alimiter_client_tcp = AsyncLimiter(
        ardt, "bench:atake-ctcp", RATE, CAP, backend="module", own_pool=False
    )
    aprefetch = AsyncPrefetchLimiter(ar, "bench:aprefetch", RATE, CAP, batch=BATCH)
    araw = ("RL.TAKE", "bench:araw", "1000000000", "1000000000000", 1, "WITHSTATE")

    sync_rows: List[Row] = [
        ("raw", lambda: r.execute_command(*raw)),
        ("limiter", limiter.take),
        ("limiter-default", limiter_default.take),
        ("raw-tcp", lambda: rt.execute_command(*raw)),
        ("limiter-tcp", limiter_tcp.take),
        ("limiter-default-tcp", limiter_default_tcp.take),
        ("limiter-client-tcp", limiter_client_tcp.take),
        ("prefetch", prefetch.take),
        ("memory", memory.take),
        ("share", share.take),
        ("lua", lambda: r.evalsha(sha, 1, "bench:lua", RATE, CAP, 1)),
        ("rules", lambda: rules.check(RULES_ATTRS)),
    ]
    async_rows: List[Tuple[str, Callable[[], Awaitable[object]]]] = [
        ("araw", lambda: ar.execute_command(*araw)),
        ("alimiter", alimiter.take),
        ("alimiter-default", alimiter_default.take),
        ("araw-tcp", lambda: art.execute_command(*araw)),
        ("alimiter-tcp", alimiter_tcp.take),
        ("alimiter-default-tcp", alimiter_default_tcp.take),
        ("alimiter-client-tcp", alimiter_client_tcp.take),
        ("aprefetch", aprefetch.take),
    ]
    if only is not None:
        sync_rows = [row for row in sync_rows if row[0] in only]
        async_rows = [row for row in async_rows if row[0] in only]
    samples: Dict[str, List[Sample]] = {}
    for _name, fn in sync_rows:  # warm up: connections, the first lease, the script cache
        measure(fn, 0.1)
    for _name, afn in async_rows:
        loop.run_until_complete(ameasure(afn, 0.1))
    for _ in range(rounds):
        for name, fn in sync_rows:
            samples.setdefault(name, []).append(measure(fn, seconds))
        for name, afn in async_rows:
            samples.setdefault(name, []).append(loop.run_until_complete(ameasure(afn, seconds)))
    prefetch.close()
    memory.close()
    share.close()
    loop.run_until_complete(aprefetch.close())
    for lim in (limiter, limiter_tcp, limiter_default, limiter_default_tcp, limiter_client_tcp):
        lim.close()
    for alim in (
        alimiter,
        alimiter_tcp,
        alimiter_default,
        alimiter_default_tcp,
        alimiter_client_tcp,
    ):
        loop.run_until_complete(alim.aclose())
    for client in (ar, art, ard, ardt):
        loop.run_until_complete(client.aclose())
    loop.close()
    calls = prefetch.metrics["redis_calls"]
    print(f"(PrefetchLimiter made {calls} Redis calls in all.)", file=sys.stderr)
    return samples, version


def report(samples: Dict[str, List[Sample]], version: str, seconds: float, rounds: int) -> None:
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(
        f"{datetime.date.today()}, Redis {version}, Python {platform.python_version()}, "
        f"redis-py {redis.__version__}, {os.cpu_count()} cores ({platform.machine()}), "
        f"load average {load:.1f}, Unix socket (TCP: loopback), one connection, "
        f"best of {rounds} rounds of {seconds:g} s per row"
    )
    print()
    wall = {name: min(s[0] for s in rows) for name, rows in samples.items()}
    cpu = {name: min(s[1] for s in rows) for name, rows in samples.items()}
    rows: List[Tuple[str, str, Any]] = [
        ("raw `RL.TAKE ... WITHSTATE` (redis-py)", "raw", None),
        ("`Limiter.take()`", "limiter", "raw"),
        ("`Limiter.take()`, client `redis.Redis()` defaults", "limiter-default", "raw"),
        ("raw `RL.TAKE ... WITHSTATE` (redis-py), TCP", "raw-tcp", None),
        ("`Limiter.take()`, TCP", "limiter-tcp", "raw-tcp"),
        ("`Limiter.take()`, TCP, `redis.Redis()` defaults", "limiter-default-tcp", "raw-tcp"),
        ("same, `own_pool=False` (through the client)", "limiter-client-tcp", "raw-tcp"),
        ("raw `RL.TAKE ... WITHSTATE` (redis.asyncio)", "araw", None),
        ("`AsyncLimiter.take()`", "alimiter", "araw"),
        ("`AsyncLimiter.take()`, `redis.asyncio.Redis()` defaults", "alimiter-default", "araw"),
        ("raw `RL.TAKE ... WITHSTATE` (redis.asyncio), TCP", "araw-tcp", None),
        ("`AsyncLimiter.take()`, TCP", "alimiter-tcp", "araw-tcp"),
        ("`AsyncLimiter.take()`, TCP, defaults", "alimiter-default-tcp", "araw-tcp"),
        ("same, `own_pool=False` (through the client)", "alimiter-client-tcp", "araw-tcp"),
        (f"`PrefetchLimiter.take()`, batch {BATCH}", "prefetch", "raw"),
        (f"`AsyncPrefetchLimiter.take()`, batch {BATCH}", "aprefetch", "araw"),
        ("`PrefetchLimiter.take()` from memory (no renewal)", "memory", "raw"),
        ("`ShareLimiter.take()` from memory (the local bucket)", "share", "raw"),
        ("seed Lua script (`EVALSHA`)", "lua", "raw"),
        (
            "`Rules.check()`, the seed's 3 layers (4 buckets), vs `Limiter.take()`",
            "rules",
            "limiter",
        ),
    ]
    print("| | wall µs | vs raw | CPU µs | vs raw | CPU vs raw, median of rounds |")
    print("|---|---:|---:|---:|---:|---:|")
    for label, name, base in rows:
        if name not in samples:
            continue
        if base not in samples:
            base = None
        wall_ratio = "" if base is None else f"{wall[name] / wall[base]:.2f}x"
        cpu_ratio = "" if base is None else f"{cpu[name] / cpu[base]:.2f}x"
        paired = "" if base is None else f"{paired_ratio(samples[name], samples[base]):.2f}x"
        print(
            f"| {label} | {wall[name]:.1f} | {wall_ratio} | {cpu[name]:.2f} | {cpu_ratio} "
            f"| {paired} |"
        )


def paired_ratio(row: List[Sample], base: List[Sample]) -> float:
    """The median over rounds of the row's CPU time over its base's in the same round: the
    two ran a moment apart, so a neighbour's burst lands on both or on one round only."""
    return statistics.median(a[1] / b[1] for a, b in zip(row, base))


if __name__ == "__main__":
    main()
