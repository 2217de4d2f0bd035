"""Sending one command with a timeout, and resolving the backend, for sync and asyncio clients.

What counts as an outage (the failure policy decides then): no connection, a timeout, a
cluster that says it is down. Everything else Redis answers (``WRONGTYPE``, ``ERR too many
live leases``, an unknown command, any ``-ERR``) is a :class:`ServerError`, raised to the
caller and counted in ``server_errors``, never a policy decision.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import inspect
import os
import queue
import sys
import threading
import time
import weakref
from typing import Any, Awaitable, Callable, NoReturn, Optional, Tuple

import redis
import redis.asyncio
import redis.exceptions
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.retry import Retry

from . import _protocol as p
from .errors import BackendNotFound, ServerError
from .metrics import Metrics

#: What counts as Redis being unavailable (the failure policy decides then): the same
#: list as the Rust client's (connection failures, timeouts, LOADING, MASTERDOWN,
#: CLUSTERDOWN, TRYAGAIN, READONLY).
OUTAGES = (
    redis.exceptions.ConnectionError,  # BusyLoadingError and AuthenticationError included
    redis.exceptions.TimeoutError,
    redis.exceptions.ClusterDownError,  # CLUSTERDOWN, MASTERDOWN
    redis.exceptions.TryAgainError,  # TRYAGAIN: a cluster slot moving
    redis.exceptions.ReadOnlyError,  # READONLY: a failover demoted the master
    OSError,
    asyncio.TimeoutError,
    concurrent.futures.TimeoutError,
)
TIMEOUTS = (redis.exceptions.TimeoutError, asyncio.TimeoutError, concurrent.futures.TimeoutError)
#: Error replies that redis-py raises as a ``ConnectionError``: ``WRONGPASS`` and
#: ``NOAUTH`` (``AuthenticationError``) are the server refusing this client's credentials, a
#: misconfiguration it answered, not an outage: raised as :class:`ServerError`, never decided
#: by the policy (a wrong password must not fail open). Catch them before :data:`OUTAGES`.
NOT_OUTAGES = (redis.exceptions.AuthenticationError,)


def unknown_outcome(e: BaseException) -> bool:
    """Whether an outage may have struck after the command reached the server: it may have
    run, its reply lost (a read that timed out, a connection reset or closed mid-reply).
    Only a failure to connect, or an error reply standing for one (``LOADING``, a refused
    password), says it was never run. A grant in such a reply is gone: counted as lost."""
    if isinstance(e, (redis.exceptions.BusyLoadingError, *NOT_OUTAGES)):
        return False
    if isinstance(e, (redis.exceptions.TimeoutError, redis.exceptions.ConnectionError)):
        return "connecting" not in str(e)
    return False


_Work = Tuple[concurrent.futures.Future[Any], Callable[..., Any], Tuple[Any, ...], dict[str, Any]]


class CallPool:
    """Threads that run calls for callers who stop waiting at their timeout.

    A call blocked on a half-open connection (a peer gone without a FIN, a client without
    ``socket_timeout``) holds its thread until the socket fails, maybe forever. A fixed
    pool would queue every later call of every limiter behind such threads, and all of
    them would fall back though Redis answers new connections. So a call that finds no
    idle thread gets a new one (up to ``MAX_THREADS``), and a thread idle for
    ``IDLE_SECONDS`` exits: the pool is as large as the calls in flight, stuck or not.

    The threads are daemons, so a stuck call never keeps the process from exiting; at
    exit the pool waits up to ``EXIT_WAIT_SECONDS`` for work already submitted (a dropped
    prefetching limiter giving back its leftovers, a late grant being refunded).
    """

    MAX_THREADS = 64
    IDLE_SECONDS = 30.0
    EXIT_WAIT_SECONDS = 5.0

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._finished = threading.Condition(self._lock)
        self._work: queue.SimpleQueue[_Work] = queue.SimpleQueue()
        self._threads = 0
        self._idle = 0
        self._queued = 0
        self._unfinished = 0  # submitted, not yet run to the end

    def submit(
        self, fn: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> concurrent.futures.Future[Any]:
        """Runs ``fn(*args, **kwargs)`` on an idle thread (a new one if none is idle, up to
        ``MAX_THREADS``); answers its future."""
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        with self._lock:
            self._work.put((future, fn, args, kwargs))
            self._queued += 1
            self._unfinished += 1
            if self._queued > self._idle and self._threads < self.MAX_THREADS:
                self._threads += 1
                threading.Thread(target=self._run, name="redis-rl-call", daemon=True).start()
        return future

    @property
    def threads(self) -> int:
        """The pool's threads right now (running or idle)."""
        return self._threads

    def drain(self, timeout: float) -> bool:
        """Waits up to ``timeout`` seconds until everything submitted has run."""
        with self._finished:
            return self._finished.wait_for(lambda: self._unfinished == 0, timeout)

    def _run(self) -> None:
        while True:
            with self._lock:
                self._idle += 1
            work: Optional[_Work]
            try:
                work = self._work.get(timeout=self.IDLE_SECONDS)
            except queue.Empty:
                work = None
            with self._lock:
                self._idle -= 1
                if work is None:
                    # Nothing came: exit, unless work was queued just now with this thread
                    # counted as idle (then it takes that work).
                    if self._queued <= self._idle:
                        self._threads -= 1
                        return
                    continue
                self._queued -= 1
            future, fn, args, kwargs = work
            if future.set_running_or_notify_cancel():  # else the caller cancelled it
                try:
                    future.set_result(fn(*args, **kwargs))
                except BaseException as e:  # handed to the caller, like ThreadPoolExecutor
                    future.set_exception(e)
            del work, future, fn, args, kwargs
            with self._finished:
                self._unfinished -= 1
                if self._unfinished == 0:
                    self._finished.notify_all()


_pool_lock = threading.Lock()
_the_pool: Optional[CallPool] = None


def _forget_pool_in_child() -> None:
    """A forked child (a gunicorn or multiprocessing worker) inherits the pool object but
    none of its threads: work submitted to it would never run and every call would time
    out. The child starts a pool of its own on first use instead."""
    global _the_pool, _pool_lock, _own_lock
    _the_pool = None
    _pool_lock = threading.Lock()  # the parent may have held it while forking
    _own_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool_in_child)


#: Objects whose ``_at_exit()`` runs at exit, before the pool is drained: prefetching
#: limiters still alive then (a module-level limiter is dropped only after the exit hooks,
#: when the pool's threads no longer run) submit the return of their leftovers there.
at_exit: weakref.WeakSet[Any] = weakref.WeakSet()


@atexit.register
def _drain_at_exit() -> None:
    for obj in list(at_exit):
        with contextlib.suppress(Exception):  # best effort; the next one still runs
            obj._at_exit()
    pool = _the_pool
    if pool is not None:
        pool.drain(CallPool.EXIT_WAIT_SECONDS)


def _pool() -> CallPool:
    global _the_pool
    with _pool_lock:
        if _the_pool is None:
            _the_pool = CallPool()
        return _the_pool


def now() -> float:
    """The monotonic clock every deadline here is on."""
    return time.monotonic()


def server_error(e: BaseException) -> ServerError:
    """The :class:`ServerError` for an error reply (a missing module or library gets
    :class:`BackendNotFound`, naming the fix)."""
    text = str(e)
    low = text.lower()
    if "unknown command" in low or "function not found" in low:
        return BackendNotFound(f"{text} -- {p.NO_BACKEND}")
    return ServerError(text)


def _connection_kwargs(client: Any) -> Optional[dict[str, Any]]:
    for owner in ("connection_pool", "nodes_manager"):
        kwargs = getattr(getattr(client, owner, None), "connection_kwargs", None)
        if isinstance(kwargs, dict):
            return kwargs
    return None


def socket_timeout(client: Any) -> Optional[float]:
    """The client's own socket timeout, if it has one (``redis.Redis``, ``RedisCluster``)."""
    kwargs = _connection_kwargs(client)
    if kwargs is not None:
        value = kwargs.get("socket_timeout")
        return float(value) if value is not None else None
    return None


#: Pools whose ``get_connection`` waits (up to the pool's ``timeout``, 20 s by default; ``None``:
#: forever) for a connection another call holds.
_WAITING_POOLS = (redis.BlockingConnectionPool, redis.asyncio.BlockingConnectionPool)


def worst_case(client: Any) -> Optional[float]:
    """How long one command on a client can take at most (a wait for a pooled connection,
    connect, command; no retries), or ``None`` if unbounded (no socket timeout, retries
    configured: redis-py retries timeouts 3 times by default, with backoff; a pool that
    waits for a free connection without end)."""
    kwargs = _connection_kwargs(client)
    if kwargs is None:
        return None
    st = kwargs.get("socket_timeout")
    if st is None:
        return None
    ct = kwargs.get("socket_connect_timeout")
    ct = st if ct is None else ct
    get_retry = getattr(client, "get_retry", None)
    try:
        retry = get_retry() if callable(get_retry) else kwargs.get("retry")
    except AttributeError:  # redis-py 5.0's RedisCluster built without a retry
        return None
    retries = getattr(retry, "get_retries", lambda: 0)() if retry is not None else 0
    if retries != 0:
        return None
    pool = getattr(client, "connection_pool", None)
    wait = pool.timeout if isinstance(pool, _WAITING_POOLS) else 0.0
    if wait is None:
        return None
    return float(st) + float(ct) + float(wait)


def _unretried_connection(client: Any, retry: Any) -> Any:
    """A new connection with ``client``'s settings but ``retry``, or ``None`` for clients
    without a plain connection pool. Cluster clients are not checked: they give up on a
    refusal at once (``RedisClusterException``, see :func:`execute`) instead of retrying
    it past the timeout."""
    pool = getattr(client, "connection_pool", None)
    connection_class = getattr(pool, "connection_class", None)
    kwargs = getattr(pool, "connection_kwargs", None)
    if connection_class is None or not isinstance(kwargs, dict):
        return None
    return connection_class(**{**kwargs, "retry": retry})


#: What a limiter's own pool copies from its client's: the plain redis-py client, pool and
#: connection classes (sync, then asyncio). Anything else (a cluster or Sentinel client, a
#: pool or connection class of the user's own, an instrumented ``execute_command``) keeps
#: the client's own path.
_PLAIN_SYNC: Tuple[Any, Any, Any] = (
    redis.Redis.execute_command,
    (redis.ConnectionPool, redis.BlockingConnectionPool),
    (redis.Connection, redis.SSLConnection, redis.UnixDomainSocketConnection),
)
_PLAIN_ASYNC: Tuple[Any, Any, Any] = (
    redis.asyncio.Redis.execute_command,
    (redis.asyncio.ConnectionPool, redis.asyncio.BlockingConnectionPool),
    (
        redis.asyncio.Connection,
        redis.asyncio.SSLConnection,
        redis.asyncio.UnixDomainSocketConnection,
    ),
)

#: A limiter's own pool opens a connection per caller at once (a thread, a task), never
#: makes one wait for another's: "too many connections" would be a false outage.
OWN_MAX_CONNECTIONS = 1 << 16

#: What a new pool adds to its connections' settings itself (handlers and registries tied
#: to that pool, the settings it started with), per (pool class, connection class).
_internals: dict[Tuple[Any, Any], frozenset[str]] = {}


def _pool_internals(pool_class: Any, connection_class: Any) -> frozenset[str]:
    keys = _internals.get((pool_class, connection_class))
    if keys is None:
        keys = frozenset(pool_class(connection_class=connection_class).connection_kwargs)
        _internals[(pool_class, connection_class)] = keys
    return keys


_kept: dict[Any, Any] = {}


def _keeping_timeout(cls: Any) -> Any:
    """``cls`` keeping the socket timeout it is given: redis-py 5.0's Unix-socket connection
    sets it, then its base class's ``__init__`` sets it back to ``None`` (no timeout)."""
    kept: Any = _kept.get(cls)
    if kept is None:

        class Kept(cls):  # type: ignore[misc]
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, **kwargs)
                self.socket_timeout = kwargs.get("socket_timeout")

        Kept.__name__ = Kept.__qualname__ = cls.__name__
        kept = _kept[cls] = Kept
    return kept


def own_pool(client: Any, timeout: Optional[float]) -> Any:
    """A connection pool of a limiter's own: ``client``'s connection settings (host and
    port or Unix socket, password, username, db, TLS, client name...), but ``timeout`` as
    the socket timeout (and at most the connect timeout) and no retries. A call on it goes
    to the wire in the caller's thread or task and the wire judges it: a reply later than
    ``timeout`` is cut off (an outage, its grant lost). ``None`` for a client whose
    connections cannot be copied (see ``_PLAIN_SYNC``), or no ``timeout``."""
    if timeout is None:
        return None
    if isinstance(client, redis.asyncio.Redis):
        plain, pools, connections = _PLAIN_ASYNC
        retry: Any = AsyncRetry(NoBackoff(), 0)
    elif isinstance(client, redis.Redis):
        plain, pools, connections = _PLAIN_SYNC
        retry = Retry(NoBackoff(), 0)
    else:
        return None
    pool = getattr(client, "connection_pool", None)
    cls: Any = getattr(pool, "connection_class", None)
    kwargs = getattr(pool, "connection_kwargs", None)
    if (
        type(client).execute_command is not plain
        or type(pool) not in pools
        or cls not in connections
        or not isinstance(kwargs, dict)
    ):
        return None
    try:
        internals = _pool_internals(pools[0], cls)
        settings = {k: v for k, v in kwargs.items() if k not in internals}
        settings["socket_timeout"] = timeout
        connect = settings.get("socket_connect_timeout")
        settings["socket_connect_timeout"] = timeout if connect is None else min(connect, timeout)
        settings["retry"] = retry
        if "retry_on_timeout" in settings:
            settings["retry_on_timeout"] = False
        if "retry_on_error" in settings:
            settings["retry_on_error"] = []
        try:
            probe = cls(**settings)  # refused settings show here, not on the first call
        except TypeError:  # a connection class without a connect timeout of its own
            del settings["socket_connect_timeout"]
            probe = cls(**settings)
        if getattr(probe, "socket_timeout", timeout) != timeout:
            cls = _keeping_timeout(cls)
            if cls(**settings).socket_timeout != timeout:
                return None
        return pools[0](connection_class=cls, max_connections=OWN_MAX_CONNECTIONS, **settings)
    except Exception:  # settings this version of redis-py cannot copy: the client's path
        return None


_own_lock = threading.Lock()
#: The own pools in use, per client pool and timeout, with how many callers use each: the
#: limiters built on one client with one timeout share one pool (as they would share the
#: client's), so that many limiters do not mean many connections each.
_own_pools: weakref.WeakKeyDictionary[Any, dict[float, list[Any]]] = weakref.WeakKeyDictionary()


def shared_own_pool(client: Any, timeout: Optional[float]) -> Any:
    """:func:`own_pool` for ``client`` and ``timeout``, shared with the other callers on the
    same client pool and timeout; every caller that gets one hands it back with
    :func:`let_go`. ``None`` where :func:`own_pool` answers ``None``."""
    user = getattr(client, "connection_pool", None)
    if timeout is None or user is None:
        return None
    with _own_lock:
        entry = _own_pools.get(user, {}).get(timeout)
        if entry is not None:
            entry[1] += 1
            return entry[0]
    pool = own_pool(client, timeout)
    if pool is None:
        return None
    with _own_lock:
        by_timeout = _own_pools.setdefault(user, {})
        entry = by_timeout.get(timeout)
        if entry is not None:  # another caller made one meanwhile (this one never connected)
            entry[1] += 1
            return entry[0]
        by_timeout[timeout] = [pool, 1]
    return pool


def let_go(client: Any, timeout: float, pool: Any) -> bool:
    """A caller is done with ``pool`` (from :func:`shared_own_pool`): whether it was the
    last, so that its connections are to be closed."""
    user = getattr(client, "connection_pool", None)
    with _own_lock:
        by_timeout = _own_pools.get(user) if user is not None else None
        entry = by_timeout.get(timeout) if by_timeout is not None else None
        if entry is None or entry[0] is not pool:
            return True
        entry[1] -= 1
        if entry[1] > 0:
            return False
        assert by_timeout is not None
        del by_timeout[timeout]
        return True


def not_sent(e: BaseException) -> BaseException:
    """A failure to get a connected connection from a pool, as the error to raise: the
    command was never sent, so the message says "connecting" (:func:`unknown_outcome`:
    nothing lost). A refusal of the credentials that redis.asyncio wraps in a bare
    ``ConnectionError`` (a Unix socket) is raised as itself (an error reply, no outage)."""
    if isinstance(e.__cause__, NOT_OUTAGES) and not isinstance(e, NOT_OUTAGES):
        return e.__cause__
    if isinstance(e, (*NOT_OUTAGES, redis.exceptions.BusyLoadingError)) or "connecting" in str(e):
        return e
    if isinstance(e, (redis.exceptions.TimeoutError, redis.exceptions.ConnectionError)):
        try:
            return type(e)(f"{e} (connecting: the command was not sent)")
        except Exception:  # a subclass that wants other arguments
            return e
    return e


class OwnPool:
    """Sends one command at a time on a limiter's own pool (:func:`own_pool`), in the
    caller's thread: a connection from the pool (connected if new: the connect timeout
    and each reply of the handshake within the timeout), the command, its reply within
    the timeout, the connection back. A read that fails or times out closes its
    connection (the reply is never read: its grant is lost, the caller counts it)."""

    def __init__(self, pool: Any, timeout: float, callbacks: Any) -> None:
        self.pool = pool
        self.timeout = timeout
        #: The client's reply parsers by command name (as its ``execute_command`` applies).
        self.callbacks = callbacks if isinstance(callbacks, dict) else {}
        self._named = _takes_command_name(pool)

    def __call__(self, args: p.Args) -> Any:
        pool = self.pool
        try:
            conn = pool.get_connection(args[0]) if self._named else pool.get_connection()
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as e:
            raise not_sent(e) from e
        try:
            conn.send_command(*args)
            reply = conn.read_response()
        except redis.exceptions.ResponseError:
            pool.release(conn)  # an error reply, read whole: the connection is ready
            raise
        except BaseException:
            conn.disconnect()  # the reply, if any, may still come on it
            pool.release(conn)
            raise
        pool.release(conn)
        parse = self.callbacks.get(args[0])
        return reply if parse is None else parse(reply)

    def packed(self, name: str, packed: bytes) -> Any:
        """As a call, the command ``name`` already packed as RESP (by the client core: no
        packing in Python), its reply unparsed by the client's callbacks."""
        pool = self.pool
        try:
            conn = pool.get_connection(name) if self._named else pool.get_connection()
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as e:
            raise not_sent(e) from e
        try:
            conn.send_packed_command([packed])
            reply = conn.read_response()
        except redis.exceptions.ResponseError:
            pool.release(conn)
            raise
        except BaseException:
            conn.disconnect()
            pool.release(conn)
            raise
        pool.release(conn)
        return reply

    def close(self) -> None:
        """Closes the pool's idle connections (a later call opens a new one). A connection
        in use is left to finish its call (a take racing ``close()`` on another thread):
        closing it under that call would fail it with an error that is neither a decision
        nor :class:`LimiterClosed`, and a lease it was asking for would be lost; it closes
        when the pool is dropped."""
        self.pool.disconnect(inuse_connections=False)


def check_credentials(client: Any) -> None:
    """Connects once with ``client``'s settings but no retries, sends PING and closes: the
    server's answer to its credentials (``WRONGPASS`` at AUTH / HELLO, ``NOAUTH`` at the
    PING) in one try. redis-py counts a refusal as a ``ConnectionError`` and its default
    retries repeat it with backoff for seconds, longer than a limiter waits: without this
    check a wrong password looks like an outage, and ALLOW fails open on it."""
    conn = _unretried_connection(client, Retry(NoBackoff(), 0))
    if conn is None:
        return
    try:
        conn.connect()
        conn.send_command("PING")
        # An answer past the credentials (a user without PING gets NOPERM): passed.
        with contextlib.suppress(redis.exceptions.ResponseError):
            conn.read_response()
    finally:
        conn.disconnect()


async def acheck_credentials(client: Any) -> None:
    """:func:`check_credentials` for an asyncio client."""
    conn = _unretried_connection(client, AsyncRetry(NoBackoff(), 0))
    if conn is None:
        return
    try:
        await conn.connect()
        await conn.send_command("PING")
        # An answer past the credentials (a user without PING gets NOPERM): passed.
        with contextlib.suppress(redis.exceptions.ResponseError):
            await conn.read_response()
    except redis.exceptions.ConnectionError as e:
        # redis.asyncio wraps a refusal during a Unix-socket connect in a bare
        # ConnectionError: the refusal it stands for.
        if isinstance(e.__cause__, NOT_OUTAGES) and not isinstance(e, NOT_OUTAGES):
            raise e.__cause__ from e
        raise
    finally:
        await conn.disconnect()


def _plain(e: redis.exceptions.RedisClusterException) -> BaseException:
    """A cluster client's "cannot be connected" (``RedisClusterException``, not a
    ``RedisError``) as what it stands for: the error that caused it (a refused password:
    an error reply, not an outage), else a ``ConnectionError`` (an outage)."""
    cause = e.__cause__ or e.__context__
    if isinstance(cause, redis.exceptions.RedisError):
        return type(cause)(*cause.args)
    return redis.exceptions.ConnectionError(str(e))


def execute(client: Any, *args: Any, **options: Any) -> Any:
    """``client.execute_command`` with a cluster client's failures as plain ones."""
    try:
        return client.execute_command(*args, **options)
    except redis.exceptions.RedisClusterException as e:
        raise _plain(e) from e


async def aexecute(client: Any, *args: Any, **options: Any) -> Any:
    """:func:`execute` for an asyncio client."""
    try:
        return await client.execute_command(*args, **options)
    except redis.exceptions.RedisClusterException as e:
        raise _plain(e) from e


class _Caller:
    """What both callers share: the timeout, the counters, the credentials checks, and how
    a call's exception is counted and raised."""

    def __init__(
        self, client: Any, timeout: Optional[float], metrics: Metrics, checks: bool
    ) -> None:
        self.client = client
        self.timeout = timeout
        self.metrics = metrics
        #: Whether this caller checks credentials, and must before its next call.
        self._checks = self._check = checks
        #: Checks passed so far (see :meth:`failed`).
        self.checks_passed = 0

    def deadline(self) -> Optional[float]:
        """When a call starting now must end (``None``: no timeout)."""
        return None if self.timeout is None else now() + self.timeout

    def failed(self, passed: int) -> None:
        """An outage of a call that started when ``checks_passed`` was ``passed``: the
        credentials are checked again before the next call, unless a check passed since
        (they were accepted during this very call: re-checking would put the check's
        connection in front of every call, and a call needing longer than ``timeout`` with
        it would time out forever though Redis answers each call within it)."""
        if self.checks_passed == passed:
            self._check = self._checks

    def sort(self, e: BaseException, passed: int) -> NoReturn:
        """Counts a call's exception and raises it as what it is: a refusal of the
        credentials or an error reply as :class:`ServerError`, an outage as itself."""
        if isinstance(e, redis.exceptions.RedisClusterException):
            plain = _plain(e)
            plain.__cause__ = e
            e = plain
        if isinstance(e.__cause__, NOT_OUTAGES) and not isinstance(e, NOT_OUTAGES):
            e = e.__cause__  # a refusal redis.asyncio wrapped in a bare ConnectionError
        if isinstance(e, NOT_OUTAGES):
            self.metrics.add("server_errors")
            raise server_error(e) from e
        if isinstance(e, TIMEOUTS):
            self.metrics.add("redis_timeouts")
            self.metrics.add("redis_errors")
            self.failed(passed)
            raise e
        if isinstance(e, OUTAGES):
            self.metrics.add("redis_errors")
            self.failed(passed)
            raise e
        if isinstance(e, redis.exceptions.RedisError):
            self.metrics.add("server_errors")
            raise server_error(e) from e
        raise e


class SyncCaller(_Caller):
    """Sends commands on a synchronous client, each within ``timeout`` seconds.

    When the client cannot take longer than ``timeout`` by itself (``socket_timeout`` plus
    ``socket_connect_timeout`` at most ``timeout``, retries off) the call is made in the
    caller's thread (the cheap path); otherwise it runs on the shared call pool and the
    caller stops waiting at ``timeout``. On that path the client's credentials are checked
    without retries (:func:`check_credentials`) before the first call and before the first
    call after an outage (a timeout there may have been a refusal retried, say after a
    password rotation): a refusal is a :class:`ServerError`, never an outage.
    """

    def __init__(
        self, client: Any, timeout: Optional[float], metrics: Metrics, own: bool = False
    ) -> None:
        #: ``own``: calls go on a pool of the caller's own (:func:`own_pool`) where the
        #: client's settings can be copied, whatever its timeouts and retries.
        pool = shared_own_pool(client, timeout) if own else None
        self.own = (
            None
            if pool is None or timeout is None
            else OwnPool(pool, timeout, getattr(client, "response_callbacks", None))
        )
        self._let_go = False
        worst = worst_case(client)
        self.direct = (
            timeout is None or self.own is not None or (worst is not None and worst <= timeout)
        )
        super().__init__(client, timeout, metrics, checks=not self.direct)  # the pooled path

    def close(self) -> None:
        """Lets go of the caller's own pool, if it has one, and closes its connections if
        no other caller uses it (once; a later call opens a connection again)."""
        own = self.own
        if own is None or self._let_go:
            return
        self._let_go = True
        if let_go(self.client, own.timeout, own.pool):
            own.close()

    def send(self, args: p.Args) -> Any:
        """The call in this thread, on the own pool if there is one, else on the client (no
        timeout of ours, no counting)."""
        if self.own is not None:
            return self.own(args)
        return execute(self.client, *args)

    def check(self) -> None:
        """Checks the credentials if due (:func:`check_credentials`; raises the refusal).
        Prefetching limiters call this in their lease jobs before the lease call."""
        if self._check:
            check_credentials(self.client)
            self.checks_passed += 1
            self._check = False

    def _send(self, args: p.Args, options: dict[str, Any]) -> Any:
        """The pooled call: credentials first if due, in the same job, so a call whose
        caller stops waiting during the check is still sent (and refunded) as before."""
        self.check()
        return execute(self.client, *args, **options)

    def remaining(self, deadline: Optional[float]) -> Optional[float]:
        """Seconds left until ``deadline`` (never negative); the whole timeout without one."""
        if deadline is None:
            return self.timeout
        return max(0.0, deadline - now())

    def __call__(
        self,
        args: p.Args,
        deadline: Optional[float] = None,
        late: Optional[Callable[[Any], None]] = None,
        reply_errors: bool = False,
        count: bool = True,
        **options: Any,
    ) -> Any:
        """The reply, within the timeout. ``late``: what to do with a reply that comes after
        the caller stopped waiting (say, refund a grant nobody will use); it runs on the
        pool. ``reply_errors``: an error reply is returned (the exception), not raised.
        ``count``: count the call in ``redis_calls`` (a limiter's take counts it with its
        decision)."""
        if count:
            self.metrics.add("redis_calls")
        passed = self.checks_passed
        try:
            if self.direct:
                if self.own is not None and not options:
                    return self.own(args)
                return execute(self.client, *args, **options)
            future = _pool().submit(self._send, args, options)
            try:
                return future.result(self.remaining(deadline))
            except concurrent.futures.TimeoutError:
                if not future.cancel() and late is not None:  # sent: it may still land
                    future.add_done_callback(_on_late(late))
                raise
        except BaseException as e:
            if reply_errors and isinstance(e, redis.exceptions.ResponseError):
                return e
            self.sort(e, passed)

    def run(self, args: p.Args) -> Any:
        """The call in this thread, for a caller whose client bounds it (``direct``): no
        pool, no timer. Not counted in ``redis_calls`` (the caller counts it)."""
        try:
            if self.own is not None:
                return self.own(args)
            return self.client.execute_command(*args)
        except BaseException as e:
            self.sort(e, self.checks_passed)


def _on_late(late: Callable[[Any], None]) -> Callable[[concurrent.futures.Future[Any]], None]:
    def done(future: concurrent.futures.Future[Any]) -> None:
        if not future.cancelled() and future.exception() is None:
            late(future.result())

    return done


#: How long a call whose caller stopped waiting may still land (asyncio; a sync call is
#: bounded by the client's socket timeout).
LATE_LIMIT = 30.0


_EAGER: Any = getattr(asyncio, "eager_task_factory", None)


def _eager(loop: asyncio.AbstractEventLoop, coro: Any) -> asyncio.Task[Any]:
    """A task started at once where Python can (3.12+: it sends its command without
    waiting for a turn of the event loop), else a plain task."""
    if _EAGER is not None:
        task: asyncio.Task[Any] = _EAGER(loop, coro)
        return task
    return loop.create_task(coro)


#: redis.asyncio's own way to send a command: a client whose class sends commands another
#: way (a subclass, an instrumented wrapper) keeps its own path.
_PLAIN_EXECUTE = redis.asyncio.Redis.execute_command


#: The largest command :meth:`AsyncCaller._pooled` sends in the caller's task. Written on a
#: connection with nothing else to send, a command up to the transport's high-water mark
#: (asyncio's default: 64 KiB) is handed to the transport whole without waiting, so a
#: cancellation cannot land in the middle of its write. A larger one (a huge key) may wait
#: for the socket with the command already in the transport's buffer; redis-py closes the
#: connection when that wait is cancelled, and the transport still sends the buffer: the
#: command runs and its reply, a grant, is lost. Such a command goes on a task of its own.
_UNPAUSED = 16 * 1024

#: What :meth:`AsyncCaller._pooled` answers for a command it did not send (larger than
#: ``_UNPAUSED``): the caller sends it on a task of its own.
_TOO_BIG = object()

#: Python 3.11's ``asyncio.wait_for``, which redis-py writes a command under (its socket
#: timeout), returns the command's completion instead of raising a cancellation that lands
#: in the turn between the write and its return: the cancellation is lost, and the take
#: goes on as if never cancelled. The task's count of cancellation requests still shows it.
#: (Python 3.12's wait_for raises it; Python 3.9 and 3.10 have no count to look at.)
_SWALLOWS_CANCEL = (3, 11) <= sys.version_info < (3, 12)


def _own_pool(client: Any) -> Any:
    """The connection pool of a plain ``redis.asyncio.Redis`` (one command per pooled
    connection, as its ``execute_command`` sends it), else ``None``."""
    if not isinstance(client, redis.asyncio.Redis):
        return None
    if type(client).execute_command is not _PLAIN_EXECUTE:
        return None
    if client.single_connection_client or client.connection is not None:
        return None
    pool = client.connection_pool
    if not (
        callable(getattr(pool, "get_connection", None)) and callable(getattr(pool, "release", None))
    ):
        return None
    return pool


def _takes_command_name(pool: Any) -> bool:
    """Whether ``pool.get_connection`` wants the command's name (redis-py before 5.3; later
    versions warn when given one)."""
    try:
        params = list(inspect.signature(pool.get_connection).parameters.values())
    except (TypeError, ValueError):
        return True
    return bool(params) and params[0].default is inspect.Parameter.empty


#: Closings scheduled by :func:`close_soon`, held until done.
_closing: set[asyncio.Future[Any]] = set()


def close_soon(pool: Any) -> None:
    """Closes an asyncio pool's connections from a finalizer (an asyncio limiter dropped
    without ``aclose()``): on the running event loop if there is one, else left to the
    connections' own finalizers."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return
    task = loop.create_task(pool.disconnect())
    _closing.add(task)
    task.add_done_callback(_closing.discard)


async def _ignore(reply: Any) -> None:
    """A late reply nobody has a use for (a call without a late handler)."""


def _expire(waiter: asyncio.Future[Any]) -> None:
    if not waiter.done():
        waiter.set_exception(asyncio.TimeoutError())


class AsyncCaller(_Caller):
    """Sends commands on an asyncio client, each within ``timeout`` seconds."""

    def __init__(
        self, client: Any, timeout: Optional[float], metrics: Metrics, own: bool = False
    ) -> None:
        #: ``own``: calls go on a pool of the caller's own (:func:`own_pool`) where the
        #: client's settings can be copied, whatever its timeouts and retries: the wire
        #: judges each call, in the caller's task.
        pool = shared_own_pool(client, timeout) if own else None
        self._let_go = False
        # Credentials are checked without retries (:func:`acheck_credentials`) before the
        # first call and the first after an outage, as for :class:`SyncCaller` (an own
        # pool has no retries: a refusal is its answer).
        super().__init__(client, timeout, metrics, checks=pool is None)
        self._late: set[asyncio.Future[Any]] = set()
        #: Where calls go: a client on the own pool, else the client.
        self.sender = client
        if pool is not None:
            self.sender = redis.asyncio.Redis(
                connection_pool=pool, retry=AsyncRetry(NoBackoff(), 0)
            )
        self.own = pool
        worst = worst_case(client)
        #: The client cannot take longer than the timeout by itself (socket timeouts, no
        #: retries): no timer of our own.
        self.bounded = (
            timeout is None or pool is not None or (worst is not None and worst <= timeout)
        )
        #: Where calls with a late handler run in the caller's own task (:meth:`_pooled`):
        #: the own pool, else the pool of a plain client whose own timeouts bound the call.
        self._pool = pool if pool is not None else (_own_pool(client) if self.bounded else None)
        self._pool_wants_name = self._pool is not None and _takes_command_name(self._pool)

    def let_go(self) -> bool:
        """Lets go of the own pool (once): whether its connections are to be closed (no
        other caller uses it)."""
        if self.own is None or self._let_go or self.timeout is None:
            return False
        self._let_go = True
        return let_go(self.client, self.timeout, self.own)

    async def aclose(self) -> None:
        """Lets go of the own pool, if there is one, and closes its connections if no other
        caller uses it."""
        own = self.own
        if own is not None and self.let_go():
            # As the synchronous close: a connection in use finishes its call.
            await own.disconnect(inuse_connections=False)

    def close_soon(self) -> None:
        """:meth:`aclose` from a finalizer (see :func:`close_soon`)."""
        if self.let_go():
            close_soon(self.own)

    async def check(self) -> None:
        """As :meth:`SyncCaller.check`."""
        if self._check:
            await acheck_credentials(self.client)
            self.checks_passed += 1
            self._check = False

    async def _send(self, args: p.Args, options: dict[str, Any]) -> Any:
        """The call, credentials first if due (as :meth:`SyncCaller._send`)."""
        if self._check:
            await self.check()
        try:
            return await self.sender.execute_command(*args, **options)
        except redis.exceptions.RedisClusterException as e:
            raise _plain(e) from e

    async def _relay(
        self, args: p.Args, options: dict[str, Any], waiter: asyncio.Future[Any]
    ) -> Tuple[bool, Any]:
        """The call as a task of its own: hands the outcome to ``waiter`` (if the caller
        still waits) and answers ``(ok, reply)`` for a late handler. An error is the
        waiter's to raise, never the task's (nobody retrieves a task's error). The body of
        :meth:`_send`, inlined (one coroutine less per call)."""
        try:
            if self._check:
                await self.check()
            reply = await self.sender.execute_command(*args, **options)
        except Exception as e:
            error: BaseException = e
            if isinstance(e, redis.exceptions.RedisClusterException):
                error = _plain(e)
                error.__cause__ = e
            if not waiter.done():
                waiter.set_exception(error)
            return False, error
        except BaseException:  # the task cancelled (its event loop closing)
            if not waiter.done():
                waiter.cancel()
            raise
        if not waiter.done():
            waiter.set_result(reply)
        return True, reply

    async def _pooled(self, pool: Any, args: p.Args, late: Callable[[Any], Awaitable[None]]) -> Any:
        """The call in the caller's task, on a connection of ``pool``, as the client's
        ``execute_command`` makes it (no retries: the caller is bounded), but with a read
        that a cancellation does not cut off.

        redis.asyncio closes the connection when a read is cancelled, and the reply, a grant
        say, is lost with it. Here the read keeps the connection open when cancelled (its
        parser keeps what it has read so far) and hands the connection to a task of its own
        (:meth:`_finish`) that reads the reply and gives it to ``late``. A cancellation
        before the command is written leaves nothing to read. The cost of a task of its own
        for every call (two more turns of the event loop: a third of a round trip) is paid
        only by the calls that are cancelled."""
        task: Any = None
        if _SWALLOWS_CANCEL:
            task = asyncio.current_task()
            cancels = task.cancelling()
        if self._check:
            await self.check()
        try:
            if self._pool_wants_name:
                conn = await pool.get_connection(args[0])
            else:
                conn = await pool.get_connection()
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as e:
            raise not_sent(e) from e
        sent = False
        try:
            packed = conn.pack_command(*args)
            if (len(packed[0]) if len(packed) == 1 else sum(map(len, packed))) > _UNPAUSED:
                reply = _TOO_BIG
            else:
                await conn.send_packed_command(packed)
                sent = True
                if task is not None and task.cancelling() > cancels:
                    raise asyncio.CancelledError  # swallowed by a wait_for: raised after all
                reply = await conn.read_response(disconnect_on_error=False)
        except asyncio.CancelledError:
            if sent:
                self.keep(asyncio.ensure_future(self._finish(pool, conn, late)))
            else:
                # Not written: a command this small is handed to the transport whole
                # without waiting (_UNPAUSED), or not at all, and redis-py closes the
                # connection when cancelled before that (connecting, a health check).
                await pool.release(conn)
            raise
        except redis.exceptions.ResponseError:
            await pool.release(conn)  # an error reply: the connection is ready for more
            raise
        except BaseException:
            # A timeout or a failed read: the reply, if any, may still come on it.
            await conn.disconnect(nowait=True)
            await pool.release(conn)
            raise
        try:
            await pool.release(conn)
        except asyncio.CancelledError:  # the reply is in hand: hand it over, as above
            if reply is not _TOO_BIG:
                self.keep(asyncio.ensure_future(late(reply)))
            raise
        return reply

    async def _finish(self, pool: Any, conn: Any, late: Callable[[Any], Awaitable[None]]) -> None:
        """Reads the reply of a call whose caller was cancelled, releases the connection
        and hands the reply to ``late``. An error reply leaves nothing to hand; a read that
        fails or outlasts ``LATE_LIMIT`` closes the connection (redis-py's read does)."""
        try:
            reply = await asyncio.wait_for(conn.read_response(), LATE_LIMIT)
        except Exception:
            return
        finally:
            await pool.release(conn)
        await late(reply)

    def keep(self, task: asyncio.Future[Any]) -> None:
        """Holds ``task`` (a late handler, a read handed over) until it is done."""
        self._late.add(task)
        task.add_done_callback(self._late.discard)

    def _later(
        self, task: asyncio.Task[Tuple[bool, Any]], late: Callable[[Any], Awaitable[None]]
    ) -> None:
        """When ``task`` lands, hand its reply to ``late`` (in a task of its own)."""

        def done(t: asyncio.Task[Tuple[bool, Any]]) -> None:
            if not t.cancelled() and t.exception() is None:
                ok, reply = t.result()
                if ok:
                    self.keep(asyncio.ensure_future(late(reply)))

        self.keep(task)
        task.add_done_callback(done)
        handle = asyncio.get_running_loop().call_later(LATE_LIMIT, task.cancel)
        task.add_done_callback(lambda _: handle.cancel())

    async def __call__(
        self,
        args: p.Args,
        deadline: Optional[float] = None,
        late: Optional[Callable[[Any], Awaitable[None]]] = None,
        reply_errors: bool = False,
        count: bool = True,
        **options: Any,
    ) -> Any:
        """The reply, within the timeout. With ``late``, a call whose caller stopped waiting
        (a timeout, a cancellation) still completes, and ``late`` gets its reply (say, to
        refund a grant): in the caller's task with the read handed over when cancelled
        (:meth:`_pooled`: a plain client bounded by its own timeouts), else on a task of its
        own. ``count``: count the call in ``redis_calls`` (a limiter's take counts it with
        its decision)."""
        if count:
            self.metrics.add("redis_calls")
        passed = self.checks_passed
        try:
            if late is None:
                if (
                    self.own is not None
                    and not options
                    and args[0] not in self.client.response_callbacks
                ):
                    reply = await self._pooled(self.own, args, _ignore)
                    if reply is not _TOO_BIG:
                        return reply
                call = self._send(args, options)
                if self.bounded:  # the client's own timeouts end the call in time
                    return await call
                timeout = self.timeout if deadline is None else max(0.0, deadline - now())
                return await asyncio.wait_for(call, timeout)
            pool = self._pool
            if pool is not None and not options and args[0] not in self.client.response_callbacks:
                reply = await self._pooled(pool, args, late)
                if reply is not _TOO_BIG:
                    return reply
            timeout = None
            if not self.bounded:  # else the client's own timeouts end the call in time
                timeout = self.timeout if deadline is None else max(0.0, deadline - now())
            loop = asyncio.get_running_loop()
            waiter = loop.create_future()
            task = _eager(loop, self._relay(args, options, waiter))
            timer = None
            if timeout is not None and not waiter.done():
                timer = loop.call_later(timeout, _expire, waiter)
            try:
                return await waiter  # cancelling this caller cancels the waiter, never the task
            except (asyncio.CancelledError, asyncio.TimeoutError):
                # Even when the task is done: its reply may have come to the waiter in the
                # same turn of the event loop as the cancellation (or the timer), and this
                # caller then never sees it.
                self._later(task, late)
                raise
            finally:
                if timer is not None:
                    timer.cancel()
        except BaseException as e:
            if reply_errors and isinstance(e, redis.exceptions.ResponseError):
                return e
            self.sort(e, passed)


def probe_options(client: Any) -> dict[str, Any]:
    """Keyless probes on a cluster client go to one node (every node loads the same
    module or library)."""
    if hasattr(client, "nodes_manager") and hasattr(client, "get_random_node"):
        return {"target_nodes": client.get_random_node()}
    return {}


def plain_call(client: Any) -> Callable[..., Any]:
    """A caller without timeout or counters (``mtake``, ``permit``): the client's call,
    with the callers' ``reply_errors`` option."""

    def call(args: p.Args, reply_errors: bool = False, **options: Any) -> Any:
        try:
            return execute(client, *args, **options)
        except redis.exceptions.ResponseError as e:
            if reply_errors:
                return e
            raise

    return call


def aplain_call(client: Any) -> Callable[..., Awaitable[Any]]:
    """:func:`plain_call` for an asyncio client."""

    async def call(args: p.Args, reply_errors: bool = False, **options: Any) -> Any:
        try:
            return await aexecute(client, *args, **options)
        except redis.exceptions.ResponseError as e:
            if reply_errors:
                return e
            raise

    return call


def resolve_backend(
    client: Any, call: Callable[..., Any], backend: str, deadline: Optional[float] = None
) -> p.Protocol:
    """The protocol for ``backend``; ``auto`` asks the server (module first) through
    ``call`` (a caller, so the probes have the limiter's timeout)."""
    if backend != p.AUTO:
        return p.Protocol(backend)
    options = probe_options(client)
    if deadline is not None:
        options["deadline"] = deadline
    if p.module_present(call(p.PROBE_MODULE, reply_errors=True, **options)):
        return p.Protocol(p.MODULE)
    has_functions = p.functions_present(call(p.PROBE_FUNCTIONS, reply_errors=True, **options))
    if not has_functions:
        metrics = getattr(call, "metrics", None)
        if isinstance(metrics, Metrics):
            metrics.add("server_errors")  # counted as the error reply it stands for
    return p.Protocol(p.decide_backend(False, has_functions))


async def aresolve_backend(
    client: Any,
    call: Callable[..., Awaitable[Any]],
    backend: str,
    deadline: Optional[float] = None,
) -> p.Protocol:
    """The asyncio twin of :func:`resolve_backend` (an asyncio cluster client learns its nodes
    first)."""
    if backend != p.AUTO:
        return p.Protocol(backend)
    if hasattr(client, "nodes_manager") and asyncio.iscoroutinefunction(
        getattr(client, "initialize", None)
    ):
        await client.initialize()  # an asyncio cluster client learns its nodes lazily
    options = probe_options(client)
    if deadline is not None:
        options["deadline"] = deadline
    if p.module_present(await call(p.PROBE_MODULE, reply_errors=True, **options)):
        return p.Protocol(p.MODULE)
    has_functions = p.functions_present(await call(p.PROBE_FUNCTIONS, reply_errors=True, **options))
    if not has_functions:
        metrics = getattr(call, "metrics", None)
        if isinstance(metrics, Metrics):
            metrics.add("server_errors")  # counted as the error reply it stands for
    return p.Protocol(p.decide_backend(False, has_functions))


class BackendTask:
    """An asyncio limiter's backend, resolved on tasks of their own.

    Awaited inline, the probes ran within each call's timeout and were cancelled with it;
    redis.asyncio drops a connection whose command is cancelled, so on a link where a new
    connection and the probes take longer than the timeout every call started over and
    the limiter fell back forever. A task goes on past a caller's timeout (up to
    ``LATE_LIMIT``), and each call waits within its own deadline for the first task to
    succeed. A call that finds the newest task running longer than the call timeout starts
    another beside it (at most ``MAX_TASKS``, the oldest cancelled): a probe stuck on a
    half-open connection holds up nobody for longer than a timeout. A task that failed is
    started again by the next call; tasks of another event loop are forgotten.
    """

    MAX_TASKS = 4

    def __init__(self) -> None:
        self._tasks: list[tuple[asyncio.Task[p.Protocol], float]] = []

    async def __call__(
        self, client: Any, call: AsyncCaller, backend: str, deadline: Optional[float]
    ) -> p.Protocol:
        loop = asyncio.get_running_loop()
        tasks = [
            (t, at)
            for t, at in self._tasks
            if t.get_loop() is loop and not (t.done() and (t.cancelled() or t.exception()))
        ]
        for t, _ in tasks:
            if t.done():
                self._tasks = [(t, 0.0)]
                return t.result()
        stale = call.timeout if call.timeout is not None else LATE_LIMIT
        failure: Optional[BaseException] = None
        if not tasks or now() - tasks[-1][1] >= stale:
            if len(tasks) >= self.MAX_TASKS:
                tasks.pop(0)[0].cancel()
            resolve = aresolve_backend(client, call, backend, now() + LATE_LIMIT)
            task = loop.create_task(resolve)
            # A failure nobody waited for is not "never retrieved": the next call retries.
            task.add_done_callback(lambda t: t.cancelled() or t.exception())
            tasks.append((task, now()))
        self._tasks = tasks
        pending = {asyncio.shield(t) for t, _ in tasks}
        while pending:
            left = None if deadline is None else max(0.0, deadline - now())
            done, pending = await asyncio.wait(
                pending, timeout=left, return_when=asyncio.FIRST_COMPLETED
            )
            if not done:
                for f in pending:
                    f.cancel()
                raise asyncio.TimeoutError()
            for f in done:
                if f.cancelled():
                    continue
                e = f.exception()
                if e is None:
                    for rest in pending:
                        rest.cancel()
                    return f.result()
                failure = e
        if failure is None:  # every task cancelled (their event loop is closing)
            raise asyncio.CancelledError()
        raise failure
