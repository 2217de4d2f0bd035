"""A limiter's own connection pool: the client's settings (address or Unix socket, user,
password, db, client name), the limiter's timeout as its socket timeout and no retries, so
that a take goes to the wire in the caller's thread or task whatever the client's timeouts
and retries. A reply later than the timeout is cut off: an outage for the failure policy,
its grant counted lost (not refunded late). Clients it cannot copy keep the client's path.
The pool closes with the limiter."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import socket
import tempfile
import threading
from typing import Any, Iterator, Optional

import pytest
import redis
import redis.asyncio as aredis
import redis.sentinel
from conftest import NO_RETRY, TINY, Proxy, Server, wait_for
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff

from redis_rl import ALLOW, DENY, AsyncLimiter, Limiter, PrefetchLimiter, ServerError, Source
from redis_rl._call import _takes_command_name

CAP = 100
TIMEOUT = 0.3


class HoldingProxy(Proxy):
    """A proxy (TCP, or a Unix socket at ``path``) that, after ``hold()``, keeps every reply
    from the client until ``release()`` (``held`` is set at the first); ``commands`` counts
    the commands forwarded to the server while holding (a retry would be a second one)."""

    def __init__(self, upstream: int, path: Optional[str] = None) -> None:
        self.upstream = upstream
        self.path = path
        self._hold = False
        self.commands = 0
        self.held = threading.Event()
        self._release = threading.Event()
        if path is None:
            self.listener = socket.socket()
            self.listener.bind(("127.0.0.1", 0))
            self.port = self.listener.getsockname()[1]
        else:
            self.listener = socket.socket(socket.AF_UNIX)
            self.listener.bind(path)
            self.port = 0
        self.listener.listen(64)
        self.accepted = 0
        self.sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def hold(self) -> None:
        self.held.clear()
        self._release.clear()
        self.commands = 0
        self._hold = True

    def release(self) -> None:
        self._hold = False
        self._release.set()

    def _forward(self, b: socket.socket, data: bytes, to_client: bool) -> None:
        if not to_client and self._hold:
            self.commands += data.count(b"RL.") + data.count(b"FCALL")
        if to_client and self._hold:
            self.held.set()
            self._release.wait()
        b.sendall(data)


def _client(proxy: HoldingProxy, setup: str, asyncio_: bool = False, **kwargs: Any) -> Any:
    """``default``: redis-py's defaults (no socket timeout, retries on); ``recommended``: the
    README's (socket timeouts within the limiter's, no retries)."""
    if setup == "recommended":
        retry: Any = AsyncRetry(NoBackoff(), 0) if asyncio_ else NO_RETRY
        kwargs.update(socket_timeout=0.1, socket_connect_timeout=0.1, retry=retry)
    where: dict[str, Any] = {"unix_socket_path": proxy.path} if proxy.path else {"port": proxy.port}
    return (aredis.Redis if asyncio_ else redis.Redis)(**where, **kwargs)


@contextlib.contextmanager
def _proxy(server: Server, transport: str) -> Iterator[HoldingProxy]:
    with tempfile.TemporaryDirectory() as tmp:
        proxy = HoldingProxy(
            server.port, os.path.join(tmp, "p.sock") if transport == "unix" else None
        )
        try:
            yield proxy
        finally:
            proxy.release()
            proxy.close()


def _level(server: Server, key: str, backend: str) -> float:
    peek = Limiter(server.client(), key, TINY, CAP, backend=backend).peek()
    return float(CAP) if peek is None else peek.tokens


@pytest.mark.parametrize("backend", ["module", "functions"])
@pytest.mark.parametrize("transport", ["tcp", "unix"])
@pytest.mark.parametrize("setup", ["default", "recommended"])
@pytest.mark.parametrize("kind", ["limiter", "async-limiter", "prefetch"])
def test_a_reply_later_than_the_timeout_is_cut_and_counted_lost(
    request: pytest.FixtureRequest, key: str, kind: str, setup: str, transport: str, backend: str
) -> None:
    server: Server = request.getfixturevalue("server" if backend == "module" else "fserver")
    policy = DENY if backend == "module" else ALLOW  # either decides, by the policy
    with _proxy(server, transport) as proxy:
        opts: dict[str, Any] = dict(timeout=TIMEOUT, policy=policy, backend=backend)
        n = 1
        lim: Any
        if kind == "limiter":
            lim = Limiter(_client(proxy, setup), key, TINY, CAP, **opts)
        elif kind == "prefetch":
            lim = PrefetchLimiter(_client(proxy, setup), key, TINY, CAP, batch=10, **opts)
            n = 10  # the batch's 9 left are not enough: a lease call
        else:
            lim = AsyncLimiter(_client(proxy, setup, True), key, TINY, CAP, **opts)
        assert lim._call.own is not None

        async def ahold() -> Any:
            assert (await lim.take()).source is Source.SERVER
            proxy.hold()
            d = await lim.take(n)
            await lim.aclose()
            return d

        if kind.startswith("async"):
            d = asyncio.run(ahold())
        else:
            assert lim.take().source is Source.SERVER
            before = _level(server, key, backend)
            proxy.hold()
            d = lim.take(n)
        assert proxy.held.is_set()
        # The wire judged the call: an outage, decided by the policy, never refunded late.
        assert d.source is Source.FALLBACK
        assert d.granted == (policy is ALLOW), d
        proxy.release()
        m = lim.metrics.snapshot()
        lost = "leases_lost" if kind == "prefetch" else "takes_lost"
        assert m[lost] == 1, m
        assert m["redis_timeouts"] == 1, m
        assert m["tokens_returned"] == 0, m
        assert proxy.commands == 1, "sent once: no retries"
        if not kind.startswith("async"):
            # The held call ran on the server and its tokens are gone.
            assert _level(server, key, backend) == pytest.approx(before - n, abs=1e-3)
            lim.close()


def _connections(server: Server, name: str) -> int:
    return sum(c.get("name") == name for c in server.client().client_list())


@pytest.mark.parametrize("kind", ["limiter", "prefetch", "async-limiter"])
@pytest.mark.parametrize("how", ["close", "dropped"])
def test_the_own_pool_closes_with_the_limiter(
    server: Server, key: str, kind: str, how: str
) -> None:
    name = f"own-{kind}-{how}"
    if kind == "async-limiter":

        async def run() -> None:
            lim = AsyncLimiter(aredis.Redis(port=server.port, client_name=name), key, TINY, CAP)
            assert (await lim.take()).source is Source.SERVER
            assert _connections(server, name) == 1
            if how == "close":
                await lim.aclose()
            else:
                del lim
                gc.collect()  # schedules the closing on this loop
            for _ in range(1500):  # a state, polled with the loop running
                if _connections(server, name) == 0:
                    return
                await asyncio.sleep(0.01)
            raise AssertionError("never happened: the own pool closed")

        asyncio.run(run())
        return
    lim: Any
    if kind == "limiter":
        lim = Limiter(redis.Redis(port=server.port, client_name=name), key, TINY, CAP)
    else:
        lim = PrefetchLimiter(redis.Redis(port=server.port, client_name=name), key, TINY, CAP)
    assert lim.take().source is Source.SERVER
    assert _connections(server, name) == 1  # the limiter's own; the client's never opened
    if how == "close":
        lim.close()
    else:
        del lim
        gc.collect()
    wait_for(lambda: _connections(server, name) == 0, "the own pool closed")


def test_the_own_pool_copies_the_clients_settings(server: Server, key: str) -> None:
    admin = server.client()
    admin.execute_command("ACL", "SETUSER", "own", "on", ">secret", "~*", "+@all")
    try:
        r = redis.Redis(
            port=server.port, username="own", password="secret", db=3, client_name="copied"
        )
        with Limiter(r, key, TINY, CAP, timeout=TIMEOUT) as lim:
            assert lim.take().source is Source.SERVER
            pool = lim._call.own.pool
            conn = pool.get_connection(*(("PING",) if _takes_command_name(pool) else ()))
            try:
                assert conn.socket_timeout == TIMEOUT
                assert conn.retry._retries == 0  # get_retries() came in redis-py 5.1
            finally:
                lim._call.own.pool.release(conn)
            [info] = [c for c in admin.client_list() if c.get("name") == "copied"]
            assert info["user"] == "own" and info["db"] == "3", info
        assert redis.Redis(port=server.port, db=3).exists(key) == 1
        # A wrong password is the server's refusal, never an outage (no retries to hide it).
        bad = redis.Redis(port=server.port, username="own", password="wrong")
        with pytest.raises(ServerError):
            Limiter(bad, key, TINY, CAP, timeout=TIMEOUT, policy=ALLOW).take()
    finally:
        admin.execute_command("ACL", "DELUSER", "own")


class _Counting(redis.Connection):
    """A connection class of the user's own (it may do anything on connect)."""


class _Traced(redis.Redis):
    def execute_command(self, *args: Any, **options: Any) -> Any:
        return super().execute_command(*args, **options)


def test_clients_that_cannot_be_copied_keep_their_own_path(server: Server, key: str) -> None:
    sentinel = redis.sentinel.Sentinel([("127.0.0.1", 1)]).master_for("mymaster")
    custom = redis.Redis(
        connection_pool=redis.ConnectionPool(port=server.port, connection_class=_Counting)
    )
    traced = _Traced(port=server.port)
    for client in (sentinel, custom, traced):
        assert Limiter(client, key, TINY, CAP)._call.own is None, client
    for client in (custom, traced):  # still limited, on the client's path
        assert Limiter(client, key, TINY, CAP).take().source is Source.SERVER
    assert Limiter(server.client(), key, TINY, CAP, timeout=None)._call.own is None


def test_limiters_on_one_client_share_one_own_pool(server: Server, key: str) -> None:
    """Limiters on one client with one timeout share their own pool (many limiters are not
    many connections each); it closes with the last of them."""
    name = "own-shared"
    r = redis.Redis(port=server.port, client_name=name)
    a = Limiter(r, key, TINY, CAP)
    b = PrefetchLimiter(r, key + ":b", TINY, CAP)
    other = Limiter(r, key, TINY, CAP, timeout=1.0)  # another timeout: a pool of its own
    assert a._call.own.pool is b._call.own.pool
    assert other._call.own.pool is not a._call.own.pool
    for lim in (a, b, a, b):
        assert lim.take().source in (Source.SERVER, Source.LEASE)
    assert _connections(server, name) == 1
    a.close()
    a.close()  # once only: b's pool stays open
    assert _connections(server, name) == 1
    leases = b.metrics["leases"]
    assert b.take(CAP // 2).granted  # more than held: a lease call
    assert b.metrics["leases"] == leases + 1
    b.close()
    assert _connections(server, name) == 0
    assert other.take().source is Source.SERVER
    assert _connections(server, name) == 1
    del other
    gc.collect()
    wait_for(lambda: _connections(server, name) == 0, "the last pool closed")
