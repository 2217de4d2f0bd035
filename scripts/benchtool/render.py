"""Builds BENCHMARKS.md from a results JSON through template.md (string.Template).

A profile cell that names a function the profile does not contain renders as a visible
**MISSING** marker and is listed in `Report.missing`; the command line then fails.
"""

import re
import string
from pathlib import Path

from . import spec

TEMPLATE = Path(__file__).resolve().parent / "template.md"
MISSING = "MISSING"


def fmt(x, digits=0):
    return "—" if x is None else f"{x:,.{digits}f}"


def ratio(x, digits=1):
    return "—" if x is None else f"{x:.{digits}f}x"


def verdict(ok):
    return "**met**" if ok else "**not met**"


class Report:
    def __init__(self, results):
        if results.get("schema") != 1:
            raise ValueError(f"results schema {results.get('schema')!r}, expected 1")
        self.r = dict(results)
        self.r.setdefault("profiles", {})
        self.missing = []  # "server / workload: function"

    # -- profile access: never a silent zero ---------------------------------------------------

    def workload(self, server, key):
        for w in self.r["profiles"][server]["workloads"]:
            if w["key"] == key:
                return w
        raise KeyError(f"{server}: no workload {key!r} in the results")

    def _miss(self, server, wkey, fn):
        label = self.r["profiles"][server]["label"]
        entry = f"{label} / {spec.PROFILE_BY_KEY[wkey]['name']}: `{fn}`"
        if entry not in self.missing:
            self.missing.append(entry)
        return f"**{MISSING}: `{fn}`**"

    def instr(self, server, wkey):
        """(value, cell) of a workload's command cost."""
        w = self.workload(server, wkey)
        if w["instr"] is None:
            return None, self._miss(server, wkey, w["root"])
        return w["instr"], fmt(w["instr"])

    def part(self, server, wkey, part):
        """(value, cell, fn) of a named part; value None when it is missing or not tracked."""
        w = self.workload(server, wkey)
        entry = w["parts"].get(part)
        if entry is None:
            fn = spec.PARTS[part].get(self.r["profiles"][server]["flavor"])
            if fn is None:
                return None, "not tracked", None  # this server inlines it: not asked for
            return None, self._miss(server, wkey, fn), fn  # asked for but not recorded
        if entry["instr"] is None:
            if part in spec.PROFILE_BY_KEY[wkey]["absent"]:
                return 0.0, "not called", entry["fn"]
            return None, self._miss(server, wkey, entry["fn"]), entry["fn"]
        return entry["instr"], fmt(entry["instr"]), entry["fn"]

    # -- sections --------------------------------------------------------------------------------

    def servers(self):
        return list(self.r["profiles"])

    def primary(self):
        for name in self.servers():
            if spec.SERVERS.get(name, {}).get("primary"):
                return name
        return None

    def throughput_table(self):
        rows = {row["key"]: row for row in self.r["throughput"]}
        us = {k: row["median"]["usec"] for k, row in rows.items()}
        rps16 = {k: row["median"]["rps16"] for k, row in rows.items()}
        out = ["| Row | req/s P1 | req/s P16 | p50 ms | p99 ms | server µs/call | server time ÷ "
               "INCR's | Lua's server time ÷ this | req/s P16 ÷ INCR's |",
               "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
        for k, row in rows.items():
            m = row["median"]
            x_incr = us[k] / us[row["incr"]] if row["incr"] else None
            x_lua = us[row["lua"]] / us[k] if row["lua"] else None
            tp = rps16[k] / rps16[row["incr"]] if row["incr"] else None
            out.append(
                f"| {row['label']} | {fmt(m['rps1'])} | {fmt(m['rps16'])} | {fmt(m['p50'], 3)} | "
                f"{fmt(m['p99'], 3)} | {fmt(us[k], 2)} | {ratio(x_incr)} | {ratio(x_lua)} | "
                f"{'—' if tp is None else f'{100 * tp:.0f}%'} |")  # fmt: skip
        return "\n".join(out)

    def commands(self):
        out = []
        for row in self.r["throughput"]:
            text = " ".join("<sha>" if a == "SHA" else a for a in row["args"])
            text += f"  (-r {row['rand']})" if row["rand"] else ""
            out.append(f"- {row['label']}: `{text}`")
        return "\n".join(out)

    def memory_table(self):
        m = self.r["memory"]["layouts"]
        floor_b = m["floor"]["bytes"]
        out = ["| Layout | filled with | bytes per bucket | ÷ per-key floor | `MEMORY USAGE b:1` |",
               "|---|---|---:|---:|---:|"]  # fmt: skip
        layouts = [
            ("Redis's per-key floor: integer string with expiry", "floor",
             "`SET b:<i> 1732897000123456 PX 1000000`"),
            ("`RL.TAKE` (type `rl-bucket`, key expires when full)", "ours",
             "`RL.TAKE b:<i> 0.001 10 1`"),
            ("Lua script's hash, same expiry", "lua_expiry",
             "`EVALSHA <sha> 1 b:<i> 0.001 10 1` + `PEXPIRE b:<i> 1000000`"),
            ("Lua script's hash as teams run it (no expiry)", "lua_seed",
             "`EVALSHA <sha> 1 b:<i> 0.001 10 1`"),
            ("Functions library's string (expires when full)", "functions",
             "`FCALL rl_take 1 b:<i> 0.001 10 1`"),
        ]  # fmt: skip
        for label, key, how in layouts:
            if key not in m:  # a results file from before the layout existed
                continue
            b = m[key]["bytes"]
            out.append(f"| {label} | {how} | {b:.1f} | {b / floor_b:.2f}x | {m[key]['usage']} |")
        return "\n".join(out)

    def idle_table(self):
        io, il = self.r["memory"]["idle"]["ours"], self.r["memory"]["idle"]["lua"]
        return "\n".join([
            "| Layout | keys left | memory still held |",
            "|---|---:|---:|",
            f"| `RL.TAKE` | {io['keys']:,} after {io['waited']:.1f} s | {io['bytes'] / 1e6:,.1f} MB |",
            f"| Lua script as usually run | {il['keys']:,} after {il['waited']:.1f} s, and forever |"
            f" {il['bytes'] / 1e6:,.1f} MB ({il['bytes'] / max(il['keys'], 1):.0f} bytes/key) |",
        ])  # fmt: skip

    def ratio_targets(self):
        rows = {row["key"]: row["median"] for row in self.r["throughput"]}
        us = {k: m["usec"] for k, m in rows.items()}
        rps16 = {k: m["rps16"] for k, m in rows.items()}
        m = self.r["memory"]["layouts"]
        floor_b, ours_b, lua_b = m["floor"]["bytes"], m["ours"]["bytes"], m["lua_expiry"]["bytes"]
        targets = [
            ("Server time, RL.TAKE grant ≤ 4x INCR's", us["grant"] / us["incr"], 4, "le"),
            ("Server time, RL.TAKE deny ≤ 3x INCR's", us["deny"] / us["incr"], 3, "le"),
            ("Server time, RL.TAKE 100k random keys ≤ 5x INCR's (same keys)",
             us["rand"] / us["incr_rand"], 5, "le"),
            ("Server time, RL.TAKE 100k random keys ≤ 5x INCR's (INCR on one key)",
             us["rand"] / us["incr"], 5, "le"),
            ("Grant path: ≥ 10x less server time than the Lua script",
             us["lua_grant"] / us["grant"], 10, "ge"),
            ("Deny path: ≥ 15x less server time than the Lua script",
             us["lua_deny"] / us["deny"], 15, "ge"),
            ("Throughput at pipeline 16, RL.TAKE grant ≥ 60% of INCR's",
             rps16["grant"] / rps16["incr"], 0.6, "ge"),
            ("Throughput at pipeline 16, RL.TAKE deny ≥ 60% of INCR's",
             rps16["deny"] / rps16["incr"], 0.6, "ge"),
            ("Throughput at pipeline 16, RL.TAKE random ≥ 60% of INCR's (same keys)",
             rps16["rand"] / rps16["incr_rand"], 0.6, "ge"),
            ("Memory per live bucket ≤ 1.35x the per-key floor", ours_b / floor_b, 1.35, "le"),
            ("Memory per live bucket ≤ 0.9x the Lua hash with the same expiry",
             ours_b / lua_b, 0.9, "le"),
        ]  # fmt: skip
        out = ["| Target | measured | |", "|---|---:|---|"]
        for label, value, limit, how in targets:
            ok = value <= limit if how == "le" else value >= limit
            shown = f"{100 * value:.0f}%" if "Throughput" in label else f"{value:.3f}x"
            out.append(f"| {label} | {shown} | {verdict(ok)} |")
        return "\n".join(out)

    def instr_targets(self):
        if not self.r["profiles"]:
            return "(No profile in this run: `BENCH_PROFILE=0`.)"
        out = ["| Target | server | instructions | | why (inclusive parts of the command) |",
               "|---|---|---:|---|---|"]  # fmt: skip
        for t in spec.INSTR_TARGETS:
            for server in self.servers():
                label = self.r["profiles"][server]["label"]
                value, cell = self.instr(server, t["workload"])
                if value is None:
                    out.append(f"| {t['label']} ≤ {t['limit']:,} | {label} | {cell} | | |")
                    continue
                ok = value <= t["limit"]
                reasons = []
                for part in t["parts"]:
                    v, pcell, fn = self.part(server, t["workload"], part)
                    if pcell == "not tracked":
                        continue
                    name = spec.PART_LABELS[part].format(fn=fn)
                    if v is None:
                        reasons.append(f"{name} {pcell}")
                    else:
                        reasons.append(f"{name} {pcell} ({100 * v / value:.0f}%)")
                gap = value - t["limit"]
                head = (f"{gap:,.0f} over: " if not ok else f"{-gap:,.0f} to spare; ")
                rep, _, _ = self.part(server, t["workload"], "replicate")
                if not ok and rep:
                    without = value - rep
                    tail = (f"; without the replicated effect {without:,.0f}"
                            f" ({'would meet' if without <= t['limit'] else 'still over'})")
                else:
                    tail = ""
                out.append(f"| {t['label']} ≤ {t['limit']:,} | {label} | {cell} | "
                           f"{verdict(ok)} | {head}{', '.join(reasons)}{tail} |")  # fmt: skip
        return "\n".join(out)

    def pin_instr_targets(self):
        """What pins cost: a pinned grant against an unpinned one (each server), and the
        unpinned grant and deny against their cost before pins (Redis 7.0)."""
        if not self.r["profiles"]:
            return "(No profile in this run: `BENCH_PROFILE=0`.)"
        t = spec.PIN_INSTR
        out = ["| Pin target | server | instructions | limit | |",
               "|---|---|---:|---:|---|"]  # fmt: skip
        for server in self.servers():
            label = self.r["profiles"][server]["label"]
            name = spec.PROFILE_BY_KEY[t["pinned"]]["name"]
            grant, _ = self.instr(server, t["grant"])
            if not self.has_workload(server, t["pinned"]) or grant is None:
                out.append(f"| {name} ≤ a grant + {t['extra']} | {label} | not measured | | |")
                continue
            v, cell = self.instr(server, t["pinned"])
            limit = grant + t["extra"]
            ok = v is not None and v <= limit
            out.append(f"| {name} ≤ a grant + {t['extra']} | {label} | {cell} | {limit:,.0f} | "
                       f"{verdict(ok)} |")  # fmt: skip
        if t["server"] in self.servers():
            label = self.r["profiles"][t["server"]]["label"]
            for wkey, before in t["before"].items():
                v, cell = self.instr(t["server"], wkey)
                name = spec.PROFILE_BY_KEY[wkey]["name"]
                limit = before + t["allow"]
                ok = v is not None and v <= limit
                out.append(f"| {name}, unpinned, ≤ {before:,} before pins + {t['allow']} | "
                           f"{label} | {cell} | {limit:,} | {verdict(ok)} |")  # fmt: skip
        return "\n".join(out)

    def percaller_instr_targets(self):
        """The per-caller path (a key new, or found expired) against a hot grant, per server."""
        if not self.r["profiles"]:
            return "(No profile in this run: `BENCH_PROFILE=0`.)"
        t = spec.PERCALLER_INSTR
        out = ["| Per-caller target | server | instructions | ÷ hot grant | | why |",
               "|---|---|---:|---:|---|---|"]  # fmt: skip
        for server in self.servers():
            label = self.r["profiles"][server]["label"]
            grant, _ = self.instr(server, t["grant"])
            for wkey in t["workloads"]:
                name = spec.PROFILE_BY_KEY[wkey]["name"]
                if not self.has_workload(server, wkey):
                    out.append(f"| {name} ≤ {t['limit']}x a hot grant | {label} | not measured"
                               f" | | | |")  # fmt: skip
                    continue
                v, cell = self.instr(server, wkey)
                if v is None or grant is None:
                    out.append(f"| {name} ≤ {t['limit']}x a hot grant | {label} | {cell} | | | |")
                    continue
                ok = v / grant <= t["limit"]
                why = []
                recorded = self.workload(server, wkey)["parts"]
                for part in ("type_set", "set_expire", "open_key", "replicate"):
                    if part not in recorded:
                        continue
                    pv, pcell, fn = self.part(server, wkey, part)
                    if pv:
                        why.append(f"`{fn}` {pcell}")
                out.append(f"| {name} ≤ {t['limit']}x a hot grant | {label} | {cell} | "
                           f"{v / grant:.2f}x | {verdict(ok)} | {', '.join(why)} |")  # fmt: skip
        a = t["absolute"]
        if a["server"] in self.servers() and self.has_workload(a["server"], a["workload"]):
            v, cell = self.instr(a["server"], a["workload"])
            if v is not None:
                name = spec.PROFILE_BY_KEY[a["workload"]]["name"]
                label = self.r["profiles"][a["server"]]["label"]
                out.append(f"| {name} ≤ {a['limit']:,} | {label} | {cell} | | "
                           f"{verdict(v <= a['limit'])} | |")  # fmt: skip
        return "\n".join(out)

    def percaller_table(self):
        pc = self.r.get("percaller")
        if not pc:
            return "(Not in this results file: `scripts/bench --only percaller`.)"
        keys = [row["key"] for row in spec.PERCALLER_ROWS]
        labels = {row["key"]: row["label"] for row in spec.PERCALLER_ROWS}
        out = ["| Server | keys | " + " | ".join(f"{labels[k]} µs" for k in keys)
               + " | Lua ÷ `RL.TAKE` | Functions ÷ `RL.TAKE` | redis-cell ÷ `RL.TAKE` "
               "| `RL.TAKE` ÷ `INCR` |",
               "|---|---|" + "---:|" * (len(keys) + 4)]  # fmt: skip
        for name, srv in pc["servers"].items():
            us = srv["usec"]
            for mode, text in (("rand", f"{pc['keys']:,} random"), ("hot", "one hot key")):
                def u(k):
                    return us.get(f"{k}_{mode}")

                def x(a, b):
                    return ratio(u(a) / u(b), 2) if u(a) and u(b) else "—"

                cells = [fmt(u(k), 3) for k in keys]
                out.append(f"| {srv['label']} | {text} | " + " | ".join(cells) +
                           f" | {x('lua', 'rl')} | {x('fn', 'rl')} | {x('cell', 'rl')} "
                           f"| {x('rl', 'incr')} |")  # fmt: skip
        return "\n".join(out)

    def percaller_targets(self):
        pc = self.r.get("percaller")
        if not pc:
            return "(Not in this results file: `scripts/bench --only percaller`.)"
        out = ["| Per-caller server-time target | server | measured | |", "|---|---|---:|---|"]
        for t in spec.PERCALLER_TARGETS:
            for srv in pc["servers"].values():
                a, b = srv["usec"].get(f"{t['num']}_rand"), srv["usec"].get(f"{t['den']}_rand")
                if not a or not b:
                    out.append(f"| {t['label']} {'≥' if t['how'] == 'ge' else '≤'} "
                               f"{t['limit']}x | {srv['label']} | not measured | |")  # fmt: skip
                    continue
                v = a / b
                ok = v >= t["limit"] if t["how"] == "ge" else v <= t["limit"]
                out.append(f"| {t['label']} {'≥' if t['how'] == 'ge' else '≤'} {t['limit']}x "
                           f"| {srv['label']} | {v:.2f}x | {verdict(ok)} |")  # fmt: skip
        return "\n".join(out)

    def percaller_note(self):
        pc = self.r.get("percaller")
        if not pc:
            return ""
        cell = pc.get("cell")
        if not cell:
            return ("redis-cell was not loaded in this run (`CELL_MODULE` unset): its columns "
                    "are empty.")
        return (f"redis-cell: `{cell['module']}` (sha256 `{cell['sha256'][:16]}…`), built outside "
                f"this repository as [docs/performance.md](docs/performance.md) describes.")

    def instr_ratios(self):
        p = self.primary()
        if p is None:
            return "(No profile of the primary server in this run.)"
        out = ["| Ratio | instructions per call |", "|---|---:|"]
        for label, a, b in [
            ("RL.TAKE grant ÷ INCR", "grant", "incr"),
            ("RL.TAKE deny ÷ INCR", "deny", "incr"),
            ("RL.TAKE random ÷ INCR random (same keys)", "rand", "incr_rand"),
            ("Lua grant ÷ RL.TAKE grant", "lua_grant", "grant"),
            ("Lua deny ÷ RL.TAKE deny", "lua_deny", "deny"),
        ]:  # fmt: skip
            va, ca = self.instr(p, a)
            vb, cb = self.instr(p, b)
            r = f"{va / vb:.2f}x" if va and vb else "—"
            out.append(f"| {label} | {ca} ÷ {cb} = {r} |")
        return "\n".join(out)

    def profile_tables(self):
        if not self.r["profiles"]:
            return "(No profile in this run: `BENCH_PROFILE=0`.)"
        out = []
        for server in self.servers():
            prof = self.r["profiles"][server]
            out += [f"### {prof['label']}: instructions per call", "",
                    f"`{prof['version']}`", "",
                    "| Workload | instr/request | instr in the command | command ÷ `INCR k:1`'s"
                    " | ÷ `INCR` on the same keys |",
                    "|---|---:|---:|---:|---:|"]  # fmt: skip
            incr, _ = self.instr(server, "incr")
            for w in prof["workloads"]:
                v, cell = self.instr(server, w["key"])
                x = f"{v / incr:.2f}x" if v and incr else "—"
                same = spec.PROFILE_BY_KEY[w["key"]]["same_keys"]
                sv = self.instr(server, same)[0] if same else None
                xs = f"{v / sv:.2f}x" if v and sv else "—"
                out.append(f"| {w['name']} | {fmt(w['request'])} | {cell} | {x} | {xs} |")
            out.append("")
        return "\n".join(out).rstrip()

    def cost_tables(self):
        p = self.primary()
        if p is None:
            return ""
        label = self.r["profiles"][p]["label"]
        out = []
        incr, incr_cell = self.instr(p, "incr")
        rows = [
            ("`RM_Replicate` (the `RL.SETSTATE` effect), all of it", ["replicate"], True),
            ("  of which `lookupCommandByCString(\"RL.SETSTATE\")`", ["lookup_cmd"], False),
            ("  of which building the argv (`moduleCreateArgvFromUserFormat`)", ["argv"], False),
            ("`RM_OpenKey` (key lookup, expiry check, key handle)", ["open_key"], True),
            ("  of which `keyIsExpired` (the key has a TTL; INCR's has none)", ["key_expired"],
             False),
            ("parsing rate and cap (`grammar::limit`: `from_utf8`, `f64::from_str`)",
             ["limit_parse"], True),
            ("`RM_SetAbsExpire` (expiry update)", ["set_expire"], True),
            ("`RM_CloseKey`", ["close_key"], True),
            ("`RM_ReplyWithLongLong` (reply)", ["reply_ll"], True),
            ("`moduleCreateContext` + `moduleFreeContext` (per module call)",
             ["ctx_create", "ctx_free"], True),
        ]  # fmt: skip
        for wkey, title in [("grant", "RL.TAKE grant"), ("deny", "RL.TAKE deny")]:
            total, total_cell = self.instr(p, wkey)
            out += [f"### {title} path on {label}, by cost (instructions per call, inclusive)", "",
                    "| Part | instr/call | share of the command |", "|---|---:|---:|"]
            counted = 0.0
            for text, parts, top in rows:
                values, cells = [], []
                for part in parts:
                    v, cell, _ = self.part(p, wkey, part)
                    values.append(v)
                    cells.append(cell)
                if all(c == "not called" for c in cells):
                    out.append(f"| {text} | not called | |")
                    continue
                if any(v is None for v in values):
                    out.append(f"| {text} | {' + '.join(cells)} | |")
                    continue
                v = sum(values)
                share = f"{100 * v / total:.0f}%" if total else "—"
                out.append(f"| {text} | {fmt(v)} | {share} |")
                if top:
                    counted += v
            if total:
                rest = total - counted
                out.append(f"| everything else (arithmetic, `n` and type checks, stats, dispatch)"
                           f" | {fmt(rest)} | {100 * rest / total:.0f}% |")  # fmt: skip
            out.append(f"| **the command** (`{self.workload(p, wkey)['root']}`) | **{total_cell}** | 100% |")
            out.append(f"| `INCR`'s whole command, for scale | {incr_cell} | |")
            out.append("")
        return "\n".join(out).rstrip()

    def lua_note(self):
        p = self.primary()
        if p is None:
            return ""
        total, total_cell = self.instr(p, "lua_grant")
        c = {k: self.part(p, "lua_grant", k)[1] for k in
             ["script_call", "time_cmd", "hmget_cmd", "hset_cmd", "lua_gc", "strtod", "printf_fp"]}
        sc = self.part(p, "lua_grant", "script_call")[0]
        around = fmt(total - sc) if total is not None and sc is not None else "—"
        take_v, take_cell, _ = self.part(p, "grant", "take")
        return (f"(On the grant path `take` itself is {take_cell} of the command.) The Lua "
                f"script's grant path, for comparison: {total_cell} instructions, of which "
                f"{c['script_call']} are its three `redis.call`s (`TIME` {c['time_cmd']}, "
                f"`HMGET` {c['hmget_cmd']}, `HMSET` {c['hset_cmd']}, plus converting arguments "
                f"and replies), and {around} the script around them: turning strings into "
                f"numbers (`tonumber`, libc `strtod` {c['strtod']}), numbers back into strings "
                f"for `HMSET` (libc `printf` {c['printf_fp']}), Lua strings and tables, and "
                f"`lua_gc` {c['lua_gc']}.")  # fmt: skip

    def trees(self):
        out = []
        for server in self.servers():
            prof = self.r["profiles"][server]
            for w in prof["workloads"]:
                out += [f"<details><summary>{prof['label']}, {w['name']}: <code>{w['command']}"
                        f"</code></summary>", "", "```", " instr/call share  function"]
                out += w["tree"] or [f"({MISSING}: `{w['root']}`)"]
                out += ["```", "", "</details>", ""]
        return "\n".join(out).rstrip()

    # -- when each section was measured ------------------------------------------------------

    def sections_table(self):
        secs = self.r.get("sections")
        if not secs:  # one run measured everything
            meta = self.r["meta"]
            secs = {n: {"date": meta["date"], "module_commit": meta["module_commit"],
                        "load_start": None, "load_end": None}
                    for n, key in spec.SECTIONS.items() if self.r.get(key)}  # fmt: skip
        names = {"throughput": "Throughput, latency and server time", "memory": "Memory",
                 "profile": "Profile (callgrind)", "share": "`RL.SHARE` at scale",
                 "hotkey": "One hot key", "skew": "`RL.SHARE` under skew",
                 "percaller": "The per-caller path, side by side",
                 "library": "The Functions library against the seed script"}  # fmt: skip
        out = ["| Section | measured (UTC) | module at | load average (1, 5, 15 min): start → end |",
               "|---|---|---|---|"]  # fmt: skip
        for name in spec.SECTIONS:
            sec = secs.get(name)
            if sec is None:
                out.append(f"| {names[name]} | not in this results file | | |")
                continue
            out.append(f"| {names[name]} | {sec['date']} | {sec['module_commit']} | "
                       f"{loads(sec.get('load_start'), sec.get('load_end'))} |")  # fmt: skip
        return "\n".join(out)

    # -- RL.SHARE --------------------------------------------------------------------------------

    def has_workload(self, server, key):
        return any(w["key"] == key for w in self.r["profiles"][server]["workloads"])

    def share_instr(self, server):
        """(value, cell) of RL.SHARE at 16 holders; a profile without it is MISSING."""
        if not self.has_workload(server, "share16"):
            label = self.r["profiles"][server]["label"]
            entry = f"{label} / {spec.PROFILE_BY_KEY['share16']['name']}: not profiled"
            if entry not in self.missing:
                self.missing.append(entry)
            return None, f"**{MISSING}: share16**"
        return self.instr(server, "share16")

    def share_instr_table(self):
        if not self.r["profiles"]:
            return "(No profile in this run: `BENCH_PROFILE=0`.)"
        out = ["| Server | `RL.SHARE`, 16 holders | `RL.TAKE` grant | `INCR k:1` | ÷ grant | ÷ INCR |",
               "|---|---:|---:|---:|---:|---:|"]  # fmt: skip
        for server in self.servers():
            v, cell = self.share_instr(server)
            g, gcell = self.instr(server, "grant")
            i, icell = self.instr(server, "incr")
            xg = f"{v / g:.2f}x" if v and g else "—"
            xi = f"{v / i:.2f}x" if v and i else "—"
            out.append(f"| {self.r['profiles'][server]['label']} | {cell} | {gcell} | {icell} | "
                       f"{xg} | {xi} |")  # fmt: skip
        return "\n".join(out)

    def share_scale_table(self):
        share = self.r.get("share")
        if not share:
            return "(Not in this results file: `scripts/bench --only share`.)"
        out = ["| Holders on the key | server µs/call (`INFO commandstats`, median) | batches "
               "| server CPU µs/call (median) | `used_memory` per holder | `MEMORY USAGE` of the key |",
               "|---:|---:|---|---:|---:|---:|"]  # fmt: skip
        for s in share["scale"]:
            batches = ", ".join(f"{b:.1f}" for b in s["batches"])
            out.append(f"| {s['holders']:,} | {s['usec']:.1f} | {batches} | {s['cpu_usec']:.1f} | "
                       f"{s['bytes_per_holder']:.0f} bytes | {s['usage']:,} bytes "
                       f"({s['usage'] / s['holders']:.0f} a holder) |")  # fmt: skip
        return "\n".join(out)

    def share_targets(self):
        out = ["| `RL.SHARE` target | measured | |", "|---|---:|---|"]
        p = self.primary()
        if p is not None:
            v, cell = self.share_instr(p)
            g, gcell = self.instr(p, "grant")
            label = self.r["profiles"][p]["label"]
            if v and g:
                out.append(f"| 16 holders ≤ {spec.SHARE_INSTR_TARGET:g}x the instructions of "
                           f"`RL.TAKE` grant ({label}) | {cell} ÷ {gcell} = {v / g:.2f}x | "
                           f"{verdict(v / g <= spec.SHARE_INSTR_TARGET)} |")  # fmt: skip
            else:
                out.append(f"| 16 holders ≤ {spec.SHARE_INSTR_TARGET:g}x `RL.TAKE` grant | {cell} | |")
        share = self.r.get("share")
        t = spec.SHARE_US_TARGET
        at = [s for s in (share or {}).get("scale", []) if s["holders"] == t["holders"]]
        if at:
            s = at[0]
            out.append(f"| {t['holders']:,} holders ≤ {t['limit']:g} µs server time per call "
                       f"(`INFO commandstats`) | {s['usec']:.1f} µs | "
                       f"{verdict(s['usec'] <= t['limit'])} |")  # fmt: skip
            out.append(f"| {t['holders']:,} holders ≤ {t['limit']:g} µs server CPU per call (the "
                       f"whole request; not inflated by waiting for a CPU) | "
                       f"{s['cpu_usec']:.1f} µs | {verdict(s['cpu_usec'] <= t['limit'])} |")  # fmt: skip
        elif share:
            out.append(f"| {t['holders']:,} holders ≤ {t['limit']:g} µs server time per call | not "
                       f"measured at {t['holders']:,} holders (a `--quick` run) | |")  # fmt: skip
        return "\n".join(out)

    # -- one hot key ------------------------------------------------------------------------------

    HOT_CLIENTS = (("rust", "Rust `rl_client::ShareLimiter`"),
                   ("python", "Python `redis_rl.ShareLimiter`"))  # fmt: skip

    def hot_table(self):
        hot = self.r.get("hotkey")
        if not hot:
            return "(Not in this results file: `scripts/bench --only hotkey`.)"
        out = ["| Client | processes | decisions/s across the fleet | granted/s | `RL.SHARE` "
               "calls/s at the server | let out in the run | bound `cap + rate × T + holders` "
               "| load average (1, 5, 15 min): start → end |",
               "|---|---:|---:|---:|---:|---:|---:|---|"]  # fmt: skip
        for key, label in self.HOT_CLIENTS:
            h = hot.get(key)
            if h is None:
                out.append(f"| {label} | not measured | | | | | | |")
                continue
            secs = h["seconds"]
            out.append(
                f"| {label} | {h['procs']} × {secs:g} s | **{h['decisions'] / secs:,.0f}** | "
                f"{h['granted'] / secs:,.0f} | **{h['server_calls'] / h['server_secs']:.1f}** "
                f"({h['server_calls']} in {h['server_secs']:.2f} s) | {h['granted']:,} | "
                f"{h['bound']:,.0f} ({'within' if h['granted'] <= h['bound'] else 'EXCEEDED'}) | "
                f"{loads(h.get('load_before'), h.get('load_after'))} |")  # fmt: skip
        return "\n".join(out)

    def hot_windows(self):
        hot = self.r.get("hotkey")
        if not hot:
            return ""
        clients = [(k, label.split(" ")[0]) for k, label in self.HOT_CLIENTS if k in hot]
        rows = {}
        for key, _ in clients:
            for w, most, bound in hot[key]["windows"]:
                rows.setdefault(w, {"bound": bound})[key] = (most, bound)
        head = " | ".join(f"{name}: most let out" for _, name in clients)
        out = [f"| Window | bound `cap + rate × t + holders` | {head} |",
               "|---:|---:|" + "---:|" * len(clients)]
        for w in sorted(rows):
            cells = []
            for key, _ in clients:
                if key not in rows[w]:
                    cells.append("—")
                    continue
                most, bound = rows[w][key]
                cells.append(f"{most:,}" + ("" if most <= bound else " (EXCEEDED)"))
            window = f"{w / 1000:g} s" if w >= 1000 else f"{w} ms"
            out.append(f"| {window} | {rows[w]['bound']:,.0f} | {' | '.join(cells)} |")
        return "\n".join(out)

    def hot_targets(self):
        h = (self.r.get("hotkey") or {}).get("rust")
        if h is None:
            return ""
        rate = h["decisions"] / h["seconds"]
        calls = h["server_calls"] / h["server_secs"]
        return "\n".join([
            f"| Hot key target (Rust, {h['procs']} processes) | measured | |", "|---|---:|---|",
            f"| decisions across the fleet ≥ {spec.HOT_DECISIONS_TARGET:,}/s | {rate:,.0f}/s | "
            f"{verdict(rate >= spec.HOT_DECISIONS_TARGET)} |",
            f"| `RL.SHARE` calls at the server ≤ {spec.HOT_CALLS_TARGET:g}/s | {calls:.1f}/s | "
            f"{verdict(calls <= spec.HOT_CALLS_TARGET)} |",
        ])  # fmt: skip

    # -- RL.SHARE under skew ---------------------------------------------------------------------

    SKEW_LABELS = {("python", "module"): "Python, module", ("rust", "module"): "Rust, module",
                   ("python", "functions"): "Python, Functions",
                   ("rust", "functions"): "Rust, Functions"}  # fmt: skip

    def skew_table(self):
        skew = self.r.get("skew")
        if not skew:
            return "(Not in this results file: `scripts/bench --only skew`.)"
        out = ["| client, backend | scenario | utilisation | 2nd s | 3rd s | latest process: "
               "limiter made / first token | 2nd s / 3rd s from its start | converge after a move "
               "| Redis calls/s | let-out per second | most in any window ÷ its bound | load "
               "average (1, 5, 15 min): start → end |",
               "|---|---|---:|---:|---:|---:|---:|---|---:|---|---:|---|"]  # fmt: skip
        for v in skew["runs"]:
            label = self.SKEW_LABELS.get((v["client"], v["backend"]),
                                         f"{v['client']}, {v['backend']}")  # fmt: skip
            conv = ", ".join("never" if c is None else f"{c / 1000:.2f} s"
                             for c in v["converge_ms"])  # fmt: skip
            worst = max(v["windows"], key=lambda w: w[1] / w[2])
            window = f"{worst[1]:,} ÷ {worst[2]:,.0f} in {worst[0]} ms"
            if not v["within"]:
                window += " (EXCEEDED)"
            per_s = ", ".join(f"{x:,}" for x in v["per_second"])
            out.append(
                f"| {label} | {v['scenario']} | **{100 * v['utilisation']:.1f} %** | "
                f"{pct(v['second_second'])} | {pct(v['third_second'])} | "
                f"{fmt(v.get('late_start_ms'))} / {fmt(v.get('first_grant_ms'))} ms | "
                f"{pct(v.get('second_after_start'))} / {pct(v.get('third_after_start'))} | {conv} | "
                f"{fmt(v['server_calls_per_s'], 1)} | {per_s} | {window} | "
                f"{loads(v.get('load_before'), v.get('load_after'))} |")  # fmt: skip
        return "\n".join(out)

    def skew_targets(self):
        skew = self.r.get("skew")
        if not skew:
            return ""
        out = ["| Skew target | runs | met in | worst |", "|---|---:|---:|---|"]
        runs = skew["runs"]

        def row(label, values, ok, show):
            values = [x for x in values if x is not None]
            if not values:
                return
            met = sum(1 for x in values if ok(x))
            worst = min(values, key=lambda x: (ok(x), -x if show == "ms" else x))
            if show == "ms":
                cell = "never" if worst == float("inf") else f"{worst / 1000:.2f} s"
            else:
                cell = pct(worst, 1)
            out.append(f"| {label} | {len(values)} | {met} | {cell} |")

        row(f"utilisation ≥ {100 * spec.SKEW_UTILISATION_TARGET:.0f} % of the rate (from the "
            f"3rd second on, while the demands exceed it)",
            [v["utilisation"] for v in runs], lambda x: x >= spec.SKEW_UTILISATION_TARGET, "pct")
        row(f"a fleet starting together: ≥ {100 * spec.SKEW_SECOND_TARGET:.0f} % in its 2nd second",
            [v["second_second"] for v in runs], lambda x: x >= spec.SKEW_SECOND_TARGET, "pct")
        row(f"… and ≥ {100 * spec.SKEW_THIRD_TARGET:.0f} % in its 3rd",
            [v["third_second"] for v in runs], lambda x: x >= spec.SKEW_THIRD_TARGET, "pct")
        row(f"the same, counted from the latest process's start: ≥ "
            f"{100 * spec.SKEW_SECOND_TARGET:.0f} % in the 2nd second",
            [v.get("second_after_start") for v in runs], lambda x: x >= spec.SKEW_SECOND_TARGET,
            "pct")  # fmt: skip
        row(f"… and ≥ {100 * spec.SKEW_THIRD_TARGET:.0f} % in the 3rd",
            [v.get("third_after_start") for v in runs], lambda x: x >= spec.SKEW_THIRD_TARGET,
            "pct")  # fmt: skip
        row(f"a moved hot spot at 95 % of its share within {spec.SKEW_CONVERGE_TARGET_MS} ms "
            f"(each move)",
            [float("inf") if c is None else c for v in runs for c in v["converge_ms"]],
            lambda x: x <= spec.SKEW_CONVERGE_TARGET_MS, "ms")  # fmt: skip
        return "\n".join(out)

    def skew_note(self):
        skew = self.r.get("skew")
        if not skew:
            return ""
        sec = (self.r.get("sections") or {}).get("skew") or {}
        return (f"Measured {sec.get('date', '(date not recorded)')} UTC, {skew['seconds']:g} s a "
                f"case, {skew['cpus']} CPUs shared with other work (each case's load is in its "
                f"row).")  # fmt: skip

    # -- the Functions library against the seed script (section "library") ---------------------

    def library_tables(self):
        lib = self.r.get("library")
        if not lib:
            return "Not measured yet: `scripts/bench --only library`."
        cases = {c["key"]: c for c in spec.LIBRARY_CASES}
        out = []
        profiles = lib.get("profiles") or {}
        if profiles:
            out += [f"Instructions per call (callgrind; before: functions/rl.lua at "
                    f"{lib.get('before_rev', '?')}, hashes only, the same calls in the same run):",
                    "",
                    "| Library case | server | before (hashes) | library | seed script "
                    "| library ÷ seed | target | |",
                    "|---|---|---:|---:|---:|---:|---|---|"]  # fmt: skip
            for key, case in cases.items():
                for name, prof in profiles.items():
                    got = prof["cases"].get(key) or {}
                    fn, seed = got.get("fn"), got.get("seed")
                    before = ((prof.get("before") or {}).get(key) or {}).get("fn")
                    if case["target"] is not None:
                        r = fn / seed if fn and seed else None
                        target = f"≤ {case['target']:.1f}x the seed script"
                        ok = r is not None and r <= case["target"]
                    else:
                        r = None
                        target = "below the hash layout"
                        ok = fn is not None and before is not None and fn < before
                    out.append(f"| {case['name']} | {prof['label']} | {fmt(before)} | {fmt(fn)} "
                               f"| {fmt(seed)} | {ratio(r, 2)} | {target} | {verdict(ok)} |")
        times = lib.get("times")
        if times:
            ver = re.search(r"v=(\S+)", times["version"])
            out += ["", f"Server time per call on {ver.group(1) if ver else times['version']} "
                    f"(`INFO commandstats`, {times['calls']:,} calls per case and round, "
                    f"{spec.CLIENTS} clients, pipelines of 16; both in one server, rounds "
                    "interleaved; a shared machine: the ratios of one round are what to read):",
                    "",
                    "| Library case (server time) | library µs | seed script µs "
                    "| library ÷ seed, per round |",
                    "|---|---:|---:|---|"]  # fmt: skip
            for key, case in cases.items():
                rd = times["rounds"].get(key) or {}
                fns, seeds = rd.get("fn") or [], rd.get("seed") or []
                med = (lambda v: sorted(v)[len(v) // 2] if v else None)
                per = ", ".join(f"{a / b:.2f}x" for a, b in zip(fns, seeds)) or "—"
                out.append(f"| {case['name']} | {fmt(med(fns), 2)} | {fmt(med(seeds), 2)} "
                           f"| {per} |")
        return "\n".join(out)

    # -- the whole file -------------------------------------------------------------------------

    def markdown(self):
        meta = self.r["meta"]
        c = meta["counts"]
        lim = meta["limits"]
        p = self.primary()
        scale = (self.r.get("share") or {}).get("scale")
        values = {
            "date": meta["date"], "minutes": f"{meta['minutes']:.1f}",
            "quick_note": " (`--quick`: a smoke run with tiny counts; the numbers mean nothing)"
                          if meta["quick"] else "",
            # The load goes with each section (the table of sections).
            "machine": re.sub(r", load average .*$", "", meta["machine"]), "server": meta["server"], "client": meta["client"],
            "clients": meta["clients"], "module_commit": meta["module_commit"],
            "lua_sha": meta["lua_sha"],
            "n_p1": f"{c['n_p1']:,}", "n_p16": f"{c['n_p16']:,}", "repeats": c["repeats"],
            "buckets": f"{self.r['memory']['buckets']:,}",
            "profile_calls": f"{c['profile_calls']:,}",
            "grant_rate": lim["grant"][0], "grant_cap": lim["grant"][1],
            "deny_rate": lim["deny"][0], "deny_cap": lim["deny"][1],
            "lease_ttl": lim["lease_ttl_ms"], "lease_keys": f"{lim['lease_keys']:,}",
            "primary_label": self.r["profiles"][p]["label"] if p else "no profile",
            "instr_targets": self.instr_targets(),
            "ratio_targets": self.ratio_targets(),
            "instr_ratios": self.instr_ratios(),
            "percaller_instr_targets": self.percaller_instr_targets(),
            "pin_instr_targets": self.pin_instr_targets(),
            "percaller_table": self.percaller_table(),
            "percaller_targets": self.percaller_targets(),
            "percaller_note": self.percaller_note(),
            "percaller_calls": f"{(self.r.get('percaller') or {}).get('calls', 0):,}",
            "percaller_repeats": (self.r.get("percaller") or {}).get("repeats", "—"),
            "throughput_table": self.throughput_table(),
            "commands": self.commands(),
            "memory_table": self.memory_table(),
            "idle_table": self.idle_table(),
            "profile_tables": self.profile_tables(),
            "cost_tables": self.cost_tables(),
            "lua_note": self.lua_note(),
            "trees": self.trees(),
            "sections_table": self.sections_table(),
            "share_instr_table": self.share_instr_table(),
            "share_scale_table": self.share_scale_table(),
            "share_targets": self.share_targets(),
            "hot_table": self.hot_table(),
            "hot_windows": self.hot_windows(),
            "hot_targets": self.hot_targets(),
            "skew_table": self.skew_table(),
            "skew_targets": self.skew_targets(),
            "skew_note": self.skew_note(),
            "library_tables": self.library_tables(),
            "hot_rate": f"{spec.HOT_LIMIT[0]:,}", "hot_cap": f"{spec.HOT_LIMIT[1]:,}",
            "share_calls": f"{scale[0]['calls']:,}" if scale else "—",
            "share_batches": len(scale[0]["batches"]) if scale else "—",
            "share_period": spec.SHARE_PERIOD_MS,
            "share_period_text": f"{int(spec.SHARE_PERIOD_MS):,}",
        }  # fmt: skip
        text = string.Template(TEMPLATE.read_text()).substitute(values)
        return text.rstrip() + "\n"


def pct(x, digits=0):
    return "—" if x is None else f"{100 * x:.{digits}f} %"


def loads(start, end):
    def one(v):
        return " ".join(f"{x:.2f}" for x in v)

    if not start:
        return "not recorded"
    return one(start) + (f" → {one(end)}" if end else "")


def required_tables(n_servers):
    """Table header rows every report has, with how many times each appears."""
    req = {
        "| Section | measured (UTC) |": 1,
        "| Row | req/s P1 | req/s P16 |": 1,
        "| Layout | filled with |": 1,
        "| Layout | keys left |": 1,
        "| Target | measured |": 1,
        "| `RL.SHARE` target | measured |": 1,
        "| Holders on the key |": 1,
        "| Client | processes |": 1,
        "| Window | bound `cap": 1,
        "| Hot key target (Rust,": 1,
        "| client, backend | scenario |": 1,
        "| Skew target | runs |": 1,
    }
    if n_servers:
        req.update({
            "| Server | `RL.SHARE`, 16 holders |": 1,
            "| Target | server | instructions |": 1,
            "| Ratio | instructions per call |": 1,
            "| Workload | instr/request |": n_servers,
            "| Per-caller target | server |": 1,
            "| Part | instr/call |": 2,
        })  # fmt: skip
    return req


def check_markdown(text, n_servers):
    """Problems with a rendered report: a table missing, a MISSING marker, a placeholder left."""
    problems = []
    for header, count in required_tables(n_servers).items():
        found = sum(1 for line in text.splitlines() if line.startswith(header))
        if found != count:
            problems.append(f"table {header!r}: {found} found, {count} expected")
    if "EXCEEDED" in text:
        problems.append("a let-out is over its bound (see the One hot key and skew sections)")
    if MISSING in text:
        problems.append(f"{text.count(MISSING)} {MISSING} marker(s): a named function is not in "
                        f"the profile (renamed or inlined? update scripts/benchtool/spec.py)")
    for line in text.splitlines():
        if "$" in line and not line.startswith("`") and "$(" not in line:
            problems.append(f"unfilled placeholder? {line.strip()[:80]}")
    if n_servers:
        for t in spec.INSTR_TARGETS:
            rows = [ln for ln in text.splitlines() if ln.startswith(f"| {t['label']} ≤ ")]
            if len(rows) != n_servers:
                problems.append(f"target {t['label']}: {len(rows)} rows, {n_servers} expected")
    return problems
