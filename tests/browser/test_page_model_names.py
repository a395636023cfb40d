"""Model ids the endpoint's list does not label, as the page shows them: a session's own
model the list lacks (PATCH /api/session, an import, a list that changed), the command line's
model in Settings, a saved default the list lacks, the model an answer's row names and the
sidebar's model badge. Each is the id as visible text, by the server's rule for labels
(`tether/visible_text.py` `visible_line`, docs/api.md §3), never its bidi controls,
zero-width or control characters; in a picker, one the list lacks says so. Two ids that clean
to one label are offered apart, each by its escaped id. The page's copy of the rule
(`web/js/names.js`) gives what `GET /api/models` gives, proven over hostile and legitimate
names alike."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path

import pytest
from names_kit import LEGITIMATE
from playwright.sync_api import BrowserContext, expect

from tether.http.models import escaped_id, model_label

from fake_openai import FakeOpenAI
from helpers import ServerProcess, new_session, running_server, start_turn, wait_idle
from pagekit import open_app

pytestmark = pytest.mark.slow

OWN = "\u202eevil\u200b-model\x07"  # shown as "evil-model"
COMMAND_LINE = "fake\u2066-\u2069model\u00ad"  # shown as "fake-model"


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    with FakeOpenAI(model=COMMAND_LINE) as server:
        server.other_models = ["big-model"]
        yield server


@pytest.fixture
def server(tmp_path: Path, fake: FakeOpenAI) -> Iterator[ServerProcess]:
    with running_server(
        tmp_path / "data",
        *("--runtime", "openai", "--base-url", fake.base_url, "--model", COMMAND_LINE),
    ) as srv:
        yield srv


def test_a_model_the_list_lacks_is_shown_as_visible_text_and_marked(
    context: BrowserContext, server: ServerProcess
) -> None:
    with server.client() as client:
        sid = new_session(client, "own model")
        answer = client.patch("/api/session", json={"session_id": sid, "model": OWN})
        assert answer.status_code == 200, answer.text
        start_turn(client, sid, "hello")
        wait_idle(client, sid)
        saved = client.patch("/api/settings", json={"default_model": "\u200bold\u202e-default"})
        assert saved.status_code == 200, saved.text
    page = context.new_page()
    open_app(page, server.base_url, f"/s/{sid}")
    picker = page.get_by_role("combobox", name="Model")
    expect(picker.locator("option")).to_have_text(
        ["Default (old-default)", "fake-model", "big-model", "evil-model (not listed)"]
    )
    expect(picker).to_have_value(OWN)  # what is sent back is the id, unchanged
    expect(page.locator(".row.assistant .model")).to_have_text(["evil-model"])
    expect(page.locator("#runtime-badge")).to_have_text("fake-model")
    expect(page.locator("#runtime-badge")).to_have_attribute("title", "fake-model")

    page.get_by_role("button", name="Settings").click()
    dialog = page.get_by_role("dialog", name="Settings")
    default = dialog.get_by_role("combobox", name="Default model")
    expect(default.locator("option")).to_have_text(
        [
            "Command line's (fake-model)",
            "fake-model",
            "big-model",
            "old-default (not listed)",
        ]
    )
    expect(default).to_have_value("\u200bold\u202e-default")


HOSTILE = [
    OWN,
    COMMAND_LINE,
    "\u200b\u2060\ufeff",  # nothing visible: its code points
    "",
    "a\u200db c\u200c",  # joiners that join nothing
    "\U0001f468\u200d\U0001f469 \u0645\u06cc\u200c\u062e",  # joiners that do
    "tab\there\nnew\u2028line\x85 \u3000 end\u00a0",
    "\u0301e\u0301 \U0001d400 \u115f\u2800",  # NFC; a lone combining mark; blank letters
    "\x1f\x7f\x9f\u206a\ufff9x\u180e",
]


def _alike_session(server: ServerProcess, fake: FakeOpenAI, *listed: str) -> str:
    """A session whose own model, `gpt\\u2060-4`, and the saved default, `\\u200bgpt-4`, read
    as `gpt-4`, which the endpoint lists beside `gpt\\u200b-4` (and `listed`); neither is
    listed."""
    fake.other_models = ["gpt-4", "gpt\u200b-4", *listed]
    with server.client() as client:
        sid = new_session(client, "alike")
        answer = client.patch("/api/session", json={"session_id": sid, "model": "gpt\u2060-4"})
        assert answer.status_code == 200, answer.text
        saved = client.patch("/api/settings", json={"default_model": "\u200bgpt-4"})
        assert saved.status_code == 200, saved.text
    return sid


def test_ids_that_read_alike_are_offered_apart_in_both_pickers(
    context: BrowserContext, server: ServerProcess, fake: FakeOpenAI
) -> None:
    """The endpoint lists `gpt-4` and `gpt\\u200b-4`, the session's own model is
    `gpt\\u2060-4` and the saved default `\\u200bgpt-4`, neither listed: each picker offered
    several `gpt-4`s. Each id whose label meets another's is shown escaped, listed
    (`GET /api/models`, the default among them) or not (the page's copy)."""
    sid = _alike_session(server, fake)
    page = context.new_page()
    open_app(page, server.base_url, f"/s/{sid}")
    picker = page.get_by_role("combobox", name="Model")
    expect(picker.locator("option")).to_have_text(
        [
            "Default (\\u{200B}gpt-4)",
            "fake-model",
            "gpt-4",
            "gpt\\u{200B}-4",
            "gpt\\u{2060}-4 (not listed)",
        ]
    )
    expect(picker).to_have_value("gpt\u2060-4")

    page.get_by_role("button", name="Settings").click()
    dialog = page.get_by_role("dialog", name="Settings")
    default = dialog.get_by_role("combobox", name="Default model")
    expect(default.locator("option")).to_have_text(
        [
            "Command line's (fake-model)",
            "fake-model",
            "gpt-4",
            "gpt\\u{200B}-4",
            "\\u{200B}gpt-4 (not listed)",
        ]
    )
    expect(default).to_have_value("\u200bgpt-4")


def test_answers_and_the_badge_name_models_apart_as_the_pickers_do(
    context: BrowserContext, server: ServerProcess, fake: FakeOpenAI
) -> None:
    """Answers from `gpt-4`, `gpt\\u200b-4` and `gpt\\u2060-4` all read `gpt-4`, and the
    badge read `fake-model` beside a listed `fake-model`: a row's model and the badge are
    named by the list's label, or escaped when the list lacks the id and its label reads as
    one of the list's."""
    sid = _alike_session(server, fake, "fake-model")
    with server.client() as client:
        for turn in ({"model": "gpt-4"}, {"model": "gpt\u200b-4"}, {}):  # {}: the session's
            start_turn(client, sid, "hello", **turn)
            wait_idle(client, sid)
    page = context.new_page()
    open_app(page, server.base_url, f"/s/{sid}")
    expect(page.locator(".row.assistant .model")).to_have_text(
        ["gpt-4", "gpt\\u{200B}-4", "gpt\\u{2060}-4"]
    )
    expect(page.locator("#runtime-badge")).to_have_text(escaped_id(COMMAND_LINE))
    expect(page.locator("#runtime-badge")).to_have_attribute("title", escaped_id(COMMAND_LINE))


def test_an_answer_is_named_anew_when_the_default_changes(
    context: BrowserContext, server: ServerProcess
) -> None:
    """The saved default `old-default` (not listed) reads as the session's own model
    `\\u200bold-default`: both are told apart, the answer's row too, until another default
    is saved: the list read again, the row is named plainly."""
    with server.client() as client:
        sid = new_session(client, "old default")
        own = client.patch("/api/session", json={"session_id": sid, "model": "\u200bold-default"})
        assert own.status_code == 200, own.text
        start_turn(client, sid, "hello")
        wait_idle(client, sid)
        saved = client.patch("/api/settings", json={"default_model": "old-default"})
        assert saved.status_code == 200, saved.text
    page = context.new_page()
    open_app(page, server.base_url, f"/s/{sid}")
    escaped = "\\u{200B}old-default"
    expect(page.get_by_role("combobox", name="Model").locator("option")).to_have_text(
        ["Default (old-default)", "fake-model", "big-model", f"{escaped} (not listed)"]
    )
    answer = page.locator(".row.assistant")
    expect(answer.locator(".model")).to_have_text(escaped)

    page.get_by_role("button", name="Settings").click()
    dialog = page.get_by_role("dialog", name="Settings")
    dialog.get_by_role("combobox", name="Default model").select_option("big-model")
    dialog.get_by_role("button", name="Save").click()
    expect(answer.locator(".model")).to_have_text("old-default")


def test_the_pages_rule_gives_what_the_server_gives(
    context: BrowserContext, server: ServerProcess
) -> None:
    """The same cases as `GET /api/models` labels, and many random mixes of the characters
    either rule treats specially: the page's copy cannot drift from the server's."""
    pool = [
        *"\u061c\u200e\u200f\u202a\u202e\u2066\u2069\u200b\u2060\u2064\ufeff\u180e\u00ad",
        *"\u206a\u206f\ufff9\ufffb\t\n\v\f\r\x1c\x1e\x1f\x85\u2028\u2029\u200c\u200d",
        *"\u115f\u3164\u2800 \u00a0\u3000\u2000\x00\x07\x7f\x80\x9f\u0301\u0645\u05e9",
        *"aZ-_.:/ \U0001f468\U0001f3f3\ufe0f\U000e0067\ue000e\u0915\u094d",
    ]
    rng = random.Random(20240611)
    names = [*HOSTILE, *LEGITIMATE.values()]
    names += ["".join(rng.choices(pool, k=rng.randint(1, 12))) for _ in range(400)]
    page = context.new_page()
    open_app(page, server.base_url)
    shown = page.evaluate(
        """async (names) => {
          const { escapedId, modelLabel } = await import("/static/js/names.js");
          return names.map((name) => [modelLabel(name), escapedId(name)]);
        }""",
        names,
    )
    expected = [[model_label(name), escaped_id(name)] for name in names]
    pairs = zip(names, shown, expected, strict=True)
    wrong = [(json.dumps(name), got, want) for name, got, want in pairs if got != want]
    assert not wrong, wrong[:5]
