"""Contract invariant 6 and issue-map rows #2308 / #2355: a compression summary is reference
material for the agent, never the user's current intent, never visible transcript, and never
carried into an ordinary fresh chat. Layers: model context, transcript."""

from __future__ import annotations

import pytest

from tether.events import SUMMARY_PREFIX

from fake_openai import FakeOpenAI, reply, text
from helpers import ServerProcess, new_session, session_body, start_turn, wait_idle

pytestmark = pytest.mark.slow

STALE_TASK = "ACTIVE TASK: delete the staging database"


def test_a_fresh_chat_never_resumes_a_stale_compressed_task(
    openai_server: ServerProcess, fake: FakeOpenAI
) -> None:
    fake.context_length = 500
    with openai_server.client() as client:
        old = new_session(client)
        fake.script(
            reply(text("word " * 350), usage={"prompt_tokens": 20, "completion_tokens": 420})
        )
        start_turn(client, old, "help me clean up staging")
        wait_idle(client, old)
        fake.script(
            reply(text(f"Summary. {STALE_TASK}.")),  # the compression pass
            reply(text("Noted.")),
        )
        start_turn(client, old, "thanks, that's all for now")
        body = wait_idle(client, old)
        sent = fake.requests[-1]["messages"]
        # the summary is a system message that says what it is; the user's words are last
        assert sent[0]["role"] == "system" and sent[0]["content"].startswith(SUMMARY_PREFIX)
        assert STALE_TASK in sent[0]["content"]
        assert sent[-1] == {"role": "user", "content": "thanks, that's all for now"}
        assert all(STALE_TASK not in str(m["content"]) for m in sent if m["role"] == "user")
        assert STALE_TASK not in str(body["messages"])  # never visible transcript
        # an ordinary fresh chat starts clean: nothing of the old task reaches the model
        fresh = new_session(client)
        fake.script(reply(text("Hello!")))
        start_turn(client, fresh, "hi")
        wait_idle(client, fresh)
        assert fake.requests[-1]["messages"] == [{"role": "user", "content": "hi"}]
        context = client.get("/api/session/context", params={"session_id": fresh}).json()
        assert STALE_TASK not in str(context) and context["compressions"] == 0
        assert session_body(client, fresh)["parent_session_id"] is None
