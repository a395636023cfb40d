"""Runtimes: who answers a turn. Each yields typed events (`runtimes.base`); the run engine
normalises them into the log. Runtimes are looked up by name and imported only when chosen,
so an optional runtime's dependencies are never imported by the core."""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points

from tether.runtimes.base import Runtime, RuntimeUnavailable
from tether.settings import Settings

BUILT_IN = {
    "demo": "tether.runtimes.demo:DemoRuntime",
    "openai": "tether.runtimes.openai:OpenAIRuntime",
    "hermes": "tether.runtimes.hermes:HermesRuntime",
}


def load_runtime(settings: Settings) -> Runtime:
    """Build the runtime `settings.runtime` names (built in, or a `tether.runtimes` plugin)."""
    target = BUILT_IN.get(settings.runtime)
    if target is None:
        found = [ep for ep in entry_points(group="tether.runtimes") if ep.name == settings.runtime]
        if not found:
            raise RuntimeUnavailable(
                f"The {settings.runtime!r} runtime is not available in this installation."
            )
        return found[0].load()(settings)
    module_name, _, attr = target.partition(":")
    return getattr(importlib.import_module(module_name), attr)(settings)
