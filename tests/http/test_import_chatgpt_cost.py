"""Planning a ChatGPT import costs time in proportion to the file: imports run one at a time,
so one slow plan holds every other import back (docs/api.md §12). Ratios within one run."""

from __future__ import annotations

import gc
import time

from tether.sessions.transfer.chatgpt import plan_sessions

from chatgpt_kit import Conversation


def _planning_seconds(assistant_messages: int) -> float:
    """One user message answered by a chain of assistant messages (ChatGPT writes one per
    tool step), planned twice; the faster of the two. The garbage collector is held off while
    timed: its passes grow with the heap and blur the algorithm's own cost."""
    conversation = Conversation("long answer", start=1.7e9)
    conversation.add("user", "go")
    for n in range(assistant_messages):
        conversation.add("assistant", f"step {n}", step=0.001)
    best = float("inf")
    for _ in range(2):
        gc.collect()
        gc.disable()
        try:
            started = time.perf_counter()
            [plan] = plan_sessions([conversation.data], lambda _: None)
            best = min(best, time.perf_counter() - started)
        finally:
            gc.enable()
    assert sum(d.type == "text.delta" for d in plan.drafts) == assistant_messages
    return best


def test_a_long_chain_of_assistant_messages_plans_in_linear_time() -> None:
    """Each step of the chain copied the chain so far: 40,000 messages took 28x what 5,000
    did (80,000: 29 s); now about 9x. Eight times the messages may take at most 16x."""
    small, large = _planning_seconds(5_000), _planning_seconds(40_000)
    assert large < 16 * small, (small, large)
