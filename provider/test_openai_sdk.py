"""The openai SDK talks to the provider as to OpenAI: replies, streams with usage, 429s."""

from __future__ import annotations

from typing import Iterator, List

import pytest

from provider import ProviderHandle, start_provider
from provider.test_limits import FakeClock

# Pinned in python/requirements-test.txt for Python 3.10 and later (the SDK's own floor).
pytest.importorskip("openai")
import openai
from openai.types.chat import ChatCompletionMessageParam

MESSAGES: List[ChatCompletionMessageParam] = [{"role": "user", "content": "Hello, provider."}]


@pytest.fixture
def handle() -> Iterator[ProviderHandle]:
    with start_provider(rpm=1000, otpm=1000, clock=FakeClock()) as handle:
        yield handle


def client(handle: ProviderHandle) -> openai.OpenAI:
    # max_retries=0: the SDK would otherwise honour retry-after and retry the 429 itself.
    return openai.OpenAI(base_url=handle.url + "/v1", api_key="unused", max_retries=0)


def test_the_sdk_reads_a_reply_and_its_usage(handle: ProviderHandle) -> None:
    reply = client(handle).chat.completions.create(
        model="fake-1",
        messages=MESSAGES,
        max_tokens=50,
        extra_headers={"x-fake-output-tokens": "8"},
    )
    assert reply.choices[0].finish_reason == "stop"
    assert reply.usage is not None
    assert reply.usage.completion_tokens == 8
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + 8


def test_the_sdk_streams_and_gets_the_usage_chunk(handle: ProviderHandle) -> None:
    stream = client(handle).chat.completions.create(
        model="fake-1",
        messages=MESSAGES,
        max_completion_tokens=4,
        stream=True,
        stream_options={"include_usage": True},
        extra_headers={"x-fake-output-tokens": "30"},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(text) == 4 * 4
    assert chunks[-2].choices[0].finish_reason == "length"
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage is not None
    assert usage.completion_tokens == 4
    assert handle.stats()["output_tokens_returned"] == 0  # 4 reserved, 4 used


def test_the_sdk_raises_rate_limit_error_with_the_headers(handle: ProviderHandle) -> None:
    sdk = client(handle)
    raw = sdk.chat.completions.with_raw_response.create(
        model="fake-1",
        messages=MESSAGES,
        max_tokens=900,
        extra_headers={"x-fake-output-tokens": "900"},
    )
    assert raw.headers["x-ratelimit-remaining-tokens"] == "100"
    with pytest.raises(openai.RateLimitError) as e:
        sdk.chat.completions.create(model="fake-1", messages=MESSAGES, max_tokens=900)
    assert e.value.status_code == 429
    assert e.value.code == "rate_limit_exceeded"
    assert e.value.response.headers["retry-after"] == "48"  # 800 short, 1000/60 a second
