"""Throwaway redis-server processes for the Functions tests: standalone, replica, cluster."""

import os
import shutil
import socket
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
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def library_source():
    with open(LIBRARY, "rb") as f:
        return f.read()


class Server:
    def __init__(self, *args, module=False):
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="rl-fn-")
        cmd = [SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
               "--appendonly", "no", "--dir", self.dir, "--logfile", "server.log",
               "--enable-debug-command", "yes", *args]
        if module:
            cmd += ["--loadmodule", MODULE]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 10
        while True:
            try:
                self.client().ping()
                break
            except redis.exceptions.ConnectionError:
                if self.proc.poll() is not None or time.time() > deadline:
                    log = open(os.path.join(self.dir, "server.log")).read()[-2000:]
                    raise RuntimeError(f"{SERVER} did not start: {log}")
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
                bus = free_port()
                self.nodes.append(Server("--cluster-enabled", "yes", "--cluster-config-file",
                                         "nodes.conf", "--cluster-port", str(bus),
                                         "--cluster-node-timeout", "2000"))
            subprocess.run(["redis-cli", "--cluster", "create",
                            *[f"127.0.0.1:{n.port}" for n in self.nodes],
                            "--cluster-replicas", "0", "--cluster-yes"],
                           check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           timeout=60)
            deadline = time.time() + 20
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
