"""Attachment bytes are stored once per content and shared by every session that uploads them
(log/attachments.py). Layers: the attachment store and the log's per-upload rows. Invariant:
an upload the log acknowledged always has its bytes; deleting another session that held the
same bytes never removes them from under it, however the two interleave."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from pathlib import Path

from tether.log.attachments import AttachmentStore, StoredUpload
from tether.runs.intake import Upload
from tether.runtimes.base import Runtime, RuntimeEvent, TextDelta, TurnInput

from engine_harness import harness


class EchoRuntime(Runtime):
    name = "echo"

    def __init__(self) -> None:
        self.model = "echo-1"

    def accepts(self, mime: str) -> bool:
        return True

    async def stream(self, turn: TurnInput) -> AsyncIterator[RuntimeEvent]:
        yield TextDelta("seen")


class HeldAttachments(AttachmentStore):
    """The real store, which holds a `put` after its bytes are on disk until released: the
    moment between storing an upload and appending the event that records it."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.hold = False
        self.stored = threading.Event()
        self.release = threading.Event()

    async def put(self, data: bytes, *, name: str, mime: str) -> StoredUpload:
        upload = await super().put(data, name=name, mime=mime)
        if self.hold:
            self.stored.set()
            await asyncio.to_thread(self.release.wait, 10)
        return upload


def test_deleting_a_session_never_removes_bytes_another_session_is_recording(
    tmp_path: Path,
) -> None:
    async def main() -> tuple[bool, bool]:
        async with harness(tmp_path, EchoRuntime()) as h:
            held = HeldAttachments(h.engine.attachments.root)
            h.engine.attachments = h.sessions.attachments = held  # the same files, held puts
            same = Upload("notes.txt", "text/plain", b"the same bytes in both sessions")
            a = (await h.sessions.create("A"))["session_id"]
            b = (await h.sessions.create("B"))["session_id"]
            await h.engine.start(a, "first", uploads=[same])
            await h.wait_idle(a)

            held.hold = True
            start_b = asyncio.create_task(h.engine.start(b, "second", uploads=[same]))
            await asyncio.to_thread(held.stored.wait, 10)  # B's bytes stored, not yet logged
            delete_a = asyncio.create_task(h.sessions.delete(a))
            await asyncio.sleep(0.2)  # time enough for the deletion to remove what it may
            held.hold = False
            held.release.set()
            await start_b
            await delete_a
            await h.wait_idle(b)

            fold = await h.sessions.folds.get(b)
            ref = next(
                att for row in fold.transcript.messages for att in row.get("attachments") or []
            )
            upload = await h.store.attachment(ref["id"], b)
            assert upload is not None
            on_disk = await held.path(upload["blob"]) is not None
            return on_disk, await h.store.blob_in_use(upload["blob"])

    on_disk, in_use = asyncio.run(main())
    assert in_use
    assert on_disk, "B's acknowledged upload lost its bytes when A was deleted"
