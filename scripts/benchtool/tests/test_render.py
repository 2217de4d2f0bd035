"""The renderer and its checks, on results built from the recorded dumps and made-up numbers."""

import copy
import unittest
from pathlib import Path
from unittest import mock

from benchtool import share_skew, spec
from benchtool.callgrind import Callgrind
from benchtool.measure import analyse_profile, legacy_sections, merge, parse_hot
from benchtool.render import MISSING, Report, check_markdown

FIXTURES = Path(__file__).resolve().parent / "fixtures"
GRANT = Callgrind.from_file(FIXTURES / "redis7-rl-take-grant.callgrind")
INCR = Callgrind.from_file(FIXTURES / "redis7-incr.callgrind")


def fake_workload(w, flavor, base):
    """A recorded-looking workload result: every tracked part present, unless absent."""
    parts = {}
    for i, part in enumerate(sorted(set(w["parts"]) | set(w["absent"]))):
        fn = spec.PARTS[part].get(flavor)
        if fn is not None:
            parts[part] = {"fn": fn, "instr": None if part in w["absent"] else 100.0 + i}
    return {"key": w["key"], "name": w["name"], "root": spec.ROOTS[w["root"]][flavor],
            "command": " ".join(w["args"]), "request": base + 3000.0, "instr": base,
            "tree": [f"{base:>8,.0f}  100.0%  root"], "parts": parts, "missing": []}  # fmt: skip


def results(servers=("redis7", "redis8", "valkey9")):
    profiles = {}
    for n, name in enumerate(servers):
        info = spec.SERVERS[name]
        workloads = []
        for i, w in enumerate(spec.PROFILES):
            if name == "redis7" and w["key"] == "grant":
                workloads.append(analyse_profile(GRANT, w, "redis7", 1008))
            elif name == "redis7" and w["key"] == "incr":
                workloads.append(analyse_profile(INCR, w, "redis7", 1008))
            else:
                workloads.append(fake_workload(w, info["flavor"], 1000.0 * (i + 1) + n))
        profiles[name] = {"label": info["label"], "flavor": info["flavor"], "binary": name,
                          "version": f"{name} v=0", "calls": 1008, "workloads": workloads}
    rows = []
    for i, row in enumerate(spec.THROUGHPUT_ROWS):
        m = {"rps1": 100000.0 - i, "rps16": 500000.0 - 1000 * i, "p50": 0.2, "p99": 0.5,
             "usec": 0.5 + i}  # fmt: skip
        rows.append({"key": row["key"], "label": row["label"], "args": row["args"],
                     "rand": row["rand"], "incr": row["incr"], "lua": row["lua"],
                     "samples": {k: [v] for k, v in m.items()}, "median": m})  # fmt: skip
    layout = {"bytes": 140.0, "keys": 10, "usage": 48}
    return {
        "schema": 1,
        "meta": {"date": "2026-01-01 00:00", "minutes": 1.0, "quick": True,
                 "counts": spec.Counts(True).as_dict(), "clients": 50, "machine": "test",
                 "server": "Redis server v=7.0.15", "client": "redis-benchmark 7.0.15",
                 "module_commit": "abc1234", "lua_sha": "f" * 40,
                 "limits": {"grant": spec.GRANT_LIMIT, "deny": spec.DENY_LIMIT,
                            "lease_ttl_ms": spec.LEASE_TTL_MS, "lease_keys": spec.LEASE_KEYS,
                            "random_keys": spec.RANDOM_KEYS}},
        "throughput": rows,
        "memory": {"buckets": 10,
                   "layouts": {"floor": dict(layout, bytes=110.0), "ours": layout,
                               "lua_expiry": dict(layout, bytes=160.0), "lua_seed": layout},
                   "idle": {"ours": {"keys": 0, "bytes": 1000, "waited": 0.5},
                            "lua": {"keys": 10, "bytes": 1200, "waited": 5.0}}},
        "profiles": profiles,
        "share": {"limit": spec.GRANT_LIMIT, "want": "10", "period_ms": spec.SHARE_PERIOD_MS,
                  "rounds": 3,
                  "scale": [{"holders": h, "calls": 3000, "batches": [us, us + 1.0],
                             "usec": us, "cpu_batches": [us / 2], "cpu_usec": us / 2,
                             "bytes_per_holder": 104.0, "usage": 84 * h}
                            for h, us in ((1000, 24.0), (4096, 40.0))]},
        "hotkey": {"rust": hot("rust", 5_900_000), "python": hot("python", 300_000), "cpus": 2},
        "skew": {"seconds": 12.0, "cpus": 2,
                 "runs": [skew("python", "module", "four"), skew("rust", "module", "moving"),
                          skew("python", "functions", "seed")]},
    }  # fmt: skip


def skew(client, backend, scenario):
    """A skew case as share_skew.py reports it: every process at 1000/s ÷ processes, evenly
    (the moving case: at its share from 500 ms after each move)."""
    n = len(share_skew.demands(scenario))
    bins = [[i, 10 // n if scenario != "moving" else 3] for i in range(1200)]
    kids = [{"bins": bins, "redis_calls": 10, "fallback_decisions": 0} for _ in range(n)]
    if scenario == "moving":
        kids[1] = {"bins": [[i, 4] for i in range(350, 600)], "redis_calls": 10,
                   "fallback_decisions": 0}  # fmt: skip
    v = share_skew.analyse(scenario, 12.0, kids, 96, 12.0)
    v["client"], v["backend"] = client, backend
    v["load_before"], v["load_after"] = [2.0, 1.5, 1.0], [2.5, 1.6, 1.0]
    return v


def hot(client, per_s, seconds=10):
    return {"client": client, "procs": 8, "seconds": seconds, "rate": 100000, "cap": 10000,
            "decisions": per_s * seconds, "granted": 994_570, "server_calls": 93,
            "server_secs": 10.0, "client_calls": 100, "bound": 1_010_008.0,
            "windows": [[50, 7519, 15108.0], [1000, 102314, 110108.0]], "within": True,
            "load_before": [9.7, 8.0, 7.0], "load_after": [10.1, 8.2, 7.1]}  # fmt: skip


class Rendering(unittest.TestCase):
    def test_recorded_grant_profile_has_every_named_part(self):
        w = analyse_profile(GRANT, spec.PROFILE_BY_KEY["grant"], "redis7", 1008)
        self.assertEqual(w["missing"], [])
        self.assertEqual(w["calls"], 1008)
        self.assertAlmostEqual(w["instr"], 6_276_075 / 1008)
        self.assertAlmostEqual(w["parts"]["replicate"]["instr"], 2_783_305 / 1008)

    def test_a_complete_report_passes_its_check(self):
        r = results()
        report = Report(r)
        text = report.markdown()
        self.assertEqual(report.missing, [])
        self.assertEqual(check_markdown(text, 3), [])
        self.assertNotIn(MISSING, text)
        self.assertIn("(docs/performance.md)", text)
        # the deny path is declared not to replicate: shown as such, not as missing
        self.assertIn("| `RM_Replicate` (the `RL.SETSTATE` effect), all of it | not called | |",
                      text)
        # the recorded grant profile's numbers reach the target table
        self.assertIn("| `RL.TAKE` grant ≤ 5,000 | Redis 7.0 | 6,226 | **not met** |", text)

    def test_a_renamed_function_is_a_visible_missing_marker_and_a_failed_check(self):
        renamed = copy.deepcopy(spec.PARTS)
        renamed["take"]["redis7"] = "redis_rl::bucket::take::take_v2"
        with mock.patch.dict(spec.PARTS, renamed):
            w = analyse_profile(GRANT, spec.PROFILE_BY_KEY["grant"], "redis7", 1008)
        self.assertEqual(w["missing"], ["redis_rl::bucket::take::take_v2"])
        self.assertIsNone(w["parts"]["take"]["instr"])  # None, not 0
        r = results()
        r["profiles"]["redis7"]["workloads"][2] = w
        report = Report(r)
        text = report.markdown()
        self.assertIn(f"**{MISSING}: `redis_rl::bucket::take::take_v2`**", text)
        self.assertEqual(report.missing, ["Redis 7.0 / RL.TAKE grant: `redis_rl::bucket::take::take_v2`"])
        self.assertTrue(any(MISSING in p for p in check_markdown(text, 3)))

    def test_a_missing_part_in_a_target_reason_fails(self):
        r = results()
        wl = next(w for w in r["profiles"]["valkey9"]["workloads"] if w["key"] == "lease")
        wl["parts"]["replicate"]["instr"] = None
        report = Report(r)
        text = report.markdown()
        self.assertIn(f"**{MISSING}: `VM_Replicate`**", text)
        self.assertTrue(report.missing)

    def test_a_missing_command_root_fails(self):
        r = results()
        wl = r["profiles"]["redis8"]["workloads"][0]
        wl["instr"], wl["tree"] = None, []
        report = Report(r)
        text = report.markdown()
        self.assertIn("Redis 8.2 / INCR: `incrCommand`", report.missing)
        self.assertTrue(check_markdown(text, 3))

    def test_check_notices_a_missing_table(self):
        text = Report(results()).markdown()
        cut = "\n".join(line for line in text.splitlines() if not line.startswith("| Layout | keys left"))
        self.assertTrue(any("keys left" in p for p in check_markdown(cut, 3)))
        only_two = "\n".join(line for line in text.splitlines() if "| Valkey 9 |" not in line)
        self.assertTrue(any("rows, 3 expected" in p for p in check_markdown(only_two, 3)))

    def test_without_a_profile(self):
        r = results()
        r["profiles"] = {}
        text = Report(r).markdown()
        self.assertEqual(check_markdown(text, 0), [])
        self.assertIn("BENCH_PROFILE=0", text)

    def test_one_server_only(self):
        text = Report(results(servers=("redis7",))).markdown()
        self.assertEqual(check_markdown(text, 1), [])


if __name__ == "__main__":
    unittest.main()


class PerCaller(unittest.TestCase):
    """The per-caller path: its side-by-side table and its targets, met and not met."""

    def with_percaller(self):
        r = results()
        us = {"incr_rand": 1.0, "rl_rand": 2.5, "lua_rand": 14.0, "fn_rand": 16.0,
              "cell_rand": 4.0, "incr_hot": 0.3, "rl_hot": 0.6, "lua_hot": 5.0,
              "fn_hot": 6.0, "cell_hot": 1.5}  # fmt: skip
        r["percaller"] = {"calls": 1000, "repeats": 1, "keys": spec.RANDOM_KEYS,
                          "cell": {"module": "libredis_cell.so", "sha256": "ab" * 32},
                          "servers": {"redis7": {"label": "Redis 7.0", "version": "v",
                                                 "usec": us, "samples": {}}}}  # fmt: skip
        return r

    def test_the_side_by_side_table_and_its_targets(self):
        text = Report(self.with_percaller()).markdown()
        self.assertEqual(check_markdown(text, 3), [])
        self.assertIn("| Redis 7.0 | 100,000 random | 1.000 | 2.500 | 14.000 | 16.000 | 4.000 "
                      "| 5.60x | 6.40x | 1.60x | 2.50x |", text)  # fmt: skip
        self.assertIn("| redis-cell ÷ `RL.TAKE`, random keys ≥ 2.0x | Redis 7.0 | 1.60x "
                      "| **not met** |", text)  # fmt: skip
        self.assertIn("| Lua script ÷ `RL.TAKE`, random keys ≥ 5.0x | Redis 7.0 | 5.60x "
                      "| **met** |", text)  # fmt: skip
        self.assertIn("| `RL.TAKE` ÷ `INCR`, random keys ≤ 3.0x | Redis 7.0 | 2.50x "
                      "| **met** |", text)  # fmt: skip

    def test_without_redis_cell_its_columns_are_empty(self):
        r = self.with_percaller()
        r["percaller"]["cell"] = None
        for k in ("cell_rand", "cell_hot"):
            del r["percaller"]["servers"]["redis7"]["usec"][k]
        text = Report(r).markdown()
        self.assertIn("| redis-cell ÷ `RL.TAKE`, random keys ≥ 2.0x | Redis 7.0 | not measured",
                      text)  # fmt: skip
        self.assertIn("`CELL_MODULE` unset", text)

    def test_the_instruction_targets_are_against_each_servers_grant(self):
        text = Report(results()).markdown()
        rows = [ln for ln in text.splitlines() if ln.startswith("| RL.TAKE, ")
                and "a hot grant" in ln]  # fmt: skip
        self.assertEqual(len(rows), 6)
        self.assertEqual(sum(1 for ln in text.splitlines()
                             if ln.startswith("| RL.TAKE, 100k random keys ≤ 8,000")), 1)  # fmt: skip

    def test_the_pin_targets_are_against_each_servers_grant_and_the_cost_before_pins(self):
        res = results()
        text = Report(res).markdown()
        rows = [ln for ln in text.splitlines() if ln.startswith("| RL.TAKE grant, pinned key ≤")]
        self.assertEqual(len(rows), 3)
        grant = next(w for w in res["profiles"]["redis7"]["workloads"] if w["key"] == "grant")
        limit = f"{grant['instr'] + spec.PIN_INSTR['extra']:,.0f}"
        self.assertIn(f"| {limit} |", rows[0])
        before = [ln for ln in text.splitlines() if "before pins +" in ln]
        self.assertEqual(len(before), 2)
        self.assertIn("| 2,345 |", before[1])
        # A results file measured before the pinned workload existed says so.
        for w in res["profiles"]["redis8"]["workloads"]:
            if w["key"] == "pinned":
                res["profiles"]["redis8"]["workloads"].remove(w)
                break
        text = Report(res).markdown()
        self.assertIn("| RL.TAKE grant, pinned key ≤ a grant + 300 | Redis 8.2 | not measured",
                      text)  # fmt: skip


class Library(unittest.TestCase):
    """The Functions library against the seed script: targets met and not met, per server."""

    def with_library(self):
        r = results()
        cases = {c["key"]: {"fn": 100.0, "seed": 100.0 if c["seed"] else None}
                 for c in spec.LIBRARY_CASES}
        cases["full"] = {"fn": 120.0, "seed": 100.0}  # over its 1.0x
        cases["deny"] = {"fn": 80.0, "seed": 100.0}  # under its 0.9x
        before = {c["key"]: {"fn": 110.0} for c in spec.LIBRARY_CASES}
        before["lease"] = {"fn": 90.0}  # the lease got dearer
        r["library"] = {"before_rev": "c9e6107", "profiles": {"redis7": {
            "label": "Redis 7.0", "flavor": "redis7", "version": "v", "calls": 10,
            "cases": cases, "before": before}},
            "times": {"calls": 10, "version": "Redis server v=7.0.15 sha=0",
                      "rounds": {c["key"]: {"fn": [2.0, 3.0], "seed": [4.0, 3.0] if c["seed"]
                                            else []} for c in spec.LIBRARY_CASES}}}
        return r

    def test_the_library_tables_and_their_targets(self):
        text = Report(self.with_library()).markdown()
        self.assertEqual(check_markdown(text, 3), [])
        rows = {ln.split(" | ")[0][2:]: ln for ln in text.splitlines()
                if ln.startswith("| `rl_") and "| Redis 7.0 |" in ln}
        self.assertIn("| 1.20x | ≤ 1.0x the seed script | **not met** |",
                      rows["`rl_take` grant, bucket full again between calls"])
        self.assertIn("| 0.80x | ≤ 0.9x the seed script | **met** |", rows["`rl_take` deny"])
        self.assertIn("| below the hash layout | **not met** |",
                      rows["`rl_lease` 20 (1000 keys, 100 ms)"])
        self.assertIn("| below the hash layout | **met** |", rows["`rl_mtake` of 2 keys"])
        self.assertIn("| 0.50x, 1.00x |", text)
        self.assertIn("Server time per call on 7.0.15", text)

    def test_without_the_section(self):
        text = Report(results()).markdown()
        self.assertIn("Not measured yet: `scripts/bench --only library`.", text)
