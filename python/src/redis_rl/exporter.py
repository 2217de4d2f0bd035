"""A Prometheus exporter for redis-rl's server-side counters (extra ``prometheus``).

    python -m redis_rl.exporter --redis-url redis://127.0.0.1:6379 --listen 127.0.0.1:9188
    redis-rl-exporter --redis-url rediss://user:secret@host:6380/0 --listen 0.0.0.0:9188

Every scrape reads the server once: ``INFO rl``, ``RL.STATS``, ``RL.TOP`` (and, for the
Functions library, ``FUNCTION LIST`` and ``INFO commandstats``). Run one exporter per server
(each Cluster node, each replica), as with redis_exporter. The URL defaults to the
environment variable ``RL_EXPORTER_REDIS_URL`` (a password there stays out of ``ps``).

What it exposes (docs/operations.md, "Metrics"):

- ``redis_rl_up``: 1 if the last scrape reached the server.
- ``redis_rl_module_loaded`` (``INFO rl`` has the module's section),
  ``redis_rl_functions_loaded``: which backend this server has.
  A replica without the module shows ``redis_rl_module_loaded 0`` next to a master with 1.
- every counter of ``INFO rl`` as ``redis_rl_<field>_total`` (``rl_denied`` is
  ``redis_rl_denied_total``); the fields that are levels, not counts (``rl_leases_active``,
  ``rl_permits_in_use``, ``rl_share_holders``, ``rl_eviction_risk`` and any ``*_active`` /
  ``*_in_use`` field) as gauges ``redis_rl_<field>``; ``rl_mode`` as
  ``redis_rl_mode{mode="enforce"|"shadow"}`` 1 / 0. Eviction: ``redis_rl_keys_evicted_total``
  and ``redis_rl_eviction_risk`` (a module older than these fields exports neither).
- per namespace (``RL.STATS``, exact names): ``redis_rl_namespace_<field>_total`` with a
  ``namespace`` label. Bounded by ``rl.max-namespaces`` (at most 1024, plus ``other``).
- ``RL.TOP``: ``redis_rl_top_denied{key}`` (the decayed denial count) and
  ``redis_rl_top_last_denied_seconds{key}``, for at most ``--top`` keys (default 10).
- the Functions library keeps no counters: for it, ``redis_rl_functions_library_info{sha1}``
  (which code is loaded, to spot nodes that differ) and ``redis_rl_fcall_calls_total``,
  the server's FCALL / FCALL_RO count, which covers every function on the server, not only
  the library's.
"""

from __future__ import annotations

import argparse
import errno
import hashlib
import logging
import os
import signal
import sys
import threading
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import redis

log = logging.getLogger("redis_rl.exporter")

LIBRARY_NAME = "rl"
TOP_MAX = 100

# HELP texts for the INFO rl fields known today; a field added later is still exported,
# with a generic text.
INFO_HELP = {
    "calls": "Calls of every RL command clients made",
    "errors": "RL command calls answered with an error",
    "granted": "RL.TAKE calls granted",
    "denied": "RL.TAKE calls denied",
    "shadow_denied": "Calls answered as granted that enforce mode would have denied",
    "mtake_granted": "RL.MTAKE calls granted",
    "mtake_denied": "RL.MTAKE calls denied",
    "tokens_granted": "Tokens granted by RL.TAKE",
    "leases_granted": "RL.LEASE calls that granted a lease",
    "leases_denied": "RL.LEASE calls that granted nothing",
    "lease_tokens_granted": "Tokens granted in leases",
    "returns": "Leases closed by a return",
    "tokens_returned": "Tokens credited back by returns",
    "leases_expired": "Leases gone without a return (expired, or deleted with their key)",
    "leases_active": "Leases recorded in buckets now",
    "reserved": "RL.RESERVE calls granted",
    "reserve_denied": "RL.RESERVE calls denied",
    "tokens_reserved": "Tokens granted by RL.RESERVE",
    "refunds": "RL.REFUND calls that credited tokens",
    "permits_acquired": "RL.ACQUIRE calls that granted a permit",
    "permits_denied": "RL.ACQUIRE calls denied",
    "permits_released": "Permits released by RL.RELEASE",
    "permits_expired": "Permits gone without a release",
    "permits_in_use": "Permits recorded in keys now",
    "limit_changes": "Writes that stored a bucket under a rate or cap other than its own",
    "limit_replaced": "Buckets whose stored limit a newer VERSION replaced",
    "limit_stale": "Buckets decided under their stored limit because the call's VERSION was older",
    "limit_conflicts": "Buckets decided under a call's other limit with the same VERSION",
    "adopted": "Lua script hashes converted into buckets",
    "keys_evicted": "Rate-limit keys (buckets, shares, permits) removed by eviction: each "
    "came back full, letting more through than its limit",
    "eviction_risk": "1 if maxmemory is set with a policy that can evict rate-limit keys",
    "pinned_decisions": "Decisions a live pin (RL.PIN) made instead of the caller's limit",
    "pins_set": "RL.PIN calls",
    "pins_removed": "RL.UNPIN calls that removed a live pin",
    "pinned_keys": "Keys holding a pin now",
}

NAMESPACE_HELP = {
    "calls": "RL.TAKE, RL.LEASE, RL.MTAKE calls with valid arguments, per namespace",
    "granted": "Granted calls per namespace",
    "denied": "Denied calls per namespace",
    "shadow_denied": "Calls that enforce mode would have denied, per namespace",
    "tokens_granted": "Tokens granted per namespace (leased tokens included)",
    "evicted": "Rate-limit keys removed by eviction, per namespace",
    "pinned": "Decisions a live pin made, per namespace",
}


def is_gauge(field: str) -> bool:
    """INFO rl fields that are levels rather than counts since the last reset."""
    return (
        field.endswith("_active")
        or field.endswith("_in_use")
        or field in ("share_holders", "eviction_risk", "pinned_keys")
    )


def parse_info(info: Dict[str, Any]) -> Tuple[Dict[str, int], Optional[str]]:
    """The numeric ``rl_<field>`` values of ``INFO rl`` as redis-py parses it, and
    ``rl_mode``. Namespace lines are left out: they come from ``RL.STATS``, exact names."""
    values: Dict[str, int] = {}
    mode = None
    for name, value in info.items():
        if not name.startswith("rl_") or name.startswith("rl_ns_"):
            continue
        field = name[3:]
        if field == "mode":
            mode = _text(value)
        elif isinstance(value, int) and not isinstance(value, bool):
            values[field] = value
    return values, mode


def _text(v: Any) -> str:
    if isinstance(v, bytes):
        return v.decode("utf-8", "backslashreplace")
    return str(v)


def _pairs(reply: Any) -> List[Tuple[Any, Any]]:
    """A map reply as pairs: a dict (RESP3) or a flat array (RESP2)."""
    if isinstance(reply, dict):
        return list(reply.items())
    if isinstance(reply, (list, tuple)):
        return [(reply[i], reply[i + 1]) for i in range(0, len(reply) - 1, 2)]
    return []


def parse_stats(reply: Any) -> Dict[str, Dict[str, int]]:
    """``RL.STATS``'s reply: namespace -> field -> value."""
    out: Dict[str, Dict[str, int]] = {}
    for ns, fields in _pairs(reply):
        out[_text(ns)] = {_text(k): int(v) for k, v in _pairs(fields)}
    return out


def parse_top(reply: Any) -> List[Tuple[str, float, float]]:
    """``RL.TOP``'s rows: (key, decayed denials, seconds since the last denial)."""
    rows = []
    for row in reply or []:
        key, denied, ago_ms = row[0], row[1], row[2]
        rows.append((_text(key), float(denied), float(ago_ms) / 1000))
    return rows


class RlCollector:
    """A ``prometheus_client`` collector that reads one server at each scrape."""

    def __init__(self, client: Any, top: int = 10) -> None:
        """``client``: a ``redis.Redis`` (one server: run one exporter per node)."""
        self.client = client
        self.top = max(0, min(top, TOP_MAX))
        self._warned: set[str] = set()

    def _warn_once(self, part: str, e: Exception) -> None:
        if part not in self._warned:
            self._warned.add(part)
            log.warning("skipping %s: %s", part, e)

    def _call(self, part: str, *args: Any) -> Any:
        """A read that may be refused (ACL) or unknown; None then, and warned once."""
        try:
            return self.client.execute_command(*args)
        except redis.ResponseError as e:
            self._warn_once(part, e)
            return None

    def collect(self) -> Iterator[Any]:
        """One scrape: ``redis_rl_up`` and the server's figures, or ``redis_rl_up 0`` alone when the
        server cannot be read (logged)."""
        from prometheus_client.core import GaugeMetricFamily

        up = GaugeMetricFamily("redis_rl_up", "1 if the last scrape reached the server")
        try:
            metrics = list(self._read())
        except redis.RedisError as e:
            log.warning("scrape failed: %s", e)
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        yield from metrics

    def _read(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        # The module's INFO section is there exactly when the module is loaded (and needs
        # only +info, where MODULE LIST needs an admin command).
        values, mode = parse_info(self.client.info("rl"))
        module = mode is not None
        yield GaugeMetricFamily(
            "redis_rl_module_loaded", "1 if the redis-rl module is loaded", value=int(module)
        )
        yield from self._functions()
        if not module:
            return
        for field, value in values.items():
            help_text = INFO_HELP.get(field, f"INFO rl field rl_{field}")
            if is_gauge(field):
                yield GaugeMetricFamily(f"redis_rl_{field}", help_text, value=value)
            else:
                yield CounterMetricFamily(f"redis_rl_{field}", help_text, value=value)
        if mode is not None:
            m = GaugeMetricFamily(
                "redis_rl_mode", "1 for the server's rl.mode (enforce or shadow)", labels=["mode"]
            )
            for name in ("enforce", "shadow"):
                m.add_metric([name], int(mode == name))
            yield m
        stats = self._call("RL.STATS", "RL.STATS")
        if stats is not None:
            yield from _namespace_metrics(parse_stats(stats))
        if self.top > 0:
            top = self._call("RL.TOP", "RL.TOP", self.top)
            if top is not None:
                yield from _top_metrics(parse_top(top))

    def _functions(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        libs = self._call(
            "FUNCTION LIST", "FUNCTION", "LIST", "LIBRARYNAME", LIBRARY_NAME, "WITHCODE"
        )
        code = None
        for lib in libs or []:
            fields = {_text(k): v for k, v in _pairs(lib)}
            if _text(fields.get("library_name", "")) == LIBRARY_NAME:
                c = fields.get("library_code", b"")
                code = c if isinstance(c, bytes) else str(c).encode()
        yield GaugeMetricFamily(
            "redis_rl_functions_loaded",
            "1 if the redis-rl Functions library (rl) is loaded",
            value=int(code is not None),
        )
        if code is None:
            return
        info = GaugeMetricFamily(
            "redis_rl_functions_library_info",
            "The loaded rl library's code, by SHA-1 (nodes that differ run different code)",
            labels=["sha1"],
        )
        info.add_metric([hashlib.sha1(code).hexdigest()], 1)
        yield info
        stats = self.client.info("commandstats")
        calls = CounterMetricFamily(
            "redis_rl_fcall_calls",
            "FCALL and FCALL_RO calls on this server: every function, not only the rl "
            "library's (the library keeps no counters of its own)",
            labels=["command"],
        )
        for command in ("fcall", "fcall_ro"):
            entry = stats.get(f"cmdstat_{command}")
            calls.add_metric([command], int(entry["calls"]) if entry else 0)
        yield calls


def _namespace_metrics(stats: Dict[str, Dict[str, int]]) -> Iterator[Any]:
    from prometheus_client.core import CounterMetricFamily

    fields: List[str] = []
    for values in stats.values():
        fields += [f for f in values if f not in fields]
    for field in fields:
        c = CounterMetricFamily(
            f"redis_rl_namespace_{field}",
            NAMESPACE_HELP.get(field, f"RL.STATS field {field}"),
            labels=["namespace"],
        )
        for ns, values in stats.items():
            if field in values:
                c.add_metric([ns], values[field])
        yield c


def _top_metrics(rows: Sequence[Tuple[str, float, float]]) -> Iterator[Any]:
    from prometheus_client.core import GaugeMetricFamily

    denied = GaugeMetricFamily(
        "redis_rl_top_denied",
        "RL.TOP: the keys denied most recently, denials decayed with a 60 s half-life",
        labels=["key"],
    )
    ago = GaugeMetricFamily(
        "redis_rl_top_last_denied_seconds",
        "RL.TOP: seconds since the key's last denial",
        labels=["key"],
    )
    for key, count, seconds in rows:
        denied.add_metric([key], count)
        ago.add_metric([key], seconds)
    yield denied
    yield ago


def parse_listen(listen: str) -> Tuple[str, int]:
    """``HOST:PORT`` (``[::1]:9188`` for IPv6) into (host, port)."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"--listen must be HOST:PORT, got {listen!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host or "0.0.0.0", int(port)


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``redis-rl-exporter`` (each option also from its environment
    variable)."""
    p = argparse.ArgumentParser(
        prog="redis-rl-exporter",
        description="Prometheus exporter for redis-rl (INFO rl, RL.STATS, RL.TOP).",
    )
    p.add_argument(
        "--redis-url",
        default=os.environ.get("RL_EXPORTER_REDIS_URL", "redis://127.0.0.1:6379"),
        help="any URL redis-py accepts: redis://[user:password@]host:port/db, rediss://, "
        "unix:///path/redis.sock (default: $RL_EXPORTER_REDIS_URL, else "
        "redis://127.0.0.1:6379)",
    )
    p.add_argument(
        "--listen",
        default="127.0.0.1:9188",
        type=parse_listen,
        help="HOST:PORT to serve /metrics on (default: %(default)s)",
    )
    p.add_argument(
        "--top",
        type=int,
        default=10,
        help=f"RL.TOP rows to export, 0 to {TOP_MAX} (0: none; default: %(default)s)",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=5.0,
        help="seconds to wait for Redis per call (default: %(default)s)",
    )
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Runs the exporter until interrupted; answers the exit status (2 for a bad option or a missing
    ``prometheus_client``)."""
    args = build_parser().parse_args(argv)
    if not 0 <= args.top <= TOP_MAX:
        print(f"--top must be 0 to {TOP_MAX}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    try:
        from prometheus_client import CollectorRegistry, start_http_server
    except ImportError:
        print(
            "redis-rl-exporter needs prometheus_client: pip install 'redis-rl[prometheus]'",
            file=sys.stderr,
        )
        return 2

    try:
        client = redis.Redis.from_url(
            args.redis_url, socket_timeout=args.timeout, socket_connect_timeout=args.timeout
        )
    except ValueError as e:
        return _fatal(
            f"bad --redis-url {_redacted(args.redis_url)}: {e} "
            "(redis://[user:password@]host:port/db, rediss://..., unix:///path/redis.sock)"
        )
    problem = _probe(client)
    if problem is not None:
        return _fatal(f"{_redacted(args.redis_url)}: {problem}")
    registry = CollectorRegistry()
    registry.register(RlCollector(client, top=args.top))
    host, port = args.listen
    try:
        # The server runs on a daemon thread: returning from main stops it.
        start_http_server(port, addr=host, registry=registry)
    except OSError as e:
        hint = (
            "another process has this port: stop it or pick a free HOST:PORT with --listen"
            if e.errno == errno.EADDRINUSE
            else "check the HOST:PORT given to --listen (an address of this machine)"
        )
        return _fatal(f"cannot listen on {host}:{port}: {e.strerror or e}; {hint}")
    log.info("serving http://%s:%d/metrics for %s", host, port, _redacted(args.redis_url))
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    return 0


def _fatal(message: str) -> int:
    """A start-up error: one line on stderr that says what to do, and exit status 2."""
    print(f"redis-rl-exporter: {message}", file=sys.stderr)
    return 2


def _probe(client: Any) -> Optional[str]:
    """One PING before serving. A server that is down or not up yet is not fatal (the
    exporter reports ``redis_rl_up 0`` until it answers, as after any outage); what cannot
    fix itself is: a refused login, a URL naming something that is not a Redis."""
    try:
        client.ping()
    except (
        redis.AuthenticationError,
        redis.exceptions.AuthorizationError,
        redis.exceptions.AuthenticationWrongNumberOfArgsError,
    ) as e:
        return f"login refused ({e}): fix the user and password in --redis-url"
    except (redis.ConnectionError, redis.TimeoutError) as e:
        log.warning("cannot reach the server yet (%s); serving redis_rl_up 0 until it answers", e)
    except redis.exceptions.NoPermissionError:
        pass  # logged in; the exporter's user needs no PING (docs/operations.md, its ACL)
    except redis.ResponseError as e:
        if str(e).startswith(("WRONGPASS", "NOAUTH")):
            return f"login refused ({e}): fix the user and password in --redis-url, or the ACL"
        return f"PING failed ({e}): is --redis-url a Redis server?"
    except redis.RedisError as e:
        return f"PING failed ({e}): is --redis-url a Redis server?"
    except ValueError as e:  # parts of the URL redis-py checks only when it connects
        return f"bad --redis-url: {e}"
    return None


def _redacted(url: str) -> str:
    """The URL without its password, for the log."""
    scheme, sep, rest = url.partition("://")
    creds, at, host = rest.rpartition("@")
    if not sep or not at:
        return url
    user = creds.partition(":")[0]
    return f"{scheme}://{user}:***@{host}" if user else f"{scheme}://***@{host}"


if __name__ == "__main__":
    sys.exit(main())
