"""Exceptions of redis-rl."""

from __future__ import annotations

from typing import TypeVar

_E = TypeVar("_E", bound=BaseException)


class RedisRLError(Exception):
    """Base class of the errors this package raises itself."""


class ServerError(RedisRLError):
    """Redis answered with an error reply (``WRONGTYPE``, ``ERR too many live leases``, an
    unknown command, any ``-ERR``) or with a reply of the wrong shape. Not an outage: it is
    raised to the caller and counted (``server_errors``), never decided by the failure
    policy. The redis-py exception, if any, is ``__cause__``."""


class BackendNotFound(ServerError):
    """Neither the module nor the Functions library ``rl`` is on the server (or the backend
    named does not answer its commands)."""


class ProtocolError(ServerError):
    """A reply did not have the shape the protocol promises."""


class PermitDenied(RedisRLError):
    """``permit()`` could not get a slot within its wait."""

    def __init__(self, key: str, in_use: int, retry_after_ms: int) -> None:
        super().__init__(f"no permit for {key!r}: {in_use} in use, retry after {retry_after_ms} ms")
        self.key = key
        self.in_use = in_use
        self.retry_after_ms = retry_after_ms


class LimiterClosed(RedisRLError):
    """The prefetching limiter was closed (``close()``): it leases nothing more, and every
    later take raises this (counted in ``errors``)."""


def again(e: _E) -> _E:
    """The error one call ended in, for one more of the takes that waited for it: a
    :class:`ServerError` anew (one exception raised in several threads at once would share
    one traceback), anything else as it is."""
    if isinstance(e, ServerError):
        fresh = type(e)(*e.args)
        fresh.__cause__ = e.__cause__
        return fresh
    return e
