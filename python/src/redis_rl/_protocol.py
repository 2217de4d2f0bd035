"""All wire encoding: the commands sent for each backend and the parsing of their replies.

Two backends speak the same protocol:

- ``module``: the redis-rl module's native commands (``RL.TAKE key rate cap ...``).
- ``functions``: the Redis Functions library ``rl`` (``FCALL rl_take 1 key rate cap ...``).

Replies are normalised here: doubles arrive as bytes/str under RESP2 and as float under
RESP3; ``RL.PEEK`` is a map under RESP3 and a flat list under RESP2; strings are bytes or
str depending on ``decode_responses``.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from . import _core
from .errors import BackendNotFound, ProtocolError


class Backend(str, enum.Enum):
    """Which server side a limiter speaks to (a ``str``: ``"module"`` still works)."""

    #: The module's commands (``RL.TAKE ...``). Needs the module loaded; an ACL user needs
    #: the ``RL.*`` commands it sends (nothing else).
    MODULE = "module"
    #: The Functions library ``rl`` (``FCALL rl_take ...``). An ACL user needs ``FCALL``
    #: and the commands the library runs (read and write on the keys).
    FUNCTIONS = "functions"
    #: The module if the server has it, else the library: one probe, ``RL.TAKE`` without
    #: arguments (answered "wrong number of arguments" or "unknown command" before any ACL
    #: check, so it needs no permission), then ``FUNCTION LIST LIBRARYNAME rl`` (a user
    #: refused it is assumed to have the library).
    AUTO = "auto"

    def __str__(self) -> str:
        return self.value


MODULE = Backend.MODULE
FUNCTIONS = Backend.FUNCTIONS
AUTO = Backend.AUTO

Arg = Union[str, int, float, bytes]
Args = Tuple[Arg, ...]

#: Probes ``auto`` sends, in order. The module's probe is ``RL.TAKE`` without arguments:
#: the server answers "wrong number of arguments" if it knows the command and "unknown
#: command" if not, both before any ACL check, so it needs no permission (``COMMAND
#: INFO`` would: a user allowed only the ``RL.*`` commands is refused it) and runs nothing.
PROBE_MODULE: Args = ("RL.TAKE",)
PROBE_FUNCTIONS: Args = ("FUNCTION", "LIST", "LIBRARYNAME", "rl")

NO_BACKEND = (
    "redis-rl: neither backend is available on this server: load the module "
    "(loadmodule /path/to/libredis_rl.so, backend='module') or the Functions library "
    "(FUNCTION LOAD REPLACE with functions/rl.lua, backend='functions')"
)


def num(value: Any) -> str:
    """A rate, cap or token count as sent: integers without a decimal point, floats exact."""
    if isinstance(value, bool):
        raise TypeError("expected a number")
    if isinstance(value, int):
        return str(value)
    f = float(value)
    if not math.isfinite(f):
        raise ValueError("rate and cap must be finite numbers")
    if f.is_integer() and abs(f) < 1e15:
        return str(int(f))
    return repr(f)


MAX_VERSION = 2**53 - 1


def check_version(version: Optional[int]) -> None:
    """``VERSION v``: an integer from 0 to 2^53 - 1 (or ``None``: not sent)."""
    if version is None:
        return
    if isinstance(version, bool) or not isinstance(version, int):
        raise TypeError("version must be an integer")
    if not (0 <= version <= MAX_VERSION):
        raise ValueError(f"version must be between 0 and {MAX_VERSION}")


def _version(rest: List[Arg], version: Optional[int]) -> None:
    if version is not None:
        rest += ["VERSION", version]


def to_int(value: Any) -> int:
    """A reply field as an ``int`` (RESP2 sends numbers as integers or strings); else
    :class:`ProtocolError`."""
    if isinstance(value, (int, float)):
        return int(value)
    if isinstance(value, (bytes, str)):
        return int(value)
    raise ProtocolError(f"expected an integer, got {value!r}")


def to_float(value: Any) -> float:
    """A reply field as a ``float`` (a double in RESP3, a string in RESP2); else
    :class:`ProtocolError`."""
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, (bytes, str)):
        return float(value)
    raise ProtocolError(f"expected a number, got {value!r}")


def to_str(value: Any) -> str:
    """A reply field as text (bytes decoded as UTF-8, undecodable bytes replaced)."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


@dataclass(frozen=True)
class TakeReply:
    granted: int
    remaining: float
    retry_after_ms: int
    reset_after_ms: int
    #: The kind of the live pin that decided (``"rate"``, ``"block"``, ``"exempt"``), the
    #: reply's fifth element; ``None``: no pin decided.
    pinned: Optional[str] = None


@dataclass(frozen=True)
class LeaseReply:
    granted: int
    lease_id: int
    ttl_ms: int
    retry_after_ms: int


@dataclass(frozen=True)
class ReserveReply:
    granted: int
    wait_ms: int
    remaining: float
    reset_after_ms: int


@dataclass(frozen=True)
class AcquireReply:
    granted: bool
    permit_id: int
    in_use: int
    retry_after_ms: int


@dataclass(frozen=True)
class MTakeReply:
    """``RL.MTAKE``: ``granted`` is n or 0; ``denied_by`` the key whose wait is longest."""

    granted: int
    denied_by: Optional[str]
    retry_after_ms: int
    remaining: Optional[List[float]]


@dataclass(frozen=True)
class PeekReply:
    """``RL.PEEK``: a bucket's state now (``None`` is returned for a missing key)."""

    tokens: float
    rate: float
    cap: float
    reset_after_ms: int
    leases: int
    leased_tokens: int
    #: The version of the stored limit (``VERSION``); ``None`` from a server without it.
    version: Optional[int] = None


#: A pin's kind as replies name it (bytes or str), to the one ``str`` of each.
PIN_KINDS: Dict[Union[str, bytes], str] = {k: k for k in ("rate", "block", "exempt")}
PIN_KINDS.update({k.encode(): k for k in ("rate", "block", "exempt")})


def pin_kind(value: Any) -> str:
    """A pin's kind element (``rate``, ``block``, ``exempt``)."""
    try:
        return PIN_KINDS[value]
    except (KeyError, TypeError):
        raise ProtocolError(f"expected a pin kind (rate, block, exempt), got {value!r}") from None


def parse_take(reply: Any) -> TakeReply:
    """``[granted, remaining, retry_after_ms, reset_after_ms]``, and the kind of the pin
    that decided as a fifth element when one did: the client core's parser."""
    return TakeReply(*_core.parse_take(reply))


def parse_lease(reply: Any) -> LeaseReply:
    """An ``RL.LEASE`` reply (the Functions' ``rl_lease`` alike) as a :class:`LeaseReply`; else
    :class:`ProtocolError`."""
    return LeaseReply(*_core.parse_lease(reply))


def parse_reserve(reply: Any) -> ReserveReply:
    """An ``RL.RESERVE`` reply as a :class:`ReserveReply`; else :class:`ProtocolError`."""
    return ReserveReply(*_core.parse_reserve(reply))


def parse_acquire(reply: Any) -> AcquireReply:
    """An ``RL.ACQUIRE`` reply as an :class:`AcquireReply`; else :class:`ProtocolError`."""
    return AcquireReply(*_core.parse_acquire(reply))


def parse_mtake(reply: Any) -> MTakeReply:
    """An ``RL.MTAKE`` reply as an :class:`MTakeReply` (``remaining`` only with ``WITHSTATE``); else
    :class:`ProtocolError`. The client core's parser (the Rust client's and the rules')."""
    try:
        granted, denied_by, retry_after_ms, remaining = _core.parse_mtake(reply)
    except ValueError as e:
        raise ProtocolError(str(e)) from None
    by = None if denied_by is None else denied_by.decode("utf-8", "replace")
    return MTakeReply(granted, by, retry_after_ms, remaining)


def parse_peek(reply: Any) -> Optional[PeekReply]:
    """An ``RL.PEEK`` reply (a map in RESP3, a flat list in RESP2) as a :class:`PeekReply`; ``None``
    for a missing key (a full bucket)."""
    fields = _core.parse_peek(reply)
    return None if fields is None else PeekReply(*fields)


def _unknown_command(reply: BaseException) -> bool:
    return "unknown command" in str(reply).lower()


def module_present(reply: Any) -> bool:
    """Whether the module's probe (:data:`PROBE_MODULE`, an error reply passed as the
    exception) found the command; ``COMMAND INFO RL.TAKE`` replies are read too."""
    if isinstance(reply, BaseException):
        return not _unknown_command(reply)
    if isinstance(reply, dict):
        return any(v for v in reply.values())
    if isinstance(reply, (list, tuple)):
        return any(x is not None for x in reply)
    return False


def functions_present(reply: Any) -> bool:
    """Whether a ``FUNCTION LIST LIBRARYNAME rl`` reply lists the library ``rl``. A user
    refused ``FUNCTION LIST`` (``NOPERM``) may still call the library: it is assumed, and a
    missing one is found by the first call (``Function not found``: ``BackendNotFound``)."""
    if isinstance(reply, BaseException):
        return not _unknown_command(reply)
    if not isinstance(reply, (list, tuple)):
        return False
    for lib in reply:
        if isinstance(lib, dict):
            fields = {to_str(k): v for k, v in lib.items()}
        elif isinstance(lib, (list, tuple)):
            fields = {to_str(lib[i]): lib[i + 1] for i in range(0, len(lib) - 1, 2)}
        else:
            continue
        if to_str(fields.get("library_name", "")) == "rl":
            return True
    return False


def decide_backend(has_module: bool, has_functions: bool) -> str:
    """The backend to use given what the server has: the module first, else the Functions library,
    else :class:`BackendNotFound` naming the fix."""
    if has_module:
        return MODULE
    if has_functions:
        return FUNCTIONS
    raise BackendNotFound(NO_BACKEND)


class Protocol:
    """Encodes commands for one backend (``module`` or ``functions``)."""

    def __init__(self, backend: str) -> None:
        if backend not in (MODULE, FUNCTIONS):
            raise ValueError(f"backend must be 'module' or 'functions', not {backend!r}")
        self.backend = Backend(backend)

    def _cmd(self, name: str, keys: Sequence[str], rest: Sequence[Arg]) -> Args:
        if self.backend == MODULE:
            return ("RL." + name.upper(), *keys, *rest)
        return ("FCALL", "rl_" + name.lower(), len(keys), *keys, *rest)

    def take(
        self,
        key: str,
        rate: float,
        cap: float,
        n: int = 1,
        withstate: bool = True,
        init: Optional[float] = None,
        version: Optional[int] = None,
    ) -> Args:
        """The arguments of a take: ``RL.TAKE key rate cap n [WITHSTATE] [INIT t] [VERSION v]`` (or
        its ``FCALL``), as the client core builds them."""
        args = _core.take_command(self.backend.value, key, rate, cap, n, withstate, init, version)
        return tuple(a.decode() for a in args)

    def lease(
        self,
        key: str,
        rate: float,
        cap: float,
        n: int,
        ttl_ms: int,
        min_tokens: int = 1,
        settle: Optional[Tuple[int, int]] = None,
        init: Optional[float] = None,
        version: Optional[int] = None,
    ) -> Args:
        """The arguments of ``RL.LEASE key rate cap n ttl_ms MIN min`` with ``RETURN id
        unused``, ``INIT`` and ``VERSION`` where given, as the client core builds them."""
        args = _core.lease_command(
            self.backend.value, key, rate, cap, n, ttl_ms, min_tokens, settle, init, version
        )
        return tuple(a.decode() for a in args)

    def return_(self, key: str, lease_id: int, unused: int) -> Args:
        """The arguments of ``RL.RETURN key lease_id unused``: a lease's leftovers back to the
        bucket."""
        args = _core.return_command(self.backend.value, key, lease_id, unused)
        return tuple(a.decode() for a in args)

    def peek(self, key: str) -> Args:
        """The arguments of ``RL.PEEK key``."""
        return self._cmd("peek", [key], [])

    def mtake(
        self,
        buckets: Sequence[Tuple[str, float, float]],
        n: int = 1,
        withstate: bool = False,
        init: Optional[float] = None,
        version: Optional[int] = None,
    ) -> Args:
        """The arguments of ``RL.MTAKE``: ``n`` from every ``(key, rate, cap)`` bucket or from
        none."""
        opts: List[Arg] = []
        if withstate:
            opts.append("WITHSTATE")
        if init is not None:
            opts += ["INIT", num(init)]
        _version(opts, version)
        if self.backend == MODULE:
            flat: List[Arg] = [n]
            for key, rate, cap in buckets:
                flat += [key, num(rate), num(cap)]
            return ("RL.MTAKE", *flat, *opts)
        limits: List[Arg] = [n]
        for _, rate, cap in buckets:
            limits += [num(rate), num(cap)]
        return self._cmd("mtake", [b[0] for b in buckets], [*limits, *opts])

    def reserve(
        self,
        key: str,
        rate: float,
        cap: float,
        n: int,
        max_wait_ms: int,
        init: Optional[float] = None,
        version: Optional[int] = None,
    ) -> Args:
        """The arguments of ``RL.RESERVE key rate cap n max_wait_ms`` (``INIT``, ``VERSION`` where
        given), as the client core builds them."""
        args = _core.reserve_command(
            self.backend.value, key, rate, cap, n, max_wait_ms, init, version
        )
        return tuple(a.decode() for a in args)

    def refund(self, key: str, n: int) -> Args:
        """The arguments of ``RL.REFUND key n``."""
        return self._cmd("refund", [key], [n])

    def acquire(self, key: str, limit: int, ttl_ms: int) -> Args:
        """The arguments of ``RL.ACQUIRE key limit ttl_ms``: one of ``limit`` concurrency slots."""
        return self._cmd("acquire", [key], [limit, ttl_ms])

    def release(self, key: str, permit_id: int) -> Args:
        """The arguments of ``RL.RELEASE key permit_id``."""
        return self._cmd("release", [key], [permit_id])

    def renew(self, key: str, permit_id: int, ttl_ms: int) -> Args:
        """The arguments of ``RL.RENEW key permit_id ttl_ms``."""
        return self._cmd("renew", [key], [permit_id, ttl_ms])
