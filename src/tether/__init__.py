"""Tether: a self-hosted web UI for AI agents whose runs never come loose."""

__version__ = "0.1.0"
