"""Runtimes declare what they can do on one base class (`runtimes.base.Runtime`), and the
layers that drive them read that surface instead of probing a runtime for methods."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tether.runtimes import BUILT_IN
from tether.runtimes.base import Capabilities, Runtime

SRC = Path(__file__).parents[2] / "src" / "tether"


def _class(target: str) -> type:
    module, _, attr = target.partition(":")
    return getattr(__import__(module, fromlist=[attr]), attr)


@pytest.mark.parametrize("name", sorted(BUILT_IN))
def test_each_built_in_is_a_runtime_that_declares_its_capabilities(name: str) -> None:
    cls = _class(BUILT_IN[name])
    assert issubclass(cls, Runtime) and cls.name == name and cls.description
    assert isinstance(cls.capabilities, Capabilities)
    keeps_history = cls.agent_history is not Runtime.agent_history
    assert cls.capabilities.agent_sync == keeps_history
    assert (cls.open_handle is not Runtime.open_handle) == (name == "hermes")


def test_capabilities_are_listed_by_name() -> None:
    caps = Capabilities(tools=True, attachments=("image", "text"), approvals=True)
    assert caps.names() == [
        "streaming",
        "tools",
        "approvals",
        "attachments:image",
        "attachments:text",
    ]


def test_nothing_that_drives_a_runtime_probes_it_for_attributes() -> None:
    probes = []
    for folder in ("runs", "http", "services.py", "sessions"):
        paths = [SRC / folder] if folder.endswith(".py") else sorted((SRC / folder).rglob("*.py"))
        for path in paths:
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if (
                    isinstance(node, ast.Call)
                    and getattr(node.func, "id", None) in ("getattr", "hasattr")
                    and "runtime" in ast.unparse(node.args[0])
                ):
                    probes.append(f"{path.relative_to(SRC)}:{node.lineno}: {ast.unparse(node)}")
    assert probes == []
