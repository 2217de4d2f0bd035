"""The operator's command line for pins and throttled keys (``python -m redis_rl ...``):

    pin KEY RATE [--cap N] [--for 10m]   every call on KEY decides under RATE (500/s)
    pin KEY --block [--for 10m]          every take of KEY denied
    pin KEY --exempt [--for 10m]         every take of KEY granted, nothing debited
    unpin KEY                            removes KEY's pin
    pinned KEY                           shows KEY's live pin
    top [--count N]                      the keys denied most lately (RL.TOP)

Every command takes ``--redis-url URL`` (default ``$REDIS_URL``, else
``redis://localhost:6379/0``). Exit codes: 0 done; 1 nothing there (``unpin`` or
``pinned`` of a key without a live pin); 2 bad arguments; 3 Redis unreachable; 4 Redis
refused (no module, an ACL rule, a wrong key type...). Errors are one line on stderr,
saying what to do.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
import urllib.parse
from typing import Any, Callable, List, Optional, Sequence, TextIO, Tuple, cast

import redis

from . import _protocol as p
from . import limits, pins

DEFAULT_URL = "redis://localhost:6379/0"

OK, NOTHING, USAGE, UNREACHABLE, REFUSED = 0, 1, 2, 3, 4

#: What the ACL user needs, per command this tool sends.
ACL_LINES = {
    "RL.PIN": "+rl.pin +rl.unpin +rl.pinned",
    "RL.UNPIN": "+rl.pin +rl.unpin +rl.pinned",
    "RL.PINNED": "+rl.pin +rl.unpin +rl.pinned",
    "RL.TOP": "+rl.top",
}

_UNITS = {
    "ms": 0.001,
    "s": 1.0,
    "sec": 1.0,
    "second": 1.0,
    "m": 60.0,
    "min": 60.0,
    "minute": 60.0,
    "h": 3600.0,
    "hour": 3600.0,
    "d": 86400.0,
    "day": 86400.0,
}


def _unit(name: str) -> Optional[float]:
    name = name.lower()
    if name not in _UNITS and name.endswith("s") and name[:-1] in _UNITS:
        name = name[:-1]  # seconds, minutes, hours, days
    return _UNITS.get(name)


# The lead replaces this with redis_rl.limits (the one limit-string parser) at merge.
def _parse_rate(text: str) -> Tuple[float, float]:
    """A limit string (``500/s``, ``100/minute``, ``30/10s``, ``500/s, burst 50``), read
    by the package's one parser, as ``(tokens per second, its count or burst)``."""
    return limits.parse_limit(text)


def _parse_duration(text: str) -> float:
    """``10m``, ``30s``, ``2h``, ``1d``, ``500ms`` or plain seconds, as seconds."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", text)
    scale = (_unit(m.group(2)) if m.group(2) else 1.0) if m else None
    if m is None or scale is None or not float(m.group(1)) > 0:
        raise ValueError(f"--for must look like 30s, 10m, 2h or 1d, not {text!r}")
    return float(m.group(1)) * scale


def _human(ms: int) -> str:
    """A duration for people: ``9m59s``, ``2h0m``, ``850ms``."""
    if ms < 1000:
        return f"{ms}ms"
    s = -(-ms // 1000)
    for unit, size, sub, subsize in (("d", 86400, "h", 3600), ("h", 3600, "m", 60)):
        if s >= size:
            return f"{s // size}{unit}{(s % size) // subsize}{sub}"
    return f"{s // 60}m{s % 60}s" if s >= 60 else f"{s}s"


def _number(x: float) -> str:
    return p.num(x) if x >= 1 or x == 0 else f"{x:.6g}"


def _redacted(url: str) -> str:
    """``url`` without its password, for messages."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return "<unparseable>"
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


class _Fail(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--redis-url",
        default=os.environ.get("REDIS_URL") or DEFAULT_URL,
        help="the Redis to talk to (default: $REDIS_URL, else %(default)s)",
    )
    top = argparse.ArgumentParser(
        prog="python -m redis_rl",
        description="Pin keys (an operator's limit every client obeys) and see who is throttled.",
    )
    sub = top.add_subparsers(dest="command", required=True, metavar="COMMAND")

    pin = sub.add_parser(
        "pin",
        parents=[common],
        help="pin a key's limit (RATE), or --block / --exempt it",
        description="RL.PIN: every call on KEY, from every client, obeys the pin.",
    )
    pin.add_argument("key", metavar="KEY")
    pin.add_argument("rate", metavar="RATE", nargs="?", help="a limit, as 500/s or 100/minute")
    pin.add_argument("--cap", type=float, help="the burst (default: RATE's count)")
    kind = pin.add_mutually_exclusive_group()
    kind.add_argument("--block", action="store_true", help="deny every take of KEY")
    kind.add_argument(
        "--exempt", action="store_true", help="grant every take of KEY, debiting nothing"
    )
    pin.add_argument(
        "--for", dest="duration", metavar="DURATION", help="end it after 30s, 10m, 2h, 1d..."
    )
    pin.add_argument(
        "--shares",
        action="store_true",
        help="KEY is an RL.SHARE key that may not exist yet (an existing one needs no flag)",
    )

    for name, what in (("unpin", "remove KEY's pin"), ("pinned", "show KEY's live pin")):
        cmd = sub.add_parser(name, parents=[common], help=what, description=what)
        cmd.add_argument("key", metavar="KEY")

    t = sub.add_parser("top", parents=[common], help="the keys denied most lately (RL.TOP)")
    t.add_argument("--count", type=int, default=10, help="how many keys (default %(default)s)")
    return top


def _connect(url: str) -> redis.Redis:
    try:
        return redis.Redis.from_url(url, socket_connect_timeout=5, socket_timeout=10)
    except ValueError as e:
        raise _Fail(USAGE, f"bad --redis-url {_redacted(url)!r}: {e}") from None


def _run(client: redis.Redis, url: str, *args: Any) -> Any:
    """One command, its failures turned into one-line errors saying what to do."""
    command = str(args[0])
    try:
        return cast(Any, client).execute_command(*args)
    except redis.exceptions.AuthenticationError as e:
        raise _Fail(
            REFUSED,
            f"Redis at {_redacted(url)} refused the credentials: {e} "
            "(check the URL's user:password)",
        ) from None
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as e:
        raise _Fail(UNREACHABLE, f"cannot reach Redis at {_redacted(url)}: {e}") from None
    except redis.exceptions.NoPermissionError as e:
        raise _Fail(
            REFUSED,
            f"the ACL user may not run {command}: {e}; add `{ACL_LINES[command]}` "
            "to it (ACL SETUSER <user> ...; see docs/deploy.md#acl)",
        ) from None
    except redis.exceptions.ResponseError as e:
        text = str(e)
        if "unknown command" in text.lower():
            raise _Fail(
                REFUSED,
                f"{command} is unknown at {_redacted(url)}: the redis-rl module is not loaded "
                "there (loadmodule /path/to/libredis_rl.so; pins and RL.TOP need the module)",
            ) from None
        raise _Fail(REFUSED, f"{command} refused: {text}") from None


def _pin(client: redis.Redis, url: str, a: argparse.Namespace, out: TextIO) -> int:
    if a.block or a.exempt:
        if a.rate is not None or a.cap is not None:
            raise _Fail(USAGE, "pin: give RATE (and --cap), or --block, or --exempt: not both")
        spec = pins.BLOCK if a.block else pins.EXEMPT
        what = spec.kind
    else:
        if a.rate is None:
            raise _Fail(USAGE, "pin: give RATE (like 500/s), or --block, or --exempt")
        try:
            rate, count = _parse_rate(a.rate)
        except ValueError as e:
            raise _Fail(USAGE, f"pin: {e}") from None
        cap = count if a.cap is None else a.cap
        if not (math.isfinite(cap) and cap > 0):
            raise _Fail(USAGE, f"pin: --cap must be a positive number, not {a.cap}")
        spec = pins.rate(rate, cap)
        what = f"rate {_number(rate)}/s, cap {_number(cap)}"
    try:
        ms = pins.px_ms(_parse_duration(a.duration)) if a.duration is not None else None
    except ValueError as e:
        raise _Fail(USAGE, f"pin: {e}") from None
    args = pins.pin_args(p.Protocol(p.MODULE), a.key, spec, ms, shares=a.shares)
    pins.check_ok(_run(client, url, *args))
    until = f"for {_human(ms)}" if ms is not None else "until unpinned"
    print(f"{a.key}: pinned ({what}) {until}", file=out)
    return OK


def _unpin(client: redis.Redis, url: str, a: argparse.Namespace, out: TextIO) -> int:
    if p.to_int(_run(client, url, "RL.UNPIN", a.key)) > 0:
        print(f"{a.key}: unpinned", file=out)
        return OK
    print(f"{a.key}: had no live pin", file=out)
    return NOTHING


def _pinned(client: redis.Redis, url: str, a: argparse.Namespace, out: TextIO) -> int:
    info = pins.parse_pinned(_run(client, url, "RL.PINNED", a.key))
    if info is None:
        print(f"{a.key}: not pinned", file=out)
        return NOTHING
    what = info.kind
    if info.rate is not None and info.cap is not None:
        what = f"rate {_number(info.rate)}/s, cap {_number(info.cap)}"
    left = "until unpinned" if info.ms_left is None else f"{_human(info.ms_left)} left"
    print(f"{a.key}: {what}, {left}", file=out)
    return OK


def _top(client: redis.Redis, url: str, a: argparse.Namespace, out: TextIO) -> int:
    if a.count < 1:
        raise _Fail(USAGE, f"top: --count must be a positive integer, not {a.count}")
    rows = _run(client, url, "RL.TOP", a.count) or []
    if not rows:
        print("no key denied lately", file=out)
        return OK
    table = [(p.to_str(r[0]), str(p.to_int(r[1])), _human(p.to_int(r[2])) + " ago") for r in rows]
    table = [("KEY", "DENIED", "LAST"), *table]
    widths = [max(len(row[i]) for row in table) for i in range(3)]
    for row in table:
        print(f"{row[0]:<{widths[0]}}  {row[1]:>{widths[1]}}  {row[2]}", file=out)
    return OK


_COMMANDS: dict[str, Callable[[redis.Redis, str, argparse.Namespace, TextIO], int]] = {
    "pin": _pin,
    "unpin": _unpin,
    "pinned": _pinned,
    "top": _top,
}


def main(
    argv: Optional[Sequence[str]] = None,
    out: Optional[TextIO] = None,
    err: Optional[TextIO] = None,
) -> int:
    """Runs one command (``argv`` without the program name); answers the exit code."""
    out = sys.stdout if out is None else out
    err = sys.stderr if err is None else err
    try:
        a = _parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    except SystemExit as e:  # argparse printed the usage, or --help
        return USAGE if e.code not in (0, None) else OK
    client: Optional[redis.Redis] = None
    try:
        client = _connect(a.redis_url)
        return _COMMANDS[a.command](client, a.redis_url, a, out)
    except _Fail as e:
        print(f"error: {e}", file=err)
        return e.code
    finally:
        if client is not None:
            client.close()


__all__: List[str] = ["main"]


if __name__ == "__main__":  # python -m redis_rl.cli_ops ...
    sys.exit(main())
