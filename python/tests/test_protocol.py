"""Wire encoding and reply normalisation (no server)."""

from __future__ import annotations

import json
from dataclasses import asdict, astuple
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest

from redis_rl import _protocol as p
from redis_rl import pins
from redis_rl._core import parse_share
from redis_rl.decision import Decision, Source
from redis_rl.errors import BackendNotFound
from redis_rl.policy import DENY, FailurePolicy, Fallback


def test_module_commands() -> None:
    m = p.Protocol("module")
    # The take, reserve and lease commands are the client core's (client-core/src/commands.rs,
    # lease.rs): every word text.
    assert m.take("k", 5, 10, 2) == ("RL.TAKE", "k", "5", "10", "2", "WITHSTATE")
    assert m.take("k", 0.5, 10.25, 1, False, init=0) == (
        *("RL.TAKE", "k", "0.5", "10.25", "1"),
        *("INIT", "0"),
    )
    assert m.lease("k", 100, 200, 20, 2000, 3, (7, 4)) == (
        *("RL.LEASE", "k", "100", "200", "20", "2000"),
        *("MIN", "3", "RETURN", "7", "4"),
    )
    assert m.lease("k", 1, 2, 2, 100)[-2:] == ("MIN", "1")
    assert m.return_("k", 7, 4) == ("RL.RETURN", "k", "7", "4")
    assert m.mtake([("a", 1, 2), ("b", 3, 4)], 1, True) == (
        "RL.MTAKE",
        1,
        "a",
        "1",
        "2",
        "b",
        "3",
        "4",
        "WITHSTATE",
    )
    assert m.reserve("k", 1, 2, 1, 500) == ("RL.RESERVE", "k", "1", "2", "1", "500")
    assert m.refund("k", 3) == ("RL.REFUND", "k", 3)
    assert m.acquire("k", 4, 1000) == ("RL.ACQUIRE", "k", 4, 1000)
    assert m.release("k", 9) == ("RL.RELEASE", "k", 9)
    assert m.renew("k", 9, 1000) == ("RL.RENEW", "k", 9, 1000)


def test_functions_commands() -> None:
    f = p.Protocol("functions")
    assert f.take("k", 5, 10, 2) == ("FCALL", "rl_take", "1", "k", "5", "10", "2", "WITHSTATE")
    assert f.reserve("k", 1, 2, 1, 500, 0) == (
        *("FCALL", "rl_reserve", "1", "k", "1", "2", "1", "500"),
        *("INIT", "0"),
    )
    assert f.peek("k") == ("FCALL", "rl_peek", 1, "k")
    assert f.mtake([("a", 1, 2), ("b", 3, 4)], 2, True, 0) == (
        "FCALL",
        "rl_mtake",
        2,
        "a",
        "b",
        2,
        "1",
        "2",
        "3",
        "4",
        "WITHSTATE",
        "INIT",
        "0",
    )
    assert f.lease("k", 1, 2, 2, 100, 1, (5, 0))[:4] == ("FCALL", "rl_lease", "1", "k")
    with pytest.raises(ValueError):
        p.Protocol("auto")


def test_replies_normalised_for_resp2_and_resp3() -> None:
    assert p.parse_take([1, b"7.5", 0, 1250]) == p.TakeReply(1, 7.5, 0, 1250)
    assert p.parse_take([0, 7.5, 10, 1250]) == p.TakeReply(0, 7.5, 10, 1250)
    assert p.parse_take([1, "7.5", 0, 1]) == p.TakeReply(1, 7.5, 0, 1)
    flat = [
        b"tokens",
        b"1.5",
        b"rate",
        b"2",
        b"cap",
        b"10",
        b"reset_after_ms",
        4250,
        b"leases",
        1,
        b"leased_tokens",
        3,
    ]
    as_map = {
        b"tokens": 1.5,
        b"rate": 2.0,
        b"cap": 10.0,
        b"reset_after_ms": 4250,
        b"leases": 1,
        b"leased_tokens": 3,
    }
    assert p.parse_peek(flat) == p.parse_peek(as_map) == p.PeekReply(1.5, 2, 10, 4250, 1, 3)
    assert p.parse_peek(None) is None
    assert p.parse_mtake([0, b"b", 250]) == p.MTakeReply(0, "b", 250, None)
    assert p.parse_mtake([1, None, 0, [b"1", 2.5]]).remaining == [1.0, 2.5]
    with pytest.raises(p.ProtocolError):
        p.parse_take(1)


def test_backend_choice() -> None:
    assert p.module_present([[b"RL.TAKE", -4]]) and not p.module_present([None])
    assert p.functions_present([[b"library_name", b"rl", b"engine", b"LUA"]])
    assert p.functions_present([{"library_name": "rl"}]) and not p.functions_present([])
    assert p.decide_backend(True, True) == "module"
    assert p.decide_backend(False, True) == "functions"
    with pytest.raises(BackendNotFound, match=r"module.*functions"):
        p.decide_backend(False, False)


def test_headers_round_up() -> None:
    d = Decision(False, 0.7, 1001, 9500, 0, 100.0, Source.SERVER)
    assert d.headers() == {
        "X-RateLimit-Limit": "100",
        "X-RateLimit-Remaining": "0",
        "X-RateLimit-Reset": "10",
        "Retry-After": "2",
    }
    ok = Decision(True, 3.9, 0, 0, 1, 2.5)
    assert ok.headers() == {
        "X-RateLimit-Limit": "2.5",
        "X-RateLimit-Remaining": "3",
        "X-RateLimit-Reset": "0",
    }
    assert Decision(False, 0, 1, 0).headers()["Retry-After"] == "1"


def test_local_policies() -> None:
    allow = Fallback(FailurePolicy.allow(0.5), 1e-6, 20)
    assert sum(allow.decide("a", 1).granted for _ in range(50)) == 10
    assert sum(allow.decide("b", 1).granted for _ in range(50)) == 10
    deny = Fallback(DENY, 10, 20, deny_retry_after_ms=1500)
    d = deny.decide("a", 1)
    assert not d.granted and d.retry_after_ms == 1500 and d.source is Source.FALLBACK
    # More than the local bucket can hold (a quarter of 2): the hint, not a wait that
    # cannot end.
    d = Fallback(FailurePolicy.allow(), 2.0, 2.0).decide("a", 1)
    assert d.granted
    d = Fallback(FailurePolicy.allow(), 2.0, 4.0).decide("a", 2)
    assert not d.granted and d.retry_after_ms == 1000 and d.reset_after_ms == 0


def test_version_is_sent_only_when_set() -> None:
    m, f = p.Protocol("module"), p.Protocol("functions")
    assert m.take("k", 5, 10, 2, version=3) == (
        *("RL.TAKE", "k", "5", "10", "2", "WITHSTATE"),
        *("VERSION", "3"),
    )
    assert "VERSION" not in m.take("k", 5, 10, 2)
    assert m.lease("k", 1, 2, 2, 100, version=0)[-2:] == ("VERSION", "0")
    assert "VERSION" not in m.lease("k", 1, 2, 2, 100)
    assert m.reserve("k", 1, 2, 1, 500, version=2**53 - 1)[-2:] == ("VERSION", str(2**53 - 1))
    assert m.mtake([("a", 1, 2), ("b", 3, 4)], 1, version=7)[-2:] == ("VERSION", 7)
    assert f.take("k", 5, 10, 1, False, version=2) == (
        *("FCALL", "rl_take", "1", "k", "5", "10", "1"),
        *("VERSION", "2"),
    )
    assert f.mtake([("a", 1, 2)], 1, version=1)[-2:] == ("VERSION", 1)
    for bad in (-1, 2**53, 1.0, True):
        with pytest.raises((ValueError, TypeError)):
            p.check_version(bad)  # type: ignore[arg-type]
    p.check_version(None)


def test_peek_version() -> None:
    flat = [b"tokens", b"1", b"rate", b"1", b"cap", b"2", b"reset_after_ms", 5]
    reply = p.parse_peek([*flat, b"leases", 0, b"leased_tokens", 0, b"version", 4])
    assert reply is not None and reply.version == 4
    old = p.parse_peek(flat)
    assert old is not None and old.version is None


# The golden protocol cases (protocol/cases/*.json): every case's reply, in both RESP
# versions as redis-py hands them over, parses to the numbers the case says.
CASES = Path(__file__).resolve().parents[2] / "protocol" / "cases"
BASE_US = 1_700_000_000_000_000  # ids in a case count from the call's microsecond clock


# Commands this client sends nothing of yet: token budgets' server half came first (the
# client half, TokenBudget, goes into the shared client core).
NOT_PARSED_YET = ("RL.BUDGET", "RL.SETTLE")


def _golden() -> List[Tuple[str, Dict[str, Any]]]:
    out = []
    for path in sorted(CASES.glob("*.json")):
        for case in json.loads(path.read_text())["cases"]:
            if isinstance(case["resp3"], dict) and "error" in case["resp3"]:
                continue
            if case["args"][0] in NOT_PARSED_YET:
                continue
            out.append((f"{path.stem}: {case['name']}", case))
    return out


def _reply(j: Any) -> Any:
    """A case's typed reply as redis-py returns it."""
    if j is None or isinstance(j, int):
        return j
    if isinstance(j, str):
        return j.encode()
    if isinstance(j, list):
        return [_reply(x) for x in j]
    ((tag, x),) = j.items()
    if tag == "simple":  # a status reply: redis-py hands FCALL's and RL.PIN's over as bytes
        return x.encode()
    if tag in ("double", "tokens"):
        return float(x)
    if tag in ("double_text", "tokens_text"):
        return repr(float(x)).removesuffix(".0").encode()
    if tag == "ms":
        return x
    if tag == "id":
        return BASE_US + x
    if tag == "map":
        return {k.encode(): _reply(v) for k, v in x}
    if tag == "pairs":
        return [y for k, v in x for y in (k.encode(), _reply(v))]
    raise AssertionError(f"unknown tag {tag}")


def _plain(j: Any) -> Any:
    """The values a case's RESP3 reply says, markers resolved."""
    if isinstance(j, list):
        return [_plain(x) for x in j]
    if isinstance(j, dict):
        ((tag, x),) = j.items()
        if tag == "id":
            return BASE_US + x
        if tag == "map":
            return {k: _plain(v) for k, v in x}
        if tag == "simple":
            return j
        return x
    return j


def _parse(args: List[str], reply: Any) -> Any:
    name = args[0].upper()
    with_state = any(isinstance(a, str) and a.upper() == "WITHSTATE" for a in args)
    if name == "RL.TAKE" and with_state:
        t = p.parse_take(reply)
        fields = [t.granted, t.remaining, t.retry_after_ms, t.reset_after_ms]
        return fields + ([t.pinned] if t.pinned is not None else [])  # a pin's fifth element
    if name == "RL.LEASE":
        return list(astuple(p.parse_lease(reply)))
    if name == "RL.RESERVE":
        return list(astuple(p.parse_reserve(reply)))
    if name == "RL.ACQUIRE":
        r = p.parse_acquire(reply)
        return [int(r.granted), r.permit_id, r.in_use, r.retry_after_ms]
    if name == "RL.MTAKE":
        m = p.parse_mtake(reply)
        row: List[Any] = [m.granted, m.denied_by, m.retry_after_ms]
        return row + ([m.remaining] if m.remaining is not None else [])
    if name == "RL.PEEK":
        peeked = p.parse_peek(reply)
        if peeked is None:
            return None
        fields = asdict(peeked)
        # The pin that decides, a field only then: read as the client reads a pin's kind.
        raw = reply if isinstance(reply, dict) else dict(zip(reply[::2], reply[1::2]))
        if b"pinned" in raw:
            fields["pinned"] = p.pin_kind(raw[b"pinned"])
        return fields
    if name == "RL.PIN":
        pins.check_ok(reply)
        return {"simple": "OK"}
    if name == "RL.PINNED":
        info = pins.parse_pinned(reply)
        if info is None:
            return None
        ms_left = -1 if info.ms_left is None else info.ms_left
        return {"kind": info.kind, "rate": info.rate, "cap": info.cap, "ms_left": ms_left}
    if name == "RL.SHARE":
        rate, burst, lease_ms, refresh_ms, n, pinned = parse_share(reply)
        row: List[Any] = [rate, burst, lease_ms, refresh_ms, n]
        return row + ([pinned] if pinned is not None else [])  # a pin's sixth element
    if name == "RL.REFUND":
        return p.to_float(reply)
    return p.to_int(reply)


@pytest.mark.parametrize("case", [c for _, c in _golden()], ids=[n for n, _ in _golden()])
def test_golden_case_replies_parse(case: Dict[str, Any]) -> None:
    want = _plain(case["resp3"])
    for protocol in ("resp2", "resp3"):
        got = _parse(case["args"], _reply(case[protocol]))
        assert got == want, protocol


@pytest.mark.parametrize(
    "reply",
    [
        None,
        1,
        True,
        b"OK",
        [1, 2, 3],
        [1, b"x", 0, 1],
        [-1, 1, 0, 1],
        [1, float("nan"), 0, 1],
        [1, 1, 0, 1, b"pinned?"],
        [1, 1, 0, 1, b"rate", 6],
        [2**64, 1, 0, 1],
        [object(), 1, 0, 1],
    ],
)
def test_malformed_take_reserve_acquire_replies_are_protocol_errors(reply: Any) -> None:
    # The core's parsers: any reply not of the command's shape is a ProtocolError, never a
    # panic, an IndexError or a number made up.
    for parse in (p.parse_take, p.parse_reserve, p.parse_acquire):
        with pytest.raises(p.ProtocolError):
            parse(reply)
    with pytest.raises(p.ProtocolError):
        p.parse_acquire([2, 1, 1, 0])  # granted is 0 or 1


@pytest.mark.parametrize(
    "reply",
    [1, b"x", [b"tokens"], [1, 2], {b"tokens": 1}, [b"tokens", b"x", b"rate", 1, b"cap", 1]],
)
def test_malformed_peek_replies_are_protocol_errors(reply: Any) -> None:
    with pytest.raises(p.ProtocolError):
        p.parse_peek(reply)
