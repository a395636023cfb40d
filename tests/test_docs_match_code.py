"""The reference docs list what the code has: every `tether serve` flag with its environment
variable and default (docs/configuration.md), every durable event type, every error code the
API returns with its status, every run state and provider error code (docs/api.md). Each is
read from the code itself, so adding one without documenting it fails here."""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import click

import tether.cli
import tether.http.app  # noqa: F401 - loads every module that defines a member of the family
from tether import events
from tether.cli import serve, users
from tether.errors import ApiError
from tether.runtimes.base import ERROR_CODES
from tether.settings import Settings

DOCS = Path(__file__).parents[1] / "docs"


def _table(doc: str, first_header: str) -> dict[str, list[str]]:
    """The rows of the Markdown table whose first column is headed `first_header`, keyed by
    the first cell with its backticks removed."""
    rows: dict[str, list[str]] = {}
    inside = False
    for line in (DOCS / doc).read_text(encoding="utf-8").splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if not line.startswith("|"):
            inside = False
        elif cells[0] == first_header:
            inside = True
        elif inside and not set(cells[0]) <= {"-"}:
            rows[cells[0].strip("`")] = cells[1:]
    return rows


def _shown(value: object) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def test_every_serve_flag_is_documented_with_its_variable_and_default() -> None:
    rows = _table("configuration.md", "flag")
    flags = [p for p in serve.params if isinstance(p, click.Option)]
    assert len(flags) > 20
    for flag in flags:
        name = max(flag.opts, key=len)
        assert name in rows, f"{name} is missing from docs/configuration.md"
        variable, default = rows[name][0], rows[name][1]
        assert variable == f"`{flag.envvar}`", name
        if flag.show_default:  # the default `tether serve --help` shows
            assert default == f"`{_shown(flag.default)}`", (name, default, flag.default)


def test_every_documented_flag_exists() -> None:
    flags = {max(p.opts, key=len) for p in serve.params if isinstance(p, click.Option)}
    assert set(_table("configuration.md", "flag")) <= flags


def test_every_users_option_and_variable_is_documented() -> None:
    """`tether users ...` has no table, but each of its flags and TETHER_* variables is named
    in docs/configuration.md's paragraph on it."""
    text = " ".join((DOCS / "configuration.md").read_text(encoding="utf-8").split())
    commands = list(users.commands.values())
    assert {c.name for c in commands} == {"add", "list", "password", "remove"}
    assert "`tether users list`" in text
    for command in commands:
        assert f"`tether users {command.name}" in text, command.name
        for option in (p for p in command.params if isinstance(p, click.Option)):
            assert max(option.opts, key=len) in text, (command.name, option.opts)
            assert not option.envvar or f"`{option.envvar}`" in text, option.envvar


def test_every_tether_variable_the_code_reads_is_documented() -> None:
    """The TETHER_* variables read outside the serve flags (TETHER_DEMO_DELAY, the
    TETHER_HERMES_* knobs) are each named somewhere in docs/."""
    docs = "\n".join(p.read_text(encoding="utf-8") for p in DOCS.glob("*.md"))
    source = Path(tether.cli.__file__).parent
    named = {
        node.value
        for path in source.rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and re.fullmatch(r"TETHER_[A-Z][A-Z0-9_]*", node.value)
    }
    assert {"TETHER_DEMO_DELAY", "TETHER_HERMES_HOME"} <= named
    assert [name for name in sorted(named) if not re.search(rf"\b{name}\b", docs)] == []


def test_every_durable_event_type_is_in_the_event_table() -> None:
    types = set(events.VOCABULARY.durable_names())  # each field too: test_event_definitions.py
    assert {"run.finished", "agent.imported", "approval.resolved"} <= types
    assert types <= set(_table("api.md", "type"))


def test_every_error_code_is_in_the_error_table_with_its_status() -> None:
    rows = _table("api.md", "code")
    classes, pending = [], list(ApiError.__subclasses__())
    while pending:
        cls = pending.pop()
        classes.append(cls)
        pending.extend(cls.__subclasses__())
    assert len(classes) > 15
    for cls in classes:
        assert cls.code in rows, f"{cls.code} is missing from docs/api.md"
        assert rows[cls.code][0] == str(cls.status), cls.code


def test_run_states_and_provider_error_codes_are_in_the_runs_section() -> None:
    text = (DOCS / "api.md").read_text(encoding="utf-8")
    runs = text[text.index("## 4. Runs") : text.index("## 5.")]
    for word in (*events.RUN_STATES, *ERROR_CODES):
        assert f"`{word}`" in runs, word


def test_each_default_is_written_once_in_settings() -> None:
    """`serve` takes each default from `Settings`; a flag naming its own would be a second copy
    that can drift from the one the app and the tests use."""
    knobs = {field.name for field in dataclasses.fields(Settings)}
    cli = ast.parse(Path(tether.cli.__file__).read_text(encoding="utf-8"))
    restated = [
        call.args[0].value
        for call in ast.walk(cli)
        if isinstance(call, ast.Call)
        and getattr(call.func, "id", None) == "option"
        and isinstance(call.args[0], ast.Constant)
        and call.args[0].value.lstrip("-").replace("-", "_") in knobs
        and any(keyword.arg == "default" for keyword in call.keywords)
    ]
    assert restated == []
    defaults = {f.name: f.default for f in dataclasses.fields(Settings)}
    for flag in serve.params:
        if flag.name in defaults and defaults[flag.name] not in (None, False):
            assert flag.default == defaults[flag.name], flag.name
