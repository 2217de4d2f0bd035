"""Limit strings as ``limits`` and ``slowapi`` write them, the one parser every limit given
as text goes through (the Rust client's ``rl_client::limits`` is its twin; both run the
golden cases in ``protocol/limit_strings.json``).

Grammar (case-insensitive, spaces free)::

    limits := limit ((";" | "," | "|") (limit | burst))*
    limit  := count ("/" | "per") [every] unit
    burst  := "burst" number          (the cap of the limit before it)
    unit   := second | minute | hour | day | month | year   (plural with "s")
            | s | sec | secs | m | min | mins | h | hr | hrs | d

``month`` is 30 days and ``year`` 12 such months (360 days), as in ``limits``. ``count``,
``every`` and a burst may be decimals. Anything else is refused with a message (``"5/ms"``
is not five per minute, ``"5/ss"`` not five per second).

Each limit is a token bucket of ``count / (every * unit)`` tokens per second and a cap of
``count`` (or its burst). A bucket lets through up to ``cap + rate * T`` in any window of
``T`` seconds: with ``"N/minute"``, up to ``2N`` in one minute (a full bucket, then a
minute's refill), ``N`` per minute sustained. For "at most N in any minute", write half of
it twice: ``"N/2 per minute, burst N/2"`` (``N/2`` + ``N/2``).
"""

from __future__ import annotations

import re
from typing import List, NamedTuple, Tuple

#: Seconds per unit word.
UNITS = {
    "s": 1.0,
    "sec": 1.0,
    "secs": 1.0,
    "second": 1.0,
    "seconds": 1.0,
    "m": 60.0,
    "min": 60.0,
    "mins": 60.0,
    "minute": 60.0,
    "minutes": 60.0,
    "h": 3600.0,
    "hr": 3600.0,
    "hrs": 3600.0,
    "hour": 3600.0,
    "hours": 3600.0,
    "d": 86_400.0,
    "day": 86_400.0,
    "days": 86_400.0,
    "month": 2_592_000.0,
    "months": 2_592_000.0,
    "year": 31_104_000.0,
    "years": 31_104_000.0,
}
#: Units for the normalized text, longest first.
_NAMES: Tuple[Tuple[float, str], ...] = (
    (31_104_000.0, "year"),
    (2_592_000.0, "month"),
    (86_400.0, "day"),
    (3600.0, "hour"),
    (60.0, "minute"),
    (1.0, "second"),
)
#: Limits per string (each is a bucket; ``RL.MTAKE`` takes 64 at most).
MAX_LIMITS = 8
#: 100 years: the longest an empty bucket may take to fill, as the module accepts.
MAX_FILL_SECS = 100.0 * 365.25 * 86_400.0

_NUM = r"[0-9]+(?:\.[0-9]+)?"
_LIMIT = re.compile(
    rf"(?P<count>{_NUM})\s*(?:/|per)\s*(?:(?P<every>{_NUM})\s*)?(?P<unit>[a-z]+)",
    re.IGNORECASE | re.ASCII,
)
_BURST = re.compile(rf"burst\s*(?P<burst>{_NUM})", re.IGNORECASE | re.ASCII)
#: ASCII whitespace only, as the Rust twin trims.
_SPACE = " \t\n\r\x0b\x0c"
_SEPARATORS = re.compile(r"[;,|]")
_HELP = (
    "write it as '1000/second', '5/minute', '100 per hour', '10/5 seconds', several joined "
    "by ';' ('10/second;500/minute'), each optionally followed by ', burst 20'"
)


class Limit(NamedTuple):
    """One limit of a limit string: ``amount`` per ``period`` seconds, bursts of ``cap``."""

    amount: float
    period: float
    cap: float

    @property
    def rate(self) -> float:
        """Tokens per second."""
        return self.amount / self.period

    @property
    def suffix(self) -> str:
        """What a key gets appended to tell this limit's bucket from the others of the
        same string (their periods differ): ``"60s"``."""
        return f"{_num(self.period)}s"

    def __str__(self) -> str:
        every, unit = self.period, "second"
        for seconds, name in _NAMES:
            if self.period % seconds == 0:
                every, unit = self.period / seconds, name
                break
        text = (
            f"{_num(self.amount)}/{unit}"
            if every == 1
            else f"{_num(self.amount)}/{_num(every)} {unit}s"
        )
        return text if self.cap == self.amount else f"{text}, burst {_num(self.cap)}"


def _num(x: float) -> str:
    x = float(x)
    return str(int(x)) if x.is_integer() and abs(x) < 1e15 else repr(x)


def parse_limits(text: str) -> List[Limit]:
    """Every limit of a limit string (``"10/second;500/minute"``), or ``ValueError`` saying
    what is wrong. All of them are meant to hold together."""
    if not isinstance(text, str):
        raise TypeError(f"a limit string is a str, not {type(text).__name__}")
    limits: List[Limit] = []
    periods: List[float] = []
    for raw in _SEPARATORS.split(text):
        part = raw.strip(_SPACE)
        if not part:
            raise ValueError(f"not a limit: {text!r} (an empty part; {_HELP})")
        burst = _BURST.fullmatch(part)
        if burst is not None:
            if not limits:
                raise ValueError(f"not a limit: {text!r} (a burst follows the limit it is for)")
            last = limits[-1]
            if last.cap != last.amount:
                raise ValueError(f"not a limit: {text!r} (two bursts for one limit)")
            cap = float(burst.group("burst"))
            limits[-1] = last._replace(cap=_check_cap(text, cap, last.rate))
            continue
        m = _LIMIT.fullmatch(part)
        if m is None:
            if re.fullmatch(_NUM, part) and limits:
                raise ValueError(
                    f"not a limit: {text!r} ({part!r} alone is not a limit; a burst is "
                    f"written ', burst {part}')"
                )
            raise ValueError(f"not a limit: {text!r} ({_HELP})")
        unit = m.group("unit").lower()
        seconds = UNITS.get(unit)
        if seconds is None:
            hint = " (milliseconds are not a unit here)" if unit in ("ms", "msec", "millis") else ""
            raise ValueError(
                f"not a limit: {text!r}: {m.group('unit')!r} is not a unit{hint}; use second, "
                "minute, hour, day, month or year (or s, sec, m, min, h, hr, d)"
            )
        count = float(m.group("count"))
        every = float(m.group("every") or 1)
        if count <= 0 or every <= 0:
            raise ValueError(f"not a limit: {text!r} (the count and the period must be positive)")
        period = every * seconds
        if period in periods:
            raise ValueError(
                f"not a limit: {text!r} (two limits over the same period, {_num(period)} s: "
                "keep the tighter one)"
            )
        periods.append(period)
        limits.append(Limit(count, period, _check_cap(text, count, count / period)))
        if len(limits) > MAX_LIMITS:
            raise ValueError(f"not a limit: {text!r} (at most {MAX_LIMITS} limits in one string)")
    return limits


def _check_cap(text: str, cap: float, rate: float) -> float:
    if not (1.0 <= cap <= 1e15):
        raise ValueError(f"not a limit: {text!r} (a count or burst must be between 1 and 1e15)")
    if not (1e-9 <= rate <= 1e15):
        raise ValueError(f"not a limit: {text!r} (the rate must be 1e-9 to 1e15 per second)")
    if cap / rate > MAX_FILL_SECS:
        raise ValueError(f"not a limit: {text!r} (a bucket must refill within 100 years)")
    return cap


def parse_limit(text: str) -> Tuple[float, float]:
    """``(rate, cap)`` of a string holding one limit (``"5/minute"``, ``"100 per hour"``,
    ``"10/5 seconds"``, ``"5/minute, burst 10"``); ``rate`` is tokens per second. A string
    of several limits is refused here: give it where several are taken (``MultiLimiter``,
    rules), which enforce them together."""
    limits = parse_limits(text)
    if len(limits) > 1:
        raise ValueError(
            f"{text!r} holds {len(limits)} limits, and this takes one (rate, cap): give it "
            "to redis_rl.MultiLimiter or a rules document, which enforce them together"
        )
    return limits[0].rate, limits[0].cap


def rate_cap(rate: object, cap: object) -> Tuple[float, float]:
    """A constructor's ``(rate, cap)`` given either as numbers or as one limit string in
    ``rate`` (``cap`` then ``None``)."""
    if isinstance(rate, str):
        if cap is not None:
            raise TypeError(f"give a limit string ({rate!r}) or rate and cap, not both")
        return parse_limit(rate)
    if cap is None:
        raise TypeError("give rate and cap (tokens per second, burst), or a limit string")
    return rate, cap  # type: ignore[return-value]


__all__ = ["Limit", "parse_limit", "parse_limits", "rate_cap"]
