"""What a new turn may carry: checked in full before anything is written, so a refused start
leaves no trace (docs/api.md §4: bad input is a 400/413 before the turn is recorded)."""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass

from tether.errors import InvalidRequest, PayloadTooLarge
from tether.runtimes.base import Runtime
from tether.settings import Settings
from tether.visible_text import shows_something, visible_line

NAME_MAX_CHARS = 255
# What the page sends for a file its browser gives no type (a Dockerfile, `.env`, `.vue`,
# `.swift`, `.jsonl`, `.ini` on Linux): such a file is taken as text when its bytes are.
UNKNOWN_TYPE = "application/octet-stream"
# A media type (RFC 6838 names, parameters of printable ASCII): what is stored, exported and
# handed to runtimes is never a line break or a control character a client slipped in.
_MEDIA_TYPE = re.compile(r"[a-z0-9][a-z0-9!#$&^_.+-]*/[a-z0-9][a-z0-9!#$&^_.+-]*(?:;[ -~]*)?")


@dataclass(frozen=True)
class Upload:
    name: str
    mime: str
    data: bytes


def check_message(text: str, settings: Settings, *, with_files: bool = False) -> str:
    """A message's text; it may be empty only when files come with it (an image to
    describe, a log to read)."""
    if not text.strip() and not with_files:
        raise InvalidRequest("The message is empty: type something or attach a file.")
    if len(text) > settings.max_message_chars:
        raise PayloadTooLarge(
            f"The message is {len(text):,} characters long; the limit is "
            f"{settings.max_message_chars:,}.",
            limit_chars=settings.max_message_chars,
        )
    return text


def decode_uploads(raw: list[dict[str, str]], settings: Settings, runtime: Runtime) -> list[Upload]:
    if len(raw) > settings.max_attachments:
        raise InvalidRequest(
            f"{len(raw)} attachments; at most {settings.max_attachments} fit in one message.",
        )
    uploads = []
    for index, item in enumerate(raw, start=1):
        # shown in the page, the export and the download as the user sees it: no bidi
        # override can make `invoice\u202egnp.exe` look like `invoiceexe.png`
        name = visible_line(item["name"])
        mime = item["mime"].strip().lower()
        if not shows_something(name) or len(name) > NAME_MAX_CHARS or "/" in name or "\\" in name:
            raise InvalidRequest(f"Attachment {index} needs a plain file name.")
        if not _MEDIA_TYPE.fullmatch(mime):
            raise InvalidRequest(f"{name}: {mime!r} is not a media type (like text/plain).")
        try:
            data = base64.b64decode(item["data_base64"], validate=True)
        except (binascii.Error, ValueError):
            raise InvalidRequest(f"{name}: data_base64 is not valid base64.") from None
        if len(data) > settings.max_attachment_bytes:
            raise PayloadTooLarge(
                f"{name} is {len(data):,} bytes; one attachment may be at most "
                f"{settings.max_attachment_bytes:,}.",
                limit_bytes=settings.max_attachment_bytes,
            )
        if mime == UNKNOWN_TYPE and _is_text(data):
            mime = "text/plain"
        if not runtime.accepts(mime):
            raise InvalidRequest(
                f"{name}: the {runtime.name} runtime cannot take {mime or 'this'} "
                "files. Attach images or text files.",
            )
        uploads.append(Upload(name, mime, data))
    return uploads


def _is_text(data: bytes) -> bool:
    """UTF-8 without a NUL: text, whatever its name (an executable or an image has NULs or
    bytes UTF-8 refuses)."""
    if b"\x00" in data:
        return False
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True
