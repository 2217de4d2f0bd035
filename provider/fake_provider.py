"""A local OpenAI-compatible chat completions server with its own rate limits.

What the token budgets (docs/budgets.md) are tested against: ``POST /v1/chat/completions``
in OpenAI's shape, streaming included, whose replies carry ``usage``, behind RPM, ITPM
and OTPM limits accounted as Anthropic documents them (limits.py). A request over a
limit gets a 429 with ``retry-after`` and the ``x-ratelimit-*`` headers; ``GET /stats``
tells what was charged and refused.

    handle = start_provider(rpm=50, itpm=30_000, otpm=8_000)
    ... point a client at handle.url + "/v1" ...
    handle.stats(); handle.close()

or ``python -m provider --port 8080 --otpm 8000`` (``--help`` lists the options).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import signal
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, List, Mapping, Optional, Sequence

from . import tokens
from .limits import (
    INPUT_TOKENS,
    OUTPUT_TOKENS,
    REQUESTS,
    Clock,
    Limits,
    LimitState,
    Refusal,
    Reservation,
    go_duration,
)

# What the 429's message calls each limit (OpenAI's wording, with input and output apart).
_LIMIT_WORDS = {
    REQUESTS: "requests per min (RPM)",
    INPUT_TOKENS: "input tokens per min (ITPM)",
    OUTPUT_TOKENS: "output tokens per min (OTPM)",
}
_ANTHROPIC_NAMES = {
    REQUESTS: "requests",
    INPUT_TOKENS: "input-tokens",
    OUTPUT_TOKENS: "output-tokens",
}


class Provider:
    """The server's state: the limits, the reply settings, and the pause gate."""

    def __init__(
        self,
        limits: Limits,
        seconds_per_token: float = 0.0,
        default_max_tokens: int = 4096,
        default_spread: int = 64,
    ) -> None:
        self.limits = limits
        self.seconds_per_token = seconds_per_token
        self.default_max_tokens = default_max_tokens
        self.default_spread = default_spread
        self._lock = threading.Lock()
        self.requests = 0
        self.served = 0
        self.bad_requests = 0
        # Set while replies run; a test clears it to hold admitted requests in flight
        # (reservations taken, nothing generated) and sets it to let them finish.
        self.running = threading.Event()
        self.running.set()

    def count(self, attribute: str) -> None:
        with self._lock:
            setattr(self, attribute, getattr(self, attribute) + 1)

    def stats(self) -> Dict[str, Any]:
        c = self.limits.counters_copy()
        with self._lock:
            stats: Dict[str, Any] = {
                "requests": self.requests,
                "served": self.served,
                "bad_requests": self.bad_requests,
                "refused": dict(c.refused, too_large=c.too_large),
                "refused_total": sum(c.refused.values()) + c.too_large,
                "admitted": c.admitted,
                "in_flight": c.in_flight,
                "max_in_flight": c.max_in_flight,
                "input_tokens": c.input_tokens,
                "output_tokens_reserved": c.output_reserved,
                "output_tokens_actual": c.output_actual,
                "output_tokens_returned": c.output_returned,
            }
        stats["limits"] = {
            s.name: {
                "limit": s.limit,
                "remaining": s.remaining,
                "used": s.limit - s.remaining,
                "reset_seconds": s.reset_seconds,
            }
            for s in self.limits.states()
        }
        return stats


def rate_limit_headers(states: Sequence[LimitState], refused: Optional[str]) -> Dict[str, str]:
    """OpenAI's x-ratelimit-* headers and Anthropic's anthropic-ratelimit-* ones.

    OpenAI has one token limit; here input and output are apart, so x-ratelimit-*-tokens
    show the most restrictive of the two, as Anthropic's anthropic-ratelimit-tokens-* do:
    the one that refused a 429, else the one with the smallest share left.
    """
    headers: Dict[str, str] = {}
    now = time.time()
    by_name = {s.name: s for s in states}
    token_states = [s for s in states if s.name != REQUESTS]
    tightest: Optional[LimitState] = None
    if refused in (INPUT_TOKENS, OUTPUT_TOKENS):
        tightest = by_name[refused]
    elif token_states:
        tightest = min(token_states, key=lambda s: s.remaining / max(s.limit, 1))
    for kind, state in (("requests", by_name.get(REQUESTS)), ("tokens", tightest)):
        if state is not None:
            headers[f"x-ratelimit-limit-{kind}"] = str(state.limit)
            headers[f"x-ratelimit-remaining-{kind}"] = str(state.remaining)
            headers[f"x-ratelimit-reset-{kind}"] = go_duration(state.reset_seconds)
    anthropic = [(_ANTHROPIC_NAMES[s.name], s) for s in states]
    if tightest is not None:
        anthropic.append(("tokens", tightest))
    for name, state in anthropic:
        # Anthropic's resets are instants (RFC 3339): when the bucket is full again, to the
        # second, rounded up.
        full_at = datetime.datetime.fromtimestamp(
            math.ceil(now + state.reset_seconds), datetime.timezone.utc
        )
        headers[f"anthropic-ratelimit-{name}-limit"] = str(state.limit)
        headers[f"anthropic-ratelimit-{name}-remaining"] = str(state.remaining)
        headers[f"anthropic-ratelimit-{name}-reset"] = full_at.strftime("%Y-%m-%dT%H:%M:%SZ")
    return headers


class Handler(BaseHTTPRequestHandler):
    server: ProviderServer
    # HTTP/1.0: every reply closes its connection, so a stream ends where the body does
    # and close() leaves no idle keep-alive connection behind.
    protocol_version = "HTTP/1.0"

    def log_message(self, format: str, *args: Any) -> None:
        pass  # Quiet: tests and replays read /stats, not the log.

    def do_GET(self) -> None:
        if self.path.rstrip("/") == "/stats":
            self._json(200, self.server.provider.stats())
        else:
            self._error(404, f"no route GET {self.path}", "invalid_request_error", None)

    def do_POST(self) -> None:
        provider = self.server.provider
        if self.path.rstrip("/") != "/v1/chat/completions":
            self._error(404, f"no route POST {self.path}", "invalid_request_error", None)
            return
        provider.count("requests")
        try:
            length = int(self.headers.get("content-length") or 0)
            body = json.loads(self.rfile.read(length) or b"null")
            if not isinstance(body, dict):
                raise tokens.BadRequest("the body must be a JSON object")
            messages = tokens.parse_messages(body)
            prompt = tokens.prompt_tokens(messages)
            bound = tokens.max_output(body, provider.default_max_tokens)
            wanted = tokens.wanted_output(
                body, self.headers.get("x-fake-output-tokens"), provider.default_spread
            )
        except ValueError as e:  # tokens.BadRequest and json.JSONDecodeError are ValueErrors
            provider.count("bad_requests")
            self._error(400, str(e), "invalid_request_error", None)
            return
        # The output estimate is max_tokens (Anthropic: OTPM is estimated from max_tokens at
        # the start of a request and adjusted to the actual at its end).
        admission = provider.limits.admit(prompt, bound)
        if isinstance(admission, Refusal):
            self._refuse(admission, str(body.get("model", "")))
            return
        output = min(wanted, bound)
        finish = "length" if wanted > bound else "stop"
        reply = Reply(body, prompt, output, finish)
        try:
            if body.get("stream"):
                self._stream(reply, admission)
            else:
                provider.running.wait()
                time.sleep(provider.seconds_per_token * output)
                self._end(admission, output)
                self._json(200, reply.completion(), self._limit_headers(None))
        except (BrokenPipeError, ConnectionResetError):
            pass  # The client went away: what was generated until then is what it used.
        finally:
            if not self._settled:
                provider.limits.settle(admission, self._generated)

    # Settled before a reply's last bytes are sent, so a client that has read its reply
    # finds the settle (and the capacity it gave back) in /stats and in the next admission.
    _settled = False
    _generated = 0

    def _end(self, admission: Reservation, generated: int) -> None:
        self.server.provider.limits.settle(admission, generated)
        self._settled = True
        self.server.provider.count("served")

    def _stream(self, reply: Reply, admission: Reservation) -> None:
        """Send the reply as OpenAI's SSE chunks."""
        self.send_response(200)
        self.send_header("content-type", "text/event-stream; charset=utf-8")
        self.send_header("cache-control", "no-cache")
        for name, value in self._limit_headers(None).items():
            self.send_header(name, value)
        self.end_headers()
        include_usage = bool((reply.body.get("stream_options") or {}).get("include_usage"))

        def event(data: Any) -> None:
            self.wfile.write(b"data: " + json.dumps(data).encode() + b"\n\n")
            self.wfile.flush()

        event(reply.chunk({"role": "assistant", "content": ""}, None, include_usage))
        # After the first chunk: a client that has read it knows the request is admitted.
        self.server.provider.running.wait()
        for word in tokens.output_words(reply.output):
            time.sleep(self.server.provider.seconds_per_token)
            event(reply.chunk({"content": word}, None, include_usage))
            self._generated += 1
        self._end(admission, self._generated)
        event(reply.chunk({}, reply.finish, include_usage))
        if include_usage:
            # OpenAI: one more chunk before [DONE], its choices empty, its usage the request's.
            event({**reply.base("chat.completion.chunk"), "choices": [], "usage": reply.usage()})
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()

    def _limit_headers(self, refused: Optional[str]) -> Dict[str, str]:
        return rate_limit_headers(self.server.provider.limits.states(), refused)

    def _refuse(self, refusal: Refusal, model: str) -> None:
        headers = self._limit_headers(refusal.limit)
        kind = "requests" if refusal.limit == REQUESTS else "tokens"
        words = _LIMIT_WORDS[refusal.limit]
        seconds, ms = refusal.retry_after_header, refusal.retry_after_ms
        if seconds is None or ms is None:
            # Larger than the limit's capacity: no wait makes it fit, so no retry-after.
            message = (
                f"Request too large for {model} on {words}: "
                f"Limit {refusal.capacity}, Requested {refusal.requested}."
            )
        else:
            headers["retry-after"] = str(seconds)
            headers["retry-after-ms"] = str(ms)
            message = (
                f"Rate limit reached for {model} on {words}: Limit {refusal.capacity}, "
                f"Used {refusal.used}, Requested {refusal.requested}. "
                f"Please try again in {go_duration(refusal.retry_after)}."
            )
        self._error(429, message, kind, "rate_limit_exceeded", headers)

    def _error(
        self,
        status: int,
        message: str,
        kind: str,
        code: Optional[str],
        headers: Optional[Mapping[str, str]] = None,
    ) -> None:
        body = {"error": {"message": message, "type": kind, "param": None, "code": code}}
        self._json(status, body, headers)

    def _json(self, status: int, body: Any, headers: Optional[Mapping[str, str]] = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)


class Reply:
    """One completion's fields, shared by its JSON and its stream chunks."""

    def __init__(self, body: Dict[str, Any], prompt: int, output: int, finish: str) -> None:
        self.body = body
        self.prompt = prompt
        self.output = output
        self.finish = finish
        self.id = "chatcmpl-" + uuid.uuid4().hex[:24]
        self.created = int(time.time())

    def base(self, obj: str) -> Dict[str, Any]:
        model = self.body.get("model") or "fake-model"
        return {"id": self.id, "object": obj, "created": self.created, "model": model}

    def usage(self) -> Dict[str, int]:
        return {
            "prompt_tokens": self.prompt,
            "completion_tokens": self.output,
            "total_tokens": self.prompt + self.output,
        }

    def completion(self) -> Dict[str, Any]:
        message = {"role": "assistant", "content": "".join(tokens.output_words(self.output))}
        choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": self.finish}
        return {**self.base("chat.completion"), "choices": [choice], "usage": self.usage()}

    def chunk(
        self, delta: Dict[str, Any], finish: Optional[str], include_usage: bool
    ) -> Dict[str, Any]:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        chunk = {**self.base("chat.completion.chunk"), "choices": [choice]}
        if include_usage:
            chunk["usage"] = None  # OpenAI: null on every chunk but the last one
        return chunk


class ProviderServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], provider: Provider) -> None:
        super().__init__(address, Handler)
        self.provider = provider


class ProviderHandle:
    """A running provider: its ``url``, its ``stats()``, ``pause()``/``resume()``, ``close()``."""

    def __init__(self, server: ProviderServer) -> None:
        self._server = server
        self.provider = server.provider
        host, port = server.server_address[:2]
        self.host = str(host)
        self.port = int(port)
        self.url = f"http://{self.host}:{self.port}"
        # A short poll: close() waits up to one interval for the loop to notice.
        self._thread = threading.Thread(
            target=server.serve_forever, args=(0.05,), name="fake-provider", daemon=True
        )
        self._thread.start()

    def stats(self) -> Dict[str, Any]:
        return self.provider.stats()

    def pause(self) -> None:
        """Hold the requests admitted from now on in flight, before they generate anything."""
        self.provider.running.clear()

    def resume(self) -> None:
        self.provider.running.set()

    def close(self) -> None:
        self.resume()  # a paused reply would keep its thread (and its client) waiting
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def __enter__(self) -> ProviderHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def start_provider(
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    rpm: Optional[float] = None,
    itpm: Optional[float] = None,
    otpm: Optional[float] = None,
    seconds_per_token: float = 0.0,
    default_max_tokens: int = 4096,
    default_spread: int = 64,
    clock: Optional[Clock] = None,
) -> ProviderHandle:
    """Serve in a background thread; port 0 takes a free port (``handle.url`` says which).

    A limit left None is not enforced. ``clock`` (seconds, monotonic) drives the limits'
    refill: a test passes a fake one to make refills and retry-after exact.
    """
    if default_max_tokens < 1 or default_spread < 1:
        raise ValueError("default_max_tokens and default_spread must be at least 1")
    limits = Limits(rpm, itpm, otpm, clock or time.monotonic)
    provider = Provider(limits, seconds_per_token, default_max_tokens, default_spread)
    return ProviderHandle(ProviderServer((host, port), provider))


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m provider", description=__doc__.split("\n\n")[0] if __doc__ else None
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0: a free port (printed)")
    parser.add_argument("--rpm", type=float, help="requests per minute (default: no limit)")
    parser.add_argument("--itpm", type=float, help="input tokens per minute (default: none)")
    parser.add_argument("--otpm", type=float, help="output tokens per minute (default: none)")
    parser.add_argument(
        "--seconds-per-token", type=float, default=0.0, help="time to generate one token"
    )
    parser.add_argument(
        "--default-max-tokens",
        type=int,
        default=4096,
        help="the output bound (and OTPM estimate) of a request with no max_tokens",
    )
    parser.add_argument(
        "--default-spread",
        type=int,
        default=64,
        help="an unhinted reply has 1..N tokens, from a hash of the request",
    )
    args = parser.parse_args(argv)
    handle = start_provider(
        args.host,
        args.port,
        rpm=args.rpm,
        itpm=args.itpm,
        otpm=args.otpm,
        seconds_per_token=args.seconds_per_token,
        default_max_tokens=args.default_max_tokens,
        default_spread=args.default_spread,
    )
    signals: List[int] = []
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda signum, _frame: signals.append(signum))
    print(f"fake provider on {handle.url}", flush=True)
    try:
        # Polled, not a bare wait: a signal that a server thread happens to receive runs
        # its handler only when the main thread next runs Python code.
        while not signals:
            time.sleep(0.1)
    finally:
        handle.close()
