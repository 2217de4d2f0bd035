"""Limit strings: the golden cases shared with the Rust client, and every place a limit is
given as text."""

from __future__ import annotations

import asyncio
import json
import math
from typing import Any

import pytest
import redis.asyncio as aredis
from conftest import REPO, Server, peek_fields

from redis_rl import AsyncMultiLimiter, Limit, MultiLimiter, ServerError, parse_limit, parse_limits
from redis_rl.multi import bucket_keys

CASES = json.loads((REPO / "protocol" / "limit_strings.json").read_text())["cases"]


@pytest.mark.parametrize("case", CASES, ids=[repr(c["text"]) for c in CASES])
def test_golden_case(case: dict[str, Any]) -> None:
    if "error" in case:
        with pytest.raises(ValueError) as e:
            parse_limits(case["text"])
        assert case["error"] in str(e.value), str(e.value)
        return
    got = [(x.amount, x.period, x.cap) for x in parse_limits(case["text"])]
    assert got == [tuple(float(v) for v in want) for want in case["limits"]]


def test_ms_is_not_minutes() -> None:
    with pytest.raises(ValueError, match="milliseconds"):
        parse_limit("5/ms")


def test_single_limit_api_refuses_several_with_where_to_give_them() -> None:
    with pytest.raises(ValueError, match="MultiLimiter"):
        parse_limit("10/second;100/minute")
    assert parse_limit("5/minute, burst 10") == (5 / 60, 10.0)


def test_normalized_text_reads_back_the_same() -> None:
    for case in CASES:
        if "limits" in case:
            for lim in parse_limits(case["text"]):
                assert parse_limits(str(lim)) == [lim], str(lim)
    assert str(Limit(5, 60, 5)) == "5/minute"
    assert str(Limit(10, 5, 20)) == "10/5 seconds, burst 20"
    assert Limit(5, 60, 5).suffix == "60s"


def test_refuses_what_is_not_a_string() -> None:
    with pytest.raises(TypeError):
        parse_limits(5)  # type: ignore[arg-type]


def test_text_the_compiled_parser_cannot_take_is_a_clear_error() -> None:
    # A lone surrogate cannot cross into Rust as UTF-8: an ordinary exception, never a crash
    # or a BaseException an `except Exception` would miss.
    with pytest.raises(UnicodeEncodeError):
        parse_limits("5/minute\ud800")
    # Huge and hostile input is refused with the parser's own message.
    for text in ("9" * 100_000 + "/minute", ";" * 100_000, "5/minute, burst " + "1" * 400):
        with pytest.raises(ValueError, match="not a limit"):
            parse_limits(text)


def test_multi_limiter_takes_every_limit_or_none(server: Server, key: str) -> None:
    r = server.client()
    calls = MultiLimiter(r, key, "10/day;3/hour")
    assert [x.suffix for x in calls.limits] == ["86400s", "3600s"]
    for left in (2, 1, 0):
        d = calls.take()
        assert d.granted and d.limit == 3 and round(d.remaining) == left
    d = calls.take()
    assert not d.granted and d.limit == 3 and d.retry_after_ms > 0
    # The refused take debited nothing: the day's bucket has its 7.
    assert math.floor(peek_fields(r, f"{{{key}}}:86400s")["tokens"]) == 7
    assert calls.metrics["granted"] == 3 and calls.metrics["denied"] == 1
    # A key with a hash tag keeps it.
    assert bucket_keys("{acme}:calls", calls.limits) == [
        "{acme}:calls:86400s",
        "{acme}:calls:3600s",
    ]


def test_async_multi_limiter_and_error_replies(server: Server, key: str) -> None:
    r = server.client()
    r.set(f"{{{key}}}:1s", "x")

    async def run() -> None:
        a = aredis.Redis(port=server.port)
        with pytest.raises(ServerError, match="WRONGTYPE"):
            await AsyncMultiLimiter(a, key, "2/second;5/minute").take()
        assert await AsyncMultiLimiter(a, key + "b", "2/second;5/minute").take()
        await a.aclose()

    asyncio.run(run())
