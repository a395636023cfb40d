"""A runtime module whose import fails, as a plugin with a missing dependency would."""

import tether_echo_runtime_missing_dependency  # noqa: F401

BrokenRuntime = None
