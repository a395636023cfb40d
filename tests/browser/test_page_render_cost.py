"""What a streaming answer costs the browser: each rendered frame costs Chromium style,
layout, paint and compositing, so a tab that rendered every delta of a run kept about a core
busy and five such tabs fell hundreds of ms behind their streams (bench/README.md,
`outside_latency.py`). While a run streams the page renders at most every 100 ms."""

from __future__ import annotations

from playwright.sync_api import BrowserContext, expect

from fake_openai import FakeOpenAI, delay, reply, text
from helpers import ServerProcess
from pagekit import open_app, send, wait_settled

DELTAS = 60


def layouts(cdp) -> float:  # noqa: ANN001
    metrics = cdp.send("Performance.getMetrics")["metrics"]
    return next(m["value"] for m in metrics if m["name"] == "LayoutCount")


def test_a_streaming_run_renders_at_most_every_100_ms_and_shows_every_delta(
    context: BrowserContext, openai_web: ServerProcess, fake: FakeOpenAI
) -> None:
    parts = []
    for i in range(DELTAS):
        parts += [text(f"w{i} "), delay(0.02)]
    fake.script(reply(text("start "), delay(0.3), *parts))
    page = context.new_page()
    cdp = context.new_cdp_session(page)
    cdp.send("Performance.enable")
    open_app(page, openai_web.base_url)
    send(page, "stream")
    expect(page.locator(".row.live .markdown")).to_contain_text("start")
    before = layouts(cdp)
    wait_settled(page)
    during = layouts(cdp) - before
    answer = page.locator(".row.assistant .markdown").last
    expect(answer).to_have_text(" ".join(["start", *(f"w{i}" for i in range(DELTAS))]))
    # 60 deltas 20 ms apart: about 1.2 s, so about 12 live renders and the settled one;
    # rendering each delta as it came laid out the page about once a delta
    assert during <= DELTAS / 2, f"{during} layouts for {DELTAS} deltas"
