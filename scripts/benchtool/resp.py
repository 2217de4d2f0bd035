"""A minimal RESP client and a redis-server launcher (standard library only)."""

import socket
import subprocess
import time
from pathlib import Path


class RedisError(Exception):
    pass


def encode(args):
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        b = a if isinstance(a, bytes) else str(a).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(b), b))
    return b"".join(out)


class Conn:
    def __init__(self, port, timeout=120):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.file = self.sock.makefile("rb")

    def call(self, *args):
        self.sock.sendall(encode(args))
        return self.read()

    def read(self):
        line = self.file.readline()
        if not line:
            raise ConnectionError("server closed the connection")
        kind, rest = line[:1], line[1:-2]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            raise RedisError(rest.decode())
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            if n < 0:
                return None
            data = self.file.read(n + 2)
            return data[:-2].decode(errors="replace")
        if kind == b"*":
            n = int(rest)
            return None if n < 0 else [self.read() for _ in range(n)]
        raise RedisError(f"unexpected reply {line!r}")

    def pipeline(self, commands, batch=1000):
        """Sends the commands `batch` at a time, reading each batch's replies before the next
        (the socket buffers stay small); raises the first error reply once all are read."""
        replies, error = [], None
        for at in range(0, len(commands), batch):
            chunk = commands[at:at + batch]
            self.sock.sendall(b"".join(encode(args) for args in chunk))
            for _ in chunk:
                try:
                    replies.append(self.read())
                except RedisError as e:
                    replies.append(e)
                    error = error or e
        if error:
            raise error
        return replies

    def info(self, section):
        fields = {}
        for line in self.call("INFO", section).splitlines():
            if ":" in line and not line.startswith("#"):
                k, v = line.split(":", 1)
                fields[k] = v
        return fields

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A server binary with the module loaded, in its own dir under the run's temp dir."""

    def __init__(self, binary, module, lua_script, tmp, name, wrapper=(), ready_timeout=30,
                 extra=()):
        self.dir = Path(tmp) / name
        self.dir.mkdir()
        self.port = free_port()
        argv = list(wrapper) + [
            binary,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--save", "",
            "--appendonly", "no",
            "--daemonize", "no",
            "--dir", str(self.dir),
            "--logfile", str(self.dir / "server.log"),
            "--loadmodule", str(module),
            *extra,
        ]  # fmt: skip
        self.proc = subprocess.Popen(
            argv, cwd=self.dir, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.time() + ready_timeout
        while True:
            try:
                self.conn = Conn(self.port)
                if self.conn.call("PING") == "PONG":
                    break
            except (OSError, RedisError):
                pass
            if self.proc.poll() is not None or time.time() > deadline:
                self.proc.kill()
                raise RuntimeError(f"{name}: server did not start; see {self.dir}/server.log")
            time.sleep(0.1)
        self.sha = self.conn.call("SCRIPT", "LOAD", Path(lua_script).read_text())
        # The Functions library next to the module (their keys never meet).
        library = Path(__file__).resolve().parents[2] / "functions" / "rl.lua"
        self.conn.call("FUNCTION", "LOAD", "REPLACE", library.read_text())

    def call(self, *args):
        return self.conn.call(*args)

    def used_memory(self):
        return int(self.conn.info("memory")["used_memory"])

    def stop(self):
        try:
            self.conn.call("SHUTDOWN", "NOSAVE")
        except (OSError, RedisError, ConnectionError):
            pass
        self.conn.close()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
