"""A token budget under the ``openai`` SDK (or any httpx client of an OpenAI-compatible API):
an httpx transport that reserves each chat completion's estimate before it is sent and
settles its ``usage`` when the reply (or its stream) ends::

    import httpx, openai, redis
    from redis_rl import TokenBudget
    from redis_rl.openai import BudgetTransport

    budget = TokenBudget(redis.Redis(), "openai:gpt-4o", "800000/minute",
                         requests="5000/minute")
    client = openai.OpenAI(http_client=httpx.Client(transport=BudgetTransport(budget)))

Every instance of a fleet that does this shares one quota and is refused before the
provider would refuse it. What is reserved and settled is decided by the client core
(``redis_rl._core``: the same estimate as the other clients):

- the estimate: the prompt's text (UTF-8 bytes / 3, rounded up, plus 4 per message), and
  ``max_completion_tokens`` or ``max_tokens`` (else ``default_max_tokens``) times ``n``;
  a budget with ``input`` and ``output`` limits reserves each its part, one with a single
  token limit both;
- the actual: the reply's ``usage``; a stream that did not ask for it
  (``stream_options.include_usage``) is made to, and the usage event is kept from the
  caller, so its chunks read as they would have;
- an error reply (the provider's own 429 included) settles the tokens at 0; a reply with
  no usage, or a call that broke off after it was sent, at the estimate.

Refused by the budget, the transport answers 429 itself, as the provider would (an
OpenAI-style error body, ``retry-after``, ``retry-after-ms``), without calling the
provider: the SDK's own retries then wait as long as the budget says. ``wait_ms`` waits in
the transport instead.
"""

from __future__ import annotations

import math
from typing import AsyncIterator, Dict, Iterator, List, Optional, Tuple, Union

import httpx

from . import _core
from .budget import AsyncTokenBudget, Reservation, TokenBudget

#: The output reserved for a request that sets no ``max_tokens``.
DEFAULT_MAX_TOKENS = 4096

_Estimate = Tuple[int, int, bool, Optional[bytes], bool]


def _is_chat(request: httpx.Request) -> bool:
    return request.method == "POST" and request.url.path.endswith("/chat/completions")


def _costs(budget: Union[TokenBudget, AsyncTokenBudget], input: int, output: int) -> Dict[str, int]:
    return dict(_core.split(list(budget.limits), input, output))


def _zero(budget: Union[TokenBudget, AsyncTokenBudget]) -> Dict[str, int]:
    """The actuals of a call the provider refused or failed: no tokens, the request."""
    return {name: 0 for name in budget.limits if name != "requests"}


def _refused(res: Reservation) -> httpx.Response:
    ms = max(1, res.retry_after_ms)
    kind = "requests" if res.denied_by == "requests" else "tokens"
    message = (
        f"Rate limit reached by the shared budget (redis-rl) on its {res.denied_by!r} limit: "
        f"retry after {ms} ms."
    )
    return httpx.Response(
        429,
        headers={
            "retry-after": str(math.ceil(ms / 1000)),
            "retry-after-ms": str(ms),
            "x-redis-rl-denied-by": str(res.denied_by),
        },
        json={"error": {"message": message, "type": kind, "code": "rate_limit_exceeded"}},
    )


def _too_large(why: str) -> httpx.Response:
    """A request above a limit's burst can never be reserved: refused as providers refuse
    one above their capacity (429, no ``retry-after``: retrying cannot help)."""
    return httpx.Response(
        429,
        headers={"x-redis-rl-denied-by": "too_large"},
        json={
            "error": {
                "message": f"Request too large for the shared budget (redis-rl): {why}",
                "type": "tokens",
                "code": "rate_limit_exceeded",
            }
        },
    )


def _with_body(request: httpx.Request, body: bytes) -> httpx.Request:
    headers = [(k, v) for k, v in request.headers.raw if k.lower() != b"content-length"]
    return httpx.Request(
        request.method, request.url, headers=headers, content=body, extensions=request.extensions
    )


def _headers(response: httpx.Response) -> List[Tuple[bytes, bytes]]:
    """The reply's headers for its body passed on decoded (so it is not decoded twice)."""
    return [
        (k, v)
        for k, v in response.headers.raw
        if k.lower() not in (b"content-encoding", b"content-length", b"transfer-encoding")
    ]


def _decoded(response: httpx.Response, content: bytes) -> httpx.Response:
    return httpx.Response(
        response.status_code,
        headers=_headers(response),
        content=content,
        extensions=response.extensions,
    )


def _failed_call(
    budget: Union[TokenBudget, AsyncTokenBudget], e: BaseException
) -> Optional[Dict[str, int]]:
    """What a call that raised settles with: nothing used if it never reached the provider,
    else the estimate (it may have run)."""
    return _zero(budget) if isinstance(e, httpx.ConnectError) else None


def _replied(
    budget: Union[TokenBudget, AsyncTokenBudget], status: int, content: bytes
) -> Optional[Dict[str, int]]:
    """What a whole reply settles with: an error (the provider's own 429 included) used no
    tokens, a reply its usage (the estimate if it has none)."""
    if status != 200:
        return _zero(budget)
    usage = _core.chat_usage(content)
    return None if usage is None else _costs(budget, usage[0], usage[1])


class _Call:
    """One chat completion's reservation and how it settles (once)."""

    def __init__(self, budget: Union[TokenBudget, AsyncTokenBudget], res: Reservation) -> None:
        self.budget = budget
        self.res = res
        self.done = False

    def actual(self, usage: Optional[Tuple[int, int]]) -> Optional[Dict[str, int]]:
        return None if usage is None else _costs(self.budget, usage[0], usage[1])


class _Settings:
    """Both transports' settings: the budget, the transport the calls go on (httpx's own by
    default), the output reserved when a request sets no ``max_tokens``, and how long a
    refused reservation waits before the transport answers 429."""

    def __init__(
        self,
        budget: Union[TokenBudget, AsyncTokenBudget],
        transport: Optional[Union[httpx.BaseTransport, httpx.AsyncBaseTransport]] = None,
        *,
        default_max_tokens: int = DEFAULT_MAX_TOKENS,
        wait_ms: int = 0,
    ) -> None:
        self.budget = budget
        if transport is None:
            transport = (
                httpx.AsyncHTTPTransport()
                if isinstance(budget, AsyncTokenBudget)
                else httpx.HTTPTransport()
            )
        self.transport = transport
        self.default_max_tokens = default_max_tokens
        self.wait_ms = wait_ms


class BudgetTransport(_Settings, httpx.BaseTransport):
    """An httpx transport that charges every chat completion to ``budget`` (a
    :class:`~redis_rl.TokenBudget`); other requests pass as they are."""

    budget: TokenBudget
    transport: httpx.BaseTransport

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        """Sends ``request``; a chat completion reserved first and settled from its reply."""
        if not _is_chat(request):
            return self.transport.handle_request(request)
        try:
            e: _Estimate = _core.estimate_chat(request.read(), self.default_max_tokens)
        except ValueError:
            return self.transport.handle_request(request)  # the provider will say what is wrong
        input, output, _stream, body, hide = e
        try:
            res = self.budget.reserve(_costs(self.budget, input, output), wait_ms=self.wait_ms)
        except ValueError as too_large:
            return _too_large(str(too_large))
        if not res.granted:
            return _refused(res)
        call = _Call(self.budget, res)
        if body is not None:
            request = _with_body(request, body)
        try:
            response = self.transport.handle_request(request)
        except BaseException as failed:
            res.settle(_failed_call(self.budget, failed))
            raise
        if response.status_code != 200 or not e[2]:
            content = response.read()
            res.settle(_replied(self.budget, response.status_code, content))
            return _decoded(response, content)
        return httpx.Response(
            response.status_code,
            headers=_headers(response),
            stream=_SyncStream(response, call, _core.StreamUsage(hide)),
            extensions=response.extensions,
        )

    def close(self) -> None:
        """Closes the transport the calls go on."""
        self.transport.close()


class _SyncStream(httpx.SyncByteStream):
    def __init__(self, response: httpx.Response, call: _Call, reader: _core.StreamUsage) -> None:
        self.response = response
        self.call = call
        self.reader = reader

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self.response.iter_bytes():
            out = self.reader.feed(chunk)
            if out:
                yield out
        rest = self.reader.finish()
        if rest:
            yield rest
        self._settle()

    def _settle(self) -> None:
        if not self.call.done:
            self.call.done = True
            self.call.res.settle(self.call.actual(self.reader.usage()))

    def close(self) -> None:
        try:
            self.response.close()
        finally:
            self._settle()


class AsyncBudgetTransport(_Settings, httpx.AsyncBaseTransport):
    """The asyncio twin of :class:`BudgetTransport`, over an
    :class:`~redis_rl.AsyncTokenBudget` (``openai.AsyncOpenAI(http_client=httpx.AsyncClient(
    transport=AsyncBudgetTransport(budget)))``)."""

    budget: AsyncTokenBudget
    transport: httpx.AsyncBaseTransport

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """As :meth:`BudgetTransport.handle_request`."""
        if not _is_chat(request):
            return await self.transport.handle_async_request(request)
        try:
            e: _Estimate = _core.estimate_chat(await request.aread(), self.default_max_tokens)
        except ValueError:
            return await self.transport.handle_async_request(request)
        input, output, _stream, body, hide = e
        costs = _costs(self.budget, input, output)
        try:
            res = await self.budget.reserve(costs, wait_ms=self.wait_ms)
        except ValueError as too_large:
            return _too_large(str(too_large))
        if not res.granted:
            return _refused(res)
        call = _Call(self.budget, res)
        if body is not None:
            request = _with_body(request, body)
        try:
            response = await self.transport.handle_async_request(request)
        except BaseException as failed:
            await res.asettle(_failed_call(self.budget, failed))
            raise
        if response.status_code != 200 or not e[2]:
            content = await response.aread()
            await res.asettle(_replied(self.budget, response.status_code, content))
            return _decoded(response, content)
        return httpx.Response(
            response.status_code,
            headers=_headers(response),
            stream=_AsyncStream(response, call, _core.StreamUsage(hide)),
            extensions=response.extensions,
        )

    async def aclose(self) -> None:
        """Closes the transport the calls go on."""
        await self.transport.aclose()


class _AsyncStream(httpx.AsyncByteStream):
    def __init__(self, response: httpx.Response, call: _Call, reader: _core.StreamUsage) -> None:
        self.response = response
        self.call = call
        self.reader = reader

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self.response.aiter_bytes():
            out = self.reader.feed(chunk)
            if out:
                yield out
        rest = self.reader.finish()
        if rest:
            yield rest
        await self._settle()

    async def _settle(self) -> None:
        if not self.call.done:
            self.call.done = True
            await self.call.res.asettle(self.call.actual(self.reader.usage()))

    async def aclose(self) -> None:
        try:
            await self.response.aclose()
        finally:
            await self._settle()


__all__ = ["DEFAULT_MAX_TOKENS", "AsyncBudgetTransport", "BudgetTransport"]
