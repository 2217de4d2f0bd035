"""A take that waits for another caller's lease call does not judge that call: only the
call's own caller (its timeout, a failure on the wire) finds an outage. A wait that runs
out behind a call Redis has not been asked yet (the GIL busy with other threads, an event
loop busy with other tasks) is no outage: no fallback decision, health stays up.

The lease call is held in the client before it is sent, the way a starved thread holds
it, so nothing here depends on the machine's speed: the waiter's timeout is made to pass
for certain (a sleep longer than it) while the call is held."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, List

import redis
import redis.asyncio as aredis
from conftest import Server
from redis.backoff import NoBackoff
from redis.retry import Retry

from redis_rl import DENY, AsyncPrefetchLimiter, PrefetchLimiter, Source

TIMEOUT = 1.0


def _is_lease(args: tuple[Any, ...]) -> bool:
    return any("LEASE" in str(a).upper() for a in args[:3])


class Holding(redis.Redis):
    """Holds its lease calls, before sending them, while ``hold`` is clear."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.hold = threading.Event()
        self.hold.set()
        self.held = threading.Event()

    def execute_command(self, *args: Any, **options: Any) -> Any:
        if _is_lease(args) and not self.hold.is_set():
            self.held.set()
            self.hold.wait()
        return super().execute_command(*args, **options)


def test_a_waiter_whose_timeout_passes_behind_a_held_call_does_not_fall_back(
    server: Server, key: str
) -> None:
    # A client that bounds its own calls within the timeout: the lease call is made in
    # the caller's thread, which is where it is held.
    client = Holding(
        host="127.0.0.1",
        port=server.port,
        socket_timeout=TIMEOUT * 0.45,
        socket_connect_timeout=TIMEOUT * 0.45,
        retry=Retry(NoBackoff(), 0),
    )
    lim = PrefetchLimiter(client, key, 1e-6, 100, batch=10, ttl=600, timeout=TIMEOUT, policy=DENY)
    client.hold.clear()
    decisions: List[Any] = [None, None]

    def take(i: int) -> None:
        decisions[i] = lim.take()

    sender = threading.Thread(target=take, args=(0,))
    sender.start()
    assert client.held.wait(30), "the lease call was never made"
    waiter = threading.Thread(target=take, args=(1,))
    waiter.start()
    time.sleep(TIMEOUT * 1.5)  # the waiter's timeout has passed, the call is still held
    assert waiter.is_alive(), f"the waiter decided without the call: {decisions[1]}"
    client.hold.set()
    sender.join(30)
    waiter.join(30)
    assert [d.granted for d in decisions] == [True, True], decisions
    assert decisions[0].source is Source.SERVER and decisions[1].source is Source.LEASE
    m = lim.metrics.snapshot()
    assert m["fallback_decisions"] == 0 and m["redis_timeouts"] == 0, m
    assert not lim._core.health.down
    lim.close()


class AsyncHolding(aredis.Redis):
    """Holds its lease calls, before sending them, while ``hold`` is clear."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.hold = asyncio.Event()
        self.hold.set()
        self.held = asyncio.Event()

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        if _is_lease(args) and not self.hold.is_set():
            self.held.set()
            await self.hold.wait()
        return await super().execute_command(*args, **options)


def test_async_a_take_that_waited_gives_its_own_call_the_whole_timeout(
    server: Server, key: str
) -> None:
    """A take whose timeout runs out behind another's lease call, then has to make its own
    call, gives that call the whole timeout: a call Redis answers within it is no outage."""

    async def main() -> None:
        client = AsyncHolding(port=server.port, socket_timeout=5)
        lim = AsyncPrefetchLimiter(
            client, key, 1e-6, 100, batch=10, ttl=600, timeout=TIMEOUT, policy=DENY
        )
        client.hold.clear()
        first = asyncio.ensure_future(lim.take(10))  # spends its whole lease
        await asyncio.wait_for(client.held.wait(), 30)
        client.held.clear()
        second = asyncio.ensure_future(lim.take())  # waits for the first call
        await asyncio.sleep(0)
        time.sleep(TIMEOUT * 0.6)  # blocks the loop: nothing lands meanwhile
        client.hold.set()  # the first call lands, within its caller's timeout
        assert (await first).granted
        client.hold.clear()
        await asyncio.wait_for(client.held.wait(), 30)  # the second take's own call
        time.sleep(TIMEOUT * 0.6)  # the second take's first timeout has passed now
        client.hold.set()
        d = await second
        m = lim.metrics.snapshot()
        await lim.close()
        assert d.granted and d.source is Source.SERVER, (d, m)
        assert m["fallback_decisions"] == 0 and m["redis_timeouts"] == 0, m

    asyncio.run(main())


def test_async_a_landed_lease_serves_the_line_in_arrival_order(server: Server, key: str) -> None:
    """Takes waiting for a lease call are served in arrival order: a smaller take behind
    one the batch cannot serve does not overtake it (it stays in line, not woken)."""

    async def main() -> None:
        client = AsyncHolding(port=server.port, socket_timeout=5)
        lim = AsyncPrefetchLimiter(client, key, 1e-6, 100, batch=3, ttl=600, timeout=30)
        client.hold.clear()
        first = asyncio.ensure_future(lim.take(1))  # leases 3, keeps 2
        await asyncio.wait_for(client.held.wait(), 30)
        client.held.clear()
        big = asyncio.ensure_future(lim.take(3))  # more than the 2 left: asks Redis next
        await asyncio.sleep(0)
        small = asyncio.ensure_future(lim.take(1))  # could be served, but is behind
        await asyncio.sleep(0)
        client.hold.set()
        assert (await first).granted
        client.hold.clear()
        await asyncio.wait_for(client.held.wait(), 30)  # the big take's own lease call
        assert not small.done(), small.result()
        client.hold.set()
        d_big, d_small = await asyncio.gather(big, small)
        await lim.close()
        assert d_big.granted and d_small.granted, (d_big, d_small)
        assert lim.metrics.snapshot()["fallback_decisions"] == 0

    asyncio.run(main())
