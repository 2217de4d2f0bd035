"""Hostile rules files through the Python package: every one a RulesError naming the file
and the line, never an abort, a hang or a bare decoding error."""

from pathlib import Path

import pytest
import redis

from redis_rl.rules import Rules
from redis_rl.rules_doc import RulesError, load_document, parse_document

GOOD = "layers:\n  - {name: a, key: 'ip:{ip}', limit: 1/s}\n"


def _problem(err: RulesError) -> tuple:
    (p,) = err.problems
    return p.line, p.message


def test_bytes_that_are_not_utf8_name_the_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_bytes(GOOD.encode() + b"  - {name: b\xff, key: k, limit: 1/s}\n")
    with pytest.raises(RulesError) as e:
        load_document(str(path))
    assert _problem(e.value) == (3, "not UTF-8: byte 0xff at line 3")
    assert str(path) in str(e.value)
    client = redis.Redis(unix_socket_path=str(tmp_path / "none.sock"))
    for follow in (False, True):
        with pytest.raises(RulesError) as e:
            Rules.from_file(client, str(path), follow=follow)
        assert _problem(e.value)[0] == 3


def test_a_nul_byte_names_its_line() -> None:
    with pytest.raises(RulesError) as e:
        parse_document(GOOD + "\x00\n", "r.yaml")
    line, message = _problem(e.value)
    assert line == 3 and "at line 3" in message


def test_aliases_that_multiply_the_document_are_refused() -> None:
    fields = ", ".join(f"f{i}: 0" for i in range(40_000))
    text = (
        f"x: &l {{name: a, key: k, limit: 1/s, {fields}}}\nlayers: ["
        + ", ".join(["*l"] * 100_000)
        + "]\n"
    )
    assert len(text) < 1 << 20
    with pytest.raises(RulesError) as e:
        parse_document(text, "r.yaml")
    line, message = _problem(e.value)
    assert line == 2 and "aliases" in message


@pytest.mark.parametrize(
    "text",
    [
        "[" * 100_000,
        "{a: " * 50_000,
        "x" * ((1 << 20) + 1),
        "&a [*a]\n",
        "a: !!binary AAAA\n",
        "layers: [{name: a, key: k, limit: 1/s}]\nlayers: []\n",
    ],
)
def test_hostile_shapes_are_problems(text: str) -> None:
    with pytest.raises(RulesError) as e:
        parse_document(text, "r.yaml")
    assert e.value.problems
