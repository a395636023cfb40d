"""Importing ChatGPT's `conversations.json` (docs/api.md §12) over real HTTP into a real
server: its message tree becomes Tether's branches (docs/api.md §10), the path to
`current_node` the branch shown, at ChatGPT's own times (invariant 4: an import is not
activity); what is skipped is counted, the same file again creates nothing, and all of it
survives a restart and a JSON export's round trip."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx

from chatgpt_kit import Conversation
from helpers import running_server, session_body

START = 1_690_000_000.0


def a_conversation() -> Conversation:
    c = Conversation("Trip <img src=x onerror=alert(1)>", START, "conv-1")
    c.add("system", "You are ChatGPT.", hidden=True)
    c.add("user", "Hello <b>there</b>")
    c.add("assistant", "Hi! <script>alert(1)</script>", model="gpt-4o")
    fork = c.current
    c.add("user", "Write poetry")  # the branch the user left: an edit of the next message
    c.add("assistant", "Roses are red", model="gpt-4o")
    c.add("user", "Compute 2+2", parent=fork)
    c.add("assistant", "print(2+2)", content_type="code", recipient="python", model="gpt-4o")
    c.add("tool", "4", content_type="execution_output")
    c.add("assistant", "", model="gpt-4o")
    c.add("assistant", "The result is 4.", model="gpt-4o")
    c.add(
        "user",
        [{"content_type": "image_asset_pointer", "asset_pointer": "file://x"}, "What is this?"],
        content_type="multimodal_text",
    )
    c.add("assistant", "A cat.", model="gpt-4o")
    c.add("user", "One last question")
    return c


def row_of(client: httpx.Client, session_id: str) -> dict[str, Any]:
    rows = client.get("/api/sessions").json()["sessions"]
    return next(r for r in rows if r["session_id"] == session_id)


def seen(session: dict[str, Any]) -> list[tuple]:
    return [(m["role"], m["content"], m.get("state")) for m in session["messages"]]


def test_a_chatgpt_export_becomes_sessions_on_the_path_to_current_node(tmp_path: Path) -> None:
    conversation = a_conversation()
    other = Conversation("<script>alert('title')</script>", START + 86_400, "conv-2")
    other.add("user", "Second conversation")
    other.add("assistant", "Indeed.")
    export = json.dumps([conversation.data, other.data]).encode()

    with running_server(tmp_path / "data") as server:
        with server.client(timeout=60) as client:
            response = client.post("/api/sessions/import", content=export)
            assert response.status_code == 201, response.text
            body = response.json()
            assert body["created"] == 2 and body["existing"] == 0
            assert body["skipped"] == {"system": 1, "tool": 2, "empty": 1}
            trip, second = body["sessions"]
            assert trip["title"] == "Trip <img src=x onerror=alert(1)>"  # text, as written
            assert second["title"] == "<script>alert('title')</script>"
            session = session_body(client, trip["session_id"])
            assert seen(session) == [
                ("user", "Hello <b>there</b>", None),
                ("assistant", "Hi! <script>alert(1)</script>", "completed"),
                ("user", "Compute 2+2", None),
                ("assistant", "The result is 4.", "completed"),
                (
                    "user",
                    "What is this?\n\n[1 file or image in the ChatGPT export, not imported]",
                    None,
                ),
                ("assistant", "A cat.", "completed"),
                ("user", "One last question", None),
                ("assistant", "", "interrupted"),
            ]
            assert session["messages"][1]["model"] == "gpt-4o"
            times = [m["created_at"] for m in session["messages"] if m["role"] == "user"]
            assert times == [START + 20, START + 60, START + 110, START + 130]
            # its own times: created then, last active at its last message, not now
            assert trip["created_at"] == START
            assert trip["updated_at"] == trip["last_message_at"] == START + 130
            listed = client.get("/api/sessions").json()["sessions"]
            assert [r["session_id"] for r in listed] == [
                second["session_id"],
                trip["session_id"],
            ]
            context = client.get(
                "/api/session/context", params={"session_id": trip["session_id"]}
            ).json()["context_messages"]
            assert context[0] == {"role": "user", "content": "Hello <b>there</b>"}

            # the edit the user left is a branch: 1 of 2 beside the one shown (2 of 2)
            edited = session["messages"][2]
            assert edited["branch"] == {"index": 2, "count": 2}
            hidden = [(r["role"], r["content"]) for r in session["branches"]["hidden"]]
            assert hidden == [("user", "Write poetry"), ("assistant", "Roses are red")]
            switched = client.post(
                "/api/session/branch",
                json={"session_id": trip["session_id"], "row_id": edited["id"], "index": 1},
            )
            assert switched.status_code == 200, switched.text
            assert seen(switched.json()["session"])[2:] == [
                ("user", "Write poetry", None),
                ("assistant", "Roses are red", "completed"),
            ]
            assert row_of(client, trip["session_id"])["updated_at"] == START + 130  # not activity
            session = session_body(client, trip["session_id"])

            exported = client.get(f"/api/sessions/{trip['session_id']}/export").content
            created = json.loads(exported)["events"][0]["data"]["imported"]
            assert created["source"] == "chatgpt" and created["origin"] == "conv-1"
            copy = client.post("/api/sessions/import", content=exported)
            assert copy.status_code == 201, copy.text
            copied = session_body(client, copy.json()["sessions"][0]["session_id"])
            assert seen(copied) == seen(session)
            assert [(r["role"], r["content"]) for r in copied["branches"]["hidden"]] == [
                (r["role"], r["content"]) for r in session["branches"]["hidden"]
            ]

            again = client.post("/api/sessions/import", content=export)
            assert again.status_code == 200, again.text
            assert again.json()["created"] == 0
            assert [r["session_id"] for r in again.json()["sessions"]] == [
                trip["session_id"],
                second["session_id"],
            ]

        server.restart()
        with server.client() as client:
            assert seen(session_body(client, trip["session_id"])) == seen(session)
            assert len(client.get("/api/sessions").json()["sessions"]) == 3


def test_a_conversation_without_current_node_follows_its_newest_branches(tmp_path: Path) -> None:
    c = Conversation("no current node", START)
    c.add("user", "Question")
    c.add("assistant", "First answer")
    c.add("assistant", "Regenerated answer", parent=c.mapping[c.current]["parent"])
    del c.data["current_node"]
    with running_server(tmp_path / "data") as server, server.client(timeout=60) as client:
        response = client.post("/api/sessions/import", content=json.dumps([c.data]).encode())
        assert response.status_code == 201, response.text
        sid = response.json()["sessions"][0]["session_id"]
        body = session_body(client, sid)
        assert seen(body) == [
            ("user", "Question", None),
            ("assistant", "Regenerated answer", "completed"),
        ]
        assert body["messages"][1]["branch"] == {"index": 2, "count": 2}  # a regenerate
        assert [r["content"] for r in body["branches"]["hidden"]] == ["First answer"]
        assert response.json()["skipped"] == {}


def test_odd_fields_of_an_export_import_what_they_can_and_count_the_rest(tmp_path: Path) -> None:
    """Fields ChatGPT never writes that way (metadata a list, a role a number, a content
    type a list, parts that are numbers, children that are objects) are not a crash: the
    messages they make unreadable are counted as skipped, the rest imports."""
    c = Conversation("odd", START)
    c.add("user", "Readable question")
    odd = c.add("assistant", "Readable answer")
    c.mapping[odd]["message"]["metadata"] = ["not", "an", "object"]
    weird_role = c.add("user", "who wrote this?")
    c.mapping[weird_role]["message"]["author"]["role"] = 5
    weird_type = c.add("assistant", "typed oddly")
    c.mapping[weird_type]["message"]["content"]["content_type"] = ["text"]
    c.add("user", [7, "numbers are not text", 8.5])
    c.mapping[c.root]["children"].append({"an": "object"})
    del c.data["current_node"]
    with running_server(tmp_path / "data") as server, server.client(timeout=60) as client:
        response = client.post("/api/sessions/import", content=json.dumps([c.data]).encode())
        assert response.status_code == 201, response.text
        assert response.json()["skipped"] == {"other_role": 1, "other_content": 1}
        sid = response.json()["sessions"][0]["session_id"]
        assert seen(session_body(client, sid)) == [
            ("user", "Readable question", None),
            ("assistant", "Readable answer", "completed"),
            ("user", "numbers are not text", None),
            ("assistant", "", "interrupted"),
        ]
        assert "Traceback" not in server.log()


def test_voice_transcripts_are_text_and_uploaded_files_are_counted(tmp_path: Path) -> None:
    """A voice message's words are in its `audio_transcription` parts, and a file the user
    uploaded (a PDF, a spreadsheet) is named only in `metadata.attachments` (an image is
    there too, and in the parts as its asset pointer): the words are the message's text and
    every file is counted once, never dropped in silence (docs/api.md §12)."""
    c = Conversation("voice and files", START)
    audio = {"content_type": "real_time_user_audio_video_asset_pointer", "audio_asset_pointer": {}}
    said = {"content_type": "audio_transcription", "text": "What's the weather?"}
    c.add("user", [said, audio], content_type="multimodal_text")
    answered = {"content_type": "audio_transcription", "text": "Sunny all day.", "direction": "out"}
    c.add("assistant", [answered, {"content_type": "audio_asset_pointer"}])
    c.mapping[c.current]["message"]["content"]["content_type"] = "multimodal_text"
    pdf = c.add("user", "Summarize the report")
    c.mapping[pdf]["message"]["metadata"]["attachments"] = [
        {"id": "file-pdf1", "name": "report.pdf", "mime_type": "application/pdf", "size": 1234}
    ]
    c.add("assistant", "It says three things.")
    photo = {"content_type": "image_asset_pointer", "asset_pointer": "file-service://file-img1"}
    pic = c.add("user", [photo, "And this?"], content_type="multimodal_text")
    c.mapping[pic]["message"]["metadata"]["attachments"] = [
        {"id": "file-img1", "name": "cat.png", "mime_type": "image/png"},
        {"id": "file-csv1", "name": "data.csv", "mime_type": "text/csv"},
    ]
    c.add("assistant", "A cat and a table.")
    c.add("user", [photo | {"asset_pointer": "sediment://file_2"}], content_type="multimodal_text")
    with running_server(tmp_path / "data") as server, server.client(timeout=60) as client:
        response = client.post("/api/sessions/import", content=json.dumps([c.data]).encode())
        assert response.status_code == 201, response.text
        assert response.json()["skipped"] == {}
        sid = response.json()["sessions"][0]["session_id"]
        assert [m["content"] for m in session_body(client, sid)["messages"]] == [
            "What's the weather?\n\n[1 file or image in the ChatGPT export, not imported]",
            "Sunny all day.\n\n[1 file or image in the ChatGPT export, not imported]",
            "Summarize the report\n\n[1 file or image in the ChatGPT export, not imported]",
            "It says three things.",
            "And this?\n\n[2 files or images in the ChatGPT export, not imported]",
            "A cat and a table.",
            "[1 file or image in the ChatGPT export, not imported]",  # no blank lines first
            "",
        ]
        found = client.get("/api/search", params={"q": "weather"}).json()["results"]
        assert [r["role"] for r in found] == ["user"]


def test_a_title_holding_a_control_character_is_kept_as_the_text_it_shows(
    tmp_path: Path,
) -> None:
    """A conversation's title is what ChatGPT showed: a tab or an escape in it (refused
    where a person types a title) is shown as a space, not a reason to drop the title in
    silence for the first message's words."""
    c = Conversation("Trip\tplan\x1b for\x00 June", START)
    c.add("user", "Where should we go?")
    with running_server(tmp_path / "data") as server, server.client(timeout=60) as client:
        response = client.post("/api/sessions/import", content=json.dumps([c.data]).encode())
        assert response.status_code == 201, response.text
        [row] = response.json()["sessions"]
        assert row["title"] == "Trip plan for June"
        assert session_body(client, row["session_id"])["title"] == "Trip plan for June"


def test_a_message_keeps_its_leading_indentation(tmp_path: Path) -> None:
    """Code pasted from inside a class starts indented: stripping the message would unindent
    its first line only, and the transcript would show other code than was sent."""
    pasted = "    def area(self):\n        return self.w * self.h\n"
    answer = "    indented code\n\nthen words"
    c = Conversation("paste", START)
    c.add("user", pasted)
    c.add("assistant", answer)
    with running_server(tmp_path / "data") as server, server.client(timeout=60) as client:
        response = client.post("/api/sessions/import", content=json.dumps([c.data]).encode())
        assert response.status_code == 201, response.text
        sid = response.json()["sessions"][0]["session_id"]
        assert seen(session_body(client, sid)) == [
            ("user", pasted, None),
            ("assistant", answer, "completed"),
        ]
