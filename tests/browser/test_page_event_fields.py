"""Layer: browser (the page's reducer, `web/js/reducer*.js`). The page's folds read only the
fields each event type defines (`tether/events.py`): a field asked for that the definition
does not have reads nothing, silently, whether by a typo or a rename on one side only. The
server's folds are held to the same rule in tests/test_event_definitions.py."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from event_samples import every_type_in_a_running_turn
from playwright.sync_api import Browser, Page

from tether import events as ev
from tether.events import VOCABULARY

from helpers import running_server

pytestmark = pytest.mark.slow

# Each envelope's data behind a Proxy that notes every field the fold asks for (by `data.x`,
# `Object.hasOwn(data, "x")` or `"x" in data`); the fold itself is the page's, unchanged.
READS_JS = """
async (events) => {
  const r = await import("/static/js/reducer.js");
  const state = r.createSession("s1");
  const reads = {};
  for (const env of events) {
    const seen = new Set(reads[env.type] ?? []);
    const note = (key) => { if (typeof key === "string") seen.add(key); };
    const data = new Proxy(env.data, {
      get(target, key, receiver) { note(key); return Reflect.get(target, key, receiver); },
      has(target, key) { note(key); return Reflect.has(target, key); },
      getOwnPropertyDescriptor(target, key) {
        note(key);
        return Reflect.getOwnPropertyDescriptor(target, key);
      },
    });
    r.applyEvent(state, { ...env, data });
    reads[env.type] = [...seen];
  }
  return reads;
}
"""


@pytest.fixture(scope="module")
def page(browser: Browser, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Page]:
    with running_server(tmp_path_factory.mktemp("fields") / "data") as server:
        ctx = browser.new_context()
        page = ctx.new_page()
        page.goto(server.base_url + "/api/health")  # any same-origin page will do
        yield page
        ctx.close()


def test_the_page_folds_read_only_fields_their_types_define(page: Page) -> None:
    envelopes = [
        {
            "seq": seq,
            "session_id": "s1",
            "type": name,
            "at": float(seq),
            "stream_id": "r1",
            "turn_id": "u1",
            "data": data,
        }
        for seq, (name, data) in enumerate(every_type_in_a_running_turn(), 1)
    ]
    reads: dict[str, list[str]] = page.evaluate(READS_JS, envelopes)
    assert set(reads) == set(VOCABULARY.durable_names())
    for name, read in reads.items():
        event_type = VOCABULARY[name]
        assert set(read) <= event_type.required | event_type.optional, (name, sorted(read))
    assert {"approval_id", "command", "choices"} <= set(reads[ev.APPROVAL_REQUESTED])  # it acted
