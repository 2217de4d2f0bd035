"""Throwaway redis-server processes for the Functions tests: standalone, replica, cluster."""

import os
import random
import shutil
import socket
import struct
import subprocess
import tempfile
import time

import redis

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# RL_LIBRARY: another version of the library (functions/bench.py compares two).
LIBRARY = os.environ.get("RL_LIBRARY", os.path.join(ROOT, "functions", "rl.lua"))
SERVER = os.environ.get("RL_SERVER", "redis-server")
MODULE = os.environ.get("RL_MODULE", os.path.join(ROOT, "target", "debug", "libredis_rl.so"))


def free_port():
    """A free loopback port below the kernel's ephemeral range (32768+), where outgoing
    connections take their local ports: a port from bind(0) can be taken by one of those
    between this check and the server's own bind. Server retries if it still loses."""
    while True:
        port = random.randint(20000, 31999)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port


def bucket_fields(r, key):
    """The fields of the library's bucket at key, whichever layout it is in (functions/rl.lua,
    "The string layout"): HGETALL of a hash; a plain bucket's string `rl:<r>:<c>:<f>` (f
    packed: seconds a little-endian double, nanoseconds a u32) as the hash it stands for,
    {f, r, c} (f as the hash's decimal ns). {} for no key. Anything else raises."""
    kind = r.type(key)
    if kind in (b"hash", "hash"):
        return r.hgetall(key)
    if kind in (b"none", "none"):
        return {}
    value = r.get(key)
    parts = value.split(b":", 3)
    assert kind in (b"string", "string") and len(parts) == 4 and parts[0] == b"rl", (key, value)
    assert len(parts[3]) == 12, (key, value)  # full_at: struct.pack('<dI4', s, ns)
    s, ns = struct.unpack("<dI", parts[3])
    assert s == int(s) and 0 <= s < 1e10 and ns < 1e9, (key, value)
    return {b"f": str(int(s) * 10**9 + ns).encode(), b"r": parts[1], b"c": parts[2]}


def library_source():
    with open(LIBRARY, "rb") as f:
        return f.read()


class Server:
    """One server on a free port; an argument "{bus}" becomes a free port too (a cluster
    node's bus port), both picked again if the server loses a race for them."""

    def __init__(self, *args, module=False):
        for _ in range(5):
            if self._start(args, module):
                return
        raise RuntimeError("no free port after 5 tries")

    def _start(self, args, module):
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="rl-fn-")
        args = [str(free_port()) if a == "{bus}" else a for a in args]
        cmd = [SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
               "--appendonly", "no", "--dir", self.dir, "--logfile", "server.log",
               "--enable-debug-command", "yes", *args]
        if module:
            cmd += ["--loadmodule", MODULE]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 30
        while True:
            if self.proc.poll() is not None:
                with open(os.path.join(self.dir, "server.log")) as f:
                    log = f.read()[-2000:]
                self.stop()
                if "Address already in use" in log:
                    return False
                raise RuntimeError(f"{SERVER} did not start: {log}")
            try:
                self.client().ping()
                return True
            except redis.exceptions.ConnectionError:
                if time.time() > deadline:
                    self.stop()
                    raise RuntimeError(f"{SERVER} did not start in 30 s")
                time.sleep(0.02)

    def client(self, protocol=2, **kw):
        return redis.Redis(port=self.port, protocol=protocol, **kw)

    def load_library(self):
        return self.client().function_load(library_source(), replace=True)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


class Cluster:
    """Three masters, no replicas, joined with `redis-cli --cluster create`."""

    def __init__(self):
        self.nodes = []
        try:
            for _ in range(3):
                self.nodes.append(Server("--cluster-enabled", "yes", "--cluster-config-file",
                                         "nodes.conf", "--cluster-port", "{bus}",
                                         "--cluster-node-timeout", "2000"))
            subprocess.run(["redis-cli", "--cluster", "create",
                            *[f"127.0.0.1:{n.port}" for n in self.nodes],
                            "--cluster-replicas", "0", "--cluster-yes"],
                           check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           timeout=60)
            deadline = time.time() + 60
            while not all(n.client().cluster("info")["cluster_state"] == "ok"
                          for n in self.nodes):
                if time.time() > deadline:
                    raise RuntimeError("cluster did not become ok")
                time.sleep(0.05)
        except BaseException:
            self.stop()
            raise

    def stop(self):
        for n in self.nodes:
            n.stop()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
