"""The golden protocol cases (protocol/cases/*.json) run against a real server: the
Functions library through FCALL (the module's own runner is tests/protocol_cases.rs; both
compare with the same case, so the library and the module agree where a case says).

For each case and each protocol (RESP2, RESP3): set the initial state (as the library's hash)
at a base instant read from the server's clock just before, run the arguments, compare the
reply, the new state read back from the hash (every field of a bucket or a share, and the
key's expiry) and whether anything was propagated (the AOF grows exactly when the case has
an effect; the library's effects are its own writes, whose result the new state shows).
Instants in a case are relative to the call's time; the call runs some time after the base,
so numbers that move with time are compared within the measured window (see
protocol/cases/README.md).
"""

import glob
import json
import math
import os
import struct

import redis

from servers import bucket_fields

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
CASES = os.path.join(ROOT, "protocol", "cases")

# The library's function for each module command (keys first, as FCALL wants them).
FUNCTIONS = {
    "RL.TAKE": "rl_take",
    "RL.LEASE": "rl_lease",
    "RL.RETURN": "rl_return",
    "RL.PEEK": "rl_peek",
    "RL.RESERVE": "rl_reserve",
    "RL.REFUND": "rl_refund",
    "RL.SHARE": "rl_share",
    "RL.MTAKE": "rl_mtake",
    "RL.BUDGET": "rl_budget",
    "RL.SETTLE": "rl_settle",
    "RL.PIN": "rl_pin",
    "RL.UNPIN": "rl_unpin",
    "RL.PINNED": "rl_pinned",
}

# A pin's kind as the library stores it (field p), and back.
PIN_CODES = {"rate": "1", "block": "2", "exempt": "3"}
PIN_KINDS = {v: k for k, v in PIN_CODES.items()}


OPTIONS = ("WITHSTATE", "INIT", "SHADOW", "VERSION")


def error_matches(want, got):
    """redis-py drops the error code of an `ERR` reply (and keeps others). The library's
    `WRONGTYPE` texts say which hash it found (docs/functions.md): the code must match."""
    if not isinstance(got, redis.exceptions.ResponseError):
        return False
    if want.startswith("WRONGTYPE "):
        return str(got).startswith("WRONGTYPE ")
    return str(got) == want or str(got) == want.split(" ", 1)[-1]


def load():
    """Every case, with its file's name: [(family, case)]."""
    out = []
    for path in sorted(glob.glob(os.path.join(CASES, "*.json"))):
        with open(path) as f:
            doc = json.load(f)
        family = os.path.basename(path)[:-5]
        for case in doc["cases"]:
            out.append((family, case))
    return out


def for_functions(case):
    """Whether the library has the case's command and its keys' types (it has buckets and
    shares, no semaphores), and the case does not exclude it."""
    states = list((case.get("state") or {}).values()) + list((case.get("after") or {}).values())
    return (
        case["args"][0].upper() in FUNCTIONS
        and all(s is None or s.get("type", "bucket") != "permits" for s in states)
        and case.get("functions", True)
    )


def fcall_args(args):
    """A module command as the library's FCALL."""
    name = args[0].upper()
    fn = FUNCTIONS[name]
    if name == "RL.MTAKE":
        # RL.MTAKE n k r c [k r c ...] [options] -> FCALL rl_mtake N k.. n r c .. [options]
        n, rest = args[1], args[2:]
        keys, limits = [], []
        i = 0
        while i < len(rest) and rest[i].upper() not in OPTIONS:
            keys.append(rest[i])
            limits += rest[i + 1 : i + 3]
            i += 3
        return ["FCALL", fn, str(len(keys)), *keys, n, *limits, *rest[i:]]
    if name == "RL.BUDGET":
        # RL.BUDGET ttl k r c n [k r c n ...] [options] -> FCALL rl_budget N k.. ttl r c n ..
        ttl, rest = args[1], args[2:]
        keys, costs = [], []
        i = 0
        while i < len(rest) and rest[i].upper() not in OPTIONS:
            keys.append(rest[i])
            costs += rest[i + 1 : i + 4]
            i += 4
        return ["FCALL", fn, str(len(keys)), *keys, ttl, *costs, *rest[i:]]
    if name == "RL.SETTLE":
        # RL.SETTLE id k actual [k actual ...] -> FCALL rl_settle N k.. id actual..
        rest = args[2:]
        return ["FCALL", fn, str(len(rest) // 2), *rest[::2], args[1], *rest[1::2]]
    if len(args) < 2:
        return ["FCALL", fn, "0"]
    return ["FCALL", fn, "1", *args[1:]]


class Window:
    """The base instant and how long the call may have run after it."""

    def __init__(self, base_us, after_us, rate):
        self.base_ns = base_us * 1000
        self.base_us = base_us
        self.drift_us = after_us - base_us + 1
        self.drift_ns = self.drift_us * 1000
        self.drift_ms = math.ceil(self.drift_us / 1000)
        self.rate = rate


def resolve(arg, base_us):
    """One argument of a case's command, on this run's clock."""
    if isinstance(arg, str):
        return arg
    (tag, x), = arg.items()
    return str({"id": base_us, "at": base_us * 1000}[tag] + x)


def server_us(r):
    s, us = r.time()
    return int(s) * 1_000_000 + int(us)


def case_rate(case):
    """The largest refill rate in the case (tokens shown move at most this fast)."""
    rates = [0.0]
    for states in (case.get("state") or {}, case.get("after") or {}):
        for s in states.values():
            if s and "rate" in s:
                rates.append(float(s["rate"]))
    return max(rates)


def tokens_close(want, got, w):
    slack = 1e-9 * max(1.0, abs(want))
    return abs(got - want) <= w.rate * w.drift_ns / 1e9 + slack


def text(b):
    return b.decode() if isinstance(b, bytes) else b


def match(want, got, w, where="reply"):
    """Problems found comparing a typed expectation with a redis-py reply (empty: equal)."""
    bad = [f"{where}: want {want!r}, got {got!r}"]
    if isinstance(want, dict) and "error" in want:
        return [] if error_matches(want["error"], got) else bad
    if isinstance(got, Exception):
        return bad
    if want is None:
        return [] if got is None else bad
    if isinstance(want, bool):
        return bad
    if isinstance(want, dict) and "simple" in want:
        # A status reply: redis-py hands FCALL's over as bytes (RESP2) or str (RESP3).
        return [] if text(got) == want["simple"] else bad
    if isinstance(want, int):
        return [] if isinstance(got, int) and got == want else bad
    if isinstance(want, str):
        return [] if isinstance(got, bytes) and got.decode() == want else bad
    if isinstance(want, list):
        if not isinstance(got, list) or len(got) != len(want):
            return bad
        out = []
        for i, (a, b) in enumerate(zip(want, got)):
            out += match(a, b, w, f"{where}[{i}]")
        return out
    (tag, x), = want.items()
    if tag == "double":
        return [] if isinstance(got, float) and got == x else bad
    if tag == "tokens":
        return [] if isinstance(got, float) and tokens_close(x, got, w) else bad
    if tag == "double_text":
        return [] if isinstance(got, bytes) and float(got) == x else bad
    if tag == "tokens_text":
        return [] if isinstance(got, bytes) and tokens_close(x, float(got), w) else bad
    if tag == "ms":
        return [] if isinstance(got, int) and x - w.drift_ms - 1 <= got <= x + 1 else bad
    if tag == "id":
        return [] if isinstance(got, int) and x <= got - w.base_us <= x + w.drift_us else bad
    if tag in ("map", "pairs"):
        if tag == "map":
            if not isinstance(got, dict):
                return bad
            items = list(got.items())
        else:
            if not isinstance(got, list) or len(got) % 2:
                return bad
            items = list(zip(got[::2], got[1::2]))
        have = {text(k): v for k, v in items}
        if sorted(have) != sorted(k for k, _ in x):
            return bad
        out = []
        for k, v in x:
            out += match(v, have[k], w, f"{where}.{k}")
        return out
    raise ValueError(f"unknown expectation {want!r}")


def lease_text(leases, base_us, base_ns):
    return "".join(
        f"{base_us + i}:{t}:{(base_ns + e) // 1000}," for i, t, e in leases
    )


def pin_until(p, base_ns):
    """A case's pin end as stored: absolute ns, 0 for none."""
    return 0 if p["until"] == 0 else base_ns + p["until"]


def pin_field(s, base_ns):
    """The library's field p for a state's pin (functions/rl.lua `Pn.parse_pin`):
    `kind until absent`, and for a rate pin the limit it returns to."""
    p = s["pin"]
    t = f"{PIN_CODES[p['kind']]} {pin_until(p, base_ns)} {1 if p.get('absent') else 0}"
    if p["kind"] == "rate":
        rate = p["base_rate"] if "base_rate" in p else s["rate"]
        cap = p["base_cap"] if "base_cap" in p else s["cap"]
        t += f" {rate} {cap}"
    return t


def set_bucket_hash(r, key, s, base_us, as_string=False):
    """The library's hash for a bucket state (functions/rl.lua's fields); `as_string`: a
    plain state (f r c only) as the string layout, `rl:<r>:<c>:` and full_at packed."""
    base_ns = base_us * 1000
    plain = not any(s.get(k) for k in ("version", "leases", "span", "pin")) \
        and "last_id" not in s and "pin" not in s
    if as_string and plain:
        full = base_ns + s["full_at"]
        r.set(key, f"rl:{s['rate']}:{s['cap']}:".encode()
              + struct.pack("<dI", full // 10**9, full % 10**9))
        r.pexpireat(key, math.ceil(full / 1e6))
        return
    if s.get("pin", {}).get("absent"):
        # A key that holds only its pin: the field p alone, kept while the pin lives.
        r.hset(key, "p", pin_field(s, base_ns))
        until = pin_until(s["pin"], base_ns)
        if until:
            r.pexpireat(key, math.ceil(until / 1e6))
        return
    fields = {"f": str(base_ns + s["full_at"]), "r": s["rate"], "c": s["cap"]}
    if s.get("version"):
        fields["v"] = str(s["version"])
    if "last_id" in s:
        fields["i"] = str(base_us + s["last_id"])
    if s.get("leases"):
        fields["l"] = lease_text(s["leases"], base_us, base_ns)
        fields["x"] = str(max((base_ns + e) // 1000 for _, _, e in s["leases"]))
    if s.get("span"):
        fields["h"] = str(base_ns + s["hold"])
        fields["s"] = str(s["span"])
    if "pin" in s:
        fields["p"] = pin_field(s, base_ns)
    r.hset(key, mapping=fields)
    ends = [base_ns + s["full_at"], base_ns + s.get("hold", 0)]
    ends += [base_ns + e for _, _, e in s.get("leases", [])]
    if "pin" in s:
        if s["pin"]["until"] == 0:
            return  # a pin without an end: no expiry
        ends.append(pin_until(s["pin"], base_ns))
    r.pexpireat(key, math.ceil(max(ends) / 1e6))


def share_us(base_ns, t):
    """A share instant (ns from the call) as the library stores it: whole µs since the epoch."""
    assert t % 1000 == 0, f"a share instant must be whole microseconds: {t}"
    return (base_ns + t) // 1000


def set_share_hash(r, key, s, base_us):
    """The library's hash for a share state (functions/rl.lua's fields): R, C, V, and one
    field per holder, its id in hex."""
    base_ns = base_us * 1000
    fields = {"R": s["rate"], "C": s["cap"]}
    if s.get("version"):
        fields["V"] = str(s["version"])
    ends = []
    for id_, want, rate, burst, lease_end, held_rate, held_burst, held_until in s["holders"]:
        le, hu = share_us(base_ns, lease_end), share_us(base_ns, held_until)
        nums = [f"{float(x):.17g}" for x in (want, rate, burst, held_rate, held_burst)]
        fields[id_.encode().hex()] = " ".join([*nums[:3], str(le), *nums[3:], str(hu)])
        ends.append(max(le, hu))
    pin = s.get("pin")
    if pin:
        fields["P"] = share_pin_field(pin, base_ns)
    r.hset(key, mapping=fields)
    if pin and pin["until"] == 0:
        return  # a pin without an end: no expiry
    if pin:
        ends.append(share_us(base_ns, pin["until"]))
    r.pexpireat(key, math.ceil(max(ends) / 1000))


def share_pin_field(p, base_ns):
    """The library's field P for a share state's pin (functions/rl.lua
    `Pn.parse_share_pin`): `kind until` (µs, 0: no end), and a rate pin's own limit."""
    until = 0 if p["until"] == 0 else share_us(base_ns, p["until"])
    t = f"{PIN_CODES[p['kind']]} {until}"
    if p["kind"] == "rate":
        t += f" {p['rate']} {p['cap']}"
    return t


def share_pin_of_field(t, w):
    """The library's field P as a case's pin (until relative to the base, ns)."""
    code, until, *limit = t.split(" ")
    p = {"kind": PIN_KINDS[code], "until": 0 if until == "0" else int(until) * 1000 - w.base_ns}
    if limit:
        p["rate"], p["cap"] = limit
    return p


def share_of_hash(h, w):
    """A stored share hash as a case's share state (instants relative to the base, ns),
    holders in id order."""
    h = {text(k): text(v) for k, v in h.items()}
    if "R" not in h or "f" in h:
        return None
    s = {"type": "share", "rate": h["R"], "cap": h["C"]}
    if "V" in h:
        s["version"] = int(h["V"])
    holders = []
    if "P" in h:
        s["pin"] = share_pin_of_field(h["P"], w)
    for k in sorted(f for f in h if f not in ("R", "C", "V", "P")):
        want, rate, burst, le, hr, hb, hu = h[k].split(" ")
        holders.append([bytes.fromhex(k).decode(), float(want), float(rate), float(burst),
                        int(le) * 1000 - w.base_ns, float(hr), float(hb),
                        int(hu) * 1000 - w.base_ns])
    s["holders"] = holders
    return s


def compare_share(want, got, w, where):
    """A share state read back against the case's: limit, version and every entry exact,
    instants within the window."""
    bad = [f"{where}: want {want}, got {got}"]
    if got is None:
        return bad
    for f in ("rate", "cap"):
        if float(want[f]) != float(got[f]):
            return bad
    if want.get("version", 0) != got.get("version", 0):
        return bad
    wp, gp = want.get("pin"), got.get("pin")
    if (wp is None) != (gp is None):
        return bad
    if wp is not None:
        if wp["kind"] != gp["kind"] or (wp["until"] == 0) != (gp["until"] == 0):
            return bad
        if wp["until"] and not at_close(wp["until"], gp["until"], w):
            return bad
        if wp["kind"] == "rate" and any(float(wp[f]) != float(gp[f]) for f in ("rate", "cap")):
            return bad
    if len(want["holders"]) != len(got["holders"]):
        return bad
    for wh, gh in zip(want["holders"], got["holders"]):
        if wh[0] != gh[0] or not (at_close(wh[4], gh[4], w) and at_close(wh[7], gh[7], w)):
            return bad
        if any(float(wh[i]) != gh[i] for i in (1, 2, 3, 5, 6)):
            return bad
    return []


def expiry(r, key, want, w):
    """The key expires when its state's last instant passes (rounded up to a millisecond):
    a share's last entry end; a bucket's full_at, hold or last lease end."""
    pin = want.get("pin")
    if pin and pin["until"] == 0:
        # A key never expires while pinned without an end.
        got = r.execute_command("PEXPIRETIME", key)
        if got == -1:
            return []
        return [(f"{key}: expires {got - w.base_us // 1000} ms after the base, "
                 "want no expiry while pinned")]
    if pin and pin.get("absent"):
        last = pin["until"]
    elif want.get("type") == "share":
        # Not before a live pin's end (functions/rl.lua `Pn.share_expire`).
        last = max([max(h[4], h[7]) for h in want["holders"]] + ([pin["until"]] if pin else []))
    else:
        ends = [want["full_at"]] + [e for _, _, e in want.get("leases", [])]
        last = max(ends + ([want["hold"]] if want.get("span") else []))
        if pin:
            last = max(last, pin["until"])
    lo = math.ceil((w.base_ns + last - 1000) / 1e6)
    hi = math.ceil((w.base_ns + last + w.drift_ns + 1000) / 1e6)
    got = r.execute_command("PEXPIRETIME", key)
    if lo <= got <= hi:
        return []
    if pin and pin["kind"] == "rate" and got > hi and not pin.get("absent"):
        # A rate pin that ends keeps the key until the bucket it leaves under the limit it
        # returns to is full (functions/rl.lua `expire`): later than the state's instants.
        return []
    return [f"{key}: expires {got - w.base_us // 1000} ms after the base, "
            f"want its last end {last} ns"]


def pin_of_field(t, w):
    """The library's field p as a case's pin (until relative to the base)."""
    code, until, absent, *base = t.split(" ")
    p = {"kind": PIN_KINDS[code], "until": 0 if until == "0" else int(until) - w.base_ns}
    if base:
        p["base_rate"], p["base_cap"] = base
    if absent == "1":
        p["absent"] = True
    return p


def bucket_of_hash(h, w):
    """A stored hash as a case's bucket state, relative to the base."""
    h = {text(k): text(v) for k, v in h.items()}
    if "f" not in h and "p" in h:
        return {"pin": pin_of_field(h["p"], w)} if len(h) == 1 else {"fields": h}
    s = {"full_at": int(h["f"]) - w.base_ns, "rate": h["r"], "cap": h["c"]}
    if "p" in h:
        s["pin"] = pin_of_field(h["p"], w)
    if "v" in h:
        s["version"] = int(h["v"])
    if "i" in h:
        s["last_id"] = int(h["i"]) - w.base_us
    leases = []
    for part in h.get("l", "").split(","):
        if part:
            i, t, e = (int(x) for x in part.split(":"))
            if e * 1000 > w.base_ns:  # expired entries are skipped by every reader
                leases.append([i - w.base_us, t, e * 1000 - w.base_ns])
    if leases:
        s["leases"] = leases
    if "s" in h:
        s["hold"] = int(h["h"]) - w.base_ns
        s["span"] = int(h["s"])
    return s


def at_close(want, got, w):
    return want - 1000 <= got <= want + w.drift_ns + 1000


def pins_equal(want, got, w):
    """A case's pin and one read back: kind, end (within the window), whether the key holds
    only the pin, and a rate pin's limit it returns to (the library keeps none for the
    others)."""
    if (want is None) != (got is None):
        return False
    if want is None:
        return True
    if want["kind"] != got["kind"] or bool(want.get("absent")) != bool(got.get("absent")):
        return False
    if (want["until"] == 0) != (got["until"] == 0):
        return False
    if want["until"] and not at_close(want["until"], got["until"], w):
        return False
    if want["kind"] == "rate":
        return all(
            float(want.get(f"base_{f}", "nan")) == float(got[f"base_{f}"]) for f in ("rate", "cap")
        )
    return True


def compare_bucket(want, got, w, where):
    """A bucket state read back against the case's (instants within the window)."""
    bad = [f"{where}: want {want}, got {got}"]
    if got is None:
        return bad
    if not pins_equal(want.get("pin"), got.get("pin"), w):
        return bad
    if want.get("pin", {}).get("absent"):
        return [] if set(got) == {"pin"} else bad
    if not at_close(want["full_at"], got["full_at"], w):
        return bad
    for f in ("rate", "cap"):
        if float(want[f]) != float(got[f]):
            return bad
    if want.get("version", 0) != got.get("version", 0):
        return bad
    if "last_id" in want and not (
        want["last_id"] <= got.get("last_id", -1) <= want["last_id"] + w.drift_us
    ):
        return bad
    wl, gl = want.get("leases", []), got.get("leases", [])
    if len(wl) != len(gl):
        return bad
    for (wi, wt, we), (gi, gt, ge) in zip(wl, gl):
        if not (wi <= gi <= wi + w.drift_us and wt == gt and at_close(we, ge, w)):
            return bad
    if bool(want.get("span")) != bool(got.get("span")):
        return bad
    if want.get("span") and not (
        want["span"] == got["span"] and at_close(want["hold"], got["hold"], w)
    ):
        return bad
    return []


def aof_size(server):
    d = os.path.join(server.dir, "appendonlydir")
    return sum(
        os.path.getsize(os.path.join(d, f)) for f in os.listdir(d) if f.endswith(".incr.aof")
    )


def earliest_us(case):
    """The earliest instant after the call in the case's states (us): a run whose window
    reaches it saw a key expire or a lease end that the case has live, and says nothing."""
    at = []
    for part in ("state", "after"):
        for s in (case.get(part) or {}).values():
            if not s:
                continue
            at += [s[f] for f in ("full_at", "hold") if f in s]
            at += [s["pin"]["until"]] if "pin" in s else []
            at += [item[-1] for item in s.get("leases", []) + s.get("permits", [])]
            at += [t for h in s.get("holders", []) for t in (h[4], h[7])]
    at = [t for t in at if t > 0]
    return min(at) // 1000 if at else math.inf


def run_case(server, case, protocol):
    """Runs one case on the library at `protocol`: the problems found, or None if the run
    took so long that a state the case has live ran out meanwhile."""
    r = server.client(protocol=protocol)
    r.flushall()
    base = server_us(r)
    for key, s in (case.get("state") or {}).items():
        if s is not None and s.get("type") == "share":
            set_share_hash(r, key, s, base)
        elif s is not None:
            # RESP3 runs write a plain state as the string layout, RESP2 runs as the hash
            # (the layout of the library before it, read as it is): both must decide alike.
            set_bucket_hash(r, key, s, base, as_string=protocol == 3)
    digests = {k: r.execute_command("DEBUG", "DIGEST-VALUE", k) for k in case.get("after", {})}
    mark = aof_size(server)
    try:
        got = r.execute_command(*fcall_args([resolve(a, base) for a in case["args"]]))
    except redis.exceptions.ResponseError as e:
        got = e
    w = Window(base, server_us(r), case_rate(case))
    want = case[f"resp{protocol}"]
    problems = match(want, got, w)
    wrote = aof_size(server) > mark
    if wrote != bool(case["effect"]):
        problems.append(f"effect: the case {'has' if case['effect'] else 'has none'}, "
                        f"the library {'wrote' if wrote else 'wrote nothing'}")
    for key, s in (case.get("after") or {}).items():
        before = (case.get("state") or {}).get(key)
        if s == before:
            now = r.execute_command("DEBUG", "DIGEST-VALUE", key)
            if now != digests[key]:
                problems.append(f"{key}: changed, the case says unchanged")
        elif s is None:
            if r.exists(key):
                problems.append(f"{key}: exists, the case says absent")
        elif s.get("type", "bucket") == "bucket":
            h = bucket_fields(r, key)
            bad = compare_bucket(s, bucket_of_hash(h, w) if h else None, w, key)
            problems += bad or expiry(r, key, s, w)
        elif s["type"] == "share":
            h = r.hgetall(key)
            bad = compare_share(s, share_of_hash(h, w) if h else None, w, key)
            problems += bad or expiry(r, key, s, w)
        else:
            raise ValueError(f"{key}: no way to read back {s}")
    return problems if server_us(r) - base < earliest_us(case) else None


def run_all(server, protocols=(2, 3)):
    """Every case the library has, on `server` (the library loaded, the AOF on)."""
    failures, ran = [], 0
    for family, case in load():
        if not for_functions(case):
            continue
        for protocol in protocols:
            ran += 1
            # A run slower than the case's shortest state (half a second) cannot observe it:
            # run it again rather than compare (the outcome never depends on the speed).
            for _ in range(10):
                problems = run_case(server, case, protocol)
                if problems is not None:
                    break
            else:
                problems = ["ten runs each slower than the case's shortest state"]
            if problems:
                failures.append(f"{family}: {case['name']} (RESP{protocol}): {problems}")
    return ran, failures
