"""Every public member of the package has a docstring: modules, classes, functions,
methods and properties whose names do not start with ``_`` (dunder methods other than
``__init__`` are Python's protocol and documented there; an ``__init__`` whose class has a
docstring is covered by it). Members imported from elsewhere (``redis``, ``typing``) are
not the package's to document."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from typing import Any, Iterator, Tuple

import redis_rl


def _modules() -> Iterator[Any]:
    yield redis_rl
    for info in pkgutil.iter_modules(redis_rl.__path__):
        if info.name == "__main__":
            continue
        yield importlib.import_module(f"redis_rl.{info.name}")


def _own(obj: Any, module: Any) -> bool:
    return getattr(obj, "__module__", None) == module.__name__


def _members(module: Any) -> Iterator[Tuple[str, Any]]:
    """(dotted name, object) of the module's public functions and classes, and of each
    class's public methods and properties (its own and those of the package's classes it
    inherits from)."""
    for name, obj in vars(module).items():
        if name.startswith("_") or not _own(obj, module):
            continue
        if inspect.isfunction(obj):
            yield f"{module.__name__}.{name}", obj
        elif inspect.isclass(obj):
            yield f"{module.__name__}.{name}", obj
            # Its own members and those it inherits from the package's private bases.
            owners = [c for c in obj.__mro__ if c.__module__.startswith("redis_rl")]
            seen: set[str] = set()
            for attr, member in ((a, m) for c in owners for a, m in vars(c).items()):
                if attr.startswith("_") or attr in seen:
                    continue
                seen.add(attr)
                if isinstance(member, (staticmethod, classmethod)):
                    member = member.__func__
                if inspect.isfunction(member) or isinstance(member, property):
                    if inspect.isfunction(member) and member.__name__ != attr:
                        continue  # an alias (``decide = take``): documented under its name
                    yield f"{module.__name__}.{name}.{attr}", member


def undocumented() -> list[str]:
    missing = []
    for module in _modules():
        if not (module.__doc__ or "").strip():
            missing.append(module.__name__)
        for name, obj in _members(module):
            if not (inspect.getdoc(obj) if not isinstance(obj, property) else obj.__doc__):
                missing.append(name)
    return missing


def test_every_public_member_has_a_docstring() -> None:
    missing = undocumented()
    assert not missing, f"{len(missing)} public members without a docstring:\n" + "\n".join(missing)
