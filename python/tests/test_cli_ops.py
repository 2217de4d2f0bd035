"""The operator's command line (``redis_rl.cli_ops.main``) against real servers: pins set,
shown and removed as the module sees them, RL.TOP, and one-line errors with their exit
codes for every way it can go wrong."""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import Iterator, List, Tuple

import pytest
from conftest import Server, _check_setup, free_port

from redis_rl import cli_ops, pins
from redis_rl.cli_ops import _parse_duration, _parse_rate


def run(*argv: str) -> Tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = cli_ops.main(list(argv), out, err)
    return code, out.getvalue(), err.getvalue()


def url(server: Server) -> List[str]:
    return ["--redis-url", f"redis://127.0.0.1:{server.port}/0"]


def test_python_m_redis_rl_runs_the_operator_commands(
    server: Server, key: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from redis_rl.__main__ import main

    assert main(["pin", key, "--block", *url(server)]) == 0
    assert main(["pinned", key, *url(server)]) == 0
    assert "block" in capsys.readouterr().out
    assert main(["unpin", key, *url(server)]) == 0


def test_rates_and_durations_parse() -> None:
    assert _parse_rate("500/s") == (500.0, 500.0)
    assert _parse_rate("100/minute") == (100 / 60, 100.0)
    assert _parse_rate("30/10s") == (3.0, 30.0)
    assert _parse_rate("5000/hours") == (5000 / 3600, 5000.0)
    assert _parse_rate(" 2.5 / m ") == (2.5 / 60, 2.5)
    for bad in ("500", "500/", "/s", "0/s", "500/fortnight", "-1/s", "1/0s"):
        with pytest.raises(ValueError):
            _parse_rate(bad)
    assert _parse_duration("10m") == 600 and _parse_duration("90") == 90
    assert _parse_duration("500ms") == 0.5 and _parse_duration("1d") == 86400
    for bad in ("0s", "ten", "5 parsecs", ""):
        with pytest.raises(ValueError):
            _parse_duration(bad)


def test_pin_show_and_unpin_a_rate(server: Server, key: str) -> None:
    code, out, err = run("pin", key, "500/s", "--for", "10m", *url(server))
    assert (code, err) == (0, ""), err
    assert out == f"{key}: pinned (rate 500/s, cap 500) for 10m0s\n"
    info = pins.parse_pinned(server.client().execute_command("RL.PINNED", key))
    assert info is not None and (info.kind, info.rate, info.cap) == ("rate", 500.0, 500.0)
    assert info.ms_left is not None and 0 < info.ms_left <= 600_000

    code, out, _ = run("pinned", key, *url(server))
    assert code == 0 and out.startswith(f"{key}: rate 500/s, cap 500, ") and "left" in out

    # A cap of its own; a rate per minute.
    assert run("pin", key, "120/minute", "--cap", "10", *url(server))[0] == 0
    info = pins.parse_pinned(server.client().execute_command("RL.PINNED", key))
    assert info is not None and info.cap == 10 and info.rate is not None
    assert math.isclose(info.rate, 2.0) and info.ms_left is None  # replaced: no end now
    assert run("pinned", key, *url(server))[1] == f"{key}: rate 2/s, cap 10, until unpinned\n"

    assert run("unpin", key, *url(server)) == (0, f"{key}: unpinned\n", "")
    assert run("unpin", key, *url(server)) == (1, f"{key}: had no live pin\n", "")
    assert run("pinned", key, *url(server)) == (1, f"{key}: not pinned\n", "")


def test_block_and_exempt(server: Server, key: str) -> None:
    r = server.client()
    assert run("pin", key, "--block", *url(server)) == (
        0,
        f"{key}: pinned (block) until unpinned\n",
        "",
    )
    granted, _, retry, _, kind = r.execute_command("RL.TAKE", key, 10, 10, 1, "WITHSTATE")
    assert (granted, retry, kind) == (0, 60000, b"block")
    assert run("pin", key, "--exempt", "--for", "30s", *url(server))[0] == 0
    granted, *_, kind = r.execute_command("RL.TAKE", key, 10, 10, 10, "WITHSTATE")
    assert (granted, kind) == (10, b"exempt")
    code, out, _ = run("pinned", key, *url(server))
    assert code == 0 and out.startswith(f"{key}: exempt, ") and out.endswith(" left\n")


def test_share_keys_are_pinned_before_and_after_their_first_holder(
    server: Server, key: str
) -> None:
    r = server.client()
    assert run("pin", key, "5/s", "--shares", *url(server))[0] == 0
    rate, burst, _, _, _, kind = r.execute_command("RL.SHARE", key, 100, 100, "h", 100, 1000)
    assert (float(rate), float(burst), kind) == (5.0, 5.0, b"rate")
    # An existing share key needs no flag; a bucket refuses it.
    assert run("pin", key, "--block", *url(server))[0] == 0
    *_, kind = r.execute_command("RL.SHARE", key, 100, 100, "h", 100, 1000)
    assert kind == b"block"
    assert run("pinned", key, *url(server))[1].startswith(f"{key}: block, ")
    assert run("unpin", key, *url(server)) == (0, f"{key}: unpinned\n", "")
    r.execute_command("RL.TAKE", key + "b", 1, 1)
    code, _, err = run("pin", key + "b", "--block", "--shares", *url(server))
    assert code == 4 and "not a share key" in err, err


def test_top_lists_the_keys_denied_most(own_server: Server) -> None:
    r = own_server.client()
    assert run("top", *url(own_server)) == (0, "no key denied lately\n", "")
    for key, denials in (("partner:acme", 3), ("user:42", 1)):
        r.execute_command("RL.TAKE", key, 1e-6, 1, 1)
        for _ in range(denials):
            assert r.execute_command("RL.TAKE", key, 1e-6, 1, 1) == 0
    code, out, err = run("top", "--count", "1", *url(own_server))
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert len(lines) == 2 and lines[0].split() == ["KEY", "DENIED", "LAST"]
    assert lines[1].split()[:2] == ["partner:acme", "3"] and lines[1].endswith(" ago")
    assert len(run("top", *url(own_server))[1].splitlines()) == 3


@pytest.mark.parametrize(
    "argv, says",
    [
        (["pin", "k"], "give RATE (like 500/s), or --block, or --exempt"),
        (["pin", "k", "500/s", "--block"], "not both"),
        (["pin", "k", "--exempt", "--cap", "5"], "not both"),
        (["pin", "k", "500/fortnight"], "is not a unit"),
        (["pin", "k", "500/s", "--cap", "0"], "--cap must be a positive number"),
        (["pin", "k", "--block", "--for", "soon"], "--for must look like"),
        (["top", "--count", "0"], "--count must be a positive integer"),
    ],
)
def test_bad_arguments_are_usage_errors(server: Server, argv: List[str], says: str) -> None:
    code, out, err = run(*argv, *url(server))
    assert code == 2 and out == "" and says in err and err.count("\n") == 1, err


def test_argparse_errors_are_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_ops.main(["nonsense"]) == 2
    assert cli_ops.main(["pin"]) == 2
    assert cli_ops.main(["--help"]) == 0
    assert "pin" in capsys.readouterr().out


def test_a_bad_url_is_a_usage_error() -> None:
    code, _, err = run("pinned", "k", "--redis-url", "http://localhost/")
    assert code == 2 and err.startswith("error: bad --redis-url 'http://localhost/'"), err


def test_unreachable_redis_is_exit_3_and_hides_the_password() -> None:
    port = free_port()
    code, _, err = run("pinned", "k", "--redis-url", f"redis://ops:s3cret@127.0.0.1:{port}/0")
    assert code == 3 and err.startswith("error: cannot reach Redis at "), err
    assert "s3cret" not in err and f"ops:***@127.0.0.1:{port}" in err
    assert err.count("\n") == 1


@pytest.fixture
def bare_server(tmp_path: Path) -> Iterator[Server]:
    """A server without the module."""
    _check_setup()
    s = Server(tmp_path / "bare", module=False)
    yield s
    s.stop()


def test_a_missing_module_says_to_load_it(bare_server: Server) -> None:
    for argv in (["pin", "k", "--block"], ["top"]):
        code, _, err = run(*argv, *url(bare_server))
        assert code == 4 and "the redis-rl module is not loaded" in err, err
        assert "loadmodule" in err and err.count("\n") == 1


def test_noperm_names_the_acl_line_to_add(own_server: Server) -> None:
    admin = own_server.client()
    admin.execute_command("ACL", "SETUSER", "app", "on", ">pw", "~*", "+rl.take", "+rl.pinned")
    as_app = ["--redis-url", f"redis://app:pw@127.0.0.1:{own_server.port}/0"]
    code, _, err = run("pin", "k", "--block", *as_app)
    assert code == 4 and "may not run RL.PIN" in err, err
    assert "add `+rl.pin +rl.unpin +rl.pinned`" in err and "docs/deploy.md#acl" in err
    code, _, err = run("top", *as_app)
    assert code == 4 and "add `+rl.top`" in err, err
    assert run("pinned", "k", *as_app)[0] == 1  # allowed: reads
    bad_password = ["--redis-url", f"redis://app:nope@127.0.0.1:{own_server.port}/0"]
    code, _, err = run("pinned", "k", *bad_password)
    assert code == 4 and "refused the credentials" in err and "nope" not in err, err


def test_a_wrong_key_type_is_the_servers_refusal(server: Server, key: str) -> None:
    server.client().set(key, "x")
    code, _, err = run("pin", key, "--block", *url(server))
    assert code == 4 and err.startswith("error: RL.PIN refused: WRONGTYPE"), err
