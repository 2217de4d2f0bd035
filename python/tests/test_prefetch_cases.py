"""The prefetch ledger's golden cases (protocol/client-cases/prefetch.json) through the
compiled extension (redis_rl._core.Ledger, what PrefetchLimiter and AsyncPrefetchLimiter
run): the same steps the core's and the Rust client's tests run, with Python values for
replies and the extension's conversions in between."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict

import pytest

from redis_rl import ProtocolError, _core

CASES = Path(__file__).resolve().parents[2] / "protocol" / "client-cases" / "prefetch.json"
MS = 1_000_000


def reply(j: Any) -> Any:
    """A case's reply as redis-py hands it over (bytes, int, None, list)."""
    if isinstance(j, str):
        return j.encode()
    if isinstance(j, list):
        return [reply(x) for x in j]
    return j


def ledger(spec: Dict[str, Any]) -> _core.Ledger:
    return _core.Ledger(
        spec["key"], spec["rate"], spec["cap"], spec["batch"], spec["ttl_ms"],
        spec["renew_at"], spec["jitter"], spec["timeout_ms"] / 1000,
        spec.get("init"), spec.get("version"),
    )  # fmt: skip


def local(got: Any) -> Any:
    kind, value, renew = got
    if kind == "granted":
        return {"granted": value, "renew": renew}
    if kind == "denied":
        return {"denied": value}
    return "ask"


def landed(kind: str, served: bool, value: int) -> Any:
    if kind == "granted":
        return {"granted": True, "served": served, "left": value}
    if kind == "denied":
        return {"denied": value}
    return kind


def pairs(leases: Any) -> Any:
    return [list(x) for x in leases]


@pytest.mark.parametrize(
    "case", json.loads(CASES.read_text())["cases"], ids=lambda c: str(c["name"])[:40]
)
def test_prefetch_ledger_case(case: Any) -> None:
    name = case["name"]
    lg = ledger(case["ledger"])
    for i, step in enumerate(case["steps"]):
        at = f"{name}, step {i}"
        now = step.get("at_ms", 0) * MS
        backend = step.get("backend", "module")
        if "take" in step:
            assert local(lg.take(step["take"], now, step.get("down", False))) == step["local"], at
        elif "begin" in step:
            kind, flight, command = lg.begin(backend, step["begin"], now)
            if kind == "send":
                assert command is not None
                got = {"flight": flight, "command": [a.decode() for a in command]}
                assert got == step["send"], at
            elif kind == "busy":
                assert flight == step["busy"], at
            else:
                assert step["closed"], at
        elif "reply" in step:
            r = reply(step["reply"])
            if step.get("protocol_error"):
                with pytest.raises(ProtocolError):
                    lg.landed(step["flight"], r, now, step.get("draw", 0.5))
                continue
            kind, served, value, back = lg.landed(step["flight"], r, now, step.get("draw", 0.5))
            assert landed(kind, served, value) == step["landed"], at
            assert pairs(back) == step["give_back"], at
        elif "error" in step:
            assert pairs(lg.failed(step["flight"], step["error"], now)) == step["give_back"], at
        elif "timeout" in step:
            assert lg.give_up(step["timeout"]) == step["claimed"], at
        elif "cancel" in step:
            lg.release(step["cancel"], False, now)
        elif "judge" in step:
            assert lg.judge(step["judge"], now, step["limit_ms"] * MS) == step["judged"], at
        elif "close" in step:
            assert pairs(lg.close(now)) == step["give_back"], at
        elif "grant" in step:
            assert lg.grant(step["grant"], now) == step["left"], at
        elif "forget" in step:
            lg.forget()
        elif "held" in step:
            assert lg.held(now) == step["held"], at
        elif "late_bound_ms" in step:
            assert lg.late_bound() // MS == step["late_bound_ms"], at
        elif "enter" in step:
            got = lg.enter_line(step["enter"], step["front"], step.get("again"))
            assert got == step["waiter"], at
        elif "leave" in step:
            assert lg.leave_line(step["leave"]) == step["next"], at
        elif "wake" in step:
            assert lg.wake(step["wake"]) == step["woken"], at
        elif "counters" in step:
            got = lg.counters()
            for k, v in step["counters"].items():
                assert got[k] == v, f"{at}: counter {k}"
        else:
            raise AssertionError(f"{at}: no event in {step}")


def test_anything_handed_back_is_read_or_refused() -> None:
    """Any Python value as a reply, any event out of order: an answer or an error, never a
    crash of the interpreter."""
    lg = _core.Ledger("k", 10.0, 100.0, 20, 1000, 0.2, 0.1, 0.2)
    _, flight, _ = lg.begin("module", 1, 0)
    for bad in [object(), {"a": 1}, [b"x"] * 4, [1, 2], 2**70, [[[[[[[[[[1]]]]]]]]]], "OK", True]:
        with pytest.raises(ProtocolError):
            lg.landed(flight, bad, 1, 0.5)
    for f in (flight, 999, 0):
        lg.landed(f, [20, 1, 1000, 0], 2, 0.5)
        lg.failed(f, "unknown", 3)
        lg.give_up(f)
        lg.claim(f)
        lg.release(f, True, 4)
        lg.judge(f, 5, 0)
    with pytest.raises(ValueError):
        lg.failed(flight, "nonsense", 0)
    with pytest.raises(ValueError):
        lg.begin("redis", 1, 0)
    with pytest.raises(ValueError):
        _core.Ledger("k", 10.0, 5.0, 20, 1000, 0.2, 0.1, 0.2)
    with pytest.raises(OverflowError):
        lg.take(-1, 0, False)


def test_both_limiters_wait_for_a_lease_reply_up_to_the_one_bound() -> None:
    """Divergence 4, settled: a lease call's reply is awaited ``max(10 s, ttl + timeout +
    1 s)`` by the sync and the asyncio limiter alike (was: 30 s at least for asyncio, and
    ``ttl + timeout + 1 s`` before the next call could be sent), the bound the Rust client
    keeps too (protocol/client-cases/prefetch.json). Nothing is sent to build a limiter."""
    import redis
    import redis.asyncio as aredis

    from redis_rl import AsyncPrefetchLimiter, PrefetchLimiter

    for ttl, timeout, bound in [(2.0, 0.2, 10.0), (60.0, 2.0, 63.0), (9.0, 0.5, 10.5)]:
        sync = PrefetchLimiter(redis.Redis(), "k", 10, 100, batch=20, ttl=ttl, timeout=timeout)
        asy = AsyncPrefetchLimiter(aredis.Redis(), "k", 10, 100, batch=20, ttl=ttl, timeout=timeout)
        assert sync._core.late_limit == asy._core.late_limit == pytest.approx(bound)
        sync.close()
