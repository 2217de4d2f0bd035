"""Limit strings: the golden cases shared with the Rust client, and every place a limit is
given as text."""

from __future__ import annotations

import json
from typing import Any

import pytest
from conftest import REPO

from redis_rl import Limit, parse_limit, parse_limits

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
