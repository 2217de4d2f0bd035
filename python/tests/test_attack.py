"""Attacks on the client contract (README: "What a client guarantees under cancellation,
errors and outages"), against real servers. Each test failed before its fix."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import math
import multiprocessing
import queue
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
import redis
import redis.asyncio as aredis
from conftest import Server, sleep_server
from redis.backoff import NoBackoff
from redis.retry import Retry

from redis_rl import (
    ALLOW,
    LAST_KNOWN,
    AsyncLimiter,
    AsyncPrefetchLimiter,
    Limiter,
    LimiterClosed,
    Metrics,
    PrefetchLimiter,
    ServerError,
    Source,
    apermit,
)

TINY = 1e-6
NO_RETRY = Retry(NoBackoff(), 0)
KINDS = ["limiter", "prefetch", "async-limiter", "async-prefetch"]


def adds_up(m: Metrics) -> None:
    assert m["calls"] == m["granted"] + m["denied"] + m["errors"], m.snapshot()


def peek(r: redis.Redis, key: str) -> dict[str, float]:
    reply = r.execute_command("RL.PEEK", key)
    if reply is None:
        return {"tokens": math.inf, "leases": 0, "leased_tokens": 0}
    pairs = reply.items() if isinstance(reply, dict) else zip(reply[::2], reply[1::2])
    return {(k.decode() if isinstance(k, bytes) else k): float(v) for k, v in pairs}


@pytest.fixture
def auth_server(own_server: Server) -> Iterator[Server]:
    """A server that requires a password (set after start: the fixture pings without)."""
    own_server.client().config_set("requirepass", "secret")
    yield own_server
    own_server.client(password="secret").config_set("requirepass", "")


def _takes_raise(
    kind: str, port: int, client_kw: dict[str, Any], key: str, timeout: float = 1.0
) -> Metrics:
    make: dict[str, Any] = {"rate": 1, "cap": 40, "policy": ALLOW, "timeout": timeout}
    if "prefetch" in kind:
        make["batch"] = 10
    if kind.startswith("async"):

        async def run() -> Metrics:
            r = aredis.Redis(port=port, **client_kw)
            cls: Any = AsyncLimiter if kind == "async-limiter" else AsyncPrefetchLimiter
            lim = cls(r, key, **make)
            for _ in range(3):
                with pytest.raises(ServerError):
                    await lim.take()
            await r.aclose()
            return lim.metrics  # type: ignore[no-any-return]

        return asyncio.run(run())
    r = redis.Redis(port=port, **client_kw)
    cls: Any = Limiter if kind == "limiter" else PrefetchLimiter
    lim = cls(r, key, **make)
    for _ in range(3):
        with pytest.raises(ServerError):
            lim.take()
    return lim.metrics  # type: ignore[no-any-return]


@pytest.mark.parametrize("retries", ["no-retries", "default-retries"])
@pytest.mark.parametrize("password", ["wrong", None], ids=["wrongpass", "noauth"])
@pytest.mark.parametrize("kind", KINDS)
def test_authentication_failure_is_an_error_not_an_outage(
    auth_server: Server, key: str, kind: str, password: Any, retries: str
) -> None:
    """Rule 2. ``WRONGPASS`` / ``NOAUTH`` are error replies; redis-py raises them as
    ``AuthenticationError``, a subclass of ``ConnectionError``, which the clients took for an
    outage: under ALLOW a wrong password failed open on every call, silently (the Rust
    client raises ``Error::Server``). With redis-py's default retries (8.x: the refusal is
    retried with backoff for seconds) the call outlived the limiter's 0.2 s timeout, an
    outage again, until the clients checked credentials once without retries."""
    # Timeouts long for a busy machine: the refusal is the point, not speed. redis-py's
    # default retries of the refusal (with backoff) still outlive 1 s by far.
    if retries == "no-retries":
        kw: dict[str, Any] = {"password": password, "socket_timeout": 5, "retry": NO_RETRY}
        timeout = 10.0
    else:
        kw, timeout = {"password": password, "socket_timeout": 5}, 1.0
    m = _takes_raise(kind, auth_server.port, kw, key, timeout)
    assert m["server_errors"] >= 3 and m["errors"] == 3, m.snapshot()
    assert m["granted"] == 0 and m["fallback_decisions"] == 0, m.snapshot()
    adds_up(m)


@pytest.mark.parametrize("kind", ["limiter", "async-limiter"])
def test_rotated_password_is_an_error_after_at_most_one_outage(
    own_server: Server, key: str, kind: str
) -> None:
    """A password rotated under a running limiter (default retries, so the refusal on a
    new connection is retried past the timeout and looks like an outage once): the next
    call that asks Redis (after ``probe_interval``) checks credentials again and raises, and
    so does every call after it: the policy decides only the calls of one outage."""
    admin = own_server.client()
    admin.config_set("requirepass", "old")
    admin = own_server.client(password="old")
    # A timeout long enough for a busy machine (the point is the refusal, not speed); the
    # socket timeout above it keeps the calls on the pool, where credentials are checked.
    make: dict[str, Any] = {"rate": 1, "cap": 40, "policy": ALLOW, "timeout": 2}
    make["probe_interval"] = 0.05

    def rotate() -> None:
        admin.config_set("requirepass", "new")
        admin.client_kill_filter(_type="normal", skipme=True)  # connections auth again

    outcomes: list[str] = []
    if kind == "async-limiter":

        async def run() -> Metrics:
            r = aredis.Redis(port=own_server.port, password="old", socket_timeout=5)
            lim = AsyncLimiter(r, key, **make)
            assert (await lim.take()).source is Source.SERVER
            rotate()
            for _ in range(4):
                try:
                    outcomes.append((await lim.take()).source.value)
                except ServerError:
                    outcomes.append("error")
                await asyncio.sleep(0.1)  # past probe_interval: the next call asks Redis
            await r.aclose()
            return lim.metrics

        m = asyncio.run(run())
    else:
        r = redis.Redis(port=own_server.port, password="old", socket_timeout=5)
        lim = Limiter(r, key, **make)
        assert lim.take().source is Source.SERVER
        rotate()
        for _ in range(4):
            try:
                outcomes.append(lim.take().source.value)
            except ServerError:
                outcomes.append("error")
            time.sleep(0.1)  # past probe_interval: the next call asks Redis
        m = lim.metrics
    own_server.client(password="new").config_set("requirepass", "")
    assert outcomes[1:] == ["error"] * 3 and outcomes[0] in ("error", "fallback"), outcomes
    assert m["fallback_decisions"] <= 1, m.snapshot()
    adds_up(m)


@pytest.mark.parametrize("kind", ["prefetch", "async-prefetch"])
def test_close_leases_nothing_more(server: Server, key: str, kind: str) -> None:
    """Rule 6: ``close()`` returns what is held and leases nothing more; no lease is left
    live after close except ones counted in ``leases_lost``. Before the fix a take after
    ``close()`` leased a new batch (the limiter "stayed usable"), which nothing would return:
    a live lease holding 10 tokens, counted nowhere (the Rust client answers ``Closed``)."""
    r = server.client()
    make: dict[str, Any] = {"rate": TINY, "cap": 100, "batch": 10, "policy": ALLOW}
    if kind == "async-prefetch":

        async def run() -> Metrics:
            ar = aredis.Redis(port=server.port)
            lim = AsyncPrefetchLimiter(ar, key, **make)
            assert await lim.take()
            assert await lim.close() == 9
            for _ in range(3):
                with pytest.raises(LimiterClosed):
                    await lim.take()
            await ar.aclose()
            return lim.metrics

        m = asyncio.run(run())
    else:
        lim = PrefetchLimiter(r, key, **make)
        assert lim.take()
        assert lim.close() == 9
        for _ in range(3):
            with pytest.raises(LimiterClosed):
                lim.take()
        m = lim.metrics
    state = peek(r, key)
    assert state["leases"] == 0 and state["leased_tokens"] == 0, state
    assert abs(state["tokens"] - 99) < 0.01, state
    assert m["leases_lost"] == 0 and m["leases"] == 1 and m["errors"] == 3, m.snapshot()
    adds_up(m)


@pytest.fixture
def debug_server(tmp_path: Any) -> Iterator[Server]:
    s = Server(tmp_path / "redis", extra=["--enable-debug-command", "yes"])
    yield s
    s.stop()


def test_cancelled_apermit_frees_its_slot(debug_server: Server, key: str) -> None:
    """Rule 1 for permits: an ``RL.ACQUIRE`` sent for a caller that is cancelled still
    lands; a permit it brings must be released, not hold the slot (nobody has it) until its
    TTL. Before the fix the call ran in the caller's task: the limit-1 key stayed busy for
    the whole 60 s TTL."""
    r = debug_server.client()

    async def run() -> None:
        ar = aredis.Redis(port=debug_server.port)
        await ar.ping()  # connected: the RL.ACQUIRE below is sent at once

        async def hold() -> None:
            async with apermit(ar, key, 1, ttl=60, timeout=10, backend="module"):
                await asyncio.sleep(30)

        sleeper = await asyncio.to_thread(sleep_server, debug_server, 1)
        task = asyncio.get_running_loop().create_task(hold())
        await asyncio.sleep(0.2)  # the RL.ACQUIRE is sent, the server asleep
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.to_thread(sleeper.join)
        deadline = time.monotonic() + 10
        while True:  # the late permit is released: the slot is free again
            reply = r.execute_command("RL.ACQUIRE", key, 1, 60_000)
            if reply[0] == 1:
                break
            assert time.monotonic() < deadline, f"slot held by a permit nobody has: {reply}"
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.1)
        await ar.aclose()

    asyncio.run(run())


def test_joined_flights_never_end_in_a_policy_decision(server: Server, key: str) -> None:
    """Rule 2: only outages go to the failure policy. A take that waits for other takes'
    lease calls (one in the air at a time) and finds nothing for its size after two of them
    fell to the policy while Redis answered every call: under ALLOW an empty bucket let it
    through. Ordered deterministically: ``CLIENT PAUSE`` holds the first call while three
    takes (5, 3, 1 tokens) line up behind it."""
    r = server.client()
    r.execute_command("RL.TAKE", key, TINY, 100, 100)  # empty, and it stays so

    async def run() -> tuple[list[Any], Metrics]:
        ar = aredis.Redis(port=server.port)
        lim = AsyncPrefetchLimiter(
            ar, key, TINY, 100, batch=10, policy=ALLOW, timeout=5, backend="module"
        )
        await ar.ping()
        r.execute_command("CLIENT", "PAUSE", 300, "WRITE")
        loop = asyncio.get_running_loop()
        tasks = []
        for n in (5, 3, 1):
            tasks.append(loop.create_task(lim.decide(n)))
            await asyncio.sleep(0.02)  # each in turn: the first sends, the others wait
        decisions = await asyncio.gather(*tasks)
        await ar.aclose()
        return decisions, lim.metrics

    decisions, m = asyncio.run(run())
    assert not any(d.granted for d in decisions), decisions
    assert m["fallback_decisions"] == 0 and m["redis_errors"] == 0, m.snapshot()
    adds_up(m)


@pytest.mark.parametrize("instances", [4, None], ids=["instances", "measured"])
def test_fallback_budget_is_debited_by_redis_grants(
    own_server: Server, key: str, instances: Any
) -> None:
    """Rule 4: a fallback budget is this instance's share, debited by what Redis grants the
    instance. Before the fix Redis grants never touched it: an instance that had just taken
    its whole share from Redis got a full local bucket at the outage, its share again."""
    r = own_server.client(socket_timeout=0.5, retry=NO_RETRY)
    lim = Limiter(r, key, rate=TINY, cap=100, policy=ALLOW, instances=instances, timeout=0.5)
    # The share: 25 of 4 instances; measured, all of it (this instance took every grant).
    share = 25 if instances else 100
    for _ in range(share):
        d = lim.take()
        assert d.granted and d.source == Source.SERVER, d
    own_server.kill()
    let_out = sum(lim.take().granted for _ in range(50))
    assert let_out == 0, f"{let_out} let out locally after the share was spent at Redis"
    adds_up(lim.metrics)


@pytest.mark.parametrize("kind", KINDS)
def test_oom_is_an_error_reply_not_an_outage(own_server: Server, key: str, kind: str) -> None:
    """Rule 2: ``-OOM command not allowed ...`` is an error reply, never a grant (ALLOW)."""
    own_server.client().config_set("maxmemory", 1)
    m = _takes_raise(kind, own_server.port, {"socket_timeout": 2}, key)
    assert m["server_errors"] >= 3 and m["errors"] == 3, m.snapshot()
    assert m["granted"] == 0 and m["fallback_decisions"] == 0, m.snapshot()
    adds_up(m)


def test_close_racing_takes_from_threads_leaves_no_lease(server: Server, key: str) -> None:
    """Rules 1 and 6 with 8 threads taking while ``close()`` runs: afterwards no lease is
    live on the server except ones counted in ``leases_lost``, every take either decided or
    raised ``LimiterClosed``, and the counters add up."""
    r = server.client()
    lim = PrefetchLimiter(r, key, 1000, 10_000, batch=20, policy=ALLOW, timeout=2)
    stop = threading.Event()
    other: list[BaseException] = []

    def worker() -> None:
        while not stop.is_set():
            try:
                lim.take()
            except LimiterClosed:
                return
            except BaseException as e:
                other.append(e)
                return

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    time.sleep(0.3)
    lim.close()
    for t in threads:
        t.join(10)
        assert not t.is_alive()
    assert not other, other
    m = lim.metrics
    deadline = time.monotonic() + 30
    while peek(r, key)["leases"] > m["leases_lost"]:  # a flight in the air at close lands
        assert time.monotonic() < deadline, (peek(r, key), m.snapshot())  # and goes back
        time.sleep(0.05)
    adds_up(m)


@pytest.mark.parametrize("kind", ["prefetch", "async-prefetch"])
def test_prefetch_last_known_budget_is_a_share(own_server: Server, key: str, kind: str) -> None:
    """Rule 4 (the Rust client's twin defect): under LAST_KNOWN a prefetching limiter has no
    level from Redis (a lease reports none), so its local bucket started full at the share
    it measured, the whole cap when it took the whole rate: 100 let out per instance where
    ``instances=4`` allow 25 (less the 10 it leased)."""
    make: dict[str, Any] = {
        "batch": 10,
        "policy": LAST_KNOWN,
        "instances": 4,
        "timeout": 0.5,
        "probe_interval": 3600,
    }
    kw = {"socket_timeout": 0.5, "socket_connect_timeout": 0.5, "retry": NO_RETRY}
    if kind == "async-prefetch":

        async def run() -> int:
            ar = aredis.Redis(port=own_server.port, **kw)
            lim = AsyncPrefetchLimiter(ar, key, TINY, 100, **make)
            assert await lim.take()
            await asyncio.sleep(0.3)
            own_server.kill()
            out = 0
            for _ in range(150):
                d = await lim.decide()
                out += d.granted and d.source is Source.FALLBACK
            await ar.aclose()
            return out

        let_out = asyncio.run(run())
    else:
        lim = PrefetchLimiter(own_server.client(**kw), key, TINY, 100, **make)
        assert lim.take()
        time.sleep(0.3)
        own_server.kill()
        let_out = 0
        for _ in range(150):
            d = lim.decide()
            let_out += d.granted and d.source is Source.FALLBACK
    assert let_out <= 15, f"{let_out} let out locally: the share is 25, 10 were leased"


def test_dropping_a_sync_prefetch_limiter_returns_its_leftovers(server: Server, key: str) -> None:
    """Rule 6: dropping a limiter returns its leftovers best effort. Before the fix a
    ``PrefetchLimiter`` dropped without ``close()`` left its lease live for its whole TTL
    (60 s here), its 9 unspent tokens with it."""
    r = server.client()
    lim = PrefetchLimiter(r, key, TINY, 100, batch=10, ttl=60)
    assert lim.take()
    del lim
    gc.collect()
    deadline = time.monotonic() + 10
    while peek(r, key)["leases"] != 0:
        assert time.monotonic() < deadline, peek(r, key)
        time.sleep(0.02)
    assert abs(peek(r, key)["tokens"] - 99) < 0.01, peek(r, key)


def _child_takes(lim: PrefetchLimiter, out: Any) -> None:
    decisions = [lim.decide() for _ in range(3)]
    out.put([d.source.value for d in decisions])
    lim.close()


def test_a_forked_child_does_not_spend_its_parents_lease(server: Server, key: str) -> None:
    """Fork (``multiprocessing`` with the fork start method, a gunicorn worker): the child
    inherits a copy of the parent's held lease. Before the fix it spent it too: tokens Redis
    granted once (to the parent) were let out by both processes, and a lease call in the air
    at the fork blocked the child's leasing for up to ``ttl + timeout + 1`` s. The child
    starts with no lease and no call in the air: its first take leases its own batch."""
    if "fork" not in multiprocessing.get_all_start_methods():
        pytest.skip("no fork on this platform")
    r = server.client()
    lim = PrefetchLimiter(r, key, TINY, 100, batch=10, ttl=60, timeout=2)
    assert lim.take() and lim.held == 9
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    child = ctx.Process(target=_child_takes, args=(lim, out))
    child.start()
    sources = out.get(timeout=20)
    child.join(20)
    assert child.exitcode == 0
    assert sources[0] == "server", sources  # its own lease, not the parent's copy
    assert lim.held == 9
    assert lim.close() == 9
    state = peek(r, key)
    # Spent: 1 by the parent, 3 by the child; nothing else live or missing.
    assert state["leases"] == 0 and abs(state["tokens"] - 96) < 0.01, state


class Proxy:
    """A TCP proxy on a free loopback port to ``upstream``: each accepted connection gets
    its own upstream one, numbered from 1 (``accepted``), and two pump threads
    (``_pump(a, b, number, to_client)``, which subclasses define)."""

    def __init__(self, upstream: int) -> None:
        self.upstream = upstream
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.port = self.listener.getsockname()[1]
        self.accepted = 0
        self.sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                down, _ = self.listener.accept()
            except OSError:
                return
            self.accepted += 1
            number = self.accepted
            up = socket.create_connection(("127.0.0.1", self.upstream))
            self.sockets += [down, up]
            for a, b, to_client in ((down, up, False), (up, down, True)):
                args = (a, b, number, to_client)
                threading.Thread(target=self._pump, args=args, daemon=True).start()

    def _pump(self, a: socket.socket, b: socket.socket, number: int, to_client: bool) -> None:
        raise NotImplementedError

    def close(self) -> None:
        self.listener.close()
        for s in self.sockets:  # shutdown wakes the threads blocked on them, sends the FIN
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                s.close()


class FreezingProxy(Proxy):
    """A proxy whose connections open at ``freeze()`` forward nothing more and never
    close (a network partition, a peer gone without a FIN); later connections pass."""

    def __init__(self, upstream: int) -> None:
        self.frozen_upto = 0
        super().__init__(upstream)

    def _pump(self, a: socket.socket, b: socket.socket, number: int, to_client: bool) -> None:
        while True:
            try:
                data = a.recv(65536)
            except OSError:
                return
            if not data:
                return
            if number <= self.frozen_upto:
                continue  # swallowed: nothing is forwarded, nothing is closed
            try:
                b.sendall(data)
            except OSError:
                return

    def freeze(self) -> None:
        self.frozen_upto = self.accepted


def test_half_open_connections_without_socket_timeout_recover(server: Server, key: str) -> None:
    """A sync Limiter on a client without ``socket_timeout`` runs its calls on the shared
    call pool; a call on a half-open connection blocks its thread until the socket fails,
    maybe forever. With the pool's 8 fixed threads, 8 half-open connections in the client's
    pool stuck every one of them: every later call of every limiter queued behind them and
    fell back forever, though Redis answered new connections. The pool now grows past
    threads whose callers gave up (up to ``CallPool.MAX_THREADS``)."""
    proxy = FreezingProxy(server.port)
    try:
        # No socket timeout (redis-py 8 defaults to 5 s: then recovery takes those 5 s,
        # above the documented bound, as every pool thread waits them out).
        r = redis.Redis(port=proxy.port, socket_timeout=None)
        lim = Limiter(r, key, rate=1000, cap=1000, policy=ALLOW, timeout=0.2, probe_interval=0.05)
        assert lim.take().source is Source.SERVER
        # Eight connections in the client's pool (a threaded server had them busy at once).
        conns = [r.connection_pool.get_connection() for _ in range(8)]
        for c in conns:
            r.connection_pool.release(c)
        proxy.freeze()
        deadline = time.monotonic() + 10
        while True:
            started = time.monotonic()
            d = lim.take()
            assert time.monotonic() - started < 0.2 + 1.0  # within its timeout: holds
            if d.source is Source.SERVER:
                break  # recovered over a fresh connection
            assert time.monotonic() < deadline, "never recovered: the call pool is stuck"
            time.sleep(0.05)
    finally:
        proxy.close()  # the stuck pool threads get their EOF: later tests have the pool
        time.sleep(0.5)


# -- The credential check and the call pool ------------------------------------------------


def _sources(kind: str, port: int, client_kw: dict[str, Any], key: str, **make: Any) -> list[str]:
    """What three calls of a ``kind`` limiter came to ("error" for a ServerError)."""
    make = {"rate": 100, "cap": 100, "policy": ALLOW, **make}
    if "prefetch" in kind:
        make["batch"] = 10
    out: list[str] = []
    if kind.startswith("async"):

        async def run() -> None:
            r = aredis.Redis(port=port, **client_kw)
            cls: Any = AsyncLimiter if kind == "async-limiter" else AsyncPrefetchLimiter
            lim = cls(r, key, **make)
            take = lim.take if kind == "async-limiter" else lim.decide
            for _ in range(3):
                try:
                    out.append((await take()).source.value)
                except ServerError:
                    out.append("error")
                await asyncio.sleep(0.1)
            await r.aclose()

        asyncio.run(run())
        return out
    r = redis.Redis(port=port, **client_kw)
    cls: Any = Limiter if kind == "limiter" else PrefetchLimiter
    lim = cls(r, key, **make)
    take: Callable[[], Any] = lim.take if kind == "limiter" else lim.decide
    for _ in range(3):
        try:
            out.append(take().source.value)
        except ServerError:
            out.append("error")
        time.sleep(0.1)
    return out


@pytest.mark.parametrize("kind", KINDS)
def test_wrong_password_with_an_explicit_backend_is_an_error(
    auth_server: Server, key: str, kind: str
) -> None:
    """Rule 2. The prefetching limiters sent their lease calls straight to the client: the
    credential check ran only in front of the backend probe. With ``backend="module"`` (no
    probe) and redis-py's default retries, a wrong password was retried past the 0.2 s
    timeout on every lease call: an outage each time, and ALLOW failed open forever (a
    password rotated under a running prefetcher likewise, the probe long done)."""
    kw = {"password": "wrong", "socket_timeout": 2}
    out = _sources(kind, auth_server.port, kw, key, timeout=0.2, backend="module")
    assert out == ["error"] * 3, out


@pytest.mark.parametrize("kind", KINDS)
def test_a_user_without_ping_is_not_refused(own_server: Server, key: str, kind: str) -> None:
    """Rule 2 (and 3). A least-privilege ACL user may run the limiter's commands but not
    ``PING``; the credential check's ``PING`` then answered ``NOPERM``, which the check
    raised: every call of a limiter on the pooled path (and every asyncio limiter) was a
    ServerError, though the user's credentials and the calls themselves were fine."""
    admin = own_server.client()
    admin.acl_setuser(
        "lim", enabled=True, passwords=["+pw"], keys=["*"], commands=["+@all", "-ping"]
    )
    kw = {"username": "lim", "password": "pw", "socket_timeout": 2}  # default retries: pooled
    out = _sources(kind, own_server.port, kw, key, timeout=1.0)
    assert out[0] == "server" and "error" not in out, out


@pytest.fixture
def unix_auth_server(tmp_path: Path) -> Iterator[Server]:
    """A server on a Unix socket (a short path: sun_path has ~100 bytes) with a password."""
    short = Path(tempfile.mkdtemp(prefix="rl", dir="/tmp"))
    s = Server(
        tmp_path / "redis", extra=["--unixsocket", str(short / "s"), "--unixsocketperm", "700"]
    )
    s.client().config_set("requirepass", "secret")
    yield s
    s.stop()
    with contextlib.suppress(OSError):
        (short / "s").unlink()
        short.rmdir()


@pytest.mark.parametrize("kind", ["async-limiter", "async-prefetch"])
def test_wrong_password_on_a_unix_socket_is_an_error(
    unix_auth_server: Server, key: str, kind: str
) -> None:
    """Rule 2. redis.asyncio authenticates a Unix-socket connection inside its connect, and
    wraps the ``AuthenticationError`` there in a bare ``ConnectionError``: the credential
    check raised that, an outage, and ALLOW failed open on a wrong password."""
    path = unix_auth_server.extra[1]

    async def run() -> list[str]:
        r = aredis.Redis(unix_socket_path=path, password="wrong", socket_timeout=2, retry=None)
        make: dict[str, Any] = {"rate": 1, "cap": 40, "policy": ALLOW, "timeout": 1.0}
        if kind == "async-limiter":
            lim: Any = AsyncLimiter(r, key, **make)
        else:
            lim = AsyncPrefetchLimiter(r, key, batch=10, **make)
        out = []
        for _ in range(3):
            try:
                out.append(
                    (
                        await lim.decide() if kind != "async-limiter" else await lim.take()
                    ).source.value
                )
            except ServerError:
                out.append("error")
        await r.aclose()
        return out

    out = asyncio.run(run())
    assert out == ["error"] * 3, out


class DelayProxy(Proxy):
    """A proxy whose replies reach the client ``delay`` seconds late (a long link: every
    round trip takes ``delay``)."""

    def __init__(self, upstream: int, delay: float) -> None:
        self.delay = delay
        super().__init__(upstream)

    def _pump(self, a: socket.socket, b: socket.socket, number: int, to_client: bool) -> None:
        delay = self.delay if to_client else 0.0
        chunks: queue.SimpleQueue[tuple[float, bytes]] = queue.SimpleQueue()

        def forward() -> None:
            while True:
                at, data = chunks.get()
                time.sleep(max(0.0, at - time.monotonic()))
                if not data:
                    with contextlib.suppress(OSError):
                        b.shutdown(socket.SHUT_WR)
                    return
                try:
                    b.sendall(data)
                except OSError:
                    return

        threading.Thread(target=forward, daemon=True).start()
        while True:
            try:
                data = a.recv(65536)
            except OSError:
                data = b""
            chunks.put((time.monotonic() + delay, data))
            if not data:
                return


@pytest.mark.parametrize("kind", ["limiter", "async-limiter"])
def test_the_credential_check_never_keeps_a_long_link_down(
    server: Server, key: str, kind: str
) -> None:
    """Rule 3. Over a link with 0.4 s round trips a call takes 0.4 s, well within the 2.2 s
    timeout; the credential check (a new connection: its handshake, then PING) takes five
    round trips, 2 s. After any outage every call was check + call = 2.4 s: it timed out,
    the timeout asked for the check again, and the limiter fell back forever though Redis
    answered every call in time. A check that passed during the call now stands. (Round
    trips this long leave a busy machine 0.2 s either side; a few tries are allowed.)"""
    proxy = DelayProxy(server.port, 0.4)
    # Between check and check + call: redis-py 8's sync check takes five round trips (2 s),
    # its asyncio check four (1.6 s).
    timeout = 2.2 if kind == "limiter" else 1.8
    make: dict[str, Any] = {"rate": 1000, "cap": 1000, "policy": ALLOW, "timeout": timeout}
    make.update(probe_interval=0.05, backend="module")
    kw: dict[str, Any] = {"socket_timeout": 10}  # default retries: the pooled path
    sources: list[str] = []
    try:
        if kind == "async-limiter":

            async def run() -> None:
                r = aredis.Redis(port=proxy.port, **kw)
                lim = AsyncLimiter(r, key, **make)
                for _ in range(6):
                    sources.append((await lim.take()).source.value)
                    if sources[-1] == "server":
                        break
                    await asyncio.sleep(2.0)  # the late call lands: a warm connection
                await r.aclose()

            asyncio.run(run())
        else:
            lim = Limiter(redis.Redis(port=proxy.port, **kw), key, **make)
            for _ in range(6):
                sources.append(lim.take().source.value)
                if sources[-1] == "server":
                    break
                time.sleep(2.0)  # the late call lands: a warm connection
    finally:
        proxy.close()
    assert "server" in sources, sources


@pytest.mark.parametrize("kind", ["async-limiter", "async-prefetch"])
def test_an_asyncio_backend_probe_outlives_a_short_timeout(
    server: Server, key: str, kind: str
) -> None:
    """Rule 3. Over a link with 0.12 s round trips, an asyncio limiter with the default
    ``backend="auto"`` and a 0.3 s timeout: its first call opens a connection, checks
    credentials and probes for the module, more than 0.3 s. The probes ran within each
    call's timeout and were cancelled with it (redis.asyncio then drops the connection),
    so every call started over and the limiter fell back forever, though each call alone
    takes 0.12 s. The probe now goes on past the timeout on a task of its own."""
    proxy = DelayProxy(server.port, 0.12)
    sources: list[str] = []

    async def run() -> None:
        r = aredis.Redis(port=proxy.port, socket_timeout=5)
        make: dict[str, Any] = {"policy": ALLOW, "timeout": 0.3, "probe_interval": 0.05}
        if kind == "async-prefetch":
            lim: Any = AsyncPrefetchLimiter(r, key, 1000, 1000, batch=10, **make)
        else:
            lim = AsyncLimiter(r, key, 1000, 1000, **make)
        decide = lim.decide if kind == "async-prefetch" else lim.take
        for _ in range(12):
            sources.append((await decide()).source.value)
            if sources[-1] != "fallback":
                break
            await asyncio.sleep(0.25)
        if kind == "async-prefetch":
            await lim.close()
        await r.aclose()

    try:
        asyncio.run(run())
    finally:
        proxy.close()
    assert sources[-1] in ("server", "lease"), sources


_DROPPED_AT_EXIT = {
    # Dropped as main() returns, the interpreter exiting next.
    "end-of-main": """
import sys, redis
from redis_rl import PrefetchLimiter

def main() -> None:
    r = redis.Redis(port=int(sys.argv[1]), socket_timeout=10)  # the call pool path
    lim = PrefetchLimiter(r, sys.argv[2], 1e-6, 100, batch=10, timeout=2)
    assert lim.take()

main()
""",
    # An app's global: dropped only after the exit hooks.
    "module-level": """
import sys, redis
from redis_rl import PrefetchLimiter

r = redis.Redis(port=int(sys.argv[1]), socket_timeout=10)
lim = PrefetchLimiter(r, sys.argv[2], 1e-6, 100, batch=10, timeout=2)
assert lim.take()
""",
}


@pytest.mark.parametrize("where", list(_DROPPED_AT_EXIT))
def test_a_prefetch_limiter_dropped_at_exit_gives_back(
    server: Server, key: str, where: str
) -> None:
    """Rule 6 (dropping returns leftovers, best effort) for a limiter never closed. Its
    return goes to the call pool, whose daemon threads the exit kills: dropped as main()
    returns, the return was lost unless the pool waited for submitted work at exit (it
    does, up to ``CallPool.EXIT_WAIT_SECONDS``); dropped at module level, only after the
    exit hooks, when the pool no longer runs, the lease stayed live with 9 tokens, unless
    limiters alive at exit submit their return from the pool's exit hook (they do)."""
    done = subprocess.run(
        [sys.executable, "-c", _DROPPED_AT_EXIT[where], str(server.port), key],
        capture_output=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr.decode()
    state = peek(server.client(), key)
    assert state["leases"] == 0 and abs(state["tokens"] - 99) < 0.01, state


@pytest.mark.parametrize("kind", ["async-limiter", "async-prefetch"])
def test_an_asyncio_backend_probe_stuck_on_a_half_open_connection_holds_up_nobody(
    server: Server, key: str, kind: str
) -> None:
    """Rule 3 (attack 7). An asyncio limiter whose first call finds the client's pooled
    connection half-open (no ``socket_timeout``: a peer gone without a FIN). The backend
    probe now runs on a task of its own bounded by ``LATE_LIMIT`` (30 s), and every call
    awaited that one task: all of them fell back for 30 s though Redis answered new
    connections at once. The rule: a half-open connection is caught by the per-call
    timeout and calls stuck on one never hold up the others."""
    proxy = FreezingProxy(server.port)
    sources: list[str] = []

    async def run() -> None:
        r = aredis.Redis(port=proxy.port, socket_timeout=None)
        await r.ping()  # one connection in the client's pool, about to go half-open
        proxy.freeze()
        make: dict[str, Any] = {"policy": ALLOW, "timeout": 0.2, "probe_interval": 0.05}
        if kind == "async-prefetch":
            lim: Any = AsyncPrefetchLimiter(r, key, 1000, 1000, batch=10, **make)
        else:
            lim = AsyncLimiter(r, key, 1000, 1000, **make)
        decide = lim.decide if kind == "async-prefetch" else lim.take
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            started = time.monotonic()
            sources.append((await decide()).source.value)
            assert time.monotonic() - started < 0.2 + 1.0
            if sources[-1] != "fallback":
                break
            await asyncio.sleep(0.05)
        if kind == "async-prefetch":
            await lim.close()

    try:
        asyncio.run(run())
    finally:
        proxy.close()
        time.sleep(0.2)
    assert sources[-1] in ("server", "lease"), sources
