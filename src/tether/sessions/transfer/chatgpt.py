"""ChatGPT's `conversations.json` (its data export) as Tether sessions (docs/api.md §12).

A conversation is a tree: `mapping` holds nodes with `parent` and `children`, each maybe a
message (`author.role`, `content.parts`, `create_time`), and `current_node` is the leaf the
user last saw. Each conversation becomes ordinary Tether events, at the times ChatGPT
recorded: a user message is a `turn.submitted`, the assistant messages after it one run
(`run.started`, a `text.delta` per message, `run.finished`), so the transcript, the model
context and the row fold exactly as for a conversation held here.

The path from the root to `current_node` becomes the session. What is not on it is never
dropped silently: the other branches' messages are kept in the log (`session.created`
`imported.other_branches`, so they come back in the session's JSON export) and counted in
the response, and so is every message skipped on the path, by reason: `system` and `tool`
messages (and assistant messages addressed to a tool), `hidden` ones ChatGPT does not show
either, `empty` ones, content of another kind (`content_type`), and assistant messages
before the first user message.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Callable
from typing import Any

from tether import events as ev
from tether.events import new_id
from tether.log.store import Draft
from tether.sessions.service import TITLE_MAX_CHARS, clean_title
from tether.sessions.transfer.plan import (
    MAX_NODES_PER_CONVERSATION,
    Refusal,
    SessionPlan,
    finite_time,
    invalid,
)
from tether.sessions.transfer.tether_json import fold_check

RUNTIME = "chatgpt"
NO_ANSWER = "the ChatGPT export has no answer to this message"
_TEXT_TYPES = {"text", "multimodal_text"}


def looks_like(value: Any) -> bool:
    return isinstance(value, list) and all(
        isinstance(c, dict) and isinstance(c.get("mapping"), dict) for c in value
    )


def plan_sessions(conversations: list[Any], progress: Callable[[int], None]) -> list[SessionPlan]:
    plans = []
    for i, conversation in enumerate(conversations):
        plans.append(_plan(conversation, f"[{i}]"))
        progress(i + 1)
    return plans


def _key(conversation: dict[str, Any]) -> str:
    canonical = json.dumps(conversation, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "chatgpt:" + hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()


def _title(raw: Any) -> str | None:
    if not isinstance(raw, str):
        return None
    try:
        return clean_title(raw[:TITLE_MAX_CHARS])
    except Exception:  # InvalidRequest: a title that is nothing visible; the first message names it
        return None


def _nodes(conversation: dict[str, Any], where: str) -> dict[str, dict[str, Any]]:
    mapping = conversation["mapping"]
    if len(mapping) > MAX_NODES_PER_CONVERSATION:
        raise Refusal(
            "import_too_large",
            f"{where}.mapping has {len(mapping):,} nodes; at most "
            f"{MAX_NODES_PER_CONVERSATION:,} are read.",
            path=f"{where}.mapping",
        )
    for node_id, node in mapping.items():
        path = f"{where}.mapping.{node_id}"
        if not isinstance(node, dict):
            raise invalid(path, "is not an object")
        if node.get("parent") is not None and not isinstance(node["parent"], str):
            raise invalid(f"{path}.parent", "is not a node id")
        message = node.get("message")
        if message is not None and not isinstance(message, dict):
            raise invalid(f"{path}.message", "is not an object")
        if message is not None:
            for part, kind in (("author", dict), ("content", dict)):
                if not isinstance(message.get(part), kind):
                    raise invalid(f"{path}.message.{part}", "is not an object")
            parts = message["content"].get("parts")
            if parts is not None and not isinstance(parts, list):
                raise invalid(f"{path}.message.content.parts", "is not a list")
    return mapping


def _path(mapping: dict[str, dict[str, Any]], current: Any, where: str) -> list[str]:
    """Root to `current_node` (or, without a usable one, to the last child at each step)."""
    if not isinstance(current, str) or current not in mapping:
        roots = [k for k, n in mapping.items() if n.get("parent") not in mapping]
        current = roots[0] if roots else None
        while current is not None:
            children = [c for c in mapping[current].get("children") or [] if c in mapping]
            if not children:
                break
            current = children[-1]
    path, seen = [], set()
    while current is not None and current in mapping:
        if current in seen:
            raise invalid(f"{where}.mapping.{current}.parent", "the node is its own ancestor")
        seen.add(current)
        path.append(current)
        current = mapping[current].get("parent")
    return path[::-1]


def _text(message: dict[str, Any]) -> tuple[str | None, str | None]:
    """The message's text and, when it is skipped, why."""
    role = (message.get("author") or {}).get("role")
    content = message["content"]
    if role in ("system", "tool"):
        return None, role
    if role not in ("user", "assistant"):
        return None, "other_role"
    if (message.get("metadata") or {}).get("is_visually_hidden_from_conversation"):
        return None, "hidden"
    if role == "assistant" and message.get("recipient") not in (None, "all"):
        return None, "tool"
    if content.get("content_type") not in _TEXT_TYPES:
        return None, "other_content"
    texts = [p for p in content.get("parts") or [] if isinstance(p, str)]
    media = sum(1 for p in content.get("parts") or [] if isinstance(p, dict))
    text = "\n".join(texts).strip()
    if media:
        noun = "file or image" if media == 1 else "files or images"
        text += f"\n\n[{media} {noun} in the ChatGPT export, not imported]"
    return (text, None) if text.strip() else (None, "empty")


def _plan(conversation: Any, where: str) -> SessionPlan:
    if not isinstance(conversation, dict) or not isinstance(conversation.get("mapping"), dict):
        raise invalid(where, "a conversation is an object with a mapping")
    mapping = _nodes(conversation, where)
    path = _path(mapping, conversation.get("current_node"), where)
    skipped: Counter[str] = Counter()
    start = finite_time(conversation.get("create_time"))
    clock = start or 0.0
    sid = new_id("s")
    drafts: list[Draft] = []
    run: dict[str, Any] | None = None

    def close() -> None:
        nonlocal run
        if run is None:
            return
        data: dict[str, Any] = {"stream_id": run["stream"], "turn_id": run["turn"]}
        if run["items"]:
            data["state"] = "completed"
        else:
            data.update(state="interrupted", reason=NO_ANSWER, maintenance=True)
        drafts.append(Draft(ev.RUN_FINISHED, data, run["stream"], run["turn"], at=run["at"]))
        run = None

    for node_id in path:
        message = mapping[node_id].get("message")
        if message is None:
            continue  # the tree's root carries no message
        text, reason = _text(message)
        at = finite_time(message.get("create_time"))
        clock = max(clock, at or clock)
        if text is None:
            skipped[reason or "empty"] += 1
            continue
        role = message["author"]["role"]
        if role == "user":
            close()
            run = {"stream": new_id("r"), "turn": new_id("u"), "items": 0, "at": clock}
            drafts.append(
                Draft(
                    ev.TURN_SUBMITTED,
                    {
                        "turn_id": run["turn"],
                        "stream_id": run["stream"],
                        "text": text,
                        "attachments": [],
                        "submitted_at": clock,
                    },
                    run["stream"],
                    run["turn"],
                    at=clock,
                )
            )
        elif run is None:
            skipped["before_first_user"] += 1
        else:
            if not run["items"]:
                model = (message.get("metadata") or {}).get("model_slug")
                started = {"stream_id": run["stream"], "runtime": RUNTIME}
                if isinstance(model, str) and model:
                    started["model"] = model[:200]
                drafts.append(Draft(ev.RUN_STARTED, started, run["stream"], run["turn"], at=clock))
            run["items"] += 1
            item = {"stream_id": run["stream"], "item_id": f"t{run['items']}", "text": text}
            if run["items"] > 1:
                item["text"] = "\n\n" + text
            drafts.append(Draft(ev.TEXT_DELTA, item, run["stream"], run["turn"], at=clock))
            run["at"] = clock
    close()
    others = _other_branches(mapping, set(path))
    if others:
        skipped["other_branches"] = len(others)
    key = _key(conversation)
    created = {
        "title": _title(conversation.get("title")),
        "imported": {
            "source": "chatgpt",
            "key": key,
            "origin": conversation.get("conversation_id") or conversation.get("id"),
            "skipped": dict(skipped),
            "other_branches": others,
        },
    }
    first = start if start is not None else (drafts[0].at if drafts else clock)
    drafts.insert(0, Draft(ev.SESSION_CREATED, created, at=first))
    fold_check(sid, drafts, where)
    return SessionPlan(key, "chatgpt", drafts, [], dict(skipped), sid)


def _other_branches(mapping: dict[str, dict[str, Any]], on_path: set[str]) -> list[dict]:
    """The messages off the chosen path, as text: kept in the log, never dropped."""
    out = []
    for node_id, node in mapping.items():
        message = node.get("message")
        if node_id in on_path or message is None:
            continue
        text, reason = _text(message)
        if reason is None:
            out.append(
                {
                    "node_id": node_id,
                    "parent_node_id": node.get("parent"),
                    "role": message["author"]["role"],
                    "text": text,
                    "created_at": finite_time(message.get("create_time")),
                }
            )
    return out
