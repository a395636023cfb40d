"""The read-only workspace tools: they must never reach outside the workspace, and every
failure must come back as a tool result the model can read, not as an exception."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tether.runtimes.tools import (
    MAX_LIST_ENTRIES,
    MAX_SEARCH_HITS,
    TOOL_NAMES,
    TOOL_SCHEMAS,
    WorkspaceTools,
)


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    (root / "sub" / "deep").mkdir(parents=True)
    (root / "a.txt").write_text("Hello World\nsecond line\n")
    (root / "sub" / "b.py").write_text("import os\nprint('hello there')\n")
    (root / "sub" / "deep" / "c.md").write_text("# HELLO\n")
    (root / ".git").mkdir()
    (root / ".git" / "config").write_text("hello from git\n")
    (root / "bin.dat").write_bytes(b"hello\x00\x01\x02binary")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("TOPSECRET hello\n")
    (tmp_path / "secret.txt").write_text("TOPSECRET\n")
    os.symlink(tmp_path / "secret.txt", root / "link.txt")
    os.symlink(outside, root / "linkdir")
    os.symlink(root / "a.txt", root / "inner_link.txt")
    return root


@pytest.fixture
def tools(ws: Path) -> WorkspaceTools:
    return WorkspaceTools(ws)


def ok(tools: WorkspaceTools, name: str, **args: object) -> str:
    result, is_error = tools.run_tool(name, args)
    assert not is_error, result
    return result


def refused(tools: WorkspaceTools, name: str, **args: object) -> str:
    result, is_error = tools.run_tool(name, args)
    assert is_error, result
    return result


# ---- confinement -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        "..",
        "../secret.txt",
        "sub/../../secret.txt",
        "/",
        "/etc/passwd",
        "link.txt",
        "linkdir",
        "linkdir/secret.txt",
    ],
)
@pytest.mark.parametrize("tool", ["list_files", "read_file", "search_files"])
def test_paths_outside_the_workspace_are_refused(
    tools: WorkspaceTools, tool: str, path: str
) -> None:
    args: dict[str, object] = {"path": path}
    if tool == "search_files":
        args["pattern"] = "secret"
    result, is_error = tools.run_tool(tool, args)
    assert is_error
    assert "outside the workspace" in result
    assert "TOPSECRET" not in result


def test_absolute_path_outside_is_refused(tools: WorkspaceTools, tmp_path: Path) -> None:
    result = refused(tools, "read_file", path=str(tmp_path / "secret.txt"))
    assert "outside the workspace" in result


def test_paths_inside_the_workspace_are_allowed(tools: WorkspaceTools, ws: Path) -> None:
    assert ok(tools, "read_file", path=str(ws / "a.txt")).startswith("Hello World")
    assert ok(tools, "read_file", path="sub/../a.txt").startswith("Hello World")
    assert ok(tools, "read_file", path="inner_link.txt").startswith("Hello World")
    assert "a.txt" in ok(tools, "list_files", path=str(ws)).splitlines()


def test_search_skips_symlinks_that_leave_the_workspace(tools: WorkspaceTools) -> None:
    result = ok(tools, "search_files", pattern="topsecret")
    assert result.startswith("No matches")


# ---- list_files ------------------------------------------------------------------------------


def test_list_files(tools: WorkspaceTools) -> None:
    assert ok(tools, "list_files").splitlines() == [
        ".git/",
        "a.txt",
        "bin.dat",
        "inner_link.txt",
        "link.txt",
        "linkdir/",
        "sub/",
    ]
    assert ok(tools, "list_files", path="sub").splitlines() == ["b.py", "deep/"]
    assert ok(tools, "list_files", path="sub/deep/").splitlines() == ["c.md"]


def test_list_files_caps_entries(tmp_path: Path) -> None:
    root = tmp_path / "many"
    root.mkdir()
    for i in range(MAX_LIST_ENTRIES + 10):
        (root / f"f{i:04d}.txt").write_text("x")
    lines = ok(WorkspaceTools(root), "list_files").splitlines()
    assert len(lines) == MAX_LIST_ENTRIES + 1
    assert lines[0] == "f0000.txt"
    assert lines[-1] == "... (10 more entries not shown)"


def test_list_files_errors(tools: WorkspaceTools, ws: Path) -> None:
    assert "not a directory" in refused(tools, "list_files", path="a.txt")
    assert "No such directory" in refused(tools, "list_files", path="nope")
    (ws / "empty").mkdir()
    assert ok(tools, "list_files", path="empty") == "empty is empty."


# ---- read_file -------------------------------------------------------------------------------


def test_read_file(tools: WorkspaceTools) -> None:
    assert ok(tools, "read_file", path="a.txt") == "Hello World\nsecond line\n"
    assert ok(tools, "read_file", path="sub/b.py").startswith("import os")


def test_read_file_truncates(tools: WorkspaceTools, ws: Path) -> None:
    (ws / "long.txt").write_text("x" * 50_000)
    result = ok(tools, "read_file", path="long.txt")
    assert result.startswith("x" * 20_000 + "\n... (truncated")
    assert "50,000-byte file" in result
    assert ok(tools, "read_file", path="long.txt", max_chars=10).startswith("x" * 10 + "\n...")
    assert ok(tools, "read_file", path="a.txt", max_chars=5).startswith("Hello\n... (trunc")


def test_read_file_replaces_invalid_utf8(tools: WorkspaceTools, ws: Path) -> None:
    (ws / "latin1.txt").write_bytes("café".encode("latin-1"))
    assert ok(tools, "read_file", path="latin1.txt") == "caf\ufffd"


def test_read_file_refuses_binaries(tools: WorkspaceTools) -> None:
    result = refused(tools, "read_file", path="bin.dat")
    assert "binary" in result
    assert "\x00" not in result


def test_read_file_errors(tools: WorkspaceTools) -> None:
    assert "No such file" in refused(tools, "read_file", path="missing.txt")
    assert "is a directory" in refused(tools, "read_file", path="sub")
    assert "Missing required argument 'path'" in refused(tools, "read_file")
    assert "must be a string" in refused(tools, "read_file", path=3)
    assert "max_chars" in refused(tools, "read_file", path="a.txt", max_chars="lots")


# ---- search_files ----------------------------------------------------------------------------


def test_search_files(tools: WorkspaceTools) -> None:
    assert ok(tools, "search_files", pattern="hello").splitlines() == [
        "a.txt:1: Hello World",
        "inner_link.txt:1: Hello World",  # a link that stays inside is an ordinary file
        "sub/b.py:2: print('hello there')",
        "sub/deep/c.md:1: # HELLO",
    ]  # .git, the binary file and links leaving the workspace are skipped; case is ignored
    assert ok(tools, "search_files", pattern="HELLO", path="sub/deep").splitlines() == [
        "sub/deep/c.md:1: # HELLO"
    ]
    assert ok(tools, "search_files", pattern="second", path="a.txt") == "a.txt:2: second line"
    assert ok(tools, "search_files", pattern="zzz").startswith("No matches for 'zzz'")


def test_search_files_caps_hits(tools: WorkspaceTools, ws: Path) -> None:
    (ws / "many.txt").write_text("needle\n" * (MAX_SEARCH_HITS + 50))
    lines = ok(tools, "search_files", pattern="needle").splitlines()
    assert len(lines) == MAX_SEARCH_HITS + 1
    assert lines[-1] == f"... (stopped after {MAX_SEARCH_HITS} matches)"


def test_search_files_errors(tools: WorkspaceTools) -> None:
    assert "must not be empty" in refused(tools, "search_files", pattern="")
    assert "Missing required argument 'pattern'" in refused(tools, "search_files")
    assert "No such file" in refused(tools, "search_files", pattern="x", path="nope")


# ---- dispatch --------------------------------------------------------------------------------


def test_unknown_tool_and_bad_arguments(tools: WorkspaceTools) -> None:
    result = refused(tools, "write_file", path="a.txt")
    assert "Unknown tool 'write_file'" in result
    assert "read_file" in result
    result, is_error = tools.run_tool("read_file", ["a.txt"])  # type: ignore[arg-type]
    assert is_error and "JSON object" in result


def test_schemas_describe_every_tool() -> None:
    assert sorted(TOOL_NAMES) == ["list_files", "read_file", "search_files"]
    for schema in TOOL_SCHEMAS:
        assert schema["type"] == "function"
        assert schema["function"]["parameters"]["type"] == "object"
    json.dumps(TOOL_SCHEMAS)
