"""What the benchmark measures: limits, workloads, profile parts and targets.

Everything the renderer names (a function in a cost table, a target) is declared here, so
that measuring and rendering agree on it.
"""

# A limit that grants every call of a run (a billion tokens of capacity) while keeping the
# key alive between calls (1000 tokens/s refill, far below the request rate): the common
# case of a busy key under its limit, updated in place.
GRANT_LIMIT = ["1000", "1000000000"]
# One token per 11.6 days: once the single token is taken, every call is denied.
DENY_LIMIT = ["0.000001", "1"]
RANDOM_KEYS = 100_000
# Keys of the profile where every call finds its key expired (see PROFILES).
EXPIRED_KEYS = 10_000
LEASE_KEYS = 1_000
LEASE_TTL_MS = "100"
SHARE_PERIOD_MS = "3600000"
# INCR on a counter past Redis's shared integers (0..9999) updates the value in place, its
# steady state; below them each call swaps in a shared object (a different, slower path).
INCR_START = ["SET", "k:1", "1000000"]
CLIENTS = 50


class Counts:
    """How much to run: the full run, or the --quick smoke run (proves the pipeline only)."""

    def __init__(self, quick):
        self.quick = quick
        self.n_p1 = 2_000 if quick else 60_000
        self.n_p16 = 10_000 if quick else 300_000
        self.repeats = 1 if quick else 5
        self.buckets = 10_000 if quick else 1_000_000
        self.profile_calls = 1_000 if quick else 20_000
        # The library section's calls per case under callgrind, and timed (per round).
        self.library_calls = 300 if quick else 3_000
        self.library_timed = 2_000 if quick else 100_000
        # RL.SHARE at scale: holders on one key, and the calls timed once they settled.
        self.share_holders = [50, 200] if quick else [1_000, 4_096]
        self.share_calls = 300 if quick else 3_000
        self.share_batches = 1 if quick else 5
        # One hot key: processes of each client, and how long they take.
        self.hot_procs = 2 if quick else 8
        self.hot_seconds = 1 if quick else 10
        # RL.SHARE under skew (benchtool/share_skew.py): how long each case runs, and which
        # cases (client, backend, scenario) run; the smoke run one per client and backend.
        self.skew_seconds = 3 if quick else 12
        self.skew_cases = SKEW_CASES_QUICK if quick else SKEW_CASES

    def as_dict(self):
        return dict(vars(self))


# --------------------------------------------------------------------------------------------
# Throughput rows: key, label, args, cmdstat name, -r, setup commands, the Lua row to compare
# with, the INCR row to compare with, the path every call must take.

LUA = ["EVALSHA", "SHA", "1"]
# The Functions library (functions/rl.lua), loaded next to the module: the same protocol
# where modules cannot load.
FN_TAKE = ["FCALL", "rl_take", "1"]
FN_LEASE = ["FCALL", "rl_lease", "1"]

THROUGHPUT_ROWS = [
    dict(key="incr", label="INCR (the floor)", args=["INCR", "k:1"], stat="incr",
         pre=[INCR_START], incr=None),
    dict(key="incr_rand", label="INCR, 100k random keys", args=["INCR", "k:__rand_int__"],
         stat="incr", rand=RANDOM_KEYS, incr=None),
    dict(key="grant", label="RL.TAKE, grant path", args=["RL.TAKE", "rl:grant", *GRANT_LIMIT, "1"],
         stat="rl.take", lua="lua_grant", expect="granted"),
    dict(key="deny", label="RL.TAKE, deny path (empty bucket)",
         args=["RL.TAKE", "rl:deny", *DENY_LIMIT, "1"], stat="rl.take",
         pre=[["RL.TAKE", "rl:deny", *DENY_LIMIT, "1"]], lua="lua_deny", expect="denied"),
    dict(key="rand", label="RL.TAKE, 100k random keys",
         args=["RL.TAKE", "rl:__rand_int__", *GRANT_LIMIT, "1"], stat="rl.take",
         rand=RANDOM_KEYS, lua="lua_rand", incr="incr_rand", expect="granted"),
    dict(key="withstate", label="RL.TAKE ... WITHSTATE (grant)",
         args=["RL.TAKE", "rl:ws", *GRANT_LIMIT, "1", "WITHSTATE"], stat="rl.take",
         lua="lua_grant", expect="granted"),
    dict(key="lease", label="RL.LEASE, batch of 20 (1000 keys)",
         args=["RL.LEASE", "rl:lease:__rand_int__", *GRANT_LIMIT, "20", LEASE_TTL_MS],
         stat="rl.lease", rand=LEASE_KEYS, lua="lua_lease"),
    dict(key="reserve", label="RL.RESERVE, grant path",
         args=["RL.RESERVE", "rl:reserve", *GRANT_LIMIT, "1", "0"], stat="rl.reserve"),
    dict(key="acquire", label="RL.ACQUIRE (1000 keys, 100 ms permits)",
         args=["RL.ACQUIRE", "rl:sem:__rand_int__", "10000", LEASE_TTL_MS],
         stat="rl.acquire", rand=LEASE_KEYS),
    dict(key="release", label="RL.RELEASE of an unknown permit (no-op path)",
         args=["RL.RELEASE", "rl:sem:1", "1"], stat="rl.release"),
    dict(key="lua_grant", label="Lua script, grant path", args=[*LUA, "lua:grant", *GRANT_LIMIT, "1"],
         stat="evalsha", expect="granted"),
    dict(key="lua_deny", label="Lua script, deny path", args=[*LUA, "lua:deny", *DENY_LIMIT, "1"],
         stat="evalsha", pre=[[*LUA, "lua:deny", *DENY_LIMIT, "1"]], expect="denied"),
    dict(key="lua_rand", label="Lua script, 100k random keys",
         args=[*LUA, "lua:__rand_int__", *GRANT_LIMIT, "1"], stat="evalsha", rand=RANDOM_KEYS,
         incr="incr_rand", expect="granted"),
    dict(key="lua_lease", label="Lua script, batch of 20 (1000 keys)",
         args=[*LUA, "lua:lease:__rand_int__", *GRANT_LIMIT, "20"], stat="evalsha",
         rand=LEASE_KEYS),
    dict(key="fn_grant", label="Functions library `rl_take`, grant path",
         args=[*FN_TAKE, "fn:grant", *GRANT_LIMIT, "1"], stat="fcall", lua="lua_grant",
         expect="granted"),
    dict(key="fn_deny", label="Functions library `rl_take`, deny path",
         args=[*FN_TAKE, "fn:deny", *DENY_LIMIT, "1"], stat="fcall",
         pre=[[*FN_TAKE, "fn:deny", *DENY_LIMIT, "1"]], lua="lua_deny", expect="denied"),
    dict(key="fn_lease", label="Functions library `rl_lease`, batch of 20 (1000 keys)",
         args=[*FN_LEASE, "fn:lease:__rand_int__", *GRANT_LIMIT, "20", LEASE_TTL_MS],
         stat="fcall", rand=LEASE_KEYS, lua="lua_lease"),
]  # fmt: skip
for _row in THROUGHPUT_ROWS:
    _row.setdefault("rand", None)
    _row.setdefault("pre", [])
    _row.setdefault("lua", None)
    _row.setdefault("incr", "incr")
    _row.setdefault("expect", None)


# --------------------------------------------------------------------------------------------
# Servers profiled with callgrind. `flavor` picks the function names (Valkey renamed the
# module API's RM_ functions to VM_).

SERVERS = {
    "redis7": dict(label="Redis 7.0", how="`redis-server` on PATH (Debian), or `RL_SERVER`",
                   flavor="redis7", primary=True),
    "redis8": dict(label="Redis 8.2", how="`RL_SERVER=$(scripts/redis8-server)`",
                   flavor="redis8", primary=False),
    "valkey9": dict(label="Valkey 9", how="`RL_SERVER=$(scripts/valkey-server)`",
                    flavor="valkey", primary=False),
}  # fmt: skip

# The function Redis times for `INFO commandstats`: a workload's "command" cost.
ROOTS = {
    "incr": {"redis7": "incrCommand", "redis8": "incrCommand", "valkey": "incrCommand"},
    "module": {"redis7": "RedisModuleCommandDispatcher", "redis8": "RedisModuleCommandDispatcher",
               "valkey": "ValkeyModuleCommandDispatcher"},
    "lua": {"redis7": "evalShaCommand", "redis8": "evalShaCommand", "valkey": "evalShaCommand"},
}  # fmt: skip


def _all(name, valkey=None):
    return {"redis7": name, "redis8": name, "valkey": valkey or name}


def _rm(name):
    return _all("RM_" + name, "VM_" + name)


# Named parts of a command's cost: logical key -> function name per flavor (a flavor without
# an entry does not track the part: Redis 8.2 inlines some of these under LTO).
PARTS = {
    "replicate": _rm("Replicate"),
    "argv": _all("moduleCreateArgvFromUserFormat"),
    "lookup_cmd": {"redis7": "lookupCommandByCString"},
    "open_key": _rm("OpenKey"),
    "key_expired": {"redis7": "keyIsExpired"},
    "limit_parse": _all("redis_rl::grammar::limit"),
    "set_expire": _rm("SetAbsExpire"),
    "type_set": {"redis7": "RM_ModuleTypeSetValue", "valkey": "VM_ModuleTypeSetValue"},
    "close_key": {"redis7": "RM_CloseKey", "valkey": "VM_CloseKey"},
    "reply_ll": _rm("ReplyWithLongLong"),
    "reply_double": _all("redis_rl::ffi::reply::reply_double"),
    "ctx_create": {"redis7": "moduleCreateContext", "valkey": "moduleCreateContext"},
    "ctx_free": {"redis7": "moduleFreeContext", "valkey": "moduleFreeContext"},
    "take": _all("redis_rl::bucket::take::take"),
    "lease": _all("redis_rl::bucket::lease::lease"),
    "script_call": {"redis7": "scriptCall"},
    "time_cmd": {"redis7": "timeCommand"},
    "hmget_cmd": {"redis7": "hmgetCommand"},
    "hset_cmd": {"redis7": "hsetCommand"},
    "lua_gc": {"redis7": "lua_gc"},
    "strtod": {"redis7": "____strtod_l_internal"},
    "printf_fp": {"redis7": "__printf_fp_l"},
}  # fmt: skip

# The callgrind workloads: key, name, args, -r, setup, root kind, the parts it must contain
# (a tracked part that is absent is an error) and the parts it must not call (shown as "not
# called"; present anyway, its cost is shown).
PROFILES = [
    dict(key="incr", name="INCR", args=["INCR", "k:1"], pre=[INCR_START], root="incr"),
    dict(key="incr_rand", name="INCR, 100k random keys", args=["INCR", "k:__rand_int__"],
         rand=RANDOM_KEYS, root="incr"),
    dict(key="grant", name="RL.TAKE grant", args=["RL.TAKE", "rl:g", *GRANT_LIMIT, "1"],
         root="module",
         parts=["replicate", "lookup_cmd", "argv", "open_key", "key_expired", "limit_parse",
                "set_expire", "close_key", "reply_ll", "ctx_create", "ctx_free", "take"]),
    dict(key="deny", name="RL.TAKE deny", args=["RL.TAKE", "rl:d", *DENY_LIMIT, "1"],
         pre=[["RL.TAKE", "rl:d", *DENY_LIMIT, "1"]], root="module",
         parts=["open_key", "key_expired", "limit_parse", "close_key", "reply_ll",
                "ctx_create", "ctx_free", "take"],
         absent=["replicate", "lookup_cmd", "argv", "set_expire"]),
    dict(key="rand", name="RL.TAKE, 100k random keys",
         args=["RL.TAKE", "rl:__rand_int__", *GRANT_LIMIT, "1"], rand=RANDOM_KEYS, root="module",
         parts=["replicate", "type_set", "set_expire", "open_key", "limit_parse", "take"],
         same_keys="incr_rand"),
    dict(key="withstate", name="RL.TAKE WITHSTATE",
         args=["RL.TAKE", "rl:w", *GRANT_LIMIT, "1", "WITHSTATE"], root="module",
         parts=["replicate", "reply_double", "open_key", "limit_parse", "take"]),
    dict(key="lease", name="RL.LEASE batch 20",
         args=["RL.LEASE", "rl:l:__rand_int__", *GRANT_LIMIT, "20", LEASE_TTL_MS],
         rand=LEASE_KEYS, root="module",
         parts=["replicate", "argv", "open_key", "limit_parse", "reply_ll", "lease"]),
    dict(key="reserve", name="RL.RESERVE grant",
         args=["RL.RESERVE", "rl:r", *GRANT_LIMIT, "1", "0"], root="module",
         parts=["replicate", "open_key", "limit_parse"]),
    dict(key="acquire", name="RL.ACQUIRE, 1000 keys",
         args=["RL.ACQUIRE", "rl:s:__rand_int__", "10000", LEASE_TTL_MS], rand=LEASE_KEYS,
         root="module", parts=["replicate", "open_key"]),
    dict(key="release", name="RL.RELEASE, unknown permit",
         args=["RL.RELEASE", "rl:s:1", "1"], root="module", parts=["open_key"],
         absent=["replicate"]),
    # One holder of 16 refreshing its share (the others joined first; leases of 3 hours).
    dict(key="share16", name="RL.SHARE, 16 holders",
         args=["RL.SHARE", "rl:sh", *GRANT_LIMIT, "h00", "10", SHARE_PERIOD_MS],
         pre=[["RL.SHARE", "rl:sh", *GRANT_LIMIT, f"h{i:02d}", "10", SHARE_PERIOD_MS]
              for i in range(16)],
         root="module", parts=["replicate", "open_key"]),
    dict(key="lua_grant", name="Lua grant", args=[*LUA, "lua:g", *GRANT_LIMIT, "1"], root="lua",
         parts=["script_call", "time_cmd", "hmget_cmd", "hset_cmd", "lua_gc", "strtod",
                "printf_fp"]),
    dict(key="lua_deny", name="Lua deny", args=[*LUA, "lua:d", *DENY_LIMIT, "1"],
         pre=[[*LUA, "lua:d", *DENY_LIMIT, "1"]], root="lua"),
    # The per-caller path when every key was used before: 10k keys, all called once in the
    # warm-up (3x the calls: 99.75% of the keys) with the server's active expiry off, so
    # that each measured call finds its key expired and not yet deleted (the keys refill in
    # 1 ms). Redis 8 reuses the value in place (REDISMODULE_OPEN_KEY_ACCESS_EXPIRED); the
    # other servers delete the key first and add it again.
    dict(key="rand_expired", name="RL.TAKE, 10k random keys, each found expired",
         args=["RL.TAKE", "rl:__rand_int__", *GRANT_LIMIT, "1"], rand=EXPIRED_KEYS,
         warm=3, pre=[["DEBUG", "SET-ACTIVE-EXPIRE", "0"]], root="module",
         parts=["replicate", "set_expire", "open_key", "limit_parse", "take"]),
    # A grant on a key an operator pinned (RL.PIN) to the callers' own limit: what deciding
    # under a pin adds to a grant (its effect says only what moved).
    dict(key="pinned", name="RL.TAKE grant, pinned key",
         args=["RL.TAKE", "rl:p", *GRANT_LIMIT, "1"], pre=[["RL.PIN", "rl:p", *GRANT_LIMIT]],
         root="module", parts=["replicate", "open_key", "set_expire", "limit_parse", "take"]),
]  # fmt: skip
for _p in PROFILES:
    _p.setdefault("rand", None)
    _p.setdefault("pre", [])
    _p.setdefault("parts", [])
    _p.setdefault("absent", [])
    _p.setdefault("same_keys", None)
    _p.setdefault("warm", None)

PROFILE_BY_KEY = {p["key"]: p for p in PROFILES}

# Instruction targets (Redis 7.0, callgrind instructions per call inside the command), and the
# parts that explain a miss. The other servers are held to the same numbers for comparison.
INSTR_TARGETS = [
    dict(workload="grant", limit=5000, label="`RL.TAKE` grant",
         parts=["replicate", "open_key", "set_expire", "limit_parse"]),
    dict(workload="deny", limit=2000, label="`RL.TAKE` deny",
         parts=["open_key", "key_expired", "limit_parse", "reply_ll"]),
    dict(workload="withstate", limit=6000, label="`RL.TAKE ... WITHSTATE`",
         parts=["replicate", "reply_double", "open_key", "limit_parse"]),
    dict(workload="lease", limit=10000, label="`RL.LEASE` batch of 20",
         parts=["replicate", "argv", "open_key", "reply_ll"]),
]  # fmt: skip

# The per-caller path (a key new or just expired) against a hot grant, instructions inside
# the command on each server: the workloads held to `limit` x the grant, and the absolute
# limit of the new-key path on Redis 7.0.
PERCALLER_INSTR = dict(limit=1.3, workloads=["rand", "rand_expired"], grant="grant",
                       absolute=dict(server="redis7", workload="rand", limit=8000))

# What pins may cost (issue: pins): a grant on a pinned key at most `extra` instructions
# over an unpinned grant on the same server, and the unpinned grant and deny at most
# `allow` over what they cost before pins (`before`: Redis 7.0, commit 90c1518).
PIN_INSTR = dict(pinned="pinned", grant="grant", extra=300, allow=60, server="redis7",
                 before=dict(grant=6174, deny=2285))

PART_LABELS = {
    "replicate": "`{fn}` (the replicated effect)",
    "argv": "of that `{fn}` (the effect's argv)",
    "lookup_cmd": "`{fn}` (the effect's command, by name)",
    "open_key": "`{fn}`",
    "key_expired": "`{fn}` (expiry check)",
    "limit_parse": "parsing rate and cap",
    "set_expire": "`{fn}`",
    "type_set": "`{fn}`",
    "close_key": "`{fn}`",
    "reply_ll": "`{fn}` (reply)",
    "reply_double": "formatting `remaining` (`reply_double`)",
}


# --------------------------------------------------------------------------------------------
# RL.SHARE: the sections a run measures, and what the share section holds itself to.

# `scripts/bench measure --only ...`: a section name -> its key in the results JSON.
SECTIONS = {"throughput": "throughput", "memory": "memory", "profile": "profiles",
            "share": "share", "hotkey": "hotkey", "skew": "skew",
            "percaller": "percaller", "library": "library"}  # fmt: skip

# The Functions library against the seed script it replaces (section "library", issue 44):
# per case, the library's call and the seed script's, both in one server per server kind:
# callgrind instructions in the timed command (fcallCommand, evalShaCommand), and on Redis
# 7.0 the server time per call (INFO commandstats) of both in one run, interleaved. `target`:
# the most the library may cost as a multiple of the seed script; cases without a seed call
# are held to the figures of the layout before (LIBRARY_BEFORE).
FN_BUSY_LIMIT = ["1000", "1000000000"]
FN_FULL_LIMIT = ["1000000", "1000000"]
LIBRARY_RAND_KEYS = 10_000
LIBRARY_CASES = [
    dict(key="full", name="`rl_take` grant, bucket full again between calls",
         fn=[*FN_TAKE, "fn:full", *FN_FULL_LIMIT, "1"],
         seed=[*LUA, "lua:full", *FN_FULL_LIMIT, "1"], target=1.0),
    dict(key="busy", name="`rl_take` grant, busy bucket",
         fn=[*FN_TAKE, "fn:busy", *FN_BUSY_LIMIT, "1"],
         seed=[*LUA, "lua:busy", *FN_BUSY_LIMIT, "1"], target=1.0),
    dict(key="rand", name="`rl_take` grant, 10k random keys (each full again: expired)",
         fn=[*FN_TAKE, "fn:__rand_int__", *FN_FULL_LIMIT, "1"],
         seed=[*LUA, "lua:__rand_int__", *FN_FULL_LIMIT, "1"], rand=LIBRARY_RAND_KEYS,
         target=1.0),
    dict(key="deny", name="`rl_take` deny", fn=[*FN_TAKE, "fn:deny", *DENY_LIMIT, "1"],
         seed=[*LUA, "lua:deny", *DENY_LIMIT, "1"], target=0.9),
    dict(key="lease", name="`rl_lease` 20 (1000 keys, 100 ms)",
         fn=[*FN_LEASE, "fn:lease:__rand_int__", *FN_BUSY_LIMIT, "20", LEASE_TTL_MS],
         rand=LEASE_KEYS),
    dict(key="mtake", name="`rl_mtake` of 2 keys",
         fn=["FCALL", "rl_mtake", "2", "fn:m1", "fn:m2", "1", *FN_BUSY_LIMIT, *FN_BUSY_LIMIT]),
    dict(key="reserve", name="`rl_reserve` grant", fn=["FCALL", "rl_reserve", "1", "fn:rv",
                                                       *FN_BUSY_LIMIT, "1", "0"]),
    dict(key="share16", name="`rl_share`, 16 holders",
         fn=["FCALL", "rl_share", "1", "fn:sh", *GRANT_LIMIT, "h00", "10", SHARE_PERIOD_MS],
         pre=[["FCALL", "rl_share", "1", "fn:sh", *GRANT_LIMIT, f"h{i:02d}", "10",
               SHARE_PERIOD_MS] for i in range(16)]),
]  # fmt: skip
for _case in LIBRARY_CASES:
    _case.setdefault("seed", None)
    _case.setdefault("rand", None)
    _case.setdefault("pre", [])
    _case.setdefault("target", None)
# The library before the string layout (hashes only): measured in the same run, the same
# calls (its instructions per call are the "before" column; the cases without a seed script
# must cost less than it).
LIBRARY_BEFORE_REV = "c9e6107"
LIBRARY_ROUNDS = 2

# Holders at scale: each wants 10/s of the grant limit's 1000/s (over-subscribed from 101
# holders: the water level runs), leases of 3 hours; 12-byte ids.
SHARE_WANT = "10"


def share_holder(i):
    return f"holder-{i:05d}"


# Rounds of calls by every holder before the timed calls, apart by more than the 250 ms
# hold, so that every holder is at its fair share.
SHARE_ROUNDS = 3
SHARE_ROUND_GAP_S = 0.3
SHARE_US_TARGET = dict(holders=4_096, limit=50.0)
# RL.SHARE at 16 holders against RL.TAKE grant, instructions in the command (Redis 7.0).
SHARE_INSTR_TARGET = 2.0

# One hot key (client/examples/share_bench.rs and benchtool/share_bench.py): rate, cap.
HOT_LIMIT = (100_000, 10_000)
HOT_DECISIONS_TARGET = 5_000_000
HOT_CALLS_TARGET = 20.0


# RL.SHARE under skew (scripts/benchtool/share_skew.py): (client, backend, scenario) per case.
SKEW_CASES = [(client, "module", scenario) for client in ("python", "rust")
              for scenario in ("four", "seed", "moving")]
SKEW_CASES += [("python", "functions", scenario) for scenario in ("four", "seed", "moving")]
SKEW_CASES_QUICK = [("python", "module", "four"), ("rust", "module", "moving"),
                    ("python", "functions", "four")]
# What each case is held to (the targets): the fleet's let-out from its third
# second on, and in its second and third seconds, as a fraction of the rate; a moved hot
# spot at its share within one period (the bench's 1 s).
SKEW_UTILISATION_TARGET = 0.97
SKEW_SECOND_TARGET = 0.70
SKEW_THIRD_TARGET = 0.95
SKEW_CONVERGE_TARGET_MS = 1000


# --------------------------------------------------------------------------------------------
# The per-caller path side by side: every peer in one server per server kind (the module, the
# Lua script, the Functions library and, with CELL_MODULE=path/to/libredis_cell.so,
# redis-cell), the same grant limit on 100k random keys (nearly every call finds its key new
# or expired) and on one hot key; server time from INFO commandstats.

# redis-cell's `max_burst count period` for the grant limit: 1000 per 1 s, cap max_burst + 1.
CELL_GRANT = ["999999999", "1000", "1"]
PERCALLER_ROWS = [
    dict(key="incr", label="`INCR`", args=["INCR", "k:__rand_int__"], stat="incr"),
    dict(key="rl", label="`RL.TAKE`", args=["RL.TAKE", "rl:__rand_int__", *GRANT_LIMIT, "1"],
         stat="rl.take"),
    dict(key="lua", label="Lua script", args=[*LUA, "lua:__rand_int__", *GRANT_LIMIT, "1"],
         stat="evalsha"),
    dict(key="fn", label="Functions library", args=[*FN_TAKE, "fn:__rand_int__", *GRANT_LIMIT, "1"],
         stat="fcall"),
    dict(key="cell", label="redis-cell", args=["CL.THROTTLE", "cell:__rand_int__", *CELL_GRANT, "1"],
         stat="cl.throttle", cell=True),
]  # fmt: skip
PERCALLER_MODES = ["rand", "hot"]
# Server time on random keys: redis-cell and the Lua script against RL.TAKE (at least), and
# RL.TAKE against INCR on the same keys (at most).
PERCALLER_TARGETS = [
    dict(label="redis-cell ÷ `RL.TAKE`, random keys", num="cell", den="rl", limit=2.0, how="ge"),
    dict(label="Lua script ÷ `RL.TAKE`, random keys", num="lua", den="rl", limit=5.0, how="ge"),
    dict(label="`RL.TAKE` ÷ `INCR`, random keys", num="rl", den="incr", limit=3.0, how="le"),
]  # fmt: skip
