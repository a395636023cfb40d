"""How a route reaches the running services (built once per app in its lifespan)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request

from tether import services
from tether.http.stream_slots import StreamSlots


@dataclass
class Services(services.Services):
    """The services (`tether.services`) and what only the HTTP layer holds."""

    stream_slots: StreamSlots


async def _services(request: Request) -> Services:
    # async: a plain `def` dependency would be run in the thread pool on every request.
    return request.app.state.services


App = Annotated[Services, Depends(_services)]
