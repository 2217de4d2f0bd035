"""Sending one command with a timeout, and resolving the backend, for sync and asyncio clients."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
from typing import Any, Awaitable, Callable, Optional

import redis.exceptions

from . import _protocol as p
from .errors import ProtocolError
from .metrics import Metrics

#: What counts as Redis being unavailable (the failure policy decides then).
FAILURES = (redis.exceptions.RedisError, OSError, asyncio.TimeoutError, ProtocolError)
TIMEOUTS = (redis.exceptions.TimeoutError, asyncio.TimeoutError, concurrent.futures.TimeoutError)

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


def socket_timeout(client: Any) -> Optional[float]:
    """The client's own socket timeout, if it has one (``redis.Redis``, ``RedisCluster``)."""
    candidates = (
        ("connection_pool", "connection_kwargs"),
        ("nodes_manager", "connection_kwargs"),
    )
    for owner, attr in candidates:
        kwargs = getattr(getattr(client, owner, None), attr, None)
        if isinstance(kwargs, dict):
            value = kwargs.get("socket_timeout")
            return float(value) if value is not None else None
    return None


class SyncCaller:
    """Sends commands on a synchronous client, each within ``timeout`` seconds.

    When the client's own ``socket_timeout`` is at most ``timeout`` the call is made in the
    caller's thread (the cheap path; set ``socket_timeout`` on the client to get it);
    otherwise it runs on a small shared thread pool and the caller stops waiting at
    ``timeout``.
    """

    def __init__(self, client: Any, timeout: Optional[float], metrics: Metrics) -> None:
        self.client = client
        self.timeout = timeout
        self.metrics = metrics
        st = socket_timeout(client)
        self.direct = timeout is None or (st is not None and st <= timeout)

    def __call__(self, args: p.Args, **options: Any) -> Any:
        self.metrics.add("redis_calls")
        try:
            if self.direct:
                return self.client.execute_command(*args, **options)
            future = _pool().submit(self.client.execute_command, *args, **options)
            return future.result(self.timeout)
        except TIMEOUTS:
            self.metrics.add("redis_timeouts")
            self.metrics.add("redis_errors")
            raise
        except FAILURES:
            self.metrics.add("redis_errors")
            raise


class AsyncCaller:
    """Sends commands on an asyncio client, each within ``timeout`` seconds."""

    def __init__(self, client: Any, timeout: Optional[float], metrics: Metrics) -> None:
        self.client = client
        self.timeout = timeout
        self.metrics = metrics

    async def __call__(self, args: p.Args, **options: Any) -> Any:
        self.metrics.add("redis_calls")
        try:
            call = self.client.execute_command(*args, **options)
            if self.timeout is None:
                return await call
            return await asyncio.wait_for(call, self.timeout)
        except TIMEOUTS:
            self.metrics.add("redis_timeouts")
            self.metrics.add("redis_errors")
            raise
        except FAILURES:
            self.metrics.add("redis_errors")
            raise


def probe_options(client: Any) -> dict[str, Any]:
    """Keyless probes on a cluster client go to one node (every node loads the same
    module or library)."""
    if hasattr(client, "nodes_manager") and hasattr(client, "get_random_node"):
        return {"target_nodes": client.get_random_node()}
    return {}


def resolve_backend(client: Any, call: Callable[..., Any], backend: str) -> p.Protocol:
    """The protocol for ``backend``; ``auto`` asks the server (module first) through
    ``call`` (a caller, so the probes have the limiter's timeout)."""
    if backend != p.AUTO:
        return p.Protocol(backend)
    options = probe_options(client)
    if p.module_present(call(p.PROBE_MODULE, **options)):
        return p.Protocol(p.MODULE)
    has_functions = p.functions_present(call(p.PROBE_FUNCTIONS, **options))
    return p.Protocol(p.decide_backend(False, has_functions))


async def aresolve_backend(
    client: Any, call: Callable[..., Awaitable[Any]], backend: str
) -> p.Protocol:
    if backend != p.AUTO:
        return p.Protocol(backend)
    if hasattr(client, "nodes_manager") and asyncio.iscoroutinefunction(
        getattr(client, "initialize", None)
    ):
        await client.initialize()  # an asyncio cluster client learns its nodes lazily
    options = probe_options(client)
    if p.module_present(await call(p.PROBE_MODULE, **options)):
        return p.Protocol(p.MODULE)
    has_functions = p.functions_present(await call(p.PROBE_FUNCTIONS, **options))
    return p.Protocol(p.decide_backend(False, has_functions))
