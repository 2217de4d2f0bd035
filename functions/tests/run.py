"""Tests of the redis-rl Functions library (functions/rl.lua). Run by scripts/test-functions.

Sections:
  alone          the library on a server without the module: every function, every reply shape
  lease_tables   the lease table appended to, pruned lazily, the 1024 bound exact
  forged_hashes  stored texts validate no call; a table without x
  foreign_hashes a hash that is not a bucket (a user's, the seed script's) is WRONGTYPE, untouched
  shadow         SHADOW: decided and written as when enforcing, answered as granted
  shares         rl_share alone: replies, key, expiry, errors, types, the 4096 bound
  cases          the golden protocol cases (protocol/cases) through FCALL, RESP2 and RESP3
  differential   module and library side by side, same random calls, RESP2 and RESP3
                 (rl_share against RL.SHARE too when the module has it)
  replication    effects reach a real replica equal (HGETALL, PEXPIRETIME); rl_peek there
  cluster        three masters; single keys anywhere, rl_mtake with hash tags, CROSSSLOT

No outcome depends on how fast the machine is (docs/functions.md, "Proven equal").

RL_SERVER: the server binary (default redis-server); RL_MODULE: the module (default
target/debug/libredis_rl.so); RL_FN_OPS: random calls per protocol (default 2500);
RL_FN_SEED: the random seed (default: time-based, printed).
"""

import json
import os
import re
import random
import struct
import sys
import time
import traceback
from pathlib import Path

import redis

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cases  # noqa: E402
import differential  # noqa: E402
from servers import MODULE, SERVER, Cluster, Server, bucket_fields, library_source  # noqa: E402

FAILED = []


def section(name):
    def wrap(f):
        def run(*a):
            started = time.time()
            print(f"== {name}", flush=True)
            try:
                f(*a)
                print(f"   ok ({time.time() - started:.1f} s)", flush=True)
            except Exception as e:  # report and go on to the next section
                FAILED.append(name)
                print(f"   FAILED: {type(e).__name__}: {e}", flush=True)
                traceback.print_exc(limit=-3)
        return run
    return wrap


def fcall(r, name, keys, *args):
    return r.execute_command("FCALL", name, len(keys), *keys, *args)


def has_command(r, name):
    """COMMAND INFO name is not empty."""
    conn = r.connection_pool.get_connection("COMMAND")
    try:  # raw: redis-py's COMMAND parser does not take a nil entry
        conn.send_command("COMMAND", "INFO", name)
        reply = conn.read_response()
    finally:
        r.connection_pool.release(conn)
    return bool(reply and reply[0])


def server_ms(r):
    """The server's clock, ms (TIME)."""
    sec, us = r.time()
    return sec * 1000 + us / 1000


def expires_after(r, key, call, ms):
    """Runs `call` and checks that `key` then expires `ms` after the server's clock at the
    call (PEXPIRETIME between TIME before + ms and TIME after + ms, rounded up): exact
    however long the call took. Returns the call's reply."""
    before = server_ms(r)
    reply = call()
    after = server_ms(r)
    at = r.pexpiretime(key)
    assert before + ms - 1 <= at <= after + ms + 1, (key, before, at, after, ms)
    return reply


def held(r, key):
    """A key's value exactly, and its expiry: a string's bytes, a hash's fields (not its DUMP:
    a replica may hold the same fields in another order), None for no key."""
    kind = r.type(key)
    if kind == b"string":
        return kind, r.get(key), r.pexpiretime(key)
    if kind == b"hash":
        return kind, r.hgetall(key), r.pexpiretime(key)
    assert kind == b"none", (key, kind)
    return None


def wait_for(what, check, deadline_s=30.0):
    """Polls `check` until it holds: a state to reach, not a time to sleep."""
    deadline = time.time() + deadline_s
    while not check():
        assert time.time() < deadline, f"not reached in {deadline_s} s: {what}"
        time.sleep(0.005)


def err(r, *cmd):
    try:
        r.execute_command(*cmd)
    except redis.ResponseError as e:
        return str(e)
    raise AssertionError(f"{cmd} did not fail")


# Each command's usage, as the module's command table declares it.
USAGE = {c["name"]: c["usage"] for c in json.loads(
    (Path(__file__).resolve().parents[2] / "protocol" / "commands.json").read_text())["commands"]}


@section("usage texts agree with protocol/commands.json")
def usage_texts():
    lua = (Path(__file__).resolve().parents[1] / "rl.lua").read_text()
    table = dict(re.findall(r"\['(RL\.[A-Z]+)'\] = '([^']*)'", lua))
    assert table, "no USAGE table in rl.lua"
    for name, usage in table.items():
        assert USAGE.get(name) == usage, (name, usage, USAGE.get(name))


@section("library alone (no module)")
def alone():
    with Server() as s:
        assert s.load_library() == b"rl"
        r2, r3 = s.client(), s.client(protocol=3)
        assert not has_command(r2, "RL.TAKE")
        # TAKE: the README's example, both protocols (a new key: exact).
        assert fcall(r2, "rl_take", ["u"], 2, 10, 3, "WITHSTATE") == [3, b"7", 0, 1500]
        assert fcall(r3, "rl_take", ["u3"], 2, 10, 3, "WITHSTATE") == [3, 7.0, 0, 1500]
        # The rest on a bucket refilling one token in 1000 s: nothing refills meanwhile,
        # however slow the machine.
        slow = (0.001, 10)
        assert expires_after(r2, "s", lambda: fcall(r2, "rl_take", ["s"], *slow, 3),
                             3_000_000) == 3  # ceil_ms of a µs instant: full again in 3000 s
        assert fcall(r2, "rl_take", ["s"], *slow, 8) == 0
        g, rem, retry, reset = fcall(r2, "rl_take", ["s"], *slow, 8, "WITHSTATE")
        assert g == 0 and 7 <= float(rem) < 7.01 and 990_000 < retry <= 1_000_000
        assert 2_990_000 < reset <= 3_000_000
        # A plain bucket is a string (value and expiry in one SET ... PXAT).
        assert r2.type("s") == b"string" and set(bucket_fields(r2, "s")) == {b"f", b"r", b"c"}
        # Denied calls write nothing: the stored state is unchanged.
        before = r2.dump("s"), r2.pexpiretime("s")
        fcall(r2, "rl_take", ["s"], *slow, 9)
        assert (r2.dump("s"), r2.pexpiretime("s")) == before
        # INIT stores a bucket created below full even when denied.
        assert expires_after(r2, "w", lambda: fcall(r2, "rl_take", ["w"], 1, 10, 5, "INIT", 0),
                             10_000) == 0
        # Lease, renew with RETURN, return, once.
        got, lid, ttl, retry = fcall(r2, "rl_lease", ["l"], *slow[:1], 100, 20, 60000)
        assert (got, ttl, retry) == (20, 60000, 0) and lid > 1_600_000_000_000_000
        got2, lid2, _, _ = fcall(r2, "rl_lease", ["l"], 0.001, 100, 20, 60000, "RETURN", lid, 5)
        assert got2 == 20 and lid2 > lid
        peek = fcall(r3, "rl_peek", ["l"])
        assert peek[b"leases"] == 1 and peek[b"leased_tokens"] == 20 and peek[b"cap"] == 100.0
        assert fcall(r2, "rl_return", ["l"], lid, 5) == 0  # already settled
        assert fcall(r2, "rl_return", ["l"], lid2, 50) == 20
        assert fcall(r2, "rl_return", ["l"], lid2, 50) == 0
        # MTAKE all or nothing, denied_by is the key.
        assert fcall(r2, "rl_mtake", ["a", "b"], 3, 0.001, 5, 0.001, 3) == [3, None, 0]
        g, by, retry = fcall(r2, "rl_mtake", ["a", "b"], 2, 0.001, 5, 0.001, 3)
        assert g == 0 and by == b"b" and 1_990_000 < retry <= 2_000_000
        assert fcall(r2, "rl_peek", ["missing"]) is None
        # Errors.
        assert err(r2, "FCALL", "rl_take", 1, "e", "x", 1) == "rate is not a number"
        assert err(r2, "FCALL", "rl_take", 1, "e", 1) == \
            "wrong number of arguments for 'RL.TAKE' command; usage: " + USAGE["RL.TAKE"]
        assert err(r2, "FCALL", "rl_take", 1, "e", 1, 1, 1, "FOO") == "unknown option 'FOO'"
        # redis-cell's max_burst count period: the same limit, as the module words it; none
        # where the suggested call would be refused too.
        assert err(r2, "FCALL", "rl_take", 1, "e", 15, 30, 60) == (
            "n must not exceed cap (if these are redis-cell's max_burst count period, the same "
            "limit here is RL.TAKE key 0.5 16: rate in tokens per second, cap = max_burst + 1)")
        assert err(r2, "FCALL", "rl_take", 1, "e", 1, 0.001, 9007199254740991) == \
            "n must not exceed cap"
        # 1024 live leases, then the error.
        pipe = r2.pipeline(transaction=False)
        for _ in range(1024):
            pipe.execute_command("FCALL", "rl_lease", 1, "many", 1e6, 1e6, 1, 60000)
        assert all(x[0] == 1 for x in pipe.execute())
        assert err(r2, "FCALL", "rl_lease", 1, "many", 1e6, 1e6, 1, 60000) == \
            "too many live leases on this key (at most 1024)"
        # RESERVE: grant now, then into debt within max_wait, then deny (one token per
        # 1000 s: the waits are exact to the refill of the test's own duration).
        assert fcall(r2, "rl_reserve", ["rv"], 0.001, 2, 2, 0)[:2] == [2, 0]
        g, wait, rem, reset = fcall(r2, "rl_reserve", ["rv"], 0.001, 2, 1, 1_500_000)
        assert g == 1 and 990_000 < wait <= 1_000_000 and -1.01 < float(rem) < -0.99
        assert 2_990_000 < reset <= 3_000_000
        g, wait, rem, _ = fcall(r2, "rl_reserve", ["rv"], 0.001, 2, 1, 1_500_000)
        assert g == 0 and 1_990_000 < wait <= 2_000_000 and -1.01 < float(rem) < -0.99
        assert fcall(r2, "rl_take", ["rv"], 0.001, 2) == 0  # later callers queue behind
        # Debt is visible (PEEK tokens negative); a bucket in debt takes nothing back (its
        # coming tokens are promised).
        assert -1.01 < float(fcall(r3, "rl_peek", ["rv"])[b"tokens"]) < -0.99
        assert float(fcall(r2, "rl_refund", ["rv"], 1)) == 0.0
        assert -1.01 < float(fcall(r3, "rl_peek", ["rv"])[b"tokens"]) < -0.99
        # Once paid by time, refunds credit what the bucket lacks, never above cap: 10
        # tokens/s, a debt of 1 paid in 0.1 s, full again 100 s after.
        assert fcall(r2, "rl_reserve", ["rp"], 10, 1000, 1000, 0)[0] == 1000
        assert fcall(r2, "rl_reserve", ["rp"], 10, 1000, 1, 1000)[0] == 1
        wait_for("debt paid", lambda: float(fcall(r3, "rl_peek", ["rp"])[b"tokens"]) >= 0)
        level = float(fcall(r3, "rl_peek", ["rp"])[b"tokens"])
        got = float(fcall(r2, "rl_refund", ["rp"], 5000))
        assert 0 < got <= 1000 - level, (got, level)
        assert not r2.exists("rp")  # full again, no lease, no hold: deleted
        assert float(fcall(r2, "rl_refund", ["nothing"], 1)) == 0.0
        # A limit change holds the key (field h) until the bucket would have been full under
        # the old limit: back on it, a caller finds the tokens, not an absent (full) bucket.
        assert fcall(r2, "rl_take", ["hd"], 1, 1000, 999) == 999
        assert expires_after(r2, "hd", lambda: fcall(r2, "rl_take", ["hd"], 1000, 10, 1),
                             1_000_000) == 1  # the old limit's fill time: 1000 s
        assert r2.hexists("hd", "h")
        time.sleep(0.03)  # full under the small limit by now (10 ms)
        g, rem, _, _ = fcall(r2, "rl_take", ["hd"], 1, 1000, 500, "WITHSTATE")
        assert g == 0 and 10 <= float(rem) < 500, rem  # 10 carried over, not 1000
        # PERSIST (or RESTORE ... 0): the next write sets the expiry again.
        r2.persist("hd")
        assert fcall(r2, "rl_take", ["hd"], 1, 1000, 1) == 1 and r2.pttl("hd") > 0
        r2.restore("hd", 0, r2.dump("hd"), replace=True)
        assert r2.pttl("hd") == -1
        assert fcall(r2, "rl_take", ["hd"], 1, 1000, 1) == 1 and r2.pttl("hd") > 0
        # Every write moves the hold on: span after the write (a span of 100 s).
        assert fcall(r2, "rl_take", ["hm"], 1, 100, 50) == 50
        assert fcall(r2, "rl_take", ["hm"], 100000, 2, 1) == 1
        assert r2.hget("hm", "s") == b"100000000000"  # the old limit's fill time, ns
        h1 = int(r2.hget("hm", "h"))
        time.sleep(0.03)
        assert fcall(r2, "rl_take", ["hm"], 100000, 2, 1) == 1
        assert int(r2.hget("hm", "h")) >= h1 + 29_000_000
        # A passed hold goes (HDEL h s): a span of 100 ms, then a write once it has passed.
        assert fcall(r2, "rl_take", ["hp"], 1000, 100, 50) == 50
        assert fcall(r2, "rl_take", ["hp"], 100000, 2, 1) == 1 and r2.hexists("hp", "h")
        assert r2.hget("hp", "s") == b"100000000"
        hold = int(r2.hget("hp", "h"))
        wait_for("the hold passed", lambda: server_ms(r2) * 1e6 > hold + 1e6)
        assert fcall(r2, "rl_take", ["hp"], 100000, 2, 1) == 1
        assert b"h" not in bucket_fields(r2, "hp") and b"s" not in bucket_fields(r2, "hp")
        # RETURN to full keeps a held key.
        got, lid, _, _ = fcall(r2, "rl_lease", ["hr"], 1, 100, 5, 60000)
        assert fcall(r2, "rl_take", ["hr"], 1000, 100, 1) == 1
        time.sleep(0.02)  # full again under the new limit: only the hold keeps the key
        assert fcall(r2, "rl_return", ["hr"], lid, 5) == 0
        assert r2.exists("hr") and r2.hexists("hr", "h") and not r2.hexists("hr", "l")
        # (on `hd`, which lives long: `u` may have expired on a slow machine by now)
        # no-writes: rl_peek through FCALL_RO; a write function is refused there.
        assert r2.execute_command("FCALL_RO", "rl_peek", 1, "hd") is not None
        assert "write flag" in err(r2, "FCALL_RO", "rl_take", 1, "hd", 1, 1)
        # OOM: the write functions are refused (no allow-oom); rl_peek still answers.
        r2.config_set("maxmemory", 1)
        assert "maxmemory" in err(r2, "FCALL", "rl_take", 1, "hd", 1, 1)
        assert r2.execute_command("FCALL", "rl_peek", 1, "hd") is not None
        r2.config_set("maxmemory", 0)


@section("budgets: a debt charged under a slow pin does not outlive it")
def budget_pins():
    with Server() as s:
        s.load_library()
        r = s.client()
        for pin_rate, pin_cap in (("1e-9", "1"), ("0.001", "1"), ("1000", "1000")):
            key = f"x{pin_rate}"
            granted, rid, _, _ = fcall(r, "rl_budget", [key], 60000, 10, 100, 10)
            assert granted == 1
            fcall(r, "rl_pin", [key], pin_rate, pin_cap)
            (charged,) = fcall(r, "rl_settle", [key], rid, 1000)
            assert charged <= 0, charged
            fcall(r, "rl_unpin", [key])
            # Its own limit fills in 10 s: at most 20 s owed (and the key expires then).
            pttl = r.pttl(key)
            assert pttl <= 20_000, (pin_rate, pin_cap, pttl)


def entries(r, key):
    """The lease table's entries as stored (live and expired): (id, tokens, expiry_us)."""
    text = (r.hget(key, "l") or b"").decode()
    return [tuple(int(x) for x in e.split(":")) for e in text.split(",") if e]


@section("lease tables: appended, expired entries dropped lazily, the bound exact")
def lease_tables():
    """rl_lease appends to a short table without parsing it: it drops only the expired
    entries at its front, and leaves others (a short TTL among long ones) for the call
    that finds the table long (4096 characters), which prunes it all. Expired entries
    must count for nothing anywhere: PEEK, RETURN, the 1024 bound, the ids."""
    with Server() as s:
        s.load_library()
        r2, r3 = s.client(), s.client(protocol=3)
        # A short TTL between long ones: kept in the table, counted nowhere.
        a = fcall(r2, "rl_lease", ["t"], 1, 1000, 5, 60000)[1]
        b = fcall(r2, "rl_lease", ["t"], 1, 1000, 7, 30)[1]
        c = fcall(r2, "rl_lease", ["t"], 1, 1000, 11, 60000)[1]
        assert a < b < c
        time.sleep(0.06)
        peek = fcall(r3, "rl_peek", ["t"])
        assert peek[b"leases"] == 2 and peek[b"leased_tokens"] == 16, peek
        assert fcall(r2, "rl_return", ["t"], b, 7) == 0  # expired: nothing back
        d = fcall(r2, "rl_lease", ["t"], 1, 1000, 13, 60000)[1]
        assert d > c
        assert [e[0] for e in entries(r2, "t")] == [a, b, c, d]  # b: not at the front
        e = fcall(r2, "rl_lease", ["t"], 1, 1000, 17, 20)[1]
        f = fcall(r2, "rl_lease", ["t"], 1, 1000, 1, 60000)[1]
        time.sleep(0.04)
        fcall(r2, "rl_lease", ["t"], 1, 1000, 1, 60000)
        assert e in [x[0] for x in entries(r2, "t")]  # not at the front: still stored
        peek = fcall(r3, "rl_peek", ["t"])
        assert peek[b"leases"] == 5 and peek[b"leased_tokens"] == 5 + 11 + 13 + 1 + 1, peek
        # RETURN of a live lease writes: it prunes the table whole.
        assert fcall(r2, "rl_return", ["t"], a, 5) == 5
        assert [x[0] for x in entries(r2, "t")] == [c, d, f, entries(r2, "t")[-1][0]]
        assert f > e
        # Expired entries at the front go on the next lease.
        r2.delete("p")
        for _ in range(5):
            fcall(r2, "rl_lease", ["p"], 1, 1000, 1, 30)
        time.sleep(0.05)
        g = fcall(r2, "rl_lease", ["p"], 1, 1000, 1, 60000)[1]
        assert [x[0] for x in entries(r2, "p")] == [g]
        # Every lease expired: the table goes, the id still grows (field i).
        time.sleep(0.001)
        r2.delete("q")
        q1 = fcall(r2, "rl_lease", ["q"], 1000000, 1000000, 1, 1)[1]
        time.sleep(0.01)
        q2 = fcall(r2, "rl_lease", ["q"], 1000000, 1000000, 1, 60000)[1]
        assert q2 > q1 and [x[0] for x in entries(r2, "q")] == [q2]
        # A long table is pruned whole. 100 leases of 1 ms behind a long one: expired, but
        # kept while the table is short (not at its front); then long leases until the
        # table reaches 4096 characters: the call that finds it that long drops them all.
        pipe = r2.pipeline(transaction=False)
        pipe.execute_command("FCALL", "rl_lease", 1, "m", 1e6, 1e6, 1, 60000)
        for _ in range(100):
            pipe.execute_command("FCALL", "rl_lease", 1, "m", 1e6, 1e6, 1, 1)
        pipe.execute()
        last = max(e[2] for e in entries(r2, "m") if e[2] < entries(r2, "m")[0][2])
        wait_for("the short leases expired", lambda: server_ms(r2) * 1000 > last)
        fcall(r2, "rl_lease", ["m"], 1e6, 1e6, 1, 60000)
        assert len(entries(r2, "m")) == 102 and len(r2.hget("m", "l")) < 4096
        longs = 2
        while len(r2.hget("m", "l")) < 4096:
            fcall(r2, "rl_lease", ["m"], 1e6, 1e6, 1, 60000)
            longs += 1
            assert len(entries(r2, "m")) == longs + 100
        fcall(r2, "rl_lease", ["m"], 1e6, 1e6, 1, 60000)
        assert len(entries(r2, "m")) == longs + 1, len(entries(r2, "m"))
        # The bound counts live leases only: 1024 live ones behind 200 expired ones.
        pipe = r2.pipeline(transaction=False)
        for _ in range(200):
            pipe.execute_command("FCALL", "rl_lease", 1, "b", 1e6, 1e6, 1, 20)
        pipe.execute()
        time.sleep(0.03)
        pipe = r2.pipeline(transaction=False)
        for _ in range(1024):
            pipe.execute_command("FCALL", "rl_lease", 1, "b", 1e6, 1e6, 1, 60000)
        assert all(x[0] == 1 for x in pipe.execute())
        assert err(r2, "FCALL", "rl_lease", 1, "b", 1e6, 1e6, 1, 60000) == \
            "too many live leases on this key (at most 1024)"
        assert fcall(r3, "rl_peek", ["b"])[b"leases"] == 1024


@section("forged hashes: stored texts validate no call; a table without x")
def forged_hashes():
    """A hash written by something else than the library (HSET) is read as it is, but it
    must not change how other calls are checked: the library remembers the limits it has
    validated by their texts (LIMITS) and trusts them without checking again, so a stored
    limit read from such a hash (rl_peek, rl_return, rl_refund, a call with another limit)
    must not land there. And a lease table without its `x` is parsed whole, not appended
    to (else the key's expiry would be the new lease's, before older leases end)."""
    with Server() as s:
        s.load_library()
        r = s.client()
        rate_err = "rate must be a finite number between 1e-9 and 1e15"
        cap_err = "cap must be a finite number between 1e-9 and 1e15"
        for rt, ct, want in [("0", "1", rate_err), ("1e-12", "1e15", rate_err),
                             ("1", "0", cap_err), ("0x10", "100", "rate is not a number"),
                             (" 5", "100", "rate is not a number"),
                             ("1e-9", "1e15", "cap / rate must be at most 100 years")]:
            r.delete("forged")
            r.hset("forged", mapping={"f": "1", "r": rt, "c": ct})
            # Each reads the stored limit, and refuses the key as not a bucket, writing
            # nothing (a rate of 0 used to make rl_take write f, then fail at PEXPIREAT on
            # Redis >= 7.2: a partial write).
            before = r.hgetall("forged")
            for cmd in (["rl_peek"], ["rl_refund", 1], ["rl_take", 10, 100, 1],
                        ["rl_take", 10, 100, 1, "WITHSTATE"], ["rl_lease", 10, 100, 1, 1000],
                        ["rl_reserve", 10, 100, 1, 0]):
                got = err(r, "FCALL", cmd[0], 1, "forged", *cmd[1:])
                assert "the hash at this key is not a bucket" in got, (cmd, got)
            assert r.hgetall("forged") == before and r.pttl("forged") == -1
            for cmd in (["rl_lease", 1, "z", rt, ct, 1, 1000], ["rl_take", 1, "z", rt, ct, 1],
                        ["rl_take", 1, "z", rt, ct], ["rl_lease", 1, "z", rt, ct, 1, 1000,
                                                      "MIN", 1],
                        ["rl_reserve", 1, "z", rt, ct, 1, 0],
                        ["rl_mtake", 1, "z", 1, rt, ct]):
                got = err(r, "FCALL", *cmd)
                assert got == want, (rt, ct, cmd, got)
            assert not r.exists("z")
        # An `f` that is no instant: refused the same way (it gave a raw Lua error when
        # longer than 9 characters), nothing written.
        for ft in ["abcdefghijkl", "", "-5", "12345678901.5"]:
            r.delete("forged")
            r.hset("forged", mapping={"f": ft, "r": "10", "c": "100"})
            before = r.hgetall("forged")
            for cmd in (["rl_peek"], ["rl_refund", 1], ["rl_take", 10, 100, 1],
                        ["rl_lease", 10, 100, 1, 1000], ["rl_reserve", 10, 100, 1, 0]):
                got = err(r, "FCALL", cmd[0], 1, "forged", *cmd[1:])
                assert "not a bucket of this library (its field f" in got, (ft, cmd, got)
            got = err(r, "FCALL", "rl_mtake", 2, "ok", "forged", 1, 10, 100, 10, 100)
            assert "not a bucket" in got and not r.exists("ok"), got
            assert r.hgetall("forged") == before
        # `x` gone (HDEL): the next lease does not take its own expiry for the table's.
        r.delete("t")
        fcall(r, "rl_lease", ["t"], 10, 100, 5, 60000)
        first = entries(r, "t")[0][2]
        r.hdel("t", "x")
        fcall(r, "rl_lease", ["t"], 10, 100, 1, 50)
        assert r.pexpiretime("t") * 1000 >= first, (r.pexpiretime("t"), first)
        assert int(r.hget("t", "x")) == max(e[2] for e in entries(r, "t"))


# Every function on a key, with arguments that would write if the key were a bucket.
EVERY_FUNCTION = [["rl_take", 5, 10], ["rl_take", 5, 10, 1, "WITHSTATE"],
                  ["rl_take", 5, 10, 1, "SHADOW"], ["rl_lease", 5, 10, 1, 60000],
                  ["rl_lease", 5, 10, 1, 60000, "RETURN", 1, 1], ["rl_return", 1, 1],
                  ["rl_reserve", 5, 10, 1, 1000], ["rl_refund", 1], ["rl_peek"],
                  ["rl_take", 5, 10, 1, "INIT", 0], ["rl_take", 5, 10, 1, "VERSION", 3]]


def refused_by(r, key, why, cmds):
    """Each of `cmds` refuses `key` (WRONGTYPE naming `why`) and leaves it as it was: same
    type and value, no expiry set."""
    kind, dump, expiry = r.type(key), r.dump(key), r.pexpiretime(key)
    for cmd in cmds:
        got = err(r, "FCALL", cmd[0], 1, key, *cmd[1:])
        assert got.startswith("WRONGTYPE") and why in got, (key, cmd, got)
    assert r.type(key) == kind and r.dump(key) == dump and r.pexpiretime(key) == expiry, key


def refused_everywhere(r, key, why):
    """Every function refuses `key` (see refused_by), FCALL_RO rl_peek and rl_mtake too,
    with the key first or second (all or nothing: the other bucket is not written)."""
    refused_by(r, key, why, EVERY_FUNCTION)
    got = err(r, "FCALL_RO", "rl_peek", 1, key)
    assert got.startswith("WRONGTYPE") and why in got, (key, got)
    for keys in ([key, "fresh"], ["fresh", key]):
        got = err(r, "FCALL", "rl_mtake", 2, *keys, 1, 5, 10, 5, 10)
        assert got.startswith("WRONGTYPE") and why in got, (keys, got)
        assert not r.exists("fresh")


@section("pins alone: the field p checked, a pin ended goes at the next write")
def pins_alone():
    """A hash whose p is not a pin this library writes is refused everywhere, untouched; a
    key that holds only a pin reads as absent; a pin with PX ends by itself and its field
    goes at the next write, the key's expiry then its bucket's again."""
    with Server() as s:
        s.load_library()
        r = s.client()
        for i, bad in enumerate(["x", "4 0 0", "1 0 0", "2 0 0 5 10", "2 -1 0", "3 0 2",
                                 "1 0 0 x 10", "2 12345678901234567890 0"]):
            r.hset(f"badpin{i}", mapping={"f": "1", "r": "5", "c": "10", "p": bad})
            why = "not a valid limit" if "x" in bad[1:] else "its field p is not a pin"
            refused_everywhere(r, f"badpin{i}", why)
            for fn in ("rl_pin", "rl_unpin", "rl_pinned"):
                args = ["BLOCK"] if fn == "rl_pin" else []
                got = err(r, "FCALL", fn, 1, f"badpin{i}", *args)
                assert got.startswith("WRONGTYPE"), (fn, bad, got)
        r.hset("pinover", mapping={"p": "2 0 0"})  # a pin over nothing must say absent
        refused_everywhere(r, "pinover", "it has a pin over no field f")
        r.hset("onlypin", mapping={"p": "3 0 1"})
        assert fcall(r, "rl_peek", ["onlypin"]) is None
        assert fcall(r, "rl_take", ["onlypin"], 1, 1, 1, "WITHSTATE")[4] == b"exempt"
        assert fcall(r, "rl_return", ["onlypin"], 1, 1) == 0
        # A rate pin over nothing: RL.PINNED names its own limit (the module's reply).
        fcall(r, "rl_pin", ["onlyrate"], "0.5", "20")
        got = fcall(r, "rl_pinned", ["onlyrate"])  # a map: its order is the server's
        assert dict(zip(got[0::2], got[1::2])) == \
            {b"ms_left": -1, b"kind": b"rate", b"rate": b"0.5", b"cap": b"20"}, got
        # PX: ends by itself; the next write drops p and sets the bucket's expiry.
        fcall(r, "rl_take", ["px"], 1, 10, 5)
        # The pin and the checks in one transaction: on a loaded machine more than the pin's
        # 50 ms can pass between two round trips (this check failed so under two busy loops).
        pipe = r.pipeline(transaction=True)
        pipe.execute_command("FCALL", "rl_pin", 1, "px", 1, 2, "PX", 50)
        pipe.pttl("px")
        pipe.hexists("px", "p")
        pinned, ttl, has_p = pipe.execute()
        assert pinned in (b"OK", "OK", True) and ttl > 0 and has_p, (pinned, ttl, has_p)
        time.sleep(0.08)  # the pin has ended by then, however slow the machine
        assert fcall(r, "rl_pinned", ["px"]) is None
        assert len(fcall(r, "rl_take", ["px"], 1, 10, 1, "WITHSTATE")) == 4
        assert not r.hexists("px", "p") and r.pttl("px") > 0
        # A pin without an end: no expiry, even after PERSIST and a write.
        fcall(r, "rl_pin", ["forever"], "BLOCK")
        assert r.pttl("forever") == -1
        fcall(r, "rl_pin", ["forever"], 5, 5)
        fcall(r, "rl_take", ["forever"], 1, 1)
        assert r.pttl("forever") == -1 and fcall(r, "rl_unpin", ["forever"]) == 1
        # Back under the caller's limit (1/s, cap 1): the pin started the key with the
        # caller's 1 token (never the pin's 5), the take spent it, so the key lives until
        # it is full again, at most 1 s (or is already gone on a slow machine): never kept.
        left = r.pttl("forever")
        assert left == -2 or 0 < left <= 1001, left  # (expiries round up to the ms)


@section("pinning is an operator's: rl_pin/rl_unpin need CONFIG SET; errors without ERR ERR")
def pin_acl():
    """A function has no ACL category and ACL rules cannot name one, so the library holds
    rl_pin and rl_unpin to the module's setters' rule: the caller may run CONFIG SET. An
    application with `+@all -@admin -@dangerous` can take but not pin, and a refused write
    inside a function answers the server's error once (no doubled `ERR ERR`)."""
    with Server() as s:
        s.load_library()
        admin = s.client()
        admin.execute_command("ACL", "SETUSER", "app", "on", "nopass", "~*", "+@all",
                              "-@admin", "-@dangerous")
        admin.execute_command("ACL", "SETUSER", "reader", "on", "nopass", "~*", "+@all",
                              "-@write", "-@admin", "-@dangerous")
        app, reader = s.client(), s.client()
        app.execute_command("AUTH", "app", "x")
        reader.execute_command("AUTH", "reader", "x")
        assert fcall(admin, "rl_pin", ["pinned"], "BLOCK") in (b"OK", "OK", True)
        for fn, key, args in [("rl_pin", "k", ["EXEMPT"]), ("rl_pin", "k", [1000, 1000]),
                              ("rl_pin", "pinned", ["EXEMPT"]), ("rl_unpin", "pinned", [])]:
            got = err(app, "FCALL", fn, 1, key, *args)
            assert got.startswith(f"{fn} is an operator's command") and "CONFIG SET" in got, got
        assert not admin.exists("k") and fcall(admin, "rl_pinned", ["pinned"]) is not None
        assert fcall(app, "rl_pinned", ["pinned"]) is not None  # reading stays open
        assert fcall(app, "rl_take", ["t"], 10, 10) == 1
        assert fcall(admin, "rl_unpin", ["pinned"]) == 1
        # A user without write permission: the server's refusal, its prefix once.
        got = err(reader, "FCALL", "rl_take", 1, "t", 10, 10)
        assert not got.startswith("ERR ERR") and not got.startswith("ERR "), got
        assert "can't run this command" in got or "no permissions" in got, got


@section("foreign hashes: a hash that is not a bucket is WRONGTYPE, untouched")
def foreign_hashes():
    """A hash the library did not write (a user's record, the seed script's bucket) must
    never be read as an absent (full) bucket: that answered a grant, added f r c to the
    user's hash and set an expiry on it, and the hash was gone a moment later."""
    with Server() as s:
        s.load_library()
        r = s.client()
        r.hset("user:42", mapping={"name": "alice", "email": "a@example.com"})
        refused_everywhere(r, "user:42", "not a bucket of this library (it has no field f)")
        # Strings: a user's, and ones shaped like a string bucket but not one this library
        # writes (its packed full_at: 12 bytes, whole seconds below 1e10, ns below 1e9), get
        # the server's own WRONGTYPE; a string bucket with an invalid limit names it.
        wrong = "Operation against a key holding the wrong kind of value"
        now_s = r.time()[0]
        for i, value in enumerate([b"1", b"rl:5:10:", b"rl:5:10:" + b"1" * 19,
                                   b"rl:5:10:" + struct.pack("<dI", now_s, 0)[:11],
                                   b"rl:5:10:" + struct.pack("<dI", now_s + 0.5, 0),
                                   b"rl:5:10:" + struct.pack("<dI", now_s, 10**9),
                                   b"rl:5:10:" + struct.pack("<dI", 1e10, 0),
                                   b"rl:5:10:" + struct.pack("<dI", -1, 0)]):
            r.set(f"str{i}", value)
            refused_everywhere(r, f"str{i}", wrong)
            assert r.get(f"str{i}") == value
        for i, (rt, ct) in enumerate([(b"0", b"10"), (b"5", b"x"), (b"1e-12", b"1")]):
            r.set(f"badlimit{i}", b"rl:" + rt + b":" + ct + b":" + struct.pack("<dI", now_s, 7))
            refused_everywhere(r, f"badlimit{i}", "its fields r, c are not a valid limit")
        assert r.hgetall("user:42") == {b"name": b"alice", b"email": b"a@example.com"}
        # One field, named like one of the library's.
        for field in ("f", "r", "c", "l", "x", "i", "v", "h", "s"):
            r.delete("one")
            r.hset("one", field, "1")
            refused_everywhere(r, "one", "not a bucket of this library")
        # The seed script's hash (scripts/token_bucket.lua: tokens, ts in seconds): refused,
        # not read as a full bucket (it granted 50 of an empty legacy bucket), and the error
        # says what it is and what to do.
        now = r.time()
        r.hset("legacy", mapping={"tokens": "0", "ts": f"{now[0]}.{now[1]:06d}"})
        refused_everywhere(r, "legacy", "the seed script's bucket (fields tokens, ts)")
        # A library bucket whose other fields are not the library's numbers: refused by
        # every call that reads them, before anything is written (they gave raw Lua errors,
        # or a key expiring before its leases).
        reads_leases = [c for c in EVERY_FUNCTION
                        if c[0] in ("rl_lease", "rl_return", "rl_peek", "rl_refund")]
        reads_version = [["rl_peek"], ["rl_take", 5, 10, 1, "VERSION", 3],
                         ["rl_take", 5, 100, 1], ["rl_lease", 5, 10, 1, 100, "VERSION", 0]]
        for field, bad, cmds in [
                ("h", "soon", None), ("s", "x1", None), ("h", "", None), ("x", "later", None),
                ("x", "-5", None), ("f", "1" * 20, None), ("r", "0", None), ("c", "x", None),
                ("i", "abc", reads_leases), ("i", "1.5", reads_leases),
                ("v", "two", reads_version), ("v", "9007199254740992", reads_version)]:
            r.delete("bent")
            fcall(r, "rl_lease", ["bent"], 5, 10, 1, 60000)
            fcall(r, "rl_take", ["bent"], 1, 10, 1)  # a limit change: h and s are stored
            r.hset("bent", field, bad)
            if cmds is None:
                refused_everywhere(r, "bent", "not a bucket of this library")
            else:
                refused_by(r, "bent", "not a bucket of this library", cmds)
        # Other types: the server's own WRONGTYPE, unchanged.
        r.set("str", "1")
        wrong = "WRONGTYPE Operation against a key holding the wrong kind of value"
        for cmd in EVERY_FUNCTION:
            assert err(r, "FCALL", cmd[0], 1, "str", *cmd[1:]) == wrong, cmd
        assert r.get("str") == b"1"
        # A key that is absent is a full bucket: created, then read as a bucket.
        assert fcall(r, "rl_take", ["new"], 5, 10, 3) == 3
        assert fcall(r, "rl_peek", ["gone"]) is None
        assert fcall(r, "rl_return", ["gone"], 1, 1) == 0
        assert float(fcall(r, "rl_refund", ["gone"], 1)) == 0.0
        assert not r.exists("gone")


@section("SHADOW: decided and written as when enforcing, answered as granted")
def shadow():
    """RL.TAKE / RL.LEASE / RL.MTAKE / RL.RESERVE's per-call SHADOW: the decision and the
    writes are the enforcing call's (a denial writes nothing), the reply is a grant (a
    lease under no id, a reservation with no wait)."""
    with Server() as s:
        s.load_library()
        r2, r3 = s.client(), s.client(protocol=3)
        slow = (0.001, 10)  # one token per 1000 s: nothing refills during the test
        # Granted: the same reply and write as without SHADOW.
        assert fcall(r2, "rl_take", ["t"], *slow, 4, "SHADOW") == 4
        assert fcall(r2, "rl_take", ["e"], *slow, 4) == 4
        assert r2.type("t") == r2.type("e") and b"f" in bucket_fields(r2, "t")
        assert bucket_fields(r2, "t").keys() == bucket_fields(r2, "e").keys()
        # Denied: answered as granted, nothing written, the wait not shown.
        before = r2.dump("t"), r2.pexpiretime("t")
        assert fcall(r2, "rl_take", ["t"], *slow, 7, "SHADOW") == 7
        g, rem, retry, reset = fcall(r3, "rl_take", ["t"], *slow, 7, "shadow", "WITHSTATE")
        assert (g, retry) == (7, 0) and 5.99 < rem <= 6.01 and 3_990_000 < reset <= 4_000_000
        assert (r2.dump("t"), r2.pexpiretime("t")) == before
        assert fcall(r2, "rl_take", ["t"], *slow, 7) == 0  # enforcing: still denied
        # INIT: a bucket created below full is stored, as when enforcing.
        assert fcall(r2, "rl_take", ["ti"], *slow, 3, "INIT", 1, "SHADOW") == 3
        assert r2.exists("ti") and fcall(r2, "rl_take", ["ti"], *slow, 2) == 0
        # Lease: a denial answers n under no lease (id 0, the ttl, no wait), records none.
        got, lid, ttl, retry = fcall(r2, "rl_lease", ["l"], *slow, 8, 60000, "SHADOW")
        assert got == 8 and lid > 0 and ttl == 60000 and retry == 0
        before = r2.hgetall("l")
        assert fcall(r2, "rl_lease", ["l"], *slow, 5, 60000, "MIN", 3, "SHADOW") == \
            [5, 0, 60000, 0]
        assert r2.hgetall("l") == before
        g, _, _, retry = fcall(r2, "rl_lease", ["l"], *slow, 5, 60000, "MIN", 3)
        assert g == 0 and 990_000 < retry <= 1_000_000  # enforcing: denied, 1 token away
        # Up to n when some are there: a real (partial) grant, SHADOW or not.
        got, lid2, _, _ = fcall(r2, "rl_lease", ["l"], *slow, 5, 60000, "SHADOW")
        assert got == 2 and lid2 > lid
        # MTAKE: all or nothing as when enforcing; a denial answers [n, nil, 0].
        assert fcall(r2, "rl_mtake", ["a", "b"], 3, 0.001, 5, 0.001, 3, "SHADOW") == [3, None, 0]
        before = r2.dump("a"), r2.dump("b")
        assert fcall(r2, "rl_mtake", ["a", "b"], 2, 0.001, 5, 0.001, 3, "SHADOW") == \
            [2, None, 0]
        rep = fcall(r3, "rl_mtake", ["a", "b"], 2, 0.001, 5, 0.001, 3, "WITHSTATE", "SHADOW")
        assert rep[:3] == [2, None, 0] and 1.99 < rep[3][0] <= 2.01 and -0.01 < rep[3][1] <= 0.01
        assert (r2.dump("a"), r2.dump("b")) == before
        # RESERVE: a denial answers n with no wait, writes nothing (no debt).
        assert fcall(r2, "rl_reserve", ["v"], *slow, 10, 0, "SHADOW")[:2] == [10, 0]
        g, wait, rem, _ = fcall(r3, "rl_reserve", ["v"], *slow, 1, 10, "SHADOW")
        assert (g, wait) == (1, 0) and -0.01 < rem <= 0.01
        g, wait, rem, _ = fcall(r3, "rl_reserve", ["v"], *slow, 1, 2_000_000, "SHADOW")
        assert g == 1 and 990_000 < wait <= 1_000_000 and -1.01 < rem < -0.99  # granted: debt
        # Errors: twice, and on functions without it.
        for cmd in (["rl_take", 1, "k", 1, 1, "SHADOW", "SHADOW"],
                    ["rl_take", 1, "k", 1, 1, 1, "shadow", "WITHSTATE", "Shadow"],
                    ["rl_lease", 1, "k", 1, 1, 1, 10, "SHADOW", "shadow"],
                    ["rl_reserve", 1, "k", 1, 1, 1, 10, "SHADOW", "SHADOW"],
                    ["rl_mtake", 1, "k", 1, 1, 1, "SHADOW", "SHADOW"]):
            assert err(r2, "FCALL", *cmd) == "option 'SHADOW' given twice", cmd
        assert err(r2, "FCALL", "rl_return", 1, "k", 1, 1, "SHADOW") == \
            "wrong number of arguments for 'RL.RETURN' command; usage: " + USAGE["RL.RETURN"]
        assert not r2.exists("k")


def share(r, key, *args):
    return r.execute_command("FCALL", "rl_share", 1, key, *args)


@section("shares: rl_share alone (replies, key, expiry, errors, types, the holder bound)")
def shares():
    """RL.SHARE's library twin on a server without the module. The division itself is
    compared with the module by the differential test; here: the reply shapes, what the key
    holds, its expiry at the last lease or hold end, bad input writing nothing, WRONGTYPE
    every way, and the 4096-holder bound."""
    with Server() as s:
        s.load_library()
        r2, r3 = s.client(), s.client(protocol=3)
        # A lone holder gets all of the rate and cap; the key expires at its lease end
        # (3 periods after the call, by the server's clock). A newcomer is back in 300 ms.
        got = expires_after(r2, "k", lambda: share(r2, "k", 100, 50, "a", 10, 60000), 180_000)
        assert got == [b"100", b"50", 180000, 300, 1], got
        assert share(r3, "k3", 100, 50, "a", 10, 60000) == [100.0, 50.0, 180000, 300, 1]
        fields = r2.hgetall("k")
        assert set(fields) == {b"R", b"C", b"61"} and (fields[b"R"], fields[b"C"]) == (b"100", b"50")
        want, rate, burst, lease_end, held_rate, held_burst, held_until = fields[b"61"].split()
        assert (float(want), float(rate), float(burst)) == (10, 100, 50)
        assert (float(held_rate), float(held_burst)) == (0, 0)
        assert int(lease_end) - int(held_until) == 180_000_000 - 250_000  # µs
        # A newcomer gets what is free (nothing) and, far short, is told to come back
        # within a quarter period; after a refresh halves a's share, a's old share is held
        # 250 ms, then b gets its half.
        assert share(r2, "k", 100, 50, "b\x00", 10, 60000) == [b"0", b"0", 180000, 15000, 2]
        assert share(r2, "k", 100, 50, "a", 10, 60000)[:2] == [b"50", b"25"]
        hold = int(r2.hget("k", "61").split()[6])
        g = share(r2, "k", 100, 50, "b\x00", 10, 60000)
        if server_ms(r2) * 1000 < hold:  # (a slow machine may be past the hold already)
            assert g[:2] == [b"0", b"0"] and 10 <= g[3] <= 250, g
        wait_for("a's hold ended", lambda: server_ms(r2) * 1000 > hold)
        assert share(r2, "k", 100, 50, "b\x00", 10, 60000) == [b"50", b"25", 180000, 60000, 2]
        assert r2.hexists("k", "6200")  # the id's bytes in hex
        # RELEASE: gives the share up now (held 250 ms); of a holder without a lease it
        # answers [0, 0, 0, period, holders] and writes nothing.
        before = r2.hgetall("k"), r2.pexpiretime("k")
        assert share(r2, "k", 100, 50, "nobody", 0, 60000, "RELEASE") == [b"0", b"0", 0, 60000, 2]
        assert (r2.hgetall("k"), r2.pexpiretime("k")) == before
        assert share(r2, "k", 100, 50, "a", 0, 60000, "RELEASE") == [b"0", b"0", 0, 60000, 1]
        assert not r2.exists("gone")
        assert share(r2, "gone", 100, 50, "a", 0, 60000, "release") == [b"0", b"0", 0, 60000, 0]
        assert not r2.exists("gone")
        # The last lease released: the key expires when the hold ends (250 ms), then it
        # goes (a key that expired is a new share).
        share(r2, "one", 10, 10, "a", 1, 100)
        expires_after(r2, "one", lambda: share(r2, "one", 10, 10, "a", 1, 100, "RELEASE"), 250)
        wait_for("the released share's key expired", lambda: not r2.exists("one"))
        # VERSION: the newest limit governs.
        assert share(r2, "v", 10, 10, "a", 1, 1000, "VERSION", 2)[:2] == [b"10", b"10"]
        assert share(r2, "v", 99, 99, "a", 1, 1000, "VERSION", 1)[:2] == [b"10", b"10"]
        assert r2.hget("v", "V") == b"2" and r2.hget("v", "R") == b"10"
        assert share(r2, "v", 20, 20, "a", 1, 1000, "VERSION", 3)[:2] == [b"20", b"20"]
        assert r2.hget("v", "V") == b"3" and r2.hget("v", "R") == b"20"
        # Bad input: the module's errors, nothing written.
        for args, want in [
                (["x", 1, "h", 1, 100], "rate is not a number"),
                ([0, 1, "h", 1, 100], "rate must be a finite number between 1e-9 and 1e15"),
                ([1, 1, "", 1, 100], "holder must be 1 to 64 bytes"),
                ([1, 1, "h" * 65, 1, 100], "holder must be 1 to 64 bytes"),
                ([1, 1, "h", -1, 100], "want must be a finite number from 0 to 1e15"),
                ([1, 1, "h", "x", 100], "want must be a finite number from 0 to 1e15"),
                ([1, 1, "h", "inf", 100], "want must be a finite number from 0 to 1e15"),
                ([1, 1, "h", 1, 9], "period_ms must be an integer from 10 to 3600000"),
                ([1, 1, "h", 1, "1.5"], "period_ms must be an integer from 10 to 3600000"),
                ([1, 1, "h", 1, 100, "RELEASE", "RELEASE"], "option 'RELEASE' given twice"),
                ([1, 1, "h", 1, 100, "VERSION", "x"],
                 "VERSION must be an integer from 0 to 9007199254740991"),
                ([1, 1, "h", 1, 100, "SHADOW"], "unknown option 'SHADOW'"),
                ([1, 1, "h", 1], "wrong number of arguments for 'RL.SHARE' command; usage: "
                 + USAGE["RL.SHARE"])]:
            assert err(r2, "FCALL", "rl_share", 1, "bad", *args) == want, (args, want)
        assert not r2.exists("bad")
        # Types: a bucket, a user's hash, a string, a forged share are refused and
        # untouched; bucket functions refuse a share.
        fcall(r2, "rl_take", ["bucket"], 1, 10)
        r2.hset("user", "name", "alice")
        r2.set("str", "1")
        for key, why in [("bucket", "is a bucket of this library, not a rate share"),
                         ("user", "not a rate share of this library (a field that is neither"),
                         ("str", "Operation against a key holding the wrong kind of value")]:
            dump = r2.dump(key)
            got = err(r2, "FCALL", "rl_share", 1, key, 1, 1, "h", 1, 100)
            assert got.startswith("WRONGTYPE") and why in got, (key, got)
            assert r2.dump(key) == dump
        for field, value in [("61", "1 2 3"), ("61", "1 2 3 4 5 6 x"), ("61", "-1 0 0 1 0 0 1"),
                             ("zz", "1"), ("R", "0"), ("V", "x")]:
            r2.delete("forged")
            share(r2, "forged", 10, 10, "a", 1, 60000)
            r2.hset("forged", field, value)
            dump = r2.dump("forged")
            got = err(r2, "FCALL", "rl_share", 1, "forged", 10, 10, "a", 1, 60000)
            assert got.startswith("WRONGTYPE") and "not a rate share" in got, (field, got)
            assert r2.dump("forged") == dump
        for cmd in EVERY_FUNCTION:
            got = err(r2, "FCALL", cmd[0], 1, "k", *cmd[1:])
            assert "it is a rate share of this library" in got, (cmd, got)
        # At most 4096 entries: a new holder beyond them is refused, a known one refreshes.
        # The table is written as rl_share writes it (4096 calls would take minutes: each
        # reads the whole table), holders with a share of 1 and an hour's lease.
        now_us = int(server_ms(r2) * 1000)
        share(r2, "many", 1e6, 1e6, "h0", 1, 3600000)
        entry = f"1 1 1 {now_us + 3_600_000_000} 0 0 {now_us + 250_000}"
        r2.hset("many", mapping={f"h{i}".encode().hex(): entry for i in range(1, 4096)})
        assert err(r2, "FCALL", "rl_share", 1, "many", 1e6, 1e6, "new", 1, 3600000) == \
            "too many holders on this key (at most 4096)"
        assert share(r2, "many", 1e6, 1e6, "h7", 1, 3600000)[4] == 4096
        assert r2.hlen("many") == 4096 + 2


@section("golden cases: protocol/cases/*.json through FCALL, RESP2 and RESP3")
def golden_cases():
    with Server("--appendonly", "yes", "--aof-use-rdb-preamble", "no",
                "--appendfsync", "always") as s:
        s.load_library()
        ran, failures = cases.run_all(s)
        assert ran >= 60, f"only {ran} case runs"
        assert not failures, "\n".join(failures)
        print(f"   {ran} case runs", flush=True)


@section("differential: module and library, same calls")
def differential_all(protocol_list, ops, seed):
    with Server(module=True) as s:
        s.load_library()
        r = s.client()
        with_reserve = has_command(r, "RL.RESERVE")
        if not with_reserve:
            print("   SKIPPED: rl_reserve / rl_refund not compared: the module under test has "
                  "no RL.RESERVE (COMMAND INFO RL.RESERVE is empty); checked alone instead")
        differential.cross_type_checks(s)
        if has_command(r, "RL.PIN"):
            for proto in protocol_list:
                steps = differential.pin_sequences(s, proto)
                print(f"   pins, RESP{proto}: {steps} fixed steps equal", flush=True)
        else:
            print("   SKIPPED: rl_pin not compared in fixed sequences: the module under test "
                  "has no RL.PIN")
        for proto in protocol_list:
            stats = differential.run(s, proto, with_reserve, ops, seed + proto)
            print(f"   RESP{proto}: {stats.summary()}", flush=True)
        if has_command(r, "RL.SHARE"):
            differential.share_cross_type_checks(s)
            differential.share_edge_cases(s)
            for proto in protocol_list:
                summary = differential.run_shares(s, proto, max(200, ops // 5), seed + 10 + proto)
                print(f"   shares, RESP{proto}: {summary}", flush=True)
        else:
            print("   SKIPPED: rl_share not compared: the module under test has no RL.SHARE")
        # The module's own count of how VERSION and pins decided (the library has no counters).
        info = r.info("everything")
        print("   module, versions: " + ", ".join(
            f"{k} {info.get(k, 0)}" for k in
            ("rl_limit_replaced", "rl_limit_stale", "rl_limit_conflicts",
             "rl_pinned_decisions", "rl_pins_set", "rl_pins_removed")), flush=True)


@section("replication: effects reach a replica equal")
def replication():
    with Server() as master, Server() as replica:
        master.load_library()
        rep = replica.client()
        rep.replicaof("127.0.0.1", master.port)
        deadline = time.time() + 60
        while rep.info("replication").get("master_link_status") != "up":
            assert time.time() < deadline, "replica did not sync"
            time.sleep(0.05)
        m = master.client()
        rnd = random.Random(7)
        keys = [f"k{i}" for i in range(12)]
        leases = {}
        for i in range(600):
            k = rnd.choice(keys)
            roll = rnd.random()
            if roll < 0.5:
                fcall(m, "rl_take", [k], rnd.choice([1, 10, 1000]), rnd.choice([5, 10, 100]),
                      rnd.randint(1, 5), "INIT", 0)
            elif roll < 0.7:
                g, lid, _, _ = fcall(m, "rl_lease", [k], 10, 100, 5, rnd.choice([50, 5000]))
                if g:
                    leases[k] = lid
            elif roll < 0.8 and k in leases:
                fcall(m, "rl_return", [k], leases.pop(k), rnd.randint(0, 5))
            elif roll < 0.9:
                fcall(m, "rl_mtake", [k], 1, 10, 100)
            elif roll < 0.95:
                fcall(m, "rl_reserve", [k], 10, 100, 5, 1000)
            else:
                # Pins: the field p, PERSIST for a pin without an end, a key of p alone.
                px = rnd.choice([[], ["PX", "30"], ["PX", "60000"]])
                pin = rnd.choice([["2", "5"], ["BLOCK"], ["EXEMPT"], None])
                if pin is None:
                    fcall(m, "rl_unpin", [k])
                else:
                    fcall(m, "rl_pin", [k], *pin, *px)
        # Shares: their effects (HSET of the entry, R C V, HDEL of dead entries, PEXPIREAT).
        skeys = [f"s{i}" for i in range(4)]
        for i in range(300):
            k = rnd.choice(skeys)
            opts = ["RELEASE"] if rnd.random() < 0.1 else []
            if rnd.random() < 0.2:
                opts += ["VERSION", str(rnd.randint(0, 3))]
            fcall(m, "rl_share", [k], rnd.choice([10, 100]), rnd.choice([5, 50]),
                  rnd.choice("abcdef"), rnd.choice([0, 1, 10, 1000]), rnd.choice([10, 100, 5000]),
                  *opts)
        keys += skeys
        wait_for("the replica acknowledged", lambda: m.wait(1, 1000) == 1, 60)
        # Effects carry absolute expiries (PEXPIREAT): equal, not close. A key read on one
        # side only must have expired by the server's clock in between.
        seen_m = {k: held(m, k) for k in keys}
        seen_r = {k: held(rep, k) for k in keys}
        end = server_ms(m)
        compared = 0
        for k in keys:
            hm, hr = seen_m[k], seen_r[k]
            if hm and hr:
                assert hm == hr, (k, hm, hr)
                compared += 1
            else:
                left = (hm or hr)[2] if (hm or hr) else 0
                assert not (hm or hr) or left <= end + 1, (k, hm, hr, end)
        assert compared > 0
        # rl_peek answers on the replica (FCALL and FCALL_RO); writes are refused there.
        k = next(k for k in keys if m.exists(k))
        assert fcall(rep, "rl_peek", [k]) is not None
        assert rep.execute_command("FCALL_RO", "rl_peek", 1, k) is not None
        assert "read only" in err(rep, "FCALL", "rl_take", 1, k, 1, 1)
        fcall(m, "rl_pin", ["pinned"], "BLOCK")
        wait_for("the replica acknowledged", lambda: m.wait(1, 1000) == 1, 60)
        assert rep.execute_command("FCALL_RO", "rl_pinned", 1, "pinned") is not None
        assert held(rep, "pinned") == held(m, "pinned") and rep.pttl("pinned") == -1
        # The library itself was replicated.
        assert "'rl'" in repr(rep.function_list()) or "b'rl'" in repr(rep.function_list())


# Keys of every kind the library wrote before the string layout, by the library of that
# commit (its last version with hashes only), and the calls that make them.
OLD_LIBRARY_REV = "c9e6107"
SLOW = ("0.001", "100")  # a token per 1000 s: nothing refills while the test runs
UPGRADE_KEYS = {
    "u:plain": [["rl_take", *SLOW, 30]],
    "u:init": [["rl_take", *SLOW, 1, "INIT", 50]],
    "u:mtake": [["rl_mtake", 7, *SLOW]],
    "u:version": [["rl_take", *SLOW, 2, "VERSION", 3]],
    "u:span": [["rl_take", *SLOW, 50], ["rl_take", "0.002", "100", 1]],
    "u:lease": [["rl_lease", *SLOW, 20, 600000]],
    "u:returned": [["rl_lease", *SLOW, 20, 600000], ["rl_return", "$id", 5]],
    "u:debt": [["rl_reserve", *SLOW, 100, 0], ["rl_reserve", *SLOW, 3, 86400000]],
    "u:budget": [["rl_budget", 600000, *SLOW, 9]],
    "u:pinrate": [["rl_take", *SLOW, 10], ["rl_pin", "0.002", "50", "PX", 600000]],
    "u:pinblock": [["rl_take", *SLOW, 10], ["rl_pin", "BLOCK"]],
    "u:pinexempt": [["rl_take", *SLOW, 10], ["rl_pin", "EXEMPT", "PX", 600000]],
    "u:pinonly": [["rl_pin", "BLOCK", "PX", 600000]],
    "u:share": [["rl_share", "10", "5", "a", 1, 5000], ["rl_share", "10", "5", "b", 2, 5000]],
    "u:sharepin": [["rl_share", "10", "5", "a", 1, 5000], ["rl_pin", "SHARES", "BLOCK"]],
}


def upgrade_call(r, key, call, ids):
    name, *args = call
    args = [ids.get(key) if a == "$id" else a for a in args]
    try:
        return fcall(r, name, [key], *args)
    except redis.ResponseError as e:
        raise AssertionError(f"{key}: {call}: {e}") from None


def observed(r, key):
    """What a caller can see of a key: rl_peek and rl_pinned of a bucket (tokens rounded to
    0.01: at most 0.001 token per second refills), a share's fields."""
    if key.startswith("u:share"):
        return ("share", r.hgetall(key))
    peek = fcall(r, "rl_peek", [key])
    if peek:
        peek = dict(zip(peek[0::2], peek[1::2]))
        peek[b"tokens"] = round(float(peek[b"tokens"]), 2)
        peek.pop(b"reset_after_ms")
    pinned = fcall(r, "rl_pinned", [key])
    if pinned:  # its end, not the time left to it
        pinned = dict(zip(pinned[0::2], pinned[1::2]))
        pinned[b"ends"] = pinned.pop(b"ms_left") != -1
    return (peek, pinned)


@section("upgrade: keys of every kind the hash-only library wrote, read and moved on")
def upgrade():
    """Keys written by the library before the string layout (OLD_LIBRARY_REV): after FUNCTION
    LOAD REPLACE of this one every key reads the same (no reset, no token minted), a write
    takes what it asks from there, a plain bucket moves to the string, every other kind
    stays a hash; a replica and the AOF hold the same bytes and expiries as the master."""
    import subprocess
    old = subprocess.run(["git", "show", f"{OLD_LIBRARY_REV}:functions/rl.lua"],
                         cwd=Path(__file__).resolve().parents[2], capture_output=True,
                         check=True).stdout
    with Server("--appendonly", "yes", "--aof-use-rdb-preamble", "no",
                "--appendfsync", "always") as master, Server() as replica:
        m, rep = master.client(), replica.client()
        m.function_load(old.decode(), replace=True)
        rep.replicaof("127.0.0.1", master.port)
        wait_for("the replica synced",
                 lambda: rep.info("replication").get("master_link_status") == "up", 60)
        ids = {}
        for key, calls in UPGRADE_KEYS.items():
            for call in calls:
                got = upgrade_call(m, key, call, ids)
                if call[0] == "rl_lease":
                    ids[key] = got[1]
        for key in UPGRADE_KEYS:
            assert m.type(key) == b"hash", (key, m.type(key))
        before = {k: observed(m, k) for k in UPGRADE_KEYS}
        m.function_load(library_source().decode(), replace=True)
        after = {k: observed(m, k) for k in UPGRADE_KEYS}
        assert after == before, [(k, before[k], after[k]) for k in before if before[k] != after[k]]
        # A write on each: a take of 1 under the stored limit decides from the stored tokens.
        for key in UPGRADE_KEYS:
            if key.startswith("u:share"):
                assert fcall(m, "rl_share", [key], "10", "5", "a", 1, 5000)[0] is not None
                continue
            peek = before[key][0]
            g, rem = fcall(m, "rl_take", [key], *SLOW, 1, "WITHSTATE")[:2]
            if before[key][1] or not peek:
                continue  # a pin decides; pins alone hold no tokens
            want = peek[b"tokens"] - g
            assert abs(float(rem) - want) < 0.02, (key, rem, want, g)
            assert g == (1 if peek[b"tokens"] >= 1 else 0), (key, g, peek)
        # Plain buckets (f r c and nothing else) written are strings now; every other kind
        # a hash (u:debt too: in debt, the take was denied and wrote nothing).
        strings = {"u:plain", "u:init", "u:mtake"}
        for key in UPGRADE_KEYS:
            want = b"string" if key in strings else b"hash"
            assert m.type(key) == want, (key, m.type(key), want)
        # Every key as the next calls find it, on the master, the replica and from the AOF.
        wait_for("the replica acknowledged", lambda: m.wait(1, 1000) == 1, 60)
        seen = {k: held(m, k) for k in UPGRADE_KEYS}
        on_replica = {k: held(rep, k) for k in UPGRADE_KEYS}
        assert on_replica == seen, [(k, seen[k], on_replica[k]) for k in seen
                                    if seen[k] != on_replica[k]]
        m.execute_command("DEBUG", "LOADAOF")
        assert {k: held(m, k) for k in UPGRADE_KEYS} == seen
        assert {k: observed(rep, k) for k in UPGRADE_KEYS if not k.startswith("u:share")} \
            == {k: observed(m, k) for k in UPGRADE_KEYS if not k.startswith("u:share")}


@section("cluster: three masters")
def cluster():
    with Cluster() as c:
        src = library_source()
        for n in c.nodes:
            n.client().function_load(src, replace=True)
        rc = redis.RedisCluster(host="127.0.0.1", port=c.nodes[0].port)
        owners = set()
        for i in range(30):  # one token per 500 s: nothing refills during the test
            key = f"user:{i}"
            assert rc.fcall("rl_take", 1, key, 0.002, 10, 3) == 3
            owners.add(rc.keyslot(key))
        g, lid, _, _ = rc.fcall("rl_lease", 1, "user:0", 0.002, 10, 3, 60000)
        assert g == 3 and rc.fcall("rl_return", 1, "user:0", lid, 3) == 3
        peek = rc.fcall("rl_peek", 1, "user:1")
        peek = dict(zip(peek[::2], peek[1::2]))
        assert 7 <= float(peek[b"tokens"]) < 7.01, peek
        keys = ["{acme}:user:42", "{acme}:api:search", "{acme}:global"]
        assert rc.fcall("rl_mtake", 3, *keys, 1, 5, 10, 100, 200, 1000, 1000) == [1, None, 0]
        try:
            rc.fcall("rl_mtake", 2, "a:1", "b:2", 1, 1, 1, 1, 1)
            raise AssertionError("cross-slot rl_mtake did not fail")
        except redis.exceptions.RedisClusterException as e:
            assert "same key slot" in str(e) or "CROSSSLOT" in str(e), str(e)
        # Straight to a node that does not own the key: MOVED, as for any key.
        node = c.nodes[0].client()
        moved = 0
        for i in range(30):
            try:
                fcall(node, "rl_peek", [f"user:{i}"])
            except redis.ResponseError as e:
                assert str(e).startswith("MOVED"), str(e)
                moved += 1
        assert 0 < moved < 30
        # rl_mtake CROSSSLOT from the server itself.
        slot_err = err(node, "FCALL", "rl_mtake", 2, "a:1", "b:2", 1, 1, 1, 1, 1)
        assert "CROSSSLOT" in slot_err or "MOVED" in slot_err, slot_err


def main():
    ops = int(os.environ.get("RL_FN_OPS", "2500"))
    seed = int(os.environ.get("RL_FN_SEED", str(int(time.time()))))
    print(f"server {SERVER}; module {MODULE}; seed {seed}; {ops} calls per protocol")
    only = sys.argv[1:]
    started = time.time()
    if not only or "usage" in only:
        usage_texts()
    if not only or "alone" in only:
        alone()
    if not only or "lease_tables" in only:
        lease_tables()
    if not only or "forged_hashes" in only:
        forged_hashes()
    if not only or "foreign_hashes" in only:
        foreign_hashes()
    if not only or "pins_alone" in only:
        pins_alone()
    if not only or "pin_acl" in only:
        pin_acl()
    if not only or "budget_pins" in only:
        budget_pins()
    if not only or "shadow" in only:
        shadow()
    if not only or "shares" in only:
        shares()
    if not only or "cases" in only:
        golden_cases()
    if not only or "differential" in only:
        if os.path.exists(MODULE):
            differential_all([2, 3], ops, seed)
        else:
            FAILED.append("differential")
            print(f"== differential: FAILED: no module at {MODULE} (set RL_MODULE or build it)")
    if not only or "replication" in only:
        replication()
    if not only or "upgrade" in only:
        upgrade()
    if not only or "cluster" in only:
        cluster()
    print(f"{'FAILED: ' + ', '.join(FAILED) if FAILED else 'all passed'} "
          f"({time.time() - started:.0f} s)")
    sys.exit(1 if FAILED else 0)


if __name__ == "__main__":
    main()
