"""``permit()`` / ``apermit()``: a distributed concurrency limit over ``RL.ACQUIRE`` /
``RL.RELEASE``, renewed with ``RL.RENEW`` while the block runs (for long calls)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from typing import Any, AsyncIterator, Iterator, Optional, Set

from . import _protocol as p
from ._call import aresolve_backend, resolve_backend
from .errors import PermitDenied


class Permit:
    """A slot held under a concurrency limit. ``lost`` turns true if a renewal found the
    permit gone (it outlived its TTL, say while the process was paused)."""

    def __init__(self, key: str, permit_id: int, in_use: int, ttl_ms: int) -> None:
        self.key = key
        self.id = permit_id
        self.in_use = in_use
        self.ttl_ms = ttl_ms
        self.lost = False
        self.renewals = 0


def _check(limit: int, ttl_ms: int, renew_every: Optional[float]) -> float:
    if limit < 1:
        raise ValueError("limit must be a positive integer")
    if ttl_ms < 1:
        raise ValueError("ttl_ms must be a positive integer")
    every = ttl_ms / 3000 if renew_every is None else renew_every
    if every <= 0:
        raise ValueError("renew_every must be positive")
    return every


@contextlib.contextmanager
def permit(
    client: Any,
    key: str,
    limit: int,
    ttl_ms: int = 30_000,
    *,
    max_wait: float = 0.0,
    renew_every: Optional[float] = None,
    backend: str = p.AUTO,
) -> Iterator[Permit]:
    """Holds one of ``limit`` slots of ``key`` for the ``with`` block, released on exit.

    The server frees a slot whose holder vanished after ``ttl_ms``; while the block runs a
    thread renews the permit every ``renew_every`` seconds (default ``ttl_ms / 3``). When
    all slots are taken it retries after the server's ``retry_after_ms`` for up to
    ``max_wait`` seconds, then raises :class:`PermitDenied`.
    """
    every = _check(limit, ttl_ms, renew_every)
    proto = resolve_backend(client, lambda a, **o: client.execute_command(*a, **o), backend)
    deadline = time.monotonic() + max_wait
    while True:
        r = p.parse_acquire(client.execute_command(*proto.acquire(key, limit, ttl_ms)))
        if r.granted:
            break
        wait = max(r.retry_after_ms, 10) / 1000
        if time.monotonic() + wait > deadline:
            raise PermitDenied(key, r.in_use, r.retry_after_ms)
        time.sleep(wait)
    held = Permit(key, r.permit_id, r.in_use, ttl_ms)
    stop = threading.Event()

    def renew() -> None:
        while not stop.wait(every):
            try:
                ok = p.to_int(client.execute_command(*proto.renew(key, held.id, ttl_ms)))
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
            client.execute_command(*proto.release(key, held.id))


#: Acquire calls whose caller was cancelled, kept until they land (and release).
_orphans: Set[asyncio.Future[Any]] = set()


async def _acquire(client: Any, proto: p.Protocol, key: str, limit: int, ttl_ms: int) -> Any:
    """One ``RL.ACQUIRE`` as a task of its own: if the caller is cancelled while it is in
    the air, it still lands, and a permit it brings is released at once (nobody holds it)
    instead of taking a slot until its TTL."""
    call = asyncio.ensure_future(client.execute_command(*proto.acquire(key, limit, ttl_ms)))
    try:
        return p.parse_acquire(await asyncio.shield(call))
    except asyncio.CancelledError:

        async def release_late() -> None:
            with contextlib.suppress(BaseException):
                r = p.parse_acquire(await call)
                if r.granted:
                    await client.execute_command(*proto.release(key, r.permit_id))

        orphan = asyncio.ensure_future(release_late())
        _orphans.add(orphan)
        orphan.add_done_callback(_orphans.discard)
        raise


@contextlib.asynccontextmanager
async def apermit(
    client: Any,
    key: str,
    limit: int,
    ttl_ms: int = 30_000,
    *,
    max_wait: float = 0.0,
    renew_every: Optional[float] = None,
    backend: str = p.AUTO,
) -> AsyncIterator[Permit]:
    """The asyncio twin of :func:`permit` (renewals run in a background task)."""
    every = _check(limit, ttl_ms, renew_every)
    proto = await aresolve_backend(client, lambda a, **o: client.execute_command(*a, **o), backend)
    deadline = time.monotonic() + max_wait
    while True:
        r = await _acquire(client, proto, key, limit, ttl_ms)
        if r.granted:
            break
        wait = max(r.retry_after_ms, 10) / 1000
        if time.monotonic() + wait > deadline:
            raise PermitDenied(key, r.in_use, r.retry_after_ms)
        await asyncio.sleep(wait)
    held = Permit(key, r.permit_id, r.in_use, ttl_ms)

    async def renew() -> None:
        while True:
            await asyncio.sleep(every)
            try:
                reply = await client.execute_command(*proto.renew(key, held.id, ttl_ms))
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
            await client.execute_command(*proto.release(key, held.id))
