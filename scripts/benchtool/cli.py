"""The command line of scripts/bench."""

import argparse
import json
import os
import signal
import sys
import tempfile
from pathlib import Path

from . import spec
from .render import Report, check_markdown

ROOT = Path(__file__).resolve().parent.parent.parent
DEFAULT_JSON = ROOT / "scripts" / "benchtool" / "results.json"
DEFAULT_MD = ROOT / "BENCHMARKS.md"

USAGE = """\
scripts/bench                   measure (about 10 minutes), write the results JSON, render
                                BENCHMARKS.md, check it
scripts/bench --quick           smoke run (BENCH_QUICK=1 too): tiny counts, JSON and Markdown
                                in a temp dir, check that every table is there; no timings
                                are asserted and nothing in the repository is written
scripts/bench measure [--json PATH]          measure only
scripts/bench [measure] --only SECTION,...   measure only these sections (throughput, memory,
                                profile, share, hotkey, skew, percaller) and merge them into
                                the existing results JSON (the others, and their dates, stay)
scripts/bench render [--json PATH] [--out PATH]  render (and check) from an existing JSON
scripts/bench check [--out PATH]             check a rendered file

Environment: BENCH_QUICK=1 (= --quick), BENCH_PROFILE=0 (skip callgrind),
BENCH_SERVERS=redis7,redis8,valkey9 (servers profiled and in the per-caller section),
BENCH_OUT=PATH (the Markdown), RL_SERVER (the Redis 7.0 server binary for every section),
CELL_MODULE=path/to/libredis_cell.so (redis-cell beside the module in the per-caller section;
built outside this repository, see docs/performance.md).
"""


def log(msg):
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


#: Sections of BENCHMARKS.md that other tools write between their markers (js/bench-compare.js
#: writes the JavaScript comparison): a render keeps each as the file has it.
KEPT_BLOCKS = ("js",)


def keep_blocks(text, out):
    """``text`` with each kept block as ``out`` holds it now (appended if the template lacks
    its markers; left out if ``out`` has none)."""
    old = out.read_text() if out.exists() else ""
    for name in KEPT_BLOCKS:
        begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
        if begin not in old or end not in old:
            continue
        block = old[old.index(begin) : old.index(end) + len(end)]
        if begin in text and end in text:
            text = text[: text.index(begin)] + block + text[text.index(end) + len(end) :]
        else:
            text = text.rstrip() + "\n\n" + block + "\n"
    return text


def render_to(results, out):
    """Renders, writes and checks; returns the list of problems (empty when all is well)."""
    report = Report(results)
    text = keep_blocks(report.markdown(), Path(out))
    Path(out).write_text(text)
    problems = [f"missing from the profile: {m}" for m in report.missing]
    problems += check_markdown(text, len(results["profiles"]))
    return problems


def fail(problems, what):
    for p in problems:
        log(f"CHECK FAILED: {p}")
    log(f"{what}: {len(problems)} problem(s)")
    return 1


def main(argv=None):
    ap = argparse.ArgumentParser(prog="scripts/bench", usage=USAGE)
    ap.add_argument("action", nargs="?", default="all", choices=["all", "measure", "render", "check"])
    ap.add_argument("--quick", action="store_true", default=os.environ.get("BENCH_QUICK") == "1")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--only", default=None, help="comma-separated sections")
    args = ap.parse_args(argv)
    only = None
    if args.only is not None:
        only = [s for s in args.only.split(",") if s]
        unknown = [s for s in only if s not in spec.SECTIONS]
        if unknown or not only:
            ap.error(f"--only: unknown section(s) {', '.join(unknown) or '(none given)'} "
                     f"(known: {', '.join(spec.SECTIONS)})")
        if args.action not in ("all", "measure"):
            ap.error("--only goes with measuring (scripts/bench [measure] --only ...)")
    profile = os.environ.get("BENCH_PROFILE", "1") != "0"
    servers = [s for s in os.environ.get("BENCH_SERVERS", ",".join(spec.SERVERS)).split(",") if s]
    for s in servers:
        if s not in spec.SERVERS:
            ap.error(f"BENCH_SERVERS: unknown server {s!r} (known: {', '.join(spec.SERVERS)})")
    env_out = os.environ.get("BENCH_OUT")
    # Stop the servers this run started if it is interrupted (the finally blocks run).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))

    tmpdir = None
    if args.quick and args.action in ("all", "measure"):
        tmpdir = Path(tempfile.mkdtemp(prefix="rl-bench-quick-"))
    json_path = args.json or (tmpdir / "results.json" if tmpdir else DEFAULT_JSON)
    md_path = args.out or (Path(env_out) if env_out else None) or (
        tmpdir / "BENCHMARKS.md" if tmpdir else DEFAULT_MD)

    if args.action == "check":
        text = md_path.read_text()
        n = sum(1 for ln in text.splitlines() if ln.startswith("| Workload | instr/request |"))
        problems = check_markdown(text, n)
        return fail(problems, str(md_path)) if problems else 0

    if args.action in ("all", "measure"):
        from .measure import measure, merge
        base = None
        if only is not None:
            if not json_path.exists():
                ap.error(f"--only merges into {json_path}, which does not exist: measure every "
                         f"section first (or give --json)")
            base = json.loads(json_path.read_text())
        counts = spec.Counts(args.quick)
        results = measure(counts, profile=profile, servers=servers, only=only)
        if base is not None:
            results = merge(base, results)
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(results, indent=1) + "\n")
        took = sum(s["minutes"] or 0 for n, s in results["sections"].items()
                   if only is None or n in only)  # fmt: skip
        log(f"wrote {json_path} ({took:.1f} min)")
        if args.action == "measure":
            return 0
    else:
        results = json.loads(json_path.read_text())

    problems = render_to(results, md_path)
    log(f"wrote {md_path}")
    if problems:
        return fail(problems, str(md_path))
    if args.quick:
        log(f"quick run: every table rendered ({md_path}); the numbers mean nothing")
    return 0
