"""ChatGPT's `conversations.json` (its data export) as Tether sessions (docs/api.md §12).

A conversation is a tree: `mapping` holds nodes with `parent` and `children`, each maybe a
message (`author.role`, `content.parts`, `create_time`), and `current_node` is the leaf the
user last saw. Each conversation becomes ordinary Tether events, at the times ChatGPT
recorded: a user message is a `turn.submitted`, the assistant messages after it one run
(`run.started`, a `text.delta` per message, `run.finished`), so the transcript, the model
context and the row fold exactly as for a conversation held here. Its tree becomes Tether's
branches (docs/api.md §10): an edited message is a branch beside the one it replaced, another
answer a regenerated one, and the path to `current_node` is the branch shown.

Nothing is dropped silently: every message not imported is counted in the response (and in
`session.created` `imported.skipped`) by reason: `system` and `tool` messages (and assistant
messages addressed to a tool), `hidden` ones ChatGPT does not show either, `empty` ones,
authors of another role (`other_role`), content of another kind (`other_content`), and
assistant messages before the first user message (`before_first_user`).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from collections.abc import Callable
from typing import Any

from tether import events as ev
from tether.events import new_id
from tether.log.store import Draft
from tether.sessions.service import TITLE_MAX_CHARS, clean_title
from tether.sessions.transfer.plan import (
    HALF_PAIR,
    MAX_EVENTS_PER_SESSION,
    MAX_NODES_PER_CONVERSATION,
    Refusal,
    SessionPlan,
    finite_time,
    half_pair_at,
    invalid,
    not_future,
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


_CONTROLS = re.compile(r" *[\x00-\x1f\x7f-\x9f][\x00-\x1f\x7f-\x9f ]*")


def _title(raw: Any) -> str | None:
    """The title as ChatGPT showed it: control characters (a tab, an escape), which a title
    typed here may not hold, are a space, so the title is kept rather than dropped."""
    if not isinstance(raw, str):
        return None
    try:
        return clean_title(_CONTROLS.sub(" ", raw[:TITLE_MAX_CHARS]))
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
        if node.get("children") is not None and not isinstance(node["children"], list):
            raise invalid(f"{path}.children", "is not a list")  # walked to find the branch shown
        message = node.get("message")
        if message is not None and not isinstance(message, dict):
            raise invalid(f"{path}.message", "is not an object")
        if message is not None:
            for part, kind in (("author", dict), ("content", dict)):
                if not isinstance(message.get(part), kind):
                    raise invalid(f"{path}.message.{part}", "is not an object")
            not_future(finite_time(message.get("create_time")), f"{path}.message.create_time")
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
            listed = mapping[current].get("children")
            children = [c for c in listed or [] if isinstance(c, str) and c in mapping]
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


def _metadata(message: dict[str, Any]) -> dict[str, Any]:
    metadata = message.get("metadata")
    return metadata if isinstance(metadata, dict) else {}


def _text(message: dict[str, Any]) -> tuple[str | None, str | None]:
    """The message's text and, when it is skipped, why."""
    role = (message.get("author") or {}).get("role")
    content = message["content"]
    if role in ("system", "tool"):
        return None, role
    if role not in ("user", "assistant"):
        return None, "other_role"
    if _metadata(message).get("is_visually_hidden_from_conversation") is True:
        return None, "hidden"
    if role == "assistant" and message.get("recipient") not in (None, "all"):
        return None, "tool"
    kind = content.get("content_type")
    if not isinstance(kind, str) or kind not in _TEXT_TYPES:
        return None, "other_content"
    parts = content.get("parts") or []
    text = "\n".join(_part_text(p) for p in parts if _part_text(p))  # as written: not stripped
    media = _files(parts, _metadata(message).get("attachments"))
    if media:
        noun = "file or image" if media == 1 else "files or images"
        note = f"[{media} {noun} in the ChatGPT export, not imported]"
        text = f"{text}\n\n{note}" if text.strip() else note
    return (text, None) if text.strip() else (None, "empty")


def _part_text(part: Any) -> str:
    """A part's words: a text part, or what a voice message said (`audio_transcription`)."""
    if isinstance(part, str):
        return part
    if isinstance(part, dict) and part.get("content_type") == "audio_transcription":
        said = part.get("text")
        return said if isinstance(said, str) else ""
    return ""


def _files(parts: list[Any], attachments: Any) -> int:
    """How many files the message had: the uploads `metadata.attachments` names (a PDF is
    only there) and the media parts (an image, a recording), an image that is in both once:
    its part points at the upload's id (`file-service://file-abc`)."""
    listed = attachments if isinstance(attachments, list) else []
    uploads = [a for a in listed if isinstance(a, dict)]
    ids = {a["id"] for a in uploads if isinstance(a.get("id"), str) and a["id"]}
    count = len(uploads)
    for part in parts:
        if not isinstance(part, dict) or part.get("content_type") == "audio_transcription":
            continue
        pointer = part.get("asset_pointer")
        if not (isinstance(pointer, str) and pointer.rpartition("://")[2] in ids):
            count += 1
    return count


def _plan(conversation: Any, where: str) -> SessionPlan:
    if not isinstance(conversation, dict) or not isinstance(conversation.get("mapping"), dict):
        raise invalid(where, "a conversation is an object with a mapping")
    not_future(finite_time(conversation.get("create_time")), f"{where}.create_time")
    mapping = _nodes(conversation, where)
    current = set(_path(mapping, conversation.get("current_node"), where))
    tree = _Tree(mapping, current, finite_time(conversation.get("create_time")), where)
    tree.emit_all()
    key = _key(conversation)
    created = {
        "title": _title(conversation.get("title")),
        "imported": {
            "source": "chatgpt",
            "key": key,
            "origin": _text_or_none(conversation.get("conversation_id") or conversation.get("id")),
            "skipped": dict(tree.skipped),
        },
    }
    drafts = tree.drafts
    start = finite_time(conversation.get("create_time"))
    first = start if start is not None else (drafts[0].at if drafts else 0.0)
    drafts.insert(0, Draft(ev.SESSION_CREATED, created, at=first))
    sid = new_id("s")
    fold_check(sid, drafts, where)
    return SessionPlan(key, "chatgpt", drafts, [], dict(tree.skipped), sid)


class _Tree:
    """The conversation's messages as Tether's branches (docs/api.md §10): rows are appended
    depth first, and where ChatGPT's tree forks, `transcript.truncated` hides what was
    written so far from the fork on, and the next sibling starts a new branch there (an edit
    of a user message, or `turn.submitted{regenerate}` for another answer to the same turn).
    At every fork the child on the path to `current_node` comes last, so the branch shown at
    the end is the one the user last saw in ChatGPT."""

    def __init__(
        self, mapping: dict[str, dict[str, Any]], current: set[str], start: float | None, where: str
    ):
        self.mapping, self.current, self.where = mapping, current, where
        self.skipped: Counter[str] = Counter()
        self.drafts: list[Draft] = []
        self.generation = 0
        self.clock = start or 0.0
        self.texts: dict[str, str] = {}
        self.kids: dict[str | None, list[str]] = {}
        for node_id, node in mapping.items():
            message = node.get("message")
            if message is None:
                continue
            text, reason = _text(message)
            if text is None:
                self.skipped[reason or "empty"] += 1
            elif half_pair_at(text) is not None:
                raise invalid(f"{where}.mapping.{node_id}.message.content.parts", HALF_PAIR)
            else:
                self.texts[node_id] = text
        self._refuse_cycles(where)
        for node_id in self.texts:
            self.kids.setdefault(self._kept_parent(node_id), []).append(node_id)
        for children in self.kids.values():
            children.sort(key=self._order)

    def _kept_parent(self, node_id: str) -> str | None:
        parent = self.mapping[node_id].get("parent")
        while parent is not None and parent in self.mapping and parent not in self.texts:
            parent = self.mapping[parent].get("parent")
        return parent if parent in self.texts else None

    def _refuse_cycles(self, where: str) -> None:
        """Every node's parents lead to the root: a node that is its own ancestor is
        refused (each node is walked once: a walk stops at a node known to be fine)."""
        fine: set[str] = set()
        for start in self.mapping:
            walk: list[str] = []
            on_walk: set[str] = set()
            node: str | None = start
            while node is not None and node in self.mapping and node not in fine:
                if node in on_walk:
                    raise invalid(f"{where}.mapping.{node}.parent", "the node is its own ancestor")
                walk.append(node)
                on_walk.add(node)
                node = self.mapping[node].get("parent")
            fine.update(walk)

    def _order(self, node_id: str) -> tuple:
        message = self.mapping[node_id]["message"]
        return (node_id in self.current, finite_time(message.get("create_time")) or 0.0)

    def _role(self, node_id: str) -> str:
        return self.mapping[node_id]["message"]["author"]["role"]

    def _at(self, node_id: str) -> float:
        at = finite_time(self.mapping[node_id]["message"].get("create_time"))
        if at is not None:
            self.clock = at
        return self.clock

    def _cut(self, keep: int) -> None:
        self.generation += 1
        data = {"keep_count": keep, "transcript_generation": self.generation}
        self.drafts.append(Draft(ev.TRANSCRIPT_TRUNCATED, data, at=self.clock))

    # -- the walk: depth first, with a stack of its own (a conversation may be long) -------
    def emit_all(self) -> None:
        top: list[str] = []
        pending = list(self.kids.get(None, []))
        while pending:  # assistant messages before any user message: their users go on top
            node = pending.pop(0)
            if self._role(node) == "user":
                top.append(node)
            else:
                self.skipped["before_first_user"] += 1
                pending[:0] = self.kids.get(node, [])
        top.sort(key=self._order)
        stack: list[tuple] = []
        self._push_users(stack, top, 0)
        while stack:
            task = stack.pop()
            if task[0] == "user":
                self._user(stack, *task[1:])
            else:
                self._answer(stack, *task[1:])
            if len(self.drafts) > MAX_EVENTS_PER_SESSION:
                raise Refusal(
                    "import_too_large",
                    f"{self.where} makes more than {MAX_EVENTS_PER_SESSION:,} events.",
                    path=self.where,
                )

    def _push_users(self, stack: list[tuple], users: list[str], keep: int) -> None:
        """Each of `users` a branch at visible position `keep`, the first one first."""
        for index in reversed(range(len(users))):
            stack.append(("user", users[index], keep, index > 0))

    def _user(self, stack: list[tuple], user: str, keep: int, cut: bool) -> None:
        if cut:
            self._cut(keep)
        turn, stream = new_id("u"), new_id("r")
        at = self._at(user)
        submitted = {
            "turn_id": turn,
            "stream_id": stream,
            "text": self.texts[user],
            "attachments": [],
            "submitted_at": at,
        }
        self.drafts.append(Draft(ev.TURN_SUBMITTED, submitted, stream, turn, at=at))
        kids = self.kids.get(user, [])
        answers = [chain for kid in kids for chain in self._answers(kid)]
        if not answers or any(self._role(k) == "user" for k in kids):
            answers.append([])  # no answer: what follows the user message directly
        answers.sort(key=lambda chain: all(node in self.current for node in chain or [user]))
        for index in reversed(range(len(answers))):
            stack.append(("answer", user, turn, stream, answers[index], keep, index))

    def _answer(
        self,
        stack: list[tuple],
        user: str,
        turn: str,
        stream: str,
        chain: list[str],
        keep: int,
        index: int,
    ) -> None:
        if index:  # another answer to the same turn: a branch beside the one before
            self._cut(keep + 1)
            stream = new_id("r")
            again = {
                "turn_id": turn,
                "stream_id": stream,
                "text": "",
                "attachments": [],
                "regenerate": True,
                "submitted_at": self.clock,
            }
            self.drafts.append(Draft(ev.TURN_SUBMITTED, again, stream, turn, at=self.clock))
        self._run(stream, turn, chain)
        after = [
            k for k in self.kids.get(chain[-1] if chain else user, []) if self._role(k) == "user"
        ]
        self._push_users(stack, after, keep + 2)

    def _answers(self, node: str) -> list[list[str]]:
        """The assistant messages from `node` on that make one answer each: a chain of
        assistant messages is one answer, and where it forks each way is another."""
        if self._role(node) != "assistant":
            return []
        # Each chain is a link (last node, the link before it): copying the chain at every
        # step made a long answer quadratic (80,000 messages: 29 s, holding other imports).
        out: list[list[str]] = []
        stack: list[_Link] = [(node, None)]
        while stack:
            link = stack.pop()
            kids = self.kids.get(link[0], [])
            further = [k for k in kids if self._role(k) == "assistant"]
            if not further or any(self._role(k) == "user" for k in kids):
                out.append(_unlinked(link))
            stack.extend((kid, link) for kid in reversed(further))
            if len(out) + len(stack) > MAX_NODES_PER_CONVERSATION:
                raise Refusal(
                    "import_too_large",
                    f"{self.where}: an answer forks into more than "
                    f"{MAX_NODES_PER_CONVERSATION:,} ways.",
                    path=self.where,
                )
        return out

    def _run(self, stream: str, turn: str, chain: list[str]) -> None:
        if not chain:  # no answer in the export: the run ends as a restart would end it
            data: dict[str, Any] = {"stream_id": stream, "turn_id": turn}
            data.update(state="interrupted", reason=NO_ANSWER, maintenance=True)
            self.drafts.append(Draft(ev.RUN_FINISHED, data, stream, turn, at=self.clock))
            return
        first = self.mapping[chain[0]]["message"]
        model = _metadata(first).get("model_slug")
        started = {"stream_id": stream, "turn_id": turn, "runtime": RUNTIME}
        if isinstance(model, str) and model:
            started["model"] = model[:200]
        self.drafts.append(Draft(ev.RUN_STARTED, started, stream, turn, at=self._at(chain[0])))
        for n, node in enumerate(chain, start=1):
            text = self.texts[node] if n == 1 else "\n\n" + self.texts[node]
            item = {"stream_id": stream, "item_id": f"t{n}", "text": text}
            self.drafts.append(Draft(ev.TEXT_DELTA, item, stream, turn, at=self._at(node)))
        done = {"stream_id": stream, "turn_id": turn, "state": "completed"}
        self.drafts.append(Draft(ev.RUN_FINISHED, done, stream, turn, at=self.clock))


_Link = tuple[str, "_Link | None"]


def _unlinked(link: _Link | None) -> list[str]:
    """The chain a link ends, first node first."""
    chain = []
    while link is not None:
        chain.append(link[0])
        link = link[1]
    return chain[::-1]


def _text_or_none(value: Any) -> str | None:
    """An id the file gives, kept only as the text it is (a hostile file's object is not)."""
    return value[:200] if isinstance(value, str) else None
