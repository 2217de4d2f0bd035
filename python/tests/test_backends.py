"""Choosing the backend: ``auto`` with users whose ACL allows only the commands a limiter
sends, permits on a server without the module."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis
import redis.asyncio as aredis
from conftest import KINDS, Server

from redis_rl import (
    AsyncLimiter,
    AsyncPrefetchLimiter,
    BackendNotFound,
    Limiter,
    PrefetchLimiter,
    apermit,
    permit,
)

RL_COMMANDS = ["rl.take", "rl.lease", "rl.return", "rl.peek", "rl.reserve", "rl.refund"]


def user(server: Server, name: str, rules: list[str]) -> dict[str, Any]:
    """An ACL user with exactly ``rules``; the client settings to log in as it."""
    server.client().execute_command("ACL", "SETUSER", name, "reset", "on", ">pw", "~*", *rules)
    return {"username": name, "password": "pw"}


def take_twice(server: Server, kind: str, key: str, login: dict[str, Any]) -> str:
    """Two takes as ``login`` with ``backend="auto"``; the backend found."""
    if kind in ("limiter", "prefetch"):
        r = server.client(**login)
        lim: Any = (Limiter if kind == "limiter" else PrefetchLimiter)(r, key, 1, 100, timeout=5)
        assert lim.take() and lim.take()
        return str(lim.backend if kind == "limiter" else lim._core.protocol.backend)

    async def run() -> str:
        r = aredis.Redis(port=server.port, socket_timeout=5, **login)
        cls: Any = AsyncLimiter if kind == "async-limiter" else AsyncPrefetchLimiter
        lim = cls(r, key, 1, 100, timeout=5)
        assert await lim.take() and await lim.take()
        await r.aclose()
        return str(lim.backend if kind == "async-limiter" else lim._core.protocol.backend)

    return asyncio.run(run())


@pytest.mark.parametrize("kind", KINDS)
def test_auto_needs_only_the_rl_commands(server: Server, key: str, kind: str) -> None:
    """A user allowed exactly the RL.* commands (no COMMAND INFO, no PING) finds the module."""
    login = user(server, f"rl-only-{kind}", ["-@all", *(f"+{c}" for c in RL_COMMANDS)])
    with pytest.raises(redis.exceptions.NoPermissionError):
        server.client(**login).execute_command("COMMAND", "INFO", "RL.TAKE")
    assert take_twice(server, kind, key, login) == "module"


@pytest.mark.parametrize("kind", KINDS)
def test_auto_needs_only_fcall(fserver: Server, key: str, kind: str) -> None:
    """A user refused FUNCTION and COMMAND (the library's own calls need the rest) finds
    the library."""
    login = user(fserver, f"no-function-{kind}", ["+@all", "-function", "-command"])
    assert take_twice(fserver, kind, key, login) == "functions"


@pytest.mark.parametrize("backend", ["auto", "functions"])
def test_permit_without_the_module_names_the_fix(fserver: Server, key: str, backend: str) -> None:
    with (
        pytest.raises(BackendNotFound, match="permits need the module"),
        permit(fserver.client(), key, 2, ttl=30, timeout=5, backend=backend),
    ):
        pass

    async def run() -> None:
        r = aredis.Redis(port=fserver.port)
        with pytest.raises(BackendNotFound, match="permits need the module"):
            async with apermit(r, key, 2, ttl=30, timeout=5, backend=backend):
                pass
        await r.aclose()

    asyncio.run(run())


def test_permit_on_module_backend_forced_without_module(fserver: Server, key: str) -> None:
    """backend="module" on a server without it: the acquire's unknown command, as the fix."""
    with (
        pytest.raises(BackendNotFound, match="permits need the module"),
        permit(fserver.client(), key, 2, timeout=5, backend="module"),
    ):
        pass


def test_permit_ttl_ms_still_accepted_with_a_warning(server: Server, key: str) -> None:
    with (
        pytest.warns(DeprecationWarning, match="ttl"),
        permit(server.client(), key, 1, 30_000, timeout=5) as p,
    ):
        assert p.ttl == 30.0 and p.ttl_ms == 30_000
