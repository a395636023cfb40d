"""Hermes Agent as a Tether runtime, run in a sidecar process (docs/hermes.md).

Importing this package never imports hermes-agent: the sidecar (`sidecar.py`) does, in the
interpreter that has it installed.
"""

from tether.runtimes.hermes.runtime import HermesHandle, HermesRuntime

__all__ = ["HermesHandle", "HermesRuntime"]
