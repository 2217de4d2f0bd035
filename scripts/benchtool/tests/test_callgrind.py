"""The callgrind parser, on recorded dumps and on small hand-written ones."""

import unittest
from pathlib import Path

from benchtool.callgrind import Callgrind, MissingFunction

FIXTURES = Path(__file__).resolve().parent / "fixtures"


class RecordedRedis7(unittest.TestCase):
    """Dumps recorded from Redis 7.0 with the module (1,008 calls each; see trim_fixture.py).

    The expected numbers are callgrind_annotate's own (`--inclusive=yes`) on the same files.
    """

    @classmethod
    def setUpClass(cls):
        cls.grant = Callgrind.from_file(FIXTURES / "redis7-rl-take-grant.callgrind")
        cls.incr = Callgrind.from_file(FIXTURES / "redis7-incr.callgrind")

    def test_total_matches_the_files_totals_line(self):
        self.assertEqual(self.grant.total, self.grant.summary)
        self.assertEqual(self.incr.total, self.incr.summary)

    def test_inclusive_costs_match_callgrind_annotate(self):
        expected = {
            "RedisModuleCommandDispatcher": 6_276_075,
            "redis_rl::bucket::take::take": 6_044_235,
            "RM_Replicate": 2_783_305,
            "lookupCommandByCString": 1_615_800,
            "RM_OpenKey": 871_487,
            "redis_rl::grammar::limit": 357_840,
        }
        for fn, cost in expected.items():
            self.assertEqual(self.grant.inclusive(fn), cost, fn)
        self.assertEqual(self.incr.inclusive("incrCommand"), 995_939)
        self.assertEqual(self.incr.inclusive("lookupKeyWrite"), 436_104)

    def test_calls_counted_from_the_edges(self):
        # redis-benchmark -n 1000 -P 16 -c 4 sends whole pipelines: 1,008 calls.
        self.assertEqual(self.grant.calls_to("RedisModuleCommandDispatcher"), 1008)
        self.assertEqual(self.incr.calls_to("incrCommand"), 1008)

    def test_a_function_not_in_the_profile_is_an_error_not_zero(self):
        with self.assertRaises(MissingFunction) as cm:
            self.grant.inclusive("redis_rl::bucket::take::take_renamed")
        self.assertIn("take_renamed", str(cm.exception))
        with self.assertRaises(MissingFunction):
            self.incr.inclusive("RM_Replicate")  # INCR never replicates through the module API
        self.assertFalse(self.grant.has("RM_ModuleTypeSetValue"))  # updated in place

    def test_tree(self):
        lines = self.grant.tree("RedisModuleCommandDispatcher", 1008)
        self.assertRegex(lines[0], r"^\s+6,226\s+100\.0%  RedisModuleCommandDispatcher$")
        self.assertTrue(any(line.endswith("  RM_Replicate") for line in lines))
        self.assertTrue(any(line.endswith("bucket::take::take") for line in lines))  # short()
        shares = [float(line.split()[1].rstrip("%")) for line in lines]
        self.assertTrue(all(s >= 3.0 for s in shares))


HAND_WRITTEN = """\
# callgrind format
version: 1
positions: instr line
events: Ir Dr
summary: 1000 10

ob=(1) /bin/server
fl=(1) server.c
fn=(1) main
0x10 5 100 1
+2 * 50
cfn=(2) work
calls=3 0x40 20
* +1 600 7
cfn=(3) helper
calls=1 0x80 30
-1 -2 40
fn=(2)
0x40 20 300 2
cfn=(3)
calls=2 0x80 30
+4 2 200
cfn=(2)
calls=1 0x40 20
+4 3 999
fn=(3)
0x80 30 240
0x84 31
"""


class HandWritten(unittest.TestCase):
    def setUp(self):
        self.cg = Callgrind(HAND_WRITTEN.splitlines(keepends=True))

    def test_two_position_columns_and_the_first_event(self):
        # self costs: main 100+50, work 300, helper 240 (+0 for a line with no cost)
        self.assertEqual(self.cg.self_of("main"), 150)
        self.assertEqual(self.cg.self_of("work"), 300)
        self.assertEqual(self.cg.self_of("helper"), 240)
        self.assertEqual(self.cg.total, 690)

    def test_inclusive_through_compressed_names_without_recursion(self):
        self.assertEqual(self.cg.inclusive("main"), 150 + 600 + 40)
        self.assertEqual(self.cg.inclusive("work"), 300 + 200)  # the work->work call is recursion
        self.assertEqual(self.cg.calls_to("work"), 3)
        self.assertEqual(self.cg.calls_to("helper"), 3)

    def test_another_event(self):
        cg = Callgrind(HAND_WRITTEN.splitlines(), event="Dr")
        self.assertEqual(cg.self_of("main"), 1)
        self.assertEqual(cg.inclusive("main"), 1 + 7)
        self.assertEqual(cg.summary, 10)
        with self.assertRaises(ValueError):
            Callgrind(HAND_WRITTEN.splitlines(), event="Bc")

    def test_a_name_used_before_it_is_defined_is_an_error(self):
        with self.assertRaises(ValueError):
            Callgrind(["events: Ir", "fn=(7)", "0 5"])

    def test_missing(self):
        self.assertTrue(self.cg.has("helper"))
        with self.assertRaises(MissingFunction):
            self.cg.inclusive("Helper")  # exact names only


if __name__ == "__main__":
    unittest.main()
