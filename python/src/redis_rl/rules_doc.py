"""A rules document: parsing and validation (naming the line and field of every problem),
and the pure plan of one request (document + attributes -> the layers that apply, their
keys and limits). No Redis here; :mod:`redis_rl.rules` takes the plan.

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

import json
import re
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, NamedTuple, Optional, Sequence, Set, Tuple

import yaml

from .limits import Limit, parse_limits

#: Attributes the middleware fills (``ip``, ``path``, ``method``, ``host``) and the usual
#: app-given ones; a document names others under ``attributes:``.
BUILTIN_ATTRIBUTES = ("ip", "path", "method", "host", "user", "tier", "api_key")
DEFAULT_PREFIX = "rl:rules:"
DEFAULT_CODE = "rate_limit_exceeded"
#: Buckets in one document at most: every layer matching at once must fit one RL.MTAKE.
MAX_BUCKETS = 64
#: Characters in one document at most.
MAX_TEXT = 1 << 20
_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_ATTR = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
_PLACEHOLDER = re.compile(r"\{([^{}]*)\}")
_LAYER_FIELDS = ("name", "match", "key", "limit", "code", "shadow")
_TOP_FIELDS = ("prefix", "attributes", "layers")


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


class Glob:
    """``*`` any run of characters (``/`` included), ``?`` one character, the rest literal
    (the Rust client's matcher is the same). Matching takes time linear in the text times
    the pattern at worst: a regex would backtrack exponentially on ``*a*a*a*b`` against a
    long attacker-chosen path."""

    __slots__ = ("literal", "pattern", "prefix")

    def __init__(self, pattern: str) -> None:
        self.pattern = pattern
        wild = "*" in pattern or "?" in pattern
        self.literal = None if wild else pattern
        body = pattern[:-1]
        self.prefix = (
            body if pattern.endswith("*") and "*" not in body and "?" not in body else None
        )

    def fullmatch(self, text: str) -> bool:
        """Whether ``text`` matches the whole pattern (``*`` any run, ``?`` one character)."""
        if self.literal is not None:
            return text == self.literal
        if self.prefix is not None:
            return text.startswith(self.prefix)
        p, i, j, n, m = self.pattern, 0, 0, len(text), len(self.pattern)
        star, mark = -1, 0
        while i < n:
            if j < m and (p[j] == "?" or (p[j] != "*" and p[j] == text[i])):
                i += 1
                j += 1
            elif j < m and p[j] == "*":
                star, mark = j, i
                j += 1
            elif star >= 0:
                j = star + 1
                mark += 1
                i = mark
            else:
                return False
        return all(c == "*" for c in p[j:])


def glob(pattern: str) -> Glob:
    """A :class:`Glob` for ``pattern``."""
    return Glob(pattern)


@dataclass(frozen=True)
class Layer:
    name: str
    #: ``(attribute, globs)``: every attribute must match one of its globs.
    match: Tuple[Tuple[str, Tuple[Glob, ...]], ...]
    key: str
    #: The attributes ``key`` names, in order.
    fields: Tuple[str, ...]
    limits: Tuple[Limit, ...]
    limit: str
    code: str
    shadow: bool
    line: Optional[int]

    def matches(self, attrs: Mapping[str, Any]) -> bool:
        """Whether every attribute this layer matches on is present and matches one of its
        patterns."""
        for attr, globs in self.match:
            value = attrs.get(attr)
            if value is None:
                return False
            text = str(value)
            if not any(g.fullmatch(text) for g in globs):
                return False
        return True

    def render(self, attrs: Mapping[str, Any]) -> Optional[str]:
        """The key with the request's attributes, or ``None`` if one is missing or empty
        (the layer then does not apply)."""
        values = {}
        for f in self.fields:
            v = attrs.get(f)
            if v is None or v == "":
                return None
            values[f] = str(v)
        return _PLACEHOLDER.sub(lambda m: values[m.group(1)], self.key)


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
    out: List[Applied] = []
    claimed = set()
    for layer in doc.layers:
        if layer.key in claimed or not layer.matches(attrs):
            continue
        rendered = layer.render(attrs)
        if rendered is None:
            continue
        if not layer.shadow:
            claimed.add(layer.key)
        # A hash tag per layer: its limits' buckets share a slot (one RL.MTAKE in a cluster).
        base = f"{doc.prefix}{{{layer.name}:{rendered}}}"
        buckets = tuple(Bucket(f"{base}:{x.suffix}", x.rate, x.cap, x) for x in layer.limits)
        out.append(Applied(layer, base, buckets))
    return out


# -- parsing ---------------------------------------------------------------------------


def _lines(
    node: Any,
    path: Tuple[Any, ...],
    out: Dict[Tuple[Any, ...], int],
    dups: List[Any],
    walked: Optional[Set[int]] = None,
) -> None:
    out[path] = node.start_mark.line + 1
    walked = set() if walked is None else walked
    if id(node) in walked:  # an alias: walked once (a "billion laughs" document stays linear)
        return
    walked.add(id(node))
    if isinstance(node, yaml.MappingNode):
        names = set()
        for k, v in node.value:
            name = k.value if isinstance(k, yaml.ScalarNode) else str(k)
            if name in names:
                dups.append((path, name, k.start_mark.line + 1))
            names.add(name)
            sub = (*path, name)
            out[sub] = k.start_mark.line + 1
            _lines(v, sub, out, dups, walked)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _lines(item, (*path, i), out, dups, walked)


def _field(path: Tuple[Any, ...]) -> str:
    text = ""
    for p in path:
        text += f"[{p}]" if isinstance(p, int) else (f".{p}" if text else str(p))
    return text or "(document)"


def parse_document(text: str, source: str = "rules") -> Document:
    """The document in ``text`` (YAML, or JSON), or :class:`RulesError` naming every
    problem found."""
    lines: Dict[Tuple[Any, ...], int] = {}
    dups: List[Any] = []
    if len(text) > MAX_TEXT:
        raise RulesError(
            [Problem(None, "(document)", f"longer than {MAX_TEXT} characters")], source
        )
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
        if node is not None:
            _lines(node, (), lines, dups)
    except RecursionError:
        raise RulesError([Problem(None, "(document)", "nested too deeply")], source) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        try:  # JSON that YAML refuses (tabs) is still JSON
            data = json.loads(text)
        except ValueError:
            line = mark.line + 1 if mark is not None else None
            raise RulesError(
                [Problem(line, "(document)", f"not YAML or JSON: {e}")], source
            ) from None
    problems: List[Problem] = []

    def bad(path: Tuple[Any, ...], message: str) -> None:
        line = None
        for n in range(len(path), -1, -1):
            if path[:n] in lines:
                line = lines[path[:n]]
                break
        problems.append(Problem(line, _field(path), message))

    for path, name, line in dups:
        problems.append(Problem(line, _field((*path, name)), "given twice"))
    if not isinstance(data, dict):
        bad((), "a document is a mapping with a 'layers' list")
        raise RulesError(problems, source)
    for k in data:
        if k not in _TOP_FIELDS:
            bad((k,), f"unknown field (a document has {', '.join(_TOP_FIELDS)})")
    prefix = data.get("prefix", DEFAULT_PREFIX)
    if not isinstance(prefix, str) or "{" in prefix or "}" in prefix or len(prefix) > 100:
        bad(("prefix",), "a string of at most 100 characters without '{' or '}'")
        prefix = DEFAULT_PREFIX
    attributes = list(BUILTIN_ATTRIBUTES)
    extra = data.get("attributes", [])
    if not isinstance(extra, list):
        bad(("attributes",), "a list of attribute names")
        extra = []
    for i, a in enumerate(extra):
        if not isinstance(a, str) or not _ATTR.fullmatch(a):
            bad(("attributes", i), "an attribute name is a letter or _ then letters, digits, _")
        else:
            attributes.append(a)
    raw_layers = data.get("layers")
    if not isinstance(raw_layers, list) or not raw_layers:
        bad(("layers",), "a non-empty list of layers (to stop refusing, mark layers shadow: true)")
        raise RulesError(problems, source)
    layers: List[Layer] = []
    names: Dict[str, int] = {}
    buckets = 0
    for i, raw in enumerate(raw_layers):
        layer = _layer(raw, ("layers", i), attributes, bad, lines)
        if layer is None:
            continue
        if layer.name in names:
            bad(("layers", i, "name"), f"{layer.name!r} is layer {names[layer.name]}'s name too")
        names.setdefault(layer.name, i)
        buckets += len(layer.limits)
        layers.append(layer)
    if buckets > MAX_BUCKETS:
        bad(("layers",), f"{buckets} buckets in all; at most {MAX_BUCKETS} (one RL.MTAKE)")
    if problems:
        raise RulesError(problems, source)
    return Document(prefix, tuple(layers), text, tuple(attributes))


def _layer(
    raw: Any, path: Tuple[Any, ...], attributes: List[str], bad: Any, lines: Dict[Any, int]
) -> Optional[Layer]:
    if not isinstance(raw, dict):
        bad(path, "a layer is a mapping with name, key and limit")
        return None
    ok = True
    for k in raw:
        if k not in _LAYER_FIELDS:
            bad((*path, k), f"unknown field (a layer has {', '.join(_LAYER_FIELDS)})")
            ok = False
    name = raw.get("name")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        bad((*path, "name"), "required: 1 to 64 of A-Z a-z 0-9 _ . -")
        ok = False
    key = raw.get("key")
    fields: List[str] = []
    if not isinstance(key, str) or not key:
        bad((*path, "key"), "required: a key template such as 'user:{user}'")
        ok = False
    else:
        if "{" in _PLACEHOLDER.sub("", key) or "}" in _PLACEHOLDER.sub("", key):
            bad((*path, "key"), "'{' and '}' only around a placeholder ({ip})")
            ok = False
        for f in _PLACEHOLDER.findall(key):
            if f not in attributes:
                bad(
                    (*path, "key"),
                    f"unknown placeholder {{{f}}}: known are {', '.join(attributes)} "
                    "(declare others under 'attributes:')",
                )
                ok = False
            elif f not in fields:
                fields.append(f)
    limit = raw.get("limit")
    limits: List[Limit] = []
    if not isinstance(limit, str):
        bad((*path, "limit"), "required: a limit string such as '1000/minute'")
        ok = False
    else:
        try:
            limits = parse_limits(limit)
        except ValueError as e:
            bad((*path, "limit"), str(e))
            ok = False
    code = raw.get("code", DEFAULT_CODE)
    if not isinstance(code, str) or not _NAME.fullmatch(code):
        bad((*path, "code"), "1 to 64 of A-Z a-z 0-9 _ . -")
        ok = False
    shadow = raw.get("shadow", False)
    if not isinstance(shadow, bool):
        bad((*path, "shadow"), "true or false")
        ok = False
    match = raw.get("match", {})
    compiled: List[Tuple[str, Tuple[Glob, ...]]] = []
    if match is None:
        match = {}
    if not isinstance(match, dict):
        bad((*path, "match"), "a mapping of attribute: glob (or a list of globs)")
        ok = False
    else:
        for attr, globs in match.items():
            where = (*path, "match", attr)
            if attr not in attributes:
                bad(where, f"unknown attribute: known are {', '.join(attributes)}")
                ok = False
                continue
            patterns = globs if isinstance(globs, list) else [globs]
            if not patterns or not all(isinstance(g, (str, int)) for g in patterns):
                bad(where, "a glob string or a non-empty list of them")
                ok = False
                continue
            compiled.append((attr, tuple(glob(str(g)) for g in patterns)))
    if not ok:
        return None
    assert isinstance(name, str) and isinstance(key, str) and isinstance(limit, str)
    return Layer(
        name=name,
        match=tuple(compiled),
        key=key,
        fields=tuple(fields),
        limits=tuple(limits),
        limit=limit,
        code=code,
        shadow=shadow,
        line=lines.get(path),
    )


def load_document(path: str) -> Document:
    """The rules document in the YAML file at ``path`` (refused with the line at fault)."""
    with open(path, encoding="utf-8") as f:
        return parse_document(f.read(), path)
