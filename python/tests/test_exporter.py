"""redis-rl-exporter (redis_rl.exporter) against real servers, scraped by a real Prometheus.

The Prometheus tests need Debian's ``prometheus`` package (``prometheus`` and ``promtool``;
scripts/test-python installs it when missing). They check the shipped alerting rules
(``promtool check rules`` and the unit tests in deploy/prometheus/rules.test.yml) and run
every query of the Grafana dashboard (deploy/grafana/redis-rl.json) and every rule against
a Prometheus that scraped the exporter and a client's metrics.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import pytest
import redis
from conftest import FUNCTIONS_LUA, REPO, Server, _check_setup, free_port
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.parser import text_string_to_metric_families

from redis_rl import Metrics, RulesMetrics
from redis_rl.exporter import RlCollector, parse_listen
from redis_rl.prometheus import register, register_rules

DEPLOY = REPO / "deploy"
RULES = DEPLOY / "prometheus" / "rules.yml"
RULES_TEST = DEPLOY / "prometheus" / "rules.test.yml"
DASHBOARD = DEPLOY / "grafana" / "redis-rl.json"

EVICTION_SERIES = {"redis_rl_keys_evicted_total", "redis_rl_eviction_risk"}

Samples = Dict[Tuple[str, Tuple[Tuple[str, str], ...]], float]


def wait_for(what: str, probe: Callable[[], Any], timeout: float = 60) -> Any:
    """Polls ``probe`` until it returns something truthy (a state, not a duration)."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def http_get(url: str) -> Optional[str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return str(r.read().decode())
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return None


def parse(text: str) -> Tuple[Samples, Dict[str, str]]:
    """Samples by (name, labels) and each family's type."""
    samples: Samples = {}
    types: Dict[str, str] = {}
    for family in text_string_to_metric_families(text):
        types[family.name] = family.type
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples, types


def collect(client: redis.Redis, top: int = 10) -> Tuple[Samples, Dict[str, str]]:
    """One scrape of the collector, in this process."""
    from prometheus_client import generate_latest

    registry = CollectorRegistry()
    registry.register(RlCollector(client, top=top))
    return parse(generate_latest(registry).decode())


class Exporter:
    """``python -m redis_rl.exporter`` as its own process, as users run it."""

    def __init__(self, url: str, *extra: str) -> None:
        for attempt in range(5):  # another process may take the port between pick and bind
            self.port = free_port()
            self.proc = subprocess.Popen(
                [
                    *(sys.executable, "-m", "redis_rl.exporter", "--redis-url", url),
                    *("--listen", f"127.0.0.1:{self.port}", *extra),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
            try:
                wait_for("the exporter", lambda: self.proc.poll() is not None or self.scrape())
            except AssertionError:
                self.stop()
                raise
            if self.proc.poll() is None:
                return
            err = self.proc.stderr.read().decode() if self.proc.stderr else ""
            if attempt == 4 or "Address already in use" not in err:
                raise AssertionError(f"the exporter exited: {err}")

    def scrape(self) -> Optional[str]:
        return http_get(f"http://127.0.0.1:{self.port}/metrics")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stderr:
            self.proc.stderr.close()


@pytest.fixture
def exporter_factory() -> Iterator[Callable[..., Exporter]]:
    started: List[Exporter] = []

    def start(url: str, *extra: str) -> Exporter:
        e = Exporter(url, *extra)
        started.append(e)
        return e

    yield start
    for e in started:
        e.stop()


def traffic(r: redis.Redis) -> None:
    """Decisions of every kind the dashboard shows, in namespaces orders and users."""
    assert r.execute_command("RL.TAKE", "orders:1", 0.001, 2, 2) == 2
    assert r.execute_command("RL.TAKE", "orders:1", 0.001, 2, 1) == 0
    assert r.execute_command("RL.TAKE", "orders:1", 0.001, 2, 1) == 0
    # SHADOW: answered as granted, counted as would-deny.
    assert r.execute_command("RL.TAKE", "users:7", 0.001, 1, 1, "SHADOW") == 1
    assert r.execute_command("RL.TAKE", "users:7", 0.001, 1, 1, "SHADOW") == 1
    granted = r.execute_command("RL.LEASE", "orders:lease", 0.001, 50, 10, 3_600_000)
    assert granted[0] == 10
    assert r.execute_command("RL.ACQUIRE", "orders:inflight", 5, 3_600_000)[0] == 1
    # A rollout: version 2 stored, a version-1 caller is stale.
    r.execute_command("RL.TAKE", "orders:v", 10, 10, 1, "VERSION", 2)
    r.execute_command("RL.TAKE", "orders:v", 5, 5, 1, "VERSION", 1)
    # An operator's pin, and a decision it made.
    r.execute_command("RL.PIN", "orders:pinned", 1, 5)
    r.execute_command("RL.TAKE", "orders:pinned", 10, 100)


def test_share_holders_are_a_gauge(own_server: Server) -> None:
    r = own_server.client()
    for holder in ("a", "b"):
        r.execute_command("RL.SHARE", "fleet:share", 100, 100, holder, 10, 1000)
    s, types = collect(r, top=3)
    assert types["redis_rl_share_holders"] == "gauge"
    assert s[("redis_rl_share_holders", ())] == 2
    # The first holder got the whole rate (alone, it may use all of it); the second, nothing
    # yet: the rate is in use until the first refreshes.
    assert types["redis_rl_shares_granted"] == "counter"
    assert s[("redis_rl_shares_granted_total", ())] == 1
    assert s[("redis_rl_shares_short_total", ())] == 1


def test_parse_listen() -> None:
    assert parse_listen("127.0.0.1:9188") == ("127.0.0.1", 9188)
    assert parse_listen("[::1]:9188") == ("::1", 9188)
    assert parse_listen(":9188") == ("0.0.0.0", 9188)
    for bad in ("9188", "host:", "host:0", "host:70000", "host:x"):
        with pytest.raises(Exception, match="HOST:PORT"):
            parse_listen(bad)


def test_counters_gauges_namespaces_top_and_mode(own_server: Server, protocol: int) -> None:
    r = own_server.client(protocol=protocol)
    traffic(r)
    s, types = collect(r, top=3)
    assert s[("redis_rl_up", ())] == 1
    assert s[("redis_rl_module_loaded", ())] == 1
    assert s[("redis_rl_functions_loaded", ())] == 0
    # Counters since start: RL.TAKE decided 2 grants (one real, one shadow) + ... exactly as
    # INFO rl says, typed as counters with _total.
    info = r.info("rl")
    for field in ("calls", "granted", "denied", "shadow_denied", "tokens_granted", "adopted"):
        assert types[f"redis_rl_{field}"] == "counter"
        assert s[(f"redis_rl_{field}_total", ())] == info[f"rl_{field}"]
    assert s[("redis_rl_denied_total", ())] == 2
    assert s[("redis_rl_shadow_denied_total", ())] == 1
    assert s[("redis_rl_limit_stale_total", ())] == 1
    # Levels are gauges, without _total.
    assert types["redis_rl_leases_active"] == "gauge"
    assert s[("redis_rl_leases_active", ())] == 1
    assert types["redis_rl_permits_in_use"] == "gauge"
    assert s[("redis_rl_permits_in_use", ())] == 1

    assert s[("redis_rl_mode", (("mode", "enforce"),))] == 1
    assert s[("redis_rl_mode", (("mode", "shadow"),))] == 0
    # The namespace is a label; values as RL.STATS gives them.
    ns = (("namespace", "orders"),)
    assert types["redis_rl_namespace_denied"] == "counter"
    assert s[("redis_rl_namespace_denied_total", ns)] == 2
    assert s[("redis_rl_namespace_shadow_denied_total", (("namespace", "users"),))] == 1
    assert s[("redis_rl_namespace_calls_total", (("namespace", "users"),))] == 2
    assert not any(name.startswith("redis_rl_ns_") for name, _ in s)
    # RL.TOP: the keys denied most, at most --top of them.
    assert s[("redis_rl_top_denied", (("key", "orders:1"),))] > 0
    assert ("redis_rl_top_last_denied_seconds", (("key", "orders:1"),)) in s
    assert len([k for k in s if k[0] == "redis_rl_top_denied"]) <= 3
    r.config_set("rl.mode", "shadow")
    s, _ = collect(r, top=0)
    assert s[("redis_rl_mode", (("mode", "shadow"),))] == 1
    assert not [k for k in s if k[0] == "redis_rl_top_denied"]


def test_namespace_labels_are_exact_bytes(own_server: Server) -> None:
    r = own_server.client()
    r.execute_command("RL.TAKE", "caf\u00e9 & co:1", 1, 1)
    r.execute_command("RL.TAKE", b"\xff\xfe:1", 1, 1)
    s, _ = collect(r)
    assert s[("redis_rl_namespace_calls_total", (("namespace", "caf\u00e9 & co"),))] == 1
    assert s[("redis_rl_namespace_calls_total", (("namespace", "\\xff\\xfe"),))] == 1


def test_process_over_tcp_and_unix_socket(tmp_path: Path, exporter_factory: Any) -> None:
    _check_setup()
    sock = tmp_path / "redis.sock"
    server = Server(tmp_path / "redis", extra=["--unixsocket", str(sock)])
    try:
        traffic(server.client())
        for url in (f"redis://127.0.0.1:{server.port}/0", f"unix://{sock}"):
            text = exporter_factory(url).scrape()
            assert text is not None
            s, _ = parse(text)
            assert s[("redis_rl_up", ())] == 1
            assert s[("redis_rl_namespace_denied_total", (("namespace", "orders"),))] == 2
    finally:
        server.stop()


def test_server_down_is_up_zero(exporter_factory: Any) -> None:
    text = exporter_factory(f"redis://127.0.0.1:{free_port()}", "--timeout", "1").scrape()
    assert text is not None
    s, _ = parse(text)
    assert s[("redis_rl_up", ())] == 0
    assert ("redis_rl_module_loaded", ()) not in s


def test_without_the_module_and_with_the_functions_library(tmp_path: Path) -> None:
    """A server without the module (a replica started without loadmodule, or a managed
    Redis): module 0, no module counters; with the library, which code is loaded."""
    _check_setup()
    server = Server(tmp_path / "redis", module=False)
    try:
        r = server.client()
        s, _ = collect(r)
        assert s[("redis_rl_up", ())] == 1
        assert s[("redis_rl_module_loaded", ())] == 0
        assert s[("redis_rl_functions_loaded", ())] == 0
        assert not any(name.endswith("_total") for name, _ in s)
        code = FUNCTIONS_LUA.read_bytes()
        r.execute_command("FUNCTION", "LOAD", "REPLACE", code)
        r.execute_command("FCALL", "rl_take", 1, "orders:1", 1, 10)
        r.execute_command("FCALL_RO", "rl_peek", 1, "orders:1")
        s, _ = collect(r)
        assert s[("redis_rl_functions_loaded", ())] == 1
        sha1 = hashlib.sha1(code).hexdigest()
        assert s[("redis_rl_functions_library_info", (("sha1", sha1),))] == 1
        assert s[("redis_rl_fcall_calls_total", (("command", "fcall"),))] == 1
        assert s[("redis_rl_fcall_calls_total", (("command", "fcall_ro"),))] == 1
    finally:
        server.stop()


def documented_acl() -> List[str]:
    """The exporter user's rules, as docs/operations.md gives them."""
    doc = (REPO / "docs" / "operations.md").read_text()
    line = re.search(r"ACL SETUSER rl-exporter on >secret (.*)", doc)
    assert line, "docs/operations.md gives no ACL line for the exporter"
    return line.group(1).split()


EXPORTER_ACL = documented_acl()


def test_the_documented_acl_user_reads_everything(own_server: Server) -> None:
    r = own_server.client()
    traffic(r)
    r.execute_command("FUNCTION", "LOAD", "REPLACE", FUNCTIONS_LUA.read_bytes())
    r.acl_setuser("rl-exporter", enabled=True, passwords=["+secret"], commands=EXPORTER_ACL)
    r.acl_setuser("no-top", enabled=True, passwords=["+secret"], commands=EXPORTER_ACL[:-1])
    admin, _ = collect(r)
    as_user, _ = collect(own_server.client(username="rl-exporter", password="secret"))
    assert set(as_user) == set(admin)  # the same series (RL.TOP's values decay meanwhile)
    assert as_user[("redis_rl_namespace_denied_total", (("namespace", "orders"),))] == 2
    assert as_user[("redis_rl_functions_loaded", ())] == 1
    # A command the user may not run is left out, the rest still comes.
    no_top, _ = collect(own_server.client(username="no-top", password="secret"))
    assert not [k for k in no_top if k[0].startswith("redis_rl_top_")]
    assert no_top[("redis_rl_namespace_denied_total", (("namespace", "orders"),))] == 2
    assert no_top[("redis_rl_module_loaded", ())] == 1


def test_the_exporter_process_runs_as_the_documented_acl_user(
    own_server: Server, exporter_factory: Any
) -> None:
    """The start-up check must need nothing the documented user lacks (PING included)."""
    r = own_server.client()
    traffic(r)
    r.acl_setuser("rl-exporter", enabled=True, passwords=["+secret"], commands=EXPORTER_ACL)
    e = exporter_factory(f"redis://rl-exporter:secret@127.0.0.1:{own_server.port}")
    s, _ = parse(e.scrape() or "")
    assert s[("redis_rl_up", ())] == 1
    assert s[("redis_rl_namespace_denied_total", (("namespace", "orders"),))] == 2


def need(binary: str) -> str:
    path = shutil.which(binary)
    if path is None:
        pytest.fail(f"{binary} not found: apt-get install prometheus (scripts/test-python does)")
    return path


def test_rules_check_and_unit_tests() -> None:
    promtool = need("promtool")
    out = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS: 10 rules found" in out.stdout
    out = subprocess.run(
        [promtool, "test", "rules", RULES_TEST.name],
        capture_output=True,
        text=True,
        cwd=RULES_TEST.parent,
    )
    assert out.returncode == 0, out.stdout + out.stderr


class Prometheus:
    """A real Prometheus on a free loopback port, scraping ``targets`` every second."""

    def __init__(self, workdir: Path, targets: Dict[str, int]) -> None:
        binary = need("prometheus")
        workdir.mkdir(parents=True, exist_ok=True)
        jobs = "".join(
            f"  - job_name: {job}\n    static_configs:\n      - targets: ['127.0.0.1:{port}']\n"
            for job, port in targets.items()
        )
        config = workdir / "prometheus.yml"
        config.write_text(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
            f"rule_files: ['{RULES}']\nscrape_configs:\n{jobs}"
        )
        self.log = open(workdir / "prometheus.log", "wb")  # noqa: SIM115
        for attempt in range(5):
            self.port = free_port()
            self.proc = subprocess.Popen(
                [
                    binary,
                    f"--config.file={config}",
                    f"--storage.tsdb.path={workdir / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                ],
                stdout=self.log,
                stderr=subprocess.STDOUT,
            )
            ready = wait_for(
                "prometheus",
                lambda: (
                    self.proc.poll() is not None
                    or http_get(f"http://127.0.0.1:{self.port}/-/ready")
                ),
            )
            if self.proc.poll() is None and ready:
                return
            if attempt == 4:
                raise AssertionError((workdir / "prometheus.log").read_text()[-2000:])

    def query(self, expr: str) -> Dict[str, Any]:
        url = f"http://127.0.0.1:{self.port}/api/v1/query?" + urllib.parse.urlencode(
            {"query": expr}
        )
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                body: Dict[str, Any] = json.loads(r.read())
        except urllib.error.HTTPError as e:  # a bad expression is a 400 with the reason
            body = json.loads(e.read())
        return body

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def dashboard_queries() -> List[Tuple[str, str]]:
    dash = json.loads(DASHBOARD.read_text())
    queries = [(p["title"], t["expr"]) for p in dash["panels"] for t in p["targets"]]
    queries += [
        (f"variable {v['name']}", v["query"]["query"])
        for v in dash["templating"]["list"]
        if v["type"] == "query"
    ]
    return queries


def test_dashboard_is_well_formed() -> None:
    """What Grafana needs to import it: unique ids, a data source and a refId per query,
    panels inside the 24-column grid without overlapping, every variable defined."""
    dash = json.loads(DASHBOARD.read_text())
    panels = dash["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    variables = {v["name"] for v in dash["templating"]["list"]}
    cells = set()
    for p in panels:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{p['title']} overlaps another panel"
                cells.add((x, y))
        assert p["datasource"]["uid"] == "${datasource}"
        assert len({t["refId"] for t in p["targets"]}) == len(p["targets"]), p["title"]
        for t in p["targets"]:
            used = set(re.findall(r"\$(\w+)", t["expr"])) - {"__rate_interval"}
            assert used <= variables, (p["title"], used - variables)


def as_promql(expr: str) -> str:
    """A Grafana query with its variables filled in as the dashboard would."""
    m = re.fullmatch(r"label_values\((.*), (\w+)\)", expr)
    if m:  # Grafana's template function: the series whose label values it lists
        expr = m.group(1)
    for var, value in (
        ("$__rate_interval", "30s"),
        ("$job", "redis-rl"),
        ("$instance", ".*"),
        ("$namespace", ".*"),
    ):
        expr = expr.replace(var, value)
    assert "$" not in expr, expr
    return expr


def test_prometheus_scrapes_the_exporter_and_runs_the_dashboard_and_rules(
    tmp_path: Path, exporter_factory: Any
) -> None:
    _check_setup()
    server = Server(tmp_path / "redis")
    registry = CollectorRegistry()
    metrics = Metrics()
    register(metrics, registry)  # a Python client's counters, default names
    metrics.decided(True, 1, fallback=True)
    rules_metrics = RulesMetrics()  # a rules engine's, version 1 in force
    rules_metrics.version = 1
    rules_metrics.decisions[("api_search", "denied")] = 2
    register_rules(rules_metrics, registry)
    app_port = free_port()
    app_server, _ = start_http_server(app_port, addr="127.0.0.1", registry=registry)
    prometheus = None
    try:
        r = server.client()
        r.execute_command("FUNCTION", "LOAD", "REPLACE", FUNCTIONS_LUA.read_bytes())
        r.execute_command("FCALL", "rl_take", 1, "fn:1", 1, 10)
        traffic(r)
        exporter = exporter_factory(f"redis://127.0.0.1:{server.port}")
        prometheus = Prometheus(
            tmp_path / "prometheus", {"redis-rl": exporter.port, "app": app_port}
        )
        p = prometheus

        def scraped() -> bool:
            # Three scrapes of each target, so that every rate() has two samples.
            res = p.query("min(count_over_time(up[30s]))")["data"]["result"]
            return bool(res) and float(res[0]["value"][1]) >= 3

        wait_for("three scrapes of each target", scraped)
        up = {s["metric"]["job"]: s["value"][1] for s in p.query("up")["data"]["result"]}
        assert up == {"redis-rl": "1", "app": "1"}
        # The metrics arrive as exposed: types, labels, values.
        res = p.query('redis_rl_namespace_denied_total{namespace="orders"}')["data"]["result"]
        assert [s["value"][1] for s in res] == ["2"]
        # A module older than the eviction fields exports no eviction series.
        absent = set() if "rl_keys_evicted" in r.info("rl") else EVICTION_SERIES
        for title, expr in dashboard_queries():
            body = p.query(as_promql(expr))
            assert body["status"] == "success", (title, expr, body)
            if not set(re.findall(r"\b(redis_rl_\w+)", expr)) & absent:
                assert body["data"]["result"], f"dashboard panel {title!r} has no data: {expr}"
        # Each rule's expression is valid PromQL, and every series it reads exists.
        rule_exprs = re.findall(r"expr: \|?\n?((?:\s{10}.*\n)+|.*\n)", RULES.read_text())
        assert len(rule_exprs) == 10
        for expr in rule_exprs:
            assert p.query(expr)["status"] == "success", expr
            # Names given as a regex (the clients' spellings): one of them must exist.
            for regex in re.findall(r'__name__=~"([^"]+)"', expr):
                res = p.query(f'count({{__name__=~"{regex}"}})')["data"]["result"]
                assert res, f"rules read {regex}, which nothing exposes"
            plain = re.sub(r'\{__name__=~"[^"]+"\}', "", expr)
            for name in set(re.findall(r"\b(redis_rl_\w+)", plain)) - absent:
                res = p.query(f"count({name})")["data"]["result"]
                assert res, f"rules read {name}, which nothing exposes"
    finally:
        if prometheus is not None:
            prometheus.stop()
        app_server.shutdown()
        server.stop()


def run_exporter(*args: str) -> subprocess.CompletedProcess[str]:
    """The exporter as users start it, expected to stop by itself (the timeout only keeps a
    regression, an exporter that serves instead of exiting, from hanging the suite)."""
    return subprocess.run(
        [sys.executable, "-m", "redis_rl.exporter", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_start_up_errors_are_one_line_and_exit_2(tmp_path: Path) -> None:
    """What cannot fix itself stops the exporter with one line saying what to do (no
    traceback), so that a service manager shows the reason and does not restart in a loop
    around a traceback."""
    _check_setup()
    server = Server(tmp_path / "redis")
    server.client().config_set("requirepass", "right")
    port = str(server.port)
    local = f"127.0.0.1:{free_port()}"
    cases = [
        (["--redis-url", "http://127.0.0.1:6379"], "bad --redis-url", "redis://"),
        (["--redis-url", "redis://127.0.0.1:notaport"], "bad --redis-url", "notaport"),
        (
            ["--redis-url", f"redis://:wrong@127.0.0.1:{port}", "--listen", local],
            "login refused",
            "fix the user and password",
        ),
        (
            ["--redis-url", f"redis://127.0.0.1:{port}", "--listen", local],
            "login refused",
            "fix the user and password",
        ),
        (  # the port is the server's own: taken
            ["--redis-url", f"redis://:right@127.0.0.1:{port}", "--listen", f"127.0.0.1:{port}"],
            "Address already in use",
            "pick a free HOST:PORT with --listen",
        ),
        (
            [
                "--redis-url",
                f"redis://:right@127.0.0.1:{port}",
                "--listen",
                "no.such.host.invalid:9188",
            ],
            "cannot listen on no.such.host.invalid:9188",
            "check the HOST:PORT given to --listen",
        ),
    ]
    try:
        for args, what, todo in cases:
            out = run_exporter(*args)
            assert out.returncode == 2, (args, out.stderr)
            assert "Traceback" not in out.stderr, (args, out.stderr)
            lines = out.stderr.splitlines()
            assert len(lines) == 1, (args, out.stderr)
            assert lines[0].startswith("redis-rl-exporter: "), lines
            assert what in lines[0] and todo in lines[0], (args, lines[0])
            assert "wrong" not in lines[0], "the password must stay out of the log"
    finally:
        server.stop()


def test_a_server_not_up_yet_is_not_fatal(exporter_factory: Any) -> None:
    """A server down at start (started after the exporter, or restarting) is what
    redis_rl_up 0 is for: the exporter serves and says once why it sees nothing."""
    e = exporter_factory(f"redis://127.0.0.1:{free_port()}", "--timeout", "1")
    assert e.proc.poll() is None
    s, _ = parse(e.scrape() or "")
    assert s[("redis_rl_up", ())] == 0


def filled_server(tmp_path: Path, policy: str) -> Tuple[Server, redis.Redis]:
    """A server with ``maxmemory`` and ``policy``, holding 200 drained buckets in namespace
    ``ev`` (each with a TTL: its time to full), then filled with plain keys until the server
    evicted some buckets."""
    _check_setup()
    server = Server(tmp_path / "redis", extra=["--maxmemory-policy", policy])
    r = server.client()
    if "rl_keys_evicted" not in r.info("rl"):
        server.stop()
        pytest.skip("this module's INFO rl has no rl_keys_evicted (older than eviction counts)")
    for i in range(200):
        assert r.execute_command("RL.TAKE", f"ev:{i}", 0.001, 10, 10) == 10
    r.config_set("maxmemory", int(r.info("memory")["used_memory"]) + 1_000_000)
    for i in range(2000):
        try:
            r.set(f"filler:{i}", b"x" * 10_000)
        except redis.exceptions.OutOfMemoryError:
            break  # volatile-*: nothing with a TTL is left to evict
        if r.info("stats")["evicted_keys"] >= 20:
            break
    assert r.info("stats")["evicted_keys"] > 0, "the server evicted nothing"
    # Room again (every command runs the eviction loop first): the counts hold still while
    # they are read, and the policy still evicts (the risk stays).
    r.config_set("maxmemory", int(r.info("memory")["used_memory"]) + 100_000_000)
    return server, r


@pytest.mark.parametrize("policy", ["allkeys-lru", "volatile-random"])
def test_evictions_are_exported(tmp_path: Path, policy: str) -> None:
    server, r = filled_server(tmp_path, policy)
    try:
        info = r.info("rl")
        left = sum(1 for i in range(200) if r.exists(f"ev:{i}"))
        s, types = collect(r)
        assert types["redis_rl_keys_evicted"] == "counter"
        assert s[("redis_rl_keys_evicted_total", ())] == info["rl_keys_evicted"] == 200 - left
        if policy.startswith("volatile-"):  # only keys with a TTL go: all of them buckets
            assert info["rl_keys_evicted"] == r.info("stats")["evicted_keys"] > 0
        assert types["redis_rl_eviction_risk"] == "gauge"
        assert s[("redis_rl_eviction_risk", ())] == info["rl_eviction_risk"] == 1
        ns = (("namespace", "ev"),)
        assert s[("redis_rl_namespace_evicted_total", ns)] == 200 - left
        # CONFIG RESETSTAT zeroes it like the other counters; noeviction clears the risk.
        r.config_resetstat()
        r.config_set("maxmemory-policy", "noeviction")
        s, _ = collect(r)
        assert s[("redis_rl_keys_evicted_total", ())] == 0
        assert s[("redis_rl_eviction_risk", ())] == 0
    finally:
        server.stop()


def test_pins_are_exported(own_server: Server) -> None:
    r = own_server.client()
    r.execute_command("RL.PIN", "pin:a", 1, 5)
    r.execute_command("RL.PIN", "pin:b", "BLOCK")
    for _ in range(3):
        r.execute_command("RL.TAKE", "pin:a", 10, 100)
        r.execute_command("RL.TAKE", "pin:b", 10, 100)
    s, types = collect(r)
    assert types["redis_rl_pinned_keys"] == "gauge"
    assert s[("redis_rl_pinned_keys", ())] == 2
    assert s[("redis_rl_pinned_decisions_total", ())] == 6
    assert s[("redis_rl_pins_set_total", ())] == 2
    assert s[("redis_rl_namespace_pinned_total", (("namespace", "pin"),))] == 6
    r.execute_command("RL.UNPIN", "pin:b")
    s, _ = collect(r)
    assert s[("redis_rl_pinned_keys", ())] == 1
    assert s[("redis_rl_pins_removed_total", ())] == 1
