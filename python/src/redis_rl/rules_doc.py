"""A rules document: parsed and validated by the client core (``redis_rl._core``, the Rust
client's code too), each problem named with its line and field; the plan of one request
(document + attributes -> the layers that apply, their keys and limits). No Redis here;
:mod:`redis_rl.rules` takes the plan.

The format (docs/rules.md)::

    prefix: "rl:rules:"        # optional: every bucket key starts with it
    attributes: [org]          # optional: attributes beyond the built-in ones
    layers:
      - name: global_ip        # [A-Za-z0-9_.-], unique: the metric label and the log's layer
        match: {}              # attribute -> glob (or list of globs); all must match
        key: "ip:{ip}"         # {attribute} placeholders
        limit: "5000/minute"   # a limit string, several joined by ';'
        code: rate_limit       # optional: what a 429 says (default rate_limit_exceeded)
        shadow: false          # optional: decide and log, never refuse

Layers with the same ``key`` template form a group: the first of them that matches applies
and the rest of the group is skipped (premium before free on ``user:{user}``). Layers with
different templates all apply. A shadow layer never claims its group.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, List, Mapping, NamedTuple, Optional, Sequence, Tuple

from . import _core
from .limits import Limit

#: Attributes the middleware fills (``ip``, ``path``, ``method``, ``host``) and the usual
#: app-given ones; a document names others under ``attributes:``.
BUILTIN_ATTRIBUTES = ("ip", "path", "method", "host", "user", "tier", "api_key")
DEFAULT_PREFIX = "rl:rules:"
DEFAULT_CODE = "rate_limit_exceeded"
#: Buckets in one document at most: every layer matching at once must fit one RL.MTAKE.
MAX_BUCKETS = 64
#: Bytes in one document at most.
MAX_TEXT = 1 << 20

#: ``*`` any run of characters (``/`` included), ``?`` one character, the rest literal;
#: ``Glob(pattern).fullmatch(text)``, in time linear in the text times the pattern.
Glob = _core.Glob


class Problem(NamedTuple):
    line: Optional[int]
    field: str
    message: str

    def __str__(self) -> str:
        where = f"line {self.line}: " if self.line else ""
        return f"{where}{self.field}: {self.message}"


class RulesError(ValueError):
    """A document that does not validate; ``problems`` names each (line, field, what)."""

    def __init__(self, problems: Sequence[Problem], source: str = "rules") -> None:
        self.problems = list(problems)
        self.source = source
        super().__init__(
            f"{source}: {len(self.problems)} problem(s):\n"
            + "\n".join(f"  {p}" for p in self.problems)
        )


def glob(pattern: str) -> Any:
    """A :data:`Glob` for ``pattern``."""
    return _core.Glob(pattern)


@dataclass(frozen=True)
class Layer:
    name: str
    key: str
    limits: Tuple[Limit, ...]
    limit: str
    code: str
    shadow: bool
    line: Optional[int]


@dataclass(frozen=True)
class Document:
    prefix: str
    layers: Tuple[Layer, ...]
    #: The text it was parsed from (what ``rules show`` prints).
    text: str
    attributes: Tuple[str, ...] = BUILTIN_ATTRIBUTES
    #: Set by the source: the stored version, and when it was applied (Unix seconds).
    version: Optional[int] = None
    updated_at: Optional[float] = None
    #: The core's document: plans and checks (immutable, shared by threads).
    core: Any = dataclasses.field(default=None, repr=False, compare=False)


class Bucket(NamedTuple):
    key: str
    rate: float
    cap: float
    limit: Limit


class Applied(NamedTuple):
    """A layer that applies to a request: its rendered key and one bucket per limit."""

    layer: Layer
    key: str
    buckets: Tuple[Bucket, ...]


def plan(doc: Document, attrs: Mapping[str, Any]) -> List[Applied]:
    """The layers that apply to ``attrs``, in document order."""
    out = []
    for index, base, buckets in doc.core.plan(attrs):
        layer = doc.layers[index]
        out.append(
            Applied(
                layer,
                base,
                tuple(Bucket(k, r, c, x) for (k, r, c), x in zip(buckets, layer.limits)),
            )
        )
    return out


def parse_document(text: str, source: str = "rules") -> Document:
    """The document in ``text`` (YAML, or JSON), or :class:`RulesError` naming every
    problem found (with its line)."""
    if not isinstance(text, str):
        raise RulesError([Problem(None, "(document)", "a document is text")], source)
    core, problems = _core.RulesDocument.parse(text)
    if core is None:
        raise RulesError([Problem(*p) for p in problems], source)
    layers = tuple(
        Layer(name, key, tuple(Limit(*x) for x in limits), limit, code, shadow, line)
        for name, key, limit, code, shadow, line, limits in core.layers()
    )
    return Document(core.prefix(), layers, text, tuple(core.attributes()), core=core)


def read_text(path: str) -> str:
    """The text of the file at ``path``; bytes that are not UTF-8 are a :class:`RulesError`
    naming the file and the line (a bare ``UnicodeDecodeError`` names neither)."""
    with open(path, "rb") as f:
        data = f.read()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        byte = data[err.start]
        raise RulesError(
            [Problem(line, "(document)", f"not UTF-8: byte 0x{byte:02x} at line {line}")],
            path,
        ) from None


def load_document(path: str) -> Document:
    """The rules document in the YAML file at ``path`` (refused with the line at fault)."""
    return parse_document(read_text(path), path)
