"""`GET /api/search`: full-text search over the user and assistant rows of every session
(docs/api.md), from the log backend's own index."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse

from tether.http.deps import App
from tether.http.errors import documented
from tether.http.schemas import SearchResults
from tether.sessions.search import LIMIT_DEFAULT, LIMIT_MAX

router = APIRouter(tags=["search"])


@router.get(
    "/api/search",
    summary="Search messages",
    response_model=None,
    responses=documented(400, ok=SearchResults),
)
async def search(
    app: App,
    q: Annotated[str, Query(description="The words to find (every word; the last as a prefix)")],
    limit: Annotated[
        int, Query(ge=1, le=LIMIT_MAX, description="At most this many results")
    ] = LIMIT_DEFAULT,
) -> JSONResponse:
    """Rows of user and assistant messages across all sessions holding every word of `q`
    (case and accents ignored; punctuation is not searched for), best matches first, each
    with a snippet around the match. 400 `invalid_request` for an empty query, one over 500
    characters or 16 words, or one with no words."""
    return JSONResponse({"results": await app.sessions.search(q, limit)})
