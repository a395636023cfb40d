"""Attachments in a model request: which types a model can take, and how an `attachment`
part of Tether's model context becomes an OpenAI content part (images as data URLs, text
files inline). Shared by every runtime that speaks the OpenAI message shape."""

from __future__ import annotations

import base64
from typing import Any

from tether.runtimes.base import AttachmentRef

IMAGE_MIMES = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})
_MIME_ALIASES = {"image/jpg": "image/jpeg", "image/pjpeg": "image/jpeg"}
TEXT_APPLICATION_MIMES = frozenset(
    {
        "application/json",
        "application/x-ndjson",
        "application/ndjson",
        "application/xml",
        "application/x-yaml",
        "application/yaml",
        "application/toml",
        "application/x-toml",
        "application/javascript",
        "application/x-javascript",
        "application/ecmascript",
        "application/typescript",
        "application/x-typescript",
        "application/sql",
        "application/x-sh",
        "application/x-shellscript",
        "application/x-python",
        "application/x-httpd-php",
        "application/x-php",  # what Linux browsers give .php files
        "application/x-ruby",  # and .rb files
        "application/x-perl",
        "application/x-tex",
        "application/x-latex",
        "application/graphql",
        "application/csv",
        "application/x-csv",
    }
)


def base_mime(mime: str) -> str:
    base = mime.split(";", 1)[0].strip().lower()
    return _MIME_ALIASES.get(base, base)


def is_text_mime(mime: str) -> bool:
    mime = base_mime(mime)
    return (
        mime.startswith("text/")
        or mime in TEXT_APPLICATION_MIMES
        or mime.endswith(("+json", "+xml", "+yaml"))
    )


def accepts_mime(mime: str) -> bool:
    return base_mime(mime) in IMAGE_MIMES or is_text_mime(mime)


def expand_part(part: Any, attachments: dict[str, AttachmentRef]) -> Any:
    """An `attachment` part resolved to an image or text part; a missing, unreadable or
    unsupported file becomes a visible text placeholder, never an error."""
    if not (isinstance(part, dict) and part.get("type") == "attachment"):
        return part
    attachment_id = part.get("attachment_id")
    ref = attachments.get(attachment_id) if isinstance(attachment_id, str) else None
    if ref is None:
        return {"type": "text", "text": f"[Attachment {attachment_id} is not available.]"}
    mime = base_mime(ref.mime)
    try:
        if mime in IMAGE_MIMES:
            data = base64.b64encode(ref.path.read_bytes()).decode("ascii")
            return {"type": "image_url", "image_url": {"url": f"data:{mime};base64,{data}"}}
        if is_text_mime(mime):
            body = ref.path.read_bytes().decode("utf-8", errors="replace")
            return {"type": "text", "text": f"Attached file {ref.name}:\n{body}"}
    except OSError as exc:
        return {
            "type": "text",
            "text": f"[Attached file {ref.name} could not be read: {exc.strerror or exc}]",
        }
    return {
        "type": "text",
        "text": f"[Attached file {ref.name} ({ref.mime}) cannot be sent to this model.]",
    }
