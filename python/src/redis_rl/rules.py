"""Layered limits from one document (:mod:`redis_rl.rules_doc`), stored in Redis and
followed live: :class:`Rules` (threads) and :class:`AsyncRules` (asyncio).

    rules = Rules.from_redis(redis.Redis(), key="rl:rules")
    d = rules.check({"ip": ip, "path": path, "method": "GET", "user": uid, "tier": tier})
    if not d:
        return 429, {"code": d.code, "layer": d.layer, "retry_after": d.retry_after_secs}

A check is all or nothing: the buckets of every enforced layer that applies are taken with
one ``RL.MTAKE`` (one round trip) when they share a slot, which they always do on one
server; in a cluster, slot by slot in document order, and what an earlier slot granted is
given back (``RL.REFUND``) when a later one refuses. Shadow layers are taken after a grant,
each on its own: a shadow refusal is logged and counted, never enforced. The plan, the
calls and the decision are the client core's (``redis_rl._core``, the Rust client's code):
this module sends the calls, follows the document and counts.

The document is polled (one ``HGET key version`` every ``poll_interval`` seconds); a new
version is parsed and validated off the request path and swapped in whole, between two
checks. A stored document that does not validate is refused: the engine keeps the last
good one, logs why and counts it (``refused_documents``). Redis being down or the key
missing keeps the current document too.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import random
import threading
import time
from typing import Any, Dict, Mapping, NamedTuple, Optional, Tuple

import redis.exceptions

from . import _protocol as p
from ._call import (
    OUTAGES,
    OwnPool,
    aexecute,
    aplain_call,
    aresolve_backend,
    execute,
    plain_call,
    resolve_backend,
)
from .decision import Decision, Source
from .errors import ProtocolError
from .rules_doc import Document, RulesError, parse_document, read_text
from .types import AsyncClient, SyncClient

log = logging.getLogger("redis_rl.rules")
#: One JSON line per denial (and a sample of grants): the decision log.
decision_log = logging.getLogger("redis_rl.rules.decisions")

#: At most this many distinct layer labels in the metrics; later names count as "_other".
MAX_LAYER_LABELS = 100
#: Attributes logged with a decision (those identifying the caller; never all of them).
LOGGED_ATTRIBUTES = ("ip", "user", "tier", "path", "method", "api_key")


class RuleDecision(NamedTuple):
    """A :class:`Decision` plus the layer that decided: the one that refused, or when
    granted the binding one (fewest tokens left), whose bucket the headers describe.
    ``layer`` is ``None`` when no layer applied (granted, no headers)."""

    granted: bool
    remaining: float
    retry_after_ms: int
    reset_after_ms: int
    tokens: int = 0
    limit: float = 0.0
    source: Source = Source.SERVER
    layer: Optional[str] = None
    code: Optional[str] = None
    key: Optional[str] = None
    #: Shadow layers that would have refused this request.
    shadow_denied: Tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return self.granted

    @property
    def retry_after(self) -> float:
        """``retry_after_ms`` in seconds."""
        return self.retry_after_ms / 1000

    @property
    def retry_after_secs(self) -> int:
        """``Retry-After``: whole seconds, rounded up, at least 1."""
        return self.decision.retry_after_secs

    @property
    def decision(self) -> Decision:
        """The plain :class:`Decision` (the binding layer's bucket)."""
        return Decision(*self[:7])

    def headers(self) -> Dict[str, str]:
        """The binding layer's ``X-RateLimit-*`` (and ``Retry-After`` when refused); none
        when no layer applied."""
        if self.layer is None:
            return {} if self.granted else {"Retry-After": str(self.retry_after_secs)}
        return self.decision.headers()

    def body(self) -> bytes:
        """The 429 body: ``{"code", "layer", "retry_after"}``."""
        return json.dumps(
            {"code": self.code, "layer": self.layer, "retry_after": self.retry_after_secs}
        ).encode()


class RulesMetrics:
    """The engine's counters and gauges (thread-safe), as Prometheus text."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.version: Optional[int] = None
        self.updated_at: Optional[float] = None
        self.loaded_at: Optional[float] = None
        self.refused_documents = 0
        self.poll_errors = 0
        self.reloads = 0
        self.fail_open = 0
        self.fail_closed = 0
        #: (layer, outcome) -> count; outcome is granted, denied or shadow_denied.
        self.decisions: Dict[Tuple[str, str], int] = {}
        self._labels: set[str] = set()

    def label(self, layer: Optional[str]) -> str:
        """The ``layer`` label for ``layer`` (``_none`` for no layer; ``_other`` past
        ``MAX_LAYER_LABELS`` distinct ones, so a document cannot blow up the series)."""
        if layer is None:
            return "_none"
        if layer in self._labels:
            return layer
        if len(self._labels) >= MAX_LAYER_LABELS:
            return "_other"
        self._labels.add(layer)
        return layer

    def decided(self, layer: Optional[str], outcome: str) -> None:
        """Counts one decision of ``layer`` with ``outcome``."""
        with self._lock:
            k = (self.label(layer), outcome)
            self.decisions[k] = self.decisions.get(k, 0) + 1

    def add(self, field: str) -> None:
        """Adds one to the counter ``field``."""
        with self._lock:
            setattr(self, field, getattr(self, field) + 1)

    def to_prometheus(self, prefix: str = "redis_rl_rules") -> str:
        """Every figure in the Prometheus text format, names starting with ``prefix``."""
        now = time.time()
        with self._lock:
            out = [
                f"# HELP {prefix}_version the version of the rules document in force",
                f"# TYPE {prefix}_version gauge",
                f"{prefix}_version {self.version if self.version is not None else -1}",
                f"# HELP {prefix}_age_seconds seconds since the document in force was applied",
                f"# TYPE {prefix}_age_seconds gauge",
                f"{prefix}_age_seconds {now - self.updated_at if self.updated_at else 0:.3f}",
            ]
            for field, what in (
                (
                    "refused_documents",
                    "stored documents refused as invalid (the last good one kept)",
                ),
                (
                    "poll_errors",
                    "polls that failed (Redis down, a wrong type), absences of the key (once each)",
                ),
                ("reloads", "new documents taken into force"),
                ("fail_open", "checks let through because Redis failed or answered an error"),
                ("fail_closed", "checks refused because Redis failed (fail_open=False)"),
            ):
                name = f"{prefix}_{field}_total"
                out += [f"# HELP {name} {what}", f"# TYPE {name} counter"]
                out.append(f"{name} {getattr(self, field)}")
            name = f"{prefix}_decisions_total"
            out += [f"# HELP {name} decisions by deciding layer", f"# TYPE {name} counter"]
            for (layer, outcome), n in sorted(self.decisions.items()):
                out.append(f'{name}{{layer="{layer}",outcome="{outcome}"}} {n}')
        return "\n".join(out) + "\n"


# -- where the document lives ----------------------------------------------------------


class RedisSource:
    """The document in a hash: ``version`` (an integer each apply increments),
    ``document`` (the text), ``updated_at`` (Unix ms of the apply)."""

    def __init__(self, key: str = "rl:rules") -> None:
        self.key = key

    def version_args(self) -> Tuple[Any, ...]:
        """The command that reads the document's version (polled)."""
        return ("HGET", self.key, "version")

    def fetch_args(self) -> Tuple[Any, ...]:
        """The command that reads the whole document (when its version changed)."""
        return ("HMGET", self.key, "version", "document", "updated_at")

    def __str__(self) -> str:
        return f"redis key {self.key!r}"


class FileSource:
    """The document in a file, followed by its modification time and size."""

    def __init__(self, path: str) -> None:
        self.path = path

    def signature(self) -> Tuple[int, int]:
        """What says the file changed: its modification time and size."""
        st = os.stat(self.path)
        return st.st_mtime_ns, st.st_size

    def read(self) -> str:
        """The file's text."""
        return read_text(self.path)

    def __str__(self) -> str:
        return f"file {self.path!r}"


def _text(x: Any) -> Optional[str]:
    if x is None:
        return None
    return x.decode() if isinstance(x, bytes) else str(x)


def apply_document(client: SyncClient, text: str, key: str = "rl:rules") -> int:
    """Validates ``text`` and stores it as the next version (atomically); returns it."""
    parse_document(text, "document")
    pipe = client.pipeline(transaction=True)
    pipe.hincrby(key, "version", 1)
    pipe.hset(key, mapping={"document": text, "updated_at": int(time.time() * 1000)})
    version, _ = pipe.execute()
    return int(version)


def stored_document(
    client: SyncClient, key: str = "rl:rules"
) -> Tuple[Optional[int], Optional[str], Optional[float]]:
    """``(version, text, updated_at)`` as stored (``None``s when there is none)."""
    v, doc, at = execute(client, "HMGET", key, "version", "document", "updated_at")
    return (
        None if v is None else int(v),
        _text(doc),
        None if at is None else int(at) / 1000,
    )


# -- the engine, shared by the sync and asyncio twins -----------------------------------


class _Engine:
    def __init__(
        self,
        source: Optional[Any],
        poll_interval: float,
        fail_open: bool,
        metrics: Optional[RulesMetrics],
        log_grants: float,
        backend: str,
    ) -> None:
        if not poll_interval > 0:
            raise ValueError("poll_interval must be positive seconds")
        if not 0.0 <= log_grants <= 1.0:
            raise ValueError("log_grants is the share of grants logged, 0 to 1")
        self.source = source
        self.poll_interval = poll_interval
        self.fail_open = fail_open
        self.metrics = metrics if metrics is not None else RulesMetrics()
        self.log_grants = log_grants
        self.backend = backend
        self.protocol: Optional[p.Protocol] = None if backend == p.AUTO else p.Protocol(backend)
        self.document: Optional[Document] = None
        #: The last version refused, so that it is reported once, not every poll.
        self.refused: Optional[int] = None
        self.missing_reported = False
        self.pid = os.getpid()
        #: A followed file: the signature in force, and the last one refused.
        self.file_sig: Optional[Tuple[int, int]] = None
        self.refused_sig: Optional[Tuple[int, int]] = None

    def follow_file(self, path: str) -> Document:
        """Starts following ``path``: its document now (raises if invalid)."""
        src = FileSource(path)
        sig = src.signature()
        doc = parse_document(src.read(), path)
        self.source, self.file_sig = src, sig
        return doc

    def file_poll(self) -> None:
        src = self.source
        assert isinstance(src, FileSource)
        try:
            sig = src.signature()
        except OSError as err:
            if not self.missing_reported:
                self.missing_reported = True
                self.metrics.add("poll_errors")
                log.error("rules: %s unreadable (%s); keeping the document in force", src, err)
            return
        self.missing_reported = False
        if sig == self.file_sig or sig == self.refused_sig:
            return
        try:
            doc = parse_document(src.read(), src.path)
        except Exception as err:  # RulesError, a file being rewritten, undecodable bytes
            self.refused_sig = sig
            self.metrics.add("refused_documents")
            log.error("rules: refused %s, keeping the document in force: %s", src, err)
            return
        self.file_sig = sig
        self.install(doc)

    # the document

    def install(self, doc: Document) -> None:
        old = self.document
        self.document = doc  # one reference swap: a check sees the old or the new, whole
        m = self.metrics
        m.version, m.updated_at, m.loaded_at = doc.version, doc.updated_at, time.time()
        if old is not None:
            m.add("reloads")
            log.info("rules: version %s in force (was %s)", doc.version, old.version)
        self.refused = None
        self.missing_reported = False

    def polled_version(self, reply: Any) -> bool:
        """Whether a fetch is due, after ``HGET version`` answered ``reply``."""
        current = self.document.version if self.document is not None else None
        if reply is None:
            if not self.missing_reported:  # counted once per absence, as a failed poll
                self.missing_reported = True
                self.metrics.add("poll_errors")
                log.error("rules: %s holds no document; keeping version %s", self.source, current)
            return False
        v = int(reply)
        return v != current and v != self.refused

    def fetched(self, reply: Any, first: bool = False) -> None:
        version, text, at = reply
        if version is None or text is None:
            if first:
                raise RulesError([], f"{self.source} holds no document (apply one first)")
            return
        v = int(version)
        try:
            doc = parse_document(_text(text) or "", f"{self.source} version {v}")
        except Exception as e:  # RulesError, or anything a hostile document may raise
            if first:
                raise
            self.refused = v
            self.metrics.add("refused_documents")
            current = self.document.version if self.document is not None else None
            log.error("rules: refused version %s, keeping version %s: %s", v, current, e)
            return
        self.install(
            dataclasses.replace(doc, version=v, updated_at=None if at is None else int(at) / 1000)
        )

    def poll_failed(self, e: BaseException) -> None:
        self.metrics.add("poll_errors")
        log.warning(
            "rules: polling %s failed (%s); keeping version %s",
            self.source,
            e,
            self.document.version if self.document else None,
        )

    # deciding

    def start(self, attributes: Mapping[str, Any], cost: int, cluster: bool) -> Any:
        """The core's check of ``attributes`` on the document in force (``ValueError`` for
        a cost no layer that applies can grant)."""
        if cost.__class__ is not int or cost < 1:
            raise ValueError("cost must be a positive integer")
        doc = self.document
        assert doc is not None
        try:
            return doc.core.check(attributes, cost, self.fail_open, cluster)
        except OverflowError:  # beyond 64 bits: above every cap a bucket can have
            raise ValueError(f"cost {cost} exceeds every layer's cap") from None

    def finish(
        self,
        check: Any,
        attrs: Mapping[str, Any],
        malformed: Optional[str],
        failure: Optional[BaseException],
    ) -> RuleDecision:
        """The check's decision, counted and logged; a malformed reply that left it without
        one is raised (:class:`ProtocolError`, after the refunds)."""
        t = check.decision()
        if t is None:
            raise ProtocolError(malformed or "a malformed RL.MTAKE reply")
        granted, remaining, retry, reset, tokens, limit, fallback, layer, code, key, shadow = t
        source = Source.FALLBACK if fallback else Source.SERVER
        d = RuleDecision(
            granted, remaining, retry, reset, tokens, limit, source, layer, code, key, tuple(shadow)
        )
        if fallback and granted:
            self.metrics.add("fail_open")
            log.warning("rules: Redis failed (%s); letting the request through", failure)
        elif fallback:
            self.metrics.add("fail_closed")
            log.warning("rules: Redis failed (%s); refusing the request", failure)
        elif malformed is not None:
            log.warning("rules: a shadow layer skipped on a malformed reply: %s", malformed)
        self.record(d, attrs)
        return d

    def record(self, d: RuleDecision, attrs: Mapping[str, Any]) -> None:
        self.metrics.decided(d.layer, "granted" if d.granted else "denied")
        for name in d.shadow_denied:
            self.metrics.decided(name, "shadow_denied")
        if (
            d.granted
            and not d.shadow_denied
            and (self.log_grants <= 0 or random.random() >= self.log_grants)
        ):
            return
        if decision_log.isEnabledFor(logging.INFO):
            entry: Dict[str, Any] = {
                "decision": "granted" if d.granted else "denied",
                "layer": d.layer,
                "code": d.code,
                "key": d.key,
                "remaining": d.remaining,
                "retry_after": d.retry_after,
                "version": self.document.version if self.document else None,
                "attributes": {k: attrs[k] for k in LOGGED_ATTRIBUTES if k in attrs},
            }
            if d.shadow_denied:
                entry["shadow_denied"] = list(d.shadow_denied)
            if d.source is Source.FALLBACK:
                entry["source"] = "fallback"
            decision_log.info(json.dumps(entry, default=str))


_ERRORS = (redis.exceptions.RedisError, *OUTAGES)


def _read_file(path: str, follow: bool) -> Tuple[Document, Optional[_Engine]]:
    """The document in the file at ``path``, and (with ``follow``) the engine that read it,
    which knows the file's signature from that reading."""
    if not follow:
        return parse_document(read_text(path), path), None
    reader = _Engine(None, 0.5, True, None, 0.0, p.AUTO)
    return reader.follow_file(path), reader


def _direct(client: Any) -> Optional[OwnPool]:
    """The client's own connection pool, called in this thread one command at a time (no
    retry: a take retried after a lost reply could take twice; the failure policy answers
    an outage), for a plain client; ``None`` for a cluster, a single-connection client or
    anything else (``execute_command`` then)."""
    pool = getattr(client, "connection_pool", None)
    if (
        not isinstance(client, redis.Redis)
        or pool is None
        or getattr(client, "connection", None) is not None
    ):
        return None
    return OwnPool(pool, 0.0, getattr(client, "response_callbacks", None))


class _RulesView:
    """What :class:`Rules` and :class:`AsyncRules` show alike."""

    _e: _Engine

    @property
    def document(self) -> Document:
        """The document in force."""
        assert self._e.document is not None
        return self._e.document

    @property
    def version(self) -> Optional[int]:
        """The version of the document in force (``None``: unversioned)."""
        return self.document.version

    @property
    def metrics(self) -> RulesMetrics:
        """The rules' counters (see :class:`RulesMetrics`)."""
        return self._e.metrics

    def _follow_file(self, reader: Optional[_Engine]) -> None:
        """Polls the file ``reader`` read (if any) from now on, from that reading."""
        if reader is not None:
            self._e.source, self._e.file_sig = reader.source, reader.file_sig


class Rules(_RulesView):
    """Layered limits from a document in Redis (or given), followed live by a background
    thread. ``check(attributes)`` returns a :class:`RuleDecision`.

    ``fail_open`` (default) lets a request through when Redis fails or answers an error
    (counted: ``fail_open``); ``False`` refuses it, a denial by the first enforced layer,
    retry after 1 s (counted: ``fail_closed``); both ``source`` ``FALLBACK``. A malformed
    reply raises :class:`ProtocolError`. On a plain client the calls go on its connection
    pool one try each (a take retried after a lost reply could take twice). ``log_grants``
    is the share of grants written to the decision log (every denial is)."""

    def __init__(
        self,
        client: SyncClient,
        document: Optional[Document] = None,
        *,
        key: Optional[str] = "rl:rules",
        poll_interval: float = 0.5,
        fail_open: bool = True,
        metrics: Optional[RulesMetrics] = None,
        log_grants: float = 0.0,
        backend: str = p.AUTO,
    ) -> None:
        self.client = client
        source = RedisSource(key) if key is not None and document is None else None
        self._e = _Engine(source, poll_interval, fail_open, metrics, log_grants, backend)
        self._cluster = getattr(client, "keyslot", None) is not None
        self._direct = _direct(client)
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        if document is not None:
            self._e.install(document)
        else:
            self._e.fetched(execute(client, *self._e.source.fetch_args()), first=True)  # type: ignore[union-attr]
            self._start()

    @classmethod
    def from_redis(cls, client: SyncClient, key: str = "rl:rules", **options: Any) -> Rules:
        """The document stored under ``key`` (``rules apply``), followed live."""
        return cls(client, key=key, **options)

    @classmethod
    def from_text(cls, client: SyncClient, text: str, **options: Any) -> Rules:
        """A fixed document (YAML or JSON text), not followed."""
        return cls(client, parse_document(text), key=None, **options)

    @classmethod
    def from_file(cls, client: SyncClient, path: str, follow: bool = True, **options: Any) -> Rules:
        """The document in a file; with ``follow``, a changed file (its modification time
        or size) is read again every ``poll_interval``, an invalid one refused."""
        document, reader = _read_file(path, follow)
        rules = cls(client, document, key=None, **options)
        rules._follow_file(reader)
        if reader is not None:
            rules._start()
        return rules

    def _start(self) -> None:
        self._thread = threading.Thread(target=self._poll_loop, name="redis-rl-rules", daemon=True)
        self._thread.start()

    def _poll_loop(self) -> None:
        while not self._stop.wait(self._e.poll_interval):
            try:
                self.refresh()
            except Exception:  # the thread must outlive any surprise: it is the follower
                log.exception("rules: polling failed unexpectedly")

    def refresh(self) -> None:
        """Polls the stored version once (the thread does this every ``poll_interval``)."""
        e = self._e
        if e.source is None:
            return
        if isinstance(e.source, FileSource):
            e.file_poll()
            return
        try:
            if e.polled_version(execute(self.client, *e.source.version_args())):
                e.fetched(execute(self.client, *e.source.fetch_args()))
        except _ERRORS as err:
            e.poll_failed(err)

    def close(self) -> None:
        """Stops the thread that polls for a new document."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def _proto(self) -> p.Protocol:
        e = self._e
        if e.protocol is None:
            e.protocol = resolve_backend(self.client, plain_call(self.client), e.backend)
        return e.protocol

    def check(self, attributes: Mapping[str, Any], cost: int = 1) -> RuleDecision:
        """Takes ``cost`` tokens from every layer that applies to ``attributes``, or from
        none. Redis failing is the failure policy's decision (``fail_open``: granted, else
        refused by the first enforced layer, retry after 1 s), never an exception."""
        e = self._e
        if e.pid != os.getpid() and e.source is not None:  # forked: the thread stayed behind
            e.pid = os.getpid()
            self._stop = threading.Event()
            self._start()
        check = e.start(attributes, cost, self._cluster)
        malformed: Optional[str] = None
        failure: Optional[BaseException] = None
        proto = e.protocol
        if proto is None and check.decision() is None:  # the first call: the backend first
            try:
                proto = self._proto()
            except _ERRORS as err:
                failure = err
                while check.decision() is None:
                    check.failed()
        functions = proto is not None and proto.backend == p.FUNCTIONS
        direct = self._direct  # a decided check sends nothing below
        while True:
            try:
                if direct is not None:
                    packed = check.packed(functions)
                    if packed is None:
                        break
                    reply = direct.packed("FCALL" if functions else "RL.MTAKE", packed)
                else:
                    args = check.command(functions)
                    if args is None:
                        break
                    reply = execute(self.client, *args)
            except redis.exceptions.ResponseError as err:
                check.error_reply(str(err))
            except _ERRORS as err:
                failure = err
                check.failed()
            else:
                bad = check.reply(reply)
                if bad is not None:
                    malformed = bad
        for args in check.refunds(functions):
            try:
                execute(self.client, *args)
            except _ERRORS as err:  # a refund lost costs its tokens until they refill
                log.warning("rules: could not give back tokens: %s", err)
        return e.finish(check, attributes, malformed, failure)

    def __enter__(self) -> Rules:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class AsyncRules(_RulesView):
    """The asyncio twin of :class:`Rules` (``await AsyncRules.from_redis(client)``, or
    ``AsyncRules(client, key=...)`` outside a loop: the document is then loaded by the
    first check); the version is polled by a task started on the first check."""

    def __init__(
        self,
        client: AsyncClient,
        document: Optional[Document] = None,
        *,
        key: Optional[str] = "rl:rules",
        poll_interval: float = 0.5,
        fail_open: bool = True,
        metrics: Optional[RulesMetrics] = None,
        log_grants: float = 0.0,
        backend: str = p.AUTO,
    ) -> None:
        self.client = client
        source = RedisSource(key) if key is not None and document is None else None
        self._e = _Engine(source, poll_interval, fail_open, metrics, log_grants, backend)
        self._cluster = getattr(client, "keyslot", None) is not None
        self._task: Optional[asyncio.Task[None]] = None
        if document is not None:
            self._e.install(document)

    @classmethod
    async def from_redis(
        cls, client: AsyncClient, key: str = "rl:rules", **options: Any
    ) -> AsyncRules:
        """Rules read from the Redis hash ``key`` (awaited: the first document is loaded before it
        returns), polled for changes."""
        rules = cls(client, key=key, **options)
        rules._e.fetched(await aexecute(client, *rules._e.source.fetch_args()), first=True)  # type: ignore[union-attr]
        rules._ensure_task()
        return rules

    @classmethod
    def from_text(cls, client: AsyncClient, text: str, **options: Any) -> AsyncRules:
        """Rules from a YAML document's text (no polling)."""
        return cls(client, parse_document(text), key=None, **options)

    @classmethod
    def from_file(
        cls, client: AsyncClient, path: str, follow: bool = True, **options: Any
    ) -> AsyncRules:
        """As :meth:`Rules.from_file`; the file is polled by the task the first check
        starts."""
        document, reader = _read_file(path, follow)
        rules = cls(client, document, key=None, **options)
        rules._follow_file(reader)
        return rules

    def _ensure_task(self) -> None:
        if self._e.source is None:
            return
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._poll_loop())

    async def _poll_loop(self) -> None:
        while True:
            await asyncio.sleep(self._e.poll_interval)
            try:
                await self.refresh()
            except Exception:  # the task must outlive any surprise: it is the follower
                log.exception("rules: polling failed unexpectedly")

    async def refresh(self) -> None:
        """Polls the source once: loads a new document if its version changed (a failure is counted,
        the document in force stays)."""
        e = self._e
        if e.source is None:
            return
        if isinstance(e.source, FileSource):
            e.file_poll()
            return
        try:
            if e.polled_version(await aexecute(self.client, *e.source.version_args())):
                e.fetched(await aexecute(self.client, *e.source.fetch_args()))
        except _ERRORS as err:
            e.poll_failed(err)

    async def close(self) -> None:
        """Stops the polling task."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _proto(self) -> p.Protocol:
        e = self._e
        if e.protocol is None:
            e.protocol = await aresolve_backend(self.client, aplain_call(self.client), e.backend)
        return e.protocol

    async def check(self, attributes: Mapping[str, Any], cost: int = 1) -> RuleDecision:
        """As :meth:`Rules.check`: the decision of every layer matching ``attributes``, ``cost``
        tokens from each enforced bucket or from none."""
        e = self._e
        if e.document is None:  # made without awaiting from_redis: load on first use
            assert e.source is not None
            e.fetched(await aexecute(self.client, *e.source.fetch_args()), first=True)
        self._ensure_task()
        check = e.start(attributes, cost, self._cluster)
        malformed: Optional[str] = None
        failure: Optional[BaseException] = None
        if check.decision() is None:
            try:
                functions = (await self._proto()).backend == p.FUNCTIONS
            except _ERRORS as err:
                failure, functions = err, False
                while check.decision() is None:
                    check.failed()
            client = self.client
            args = check.command(functions)
            while args is not None:
                try:
                    reply = await aexecute(client, *args)
                except redis.exceptions.ResponseError as err:
                    check.error_reply(str(err))
                except _ERRORS as err:
                    failure = err
                    check.failed()
                else:
                    bad = check.reply(reply)
                    if bad is not None:
                        malformed = bad
                args = check.command(functions)
            for args in check.refunds(functions):
                try:
                    await aexecute(client, *args)
                except _ERRORS as err:  # a refund lost costs its tokens until they refill
                    log.warning("rules: could not give back tokens: %s", err)
        return e.finish(check, attributes, malformed, failure)


__all__ = [
    "AsyncRules",
    "RedisSource",
    "RuleDecision",
    "Rules",
    "RulesError",
    "RulesMetrics",
    "apply_document",
    "stored_document",
]
