"""A Starlette app (served by uvicorn in its tenant's sandbox): ``GET /`` answers what it sees (view.py)."""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route
from view import observe


async def index(request):
    return JSONResponse(observe("starlette"))


app = Starlette(routes=[Route("/", index)])
