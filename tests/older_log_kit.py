"""A log an older Tether wrote, made over a real data directory while its server is stopped:
attachment names as they were recorded before names were cleaned at intake (an older
Tether, another replica of one, stored them as given). Shared by the page's and the
import's tests of such names."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tether.log import Draft
from tether.services import open_store
from tether.settings import Settings


def upload_again_as_an_older_tether(
    data_dir: Path, sid: str, refs: list[dict[str, Any]], names: dict[str, str]
) -> None:
    """Append a second turn uploading the session's files (`refs`, a message's attachments)
    again, each named `names[its name]` raw, in the event and in the upload it records (what
    the download is named), as an older Tether wrote them. Runs in a thread of its own, so a
    caller whose thread holds an event loop (Playwright's) can call it too."""
    with ThreadPoolExecutor(1) as thread:
        thread.submit(asyncio.run, _append(data_dir, sid, refs, names)).result()


async def _append(
    data_dir: Path, sid: str, refs: list[dict[str, Any]], names: dict[str, str]
) -> None:
    store = open_store(Settings(data_dir=data_dir))
    turn, stream = "u_old", "r_old"
    files = [
        {"id": f"{r['id']}_old", "mime": r["mime"], "size": r["size"], "name": names[r["name"]]}
        for r in refs
    ]
    blobs = {f"{r['id']}_old": (await store.attachment(r["id"], sid))["blob"] for r in refs}
    submitted = {"turn_id": turn, "stream_id": stream, "text": "files again"}
    ran = {"stream_id": stream, "turn_id": turn}
    try:
        await store.append(
            sid,
            [
                Draft(
                    "turn.submitted",
                    {**submitted, "attachments": files, "submitted_at": time.time()},
                    stream,
                    turn,
                    blobs=blobs,
                ),
                Draft("run.started", {**ran, "runtime": "demo"}, stream, turn),
                Draft(
                    "text.delta", {"stream_id": stream, "item_id": "t1", "text": "ok"}, stream, turn
                ),
                Draft("run.finished", {**ran, "state": "completed"}, stream, turn),
            ],
        )
    finally:
        await store.aclose()
