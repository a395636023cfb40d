"""Layer: live stream / SSE and run journal replay (docs/api.md §6, contract invariants 3 and 5):
replay-then-live with no gap and no duplicate from any cursor; a cursor that cannot be honoured
yields one `session.snapshot`, never a refusal and never a silent skip."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx

from helpers import ServerProcess, iter_sse, read_events, running_server, seqs


def make_session_with_events(client: httpx.Client, total: int) -> str:
    sid = client.post("/api/sessions", json={"title": "t0"}).json()["session"]["session_id"]
    for i in range(1, total):
        assert (
            client.patch("/api/session", json={"session_id": sid, "title": f"t{i}"}).status_code
            == 200
        )
    return sid


def test_resume_from_every_cursor_gets_exactly_the_suffix(server: ServerProcess) -> None:
    with server.client() as client:
        sid = make_session_with_events(client, 300)
        for cursor in range(0, 301):
            if cursor == 300:
                frames = read_events(client, sid, after="300", stop_on="heartbeat")
            else:
                frames = read_events(client, sid, after=str(cursor), until_seq=300)
            assert seqs(frames) == list(range(cursor + 1, 301)), cursor
            assert all(f.event != "session.snapshot" for f in frames)


def test_last_event_id_header_resumes_and_the_query_wins(server: ServerProcess) -> None:
    with server.client() as client:
        sid = make_session_with_events(client, 10)
        by_header = read_events(client, sid, headers={"Last-Event-ID": "7"}, until_seq=10)
        assert seqs(by_header) == [8, 9, 10]
        both = read_events(client, sid, after="4", headers={"Last-Event-ID": "8"}, until_seq=10)
        assert seqs(both) == [5, 6, 7, 8, 9, 10]


def test_envelope_matches_the_api(server: ServerProcess) -> None:
    with server.client() as client:
        sid = make_session_with_events(client, 2)
        frames = read_events(client, sid, after="0", until_seq=2)
        first = frames[0].json
        assert frames[0].event == "session.created" and frames[0]["id"] == "1"
        assert set(first) == {"seq", "session_id", "type", "at", "data"}
        assert first["session_id"] == sid and first["data"] == {"title": "t0"}


def test_malformed_or_future_cursor_yields_one_snapshot_then_live(server: ServerProcess) -> None:
    with server.client() as client:
        sid = make_session_with_events(client, 5)
        for bad in ["abc", "-1", "999", "1.5", "", "٣"]:
            frames = read_events(client, sid, after=bad, stop_on="heartbeat")
            assert [f.event for f in frames] == ["session.snapshot", "heartbeat"], bad
            snapshot = frames[0].json
            assert frames[0].get("id") is None
            assert snapshot == client.get("/api/session", params={"session_id": sid}).json()
        frames = read_events(client, sid, headers={"Last-Event-ID": "junk"}, stop_on="heartbeat")
        assert frames[0].event == "session.snapshot"

        # live events after the snapshot continue from its last_seq, without a gap
        got: list = []

        def follow() -> None:
            got.extend(read_events(client, sid, after="nonsense", until_seq=7))

        reader = threading.Thread(target=follow)
        reader.start()
        time.sleep(0.3)
        client.patch("/api/session", json={"session_id": sid, "title": "six"})
        client.patch("/api/session", json={"session_id": sid, "title": "seven"})
        reader.join(10)
        assert got[0].event == "session.snapshot"
        assert got[0].json["session"]["last_seq"] == 5
        assert seqs(got) == [6, 7]


def test_no_cursor_means_from_now(server: ServerProcess) -> None:
    with server.client() as client:
        sid = make_session_with_events(client, 3)
        frames: list = []
        reader = threading.Thread(
            target=lambda: frames.extend(read_events(client, sid, until_seq=4))
        )
        reader.start()
        time.sleep(0.3)
        client.patch("/api/session", json={"session_id": sid, "title": "next"})
        reader.join(10)
        assert seqs(frames) == [4]


def test_idle_stream_sends_heartbeats_with_position(server: ServerProcess) -> None:
    with server.client() as client:
        sid = make_session_with_events(client, 2)
        started = time.monotonic()
        beats = []
        with client.stream("GET", f"/api/sessions/{sid}/events") as response:
            for frame in iter_sse(response):
                if frame.event == "heartbeat":
                    beats.append(frame.json)
                if len(beats) == 3:
                    break
        assert time.monotonic() - started < 3  # the server runs with 0.3 s heartbeats
        assert beats[0]["last_seq"] == 2 and beats[0]["busy"] is False
        assert beats[0]["active_stream_id"] is None and "server_time" in beats[0]


def test_fifty_concurrent_writers_reach_two_followers_identically(server: ServerProcess) -> None:
    with server.client() as client:
        sid = client.post("/api/sessions", json={}).json()["session"]["session_id"]
        total = 1 + 50 * 4
        followers: list[list] = [[], []]
        threads = [
            threading.Thread(
                target=lambda out=out: out.extend(
                    read_events(client, sid, after="0", until_seq=total, timeout=30)
                )
            )
            for out in followers
        ]
        for t in threads:
            t.start()

        def writer(n: int) -> None:
            with server.client() as own:
                for i in range(4):
                    response = own.patch(
                        "/api/session", json={"session_id": sid, "title": f"w{n}-{i}"}
                    )
                    assert response.status_code == 200

        writers = [threading.Thread(target=writer, args=(n,)) for n in range(50)]
        for w in writers:
            w.start()
        for w in writers + threads:
            w.join(30)
        expected = list(range(1, total + 1))
        assert seqs(followers[0]) == expected
        durable = [[f["data"] for f in frames if f.get("id")] for frames in followers]
        assert durable[0] == durable[1]  # heartbeats (no id) carry each stream's own clock


def test_sidebar_stream_reports_changes_and_deletions(server: ServerProcess) -> None:
    with server.client() as client:
        sid = client.post("/api/sessions", json={"title": "a"}).json()["session"]["session_id"]
        changes: list = []

        def follow() -> None:
            with client.stream("GET", "/api/events") as response:
                for frame in iter_sse(response):
                    if frame.event == "session.changed":
                        changes.append(frame.json)
                        if frame.json["reason"] == "deleted":
                            return

        reader = threading.Thread(target=follow)
        reader.start()
        time.sleep(0.3)
        client.patch("/api/session", json={"session_id": sid, "title": "b"})
        client.delete("/api/session", params={"session_id": sid})
        reader.join(10)
        assert changes[0]["session_id"] == sid and changes[0]["row"]["title"] == "b"
        assert changes[-1] == {"session_id": sid, "reason": "deleted", "row": None}


def test_deleting_a_session_ends_its_stream(server: ServerProcess) -> None:
    with server.client() as client:
        sid = client.post("/api/sessions", json={}).json()["session"]["session_id"]
        frames: list = []
        reader = threading.Thread(
            target=lambda: frames.extend(read_events(client, sid, stop_on="session.deleted"))
        )
        reader.start()
        time.sleep(0.3)
        client.delete("/api/session", params={"session_id": sid})
        reader.join(10)
        assert frames[-1].event == "session.deleted"


def test_a_session_stream_can_carry_the_sidebar_feed(server: ServerProcess) -> None:
    """One connection per browser tab: `?sidebar=1` adds `session.changed` frames."""
    with server.client() as client:
        sid = client.post("/api/sessions", json={"title": "open"}).json()["session"]["session_id"]
        other = client.post("/api/sessions", json={"title": "x"}).json()["session"]["session_id"]
        got: list = []

        def follow() -> None:
            with client.stream(
                "GET", f"/api/sessions/{sid}/events", params={"sidebar": "1"}
            ) as response:
                for frame in iter_sse(response):
                    got.append(frame)
                    if frame.event == "session.changed" and frame.json["session_id"] == other:
                        return

        reader = threading.Thread(target=follow)
        reader.start()
        time.sleep(0.3)
        client.patch("/api/session", json={"session_id": sid, "title": "renamed"})
        client.patch("/api/session", json={"session_id": other, "title": "y"})
        reader.join(10)
        events = [f.event for f in got if f.event != "heartbeat"]
        assert events == ["session.changed", "session.updated", "session.changed"]
        assert got[-1].json["row"]["title"] == "y"
        assert seqs(got) == [2]


def test_a_sidebar_stream_says_at_once_that_it_follows(tmp_path: Path) -> None:
    """Layer: sidebar feed / SSE (docs/api.md §6; contract invariant 3 for the page's move
    from one stream to the next): `GET /api/events` begins with a heartbeat, a session stream
    with `?sidebar=1` sends one right after its replay, long before `--heartbeat-seconds`,
    and a change made as soon as it arrived is on the stream."""
    with (
        running_server(tmp_path / "data", "--heartbeat-seconds", "5") as server,
        server.client() as client,
    ):
        sid = make_session_with_events(client, 3)
        other = client.post("/api/sessions", json={}).json()["session"]["session_id"]
        replay = ["session.created", "session.updated", "session.updated"]
        for path, params, replayed in (
            ("/api/events", {}, []),
            (f"/api/sessions/{sid}/events", {"after": "0", "sidebar": "1"}, replay),
        ):
            title = f"renamed for {path}"
            got: list = []
            began = time.monotonic()
            with client.stream("GET", path, params=params, timeout=10) as response:
                for frame in iter_sse(response):
                    got.append(frame)
                    if frame.event == "heartbeat" and len(got) == len(seqs(got)) + 1:
                        assert time.monotonic() - began < 2
                        renamed = client.patch(
                            "/api/session", json={"session_id": other, "title": title}
                        )
                        assert renamed.status_code == 200
                    if frame.event == "session.changed":
                        break
            assert got[-1].json["row"]["title"] == title
            assert [f.event for f in got[:-1]] == [*replayed, "heartbeat"]
