"""A hostile review of the failure policy's extension entries (``redis_rl._core.Fallback``,
``Health``, under ``redis_rl.policy``): malformed input is a clear Python error that changes
nothing, extreme input is decided, a fork mid-use leaves the child a working object."""

from __future__ import annotations

import math
import os
import threading
from typing import Any, Callable, List

import pytest

from redis_rl import _core
from redis_rl.policy import FailurePolicy, Fallback, Health

BAD_NUMBERS: List[Any] = [math.nan, math.inf, -math.inf, -1, 10**400, None, "1", b"1", [1]]
CLEAR = (ValueError, TypeError, OverflowError, UnicodeEncodeError)


def refused(call: Callable[[], Any]) -> bool:
    """Whether ``call`` raised one of the clear errors (a PanicException is a BaseException
    and would escape this, failing the test)."""
    try:
        call()
    except CLEAR:
        return True
    return False


@pytest.mark.parametrize("policy", ["allow", "last_known", "deny"])
def test_malformed_input_to_every_entry_is_a_clear_error_and_changes_nothing(policy: str) -> None:
    fb = Fallback(FailurePolicy(policy), 10, 20, instances=2)
    fb.observe("seen", 3, 5.0, 1)
    before = (fb.keys(), fb.observed_rate("seen"))
    calls: List[Callable[[], Any]] = []
    for bad in BAD_NUMBERS:
        calls += [
            lambda b=bad: Fallback(FailurePolicy(policy), b, 20),
            lambda b=bad: Fallback(FailurePolicy(policy), 10, b),
            lambda b=bad: Fallback(FailurePolicy(policy), 10, 20, deny_retry_after_ms=b),
            lambda b=bad: Fallback(FailurePolicy(policy), 10, 20, max_keys=b),
            lambda b=bad: _core.Fallback(policy, 10, 20, b, 1000, 10),
            lambda b=bad: fb.decide_at("k", b, 1),
            lambda b=bad: fb.decide_with("k", 1, b, 20, 1),
            lambda b=bad: fb.decide_with("k", 1, 10, b, 1),
            lambda b=bad: fb.reserve("k", b, 10, 1),
            lambda b=bad: fb.reserve("k", 1, b, 1),
        ]
        if bad is not None:  # None: the default (instances) or the extension's clock (now)
            calls += [
                lambda b=bad: Fallback(FailurePolicy(policy), 10, 20, instances=b),
                lambda b=bad: fb.decide_at("k", 1, b),
                lambda b=bad: fb.observe("k", 1, 1.0, b),
            ]
        if bad != math.inf:  # an infinite probe interval is "never probe again"
            calls.append(lambda b=bad: Health(b))
        if not isinstance(bad, (float, int)) or (isinstance(bad, int) and bad > 2**64):
            # A grant that is a float is taken (negative, NaN: none; inf: all); others refused.
            calls.append(lambda b=bad: fb.observe("k", b, None, 1))
    for key in ["\ud800", None, b"k", 1]:
        calls += [
            lambda k=key: fb.observe(k, 1, None, 1),
            lambda k=key: fb.decide_at(k, 1, 1),
            lambda k=key: fb.decide_with(k, 1, 10, 20, 1),
            lambda k=key: fb.reserve(k, 1, 10, 1),
            lambda k=key: fb.observed_rate(k),
        ]
    calls += [
        lambda: _core.Fallback("ALLOW", 10, 20, 0.5, 1000, 10),
        lambda: _core.Fallback("allow", 10, 20, 0.0, 1000, 10),
        lambda: _core.Fallback("allow", 10, 20, 1001.0, 1000, 10),
        lambda: _core.Fallback("allow", 10, 20, 0.5, 1000, 0),
        lambda: _core.Health(-1),
        lambda: _core.Health(2**64),
        lambda: Health(0.5).may_call(-1),
        lambda: Health(0.5).failed(2**64),
    ]
    accepted = [i for i, call in enumerate(calls) if not refused(call)]
    assert accepted == [], accepted
    assert (fb.keys(), fb.observed_rate("seen")) == before


def test_health_refuses_what_is_no_interval_with_a_clear_error() -> None:
    """NaN once surfaced as ``round()``'s "cannot convert float NaN to integer" and a
    negative interval was taken as 0 (probe on every call): both are a ValueError naming
    the argument; an infinite interval stays "never probe again"."""
    for bad in [math.nan, -1.0, -math.inf]:
        with pytest.raises(ValueError, match="probe_interval"):
            Health(bad)
    with pytest.raises(TypeError, match="probe_interval"):
        Health("1")  # type: ignore[arg-type]
    assert Health(math.inf).down_until == 0
    assert Health(0).down_until == 0


@pytest.mark.parametrize("policy", ["allow", "last_known"])
def test_extreme_limits_and_sizes_are_decided(policy: str) -> None:
    """Rates 1e-9 to 1e12, caps below one token, n of 0 and 2**64 - 1, instants at the ends
    of the clock: every answer is a decision with finite numbers, never more than asked."""
    for rate in [1e-9, 1e-3, 1.0, 1e6, 1e12]:
        for cap in [1e-6, 0.5, 1.0, 1e6, 1e12]:
            try:
                fb = Fallback(FailurePolicy(policy), rate, cap, instances=3, max_keys=4)
            except ValueError as e:  # beyond the server's bounds: refused, with them
                assert "must be" in str(e)
                continue
            for i, now in enumerate([1, 10**9, 2**63 - 1, 2**64 - 1, 5]):
                key = f"k{i % 6}"
                fb.observe(
                    key, [0, 1, 2**53, 10**30, math.inf][i], [None, 0.0, cap, -1.0, 1e300][i], now
                )
                for n in [0, 1, 2**32, 2**64 - 1]:
                    ok, remaining, _, _, tokens = fb.decide_at(key, n, now)
                    assert math.isfinite(remaining) and tokens == (n if ok else 0)
                    assert not ok or n <= max(cap, 1.0), (rate, cap, n)
                    ok, remaining, _, _, tokens = fb.reserve(key, n, 2**64 - 1, now)
                    assert math.isfinite(remaining) and tokens == (n if ok else 0)
                    ok, *_ = fb.decide_with(key, n, rate * 2, cap * 2, now)
                assert fb.keys() <= 4


def test_a_fork_while_threads_use_the_objects_leaves_the_child_working() -> None:
    """The objects hold no Python lock now: a fork while other threads are calling must
    leave the child a Fallback and a Health it can use (each call runs whole under the GIL,
    so the child sees the state before or after a call, never half of one)."""
    if not hasattr(os, "fork"):
        pytest.skip("no fork")
    fb = Fallback(FailurePolicy("allow"), 1000, 1000, instances=1, max_keys=64)
    health = Health(0.001)
    stop = threading.Event()

    def churn(t: int) -> None:
        i = 0
        while not stop.is_set():
            fb.observe(f"{t}:{i % 500}", 1, None, None)
            fb.decide_at(f"{t}:{i % 500}", 1)
            health.failed()
            health.may_call()
            health.succeeded()
            i += 1

    threads = [threading.Thread(target=churn, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    try:
        for _ in range(20):
            pid = os.fork()
            if pid == 0:  # the child: its state is whole, every call answers
                code = 1
                try:
                    assert fb.keys() <= 64
                    child = Fallback(FailurePolicy("allow"), 10, 10, instances=1)
                    got = sum(child.decide_at("c", 1, 1)[0] for _ in range(20))
                    fb.decide_at("child", 1)
                    health.failed(1)
                    assert health.down and health.may_call(10**9)
                    code = 0 if got == 10 else 2
                finally:
                    os._exit(code)
            _, status = os.waitpid(pid, 0)
            assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    finally:
        stop.set()
        for t in threads:
            t.join()
