"""``python -m redis_rl``: the operator's command line. ``rules check|apply|show|diff``
for the rules document; ``pin``, ``unpin``, ``pinned``, ``top`` for pins and the keys
denied most (see ``redis_rl.cli_ops``).

    python -m redis_rl pin partner:acme 500/s --for 10m --redis-url redis://localhost:6379
    python -m redis_rl rules check rules.yaml
    python -m redis_rl rules apply rules.yaml --redis-url redis://localhost:6379
    python -m redis_rl rules show --redis-url redis://localhost:6379
    python -m redis_rl rules diff rules.yaml --redis-url redis://localhost:6379

Exit status: 0 done, 1 the document (or the diff) has problems, 2 usage or Redis errors.
"""

from __future__ import annotations

import argparse
import datetime
import difflib
import sys
from typing import List, Optional

from .rules_doc import RulesError, parse_document


def _client(url: str) -> object:
    import redis

    return redis.Redis.from_url(url, socket_timeout=5)


def _read(path: str) -> str:
    if path == "-":
        return sys.stdin.read()
    with open(path, encoding="utf-8") as f:
        return f.read()


def _lines(text: str) -> List[str]:
    return [line if line.endswith("\n") else line + "\n" for line in text.splitlines(True)]


def _report(path: str, e: RulesError) -> None:
    for problem in e.problems:  # path:line: field: what (as compilers write it)
        where = f"{path}:{problem.line}" if problem.line else path
        print(f"{where}: {problem.field}: {problem.message}", file=sys.stderr)


def main(argv: Optional[List[str]] = None) -> int:
    args_in = sys.argv[1:] if argv is None else argv
    if args_in and args_in[0] in ("pin", "unpin", "pinned", "top"):
        from . import cli_ops

        return cli_ops.main(args_in)
    ap = argparse.ArgumentParser(prog="python -m redis_rl", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="area", required=True)
    rules = sub.add_parser("rules", help="the rules document (docs/rules.md)")
    cmd = rules.add_subparsers(dest="cmd", required=True)
    redis_opts = argparse.ArgumentParser(add_help=False)
    redis_opts.add_argument("--redis-url", default="redis://localhost:6379")
    redis_opts.add_argument("--key", default="rl:rules", help="the hash holding the document")
    c = cmd.add_parser("check", help="validate a document; name the line and field of each problem")
    c.add_argument("file")
    a = cmd.add_parser("apply", parents=[redis_opts], help="validate, then store as a new version")
    a.add_argument("file")
    cmd.add_parser("show", parents=[redis_opts], help="print the stored document and its version")
    d = cmd.add_parser("diff", parents=[redis_opts], help="the stored document against a file")
    d.add_argument("file")
    args = ap.parse_args(argv)

    from .rules import apply_document, stored_document

    try:
        if args.cmd == "check":
            text = _read(args.file)
            try:
                doc = parse_document(text, args.file)
            except RulesError as e:
                _report(args.file, e)
                return 1
            print(f"{args.file}: ok, {len(doc.layers)} layers")
            return 0
        if args.cmd == "apply":
            text = _read(args.file)
            try:
                parse_document(text, args.file)
            except RulesError as e:
                _report(args.file, e)
                print("nothing applied", file=sys.stderr)
                return 1
            applied = apply_document(_client(args.redis_url), text, args.key)  # type: ignore[arg-type]
            print(f"applied {args.file} as version {applied} of {args.key}")
            return 0
        version, stored, at = stored_document(_client(args.redis_url), args.key)  # type: ignore[arg-type]
        if args.cmd == "show":
            if version is None or stored is None:
                print(f"{args.key}: no document stored", file=sys.stderr)
                return 1
            when = datetime.datetime.fromtimestamp(at, datetime.timezone.utc) if at else None
            print(f"# {args.key} version {version}, applied {when.isoformat() if when else '?'}")
            sys.stdout.write(stored if stored.endswith("\n") else stored + "\n")
            return 0
        text = _read(args.file)
        diff = list(
            difflib.unified_diff(
                _lines(stored or ""),
                _lines(text),
                f"{args.key} (version {version})",
                args.file,
            )
        )
        sys.stdout.writelines(diff)
        return 1 if diff else 0
    except Exception as e:  # Redis unreachable, a wrong type under the key
        import redis

        if isinstance(e, (redis.exceptions.RedisError, OSError)):
            print(f"redis error: {e}", file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":
    sys.exit(main())
