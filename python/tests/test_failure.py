"""Failure policies against a redis-server that is killed, restarted, paused, full, behind a
slow or half-open link, or refusing the credentials."""

from __future__ import annotations

import asyncio
import contextlib
import queue
import socket
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
import redis
import redis.asyncio as aredis
from conftest import KINDS, NO_RETRY, TINY, Proxy, Server, adds_up, wait_for

from redis_rl import (
    ALLOW,
    DENY,
    LAST_KNOWN,
    AsyncLimiter,
    AsyncPrefetchLimiter,
    FailurePolicy,
    Limiter,
    Metrics,
    PrefetchLimiter,
    ServerError,
    Source,
)
from redis_rl._call import _takes_command_name

RATE, CAP = 0.01, 10  # refill negligible within the test: local counts are exact

# What each policy lets through in a burst of 20 during the outage, after 4 tokens were
# taken from Redis (which then reported 6 left).
POLICIES = [
    # A local bucket of cap * 0.5 = 5, debited by the 4 Redis granted this instance.
    ("allow-half", FailurePolicy.allow(0.5), 1),
    # Its share of the level Redis last reported: 4 grants in a few ms vouch for
    # no more than the configured quarter (they once read as the whole limit, 6 of 6)
    ("last-known", LAST_KNOWN, 1),
    ("deny", DENY, 0),
]


@pytest.mark.parametrize(("name", "policy", "burst"), POLICIES, ids=[p[0] for p in POLICIES])
def test_limiter_outage_and_recovery(
    own_server: Server, key: str, name: str, policy: FailurePolicy, burst: int
) -> None:
    r = own_server.client(socket_timeout=0.5, socket_connect_timeout=0.5)
    lim = Limiter(r, key, RATE, CAP, policy=policy, probe_interval=0.1, timeout=5)
    for _ in range(4):
        assert lim.take().source is Source.SERVER
    own_server.kill()
    decisions = [lim.take() for _ in range(20)]
    assert all(d.source is Source.FALLBACK for d in decisions)
    assert sum(d.granted for d in decisions) == burst
    assert lim.metrics.fallback_decisions == 20
    assert lim.metrics["redis_errors"] >= 1
    if policy is DENY:
        assert decisions[0].headers()["Retry-After"] == "1"
    # Back up (empty: --save ""): the limiter asks Redis again by itself.
    own_server.start()
    wait_for(lambda: lim.take().source is Source.SERVER, "a server decision after restart")
    d = lim.take()
    assert d.source is Source.SERVER and d.granted  # a fresh bucket on the new server


@pytest.mark.parametrize(("name", "policy", "burst"), POLICIES, ids=[p[0] for p in POLICIES])
def test_prefetch_spends_its_lease_then_applies_the_policy(
    own_server: Server, key: str, name: str, policy: FailurePolicy, burst: int
) -> None:
    r = own_server.client(socket_timeout=0.5, socket_connect_timeout=0.5)
    lim = PrefetchLimiter(
        r, key, RATE, CAP, batch=5, renew_at=0.0, policy=policy, probe_interval=0.1, timeout=5
    )
    assert lim.take() and lim.held == 4
    own_server.kill()
    decisions = [lim.decide() for _ in range(20)]
    assert [d.source for d in decisions[:4]] == [Source.LEASE] * 4
    assert all(d.granted for d in decisions[:4])  # real grants, held before the outage
    assert all(d.source is Source.FALLBACK for d in decisions[4:])
    local = sum(d.granted for d in decisions[4:])
    # DENY: nothing; ALLOW: the share of 5 was the lease Redis granted; LAST_KNOWN (leases
    # report no level): at most the default share of the cap (a quarter of 10), less the 5
    # the lease took.
    assert local == 0
    own_server.start()
    wait_for(lambda: lim.decide().source is not Source.FALLBACK, "a lease after restart")
    assert lim.held > 0
    lim.close()


def test_async_outage_and_recovery(own_server: Server, key: str) -> None:
    async def run() -> None:
        r = aredis.Redis(port=own_server.port, socket_connect_timeout=0.5)
        lim = AsyncLimiter(r, key, RATE, CAP, policy=DENY, probe_interval=0.1, timeout=5)
        assert (await lim.take()).source is Source.SERVER
        own_server.kill()
        ds = [await lim.take() for _ in range(5)]
        assert all(d.source is Source.FALLBACK and not d.granted for d in ds)
        own_server.start()
        deadline = time.monotonic() + 15
        while (await lim.take()).source is not Source.SERVER:
            assert time.monotonic() < deadline, "no recovery"
            await asyncio.sleep(0.02)
        await r.aclose()

    asyncio.run(run())


@pytest.mark.parametrize("socket_timeout", [None, 1.0], ids=["limiter-timeout", "socket-timeout"])
def test_slow_server_times_out(own_server: Server, key: str, socket_timeout: float) -> None:
    # SIGSTOP: the server accepts nothing and answers nothing, like a long DEBUG SLEEP.
    r = own_server.client(socket_timeout=socket_timeout)
    lim = Limiter(  # 1 s: long for a busy machine, short beside a SIGSTOP
        r, key, RATE, CAP, policy=DENY, timeout=1, probe_interval=3600, backend="module"
    )
    assert lim.take().source is Source.SERVER
    own_server.pause()
    try:
        results: list[object] = []
        t = threading.Thread(target=lambda: results.extend(lim.take() for _ in range(3)))
        t.start()
        t.join(10)  # a hang detector, not a performance threshold
        assert not t.is_alive(), "take() waited for a stopped server"
    finally:
        own_server.resume()
    assert [getattr(d, "source", None) for d in results] == [Source.FALLBACK] * 3
    assert lim.metrics["redis_timeouts"] == 1  # then decided locally until the next probe
    assert lim.metrics["redis_calls"] == 2


def test_async_slow_server_times_out(own_server: Server, key: str) -> None:
    async def run() -> None:
        r = aredis.Redis(port=own_server.port)
        lim = AsyncPrefetchLimiter(
            r, key, RATE, CAP, batch=2, renew_at=0.0, policy=DENY, timeout=1, probe_interval=0.1
        )
        assert await lim.take() and await lim.take()
        own_server.pause()
        try:
            d = await asyncio.wait_for(lim.decide(), 10)
        finally:
            own_server.resume()
        assert d.source is Source.FALLBACK and not d.granted
        assert lim.metrics["redis_timeouts"] == 1
        deadline = time.monotonic() + 15
        while (await lim.decide()).source is Source.FALLBACK:
            assert time.monotonic() < deadline, "no recovery"
            await asyncio.sleep(0.02)
        await r.aclose()

    asyncio.run(run())


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
    """Contract rule 2 (docs/client-contract.md). ``WRONGPASS`` / ``NOAUTH`` are error replies;
    redis-py raises them as ``AuthenticationError``, a subclass of ``ConnectionError``, which
    must not be taken for an outage (under ALLOW a wrong password would fail open on every
    call). With redis-py's default retries (8.x retries the refusal with backoff for seconds)
    the call would outlive the limiter's 0.2 s timeout: the clients check credentials once,
    without retries."""
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


@pytest.mark.parametrize("instances", [4, None], ids=["instances", "default"])
def test_fallback_budget_is_debited_by_redis_grants(
    own_server: Server, key: str, instances: Any
) -> None:
    """Contract rule 4: a fallback budget is this instance's share, debited by what Redis grants
    the instance: an instance that has just taken its whole share from Redis gets no full
    local bucket at the outage."""
    r = own_server.client(socket_timeout=5, retry=NO_RETRY)
    lim = Limiter(r, key, rate=TINY, cap=100, policy=ALLOW, instances=instances, timeout=5)
    # The share: 25, a quarter (instances=4, and the default without it).
    share = 25
    for _ in range(share):
        d = lim.take()
        assert d.granted and d.source == Source.SERVER, d
    own_server.kill()
    let_out = sum(lim.take().granted for _ in range(50))
    assert let_out == 0, f"{let_out} let out locally after the share was spent at Redis"
    adds_up(lim.metrics)


@pytest.mark.parametrize("kind", KINDS)
def test_oom_is_an_error_reply_not_an_outage(own_server: Server, key: str, kind: str) -> None:
    """Contract rule 2: ``-OOM command not allowed ...`` is an error reply, never a grant."""
    own_server.client().config_set("maxmemory", 1)
    m = _takes_raise(kind, own_server.port, {"socket_timeout": 2}, key)
    assert m["server_errors"] >= 3 and m["errors"] == 3, m.snapshot()
    assert m["granted"] == 0 and m["fallback_decisions"] == 0, m.snapshot()
    adds_up(m)


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
    maybe forever. Eight half-open connections in the client's pool must not stick every
    later call of every limiter behind them while Redis answers new connections: the pool
    grows past threads whose callers gave up (up to ``CallPool.MAX_THREADS``)."""
    proxy = FreezingProxy(server.port)
    try:
        # No socket timeout (redis-py 8 defaults to 5 s: then recovery takes those 5 s,
        # above the documented bound, as every pool thread waits them out).
        r = redis.Redis(port=proxy.port, socket_timeout=None)
        lim = Limiter(r, key, rate=1000, cap=1000, policy=ALLOW, timeout=0.2, probe_interval=0.05)
        assert lim.take().source is Source.SERVER
        # Eight connections in the client's pool (a threaded server had them busy at once).
        name = ("PING",) if _takes_command_name(r.connection_pool) else ()
        conns = [r.connection_pool.get_connection(*name) for _ in range(8)]
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
    """Contract rule 2. With ``backend="module"`` (no backend probe) the credential check still
    runs in front of the prefetching limiters' lease calls: a wrong password retried by
    redis-py past the 0.2 s timeout would be an outage on every lease call, and ALLOW would
    fail open forever (a password rotated under a running prefetcher likewise)."""
    kw = {"password": "wrong", "socket_timeout": 2}
    out = _sources(kind, auth_server.port, kw, key, timeout=0.2, backend="module")
    assert out == ["error"] * 3, out


@pytest.mark.parametrize("kind", KINDS)
def test_a_user_without_ping_is_not_refused(own_server: Server, key: str, kind: str) -> None:
    """Contract rules 2 and 3. A least-privilege ACL user may run the limiter's commands but not
    ``PING``: the credential check's ``NOPERM`` is not raised, so every call of a limiter on
    the pooled path (and every asyncio limiter) works when the credentials and the calls
    themselves are fine."""
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
    """Contract rule 2. redis.asyncio authenticates a Unix-socket connection inside its connect,
    and wraps the ``AuthenticationError`` there in a bare ``ConnectionError``: the credential
    check still reports an error, not an outage, so ALLOW does not fail open on a wrong
    password."""
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
    """Contract rule 3. Over a link with 0.4 s round trips a call takes 0.4 s, well within the
    2.2 s timeout; the credential check (a new connection: its handshake, then PING) takes
    five round trips, 2 s. Check + call would be 2.4 s, a timeout that asks for the check
    again, forever: a check that passed during the call stands. (Round trips this long leave
    a busy machine 0.2 s either side; a few tries are allowed.)"""
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


def async_limiter(kind: str, r: aredis.Redis, key: str, make: dict[str, Any]) -> tuple[Any, Any]:
    """An asyncio limiter of ``kind`` (1000/s, cap 1000) and its deciding call."""
    if kind == "async-prefetch":
        lim: Any = AsyncPrefetchLimiter(r, key, 1000, 1000, batch=10, **make)
        return lim, lim.decide
    lim = AsyncLimiter(r, key, 1000, 1000, **make)
    return lim, lim.take


@pytest.mark.parametrize("kind", ["async-limiter", "async-prefetch"])
def test_an_asyncio_backend_probe_outlives_a_short_timeout(
    server: Server, key: str, kind: str
) -> None:
    """Contract rule 3. Over a link with 0.12 s round trips, an asyncio limiter with the default
    ``backend="auto"`` and a 0.3 s timeout: its first call opens a connection, checks
    credentials and probes for the module, more than 0.3 s. The probe goes on past the
    timeout on a task of its own (cancelled with each call, redis.asyncio would drop the
    connection and every call would start over), so the limiter recovers."""
    proxy = DelayProxy(server.port, 0.12)
    sources: list[str] = []

    async def run() -> None:
        r = aredis.Redis(port=proxy.port, socket_timeout=5)
        make: dict[str, Any] = {"policy": ALLOW, "timeout": 0.3, "probe_interval": 0.05}
        lim, decide = async_limiter(kind, r, key, make)
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


@pytest.mark.parametrize("kind", ["async-limiter", "async-prefetch"])
def test_an_asyncio_backend_probe_stuck_on_a_half_open_connection_holds_up_nobody(
    server: Server, key: str, kind: str
) -> None:
    """Contract rule 3. An asyncio limiter whose first call finds the client's pooled
    connection half-open (no ``socket_timeout``: a peer gone without a FIN). The backend
    probe runs on a task of its own bounded by ``LATE_LIMIT`` (30 s); calls must not all
    await it and fall back for 30 s while Redis answers new connections at once: a half-open
    connection is caught by the per-call timeout and calls stuck on one never hold up the
    others."""
    proxy = FreezingProxy(server.port)
    sources: list[str] = []

    async def run() -> None:
        r = aredis.Redis(port=proxy.port, socket_timeout=None)
        await r.ping()  # one connection in the client's pool, about to go half-open
        proxy.freeze()
        make: dict[str, Any] = {"policy": ALLOW, "timeout": 0.2, "probe_interval": 0.05}
        lim, decide = async_limiter(kind, r, key, make)
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
