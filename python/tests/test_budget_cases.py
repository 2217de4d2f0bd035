"""The token budget's state machine golden cases (protocol/client-cases/token_budget.json)
through the compiled extension (redis_rl._core.Budget): the same steps the core's tests run,
with Python values for replies and the extension's conversions in between."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, List, Optional

import pytest

from redis_rl import ProtocolError, _core

CASES = Path(__file__).resolve().parents[2] / "protocol" / "client-cases" / "token_budget.json"
MS = 1_000_000


def reply(j: Any) -> Any:
    """A case's reply as redis-py hands it over (bytes, int, None, list, float)."""
    if isinstance(j, str):
        return j.encode()
    if isinstance(j, list):
        return [reply(x) for x in j]
    if isinstance(j, dict):
        return float(j["double"])
    return j


def decision(name: str, g: Any, want: Any) -> None:
    granted, retry, denied_by, remaining, source, ticket = g
    assert (granted, retry, denied_by, source, ticket.open()) == (
        want["granted"], want["retry_after_ms"], want["denied_by"], want["source"], want["open"],
    ), name  # fmt: skip
    if want["remaining"] is None:
        assert remaining is None, name
    else:
        assert remaining == pytest.approx(want["remaining"], abs=1e-6), name


@pytest.mark.parametrize(
    "case", json.loads(CASES.read_text())["cases"], ids=lambda c: str(c["name"])[:40]
)
def test_budget_state_machine_case(case: Any) -> None:
    name, b = case["name"], case["budget"]
    budget = _core.Budget(
        b["key"], [tuple(x) for x in b["limits"]], b["ttl_ms"], b["policy"], b["share"]
    )
    costs: List[int] = []
    ticket: Optional[Any] = None
    for step in case["steps"]:
        now = step.get("at_ms", 0) * MS
        backend = step.get("backend", "module")
        if "reserve" in step:
            r = step["reserve"]
            named = list(r.get("named", {}).items())
            if "error" in step:
                with pytest.raises(ValueError) as e:
                    budget.costs(r.get("tokens"), named)
                assert step["error"] in str(e.value), name
                continue
            costs = budget.costs(r.get("tokens"), named)
            if "command" in step:
                got = [a.decode() for a in budget.reserve_command(backend, costs)]
                assert got == step["command"], name
            if step.get("outage"):
                g = budget.outage(costs, now)
                decision(name, g, step["decision"])
                if g[0] or ticket is None:
                    ticket = g[5]
        if "reply" in step:
            if step.get("protocol_error"):
                with pytest.raises(ProtocolError):
                    budget.reserved(costs, reply(step["reply"]))
                continue
            g = budget.reserved(costs, reply(step["reply"]))
            decision(name, g, step["decision"])
            if g[0] or ticket is None:  # a denial's ticket settles nothing
                ticket = g[5]
        if "settle" in step:
            assert ticket is not None, name
            kind, value = budget.settle(backend, ticket, step["settle"], now)
            if kind == "send":
                assert [a.decode() for a in value] == step["command"], name
            elif kind == "done":
                assert value == step["done"], name
            else:
                assert step.get("nothing"), name
        if "settle_reply" in step:
            assert budget.settled(reply(step["settle_reply"])) == step["settled"], name
        if "counters" in step:
            assert dict(budget.counters()) == step["counters"], name
