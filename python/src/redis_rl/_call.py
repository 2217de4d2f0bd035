"""Sending one command with a timeout, and resolving the backend, for sync and asyncio clients.

What counts as an outage (the failure policy decides then): no connection, a timeout, a
cluster that says it is down. Everything else Redis answers (``WRONGTYPE``, ``ERR too many
live leases``, an unknown command, any ``-ERR``) is a :class:`ServerError`, raised to the
caller and counted in ``server_errors``, never a policy decision.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
import time
from typing import Any, Awaitable, Callable, Optional

import redis.exceptions

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
#: The old name of :data:`OUTAGES`.
FAILURES = OUTAGES
TIMEOUTS = (redis.exceptions.TimeoutError, asyncio.TimeoutError, concurrent.futures.TimeoutError)
#: Error replies that redis-py raises as a ``ConnectionError``: ``WRONGPASS`` and
#: ``NOAUTH`` (``AuthenticationError``) are the server refusing this client's credentials, a
#: misconfiguration it answered, not an outage: raised as :class:`ServerError`, never decided
#: by the policy (a wrong password must not fail open). Catch them before :data:`OUTAGES`.
NOT_OUTAGES = (redis.exceptions.AuthenticationError,)

_executor_lock = threading.Lock()
_executor: Optional[concurrent.futures.ThreadPoolExecutor] = None


def _forget_pool_in_child() -> None:
    """A forked child (a gunicorn or multiprocessing worker) inherits the pool object but
    none of its threads: work submitted to it would never run and every call would time
    out. The child starts a pool of its own on first use instead."""
    global _executor, _executor_lock
    _executor = None
    _executor_lock = threading.Lock()  # the parent may have held it while forking


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool_in_child)


def _pool() -> concurrent.futures.ThreadPoolExecutor:
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = concurrent.futures.ThreadPoolExecutor(
                max_workers=8, thread_name_prefix="redis-rl-call"
            )
        return _executor


def now() -> float:
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


def worst_case(client: Any) -> Optional[float]:
    """How long one command on a sync client can take at most (connect + command, no
    retries), or ``None`` if unbounded (no socket timeout, or retries configured: redis-py
    retries timeouts 3 times by default, with backoff)."""
    kwargs = _connection_kwargs(client)
    if kwargs is None:
        return None
    st = kwargs.get("socket_timeout")
    if st is None:
        return None
    ct = kwargs.get("socket_connect_timeout")
    ct = st if ct is None else ct
    get_retry = getattr(client, "get_retry", None)
    retry = get_retry() if callable(get_retry) else kwargs.get("retry")
    retries = getattr(retry, "get_retries", lambda: 0)() if retry is not None else 0
    if retries != 0:
        return None
    return float(st) + float(ct)


class SyncCaller:
    """Sends commands on a synchronous client, each within ``timeout`` seconds.

    When the client cannot take longer than ``timeout`` by itself (``socket_timeout`` plus
    ``socket_connect_timeout`` at most ``timeout``, retries off) the call is made in the
    caller's thread (the cheap path); otherwise it runs on a small shared thread pool and
    the caller stops waiting at ``timeout``.
    """

    def __init__(self, client: Any, timeout: Optional[float], metrics: Metrics) -> None:
        self.client = client
        self.timeout = timeout
        self.metrics = metrics
        worst = worst_case(client)
        self.direct = timeout is None or (worst is not None and worst <= timeout)

    def remaining(self, deadline: Optional[float]) -> Optional[float]:
        if deadline is None:
            return self.timeout
        return max(0.0, deadline - now())

    def deadline(self) -> Optional[float]:
        return None if self.timeout is None else now() + self.timeout

    def __call__(
        self,
        args: p.Args,
        deadline: Optional[float] = None,
        late: Optional[Callable[[Any], None]] = None,
        **options: Any,
    ) -> Any:
        """The reply, within the timeout. ``late``: what to do with a reply that comes after
        the caller stopped waiting (say, refund a grant nobody will use); it runs on the
        pool."""
        self.metrics.add("redis_calls")
        try:
            if self.direct:
                return self.client.execute_command(*args, **options)
            future = _pool().submit(self.client.execute_command, *args, **options)
            try:
                return future.result(self.remaining(deadline))
            except concurrent.futures.TimeoutError:
                if not future.cancel() and late is not None:  # sent: it may still land
                    future.add_done_callback(_on_late(late))
                raise
        except NOT_OUTAGES as e:
            self.metrics.add("server_errors")
            raise server_error(e) from e
        except TIMEOUTS:
            self.metrics.add("redis_timeouts")
            self.metrics.add("redis_errors")
            raise
        except OUTAGES:
            self.metrics.add("redis_errors")
            raise
        except redis.exceptions.RedisError as e:
            self.metrics.add("server_errors")
            raise server_error(e) from e


def _on_late(late: Callable[[Any], None]) -> Callable[[concurrent.futures.Future[Any]], None]:
    def done(future: concurrent.futures.Future[Any]) -> None:
        if not future.cancelled() and future.exception() is None:
            late(future.result())

    return done


#: How long a call whose caller stopped waiting may still land (asyncio; a sync call is
#: bounded by the client's socket timeout).
LATE_LIMIT = 30.0


class AsyncCaller:
    """Sends commands on an asyncio client, each within ``timeout`` seconds."""

    def __init__(self, client: Any, timeout: Optional[float], metrics: Metrics) -> None:
        self.client = client
        self.timeout = timeout
        self.metrics = metrics
        self._late: set[asyncio.Future[Any]] = set()

    def _keep(self, task: asyncio.Future[Any]) -> None:
        self._late.add(task)
        task.add_done_callback(self._late.discard)

    def _later(self, task: asyncio.Future[Any], late: Callable[[Any], Awaitable[None]]) -> None:
        """When ``task`` lands, hand its reply to ``late`` (in a task of its own)."""

        def done(t: asyncio.Future[Any]) -> None:
            if not t.cancelled() and t.exception() is None:
                self._keep(asyncio.ensure_future(late(t.result())))

        self._keep(task)
        task.add_done_callback(done)
        handle = asyncio.get_running_loop().call_later(LATE_LIMIT, task.cancel)
        task.add_done_callback(lambda _: handle.cancel())

    def deadline(self) -> Optional[float]:
        return None if self.timeout is None else now() + self.timeout

    async def __call__(
        self,
        args: p.Args,
        deadline: Optional[float] = None,
        late: Optional[Callable[[Any], Awaitable[None]]] = None,
        **options: Any,
    ) -> Any:
        """The reply, within the timeout. With ``late``, the call runs as a task of its own
        that a timeout or a cancellation of the caller does not stop; ``late`` gets a reply
        that comes after the caller stopped waiting (say, to refund a grant)."""
        self.metrics.add("redis_calls")
        try:
            call = self.client.execute_command(*args, **options)
            timeout = self.timeout if deadline is None else max(0.0, deadline - now())
            if late is None:
                if timeout is None:
                    return await call
                return await asyncio.wait_for(call, timeout)
            loop = asyncio.get_running_loop()
            task = loop.create_task(call)
            waiter = loop.create_future()

            def wake(_: object) -> None:
                if not waiter.done():
                    waiter.set_result(None)

            task.add_done_callback(wake)
            timer = None if timeout is None else loop.call_later(timeout, wake, None)
            try:
                await waiter  # cancelling this caller cancels the waiter, never the task
            except asyncio.CancelledError:
                self._later(task, late)
                raise
            finally:
                if timer is not None:
                    timer.cancel()
                task.remove_done_callback(wake)
            if not task.done():
                self._later(task, late)
                raise asyncio.TimeoutError()
            return task.result()
        except NOT_OUTAGES as e:
            self.metrics.add("server_errors")
            raise server_error(e) from e
        except TIMEOUTS:
            self.metrics.add("redis_timeouts")
            self.metrics.add("redis_errors")
            raise
        except OUTAGES:
            self.metrics.add("redis_errors")
            raise
        except redis.exceptions.RedisError as e:
            self.metrics.add("server_errors")
            raise server_error(e) from e


def probe_options(client: Any) -> dict[str, Any]:
    """Keyless probes on a cluster client go to one node (every node loads the same
    module or library)."""
    if hasattr(client, "nodes_manager") and hasattr(client, "get_random_node"):
        return {"target_nodes": client.get_random_node()}
    return {}


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
    if p.module_present(call(p.PROBE_MODULE, **options)):
        return p.Protocol(p.MODULE)
    has_functions = p.functions_present(call(p.PROBE_FUNCTIONS, **options))
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
    if backend != p.AUTO:
        return p.Protocol(backend)
    if hasattr(client, "nodes_manager") and asyncio.iscoroutinefunction(
        getattr(client, "initialize", None)
    ):
        await client.initialize()  # an asyncio cluster client learns its nodes lazily
    options = probe_options(client)
    if deadline is not None:
        options["deadline"] = deadline
    if p.module_present(await call(p.PROBE_MODULE, **options)):
        return p.Protocol(p.MODULE)
    has_functions = p.functions_present(await call(p.PROBE_FUNCTIONS, **options))
    if not has_functions:
        metrics = getattr(call, "metrics", None)
        if isinstance(metrics, Metrics):
            metrics.add("server_errors")  # counted as the error reply it stands for
    return p.Protocol(p.decide_backend(False, has_functions))
