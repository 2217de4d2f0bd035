#!/usr/bin/env python3
"""Trims a callgrind dump to one function and everything it calls (how the fixtures were made).

    python3 scripts/benchtool/tests/trim_fixture.py IN ROOT_FUNCTION OUT

Keeps the header, the blocks of ROOT_FUNCTION, of every function reachable from it and of its
callers (their edges count the calls), and
the totals line recomputed; compressed names are written out in full where the kept text
first uses them, so the result is a valid callgrind file on its own (callgrind_annotate reads
it). The fixtures came from a short run (redis-benchmark -c 4 -P 16 -n 1000 after a warm-up,
counters zeroed with callgrind_control -z, dumped with -d) against Debian's Redis 7.0.
"""

import re
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))

from benchtool.callgrind import Callgrind  # noqa: E402

SPACES = {"fn": "fn", "cfn": "fn", "fl": "fl", "fi": "fl", "fe": "fl", "cfi": "fl", "cfl": "fl",
          "ob": "ob", "cob": "ob"}  # fmt: skip
REF = re.compile(r"^(\w+)=\((\d+)\)(?: (.*))?$")


def trim(src, root, dst):
    lines = Path(src).read_text(errors="replace").splitlines()
    cg = Callgrind(lines)
    keep, todo = set(), [root]
    while todo:
        fn = todo.pop()
        if fn in keep:
            continue
        keep.add(fn)
        todo += [c for c, _, _ in cg.callees.get(fn, ())]
    # and the root's callers, whose call edges count the calls
    keep |= {caller for (caller, callee) in cg.edges if callee == root and caller != root}

    names = defaultdict(dict)  # space -> id -> name, from the whole input
    for line in lines:
        m = REF.match(line)
        if m and m.group(1) in SPACES and m.group(3) is not None:
            names[SPACES[m.group(1)]][m.group(2)] = m.group(3)

    emitted = defaultdict(set)

    def out_line(line):
        m = REF.match(line)
        if not m or m.group(1) not in SPACES:
            return line
        kind, ident = m.group(1), m.group(2)
        space = SPACES[kind]
        if ident in emitted[space]:
            return f"{kind}=({ident})"
        emitted[space].add(ident)
        return f"{kind}=({ident}) {names[space][ident]}"

    header, body = [], []
    context = {"ob": None, "fl": None}
    in_body = False
    keeping = False
    total = 0
    fn = None
    for line in lines:
        m = REF.match(line)
        kind = m.group(1) if m else None
        if not in_body and kind not in ("ob", "fl", "fn"):
            if not line.startswith(("totals:", "summary:")):
                header.append(line)
            continue
        in_body = True
        if kind in ("ob", "fl"):
            context[kind] = line
            continue
        if kind == "fn":
            fn = names["fn"][m.group(2)]
            keeping = fn in keep
            if keeping:
                body.append("")
                for k in ("ob", "fl"):
                    if context[k]:
                        body.append(out_line(context[k]))
                body.append(out_line(line))
            continue
        if line.startswith(("totals:", "summary:")) or not keeping:
            continue
        body.append(out_line(line))
    kept = Callgrind(header + body)
    total = kept.total
    text = "\n".join(header + [f"summary: {total}"] + body + ["", f"totals: {total}", ""])
    Path(dst).write_text(text)
    return len(keep)


if __name__ == "__main__":
    src, root, dst = sys.argv[1:4]
    print(f"kept {trim(src, root, dst)} functions")
