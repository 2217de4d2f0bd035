"""Fixtures: real redis-servers on free loopback ports, in temp dirs.

- The module is ``$RL_MODULE`` if set, else ``<repo>/target/debug/libredis_rl.so``.
- The server binary is ``$RL_SERVER`` if set, else ``redis-server``.
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import shutil
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator, List, Optional

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from redis_rl import Metrics

REPO = Path(__file__).resolve().parents[2]
MODULE = Path(os.environ.get("RL_MODULE") or REPO / "target" / "debug" / "libredis_rl.so")
SERVER = os.environ.get("RL_SERVER") or "redis-server"
FUNCTIONS_LUA = REPO / "functions" / "rl.lua"

TINY = 1e-6  # refill negligible: counts are exact
NO_RETRY = Retry(NoBackoff(), 0)  # a killed server is found at once, not after backoffs
KINDS = ["limiter", "prefetch", "async-limiter", "async-prefetch"]  # every limiter type


def free_port(bus: bool = False) -> int:
    """A free loopback port; with ``bus``, one whose cluster bus port (+10000) is free too.

    Picked below the kernel's ephemeral range (32768+), where outgoing connections take
    their local ports: a port from ``bind(0)`` can be taken by one of those between this
    check and the server's own bind. ``Server`` still retries if it loses that race.
    """
    while True:
        port = random.randint(10000, 21999)
        try:
            for p in (port, port + 10000) if bus else (port,):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
        except OSError:
            continue
        return port


class Server:
    """One redis-server process; can be killed, restarted on the same port, paused."""

    def __init__(self, workdir: Path, module: bool = True, extra: Optional[List[str]] = None):
        self.dir = workdir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.module = module
        self.extra = extra or []
        self.proc: Optional[subprocess.Popen[bytes]] = None
        cluster = "--cluster-enabled" in self.extra
        for attempt in range(5):  # another process may take the port between pick and bind
            self.port = free_port(bus=cluster)
            try:
                self.start()
                return
            except RuntimeError:
                self.stop()
                if attempt == 4:
                    raise

    def args(self) -> List[str]:
        args = [SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
        args += ["--appendonly", "no", "--dir", str(self.dir)]
        if self.module:
            args += ["--loadmodule", str(MODULE)]
        return args + self.extra

    def start(self) -> None:
        log = open(self.dir / "server.log", "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(
            self.args(), stdout=log, stderr=subprocess.STDOUT, cwd=self.dir
        )
        deadline = time.monotonic() + 10
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"redis-server exited: {(self.dir / 'server.log').read_text()[-2000:]}"
                )
            try:
                if redis.Redis(port=self.port, socket_timeout=1).ping():
                    return
            except redis.exceptions.ConnectionError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("redis-server did not start")
            time.sleep(0.02)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()

    def restart(self) -> None:
        self.kill()
        self.start()

    def pause(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def client(self, **kwargs: Any) -> redis.Redis:
        kwargs.setdefault("socket_timeout", 2)
        return redis.Redis(host="127.0.0.1", port=self.port, **kwargs)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.resume()
            self.proc.kill()
            self.proc.wait()


def has_command(client: redis.Redis, name: str) -> bool:
    reply = client.execute_command("COMMAND INFO", name)
    return bool(reply) and reply[0] is not None


def _check_setup() -> None:
    if shutil.which(SERVER) is None and not Path(SERVER).exists():
        pytest.exit(f"redis-server binary not found: {SERVER} (set RL_SERVER)", 2)
    if not MODULE.exists():
        pytest.exit(f"module not found: {MODULE} (cargo build -p redis-rl, or set RL_MODULE)", 2)


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A shared server with the module; tests use their own keys."""
    _check_setup()
    s = Server(tmp_path_factory.mktemp("redis"))
    yield s
    s.stop()


@pytest.fixture(scope="module")
def fserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A server with the Functions library instead of the module (one per test file)."""
    if not FUNCTIONS_LUA.exists():
        pytest.skip("functions/rl.lua is not in this checkout")
    _check_setup()
    s = Server(tmp_path_factory.mktemp("functions"), module=False)
    s.client().execute_command("FUNCTION", "LOAD", "REPLACE", FUNCTIONS_LUA.read_text())
    yield s
    s.stop()


@pytest.fixture
def own_server(tmp_path: Path) -> Iterator[Server]:
    """A server of this test's own (to kill, restart or pause)."""
    _check_setup()
    s = Server(tmp_path / "redis")
    yield s
    s.stop()


@pytest.fixture(params=[2, 3], ids=["resp2", "resp3"])
def protocol(request: pytest.FixtureRequest) -> int:
    return int(request.param)


@pytest.fixture
def key(request: pytest.FixtureRequest) -> str:
    """A key unique to this test (and parameter)."""
    return f"t:{request.node.name}:{time.monotonic_ns()}"


def info_rl(client: redis.Redis) -> dict[str, Any]:
    return dict(client.info("rl"))


def sleep_server(server: Server, seconds: int) -> threading.Thread:
    """DEBUG SLEEP on a connection of its own; returns once the server stopped answering."""
    admin = server.client(socket_timeout=seconds + 30)
    t = threading.Thread(target=admin.execute_command, args=("DEBUG", "SLEEP", seconds))
    t.start()
    probe = server.client(socket_timeout=0.3, retry=Retry(NoBackoff(), 0))
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            probe.ping()
            time.sleep(0.01)
        except redis.exceptions.TimeoutError:
            return t
    raise AssertionError("DEBUG SLEEP did not take effect")


@pytest.fixture
def debug_server(tmp_path: Path) -> Iterator[Server]:
    """A server of this test's own that accepts DEBUG (DEBUG SLEEP)."""
    _check_setup()
    s = Server(tmp_path / "redis", extra=["--enable-debug-command", "yes"])
    yield s
    s.stop()


def adds_up(m: Metrics) -> None:
    """Contract rule 6: every call is counted once, as a grant, a denial or an error."""
    assert m["calls"] == m["granted"] + m["denied"] + m["errors"], m.snapshot()


def peek_fields(r: redis.Redis, key: str) -> dict[str, float]:
    """RL.PEEK as numbers; a missing key is a full bucket with no lease."""
    reply = r.execute_command("RL.PEEK", key)
    if reply is None:
        return {"tokens": math.inf, "leases": 0, "leased_tokens": 0}
    pairs = reply.items() if isinstance(reply, dict) else zip(reply[::2], reply[1::2])
    return {(k.decode() if isinstance(k, bytes) else k): float(v) for k, v in pairs}


def wait_for(cond: Callable[[], bool], what: str, limit: float = 15.0) -> None:
    """Polls ``cond`` until it holds (a state, not a duration)."""
    deadline = time.monotonic() + limit
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"never happened: {what}")
        time.sleep(0.01)


class Proxy:
    """A TCP proxy on a free loopback port to ``upstream``: each accepted connection gets
    its own upstream one, numbered from 1 (``accepted``), and two pump threads
    (``_pump(a, b, number, to_client)``): each hands what it reads to ``_forward`` until
    its side closes. Subclasses change ``_forward``, or the whole pump."""

    def __init__(self, upstream: int) -> None:
        self.upstream = upstream
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.port = self.listener.getsockname()[1]
        self.accepted = 0
        self.sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                down, _ = self.listener.accept()
            except OSError:
                return
            self.accepted += 1
            number = self.accepted
            up = socket.create_connection(("127.0.0.1", self.upstream))
            self.sockets += [down, up]
            for a, b, to_client in ((down, up, False), (up, down, True)):
                args = (a, b, number, to_client)
                threading.Thread(target=self._pump, args=args, daemon=True).start()

    def _pump(self, a: socket.socket, b: socket.socket, number: int, to_client: bool) -> None:
        while True:
            try:
                data = a.recv(65536)
                if not data:
                    b.shutdown(socket.SHUT_WR)
                    return
                self._forward(b, data, to_client)
            except OSError:
                return

    def _forward(self, b: socket.socket, data: bytes, to_client: bool) -> None:
        b.sendall(data)

    def close(self) -> None:
        self.listener.close()
        for s in self.sockets:  # shutdown wakes the threads blocked on them, sends the FIN
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                s.close()


class CuttingProxy(Proxy):
    """A proxy that, after ``cut(after)``, delivers the next reply in two pieces: its first
    ``after`` bytes at once (``delivered`` is set then), the rest at ``release()``."""

    def __init__(self, upstream: int) -> None:
        self._after: Optional[int] = None
        self.delivered = threading.Event()
        self._release = threading.Event()
        super().__init__(upstream)

    def cut(self, after: int) -> None:
        self.delivered.clear()
        self._release.clear()
        self._after = after

    def release(self) -> None:
        self._release.set()

    def _forward(self, b: socket.socket, data: bytes, to_client: bool) -> None:
        after = self._after
        if to_client and after is not None:
            assert len(data) > after, (data, after)
            self._after = None
            b.sendall(data[:after])
            self.delivered.set()
            self._release.wait()
            data = data[after:]
        b.sendall(data)


class StallingProxy(Proxy):
    """A proxy that, after ``stall()``, forwards the first piece of the next command and
    then stops reading commands (``stalled`` is set then) until ``release()``: the client's
    writes back up once the socket buffers between them are full. Its sockets take the
    smallest receive buffer the kernel gives, so that a few MiB fill them."""

    def __init__(self, upstream: int) -> None:
        self._stall = False
        self.stalled = threading.Event()
        self._release = threading.Event()
        super().__init__(upstream)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)

    def stall(self) -> None:
        self.stalled.clear()
        self._release.clear()
        self._stall = True

    def release(self) -> None:
        self._stall = False
        self._release.set()

    def _forward(self, b: socket.socket, data: bytes, to_client: bool) -> None:
        b.sendall(data)
        if not to_client and self._stall:
            self.stalled.set()
            self._release.wait()
