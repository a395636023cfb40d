"""The server's defaults for sessions that have no model or system prompt of their own
(docs/api.md §11, `GET/PATCH /api/settings`): the command line's (`--model`,
`--system-prompt`) unless the settings panel saved its own.

What the panel saves lives in `settings.json` in the data directory (mode 0600 like the
rest of it), written whole to a temporary file, fsynced and renamed over the old one, so a
crash leaves the old settings or the new ones, never half of either; a restart reads it
back. A saved value wins over the flag (it is the later, explicit choice); saving `null`
removes it, and the flag applies again. The defaults are not in the event log: they are no
session's history, and changing them changes no transcript (a session's own `model` /
`system_prompt`, which are, stay as they are).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from pathlib import Path
from typing import Any

from tether.errors import InvalidRequest
from tether.log.private import FILE_MODE

log = logging.getLogger("tether")

FILE_NAME = "settings.json"
MODEL_MAX_CHARS = 200
KEYS = ("default_model", "default_system_prompt")


class ServerDefaults:
    def __init__(
        self,
        data_dir: Path,
        flag_system_prompt: str | None,
        *,
        system_prompt_max_chars: int,
    ):
        self.path = data_dir / FILE_NAME
        self.flag_system_prompt = flag_system_prompt
        self.max_prompt = system_prompt_max_chars
        self._lock = asyncio.Lock()
        self.saved = self._read()

    def _read(self) -> dict[str, Any]:
        try:
            raw = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            log.warning("%s cannot be read (%s): the command line's defaults apply", self.path, exc)
            return {}
        saved = {}
        if isinstance(raw, dict):
            if isinstance(raw.get("default_model"), str):
                saved["default_model"] = raw["default_model"]
            if isinstance(raw.get("default_system_prompt"), str):
                saved["default_system_prompt"] = raw["default_system_prompt"]
        return saved

    @property
    def model(self) -> str | None:
        """The model a session without its own uses; None: the runtime's own (`--model`)."""
        return self.saved.get("default_model")

    @property
    def system_prompt(self) -> str | None:
        """The system prompt a session without its own gets (None or blank: none)."""
        prompt = self.saved.get("default_system_prompt", self.flag_system_prompt)
        return prompt or None

    def view(self, runtime_model: str) -> dict[str, Any]:
        return {
            "default_model": self.model or runtime_model,
            "default_system_prompt": self.system_prompt,
            "saved": dict(self.saved),
            "command_line": {"model": runtime_model, "system_prompt": self.flag_system_prompt},
        }

    def _clean(self, changes: dict[str, Any]) -> dict[str, str | None]:
        if not any(key in changes for key in KEYS):
            raise InvalidRequest("Nothing to change: send default_model or default_system_prompt.")
        out: dict[str, str | None] = {}
        if "default_model" in changes:
            model = changes["default_model"]
            if model is not None:
                model = model.strip()
                if not model or len(model) > MODEL_MAX_CHARS:
                    raise InvalidRequest(
                        f"default_model must be a model id of 1-{MODEL_MAX_CHARS} characters, "
                        "or null for the command line's."
                    )
            out["default_model"] = model
        if "default_system_prompt" in changes:
            prompt = changes["default_system_prompt"]
            if prompt is not None and len(prompt) > self.max_prompt:
                raise InvalidRequest(
                    f"default_system_prompt is longer than {self.max_prompt:,} characters."
                )
            out["default_system_prompt"] = prompt
        return out

    async def update(self, changes: dict[str, Any]) -> None:
        """Validate everything, then save; a refused change saves nothing."""
        clean = self._clean(changes)
        async with self._lock:
            saved = dict(self.saved)
            for key, value in clean.items():
                if value is None:
                    saved.pop(key, None)
                else:
                    saved[key] = value
            if saved != self.saved:
                await asyncio.to_thread(self._write, saved)
                self.saved = saved

    def _write(self, saved: dict[str, Any]) -> None:
        temp = self.path.with_name(f".{FILE_NAME}.tmp")
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
        with os.fdopen(fd, "wb") as out:
            out.write(json.dumps(saved, ensure_ascii=False, indent=1).encode("utf-8"))
            out.flush()
            os.fsync(out.fileno())
        os.replace(temp, self.path)
        directory = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
