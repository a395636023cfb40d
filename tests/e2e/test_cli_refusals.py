"""`tether serve` refusing a configuration it cannot serve: one line naming what is wrong, a
non-zero exit, no traceback, and nothing written (docs/configuration.md)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def refused(args: list[str], env: dict[str, str] | None = None, code: int = 1) -> str:
    """Run `tether` with `args`; the one error line it printed, having checked the rest (a
    usage error, exit 2, comes after click's two lines of usage)."""
    result = subprocess.run(
        [sys.executable, "-m", "tether", *args],
        env={**os.environ, **(env or {})},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert result.returncode == code, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == (1 if code == 1 else 4), result.stderr
    return lines[-1]


def test_a_port_in_use_is_refused_before_the_data_directory_is_made(tmp_path: Path) -> None:
    """uvicorn bound the port only after the app had started: the log said "ready", the data
    directory was made, then a bind error and exit 3."""
    data = tmp_path / "data"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        line = refused(["serve", "--port", str(port), "--data-dir", str(data), "--no-browser"])
    assert line == f"Error: Cannot listen on 127.0.0.1 port {port}: Address already in use."
    assert not data.exists()


@pytest.mark.parametrize("url", ["localhost:11434/v1", "ftp://models.example/v1", "http://"])
def test_a_base_url_that_is_not_http_is_refused_at_start(tmp_path: Path, url: str) -> None:
    """It was taken as is: the server started, and every turn then failed."""
    line = refused(
        ["serve", "--runtime", "openai", "--model", "m", "--base-url", url]
        + ["--data-dir", str(tmp_path / "data"), "--port", "0", "--no-browser"]
    )
    assert line == (
        f"Error: --base-url {url!r} is not an http:// or https:// URL "
        "(e.g. http://localhost:11434/v1)."
    )


@pytest.mark.parametrize(
    ("args", "code", "error"),
    [
        (["--runtime", "nosuch"], 1, "There is no runtime 'nosuch' in this installation"),
        (
            ["--auth", "oidc", "--oidc-issuer", "https://id.example", "--oidc-client-id", "t"]
            + ["--oidc-client-secret-env", "TETHER_TEST_UNSET_SECRET"],
            2,
            "The environment variable TETHER_TEST_UNSET_SECRET (named by",
        ),
    ],
    ids=["unknown runtime", "unset client secret"],
)
def test_a_refused_configuration_leaves_no_data_directory(
    tmp_path: Path, args: list[str], code: int, error: str
) -> None:
    """Both were found only after the data directory and its database had been made."""
    data = tmp_path / "data"
    line = refused(
        ["serve", *args, "--data-dir", str(data), "--port", "0", "--no-browser"], code=code
    )
    assert line.startswith(f"Error: {error}"), line
    assert not data.exists()


@pytest.mark.parametrize(
    "command", [["list"], ["remove", "bob"], ["password", "bob", "--password-env", "PW"]]
)
def test_users_on_a_data_directory_that_does_not_exist_is_refused(
    tmp_path: Path, command: list[str]
) -> None:
    """A misspelt --data-dir made a new, empty one: `users list` printed nothing, exit 0."""
    data = tmp_path / "typo"
    line = refused(["users", *command, "--data-dir", str(data)], env={"PW": "a new password"})
    assert line == (
        f"Error: There is no Tether data in {data}: give the --data-dir of the server "
        "(`tether users add` makes a new one)."
    )
    assert not data.exists()


def test_users_add_refuses_a_bad_name_before_asking_for_a_password(tmp_path: Path) -> None:
    """The password was asked for twice first, and only then was the name refused."""
    data = tmp_path / "data"
    line = refused(["users", "add", "bob smith", "--data-dir", str(data)])
    assert line == (
        "Error: A user name is 1-64 letters, digits and ._@+-, starting with a letter or digit."
    )
    assert not data.exists()


@pytest.mark.parametrize("issuer", ["id.example.com", "ftp://id.example.com", "https://"])
def test_an_oidc_issuer_that_is_not_a_url_is_refused(tmp_path: Path, issuer: str) -> None:
    """It was taken as is: the server started and every sign-in then failed."""
    data = tmp_path / "data"
    line = refused(
        ["serve", "--auth", "oidc", "--oidc-issuer", issuer, "--oidc-client-id", "tether"]
        + ["--oidc-client-secret-env", "SECRET", "--data-dir", str(data), "--port", "0"]
        + ["--no-browser"],
        env={"SECRET": "s3cret"},
        code=2,
    )
    assert line == (
        "Error: Invalid value for '--oidc-issuer' (env var: 'TETHER_OIDC_ISSUER'): give the "
        "provider's http:// or https:// issuer URL (e.g. https://id.example.com/realms/main)"
    )
    assert not data.exists()


@pytest.mark.parametrize("header", ["", "X Forwarded User", "X-User:"])
def test_a_trusted_header_that_is_no_header_name_is_refused(tmp_path: Path, header: str) -> None:
    """No request can carry it, so the server started and nobody could ever sign in."""
    data = tmp_path / "data"
    line = refused(
        ["serve", "--auth", "trusted-header", "--trusted-proxy", "10.0.0.1"]
        + ["--trusted-header", header, "--data-dir", str(data), "--port", "0", "--no-browser"],
        code=2,
    )
    assert line == (
        "Error: Invalid value for '--trusted-header' (env var: 'TETHER_TRUSTED_HEADER'): give "
        f"an HTTP header name such as X-Forwarded-User, not {header!r}"
    )
    assert not data.exists()


def test_the_log_level_is_taken_in_capitals_too(tmp_path: Path) -> None:
    """TETHER_LOG_LEVEL=DEBUG, as Python's logging writes its levels, was refused as an invalid
    value; it is taken as debug (the refusal that follows is the unknown runtime's)."""
    line = refused(
        ["serve", "--runtime", "nosuch", "--data-dir", str(tmp_path / "data"), "--port", "0"],
        env={"TETHER_LOG_LEVEL": "DEBUG"},
    )
    assert line.startswith("Error: There is no runtime 'nosuch'"), line


@pytest.mark.parametrize(
    ("command", "error"),
    [
        (["password", "bob"], "There is no user bob."),
        (["add", "alice"], "There is already a user called alice."),
    ],
    ids=["password of no one", "add an existing name"],
)
def test_users_refuses_the_name_before_asking_for_a_password(
    tmp_path: Path, command: list[str], error: str
) -> None:
    """The new password was asked for twice first, and only then was the name refused."""
    data = tmp_path / "data"
    added = subprocess.run(
        [sys.executable, "-m", "tether", "users", "add", "alice", "--password-env", "PW"]
        + ["--data-dir", str(data)],
        env={**os.environ, "PW": "alice's password"},
        capture_output=True,
        timeout=20,
    )
    assert added.returncode == 0, added.stderr
    assert refused(["users", *command, "--data-dir", str(data)]) == f"Error: {error}"


def test_users_add_refuses_a_short_password_before_making_the_data_directory(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    line = refused(
        ["users", "add", "alice", "--password-env", "PW", "--data-dir", str(data)],
        env={"PW": "short"},
    )
    assert line == "Error: A password has at least 8 characters."
    assert not data.exists()


@pytest.mark.parametrize("host", ["example.com:abc", "[::1]x", "example.com:"])
def test_an_allowed_host_the_host_check_cannot_read_is_refused(tmp_path: Path, host: str) -> None:
    """The host check could not parse it, so it was accepted and then matched no request."""
    data = tmp_path / "data"
    line = refused(
        ["serve", "--allowed-host", host, "--data-dir", str(data), "--port", "0", "--no-browser"],
        code=2,
    )
    assert line.startswith("Error: Invalid value for '--allowed-host'"), line
    assert repr(host) in line, line
    assert not data.exists()


def test_a_database_that_cannot_be_reached_leaves_no_data_directory(tmp_path: Path) -> None:
    """The local directory (attachments' copies, the cookie secret) was made before the
    PostgreSQL server was asked, and stayed, empty, after the refusal."""
    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    data = tmp_path / "new" / "data"
    url = f"postgresql://tether@127.0.0.1:{port}/tether"
    result = subprocess.run(
        [sys.executable, "-m", "tether", "serve", "--database-url", url]
        + ["--data-dir", str(data), "--port", "0", "--no-browser"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert result.returncode == 1, result.stderr
    assert result.stderr.startswith("Error: Cannot open the Tether database at "), result.stderr
    assert "Connection refused" in result.stderr  # libpq's words, and its hint on a second line
    assert list(tmp_path.iterdir()) == []


def test_users_add_on_a_postgresql_servers_data_directory_asks_for_its_database(
    tmp_path: Path,
) -> None:
    """A server on PostgreSQL keeps only its attachments' copies in its data directory; a user
    added there without --database-url went into a new tether.db no server reads, and the
    person could not sign in."""
    data = tmp_path / "data"
    (data / "attachments").mkdir(parents=True)
    line = refused(
        ["users", "add", "bob", "--data-dir", str(data), "--password-env", "PW"],
        env={"PW": "a long enough password"},
    )
    assert line == (
        f"Error: {data} is the data directory of a server on PostgreSQL (it holds attachments "
        "and no tether.db): its users are in the database. Give the server's --database-url "
        "(or TETHER_DATABASE_URL)."
    )
    assert sorted(p.name for p in data.iterdir()) == ["attachments"]
