"""Token budgets (TokenBudget, AsyncTokenBudget) against real servers: the module and the
Functions library, both protocols, outages under each failure policy, and what the shell
refuses before anything is sent."""

from __future__ import annotations

import asyncio
import os
import threading
from typing import Any

import pytest
import redis
import redis.asyncio as aredis
from conftest import NO_RETRY, TINY, Server, peek_fields

from redis_rl import (
    ALLOW,
    DENY,
    LAST_KNOWN,
    AsyncTokenBudget,
    ProtocolError,
    ServerError,
    Source,
    TokenBudget,
    _core,
)


def tokens_left(r: redis.Redis, budget: Any, name: str) -> float:
    return peek_fields(r, budget.limits[name][0])["tokens"]


@pytest.fixture(params=["module", "functions"])
def backend_server(request: pytest.FixtureRequest, server: Server, fserver: Server) -> Server:
    return server if request.param == "module" else fserver


def test_reserve_and_settle_give_back_what_was_not_used(
    backend_server: Server, protocol: int, key: str
) -> None:
    r = backend_server.client(protocol=protocol)
    budget = TokenBudget(r, key, TINY, 1000, requests=(TINY, 10))
    assert set(budget.limits) == {"tokens", "requests"}
    assert budget.limits["tokens"][0] == f"{{{key}}}:tokens"
    res = budget.reserve(700)
    assert res and res.source is Source.SERVER and res.reserved == {"tokens": 700, "requests": 1}
    assert res.remaining is not None and round(res.remaining["tokens"]) == 300
    # Another 400 does not fit until the first settles at its actual 250.
    denied = budget.reserve(400)
    assert not denied and denied.denied_by == "tokens" and denied.retry_after_ms > 0
    assert res.settle(250) == {"tokens": 450, "requests": 0}
    assert res.settle(250) is None, "once"
    with budget.reserve(400) as second:
        assert second.granted
        second.use(500)  # 100 over: charged as debt
    assert second.settlement == {"tokens": -100, "requests": 0}
    c = budget.counters
    assert (c.granted, c.denied, c.settled, c.refunded_tokens, c.overage_tokens) == (
        2, 1, 4, 450, 100,
    )  # fmt: skip
    assert c.reserved_tokens == 700 + 1 + 400 + 1


def test_several_limits_by_name_all_or_nothing(server: Server, key: str) -> None:
    r = server.client()
    budget = TokenBudget(
        r, key, limits={"input": (TINY, 2000), "output": "100/minute"}, requests=(TINY, 5)
    )
    assert budget.limits["output"][1:] == (100 / 60, 100)
    res = budget.reserve({"input": 1500, "output": 80})
    assert res.granted
    # The output limit refuses: nothing is taken from input or requests either.
    denied = budget.reserve({"input": 10, "output": 50})
    assert not denied and denied.denied_by == "output"
    assert round(tokens_left(r, budget, "input")) == 500
    res.settle({"input": 1400, "output": 20})  # requests: the estimate (1)
    assert res.settlement == {"input": 100, "output": 60, "requests": 0}
    # The context manager settles with the estimate when no actual was recorded.
    with budget.reserve({"input": 100, "output": 10}) as unused:
        pass
    assert unused.settlement == {"input": 0, "output": 0, "requests": 0}


def test_what_the_shell_refuses_before_sending(server: Server, key: str) -> None:
    r = server.client()
    one = TokenBudget(r, key, 10, 100)
    two = TokenBudget(r, key, limits={"input": (1, 10), "output": (1, 10)})
    with pytest.raises(ValueError, match="by name"):
        two.reserve(5)
    with pytest.raises(ValueError, match=r"no limit .inptu."):
        two.reserve({"inptu": 1, "output": 1})
    with pytest.raises(ValueError, match="burst"):
        one.reserve(101)
    with pytest.raises(ValueError, match="positive integer"):
        one.reserve(0)
    with pytest.raises(ValueError, match="positive integer"):
        one.reserve(True)
    with pytest.raises(TypeError, match="not both"):
        TokenBudget(r, key, "10/second", 5)
    with pytest.raises(ValueError, match="holds 2 limits"):
        TokenBudget(r, key, "10/second;500/minute")
    with pytest.raises(ValueError, match="ttl"):
        TokenBudget(r, key, 10, 100, ttl=0)
    with pytest.raises(ValueError, match="twice"):
        TokenBudget(r, key, limits={"requests": (1, 1)}, requests=(1, 1))
    res = one.reserve(10)
    with pytest.raises(ValueError, match="non-negative"):
        res.settle(-1)
    with pytest.raises(TypeError, match=r"TokenBudget: res\.settle"):
        asyncio.run(res.asettle(1))
    assert res.settle(3) == {"tokens": 7}


def test_an_error_reply_raises_and_a_malformed_reply_is_a_protocol_error(
    server: Server, key: str
) -> None:
    r = server.client()
    r.set(f"{{{key}}}:tokens", "a string")
    with pytest.raises(ServerError, match="WRONGTYPE"):
        TokenBudget(r, key, 10, 100, backend="module").reserve(1)
    core = _core.Budget("k", [("tokens", 1.0, 10.0)], 1000, "allow", 1.0)
    for reply in [
        b"OK",
        [1, 2],
        [2, 1, None, 0],
        [1, 5, None, 0, [b"x"]],
        [0, 0, b"other", 5],
        object(),
    ]:
        with pytest.raises(ProtocolError):
            core.reserved([1], reply)
    with pytest.raises(ProtocolError):
        core.settled([b"x"])


@pytest.mark.parametrize(
    "policy,granted",
    [(ALLOW, 5), (LAST_KNOWN, 2), (DENY, 0)],
    ids=["allow", "last_known", "deny"],
)
def test_an_outage_is_decided_by_the_failure_policy(
    own_server: Server, key: str, policy: Any, granted: int
) -> None:
    r = own_server.client(retry=NO_RETRY, socket_timeout=0.5)
    # Two instances: the local budget is half of each limit (5 of 10 requests).
    budget = TokenBudget(
        r, key, TINY, 1000, requests=(TINY, 10), failure_policy=policy, instances=2
    )
    for _ in range(6):
        budget.reserve(10).settle(10)
    # Redis reported 4 requests left: LAST_KNOWN starts from half of that.
    own_server.kill()
    out = [budget.reserve(10) for _ in range(8)]
    assert sum(x.granted for x in out) == granted
    assert all(x.source is Source.FALLBACK for x in out)
    # A local grant settles locally: nothing is sent to the dead server.
    for x in out:
        if x.granted:
            assert x.settle(3) == {"tokens": 7, "requests": 0}
    c = budget.counters
    assert (c.fallback_granted, c.fallback_denied, c.outages) == (granted, 8 - granted, 8)
    # A settle that cannot reach Redis leaves the estimate charged, counted, never raised.
    own_server.start()
    r2 = own_server.client(retry=NO_RETRY, socket_timeout=0.5)
    b2 = TokenBudget(r2, key + "b", TINY, 1000)
    held = b2.reserve(600)
    own_server.kill()
    assert held.settle(0) is None
    assert b2.counters.settles_lost == 1
    own_server.start()


def test_async_budget_and_many_tasks_exact(server: Server, key: str) -> None:
    async def main() -> None:
        r = aredis.Redis(host="127.0.0.1", port=server.port, protocol=3)
        # Exactness, not timeouts, is tested: 300 tasks at once on a busy machine can wait
        # longer than the default 0.2 s for their turn on the loop and the pool.
        budget = AsyncTokenBudget(r, key, TINY, 1000, requests=(1e-3, 10_000), timeout=60)

        async def call(i: int) -> bool:
            async with await budget.reserve(10) as res:
                if res.granted:
                    res.use(i % 10)
                return res.granted

        results = await asyncio.gather(*(call(i) for i in range(300)))
        await r.aclose()
        c = budget.counters
        # Each call that ran settled below its estimate: the bucket holds what they used.
        used = sum(i % 10 for i, g in enumerate(results) if g)
        assert c.granted == sum(results) and c.denied == 300 - sum(results)
        assert c.refunded_tokens == sum(10 - i % 10 for i, g in enumerate(results) if g)
        sync = server.client()
        assert abs(tokens_left(sync, budget, "tokens") - (1000 - used)) < 1e-3

    asyncio.run(main())


def test_threads_and_a_fork_share_one_budget_exactly(server: Server, key: str) -> None:
    r = server.client()
    budget = TokenBudget(r, key, 1e-3, 10_000)
    grants = []

    def worker() -> None:
        for _ in range(50):
            res = budget.reserve(10)
            grants.append(res.granted)
            res.settle(4)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(grants) and budget.counters.refunded_tokens == 400 * 6
    pid = os.fork()
    if pid == 0:  # the child: the inherited budget works (fresh lock, own connection)
        code = 0
        try:
            child = server.client()
            b = TokenBudget(child, key, 1e-3, 10_000)
            ok = b.reserve(10).settle(10) == {"tokens": 0}
            code = 0 if ok and budget.counters.granted == 400 else 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0
    assert abs(tokens_left(r, budget, "tokens") - (10_000 - 400 * 4 - 10)) < 1e-3


def test_what_the_review_found(server: Server, key: str) -> None:
    """An actual above what the server reads settles (charged as bounded debt), not
    refused; a timeout of inf is refused at once."""
    r = server.client()
    budget = TokenBudget(r, key, "1000/minute", requests="100/minute")
    res = budget.reserve(5)
    back = res.settle(2**63)
    assert back is not None and back["tokens"] is not None and back["tokens"] < 0
    with pytest.raises(ValueError, match="timeout"):
        TokenBudget(r, key, "10/second", timeout=float("inf"))
    with pytest.raises(ValueError, match="timeout"):
        TokenBudget(r, key, "10/second", timeout=float("nan"))
