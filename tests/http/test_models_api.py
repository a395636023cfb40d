"""Models (issue 16.1): `GET /api/models` is the endpoint's own `/v1/models`; `PATCH
/api/session {model}` is metadata in the log (`session.updated`, invariant 4: no activity) and
the next run uses it, recorded on `run.started` and shown on the assistant row; a model the
endpoint does not know ends the run with `model_not_found`. Real server, real HTTP, the fake
OpenAI server at the model boundary."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from fake_openai import FakeOpenAI, error
from helpers import ServerProcess, new_session, running_server, session_body, start_turn, wait_idle

pytestmark = pytest.mark.slow


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as server:
        server.other_models = ["big-model", "tiny-model"]
        yield server


@pytest.fixture
def server(tmp_path: Path, fake: FakeOpenAI) -> Iterator[ServerProcess]:
    with running_server(
        tmp_path / "data",
        *("--runtime", "openai", "--base-url", fake.base_url, "--model", "fake-model"),
    ) as srv:
        yield srv


def patch(client: httpx.Client, sid: str, **changes: object) -> httpx.Response:
    return client.patch("/api/session", json={"session_id": sid, **changes})


def test_models_are_the_endpoints_own_list(server: ServerProcess, fake: FakeOpenAI) -> None:
    with server.client() as client:
        body = client.get("/api/models").json()
    assert body["default"] == "fake-model"
    assert [m["id"] for m in body["models"]] == ["fake-model", "big-model", "tiny-model"]
    assert body["models"][0]["context_window"] == fake.context_length
    assert "error" not in body or body["error"] is None


def test_an_unreachable_endpoint_lists_the_default_with_an_error(tmp_path: Path) -> None:
    with FakeOpenAI() as gone:
        base_url = gone.base_url
    with (
        running_server(
            tmp_path / "data", "--runtime", "openai", "--base-url", base_url, "--model", "m1"
        ) as srv,
        srv.client() as client,
    ):
        response = client.get("/api/models")
    assert response.status_code == 200
    body = response.json()
    assert body["models"] == [{"id": "m1", "label": "m1"}]
    assert body["error"]["code"] == "network"
    # what failed, not the "timed out" the SDK's aiohttp transport says of a refused connection
    assert "ClientConnectorError" in body["error"]["message"]
    assert "timed out" not in body["error"]["message"]


def test_the_demo_runtime_lists_its_own_model(tmp_path: Path) -> None:
    with running_server(tmp_path / "data") as srv, srv.client() as client:
        body = client.get("/api/models").json()
    assert body["default"] == "tether-demo"
    assert [m["id"] for m in body["models"]] == ["tether-demo"]


def test_the_session_model_is_durable_metadata_and_the_next_run_uses_it(
    server: ServerProcess, fake: FakeOpenAI
) -> None:
    with server.client() as client:
        sid = new_session(client)
        start_turn(client, sid, "first")
        before = wait_idle(client, sid)
        assert before["model"] is None
        assert before["messages"][-1]["model"] == "fake-model"

        response = patch(client, sid, model="big-model")
        assert response.status_code == 200, response.text
        row = response.json()["session"]
        assert row["model"] == "big-model"
        assert row["updated_at"] == before["updated_at"]  # metadata, not activity
        listed = client.get("/api/sessions").json()["sessions"]
        assert [r["model"] for r in listed if r["session_id"] == sid] == ["big-model"]

        start_turn(client, sid, "second")
        after = wait_idle(client, sid)
        assert fake.last_request["model"] == "big-model"
        assert after["messages"][-1]["model"] == "big-model"
        assert after["messages"][1]["model"] == "fake-model"  # the earlier answer keeps its own

        # A start request's `model` overrides the session's for that turn only.
        start_turn(client, sid, "third", model="tiny-model")
        wait_idle(client, sid)
        assert fake.last_request["model"] == "tiny-model"

        # null: back to the server default.
        assert patch(client, sid, model=None).json()["session"]["model"] is None
        start_turn(client, sid, "fourth")
        wait_idle(client, sid)
        assert fake.last_request["model"] == "fake-model"

    # The log is the source: a restart shows the same.
    server.restart()
    with server.client() as client:
        view = session_body(client, sid)
        assert view["model"] is None
        assert [m.get("model") for m in view["messages"] if m["role"] == "assistant"] == [
            "fake-model",
            "big-model",
            "tiny-model",
            "fake-model",
        ]


def test_an_unchanged_model_appends_nothing(server: ServerProcess) -> None:
    with server.client() as client:
        sid = new_session(client)
        patch(client, sid, model="big-model")
        seq = session_body(client, sid)["last_seq"]
        assert patch(client, sid, model="big-model").status_code == 200
        assert session_body(client, sid)["last_seq"] == seq


@pytest.mark.parametrize(
    "model",
    [pytest.param("", id="empty"), pytest.param("   ", id="blank"), pytest.param(5, id="number")],
)
def test_a_bad_model_is_400_and_changes_nothing(server: ServerProcess, model: object) -> None:
    with server.client() as client:
        sid = new_session(client)
        seq = session_body(client, sid)["last_seq"]
        response = patch(client, sid, model=model)
        assert response.status_code == 400, response.text
        assert response.json()["code"] == "invalid_request"
        assert session_body(client, sid)["last_seq"] == seq


def test_a_model_the_endpoint_does_not_know_ends_the_run_with_model_not_found(
    server: ServerProcess, fake: FakeOpenAI
) -> None:
    """Any id is accepted (the list may be stale, or the endpoint may not list at all); the
    endpoint is the judge, and its refusal is the run's truthful end."""
    fake.script(error(404, "The model 'nope' does not exist", code="model_not_found"))
    with server.client() as client:
        sid = new_session(client)
        assert patch(client, sid, model="nope").status_code == 200
        start_turn(client, sid, "hello")
        row = wait_idle(client, sid)["messages"][-1]
    assert fake.last_request["model"] == "nope"
    assert (row["state"], row["error"]["code"], row["model"]) == (
        "error",
        "model_not_found",
        "nope",
    )


def test_a_hostile_model_id_is_shown_as_visible_text_and_sent_back_unchanged(
    server: ServerProcess, fake: FakeOpenAI
) -> None:
    """An endpoint may list an id with a bidi override or zero-width characters, to pass for
    another model in the picker: the list gives each id a `label` to show, visible text
    (docs/api.md §3), and the id itself is what the session keeps and the endpoint gets back,
    byte for byte. The Markdown export shows the answering model by its visible text too."""
    spoof, blank = "big\u202e-ledom\u200b", "\u200b\u2066"
    fake.other_models = [spoof, blank, "gpt-4o-\u05d1"]
    with server.client() as client:
        body = client.get("/api/models").json()
        labels = {m["id"]: m["label"] for m in body["models"]}
        assert labels == {
            "fake-model": "fake-model",
            spoof: "big-ledom",
            blank: "U+200B U+2066",
            "gpt-4o-\u05d1": "gpt-4o-\u05d1",
        }
        assert body["default_label"] == "fake-model"
        sid = new_session(client)
        assert patch(client, sid, model=spoof).json()["session"]["model"] == spoof
        start_turn(client, sid, "hello")
        answer = wait_idle(client, sid)["messages"][-1]
        assert fake.last_request["model"] == spoof
        assert answer["model"] == spoof
        markdown = client.get(f"/api/sessions/{sid}/export", params={"format": "markdown"}).text
    assert "## Assistant (big-ledom)" in markdown
    assert "\u202e" not in markdown and "\u200b" not in markdown


def test_ids_that_clean_to_one_label_are_labelled_apart(
    server: ServerProcess, fake: FakeOpenAI
) -> None:
    """`gpt\\u200b-4` beside `gpt-4` (or ids differing only by controls) both showed as
    `gpt-4`: nobody could tell which one a picker picks. Ids whose labels meet are each
    labelled by the id with what the cleaning takes written `\\u{HEX}`, so the clean one
    keeps its plain label; an id that reads like such an escape is escaped in turn (its
    `\\` as `\\\\`), and the default takes part."""
    fake.other_models = [
        "gpt-4",
        "gpt\u200b-4",
        "gpt-4\x07",
        "gpt\\u{200B}-4",  # reads like the escape of the second
        "fake\u2060-model",  # meets the default
        "e\u0301 x",  # not NFC: meets "é x"
        "\u00e9 x",
        "solo\u200b",  # meets no other label: cleaned as before
    ]
    with server.client() as client:
        body = client.get("/api/models").json()
    labels = {m["id"]: m["label"] for m in body["models"]}
    assert labels == {
        "fake-model": "fake-model",
        "gpt-4": "gpt-4",
        "gpt\u200b-4": "gpt\\u{200B}-4",
        "gpt-4\x07": "gpt-4\\u{0007}",
        "gpt\\u{200B}-4": "gpt\\\\u{200B}-4",
        "fake\u2060-model": "fake\\u{2060}-model",
        "e\u0301 x": "e\\u{0301} x",
        "\u00e9 x": "\u00e9 x",
        "solo\u200b": "solo",
    }
    assert body["default_label"] == "fake-model"
