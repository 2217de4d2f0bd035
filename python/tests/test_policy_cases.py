"""The failure policy's golden cases (protocol/client-cases/failure_policy.json) through the
compiled extension: the package's own ``policy.Fallback`` and ``policy.Health`` (its
defaults: ``instances=None``, the share it derives, seconds to nanoseconds), driven with the
cases' times instead of the clock."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, List, Optional, Tuple

import pytest

from redis_rl.policy import FailurePolicy, Fallback, Health

CASES = Path(__file__).resolve().parents[2] / "protocol" / "client-cases" / "failure_policy.json"
MS = 1_000_000


def keys(e: Any) -> List[str]:
    if "keys" in e:
        return [f"{e['prefix']}{i}" for i in range(e["keys"])]
    return [e["key"]]


def check(name: str, d: Tuple[bool, float, int, int, int], want: Any) -> None:
    granted, remaining, retry, reset, _ = d
    assert (granted, retry, reset) == (
        want["granted"], want["retry_after_ms"], want["reset_after_ms"],
    ), (name, d)  # fmt: skip
    assert remaining == pytest.approx(want["remaining"], abs=1e-6), (name, d)


@pytest.mark.parametrize(
    "case", json.loads(CASES.read_text())["cases"], ids=lambda c: str(c["name"])[:40]
)
def test_failure_policy_case(case: Any) -> None:
    name, lim = case["name"], case["limiter"]
    instances: Optional[int] = lim["instances"]
    fb = Fallback(
        FailurePolicy(lim["policy"]),
        lim["rate"],
        lim["cap"],
        deny_retry_after_ms=lim["deny_retry_after_ms"],
        max_keys=lim["max_keys"],
        instances=instances,
    )
    health = Health(lim["probe_interval_ms"] / 1000)
    for step in case["steps"]:
        at = step.get("at_ms", 0) * MS
        if "call" in step:
            assert health.may_call(at) is step["sends"], name
        elif "reply" in step:
            r = step["reply"]
            for i in range(step.get("times", 1)):
                assert health.succeeded() is (step["outage_ended"] and i == 0), name
                # A string level names a float JSON has no number for ("NaN", "inf").
                level = float(r["level"]) if isinstance(r["level"], str) else r["level"]
                for key in keys(r):
                    fb.observe(key, r["granted"], level, at + i * step.get("every_ms", 0) * MS)
        elif "timeout" in step or "error" in step:
            health.failed(at)
            assert health.down
        elif "take" in step:
            t = step["take"]
            granted, last = 0, None
            for key in keys(t):
                for _ in range(t.get("times", 1)):
                    if "limit" in t:
                        last = fb.decide_with(key, t["n"], *t["limit"], at)
                    else:
                        last = fb.decide_at(key, t["n"], at)
                    granted += last[0]
            if "decision" in step:
                assert last is not None
                check(name, last, step["decision"])
            if "granted_times" in step:
                assert granted == step["granted_times"], (name, at)
        elif "reserve" in step:
            r = step["reserve"]
            check(name, fb.reserve(r["key"], r["n"], r["max_wait_ms"], at), step["decision"])
        elif "meter" in step:
            rate = fb.observed_rate(step["meter"]["key"])
            assert rate is not None and math.isclose(rate, step["meter"]["rate"]), name
        elif "down" in step:
            assert health.down is step["down"], name
        elif "keys_at_most" in step:
            assert fb.keys() <= step["keys_at_most"], name
        else:
            raise AssertionError(f"{name}: unknown step {step}")


def test_bad_input_is_a_clear_error_and_changes_nothing() -> None:
    """Never hurt the host: what the extension refuses is a Python error, never an abort."""
    fb = Fallback(FailurePolicy("allow"), 10, 20, instances=1)
    with pytest.raises(OverflowError):
        fb.decide_at("k", -1)
    with pytest.raises(TypeError):
        fb.observe(b"k", 1, None)  # type: ignore[arg-type]
    assert fb.keys() == 0
    with pytest.raises(ValueError):
        fb.decide_with("k", 1, 0.0, 1.0)
    with pytest.raises(ValueError):
        Fallback(FailurePolicy("allow"), 10, 20, instances=0)
    with pytest.raises(ValueError):
        Fallback(FailurePolicy("allow"), math.inf, 20)
    with pytest.raises(ValueError):
        Fallback(FailurePolicy("allow"), 10, 20, max_keys=0)
    # A malformed grant (negative, not a number) is no grant; an odd level is no level.
    for granted, level in [(-5, None), (math.nan, 1.0), (3, math.nan), (1, -math.inf)]:
        fb.observe("k", granted, level)
    assert fb.decide("k", 1).granted


def test_health_extremes_and_threads() -> None:
    """One probe per interval whatever the threads racing for it; intervals at the ends of the
    clock."""
    import threading

    h = Health(3600)
    h.failed(1)
    assert h.down and not h.may_call(2)
    probes: List[bool] = []
    threads = [
        threading.Thread(
            target=lambda: probes.extend(h.may_call(3600 * 10**9 + 1) for _ in range(500))
        )
        for _ in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(probes) == 1
    never = Health(float("inf"))
    never.failed()
    assert never.down and not never.may_call()
    assert never.succeeded() and not never.down
    with pytest.raises(OverflowError):
        Health(0.5).failed(-1)


def test_many_keys_stay_bounded_and_each_is_decided() -> None:
    fb = Fallback(FailurePolicy("last_known"), 1, 1, max_keys=64, instances=1)
    for i in range(10_000):
        fb.observe(f"k{i}", 1, 0.0, i)
        assert fb.keys() <= 64
    # The last key: Redis reported nothing left.
    assert not fb.decide_at("k9999", 1, 10_000)[0]
    # A key never seen: the configured share, full.
    assert fb.decide_at("new", 1, 10_000)[0]
