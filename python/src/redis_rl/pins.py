"""Pins: an operator's limit on one key (``RL.PIN``), which the server applies to every
command on that key whatever limit the caller sends.

- ``pin(spec, duration)``: ``rate(r, c)`` decides under that limit, ``BLOCK`` denies every
  take, ``EXEMPT`` grants every take and debits nothing; for ``duration`` seconds, or until
  ``unpin``. Pinning again replaces the pin.
- ``unpin()``: whether a live pin was removed.
- ``pinned()``: the live pin (:class:`PinInfo`), or ``None``.

A decision a live pin made says so: ``Decision.pinned`` is its kind (``"rate"``,
``"block"``, ``"exempt"``; ``Limiter.take`` only: ``RL.TAKE ... WITHSTATE`` answers it).
The limiters expose these as methods (``Limiter.pin`` ...); the functions here take the
limiter. ``RL.PIN`` and ``RL.UNPIN`` are operators' commands (``@admin``): the ACL user must
be allowed them (``+rl.pin +rl.unpin +rl.pinned``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Optional, Protocol

from . import _protocol as p
from .errors import ProtocolError

#: The kinds of pin, as the server names them.
RATE = "rate"
BLOCK_KIND = "block"
EXEMPT_KIND = "exempt"
KINDS = (RATE, BLOCK_KIND, EXEMPT_KIND)


@dataclass(frozen=True)
class PinSpec:
    """What ``pin`` sets: a rate pin's ``rate`` (tokens/s) and ``cap``, or ``BLOCK`` /
    ``EXEMPT`` (no limit)."""

    kind: str
    rate: Optional[float] = None
    cap: Optional[float] = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"a pin is one of {', '.join(KINDS)}, not {self.kind!r}")
        if (self.kind == RATE) != (self.rate is not None and self.cap is not None):
            raise ValueError("a rate pin needs rate and cap; a block or exempt pin neither")
        for value in (self.rate, self.cap):
            if value is not None and not (isinstance(value, (int, float)) and value > 0):
                raise ValueError(f"rate and cap must be positive numbers, not {value!r}")


def rate(rate: float, cap: float) -> PinSpec:
    """A rate pin: every command on the key decides under ``rate`` tokens/s, bursts of
    ``cap`` (the bucket's tokens carry over, clamped to ``cap``)."""
    return PinSpec(RATE, float(rate), float(cap))


#: Every take, lease and reservation of the key denied (``retry_after`` is the pin's time
#: left, or a minute for a pin without an end).
BLOCK = PinSpec(BLOCK_KIND)
#: Every take, lease and reservation granted, nothing debited (an allow list). Never refund
#: such a grant.
EXEMPT = PinSpec(EXEMPT_KIND)


@dataclass(frozen=True)
class PinInfo:
    """A key's live pin, as ``RL.PINNED`` shows it."""

    kind: str
    #: A rate pin's limit (``None`` for block and exempt pins).
    rate: Optional[float]
    cap: Optional[float]
    #: Milliseconds left; ``None``: until unpinned.
    ms_left: Optional[int]

    @property
    def left(self) -> Optional[float]:
        """Seconds left (``None``: until unpinned)."""
        return None if self.ms_left is None else self.ms_left / 1000


def px_ms(duration: Optional[float]) -> Optional[int]:
    """``PX ms`` for a pin of ``duration`` seconds: whole milliseconds rounded up (a pin
    never ends before the time asked). ``None``: no end."""
    if duration is None:
        return None
    if isinstance(duration, bool) or not isinstance(duration, (int, float)):
        raise TypeError("duration must be a number of seconds")
    if not (math.isfinite(duration) and duration > 0):
        raise ValueError("a pin's duration must be a positive number of seconds")
    return max(1, math.ceil(duration * 1000))


def pin_args(
    proto: p.Protocol, key: str, spec: PinSpec, ms: Optional[int], shares: bool = False
) -> p.Args:
    """``RL.PIN key [SHARES] rate cap | BLOCK | EXEMPT [PX ms]`` (or ``FCALL rl_pin 1 key
    ...``). ``shares``: the key is (or will be, when nothing is there yet) a share key
    (``RL.SHARE``); an existing share key is pinned without it too."""
    rest: list[p.Arg] = (
        [p.num(spec.rate), p.num(spec.cap)]
        if spec.kind == RATE and spec.rate is not None and spec.cap is not None
        else [spec.kind.upper()]
    )
    if shares:
        rest.insert(0, "SHARES")
    if ms is not None:
        rest += ["PX", ms]
    return proto._cmd("pin", [key], rest)


def key_args(proto: p.Protocol, name: str, key: str) -> p.Args:
    """``RL.UNPIN key`` or ``RL.PINNED key``."""
    return proto._cmd(name, [key], [])


def check_ok(reply: Any) -> None:
    """Accepts ``RL.PIN``'s ``OK`` (``True`` from redis-py's callback); else
    :class:`ProtocolError`."""
    if reply is True or p.to_str(reply) == "OK":
        return
    raise ProtocolError(f"unexpected RL.PIN reply: {reply!r}")


def parse_pinned(reply: Any) -> Optional[PinInfo]:
    """``RL.PINNED``'s nil, or its map (RESP3) / flat list (RESP2) of ``kind``, ``rate``,
    ``cap`` (nil but for a rate pin) and ``ms_left`` (-1: until unpinned)."""
    if reply is None:
        return None
    if isinstance(reply, dict):
        fields = {p.to_str(k): v for k, v in reply.items()}
    elif isinstance(reply, (list, tuple)) and len(reply) % 2 == 0:
        fields = {p.to_str(reply[i]): reply[i + 1] for i in range(0, len(reply), 2)}
    else:
        raise ProtocolError(f"unexpected RL.PINNED reply: {reply!r}")
    try:
        kind = p.pin_kind(fields["kind"])
        ms_left = p.to_int(fields["ms_left"])
        limit = (p.to_float(fields["rate"]), p.to_float(fields["cap"])) if kind == RATE else None
    except (KeyError, ValueError) as e:
        raise ProtocolError(f"unexpected RL.PINNED reply ({e}): {reply!r}") from None
    return PinInfo(
        kind,
        limit[0] if limit else None,
        limit[1] if limit else None,
        None if ms_left < 0 else ms_left,
    )


# -- the limiters' methods (sync, then asyncio) --
# What they need of a limiter, said structurally: limiter.py imports this module, so this
# one names no limiter type (no import circle, not even a type-only one).


class _Pinnable(Protocol):
    @property
    def key(self) -> str: ...

    def _protocol(self) -> p.Protocol: ...

    @property
    def _call(self) -> Callable[..., Any]: ...


class _APinnable(Protocol):
    @property
    def key(self) -> str: ...

    def _protocol(self) -> Awaitable[p.Protocol]: ...

    @property
    def _call(self) -> Callable[..., Awaitable[Any]]: ...


def pin(lim: _Pinnable, spec: PinSpec, duration: Optional[float], key: Optional[str]) -> None:
    """``Limiter.pin``: ``RL.PIN`` on ``key`` (the limiter's own by default) for ``duration``
    seconds (``None``: until unpinned)."""
    args = pin_args(lim._protocol(), _key(lim, key), spec, px_ms(duration))
    check_ok(lim._call(args))


def unpin(lim: _Pinnable, key: Optional[str]) -> bool:
    """``Limiter.unpin``: ``RL.UNPIN``; whether a live pin was removed."""
    return p.to_int(lim._call(key_args(lim._protocol(), "unpin", _key(lim, key)))) > 0


def pinned(lim: _Pinnable, key: Optional[str]) -> Optional[PinInfo]:
    """``Limiter.pinned``: ``RL.PINNED``; the live pin, or ``None``."""
    return parse_pinned(lim._call(key_args(lim._protocol(), "pinned", _key(lim, key))))


async def apin(
    lim: _APinnable, spec: PinSpec, duration: Optional[float], key: Optional[str]
) -> None:
    """The asyncio twin of :func:`pin`."""
    args = pin_args(await lim._protocol(), _key(lim, key), spec, px_ms(duration))
    check_ok(await lim._call(args))


async def aunpin(lim: _APinnable, key: Optional[str]) -> bool:
    """The asyncio twin of :func:`unpin`."""
    args = key_args(await lim._protocol(), "unpin", _key(lim, key))
    return p.to_int(await lim._call(args)) > 0


async def apinned(lim: _APinnable, key: Optional[str]) -> Optional[PinInfo]:
    """The asyncio twin of :func:`pinned`."""
    args = key_args(await lim._protocol(), "pinned", _key(lim, key))
    return parse_pinned(await lim._call(args))


def _key(lim: Any, key: Optional[str]) -> str:
    return str(lim.key) if key is None else key


__all__ = [
    "BLOCK",
    "EXEMPT",
    "PinInfo",
    "PinSpec",
    "parse_pinned",
    "rate",
]
