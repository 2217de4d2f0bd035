#!/usr/bin/env python3
"""The token-budget replay (docs/budgets.md, "The replay"): a fleet of 8 instances with
skewed demand calls one LLM provider (provider/: its own requests, input and output
tokens per minute, 429s) through the openai SDK, once per way of sharing the quota:

  none        no shared limit: every instance calls, the SDK retries the provider's 429s
  split       a local split: each instance its own budget at 1/8 of every limit
  after       charge after the response (LiteLLM's TPM check, ai-gateway #680): a call is let
              through while the shared bucket has anything left, and its usage charged after
  nosettle    reserve the prompt and max_tokens on the shared budget, never settle
  ours        reserve and settle (redis_rl.openai.BudgetTransport over a TokenBudget)
  outage      ours, Redis unreachable for a third of the run (SIGSTOP): the failure policy
              (ALLOW at 1/8 of each limit) decides meanwhile
  pin         ours, an operator's RL.PIN halving the output limit for the middle third

Columns: the provider's 429s, the share of its output tokens (the binding limit) and of
its requests used (of what it could serve in the run: its burst plus its rate times the
run), the wait before the provider admitted a call (p50, p99), Redis calls per request.

  budget_replay.py [--smoke] [--json PATH] [--markdown PATH]

Run by scripts/budget-replay in the Python test venv (the package, the openai SDK).
--smoke: 5 s per row, checks the bounds (ours: no provider 429; the others' outcomes are
reported, not asserted) and exits non-zero on a violation.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # provider/

import httpx  # noqa: E402
import openai  # noqa: E402
import redis  # noqa: E402

from provider import start_provider  # noqa: E402
from redis_rl import ALLOW, TokenBudget, _core  # noqa: E402
from redis_rl.openai import BudgetTransport  # noqa: E402

# The provider's limits, per minute (a small organisation's tier, scaled to a short run).
RPM, ITPM, OTPM = 600.0, 90_000.0, 24_000.0
SECONDS_PER_TOKEN = 0.002  # a 500-token stream lasts a second
# The fleet: 8 instances, 3 of them hot (workers each: calls in flight at once, calling
# back to back), 5 cold (one call at a time, 4 s apart: under their eighth of the quota).
WORKERS = [6, 5, 4, 1, 1, 1, 1, 1]
THINK_S = [0.0, 0.0, 0.0, 4.0, 4.0, 4.0, 4.0, 4.0]
# The budget's limits: the provider's, at 98% (two clocks and float rounding apart).
BUDGET_SHARE = 0.98
SEED = 20261206
ROWS = ["none", "split", "after", "nosettle", "ours", "outage", "pin"]
LABELS = {
    "none": "no shared limit",
    "split": "local split (1/8 each)",
    "after": "charge after the response",
    "nosettle": "reserve max_tokens, never settle",
    "ours": "reserve and settle (ours)",
    "outage": "ours, Redis unreachable for a third of the run",
    "pin": "ours, RL.PIN halves the output limit for a third",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Redis:
    """A redis-server with the module, in a temp dir, on a free port."""

    def __init__(self, module: str) -> None:
        self.dir = tempfile.mkdtemp(prefix="budget-replay-")
        self.port = free_port()
        self.proc = subprocess.Popen(
            [os.environ.get("RL_SERVER", "redis-server"), "--port", str(self.port),
             "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", self.dir,
             "--loadmodule", module],
            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
        )  # fmt: skip
        deadline = time.monotonic() + 10
        while True:
            try:
                if redis.Redis(port=self.port, socket_timeout=1).ping():
                    return
            except redis.exceptions.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.02)

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, socket_timeout=0.2, socket_connect_timeout=0.2)

    def calls(self) -> int:
        stats = redis.Redis(port=self.port).info("commandstats")
        return sum(
            int(v["calls"]) for k, v in stats.items() if k.lower().startswith("cmdstat_rl.")
        )

    def close(self) -> None:
        self.proc.send_signal(signal.SIGCONT)
        self.proc.kill()
        self.proc.wait()


def limits(share: float) -> Dict[str, Any]:
    s = BUDGET_SHARE * share
    return {
        "limits": {
            "input": (ITPM / 60 * s, ITPM * s),
            "output": (OTPM / 60 * s, OTPM * s),
        },
        "requests": (RPM / 60 * s, RPM * s),
    }


class _After(httpx.BaseTransport):
    """Charge after the response: a call passes while the shared output bucket is not
    empty, and its usage is charged when it ends (one token reserved, the rest settled as
    debt)."""

    def __init__(self, budget: TokenBudget) -> None:
        self.budget = budget
        self.inner = httpx.HTTPTransport()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        res = self.budget.reserve({"input": 1, "output": 1})
        while not res.granted:
            time.sleep(max(res.retry_after, 0.001))
            res = self.budget.reserve({"input": 1, "output": 1})
        # A stream is asked for its usage, as for ours, to charge it after.
        body = _core.estimate_chat(request.read(), 4096)[3]
        if body is not None:
            request = httpx.Request(
                request.method, request.url, content=body,
                headers=[(k, v) for k, v in request.headers.raw if k.lower() != b"content-length"],
            )  # fmt: skip
        response = self.inner.handle_request(request)
        content = response.read()
        usage = None
        if response.status_code == 200:
            reader = _core.StreamUsage(False)
            reader.feed(content)
            reader.finish()
            usage = reader.usage() or _core.chat_usage(content)
        res.settle({"input": usage[0], "output": usage[1]} if usage else {"input": 0, "output": 0})
        headers = [
            (k, v) for k, v in response.headers.raw
            if k.lower() not in (b"content-encoding", b"content-length", b"transfer-encoding")
        ]  # fmt: skip
        return httpx.Response(response.status_code, headers=headers, content=content)


class _NeverSettled(TokenBudget):
    """Reserves the estimate like ours, and never settles it."""

    def reserve(self, tokens: Any, *, wait_ms: int = 0) -> Any:
        res = super().reserve(tokens, wait_ms=wait_ms)
        res.settle = lambda actual=None: None  # type: ignore[method-assign]
        return res


def run_row(row: str, seconds: float, module: str) -> Dict[str, Any]:
    server = Redis(module)
    provider = start_provider(
        rpm=RPM, itpm=ITPM, otpm=OTPM, seconds_per_token=SECONDS_PER_TOKEN
    )
    waits: List[float] = []
    served = 0
    lock = threading.Lock()
    stop_at = time.monotonic() + seconds
    key = "openai:replay"

    def make_client(instance: int) -> Any:
        if row == "none":
            http = httpx.Client()
        elif row == "split":
            b = TokenBudget(server.client(), f"{key}:{instance}", instances=1, **limits(1 / 8))  # type: ignore[arg-type]
            http = httpx.Client(transport=BudgetTransport(b, wait_ms=60_000))
        elif row == "after":
            b = TokenBudget(server.client(), key, **limits(1.0))  # type: ignore[arg-type]
            http = httpx.Client(transport=_After(b))
        elif row == "nosettle":
            b = _NeverSettled(server.client(), key, **limits(1.0))  # type: ignore[arg-type]
            http = httpx.Client(transport=BudgetTransport(b, wait_ms=60_000))
        else:
            b = TokenBudget(
                server.client(), key, failure_policy=ALLOW, instances=8,  # type: ignore[arg-type]
                timeout=0.2, **limits(1.0),
            )  # fmt: skip
            http = httpx.Client(transport=BudgetTransport(b, wait_ms=60_000))
        # Without a shared budget the SDK's own retries (honouring the provider's
        # retry-after) are how a caller copes; a budget's transport waits itself, until the
        # end of the run.
        retries = 2 if row in ("none", "after") else 0
        return openai.OpenAI(
            base_url=provider.url + "/v1", api_key="unused", http_client=http,
            max_retries=retries, timeout=120,
        )  # fmt: skip

    clients = [make_client(i) for i in range(len(WORKERS))]  # one per instance

    def worker(instance: int, w: int) -> None:
        nonlocal served
        client = clients[instance]
        r = random.Random(f"{SEED}:{row}:{instance}:{w}")
        while time.monotonic() < stop_at:
            # Nobody waits past the end of the run (the transport is the instance's).
            transport = getattr(client._client, "_transport", None)
            if isinstance(transport, BudgetTransport):
                transport.wait_ms = int(max(0.0, stop_at - time.monotonic()) * 1000)
            prompt = "word " * r.randint(20, 400)
            max_tokens = r.choice([256, 512, 1024])
            output = max(1, int(max_tokens * r.uniform(0.05, 0.6)))
            stream = r.random() < 0.5
            started = time.monotonic()
            headers = {"x-fake-output-tokens": str(output)}
            try:
                if stream:
                    chunks = client.chat.completions.create(
                        model="m", messages=[{"role": "user", "content": prompt}],
                        max_tokens=max_tokens, stream=True, extra_headers=headers,
                    )  # fmt: skip
                    first = None
                    for _ in chunks:
                        if first is None:
                            first = time.monotonic()
                    admitted = first or time.monotonic()
                else:
                    client.chat.completions.create(
                        model="m", messages=[{"role": "user", "content": prompt}],
                        max_tokens=max_tokens, extra_headers=headers,
                    )  # fmt: skip
                    admitted = time.monotonic() - output * SECONDS_PER_TOKEN
            except openai.APIError:
                time.sleep(0.05)  # refused at the end of the run: nothing to wait for
                continue
            with lock:
                served += 1
                waits.append(max(0.0, admitted - started))
            time.sleep(min(THINK_S[instance], max(0.0, stop_at - time.monotonic())))

    threads = [
        threading.Thread(target=worker, args=(i, w), daemon=True)
        for i, n in enumerate(WORKERS)
        for w in range(n)
    ]
    started = time.monotonic()
    calls_before = server.calls()
    for t in threads:
        t.start()
    if row == "outage":
        time.sleep(seconds / 3)
        server.proc.send_signal(signal.SIGSTOP)
        time.sleep(seconds / 3)
        server.proc.send_signal(signal.SIGCONT)
    elif row == "pin":
        time.sleep(seconds / 3)
        pin_key = "{" + key + "}:output"
        r = redis.Redis(port=server.port)
        r.execute_command(
            "RL.PIN", pin_key, repr(OTPM / 60 * BUDGET_SHARE / 2), repr(OTPM * BUDGET_SHARE),
            "PX", int(seconds / 3 * 1000),
        )  # fmt: skip
    for t in threads:
        t.join(timeout=max(0.0, stop_at - time.monotonic()) + 120)
    elapsed = time.monotonic() - started
    stats = provider.stats()
    calls = server.calls() - calls_before
    provider.close()
    server.close()
    waits.sort()

    def pct(q: float) -> float:
        return waits[min(len(waits) - 1, int(q * len(waits)))] if waits else 0.0

    capacity_out = OTPM + OTPM / 60 * elapsed
    capacity_req = RPM + RPM / 60 * elapsed
    return {
        "row": row,
        "label": LABELS[row],
        "seconds": round(elapsed, 2),
        "provider_429s": stats["refused_total"],
        "served": served,
        "output_tokens": stats["output_tokens_actual"],
        "output_used": stats["output_tokens_actual"] / capacity_out,
        "requests_used": stats["served"] / capacity_req,
        "wait_p50_s": round(pct(0.5), 3),
        "wait_p99_s": round(pct(0.99), 3),
        "redis_calls_per_request": round(calls / served, 2) if served else 0.0,
        "refused_by": stats["refused"],
    }


def markdown(results: List[Dict[str, Any]]) -> str:
    lines = [
        "| way of sharing the quota | provider 429s | output tokens used | requests used "
        "| wait p50 / p99 | Redis calls per request |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r['label']} | {r['provider_429s']} | {r['output_used']:.1%} | "
            f"{r['requests_used']:.1%} | {r['wait_p50_s']:.2f} s / {r['wait_p99_s']:.2f} s | "
            f"{r['redis_calls_per_request']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def check(results: List[Dict[str, Any]]) -> List[str]:
    """The bounds a run must keep whatever the machine's speed."""
    bad = []
    for r in results:
        if r["row"] in ("ours", "pin", "nosettle", "split") and r["provider_429s"]:
            bad.append(f"{r['row']}: {r['provider_429s']} provider 429s (expected none)")
        if r["row"] == "ours" and r["served"] == 0:
            bad.append("ours: nothing served")
    return bad


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--module", default=os.path.join(ROOT, "target", "debug", "libredis_rl.so"))
    ap.add_argument("--json")
    ap.add_argument("--markdown")
    ap.add_argument("--rows", default=",".join(ROWS))
    ap.add_argument("--merge", action="store_true", help="replace these rows in --json")
    a = ap.parse_args()
    # The server changes into its own dir before it loads the module.
    a.module = os.path.abspath(a.module)
    seconds = 5.0 if a.smoke else 40.0
    results = []
    for row in a.rows.split(","):
        r = run_row(row, seconds, a.module)
        print(json.dumps(r), flush=True)
        results.append(r)
    if a.merge and a.json and os.path.exists(a.json):
        with open(a.json) as f:
            old = {r["row"]: r for r in json.load(f)["results"]}
        old.update({r["row"]: r for r in results})
        results = [old[r] for r in ROWS if r in old]
    table = markdown(results)
    print(table)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"seconds_per_row": seconds, "results": results}, f, indent=1)
    if a.markdown:
        with open(a.markdown, "w") as f:
            f.write(table)
    bad = check(results)
    for b in bad:
        print("VIOLATION:", b, file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
