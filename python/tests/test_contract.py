"""The client contract (README: "What a client guarantees under cancellation, errors and
outages"), rule by rule, against real servers:

1. Cancellation never loses tokens.
2. Only connection failures and timeouts are outages; error replies are raised and counted.
3. Recovery: built while Redis is down, recovers by itself; half-open connections time out.
4. Local state: per-size denial cache, fallback budgets a share of the fleet's limit carried
   across flaps, every call within its timeout.
5. Bounds (tests/test_prefetch.py: the fleet tests).
6. Metrics add up: calls == granted + denied + errors (checked throughout).

Slow calls come from ``CLIENT PAUSE`` (deterministic: the pause is in force when the reply
comes back), ``DEBUG SLEEP`` and SIGSTOP. No timing threshold is tighter than a second.
"""

from __future__ import annotations

import asyncio
import math
import time
from pathlib import Path
from typing import Any, Callable, Optional

import pytest
import redis
import redis.asyncio as aredis
from conftest import (
    KINDS,
    NO_RETRY,
    TINY,
    CuttingProxy,
    Server,
    StallingProxy,
    _check_setup,
    adds_up,
    peek_fields,
    sleep_server,
    wait_for,
)
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff

from redis_rl import (
    ALLOW,
    DENY,
    LAST_KNOWN,
    AsyncLimiter,
    AsyncPrefetchLimiter,
    BackendNotFound,
    FailurePolicy,
    Limiter,
    Metrics,
    PrefetchLimiter,
    ServerError,
    Source,
)
from redis_rl._call import _takes_command_name

SLACK = 1.0  # "returns within its timeout": timeout + this, never tighter


async def await_for(cond: Callable[[], bool], what: str, limit: float = 15.0) -> None:
    deadline = time.monotonic() + limit
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"never happened: {what}")
        await asyncio.sleep(0.01)


def pause(server: Server, ms: int) -> None:
    """CLIENT PAUSE ALL: every command from now on waits until the pause ends."""
    server.client().execute_command("CLIENT", "PAUSE", ms, "ALL")


# -- 1. Cancellation never loses tokens ---------------------------------------------------


def test_async_cancelled_takes_lose_no_batch(server: Server, key: str) -> None:
    """Five takes cancelled by asyncio.wait_for while the server is paused: the one lease
    call completes, its batch is installed whole, and every token comes back on close."""

    async def run() -> None:
        r = aredis.Redis(port=server.port, socket_timeout=10)
        lim = AsyncPrefetchLimiter(
            r, key, TINY, 100, batch=10, renew_at=0.0, timeout=10, backend="module"
        )
        pause(server, 1000)
        for _ in range(5):
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(lim.take(), 0.1)
        await await_for(lambda: lim.metrics["leases"] == 1, "the lease call landing")
        assert lim.held == 10  # nothing spent for the callers who left
        admin = server.client()
        state = peek_fields(admin, key)
        assert state["leases"] == 1 and state["leased_tokens"] == 10
        calls = lim.metrics["redis_calls"]
        assert await lim.take() and lim.held == 9
        assert lim.metrics["redis_calls"] == calls  # spent from the installed batch
        assert await lim.close() == 9
        state = peek_fields(admin, key)
        assert state["leases"] == 0 and math.floor(state["tokens"]) == 99
        m = lim.metrics
        assert m["errors"] == 5 and m["leases_lost"] == 0
        adds_up(m)
        await r.aclose()

    asyncio.run(run())


def test_async_timed_out_take_installs_its_lease(server: Server, key: str) -> None:
    """The limiter's own timeout (not a cancellation): the policy decides, the lease lands
    later and is spent by the next take."""

    async def run() -> None:
        r = aredis.Redis(port=server.port, socket_timeout=10)
        lim = AsyncPrefetchLimiter(
            r, key, TINY, 100, batch=10, renew_at=0.0, timeout=0.2, policy=DENY,
            probe_interval=0.05, backend="module",
        )  # fmt: skip
        pause(server, 1000)
        d = await lim.decide()
        assert d.source is Source.FALLBACK and not d.granted
        await await_for(lambda: lim.metrics["leases"] == 1, "the lease call landing")
        assert lim.held == 10
        d = await lim.decide()
        assert d.granted and d.source is Source.LEASE
        await lim.close()
        state = peek_fields(server.client(), key)
        assert state["leases"] == 0 and math.floor(state["tokens"]) == 99
        assert lim.metrics["redis_timeouts"] == 1 and lim.metrics["leases_lost"] == 0
        adds_up(lim.metrics)
        await r.aclose()

    asyncio.run(run())


def test_sync_timed_out_take_installs_its_lease(server: Server, key: str) -> None:
    """The pool call outlives the caller's timeout and installs its lease when it lands."""
    r = server.client(socket_timeout=10)
    lim = PrefetchLimiter(
        r, key, TINY, 100, batch=10, renew_at=0.0, timeout=0.2, policy=DENY, backend="module",
        own_pool=False,
    )  # fmt: skip
    pause(server, 1000)
    d = lim.decide()
    assert d.source is Source.FALLBACK and not d.granted
    wait_for(lambda: lim.metrics["leases"] == 1, "the lease call landing")
    assert lim.held == 10
    assert peek_fields(server.client(), key)["leased_tokens"] == 10
    wait_for(lambda: lim.decide().source is Source.LEASE, "a grant from the installed lease")
    lim.close()
    state = peek_fields(server.client(), key)
    assert state["leases"] == 0 and math.floor(state["tokens"]) == 99
    assert lim.metrics["leases_lost"] == 0
    adds_up(lim.metrics)


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_lease_landing_after_its_ttl_is_returned(server: Server, key: str, kind: str) -> None:
    """A lease that lands after sent + ttl is not spent: it goes back with RL.RETURN."""
    pause(server, 1000)
    if kind == "sync":
        lim: Any = PrefetchLimiter(
            server.client(socket_timeout=10), key, TINY, 100, batch=10, ttl=0.3,
            timeout=0.2, backend="module", own_pool=False,
        )  # fmt: skip
        lim.decide()
    else:

        async def run() -> Any:
            r = aredis.Redis(port=server.port, socket_timeout=10)
            alim = AsyncPrefetchLimiter(
                r, key, TINY, 100, batch=10, ttl=0.3, timeout=0.2, backend="module"
            )
            await alim.decide()
            await await_for(lambda: alim.metrics["returns"] == 1, "the lease returned")
            await r.aclose()
            return alim

        lim = asyncio.run(run())
    wait_for(lambda: lim.metrics["returns"] == 1, "the late lease returned")
    assert lim.held == 0
    assert lim.metrics["leases_expired"] == 1 and lim.metrics["tokens_returned"] == 10
    state = peek_fields(server.client(), key)
    assert state["leases"] == 0 and state["tokens"] >= 100
    assert lim.metrics["leases_lost"] == 0
    adds_up(lim.metrics)


#: Two ways an asyncio limiter makes its calls. "own-timeouts": the client's socket timeouts
#: end every call within the limiter's timeout (10 s) and retries are off, so the call runs
#: in the caller's task, its read handed to a task of its own when cancelled. "retries":
#: redis-py's default retries may outlast the timeout, so every call runs on a task of its
#: own from the start, ended by the limiter's timer.
ASYNC_SETUPS = {
    "own-timeouts": {
        "socket_timeout": 5,
        "socket_connect_timeout": 5,
        "retry": AsyncRetry(NoBackoff(), 0),
    },
    "retries": {"socket_timeout": 10},
    "own-pool": {"socket_timeout": 10},
}
#: Whether the limiter makes its calls on a pool of its own ("own-pool": the client's
#: settings, the limiter's timeout, no retries: in the caller's task, as "own-timeouts").
OWN = {"own-timeouts": False, "retries": False, "own-pool": True}


@pytest.mark.parametrize("setup", list(ASYNC_SETUPS))
def test_async_limiter_cancelled_takes_are_refunded(server: Server, key: str, setup: str) -> None:
    """RL.TAKE calls whose callers timed out after the server granted them (a proxy holds
    each reply until the end) complete; their grants are refunded."""
    proxy = CuttingProxy(server.port)

    async def run() -> None:
        r = aredis.Redis(port=proxy.port, **ASYNC_SETUPS[setup])
        lim = AsyncLimiter(r, key, TINY, 10, timeout=10, backend="module", own_pool=OWN[setup])
        assert (lim._call._pool is not None) == (setup != "retries")
        assert (await lim.take(1)).granted  # the credentials checked
        await lim.refund(1)
        # Three connections made first: a take that makes one would have its handshake's
        # reply held, and be cancelled before it sent anything.
        pool = lim._call._pool or r.connection_pool
        name = ("PING",) if _takes_command_name(pool) else ()
        for c in [await pool.get_connection(*name) for _ in range(3)]:
            await pool.release(c)
        for _ in range(3):
            proxy.cut(0)  # the next reply is held whole
            take = asyncio.ensure_future(lim.take(2))
            assert await asyncio.to_thread(proxy.delivered.wait, 10)  # granted, reply held
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(take, 0.01)
        assert peek_fields(server.client(), key)["tokens"] < 5
        proxy.release()
        await await_for(lambda: lim.metrics["tokens_returned"] == 6, "the refunds")
        assert peek_fields(server.client(), key)["tokens"] >= 10  # every token back
        assert lim.metrics["errors"] == 3
        adds_up(lim.metrics)
        await r.aclose()

    try:
        asyncio.run(run())
    finally:
        proxy.close()


@pytest.mark.parametrize("op", ["take", "reserve"])
@pytest.mark.parametrize("setup", list(ASYNC_SETUPS))
def test_async_take_cancelled_at_each_turn_is_cancelled_and_loses_nothing(
    server: Server, key: str, setup: str, op: str
) -> None:
    """Takes cancelled k turns of the event loop after they start, for k = 0 to 39: before
    their connection, while written, while read. A take still running when cancelled
    raises CancelledError (Python 3.11's ``asyncio.wait_for``, which redis-py writes a
    command under, returns instead in one of those turns), and the bucket holds exactly
    what the takes that returned were granted."""

    async def run() -> None:
        r = aredis.Redis(port=server.port, **ASYNC_SETUPS[setup])
        lim = AsyncLimiter(r, key, TINY, 100, timeout=10, backend="module", own_pool=OWN[setup])
        granted = 0
        for k in range(40):
            take = asyncio.ensure_future(
                lim.take(1) if op == "take" else lim.reserve(1, max_wait=0)
            )
            for _ in range(k):
                await asyncio.sleep(0)
            if take.cancel():
                with pytest.raises(asyncio.CancelledError):
                    await take
            else:
                assert (await take).granted  # done before its cancellation
                granted += 1
            await await_for(lambda: not lim._call._late, "the cancelled takes' replies")
        state = await lim.peek()
        assert math.floor(100 if state is None else state.tokens) == 100 - granted
        assert not (lim._call._pool or r.connection_pool)._in_use_connections
        assert lim.metrics["takes_lost"] == 0
        adds_up(lim.metrics)
        await r.aclose()

    asyncio.run(run())


class CancelsAsTheReplyLands(aredis.Redis):
    """A client with an execute_command of its own (an instrumented client: the limiter
    runs its calls on a task of their own) that, as an RL.TAKE reply comes back, has
    ``victim`` cancelled in the next turn of the event loop: after the call's task ended
    with the reply, before the take waiting for it resumed."""

    victim: Optional[asyncio.Future[Any]] = None

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        reply = await super().execute_command(*args, **options)
        if args[0] == "RL.TAKE" and self.victim is not None:
            asyncio.get_running_loop().call_soon(self.victim.cancel)
        return reply


@pytest.mark.parametrize("setup", list(ASYNC_SETUPS))
def test_async_take_cancelled_as_its_reply_lands_is_refunded(
    server: Server, key: str, setup: str
) -> None:
    """A take on a task of its own, cancelled in the very turn its reply came back: the
    call is over, but its caller never sees the grant; it is refunded all the same."""

    async def run() -> None:
        r = CancelsAsTheReplyLands(port=server.port, **ASYNC_SETUPS[setup])
        lim = AsyncLimiter(r, key, TINY, 10, timeout=10, backend="module")
        assert lim._call._pool is None
        assert (await lim.take(1)).granted
        await lim.refund(1)
        for _ in range(3):
            take = asyncio.ensure_future(lim.take(2))
            r.victim = take
            with pytest.raises(asyncio.CancelledError):
                await take
            r.victim = None
        await await_for(lambda: lim.metrics["tokens_returned"] == 6, "the refunds")
        assert peek_fields(server.client(), key)["tokens"] >= 10  # every token back
        assert lim.metrics["takes_lost"] == 0 and lim.metrics["errors"] == 3
        adds_up(lim.metrics)
        await r.aclose()

    asyncio.run(run())


def test_async_take_cancelled_while_its_write_waits_is_refunded(server: Server, key: str) -> None:
    """A take whose command outgrows the socket buffers (a key of 16 MiB) waits for the
    socket with the command handed to the transport. Cancelled there, the command still
    goes out (a transport sends its buffer before it closes) and runs: its grant is
    refunded, as for any take cancelled after its command went out."""
    proxy = StallingProxy(server.port)

    async def run() -> None:
        r = aredis.Redis(port=proxy.port, **ASYNC_SETUPS["own-timeouts"])
        huge = f"{key}:{'k' * (16 << 20)}"
        lim = AsyncLimiter(r, huge, TINY, 10, timeout=10, backend="module")
        assert lim._call._pool is not None
        assert (await lim.take(1)).granted  # connected: the next take reuses it
        proxy.stall()
        take = asyncio.ensure_future(lim.take(2))
        assert await asyncio.to_thread(proxy.stalled.wait, 10)  # part of it went out
        take.cancel()
        with pytest.raises(asyncio.CancelledError):
            await take
        proxy.release()
        await await_for(lambda: lim.metrics["tokens_returned"] == 2, "the refund")
        assert math.floor(peek_fields(server.client(), huge)["tokens"]) == 9
        assert lim.metrics["takes_lost"] == 0
        adds_up(lim.metrics)
        await r.aclose()

    try:
        asyncio.run(run())
    finally:
        proxy.close()


@pytest.mark.parametrize("cut", ["in-the-first-line", "in-the-middle"])
def test_async_take_cancelled_with_half_its_reply_read_is_refunded(
    server: Server, key: str, protocol: int, cut: str
) -> None:
    """A take cancelled after part of its reply arrived (the caller's-task path): the rest
    is read on the same connection by a task of its own, the grant refunded, and the
    connection's next reply is read from its start."""
    proxy = CuttingProxy(server.port)

    async def run() -> None:
        r = aredis.Redis(port=proxy.port, protocol=protocol, **ASYNC_SETUPS["own-timeouts"])
        lim = AsyncLimiter(r, key, TINY, 10, timeout=10, backend="module")
        assert lim._call._pool is not None
        assert (await lim.take(1)).granted  # connected: the next take reuses it
        proxy.cut(2 if cut == "in-the-first-line" else 9)
        take = asyncio.ensure_future(lim.take(2))
        assert await asyncio.to_thread(proxy.delivered.wait, 10)
        await asyncio.sleep(0.2)  # the client reads what came (the test holds either way)
        take.cancel()
        with pytest.raises(asyncio.CancelledError):
            await take
        proxy.release()
        await await_for(lambda: lim.metrics["tokens_returned"] == 2, "the refund")
        d = await lim.take(1)  # the same connection: its own reply, not the cut one's
        assert d.granted and math.floor(d.remaining) == 8, d
        assert math.floor(peek_fields(server.client(), key)["tokens"]) == 8
        assert lim.metrics["takes_lost"] == 0
        adds_up(lim.metrics)
        await r.aclose()

    try:
        asyncio.run(run())
    finally:
        proxy.close()


def test_sync_limiter_timed_out_take_is_refunded(server: Server, key: str) -> None:
    r = server.client(socket_timeout=10)  # above the limiter's timeout: the pool path
    lim = Limiter(r, key, TINY, 10, timeout=0.2, policy=DENY, backend="module", own_pool=False)
    pause(server, 1000)
    d = lim.take(3)
    assert d.source is Source.FALLBACK and not d.granted
    wait_for(lambda: lim.metrics["tokens_returned"] == 3, "the refund")
    assert peek_fields(server.client(), key)["tokens"] >= 10
    assert lim.metrics["takes_lost"] == 0
    adds_up(lim.metrics)


def test_async_reserve_cancelled_while_it_waits_gives_its_tokens_back(
    server: Server, key: str
) -> None:
    """An AsyncLimiter.reserve granted with a wait and cancelled during that wait: its
    tokens go back as a late grant's would (RL.REFUND), and what the bucket would not take
    back (a bucket in debt takes nothing) counts in takes_lost; the counters add up."""
    admin = server.client()

    async def run() -> Metrics:
        r = aredis.Redis(port=server.port, **ASYNC_SETUPS["own-timeouts"])
        lim = AsyncLimiter(r, key, 0.01, 1, timeout=10, backend="module")
        assert (await lim.take()).granted  # empty: the reserve waits ~100 s
        reserve = asyncio.ensure_future(lim.reserve(1, max_wait=1000))
        await await_for(lambda: peek_fields(admin, key)["tokens"] < -0.5, "the reserve's debt")
        reserve.cancel()
        with pytest.raises(asyncio.CancelledError):
            await reserve
        await await_for(lambda: lim.metrics["takes_lost"] == 1, "the refused refund")
        await r.aclose()
        return lim.metrics

    m = asyncio.run(run())
    assert m["tokens_returned"] == 0 and m["granted"] == 2, m.snapshot()
    adds_up(m)


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_late_reserve_into_debt_is_counted_lost(server: Server, key: str, kind: str) -> None:
    """A reserve that times out (the policy decides) and lands later, into debt: the bucket
    takes the refund back as 0, so nothing counts as returned and the take is lost."""
    admin = server.client()
    admin.execute_command("RL.TAKE", key, 1, 10, 10)  # empty: the reserve lands in debt
    if kind == "sync":
        lim = Limiter(
            server.client(socket_timeout=10), key, 1, 10, timeout=0.2, backend="module",
            own_pool=False,
        )  # fmt: skip
        pause(server, 1000)
        assert lim.reserve(5, max_wait=60).source is Source.FALLBACK
        wait_for(lambda: lim.metrics["takes_lost"] == 1, "the refused refund")
        m = lim.metrics
    else:

        async def run() -> Metrics:
            r = aredis.Redis(port=server.port, socket_timeout=10)
            lim = AsyncLimiter(r, key, 1, 10, timeout=0.2, backend="module", own_pool=False)
            await r.ping()  # connected (a limiter's call could time out on a busy machine)
            pause(server, 1000)
            assert (await lim.reserve(5, max_wait=60)).source is Source.FALLBACK
            await await_for(lambda: lim.metrics["takes_lost"] == 1, "the refused refund")
            await r.aclose()
            return lim.metrics

        m = asyncio.run(run())
    assert m["tokens_returned"] == 0, m.snapshot()
    assert peek_fields(admin, key)["tokens"] < 0  # still in debt: the reserve's tokens were spent
    adds_up(m)


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_late_grant_whose_refund_finds_the_bucket_in_debt_is_counted_lost(
    server: Server, key: str, kind: str
) -> None:
    """A take that times out and is granted (no debt then), and whose refund finds the
    bucket in debt (a reservation ran behind it; a proxy holds the take's reply until
    then): the bucket takes nothing back, so the take counts in takes_lost."""
    proxy = CuttingProxy(server.port)
    admin = server.client()

    def reserve_behind() -> None:
        assert proxy.delivered.wait(10)  # the take ran; its reply is held
        # 6 tokens left: a reservation of 10 puts the bucket 4 in debt (40 s at 0.1/s).
        admin.execute_command("RL.RESERVE", key, 0.1, 10, 10, 60_000)
        assert peek_fields(admin, key)["tokens"] < -3
        proxy.release()

    try:
        if kind == "sync":
            lim = Limiter(
                redis.Redis(port=proxy.port, socket_timeout=10),
                key, 0.1, 10, timeout=0.2, policy=DENY, backend="module",
            )  # fmt: skip
            assert lim.take(1).granted  # connected, credentials checked
            proxy.cut(0)
            assert lim.take(3).source is Source.FALLBACK
            reserve_behind()
            wait_for(lambda: lim.metrics["takes_lost"] == 1, "the refused refund")
            m = lim.metrics
        else:

            async def run() -> Metrics:
                r = aredis.Redis(port=proxy.port, socket_timeout=10)
                alim = AsyncLimiter(r, key, 0.1, 10, timeout=0.2, policy=DENY, backend="module")
                assert (await alim.take(1)).granted  # connected, credentials checked
                proxy.cut(0)
                assert (await alim.take(3)).source is Source.FALLBACK
                await asyncio.to_thread(reserve_behind)
                await await_for(lambda: alim.metrics["takes_lost"] == 1, "the refused refund")
                await r.aclose()
                return alim.metrics

            m = asyncio.run(run())
    finally:
        proxy.close()
    assert m["tokens_returned"] == 0, m.snapshot()
    adds_up(m)


# -- 2. Error replies are errors, not outages ---------------------------------------------


def run_kind(
    server: Server, kind: str, key: str, make: dict[str, Any], takes: int
) -> tuple[Metrics, list[ServerError]]:
    """``takes`` calls on a limiter of ``kind``, each of which must raise ServerError."""
    errors: list[ServerError] = []
    if kind.startswith("async"):

        async def run() -> Metrics:
            r = aredis.Redis(port=server.port)
            cls: Any = AsyncLimiter if kind == "async-limiter" else AsyncPrefetchLimiter
            lim = cls(r, key, **make)
            for _ in range(takes):
                with pytest.raises(ServerError) as e:
                    await lim.take()
                errors.append(e.value)
            await r.aclose()
            return lim.metrics  # type: ignore[no-any-return]

        return asyncio.run(run()), errors
    cls: Any = Limiter if kind == "limiter" else PrefetchLimiter
    lim = cls(server.client(), key, **make)
    for _ in range(takes):
        with pytest.raises(ServerError) as e:
            lim.take()
        errors.append(e.value)
    return lim.metrics, errors


@pytest.mark.parametrize("kind", KINDS)
def test_wrongtype_is_raised_not_a_policy_decision(server: Server, key: str, kind: str) -> None:
    server.client().set(key, "not a bucket")
    make = {"rate": TINY, "cap": 100, "policy": ALLOW, "timeout": 5}
    m, errors = run_kind(server, kind, key, make, 3)
    assert all("WRONGTYPE" in str(e) for e in errors)
    assert m["server_errors"] == 3 and m["errors"] == 3  # each call asked Redis again
    assert m["granted"] == 0 and m["fallback_decisions"] == 0 and m["redis_errors"] == 0
    adds_up(m)


@pytest.mark.parametrize("kind", ["prefetch", "async-prefetch"])
def test_too_many_live_leases_is_raised(server: Server, key: str, kind: str) -> None:
    r = server.client()
    pipe = r.pipeline(transaction=False)
    for _ in range(1024):
        pipe.execute_command("RL.LEASE", key, 1, 5000, 1, 60000)
    assert all(reply[0] == 1 for reply in pipe.execute())
    make = {"rate": 1, "cap": 5000, "batch": 10, "policy": ALLOW, "timeout": 5}
    m, errors = run_kind(server, kind, key, make, 2)
    assert all("too many live leases" in str(e) for e in errors)
    assert m["server_errors"] == 2 and m["granted"] == 0 and m["fallback_decisions"] == 0
    adds_up(m)


@pytest.mark.parametrize("kind", KINDS)
def test_missing_module_is_a_clear_error(tmp_path: Path, key: str, kind: str) -> None:
    _check_setup()
    bare = Server(tmp_path / "bare", module=False)
    try:
        make = {"rate": 1, "cap": 100, "policy": ALLOW, "backend": "module", "timeout": 5}
        m, errors = run_kind(bare, kind, key, make, 1)
        assert isinstance(errors[0], BackendNotFound)
        assert "loadmodule" in str(errors[0])  # names the fix
        assert m["server_errors"] == 1 and m["fallback_decisions"] == 0
        adds_up(m)
        # backend="auto" finds neither backend: the same error, from the probes.
        make["backend"] = "auto"
        m, errors = run_kind(bare, kind, key, make, 1)
        assert isinstance(errors[0], BackendNotFound) and m["fallback_decisions"] == 0
        assert m["server_errors"] == 1
        adds_up(m)
    finally:
        bare.stop()


# -- 3. Recovery ---------------------------------------------------------------------------

#: Documented: the first call after ``probe_interval`` asks Redis again (one more probe per
#: stale pooled connection). The test allows far more, for a loaded machine.
RECOVERY_LIMIT = 10.0


@pytest.mark.parametrize("kind", ["limiter", "prefetch"])
def test_built_while_redis_is_down_then_recovers(own_server: Server, key: str, kind: str) -> None:
    own_server.kill()
    r = own_server.client(socket_timeout=1, socket_connect_timeout=1)
    make: dict[str, Any] = {"policy": FailurePolicy.allow(0.5), "probe_interval": 0.1}
    lim: Any = (
        Limiter(r, key, 0.01, 10, **make)
        if kind == "limiter"
        else PrefetchLimiter(r, key, 0.01, 10, batch=2, **make)
    )
    ds = [lim.decide() if kind == "prefetch" else lim.take() for _ in range(10)]
    assert all(d.source is Source.FALLBACK for d in ds)
    assert sum(d.granted for d in ds) == 5  # serving from its policy: cap * 0.5
    own_server.start()
    start = time.monotonic()

    def served() -> bool:
        d = lim.decide() if kind == "prefetch" else lim.take()
        return d.source is not Source.FALLBACK

    wait_for(served, "a server decision after Redis came up", RECOVERY_LIMIT)
    assert time.monotonic() - start < RECOVERY_LIMIT
    adds_up(lim.metrics)


def test_async_built_while_redis_is_down_then_recovers(own_server: Server, key: str) -> None:
    own_server.kill()

    async def run() -> None:
        r = aredis.Redis(port=own_server.port, socket_timeout=1, socket_connect_timeout=1)
        lims: list[Any] = [
            AsyncLimiter(r, key, 0.01, 10, policy=DENY, probe_interval=0.1),
            AsyncPrefetchLimiter(r, key + "p", 0.01, 10, batch=2, policy=DENY, probe_interval=0.1),
        ]
        for lim in lims:
            d = await lim.decide() if isinstance(lim, AsyncPrefetchLimiter) else await lim.take()
            assert d.source is Source.FALLBACK and not d.granted
        own_server.start()
        for lim in lims:
            deadline = time.monotonic() + RECOVERY_LIMIT
            while True:
                if isinstance(lim, AsyncPrefetchLimiter):
                    d = await lim.decide()
                else:
                    d = await lim.take()
                if d.source is not Source.FALLBACK:
                    break
                assert time.monotonic() < deadline, "no recovery"
                await asyncio.sleep(0.02)
            adds_up(lim.metrics)
        await r.aclose()

    asyncio.run(run())


@pytest.mark.parametrize("kind", ["limiter", "prefetch"])
def test_half_open_connection_times_out_and_recovers(
    own_server: Server, key: str, kind: str
) -> None:
    """SIGSTOP: the connection stays open and nothing answers (a half-open connection)."""
    r = own_server.client(socket_timeout=2)
    lim: Any = (
        Limiter(r, key, TINY, 10, policy=DENY, timeout=0.2, probe_interval=0.1)
        if kind == "limiter"
        else PrefetchLimiter(r, key, TINY, 10, batch=2, renew_at=0.0, policy=DENY,
                             timeout=0.2, probe_interval=0.1)
    )  # fmt: skip
    take: Callable[[], Any] = lim.decide if kind == "prefetch" else lim.take
    wait_for(lambda: take().granted, "a first grant")  # a loaded machine may be slow at first
    own_server.pause()
    try:
        ds = []
        for _ in range(6):  # a prefetcher first spends what it holds
            start = time.monotonic()
            ds.append(take())
            assert time.monotonic() - start < 0.2 + SLACK
            time.sleep(0.15)  # past probe_interval: the next take may ask Redis again
    finally:
        own_server.resume()
    fallback = [d for d in ds if d.source is Source.FALLBACK]
    assert len(fallback) >= 3 and not any(d.granted for d in fallback)
    assert lim.metrics["redis_timeouts"] >= 1
    wait_for(lambda: take().source is not Source.FALLBACK, "recovery", RECOVERY_LIMIT)
    adds_up(lim.metrics)


# -- 4. Local state --------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_denial_cache_is_per_size(server: Server, key: str, kind: str) -> None:
    """A denied take of 8 (the bucket holds 5) denies 9 locally, but not a take of 2."""
    r = server.client()
    r.execute_command("RL.TAKE", key, TINY, 10, 5)  # 5 left
    if kind == "sync":
        lim = PrefetchLimiter(r, key, TINY, 10, batch=1, renew_at=0.0, backend="module", timeout=5)
        d8 = lim.decide(8)
        calls = lim.metrics["redis_calls"]
        d9 = lim.decide(9)
        calls_after_9 = lim.metrics["redis_calls"]
        d2 = lim.decide(2)
        m = lim.metrics
    else:

        async def run() -> tuple[Any, Any, Any, int, int, Metrics]:
            ar = aredis.Redis(port=server.port)
            alim = AsyncPrefetchLimiter(
                ar, key, TINY, 10, batch=1, renew_at=0.0, backend="module", timeout=5
            )
            a = await alim.decide(8)
            c = alim.metrics["redis_calls"]
            b = await alim.decide(9)
            c9 = alim.metrics["redis_calls"]
            d = await alim.decide(2)
            await ar.aclose()
            return a, b, d, c, c9, alim.metrics

        d8, d9, d2, calls, calls_after_9, m = asyncio.run(run())
    assert not d8.granted and d8.source is Source.SERVER
    assert not d9.granted and d9.source is Source.LEASE and calls_after_9 == calls  # cached
    assert d2.granted and d2.source is Source.SERVER  # asked Redis, not denied locally
    assert m["redis_calls"] == calls + 1
    adds_up(m)


def test_fallback_is_a_share_of_the_fleet_limit(own_server: Server, key: str) -> None:
    """Four instances with instances=4: the fleet's fallback burst is the limit, not 4x."""
    r = own_server.client(socket_timeout=0.5, socket_connect_timeout=0.5, retry=NO_RETRY)
    lims = [Limiter(r, key, 0.01, 100, policy=ALLOW, instances=4, timeout=5) for _ in range(4)]
    for lim in lims:
        assert lim.take().source is Source.SERVER
    own_server.kill()
    let_out = [sum(lim.take().granted for _ in range(60)) for lim in lims]
    assert let_out == [24, 24, 24, 24]  # 100 / 4 each, less the token Redis granted
    for lim in lims:
        adds_up(lim.metrics)


def test_default_fallback_does_not_give_each_instance_the_whole_limit(
    own_server: Server, key: str
) -> None:
    """Without ``instances``, each instance falls back to a quarter of the limit (the default
    ``instances`` of 4, the Rust client's too), never the whole limit: four instances sharing
    a key's traffic get at most a quarter each, less what Redis granted them."""
    rate, cap = 80.0, 10.0
    r = own_server.client(socket_timeout=0.5, socket_connect_timeout=0.5, retry=NO_RETRY)
    lims = [
        Limiter(r, key, rate, cap, policy=ALLOW, timeout=5, probe_interval=3600) for _ in range(4)
    ]
    end = time.monotonic() + 2.0
    while time.monotonic() < end:  # the four share the key's traffic: one take each per
        for lim in lims:  # 50 ms, while the bucket refills 4 tokens: each gets one
            lim.take()
        time.sleep(0.05)
    own_server.kill()
    let_out = [sum(lim.take().granted for _ in range(40)) for lim in lims]
    # A local cap of 10 / 4 = 2.5 at most, less what Redis granted each (the whole limit
    # would be 10 each).
    assert all(n <= cap / 4 for n in let_out), let_out
    for lim in lims:
        adds_up(lim.metrics)


@pytest.mark.parametrize(
    ("name", "policy", "instances", "first"),
    # allow: a share of 10 / 2, less the 4 Redis granted; last-known: a quarter of the 6
    # Redis reported (4 quick grants vouch for no more than the configured share).
    [("allow", ALLOW, 2, 1), ("last-known", LAST_KNOWN, None, 1)],
    ids=["allow-instances-2", "last-known"],
)
def test_fallback_budget_carries_across_flaps(
    own_server: Server,
    key: str,
    name: str,
    policy: FailurePolicy,
    instances: Optional[int],
    first: int,
) -> None:
    """An outage that ends and starts again continues the local bucket: not full again."""
    r = own_server.client(socket_timeout=0.5, socket_connect_timeout=0.5, retry=NO_RETRY)
    lim = Limiter(
        r, key, 0.01, 10, policy=policy, probe_interval=0.05, instances=instances, timeout=5
    )
    for _ in range(4):
        assert lim.take().source is Source.SERVER  # Redis reports 6 left
    own_server.kill()
    assert sum(lim.take().granted for _ in range(20)) == first
    own_server.start()
    wait_for(lambda: lim.take().source is Source.SERVER, "recovery")
    own_server.kill()
    second = [lim.take() for _ in range(20)]
    assert all(d.source is Source.FALLBACK for d in second)
    assert sum(d.granted for d in second) == 0  # spent in the first outage (refill ~0)
    adds_up(lim.metrics)


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_call_waiting_for_a_pooled_connection_returns_within_its_timeout(
    server: Server, key: str, kind: str
) -> None:
    """A client whose BlockingConnectionPool has no free connection waits up to the pool's
    timeout (20 s by default) for one, whatever its socket timeouts: such a call is not
    bounded by the client, and the limiter's timeout (0.2 s) still holds."""
    fast = {"socket_timeout": 0.05, "socket_connect_timeout": 0.05}
    if kind == "sync":
        pool = redis.BlockingConnectionPool(port=server.port, max_connections=1, **fast)
        r = redis.Redis(connection_pool=pool, retry=NO_RETRY)
        lim = Limiter(r, key, TINY, 10, timeout=0.2, policy=DENY, backend="module", own_pool=False)
        held = pool.get_connection(*(("PING",) if _takes_command_name(pool) else ()))
        start = time.monotonic()
        d = lim.take()
        elapsed = time.monotonic() - start
        pool.release(held)
        m = lim.metrics
    else:

        async def run() -> tuple[Any, float, Metrics]:
            pool = aredis.BlockingConnectionPool(port=server.port, max_connections=1, **fast)
            ar = aredis.Redis(connection_pool=pool, retry=AsyncRetry(NoBackoff(), 0))
            lim = AsyncLimiter(
                ar, key, TINY, 10, timeout=0.2, policy=DENY, backend="module", own_pool=False
            )
            name = ("PING",) if _takes_command_name(pool) else ()
            held = await pool.get_connection(*name)
            start = time.monotonic()
            d = await lim.take()
            elapsed = time.monotonic() - start
            await pool.release(held)
            await await_for(lambda: lim.metrics["tokens_returned"] == 1, "the late refund")
            await ar.aclose()
            return d, elapsed, lim.metrics

        d, elapsed, m = asyncio.run(run())
    assert d.source is Source.FALLBACK and not d.granted
    assert elapsed < 0.2 + SLACK, elapsed
    adds_up(m)


def test_every_call_returns_within_its_timeout(debug_server: Server, key: str) -> None:
    """DEBUG SLEEP 5 and timeout 0.2: each kind of call returns within timeout + 1 s, the
    client's own retries and socket timeouts notwithstanding; the leases asked for during
    the sleep land afterwards and are all given back."""
    port = debug_server.port
    timeout = 0.2
    short = redis.Redis(port=port, socket_timeout=timeout)  # retries: redis-py's default
    slow = redis.Redis(port=port, socket_timeout=10)
    sync_lims: list[Any] = [
        Limiter(short, key + ":a", TINY, 10, timeout=timeout, policy=DENY),  # backend auto
        Limiter(slow, key + ":b", TINY, 10, timeout=timeout, policy=DENY, backend="module"),
        PrefetchLimiter(
            slow,
            key + ":c",
            TINY,
            10,
            batch=5,
            timeout=timeout,
            policy=DENY,
            backend="module",
            own_pool=False,  # the client's path: the late lease is read and given back
        ),
    ]
    sleeper = sleep_server(debug_server, 5)
    elapsed: list[float] = []
    for lim in sync_lims:
        start = time.monotonic()
        d = lim.decide() if isinstance(lim, PrefetchLimiter) else lim.take()
        elapsed.append(time.monotonic() - start)
        assert d.source is Source.FALLBACK and not d.granted

    async def run() -> list[Any]:
        ar = aredis.Redis(port=port, socket_timeout=10)
        lims: list[Any] = [
            AsyncLimiter(ar, key + ":d", TINY, 10, timeout=timeout, policy=DENY),
            AsyncPrefetchLimiter(
                ar, key + ":e", TINY, 10, batch=5, timeout=timeout, policy=DENY, backend="module"
            ),
        ]
        for lim in lims:
            start = time.monotonic()
            d = await lim.decide() if isinstance(lim, AsyncPrefetchLimiter) else await lim.take()
            elapsed.append(time.monotonic() - start)
            assert d.source is Source.FALLBACK and not d.granted
        # After the sleep: the asyncio lease lands and close() gives it back.
        await await_for(lambda: lims[1].metrics["leases"] == 1, "the async lease landing")
        await lims[1].close()
        await ar.aclose()
        return lims

    async_lims = asyncio.run(run())
    assert all(e < timeout + SLACK for e in elapsed), elapsed
    sleeper.join(30)
    wait_for(lambda: sync_lims[2].metrics["leases"] == 1, "the sync lease landing")
    sync_lims[2].close()
    admin = debug_server.client()
    for suffix in (":c", ":e"):
        state = peek_fields(admin, key + suffix)
        assert state["leases"] == 0 and state["tokens"] >= 10, (suffix, state)  # nothing lost
    for lim in sync_lims + async_lims:
        assert lim.metrics["leases_lost"] == 0
        adds_up(lim.metrics)
