"""The server's defaults for sessions that have no model or system prompt of their own
(docs/api.md §11, `GET/PATCH /api/settings`): the command line's (`--model`,
`--system-prompt`) unless the settings panel saved its own.

What the panel saves is kept by a `log.shared.SavedSettings`: `settings.json` in the data
directory (mode 0600, written whole, fsynced and renamed, so a crash leaves the old settings
or the new ones), or with PostgreSQL a table every replica reads, so a change through one is
what all answer. A saved value wins over the flag (it is the later, explicit choice); saving
`null` removes it, and the flag applies again. The defaults are not in the event log: they
are no session's history, and changing them changes no transcript (a session's own `model` /
`system_prompt`, which are, stay as they are).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tether.errors import InvalidRequest
from tether.log.shared import SavedSettings

MODEL_MAX_CHARS = 200
SYSTEM_PROMPT_MAX_CHARS = 20_000  # a session's or the default system prompt (docs/api.md)
KEYS = ("default_model", "default_system_prompt")


@dataclass(frozen=True, slots=True)
class Defaults:
    """The defaults in effect now (read once per request or turn)."""

    saved: dict[str, str]
    flag_system_prompt: str | None

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


class ServerDefaults:
    def __init__(
        self,
        saved: SavedSettings,
        flag_system_prompt: str | None,
        *,
        system_prompt_max_chars: int,
    ):
        self.saved = saved
        self.flag_system_prompt = flag_system_prompt
        self.max_prompt = system_prompt_max_chars

    async def current(self) -> Defaults:
        return Defaults(await self.saved.load(), self.flag_system_prompt)

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
        await self.saved.save(self._clean(changes))
