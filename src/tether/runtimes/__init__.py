"""Runtimes: who answers a turn. Each yields typed events (`runtimes.base`); the run engine
normalises them into the log. Every runtime, built in or installed as a plugin, is an entry
point of the group `tether.runtimes` (docs/runtimes.md), looked up by name and imported only
when chosen, so an optional runtime's dependencies are never imported by the core."""

from __future__ import annotations

from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points

from tether.runtimes.base import Runtime, RuntimeUnavailable
from tether.settings import Settings

GROUP = "tether.runtimes"

# The built-ins' entry points, as pyproject.toml declares them. Read from here too, so an
# installation whose metadata predates them (an editable install not yet reinstalled) still
# finds them; tests/runtimes/test_runtime_plugins.py checks that the two lists agree.
BUILT_IN = {
    "demo": "tether.runtimes.demo:DemoRuntime",
    "openai": "tether.runtimes.openai:OpenAIRuntime",
    "hermes": "tether.runtimes.hermes:HermesRuntime",
}


@dataclass(frozen=True)
class Registered:
    name: str
    target: str  # module:attribute
    distribution: str  # the package that registered it


def registered() -> dict[str, Registered]:
    """Every runtime this installation offers, by name."""
    found = {name: Registered(name, target, "tether") for name, target in BUILT_IN.items()}
    for point in entry_points(group=GROUP):
        dist = point.dist.name if point.dist is not None else "?"
        found[point.name] = Registered(point.name, point.value, dist)
    return found


def runtime_class(name: str) -> type[Runtime]:
    """The class registered as `name`; RuntimeUnavailable (with the reason) when there is
    none or it cannot be imported."""
    entry = registered().get(name)
    if entry is None:
        names = ", ".join(sorted(registered()))
        raise RuntimeUnavailable(
            f"There is no runtime {name!r} in this installation (available: {names})."
        )
    try:
        cls = EntryPoint(name, entry.target, GROUP).load()
    except Exception as exc:  # a plugin's import can fail in any way: say which and why
        raise RuntimeUnavailable(
            f"The {name!r} runtime ({entry.target}, from {entry.distribution}) could not be "
            f"loaded: {type(exc).__name__}: {exc}"
        ) from exc
    if not (isinstance(cls, type) and issubclass(cls, Runtime)):
        raise RuntimeUnavailable(
            f"The {name!r} runtime ({entry.target}) is not a tether.runtimes.base.Runtime."
        )
    return cls


def load_runtime(settings: Settings) -> Runtime:
    """Build the runtime `settings.runtime` names. RuntimeUnavailable when it cannot start
    (not installed, failed to import, or refused the configuration)."""
    return runtime_class(settings.runtime)(settings)
