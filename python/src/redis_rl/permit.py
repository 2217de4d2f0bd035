"""``permit()`` / ``apermit()``: a distributed concurrency limit over ``RL.ACQUIRE`` /
``RL.RELEASE``, renewed with ``RL.RENEW`` while the block runs (for long calls).

Every call has a timeout, as a limiter's do. While Redis is unavailable (no connection, a
timeout) the failure policy decides, as the Rust client's ``Semaphore`` does (the client
core's ``permit`` module, docs/client-contract.md §7): ``ALLOW`` and ``LAST_KNOWN`` (the
default ``ALLOW``) hand out local permits up to ``max(1, limit // instances)`` per key in
this process (``instances`` defaults to 4: set your fleet's size), so a fleet of at most
``instances`` holds at most ``limit``; ``DENY`` refuses (:class:`PermitDenied`, retry after
1 s). A local permit has ``source`` ``FALLBACK``, needs no release call and is never
renewed. An error reply is never decided locally.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
import warnings
from typing import Any, AsyncIterator, Dict, Iterator, Optional, Tuple

from . import _core
from . import _protocol as p
from ._call import (
    NOT_OUTAGES,
    OUTAGES,
    AsyncCaller,
    SyncCaller,
    aexecute,
    aresolve_backend,
    execute,
    resolve_backend,
)
from .decision import Source
from .errors import BackendNotFound, PermitDenied
from .metrics import Metrics
from .policy import ALLOW, DEFAULT_INSTANCES, FailurePolicy
from .types import AsyncClient, SyncClient

#: Permits need the module's commands: the Functions library has none.
NO_PERMITS = (
    "redis-rl: permits need the module (RL.ACQUIRE, RL.RENEW, RL.RELEASE): load it "
    "(loadmodule /path/to/libredis_rl.so); the Functions library has no permits"
)
#: The retry hint of a ``DENY`` fallback, in milliseconds.
DENY_RETRY_AFTER_MS = 1000


class _Local:
    """This process's local permits, one table per (policy, instances), under a lock the
    fork handler replaces in a child (where no block of the parent's holds one)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.tables: Dict[Tuple[str, int], Any] = {}

    def acquire(self, policy: FailurePolicy, instances: int, key: str, limit: int) -> Any:
        with self.lock:
            table = self.tables.get((policy.kind, instances))
            if table is None:
                table = _core.LocalPermits(policy.kind, instances, DENY_RETRY_AFTER_MS)
                self.tables[(policy.kind, instances)] = table
            return table.acquire(key, limit)

    def release(self, policy: FailurePolicy, instances: int, key: str) -> None:
        with self.lock:
            table = self.tables.get((policy.kind, instances))
            if table is not None:
                table.release(key)

    def forked(self) -> None:
        self.lock = threading.Lock()
        self.tables = {}


_LOCAL = _Local()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_LOCAL.forked)


class Permit:
    """A slot held under a concurrency limit. ``lost`` turns true if a renewal found the
    permit gone (it outlived its TTL, say while the process was paused)."""

    def __init__(
        self, key: str, permit_id: int, in_use: int, ttl: float, source: Source = Source.SERVER
    ) -> None:
        """A permit as the server granted it, or the failure policy (``source``
        ``FALLBACK``, ``id`` 0); made by :func:`permit` and :func:`apermit`."""
        self.key = key
        self.id = permit_id
        self.in_use = in_use
        #: Seconds the server keeps the slot without a renewal.
        self.ttl = ttl
        self.lost = False
        self.renewals = 0
        self.source = source

    @property
    def ttl_ms(self) -> int:
        """The TTL in milliseconds (the old name; ``ttl`` is in seconds)."""
        return round(self.ttl * 1000)


def _ttl(ttl: Optional[float], ttl_ms: Optional[int]) -> float:
    """The TTL in seconds, from ``ttl`` or the deprecated ``ttl_ms``."""
    if ttl_ms is not None:
        warnings.warn("ttl_ms is deprecated: pass ttl in seconds", DeprecationWarning, stacklevel=4)
        if ttl is not None:
            raise TypeError("pass ttl (seconds) or ttl_ms, not both")
        return ttl_ms / 1000
    return 30.0 if ttl is None else float(ttl)


def _instances(policy: FailurePolicy, instances: Optional[int]) -> int:
    if not isinstance(policy, FailurePolicy):
        raise TypeError("policy must be a FailurePolicy (ALLOW, LAST_KNOWN, DENY)")
    if instances is None:
        return DEFAULT_INSTANCES
    if isinstance(instances, bool) or not isinstance(instances, int) or instances < 1:
        raise ValueError("instances must be a positive integer")
    return instances


def _check(limit: int, ttl: float, renew_every: Optional[float]) -> tuple[int, float]:
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValueError("limit must be a positive integer")
    ms = round(ttl * 1000)
    if ms < 1:
        raise ValueError("ttl must be at least 0.001 s")
    every = ttl / 3 if renew_every is None else renew_every
    if every <= 0:
        raise ValueError("renew_every must be positive")
    return ms, every


def _fallback(policy: FailurePolicy, instances: int, key: str, limit: int) -> p.AcquireReply:
    """The failure policy's answer, as the server's would read (``permit_id`` 0)."""
    granted, in_use, retry_after_ms = _LOCAL.acquire(policy, instances, key, limit)
    return p.AcquireReply(granted, 0, in_use, retry_after_ms)


def _backend(backend: str) -> p.Protocol:
    if backend == p.FUNCTIONS:
        raise BackendNotFound(NO_PERMITS)
    return p.Protocol(p.MODULE)


def _not_found(e: BackendNotFound) -> BackendNotFound:
    err = BackendNotFound(f"{e.args[0].split(' -- ')[0]} -- {NO_PERMITS}")
    err.__cause__ = e.__cause__
    return err


@contextlib.contextmanager
def permit(
    client: SyncClient,
    key: str,
    limit: int,
    ttl_ms: Optional[int] = None,
    *,
    ttl: Optional[float] = None,
    max_wait: float = 0.0,
    renew_every: Optional[float] = None,
    timeout: Optional[float] = 0.2,
    backend: str = p.AUTO,
    policy: FailurePolicy = ALLOW,
    instances: Optional[int] = None,
) -> Iterator[Permit]:
    """Holds one of ``limit`` slots of ``key`` for the ``with`` block, released on exit.

    The server frees a slot whose holder vanished after ``ttl`` seconds (default 30); while
    the block runs a thread renews the permit every ``renew_every`` seconds (default
    ``ttl / 3``). When all slots are taken it retries after the server's wait for up to
    ``max_wait`` seconds, then raises :class:`PermitDenied`. Each call returns within
    ``timeout``: an acquire that lands later is released at once. While Redis is
    unavailable ``policy`` decides (see the module's doc; ``instances`` processes share
    each key's limit, default 4); an error reply raises :class:`ServerError` (a server
    without the module: :class:`BackendNotFound`).
    """
    seconds = _ttl(ttl, ttl_ms)
    ms, every = _check(limit, seconds, renew_every)
    fleet = _instances(policy, instances)
    call = SyncCaller(client, timeout, Metrics())
    proto = None if backend == p.AUTO else _backend(backend)

    def release_late(reply: Any) -> None:
        r = p.parse_acquire(reply)
        if r.granted and proto is not None:
            with contextlib.suppress(Exception):
                execute(client, *proto.release(key, r.permit_id))

    deadline = time.monotonic() + max_wait
    while True:
        local = False
        try:
            if proto is None:
                proto = _backend(resolve_backend(client, call, backend, call.deadline()).backend)
            r = p.parse_acquire(call(proto.acquire(key, limit, ms), late=release_late))
        except BackendNotFound as e:
            raise _not_found(e) from e.__cause__
        except NOT_OUTAGES:
            raise
        except OUTAGES:
            r, local = _fallback(policy, fleet, key, limit), True
        if r.granted:
            break
        wait = max(r.retry_after_ms, 10) / 1000
        if time.monotonic() + wait > deadline:
            raise PermitDenied(key, r.in_use, r.retry_after_ms)
        time.sleep(wait)
    if local:  # the failure policy's permit: held here, nothing to renew or release
        try:
            yield Permit(key, 0, r.in_use, seconds, Source.FALLBACK)
        finally:
            _LOCAL.release(policy, fleet, key)
        return
    held = Permit(key, r.permit_id, r.in_use, seconds)
    assert proto is not None  # the call that granted it had one
    stop = threading.Event()

    def renew() -> None:
        while not stop.wait(every):
            try:
                ok = p.to_int(call(proto.renew(key, held.id, ms)))
            except Exception:
                continue  # try again next period; the TTL covers a short outage
            held.renewals += 1
            if not ok:
                held.lost = True
                return

    thread = threading.Thread(target=renew, name=f"redis-rl-permit-{key}", daemon=True)
    thread.start()
    try:
        yield held
    finally:
        stop.set()
        thread.join()
        with contextlib.suppress(Exception):
            call(proto.release(key, held.id))


@contextlib.asynccontextmanager
async def apermit(
    client: AsyncClient,
    key: str,
    limit: int,
    ttl_ms: Optional[int] = None,
    *,
    ttl: Optional[float] = None,
    max_wait: float = 0.0,
    renew_every: Optional[float] = None,
    timeout: Optional[float] = 0.2,
    backend: str = p.AUTO,
    policy: FailurePolicy = ALLOW,
    instances: Optional[int] = None,
) -> AsyncIterator[Permit]:
    """The asyncio twin of :func:`permit` (renewals run in a background task). An acquire
    whose caller is cancelled or times out still lands, and a permit it brings is released
    at once instead of holding a slot nobody has until its TTL."""
    seconds = _ttl(ttl, ttl_ms)
    ms, every = _check(limit, seconds, renew_every)
    fleet = _instances(policy, instances)
    call = AsyncCaller(client, timeout, Metrics())
    proto = None if backend == p.AUTO else _backend(backend)

    async def release_late(reply: Any) -> None:
        r = p.parse_acquire(reply)
        if r.granted and proto is not None:
            with contextlib.suppress(Exception):
                await aexecute(client, *proto.release(key, r.permit_id))

    deadline = time.monotonic() + max_wait
    while True:
        local = False
        try:
            if proto is None:
                resolved = await aresolve_backend(client, call, backend, call.deadline())
                proto = _backend(resolved.backend)
            r = p.parse_acquire(await call(proto.acquire(key, limit, ms), late=release_late))
        except BackendNotFound as e:
            raise _not_found(e) from e.__cause__
        except NOT_OUTAGES:
            raise
        except OUTAGES:
            r, local = _fallback(policy, fleet, key, limit), True
        if r.granted:
            break
        wait = max(r.retry_after_ms, 10) / 1000
        if time.monotonic() + wait > deadline:
            raise PermitDenied(key, r.in_use, r.retry_after_ms)
        await asyncio.sleep(wait)
    if local:  # the failure policy's permit: held here, nothing to renew or release
        try:
            yield Permit(key, 0, r.in_use, seconds, Source.FALLBACK)
        finally:
            _LOCAL.release(policy, fleet, key)
        return
    held = Permit(key, r.permit_id, r.in_use, seconds)
    assert proto is not None  # the call that granted it had one

    async def renew() -> None:
        while True:
            await asyncio.sleep(every)
            try:
                reply = await call(proto.renew(key, held.id, ms))
            except Exception:
                continue
            held.renewals += 1
            if not p.to_int(reply):
                held.lost = True
                return

    task = asyncio.get_running_loop().create_task(renew())
    try:
        yield held
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        with contextlib.suppress(Exception):
            await call(proto.release(key, held.id))
