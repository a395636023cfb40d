"""How a route reaches the running services (built once per app in its lifespan)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request

from tether.http.stream_slots import StreamSlots
from tether.log import Hub
from tether.log.attachments import AttachmentStore
from tether.log.store import EventStore
from tether.runs.engine import RunEngine
from tether.runs.queue import QueueService
from tether.runs.registry import RunRegistry
from tether.sessions.feed import SidebarFeed
from tether.sessions.service import SessionService
from tether.settings import Settings


@dataclass
class Services:
    settings: Settings
    store: EventStore
    hub: Hub
    registry: RunRegistry
    sessions: SessionService
    feed: SidebarFeed
    attachments: AttachmentStore
    engine: RunEngine
    queue: QueueService
    stream_slots: StreamSlots


async def _services(request: Request) -> Services:
    # async: a plain `def` dependency would be run in the thread pool on every request.
    return request.app.state.services


App = Annotated[Services, Depends(_services)]
