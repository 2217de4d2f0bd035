"""The limits' math and the token rule as pure functions, on a fake clock: no sleeping."""

from __future__ import annotations

import math
from typing import Any, Dict, List

import pytest

from provider import tokens
from provider.limits import (
    INPUT_TOKENS,
    OUTPUT_TOKENS,
    REQUESTS,
    Bucket,
    Limits,
    Refusal,
    Reservation,
    go_duration,
)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_bucket_starts_full_and_refills_continuously_up_to_its_capacity() -> None:
    bucket = Bucket(60, now=0.0)  # 60 a minute: 1 a second
    bucket.take(60, now=0.0)
    assert bucket.remaining(0.0) == 0
    assert bucket.remaining(10.0) == 10
    assert bucket.until_full(10.0) == 50.0
    assert bucket.remaining(1000.0) == 60
    assert bucket.until_full(1000.0) == 0.0


def test_the_wait_is_the_shortfall_over_the_rate_and_retry_after_rounds_it_up() -> None:
    bucket = Bucket(600, now=0.0)  # 10 a second
    bucket.take(600, now=0.0)
    assert bucket.wait(25, now=0.0) == 2.5
    assert bucket.wait(25, now=2.5) == 0.0
    assert bucket.wait(601, now=0.0) == math.inf
    assert Refusal(OUTPUT_TOKENS, 2.5, 25, 600, 600).retry_after_header == 3
    assert Refusal(OUTPUT_TOKENS, 2.0, 20, 600, 600).retry_after_header == 2
    assert Refusal(OUTPUT_TOKENS, 2.0000000000001, 20, 600, 600).retry_after_header == 2
    assert Refusal(OUTPUT_TOKENS, 2.0005, 20, 600, 600).retry_after_ms == 2001
    too_large = Refusal(OUTPUT_TOKENS, math.inf, 601, 0, 600)
    assert (too_large.retry_after_header, too_large.retry_after_ms) == (None, None)


def test_admission_is_all_or_nothing() -> None:
    clock = FakeClock()
    limits = Limits(rpm=10, itpm=100, otpm=50, clock=clock)
    assert isinstance(limits.admit(10, 40), Reservation)
    refusal = limits.admit(10, 40)
    assert isinstance(refusal, Refusal)
    assert refusal.limit == OUTPUT_TOKENS
    # 10 output tokens left, 40 wanted, 50/60 a second: 36 s.
    assert refusal.retry_after == pytest.approx(36.0)
    assert (refusal.requested, refusal.used, refusal.capacity) == (40, 40, 50)
    # The refused request took nothing from the request and input limits.
    states = {s.name: s.remaining for s in limits.states()}
    assert states == {REQUESTS: 9, INPUT_TOKENS: 90, OUTPUT_TOKENS: 10}
    assert limits.counters.refused == {REQUESTS: 0, INPUT_TOKENS: 0, OUTPUT_TOKENS: 1}
    clock.now += 36
    assert isinstance(limits.admit(10, 40), Reservation)


def test_a_refusal_names_the_limit_with_the_longest_wait() -> None:
    limits = Limits(rpm=1, otpm=60, clock=FakeClock())
    assert isinstance(limits.admit(0, 60), Reservation)
    refusal = limits.admit(0, 30)
    assert isinstance(refusal, Refusal)
    # Requests: 60 s for one more; output tokens: 30 s for 30.
    assert (refusal.limit, refusal.retry_after) == (REQUESTS, 60.0)


def test_settle_gives_back_the_unused_estimate_but_never_above_capacity() -> None:
    clock = FakeClock()
    limits = Limits(otpm=600, clock=clock)  # 10 a second
    first = limits.admit(5, 400)
    second = limits.admit(5, 100)
    assert isinstance(first, Reservation) and isinstance(second, Reservation)
    limits.settle(first, 30)  # 370 back: 100 + 370
    assert [s.remaining for s in limits.states()] == [470]
    clock.now += 10  # +100: 570
    limits.settle(second, 0)  # 100 unused, only 30 fit
    assert [s.remaining for s in limits.states()] == [600]
    c = limits.counters
    assert (c.output_reserved, c.output_actual, c.output_returned) == (500, 30, 470)
    assert (c.in_flight, c.max_in_flight) == (0, 2)


def test_an_actual_above_the_estimate_is_charged() -> None:
    limits = Limits(otpm=600, clock=FakeClock())
    reservation = limits.admit(0, 100)
    assert isinstance(reservation, Reservation)
    limits.settle(reservation, 150)
    assert [s.remaining for s in limits.states()] == [450]


def test_no_limits_admit_everything() -> None:
    limits = Limits(clock=FakeClock())
    assert isinstance(limits.admit(10**9, 10**9), Reservation)
    assert limits.states() == []


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0.0, "0ms"), (0.0001, "1ms"), (0.012, "12ms"), (1.0, "1s"), (1.5, "1.5s"),
     (360.0, "6m0s"), (179.56, "2m59.56s")],
)  # fmt: skip
def test_go_duration_writes_openais_reset_format(seconds: float, text: str) -> None:
    assert go_duration(seconds) == text


def test_prompt_tokens_follow_the_documented_rule() -> None:
    messages: List[Dict[str, Any]] = [
        {"role": "system", "content": "x" * 9},  # ceil(9/4) = 3, + 4
        {"role": "user", "content": [{"type": "text", "text": "abcd"}], "name": "bob"},  # 2 + 4
        {"role": "assistant", "content": None},  # 0 + 4
    ]
    assert tokens.prompt_tokens(messages) == 3 + (3 + 4) + (2 + 4) + (0 + 4)


def test_max_output_prefers_max_completion_tokens_then_max_tokens_then_the_default() -> None:
    assert tokens.max_output({"max_completion_tokens": 5, "max_tokens": 9}, 100) == 5
    assert tokens.max_output({"max_tokens": 9}, 100) == 9
    assert tokens.max_output({}, 100) == 100
    for bad in (0, -1, "5", True, 2.5):
        with pytest.raises(tokens.BadRequest):
            tokens.max_output({"max_tokens": bad}, 100)


def test_the_output_length_is_hinted_or_a_hash_of_the_request() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    hashed = tokens.wanted_output(body, None, 64)
    assert 1 <= hashed <= 64
    assert tokens.wanted_output(dict(body), None, 64) == hashed
    other = {"model": "m", "messages": [{"role": "user", "content": "hi!"}]}
    lengths = {tokens.wanted_output(other, None, 10**6), tokens.wanted_output(body, None, 10**6)}
    assert len(lengths) == 2
    hinted = {**body, "metadata": {"fake_output_tokens": "17"}}
    assert tokens.wanted_output(hinted, None, 64) == 17
    assert tokens.wanted_output(hinted, "3", 64) == 3  # the header wins
    with pytest.raises(tokens.BadRequest):
        tokens.wanted_output(body, "many", 64)
