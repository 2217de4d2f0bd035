"""The Functions backend: the library ``rl`` (functions/rl.lua) on a server without the module.
Runs when functions/rl.lua exists in the repository."""

from __future__ import annotations

import math

import pytest
from conftest import FUNCTIONS_LUA, Server
from test_limiter import CAP, RATE, SEQ, check, expected

import redis_rl
from redis_rl import Limiter, PrefetchLimiter

pytestmark = pytest.mark.skipif(
    not FUNCTIONS_LUA.exists(),
    reason=f"{FUNCTIONS_LUA.relative_to(FUNCTIONS_LUA.parents[1])} is not in this checkout yet",
)


def test_auto_picks_functions_and_decisions_match(fserver: Server, protocol: int, key: str) -> None:
    lim = Limiter(fserver.client(protocol=protocol), key, RATE, CAP, timeout=5)
    for n, (ok, tokens) in zip(SEQ, expected(SEQ)):
        check(lim.take(n), n, ok, tokens)
    assert lim.backend == "functions"
    peek = lim.peek()
    assert peek is not None and peek.cap == CAP


def test_prefetch_over_functions(fserver: Server, key: str) -> None:
    r = fserver.client()
    with PrefetchLimiter(r, key, 1e-6, 100, batch=10, backend="functions", timeout=5) as lim:
        assert sum(lim.take().granted for _ in range(3)) == 3
    peek = Limiter(r, key, 1e-6, 100, timeout=5, backend="functions").peek()
    assert peek is not None and math.floor(peek.tokens) == 97 and peek.leases == 0


def test_mtake_over_functions(fserver: Server, key: str) -> None:
    r = fserver.client()
    got = redis_rl.mtake(r, [(f"{{{key}}}:a", 1, 2), (f"{{{key}}}:b", 1, 1)], 1, withstate=True)
    assert got.granted == 1 and got.remaining is not None
    got = redis_rl.mtake(r, [(f"{{{key}}}:a", 1, 2), (f"{{{key}}}:b", 1, 1)], 1)
    assert got.granted == 0 and got.denied_by == f"{{{key}}}:b"


def test_module_backend_forced_on_a_functions_server(fserver: Server, key: str) -> None:
    # backend="module" where only the library exists: an error naming the fix, not a
    # policy decision (contract rule 2: a missing module is a clear error).
    lim = Limiter(fserver.client(), key, 1, 2, backend="module", policy=redis_rl.ALLOW)
    with pytest.raises(redis_rl.BackendNotFound, match="loadmodule"):
        lim.take()
    m = lim.metrics
    assert m["server_errors"] == 1 and m["errors"] == 1 and m["fallback_decisions"] == 0
    assert m["calls"] == m["granted"] + m["denied"] + m["errors"]


def test_versioned_limit_over_functions_newer_wins(fserver: Server, key: str) -> None:
    # VERSION v over the library (issue 17): two releases share a key with two limits; the
    # newer version's limit replaces the older one's and then decides its calls too.
    r = fserver.client()
    old = Limiter(r, key, 1e-6, 10, version=1, backend="functions", timeout=5)
    new = Limiter(r, key, 1e-6, 4, version=2, backend="functions", timeout=5)
    assert old.take().granted  # the bucket: version 1, cap 10, 9 left
    peek = old.peek()
    assert peek is not None and peek.version == 1 and peek.cap == 10
    d = new.take()  # version 2 replaces the limit: 9 tokens carried into cap 4, one taken
    assert d.granted and math.floor(d.remaining) == 3
    # Version 1's calls are now decided under version 2's cap of 4: 3 left in all.
    assert sum(old.take().granted for _ in range(5)) == 3
    peek = old.peek()
    assert peek is not None and peek.version == 2 and peek.cap == 4
    assert old.metrics["server_errors"] == 0
