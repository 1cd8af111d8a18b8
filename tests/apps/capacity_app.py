"""A worker that exports its own capacity the way an inference server does (vLLM's metric names), for the probe
tests: ``/metrics`` is the file ``$CLAIMS_DIR/<worker id>.prom`` (404 without one, 503 while it reads "down");
``/busy`` answers 429 with ``Retry-After: $BUSY_RETRY``; any other path answers its worker id and appends one line
to ``$CLAIMS_DIR/<worker id>.served`` — the app's own count of what was sent to it, whoever sent it."""

from __future__ import annotations

import os
from pathlib import Path

from aiohttp import web

CLAIMS = Path(os.environ["CLAIMS_DIR"])
WORKER = os.environ["ELASTIC_WORKER_ID"]


async def metrics(request: web.Request) -> web.Response:
    claim = CLAIMS / f"{WORKER}.prom"
    try:
        text = claim.read_text()
    except FileNotFoundError:
        return web.Response(status=404, text="no claim\n")
    if text.strip() == "down":
        return web.Response(status=503, text="down\n")
    return web.Response(text=text, content_type="text/plain")


async def busy(request: web.Request) -> web.Response:
    return web.Response(status=429, text="busy\n", headers={"Retry-After": os.environ.get("BUSY_RETRY", "2")})


async def other(request: web.Request) -> web.Response:
    with open(CLAIMS / f"{WORKER}.served", "a") as served:
        served.write(request.path + "\n")
    return web.Response(text=f"worker {WORKER} pid {os.getpid()}\n")


app = web.Application()
app.router.add_get("/metrics", metrics)
app.router.add_get("/busy", busy)
app.router.add_route("*", "/{tail:.*}", other)
web.run_app(app, path=os.environ["ELASTIC_LISTEN"].removeprefix("unix:"), print=None, handle_signals=True)
