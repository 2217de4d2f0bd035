"""What a rules check costs, next to ``Limiter.take()`` and the raw calls it makes.

Starts its own redis-server with the module on a Unix socket and measures, on one
connection, microseconds per call (wall, and this process's CPU) of:

- ``Limiter.take()`` (one ``RL.TAKE``) and ``Rules.check()`` with a one-layer document
  (one ``RL.MTAKE`` of one bucket): the engine's own cost;
- the raw ``RL.MTAKE`` of the seed's buckets for a premium user on the search path (4
  buckets of 3 layers) and ``Rules.check()`` on the seed document making it.

    python python/bench_rules.py [--seconds 0.2] [--rounds 10]

Every decision is a grant (the limits never run dry). Reported, never asserted.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List, Tuple

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import HUGE, RULES_ATTRS, SEED_RULES, Sample, measure, paired_ratio
from redis_rl import Limiter, Rules
from redis_rl.rules_doc import plan as make_plan

REPO = Path(__file__).resolve().parents[1]
ONE = f"layers:\n  - {{name: ip, key: 'ip:{{ip}}', limit: '{HUGE}'}}\n"
SEED = SEED_RULES
ATTRS = RULES_ATTRS


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=float, default=0.2)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--server", default=os.environ.get("RL_SERVER", "redis-server"))
    ap.add_argument(
        "--module",
        default=os.environ.get("RL_MODULE", str(REPO / "target" / "release" / "libredis_rl.so")),
    )
    args = ap.parse_args()
    args.module = os.path.abspath(args.module)  # the server changes to its --dir first
    with tempfile.TemporaryDirectory() as tmp:
        sock = os.path.join(tmp, "redis.sock")
        proc = subprocess.Popen(
            [args.server, "--port", "0", "--unixsocket", sock, "--save", "", "--dir", tmp,
             "--loadmodule", args.module],
            stdout=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            r = redis.Redis(unix_socket_path=sock, socket_timeout=0.1)
            deadline = time.monotonic() + 10
            while True:
                try:
                    r.ping()
                    break
                except redis.exceptions.ConnectionError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.02)
            limiter = Limiter(r, "bench:take", HUGE, backend="module")
            one = Rules.from_text(r, ONE, backend="module")
            seed = Rules.from_text(r, SEED, backend="module")
            plan = seed.check(ATTRS)
            buckets = [
                (b.key, b.rate, b.cap) for a in make_plan(seed.document, ATTRS) for b in a.buckets
            ]
            mtake = ["RL.MTAKE", 1]
            for k, rate, cap in buckets:
                mtake += [k, repr(rate), repr(cap)]
            mtake.append("WITHSTATE")
            rows: List[Tuple[str, Callable[[], object]]] = [
                ("limiter", limiter.take),
                ("rules1", lambda: one.check({"ip": "10.0.0.1"})),
                ("mtake4", lambda: r.execute_command(*mtake)),
                ("seed", lambda: seed.check(ATTRS)),
            ]
            samples: Dict[str, List[Sample]] = {}
            for _, fn in rows:
                measure(fn, 0.1)
            for _ in range(args.rounds):
                for name, fn in rows:
                    samples.setdefault(name, []).append(measure(fn, args.seconds))
            assert plan.granted and len(buckets) == 4, (plan, buckets)
        finally:
            proc.terminate()
            proc.wait()
    cpu = {n: min(s[1] for s in rows_) for n, rows_ in samples.items()}
    wall = {n: min(s[0] for s in rows_) for n, rows_ in samples.items()}
    print(f"best of {args.rounds} rounds of {args.seconds:g} s, load {os.getloadavg()[0]:.1f}")
    print("| | wall µs | CPU µs | CPU vs base, median of rounds |")
    print("|---|---:|---:|---:|")
    for label, name, base in (
        ("`Limiter.take()`", "limiter", None),
        ("`Rules.check()`, one layer", "rules1", "limiter"),
        ("raw `RL.MTAKE` of the seed's 4 buckets", "mtake4", None),
        ("`Rules.check()`, seed document (3 layers, 4 buckets)", "seed", "limiter"),
    ):
        ratio = "" if base is None else f"{paired_ratio(samples[name], samples[base]):.2f}x"
        print(f"| {label} | {wall[name]:.1f} | {cpu[name]:.2f} | {ratio} |")


if __name__ == "__main__":
    main()
