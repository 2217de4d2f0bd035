"""The skew bench's pure parts: the demands, the max-min reference and the analysis of the
processes' bins (utilisation, the window bound, convergence after a move)."""

import unittest

from benchtool import share_skew as sk


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

    def test_convergence_after_a_move(self):
        # Process 1 becomes hot at 3 s and lets out its share (400/s) from 3.5 s on.
        bins = [[i, 4] for i in range(350, 600)]
        kids = [{"bins": [], "redis_calls": 0, "fallback_decisions": 0}] * 4
        kids[1] = {"bins": bins, "redis_calls": 0, "fallback_decisions": 0}
        out = sk.analyse("moving", 6.0, kids, 0, 6.0)
        # (95 % of a 200 ms window: 19 of its 20 bins)
        self.assertEqual(out["converge_ms"], [690])


if __name__ == "__main__":
    unittest.main()
