"""ChatGPT `conversations.json` files for the import tests and bench/import_load.py, in the
shape of ChatGPT's data export: a `mapping` tree of nodes (`parent`, `children`), messages
with `author.role`, `content.content_type` and `content.parts`, `create_time` in seconds and
the `current_node` the user last saw."""

from __future__ import annotations

import uuid
from typing import Any


class Conversation:
    def __init__(self, title: str, start: float, conversation_id: str | None = None) -> None:
        self.start = start
        self.clock = start
        self.root = str(uuid.uuid4())
        self.mapping: dict[str, dict[str, Any]] = {
            self.root: {"id": self.root, "message": None, "parent": None, "children": []}
        }
        self.current = self.root
        self.data: dict[str, Any] = {
            "title": title,
            "create_time": start,
            "update_time": start,
            "mapping": self.mapping,
            "conversation_id": conversation_id or str(uuid.uuid4()),
            "id": conversation_id,
        }

    def add(
        self,
        role: str,
        text: str | list[Any] | None,
        *,
        parent: str | None = None,
        content_type: str = "text",
        recipient: str = "all",
        hidden: bool = False,
        model: str | None = None,
        step: float = 10.0,
    ) -> str:
        """A message under `parent` (the current node by default), which becomes current."""
        self.clock += step
        node_id = str(uuid.uuid4())
        parts = text if isinstance(text, list) else [text] if text is not None else []
        metadata: dict[str, Any] = {}
        if hidden:
            metadata["is_visually_hidden_from_conversation"] = True
        if model:
            metadata["model_slug"] = model
        parent = parent or self.current
        self.mapping[node_id] = {
            "id": node_id,
            "message": {
                "id": node_id,
                "author": {"role": role, "name": None, "metadata": {}},
                "create_time": self.clock,
                "update_time": None,
                "content": {"content_type": content_type, "parts": parts},
                "status": "finished_successfully",
                "end_turn": role == "assistant",
                "weight": 1.0,
                "metadata": metadata,
                "recipient": recipient,
            },
            "parent": parent,
            "children": [],
        }
        self.mapping[parent]["children"].append(node_id)
        self.current = node_id
        self.data["current_node"] = node_id
        self.data["update_time"] = self.clock
        return node_id


def many(count: int, turns: int = 6, start: float = 1_650_000_000.0) -> list[dict[str, Any]]:
    """`count` plain conversations of `turns` exchanges each, a day apart."""
    out = []
    for n in range(count):
        conversation = Conversation(f"Conversation {n}", start + n * 86_400)
        conversation.add("system", "", hidden=True)
        for t in range(turns):
            conversation.add("user", f"Question {t} of conversation {n}: " + "words " * 40)
            conversation.add("assistant", f"Answer {t}. " + "An answer sentence. " * 60)
        out.append(conversation.data)
    return out
