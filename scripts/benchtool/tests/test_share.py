"""The RL.SHARE and one-hot-key sections: the share bench's output, the let-out windows,
merging a partial run into earlier results, and how the sections render and are checked."""

import copy
import io
import json
import unittest
from contextlib import redirect_stderr
from pathlib import Path
from types import SimpleNamespace

from benchtool import cli, share_bench, spec
from benchtool.measure import legacy_sections, merge, parse_hot
from benchtool.render import MISSING, Report, check_markdown
from benchtool.tests.test_render import hot, results

FIXTURES = Path(__file__).resolve().parent / "fixtures"


def partial(sections, commit="def5678"):
    """What `measure(only=sections)` returns: only those sections, each with its entry."""
    full = results()
    out = {"schema": 1, "meta": dict(full["meta"], lua_sha="a" * 40, module_commit=commit),
           "sections": {}}  # fmt: skip
    for name in sections:
        key = spec.SECTIONS[name]
        out[key] = copy.deepcopy(full[key])
        out["sections"][name] = {"date": "2026-12-02 00:10", "minutes": 1.5,
                                 "module_commit": commit, "quick": False,
                                 "load_start": [3.0, 2.0, 1.0], "load_end": [4.0, 3.0, 2.0]}  # fmt: skip
    return out


class HotOutput(unittest.TestCase):
    def test_the_rust_examples_json_parses(self):
        text = "2 processes, one key ...\n" + (FIXTURES / "share_bench_rust.out").read_text()
        v = parse_hot(text)
        self.assertEqual(v["client"], "rust")
        self.assertEqual(v["decisions"], 4852173)
        self.assertEqual(v["windows"][0], [50, 10052, 15102])
        self.assertTrue(v["within"])

    def test_the_python_scripts_summary_parses_as_the_same_format(self):
        args = SimpleNamespace(procs=2, seconds=1.0, rate=100_000.0, cap=10_000.0)
        children = [{"decisions": 1000, "granted": 30, "redis_calls": 3, "bins": [[0, 10], [999, 20]],
                     "fallback_decisions": 7},
                    {"decisions": 500, "granted": 5, "redis_calls": 2, "bins": [[1000, 5]]}]  # fmt: skip
        v = parse_hot(json.dumps(share_bench.summary(args, children, 4, 1.01)))
        self.assertEqual((v["decisions"], v["granted"], v["client_calls"]), (1500, 35, 5))
        # decisions of the failure policy (a call that timed out), reported beside the bound
        self.assertEqual(v["fallback_decisions"], 7)
        # the 1 s windows: bins 0..999 hold 30, bins 1..1000 hold 25
        self.assertEqual(v["windows"][-1][:2], [1000, 30])
        self.assertEqual(v["bound"], 10_000 + 100_000 + 2)
        self.assertTrue(v["within"])

    def test_output_without_a_field_or_a_json_line_is_an_error(self):
        line = json.loads((FIXTURES / "share_bench_rust.out").read_text())
        del line["server_calls"]
        with self.assertRaisesRegex(ValueError, "server_calls"):
            parse_hot(json.dumps(line))
        with self.assertRaisesRegex(ValueError, "no JSON"):
            parse_hot("thread 'main' panicked\n")


class Windows(unittest.TestCase):
    def test_most_let_out_in_a_sliding_window_against_its_bound(self):
        bins = [0] * 100
        bins[10], bins[59], bins[60], bins[99] = 5, 7, 11, 2
        w = share_bench.worst_windows(bins, 99, rate=1000.0, cap=10.0, holders=2)
        # 50 ms: bins 10..59 hold 12, bins 59..99 hold 20 (the most), bins 60..99 hold 13
        self.assertEqual(w, [[50, 20, 10 + 1000 * 0.051 + 2]])

    def test_a_burst_over_the_bound_is_not_within(self):
        args = SimpleNamespace(procs=1, seconds=0.1, rate=1000.0, cap=10.0)
        over = share_bench.summary(args, [{"decisions": 200, "granted": 200, "redis_calls": 1,
                                           "bins": [[5, 200]]}], 1, 0.1)  # fmt: skip
        self.assertFalse(over["within"])  # 200 > 10 + 1000 * 0.051 + 1 in 50 ms


class Merge(unittest.TestCase):
    def test_a_partial_run_replaces_its_sections_only(self):
        base = results()
        base["throughput"][0]["median"]["usec"] = 123.0
        part = partial(["share", "hotkey"])
        part["share"]["scale"][0]["usec"] = 77.0
        merged = merge(base, part)
        self.assertEqual(merged["throughput"][0]["median"]["usec"], 123.0)
        self.assertEqual(merged["share"]["scale"][0]["usec"], 77.0)
        self.assertEqual(merged["meta"]["lua_sha"], base["meta"]["lua_sha"])
        self.assertEqual(merged["meta"]["module_commit"], "abc1234")
        # the sections of the base (a file from before sections were recorded) keep its run
        self.assertEqual(merged["sections"]["throughput"]["module_commit"], "abc1234")
        self.assertEqual(merged["sections"]["share"]["module_commit"], "def5678")
        self.assertNotIn("sections", base)  # the base itself is not changed
        text = Report(merged).markdown()
        self.assertEqual(check_markdown(text, 3), [])
        self.assertIn("| `RL.SHARE` at scale | 2026-12-02 00:10 | def5678 | 3.00 2.00 1.00 → "
                      "4.00 3.00 2.00 |", text)  # fmt: skip
        self.assertIn("| Throughput, latency and server time | 2026-01-01 00:00 | abc1234 |", text)

    def test_a_new_throughput_brings_its_script_sha(self):
        merged = merge(results(), partial(["throughput"]))
        self.assertEqual(merged["meta"]["lua_sha"], "a" * 40)

    def test_legacy_sections_read_the_load_from_the_machine_line(self):
        r = results()
        r["meta"]["machine"] = "CPU, 2 CPUs, load average 0.16 0.61 0.73 at start"
        secs = legacy_sections(r)
        self.assertEqual(secs["profile"]["load_start"], [0.16, 0.61, 0.73])
        del r["hotkey"]
        self.assertNotIn("hotkey", legacy_sections(r))

    def test_only_needs_known_sections_and_an_existing_file(self):
        for argv in (["--only", "bogus"], ["render", "--only", "share"],
                     ["--only", "share", "--json", "/nonexistent/results.json"]):  # fmt: skip
            with self.subTest(argv=argv), redirect_stderr(io.StringIO()):
                with self.assertRaises(SystemExit) as e:
                    cli.main(argv)
                self.assertEqual(e.exception.code, 2)


class ShareRendering(unittest.TestCase):
    def test_the_share_section_shows_the_ratios_and_targets(self):
        text = Report(results()).markdown()
        self.assertIn("| Redis 7.0 | 11,000 | 6,226 | 988 | 1.77x | 11.13x |", text)
        self.assertIn("| 16 holders ≤ 2x the instructions of `RL.TAKE` grant (Redis 7.0) | "
                      "11,000 ÷ 6,226 = 1.77x | **met** |", text)  # fmt: skip
        self.assertIn("| 4,096 | 40.0 | 40.0, 41.0 | 20.0 | 104 bytes | 344,064 bytes (84 a holder) |",
                      text)  # fmt: skip
        self.assertIn("| 4,096 holders ≤ 50 µs server time per call (`INFO commandstats`) | "
                      "40.0 µs | **met** |", text)  # fmt: skip
        self.assertIn("| 4,096 holders ≤ 50 µs server CPU per call (the whole request; not "
                      "inflated by waiting for a CPU) | 20.0 µs | **met** |", text)  # fmt: skip

    def test_the_hot_key_section_shows_rates_bounds_and_load(self):
        r = results()
        r["hotkey"]["rust"] = hot("rust", 4_000_000)
        text = Report(r).markdown()
        self.assertIn("| Rust `rl_client::ShareLimiter` | 8 × 10 s | **4,000,000** | 99,457 | "
                      "**9.3** (93 in 10.00 s) | 994,570 | 1,010,008 (within) | "
                      "9.70 8.00 7.00 → 10.10 8.20 7.10 |", text)  # fmt: skip
        self.assertIn("| decisions across the fleet ≥ 5,000,000/s | 4,000,000/s | **not met** |",
                      text)  # fmt: skip
        self.assertIn("| 50 ms | 15,108 | 7,519 | 7,519 |", text)
        self.assertEqual(check_markdown(text, 3), [])  # a missed target is not a failed check

    def test_a_let_out_over_its_bound_fails_the_check(self):
        r = results()
        r["hotkey"]["python"]["windows"][0][1] = 20_000
        problems = check_markdown(Report(r).markdown(), 3)
        self.assertTrue(any("over its bound" in p for p in problems))

    def test_a_profile_without_the_share_workload_is_missing(self):
        r = results()
        r["profiles"]["valkey9"]["workloads"] = [
            w for w in r["profiles"]["valkey9"]["workloads"] if w["key"] != "share16"]
        report = Report(r)
        text = report.markdown()
        self.assertIn(f"**{MISSING}: share16**", text)
        self.assertIn("Valkey 9 / RL.SHARE, 16 holders: not profiled", report.missing)

    def test_results_without_the_new_sections_render_but_fail_the_check(self):
        r = results()
        del r["share"], r["hotkey"]
        text = Report(r).markdown()
        self.assertIn("`scripts/bench --only share`", text)
        self.assertIn("`scripts/bench --only hotkey`", text)
        problems = check_markdown(text, 3)
        self.assertTrue(any("Holders on the key" in p for p in problems))
        self.assertTrue(any("Client | processes" in p for p in problems))


if __name__ == "__main__":
    unittest.main()
