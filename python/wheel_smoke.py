"""Does an installed wheel limit correctly? Run by scripts/test-python in a fresh venv of the
oldest and the newest CPython the abi3 wheel supports, with no cargo on PATH (what a user
without Rust gets from ``pip install`` of the wheel).

Starts its own redis-server with the module on a Unix socket in a temp dir, then drives each
limiter class through the compiled core: exact grants and denials of a ``Limiter``, a
``PrefetchLimiter`` that serves from its lease and gives back what it holds, a
``ShareLimiter``, a ``Rules`` check and a ``TokenBudget``; every outcome is checked against
what the server says.

    python python/wheel_smoke.py REDIS_SERVER MODULE
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time

import redis

import redis_rl


def start(server: str, module: str, sock: str, tmp: str) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [
            server,
            "--port",
            "0",
            "--unixsocket",
            sock,
            "--dir",
            tmp,
            "--save",
            "",
            "--appendonly",
            "no",
            "--loadmodule",
            module,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    for _ in range(500):
        if os.path.exists(sock):
            try:
                if redis.Redis(unix_socket_path=sock).ping():
                    return proc
            except redis.ConnectionError:
                pass
        time.sleep(0.01)
    proc.kill()
    raise SystemExit("wheel smoke: redis-server did not start")


def main() -> None:
    server, module = sys.argv[1], os.path.abspath(sys.argv[2])
    assert shutil.which("cargo") is None, "this check runs without cargo on PATH"
    tmp = tempfile.mkdtemp(prefix="rl-wheel-")
    sock = os.path.join(tmp, "redis.sock")
    proc = start(server, module, sock, tmp)
    try:
        r = redis.Redis(unix_socket_path=sock)
        # A Limiter: a burst of 5 at a rate too slow to refill, exactly 5 grants.
        lim = redis_rl.Limiter(r, "wheel:take", rate=0.001, cap=5, timeout=5)
        got = [lim.take().granted for _ in range(7)]
        assert got == [True] * 5 + [False] * 2, got
        assert lim.take().source == redis_rl.Source.SERVER
        # A PrefetchLimiter: grants from its lease, and close() gives back what is held (a
        # TTL no stall of a busy machine outlives: an expired lease's tokens stay spent).
        with redis_rl.PrefetchLimiter(
            r, "wheel:lease", rate=0.001, cap=100, batch=10, ttl=60, timeout=5
        ) as pre:
            got = [pre.take().granted for _ in range(15)]
            assert got == [True] * 15, got
        left = redis_rl.Limiter(r, "wheel:lease", rate=0.001, cap=100, timeout=5)
        after = left.take(1).remaining
        assert 84 <= after < 84.1, after  # refilled at 0.001/s meanwhile, nothing more
        # A ShareLimiter holds a share of a quota (its first answer comes from a thread of
        # its own) and spends it from memory: the only holder gets the whole rate.
        with redis_rl.ShareLimiter(r, "wheel:share", rate=1000, cap=100, timeout=5) as share:
            deadline = time.monotonic() + 30
            while share.share().holders == 0 and time.monotonic() < deadline:
                time.sleep(0.01)
            info = share.share()
            assert info.holders == 1 and info.rate == 1000, info
        # Rules: the document is checked by the core, one layer enforced exactly.
        text = "layers:\n  - name: per_user\n    key: 'u:{user}'\n    limit: '2/hour'\n"
        rules = redis_rl.Rules.from_text(r, text)
        got = [rules.check({"user": "ada"}).granted for _ in range(3)]
        assert got == [True, True, False], got
        # A token budget reserves an estimate and settles the actual.
        budget = redis_rl.TokenBudget(r, "wheel:budget", 0.001, 1000, timeout=5)
        with budget.reserve(600) as res:
            assert res.granted
            res.use(100)
        with budget.reserve(850) as res:
            assert res.granted, "the settle gave back the 500 unused"
        print(
            "wheel smoke: limits correctly on CPython",
            sys.version.split()[0],
            "with redis_rl from",
            os.path.dirname(redis_rl.__file__),
        )
    finally:
        proc.kill()
        proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
