"""Limit strings as ``limits`` and ``slowapi`` write them. Every limit given as text goes
through one parser, the Rust client's ``rl_client::limits``, compiled into ``redis_rl._core``:
both clients read a limit string the same way, message for message (the golden cases in
``protocol/limit_strings.json``).

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

from typing import List, NamedTuple, Tuple

from . import _core

#: Units for the normalized text, longest first.
_NAMES: Tuple[Tuple[float, str], ...] = (
    (31_104_000.0, "year"),
    (2_592_000.0, "month"),
    (86_400.0, "day"),
    (3600.0, "hour"),
    (60.0, "minute"),
    (1.0, "second"),
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
    return [Limit(*parts) for parts in _core.parse_limits(text)]


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
