"""The share holder's golden cases (protocol/client-cases/share.json) through the compiled
extension (redis_rl._core.ShareHolder and ShareRefresh): the same steps the core's tests
run, with Python values for replies, the package's Decision and Metrics, and the
extension's conversions in between."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict

import pytest

from redis_rl import Decision, Metrics, ProtocolError, Source, _core

CASES = Path(__file__).resolve().parents[2] / "protocol" / "client-cases" / "share.json"
DOC = json.loads(CASES.read_text())
MS = 1_000_000


class _Owner:
    """What the metrics watch the holder's counts for (alive for the whole test run)."""


_OWNER = _Owner()


def reply(j: Any) -> Any:
    """A case's reply as redis-py hands it over (bytes, int, None, list, float)."""
    if isinstance(j, str):
        return j.encode()
    if isinstance(j, list):
        return [reply(x) for x in j]
    if isinstance(j, dict):
        return float(j["double"])
    return j


@pytest.mark.parametrize("case", DOC["cases"], ids=lambda c: str(c["name"])[:40])
def test_share_holder_case(case: Any) -> None:
    name = case["name"]
    h: Dict[str, Any] = {**DOC["holder"], **case["holder"]}
    metrics = Metrics()
    holder = _core.ShareHolder(
        h["policy"],
        float(h["allow_share"]),
        float(h["rate"]),
        float(h["cap"]),
        h["instances"],
        h["allow_for_ms"] * MS,
        h["period_ms"] * MS,
        h["deny_retry_after_ms"] * MS,
        0,
        Decision,
        Source.SHARE,
        Source.FALLBACK,
        metrics,
    )
    refresh = _core.ShareRefresh(
        h["key"],
        float(h["rate"]),
        float(h["cap"]),
        h["period_ms"],
        h["version"],
        float(h["headroom"]),
        0,
    )
    sent, counted = 0, {"calls": 0, "granted": 0, "tokens_granted": 0}
    for step in case["steps"]:
        now = step.get("at_ms", 0) * MS
        if "send" in step:
            args, event = refresh.send(step["send"], h["id"], holder.attempted(), now)
            if "command" in step:
                assert [a.decode() for a in args] == step["command"], name
            assert event.kind == "sending"
            holder.apply(event)
            sent = now
        elif "release" in step:
            args = refresh.release_command(step["release"], h["id"])
            assert [a.decode() for a in args] == step["command"], name
        elif "reply" in step:
            try:
                event, next_ns = refresh.answered(reply(step["reply"]), sent, now, 0.0)
                assert "protocol_error" not in step, name
            except ProtocolError:
                assert step.get("protocol_error") is True, name
                event, next_ns = refresh.failed()
            holder.apply(event)
            assert next_ns // MS == step["next_ms"], (name, step)
        elif "error" in step:
            event, next_ns = refresh.failed()
            assert event.kind == "failed"
            holder.apply(event)
            assert next_ns // MS == step["next_ms"], (name, step)
        elif "timeout" in step or "refused" in step:
            event, next_ns = refresh.outage("refused" in step, now, h["probe_ms"] * MS)
            assert event.kind == "outage"
            holder.apply(event)
            assert next_ns // MS == step["next_ms"], (name, step)
        elif "take" in step:
            n = step["take"]
            d = holder.take(n, now)
            if step.get("failed"):
                assert d is None, (name, step)
                continue
            w = step["decision"]
            assert isinstance(d, Decision), (name, d)
            assert d.granted == w["allowed"], (name, step, d)
            assert d.source == (Source.FALLBACK if w["fallback"] else Source.SHARE), (name, d)
            assert d.remaining == pytest.approx(w["remaining"], abs=1e-6), (name, d)
            assert (d.retry_after_ms, d.reset_after_ms) == (
                w["retry_after_ms"],
                w["reset_after_ms"],
            ), (name, step, d)
            assert d.pinned == w["pinned"], (name, d)
            assert (d.tokens, d.limit) == (n if d.granted else 0, float(h["cap"])), (name, d)
            counted["calls"] += 1
            counted["granted"] += int(d.granted)
            counted["tokens_granted"] += d.tokens
        elif "share" in step:
            rate, burst, tokens, holders, fallback, pinned = holder.info(now)
            w = step["share"]
            assert (rate, burst, tokens) == pytest.approx((w["rate"], w["burst"], w["tokens"]))
            assert (holders, fallback, pinned) == (w["holders"], w["fallback"], w["pinned"]), name
        elif "tick" in step:
            assert refresh.drifted(now, holder.attempted()) == step["drifted"], name
        else:
            raise AssertionError(f"{name}: unknown step {step}")
    # Every decision is counted once: the share's grants in the holder (drained when the
    # metrics are read), the rest in the metrics as they happen.
    metrics.watch(_OWNER, holder.drain)
    assert {k: metrics[k] for k in counted} == counted, name


def test_bad_takes_are_refused_and_change_nothing() -> None:
    holder = _core.ShareHolder(
        "deny", 1.0, 10.0, 5.0, 1, 0, MS, MS, 0, Decision, Source.SHARE, Source.FALLBACK, Metrics()
    )
    for n in (0, -1, True, 1.0, "1", None, 6, 2**70, -(2**70)):
        with pytest.raises(ValueError):
            holder.take(n, 0)
    assert holder.attempted() == 0 and holder.drain() == (0, 0, 0)
    with pytest.raises(ValueError):
        _core.ShareHolder(
            "maybe", 1.0, 10, 5, 1, 0, MS, MS, 0, Decision, Source.SHARE, Source.FALLBACK, None
        )
    with pytest.raises(ValueError):
        _core.ShareRefresh("k", 10.0, 5.0, 1000, None, float("nan"), 0)
    for rate, cap in ((float("nan"), 5.0), (10.0, float("inf")), (0.0, 5.0)):
        with pytest.raises(ValueError):
            _core.ShareRefresh("k", rate, cap, 1000, None, 0.0, 0)
    refresh = _core.ShareRefresh("k", 10.0, 5.0, 1000, None, 0.0, 0)
    with pytest.raises(ValueError):
        refresh.send("cluster", "h", 0, 0)
    for bad in (object(), [object()], {1: 2}, [[[[[[[[[[1]]]]]]]]]], 2**80, True):
        with pytest.raises(ProtocolError):
            refresh.answered(bad, 0, 0, 0.0)
