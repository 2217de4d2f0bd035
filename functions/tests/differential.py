"""The module and the library side by side on one server, driven by the same random calls.

Every call is issued to both backends back to back inside one MULTI/EXEC (module keys
`m:*`, library keys `f:*`), bracketed by TIME, preceded in the same transaction by the
library's hold and both keys' PTTL, and followed by RL.PEEK/rl_peek and PTTL of the keys
involved. The two calls read clocks up to the call's window apart (the module a nanosecond
clock, the library TIME, frozen for the whole EXEC on Redis >= 7.2 and Valkey), and each
side's stored state keeps its own clock's offset. That offset is measured, not estimated:
after every call, |tokens_module - tokens_library| / rate of the two peeks (exact doubles,
negative in debt) plus the peeks' own window bounds how far apart the two states are. The
next call on the pair is compared within T = (offset + window) x max(1, stored rate / call
rate), in time under the call's limit (a limit change carries the offset as tokens, or in
debt as time: the larger). So:

- errors, integers and decisions must be identical, except where the two calls straddle a
  boundary within T (a token arriving, a lease expiring, the debt boundary of a credit, a
  hold lapsing, a key expiring on one side only): those are counted, each must be explained
  by T, the pair of keys is retired (their states now differ by a decision), and they must
  stay under 0.5% of the calls;
- doubles (remaining tokens) must be equal up to rate * T; how many are bit-identical is
  reported;
- PTTL must agree within the peeks' window plus the pair's largest tolerance so far and
  2 ms of rounding.

Some pairs flap between two limits, a big cap and a small one refilling fast, with sleeps
longer than the small bucket takes to fill: without the hold (a limit change keeps the key
until the bucket would have been full under the old limit) the key would expire between
the calls and the big limit would find a full bucket. Some steps PERSIST the keys, or
DUMP and RESTORE them with no TTL, between calls: the next write must set the expiry again.
"""

import random
import time

import redis

MAX_STRADDLE_RATE = 0.005
# The library's hold (field h) in either layout (functions/rl.lua, "The string layout"): a
# plain bucket's string has none by construction, as a hash without h; any other value is
# an error, as HGET's WRONGTYPE.
HOLD = ("local k = redis.call('TYPE', KEYS[1]).ok "
        "if k == 'hash' or k == 'none' then return redis.call('HGET', KEYS[1], 'h') end "
        "local v = redis.call('GET', KEYS[1]) "
        "local at = string.match(v, '^rl:[^:]+:[^:]+:()') "
        "if at and #v == at + 11 then return false end "
        "return redis.error_reply('not a bucket of the library: ' .. v)")


class Mismatch(AssertionError):
    pass


def b(x):
    return x if isinstance(x, bytes) else str(x).encode()


# ---------------------------------------------------------------------------------------
# Random limits and calls.

PLAIN_LIMITS = [(1, 1), (1, 3), (2, 10), (5, 5), (10, 20), (100, 100), (1000, 1000),
                (0.5, 1), (0.3333, 2), (7.7, 13.5), (3, 10), (50, 200), (20, 3)]
EXTREME_LIMITS = [(1e-9, 1e-9), (1e-9, 3), (1e15, 1e15), (1e9, 1), (1e6, 1e15),
                  (1e-3, 1e-3), (123456.789, 0.001), (1e12, 5), (0.01, 1e6)]
SPELLINGS = {1000: ["1000", "1e3", "1000.0", "+1000", "1E3"], 0.5: [".5", "0.5", "5e-1"],
             2: ["2", "2.", "0.2e1"], 10: ["10", "1e1", "10.000"]}
# (big, small): a small cap refilling fast, full again within milliseconds, and a big cap;
# rate changes (converted with directed rounding) and cap-only changes (exact in ns).
FLAP_LIMITS = [((100, 50), (2000, 3)), ((5, 40), (1000, 2)), ((1000, 1e6), (1e6, 5)),
               ((50, 200), (50, 4)), ((7.7, 13.5), (7.7, 2.25)), ((1, 1000), (1, 0.5))]
BAD_NUMBERS = ["x", "-1", "nan", "inf", "-inf", "0", "1e16", "1e-10", "", "1.2.3", " 1",
               "1 ", "0x10", "1e", "e5", ".", "NaN", "Infinity", "1e400", b"\xff1"]
BAD_INTEGERS = ["x", "-1", "0", "1.0", "1e3", "+1", "9223372036854775808", "", " 1"]
# VERSION v: a pair in version mode has a limit per version (two releases rolling out), and
# its callers send versions around the newest drawn so far: the newest (which replaces the
# stored limit the first time), older ones (stale: decided under the stored, newer limit),
# 0 (explicit or absent), and rarely the largest.
VERSIONS = [1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144, 233]
MAX_VERSION = 9007199254740991
BAD_VERSIONS = ["-1", "x", "1.5", "9007199254740992", "18446744073709551615", "",
                " 1", "+1", "1e3", "9223372036854775808"]


def shadow_opt():
    """`SHADOW` (any case) for about one call in eight of those that take it."""
    if random.random() < 0.12:
        return [random.choice(["SHADOW", "shadow", "Shadow"])]
    return []


def spell(x):
    opts = SPELLINGS.get(x)
    if opts and random.random() < 0.3:
        return random.choice(opts)
    return repr(x) if isinstance(x, float) else str(x)


class Pair:
    counter = 0

    def __init__(self):
        Pair.counter += 1
        self.name = f"{Pair.counter}"
        self.new_limit()
        self.leases = []  # (module id, library id, tokens, expires_unix_s)
        # Each side's state is its own: a write from a full bucket starts at that side's
        # clock, so the two states stay offset by what refills in the window of that call
        # (and a limit change carries that offset over in tokens, not in time). The largest
        # `rate * window` of any call on this pair bounds it, in tokens.
        self.skew_tokens = 0.0
        # The same offset in time under each limit the pair had: a limit change holds the
        # key until the old bucket would be full, an instant that carries the offset at the
        # old rate (the key's PTTL is the later of that and the new full_at).
        self.skew_us = 0.0
        # Rates of the limits before the current one: the stored state may still be under
        # one of them, and a call refills at that rate before converting (its window too).
        self.old_rates = []
        self.history = []  # the last calls on this pair, for a failure's report
        self.flap = random.choice(FLAP_LIMITS) if random.random() < 0.3 else None
        self.in_debt = False  # the module's peek after the last call showed tokens < 0
        # Once in debt, the pair's offset is time (the level's instant is stored-state based,
        # `behind`), kept through limit changes and after the debt is paid: at a faster
        # rate it is more tokens. From then on the tolerance includes `skew_us` at any rate.
        self.debt_seen = False
        # Measured: after each call the two sides' peeks give their tokens under the stored
        # limit (exact doubles, negative in debt); their difference over the stored rate,
        # plus the time between the two peeks, bounds how far apart the two stored states
        # are (µs: |full_at_module - full_at_library|), whatever produced it (windows of
        # earlier calls, a debt's offset kept as time, a conversion to a slower rate).
        self.off_us = 0.0
        self.stored_rate = None  # the stored limit's rate (None: no key, a full bucket)
        # (module tokens, library tokens, TIME after them, peek window, stored cap)
        self.last_peek = None
        self.max_window_us = 0.0  # the largest call tolerance on this pair so far
        # The library's hold was within reach of a write's instant (see `step`): one side's
        # span may have lapsed and not the other's, which only the expiry shows.
        self.hold_straddle = False
        if self.flap:
            self.rate, self.cap = self.flap[0]
        # Version mode: a limit per version (None: calls without VERSION, or VERSION 0).
        self.vlimits = {0: (self.rate, self.cap)} if (
            not self.flap and random.random() < 0.45) else None
        self.vnext = 0  # index in VERSIONS of the newest version drawn so far
        # Pins (RL.PIN / rl_pin): the largest pinned rate so far (the stored state may be
        # under it), the ends of pins set with PX as (unix µs, the pin call's window µs),
        # and the largest window of a pin call: the two sides' pins start (and end) that
        # far apart, which BLOCK's retry_after and RL.PINNED's ms_left show.
        self.pin_rate = 0.0
        # The slowest rate the pair had (calls' limits and rate pins): a rate pin ends into
        # the limit kept aside, which may be any earlier one of the pair's (versions).
        self.min_rate = self.max_rate = self.rate
        self.pin_ends = []
        self.pin_skew_us = 0.0

    @property
    def m(self):
        return f"m:{self.name}"

    @property
    def f(self):
        return f"f:{self.name}"

    def set_limit(self, limit):
        self.old_rates = (self.old_rates + [self.rate])[-3:]
        self.rate, self.cap = limit
        self.min_rate = min(self.min_rate, self.rate)
        self.max_rate = max(self.max_rate, self.rate)

    @property
    def tol_rate(self):
        return max([self.rate] + self.old_rates + [self.pin_rate])

    def near_pin_end(self, t_us, tol_us):
        """Whether a pin set with PX ends within the tolerance of `t_us` on either side
        (each side's pin ends PX after its own clock read it: the pin call's window apart)."""
        return any(abs(end - t_us) <= tol_us + skew + 2000 for end, skew in self.pin_ends)

    def new_limit(self):
        if hasattr(self, "rate"):
            self.old_rates = (self.old_rates + [self.rate])[-3:]
        self.rate, self.cap = random.choice(
            EXTREME_LIMITS if random.random() < 0.12 else PLAIN_LIMITS)
        self.min_rate = min(getattr(self, "min_rate", self.rate), self.rate)
        self.max_rate = max(getattr(self, "max_rate", self.rate), self.rate)

    @property
    def on_small(self):
        return self.flap is not None and (self.rate, self.cap) == self.flap[1]


def draw_version(p):
    """A version for a call on a pair in version mode (see VERSIONS)."""
    x = random.random()
    if x < 0.004:
        return MAX_VERSION  # every later call on the key is stale until it goes
    if x < 0.12:
        return 0
    if x < 0.22 and p.vnext < len(VERSIONS) - 1:
        p.vnext += 1  # a new release
    if x < 0.45 and p.vnext > 0:
        return VERSIONS[random.randrange(p.vnext)]  # an older one: stale once newer is stored
    return VERSIONS[p.vnext]


def versioned(p, v):
    """The pair's limit at version v (drawn the first time; rarely redrawn: a conflict at
    the same version, where the call's limit applies as without versions)."""
    limit = p.vlimits.get(v)
    if limit is None or random.random() < 0.03:
        limit = random.choice(EXTREME_LIMITS if random.random() < 0.1 else PLAIN_LIMITS)
        p.vlimits[v] = limit
    if limit != (p.rate, p.cap):
        p.set_limit(limit)


def version_opts(p):
    """`VERSION v` for a single-key call (and the pair's limit set to that version's)."""
    if p.vlimits is None:
        return ["VERSION", "0"] if random.random() < 0.02 else []
    v = draw_version(p)
    versioned(p, v)
    if v == 0 and random.random() < 0.5:
        return []
    return ["VERSION", str(v)]


class Call:
    def __init__(self, kind, mod, fn, keys, rate, **meta):
        self.kind, self.mod, self.fn, self.keys, self.rate = kind, mod, fn, keys, rate
        self.meta = meta


def small_n(cap):
    top = max(1, min(int(cap), 12))
    return random.randint(1, top)


def gen_take(p):
    rest = []
    vo = version_opts(p)
    n = small_n(p.cap)
    if random.random() < 0.8:
        rest.append(str(n))
    else:
        n = 1
    if random.random() < 0.6:
        rest.append(random.choice(["WITHSTATE", "withstate"]))
    if random.random() < 0.15:
        rest += ["INIT", spell(random.choice([0, p.cap / 2, p.cap, 1]) if p.cap >= 1 else 0)]
    sh = shadow_opt()
    if sh:
        first = 1 if rest and rest[0] == str(n) else 0
        at = random.randint(first, len(rest))
        if at < len(rest) and rest[at - 1:at] == ["INIT"]:
            at += 1  # not between INIT and its value
        rest[at:at] = sh
    if vo:
        # After n (only the first option place takes it), before or after the options.
        first = 1 if rest and rest[0] == str(n) else 0
        at = random.choice([first, len(rest)])
        rest[at:at] = vo
    r, c = spell(p.rate), spell(p.cap)
    return Call("take", ["RL.TAKE", p.m, r, c, *rest],
                ["FCALL", "rl_take", 1, p.f, r, c, *rest], [p], p.rate, n=n,
                with_state="WITHSTATE" in [x.upper() for x in rest], shadow=bool(sh),
                boundary=[n])


def gen_lease(p, now_s):
    vo = version_opts(p)
    n = random.randint(1, max(1, min(int(p.cap) * 2, 30)))
    ttl = random.choice([20, 50, 100, 300, 1000])
    opts_m, opts_f = [], []
    if random.random() < 0.3:
        m = str(random.randint(1, max(1, min(n, int(p.cap)))))
        opts_m += ["MIN", m]
        opts_f += ["MIN", m]
    settle = None
    if p.leases and random.random() < 0.5:
        settle = random.choice(p.leases)
        unused = str(random.randint(0, settle[2] + 1))
        opts_m += ["RETURN", str(settle[0]), unused]
        opts_f += ["RETURN", str(settle[1]), unused]
    elif random.random() < 0.05:
        opts_m += ["RETURN", "12345", "1"]
        opts_f += ["RETURN", "12345", "1"]
    if random.random() < 0.1:
        init = ["INIT", spell(random.choice([0, 1, p.cap]) if p.cap >= 1 else 0)]
        opts_m += init
        opts_f += init
    sh = shadow_opt()
    if sh:
        front = random.random() < 0.5
        opts_m = sh + opts_m if front else opts_m + sh
        opts_f = sh + opts_f if front else opts_f + sh
    if vo:
        front = random.random() < 0.5
        opts_m = vo + opts_m if front else opts_m + vo
        opts_f = vo + opts_f if front else opts_f + vo
    r, c = spell(p.rate), spell(p.cap)
    min_n = int(opts_m[opts_m.index("MIN") + 1]) if "MIN" in opts_m else 1
    return Call("lease", ["RL.LEASE", p.m, r, c, str(n), str(ttl), *opts_m],
                ["FCALL", "rl_lease", 1, p.f, r, c, str(n), str(ttl), *opts_f], [p], p.rate,
                ttl=ttl, settle=settle, now_s=now_s, shadow=bool(sh), boundary=[min_n])


def gen_return(p):
    if p.leases and random.random() < 0.85:
        settle = random.choice(p.leases)
        ids = (str(settle[0]), str(settle[1]))
    else:
        settle, ids = None, ("777", "777")
    unused = str(random.randint(0, (settle[2] if settle else 3) + 1))
    return Call("return", ["RL.RETURN", p.m, ids[0], unused],
                ["FCALL", "rl_return", 1, p.f, ids[1], unused], [p], p.rate, settle=settle)


def gen_peek(p):
    fn = random.choice(["FCALL", "FCALL_RO"])
    return Call("peek", ["RL.PEEK", p.m], [fn, "rl_peek", 1, p.f], [p], p.rate)


def gen_mtake(pairs):
    k = random.randint(1, min(3, len(pairs)))
    group = random.sample(pairs, k)
    # One VERSION for every bucket, when every pair is in version mode: drawn by the first
    # (the others take that version's limit too). Pairs not in version mode keep calls
    # without versions (a version would make all their later calls stale), but for a rare
    # explicit 0.
    vo = []
    if all(q.vlimits is not None for q in group):
        v = draw_version(group[0])
        for q in group:
            versioned(q, v)
        if v or random.random() < 0.5:
            vo = ["VERSION", str(v)]
    elif random.random() < 0.03:
        vo = ["VERSION", "0"]
    n = small_n(min(q.cap for q in group))
    opts = []
    if random.random() < 0.6:
        opts.append("WITHSTATE")
    if random.random() < 0.1:
        opts += ["INIT", "0"]
    sh = shadow_opt()
    if sh:
        opts = sh + opts if random.random() < 0.5 else opts + sh
    if vo:
        opts = vo + opts if random.random() < 0.5 else opts + vo
    mod = ["RL.MTAKE", str(n)]
    fn = ["FCALL", "rl_mtake", k, *[q.f for q in group], str(n)]
    for q in group:
        r, c = spell(q.rate), spell(q.cap)
        mod += [q.m, r, c]
        fn += [r, c]
    return Call("mtake", mod + opts, fn + opts, group, max(q.rate for q in group), n=n,
                shadow=bool(sh), boundary=[n] * len(group))


def gen_budget(pairs):
    """RL.BUDGET on 1-3 pairs, each its own cost (as gen_mtake draws the version)."""
    k = random.randint(1, min(3, len(pairs)))
    group = random.sample(pairs, k)
    vo = []
    if all(q.vlimits is not None for q in group):
        v = draw_version(group[0])
        for q in group:
            versioned(q, v)
        if v or random.random() < 0.5:
            vo = ["VERSION", str(v)]
    elif random.random() < 0.03:
        vo = ["VERSION", "0"]
    costs = [small_n(q.cap) for q in group]
    ttl = random.choice([20, 50, 100, 300, 1000])
    opts = []
    if random.random() < 0.5:
        opts.append("WITHSTATE")
    sh = shadow_opt()
    if sh:
        opts = sh + opts if random.random() < 0.5 else opts + sh
    if vo:
        opts = vo + opts if random.random() < 0.5 else opts + vo
    mod = ["RL.BUDGET", str(ttl)]
    fn = ["FCALL", "rl_budget", k, *[q.f for q in group], str(ttl)]
    for q, n in zip(group, costs):
        r, c = spell(q.rate), spell(q.cap)
        mod += [q.m, r, c, str(n)]
        fn += [r, c, str(n)]
    return Call("budget", mod + opts, fn + opts, group, max(q.rate for q in group),
                costs=costs, ttl=ttl, now_s=time.time(), shadow=bool(sh), boundary=costs)


def gen_settle(runner):
    """RL.SETTLE of a reservation RL.BUDGET made on pairs still in play (or of an unknown
    id), every key or some, each with an actual below, at or above its cost (absurd ones
    too: the debt floor)."""
    live = [b for b in runner.budgets if all(q in runner.pairs for q in b["pairs"])]
    if live and random.random() < 0.9:
        b = random.choice(live)
        idx = sorted(random.sample(range(len(b["pairs"])), random.randint(1, len(b["pairs"]))))
        ids = (str(b["ids"][0]), str(b["ids"][1]))
    else:
        b, idx, ids = None, [0], ("777", "777")
    group = [b["pairs"][i] for i in idx] if b else [random.choice(runner.pairs)]
    costs = [b["costs"][i] for i in idx] if b else [1]
    actuals = [str(random.choice([0, n // 2, n, n + 1, 2 * n + 3, 10 ** 9])) for n in costs]
    mod = ["RL.SETTLE", ids[0]]
    for q, a in zip(group, actuals):
        mod += [q.m, a]
    fn = ["FCALL", "rl_settle", len(group), *[q.f for q in group], ids[1], *actuals]
    settle = (b["ids"][0], b["ids"][1], 0, b["expires"], b["ttl"] * 1000) if b else None
    return Call("settle", mod, fn, group, max(q.rate for q in group), budget=b,
                settle=settle)


def gen_reserve(p):
    vo = version_opts(p)
    n = small_n(p.cap)
    wait = random.choice([0, 10, 100, 1000, 5000])
    rest = []
    if random.random() < 0.1:
        rest += ["INIT", "0"]
    sh = shadow_opt()
    if sh:
        rest = sh + rest if random.random() < 0.5 else rest + sh
    if vo:
        rest = vo + rest if random.random() < 0.5 else rest + vo
    r, c = spell(p.rate), spell(p.cap)
    # The boundary: granted when the wait is at most max_wait, i.e. n - rate * max_wait
    # tokens are there (the level may be negative: debt).
    return Call("reserve", ["RL.RESERVE", p.m, r, c, str(n), str(wait), *rest],
                ["FCALL", "rl_reserve", 1, p.f, r, c, str(n), str(wait), *rest], [p], p.rate,
                n=n, max_wait=wait, shadow=bool(sh), boundary=[n - p.rate * wait / 1000])


PIN_PX = [None, None, None, 20, 50, 200, 1000, 60000]


def gen_pin(p):
    """RL.PIN (rate cap, BLOCK, EXEMPT; maybe PX), RL.UNPIN or RL.PINNED on a pair."""
    x = random.random()
    if x < 0.2:
        return Call("unpin", ["RL.UNPIN", p.m], ["FCALL", "rl_unpin", 1, p.f], [p], p.rate)
    if x < 0.35:
        fn = random.choice(["FCALL", "FCALL_RO"])
        return Call("pinned", ["RL.PINNED", p.m], [fn, "rl_pinned", 1, p.f], [p], p.rate)
    px = random.choice(PIN_PX)
    tail = [random.choice(["PX", "px"]), str(px)] if px else []
    y = random.random()
    if y < 0.5:
        rate, cap = random.choice(EXTREME_LIMITS if random.random() < 0.08 else PLAIN_LIMITS)
        what, pin_rate = [spell(rate), spell(cap)], rate
    else:
        what = [random.choice(["BLOCK", "block"] if y < 0.75 else ["EXEMPT", "exempt"])]
        pin_rate = None
    return Call("pin", ["RL.PIN", p.m, *what, *tail], ["FCALL", "rl_pin", 1, p.f, *what, *tail],
                [p], pin_rate or p.rate, px=px, pin_rate=pin_rate)


def gen_refund(p):
    n = str(random.choice([1, 2, 5, random.randint(1, 1000)]))
    return Call("refund", ["RL.REFUND", p.m, n], ["FCALL", "rl_refund", 1, p.f, n], [p],
                p.rate)


def gen_bad(p):
    """A call the module refuses; the library must refuse it with the same text."""
    r, c = spell(p.rate), spell(p.cap)
    choice = random.randrange(19)
    if choice == 18:  # RL.PIN / RL.UNPIN / RL.PINNED errors
        bad = random.choice([
            ["RL.PIN"], ["RL.PIN", "x", c], [r], ["BLOCK", "PX"], ["BLOCK", "PX", "0"],
            ["EXEMPT", "PX", "-1"], ["BLOCK", "FOO"], [r, c, "PX"], [r, c, "PX", "x"],
            [r, c, "BAR", "1"], ["BLOCK", "PX", "99999999999999"], ["1e-9", "1e6"],
            [r, c, "PX", "1", "x"], ["RL.UNPIN", "x"], ["RL.PINNED", "x"]])
        if bad[0] in ("RL.UNPIN", "RL.PINNED"):
            fn = "rl_unpin" if bad[0] == "RL.UNPIN" else "rl_pinned"
            return Call("bad", [bad[0], p.m, *bad[1:]], ["FCALL", fn, 1, p.f, *bad[1:]], [p],
                        p.rate)
        if bad[0] == "RL.PIN":
            bad = bad[1:]
        return Call("bad", ["RL.PIN", p.m, *bad], ["FCALL", "rl_pin", 1, p.f, *bad], [p], p.rate)
    if choice == 17:  # SHADOW twice on the four commands that take it; none on the others
        twice = random.choice([["SHADOW", "SHADOW"], ["shadow", "INIT", "0", "Shadow"]])
        cmd = random.randrange(6)
        if cmd == 0:
            return Call("bad", ["RL.TAKE", p.m, r, c, "1", *twice],
                        ["FCALL", "rl_take", 1, p.f, r, c, "1", *twice], [p], p.rate)
        if cmd == 1:
            return Call("bad", ["RL.LEASE", p.m, r, c, "1", "100", *twice],
                        ["FCALL", "rl_lease", 1, p.f, r, c, "1", "100", *twice], [p], p.rate)
        if cmd == 2:
            return Call("bad", ["RL.RESERVE", p.m, r, c, "1", "10", *twice],
                        ["FCALL", "rl_reserve", 1, p.f, r, c, "1", "10", *twice], [p], p.rate)
        if cmd == 3:
            return Call("bad", ["RL.MTAKE", "1", p.m, r, c, *twice],
                        ["FCALL", "rl_mtake", 1, p.f, "1", r, c, *twice], [p], p.rate)
        if cmd == 4:
            return Call("bad", ["RL.RETURN", p.m, "1", "1", "SHADOW"],
                        ["FCALL", "rl_return", 1, p.f, "1", "1", "SHADOW"], [p], p.rate)
        return Call("bad", ["RL.REFUND", p.m, "1", "SHADOW"],
                    ["FCALL", "rl_refund", 1, p.f, "1", "SHADOW"], [p], p.rate)
    if choice == 15:  # VERSION errors, on every command that takes it
        bad = random.choice([["VERSION", random.choice(BAD_VERSIONS)], ["VERSION"],
                             ["VERSION", "1", "VERSION", "1"], ["version", "2", "VERSION", "x"],
                             ["VERSION", "VERSION"]])
        cmd = random.randrange(4)
        if cmd == 0:
            return Call("bad", ["RL.TAKE", p.m, r, c, "1", *bad],
                        ["FCALL", "rl_take", 1, p.f, r, c, "1", *bad], [p], p.rate)
        if cmd == 1:
            return Call("bad", ["RL.LEASE", p.m, r, c, "1", "100", *bad],
                        ["FCALL", "rl_lease", 1, p.f, r, c, "1", "100", *bad], [p], p.rate)
        if cmd == 2:
            return Call("bad", ["RL.RESERVE", p.m, r, c, "1", "10", *bad],
                        ["FCALL", "rl_reserve", 1, p.f, r, c, "1", "10", *bad], [p], p.rate)
        return Call("bad", ["RL.MTAKE", "1", p.m, r, c, *bad],
                    ["FCALL", "rl_mtake", 1, p.f, "1", r, c, *bad], [p], p.rate)
    if choice == 16:  # n above the cap with a valid version (the call's own cap: a syntax check)
        v = random.choice(["1", str(MAX_VERSION)])
        return Call("bad", ["RL.TAKE", p.m, "1", "3", "4", "VERSION", v],
                    ["FCALL", "rl_take", 1, p.f, "1", "3", "4", "VERSION", v], [p], p.rate)
    if choice == 0:
        args = [random.choice(BAD_NUMBERS), c]
    elif choice == 1:
        args = [r, random.choice(BAD_NUMBERS)]
    elif choice == 2:
        args = ["1e-9", "1e6"]  # cap / rate over 100 years
    elif choice == 3:
        args = [r, c, random.choice(BAD_INTEGERS)]
    elif choice == 4:
        args = [r, "3", "4"]
    elif choice == 5:
        args = [r, c, "1", random.choice(["FOO", "bar\x00baz", b"\xffoo", b"a\xe2\x82", "x" * 80, "x" + "é" * 40])]
    elif choice == 6:
        args = [r, c, "1", "INIT"]
    elif choice == 7:
        args = [r, c, "1", "INIT", random.choice(["-1", "x", str(p.cap * 2 + 1)])]
    elif choice == 8:
        args = [r, c, "1", "WITHSTATE", "2"]
    elif choice == 9:
        args = [r, c, "1", "WITHSTATE", "INIT", "0", "WITHSTATE", "x"]
    elif choice == 10:  # lease errors
        lease = random.choice([
            [r, c, "0", "100"], [r, c, "1", "0"], [r, c, "1", "86400001"],
            [r, c, "5", "100", "MIN", "6"], ["1", "3", "5", "100", "MIN", "4"],
            [r, c, "1", "100", "MIN"], [r, c, "1", "100", "RETURN", "1"],
            [r, c, "1", "100", "RETURN", "-1", "1"], [r, c, "1", "100", "RETURN", "1", "x"],
            [r, c, "1", "100", "MIN", "0"], [r, c, "1", "100", "BOGUS"],
            [r, c, "1"], [r, c, "x", "100"], ["x", c, "1", "100"]])
        return Call("bad", ["RL.LEASE", p.m, *lease], ["FCALL", "rl_lease", 1, p.f, *lease],
                    [p], p.rate)
    elif choice == 11:  # return errors
        ret = random.choice([["x", "1"], ["1", "-1"], ["1"], ["1", "2", "3"]])
        return Call("bad", ["RL.RETURN", p.m, *ret], ["FCALL", "rl_return", 1, p.f, *ret],
                    [p], p.rate)
    elif choice == 12:  # mtake errors
        mt = random.choice([(["0"], [r, c]), (["1"], ["x", c]), (["99"], [r, "5"]),
                            (["1"], [r, c, "INIT", "x"])])
        n, rest = mt
        opts = rest[2:]
        return Call("bad", ["RL.MTAKE", *n, p.m, *rest[:2], *opts],
                    ["FCALL", "rl_mtake", 1, p.f, *n, *rest], [p], p.rate)
    elif choice == 13:  # a key twice
        return Call("bad", ["RL.MTAKE", "1", p.m, r, c, p.m, r, c],
                    ["FCALL", "rl_mtake", 2, p.f, p.f, "1", r, c, r, c], [p], p.rate)
    else:
        args = [r]  # arity
    return Call("bad", ["RL.TAKE", p.m, *args], ["FCALL", "rl_take", 1, p.f, *args], [p],
                p.rate)


# ---------------------------------------------------------------------------------------
# Comparing.

def err_text(x):
    return f"{type(x).__name__}: {x}"


def as_float(x):
    return float(x.decode() if isinstance(x, bytes) else x)


def as_map(p):
    """A peek's reply as a dict (RESP2 gives a flat list), or None."""
    if isinstance(p, list):
        return dict(zip(p[::2], p[1::2]))
    return p


class Stats:
    def __init__(self):
        self.calls = 0
        self.straddles = []
        self.doubles = 0
        self.doubles_equal = 0
        self.texts_equal = 0
        self.errors = 0
        self.kinds = {}
        self.ms_fields = 0
        self.frozen = 0
        self.ticks = 0
        self.flaps = 0
        self.persists = 0
        self.in_debt = 0  # calls on a pair whose module bucket was in debt before the call
        self.debt_changes = 0  # limit changes on a pair in debt
        self.versioned = 0  # calls passing VERSION (bad ones included)
        self.shadow = 0  # calls passing SHADOW (bad ones included)

    def summary(self):
        rate = len(self.straddles) / max(1, self.calls)
        return (f"{self.calls} pairs ({', '.join(f'{k} {v}' for k, v in sorted(self.kinds.items()))}); "
                f"{self.errors} error replies compared; limit flaps {self.flaps}, "
                f"PERSIST/RESTORE-0 steps {self.persists}; calls on a bucket in debt "
                f"{self.in_debt} (limit changes in debt {self.debt_changes}); with VERSION "
                f"{self.versioned}; with SHADOW {self.shadow}; straddles {len(self.straddles)} "
                f"({100 * rate:.3f}%); ms fields {self.ms_fields}, one apart (a tick in the "
                f"window) {self.ticks}; doubles {self.doubles}, value-identical "
                f"{self.doubles_equal}, text-identical {self.texts_equal}"
                + (f"; TIME frozen in MULTI (window closed by a TIME after EXEC) in "
                   f"{self.frozen}" if self.frozen else ""))


class Runner:
    def __init__(self, server, protocol, with_reserve, seed, ops):
        self.r = server.client(protocol=protocol)
        self.protocol = protocol
        self.with_reserve = with_reserve
        self.rng = random.Random(seed)
        self.ops = ops
        self.stats = Stats()
        self.pairs = [Pair() for _ in range(6)]
        self.log = []  # every call, straddles included: (step, pair names, call, replies)

    def double(self, a, b, rate, window_s, what):
        """Both sides' doubles: equal up to what refills in the window."""
        s = self.stats
        s.doubles += 1
        fa, fb = as_float(a), as_float(b)
        if fa == fb:
            s.doubles_equal += 1
        if isinstance(a, bytes) and a == b:
            s.texts_equal += 1
        elif not isinstance(a, bytes) and fa == fb:
            s.texts_equal += 1
        tol = rate * window_s * 1.01 + 1e-12 * max(1.0, abs(fa))
        if abs(fa - fb) > tol:
            raise Mismatch(f"{what}: {a!r} vs {b!r} beyond rate*window {tol}")

    def ms(self, a, b, window_ms, what):
        """Milliseconds (rounded up): equal, or one apart when a millisecond ticked over
        within the window (a tick, counted; the states still agree)."""
        self.stats.ms_fields += 1
        if a != b:
            if abs(a - b) <= 1 + window_ms:
                self.stats.ticks += 1
                return
            raise Mismatch(f"{what}: {a} vs {b} (window {window_ms:.3f} ms)")

    def run(self):
        self.budgets = []  # reservations RL.BUDGET granted: pairs, costs, both ids, expiry
        random.seed(self.rng.random())
        for _ in range(self.ops):
            self.step()
        return self.stats

    def pick_call(self, now_s):
        p = random.choice(self.pairs)
        roll = random.random()
        if p.in_debt:
            self.stats.in_debt += 1
        if p.flap:
            if roll < 0.5:
                p.set_limit(p.flap[0] if p.on_small else p.flap[1])
                self.stats.flaps += 1
                self.stats.debt_changes += p.in_debt
                if random.random() < 0.5:
                    # Longer than the small bucket takes to fill: its key, held, stays.
                    time.sleep(random.choice([0.003, 0.01, 0.03]))
        elif roll < 0.03 or (p.in_debt and roll < 0.15):
            # A limit change on a bucket in debt: the debt carries over as the deficit does.
            p.new_limit()
            self.stats.debt_changes += p.in_debt
        kinds = [(gen_take, 0.34), (lambda q: gen_lease(q, now_s), 0.18), (gen_return, 0.1),
                 (gen_peek, 0.08), (None, 0.1), (gen_bad, 0.12)]
        kinds += [(gen_pin, 0.06), ("budget", 0.06), ("settle", 0.05)]
        if self.with_reserve:
            # Enough reservations that pairs are often in debt when the other calls (and
            # limit changes) come: debt is negative remaining/tokens everywhere.
            kinds += [(gen_reserve, 0.1), (gen_refund, 0.05)]
        total = sum(w for _, w in kinds)
        x = random.random() * total
        for g, w in kinds:
            x -= w
            if x <= 0:
                if g is None:
                    return gen_mtake(self.pairs)
                if g == "budget":
                    return gen_budget(self.pairs)
                if g == "settle":
                    return gen_settle(self)
                return g(p)
        return gen_take(p)

    def persist(self):
        """Takes both keys of a pair off expiry (PERSIST, or DUMP and RESTORE ... 0): the
        next write on them must set it again (the PTTL comparisons after it check)."""
        p = random.choice(self.pairs)
        for k in (p.m, p.f):
            if random.random() < 0.5:
                self.r.persist(k)
            else:
                dump = self.r.dump(k)
                if dump is not None:
                    self.r.restore(k, 0, dump, replace=True)
        self.stats.persists += 1

    def step(self):
        if random.random() < 0.08:
            time.sleep(random.choice([0.001, 0.005, 0.02, 0.05]))
        if random.random() < 0.03:
            self.persist()
        call = self.pick_call(time.time())
        # The refill in the window is at the stored limit's rate, maybe an earlier one's.
        # A call with an older VERSION is decided under the stored limit: its rate too.
        call.rate = max([call.rate] + [q.tol_rate for q in call.keys]
                        + [q.stored_rate or 0 for q in call.keys])
        first_module = random.random() < 0.5
        # Bad calls outside MULTI: an arity error refused at queueing would abort it.
        pipe = self.r.pipeline(transaction=call.kind != "bad")
        pipe.execute_command("TIME")
        pre = 3  # per key: the library's hold, both keys' PTTL, before the call
        for q in call.keys:
            pipe.execute_command("EVAL", HOLD, 1, q.f)
            pipe.execute_command("PTTL", q.m)
            pipe.execute_command("PTTL", q.f)
        order = [call.mod, call.fn] if first_module else [call.fn, call.mod]
        for c in order:
            pipe.execute_command(*c)
        pipe.execute_command("TIME")
        for q in call.keys:
            pipe.execute_command("RL.PEEK", q.m)
            pipe.execute_command("FCALL", "rl_peek", 1, q.f)
            pipe.execute_command("PTTL", q.m)
            pipe.execute_command("PTTL", q.f)
        pipe.execute_command("TIME")
        out = pipe.execute(raise_on_error=False)

        before = out[1:1 + pre * len(call.keys)]
        holds = before[0::pre]
        out = [out[0]] + out[1 + pre * len(call.keys):]
        t0, t1, t2 = out[0], out[3], out[-1]
        if t0 == t2 and call.kind != "bad":
            # Redis >= 7.2 and Valkey freeze TIME for a whole MULTI/EXEC (and a script sees
            # that same instant): the library's calls all ran at t0, the module's at its real
            # clock, somewhere before a TIME sent after EXEC.
            t1 = t2 = self.r.time()
            self.stats.frozen += 1
        # The peeks run between the second and third TIME: their own window.
        peek_raw_us = (t2[0] - t1[0]) * 1e6 + (t2[1] - t1[1]) + 2
        if t0 == out[3] and call.kind != "bad":
            peek_raw_us = (t2[0] - t0[0]) * 1e6 + (t2[1] - t0[1]) + 2
        window_us = (t1[0] - t0[0]) * 1e6 + (t1[1] - t0[1]) + 2  # + TIME's truncation
        raw_us = window_us
        for q in call.keys:
            q.skew_tokens = max(q.skew_tokens, q.tol_rate * window_us / 1e6)
        # The tolerance of this call, in time under each key's limit for the call: the two
        # stored states were `off_us` apart (measured after the last call on the pair, under
        # the stored limit), and the two calls read clocks up to the window apart. Both
        # count in time under the stored limit; a limit change carries tokens over (time
        # scaled by stored rate / new rate), or time when in debt (`behind`): the larger.
        # (RETURN, REFUND and PEEK pass no limit: the stored one, no conversion.)
        no_limit = call.kind in ("return", "refund", "peek", "pinned", "settle")
        # A rate pin converts the stored tokens into the pinned limit (its rate, not the
        # pair's); a pin's start and end are the pin call's window apart on the two sides.
        # A pair that had a rate pin may go (at RL.UNPIN, or at its end) from the pinned
        # limit to the one kept aside, any of its earlier limits: the slowest one's time.
        tols = [(q.off_us + raw_us) * (1.0 if no_limit and not q.pin_rate else
                                       max(1.0, (q.stored_rate or q.rate)
                                           / min([q.rate, call.meta.get("pin_rate") or q.rate]
                                                 + ([q.min_rate] if q.pin_rate else []))))
                # The two sides' pins end that far apart, refilling at whichever rate
                # follows, converted to whichever limit comes next.
                + q.pin_skew_us * max(q.max_rate, q.pin_rate) / min(q.min_rate, q.rate)
                for q in call.keys]
        window_us = max(tols)
        call.tols = tols
        call.t0_us = t0[0] * 1e6 + t0[1]
        for q, h in zip(call.keys, holds):
            q.max_window_us = max(q.max_window_us, window_us)
            # A write keeps the stored span only while the hold is after the level's
            # instant. The two holds are as far apart as the levels' instants were at the
            # write that set them (at most the largest tolerance of the pair's calls): a
            # hold that close to this call's instant may lapse on one side only.
            if h is not None and abs(int(h) / 1e3 - call.t0_us) <= q.max_window_us + raw_us:
                q.hold_straddle = True
        # A key about to expire (its expiry is full_at or a hold rounded up to the ms, so
        # the two keys' expiries can be a millisecond apart, plus the states' offset), or
        # gone on one side only. The two buckets are full then, but a full bucket and no key
        # are not the same call's input everywhere: INIT applies only where the key is
        # absent, and a limit change carries the stored bucket's tokens (at most its cap)
        # where an absent key is full under the new limit.
        expiring = any((tm < 0) != (tf < 0) or 0 <= min(tm, tf) <= 2 + window_us / 1000
                       for tm, tf in zip(before[1::pre], before[2::pre])
                       if tm != -1 and tf != -1)
        rm, rf = (out[1], out[2]) if first_module else (out[2], out[1])
        self.log = (self.log + [(self.stats.calls, [q.name for q in call.keys],
                                 f"{call.mod} -> {rm!r} / {rf!r} (module first: "
                                 f"{first_module})")])[-400:]
        self.stats.calls += 1
        self.stats.kinds[call.kind] = self.stats.kinds.get(call.kind, 0) + 1
        self.stats.versioned += any(str(x).upper() == "VERSION" for x in call.mod)
        self.stats.shadow += any(str(x).upper() == "SHADOW" for x in call.mod)
        try:
            try:
                self.raw_us = raw_us
                self.window_us = window_us
                self.call_t0_us = call.t0_us
                self.call_peeks = [out[4 + 4 * i: 6 + 4 * i] for i in range(len(call.keys))]
                self.peek_raw_us = peek_raw_us
                self.t2 = t2
                self.compare(call, rm, rf, window_us)
                for i, q in enumerate(call.keys):
                    pm, pf, tm, tf = out[4 + 4 * i: 8 + 4 * i]
                    # After the call the states are at most its tolerance apart (in time under
                    # the limit now stored: the call's if it wrote, else the old one and then
                    # `off_us` <= the tolerance), and the two peeks read clocks up to their own
                    # window apart.
                    rate = self.compare_peek(pm, pf, tols[i] + peek_raw_us, "after-peek")
                    skew = max(q.skew_tokens, q.tol_rate * raw_us / 1e6)
                    # PTTL also carries holds and lease expiries set by earlier calls, each off
                    # by that call's offset: bounded by the pair's largest offsets so far.
                    pttl_us = peek_raw_us + max(skew / rate * 1e6 if rate else 0, q.skew_us,
                                                q.max_window_us)
                    try:
                        self.compare_pttl(tm, tf, pttl_us)
                    except Mismatch as e:
                        if q.hold_straddle:
                            raise Straddle(f"{e}: a hold within the window of a write (the span "
                                           f"lapsed on one side only)") from None
                        raise
                    pm, pf = as_map(pm), as_map(pf)
                    if pm is not None and pf is not None:
                        rate = as_float(pm[b"rate"])
                        tm_, tf_ = as_float(pm[b"tokens"]), as_float(pf[b"tokens"])
                        q.off_us = abs(tm_ - tf_) / rate * 1e6 + peek_raw_us
                        q.stored_rate = rate
                        q.last_peek = (tm_, tf_, t2[0] * 1e6 + t2[1], peek_raw_us,
                                       as_float(pm[b"cap"]))
                    else:  # no key on either side: full buckets, equal
                        q.off_us, q.stored_rate, q.last_peek = 0.0, None, None
                    q.in_debt = pm is not None and as_float(pm[b"tokens"]) < 0
                    q.debt_seen = q.debt_seen or q.in_debt
            except Mismatch as e:
                if call.meta.get("shadow") and self.near_boundary(call):
                    raise Straddle(f"{e}: SHADOW answers a denial as a grant, and the level "
                                   f"was within the window of the call's boundary (granted "
                                   f"on one side, shadow-denied on the other)") from None
                if expiring:
                    raise Straddle(f"{e}: a key expired (or was about to) on one side only "
                                   f"(INIT, a limit change)") from None
                if any(q.near_pin_end(call.t0_us, window_us) for q in call.keys):
                    raise Straddle(f"{e}: a pin ended within the window (on one side "
                                   f"only)") from None
                if call.kind in ("lease", "return", "settle") and self.near_expiry(call):
                    raise Straddle(f"{e}: the returned lease expired within the window on "
                                   f"one side only (the other credited it and wrote)") from None
                raise
        except Straddle as s:
            self.stats.straddles.append(f"{call.kind} {call.mod}: {s}")
            for q in call.keys:  # the states now differ by a decision: start afresh
                idx = self.pairs.index(q)
                self.pairs[idx] = Pair()
            return
        except Mismatch as e:
            history = "".join(f"\n    {h}" for q in call.keys for h in q.history)
            names = {q.name for q in call.keys}
            history += "\n  every call on these keys:" + "".join(
                f"\n    #{n} {c}" for n, ks, c in self.log if names & set(ks))
            raise Mismatch(f"{call.mod} / {call.fn} (protocol {self.protocol}): {e}\n"
                           f"  module:  {rm!r}\n  library: {rf!r}\n  history:{history}"
                           ) from None
        for i, q in enumerate(call.keys):
            q.skew_us = max(q.skew_us, q.skew_tokens / q.rate * 1e6)
            q.history = (q.history + [
                f"{call.mod} -> {rm!r} / {rf!r} (TIME {t0[0]}.{int(t0[1]):06d}, window "
                f"{raw_us:.0f} us, tolerance {window_us:.0f} us; before it: library hold "
                f"{before[pre * i]!r}, PTTL {before[pre * i + 1]} / {before[pre * i + 2]}; "
                f"after: states {q.off_us:.0f} us apart)"])[-10:]
        self.after(call, rm, rf)

    def after(self, call, rm, rf):
        if call.kind == "pin" and not isinstance(rm, Exception):
            p = call.keys[0]
            p.pin_skew_us = max(p.pin_skew_us, self.raw_us)
            if call.meta["pin_rate"]:
                p.pin_rate = max(p.pin_rate, call.meta["pin_rate"])
                p.min_rate = min(p.min_rate, call.meta["pin_rate"])
            if call.meta["px"]:
                p.pin_ends = (p.pin_ends + [(call.t0_us + call.meta["px"] * 1000,
                                             self.raw_us)])[-6:]
        if call.kind == "lease" and isinstance(rm, list):
            p = call.keys[0]
            if call.meta["settle"] is not None and call.meta["settle"] in p.leases:
                p.leases.remove(call.meta["settle"])
            if rm[0] > 0:
                p.leases.append((rm[1], rf[1], rm[0], time.time() + call.meta["ttl"] / 1000,
                                 call.meta["ttl"] * 1000))
            p.leases = p.leases[-8:]
        if call.kind == "budget" and isinstance(rm, list) and rm[0] == 1 and rm[1] and rf[1]:
            ttl = call.meta["ttl"]
            self.budgets = (self.budgets + [{
                "pairs": call.keys, "costs": call.meta["costs"], "ids": (rm[1], rf[1]),
                "expires": time.time() + ttl / 1000, "ttl": ttl}])[-8:]
        if call.kind == "settle" and call.meta["budget"] in self.budgets:
            self.budgets.remove(call.meta["budget"])
        if call.kind == "return" and call.meta["settle"] in call.keys[0].leases:
            call.keys[0].leases.remove(call.meta["settle"])

    def compare(self, call, rm, rf, window_us):
        window_s, window_ms = window_us / 1e6, window_us / 1000
        em, ef = isinstance(rm, Exception), isinstance(rf, Exception)
        if em or ef:
            if not (em and ef) or err_text(rm) != err_text(rf):
                raise Mismatch(f"errors differ: {err_text(rm) if em else rm} vs "
                               f"{err_text(rf) if ef else rf}")
            self.stats.errors += 1
            return
        if call.kind == "bad":
            raise Mismatch("expected an error")
        k = call.kind
        # Doubles of the call's limit: that rate over the tolerance (or the stored limit's,
        # which decides a call with an older VERSION).
        rate_l = max(call.keys[0].rate, call.keys[0].stored_rate or 0)
        if k == "take":
            if call.meta["with_state"]:
                if rm[4:] != rf[4:]:
                    raise Mismatch(f"pinned {rm[4:]} vs {rf[4:]}")
                self.decision(rm[0], rf[0], (rm, rf), window_ms, lambda r: r[2])
                self.double(rm[1], rf[1], rate_l, window_s, "remaining")
                self.ms(rm[2], rf[2], window_ms, "retry_after_ms")
                self.ms(rm[3], rf[3], window_ms, "reset_after_ms")
            else:
                self.decision(rm, rf, None, window_ms, None)
        elif k == "lease":
            if rm[0] != rf[0]:
                if abs(rm[0] - rf[0]) <= 1 + rate_l * window_s or self.near_expiry(call):
                    raise Straddle(f"granted {rm[0]} vs {rf[0]}")
                # Denied on one side (fewer than MIN there): its wait within the tolerance.
                denied = rm if rm[0] == 0 else rf if rf[0] == 0 else None
                if denied is not None and denied[3] <= 1 + window_ms:
                    raise Straddle(f"granted {rm[0]} vs {rf[0]}; denied side's wait "
                                   f"{denied[3]} ms")
                if call.meta["settle"] is not None and self.near_debt(call.keys[0]):
                    raise Straddle(f"granted {rm[0]} vs {rf[0]}: the RETURN's credit taken "
                                   f"on one side only (in debt on the other, within the window)")
                raise Mismatch(f"granted {rm[0]} vs {rf[0]}")
            if (rm[1] == 0) != (rf[1] == 0) or rm[2] != rf[2]:
                raise Mismatch("lease id / ttl")
            self.ms(rm[3], rf[3], window_ms, "retry_after_ms")
        elif k == "return":
            if rm != rf:
                if self.near_expiry(call):
                    raise Straddle(f"credited {rm} vs {rf} at the lease's expiry")
                if (rm == 0) != (rf == 0) and self.near_debt(call.keys[0]):
                    raise Straddle(f"credited {rm} vs {rf}: in debt on one side only, "
                                   f"within the window")
                q = call.keys[0]
                if abs(rm - rf) <= 1 + (q.stored_rate or q.rate) * window_s:
                    # What the bucket lacks, rounded up, differs by what refills in the
                    # window (a bucket full again on one side only).
                    raise Straddle(f"credited {rm} vs {rf}: full again within the window")
                raise Mismatch(f"credited {rm} vs {rf}")
        elif k == "mtake":
            self.decision(rm[0], rf[0], (rm, rf), window_ms, lambda r: r[2])
            if rm[0] == 0:
                dm, df = rm[1].decode()[2:], rf[1].decode()[2:]
                if dm != df:
                    raise Straddle(f"denied_by {dm} vs {df} (waits {rm[2]} / {rf[2]})")
            elif rm[1] is not None or rf[1] is not None:
                raise Mismatch("denied_by on a grant")
            self.ms(rm[2], rf[2], window_ms, "retry_after_ms")
            if len(rm) == 4:
                for a, b_, q, t in zip(rm[3], rf[3], call.keys, call.tols):
                    self.double(a, b_, max(q.rate, q.stored_rate or 0), t / 1e6, "remaining")
        elif k == "budget":
            self.decision(rm[0], rf[0], (rm, rf), window_ms, lambda r: r[3])
            if rm[0] == 0:
                dm, df = rm[2].decode()[2:], rf[2].decode()[2:]
                if dm != df:
                    raise Straddle(f"denied_by {dm} vs {df} (waits {rm[3]} / {rf[3]})")
            elif rm[2] is not None or rf[2] is not None:
                raise Mismatch("denied_by on a grant")
            if (rm[1] == 0) != (rf[1] == 0):
                raise Mismatch(f"reservation id {rm[1]} vs {rf[1]}")
            self.ms(rm[3], rf[3], window_ms, "retry_after_ms")
            if len(rm) == 5:
                for a, b_, q, t in zip(rm[4], rf[4], call.keys, call.tols):
                    self.double(a, b_, max(q.rate, q.stored_rate or 0), t / 1e6, "remaining")
        elif k == "settle":
            for a, b_, q in zip(rm, rf, call.keys):
                if a == b_:
                    continue
                if (a is None) != (b_ is None):
                    if self.near_expiry(call):
                        raise Straddle(f"settled {a} vs {b_} at the reservation's expiry")
                    raise Mismatch(f"settled {a} vs {b_}")
                if (a == 0) != (b_ == 0) and self.near_debt(q):
                    raise Straddle(f"settled {a} vs {b_}: in debt on one side only")
                if abs(a - b_) <= 1 + (q.stored_rate or q.rate) * (window_s + q.off_us / 1e6):
                    # What a bucket lacks (a credit), or the room left above -cap (a
                    # charge), differs by what refills in the states' offset.
                    raise Straddle(f"settled {a} vs {b_}: within the window")
                raise Mismatch(f"settled {a} vs {b_}")
        elif k == "pin":
            if rm != rf:
                raise Mismatch(f"pin {rm!r} vs {rf!r}")
        elif k == "unpin":
            if rm != rf:
                raise Mismatch(f"unpin {rm!r} vs {rf!r}")
        elif k == "pinned":
            pm, pf = as_map(rm), as_map(rf)
            if (pm is None) != (pf is None):
                raise Mismatch(f"pinned {rm!r} vs {rf!r}")
            if pm is not None:
                if set(pm) != set(pf) or pm[b"kind"] != pf[b"kind"] or any(
                        pm[f] != pf[f] and (pm[f] is None or pf[f] is None
                                            or as_float(pm[f]) != as_float(pf[f]))
                        for f in (b"rate", b"cap")):
                    raise Mismatch(f"pinned {rm!r} vs {rf!r}")
                self.ms(pm[b"ms_left"], pf[b"ms_left"], window_ms, "ms_left")
        elif k == "peek":
            # Under the stored limit: the states' offset and this call's window.
            q = call.keys[0]
            self.compare_peek(rm, rf, q.off_us + self.raw_us, "peek")
        elif k == "reserve":
            if rm[0] != rf[0]:
                wait = max(rm[1], rf[1])
                if abs(wait - call.meta["max_wait"]) <= 1 + window_ms:
                    raise Straddle(f"reserve granted {rm[0]} vs {rf[0]} at max_wait")
                self.decision(rm[0], rf[0], (rm, rf), window_ms, lambda r: r[1])
            self.ms(rm[1], rf[1], window_ms, "wait_ms")
            self.double(rm[2], rf[2], rate_l, window_s, "remaining")
            self.ms(rm[3], rf[3], window_ms, "reset_after_ms")
        elif k == "refund":
            # Under the stored limit: the states' offset and this call's window.
            q = call.keys[0]
            stored = q.stored_rate or q.rate
            tol_s = (q.off_us + self.raw_us) / 1e6
            if (as_float(rm) == 0) != (as_float(rf) == 0) and self.near_debt(q):
                raise Straddle(f"refunded {rm} vs {rf}: in debt on one side only, within "
                               f"the window")
            self.double(rm, rf, stored, tol_s, "refunded")

    def near_boundary(self, call):
        """Whether a SHADOW call may have been granted on one side and denied on the other
        (both answer a grant, so only the state after shows it): some key's level,
        extrapolated from its last peeks to this call, within the call's tolerance of the
        call's boundary (`boundary`: n for TAKE and MTAKE, MIN for LEASE, n - rate * max_wait
        for RESERVE). A call under another limit than the stored one (its tokens converted),
        or settling a lease (credited first), is not extrapolated: taken as near."""
        if call.meta.get("settle") is not None:
            return True
        for q, target, tol in zip(call.keys, call.meta["boundary"], call.tols):
            if q.last_peek is None or not q.stored_rate:
                continue  # no key on either side: full buckets, the same decision
            tm, tf, t_peek, peek_us, cap = q.last_peek
            if (q.stored_rate, cap) != (q.rate, q.cap):
                return True
            r = q.stored_rate
            elapsed = (self.call_t0_us - t_peek) / 1e6
            reach = r * (tol + peek_us + self.raw_us) / 1e6 + 1e-9 * max(1.0, abs(target))
            if any(abs(min(cap, t + r * elapsed) - target) <= reach for t in (tm, tf)):
                return True
        return False

    def near_debt(self, q):
        """Whether the pair's level, extrapolated from its last peeks to this call, was
        within the call's tolerance of 0 on either side: a bucket in debt credits nothing
        (RETURN, REFUND, LEASE ... RETURN), one just out of it credits, so the two sides may
        straddle that boundary."""
        if q.last_peek is None or not q.stored_rate:
            return False
        tm, tf, t_peek, peek_us, _ = q.last_peek
        r = q.stored_rate
        elapsed = (self.call_t0_us - t_peek) / 1e6
        reach = r * (q.off_us + self.raw_us + peek_us) / 1e6
        return any(abs(t + r * elapsed) <= reach + r * self.raw_us / 1e6 for t in (tm, tf))

    def near_expiry(self, call):
        """Whether the lease this call returns expires within its window on either side:
        each side's lease expires at its id (the µs instant it was granted, by that side's
        clock) plus the ttl, so the two expiries are that lease call's window apart, and one
        side may find it live (and credit it, writing) while the other finds it expired."""
        s = call.meta.get("settle")
        if not s:
            return False
        if abs(time.time() - s[3]) < 0.005:
            return True
        exp_m, exp_f = s[0] + s[4], s[1] + s[4]
        return (call.t0_us - self.window_us <= max(exp_m, exp_f)
                and min(exp_m, exp_f) <= call.t0_us + self.window_us)

    def decision(self, gm, gf, replies, window_ms, retry_of):
        if gm == gf:
            return
        if replies is not None:
            denied = replies[0] if gm == 0 else replies[1]
            if retry_of(denied) <= 1 + window_ms:
                raise Straddle(f"granted {gm} vs {gf}; denied side's wait {retry_of(denied)} ms")
            raise Mismatch(f"granted {gm} vs {gf}, wait {retry_of(denied)} ms")
        raise Straddle(f"granted {gm} vs {gf} (no wait in the reply; checked by the peek after)")

    def compare_peek(self, pm, pf, window_us, what):
        """A peek answers under the stored limit: the two sides' states, `window_us` apart
        at most in time under that limit (see `step`), at that limit's rate."""
        if pm is None or pf is None:
            if pm is not None or pf is not None:
                raise Straddle(f"{what}: one key gone ({pm!r} / {pf!r})")
            return None
        pm, pf = as_map(pm), as_map(pf)
        if set(pm) != set(pf):
            raise Mismatch(f"{what}: fields {sorted(pm)} vs {sorted(pf)}")
        rate = as_float(pm[b"rate"])
        window_s, window_ms = window_us / 1e6, window_us / 1000
        for f in (b"rate", b"cap"):
            if as_float(pm[f]) != as_float(pf[f]):
                raise Mismatch(f"{what}: {f} {pm[f]} vs {pf[f]}")
        if pm[b"version"] != pf[b"version"]:
            raise Mismatch(f"{what}: version {pm[b'version']} vs {pf[b'version']}")
        if pm.get(b"pinned") != pf.get(b"pinned"):
            raise Mismatch(f"{what}: pinned {pm.get(b'pinned')} vs {pf.get(b'pinned')}")
        self.double(pm[b"tokens"], pf[b"tokens"], rate, window_s, f"{what} tokens")
        self.ms(pm[b"reset_after_ms"], pf[b"reset_after_ms"], window_ms, f"{what} reset")
        if pm[b"leases"] != pf[b"leases"] or pm[b"leased_tokens"] != pf[b"leased_tokens"]:
            raise Straddle(f"{what}: leases {pm[b'leases']}/{pm[b'leased_tokens']} vs "
                           f"{pf[b'leases']}/{pf[b'leased_tokens']} (an expiry in the window)")
        return rate

    def compare_pttl(self, tm, tf, window_us):
        if tm == tf:
            return
        if (tm == -1) != (tf == -1) and max(tm, tf) >= 0:
            # One key has no expiry, the other has one: a write that did not set it (after
            # PERSIST or RESTORE ... 0), whatever the window.
            raise Mismatch(f"pttl {tm} vs {tf}: one key without expiry")
        if tm < 0 or tf < 0:
            if max(tm, tf) <= 2 + window_us / 1000:
                raise Straddle(f"pttl {tm} vs {tf}")
            raise Mismatch(f"pttl {tm} vs {tf}")
        if abs(tm - tf) > 2 + window_us / 1000:
            raise Mismatch(f"pttl {tm} vs {tf}")


class Straddle(Exception):
    pass


def cross_type_checks(server):
    """Keys are not interchangeable: WRONGTYPE both ways, and against other types."""
    r = server.client()
    r.execute_command("RL.TAKE", "x:module", 1, 1)
    r.execute_command("FCALL", "rl_take", 1, "x:library", 1, 1)
    r.set("x:string", "1")
    wrong = "WRONGTYPE Operation against a key holding the wrong kind of value"
    cases = [["RL.TAKE", "x:library", 1, 1], ["RL.PEEK", "x:library"],
             ["FCALL", "rl_take", 1, "x:module", 1, 1], ["FCALL", "rl_peek", 1, "x:module"],
             ["FCALL", "rl_lease", 1, "x:module", 1, 1, 1, 100],
             ["FCALL", "rl_return", 1, "x:string", 1, 1],
             ["FCALL", "rl_mtake", 2, "x:library", "x:string", 1, 1, 1, 1, 1],
             ["FCALL", "rl_take", 1, "x:string", 1, 1]]
    for c in cases:
        try:
            r.execute_command(*c)
        except redis.ResponseError as e:
            assert str(e) == wrong, (c, str(e))
            continue
        raise AssertionError(f"{c} did not fail with WRONGTYPE")


def run(server, protocol, with_reserve, ops, seed):
    runner = Runner(server, protocol, with_reserve, seed, ops)
    stats = runner.run()
    rate = len(stats.straddles) / max(1, stats.calls)
    for s in stats.straddles[:12]:
        print(f"    straddle: {s}")
    assert rate < MAX_STRADDLE_RATE, f"straddles {rate:.4%} >= 0.5%"
    return stats


# ---------------------------------------------------------------------------------------
# Rate shares: RL.SHARE and rl_share side by side.

MAX_SHARE_STRADDLE_RATE = 0.02
SHARE_LIMITS = [(100, 50), (10, 10), (1000, 1), (7.7, 13.5), (0.3333, 2), (1e6, 1e3),
                (1e-3, 1e-3), (5, 1e6), (1e15, 1e15), (1e-9, 1e-9), (1e15, 1e-9)]
SHARE_HOLDERS = ["a", "b", "c", "d", "e", "svc-1", "svc-2", "\x00", "\xff\x01", "é",
                 "x" * 64, "0", "zz"]
SHARE_WANTS = [0, 0, 1, 2.5, 5, 10, 33, 50, 100, 1000, 1e15, 0.1, 7.7]
SHARE_PERIODS = [10, 20, 50, 100, 250, 299, 300, 301, 1000, 60000, 3600000]
BAD_SHARES = [["x", "1", "h", "1", "100"], ["1", "1", "", "1", "100"],
              ["1", "1", "h" * 65, "1", "100"], ["1", "1", "h", "-1", "100"],
              ["1", "1", "h", "nan", "100"], ["1", "1", "h", "1e16", "100"],
              ["1", "1", "h", "1", "9"], ["1", "1", "h", "1", "3600001"],
              ["1", "1", "h", "1", "x"], ["1", "1", "h", "1", "100", "RELEASE", "release"],
              ["1", "1", "h", "1", "100", "FOO"], ["1", "1", "h", "1", "100", "VERSION"],
              ["1", "1", "h", "1", "100", "VERSION", "-1"], ["1", "1", "h", "1"],
              ["1", "1", "h", "inf", "100", "BAR"], ["1e-9", "1e6", "h", "1", "100"]]


class SharePair:
    counter = 0

    def __init__(self):
        SharePair.counter += 1
        self.name = f"s{SharePair.counter}"
        self.limit = random.choice(SHARE_LIMITS)
        self.holders = random.sample(SHARE_HOLDERS, random.randint(1, 6))
        self.versions = random.random() < 0.3
        self.version = 0
        self.max_window_us = 0.0  # each entry's instants carry the window of its call

    @property
    def m(self):
        return f"m:{self.name}"

    @property
    def f(self):
        return f"f:{self.name}"


class ShareRunner:
    """Same random RL.SHARE / rl_share calls on a pair of keys, each pair back to back in
    one MULTI/EXEC bracketed by TIME. Replies must be equal (rate and burst as exact
    doubles), except where an entry's lease or hold ends within the call's tolerance of
    its instant (a straddle: counted, the pair retired); refresh_ms, when computed from
    such an end, within the tolerance; the keys' expiries within it too."""

    def __init__(self, server, protocol, seed, ops):
        self.r = server.client(protocol=protocol)
        self.protocol = protocol
        self.rng = random.Random(seed)
        self.ops = ops
        self.pairs = [SharePair() for _ in range(4)]
        self.calls = self.errors = self.shorts = self.releases = self.equal = 0
        self.pins = self.pinned = 0
        self.straddles = []

    def gen(self, p):
        if random.random() < 0.08:
            bad = random.choice(BAD_SHARES)
            return bad, True
        if random.random() < 0.04:
            p.limit = random.choice(SHARE_LIMITS)
        rate, cap = p.limit
        args = [spell(rate), spell(cap), random.choice(p.holders),
                spell(random.choice(SHARE_WANTS)), str(random.choice(SHARE_PERIODS))]
        opts = []
        if random.random() < 0.12:
            opts.append(random.choice(["RELEASE", "release"]))
        if p.versions:
            if random.random() < 0.1:
                p.version += 1
            v = random.choice([p.version, p.version, max(0, p.version - 1), 0])
            opts += ["VERSION", str(v)]
        random.shuffle(opts) if "VERSION" not in opts else None
        return args + opts, False

    def pin_step(self, p):
        """RL.PIN (rate cap, BLOCK, EXEMPT; maybe PX; SHARES where the key may not exist
        yet), RL.UNPIN or RL.PINNED on a share pair: the same replies (RL.PINNED's ms_left
        within the tolerance), the same expiries."""
        choice = random.random()
        if choice < 0.25:
            cmd, fn, what = "RL.UNPIN", "rl_unpin", []
        elif choice < 0.4:
            cmd, fn, what = "RL.PINNED", "rl_pinned", []
        else:
            cmd, fn = "RL.PIN", "rl_pin"
            kind = random.random()
            if kind < 0.3:
                what = [random.choice(["BLOCK", "block"])]
            elif kind < 0.5:
                what = ["EXEMPT"]
            else:
                rate, cap = random.choice(SHARE_LIMITS)
                what = [spell(rate), spell(cap)]
            if self.r.exists(p.m) == 0 or random.random() < 0.3:
                what = ["SHARES", *what]
            px = random.choice(PIN_PX)
            if px:
                what += ["PX", str(px)]
        pipe = self.r.pipeline(transaction=True)
        pipe.execute_command("TIME")
        pipe.execute_command("HGET", p.f, "P")
        calls = [[cmd, p.m, *what], ["FCALL", fn, 1, p.f, *what]]
        first_module = random.random() < 0.5
        for c in (calls if first_module else calls[::-1]):
            pipe.execute_command(*c)
        pipe.execute_command("TIME")
        pipe.execute_command("PEXPIRETIME", p.m)
        pipe.execute_command("PEXPIRETIME", p.f)
        out = pipe.execute(raise_on_error=False)
        t0, pin_before, a, b, t1, em, ef = out
        rm, rf = (a, b) if first_module else (b, a)
        if t0 == t1:
            t1 = self.r.time()
        window = (t1[0] - t0[0]) * 1e6 + (t1[1] - t0[1]) + 2
        tol = window + p.max_window_us
        self.pins += 1
        call_us = t0[0] * 1e6 + t0[1]
        near = False
        if pin_before:
            until = int(pin_before.split()[1])
            near = until != 0 and call_us - tol <= until <= call_us + tol
        try:
            if isinstance(rm, Exception) or isinstance(rf, Exception):
                if str(rm) != str(rf):
                    raise Mismatch(f"errors differ: {rm!r} vs {rf!r}")
                return
            if cmd == "RL.PINNED" and rm and rf:
                def fields(x):
                    d = {(k.decode() if isinstance(k, bytes) else k): v
                         for k, v in as_map(x).items()}
                    return {k: v if v is None or k in ("kind", "ms_left") else as_float(v)
                            for k, v in d.items()}
                mm, mf = fields(rm), fields(rf)
                lm, lf = mm.pop("ms_left"), mf.pop("ms_left")
                if mm != mf:
                    raise Mismatch(f"pinned {mm!r} vs {mf!r}")
                if lm != lf and abs(lm - lf) > 1 + tol / 1000:
                    raise Mismatch(f"ms_left {lm} vs {lf}")
            elif rm != rf:
                raise Mismatch(f"{rm!r} vs {rf!r}")
            if em != ef and abs(em - ef) > 1 + tol / 1000:
                raise Mismatch(f"expiry {em} vs {ef}")
        except Mismatch as e:
            if near:
                self.straddles.append(f"{cmd} {what}: {e}")
                self.pairs[self.pairs.index(p)] = SharePair()
                return
            raise Mismatch(f"{cmd} {what} (protocol {self.protocol}): {e}") from None
        # The two sides' pin ends (and the expiries they set) are this call's window apart:
        # later comparisons of the pair allow it (a slow machine widens it, nothing else).
        p.max_window_us = max(p.max_window_us, window)

    def step(self):
        if random.random() < 0.06:
            time.sleep(random.choice([0.01, 0.05, 0.26]))  # holds (250 ms) and leases lapse
        p = random.choice(self.pairs)
        if random.random() < 0.07:
            return self.pin_step(p)
        args, bad = self.gen(p)
        first_module = random.random() < 0.5
        pipe = self.r.pipeline(transaction=not bad)
        pipe.execute_command("TIME")
        pipe.execute_command("HGETALL", p.f)
        calls = [["RL.SHARE", p.m, *args], ["FCALL", "rl_share", 1, p.f, *args]]
        for c in (calls if first_module else calls[::-1]):
            pipe.execute_command(*c)
        pipe.execute_command("TIME")
        pipe.execute_command("PEXPIRETIME", p.m)
        pipe.execute_command("PEXPIRETIME", p.f)
        out = pipe.execute(raise_on_error=False)
        t0, before, a, b, t1, em, ef = out
        rm, rf = (a, b) if first_module else (b, a)
        if t0 == t1:  # TIME frozen in MULTI (Redis >= 7.2, Valkey): close with a later one
            t1 = self.r.time()
        window = (t1[0] - t0[0]) * 1e6 + (t1[1] - t0[1]) + 2
        tol = window + p.max_window_us
        self.calls += 1
        em_, ef_ = isinstance(rm, Exception), isinstance(rf, Exception)
        if em_ or ef_:
            if not (em_ and ef_) or str(rm) != str(rf):
                raise Mismatch(f"{args}: errors differ: {rm!r} vs {rf!r}")
            self.errors += 1
            return
        if bad:
            raise Mismatch(f"{args}: expected an error, got {rm!r} / {rf!r}")
        # Instants of the library's entries before the call (µs): a lease or hold ending
        # within the tolerance of the call may have ended on one side only.
        ends = []
        if isinstance(before, dict):
            before = [x for kv in before.items() for x in kv]
        for k, v in zip(before[::2], before[1::2]):
            if k == b"P":
                ends.append(int(v.split()[1]))  # a pin's end
            elif k not in (b"R", b"C", b"V"):
                parts = v.split()
                ends += [int(parts[3]), int(parts[6])]
        call_us = t0[0] * 1e6 + t0[1]
        near = any(call_us - tol <= e <= call_us + tol for e in ends)
        try:
            self.compare(rm, rf, tol, near)
            if em != ef and abs(em - ef) > 1 + tol / 1000:
                raise Mismatch(f"expiry {em} vs {ef}")
        except Mismatch as e:
            if near:
                self.straddles.append(f"{args}: {e}")
                idx = self.pairs.index(p)
                self.pairs[idx] = SharePair()
                return
            raise Mismatch(f"{args} (protocol {self.protocol}, window {window:.0f} us, "
                           f"tolerance {tol:.0f} us): {e}\n  module:  {rm!r}\n  library: "
                           f"{rf!r}\n  library state before: {before!r}") from None
        p.max_window_us = max(p.max_window_us, window)
        self.equal += 1
        self.pinned += len(rm) > 5
        self.shorts += rm[3] < max(300, int(args[4]))  # periods under 300 ms are raised
        self.releases += any(str(x).upper() == "RELEASE" for x in args)

    def compare(self, rm, rf, tol, near):
        for i, what in ((0, "rate"), (1, "burst")):
            if as_float(rm[i]) != as_float(rf[i]):
                raise Mismatch(f"{what} {rm[i]!r} vs {rf[i]!r}")
            if self.protocol == 3 and not isinstance(rf[i], float):
                raise Mismatch(f"{what}: not a double under RESP3: {rf[i]!r}")
        # A call within the hold of a call that shrank the share is answered with what is
        # left of its lease, counted from each side's own instant.
        if rm[4] != rf[4] or (rm[2] != rf[2] and abs(rm[2] - rf[2]) > 1 + tol / 1000):
            raise Mismatch(f"lease_ms / holders {rm[2]}, {rm[4]} vs {rf[2]}, {rf[4]}")
        if rm[3] != rf[3] and abs(rm[3] - rf[3]) > 1 + tol / 1000:
            raise Mismatch(f"refresh_ms {rm[3]} vs {rf[3]}")
        # The pin's kind, only when a pin decided.
        if rm[5:] != rf[5:]:
            raise Mismatch(f"pin {rm[5:]!r} vs {rf[5:]!r}")

    def run(self):
        self.budgets = []  # reservations RL.BUDGET granted: pairs, costs, both ids, expiry
        random.seed(self.rng.random())
        for _ in range(self.ops):
            self.step()
        rate = len(self.straddles) / max(1, self.calls)
        for s in self.straddles[:12]:
            print(f"    straddle: {s}")
        # Each straddle is explained (an end within the tolerance); the bound is wider than
        # the buckets' because a share key's boundaries are dense: with a 10 ms period a
        # lease ends every 30 ms, and every call starts a 250 ms hold.
        assert rate < MAX_SHARE_STRADDLE_RATE, f"straddles {rate:.4%} >= 2%"
        return (f"{self.calls} pairs; {self.errors} error replies compared; "
                f"{self.equal} replies equal, {self.shorts} short, {self.releases} "
                f"releases, {self.pinned} decided by a pin; {self.pins} pin calls; "
                f"straddles {len(self.straddles)} ({100 * rate:.3f}%)")


def share_cross_type_checks(server):
    """Shares are not interchangeable with buckets, or between module and library."""
    r = server.client()
    r.execute_command("RL.SHARE", "xs:module", 10, 10, "h", 1, 1000)
    r.execute_command("FCALL", "rl_share", 1, "xs:library", 10, 10, "h", 1, 1000)
    r.execute_command("RL.TAKE", "xs:mbucket", 1, 1)
    r.execute_command("FCALL", "rl_take", 1, "xs:lbucket", 1, 1)
    wrong = "WRONGTYPE Operation against a key holding the wrong kind of value"
    for c, want in [
            (["RL.SHARE", "xs:library", 10, 10, "h", 1, 1000], wrong),
            (["RL.TAKE", "xs:module", 1, 1], wrong),
            (["FCALL", "rl_share", 1, "xs:module", 10, 10, "h", 1, 1000], wrong),
            (["FCALL", "rl_share", 1, "xs:mbucket", 10, 10, "h", 1, 1000], wrong),
            (["FCALL", "rl_share", 1, "xs:lbucket", 10, 10, "h", 1, 1000],
             "WRONGTYPE the hash at this key is a bucket of this library, not a rate share"),
            (["FCALL", "rl_take", 1, "xs:library", 1, 1],
             "WRONGTYPE the hash at this key is not a bucket of this library (it is a rate "
             "share of this library (rl_share))")]:
        try:
            r.execute_command(*c)
        except redis.ResponseError as e:
            assert str(e) == want, (c, str(e))
            continue
        raise AssertionError(f"{c} did not fail with WRONGTYPE")



# Fixed sequences whose sums of the others' shares round: the library must take them as
# share.rs's Sum does (exact when no addition rounds, else raised by the worst rounding),
# or a short holder's rate or burst differs from the module's in the last places.
SHARE_EDGE_SEQUENCES = [
    [["100", "10", "a", "7"], ["100", "10", "c", "5"], ["100", "10", "b", "0"],
     ["100", "10", "a", "7"], ["100", "10", "c", "5"], ["7.7", "13.5", "d", "1"],
     ["7.7", "13.5", "e", "3"], ["7.7", "13.5", "a", "100"], ["7.7", "13.5", "g", "50"]],
    [["0.3333", "2", "a", "0.1"], ["0.3333", "2", "b", "7.7"], ["0.3333", "2", "c", "1e15"],
     ["0.3333", "2", "a", "33"], ["0.3333", "2", "d", "2.5"], ["0.3333", "2", "e", "0.1"]],
    [["1e-9", "1e-9", "a", "1e15"], ["1e-9", "1e-9", "b", "5e-324"],
     ["1e-9", "1e-9", "c", "1e-300"], ["1e-9", "1e-9", "a", "0"],
     ["1e-9", "1e-9", "d", "1e15"]],
]


def share_edge_cases(server):
    """Each call of a fixed sequence on a module key and a library key in one MULTI (one
    instant, long periods): equal replies, rate and burst as exact doubles."""
    r = server.client(protocol=3)
    for n, seq in enumerate(SHARE_EDGE_SEQUENCES):
        m, f = f"edge:m{n}", f"edge:f{n}"
        for call in seq:
            args = [*call, "3600000"]
            pipe = r.pipeline(transaction=True)
            pipe.execute_command("RL.SHARE", m, *args)
            pipe.execute_command("FCALL", "rl_share", 1, f, *args)
            rm, rf = pipe.execute()
            assert [as_float(x) for x in rm[:2]] == [as_float(x) for x in rf[:2]], \
                (args, rm, rf)
            assert rm[2] == rf[2] and rm[4] == rf[4], (args, rm, rf)


def run_shares(server, protocol, ops, seed):
    return ShareRunner(server, protocol, seed, ops).run()


# ---------------------------------------------------------------------------------------
# Pins: fixed sequences on a module key and a library key, every step of each in one MULTI
# with both keys' PTTL. Replies equal (doubles within 0.05 tokens: rates up to 100 over the
# calls' windows; milliseconds within 5 ms; lease ids both 0 or both not), PTTL both -1 (a
# pin without an end) or within 5 ms. The random differential above compares tightly.

PIN_SEQUENCES = [
    ("a share key pinned BLOCK before any holder: RELEASE, VERSION and want 0 under it", [
        ["RL.PIN", "K", "SHARES", "BLOCK"], ["RL.SHARE", "K", "100", "10", "a", "50", "1000",
                                             "RELEASE"],
        ["RL.SHARE", "K", "100", "10", "a", "50", "1000", "VERSION", "3"],
        ["RL.SHARE", "K", "100", "10", "b", "0", "1000"], ["RL.PINNED", "K"], ["EXISTS", "K"],
        ["RL.PIN", "K", "SHARES", "EXEMPT"], ["RL.SHARE", "K", "7", "3", "a", "1", "1000"],
        ["RL.UNPIN", "K"], ["EXISTS", "K"], ["RL.SHARE", "K", "100", "10", "a", "50", "1000"],
        ["RL.UNPIN", "K"]]),
    ("a share key through EXEMPT with versions, a shrinking rate pin ending by itself", [
        ["RL.SHARE", "K", "100", "10", "a", "50", "1000"], ["RL.PIN", "K", "EXEMPT"],
        ["RL.SHARE", "K", "100", "10", "a", "50", "1000", "VERSION", "3"],
        ["RL.SHARE", "K", "10", "10", "b", "50", "1000", "VERSION", "2"],
        ["RL.SHARE", "K", "10", "10", "b", "50", "1000", "RELEASE"],
        ["RL.PIN", "K", "5", "5", "PX", "150"],
        ["RL.SHARE", "K", "100", "10", "b", "50", "1000", "VERSION", "1"],
        ["RL.SHARE", "K", "100", "10", "a", "50", "1000", "RELEASE"],
        ["RL.SHARE", "K", "100", "10", "c", "1", "1000"], ["RL.PINNED", "K"], ["SLEEP", "0.2"],
        ["RL.PINNED", "K"], ["RL.SHARE", "K", "100", "10", "c", "1", "1000"],
        ["RL.UNPIN", "K"], ["RL.PIN", "K", "SHARES", "1e15", "1e15"],
        ["RL.SHARE", "K", "1e15", "1e15", "d", "1e15", "300"], ["RL.UNPIN", "K"],
        ["RL.SHARE", "K", "1e15", "1e15", "d", "1e15", "300"]]),
    ("BLOCK on an absent key holds only the pin", [
        ["RL.PIN", "K", "BLOCK"], ["RL.TAKE", "K", "10", "10", "1", "WITHSTATE"],
        ["RL.TAKE", "K", "10", "10", "1"], ["RL.TAKE", "K", "10", "10", "1", "SHADOW"],
        ["RL.PEEK", "K"], ["RL.PINNED", "K"], ["RL.LEASE", "K", "10", "10", "2", "100"],
        ["RL.RESERVE", "K", "10", "10", "1", "1000"], ["RL.MTAKE", "1", "K", "10", "10",
                                                       "WITHSTATE"],
        ["RL.REFUND", "K", "1"], ["RL.RETURN", "K", "1", "1"], ["EXISTS", "K"],
        ["RL.UNPIN", "K"], ["EXISTS", "K"], ["RL.UNPIN", "K"]]),
    ("EXEMPT on an absent key, ending by itself", [
        ["RL.PIN", "K", "EXEMPT", "PX", "150"], ["RL.TAKE", "K", "1", "1", "1", "WITHSTATE"],
        ["RL.TAKE", "K", "1", "1", "1", "WITHSTATE"], ["RL.TAKE", "K", "1", "2", "3", "WITHSTATE"],
        ["RL.LEASE", "K", "1", "5", "3", "100"], ["RL.LEASE", "K", "1", "5", "9", "100"],
        ["RL.RESERVE", "K", "1", "5", "5", "0"], ["RL.PEEK", "K"], ["RL.PINNED", "K"],
        ["SLEEP", "0.2"], ["RL.PINNED", "K"], ["RL.TAKE", "K", "1", "1", "1", "WITHSTATE",
                                               "INIT", "0"],
        ["RL.PEEK", "K"]]),
    ("a rate pin keeps the callers' limit aside; versions during it", [
        ["RL.TAKE", "K", "10", "100", "50", "VERSION", "1"], ["RL.PIN", "K", "1", "10"],
        ["RL.PEEK", "K"], ["RL.TAKE", "K", "10", "100", "1", "WITHSTATE", "VERSION", "1"],
        ["RL.TAKE", "K", "10", "100", "11", "VERSION", "1"],
        ["RL.TAKE", "K", "20", "50", "1", "WITHSTATE", "VERSION", "2"], ["RL.PEEK", "K"],
        ["RL.TAKE", "K", "10", "100", "1", "WITHSTATE", "VERSION", "1"],
        ["RL.PINNED", "K"], ["RL.UNPIN", "K"], ["RL.PEEK", "K"],
        ["RL.TAKE", "K", "10", "100", "1", "WITHSTATE", "VERSION", "1"], ["RL.UNPIN", "K"]]),
    ("leases, returns, refunds, reservations and MTAKE under EXEMPT", [
        ["RL.TAKE", "K", "10", "10", "5"], ["RL.LEASE", "K", "10", "10", "3", "5000"],
        ["RL.PIN", "K", "EXEMPT"], ["RL.RETURN", "K", "{id}", "3"], ["RL.REFUND", "K", "2"],
        ["RL.LEASE", "K", "10", "10", "20", "100", "MIN", "2"],
        ["RL.LEASE", "K", "10", "20", "20", "100", "MIN", "15"],
        ["RL.RESERVE", "K", "10", "10", "4", "0"], ["RL.RESERVE", "K", "10", "10", "10", "0"],
        ["RL.MTAKE", "2", "K", "10", "10", "K2", "10", "10", "WITHSTATE"],
        ["RL.MTAKE", "12", "K", "10", "20", "K2", "10", "20"],
        ["RL.PEEK", "K"], ["RL.UNPIN", "K"], ["RL.PEEK", "K"]]),
    ("a rate pin ending by itself carries its tokens over", [
        ["RL.TAKE", "K", "100", "100", "90"], ["RL.PIN", "K", "5", "5", "PX", "60"],
        ["RL.TAKE", "K", "100", "100", "1", "WITHSTATE"], ["RL.TAKE", "K", "100", "100", "6"],
        ["RL.PEEK", "K"], ["SLEEP", "0.1"], ["RL.PEEK", "K"],
        ["RL.TAKE", "K", "100", "100", "1", "WITHSTATE"], ["RL.PINNED", "K"]]),
    ("BLOCK over a bucket: a lease returned under it credits, nothing is taken", [
        ["RL.LEASE", "K", "10", "10", "6", "5000"], ["RL.PIN", "K", "BLOCK", "PX", "5000"],
        ["RL.LEASE", "K", "10", "10", "1", "1000", "RETURN", "{id}", "4"],
        ["RL.TAKE", "K", "10", "10", "1", "WITHSTATE"], ["RL.REFUND", "K", "1"],
        ["RL.RESERVE", "K", "10", "10", "1", "86400000", "SHADOW"],
        ["RL.MTAKE", "1", "K2", "10", "10", "K", "10", "10"], ["RL.PEEK", "K"],
        ["RL.PIN", "K", "3", "3"], ["RL.PEEK", "K"], ["RL.PIN", "K", "EXEMPT", "PX", "50"],
        ["RL.PEEK", "K"], ["RL.UNPIN", "K"], ["RL.PEEK", "K"]]),
    ("a rate pin's cap below what a call needs denies it until the pin ends", [
        ["RL.TAKE", "K", "10", "10", "3"], ["RL.PIN", "K", "1", "4"],
        ["RL.TAKE", "K", "10", "10", "5", "WITHSTATE"], ["RL.TAKE", "K", "10", "10", "5"],
        ["RL.TAKE", "K", "10", "10", "5", "SHADOW"],
        ["RL.LEASE", "K", "10", "10", "9", "100", "MIN", "5"],
        ["RL.LEASE", "K", "10", "10", "9", "100", "MIN", "2"],
        ["RL.RESERVE", "K", "10", "10", "5", "86400000"],
        ["RL.RESERVE", "K", "10", "10", "5", "86400000", "SHADOW"],
        ["RL.MTAKE", "5", "K", "10", "10", "K2", "10", "10", "WITHSTATE"],
        ["RL.TAKE", "K", "10", "20", "5", "WITHSTATE", "VERSION", "1"], ["RL.PEEK", "K"],
        ["RL.TAKE", "K", "10", "10", "1", "WITHSTATE"], ["RL.UNPIN", "K"],
        ["RL.TAKE", "K", "10", "10", "5", "WITHSTATE"], ["RL.PEEK", "K"]]),
    ("over a rate pin's cap: a lease returned credits, the new one is denied", [
        ["RL.LEASE", "K", "10", "10", "6", "5000"], ["RL.PIN", "K", "1", "4.5", "PX", "100000"],
        ["RL.LEASE", "K", "10", "10", "9", "1000", "MIN", "5", "RETURN", "{id}", "4"],
        ["RL.PEEK", "K"], ["RL.TAKE", "K", "10", "10", "5", "WITHSTATE"],
        ["RL.TAKE", "K", "10", "10", "4", "WITHSTATE"],
        ["RL.LEASE", "K", "10", "10", "9", "1000", "MIN", "5", "SHADOW"],
        ["RL.RESERVE", "K", "10", "10", "5", "0"], ["RL.PEEK", "K"]]),
    ("over a rate pin's cap with versions: a newer one is kept, an older one changes nothing", [
        ["RL.TAKE", "K", "10", "10", "1", "VERSION", "5"], ["RL.PIN", "K", "1", "2"],
        ["RL.TAKE", "K", "10", "10", "3", "WITHSTATE", "VERSION", "4"], ["RL.PEEK", "K"],
        ["RL.TAKE", "K", "10", "30", "3", "WITHSTATE", "VERSION", "6"], ["RL.PEEK", "K"],
        ["RL.RESERVE", "K", "20", "40", "3", "1000", "VERSION", "7", "SHADOW"],
        ["RL.PEEK", "K"],
        ["RL.LEASE", "K", "20", "50", "9", "100", "MIN", "3", "VERSION", "8"],
        ["RL.PEEK", "K"],
        ["RL.MTAKE", "3", "K", "20", "60", "K2", "10", "10", "VERSION", "9"],
        ["RL.PEEK", "K"], ["RL.PEEK", "K2"], ["RL.UNPIN", "K"], ["RL.PEEK", "K"],
        ["RL.TAKE", "K", "20", "60", "3", "WITHSTATE", "VERSION", "9"]]),
    ("MTAKE: an over-cap pin against a BLOCK, in both orders, and a pin ending by itself", [
        ["RL.PIN", "K", "1", "2", "PX", "120"], ["RL.PIN", "K2", "BLOCK"],
        ["RL.MTAKE", "3", "K", "10", "10", "K2", "10", "10", "WITHSTATE"],
        ["RL.MTAKE", "3", "K2", "10", "10", "K", "10", "10"],
        ["RL.MTAKE", "2", "K", "10", "10"], ["RL.MTAKE", "3", "K", "10", "10"],
        ["SLEEP", "0.2"], ["RL.MTAKE", "3", "K", "10", "10", "WITHSTATE"],
        ["RL.PEEK", "K"], ["RL.TAKE", "K", "10", "10", "7", "WITHSTATE"]]),
    ("a rate pin on an absent key starts full; errors", [
        ["RL.PIN", "K", "2", "4", "PX", "10000"], ["RL.PEEK", "K"],
        ["RL.TAKE", "K", "100", "100", "5"],
        ["RL.LEASE", "K", "100", "100", "9", "100", "MIN", "5"],
        ["RL.RESERVE", "K", "100", "100", "5", "10"],
        ["RL.MTAKE", "5", "K", "100", "100"], ["RL.TAKE", "K", "100", "100", "4", "WITHSTATE"],
        ["RL.PIN", "K", "2", "4", "PX", "0"], ["RL.PIN", "K", "BLOCK", "PX"],
        ["RL.UNPIN", "K"], ["EXISTS", "K"]]),
]

FN_OF = {"RL.TAKE": "rl_take", "RL.LEASE": "rl_lease", "RL.RETURN": "rl_return",
         "RL.PEEK": "rl_peek", "RL.RESERVE": "rl_reserve", "RL.REFUND": "rl_refund",
         "RL.PIN": "rl_pin", "RL.UNPIN": "rl_unpin", "RL.PINNED": "rl_pinned",
         "RL.SHARE": "rl_share"}


def _side(step, prefix, tag, lease_id):
    """The step on one side's keys (`K`, `K2`), module command or library FCALL."""
    args = [prefix + tag + a if a in ("K", "K2") else (str(lease_id) if a == "{id}" else a)
            for a in step]
    if prefix == "m:" or args[0] == "EXISTS":
        return args
    if args[0] == "RL.MTAKE":
        n, rest = args[1], args[2:]
        keys = rest[0::3][:len(rest) // 3]
        limits = [x for i in range(len(keys)) for x in rest[3 * i + 1:3 * i + 3]]
        opts = rest[3 * len(keys):]
        return ["FCALL", "rl_mtake", len(keys), *keys, n, *limits, *opts]
    return ["FCALL", FN_OF[args[0]], 1, args[1], *args[2:]]


def _same(a, b, where):
    if isinstance(a, Exception) or isinstance(b, Exception):
        if str(a) != str(b) or type(a) is not type(b):
            raise Mismatch(f"{where}: {a!r} vs {b!r}")
        return
    if isinstance(a, (dict, list)) and isinstance(b, (dict, list)):
        a, b = as_map(a) if isinstance(a, dict) else a, as_map(b) if isinstance(b, dict) else b
    if isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            raise Mismatch(f"{where}: fields {sorted(a)} vs {sorted(b)}")
        for k in a:
            _same(a[k], b[k], f"{where}.{k!r}")
        return
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            raise Mismatch(f"{where}: {a!r} vs {b!r}")
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{where}[{i}]")
        return
    if isinstance(a, int) and isinstance(b, int):
        if a == b or (a >= 10**12 and b >= 10**12) or (abs(a - b) <= 5 and min(a, b) > 5):
            return  # lease ids (each side's clock), milliseconds counting down
        raise Mismatch(f"{where}: {a!r} vs {b!r}")
    if isinstance(a, bytes) and isinstance(b, bytes):
        if a == b:
            return
        if a[:2] in (b"m:", b"f:") and a[2:] == b[2:]:
            return  # the denying key, on each side's name
        try:
            if abs(float(a) - float(b)) <= 0.05:
                return
        except ValueError:
            pass
        raise Mismatch(f"{where}: {a!r} vs {b!r}")
    if isinstance(a, float) or isinstance(b, float):
        if a is not None and b is not None and abs(float(a) - float(b)) <= 0.05:
            return
    if a != b:
        raise Mismatch(f"{where}: {a!r} vs {b!r}")


def pin_sequences(server, protocol):
    """Each sequence of PIN_SEQUENCES on m:* and f:* keys: equal replies and expiries, and
    the library's pin-only keys hold the field p alone."""
    r = server.client(protocol=protocol)
    steps = 0
    for n, (about, seq) in enumerate(PIN_SEQUENCES):
        ids = {"m:": 0, "f:": 0}
        for k in ("K", "K2"):
            r.delete(f"m:ps{n}{k}", f"f:ps{n}{k}")
        for i, step in enumerate(seq):
            if step[0] == "SLEEP":
                time.sleep(float(step[1]))
                continue
            pipe = r.pipeline(transaction=True)
            for prefix in ("m:", "f:"):
                pipe.execute_command(*_side(step, prefix, f"ps{n}", ids[prefix]))
            pipe.execute_command("PTTL", f"m:ps{n}K")
            pipe.execute_command("PTTL", f"f:ps{n}K")
            rm, rf, tm, tf = pipe.execute(raise_on_error=False)
            where = f"{about}: step {i} {step} (RESP{protocol})"
            if step[0] in ("RL.PEEK", "RL.PINNED"):  # fields in any order (RESP2: a list)
                rm, rf = as_map(rm), as_map(rf)
            _same(rm, rf, where)
            if (tm == -1) != (tf == -1) or (tm >= 0 and abs(tm - tf) > 5):
                raise Mismatch(f"{where}: PTTL {tm} vs {tf}")
            if step[0] == "RL.LEASE" and isinstance(rm, list) and rm[1]:
                ids["m:"], ids["f:"] = rm[1], rf[1]
            steps += 1
    # A key pinned before use holds only the pin (the library: field p alone).
    r.execute_command("FCALL", "rl_pin", 1, "f:only", "BLOCK")
    fields = r.hkeys("f:only")
    assert fields == [b"p"], fields
    assert r.pttl("f:only") == -1
    r.execute_command("FCALL", "rl_unpin", 1, "f:only")
    assert not r.exists("f:only")
    return steps
