"""The skew bench's pure parts: the demands, the max-min reference and the analysis of the
processes' bins (utilisation, the window bound, convergence after a move)."""

import json
import unittest

from benchtool import share_skew as sk
from benchtool.measure import parse_skew
from benchtool.render import Report, check_markdown
from benchtool.tests.test_render import results, skew


class SkewTest(unittest.TestCase):
    def test_the_hot_spot_moves_every_few_seconds(self):
        self.assertEqual([sk.demand_at("moving", i, 0.5) for i in range(4)], [900, 200, 200, 200])
        self.assertEqual([sk.demand_at("moving", i, 3.5) for i in range(4)], [200, 900, 200, 200])
        self.assertEqual(sk.demand_at("seed", 7, 9.0), 60)
        self.assertEqual(sum(sk.demands("seed")), 1500)

    def test_max_min(self):
        self.assertEqual(sk.max_min([900, 200, 200, 200], 1000), [400, 200, 200, 200])
        self.assertEqual(sk.max_min([10, 10], 1000), [10, 10])

    def test_analysis(self):
        # Two processes letting out 500/s each, evenly, for 4 s: the whole rate, within.
        per_bin = [[i, 5] for i in range(400)]
        kids = [{"bins": per_bin, "redis_calls": 4, "fallback_decisions": 0}] * 2
        out = sk.analyse("four", 4.0, kids, 8, 4.0)
        self.assertEqual(out["per_second"], [1000] * 4)
        self.assertEqual(out["utilisation"], 1.0)
        self.assertTrue(out["within"])
        self.assertEqual(out["server_calls_per_s"], 2.0)
        # A burst of 3,000 in one bin is over every window's bound.
        kids = [{"bins": [[50, 3000]], "redis_calls": 0, "fallback_decisions": 0}]
        self.assertFalse(sk.analyse("four", 4.0, kids, 0, 4.0)["within"])

    def test_a_late_process_shifts_the_start(self):
        # Both let out 500/s from 0.5 s (one made its limiter 500 ms late): the 2nd and 3rd
        # seconds from the shared start hold 1000 each, and so do those from the late start,
        # but the first from the late start is whole while the first from 0 is half.
        kids = [{"bins": [[i, 5] for i in range(50, 400)], "redis_calls": 1,
                 "fallback_decisions": 0, "late_start_ms": ms} for ms in (0.0, 500.0)]  # fmt: skip
        out = sk.analyse("four", 4.0, kids, 2, 4.0)
        self.assertEqual(out["per_second"], [500, 1000, 1000, 1000])
        self.assertEqual(out["late_start_ms"], 500.0)
        self.assertEqual(out["first_grant_ms"], 500)
        self.assertEqual((out["second_after_start"], out["third_after_start"]), (1.0, 1.0))
        kids[1]["late_start_ms"] = 1500.0  # the seconds from 1.5 s: 1.5-2.5, 2.5-3.5
        out = sk.analyse("four", 4.0, kids, 2, 4.0)
        self.assertEqual((out["second_after_start"], out["third_after_start"]), (1.0, None))

    def test_convergence_after_a_move(self):
        # Process 1 becomes hot at 3 s and lets out its share (400/s) from 3.5 s on.
        bins = [[i, 4] for i in range(350, 600)]
        kids = [{"bins": [], "redis_calls": 0, "fallback_decisions": 0}] * 4
        kids[1] = {"bins": bins, "redis_calls": 0, "fallback_decisions": 0}
        out = sk.analyse("moving", 6.0, kids, 0, 6.0)
        # (95 % of a 200 ms window: 19 of its 20 bins)
        self.assertEqual(out["converge_ms"], [690])



class SkewSection(unittest.TestCase):
    """`scripts/bench --only skew`: share_skew.py's output parsed, rendered and checked."""

    def test_the_scripts_output_parses(self):
        v = skew("python", "module", "four")
        self.assertEqual(parse_skew("a child's noise\n" + json.dumps(v))["utilisation"], 0.8)
        del v["converge_ms"]
        with self.assertRaisesRegex(ValueError, "converge_ms"):
            parse_skew(json.dumps(v))
        with self.assertRaisesRegex(ValueError, "no JSON"):
            parse_skew("share_skew: a child failed\n")

    def test_the_table_and_its_targets(self):
        text = Report(results()).markdown()
        self.assertIn("| Python, module | four | **80.0 %** | 80 % | 80 % | 0 / 0 ms | 80 % / 80 % |  | 8.0 | 800, 800, "
                      "800, 800, 800, 800, 800, 800, 800, 800, 800, 800 | 1,600 ÷ 3,010 in 2000 ms "
                      "| 2.00 1.50 1.00 → 2.50 1.60 1.00 |", text)  # fmt: skip
        self.assertIn("| Rust, module | moving | ", text)
        self.assertIn("| 0.69 s, never, never |", text)
        self.assertIn("| utilisation ≥ 97 % of the rate (from the 3rd second on, while the "
                      "demands exceed it) | 3 | 1 | 80.0 % |", text)  # fmt: skip
        self.assertIn("| a moved hot spot at 95 % of its share within 1000 ms (each move) | 3 | 1 "
                      "| never |", text)  # fmt: skip
        self.assertIn("| `RL.SHARE` under skew | ", text)
        self.assertIn("| … and ≥ 95 % in its 3rd | 3 | 0 | 80.0 % |", text)
        self.assertEqual(check_markdown(text, 3), [])  # a missed target is not a failed check

    def test_a_let_out_over_its_bound_fails_the_check(self):
        r = results()
        run = r["skew"]["runs"][0]
        run["windows"][0][1], run["within"] = 5000, False
        problems = check_markdown(Report(r).markdown(), 3)
        self.assertTrue(any("over its bound" in p for p in problems))

    def test_results_without_the_section_render_but_fail_the_check(self):
        r = results()
        del r["skew"]
        text = Report(r).markdown()
        self.assertIn("`scripts/bench --only skew`", text)
        self.assertTrue(any("client, backend" in p for p in check_markdown(text, 3)))


if __name__ == "__main__":
    unittest.main()
