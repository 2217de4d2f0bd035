"""A parser for callgrind output files (format version 1), by function name.

Only what the report needs: each function's self cost and the inclusive cost of each call
edge, for one event (Ir by default), with name compression, any number of position columns
(`positions: line` or `positions: instr line`) and relative positions (`+3`, `-2`, `*`).

A function is looked up by its exact name; asking for one that the profile does not contain
raises MissingFunction, never returns 0: a renamed or inlined function must be noticed, not
reported as free.
"""

import re
from collections import defaultdict

_REF = re.compile(r"\((\d+)\)(?: (.*))?$")


class MissingFunction(KeyError):
    def __init__(self, fn, where=""):
        super().__init__(fn)
        self.fn, self.where = fn, where

    def __str__(self):
        return f"function {self.fn!r} is not in the profile{' ' + self.where if self.where else ''}"


class Callgrind:
    """Self costs and call edges of one callgrind dump."""

    def __init__(self, lines, event="Ir", source="<callgrind>"):
        self.source = source
        self.self_cost = defaultdict(int)
        self.edges = defaultdict(lambda: [0, 0])  # (caller, callee) -> [calls, inclusive]
        self.functions = set()
        self.total = 0
        self.summary = None
        self.events = ["Ir"]
        self._parse(lines, event)
        self.callees = defaultdict(list)
        for (caller, callee), (n, cost) in self.edges.items():
            if caller != callee:
                self.callees[caller].append((callee, n, cost))

    @classmethod
    def from_file(cls, path, event="Ir"):
        with open(path, errors="replace") as f:
            return cls(f, event=event, source=str(path))

    def _parse(self, lines, event):
        names = {}  # fn and cfn share one namespace of compressed names
        npos = 1
        col = 0
        fn = callee = None
        calls = None

        def name(ref):
            m = _REF.match(ref)
            if not m:
                return ref
            if m.group(2) is not None:
                names[m.group(1)] = m.group(2)
                return m.group(2)
            if m.group(1) not in names:
                raise ValueError(f"{self.source}: compressed name ({m.group(1)}) used before defined")
            return names[m.group(1)]

        def cost_of(line):
            parts = line.split()
            i = npos + col
            return int(parts[i]) if len(parts) > i else 0

        for raw in lines:
            line = raw.rstrip("\n")
            if not line or line[0] == "#":
                continue
            c = line[0]
            if c.isdigit() or c in "+-*":
                cost = cost_of(line)
                if calls is not None:
                    edge = self.edges[(fn, callee)]
                    edge[0] += calls
                    edge[1] += cost
                    calls = None
                else:
                    self.self_cost[fn] += cost
                    self.total += cost
            elif line.startswith("fn="):
                fn = name(line[3:])
                self.functions.add(fn)
            elif line.startswith("cfn="):
                callee = name(line[4:])
                self.functions.add(callee)
            elif line.startswith("calls="):
                calls = int(line[6:].split()[0])
            elif line.startswith("positions:"):
                npos = len(line.split(":", 1)[1].split())
            elif line.startswith("events:"):
                self.events = line.split(":", 1)[1].split()
                if event not in self.events:
                    raise ValueError(f"{self.source}: no event {event!r} in {self.events}")
                col = self.events.index(event)
            elif line.startswith("summary:") or line.startswith("totals:"):
                self.summary = int(line.split(":", 1)[1].split()[col])
            # ob=, fl=, fi=, fe=, cob=, cfi=, cfl=, jump=, jcnd= and the header lines do not
            # change whose cost a line is.

    def has(self, fn):
        return fn in self.functions

    def require(self, fn):
        if fn not in self.functions:
            raise MissingFunction(fn, f"({self.source})")

    def self_of(self, fn):
        self.require(fn)
        return self.self_cost.get(fn, 0)

    def inclusive(self, fn):
        """Self cost plus the inclusive cost of every call it makes (recursion excluded)."""
        self.require(fn)
        return self.self_cost.get(fn, 0) + sum(cost for _, _, cost in self.callees.get(fn, ()))

    def calls_to(self, fn):
        """How many times fn was called (summed over its callers)."""
        self.require(fn)
        return sum(n for (caller, callee), (n, _) in self.edges.items() if callee == fn and caller != fn)

    def tree(self, root, per, min_share=0.03, depth=8):
        """Lines `instr/call  share  name` under `root`, biggest first.

        Callgrind records a callee's cost per caller function, not per call path: a function
        reached from several places (`dictFind`, `zfree`) has its callees split among those
        places in proportion to its cost on each path.
        """
        total = self.inclusive(root)
        lines = []

        def walk(fn, cost, level, seen):
            lines.append((level, fn, cost))
            whole = self.inclusive(fn)
            if level >= depth or whole <= 0:
                return
            share = cost / whole
            kids = sorted(self.callees.get(fn, ()), key=lambda k: (-k[2], k[0]))
            for kid, _, kid_cost in kids:
                if kid_cost * share >= min_share * total and kid not in seen:
                    walk(kid, kid_cost * share, level + 1, seen | {kid})

        walk(root, total, 0, {root})
        return [
            f"{cost / per:>8,.0f}  {100 * cost / total:5.1f}%  {'  ' * level}{short(fn)}"
            for level, fn, cost in lines
        ]


def short(fn):
    fn = re.sub(r"^redis_rl::", "", fn)
    return fn if len(fn) < 90 else fn[:87] + "..."
