"""The page treats everything a model, a tool or a user wrote as untrusted (XSS-proof), and
shows automatic compression only as a quiet divider (contract invariant 6)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import BrowserContext, expect

from fake_openai import FakeOpenAI, barrier, reasoning, reply, text, tool_call
from helpers import ServerProcess, running_server
from pagekit import open_app, send, wait_settled

pytestmark = pytest.mark.slow

EVIL = (
    '<img src=x onerror="window.__xss=1"> <script>window.__xss=2</script> '
    '[click me](javascript:window.__xss=3) <a href="javascript:window.__xss=4">x</a> '
    '<svg onload="window.__xss=5"></svg> **bold**'
)


def transcript_of(page):  # noqa: ANN001, ANN201
    return page.locator("#transcript")


@pytest.fixture
def openai_web(tmp_path: Path, fake: FakeOpenAI) -> Iterator[ServerProcess]:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "evil.html").write_text(EVIL)
    with running_server(
        tmp_path / "data",
        "--runtime",
        "openai",
        "--base-url",
        fake.base_url,
        "--model",
        "fake-model",
        "--workspace",
        str(workspace),
    ) as srv:
        yield srv


def test_model_tool_and_user_html_is_inert(
    context: BrowserContext, openai_web: ServerProcess, fake: FakeOpenAI
) -> None:
    fake.script(
        reply(reasoning(EVIL), text(EVIL), tool_call("call_1", "read_file", {"path": "evil.html"})),
        reply(text(EVIL)),
    )
    page = context.new_page()
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    open_app(page, openai_web.base_url)
    send(page, EVIL)
    wait_settled(page)
    page.select_option("#display-mode", "stream")
    page.locator("details").evaluate_all("(els) => els.forEach((d) => { d.open = true; })")
    expect(transcript_of(page).locator(".markdown strong")).to_have_count(2)
    assert page.evaluate("window.__xss") is None
    assert dialogs == []
    transcript = page.locator("#transcript")
    assert transcript.locator("script, img[onerror], svg, iframe, [onload]").count() == 0
    hrefs = transcript.locator("a[href]").evaluate_all("(as) => as.map((a) => a.href)")
    assert all(h.startswith(("http:", "https:", "mailto:")) for h in hrefs), hrefs
    expect(transcript.locator(".row.user")).to_contain_text("<script>window.__xss=2</script>")
    expect(transcript.locator(".tool-result")).to_contain_text("onerror")  # shown as text
    expect(transcript.locator(".markdown strong")).to_have_count(2)  # Markdown still renders


def test_compression_shows_as_a_quiet_divider_then_leaves_settled_history(
    context: BrowserContext, openai_web: ServerProcess, fake: FakeOpenAI
) -> None:
    fake.context_length = 400
    fake.script(reply(text("word " * 300), usage={"prompt_tokens": 10, "completion_tokens": 330}))
    page = context.new_page()
    open_app(page, openai_web.base_url)
    send(page, "first")
    wait_settled(page)
    fake.script(
        reply(barrier("summary"), text("handoff summary for the agent")),
        reply(text("second answer")),
    )
    send(page, "second")
    divider = page.locator(".row.live .divider")
    expect(divider).to_have_text("Compressing context")
    assert page.locator(".row.live .tool-card").count() == 0  # not a clickable tool row
    fake.release("summary")
    wait_settled(page)
    expect(page.locator(".row.assistant").last).to_contain_text("second answer")
    expect(page.locator(".row.assistant .divider")).to_have_count(0)  # omitted when settled
    expect(page.locator("#transcript")).not_to_contain_text("handoff summary for the agent")


LATER_EVENTS_JS = """async (later) => {
  const r = await import("/static/js/reducer.js");
  const {TranscriptView} = await import("/static/js/transcript.js");
  const root = document.createElement("div");
  document.body.append(root);
  const view = new TranscriptView(root);
  const s = r.createSession("s1");
  let seq = 0;
  const apply = (type, data) => {
    seq += 1;
    r.applyEvent(s, {seq, session_id: "s1", type, at: 1000 + seq, stream_id: "r1",
                     turn_id: "u1", data: {stream_id: "r1", ...data}});
    view.render(r.view(s));
    return root.querySelector(".row.live .divider")?.textContent ?? null;
  };
  apply("turn.submitted", {turn_id: "u1", text: "go", attachments: [], submitted_at: 1000});
  apply("run.started", {turn_id: "u1", runtime: "openai", model: "m"});
  const labels = [apply("compression.started", {pass_id: "p1"})];
  if (later === "reasoning.delta" || later === "text.delta") {
    labels.push(apply(later, {item_id: "i1", text: "carrying on"}));
  } else {
    labels.push(apply("tool.started", {call_id: "c1", name: "list_files", args: {}}));
  }
  return labels;
}"""


@pytest.mark.parametrize("later", ["reasoning.delta", "text.delta", "tool.started"])
def test_later_events_prove_compression_passed_without_its_completion(
    context: BrowserContext, openai_web: ServerProcess, later: str
) -> None:
    """Contract invariant 6: "Later tool, reasoning, or interim assistant events prove the
    compression barrier has passed even if no explicit completion event was delivered." The
    page's own reducer and transcript view, fed a live run whose `compression.completed`
    never came: the divider turns from "Compressing context" to "Context auto-compressed"
    as soon as anything of the run follows it."""
    page = context.new_page()
    page.goto(openai_web.base_url + "/api/health")
    labels = page.evaluate(LATER_EVENTS_JS, later)
    assert labels == ["Compressing context", "Context auto-compressed"]
