"""The semaphore's failure policy golden cases (protocol/client-cases/permit.json) through
``permit()`` and ``apermit()``: every acquire finds Redis away (a port nothing listens on:
the connection is refused), the policy decides through the compiled core; a release leaves
the oldest ``with`` block of its key."""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest
import redis
import redis.asyncio as aredis
from conftest import free_port

from redis_rl import DENY, LAST_KNOWN, PermitDenied, Source, apermit, permit
from redis_rl.permit import _LOCAL
from redis_rl.policy import ALLOW

CASES = json.loads(
    (Path(__file__).resolve().parents[2] / "protocol" / "client-cases" / "permit.json").read_text()
)
POLICIES = {"allow": ALLOW, "last_known": LAST_KNOWN, "deny": DENY}


def want_of(step: Dict[str, Any]) -> Tuple[bool, int, int]:
    w = step["want"]
    return w["granted"], w["in_use"], w.get("retry_after_ms", 0)


@pytest.mark.parametrize("case", CASES["cases"], ids=lambda c: str(c["about"])[:40])
def test_permit_case(case: Dict[str, Any]) -> None:
    _LOCAL.forked()  # a fresh table: each case starts with no local permit held
    client = redis.Redis(port=free_port(), socket_timeout=0.2, socket_connect_timeout=0.2)
    policy, instances = POLICIES[case["policy"]], case["instances"]
    held: List[Tuple[str, contextlib.ExitStack]] = []
    for step in case["steps"]:
        if "release" in step:
            i = next(n for n, (k, _) in enumerate(held) if k == step["release"])
            held.pop(i)[1].close()
            continue
        stack = contextlib.ExitStack()
        try:
            got = stack.enter_context(
                permit(
                    client,
                    step["acquire"],
                    step["limit"],
                    ttl=60,
                    backend="module",
                    policy=policy,
                    instances=instances,
                )
            )
        except PermitDenied as e:
            assert (False, e.in_use, e.retry_after_ms) == want_of(step), step
            continue
        assert (True, got.in_use, 0) == want_of(step), step
        assert got.source is Source.FALLBACK and got.id == 0
        held.append((step["acquire"], stack))
    for _, stack in held:
        stack.close()


@pytest.mark.parametrize("case", CASES["cases"], ids=lambda c: str(c["about"])[:40])
def test_apermit_case(case: Dict[str, Any]) -> None:
    async def run() -> None:
        _LOCAL.forked()
        client = aredis.Redis(port=free_port(), socket_timeout=0.2, socket_connect_timeout=0.2)
        policy, instances = POLICIES[case["policy"]], case["instances"]
        held: List[Tuple[str, contextlib.AsyncExitStack]] = []
        for step in case["steps"]:
            if "release" in step:
                i = next(n for n, (k, _) in enumerate(held) if k == step["release"])
                await held.pop(i)[1].aclose()
                continue
            stack = contextlib.AsyncExitStack()
            try:
                got = await stack.enter_async_context(
                    apermit(
                        client,
                        step["acquire"],
                        step["limit"],
                        ttl=60,
                        backend="module",
                        policy=policy,
                        instances=instances,
                    )
                )
            except PermitDenied as e:
                assert (False, e.in_use, e.retry_after_ms) == want_of(step), step
                continue
            assert (True, got.in_use, 0) == want_of(step), step
            assert got.source is Source.FALLBACK
            held.append((step["acquire"], stack))
        for _, stack in held:
            await stack.aclose()
        await client.aclose()

    asyncio.run(run())


def test_an_error_reply_is_never_decided_locally(server: Any, key: str) -> None:
    """The policy answers outages only: a wrong type under the key is the caller's error."""
    from redis_rl import ServerError

    r = redis.Redis(port=server.port)
    r.set(key, "not a semaphore")
    with pytest.raises(ServerError), permit(r, key, 2, ttl=5, policy=ALLOW):
        pass


def test_a_local_permit_is_let_go_however_its_block_ends() -> None:
    """An error in the block of a local permit is the block's own (not chained to the
    outage that made the permit local) and the permit is let go."""
    _LOCAL.forked()
    client = redis.Redis(port=free_port(), socket_timeout=0.2, socket_connect_timeout=0.2)
    with pytest.raises(KeyError) as e, permit(client, "k", 1, ttl=5, backend="module", instances=1):
        raise KeyError("mine")
    assert e.value.__context__ is None
    with permit(client, "k", 1, ttl=5, backend="module", instances=1) as p:
        assert p.source is Source.FALLBACK and p.in_use == 1
