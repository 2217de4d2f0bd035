#!/usr/bin/env python3
"""Two builds of the module, one server each, driven by the same random command streams.

    scripts/equivalence.py OLD.so NEW.so [--server PATH] [--seed N] [--steps N] [--bulk]
        [--slow] [--reuse-expired] [--min-period 300] [--no-pins] [--verbose] [--keep]

For a change that claims to keep behaviour (a refactor, a hot-path change): every reply,
effect and counter of the second build must be the first's, byte for byte.

Both servers run under one wall clock frozen at the same instant: an LD_PRELOAD shim built
here with cc (CLOCK_REALTIME, gettimeofday and time read one shared file, which the driver
steps now and then; modules are loaded without RTLD_DEEPBIND so that the module reads the
shim's clock too), with active expiry off. So both see exactly the same times, and replies,
lease and permit ids, doubles, expiries and the AOF are compared exactly, not within a
tolerance. The commands: every RL.* command with every option (INIT, SHADOW, VERSION,
WITHSTATE, MIN, RETURN, RELEASE), RL.PIN of every kind on buckets, semaphores and share
keys (with and without PX, some ending within the run), RL.UNPIN and RL.PINNED, duplicated
and unknown options, wrong arities, bad numbers, limits at 1e-9 and 1e15, wrong types, the
seed script's hashes (with rl.adopt-script-keys), long keys, more namespaces than
rl.max-namespaces, CONFIG SET of the rl.* configs, CONFIG RESETSTAT, DEBUG RELOAD, COPY,
runs of one call, EVAL, MULTI/EXEC and DISCARD, on a RESP2 and a RESP3 connection.

Compared after every command: the reply bytes and the dirty counter; every 300 commands:
INFO rl, RL.STATS (all and per namespace), RL.TOP, and every key's TYPE, DUMP, RL.PEEK,
RL.PINNED and PTTL. Then (--bulk) keys filled to their limits (1024 leases, 10000 permits,
4096 holders) and runs of denials at rl.top-keys 4, 1 and 16 with RL.TOP read between them;
the internal effects found in the AOF (RL.SETSTATE, RL.SETPERMITS, RL.SETSHARES), replayed
mutated; the whole AOF (appendfsync always), and the AOF rewritten without RDB preamble.
Last, a replica of the second build follows its master through more random writes, and
every key's DEBUG DIGEST-VALUE must match.

--reuse-expired is for a new build that reuses expired buckets in place where the old one had
the server delete them first (Redis 8+): the AOFs are compared without the DEL (and MULTI/EXEC)
that lazy expiry puts before a write (tests/expired_keys.rs replays such an AOF and follows
it with a replica).

--slow is for Valkey, whose own clock follows the monotonic clock from its frozen start:
the module's clock never steps, nothing expires within the run, PTTL is compared within
10 s. --min-period 300 compares with builds from before RL.SHARE raised short periods;
--no-pins with builds from before pins.

Exits 1 at the first difference, printing it and the commands that led to it.
"""

import argparse
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time

from benchtool.resp import encode

SHIM = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>
static unsigned long long fake_ns(void) {
    const char *p = getenv("FAKECLOCK_FILE");
    char buf[64] = {0};
    int fd = p ? open(p, O_RDONLY) : -1;
    if (fd < 0) return 1800000000000000000ULL;
    int n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 1800000000000000000ULL;
    return strtoull(buf, 0, 10);
}
int clock_gettime(clockid_t id, struct timespec *ts) {
    if (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE) {
        unsigned long long ns = fake_ns();
        ts->tv_sec = ns / 1000000000ULL; ts->tv_nsec = ns % 1000000000ULL; return 0;
    }
    static int (*real)(clockid_t, struct timespec *);
    if (!real) real = dlsym(RTLD_NEXT, "clock_gettime");
    return real(id, ts);
}
int gettimeofday(struct timeval *tv, void *tz) {
    (void)tz; unsigned long long ns = fake_ns();
    if (tv) { tv->tv_sec = ns / 1000000000ULL; tv->tv_usec = (ns % 1000000000ULL) / 1000; }
    return 0;
}
time_t time(time_t *t) { time_t s = fake_ns() / 1000000000ULL; if (t) *t = s; return s; }
/* Valkey loads modules with RTLD_DEEPBIND, which would bind the module to libc's clock. */
void *dlopen(const char *file, int mode) {
    static void *(*real)(const char *, int);
    if (!real) real = dlsym(RTLD_NEXT, "dlopen");
    return real(file, mode & ~RTLD_DEEPBIND);
}
"""


class Diff(AssertionError):
    pass


# ---------------------------------------------------------------------------------------
# A raw RESP connection: replies are kept as the exact bytes the server sent.


class Conn:
    def __init__(self, path):
        self.s = socket.socket(socket.AF_UNIX)
        self.s.connect(path)
        self.s.settimeout(60)
        self.buf = b""

    def _line(self):
        while b"\r\n" not in self.buf:
            chunk = self.s.recv(1 << 16)
            if not chunk:
                raise EOFError("connection closed")
            self.buf += chunk
        i = self.buf.index(b"\r\n")
        line, self.buf = self.buf[: i + 2], self.buf[i + 2 :]
        return line

    def _n(self, n):
        while len(self.buf) < n:
            chunk = self.s.recv(1 << 16)
            if not chunk:
                raise EOFError("connection closed")
            self.buf += chunk
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def read(self):
        """(raw bytes, parsed value)"""
        line = self._line()
        t, body = line[:1], line[1:-2]
        if t in b"$=!":
            n = int(body)
            if n < 0:
                return line, None
            data = self._n(n + 2)
            return line + data, data[:-2]
        if t in b"*~>%|":
            n = int(body)
            if n < 0:
                return line, None
            count = n * 2 if t in b"%|" else n
            raws, vals = [line], []
            for _ in range(count):
                r, v = self.read()
                raws.append(r)
                vals.append(v)
            raw = b"".join(raws)
            if t == b"|":  # an attribute precedes the reply it annotates
                r, v = self.read()
                return raw + r, v
            return raw, vals
        if t == b":":
            return line, int(body)
        if t == b"-":
            return line, Exception(body.decode(errors="replace"))
        return line, body

    def call(self, *args):
        self.s.sendall(encode(args))
        return self.read()


# ---------------------------------------------------------------------------------------
# Servers.


def free_sock(d, name):
    return os.path.join(d, name + ".sock")


class Server:
    def __init__(self, binary, module, root, name, shim, clock, extra=()):
        self.dir = os.path.join(root, name)
        os.makedirs(self.dir)
        self.sock = free_sock(self.dir, "s")
        env = dict(os.environ, LD_PRELOAD=shim, FAKECLOCK_FILE=clock)
        self.proc = subprocess.Popen(
            [
                binary,
                "--port",
                "0",
                "--unixsocket",
                self.sock,
                "--dir",
                self.dir,
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--save",
                "",
                "--enable-debug-command",
                "yes",
                "--logfile",
                os.path.join(self.dir, "log"),
                "--loadmodule",
                module,
                *extra,
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.time() + 30
        while True:
            try:
                c = Conn(self.sock)
                if c.call("PING")[1] == b"PONG":
                    break
            except (OSError, EOFError):
                pass
            if time.time() > deadline or self.proc.poll() is not None:
                raise RuntimeError(f"server {name} did not start: {self.log()}")
            time.sleep(0.05)
        c.call("DEBUG", "SET-ACTIVE-EXPIRE", "0")

    def log(self):
        try:
            return open(os.path.join(self.dir, "log")).read()[-3000:]
        except OSError:
            return ""

    def conn(self, resp3=False):
        c = Conn(self.sock)
        if resp3:
            c.call("HELLO", "3")
        c.call("DEBUG", "MARK-INTERNAL-CLIENT")  # Redis 8+: may call internal commands
        return c

    def aof(self):
        d = os.path.join(self.dir, "appendonlydir")
        out = b""
        for f in sorted(os.listdir(d)):
            if ".incr." in f or f.endswith(".aof") and ".base." in f:
                with open(os.path.join(d, f), "rb") as fh:
                    out += fh.read()
        return out

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


# ---------------------------------------------------------------------------------------
# Random commands.

LIMITS = [
    ("1e-9", "1e-9"),
    ("1e-9", "3"),
    ("0.001", "10"),
    ("1e-6", "1e15"),
    ("1e15", "1e15"),
    ("0.5", "1"),
    ("2", "10"),
    ("1000", "1000"),
    ("7.7", "13.5"),
    ("1e-3", "1e-3"),
    ("1e12", "5"),
    ("1", "3"),
    ("1e-9", "1e6"),
]
SLOW_LIMITS = [
    ("1e-9", "1e-9"),
    ("1e-9", "3"),
    ("0.001", "10"),
    ("1e-6", "1e15"),
    ("1e-3", "1e-3"),
    ("1e-9", "1e6"),
    ("0.0001", "5"),
]
BAD_NUMBERS = [
    "0",
    "-1",
    "nan",
    "inf",
    "-inf",
    "1e16",
    "1e-10",
    "abc",
    "",
    "1.5.5",
    "0x10",
    " 1",
    "1 ",
    "+",
    "-0",
    "1e309",
    "9007199254740992",
    "18446744073709551616",
    "3.0",
    "2.5",
    "00001",
    "+3",
    "1e3",
]


class Gen:
    def __init__(self, rng, min_period=1, slow=False, pins=True):
        self.r = rng
        self.min_period = min_period
        # RL.PIN, RL.UNPIN and RL.PINNED among the commands (not for builds before pins).
        self.pins = pins
        # Only limits, leases, permits and shares that last longer than the run.
        self.slow = slow
        self.ids = [b"0", b"1"]
        self.ns = ["a", "b", "orders", "x-y", "ns0"]
        self.holders = ["h1", "h2", "h3", "é", "h:x"]
        self.scripts = ["script:0"]

    def key(self):
        r = self.r
        if r.random() < 0.1:
            return r.choice(["str", "list", "missing", "", "sem:1", "share:1"])
        if r.random() < 0.05:
            return f"many{r.randrange(40)}:k"  # more namespaces than rl.max-namespaces
        if r.random() < 0.04:
            return r.choice(self.scripts[-3:])  # the seed script's hashes
        if r.random() < 0.04:
            # Long names: past a shown top key (128), a namespace's name (48), 16 bytes.
            return r.choice(
                [
                    "L" * 130 + "%d",
                    "n" * 49 + ":k%d",
                    "n" * 48 + ":k%d",
                    "abcdefghijklmnop%d",
                    "abcdefghijklmno%d:x",
                    "ab%dd",
                ]
            ) % r.randrange(3)
        sep = r.choice([":", ":", ":", "/", ".", ""])
        return f"{r.choice(self.ns)}{sep}k{r.randrange(6)}"

    def new_script(self):
        # A fresh key: an adopted one is a bucket from then on.
        self.scripts.append(f"script:{len(self.scripts)}")
        return self.scripts[-1]

    def num(self, good):
        r = self.r
        if r.random() < 0.06:
            return r.choice(BAD_NUMBERS)
        return good

    def ttl(self, lo, hi):
        return self.intlike(max(lo, 10**7) if self.slow else lo, hi)

    def intlike(self, lo, hi):
        r = self.r
        if r.random() < 0.05:
            return r.choice(BAD_NUMBERS)
        return str(r.randint(lo, hi))

    def limit(self):
        if self.slow:
            rate, cap = self.r.choice(SLOW_LIMITS)
        else:
            rate, cap = self.r.choice(
                LIMITS if self.r.random() < 0.3 else LIMITS[:3] + LIMITS[5:12]
            )
        return self.num(rate), self.num(cap)

    def lease_id(self):
        r = self.r
        if r.random() < 0.8 and len(self.ids) > 2:
            return r.choice(self.ids[-30:]).decode()
        return self.intlike(0, 10)

    def options(self, allowed):
        r = self.r
        out = []
        for _ in range(r.choice([0, 0, 1, 1, 2, 3])):
            o = r.choice(allowed + ["FOO", "withstate", "Init"] if r.random() < 0.15 else allowed)
            up = o.upper()
            if up == "INIT":
                out += [o, self.num(str(r.choice([0, 0.5, 1, 3, 10, 1e15])))]
                if r.random() < 0.03:
                    out.pop()  # INIT without its value
            elif up == "VERSION":
                out += [o, self.intlike(0, 4) if r.random() < 0.95 else "9007199254740992"]
            elif up == "MIN":
                out += [o, self.intlike(0, 5)]
            elif up == "RETURN":
                out += [o, self.lease_id(), self.intlike(0, 5)]
            else:
                out.append(o)
        return out

    def command(self):
        r = self.r
        if r.random() < 0.03:
            # The seed script's state, for rl.adopt-script-keys.
            return [
                "HSET",
                self.new_script(),
                "tokens",
                r.choice(["0", "2.5", "10", "3", "1e300", "x"]),
                "ts",
                r.choice(["1800000000.1", "1799999999", "0", "2e9", "y"]),
            ]
        c = r.choice(
            ["TAKE"] * 8
            + ["LEASE"] * 4
            + ["RETURN"] * 3
            + ["MTAKE"] * 3
            + ["PEEK"] * 2
            + ["RESERVE"] * 3
            + ["REFUND"] * 2
            + ["ACQUIRE"] * 3
            + ["RELEASE"] * 2
            + ["RENEW"] * 2
            + ["SHARE"] * 3
            + (["PIN"] * 3 + ["UNPIN", "PINNED"] if self.pins else [])
            + ["STATS", "TOP", "CONFIG", "OTHER"]
        )
        if c == "TAKE":
            rate, cap = self.limit()
            a = ["RL.TAKE", self.key(), rate, cap]
            if r.random() < 0.7:
                a.append(self.intlike(1, 4) if r.random() < 0.9 else r.choice(["1e15", "11"]))
            a += self.options(["WITHSTATE", "INIT", "SHADOW", "VERSION"])
        elif c == "LEASE":
            rate, cap = self.limit()
            a = [
                "RL.LEASE",
                self.key(),
                rate,
                cap,
                self.intlike(1, 12),
                self.ttl(1, 10**8) if r.random() < 0.95 else "86400001",
            ]
            a += self.options(["MIN", "RETURN", "INIT", "SHADOW", "VERSION"])
        elif c == "RETURN":
            a = ["RL.RETURN", self.key(), self.lease_id(), self.intlike(0, 5)]
        elif c == "MTAKE":
            a = ["RL.MTAKE", self.intlike(1, 3)]
            for _ in range(r.choice([1, 1, 2, 3, 65]) if r.random() < 0.97 else 64):
                a += [self.key(), *self.limit()]
            a += self.options(["WITHSTATE", "INIT", "SHADOW", "VERSION"])
        elif c == "PEEK":
            a = ["RL.PEEK", self.key()]
        elif c == "RESERVE":
            rate, cap = self.limit()
            a = [
                "RL.RESERVE",
                self.key(),
                rate,
                cap,
                self.intlike(1, 5),
                self.intlike(0, 10**7) if r.random() < 0.9 else self.intlike(0, 10**10),
            ]
            a += self.options(["INIT", "SHADOW", "VERSION"])
        elif c == "REFUND":
            a = ["RL.REFUND", self.key(), self.intlike(0, 5)]
        elif c == "ACQUIRE":
            a = [
                "RL.ACQUIRE",
                r.choice(["sem:1", "sem:2", self.key()]),
                self.intlike(1, 3),
                self.ttl(1, 10**8),
            ]
        elif c == "RELEASE":
            a = ["RL.RELEASE", r.choice(["sem:1", "sem:2", self.key()]), self.lease_id()]
        elif c == "RENEW":
            a = ["RL.RENEW", r.choice(["sem:1", "sem:2"]), self.lease_id(), self.ttl(1, 10**8)]
        elif c == "SHARE":
            rate, cap = self.limit()
            a = [
                "RL.SHARE",
                r.choice(["share:1", "share:2", self.key()]),
                rate,
                cap,
                r.choice(self.holders),
                self.num(r.choice(["1", "0.5", "1e9", "0"])),
                self.intlike(
                    3_000_000 if self.slow else self.min_period,
                    3_600_000 if self.slow or r.random() < 0.1 else 4000,
                ),
            ]
            a += self.options(["RELEASE", "VERSION"])
        elif c == "PIN":
            a = self.pin()
        elif c in ("UNPIN", "PINNED"):
            a = ["RL." + c, r.choice(["sem:1", "share:1", "share:2", self.key()])]
        elif c == "STATS":
            a = ["RL.STATS"] + (
                [r.choice(self.ns + ["", "nope", "many3"])] if r.random() < 0.7 else []
            )
        elif c == "TOP":
            a = ["RL.TOP"] + ([self.intlike(0, 300)] if r.random() < 0.7 else [])
        elif c == "CONFIG":
            name, vals = r.choice(
                [
                    ("rl.top-keys", ["0", "1", "2", "8", "128", "-1"]),
                    ("rl.namespace-separator", [":", "/", ".", "", "ab"]),
                    ("rl.max-namespaces", ["0", "1", "4", "64", "100000"]),
                    ("rl.mode", ["enforce", "shadow", "enforce", "x"]),
                    ("rl.adopt-script-keys", ["yes", "no"]),
                ]
            )
            a = ["CONFIG", "SET", name, r.choice(vals)]
        else:
            a = r.choice(
                [
                    ["CONFIG", "RESETSTAT"],
                    ["SET", "str", "v"],
                    ["LPUSH", "list", "v"],
                    ["DEL", self.key()],
                    [
                        "HSET",
                        r.choice(["script:1", "script:2"]),
                        "tokens",
                        r.choice(["0", "2.5", "10", "1e300", "x"]),
                        "ts",
                        r.choice(["1800000000.1", "1799999999", "0", "2e9", "y"]),
                    ],
                    ["HSET", "script:2", "extra", "1"],
                    ["RL.TAKE"],
                    ["RL.TAKE", "k"],
                    ["RL.MTAKE", "1"],
                    ["RL.MTAKE", "1", "k", "1"],
                    ["RL.LEASE", "k", "1", "1", "1"],
                    ["RL.RETURN", "k", "1"],
                    ["RL.PEEK"],
                    ["RL.PEEK", "a", "b"],
                    ["RL.STATS", "a", "b"],
                    ["RL.TOP", "1", "2"],
                    ["RL.SHARE", "k"],
                    ["RL.REFUND", "k"],
                    ["RL.ACQUIRE", "k", "1"],
                    ["RL.RELEASE", "k"],
                    ["PERSIST", self.key()],
                    ["DEBUG", "RELOAD"],
                    ["COPY", self.key(), self.key(), "REPLACE"],
                    ["RL.TAKE", "k", "1", "1", "1", "VERSION"],
                    ["RL.SETSTATE", "k"],
                    ["RL.SETPERMITS"],
                    ["RL.SETSHARES", "k"],
                ]
            )
        # Through a script now and then (its effects wrapped in MULTI/EXEC).
        if r.random() < 0.04 and a[0].upper().startswith("RL."):
            a = ["EVAL", "return redis.pcall(unpack(ARGV))", "0"] + a
        # Mangle the option/command names' case now and then.
        if r.random() < 0.05:
            a[0] = a[0].lower()
        return a

    def pin(self):
        """An `RL.PIN` on a bucket, semaphore or share key (or a key of another kind), of
        every kind, with or without `PX`, now and then malformed."""
        r = self.r
        what = r.choice(["bucket"] * 4 + ["permits", "shares", "bad"])
        if what == "permits":
            key = r.choice(["sem:1", "sem:2"])
            kind = [r.choice(["PERMITS", "permits"]), self.intlike(1, 4)]
            kind = r.choice([kind, kind, ["BLOCK"], ["EXEMPT"]])
        elif what == "shares":
            key = r.choice(["share:1", "share:2", "share:3"])
            kind = r.choice([list(self.limit()), ["BLOCK"], ["EXEMPT"]])
            if r.random() < 0.5:
                kind = ["SHARES"] + kind
        else:
            key = self.key()
            kind = r.choice([list(self.limit())] * 3 + [["BLOCK"], ["exempt"]])
        a = ["RL.PIN", key] + kind
        if r.random() < 0.4:
            a += ["PX", self.ttl(1, 10**7) if r.random() < 0.95 else "0"]
        if what == "bad":
            a = r.choice(
                [
                    ["RL.PIN", key],
                    ["RL.PIN", key, "1"],
                    ["RL.PIN", key, "BLOCK", "PX"],
                    ["RL.PIN", key, "BLOCK", "EX", "1"],
                    ["RL.PIN", key, "1", "1", "PX", "-1"],
                    ["RL.PIN", key, "PERMITS", "0"],
                    ["RL.PIN", key, "SHARES"],
                    ["RL.UNPIN"],
                    ["RL.PINNED", key, key],
                ]
            )
        return a

    def learn(self, v):
        if isinstance(v, int) and v > 1000:
            self.ids.append(str(v).encode())
        elif isinstance(v, list):
            for x in v:
                self.learn(x)


# ---------------------------------------------------------------------------------------


class Pair:
    def __init__(self, a, b):
        self.a, self.b = a, b
        self.ca = [a.conn(False), a.conn(True)]
        self.cb = [b.conn(False), b.conn(True)]
        self.history = []
        self.tally = {}
        self.pttl_slack = 0
        self.pins = True
        self.info = [a.conn(), b.conn()]

    def fail(self, what, x, y):
        tail = "\n".join(" ".join(map(str, h)) for h in self.history[-40:])
        raise Diff(f"{what} differs\n old: {x!r}\n new: {y!r}\nlast commands:\n{tail}")

    def both(self, args, which=0):
        self.history.append(args)
        ra, va = self.ca[which].call(*args)
        rb, _vb = self.cb[which].call(*args)
        if ra != rb:
            self.fail(f"reply to {args!r} (resp{3 if which else 2})", ra, rb)
        name = str(args[0]).upper()
        t = self.tally.setdefault(name, {})
        kind = (
            ra[:1].decode()
            if ra[:1] != b"-"
            else ra.split(b" ")[0].decode() + " " + ra.decode(errors="replace")[4:40]
        )
        t[kind] = t.get(kind, 0) + 1
        return va

    def dirty(self):
        def get(c):
            info = c.call("INFO", "persistence")[1].decode()
            return next(l for l in info.split("\r\n") if l.startswith("rdb_changes_since"))

        x, y = get(self.info[0]), get(self.info[1])
        if x != y:
            self.fail("dirty", x, y)

    def snapshot(self, namespaces):
        # Values freed in a background thread (Valkey frees deleted and flushed values
        # lazily by default) leave the INFO rl gauges when the thread gets to them.
        for c in self.info:
            deadline = time.time() + 30
            while b"lazyfree_pending_objects:0\r\n" not in c.call("INFO", "memory")[1]:
                if time.time() > deadline:
                    raise Diff("lazy frees never ended")
                time.sleep(0.01)
        ia = self.ca[0].call("INFO", "rl")[0]
        ib = self.cb[0].call("INFO", "rl")[0]
        if ia != ib:
            self.fail("INFO rl", ia, ib)
        for which in (0, 1):
            self.both(["RL.TOP", "1000"], which)
            self.both(["RL.STATS"], which)
            for ns in namespaces:
                self.both(["RL.STATS", ns], which)
        ka = sorted(self.ca[0].call("KEYS", "*")[1])
        kb = sorted(self.cb[0].call("KEYS", "*")[1])
        if ka != kb:
            self.fail("KEYS", ka, kb)
        for k in ka:
            for cmd in ("TYPE", "DUMP", "RL.PEEK") + (("RL.PINNED",) if self.pins else ()):
                self.both([cmd, k], 0)
            x = self.ca[0].call("PTTL", k)[1]
            y = self.cb[0].call("PTTL", k)[1]
            if abs(x - y) > self.pttl_slack:
                self.fail(f"PTTL of {k!r}", x, y)


def run(args):
    root = tempfile.mkdtemp(prefix="rl-equiv-")
    shim = os.path.join(root, "fakeclock.so")
    with open(os.path.join(root, "fakeclock.c"), "w") as f:
        f.write(SHIM)
    subprocess.check_call(
        ["cc", "-O2", "-shared", "-fPIC", "-o", shim, os.path.join(root, "fakeclock.c"), "-ldl"]
    )
    clock = os.path.join(root, "clock")
    now = 1_800_000_000_123_456_789
    with open(clock, "w") as f:
        f.write(str(now))
    servers = []

    def set_clock(ns):
        with open(clock + ".tmp", "w") as f:
            f.write(str(ns))
        os.replace(clock + ".tmp", clock)

    try:
        a = Server(args.server, args.old, root, "old", shim, clock)
        servers.append(a)
        b = Server(args.server, args.new, root, "new", shim, clock)
        servers.append(b)
        p = Pair(a, b)
        p.both(["CONFIG", "SET", "rl.adopt-script-keys", "yes"])
        if args.slow:
            p.pttl_slack = 10_000
        rng = random.Random(args.seed)
        p.pins = not args.no_pins
        g = Gen(rng, args.min_period, args.slow, p.pins)
        multi = None
        last_cmd = None
        for step in range(args.steps):
            if rng.random() < 0.02 and not args.slow:
                now += rng.choice([1, 999, 1_000_000, 300_000_000, 10**10, 10**13])
                set_clock(now)
            which = 1 if rng.random() < 0.3 else 0
            if multi is None and rng.random() < 0.03:
                multi = (which, rng.randrange(1, 6))
                p.both(["MULTI"], which)
            if rng.random() < 0.1 and last_cmd:
                cmd = last_cmd  # runs of one call: denials on one key in a row
            else:
                cmd = g.command()
            last_cmd = cmd
            w = multi[0] if multi else which
            v = p.both(cmd, w)
            g.learn(v)
            if multi:
                multi = (multi[0], multi[1] - 1)
                if multi[1] == 0:
                    g.learn(p.both([rng.choice(["EXEC", "EXEC", "DISCARD"])], multi[0]))
                    multi = None
            if multi is None:
                p.dirty()
            if step % 300 == 299 and multi is None:
                p.snapshot(g.ns + ["many1", "nope"])
        if multi:
            p.both(["EXEC"], multi[0])
        p.snapshot(g.ns + ["many1", "nope"])
        # Keys filled to their limits: 1024 leases, 10000 permits, 4096 holders.
        if args.bulk:
            for i in range(1030):
                p.both(["RL.LEASE", "bulk:lease", "1e-3", "1e6", "1", "86400000"], i % 2)
            p.both(["RL.RETURN", "bulk:lease", g.ids[-1].decode(), "1"])
            for i in range(10005):
                p.both(["RL.ACQUIRE", "bulk:sem", "10000", "86400000"], i % 2)
            for i in range(4100):
                p.both(["RL.SHARE", "bulk:share", "1e9", "1e9", f"h{i}", "1", "3600000"], i % 2)
            # The most-denied keys at small capacities: runs of denials on one key, other
            # keys between them, fading and renormalising (steps up to 11 hours).
            for topk in ["4", "1", "16"]:
                p.both(["CONFIG", "SET", "rl.top-keys", topk])
                for i in range(1500):
                    k = f"t:{rng.randrange(3) if rng.random() < 0.7 else rng.randrange(30)}"
                    for _ in range(rng.randrange(1, 8) if rng.random() < 0.3 else 1):
                        p.both(["RL.TAKE", k, "1e-9", "1"], rng.randrange(2))
                    if rng.random() < 0.02:
                        now += rng.choice([10**6, 10**9, 60 * 10**9, 40000 * 10**9])
                        set_clock(now)
                    if i % 50 == 0:
                        p.both(["RL.TOP", "1000"], rng.randrange(2))
            p.dirty()
            p.snapshot(["bulk", "t"])
        # The internal effects, as written, then mutated.
        effects = parse_aof(a.aof())
        effects = [e for e in effects if e[0].upper().startswith(b"RL.SET")]
        for e in effects[: args.steps // 4]:
            e = list(e)
            if rng.random() < 0.5 and len(e) > 2:
                i = rng.randrange(2, len(e))
                e[i] = rng.choice(
                    [
                        b"0",
                        b"-1",
                        b"1",
                        b"abc",
                        b"1e300",
                        b"99999999999999999999",
                        e[i] + b"0",
                        e[i][:-1],
                        b"nan",
                    ]
                )
            if rng.random() < 0.2:
                e[1] = g.key().encode()
            p.both(e, rng.randrange(2))
            p.dirty()
        p.snapshot(g.ns + ["many1", "nope"])
        for c in p.ca + p.cb:
            c.call("PING")
        aa, ab = a.aof(), b.aof()
        if aa != ab:
            la, lb = parse_aof(aa), parse_aof(ab)
            if args.reuse_expired:
                la, lb = without_expiry_deletes(la), without_expiry_deletes(lb)
            for i, (x, y) in enumerate(zip(la, lb)):
                if x != y:
                    p.fail(f"AOF entry {i}", x, y)
            if len(la) != len(lb):
                p.fail("AOF length", len(la), len(lb))
        # AOF rewrite (as commands, no RDB preamble): both rewrite to the same commands.
        for s in (a, b):
            c = s.conn()
            c.call("CONFIG", "SET", "aof-use-rdb-preamble", "no")
            c.call("BGREWRITEAOF")
        for s in (a, b):
            c = s.conn()
            deadline = time.time() + 60
            while (
                b"aof_rewrite_in_progress:0" not in c.call("INFO", "persistence")[1]
                or b"aof_rewrite_scheduled:0" not in c.call("INFO", "persistence")[1]
            ):
                if time.time() > deadline:
                    raise Diff("AOF rewrite never ended")
                time.sleep(0.05)
        ra, rb = base_aof(a), base_aof(b)
        if sorted(parse_aof(ra)) != sorted(parse_aof(rb)):
            la, lb = sorted(parse_aof(ra)), sorted(parse_aof(rb))
            for x, y in zip(la, lb):
                if x != y:
                    p.fail("rewritten AOF", x, y)
            p.fail("rewritten AOF length", len(la), len(lb))
        # A replica of the new build matches its master.
        rep = Server(
            args.server, args.new, root, "replica", shim, clock, ["--replicaof", "no", "one"]
        )
        servers.append(rep)
        rc = rep.conn()
        rc.call("REPLICAOF", "127.0.0.1", str(port_of(b)))
        deadline = time.time() + 60
        while True:
            info = rc.call("INFO", "replication")[1].decode()
            mo = b.conn().call("INFO", "replication")[1].decode()
            moff = [l for l in mo.split("\r\n") if l.startswith("master_repl_offset")]
            roff = [l for l in info.split("\r\n") if l.startswith("master_repl_offset")]
            if "master_link_status:up" in info and moff == roff:
                break
            if time.time() > deadline:
                raise Diff("replica never synced:\n" + info)
            time.sleep(0.1)
        # Keep writing through the master, then compare.
        for _ in range(args.steps // 4):
            cmd = g.command()
            # DEBUG RELOAD drops keys that expired without telling replicas (a server
            # matter, not the module's).
            if cmd[0].upper() in ("CONFIG", "DEBUG"):
                continue
            g.learn(p.cb[0].call(*cmd)[1])
        time.sleep(0.5)
        deadline = time.time() + 60
        while True:
            mo = b.conn().call("INFO", "replication")[1].decode()
            info = rc.call("INFO", "replication")[1].decode()
            moff = [l for l in mo.split("\r\n") if l.startswith("master_repl_offset")]
            roff = [l for l in info.split("\r\n") if l.startswith("master_repl_offset")]
            if moff == roff:
                break
            if time.time() > deadline:
                raise Diff("replica never caught up")
            time.sleep(0.1)
        mc = b.conn()
        keys = sorted(mc.call("KEYS", "*")[1])
        rkeys = sorted(rc.call("KEYS", "*")[1])
        if keys != rkeys:
            raise Diff(
                f"replica keys differ: master only {sorted(set(keys) - set(rkeys))!r}, replica only {sorted(set(rkeys) - set(keys))!r}"
            )
        for k in keys:
            x = mc.call("DEBUG", "DIGEST-VALUE", k)[0]
            y = rc.call("DEBUG", "DIGEST-VALUE", k)[0]
            if x != y:
                raise Diff(f"replica digest of {k!r}: {x!r} vs {y!r}")
        if args.verbose:
            print(b.conn().call("INFO", "rl")[1].decode().replace("\r\n", " "))
            for name, t in sorted(p.tally.items()):
                print(name, sorted(t.items(), key=lambda x: -x[1])[:12])
        print(
            f"seed {args.seed}: {args.steps} steps, {len(effects)} effects, "
            f"{len(keys)} keys: identical"
        )
    finally:
        for s in servers:
            s.stop()
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
        else:
            print("kept", root)


def without_expiry_deletes(entries):
    """`entries` without what a server's lazy expiry adds before a write to a key whose time
    passed: a `DEL`/`UNLINK` of a key whose next entry is an `RL.SETSTATE` of it (at once,
    or later in the same `MULTI`, as `RL.MTAKE` opens every key first), and a `MULTI`/`EXEC`
    left around a single command. A build that reuses the expired bucket in place (Redis 8+)
    sends the effect alone (`--reuse-expired`); the replica check still sees a `DEL` that
    was needed and went missing."""
    out = []
    for i, e in enumerate(entries):
        if e[0].upper() in (b"DEL", b"UNLINK") and len(e) == 2:
            nxt = next((x for x in entries[i + 1 :] if len(x) > 1 and x[1] == e[1]), None)
            if nxt is not None and nxt[0].upper() == b"RL.SETSTATE":
                continue
        out.append(e)
    flat = []
    i = 0
    while i < len(out):
        if (
            out[i][0].upper() == b"MULTI"
            and i + 2 < len(out)
            and out[i + 2][0].upper() == b"EXEC"
        ):
            flat.append(out[i + 1])
            i += 3
            continue
        flat.append(out[i])
        i += 1
    return flat


def base_aof(server):
    d = os.path.join(server.dir, "appendonlydir")
    return b"".join(
        open(os.path.join(d, f), "rb").read() for f in sorted(os.listdir(d)) if ".base." in f
    )


def port_of(server):
    c = server.conn()
    c.call("CONFIG", "SET", "repl-diskless-sync-delay", "0")  # the delay counts frozen seconds
    # A replica needs TCP: give the master a port.
    for _ in range(20):
        port = random.randrange(20000, 60000)
        r = c.call("CONFIG", "SET", "port", str(port))[1]
        if not isinstance(r, Exception):
            return port
    raise RuntimeError("no port")


def parse_aof(data):
    out, i = [], 0
    while i < len(data):
        if data[i : i + 1] != b"*":
            j = data.index(b"\n", i)
            i = j + 1
            continue
        j = data.index(b"\r\n", i)
        n = int(data[i + 1 : j])
        i = j + 2
        args = []
        for _ in range(n):
            j = data.index(b"\r\n", i)
            ln = int(data[i + 1 : j])
            args.append(data[j + 2 : j + 2 + ln])
            i = j + 2 + ln + 2
        out.append(tuple(args))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--server", default="redis-server")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--verbose", action="store_true")
    ap.add_argument(
        "--bulk",
        action="store_true",
        help="also fill keys to their limits (1024 leases, 10000 permits, 4096 holders)",
    )
    ap.add_argument(
        "--slow",
        action="store_true",
        help="for servers whose own clock runs on (Valkey: its time follows the "
        "monotonic clock): the module's clock never steps, nothing expires "
        "within the run, PTTL within 10 s",
    )
    ap.add_argument(
        "--reuse-expired",
        action="store_true",
        help="the new build reuses expired buckets in place where the old one had the "
        "server delete them (Redis 8+): the AOFs are compared without the DEL (and "
        "MULTI/EXEC) lazy expiry adds before a write",
    )
    ap.add_argument(
        "--min-period",
        type=int,
        default=1,
        help="RL.SHARE periods from (300 against builds before periods were raised)",
    )
    ap.add_argument(
        "--no-pins",
        action="store_true",
        help="no RL.PIN, RL.UNPIN or RL.PINNED (against builds before pins)",
    )
    a = ap.parse_args()
    try:
        run(a)
    except Diff as e:
        print(f"DIFFERENCE (seed {a.seed}): {e}")
        sys.exit(1)


if __name__ == "__main__":
    main()
