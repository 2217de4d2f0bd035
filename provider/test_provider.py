"""The provider over real HTTP (urllib): replies, streams, 429s, and the output estimate.

The limits run on a fake clock that only the test moves, so every refill, remaining count
and retry-after is exact; nothing here depends on how fast the machine is.
"""

from __future__ import annotations

import datetime
import json
import math
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import pytest

from provider import ProviderHandle, start_provider, tokens
from provider.test_limits import FakeClock

Start = Callable[..., ProviderHandle]
MESSAGES = [{"role": "user", "content": "Say something, about forty characters."}]
PROMPT = tokens.prompt_tokens(MESSAGES)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def start(clock: FakeClock) -> Iterator[Start]:
    handles: List[ProviderHandle] = []

    def start(**kwargs: Any) -> ProviderHandle:
        handle = start_provider(clock=clock, **kwargs)
        handles.append(handle)
        return handle

    yield start
    for handle in handles:
        handle.close()


def request(
    handle: ProviderHandle, body: Dict[str, Any], output: Optional[int] = None
) -> urllib.request.Request:
    headers = {"content-type": "application/json"}
    if output is not None:
        headers["x-fake-output-tokens"] = str(output)
    data = json.dumps({"model": "fake-1", "messages": MESSAGES, **body}).encode()
    return urllib.request.Request(handle.url + "/v1/chat/completions", data, headers)


def post(
    handle: ProviderHandle, body: Dict[str, Any], output: Optional[int] = None
) -> Tuple[int, Dict[str, str], Any]:
    """Status, headers (lower-cased) and JSON body of one non-streaming call."""
    try:
        with urllib.request.urlopen(request(handle, body, output), timeout=30) as r:
            return r.status, {k.lower(): v for k, v in r.headers.items()}, json.load(r)
    except urllib.error.HTTPError as e:
        with e:
            return e.code, {k.lower(): v for k, v in e.headers.items()}, json.load(e)


def events(lines: Any) -> List[Any]:
    """The SSE stream's data payloads, "[DONE]" as itself."""
    out: List[Any] = []
    for raw in lines:
        line = raw.decode().strip()
        if line:
            assert line.startswith("data: ")
            data = line[len("data: ") :]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def test_a_reply_carries_usage_by_the_documented_rule(start: Start) -> None:
    handle = start()
    status, headers, body = post(handle, {"max_tokens": 100}, output=7)
    assert status == 200
    assert headers["content-type"] == "application/json"
    assert body["object"] == "chat.completion"
    assert body["model"] == "fake-1"
    choice = body["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert choice["message"]["role"] == "assistant"
    assert choice["message"]["content"] == "".join(tokens.output_words(7))
    assert body["usage"] == {
        "prompt_tokens": PROMPT,
        "completion_tokens": 7,
        "total_tokens": PROMPT + 7,
    }


def test_the_reply_stops_at_max_completion_tokens(start: Start) -> None:
    handle = start()
    _, _, body = post(handle, {"max_completion_tokens": 5, "max_tokens": 50}, output=40)
    assert body["usage"]["completion_tokens"] == 5
    assert body["choices"][0]["finish_reason"] == "length"


def test_an_unhinted_reply_has_the_same_length_every_time(start: Start) -> None:
    handle = start(default_spread=64)
    lengths = {post(handle, {})[2]["usage"]["completion_tokens"] for _ in range(3)}
    assert len(lengths) == 1
    assert 1 <= lengths.pop() <= 64


def test_a_stream_with_include_usage_ends_with_a_usage_chunk(start: Start) -> None:
    handle = start()
    body = {"max_tokens": 100, "stream": True, "stream_options": {"include_usage": True}}
    with urllib.request.urlopen(request(handle, body, output=6), timeout=30) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        assert r.headers["x-ratelimit-remaining-requests"] is None  # no RPM limit set
        chunks = events(r)
    assert chunks[-1] == "[DONE]"
    final, last_choice = chunks[-2], chunks[-3]
    assert final["choices"] == []
    assert final["usage"] == {
        "prompt_tokens": PROMPT,
        "completion_tokens": 6,
        "total_tokens": PROMPT + 6,
    }
    assert last_choice["choices"][0]["finish_reason"] == "stop"
    assert all(c["usage"] is None for c in chunks[:-2])
    assert all(c["object"] == "chat.completion.chunk" for c in chunks[:-1])
    assert len({c["id"] for c in chunks[:-1]}) == 1
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks[:-2])
    assert text == "".join(tokens.output_words(6))


def test_a_stream_without_include_usage_has_no_usage(start: Start) -> None:
    handle = start()
    body = {"max_tokens": 3, "stream": True}
    with urllib.request.urlopen(request(handle, body, output=9), timeout=30) as r:
        chunks = events(r)
    assert chunks[-1] == "[DONE]"
    assert all("usage" not in c and len(c["choices"]) == 1 for c in chunks[:-1])
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert len(chunks) == 1 + 3 + 1 + 1  # role, three tokens, finish, [DONE]
    assert handle.stats()["output_tokens_actual"] == 3


def test_over_the_token_limit_a_429_says_when_to_retry(start: Start, clock: FakeClock) -> None:
    handle = start(rpm=100, otpm=600)  # output: 10 a second
    before = time.time()
    status, headers, _ = post(handle, {"max_tokens": 400}, output=400)
    after = time.time()
    assert status == 200
    assert headers["x-ratelimit-limit-tokens"] == "600"
    assert headers["x-ratelimit-remaining-tokens"] == "200"
    assert headers["x-ratelimit-reset-tokens"] == "40s"  # 400 short, 10 a second
    assert headers["x-ratelimit-limit-requests"] == "100"
    assert headers["x-ratelimit-remaining-requests"] == "99"
    assert headers["x-ratelimit-reset-requests"] == "600ms"
    assert headers["anthropic-ratelimit-output-tokens-remaining"] == "200"
    assert headers["anthropic-ratelimit-requests-remaining"] == "99"
    reset = datetime.datetime.strptime(
        headers["anthropic-ratelimit-output-tokens-reset"], "%Y-%m-%dT%H:%M:%SZ"
    ).replace(tzinfo=datetime.timezone.utc)
    # 40 s after the reply, to the second rounded up, on the wall clock.
    assert math.ceil(before + 40) <= reset.timestamp() <= math.ceil(after + 40)
    assert headers["anthropic-ratelimit-tokens-limit"] == "600"
    assert "retry-after" not in headers

    status, headers, body = post(handle, {"max_tokens": 400}, output=1)
    assert status == 429
    assert headers["retry-after"] == "20"  # 200 short, 10 a second
    assert headers["retry-after-ms"] == "20000"
    assert headers["x-ratelimit-remaining-tokens"] == "200"
    assert headers["x-ratelimit-remaining-requests"] == "99"  # refused: nothing taken
    error = body["error"]
    assert (error["type"], error["code"]) == ("tokens", "rate_limit_exceeded")
    assert "output tokens per min (OTPM): Limit 600, Used 400, Requested 400" in error["message"]

    clock.now += 19.5
    status, headers, _ = post(handle, {"max_tokens": 400}, output=1)
    assert (status, headers["retry-after"]) == (429, "1")  # 0.5 s rounds up
    clock.now += 0.5
    assert post(handle, {"max_tokens": 400}, output=1)[0] == 200

    stats = handle.stats()
    assert stats["refused"]["output_tokens"] == 2
    assert stats["refused_total"] == 2
    assert (stats["served"], stats["requests"]) == (2, 4)


def test_over_the_request_limit_a_429_is_of_type_requests(start: Start) -> None:
    handle = start(rpm=2)
    assert [post(handle, {})[0] for _ in range(2)] == [200, 200]
    status, headers, body = post(handle, {})
    assert status == 429
    assert body["error"]["type"] == "requests"
    assert headers["retry-after"] == "30"
    assert headers["x-ratelimit-remaining-requests"] == "0"
    assert headers["x-ratelimit-reset-requests"] == "1m0s"
    assert "x-ratelimit-limit-tokens" not in headers


def test_a_request_above_the_limit_itself_is_refused_without_retry_after(start: Start) -> None:
    handle = start(itpm=PROMPT - 1)
    status, headers, body = post(handle, {})
    assert status == 429
    assert "retry-after" not in headers
    assert body["error"]["message"].startswith("Request too large")
    stats = handle.stats()
    assert stats["refused"] == {
        "requests": 0,
        "input_tokens": 0,
        "output_tokens": 0,
        "too_large": 1,
    }
    assert stats["refused_total"] == 1


def test_the_output_estimate_is_max_tokens_until_the_request_ends(start: Start) -> None:
    # Anthropic: OTPM is estimated from max_tokens at the start, adjusted at the end.
    handle = start(otpm=1000)
    handle.pause()  # admitted requests wait before generating
    body = {"max_tokens": 400, "stream": True}
    streams = [urllib.request.urlopen(request(handle, body, output=10), timeout=30)]
    streams.append(urllib.request.urlopen(request(handle, body, output=10), timeout=30))
    for stream in streams:
        stream.readline()  # the first chunk: admitted, 400 reserved
    assert handle.stats()["in_flight"] == 2
    # Three replies of 10 tokens would fit in 1000, but three estimates of 400 do not.
    status, headers, _ = post(handle, {"max_tokens": 400}, output=10)
    assert status == 429
    assert headers["x-ratelimit-remaining-tokens"] == "200"
    assert handle.stats()["limits"]["output_tokens"]["used"] == 800

    handle.resume()
    for stream in streams:
        with stream:
            assert events(stream)[-1] == "[DONE]"
    stats = handle.stats()
    assert stats["output_tokens_reserved"] == 800
    assert stats["output_tokens_actual"] == 20
    assert stats["output_tokens_returned"] == 780
    assert stats["limits"]["output_tokens"]["remaining"] == 980
    assert stats["in_flight"] == 0
    assert stats["max_in_flight"] == 2
    assert post(handle, {"max_tokens": 400}, output=10)[0] == 200


def test_a_stream_the_client_drops_is_charged_what_was_generated(start: Start) -> None:
    handle = start(otpm=10_000)
    handle.pause()
    body = {"max_tokens": 5000, "stream": True}
    stream = urllib.request.urlopen(request(handle, body, output=5000), timeout=30)
    stream.readline()  # admitted: 5000 reserved
    stream.close()  # gone before a token was generated
    handle.resume()  # the writes fail (the socket is closed) long before 5000 tokens
    deadline = time.monotonic() + 60  # a guard against a hang, not a measure
    while handle.stats()["in_flight"] and time.monotonic() < deadline:
        time.sleep(0.01)
    stats = handle.stats()
    assert stats["in_flight"] == 0
    assert stats["served"] == 0
    generated = stats["output_tokens_actual"]
    assert generated < 5000
    assert stats["output_tokens_returned"] == 5000 - generated
    assert stats["limits"]["output_tokens"]["used"] == generated


def test_stats_over_http_match_the_handle(start: Start) -> None:
    handle = start(rpm=10, itpm=1000, otpm=1000)
    post(handle, {"max_tokens": 50}, output=5)
    with urllib.request.urlopen(handle.url + "/stats", timeout=30) as r:
        stats = json.load(r)
    assert stats == handle.stats()
    assert stats["input_tokens"] == PROMPT
    assert stats["limits"]["input_tokens"] == {
        "limit": 1000,
        "remaining": 1000 - PROMPT,
        "used": PROMPT,
        "reset_seconds": PROMPT * 60 / 1000,
    }
    assert stats["limits"]["output_tokens"]["used"] == 5


def test_bad_requests_get_openai_style_errors(start: Start) -> None:
    handle = start()
    status, _, body = post(handle, {"messages": []})
    assert (status, body["error"]["type"]) == (400, "invalid_request_error")
    assert post(handle, {"max_tokens": 0})[0] == 400
    bad = urllib.request.Request(handle.url + "/v1/chat/completions", b"{not json")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(bad, timeout=30)
    assert e.value.code == 400
    e.value.close()
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(handle.url + "/v1/models", timeout=30)
    assert e.value.code == 404
    e.value.close()
    assert handle.stats()["bad_requests"] == 3


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_the_command_line_serves_until_signalled(signum: int) -> None:
    root = Path(__file__).resolve().parent.parent
    process = subprocess.Popen(
        [sys.executable, "-m", "provider", "--rpm", "1", "--otpm", "1000"],
        cwd=root,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line.startswith("fake provider on http://127.0.0.1:")
        url = line.split()[-1]
        body = json.dumps({"messages": MESSAGES, "max_tokens": 10}).encode()
        with urllib.request.urlopen(url + "/v1/chat/completions", body, timeout=30) as r:
            assert r.headers["x-ratelimit-limit-requests"] == "1"
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(url + "/v1/chat/completions", body, timeout=30)
        assert e.value.code == 429
        e.value.close()
        process.send_signal(signum)
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        if process.stdout is not None:
            process.stdout.close()
