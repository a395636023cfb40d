"""Runs: the state machine, admission and attachment, Stop, reclaim and recovery."""
