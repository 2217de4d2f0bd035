"""Rules documents: validation, the plan of a request, the engine on a real server (all or
nothing, the deciding layer, live following, refused documents, Redis restarting), the CLI,
and the shipped seed document end to end through FastAPI and Flask."""

from __future__ import annotations

import json
import logging
import math
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest
import redis
import redis.asyncio as aredis
import yaml
from conftest import REPO, Server, peek_fields, wait_for
from test_cluster import cluster  # noqa: F401  (the fixture)

from redis_rl import AsyncRules, Rules, RulesError, parse_document
from redis_rl._protocol import parse_peek
from redis_rl.rules import apply_document, stored_document
from redis_rl.rules_doc import plan

SEED = REPO / "deploy" / "rules" / "seed.yaml"
#: The seed's layers with limits small enough to reach in a test (none refills within it).
SMALL = {
    "global_ip": "8/day",
    "api_search": "3/day",
    "premium_user": "6/day;5/hour",
    "free_user": "4/day",
}


def small_seed(prefix: str) -> str:
    doc = yaml.safe_load(SEED.read_text())
    doc["prefix"] = prefix
    for layer in doc["layers"]:
        layer["limit"] = SMALL[layer["name"]]
    return yaml.safe_dump(doc, sort_keys=False)


def attrs(
    ip: str, user: Optional[str] = None, tier: str = "free", path: str = "/v1/items"
) -> Dict[str, Any]:
    a: Dict[str, Any] = {"ip": ip, "path": path, "method": "GET", "tier": tier}
    if user is not None:
        a["user"] = user
    return a


# -- the document ----------------------------------------------------------------------


def test_seed_document_validates_and_plans_as_documented() -> None:
    doc = parse_document(SEED.read_text())
    assert [x.name for x in doc.layers] == ["global_ip", "api_search", "premium_user", "free_user"]
    got = plan(doc, attrs("1.2.3.4", "42", "premium", "/v1/search/q"))
    assert [(a.layer.name, [(b.key, b.rate, b.cap) for b in a.buckets]) for a in got] == [
        ("global_ip", [("rl:rules:{global_ip:ip:1.2.3.4}:60s", 5000 / 60, 5000.0)]),
        ("api_search", [("rl:rules:{api_search:search:1.2.3.4}:60s", 5.0, 300.0)]),
        (
            "premium_user",
            [
                ("rl:rules:{premium_user:user:42}:60s", 5000 / 60, 5000.0),
                ("rl:rules:{premium_user:user:42}:1s", 100.0, 100.0),
            ],
        ),
    ]
    # A free user: the first matching layer of the user:{user} group is free_user.
    assert [a.layer.name for a in plan(doc, attrs("1.2.3.4", "7"))] == ["global_ip", "free_user"]
    # No user attribute: the user layers do not apply (their key cannot be made).
    assert [a.layer.name for a in plan(doc, attrs("1.2.3.4"))] == ["global_ip"]
    # A glob: * crosses '/'; the path must match all of it.
    assert "api_search" in [a.layer.name for a in plan(doc, attrs("i", path="/v1/search/a/b"))]
    assert "api_search" not in [a.layer.name for a in plan(doc, attrs("i", path="/v2/v1/search/a"))]


def test_errors_name_line_and_field() -> None:
    text = (
        "layers:\n"  # 1
        "  - name: a\n"  # 2
        '    key: "u:{usr}"\n'  # 3
        "    limit: 5/ms\n"  # 4
        "    bogus: 1\n"  # 5
        "  - name: b\n"  # 6
        "    key: x\n"  # 7
        '    limit: "5/minute"\n'  # 8
        "    shadow: maybe\n"  # 9
        "    match: {verb: GET}\n"  # 10
    )
    with pytest.raises(RulesError) as e:
        parse_document(text)
    got = {(p.line, p.field) for p in e.value.problems}
    assert got == {
        (3, "layers[0].key"),
        (4, "layers[0].limit"),
        (5, "layers[0].bogus"),
        (9, "layers[1].shadow"),
        (10, "layers[1].match.verb"),
    }, e.value.problems
    assert "'ms' is not a unit" in str(e.value)


@pytest.mark.parametrize(
    "text,what",
    [
        ("layers: []", "non-empty list"),
        ("{}", "non-empty list"),
        ("- a", "a mapping"),
        ("layers: [{name: a, key: k, limit: 1/s}, {name: a, key: j, limit: 1/s}]", "name too"),
        ("layers: [{name: a, key: 'k:{ip', limit: 1/s}]", "placeholder"),
        ("prefix: 'a{b}'\nlayers: [{name: a, key: k, limit: 1/s}]", "prefix"),
        ("layers:\n  - name: a\n    name: b\n    key: k\n    limit: 1/s\n", "given twice"),
        ("layers: [{name: a, key: k, limit: 1/s}", "not YAML or JSON"),
    ],
)
def test_refused_documents(text: str, what: str) -> None:
    with pytest.raises(RulesError, match=what):
        parse_document(text)


def test_json_is_accepted_and_attributes_can_be_declared() -> None:
    text = json.dumps(
        {"attributes": ["org"], "layers": [{"name": "o", "key": "org:{org}", "limit": "1/s"}]}
    )
    doc = parse_document("\t" + text)  # a tab YAML refuses; JSON takes it
    assert [a.key for a in plan(doc, {"org": "acme"})] == ["rl:rules:{o:org:acme}"]


# -- the engine on a real server -------------------------------------------------------


@pytest.fixture
def prefix(key: str) -> str:
    return key.replace("{", "").replace("}", "") + ":"


def test_each_layer_refuses_with_its_code_and_nothing_else_is_debited(
    server: Server, prefix: str
) -> None:
    r = server.client()
    rules = Rules.from_text(r, small_seed(prefix))

    def left(name: str, rendered: str, suffix: str = "86400s") -> float:
        return math.floor(peek_fields(r, f"{prefix}{{{name}:{rendered}}}:{suffix}")["tokens"])

    # A free user: 4 a day, then free_user refuses; the IP's bucket keeps its 4 tokens.
    for i in range(4):
        d = rules.check(attrs("10.0.0.1", "free1"))
        assert d.granted and d.layer == "free_user" and math.floor(d.remaining) == 3 - i, d
    d = rules.check(attrs("10.0.0.1", "free1"))
    assert (d.granted, d.layer, d.code) == (False, "free_user", "user_rate_limit")
    assert d.retry_after_ms > 0 and d.headers()["X-RateLimit-Limit"] == "4"
    assert json.loads(d.body()) == {
        "code": "user_rate_limit",
        "layer": "free_user",
        "retry_after": d.retry_after_secs,
    }
    assert left("global_ip", "ip:10.0.0.1") == 4

    # A premium user: the hour's 5 bind before the day's 6.
    for _ in range(5):
        assert rules.check(attrs("10.0.0.2", "prem1", "premium"))
    d = rules.check(attrs("10.0.0.2", "prem1", "premium"))
    assert (d.granted, d.layer, d.code) == (False, "premium_user", "user_rate_limit")
    assert d.key == f"{prefix}{{premium_user:user:prem1}}:3600s"
    assert left("premium_user", "user:prem1") == 1 and left("global_ip", "ip:10.0.0.2") == 3

    # The search path: api_search's 3, then it refuses; the user's and the IP's keep theirs.
    for _ in range(3):
        assert rules.check(attrs("10.0.0.3", "prem2", "premium", "/v1/search/x"))
    d = rules.check(attrs("10.0.0.3", "prem2", "premium", "/v1/search/x"))
    assert (d.granted, d.layer, d.code) == (False, "api_search", "search_rate_limit")
    assert left("premium_user", "user:prem2", "3600s") == 2
    assert left("global_ip", "ip:10.0.0.3") == 5

    # One IP over its global limit (new users each time): global_ip refuses the 9th, and
    # that request's user bucket is never made.
    for i in range(8):
        assert rules.check(attrs("10.0.0.4", f"u{i}"))
    d = rules.check(attrs("10.0.0.4", "u8"))
    assert (d.granted, d.layer, d.code) == (False, "global_ip", "ip_rate_limit")
    assert r.exists(f"{prefix}{{free_user:user:u8}}:86400s") == 0
    m = rules.metrics.to_prometheus()
    assert 'redis_rl_rules_decisions_total{layer="global_ip",outcome="denied"} 1' in m


def test_shadow_layer_logs_and_never_refuses(
    server: Server, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    r = server.client()
    text = (
        f"prefix: '{prefix}'\nlayers:\n"
        "  - {name: trial, key: 'ip:{ip}', limit: 2/day, shadow: true, code: trial}\n"
        "  - {name: ip, key: 'ip:{ip}', limit: 5/day}\n"
    )
    rules = Rules.from_text(r, text)
    caplog.set_level(logging.INFO, logger="redis_rl.rules.decisions")
    seen = [rules.check({"ip": "a"}) for _ in range(5)]
    assert all(seen) and [d.shadow_denied for d in seen] == [
        (),
        (),
        ("trial",),
        ("trial",),
        ("trial",),
    ]
    assert not rules.check({"ip": "a"})  # the enforced layer of the same key still applies
    lines = [json.loads(rec.getMessage()) for rec in caplog.records]
    assert [x["decision"] for x in lines] == ["granted"] * 3 + ["denied"]
    assert lines[-1]["layer"] == "ip" and lines[-1]["attributes"] == {"ip": "a"}


def test_across_slots_a_later_refusal_gives_back_the_earlier_grant(
    server: Server, prefix: str
) -> None:
    r = server.client()
    text = (
        f"prefix: '{prefix}'\nlayers:\n"
        "  - {name: ip, key: 'ip:{ip}', limit: 5/day}\n"
        "  - {name: user, key: 'user:{user}', limit: 1/day}\n"
    )
    rules = Rules.from_text(r, text)

    class Slots:  # a standalone server with a cluster's slot split: one slot per layer
        def __getattr__(self, name: str) -> Any:
            return getattr(r, name)

        def keyslot(self, key: str) -> int:
            return 0 if "{ip:" in key else 1

    rules.client = Slots()  # type: ignore[assignment]
    assert rules.check({"ip": "a", "user": "u"})
    d = rules.check({"ip": "a", "user": "u"})
    assert (d.granted, d.layer) == (False, "user")
    assert math.floor(peek_fields(r, f"{prefix}{{ip:ip:a}}:86400s")["tokens"]) == 4  # refunded


def test_fail_open_on_error_replies_is_counted(server: Server, prefix: str) -> None:
    r = server.client()
    text = f"prefix: '{prefix}'\nlayers:\n  - {{name: ip, key: 'ip:{{ip}}', limit: 1/day}}\n"
    r.set(f"{prefix}{{ip:ip:a}}:86400s", "not a bucket")  # WRONGTYPE on every take
    d = Rules.from_text(r, text).check({"ip": "a"})
    assert d.granted and d.source.value == "fallback"
    closed = Rules.from_text(r, text, fail_open=False)
    assert not closed.check({"ip": "a"}) and closed.metrics.fail_closed == 1


# -- following the stored document -----------------------------------------------------


def doc_text(prefix: str, limit: str) -> str:
    return f"prefix: '{prefix}'\nlayers:\n  - {{name: ip, key: 'ip:{{ip}}', limit: '{limit}'}}\n"


def test_follows_applies_refuses_broken_documents_and_survives_a_restart(
    own_server: Server, caplog: pytest.LogCaptureFixture
) -> None:
    r = own_server.client()
    with pytest.raises(RulesError, match="no document"):
        Rules.from_redis(r, key="rl:rules")
    assert apply_document(r, doc_text("p:", "1/day")) == 1
    with Rules.from_redis(r, poll_interval=0.02) as rules:
        assert rules.version == 1
        assert rules.check({"ip": "a"}) and not rules.check({"ip": "a"})
        apply_document(r, doc_text("p:", "3/day"))
        wait_for(lambda: rules.version == 2, "version 2 in force")
        # The new limit: 3 a day (a's empty bucket is not refilled by the change).
        assert [bool(rules.check({"ip": "b"})) for _ in range(4)] == [True] * 3 + [False]

        # A broken document stored behind the CLI's back: refused once, version 2 kept.
        caplog.set_level(logging.ERROR, logger="redis_rl.rules")
        r.hset("rl:rules", mapping={"document": "layers: [{name: x}]"})
        r.hincrby("rl:rules", "version", 1)
        wait_for(lambda: rules.metrics.refused_documents == 1, "the broken document refused")
        assert rules.version == 2 and rules.check({"ip": "c"})
        assert any("refused version 3, keeping version 2" in m for m in caplog.messages)

        # Redis restarts empty: the polls fail, then find no document; version 2 stays.
        own_server.restart()
        wait_for(
            lambda: rules.metrics.poll_errors > 0 or "holds no document" in caplog.text,
            "the restart seen",
        )
        assert rules.version == 2
        apply_document(r, doc_text("p:", "2/day"))
        wait_for(lambda: rules.version == 1, "the restarted server's version 1 in force")
        assert rules.document.layers[0].limit == "2/day"
    assert stored_document(r)[0] == 1


def test_async_rules_follow(server: Server, key: str) -> None:
    import asyncio

    rkey = f"{key}:rules"
    r = server.client()
    apply_document(r, doc_text(key + ":", "1/day"), rkey)

    async def run() -> None:
        a = aredis.Redis(port=server.port)
        rules = await AsyncRules.from_redis(a, key=rkey, poll_interval=0.02)
        assert await rules.check({"ip": "x"}) and not await rules.check({"ip": "x"})
        apply_document(r, doc_text(key + ":", "5/day"), rkey)
        deadline = time.monotonic() + 15
        while rules.version != 2:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        assert rules.document.layers[0].limit == "5/day" and await rules.check({"ip": "y"})
        await rules.close()
        await a.aclose()

    asyncio.run(run())


FOLLOWER = """
import sys, time, redis
from redis.backoff import NoBackoff
from redis.retry import Retry
from redis_rl import Rules
r = redis.Redis(port=int(sys.argv[1]), socket_timeout=1, retry=Retry(NoBackoff(), 0))
rules = Rules.from_redis(r, key=sys.argv[2])
print("ready", rules.version, flush=True)
for line in sys.stdin:
    word, arg = line.split()
    if word == "wait":  # until version arg is in force
        while rules.version != int(arg):
            time.sleep(0.001)
        print("seen", time.time(), flush=True)
    elif word == "until":  # until counter arg moved; then what is in force
        while not getattr(rules.metrics, arg):
            time.sleep(0.001)
        print("state", rules.version, rules.check({"ip": "fleet"}).layer, flush=True)
"""


class Fleet:
    """Processes each following the document under one key (the default 0.5 s poll)."""

    def __init__(self, port: int, key: str, n: int) -> None:
        self.procs = [
            subprocess.Popen(
                [sys.executable, "-c", FOLLOWER, str(port), key],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            for _ in range(n)
        ]

    def ask(self, line: str) -> List[List[str]]:
        for proc in self.procs:
            assert proc.stdin is not None
            proc.stdin.write(line + "\n")
            proc.stdin.flush()
        return self.read()

    def read(self) -> List[List[str]]:
        out = []
        for proc in self.procs:
            assert proc.stdout is not None
            out.append(proc.stdout.readline().split())
        return out

    def close(self) -> None:
        for proc in self.procs:
            proc.kill()
            proc.wait()


def test_four_processes_follow_applies_and_keep_rules_through_breakage(
    own_server: Server,
) -> None:
    """Four processes with the default poll (0.5 s) all take a new version (how long they
    took is printed: measured, not asserted), keep it through a broken stored document and
    through Redis restarting empty, and take the next apply."""
    r = own_server.client()
    rkey = "rl:rules"
    apply_document(r, doc_text("p:", "1/day"), rkey)
    fleet = Fleet(own_server.port, rkey, 4)
    try:
        assert fleet.read() == [["ready", "1"]] * 4
        for proc in fleet.procs:  # the wait starts before the apply
            assert proc.stdin is not None
            proc.stdin.write("wait 2\n")
            proc.stdin.flush()
        applied = time.time()
        apply_document(r, doc_text("p:", "2/day"), rkey)
        delays = [float(when) - applied for _, when in fleet.read()]
        print(f"4 processes followed an apply after {sorted(round(d, 3) for d in delays)} s")

        r.hset(rkey, mapping={"document": "layers: [{name: broken}]"})
        r.hincrby(rkey, "version", 1)
        assert fleet.ask("until refused_documents") == [["state", "2", "ip"]] * 4

        own_server.restart()  # no persistence: the document is gone
        assert fleet.ask("until poll_errors") == [["state", "2", "ip"]] * 4
        apply_document(r, doc_text("q:", "5/day"), rkey)
        assert fleet.ask("wait 1")[0][0] == "seen"
        assert fleet.ask("until reloads") == [["state", "1", "ip"]] * 4
    finally:
        fleet.close()


# -- the command line ------------------------------------------------------------------


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "redis_rl", "rules", *args], capture_output=True, text=True
    )


def test_cli_check_apply_show_diff(server: Server, key: str, tmp_path: Path) -> None:
    url = f"redis://127.0.0.1:{server.port}"
    rkey = f"{key}:rules"
    assert cli("check", str(SEED)).returncode == 0
    bad = tmp_path / "bad.yaml"
    bad.write_text("layers:\n  - name: a\n    key: k\n    limit: 5/ss\n")
    out = cli("check", str(bad))
    assert out.returncode == 1 and f"{bad}:4: layers[0].limit: " in out.stderr, out.stderr
    out = cli("apply", str(bad), "--redis-url", url, "--key", rkey)
    assert out.returncode == 1 and "nothing applied" in out.stderr
    assert server.client().exists(rkey) == 0
    out = cli("apply", str(SEED), "--redis-url", url, "--key", rkey)
    assert out.returncode == 0 and "version 1" in out.stdout, out.stderr
    out = cli("show", "--redis-url", url, "--key", rkey)
    assert "version 1" in out.stdout and "premium_user" in out.stdout
    assert cli("diff", str(SEED), "--redis-url", url, "--key", rkey).returncode == 0
    other = tmp_path / "other.yaml"
    other.write_text(SEED.read_text().replace("300/minute", "200/minute"))
    out = cli("diff", str(other), "--redis-url", url, "--key", rkey)
    assert out.returncode == 1 and '-    limit: "300/minute"' in out.stdout


# -- end to end: the seed through FastAPI and Flask ------------------------------------

fastapi = pytest.importorskip("fastapi")
flask = pytest.importorskip("flask")


def header_attributes(get: Any) -> Dict[str, Any]:
    # Behind a proxy the client's address is a trusted header's; user and tier would come
    # from a verified JWT.
    out = {
        k: get(h) for k, h in (("ip", "x-forwarded-for"), ("user", "x-user"), ("tier", "x-tier"))
    }
    return {k: v for k, v in out.items() if v is not None}


def seed_requests(get: Any, prefix: str, r: redis.Redis) -> None:
    """The four cases through an HTTP app: ``get(path, headers) -> (status, headers, json)``."""

    def call(ip: str, user: str, tier: str = "free", path: str = "/v1/items") -> Any:
        return get(path, {"x-forwarded-for": ip, "x-user": user, "x-tier": tier})

    for _ in range(4):
        status, headers, _ = call("10.1.0.1", "free")
        assert status == 200 and headers["x-ratelimit-limit"] == "4"
    status, headers, body = call("10.1.0.1", "free")
    assert status == 429 and body["layer"] == "free_user" and body["code"] == "user_rate_limit"
    assert int(headers["retry-after"]) >= 1 and headers["x-ratelimit-limit"] == "4"
    for _ in range(5):
        assert call("10.1.0.2", "prem", "premium")[0] == 200
    assert call("10.1.0.2", "prem", "premium")[2]["layer"] == "premium_user"
    for _ in range(3):
        assert call("10.1.0.3", "prem2", "premium", "/v1/search/q")[0] == 200
    status, _, body = call("10.1.0.3", "prem2", "premium", "/v1/search/q")
    assert (status, body["layer"], body["code"]) == (429, "api_search", "search_rate_limit")
    for i in range(8):
        assert call("10.1.0.4", f"u{i}")[0] == 200
    status, _, body = call("10.1.0.4", "u8")
    assert (status, body["layer"]) == (429, "global_ip")
    # Nothing debited from layers that did not refuse.
    assert math.floor(peek_fields(r, f"{prefix}{{global_ip:ip:10.1.0.1}}:86400s")["tokens"]) == 4
    assert math.floor(peek_fields(r, f"{prefix}{{premium_user:user:prem2}}:3600s")["tokens"]) == 2
    assert r.exists(f"{prefix}{{free_user:user:u8}}:86400s") == 0


def test_seed_end_to_end_fastapi(server: Server, prefix: str) -> None:
    from fastapi.testclient import TestClient

    from redis_rl.asgi import RateLimitMiddleware

    r = server.client()
    apply_document(r, small_seed(prefix), f"{prefix}rules")
    app = fastapi.FastAPI()
    app.add_middleware(
        RateLimitMiddleware,
        rules=AsyncRules(aredis.Redis(port=server.port), key=f"{prefix}rules"),
        attributes=lambda scope: header_attributes(
            lambda h: dict(scope["headers"]).get(h.encode(), b"").decode() or None
        ),
    )

    @app.get("/{rest:path}")
    def anything(rest: str) -> Dict[str, str]:
        return {"ok": rest}

    with TestClient(app) as client:

        def get(path: str, headers: Dict[str, str]) -> Any:
            resp = client.get(path, headers=headers)
            assert len(resp.headers.get_list("x-ratelimit-limit")) == 1
            return resp.status_code, resp.headers, resp.json()

        seed_requests(get, prefix, r)


def test_seed_end_to_end_flask(server: Server, prefix: str) -> None:
    from redis_rl.wsgi import RateLimitWSGIMiddleware

    r = server.client()
    apply_document(r, small_seed(prefix), f"{prefix}rules")
    app = flask.Flask(__name__)
    with Rules.from_redis(r, key=f"{prefix}rules") as rules:
        app.wsgi_app = RateLimitWSGIMiddleware(  # type: ignore[method-assign]
            app.wsgi_app,
            rules=rules,
            attributes=lambda environ: header_attributes(
                lambda h: environ.get("HTTP_" + h.upper().replace("-", "_"))
            ),
        )

        @app.get("/<path:rest>")
        def anything(rest: str) -> Dict[str, str]:
            return {"ok": rest}

        client = app.test_client()

        def get(path: str, headers: Dict[str, str]) -> Any:
            resp = client.get(path, headers=headers)
            assert len(resp.headers.getlist("X-RateLimit-Limit")) == 1
            return resp.status_code, {k.lower(): v for k, v in resp.headers}, resp.get_json()

        seed_requests(get, prefix, r)


RULE_CASES = json.loads((REPO / "protocol" / "rules_cases.json").read_text())


def case_document(name: str) -> str:
    d = RULE_CASES["documents"][name]
    return (REPO / d["file"]).read_text() if "file" in d else str(d["text"])


@pytest.mark.parametrize("case", RULE_CASES["plans"], ids=lambda c: json.dumps(c["attributes"]))
def test_golden_plans(case: Dict[str, Any]) -> None:
    doc = parse_document(case_document(case["document"]))
    got = [[a.layer.name, [b.key for b in a.buckets]] for a in plan(doc, case["attributes"])]
    assert got == case["layers"]


@pytest.mark.parametrize("case", RULE_CASES["refused"], ids=lambda c: str(c["text"]))
def test_golden_refusals(case: Dict[str, Any]) -> None:
    with pytest.raises(RulesError) as e:
        parse_document(case["text"])
    assert case["field"] in [p.field for p in e.value.problems], e.value.problems


class ScriptedCalls:
    """A check's transport scripted by a golden case (the calls it must make, what each
    gets), so that the case runs through this shell's own loop: its argument lists, its
    exceptions sorted into replies, failures and error replies, its refunds."""

    def __init__(self, events: List[Dict[str, Any]], slots: bool) -> None:
        self.events = list(events)
        self.refunds: List[List[str]] = []
        if slots:
            self.keyslot = lambda key: 0  # only its presence matters: the core groups

    def execute_command(self, *args: Any) -> Any:
        sent = [a.decode() if isinstance(a, bytes) else str(a) for a in args]
        if not self.events:
            self.refunds.append(sent)
            return 1
        event = self.events.pop(0)
        assert sent == event["send"]
        if "reply" in event:
            return case_reply(event["reply"])
        if "error_reply" in event:
            raise redis.exceptions.ResponseError(event["error_reply"])
        raise redis.exceptions.TimeoutError(event["error"])


def case_reply(j: Any) -> Any:
    """A case's reply as redis-py hands it over."""
    if isinstance(j, str):
        return j.encode()
    if isinstance(j, list):
        return [case_reply(x) for x in j]
    return j


@pytest.mark.parametrize("case", RULE_CASES["checks"], ids=lambda c: str(c["about"])[:50])
def test_golden_checks(case: Dict[str, Any]) -> None:
    from redis_rl import ProtocolError

    calls = ScriptedCalls(case.get("events", []), case.get("cluster", False))
    rules = Rules.from_text(
        calls,  # type: ignore[arg-type]
        case_document(case["document"]),
        fail_open=case.get("fail_open", True),
        backend=case.get("backend", "module"),
    )
    cost = case.get("cost", 1)
    if "cost_error" in case:
        with pytest.raises(ValueError, match=case["cost_error"]):
            rules.check(case["attributes"], cost)
        return
    want = case["decision"]
    if want is None:
        with pytest.raises(ProtocolError):
            rules.check(case["attributes"], cost)
    else:
        d = rules.check(case["attributes"], cost)
        got = {
            "granted": d.granted,
            "remaining": d.remaining,
            "retry_after_ms": d.retry_after_ms,
            "reset_after_ms": d.reset_after_ms,
            "tokens": d.tokens,
            "limit": d.limit,
            "layer": d.layer,
            "code": d.code,
            "key": d.key,
            "shadow_denied": list(d.shadow_denied),
            "fallback": d.source.name == "FALLBACK",
        }
        assert got == want
    assert calls.events == [], "calls not made"
    assert calls.refunds == case["refunds"]


def test_rules_metrics_reach_prometheus_client(server: Server, prefix: str) -> None:
    prometheus_client = pytest.importorskip("prometheus_client")
    from redis_rl.prometheus import register_rules

    r = server.client()
    apply_document(r, doc_text(prefix, "1/day"), f"{prefix}rules")
    with Rules.from_redis(r, key=f"{prefix}rules") as rules:
        rules.check({"ip": "m"})
        rules.check({"ip": "m"})
        registry = prometheus_client.CollectorRegistry()
        register_rules(rules.metrics, registry)
        text = prometheus_client.generate_latest(registry).decode()
    assert "redis_rl_rules_version 1.0" in text
    assert 'redis_rl_rules_decisions_total{layer="ip",outcome="granted"} 1.0' in text
    assert 'redis_rl_rules_decisions_total{layer="ip",outcome="denied"} 1.0' in text
    assert "redis_rl_rules_refused_documents_total 0.0" in text


def test_hostile_documents_are_refused_quickly() -> None:
    laughs = "a: &a [x, x, x, x, x, x, x, x, x, x]\n"
    for i, name in enumerate("bcdefghij"):
        prev = "abcdefghij"[i]
        refs = ", ".join([f"*{prev}"] * 10)
        laughs += f"{name}: &{name} [{refs}]\n"
    laughs += "layers: [{name: a, key: k, limit: 1/s}]\n"
    with pytest.raises(RulesError, match="aliases expand the document"):
        parse_document(laughs)  # 10^10 leaves if walked naively: refused as it is read
    with pytest.raises(RulesError, match="nested too deeply"):
        parse_document("[" * 100_000 + "]" * 100_000)
    with pytest.raises(RulesError, match="longer than"):
        parse_document("layers: []\n" + "#" * (1 << 20))


def test_a_hostile_stored_document_does_not_stop_the_follower(server: Server, key: str) -> None:
    rkey = f"{key}:rules"
    r = server.client()
    apply_document(r, doc_text(key + ":", "1/day"), rkey)
    with Rules.from_redis(r, key=rkey, poll_interval=0.02) as rules:
        r.hset(rkey, mapping={"document": "[" * 100_000 + "]" * 100_000})
        r.hincrby(rkey, "version", 1)
        wait_for(lambda: rules.metrics.refused_documents == 1, "the deep document refused")
        apply_document(r, doc_text(key + ":", "2/day"), rkey)
        wait_for(lambda: rules.version == 3, "the next good version followed")


def test_a_cost_no_layer_can_grant_is_the_callers_error(server: Server, prefix: str) -> None:
    rules = Rules.from_text(server.client(), doc_text(prefix, "5/day"))
    with pytest.raises(ValueError, match="exceeds layer ip's cap 5"):
        rules.check({"ip": "a"}, cost=6)
    with pytest.raises(ValueError, match="positive integer"):
        rules.check({"ip": "a"}, cost=0)
    assert rules.check({"ip": "a"}, cost=5) and not rules.check({"ip": "a"})


def test_cluster_takes_slot_by_slot_and_refunds(cluster: list[Server]) -> None:  # noqa: F811
    from redis.cluster import RedisCluster

    rc = RedisCluster(host="127.0.0.1", port=cluster[0].port)
    rules = Rules.from_text(rc, small_seed("c:"))
    ip_key = "c:{global_ip:ip:10.9.0.1}:86400s"
    user_key = "c:{free_user:user:cf}:86400s"
    assert rc.keyslot(ip_key) != rc.keyslot(user_key)  # two slots: two RL.MTAKE
    for _ in range(4):
        assert rules.check(attrs("10.9.0.1", "cf"))
    d = rules.check(attrs("10.9.0.1", "cf"))
    assert (d.granted, d.layer) == (False, "free_user")
    peek = parse_peek(rc.execute_command("RL.PEEK", ip_key))
    assert peek is not None and math.floor(peek.tokens) == 4  # the ip grant was given back
    rc.close()


def test_a_file_is_followed_too(server: Server, prefix: str, tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(doc_text(prefix, "1/day"))
    with Rules.from_file(server.client(), str(path), poll_interval=0.02) as rules:
        assert rules.check({"ip": "f"}) and not rules.check({"ip": "f"})
        path.write_text(doc_text(prefix + "b:", "2/day"))
        wait_for(lambda: rules.document.prefix == prefix + "b:", "the new file in force")
        path.write_text("layers: [{name: broken}]\n")
        wait_for(lambda: rules.metrics.refused_documents == 1, "the broken file refused")
        path.unlink()
        wait_for(lambda: rules.metrics.poll_errors == 1, "the missing file seen")
        assert rules.document.prefix == prefix + "b:" and rules.check({"ip": "f"})


def test_globs_take_linear_time_on_hostile_paths() -> None:
    from redis_rl.rules_doc import glob

    g = glob("*a*a*a*a*a*a*b")
    assert not g.fullmatch("a" * 20_000)  # a backtracking regex would never return
    assert g.fullmatch("a" * 20_000 + "b")
    assert glob("/v1/search/*").fullmatch("/v1/search/") and glob("a?c*").fullmatch("abc")
    assert glob("*x*y").fullmatch("axxzy") and not glob("*x*y").fullmatch("axyz")
    assert glob("").fullmatch("") and not glob("").fullmatch("a") and glob("*").fullmatch("")
    assert glob("a.b").fullmatch("a.b") and not glob("a.b").fullmatch("axb")


def test_no_layer_applies_is_a_grant_without_a_call(server: Server, prefix: str) -> None:
    text = (
        f"prefix: '{prefix}'\nlayers:\n"
        "  - {name: admin, match: {path: '/admin/*'}, key: 'ip:{ip}', limit: 1/day}\n"
        "  - {name: trial, key: 'ip:{ip}', limit: 1/day, shadow: true}\n"
    )
    rules = Rules.from_text(server.client(), text)
    for _ in range(3):
        d = rules.check({"ip": "n", "path": "/public"})
        assert d.granted and d.layer is None and d.source.value == "server" and d.headers() == {}
    assert rules.metrics.fail_open == 0
    assert [x.shadow_denied for x in [rules.check({"ip": "m"}), rules.check({"ip": "m"})]] == [
        (),
        ("trial",),
    ]


def test_rules_over_the_functions_library(fserver: Server) -> None:
    text = doc_text("fn:", "2/day") + "  - {name: user, key: 'user:{user}', limit: '1/day'}\n"
    rules = Rules.from_text(fserver.client(), text)  # auto: no module, the library
    assert rules.check({"ip": "a", "user": "u"})
    d = rules.check({"ip": "a", "user": "u"})
    assert (d.granted, d.layer) == (False, "user")
    d = rules.check({"ip": "a", "user": "v"})
    assert d.granted and d.layer in ("ip", "user")
    assert not rules.check({"ip": "a", "user": "w"}) and rules.metrics.fail_open == 0


def test_one_round_trip_per_check_on_one_server(own_server: Server) -> None:
    r = own_server.client()
    rules = Rules.from_text(r, small_seed("o:"), backend="module")
    r.execute_command("CONFIG", "RESETSTAT")
    d = rules.check(attrs("10.2.0.1", "p", "premium", "/v1/search/q"))  # 3 layers, 4 buckets
    stats = r.info("commandstats")
    assert (
        d.granted
        and len(plan(rules.document, attrs("10.2.0.1", "p", "premium", "/v1/search/q"))) == 3
    )
    calls = {
        k.lower(): v["calls"]
        for k, v in stats.items()
        if k not in ("cmdstat_info", "cmdstat_config|resetstat")
    }
    assert calls == {"cmdstat_rl.mtake": 1}, calls


def test_redis_away_is_the_failure_policys_decision() -> None:
    """Divergence 6 on a port nothing listens on (through the client's pool, the direct
    path): failing closed is a denial by the first enforced layer, failing open a grant."""
    from conftest import free_port
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    from redis_rl import Source

    r = redis.Redis(
        port=free_port(),
        socket_timeout=0.2,
        socket_connect_timeout=0.2,
        retry=Retry(NoBackoff(), 0),
    )
    closed = Rules.from_text(r, SEED.read_text(), fail_open=False, backend="module")
    d = closed.check(attrs("1.2.3.4", "7"), 2)
    assert (d.granted, d.source, d.layer, d.code) == (
        False,
        Source.FALLBACK,
        "global_ip",
        "ip_rate_limit",
    )
    assert d.retry_after_ms == 1000 and closed.metrics.fail_closed == 1
    opened = Rules.from_text(r, SEED.read_text(), backend="module")
    d = opened.check(attrs("1.2.3.4", "7"))
    assert d.granted and d.source is Source.FALLBACK and d.layer is None
    assert opened.metrics.fail_open == 1


def test_costs_beyond_64_bits_and_odd_attributes() -> None:
    """A cost no integer type holds is the caller's error like any cost above a cap; an
    attribute that is not a string is read as ``str()`` makes it, ``None`` as absent."""
    rules = Rules.from_text(None, "layers: [{name: a, key: 'u:{user}', limit: 5/s}]")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="exceeds"):
        rules.check({"user": "x"}, 2**70)
    with pytest.raises(ValueError, match="positive"):
        rules.check({"user": "x"}, True)
    assert [a.key for a in plan(rules.document, {"user": 42})] == ["rl:rules:{a:u:42}"]
    assert plan(rules.document, {"user": None}) == []
    d = rules.check({"user": None})  # no layer applies: granted, no call (no client)
    assert d.granted and d.layer is None
