"""The ``openai`` SDK through :mod:`redis_rl.openai`'s transport, against the repository's
fake provider (``provider/``: its own token and request limits, 429s): reserve the
estimate, settle the usage, streams included; a fleet of callers that shares the budget
never meets the provider's 429."""

from __future__ import annotations

import asyncio
import sys
import threading
from pathlib import Path
from typing import Any, Iterator, List

import httpx
import pytest
from conftest import Server, peek_fields

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: provider/
from provider import ProviderHandle, start_provider

from redis_rl import AsyncTokenBudget, TokenBudget
from redis_rl.openai import AsyncBudgetTransport, BudgetTransport

openai = pytest.importorskip("openai")  # pinned for Python 3.10 and later

MESSAGES: List[Any] = [{"role": "user", "content": "Hello, provider."}]


@pytest.fixture
def provider() -> Iterator[ProviderHandle]:
    with start_provider(rpm=10_000, itpm=1_000_000, otpm=1_000_000) as handle:
        yield handle


def sdk(handle: ProviderHandle, budget: TokenBudget, **kwargs: Any) -> Any:
    http = httpx.Client(transport=BudgetTransport(budget, **kwargs))
    return openai.OpenAI(
        base_url=handle.url + "/v1", api_key="unused", max_retries=0, http_client=http
    )


def level(server: Server, budget: Any, name: str) -> float:
    return peek_fields(server.client(), budget.limits[name][0])["tokens"]


def test_a_reply_settles_its_usage(server: Server, provider: ProviderHandle, key: str) -> None:
    budget = TokenBudget(
        server.client(), key, limits={"input": (1e-3, 10_000), "output": (1e-3, 10_000)}
    )
    client = sdk(provider, budget)
    reply = client.chat.completions.create(
        model="m", messages=MESSAGES, max_tokens=500, extra_headers={"x-fake-output-tokens": "37"}
    )
    assert reply.usage.completion_tokens == 37
    # The buckets hold exactly what the provider counted: the estimates came back.
    assert abs(level(server, budget, "output") - (10_000 - 37)) < 0.01
    assert abs(level(server, budget, "input") - (10_000 - reply.usage.prompt_tokens)) < 0.01
    c = budget.counters
    assert (c.granted, c.settled, c.overage_tokens) == (1, 2, 0)
    assert c.refunded_tokens >= 500 - 37, "the output's unused estimate, and the input's"


def test_a_stream_settles_its_usage_and_reads_as_asked(
    server: Server, provider: ProviderHandle, key: str
) -> None:
    budget = TokenBudget(server.client(), key, 1e-3, 10_000)
    client = sdk(provider, budget)
    for asked in (False, True):
        before = level(server, budget, "tokens") if asked else 10_000.0
        options = {"stream_options": {"include_usage": True}} if asked else {}
        chunks = list(
            client.chat.completions.create(
                model="m", messages=MESSAGES, max_tokens=300, stream=True,
                extra_headers={"x-fake-output-tokens": "12"}, **options,
            )
        )  # fmt: skip
        usage = [c.usage for c in chunks if c.usage is not None]
        # The usage event reaches only a caller who asked for it.
        assert len(usage) == (1 if asked else 0)
        assert all(c.choices for c in chunks) != asked
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text
        used = before - level(server, budget, "tokens")
        stats = provider.stats()
        assert used == pytest.approx(12 + stats["input_tokens"] / stats["served"], abs=0.01)


def test_the_budget_refuses_before_the_provider(
    server: Server, provider: ProviderHandle, key: str
) -> None:
    budget = TokenBudget(server.client(), key, 1e-3, 1000)
    client = sdk(provider, budget)
    held = budget.reserve(900)  # another call in flight
    with pytest.raises(openai.RateLimitError) as refused:
        client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=500)
    assert refused.value.response.headers["x-redis-rl-denied-by"] == "tokens"
    assert int(refused.value.response.headers["retry-after-ms"]) > 0
    # A request that could never fit is refused as too large, without a retry-after.
    with pytest.raises(openai.RateLimitError) as too_large:
        client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=5000)
    assert "retry-after" not in too_large.value.response.headers
    assert "burst" in str(too_large.value)
    assert provider.stats()["requests"] == 0, "the provider never saw either"
    held.settle(0)


def test_a_provider_error_settles_the_tokens_at_zero(server: Server, key: str) -> None:
    # The provider's own limit is tighter than the budget's: its 429 costs the budget nothing.
    with start_provider(rpm=1) as handle:
        budget = TokenBudget(server.client(), key, 1e-3, 1000)
        client = sdk(handle, budget)
        client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=10)
        spent = 1000 - level(server, budget, "tokens")
        with pytest.raises(openai.RateLimitError):
            client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=10)
        assert 1000 - level(server, budget, "tokens") == pytest.approx(spent, abs=0.01)


def test_a_fleet_sharing_the_budget_never_meets_the_providers_429(server: Server, key: str) -> None:
    """Eight callers (threads, each its own SDK client: the instances of a fleet) send as
    fast as they can; the budget is the provider's limits (at 98%, float margins). Every
    call the budget grants, the provider admits: it reserves at least what the provider
    charges, before the provider does, and gives back after it."""
    limits = {"rpm": 600.0, "itpm": 6000.0, "otpm": 3000.0}
    with start_provider(**limits) as handle:
        share = 0.98
        budget_args = {
            "limits": {
                "input": (limits["itpm"] / 60 * share, limits["itpm"] * share),
                "output": (limits["otpm"] / 60 * share, limits["otpm"] * share),
            },
            "requests": (limits["rpm"] / 60 * share, limits["rpm"] * share),
        }
        results: List[str] = []
        lock = threading.Lock()

        def instance(i: int) -> None:
            budget = TokenBudget(server.client(), key, **budget_args)  # type: ignore[arg-type]
            client = sdk(handle, budget)
            for j in range(12):
                try:
                    client.chat.completions.create(
                        model="m", messages=[{"role": "user", "content": f"q {i} {j} " * 20}],
                        max_tokens=400, extra_headers={"x-fake-output-tokens": str(60 + j * 10)},
                    )  # fmt: skip
                    outcome = "ok"
                except openai.RateLimitError as e:
                    outcome = (
                        "budget" if "x-redis-rl-denied-by" in e.response.headers else "provider"
                    )
                with lock:
                    results.append(outcome)

        threads = [threading.Thread(target=instance, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        stats = handle.stats()
    assert results.count("provider") == 0, stats
    assert results.count("ok") > 0 and results.count("budget") > 0, results
    # The calls' outputs add up to 11,040 tokens against a burst of 2,940 and 49 a second:
    # the budget refused some (however fast or slow the machine), and what it let through
    # the provider served.
    assert stats["served"] == results.count("ok")


def test_async_transport(server: Server, provider: ProviderHandle, key: str) -> None:
    async def main() -> None:
        import redis.asyncio as aredis

        r = aredis.Redis(host="127.0.0.1", port=server.port)
        budget = AsyncTokenBudget(r, key, 1e-3, 10_000)
        http = httpx.AsyncClient(transport=AsyncBudgetTransport(budget))
        client = openai.AsyncOpenAI(
            base_url=provider.url + "/v1", api_key="unused", max_retries=0, http_client=http
        )
        reply = await client.chat.completions.create(
            model="m",
            messages=MESSAGES,
            max_tokens=100,
            extra_headers={"x-fake-output-tokens": "5"},
        )
        stream = await client.chat.completions.create(
            model="m", messages=MESSAGES, max_tokens=100, stream=True,
            extra_headers={"x-fake-output-tokens": "6"},
        )  # fmt: skip
        async for _ in stream:
            pass
        await client.close()
        await r.aclose()
        used = 10_000 - level(server, budget, "tokens")
        assert used == pytest.approx(2 * reply.usage.prompt_tokens + 5 + 6, abs=0.01)
        assert budget.counters.settled == 2

    asyncio.run(main())
